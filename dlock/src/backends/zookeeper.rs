//! The ZooKeeper backend (`zk://`): ephemeral sequential nodes in Apache
//! Curator's layout, a FIFO queue that watches only its predecessor, and the
//! session heartbeat as the renewal.
//!
//! Capabilities: ✓ mutual exclusion between processes and machines · ✓ lease
//! expiry (the session timeout) · ✓ fencing tokens (the node's `czxid`) ·
//! ✓ FIFO wake-up, each waiter woken by its predecessor's deletion only (no
//! herd) · ✓ interoperates with Curator's `InterProcessMutex` on the same path ·
//! ✓ chroot · ✓ digest auth, with ACLs that hold (see *Permissions*) ·
//! ✓ semaphores (see `permits.rs`) · ✓ read-write locks, interoperating with
//! Curator's `InterProcessReadWriteLock` (see below and `rw.rs`) · ✓ leader
//! election, interoperating with Curator's `LeaderLatch` (see
//! `election.rs`) · ✓ count-down latches (a persistent node, see `latch.rs`) ·
//! ✓ TLS (`zks://`, feature `tls`).
//!
//! Enable with the cargo feature `zookeeper`.
//!
//! # Protocol
//!
//! - A key lives at `/<prefix>/<escaped key>` under the URL's chroot (default
//!   prefix `dlock`). The key is escaped into one node name: `%`, `/` and what
//!   ZooKeeper forbids (characters above U+FFFF included, which the Java
//!   server sees as UTF-16 surrogates and refuses) become `%XX` per UTF-8
//!   byte; `.` and `..` become `%2E`, `%2E%2E`. Only children named exactly
//!   `_c_<uuid>-lock-<10 digits>` are contenders (`order.rs`), so another
//!   prefix's key directory nested in a key's directory blocks nothing.
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
//! # Read-write locks
//!
//! [`RwLock`](crate::RwLock) takes Apache Curator's
//! `InterProcessReadWriteLock` layout, so a Java service doing
//! `new InterProcessReadWriteLock(client, path)` on the path
//! [`rw_lock_path`](ZooKeeperBackend::rw_lock_path) gives (with the URL's
//! chroot as Curator's namespace) and dlock exclude each other both ways.
//!
//! - A read-write lock lives at `/<prefix>-rw/<escaped key>`, apart from
//!   the key's plain lock at `/<prefix>/<escaped key>`: an `RwLock` and a
//!   `Lock` of one key are separate objects and do not exclude each other
//!   (neither lists the other's nodes).
//! - A reader creates the EPHEMERAL_SEQUENTIAL child
//!   `_c_<uuid>-__READ__<seq>`, a writer `_c_<uuid>-__WRIT__<seq>` (data:
//!   the owner token), created and listed in one round trip and found again
//!   by uuid as a lock node is. Both kinds share the directory's sequence,
//!   which orders them in one queue.
//! - A writer holds when its node is first of all; otherwise it watches its
//!   predecessor, read or write. A reader holds when no write node sorts
//!   before it; otherwise it watches the first write node (Curator's rule:
//!   every reader behind a writer wakes when that writer's node goes, and
//!   readers behind readers hold at once). So a waiting writer is served
//!   before every reader that queued after it. (The rules: `order.rs`.)
//! - Fencing token: the node's `czxid`, for both kinds. Write tokens
//!   strictly increase; a read's token is its own node's `czxid`, above the
//!   token of every write granted before it and below that of every write
//!   granted after it (the argument is in `rw.rs`).
//! - Everything else is the lock's: renewal by the session and a read
//!   behind a `sync`, the 11/20 ttl clamp, loss, deleting a node whose
//!   lease ran out, and cancel safety (a dropped or timed-out `read()` or
//!   `write()` deletes its node, so a cancelled writer does not keep
//!   readers out); an acquisition whose first request meets a session
//!   expired unknown to the client starts over once on a new session.
//! - Limits: a crashed reader's share frees when the server expires its
//!   session (the session timeout), not after its ttl, as a crashed lock
//!   holder's does. Curator's own reentrancy (a thread holding the write
//!   lock takes the read lock without queueing) stays within Curator;
//!   dlock's is by scope. By Curator's rules, the read node of such a
//!   downgrade queues behind any writer that waited meanwhile, which then
//!   holds beside the downgraded reader once the write lock goes, be it
//!   Curator's or dlock's.
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
//! - A node deleted between renewals is heard at once: an exists-watch on
//!   each held node rings the backend's loss alarm on its delete (or a
//!   change of its data, or its session's end), and the watchdog renews
//!   every lease at once (see `node_watch.rs`).
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
//! tokio runtime that opens it. This backend opens every session, the first
//! (in [`connect`](ZooKeeperBackend::connect)) and each one after an expiry,
//! on dlock's own background runtime, whatever runtime the caller is on;
//! guards taken on any runtime use it through a channel.
//!
//! - So the session's heartbeats and the watchdog's renewals go on while the
//!   runtime that connected is idle (a synchronous program's `block_on`
//!   runtime between calls) or gone.
//! - What must outlive a caller's runtime runs on the session's runtime too:
//!   the deletion of a node whose local deadline passed, and the background
//!   delete of a dropped acquisition's node. So a guard dropped after its own
//!   runtime ended (a `#[tokio::test]`, a `block_on` in a helper thread),
//!   whose release cannot run there, still frees its key by its local
//!   deadline, within the ttl of its last renewal.
//! - Only if dlock's background runtime could not be started at all does a
//!   session run on the runtime that opened it. Should that runtime end, the
//!   session's task ends with it: nothing is sent any more, and the server
//!   expires the session, with its nodes, one session timeout after the last
//!   heartbeat. The backend notices, forgets those nodes, reports their
//!   guards lost at the next renewal, and opens a new session.
//!
//! # URL
//!
//! `zk[s]://[user:password@]host[:port][,host[:port]...][/chroot][?session_timeout=30s&timeout=5s&prefix=dlock&acl=creator_read&ca=..&cert=..&key=..]`
//!
//! - `user:password@`: digest auth (`addauth digest user:password`); see
//!   *Permissions* for the ACLs it brings. Over `zk://` the credentials
//!   cross the network in clear text: use `zks://` where the network is not
//!   trusted. The password never appears in `describe()`, `Debug` or errors.
//! - `session_timeout`: asked of the server (default 30 s, at most
//!   2^31 − 1 ms, which is all the protocol carries: a longer one is an
//!   `InvalidOption` rather than a request that wraps around); the server
//!   negotiates it into `[2, 20] × tickTime` (its default bounds). Leases
//!   last at most 11/20 of it, whatever ttl was asked, `Duration::MAX`
//!   included.
//! - `timeout`: a connection that hears nothing from its server this long
//!   is replaced, and the session carries on over a new one (default 5 s;
//!   the client pings after 3/8 of it without traffic, so a live server is
//!   never that silent). A flow that a NAT or load balancer forgot, or a
//!   stream broken mid-message, is noticed in that time instead of 2/5 of
//!   the session timeout. `zookeeper-client` ignores it when it is longer
//!   than 3/5 of the negotiated session timeout.
//! - `prefix`: the top node (default `dlock`).
//! - `acl`: `creator_read` (the default with credentials), `creator` or
//!   `open` (the only one without credentials); see *Permissions*.
//! - `zks://` (feature `tls`): TLS to every server (its `secureClientPort`).
//!   `ca` (required) is a PEM file of the CA that signed the servers'
//!   certificates; each certificate is checked against it and against the
//!   host name as the URL writes it (`zookeeper-client` has no separate
//!   name to check, so `domain` is an `InvalidOption`: write the hosts as
//!   their certificates name them). `cert` and `key` (PEM files, both or
//!   neither) give a client certificate, for servers with
//!   `ssl.clientAuth=need`. `zks://` without the `tls` feature, or without
//!   `ca`, is an `InvalidOption`.
//!
//! # Permissions
//!
//! ZooKeeper checks a delete against the *parent's* ACL, so a key
//! directory's ACL is what protects a holder's node.
//!
//! - **Without credentials, every node is `world:anyone:cdrwa`** (Curator's
//!   default too): any client of the ensemble can delete a holder's node,
//!   and so take its lock, and read its owner token. Use credentials
//!   (`zk://app:secret@…`, over `zks://`) and the default `creator_read`.
//! - With credentials, every node dlock creates (the prefix, key
//!   directories, lock, permit, read and write nodes) gets, by `acl`:
//!   `creator_read`: the URL's identity `cdrwa`, anyone `r` (others can
//!   list and watch the queue, as Curator's tools do, but not queue, delete
//!   or change); `creator`: the identity alone; `open`: `world:anyone:cdrwa`.
//! - A directory someone else made may be open. With `creator_read` or
//!   `creator`, each acquisition reads its key directory's ACL right behind
//!   the create of its node (pipelined: no round trip of its own), and
//!   hands out no lease under a directory weaker than its `acl`: it
//!   tightens it (`setACL`), or fails with a `Backend` error naming the node
//!   and its ACL if its identity may not. Key directories stay containers
//!   (see `acl.rs` for why a check on every acquisition rather than
//!   persistent directories): one the server removed when idle and another
//!   client created again open is tightened by the next acquisition. A
//!   prefix node dlock finds when it creates a key directory is checked the
//!   same way.
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

// The files of this backend, by concern (what ARCHITECTURE.md's "Inside a backend"
// table points to):
// - a lock's node, taken (in the queue) and deleted: `lock_node.rs`
// - the `LockBackend` impl, each call handed on: `lock_backend.rs`
// - URL / configuration: `config.rs` (key escaping, `?acl=`), `tls.rs` (`zks://`: `?ca=`,
//   `?cert=`/`?key=` as `zookeeper-client`'s `TlsOptions`; feature `tls`)
// - access control: `acl.rs` (the ACL of created nodes by `?acl=`; each acquisition's key
//   directory checked, tightened or refused)
// - waiting in line: `queue.rs` (+ the protected create; one queue code for lock, read and write
//   nodes), `order.rs` (Curator's rules of whose turn it is)
// - renewal: `renew.rs` (held nodes read in multi-reads of at most 1,000 nodes and 128 KiB,
//   behind one `sync` per session), `lease.rs`, `held.rs`; `node_watch.rs` (an exists-watch on
//   each held node rings the loss alarm when it is deleted, so the renewal runs at once)
// - sessions: `session.rs` (opened on dlock's runtime)
// - clean-up of abandoned entries: `cleanup.rs`, `stale.rs` (a campaign's sweep of its own
//   session's unused participant nodes)
// - semaphores (`PermitBackend`): `permits.rs`
// - leader election (`ElectionBackend`): `election.rs` (`own_layout`: Curator's `LeaderLatch`,
//   `latch-` nodes (`order.rs`'s `Queue::Latch`) in the lock's queue code, created from a request
//   carrying the value as the node's data; `proclaim` sets the data; a persistent recursive watch
//   for observers, re-made on a new session when its session ends)
// - read-write locks (`RwBackend`): `rw.rs` (Curator's `InterProcessReadWriteLock` layout,
//   `rw_lock_path`, why a read's `czxid` fences), `order.rs`
mod acl;
mod barrier;
mod cleanup;
mod config;
mod election;
mod held;
mod inspect;
mod latch;
mod lease;
mod lock_backend;
mod lock_node;
mod node_watch;
mod order;
mod permits;
mod queue;
mod renew;
mod rw;
mod semaphore_inspect;
mod session;
mod stale;
#[cfg(feature = "tls")]
mod tls;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use zookeeper_client::{Client, Error as ZkError, SessionState, Stat};

use self::config::Config;
use self::held::HeldMap;
use self::session::Session;
use crate::backend::{AcquireRequest, Lease};
use crate::LockError;

/// How long the clean-up of a timed-out waiter may take before `acquire`
/// returns anyway (the node is then deleted in the background, or with the
/// session).
const CLEANUP_WAIT: Duration = Duration::from_secs(2);

/// A session still opening after this long when the wait runs out means
/// ZooKeeper is not answering (`Backend`); sooner, the wait was just short
/// (`Timeout`). The same line as etcd's `STALLED`.
const SESSION_STALLED: Duration = Duration::from_secs(1);

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
    /// Campaigns in flight, by election directory (see `stale.rs`).
    campaigns: stale::Campaigns,
    /// A ttl cut to the session's bound is a WARN, once (see `lease.rs`).
    cut_ttl: lease::CutTtlWarning,
    /// Rung when a held node's watch fires (deleted, changed, session
    /// ended): the watchdog renews at once (see `node_watch.rs`).
    loss_alarm: tokio::sync::watch::Sender<u64>,
    /// The watches latch waiters share, one per latch node (see `latch.rs`).
    latch_watches: Arc<crate::backends::shared_watches::SharedWatches>,
    /// `zks://`: the TLS options every session connects with, read from the
    /// URL's files at `connect`.
    #[cfg(feature = "tls")]
    tls: Option<zookeeper_client::TlsOptions>,
}

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
    /// URL: `zk[s]://[user:password@]host[:port][,host[:port]...][/chroot][?session_timeout=30s&prefix=dlock&acl=..&ca=..&cert=..&key=..]`
    /// (see the [module docs](self)).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] naming the URL (password redacted) if it
    /// is malformed, asks for an `acl` it cannot have, or names TLS files
    /// that cannot be read; [`LockError::Backend`] if no server can be
    /// reached (or, over `zks://`, none passed the TLS checks).
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
        let shown = crate::url::redact(url);
        #[cfg(feature = "tls")]
        let tls = match &config.tls {
            Some(files) => Some(tls::options(files, &shown)?),
            None => None,
        };
        let backend = ZooKeeperBackend {
            config,
            shown,
            current: Mutex::new(None),
            reopening: tokio::sync::Mutex::new(()),
            session_timeout_ms: AtomicU64::new(0),
            held: Arc::new(Mutex::new(HashMap::new())),
            campaigns: stale::Campaigns::default(),
            cut_ttl: lease::CutTtlWarning::default(),
            loss_alarm: tokio::sync::watch::Sender::new(0),
            latch_watches: Arc::default(),
            #[cfg(feature = "tls")]
            tls,
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
        crate::backend::key::validate(key)?;
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
        let text = format!("{what}: {e}");
        // A lost connection or an unanswered request may pass: a waiting
        // acquisition asks again (`backend/transient.rs`).
        let transient = matches!(
            e,
            ZkError::ConnectionLoss
                | ZkError::Timeout
                | ZkError::NoHosts
                | ZkError::SessionMoved
                | ZkError::Throttled
        );
        if transient {
            LockError::backend(
                self.shown.clone(),
                crate::backend::transient::Transient::new(text),
            )
        } else {
            LockError::backend(self.shown.clone(), text)
        }
    }

    /// The current session if new work can use it.
    fn usable_session(&self) -> Option<Arc<Session>> {
        lock(&self.current)
            .as_ref()
            .filter(|s| s.is_usable())
            .cloned()
    }

    /// The live session, opening a new one if the last one ended or the
    /// runtime it ran on is gone. A new session runs on dlock's background
    /// runtime (see *Runtimes* in the module docs), whatever runtime the
    /// caller is on.
    async fn session(&self) -> Result<Arc<Session>, LockError> {
        if let Some(s) = self.usable_session() {
            return Ok(s);
        }
        let _one = self.reopening.lock().await;
        if let Some(s) = self.usable_session() {
            return Ok(s);
        }
        let mut connector = Client::connector()
            .with_session_timeout(self.config.session_timeout)
            // A silent connection is replaced after `?timeout=` (ignored,
            // and 2/5 of the session timeout kept, when ours is above 3/5
            // of the negotiated session timeout).
            .with_connection_timeout(self.config.timeout)
            // Fail when every host refused, instead of retrying until the
            // session timeout: the caller's own deadline decides about
            // retries (beyond the two quick ones of `Session::open`).
            .with_fail_eagerly();
        if let Some(digest) = &self.config.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            connector = connector.with_tls(tls.clone());
        }
        let secure = self.config.tls.is_some();
        let connect_string = self.config.connect_string.clone();
        // `zookeeper-client` spawns the session's task where it connects.
        let opened = crate::lease::background::run(async move {
            let runtime = Handle::try_current().ok()?;
            Some(Session::open(runtime, connector, &connect_string, secure).await)
        })
        .await;
        let session = opened
            .ok_or_else(|| {
                LockError::backend(
                    self.shown.clone(),
                    "a ZooKeeper session needs a tokio runtime to run on",
                )
            })?
            .map_err(|e| {
                let what = if secure {
                    // zookeeper-client reports a refused handshake as no
                    // host available: say what TLS needs.
                    "cannot open a ZooKeeper session over TLS (is the server's certificate signed by `?ca=`, does it name the host as the URL writes it, does the server want a client certificate: `?cert=` and `?key=`?)"
                } else {
                    "cannot open a ZooKeeper session"
                };
                self.error(what, e)
            })?;
        let client = &session.client;
        let timeout = u64::try_from(client.session_timeout().as_millis()).unwrap_or(u64::MAX);
        self.session_timeout_ms.store(timeout, Ordering::Relaxed);
        tracing::debug!(session = %client.session_id(), timeout_ms = timeout, "ZooKeeper session opened");
        let session = Arc::new(session);
        *lock(&self.current) = Some(session.clone());
        self.forget_dead_sessions();
        Ok(session)
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
        self.cut_ttl.check(&self.shown, req.ttl, session_timeout);
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
}
