//! A lock's acquisition and release on its key directory: a node in the
//! queue, the wait for the predecessor's deletion, and the delete of the
//! node.

use std::time::Instant;

use super::cleanup::{deleted, Cleanup};
use super::order::Queue;
use super::queue::new_uuid;
use super::{is_connected, lock, representable, ZooKeeperBackend, CLEANUP_WAIT, SESSION_STALLED};
use crate::backend::silence::SILENT_FOR;
use crate::backend::{AcquireRequest, Lease};
use crate::{backend::deadline, LockError};

impl ZooKeeperBackend {
    /// `try_acquire` of a lock or a read-write lease: one place taken in
    /// `queue` under `dir`, left again at once unless it is our turn.
    pub(super) async fn try_queued(
        &self,
        req: &AcquireRequest,
        (dir, queue): (&str, Queue),
    ) -> Result<Option<Lease>, LockError> {
        let session = self.session().await?;
        let client = &session.client;
        // One attempt must not wait for a reconnect: while disconnected,
        // requests queue until the session comes back or expires.
        let state = client.state();
        if !is_connected(state) {
            return Err(LockError::backend(
                self.shown.clone(),
                crate::backend::transient::Transient::new(format!(
                    "ZooKeeper is unreachable (session {state})"
                )),
            ));
        }
        let limit = client.session_timeout();
        match tokio::time::timeout(limit, self.try_once(&session, req, (dir, queue))).await {
            Ok(answer) => answer,
            Err(_) => Err(LockError::backend(
                self.shown.clone(),
                crate::backend::transient::Transient::new(format!(
                    "ZooKeeper did not answer within the session timeout ({limit:?})"
                )),
            )),
        }
    }

    /// `acquire` of a lock or a read-write lease: a place in `queue` under
    /// `dir`, and the wait for our turn until `deadline`.
    pub(super) async fn acquire_queued(
        &self,
        req: &AcquireRequest,
        (dir, queue): (&str, Queue),
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let deadline = representable(deadline);
        let uuid = new_uuid()?;
        // A session can be dead on the server while this client does not
        // know it yet (cut off, it learns of the expiry when it reconnects):
        // then the first request of this acquisition fails with "session
        // expired" before it got a place in the queue. Nothing was taken, so
        // the acquisition starts over, once, on a new session. A session that
        // expires while we wait in the queue still ends the wait with an
        // error: the caller lost its place.
        let mut started_over = false;
        let (session, mut cleanup, waited) = loop {
            let opened = async { self.session().await };
            let opening = Instant::now();
            let session = match deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), opened).await {
                    Ok(c) => c?,
                    // A short wait that ends while a session opens is a
                    // timeout (the caller's time ran out, not the server);
                    // a session that took a second or more without an
                    // answer is a server that does not answer.
                    Err(_) if opening.elapsed() < SESSION_STALLED => return Ok(None),
                    Err(_) => {
                        return Err(LockError::backend(
                            self.shown.clone(),
                            format!(
                                "could not open a ZooKeeper session in {:?}, when the wait ran out",
                                opening.elapsed()
                            ),
                        ))
                    }
                },
                None => opened.await?,
            };
            // Armed from before the create: the node goes if this future is
            // dropped, or the wait runs out, at any await.
            let mut cleanup = Cleanup::new(&session, dir, &uuid);
            let waited = deadline::until(
                deadline,
                self.queue_and_wait(&session, req, (dir, queue), &mut cleanup),
            )
            .await;
            let expired_before_queueing = matches!(waited, Some(Err(_)))
                && cleanup.path.is_none()
                && session.client.state().is_terminated();
            if expired_before_queueing && !started_over {
                // Its node, if the create landed, went with the session.
                cleanup.disarm();
                started_over = true;
                continue;
            }
            break (session, cleanup, waited);
        };
        let client = &session.client;
        match waited {
            Some(Ok(lease)) => {
                self.remember(&lease, &session, cleanup);
                Ok(Some(lease))
            }
            // A node still armed is deleted in the background.
            Some(Err(e)) => Err(e),
            None => {
                let state = client.state();
                if !is_connected(state) {
                    // Say why the wait ran out, and wait no longer for a
                    // server that does not answer: the node goes in the
                    // background (after a reconnect if need be; an expired
                    // session takes it anyway).
                    return Err(LockError::backend(
                        self.shown.clone(),
                        format!(
                            "ZooKeeper was unreachable when the wait ran out (session {state})"
                        ),
                    ));
                }
                // Not in the queue yet: the create was in flight. A timeout
                // only if the server is there (`backend/silence.rs`).
                if cleanup.path.is_none() && !answers_a_read(client).await {
                    return Err(silent_at_deadline(&self.shown));
                }
                // Delete it here and wait for that, so a timed-out waiter
                // never blocks whoever comes next. If that fails, `cleanup`
                // stays armed and tries again in the background.
                match tokio::time::timeout(CLEANUP_WAIT, cleanup.remove_now()).await {
                    Ok(Ok(())) => Ok(None),
                    Ok(Err(e)) => Err(self.error("the wait ran out, and deleting own lock node failed", e)),
                    Err(_) => Err(LockError::backend(
                        self.shown.clone(),
                        format!("the wait ran out, and deleting own lock node did not finish within {CLEANUP_WAIT:?}"),
                    )),
                }
            }
        }
    }

    /// `release` of lock, permit and read-write nodes alike: the delete of
    /// the node.
    pub(super) async fn release_node(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(mut held) = lock(&self.held).remove(&lease.resource) else {
            return Ok(false);
        };
        // Our own delete is no loss: the node's watch ends first.
        held.watch = None;
        if !held.session.is_usable() {
            // The session ended, and its ephemeral nodes with it (or ends
            // soon: its runtime is gone, so the server expires it).
            held.cleanup.disarm();
            return Ok(false);
        }
        match deleted(held.session.client.delete(&lease.resource, None).await) {
            Ok(was_there) => {
                held.cleanup.disarm();
                Ok(was_there)
            }
            Err(e) => {
                // Dropping `held` retries the delete in the background.
                held.cleanup.arm();
                Err(self.error(
                    format_args!("cannot delete lock node {}", lease.resource),
                    e,
                ))
            }
        }
    }
}

impl ZooKeeperBackend {
    /// [`answers_a_read`] on this backend's session (its opening included
    /// in the [`SILENT_FOR`]).
    pub(super) async fn answers_now(&self) -> bool {
        let asked = async {
            match self.session().await {
                Ok(session) => answers_a_read(&session.client).await,
                Err(_) => false,
            }
        };
        tokio::time::timeout(SILENT_FOR, asked)
            .await
            .unwrap_or(false)
    }
}

/// Whether the server answers a read (a stat of `/`) within
/// [`SILENT_FOR`]: asked when a wait ran out with a request of it in
/// flight, to tell an outage from a slow answer (`backend/silence.rs`).
pub(super) async fn answers_a_read(client: &zookeeper_client::Client) -> bool {
    matches!(
        tokio::time::timeout(SILENT_FOR, client.check_stat("/")).await,
        Ok(Ok(_))
    )
}

/// The error of a wait that ran out with a request in flight, on a server
/// that did not answer a read either.
pub(super) fn silent_at_deadline(shown: &str) -> LockError {
    LockError::backend(
        shown.to_owned(),
        crate::backend::transient::Transient::new(format!(
            "ZooKeeper did not answer, nor a read within {SILENT_FOR:?}, when the wait ran out"
        )),
    )
}
