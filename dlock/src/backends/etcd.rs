//! The etcd backend (`etcd://`, `etcds://`): leases, a FIFO queue by create
//! revision, and the key layout of `etcdctl lock`.
//!
//! Capabilities: ✓ mutual exclusion across processes and machines · ✓ lease
//! expiry enforced by the server · ✓ fencing tokens (the key's create
//! revision) · ✓ FIFO, first come first served · ✓ waiters woken by a watch
//! on their predecessor only (no thundering herd) · ✓ interoperates with
//! `etcdctl lock` and Go's `concurrency.Mutex` · ✓ semaphores (see
//! `permits.rs`) · ✓ read-write locks in the layout of etcd's recipe
//! `RWMutex` (see *Read-write locks* below) · ✓ leader election in the
//! layout of Go's `concurrency.Election`, with `etcdctl elect` (see
//! `election.rs`) · ✓ count-down latches (see `latch.rs`) · ✓ TLS and
//! user/password
//! auth · ✗ lease lengths finer than etcd's whole seconds on the server (the
//! client side keeps the exact ttl; see below).
//!
//! Needs the cargo feature `etcd` (and `tls` for `etcds://`). Building it
//! needs `protoc` and the protobuf well-known types (Debian:
//! `protobuf-compiler libprotobuf-dev`).
//!
//! # Protocol
//!
//! - A waiter or holder of `order:42` is the key `dlock/order:42/<lease-id-hex>`,
//!   attached to a lease, created by a transaction that only creates
//!   (`create_revision == 0`). This is the layout of `etcdctl lock
//!   dlock/order:42` and Go's `concurrency.Mutex`, so their locks and ours
//!   exclude each other. A key is escaped into one path segment (see
//!   *Keys containing `/` or `%`* below).
//! - The holder is the key with the smallest create revision directly
//!   under `dlock/order:42/` (see *Only direct children contend*). The same transaction that enqueues reads it, so an
//!   uncontended acquire is one round trip.
//! - A waiter watches only its predecessor (the largest smaller create
//!   revision) for its delete, from the revision after the read that found
//!   it, then reads again: one wake-up per release, not one per waiter.
//! - The fencing token is the own key's create revision: etcd's revision is
//!   global and only grows, so successive holders of a key get larger ones.
//! - Release deletes the own key if its create revision is still ours, and
//!   the next acquisition of the key by this backend starts only once etcd
//!   answered that delete (if the `release` future is dropped half-way, the
//!   delete finishes in the background first). A timed-out or dropped
//!   `acquire` deletes its key too (in the background if it was dropped), so
//!   no ghost waiter blocks the queue.
//! - An enqueue that finds a key of its own name (same session lease) left
//!   by an earlier guard, whose delete has not landed, never takes it over:
//!   that key's revision was the earlier guard's fencing token and a delete
//!   of it may still arrive. It deletes the old key by its revision and
//!   creates its own (`concurrency.Mutex` adopts it instead).
//! - Renewal is a lease keep-alive, plus a check of the held keys in the same
//!   round of requests (a read of them, or for many keys one watch of the
//!   namespace's deletes: see `deletions.rs`), so that a key deleted behind
//!   our back (`etcdctl del`) is noticed and reported as lost even while its
//!   lease lives on.
//! - A held key's loss is heard at once, not at the next renewal: each held
//!   key has a watcher from its create revision + 1, all on one watch stream
//!   per backend; a delete of it (`etcdctl del`, `etcdctl lease revoke`) or
//!   a put by someone else rings the loss alarm and the watchdog renews at
//!   once (see `key_watch.rs`).
//!
//! # Read-write locks
//!
//! [`RwLock`](crate::RwLock) follows the layout and rules of etcd's own
//! recipe `RWMutex` (`client/v3/experimental/recipes`, rwmutex.go), so a Go
//! service with `recipe.NewRWMutex(session, "dlock-rw/prices")` and dlock's
//! `RwLock::new("prices")` take one read-write lock
//! ([`EtcdBackend::rw_prefix`] gives the name):
//!
//! - A reader or writer, waiting or holding, is the key
//!   `<prefix>-rw/<escaped key>/read/<n>` or `.../write/<n>` with an empty
//!   value, on the backend's session lease for the ttl (as the mutex's keys
//!   are, see below). `<n>` is the time in nanoseconds since the Unix epoch,
//!   as the recipe names its keys (made unique within the process). It is
//!   created by a transaction `If(Version(key) == 0)`; a name that exists
//!   is another client's, and another is picked.
//! - The create revision is the place in line. A reader waits for the
//!   `write` key with the largest mod revision below its own to be
//!   deleted; a writer for the key of either kind with the largest mod
//!   revision below its own (the recipe's `WithLastRev` +
//!   `WithMaxModRev(myRev - 1)`; the recipe's keys are never modified, so
//!   their mod revision is their create revision). It watches that one key's delete, from the revision
//!   after its read, and reads again. The creating transaction reads first,
//!   so an uncontended read or write is one round trip. A later reader sees
//!   an earlier waiting writer's key and waits: writers do not starve.
//! - The fencing token of a read or write lease is its own key's create
//!   revision. Writes: revisions only grow, so successive writers get
//!   larger ones. A read R is above every write W granted before it: had
//!   W's key been younger than R's, W would have waited for R's key, which
//!   lives until R lets go. And it is below every write W granted after it:
//!   had W's key been older, R would have waited for it to go, so W was
//!   granted before R. (Not the token of the write it follows, as on the
//!   memory backend: a number between that write's and the next one's.)
//! - Renewal, loss, release and cancel safety are the mutex's: a
//!   keep-alive of the session plus a read of the key by its create
//!   revision; a compare-and-delete by that revision; a timed-out or
//!   dropped acquire deletes its key (in the background if dropped), so a
//!   cancelled writer does not keep readers out. A reader's share frees
//!   with its key: by its release, by its session's expiry if its process
//!   dies, or by the clean-up of keys past their local deadline.
//! - The `-rw` root keeps these keys apart from the plain lock of the same
//!   key (`<prefix>/<key>/`): neither lock's directory contains the other's
//!   keys, and they do not exclude each other. (A backend with
//!   `?prefix=dlock-rw` would put its plain locks among the read-write
//!   locks of `?prefix=dlock`: do not name prefixes so.)
//!
//! Like the recipe, a writer waits for every `read/<n>` and `write/<n>`
//! key and a reader for every `write/<n>` key; unlike the recipe (which
//! waits for any key under the prefix), a deeper key such as
//! `<prefix>-rw/prices/eu/write/<n>` (another lock's) is never waited
//! for (see *Only direct children contend* below). Unlike the recipe, a
//! dlock waiter whose own key vanished (deleted, or its session expired)
//! queues again at the end instead of going on.
//!
//! # Only direct children contend
//!
//! etcd has no directories: a range read of `dlock/tenant/` also returns
//! `dlock/tenant/7/<lease>`, the key of `etcdctl lock dlock/tenant/7` (or of
//! a backend whose prefix is `dlock/tenant`), which is another lock. So a
//! key with a further `/` after a lock's directory is never its holder, nor
//! the predecessor a waiter watches, nor a permit holder of a semaphore
//! (`<prefix>-semaphores/<name>/<seg>` only), nor a reader or writer of a
//! read-write lock (`<prefix>-rw/<key>/read/<n>` and `.../write/<n>` only),
//! whoever wrote it. The reads skip such keys page by page (32 keys a
//! read), so a directory shared with a few of them costs nothing more.
//! (`etcdctl lock dlock/tenant` and Go's `concurrency.Mutex` do count
//! them: they wait for `dlock/tenant/7`'s holders as well.)
//!
//! # One lease per backend and ttl
//!
//! Like an `etcdctl lock` process or a Go `concurrency.Session`, a backend
//! keeps one lease (a *session*) per ttl rounded up to whole seconds, and
//! attaches all its keys of that ttl to it. Why not one lease per guard:
//!
//! - A per-guard lease costs a grant (and a revoke) per acquisition: two
//!   more writes, each a raft round with an fsync, on top of the two an
//!   acquire/release cycle needs. The session makes a cycle as cheap as the
//!   raw `etcdctl lock` protocol.
//! - The watchdog's batched `renew` becomes one keep-alive per session,
//!   whatever the number of guards.
//! - The key name is `<lease-hex>`, as `etcdctl` writes it; two guards of one
//!   session on one key would collide, and dlock's local queue already makes
//!   the guards of one backend take a key one after another (the backend
//!   itself keeps a guard's release and the next guard's enqueue apart, see
//!   above).
//!
//! What a shared lease gives up, and how it is covered: a key must not be
//! kept alive by its neighbours' keep-alives once its own guard stopped
//! renewing it (renewal off, or a guard dropped where its release could not
//! run, such as a runtime that ended). The core deletes every lease whose
//! local deadline passes, and the backend itself deletes, with every
//! keep-alive it sends, the keys whose local deadline has passed, so such a
//! key leaves the server within about a ttl (plus the renewal interval of
//! the guards that keep the session alive) while this process lives; if the
//! process dies, the whole session expires with it.
//!
//! How long a session lives, so that the leases on the server are bounded
//! by the ttls in use, not by every ttl ever seen:
//!
//! - A session no key uses (no held key, no acquisition under way) for
//!   [`SESSION_IDLE`] (5 s; checked every second on dlock's background
//!   runtime) is taken out of the backend and revoked. An acquisition that
//!   comes at that moment never gets the revoked lease: it finds no session
//!   and grants a fresh one (the decision and every hand-out are under one
//!   lock; see `session.rs`). Counted by `dlock_etcd_idle_sessions_total`.
//! - Dropping the backend revokes the sessions left. Inside a runtime the
//!   revokes run on dlock's background runtime; outside any (after the
//!   runtime shut down, in a plain thread, at the end of `main`) the drop
//!   waits for them, at most about 2 s, since the process may end next.
//!
//! # Lease lengths
//!
//! etcd leases are whole seconds, and etcd raises short ones to its minimum
//! (1.5 election timeouts, 2 s with default settings). The session's ttl is
//! the requested ttl rounded *up*; the local deadline of a guard comes from
//! the ttl the caller asked for, counted from when the grant or keep-alive
//! request was *sent*, so it never falls after the server's expiry.
//!
//! # Failures
//!
//! - A request that could not reach a member (refused, reset, no leader) is
//!   sent again, to whichever member the client picks, up to 4 times; the
//!   client spreads requests over all members of the URL.
//! - A waiter with a deadline retries errors until its deadline, keeping its
//!   place in the queue through a leader election; if the deadline passes
//!   while etcd fails, `acquire` returns [`LockError::Backend`], not a
//!   timeout. Without a deadline it gives up once etcd has not answered for
//!   a ttl.
//! - Renewal errors are retried by the core until the local deadline; a
//!   lease etcd reports gone, or a held key that is no longer there, is
//!   [`Renewal::SessionExpired`] or [`Renewal::Deleted`]: the guard is lost.
//!
//! # Keys containing `/` or `%`
//!
//! A key is one path segment of the etcd key: `%` becomes `%25` and `/`
//! becomes `%2F` (every other byte stays), so `tenant/7` lives under
//! `dlock/tenant%2F7/` and `tenant/7/order` under `dlock/tenant%2F7%2Forder/`,
//! and the two are independent locks, as on every other backend. Semaphore
//! names are escaped the same way.
//!
//! Keys without `/` and `%` keep exactly the `etcdctl lock <prefix>/<key>`
//! layout. A key with them is the lock `etcdctl lock <prefix>/<escaped key>`
//! (`etcdctl lock dlock/tenant%2F7` for `tenant/7`), not `etcdctl lock
//! dlock/tenant/7`; [`EtcdBackend::queue_prefix`] gives the name. Versions
//! of dlock before this escaping used the raw key: for keys with `/` or `%`,
//! do not mix them with this one.
//!
//! # URLs
//!
//! `etcd://[user:password@]host[:port][,host[:port]...][?options]`, and
//! `etcds://` for TLS. The port defaults to 2379. Options:
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `prefix=dlock` | the key namespace; `etcdctl lock <prefix>/<key>` takes the same lock | `dlock` |
//! | `timeout=5s` | how long one request may take (`500ms`, `5s`) | `5s` |
//! | `tcp_keepalive=5s` | TCP keep-alive's idle time on every connection (`0`: off); beside it an HTTP/2 ping every 5 s, unanswered within 3 s, closes a dead connection | `5s` |
//! | `ca=/path/ca.pem` | `etcds://` only, required: the CA that signed the members' certificates | none |
//! | `domain=name` | `etcds://` only: the name the certificates are checked against | the host |
//! | `compaction=1h` | dlock compacts the cluster's history, keeping the last `1h` (every `1h`, up to the revision read an hour earlier; see `compaction.rs`), for a cluster that does not compact itself (`--auto-compaction-retention` is better where you can set it). A compaction is cluster-wide: other clients' history goes too | off |
//!
//! The password is percent-decoded and never shown by `describe()`, `Debug`
//! or errors.
//!
//! # Example
//!
//! ```no_run
//! use dlock::{backends::etcd::EtcdBackend, Lock};
//! use std::{sync::Arc, time::Duration};
//!
//! # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
//! let etcd = Arc::new(EtcdBackend::connect("etcd://127.0.0.1:2379?prefix=dlock").await?);
//! let guard = Lock::new("order:42").with_backend(etcd).wait(Duration::from_secs(5)).acquire().await?;
//! // `etcdctl lock dlock/order:42` now waits until we release.
//! println!("fencing token {:?}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```

// The files of this backend, by concern (what ARCHITECTURE.md's "Inside a backend"
// table points to):
// - URL / configuration: `config.rs` (+ TLS)
// - requests, errors: `client.rs`
// - waiting in line: `queue.rs` (the `Line` every entry waits in: sessions, retries, watch,
//   clean-up; a line says what it asks (`Asked`), how it names, creates and waits behind an entry,
//   and knows its `Inner`; the lease of a won entry is the trait's default), `mutex.rs` (the plain
//   lock's line), `contenders.rs` (only a directory's direct children are entries; paged reads)
// - renewal: `session.rs` (one lease per ttl; revoked after `SESSION_IDLE` unused, and at the
//   backend's drop), `held.rs`; `renew.rs` (`renew_any`: one keep-alive per session, then
//   `read_revisions`: held keys read in transactions of at most 64 keys and 128 KiB, 128 in
//   flight), or for 128 keys and more in one renewal `deletions.rs` (one watch stream of the
//   namespace's deletes marks held records deleted; a renewal waits for one progress answer; keys
//   older than the watch, and renewals it does not answer in time, are read)
// - hearing a loss at once: `key_watch.rs` (a watcher per held key, all on one stream, from the
//   key's create revision + 1; a delete or a foreign put marks the record and rings the loss alarm)
// - sessions: `session.rs`
// - clean-up of abandoned entries: `queue.rs` (`Queued`), `held.rs`
// - semaphores (`PermitBackend`): `permits.rs`
// - leader election (`ElectionBackend`): `election.rs` (`own_layout`: `concurrency.Election`'s
//   keys `<prefix>-election/<name>/<lease-hex>` in the mutex's `Line`
//   (`enqueue_in`/`predecessor_in` with the directory and value), its own turn (the directory),
//   `proclaim` by create revision, a watch of the directory)
// - read-write locks (`RwBackend`): `rw.rs` (etcd's recipe `RWMutex`: a `Line` whose entries are
//   `read/<ns>`, `write/<ns>` under `<prefix>-rw/<key>/`)
// - count-down latches (`LatchBackend`): `latch.rs` (a key under `<prefix>-latches/`, one shared
//   watch per waited-on name)
// - double barriers (`BarrierBackend`): `barrier.rs` (etcd's recipe: member keys on the session
//   lease under `<prefix>-barriers/<name>/members/`, a `ready` key, a watch of the prefix)
mod barrier;
mod client;
mod compaction;
mod config;
mod contenders;
mod deletions;
mod election;
mod held;
mod inspect;
mod key_watch;
mod latch;
mod mutex;
mod names;
mod permits;
mod queue;
mod refused;
mod renew;
mod rw;
mod session;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Client, ConnectOptions, GetOptions};

use self::deletions::DeleteWatch;
use self::held::Held;
use self::key_watch::KeyWatch;
use self::names::Kind;
use self::refused::About;
pub use self::session::SESSION_IDLE;
use self::session::{Session, SHUTDOWN_REVOKE};
use crate::backend::{AcquireRequest, Capabilities, Lease, LockBackend, Renewal};
use crate::LockError;

/// The most keys one renewal read asks for: etcd's default `--max-txn-ops`
/// is 128; stay well below it.
const TXN_CHUNK: usize = 64;

/// The most one renewal read may carry, counting its request and its answer
/// (see [`read_cost`]): a twelfth of etcd's default `--max-request-bytes`
/// (1.5 MiB) and far below the 4 MiB a gRPC answer may take, so neither the
/// number of held keys nor their length makes a read etcd refuses.
const MAX_READ_BYTES: usize = 128 * 1024;

/// How many renewal reads are in flight at once. A read is linearizable:
/// etcd answers it once it has applied every write committed before it, so
/// while acquisitions flood the server each wave of reads waits for the
/// whole backlog of writes. Reads in flight together share that wait (etcd
/// confirms them with one `ReadIndex`); 50,000 held keys are 782 reads,
/// which four at a time lost most leases while 50,000 locks were being
/// taken (measured: 40,358 of 50,000 lost at ttl 3 s), and go in seven
/// waves here. (Even so they fell behind past about 40,000 keys: many keys
/// are now checked by the watch of deletes instead, `deletions.rs`; the
/// reads remain for a few keys and as its fallback.)
const READS_IN_FLIGHT: usize = 128;

/// A lock service on an etcd cluster.
///
/// See the [module docs](self) for the protocol, the URL syntax and why one
/// lease serves many guards.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// let etcd = dlock::backends::etcd::EtcdBackend::connect("etcd://10.0.0.1:2379,10.0.0.2:2379").await?;
/// dlock::registry().register("etcd", std::sync::Arc::new(etcd));
/// let guard = dlock::Lock::new("nightly-report").backend("etcd").acquire().await?;
/// # drop(guard); Ok(()) }
/// ```
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("url", &self.inner.shown)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// What the backend, its background cleanups and its renewals share.
struct Inner {
    client: Client,
    /// The URL with the password redacted.
    shown: String,
    prefix: String,
    /// The value of each lock entry: the holder name `inspect` shows.
    client_name: String,
    timeout: Duration,
    /// One session lease per ttl in whole seconds, while it is used (see
    /// `session.rs`'s `revoke_idle`).
    sessions: tokio::sync::Mutex<HashMap<u64, Arc<Session>>>,
    /// The keys this backend holds, by etcd key (see `held.rs`).
    held: Mutex<HashMap<String, Held>>,
    /// The watch of deletes that renewals of many keys ask instead of reading
    /// every key (see `deletions.rs`).
    delete_watch: tokio::sync::Mutex<DeleteWatch>,
    /// The watcher of each held key, on one stream, and the loss alarm it
    /// rings (see `key_watch.rs`).
    key_watch: Mutex<KeyWatch>,
    /// One turn per lock key: an acquisition holds it from its first request
    /// until it holds the key or its entry is gone from the server (cleaned
    /// up after a timeout or cancellation), and a release from its first
    /// request until its delete is answered. So no two requests of this
    /// backend race for one etcd key name: two acquisitions, or an
    /// acquisition and the cleanup or release of the previous one.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The count-down latches' watches, one per waited-on latch (see `latch.rs`).
    latch_watches: crate::backends::shared_watches::SharedWatches,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these mutexes is one insert, remove or assignment,
    // so a poisoned mutex still guards consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EtcdBackend {
    /// Connects to the etcd cluster named by `url` and checks that it answers.
    ///
    /// URL syntax and options: see the [module docs](self).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] naming the URL (password redacted) if it
    /// is malformed, or `etcds://` is used without the `tls` feature or the
    /// CA file cannot be read; [`LockError::Backend`] if no member answers or
    /// the credentials are refused.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backends::etcd::EtcdBackend;
    /// let plain = EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
    /// let secure = EtcdBackend::connect("etcds://app:s3cret@etcd.internal:2379?ca=/etc/etcd/ca.pem").await?;
    /// assert_eq!(dlock::LockBackend::describe(&secure), "etcds://app:***@etcd.internal:2379?ca=/etc/etcd/ca.pem");
    /// # drop(plain); Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        /// How long an HTTP/2 ping may go unanswered.
        const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);
        let config = config::parse(url)?;
        let shown = crate::url::redact(url);
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            // HTTP/2 pings find a member that died, or a flow that a NAT
            // forgot, without a closed connection: a ping every 5 s (etcd
            // refuses them more often), unanswered within 3 s, closes the
            // connection, so a dead flow is replaced within about 8 s
            // (issue 52; it was 15 s with a ping every 10 s).
            .with_keep_alive(
                Duration::from_secs(5),
                config.timeout.min(KEEP_ALIVE_TIMEOUT),
            )
            .with_keep_alive_while_idle(true)
            // A member cut off from its leader fails requests at once
            // instead of holding them, so we try another member.
            .with_require_leader(true);
        if let Some(idle) = config.tcp_keepalive {
            options = options.with_tcp_keepalive(idle);
        }
        if let Some((name, password)) = &config.user {
            options = options.with_user(name.clone(), password.clone());
        }
        if config.tls {
            options = config::tls_options(options, &config, &shown)?;
        }
        let endpoints = config.endpoints.clone();
        // On dlock's background runtime: the client's channel spawns its
        // workers (and they their connections) on the runtime it is made
        // on, and renewals must not wait for the caller's to be driven.
        let connecting = crate::lease::background::run(async move {
            Client::connect(&endpoints, Some(options)).await
        });
        let client = tokio::time::timeout(config.timeout, connecting)
            .await
            .map_err(|_| {
                LockError::backend(
                    shown.clone(),
                    format!("no etcd member answered within {:?}", config.timeout),
                )
            })?
            .map_err(|e| LockError::backend(shown.clone(), e))?;
        let inner = Arc::new(Inner {
            client,
            shown,
            prefix: config.prefix,
            client_name: config
                .client_name
                .unwrap_or_else(|| crate::backend::holder::default_client_name().to_owned()),
            timeout: config.timeout,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            delete_watch: tokio::sync::Mutex::new(DeleteWatch::default()),
            key_watch: Mutex::new(KeyWatch::default()),
            turns: Mutex::new(HashMap::new()),
            latch_watches: crate::backends::shared_watches::SharedWatches::default(),
        });
        if let Some(retention) = config.compaction {
            compaction::start(Arc::downgrade(&inner), retention);
        }
        // The client connects lazily; one read proves a member answers and
        // that the credentials may read the namespace.
        let probe = GetOptions::new().with_prefix().with_count_only();
        inner
            .rpc(|| {
                let mut kv = inner.client.kv_client();
                let (dir, probe) = (inner.dir_of(""), probe.clone());
                async move { kv.get(dir, Some(probe)).await }
            })
            .await
            .map_err(|e| inner.name_connect_refusal(e))?;
        session::watch_idle(&inner);
        Ok(EtcdBackend { inner })
    }

    /// The etcd key prefix under which the queue of `key` lives
    /// (`<prefix>/<escaped key>/`): `etcdctl get --prefix` on it lists the
    /// holder and the waiters, oldest first by create revision, and `etcdctl
    /// lock` on it without the trailing `/` takes the same lock.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let etcd = dlock::backends::etcd::EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
    /// assert_eq!(etcd.queue_prefix("order:42"), "dlock/order:42/");
    /// // `/` and `%` are escaped: `tenant/7/order` is not inside this queue.
    /// assert_eq!(etcd.queue_prefix("tenant/7"), "dlock/tenant%2F7/");
    /// # Ok(()) }
    /// ```
    pub fn queue_prefix(&self, key: &str) -> String {
        self.inner.dir_of(key)
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn describe(&self) -> String {
        self.inner.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let about = About::Lock(&req.key);
        let answer = self.inner.acquire(req, None, true).await;
        answer.map_err(|e| self.inner.name_refusal(e, about))
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let about = About::Lock(&req.key);
        let answer = self.inner.acquire(req, deadline, false).await;
        answer.map_err(|e| self.inner.name_refusal(e, about))
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let renewed = self.renew_any(leases).await;
        self.inner.name_refusals(leases, renewed, About::Lock)
    }

    /// Deletes the key if its create revision is still ours, keeping the
    /// key's turn until etcd answered; if etcd fails, or this future is
    /// dropped first, the delete goes on in the background (see `held.rs`).
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        // An election's candidate key keeps the election's turn (its
        // directory, `election.rs`), a lock's the lock key's.
        let election_dir;
        let turn = if self.inner.is_election_entry(&lease.resource) {
            election_dir = format!("{}/", self.inner.prefix_of(Kind::Election, &lease.key));
            election_dir.as_str()
        } else {
            lease.key.as_str()
        };
        let answer = self.inner.release_entry(lease, Some(turn)).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Lock(&lease.key)))
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            latch: Some(self),
            barrier: Some(self),
            ..Capabilities::all(self)
        }
    }

    /// Rung when a held key's watcher sees it deleted or rewritten, or the
    /// watch stream breaks (see `key_watch.rs`).
    fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(lock(&self.inner.key_watch).alarm.subscribe())
    }

    fn client_name(&self) -> Option<&str> {
        Some(&self.inner.client_name)
    }

    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, LockError> {
        let answer = self.inner.inspect_lock(key).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Lock(key)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, crate::LockInfo)>, LockError> {
        let answer = self.inner.list_locks(prefix).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Lock(prefix)))
    }

    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let answer = self.inner.force_release_lock(key).await;
        answer.map_err(|e| self.inner.name_refusal(e, About::Lock(key)))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Revoke the session leases left, so any key on them goes now
        // rather than after a ttl (an hour's ttl would keep its lease for
        // the hour).
        let ids: Vec<i64> = self
            .sessions
            .get_mut()
            .values()
            .filter(|s| !s.is_dead())
            .map(|s| s.id)
            .collect();
        if ids.is_empty() {
            return;
        }
        let leases = self.client.lease_client();
        // On dlock's background runtime, where the client's channel lives,
        // whatever runtime (if any) drops the backend; all at once, each
        // bounded.
        let revokes = async move {
            let mut all = tokio::task::JoinSet::new();
            for id in ids {
                let mut leases = leases.clone();
                all.spawn(async move {
                    let _ = tokio::time::timeout(SHUTDOWN_REVOKE, leases.revoke(id)).await;
                });
            }
            while all.join_next().await.is_some() {}
        };
        // Inside a runtime (or on dlock's own thread) the drop must not
        // block it: the revokes go on in the background while the runtime
        // lives on. Outside any runtime (after the runtime shut down, in a
        // plain thread, at the end of `main`) nothing says the process
        // lives long enough: wait for them, bounded.
        if tokio::runtime::Handle::try_current().is_ok() || crate::lease::background::is_current() {
            crate::lease::background::spawn(revokes);
            return;
        }
        let (done, revoked) = std::sync::mpsc::channel();
        crate::lease::background::spawn(async move {
            revokes.await;
            let _ = done.send(());
        });
        let _ = revoked.recv_timeout(SHUTDOWN_REVOKE + Duration::from_millis(500));
    }
}
