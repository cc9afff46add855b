//! Node clean-up: what deletes our node in the background when an
//! acquisition or a guard ends without a release, the delete itself, and
//! how a node whose create lost its answer is found again by its uuid.

use std::time::Duration;

use tokio::runtime::Handle;
use zookeeper_client::{Client, Error as ZkError, Stat};

use super::session::Session;

/// How often a create or lookup is retried after a connection loss before
/// giving up with an error (each retry waits for the client to reconnect).
pub(super) const MAX_RETRIES: usize = 5;

/// Deletes our node in the background when dropped, unless disarmed.
///
/// Armed from before the create, so a future dropped at any await (a
/// cancelled `acquire`, a wait that ran out) leaves no node behind: found by
/// its uuid if the create has not answered yet.
///
/// The delete runs on the runtime of the node's session, not the caller's:
/// a guard or an `acquire` future may be dropped after its own runtime is
/// gone (or outside any runtime), and the session's runtime is the one that
/// can still reach the server.
pub(super) struct Cleanup {
    pub(super) runtime: Handle,
    pub(super) client: Client,
    pub(super) dir: String,
    pub(super) uuid: String,
    /// Known once the create answered; before that the node is found by uuid.
    pub(super) path: Option<String>,
    pub(super) armed: bool,
}

impl Cleanup {
    pub(super) fn new(session: &Session, dir: &str, uuid: &str) -> Self {
        Cleanup {
            runtime: session.runtime().clone(),
            client: session.client.clone(),
            dir: dir.to_owned(),
            uuid: uuid.to_owned(),
            path: None,
            armed: true,
        }
    }

    pub(super) fn set_path(&mut self, path: &str) {
        self.path = Some(path.to_owned());
    }

    /// The node was deleted, or went with its session: nothing to do on drop.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    pub(super) fn arm(&mut self) {
        self.armed = true;
    }

    /// Leaves the queue: deletes the node now, as one that must not keep a
    /// place (found by uuid if its path is not known yet). A node gone
    /// already, or gone with its session, is left too. On an error the
    /// clean-up stays armed and tries again in the background.
    pub(super) async fn leave(&mut self) -> Result<(), ZkError> {
        let Some(path) = &self.path else {
            return self.remove_now().await;
        };
        deleted(self.client.delete(path, None).await)?;
        self.disarm();
        Ok(())
    }

    /// Deletes the node now (found by uuid if its path is not known yet),
    /// and disarms on success.
    pub(super) async fn remove_now(&mut self) -> Result<(), ZkError> {
        remove_node(&self.client, &self.dir, &self.uuid, self.path.as_deref()).await?;
        self.disarm();
        Ok(())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // If the session's runtime has shut down, the task is dropped unrun
        // (no panic): the session died with that runtime, and the server
        // deletes its nodes when it expires the session.
        let (client, dir, uuid, path) = (
            self.client.clone(),
            std::mem::take(&mut self.dir),
            std::mem::take(&mut self.uuid),
            self.path.take(),
        );
        // Counted in flight: `dlock::shutdown` waits for it (bounded), so a
        // process that gave up waiting leaves the queue before it exits.
        drop(
            self.runtime
                .spawn(crate::lease::background::in_flight::tracked(async move {
                    if let Err(e) =
                        remove_node_eventually(&client, &dir, &uuid, path.as_deref()).await
                    {
                        tracing::debug!(%dir, error = %e, "background delete of a lock node failed; it ends with the session");
                    }
                })),
        );
    }
}

/// [`remove_node`] for background deletes, which nobody waits for: retries
/// after connection losses for as long as the session lives, so a node whose
/// lease ran out never stays for the rest of a session that reconnected.
/// Each retry waits for the client to reconnect (requests queue meanwhile),
/// plus a pause that grows to one second.
pub(super) async fn remove_node_eventually(
    client: &Client,
    dir: &str,
    uuid: &str,
    path: Option<&str>,
) -> Result<(), ZkError> {
    let mut pause = Duration::from_millis(50);
    loop {
        match remove_node(client, dir, uuid, path).await {
            Err(e) if connection_dropped(&e) && !client.state().is_terminated() => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) if session_ended(&e) => return Ok(()),
            other => return other,
        }
    }
}

/// Deletes the node at `path`, or, if the path is unknown (the create did not
/// answer), the child of `dir` named after `uuid`. A missing node is success.
pub(super) async fn remove_node(
    client: &Client,
    dir: &str,
    uuid: &str,
    path: Option<&str>,
) -> Result<(), ZkError> {
    let path = match path {
        Some(p) => p.to_owned(),
        None => match find_by_uuid(client, dir, uuid).await? {
            Some((p, _)) => p,
            None => return Ok(()),
        },
    };
    let mut tries = 0;
    loop {
        match client.delete(&path, None).await {
            Ok(()) | Err(ZkError::NoNode) => return Ok(()),
            Err(e) if connection_dropped(&e) && tries < MAX_RETRIES => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The child of `dir` whose name carries `uuid`, with its stat: how a create
/// whose answer was lost is recovered (Curator's protected mode).
pub(super) async fn find_by_uuid(
    client: &Client,
    dir: &str,
    uuid: &str,
) -> Result<Option<(String, Stat)>, ZkError> {
    let marker = format!("_c_{uuid}-");
    let mut tries = 0;
    loop {
        let attempt = async {
            let children = match client.list_children(dir).await {
                Err(ZkError::NoNode) => return Ok(None),
                other => other?,
            };
            let Some(name) = children.into_iter().find(|c| c.starts_with(&marker)) else {
                return Ok(None);
            };
            let path = format!("{dir}/{name}");
            match client.check_stat(&path).await? {
                Some(stat) => Ok(Some((path, stat))),
                None => Ok(None),
            }
        };
        match attempt.await {
            Err(e) if connection_dropped(&e) && tries < MAX_RETRIES => tries += 1,
            other => return other,
        }
    }
}

/// Errors that mean the connection dropped with the request in flight: it
/// may or may not have been applied, and the session may live on (the
/// client reconnects to it). `ConnectionLoss`, or one of the client's own
/// errors of a dropped connection (`Custom`): an I/O error, or "no response
/// from connection in …ms" when the client itself was frozen past its read
/// timeout, as a process stopped by SIGSTOP or a long GC pause is. Taking
/// the latter for a final answer once left the node of a lost lease in
/// place for the rest of its session, and an election without a leader.
pub(super) fn connection_dropped(e: &ZkError) -> bool {
    matches!(e, ZkError::ConnectionLoss | ZkError::Custom(_))
}

/// Errors that mean the session is gone, and with it every node it held.
pub(super) fn session_ended(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// The answer to the delete of our node: `Ok(true)` deleted, `Ok(false)`
/// gone already (deleted, or with its session), `Err`: it may still be
/// there.
pub(super) fn deleted(answer: Result<(), ZkError>) -> Result<bool, ZkError> {
    match answer {
        Ok(()) => Ok(true),
        Err(ZkError::NoNode) => Ok(false),
        Err(e) if session_ended(&e) => Ok(false),
        Err(e) => Err(e),
    }
}
