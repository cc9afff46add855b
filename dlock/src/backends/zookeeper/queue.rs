//! Taking a place in a key's queue: `acquire` and `try_acquire` on lock
//! nodes and on the read and write nodes of read-write locks, which differ
//! only in their node's name and the rule that says whose turn it is
//! ([`Queue`], in `order.rs`).
//!
//! Both start the same way: create our node and list the key's children,
//! sent back to back (one round trip; see `create_protected`). If it is our
//! turn (for a lock, our node has the smallest sequence), the lease is ours:
//! the fencing token is the `czxid` from the create's own stat, and the
//! lease is counted from the create (see `Placed::created`), so an
//! uncontended acquisition costs the create, the listing, and later the
//! release's delete: nothing else.
//!
//! Otherwise `try_acquire` leaves the queue at once, and `acquire` watches
//! the node the rule names (for a lock, Curator's predecessor), read with a
//! watch as Curator's `getData` does, and lists again when it goes. Every listing
//! after a wait goes behind a `sync`, and a lease granted by one is counted
//! from it: the wait may have been long, on a follower that since lost its
//! leader.
//!
//! The create itself (`create_protected`) is Curator's protected mode: the
//! node's name carries a uuid, so a create whose answer was lost is found
//! again.

use std::time::{Duration, Instant};

use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, Stat};

use super::cleanup::{connection_dropped, find_by_uuid, session_ended, Cleanup, MAX_RETRIES};
use super::order::{Queue, Turn};
use super::session::Session;
use super::{after_sync, ZooKeeperBackend};
use crate::backend::{AcquireRequest, Lease};
use crate::LockError;

/// How long a waiter pauses before asking again after a lost connection, at
/// first; the pause doubles up to [`MAX_PAUSE`]. The caller's deadline bounds
/// the whole wait.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Our node, just created, and the queue as listed right behind it.
pub(super) struct Placed {
    pub(super) path: String,
    pub(super) stat: Stat,
    pub(super) children: Vec<String>,
    /// When the create was sent, and when it was answered: what a lease
    /// granted by the first listing is counted from, with no `sync`.
    ///
    /// A create is a write. A follower forwards it to the leader, which
    /// checks that the session is alive (it refuses an expired one),
    /// commits it through the quorum, and only then does the follower apply
    /// and answer it. So an answered create proves what a read behind a
    /// `sync` proves (see `after_sync` and `lease.rs`): the leader was
    /// reachable, and our session alive on it, after the create was sent.
    /// The listing behind it may be answered by the follower alone, but not
    /// before the follower applied our create (a session's requests are
    /// answered in order), and every node with a smaller sequence was
    /// committed before ours: the listing misses none that still exists. So
    /// whether we are first is decided right, and the lease may start at
    /// the create's send, less its round trip as for any request. A `sync`
    /// pipelined with the create would prove nothing more, and would cost
    /// the leader a round of its own.
    pub(super) created: (Instant, Instant),
}

/// A node [`ZooKeeperBackend::create_protected`] made.
pub(super) struct Created {
    /// The node's path.
    pub(super) path: String,
    /// The stat the create answered with (found again by uuid after a lost
    /// answer): its `czxid` is the fencing token.
    pub(super) stat: Stat,
    /// The children of the node's directory, listed behind the create, when
    /// asked for and answered.
    pub(super) children: Option<Vec<String>>,
    /// When the create that made the node was sent (or, after lost answers,
    /// the earliest one that may have made it).
    pub(super) sent: Instant,
    /// When its answer came (or, if it was lost, the node was found again).
    pub(super) answered: Instant,
}

/// A version 4 UUID from OS randomness, in Curator's textual form.
pub(super) fn new_uuid() -> Result<String, LockError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| {
        LockError::backend("os-rng", format!("no randomness for a lock node name: {e}"))
    })?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// A node's name in its directory.
fn name_of(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, n)| n)
}

/// Runs `op` again after a lost connection, for as long as the session
/// lives, pausing a little longer each time: while disconnected, requests
/// wait for the reconnection or fail at once, and a waiter must not spin.
pub(super) async fn retrying<T, F, Fut>(client: &Client, mut op: F) -> Result<T, ZkError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ZkError>>,
{
    let mut pause = FIRST_PAUSE;
    loop {
        match op().await {
            Err(e) if connection_dropped(&e) && !client.state().is_terminated() => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            other => return other,
        }
    }
}

impl ZooKeeperBackend {
    /// The ACL of every node dlock creates (`?acl=`, see `acl.rs`).
    pub(super) fn node_acls(&self) -> Acls<'static> {
        self.config.acl.acls()
    }

    /// Creates the key's directory as container nodes, and checks the ACL
    /// of the prefix node above it, which someone else may have made.
    pub(super) async fn make_dir(&self, client: &Client, dir: &str) -> Result<(), LockError> {
        match client
            .mkdir(dir, &CreateMode::Container.with_acls(self.node_acls()))
            .await
        {
            Ok(()) if self.guards_dirs() => {
                let root = dir.rsplit_once('/').map_or("", |(root, _)| root);
                if !root.is_empty() {
                    self.guard_dir(client, root, client.get_acl(root).await)
                        .await?;
                }
                Ok(())
            }
            Ok(()) => Ok(()),
            Err(ZkError::NoNode) => Err(LockError::backend(
                self.shown.clone(),
                format!(
                    "cannot create {dir}: the URL's chroot does not exist on the server; create it first"
                ),
            )),
            Err(e) => Err(self.error(format_args!("cannot create {dir}"), e)),
        }
    }

    /// Creates `_c_<uuid>-<name><seq>` under `dir` (`name` as
    /// [`Queue::node_name`]), creating `dir` if needed, and finds the node
    /// again by its uuid if the answer is lost. With `list`, the children of
    /// `dir` are asked for right behind the create.
    pub(super) async fn create_protected(
        &self,
        client: &Client,
        dir: &str,
        (uuid, name): (&str, &str),
        data: &[u8],
        list: bool,
    ) -> Result<Created, LockError> {
        let prefix = format!("{dir}/_c_{uuid}-{name}");
        let acls = self.node_acls();
        let options = CreateMode::EphemeralSequential.with_acls(acls);
        // When the earliest create that may have made the node was sent: a
        // lease counted from the create starts there. A create refused for a
        // missing directory made nothing, so the next one starts afresh (the
        // directory made in between takes a few writes); one whose answer
        // was lost may have made the node a later lookup finds.
        let mut since = None;
        for _ in 0..MAX_RETRIES {
            let sent = *since.get_or_insert_with(Instant::now);
            let created = client.create(&prefix, data, &options);
            // Sent at once, behind the create, on the same session: the
            // server answers a session's requests in the order they were
            // sent, so the listing sees our node and every node created
            // before it, and costs no round trip of its own. So does the
            // read of the directory's ACL (with credentials; see `acl.rs`),
            // read once our node is in it.
            let acl_read = self.guards_dirs().then(|| client.get_acl(dir));
            let listed = list.then(|| client.list_children(dir));
            match created.await {
                Ok((stat, seq)) => {
                    let answered = Instant::now();
                    let tightened = match acl_read {
                        Some(read) => self.guard_dir(client, dir, read.await).await?,
                        None => false,
                    };
                    // A failed listing is asked for again by the caller, as
                    // is one sent before the ACL was tightened.
                    let children = match listed {
                        Some(listed) if !tightened => listed.await.ok(),
                        _ => None,
                    };
                    return Ok(Created {
                        path: format!("{prefix}{seq}"),
                        stat,
                        children,
                        sent,
                        answered,
                    });
                }
                // The directory is missing, or the server removed the empty
                // container between our mkdir and this create.
                Err(ZkError::NoNode) => {
                    since = None;
                    self.make_dir(client, dir).await?;
                }
                Err(e) if connection_dropped(&e) => match find_by_uuid(client, dir, uuid).await {
                    // A lost create made the node: the leader committed it
                    // after `sent`.
                    Ok(Some((path, stat))) => {
                        if self.guards_dirs() {
                            self.guard_dir(client, dir, client.get_acl(dir).await)
                                .await?;
                        }
                        return Ok(Created {
                            path,
                            stat,
                            children: None,
                            sent,
                            answered: Instant::now(),
                        });
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        return Err(self.error(
                            "lost the answer to a create and could not look for the node",
                            e,
                        ))
                    }
                },
                Err(ZkError::NoAuth) => return Err(self.not_permitted(client, dir).await),
                Err(e) => {
                    return Err(self.error(format_args!("cannot create a lock node under {dir}"), e))
                }
            }
        }
        Err(LockError::backend(
            self.shown.clone(),
            format!("could not create a lock node under {dir} in {MAX_RETRIES} attempts (connection kept dropping, or the directory kept vanishing)"),
        ))
    }

    /// Creates our node for `queue` in `dir` (the create is armed in
    /// `cleanup` from before it is sent) and lists the queue behind it.
    pub(super) async fn place(
        &self,
        session: &Session,
        req: &AcquireRequest,
        (dir, queue): (&str, Queue),
        cleanup: &mut Cleanup,
    ) -> Result<Placed, LockError> {
        let client = &session.client;
        let named = (cleanup.uuid.as_str(), queue.node_name());
        let created = self
            .create_protected(client, dir, named, req.token.as_bytes(), true)
            .await?;
        cleanup.set_path(&created.path);
        let children = match created.children {
            Some(children) => children,
            // The listing was lost with the connection (or the create's
            // answer was, and the node found again by uuid): ask once more.
            None => retrying(client, || client.list_children(dir))
                .await
                .map_err(|e| self.error(format_args!("cannot list {dir}"), e))?,
        };
        Ok(Placed {
            path: created.path,
            stat: created.stat,
            children,
            created: (created.sent, created.answered),
        })
    }

    /// `acquire`'s part after the session is open: take a place in
    /// `queue` under `dir`, and wait for our turn. Our node is armed in
    /// `cleanup`, which the caller keeps, so a wait that is dropped
    /// (cancelled, or its deadline passed) leaves it to the caller to delete
    /// the node.
    pub(super) async fn queue_and_wait(
        &self,
        session: &Session,
        req: &AcquireRequest,
        (dir, queue): (&str, Queue),
        cleanup: &mut Cleanup,
    ) -> Result<Lease, LockError> {
        let client = &session.client;
        let Placed {
            path,
            stat,
            mut children,
            created,
        } = self.place(session, req, (dir, queue), cleanup).await?;
        let mut counted_from = created;
        loop {
            self.still_queued(&children, &path)?;
            let ahead = match self.turn(queue, &children, &path)? {
                Turn::Ours => return self.lease(req, client, &path, &stat, counted_from),
                Turn::After(ahead) => format!("{dir}/{ahead}"),
            };
            // A read with a watch, as Curator's `getData`: unlike `exists`, it
            // leaves no watch behind when the node is already gone.
            match retrying(client, || client.get_and_watch_data(&ahead)).await {
                Ok((_, _, watcher)) => {
                    // Fires on the node's deletion (or a change of its data,
                    // or the session's end); either way, look again.
                    watcher.changed().await;
                }
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(self.waiting_failed(dir, e, cleanup)),
            }
            let sent = Instant::now();
            children =
                match retrying(client, || after_sync(client, || client.list_children(dir))).await {
                    Ok(children) => children,
                    Err(e) => return Err(self.waiting_failed(dir, e, cleanup)),
                };
            counted_from = (sent, Instant::now());
        }
    }

    /// The error of a wait the server ended; a session that ended took our
    /// node with it, so there is nothing left to delete.
    fn waiting_failed(&self, dir: &str, e: ZkError, cleanup: &mut Cleanup) -> LockError {
        if session_ended(&e) {
            cleanup.disarm();
        }
        self.error(format_args!("waiting for lock {dir} failed"), e)
    }

    /// Where our node at `path` stands in `queue` among `children`.
    fn turn<'a>(
        &self,
        queue: Queue,
        children: &'a [String],
        path: &str,
    ) -> Result<Turn<'a>, LockError> {
        queue.turn(children, name_of(path)).ok_or_else(|| {
            LockError::backend(
                self.shown.clone(),
                format!("lock node {path} has no sequence number"),
            )
        })
    }

    /// Whether our node is still among the listed children: a node deleted
    /// by someone else holds no place in the queue.
    fn still_queued(&self, children: &[String], path: &str) -> Result<(), LockError> {
        let name = name_of(path);
        if children.iter().any(|c| c == name) {
            Ok(())
        } else {
            Err(LockError::backend(
                self.shown.clone(),
                format!("lock node {path} vanished from the queue (deleted by someone, or its session ended)"),
            ))
        }
    }

    /// One `try_acquire` attempt on a connected session: take a place in
    /// `queue` under `dir`, and leave it again unless it is our turn.
    pub(super) async fn try_once(
        &self,
        session: &std::sync::Arc<Session>,
        req: &AcquireRequest,
        (dir, queue): (&str, Queue),
    ) -> Result<Option<Lease>, LockError> {
        let client = &session.client;
        // Armed from before the create: if this future is dropped at any
        // await, the node is deleted in the background (found by uuid if the
        // create has not answered yet).
        let mut cleanup = Cleanup::new(session, dir, &new_uuid()?);
        let placed = self.place(session, req, (dir, queue), &mut cleanup).await?;
        self.still_queued(&placed.children, &placed.path)?;
        if self.turn(queue, &placed.children, &placed.path)? == Turn::Ours {
            let lease = self.lease(req, client, &placed.path, &placed.stat, placed.created)?;
            self.remember(&lease, session, cleanup);
            return Ok(Some(lease));
        }
        // Someone is ahead of us: leave the queue now, so our node does not
        // block the holder's successor.
        match cleanup.leave().await {
            Ok(()) => Ok(None),
            Err(e) => Err(self.error(
                format_args!("cannot delete own lock node {}", placed.path),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4_and_differ() {
        let a = new_uuid().unwrap();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, new_uuid().unwrap());
    }
}
