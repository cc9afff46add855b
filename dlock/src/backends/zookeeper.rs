//! The ZooKeeper backend (`zk://`): ephemeral sequential nodes in Apache
//! Curator's layout, a FIFO queue that watches only its predecessor, and the
//! session heartbeat as the renewal.
//!
//! Capabilities: ✓ mutual exclusion between processes and machines · ✓ lease
//! expiry (the session timeout) · ✓ fencing tokens (the node's `czxid`) ·
//! ✓ FIFO wake-up, each waiter woken by its predecessor's deletion only (no
//! herd) · ✓ interoperates with Curator's `InterProcessMutex` on the same path ·
//! ✓ chroot · ✓ digest auth · ✓ semaphores (see `permits.rs`) · ✗ TLS.
//!
//! Enable with the cargo feature `zookeeper`.
//!
//! # Protocol
//!
//! - A key lives at `/<prefix>/<escaped key>` under the URL's chroot (default
//!   prefix `dlock`). The key is escaped into one node name: `%`, `/` and what
//!   ZooKeeper forbids become `%XX`; `.` and `..` become `%2E`, `%2E%2E`.
//!   Parents are created as container nodes, as Curator does, so the server
//!   removes a key's directory once it stays empty.
//! - A contender creates the EPHEMERAL_SEQUENTIAL child
//!   `_c_<uuid>-lock-<seq>`: Curator's "protected" name, so a Java service
//!   using `InterProcessMutex` on the same path and dlock exclude each other.
//!   The node's data is the owner token.
//! - The node is created and the key's children listed in one round trip
//!   (the listing is sent right behind the create). The holder is the child
//!   with the smallest sequence: if that is our node, the lock is ours, with
//!   no further request. A waiter watches only the next-lower child for
//!   deletion, then lists again. (See `queue.rs`.)
//! - If the connection drops while the create is in flight, the node is
//!   found again by its uuid instead of being leaked (protected create).
//! - A wait that runs out, or an `acquire` future that is dropped, deletes its
//!   own node.
//! - Fencing token: the own node's `czxid`, the id of the transaction that
//!   created it, from the create's own answer. ZooKeeper orders every
//!   transaction, and a holder's node was always created after its
//!   predecessor's, so it strictly increases across successive holders, also
//!   after the key's directory was removed and created again (sequence
//!   numbers restart then, zxids do not).
//! - Release deletes the own node.
//! - `try_acquire` queues the same way, and deletes its node again at once
//!   if it is not first.
//!
//! So an uncontended `acquire` and release cost three requests (create,
//! listing, delete) in two round trips, against a bare create and delete.
//!
//! # Renewal, session loss and the ttl
//!
//! ZooKeeper keeps the node while the session lives; the ensemble's leader
//! expires a session `session timeout` after it last heard of a request or
//! heartbeat of the client (from its followers, in an ensemble). So:
//!
//! - A lease's ttl is **clamped to 11/20 of the negotiated session timeout**
//!   ([`Lease::ttl`](crate::backend::Lease) reports the clamped value), and
//!   its local deadline is cut by the round trip of the request it is counted
//!   from. The leader, which alone expires sessions, hears of a session on a
//!   follower only at that follower's next ping reply; a longer lease could
//!   outlive a session the leader expires for want of that news (the bound
//!   is derived in `lease.rs`). A shorter ttl is kept as it is (the guard is
//!   then declared lost sooner than the server could expire it, which is
//!   safe). For a longer ttl, ask for a longer session timeout.
//! - The watchdog's renewal (every ttl/3) reads every held node of a session
//!   in one multi-read, sent right behind a `sync` (one round trip for both).
//!   Only the leader expires sessions, and a follower that lost its leader
//!   goes on answering plain reads for up to `syncLimit × tickTime`; but it
//!   answers a read queued behind a sync only once the leader answered the
//!   sync. So an answer proves the session was alive on the leader after the
//!   read was *sent* and the node still exists, and the new local deadline
//!   is `sent + ttl − drift` (less the round trip, where that would pass
//!   11/20 of the session timeout). A node that is gone (deleted by an
//!   operator) or a session that is expired or closed answers `Refused`: the
//!   guard is lost at once. While disconnected, or connected to a follower
//!   without a leader, the read does not return, so the guard is lost when
//!   its local deadline passes, never later than the server could expire the
//!   session.
//!   A lease granted at once, by the listing sent behind the create,
//!   starts with the create: a write, which the leader itself checks and
//!   commits, so its answer proves what a read behind a sync proves, and the
//!   fast path sends no sync (the reasoning is in `queue.rs`). A lease
//!   granted after a wait starts with the listing that granted it, sent
//!   behind a sync, as is a permit's.
//! - After an expiry the backend opens a new session for the next acquisition;
//!   guards of the old session stay lost.
//! - ZooKeeper has no per-node expiry for ephemeral nodes, so a lease whose
//!   local deadline passes without a renewal (renewal off, a leaked guard, a
//!   guard whose release could not run) has its node deleted by the backend
//!   then: the key is free again within the ttl, not at the session's end.
//! - A crashed holder blocks others for the session timeout, not the ttl.
//!
//! # Runtimes
//!
//! `zookeeper-client` runs a session (requests, heartbeats) as a task on the
//! tokio runtime that opened it: the one [`connect`](ZooKeeperBackend::connect)
//! ran on, or, after the session ended, that of the acquisition that opened
//! the next one. Guards taken on any other runtime use it through a channel.
//!
//! - What must outlive a caller's runtime runs on the session's runtime: the
//!   deletion of a node whose local deadline passed, and the background
//!   delete of a dropped acquisition's node. So a guard dropped after its own
//!   runtime ended (a `#[tokio::test]`, a `block_on` in a helper thread),
//!   whose release cannot run there, still frees its key by its local
//!   deadline, within the ttl of its last renewal.
//! - If the session's runtime ends, the session's task ends with it: nothing
//!   is sent any more, and the server expires the session, with its nodes, one
//!   session timeout after the last heartbeat. The backend notices, forgets
//!   those nodes, reports their guards lost at the next renewal, and opens a
//!   new session on the runtime of the next acquisition.
//! - Either way, a node whose guard is gone outlives the guard by at most
//!   ttl + session timeout (the ttl until its deadline, if the session's
//!   runtime ends just before that, the session timeout for the server to
//!   expire the session), and by at most the ttl while that runtime runs.
//!
//! # URL
//!
//! `zk://[user:password@]host[:port][,host[:port]...][/chroot][?session_timeout=30s&prefix=dlock]`
//!
//! - `user:password@`: digest auth (`addauth digest user:password`). The
//!   key directories and lock nodes dlock creates then get the ACL "the
//!   creator's identity: all; anyone: read": only clients with the same
//!   credentials can queue for (create children in) or delete from those
//!   directories, while anyone can still list and watch the queue, as
//!   waiters and Curator need. (ZooKeeper checks a delete against the
//!   parent's ACL, so the directory's ACL is what protects a holder's node.)
//!   The password never appears in `describe()`, `Debug` or errors.
//! - `session_timeout`: asked of the server (default 30 s, at most
//!   2^31 − 1 ms, which is all the protocol carries: a longer one is an
//!   `InvalidOption` rather than a request that wraps around); the server
//!   negotiates it into `[2, 20] × tickTime` (its default bounds). Leases
//!   last at most 11/20 of it, whatever ttl was asked, `Duration::MAX`
//!   included.
//! - `prefix`: the top node (default `dlock`).
//!
//! ```no_run
//! use dlock::{backends::zookeeper::ZooKeeperBackend, Lock};
//! use std::sync::Arc;
//!
//! # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
//! let zk = Arc::new(ZooKeeperBackend::connect("zk://127.0.0.1:2181/app?session_timeout=10s").await?);
//! let guard = Lock::new("order:42").with_backend(zk).acquire().await?;
//! let fence = guard.fencing_token().expect("ZooKeeper gives fencing tokens");
//! println!("holding order:42 with fencing token {fence}");
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod config;
mod lease;
mod permits;
mod queue;
mod session;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::runtime::Handle;
use zookeeper_client::{
    Acl, Acls, Client, CreateMode, Error as ZkError, MultiReadResult, Permission, SessionState,
    Stat,
};

use self::config::Config;
use self::session::Session;
use crate::backend::{AcquireRequest, Lease, LockBackend, PermitBackend, PermitRequest, Renewal};
use crate::{deadline, LockError};

/// With digest auth: the creator's identity may do everything, anyone may
/// read (list and watch the queue).
static CREATOR_ALL_ANYONE_READ: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

/// Curator's lock name for `InterProcessMutex`: children are `_c_<uuid>-lock-<seq>`.
const LOCK_NAME: &str = "lock-";

/// How often a create or lookup is retried after a connection loss before
/// giving up with an error (each retry waits for the client to reconnect).
const MAX_RETRIES: usize = 5;

/// How long the clean-up of a timed-out waiter may take before `acquire`
/// returns anyway (the node is then deleted in the background, or with the
/// session).
const CLEANUP_WAIT: Duration = Duration::from_secs(2);

/// A lock service on a ZooKeeper ensemble.
///
/// One backend holds one ZooKeeper session at a time; every guard acquired
/// through it lives on that session. Clone the `Arc`, not the backend, to
/// share it. See the [module docs](self) for the protocol and the rules that
/// tie the ttl to the session timeout.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
/// assert_eq!(zk.lock_path("jobs/nightly")?, "/dlock/jobs%2Fnightly");
/// dlock::registry().register("zk", std::sync::Arc::new(zk));
/// let guard = dlock::Lock::new("jobs/nightly").backend("zk").acquire().await?;
/// # drop(guard); Ok(()) }
/// ```
pub struct ZooKeeperBackend {
    config: Config,
    /// The URL with its password redacted.
    shown: String,
    /// The session new acquisitions use; replaced when it has ended or the
    /// runtime it ran on is gone.
    current: Mutex<Option<Arc<Session>>>,
    /// Serialises opening a new session, so concurrent callers open one.
    reopening: tokio::sync::Mutex<()>,
    /// The negotiated session timeout of the current session, in ms.
    session_timeout_ms: AtomicU64,
    /// Held nodes by path: the session each lives on, its local deadline,
    /// and what deletes it in the background if the lease is forgotten.
    held: Arc<Mutex<HeldMap>>,
}

type HeldMap = HashMap<String, Held>;

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("url", &self.shown)
            .field("session_timeout", &self.session_timeout())
            .field("held", &lock(&self.held).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these mutexes is one insert, remove or assignment,
    // so a poisoned mutex still guards consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One held node.
struct Held {
    /// The session the node lives on (it may no longer be the current one).
    session: Arc<Session>,
    /// The lease's local deadline, moved by each renewal. When it passes
    /// without one, the node is deleted (see [`reap`]).
    valid_until: Instant,
    /// What deletes the node in the background if it is dropped unreleased.
    cleanup: Cleanup,
    /// Dropped with the entry (release, reaping): ends the node's reaper
    /// task at once instead of leaving it asleep until the deadline.
    _reaper: tokio::sync::oneshot::Sender<()>,
}

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
struct Cleanup {
    runtime: Handle,
    client: Client,
    dir: String,
    uuid: String,
    /// Known once the create answered; before that the node is found by uuid.
    path: Option<String>,
    armed: bool,
}

impl Cleanup {
    fn new(session: &Session, dir: &str, uuid: &str) -> Self {
        Cleanup {
            runtime: session.runtime().clone(),
            client: session.client.clone(),
            dir: dir.to_owned(),
            uuid: uuid.to_owned(),
            path: None,
            armed: true,
        }
    }

    fn set_path(&mut self, path: &str) {
        self.path = Some(path.to_owned());
    }

    /// The node was deleted, or went with its session: nothing to do on drop.
    fn disarm(&mut self) {
        self.armed = false;
    }

    fn arm(&mut self) {
        self.armed = true;
    }

    /// Deletes the node now (found by uuid if its path is not known yet),
    /// and disarms on success.
    async fn remove_now(&mut self) -> Result<(), ZkError> {
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
        drop(self.runtime.spawn(async move {
            if let Err(e) = remove_node_eventually(&client, &dir, &uuid, path.as_deref()).await {
                tracing::debug!(%dir, error = %e, "background delete of a lock node failed; it ends with the session");
            }
        }));
    }
}

/// A node [`ZooKeeperBackend::create_protected`] made.
struct Created {
    /// The node's path.
    path: String,
    /// The stat the create answered with (found again by uuid after a lost
    /// answer): its `czxid` is the fencing token.
    stat: Stat,
    /// The children of the node's directory, listed behind the create, when
    /// asked for and answered.
    children: Option<Vec<String>>,
    /// When the create that made the node was sent (or, after lost answers,
    /// the earliest one that may have made it).
    sent: Instant,
    /// When its answer came (or, if it was lost, the node was found again).
    answered: Instant,
}

/// [`remove_node`] for background deletes, which nobody waits for: retries
/// after connection losses for as long as the session lives, so a node whose
/// lease ran out never stays for the rest of a session that reconnected.
/// Each retry waits for the client to reconnect (requests queue meanwhile),
/// plus a pause that grows to one second.
async fn remove_node_eventually(
    client: &Client,
    dir: &str,
    uuid: &str,
    path: Option<&str>,
) -> Result<(), ZkError> {
    let mut pause = Duration::from_millis(50);
    loop {
        match remove_node(client, dir, uuid, path).await {
            Err(ZkError::ConnectionLoss) if !client.state().is_terminated() => {
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
async fn remove_node(
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
            Err(ZkError::ConnectionLoss) if tries < MAX_RETRIES => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The child of `dir` whose name carries `uuid`, with its stat: how a create
/// whose answer was lost is recovered (Curator's protected mode).
async fn find_by_uuid(
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
            Err(ZkError::ConnectionLoss) if tries < MAX_RETRIES => tries += 1,
            other => return other,
        }
    }
}

/// Deletes the node at `path` once its local deadline has passed without a
/// renewal.
///
/// ZooKeeper keeps an ephemeral node for as long as the session lives, but a
/// dlock lease ends at its ttl when it is not renewed (renewal off, or a
/// holder whose watchdog cannot run): by then the guard reports the loss, so
/// the node must go too, or the key stays blocked by a lease nobody holds.
async fn reap(
    held: Weak<Mutex<HeldMap>>,
    path: String,
    mut at: Instant,
    mut gone: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => {}
            // The entry was removed (released or reaped): nothing to watch.
            _ = &mut gone => return,
        }
        let Some(map) = held.upgrade() else {
            return;
        };
        let expired = {
            let mut map = lock(&map);
            match map.get(&path) {
                None => return,
                Some(h) if h.valid_until > Instant::now() => {
                    at = h.valid_until;
                    None
                }
                Some(_) => map.remove(&path),
            }
        };
        if let Some(mut node) = expired {
            tracing::debug!(%path, "lease ran out without renewal; deleting its node");
            // Dropping an armed cleanup deletes the node in the background.
            node.cleanup.arm();
            return;
        }
    }
}

/// A version 4 UUID from OS randomness, in Curator's textual form.
fn new_uuid() -> Result<String, LockError> {
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

/// The sequence number of a lock child, as Curator reads it: the digits
/// after the last `lock-`. `None` for children that are not lock nodes.
fn sequence_of(name: &str) -> Option<i64> {
    let (_, seq) = name.rsplit_once(LOCK_NAME)?;
    seq.parse().ok()
}

/// Whether `own` has the smallest sequence among the lock children.
fn is_first(children: &[String], own: &str) -> bool {
    let Some(mine) = sequence_of(own) else {
        return false;
    };
    children
        .iter()
        .filter_map(|c| sequence_of(c))
        .all(|seq| seq >= mine)
}

fn fence_of(stat: &Stat) -> Option<u64> {
    u64::try_from(stat.czxid).ok()
}

fn is_connected(state: SessionState) -> bool {
    matches!(
        state,
        SessionState::SyncConnected | SessionState::ConnectedReadOnly
    )
}

/// A wait deadline tokio's timer can take, or none: tokio rounds a deadline
/// up to the next millisecond, which overflows (and panics) within a
/// millisecond of the latest `Instant` there is. A deadline that far away is
/// no limit anyway.
fn representable(deadline: Option<Instant>) -> Option<Instant> {
    deadline.filter(|d| d.checked_add(Duration::from_secs(1)).is_some())
}

/// Errors that mean the session is gone, and with it every node it held.
fn session_ended(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// Sends a `sync`, then the read `read` makes, at once (one round trip), and
/// returns the read's answer once both answered.
///
/// A follower that lost its leader goes on answering plain reads for up to
/// `syncLimit × tickTime`, while the leader, the only server that expires
/// sessions, may already be expiring ours. A follower answers a read queued
/// behind a `sync` of the same session only after the leader answered the
/// sync, so this answer proves the leader reachable, and the session alive
/// on it, after the request was sent: what a lease may be counted from.
async fn after_sync<T, F>(client: &Client, read: impl FnOnce() -> F) -> Result<T, ZkError>
where
    F: std::future::Future<Output = Result<T, ZkError>>,
{
    let synced = client.sync("/");
    let answer = read();
    // Both are on their way; an unconfirmed answer proves nothing.
    synced.await?;
    answer.await
}

impl ZooKeeperBackend {
    /// Connects to the ensemble named by `url` and opens a session.
    ///
    /// URL: `zk://[user:password@]host[:port][,host[:port]...][/chroot][?session_timeout=30s&prefix=dlock]`
    /// (see the [module docs](self)).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] naming the URL (password redacted) if it
    /// is malformed; [`LockError::Backend`] if no server can be reached.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backends::zookeeper::ZooKeeperBackend;
    /// let zk = ZooKeeperBackend::connect("zk://app:secret@10.0.0.1:2181,10.0.0.2:2181/services").await?;
    /// assert_eq!(dlock::LockBackend::describe(&zk), "zk://app:***@10.0.0.1:2181,10.0.0.2:2181/services");
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = config::parse(url)?;
        let backend = ZooKeeperBackend {
            config,
            shown: crate::url::redact(url),
            current: Mutex::new(None),
            reopening: tokio::sync::Mutex::new(()),
            session_timeout_ms: AtomicU64::new(0),
            held: Arc::new(Mutex::new(HashMap::new())),
        };
        backend.session().await?;
        Ok(backend)
    }

    /// The node under which `key`'s contenders create their children,
    /// relative to the URL's chroot: `/<prefix>/<escaped key>`.
    ///
    /// This is the path to give Curator's `InterProcessMutex` (with the same
    /// chroot as namespace) to lock the same key from Java.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if `key` is not a valid lock key.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181?prefix=locks").await?;
    /// // Java: new InterProcessMutex(curator, "/locks/orders%2F42")
    /// assert_eq!(zk.lock_path("orders/42")?, "/locks/orders%2F42");
    /// # Ok(()) }
    /// ```
    pub fn lock_path(&self, key: &str) -> Result<String, LockError> {
        crate::key::validate(key)?;
        Ok(format!(
            "/{}/{}",
            self.config.prefix,
            config::escape_key(key)
        ))
    }

    /// The session timeout the server granted to the current session; lease
    /// ttls are clamped to 11/20 of it (see the module docs). Zero before a
    /// session was opened.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181?session_timeout=10s").await?;
    /// // The server may have granted less (or more), within [2, 20] × its tickTime.
    /// println!("a crashed holder blocks others for about {:?}", zk.session_timeout());
    /// # Ok(()) }
    /// ```
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms.load(Ordering::Relaxed))
    }

    /// The `zookeeper-client` handle of the current session, for work dlock
    /// does not cover (reading lock nodes, sharing the session). Operations
    /// on it run on the session that keeps this backend's locks: closing or
    /// expiring it loses them. `None` if the last session ended.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let zk = dlock::backends::zookeeper::ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
    /// if let Some(client) = zk.client() {
    ///     // Who is queued for `order:42`, in Curator's `_c_<uuid>-lock-<seq>` names.
    ///     let queue = client.list_children(&zk.lock_path("order:42")?).await?;
    ///     println!("{queue:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn client(&self) -> Option<Client> {
        lock(&self.current)
            .as_ref()
            .filter(|s| s.is_usable())
            .map(|s| s.client.clone())
    }

    fn error(&self, what: impl fmt::Display, e: ZkError) -> LockError {
        LockError::backend(self.shown.clone(), format!("{what}: {e}"))
    }

    /// The current session if new work can use it.
    fn usable_session(&self) -> Option<Arc<Session>> {
        lock(&self.current)
            .as_ref()
            .filter(|s| s.is_usable())
            .cloned()
    }

    /// The live session, opening a new one if the last one ended or the
    /// runtime it ran on is gone. A new session runs on the caller's runtime.
    async fn session(&self) -> Result<Arc<Session>, LockError> {
        if let Some(s) = self.usable_session() {
            return Ok(s);
        }
        let _one = self.reopening.lock().await;
        if let Some(s) = self.usable_session() {
            return Ok(s);
        }
        let runtime = Handle::try_current().map_err(|_| {
            LockError::backend(
                self.shown.clone(),
                "a ZooKeeper session needs a tokio runtime to run on",
            )
        })?;
        let mut connector = Client::connector()
            .with_session_timeout(self.config.session_timeout)
            // Fail when every host refused, instead of retrying until the
            // session timeout: the caller's own deadline decides about retries.
            .with_fail_eagerly();
        if let Some(digest) = &self.config.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        let session = Session::open(runtime, connector, &self.config.connect_string)
            .await
            .map_err(|e| self.error("cannot open a ZooKeeper session", e))?;
        let client = &session.client;
        let timeout = u64::try_from(client.session_timeout().as_millis()).unwrap_or(u64::MAX);
        self.session_timeout_ms.store(timeout, Ordering::Relaxed);
        tracing::debug!(session = %client.session_id(), timeout_ms = timeout, "ZooKeeper session opened");
        let session = Arc::new(session);
        *lock(&self.current) = Some(session.clone());
        self.forget_dead_sessions();
        Ok(session)
    }

    /// Drops the entries of nodes whose session's runtime is gone. Their
    /// reapers died with that runtime, and nothing can reach the server
    /// through the session any more; the server deletes the nodes when it
    /// expires the session. Called when a new session opens, which is when
    /// a session found dead is replaced.
    fn forget_dead_sessions(&self) {
        let dead: Vec<Held> = {
            let mut held = lock(&self.held);
            let paths: Vec<String> = held
                .iter()
                .filter(|(_, h)| !h.session.is_alive())
                .map(|(p, _)| p.clone())
                .collect();
            paths.iter().filter_map(|p| held.remove(p)).collect()
        };
        // Dropped outside the lock: a `Cleanup` may enter a runtime.
        drop(dead);
    }

    /// The ACL of every node dlock creates (see the module docs on digest auth).
    fn node_acls(&self) -> Acls<'static> {
        if self.config.digest.is_some() {
            Acls::new(&CREATOR_ALL_ANYONE_READ)
        } else {
            Acls::anyone_all()
        }
    }

    /// The lease on a granted node. `sent` and `answered` frame the request
    /// the lease is counted from, one the leader answered (see `lease.rs`).
    fn lease(
        &self,
        req: &AcquireRequest,
        client: &Client,
        path: &str,
        stat: &Stat,
        (sent, answered): (Instant, Instant),
    ) -> Result<Lease, LockError> {
        let session_timeout = client.session_timeout();
        let ttl = req.ttl.min(lease::max_ttl(session_timeout));
        let fencing_token = fence_of(stat).ok_or_else(|| {
            LockError::backend(
                self.shown.clone(),
                format!("lock node {path} has the invalid czxid {}", stat.czxid),
            )
        })?;
        Ok(Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl,
            fencing_token: Some(fencing_token),
            valid_until: lease::deadline(sent, answered, ttl, session_timeout),
            resource: path.to_owned(),
        })
    }

    /// Creates the key's directory as container nodes.
    async fn make_dir(&self, client: &Client, dir: &str) -> Result<(), LockError> {
        match client
            .mkdir(dir, &CreateMode::Container.with_acls(self.node_acls()))
            .await
        {
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

    /// Creates `_c_<uuid>-lock-<seq>` under `dir`, creating `dir` if needed,
    /// and finds the node again by its uuid if the answer is lost. With
    /// `list`, the children of `dir` are asked for right behind the create.
    async fn create_protected(
        &self,
        client: &Client,
        dir: &str,
        uuid: &str,
        data: &[u8],
        list: bool,
    ) -> Result<Created, LockError> {
        let prefix = format!("{dir}/_c_{uuid}-{LOCK_NAME}");
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
            // before it, and costs no round trip of its own.
            let listed = list.then(|| client.list_children(dir));
            match created.await {
                Ok((stat, seq)) => {
                    let answered = Instant::now();
                    // A failed listing is asked for again by the caller.
                    let children = match listed {
                        Some(listed) => listed.await.ok(),
                        None => None,
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
                Err(ZkError::ConnectionLoss) => match find_by_uuid(client, dir, uuid).await {
                    // A lost create made the node: the leader committed it
                    // after `sent`.
                    Ok(Some((path, stat))) => {
                        return Ok(Created {
                            path,
                            stat,
                            children: None,
                            sent,
                            answered: Instant::now(),
                        })
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        return Err(self.error(
                            "lost the answer to a create and could not look for the node",
                            e,
                        ))
                    }
                },
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

    /// Records a granted node, and starts the task that deletes it if its
    /// local deadline passes without a renewal.
    ///
    /// The reaper runs on the session's runtime, not the caller's, so it
    /// outlives a guard whose runtime ended before the guard could be
    /// released there.
    fn remember(&self, lease: &Lease, session: &Arc<Session>, cleanup: Cleanup) {
        let (reaper, gone) = tokio::sync::oneshot::channel();
        lock(&self.held).insert(
            lease.resource.clone(),
            Held {
                session: session.clone(),
                valid_until: lease.valid_until,
                cleanup,
                _reaper: reaper,
            },
        );
        session.spawn(reap(
            Arc::downgrade(&self.held),
            lease.resource.clone(),
            lease.valid_until,
            gone,
        ));
    }
}

#[async_trait]
impl LockBackend for ZooKeeperBackend {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let dir = self.lock_path(&req.key)?;
        let session = self.session().await?;
        let client = &session.client;
        // One attempt must not wait for a reconnect: while disconnected,
        // requests queue until the session comes back or expires.
        let state = client.state();
        if !is_connected(state) {
            return Err(LockError::backend(
                self.shown.clone(),
                format!("ZooKeeper is unreachable (session {state})"),
            ));
        }
        let limit = client.session_timeout();
        match tokio::time::timeout(limit, self.try_once(&session, req, &dir)).await {
            Ok(answer) => answer,
            Err(_) => Err(LockError::backend(
                self.shown.clone(),
                format!("ZooKeeper did not answer within the session timeout ({limit:?})"),
            )),
        }
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let deadline = representable(deadline);
        let dir = self.lock_path(&req.key)?;
        let uuid = new_uuid()?;
        let opened = async { self.session().await };
        let session = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), opened).await {
                Ok(c) => c?,
                Err(_) => {
                    return Err(LockError::backend(
                        self.shown.clone(),
                        "could not open a ZooKeeper session before the wait ran out",
                    ))
                }
            },
            None => opened.await?,
        };
        let client = &session.client;
        // Armed from before the create: the node goes if this future is
        // dropped, or the wait runs out, at any await.
        let mut cleanup = Cleanup::new(&session, &dir, &uuid);
        let waited = deadline::until(
            deadline,
            self.queue_and_wait(&session, req, &dir, &mut cleanup),
        )
        .await;
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

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let sent = Instant::now();
        let mut answers: Vec<Option<Result<Renewal, LockError>>> =
            leases.iter().map(|_| None).collect();
        // Group the leases by session: one multi-read per session (almost
        // always one), sent before any answer is awaited.
        let mut groups: Vec<(Arc<Session>, Vec<usize>)> = Vec::new();
        // Entries of sessions whose runtime is gone: their reapers died with
        // it, so they are forgotten here (dropped outside the lock).
        let mut dead = Vec::new();
        {
            let mut held = lock(&self.held);
            for (i, lease) in leases.iter().enumerate() {
                let Some(h) = held.get(&lease.resource) else {
                    answers[i] = Some(Ok(Renewal::Refused));
                    continue;
                };
                if !h.session.is_alive() {
                    answers[i] = Some(Ok(Renewal::SessionExpired));
                    dead.extend(held.remove(&lease.resource));
                    continue;
                }
                if h.session.client.state().is_terminated() {
                    answers[i] = Some(Ok(Renewal::SessionExpired));
                    continue;
                }
                match groups.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &h.session)) {
                    Some((_, idx)) => idx.push(i),
                    None => groups.push((h.session.clone(), vec![i])),
                }
            }
        }
        drop(dead);
        // Each read goes behind a sync (see `after_sync`), both sent now.
        let mut reads = Vec::new();
        for (session, idx) in &groups {
            let synced = session.client.sync("/");
            let mut reader = session.client.new_multi_reader();
            let mut bad = None;
            for &i in idx {
                if let Err(e) = reader.add_get_data(&leases[i].resource) {
                    bad = Some(e);
                }
            }
            reads.push(match bad {
                Some(e) => Err(e),
                None => Ok((synced, reader.commit())),
            });
        }
        for ((session, idx), read) in groups.iter().zip(reads) {
            let client = &session.client;
            let session_timeout = client.session_timeout();
            let result = match read {
                Ok((synced, commit)) => match synced.await {
                    Ok(()) => commit.await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let answered = Instant::now();
            match result {
                Ok(results) => {
                    for (&i, r) in idx.iter().zip(results) {
                        answers[i] = Some(match r {
                            MultiReadResult::Data { stat, .. }
                                if stat.ephemeral_owner == client.session_id().0 =>
                            {
                                Ok(Renewal::Renewed {
                                    valid_until: lease::deadline(
                                        sent,
                                        answered,
                                        leases[i].ttl,
                                        session_timeout,
                                    ),
                                })
                            }
                            // Not ours any more: the lease is lost.
                            MultiReadResult::Data { .. } => Ok(Renewal::Refused),
                            // Deleted, by an operator or with the session.
                            MultiReadResult::Error {
                                err: ZkError::NoNode,
                            } => Ok(Renewal::Deleted),
                            MultiReadResult::Error { err } => {
                                Err(self.error("renewal read failed", err))
                            }
                            other => Err(LockError::backend(
                                self.shown.clone(),
                                format!("renewal read got an unexpected answer: {other:?}"),
                            )),
                        });
                    }
                }
                Err(e) if session_ended(&e) => {
                    for &i in idx {
                        answers[i] = Some(Ok(Renewal::SessionExpired));
                    }
                }
                Err(e) => {
                    for &i in idx {
                        answers[i] = Some(Err(self.error("renewal read failed", e.clone())));
                    }
                }
            }
        }
        // A node reaped while the read was in flight stays lost; every other
        // renewed node moves its deadline, under the same lock the reaper
        // takes, so the two never disagree.
        {
            let mut held = lock(&self.held);
            for (lease, answer) in leases.iter().zip(answers.iter_mut()) {
                if let Some(Ok(Renewal::Renewed { valid_until })) = answer {
                    match held.get_mut(&lease.resource) {
                        Some(h) => h.valid_until = h.valid_until.max(*valid_until),
                        None => *answer = Some(Ok(Renewal::Refused)),
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(LockError::backend(
                        self.shown.clone(),
                        "renewal got fewer answers than it asked for",
                    ))
                })
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(mut held) = lock(&self.held).remove(&lease.resource) else {
            return Ok(false);
        };
        if !held.session.is_usable() {
            // The session ended, and its ephemeral nodes with it (or ends
            // soon: its runtime is gone, so the server expires it).
            held.cleanup.disarm();
            return Ok(false);
        }
        match held.session.client.delete(&lease.resource, None).await {
            Ok(()) => {
                held.cleanup.disarm();
                Ok(true)
            }
            Err(ZkError::NoNode) => {
                held.cleanup.disarm();
                Ok(false)
            }
            Err(e) if session_ended(&e) => {
                held.cleanup.disarm();
                Ok(false)
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

    fn permits(&self) -> Option<&dyn PermitBackend> {
        Some(self)
    }
}

#[async_trait]
impl PermitBackend for ZooKeeperBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        let once = self.permit(req, true);
        let limit = self
            .session_timeout()
            .max(std::time::Duration::from_secs(1));
        match tokio::time::timeout(limit, once).await {
            Ok(answer) => answer,
            Err(_) => Err(LockError::backend(
                self.shown.clone(),
                format!("ZooKeeper did not answer within {limit:?}"),
            )),
        }
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        // Dropping the wait at the deadline deletes our node (`Cleanup`).
        deadline::until(representable(deadline), self.permit(req, false))
            .await
            .unwrap_or(Ok(None))
    }

    /// Permit nodes are session nodes like lock nodes: the same read.
    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew(leases).await
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        self.release(lease).await
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

    #[test]
    fn the_smallest_sequence_is_first_whatever_the_uuid() {
        let children: Vec<String> = [
            "_c_bbb-lock-0000000007",
            "_c_aaa-lock-0000000005",
            "_c_ccc-lock-0000000009",
            "unrelated",
        ]
        .map(String::from)
        .to_vec();
        assert!(is_first(&children, "_c_aaa-lock-0000000005"));
        assert!(!is_first(&children, "_c_bbb-lock-0000000007"));
        assert!(!is_first(&children, "garbage"));
        assert_eq!(sequence_of("_c_x-lock-lock-0000000012"), Some(12));
    }
}
