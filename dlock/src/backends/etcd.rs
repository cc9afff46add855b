//! The etcd backend (`etcd://`, `etcds://`): leases, a FIFO queue by create
//! revision, and the key layout of `etcdctl lock`.
//!
//! Capabilities: ✓ mutual exclusion across processes and machines · ✓ lease
//! expiry enforced by the server · ✓ fencing tokens (the key's create
//! revision) · ✓ FIFO, first come first served · ✓ waiters woken by a watch
//! on their predecessor only (no thundering herd) · ✓ interoperates with
//! `etcdctl lock` and Go's `concurrency.Mutex` · ✓ semaphores (see
//! `permits.rs`) · ✓ TLS and user/password
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
//! - The holder is the key with the smallest create revision under
//!   `dlock/order:42/`. The same transaction that enqueues reads it, so an
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
//! - Renewal is a lease keep-alive, plus one read of the held keys in the same
//!   round of requests, so that a key deleted behind our back (`etcdctl del`)
//!   is noticed and reported as lost even while its lease lives on.
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
//! | `ca=/path/ca.pem` | `etcds://` only, required: the CA that signed the members' certificates | none |
//! | `domain=name` | `etcds://` only: the name the certificates are checked against | the host |
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

mod held;
mod names;
mod permits;
mod url;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
    WatchOptions, WatchStream,
};
use tokio::sync::OwnedMutexGuard;

use self::held::{revision_of_lease, Held};
use crate::backend::{
    lease_deadline, AcquireRequest, Lease, LockBackend, PermitBackend, PermitRequest, Renewal,
};
use crate::{deadline, LockError};

/// How many times an acquire starts over because its session lease vanished
/// under it before it reports an error: more means etcd keeps expiring
/// leases faster than we can use them.
const MAX_REQUEUES: u32 = 5;

/// etcd's default `--max-txn-ops` is 128; stay well below it.
const TXN_CHUNK: usize = 64;

/// How many times an enqueue deletes an older key that holds its entry name
/// before it gives up (one is the rule; more means an enqueue cut off in
/// flight landed late).
const STALE_TRIES: u32 = 4;

/// How many members a request tries when it cannot reach one (a 3- or
/// 5-member cluster with one or two members down).
const UNREACHABLE_TRIES: u32 = 4;

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
    timeout: Duration,
    /// One session lease per ttl in whole seconds.
    sessions: tokio::sync::Mutex<HashMap<u64, Arc<Session>>>,
    /// The keys this backend holds, by etcd key (see `held.rs`).
    held: Mutex<HashMap<String, Held>>,
    /// One turn per lock key: an acquisition holds it from its first request
    /// until it holds the key or its entry is gone from the server (cleaned
    /// up after a timeout or cancellation), and a release from its first
    /// request until its delete is answered. So no two requests of this
    /// backend race for one etcd key name: two acquisitions, or an
    /// acquisition and the cleanup or release of the previous one.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// One lease shared by the keys of one ttl.
struct Session {
    id: i64,
    /// The ttl etcd granted (it may raise short ones).
    granted: Duration,
    /// When the last successful grant or keep-alive was *sent*: the server's
    /// expiry is at least this plus `granted`.
    refreshed: Mutex<Instant>,
    /// etcd said the lease is gone; every key on it went with it.
    dead: AtomicBool,
    /// The keep-alive stream, opened on first use. Taken out while a
    /// keep-alive is in flight and put back only after its answer was read,
    /// so a keep-alive abandoned half-way (timeout, cancellation) never
    /// leaves a late answer to be mistaken for the next one's.
    keeper: tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
}

/// A lock key's turn within this backend (see [`Inner::turns`]).
struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    key: String,
    inner: Arc<Inner>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = lock(&self.inner.turns);
        // Forget the key's mutex once nobody holds or waits for it, so a
        // process that locks many distinct keys does not keep them all.
        if turns
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            turns.remove(&self.key);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these mutexes is one insert, remove or assignment,
    // so a poisoned mutex still guards consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The answer of etcd to a keep-alive.
enum Alive {
    Yes,
    /// The lease is gone (expired or revoked).
    Gone,
}

/// How an acquisition's talk with etcd stands, for when its deadline passes.
#[derive(Default)]
struct Progress {
    /// The latest error, cleared by the next answer.
    failure: Option<LockError>,
    /// A request to etcd has been unanswered since then.
    asking_since: Option<Instant>,
}

/// A request unanswered this long when the deadline passes means etcd is not
/// answering (a paused or partitioned member), not that the lock is busy.
const STALLED: Duration = Duration::from_secs(1);

impl Progress {
    fn answered(&mut self) {
        self.failure = None;
        self.asking_since = None;
    }

    /// What `acquire` returns when its deadline passed: a timeout, unless
    /// etcd was failing or silent, which is a backend error.
    fn at_deadline(self, inner: &Inner) -> Result<Option<Lease>, LockError> {
        match (self.failure, self.asking_since) {
            (Some(e), _) => Err(e),
            (None, Some(since)) if since.elapsed() >= STALLED => Err(inner.error(format!(
                "etcd did not answer for {:?} (a member paused or cut off?)",
                since.elapsed()
            ))),
            _ => Ok(None),
        }
    }
}

/// What a waiter found ahead of its entry.
enum Ahead {
    /// Nothing older: the lock is ours.
    First,
    /// The youngest older entry (raw bytes: other clients may write any key),
    /// and the store revision of the read that found it.
    Behind { key: Vec<u8>, revision: i64 },
    /// Our own entry is gone.
    Gone,
}

/// What an enqueue found.
enum Enqueued {
    /// Our key, created at `mine`, and the holder's create revision.
    Created { mine: i64, owner: Option<i64> },
    /// A guard of this backend still counts on the key of our name, until
    /// `until`. The core lets one local holder of a key in at a time, so
    /// this is at most the last moment of a lease being lost: the caller
    /// lets it end rather than take its key away.
    HeldHere { until: Instant },
}

/// Where an acquisition stands when it does not hold the lock (yet).
enum Step {
    Acquired(Lease, Arc<Session>),
    /// `try_acquire` found another holder.
    NotFirst,
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
        let config = url::parse(url)?;
        let shown = crate::url::redact(url);
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            // HTTP/2 pings find a member that died without closing its
            // connections. etcd refuses pings more often than every 5 s.
            .with_keep_alive(Duration::from_secs(10), config.timeout)
            // A member cut off from its leader fails requests at once
            // instead of holding them, so we try another member.
            .with_require_leader(true);
        if let Some((name, password)) = &config.user {
            options = options.with_user(name.clone(), password.clone());
        }
        if config.tls {
            options = tls_options(options, &config, &shown)?;
        }
        let client = tokio::time::timeout(
            config.timeout,
            Client::connect(&config.endpoints, Some(options)),
        )
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
            timeout: config.timeout,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            turns: Mutex::new(HashMap::new()),
        });
        // The client connects lazily; one read proves a member answers and
        // that the credentials may read the namespace.
        let probe = GetOptions::new().with_prefix().with_count_only();
        inner
            .rpc(|| {
                let mut kv = inner.client.kv_client();
                let (dir, probe) = (inner.dir_of(""), probe.clone());
                async move { kv.get(dir, Some(probe)).await }
            })
            .await?;
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

#[cfg(feature = "tls")]
fn tls_options(
    options: ConnectOptions,
    config: &url::Config,
    shown: &str,
) -> Result<ConnectOptions, LockError> {
    let mut tls = etcd_client::TlsOptions::new();
    if let Some(ca) = &config.ca {
        let pem = std::fs::read(ca).map_err(|e| {
            LockError::invalid_option(format!(
                "etcd URL `{shown}`: cannot read the CA file `{}`: {e}",
                ca.display()
            ))
        })?;
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
    }
    if let Some(domain) = &config.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(options.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
fn tls_options(
    _options: ConnectOptions,
    _config: &url::Config,
    shown: &str,
) -> Result<ConnectOptions, LockError> {
    Err(LockError::invalid_option(format!(
        "etcd URL `{shown}`: etcds:// needs TLS support; enable the `tls` feature of dlock"
    )))
}

impl Inner {
    fn error(&self, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> LockError {
        LockError::backend(self.shown.clone(), source)
    }

    /// `<prefix>/<escaped key>/`: the directory of a key's queue (see
    /// `names.rs` for the escaping).
    fn dir_of(&self, key: &str) -> String {
        format!("{}/{}/", self.prefix, names::escape(key))
    }

    /// `<prefix>/<escaped key>/<lease-hex>`: our entry in the queue, as
    /// `etcdctl` names it.
    fn entry_of(&self, key: &str, lease: i64) -> String {
        format!("{}{lease:x}", self.dir_of(key))
    }

    /// One request, bounded by the request timeout, and tried again on
    /// another member when the first one could not be reached.
    ///
    /// The client spreads requests over the members at random and keeps
    /// trying a dead one; a request that never reached a member was not
    /// applied, so sending it again is safe.
    async fn rpc<T, F, Fut>(&self, mut call: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = 0u32;
        loop {
            let error = match tokio::time::timeout(self.timeout, call()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => e,
                Err(_) => return Err(self.error(format!("no answer within {:?}", self.timeout))),
            };
            attempt += 1;
            if attempt >= UNREACHABLE_TRIES || !unreachable(&error) {
                return Err(self.error(error));
            }
            tokio::time::sleep(Duration::from_millis(10) * attempt).await;
        }
    }

    /// One transaction (see [`Inner::rpc`] for when it is sent again).
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        self.rpc(|| {
            let mut kv = self.client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    async fn turn(self: &Arc<Self>, key: &str) -> Turn {
        let mutex = lock(&self.turns).entry(key.to_owned()).or_default().clone();
        Turn {
            guard: Some(mutex.lock_owned().await),
            key: key.to_owned(),
            inner: self.clone(),
        }
    }

    fn try_turn(self: &Arc<Self>, key: &str) -> Option<Turn> {
        let mutex = lock(&self.turns).entry(key.to_owned()).or_default().clone();
        let guard = mutex.try_lock_owned().ok();
        // Built even on failure, so that its Drop prunes the map entry.
        let turn = Turn {
            guard,
            key: key.to_owned(),
            inner: self.clone(),
        };
        turn.guard.is_some().then_some(turn)
    }

    /// The live session for `ttl`, granting a lease if there is none.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>, LockError> {
        let secs = lease_seconds(ttl);
        let mut sessions = self.sessions.lock().await;
        if let Some(session) = sessions.get(&secs).filter(|s| !s.is_dead()) {
            return Ok(session.clone());
        }
        let sent = Instant::now();
        let granted = self
            .rpc(|| {
                let mut leases = self.client.lease_client();
                async move { leases.grant(secs as i64, None).await }
            })
            .await?;
        let session = Arc::new(Session {
            id: granted.id(),
            granted: Duration::from_secs(granted.ttl().max(0) as u64),
            refreshed: Mutex::new(sent),
            dead: AtomicBool::new(false),
            keeper: tokio::sync::Mutex::new(None),
        });
        sessions.insert(secs, session.clone());
        Ok(session)
    }

    /// Makes sure `session` was refreshed recently enough that a guard taken
    /// now has most of its ttl ahead of it.
    async fn fresh(&self, session: &Session, ttl: Duration) -> Result<Alive, LockError> {
        if session.refreshed().elapsed() <= ttl / 4 {
            return Ok(Alive::Yes);
        }
        session.keep_alive(self, Instant::now()).await
    }

    fn lease(
        &self,
        req: &AcquireRequest,
        session: &Session,
        entry: String,
        revision: i64,
    ) -> Lease {
        Lease {
            key: req.key.clone(),
            token: req.token.clone(),
            ttl: req.ttl,
            fencing_token: Some(revision as u64),
            valid_until: session.deadline(req.ttl),
            resource: entry,
        }
    }

    /// Enqueues under `session`: creates our key, and reads the holder in the
    /// same transaction.
    ///
    /// If a key of that name exists already, it is an older key of our
    /// session: a release or cleanup whose delete has not landed (or never
    /// will), or an enqueue cut off in flight. It is never adopted: its
    /// revision was another guard's fencing token, and a delete of that
    /// revision may still arrive and would take the key from under us. It
    /// is deleted by its revision, and ours created anew.
    async fn enqueue(
        &self,
        key: &str,
        session: &Session,
        entry: &str,
    ) -> Result<Enqueued, LockError> {
        let owner = TxnOp::get(
            self.dir_of(key),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(entry, "", Some(PutOptions::new().with_lease(session.id))),
                owner,
            ])
            .or_else([TxnOp::get(entry, None)]);
        for _ in 0..STALE_TRIES {
            let answer = self.txn(txn.clone()).await?;
            let ops = answer.op_responses();
            if answer.succeeded() {
                let Some(mine) = revision_of(&answer) else {
                    return Err(self.error(format!(
                        "etcd answered the enqueue of `{entry}` without its revision"
                    )));
                };
                let owner = first_create_revision(ops.get(1));
                return Ok(Enqueued::Created { mine, owner });
            }
            // Gone since: try again.
            let Some(stale) = first_create_revision(ops.first()) else {
                continue;
            };
            if let Some(until) = self.live_until(entry, stale) {
                return Ok(Enqueued::HeldHere { until });
            }
            self.delete_entry(entry, Some(stale)).await?;
        }
        Err(self.error(format!(
            "the queue entry `{entry}` stayed taken by an older key of this backend"
        )))
    }

    /// Deletes `entry` if it is still the key created at `revision`.
    ///
    /// Without a revision (an enqueue cut off before its answer), the key
    /// that has the name now is that enqueue's, or an older one nobody
    /// counts on, as the caller holds the key's turn (or the name is its
    /// alone, for a permit); it is read and deleted by its revision, so that
    /// a delete arriving late can never remove a key created after it.
    async fn delete_entry(&self, entry: &str, revision: Option<i64>) -> Result<bool, LockError> {
        let revision = match revision {
            Some(revision) => revision,
            None => {
                let answer = self
                    .txn(Txn::new().and_then([TxnOp::get(entry, None)]))
                    .await?;
                match first_create_revision(answer.op_responses().first()) {
                    // A live guard's key is never an abandoned entry.
                    Some(revision) if self.live_until(entry, revision).is_none() => revision,
                    _ => return Ok(false),
                }
            }
        };
        let txn = Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(entry, None)]);
        let answer = self.txn(txn).await?;
        Ok(answer.succeeded())
    }

    /// Deletes a queue entry after an acquisition ended without the lock,
    /// retrying a few times: a ghost entry would block the queue for as long
    /// as this process keeps the session alive.
    async fn clean_up(&self, entry: &str, revision: Option<i64>, racing_create: bool) {
        for attempt in 0..4u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100) * 2u32.pow(attempt)).await;
            }
            if self.delete_entry(entry, revision).await.is_ok() {
                if racing_create {
                    // The enqueue was cut off in flight: it may still be
                    // applied after our delete. Look once more a moment later.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = self.delete_entry(entry, revision).await;
                }
                return;
            }
        }
        tracing::warn!(entry, "could not delete an abandoned etcd queue entry; it goes when the session lease expires");
    }

    /// `try_acquire` and `acquire` in one: enqueue, and unless `once`, wait
    /// for the predecessors to go. `progress` tells the caller, if its
    /// deadline passes, whether etcd was failing or silent at that moment.
    ///
    /// Errors (a member down, an election) are retried: until the caller's
    /// deadline if it has one (a leader election takes a second or two and
    /// must not cost the waiter its place), else until etcd has not answered
    /// for a ttl: by then our queue entry may have expired, the service is
    /// down, and waiting on would only hide it.
    async fn take(
        self: &Arc<Self>,
        req: &AcquireRequest,
        queued: &mut Queued,
        once: bool,
        patient: bool,
        progress: &mut Progress,
    ) -> Result<Step, LockError> {
        let mut give_up = after(Instant::now(), req.ttl);
        let mut backoff = Duration::from_millis(20);
        let mut requeues = 0;
        let mut retry = |e: LockError, failure: &mut Option<LockError>, give_up: Instant| {
            if once || (!patient && Instant::now() + backoff >= give_up) {
                return Err(e);
            }
            *failure = Some(e);
            let wait = backoff;
            backoff = (backoff * 2).min(Duration::from_millis(500));
            Ok(wait)
        };
        'enqueue: loop {
            if requeues > MAX_REQUEUES {
                return Err(self.error(format!(
                    "the session lease of `{}` expired {MAX_REQUEUES} times while queueing; etcd is expiring leases faster than the ttl {:?}",
                    req.key, req.ttl
                )));
            }
            progress.asking_since = Some(Instant::now());
            let session = match self.session(req.ttl).await {
                Ok(s) => s,
                Err(e) => {
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                    continue;
                }
            };
            progress.asking_since = Some(Instant::now());
            match self.fresh(&session, req.ttl).await {
                Ok(Alive::Yes) => {}
                Ok(Alive::Gone) => {
                    requeues += 1;
                    continue;
                }
                Err(e) => {
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                    continue;
                }
            }
            give_up = after(Instant::now(), req.ttl);
            let entry = self.entry_of(&req.key, session.id);
            queued.entry = Some(entry.clone());
            queued.revision = None;
            queued.in_flight = true;
            progress.asking_since = Some(Instant::now());
            let (mine, owner) = match self.enqueue(&req.key, &session, &entry).await {
                Ok(Enqueued::Created { mine, owner }) => (mine, owner),
                Ok(Enqueued::HeldHere { until }) => {
                    // The name is a live guard's key: never ours to clean up.
                    queued.entry = None;
                    queued.in_flight = false;
                    progress.answered();
                    if once {
                        return Ok(Step::NotFirst);
                    }
                    tokio::time::sleep_until(until.into()).await;
                    continue;
                }
                Err(e) if lease_not_found(&e) => {
                    session.mark_dead();
                    queued.in_flight = false;
                    requeues += 1;
                    continue;
                }
                Err(e) => {
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                    continue;
                }
            };
            queued.in_flight = false;
            queued.revision = Some(mine);
            progress.answered();
            if owner == Some(mine) {
                return Ok(Step::Acquired(
                    self.lease(req, &session, entry, mine),
                    session,
                ));
            }
            if once {
                return Ok(Step::NotFirst);
            }

            // Wait for every older entry to go, watching only the youngest of them.
            loop {
                progress.asking_since = Some(Instant::now());
                match self.fresh(&session, req.ttl).await {
                    Ok(Alive::Yes) => give_up = after(Instant::now(), req.ttl),
                    Ok(Alive::Gone) => {
                        session.mark_dead();
                        requeues += 1;
                        continue 'enqueue;
                    }
                    Err(e) => {
                        tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                        continue;
                    }
                }
                progress.asking_since = Some(Instant::now());
                let ahead = match self.predecessor(&req.key, &entry, mine).await {
                    Ok(ahead) => ahead,
                    Err(e) => {
                        tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                        continue;
                    }
                };
                progress.answered();
                give_up = after(Instant::now(), req.ttl);
                let (predecessor, revision) = match ahead {
                    Ahead::First => {
                        return Ok(Step::Acquired(
                            self.lease(req, &session, entry, mine),
                            session,
                        ))
                    }
                    // Our entry is gone: the session expired, or someone
                    // deleted it. Queue again at the end.
                    Ahead::Gone => {
                        requeues += 1;
                        continue 'enqueue;
                    }
                    Ahead::Behind { key, revision } => (key, revision),
                };
                // Refresh the session before our entry's lease could run
                // low while we wait.
                let refresh_at = after(session.refreshed(), req.ttl / 4);
                progress.asking_since = Some(Instant::now());
                let stream = match self.watch(&predecessor, revision).await {
                    Ok(stream) => stream,
                    Err(e) => {
                        tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                        continue;
                    }
                };
                // Waiting for the holder is not waiting for etcd.
                progress.asking_since = None;
                if let Err(e) = self.await_delete(stream, refresh_at).await {
                    tokio::time::sleep(retry(e, &mut progress.failure, give_up)?).await;
                }
            }
        }
    }

    /// Reads the youngest entry older than ours, and checks ours still exists.
    async fn predecessor(&self, key: &str, entry: &str, mine: i64) -> Result<Ahead, LockError> {
        let older = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(mine - 1)
            .with_limit(1);
        let txn = Txn::new().and_then([
            TxnOp::get(self.dir_of(key), Some(older)),
            TxnOp::get(entry, None),
        ]);
        let answer = self.txn(txn).await?;
        let ops = answer.op_responses();
        if first_create_revision(ops.get(1)) != Some(mine) {
            return Ok(Ahead::Gone);
        }
        let predecessor = match ops.first() {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.key().to_vec()),
            _ => None,
        };
        Ok(match predecessor {
            None => Ahead::First,
            Some(key) => Ahead::Behind {
                key,
                revision: revision_of(&answer).unwrap_or(0),
            },
        })
    }

    /// Watches `predecessor` for its delete after `revision`.
    async fn watch(&self, predecessor: &[u8], revision: i64) -> Result<WatchStream, LockError> {
        // From the revision after our read: a delete at any later revision
        // is delivered, and a watch that starts at the current revision is
        // served at once, not by etcd's 100 ms catch-up loop.
        let options = WatchOptions::new().with_start_revision(revision + 1);
        self.rpc(|| {
            let mut watches = self.client.watch_client();
            let (key, options) = (predecessor.to_vec(), options.clone());
            async move { watches.watch(key, Some(options)).await }
        })
        .await
    }

    /// Waits until the watch sees a delete (the predecessor, or a permit
    /// under the semaphore's prefix), or until `until` (time to refresh the
    /// session). Either way the caller reads again.
    async fn await_delete(&self, mut stream: WatchStream, until: Instant) -> Result<(), LockError> {
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                _ = tokio::time::sleep_until(until.into()) => return Ok(()),
            };
            match message {
                Ok(Some(answer)) => {
                    let deleted = answer
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete);
                    // Cancelled (compaction, lost leader): read again.
                    if deleted || answer.canceled() {
                        return Ok(());
                    }
                }
                Ok(None) => return Err(self.error("the watch stream was closed by the server")),
                Err(e) => return Err(self.error(e)),
            }
        }
    }

    async fn acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        once: bool,
    ) -> Result<Option<Lease>, LockError> {
        let turn = if once {
            match self.try_turn(&req.key) {
                Some(turn) => turn,
                // This backend already holds or queues for the key.
                None => return Ok(None),
            }
        } else {
            match deadline::until(deadline, self.turn(&req.key)).await {
                Some(turn) => turn,
                None => return Ok(None),
            }
        };
        let mut queued = Queued {
            inner: self.clone(),
            turn: Some(turn),
            entry: None,
            revision: None,
            in_flight: false,
        };
        let mut progress = Progress::default();
        let taken = {
            let work = self.take(req, &mut queued, once, deadline.is_some(), &mut progress);
            deadline::until(deadline.filter(|_| !once), work).await
        };
        match taken {
            Some(Ok(Step::Acquired(lease, session))) => {
                // The key's turn goes with `queued`: the next acquisition of
                // the key waits in the core until this guard lets go, and a
                // release takes the turn again while its delete is on its way.
                queued.disarm();
                if let Some(revision) = revision_of_lease(&lease) {
                    self.hold(&lease, session, revision);
                }
                Ok(Some(lease))
            }
            Some(Ok(Step::NotFirst)) => {
                queued.finish().await;
                Ok(None)
            }
            Some(Err(e)) => Err(e),
            // The deadline passed: a timeout, unless the service was failing.
            None => progress.at_deadline(self),
        }
    }
}

/// A queue entry that is not (yet) a held lease. Dropping it deletes the
/// entry in the background, which makes `acquire` cancel safe.
struct Queued {
    inner: Arc<Inner>,
    turn: Option<Turn>,
    entry: Option<String>,
    revision: Option<i64>,
    /// The enqueue request was sent and not answered.
    in_flight: bool,
}

impl Queued {
    /// The acquisition won: nothing to clean up.
    fn disarm(&mut self) {
        self.entry = None;
    }

    /// Deletes the entry now (the server just answered, so this is quick).
    async fn finish(mut self) {
        if let Some(entry) = self.entry.take() {
            self.inner
                .clean_up(&entry, self.revision, self.in_flight)
                .await;
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        let (inner, revision, racing) = (self.inner.clone(), self.revision, self.in_flight);
        // The turn moves into the cleanup: the next acquisition of this key
        // by this backend starts only after the entry is gone.
        let turn = self.turn.take();
        // Never panic in Drop: without a runtime the entry stays until the
        // session lease expires, or until the next enqueue of the key deletes
        // it (by its revision, as it does any older key of its name).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                inner.clean_up(&entry, revision, racing).await;
                drop(turn);
            });
        }
    }
}

impl Session {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    fn refreshed(&self) -> Instant {
        *lock(&self.refreshed)
    }

    /// The local deadline of a guard of `ttl` on this session.
    fn deadline(&self, ttl: Duration) -> Instant {
        lease_deadline(self.refreshed(), ttl.min(self.granted))
    }

    /// Sends a keep-alive, unless one sent at or after `since` already
    /// succeeded (concurrent renewals share one round trip). In the same
    /// moment, deletes the held keys that outlived their local deadline:
    /// the keep-alive must not keep those on the server.
    async fn keep_alive(&self, inner: &Inner, since: Instant) -> Result<Alive, LockError> {
        let (_, alive) = tokio::join!(inner.clear_expired(), self.exchange(inner, since));
        alive
    }

    /// The keep-alive itself (see [`Session::keep_alive`]).
    async fn exchange(&self, inner: &Inner, since: Instant) -> Result<Alive, LockError> {
        let mut slot = self.keeper.lock().await;
        if self.is_dead() {
            return Ok(Alive::Gone);
        }
        if self.refreshed() >= since {
            return Ok(Alive::Yes);
        }
        let sent = Instant::now();
        if let Some((mut keeper, mut stream)) = slot.take() {
            let exchange = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            match tokio::time::timeout(inner.timeout, exchange).await {
                Ok(Ok(Some(answer))) => {
                    *slot = Some((keeper, stream));
                    return self.answered(answer.ttl(), sent);
                }
                // The stream's member died or closed it: open a new stream
                // below, which the client may route to another member.
                Ok(Ok(None) | Err(_)) => {}
                Err(_) => {
                    return Err(
                        inner.error(format!("no keep-alive answer within {:?}", inner.timeout))
                    )
                }
            }
        }
        // Opening the stream sends the first keep-alive and reads its answer.
        let opened = inner
            .rpc(|| {
                let mut leases = inner.client.lease_client();
                let id = self.id;
                async move { leases.keep_alive(id).await }
            })
            .await;
        match opened {
            Ok(opened) => {
                *slot = Some(opened);
                self.answered(1, sent)
            }
            Err(e) if lease_not_found(&e) => self.answered(0, sent),
            Err(e) => Err(e),
        }
    }

    /// Records etcd's answer to a keep-alive sent at `sent`.
    fn answered(&self, ttl: i64, sent: Instant) -> Result<Alive, LockError> {
        if ttl <= 0 {
            self.mark_dead();
            return Ok(Alive::Gone);
        }
        let mut refreshed = lock(&self.refreshed);
        *refreshed = (*refreshed).max(sent);
        Ok(Alive::Yes)
    }
}

/// The etcd lease length for a ttl: whole seconds, rounded up, so the server
/// never expires a key before the deadline the caller was promised; at most
/// etcd's maximum (a longer ttl gets a local deadline at that maximum).
fn lease_seconds(ttl: Duration) -> u64 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    secs.clamp(1, MAX_LEASE_SECONDS)
}

/// `at + span`, or a century on if that overflows the clock (absurd ttls).
fn after(at: Instant, span: Duration) -> Instant {
    at.checked_add(span)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(at)
}

/// etcd's `MaxLeaseTTL`.
const MAX_LEASE_SECONDS: u64 = 9_000_000_000;

/// Whether the request failed to reach a member (connection refused or
/// reset, no leader reachable), as opposed to an answer from etcd.
fn unreachable(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // gRPC `UNAVAILABLE` (code 14): tonic's code for a failed connection,
        // and etcd's for "leader changed" or "no leader" (not applied).
        // tonic reports a connection that broke under a request as `UNKNOWN`
        // "transport error".
        etcd_client::Error::GRpcStatus(status) => {
            status.code() as i32 == 14 || status.message() == "transport error"
        }
        _ => false,
    }
}

/// Whether etcd said the lease does not exist (expired or revoked).
fn lease_not_found(error: &LockError) -> bool {
    let LockError::Backend { source, .. } = error else {
        return false;
    };
    match source.downcast_ref::<etcd_client::Error>() {
        // etcd's own message for ErrLeaseNotFound (gRPC NotFound).
        Some(etcd_client::Error::GRpcStatus(status)) => {
            status.message().contains("requested lease not found")
        }
        Some(etcd_client::Error::LeaseKeepAliveError(message)) => message.contains("not found"),
        _ => false,
    }
}

/// The revision of the store when etcd answered.
fn revision_of(answer: &TxnResponse) -> Option<i64> {
    answer.header().map(|h| h.revision())
}

/// The create revision of the first key a get in a transaction returned.
fn first_create_revision(op: Option<&TxnOpResponse>) -> Option<i64> {
    match op {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn describe(&self) -> String {
        self.inner.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.inner.acquire(req, None, true).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.inner.acquire(req, deadline, false).await
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let inner = &self.inner;
        let sent = Instant::now();
        let sessions: Vec<Option<Arc<Session>>> =
            leases.iter().map(|l| inner.held_session(l)).collect();
        let mut distinct: Vec<Arc<Session>> = Vec::new();
        for session in sessions.iter().flatten() {
            if !distinct.iter().any(|s| Arc::ptr_eq(s, session)) {
                distinct.push(session.clone());
            }
        }
        // One keep-alive per session, and one read of every held key in the
        // same moment: a live lease does not prove the key is still there.
        let keep_alives = async {
            let mut answers = Vec::with_capacity(distinct.len());
            for session in &distinct {
                answers.push(session.keep_alive(inner, sent).await);
            }
            answers
        };
        let (alive, present) = tokio::join!(keep_alives, inner.read_revisions(leases));
        leases
            .iter()
            .zip(&sessions)
            .enumerate()
            .map(|(i, (lease, session))| {
                let Some(session) = session else {
                    return Ok(Renewal::Refused);
                };
                let at = distinct
                    .iter()
                    .position(|s| Arc::ptr_eq(s, session))
                    .unwrap_or(0);
                let revision = revision_of_lease(lease);
                match (&alive[at], &present) {
                    (Ok(Alive::Gone), _) => Ok(inner.refused(lease, Renewal::SessionExpired)),
                    (_, Ok(revisions)) if revisions[i] != revision => {
                        Ok(inner.refused(lease, Renewal::Deleted))
                    }
                    (Err(e), _) | (_, Err(e)) => Err(inner.error(e.to_string())),
                    (Ok(Alive::Yes), Ok(_)) => {
                        let valid_until = session.deadline(lease.ttl);
                        inner.renewed(lease, valid_until);
                        Ok(Renewal::Renewed { valid_until })
                    }
                }
            })
            .collect()
    }

    /// Deletes the key if its create revision is still ours, keeping the
    /// key's turn until etcd answered; if etcd fails, or this future is
    /// dropped first, the delete goes on in the background (see `held.rs`).
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.inner.release_entry(lease, Some(&lease.key)).await
    }

    fn permits(&self) -> Option<&dyn PermitBackend> {
        Some(self)
    }
}

#[async_trait]
impl PermitBackend for EtcdBackend {
    async fn try_acquire_permit(&self, req: &PermitRequest) -> Result<Option<Lease>, LockError> {
        self.inner.permit(req, true).await
    }

    async fn acquire_permit(
        &self,
        req: &PermitRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        // Dropping the wait at the deadline deletes our key (`Queued`).
        deadline::until(deadline, self.inner.permit(req, false))
            .await
            .unwrap_or(Ok(None))
    }

    /// Permit keys are session keys like lock keys: the same keep-alive and read.
    async fn renew_permits(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        self.renew(leases).await
    }

    async fn release_permit(&self, lease: &Lease) -> Result<bool, LockError> {
        self.inner.release_entry(lease, None).await
    }
}

impl Inner {
    /// A renewal found `lease`'s key or session gone (`why`): nothing of it
    /// is left to delete, so its record goes now.
    fn refused(&self, lease: &Lease, why: Renewal) -> Renewal {
        if let Some(revision) = revision_of_lease(lease) {
            self.forget(&lease.resource, revision);
        }
        why
    }

    /// The create revision of each lease's key (`None`: the key is gone).
    async fn read_revisions(&self, leases: &[Lease]) -> Result<Vec<Option<i64>>, LockError> {
        let mut revisions = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(TXN_CHUNK) {
            let gets: Vec<TxnOp> = chunk
                .iter()
                .map(|l| TxnOp::get(l.resource.as_str(), None))
                .collect();
            let answer = self.txn(Txn::new().and_then(gets)).await?;
            let ops = answer.op_responses();
            for i in 0..chunk.len() {
                revisions.push(first_create_revision(ops.get(i)));
            }
        }
        Ok(revisions)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Revoke the session leases so any key left on them goes now rather
        // than after a ttl. Best effort: without a runtime they simply expire.
        let ids: Vec<i64> = self.sessions.get_mut().values().map(|s| s.id).collect();
        if ids.is_empty() {
            return;
        }
        let mut leases = self.client.lease_client();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for id in ids {
                    let _ = tokio::time::timeout(Duration::from_secs(2), leases.revoke(id)).await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_seconds_round_up_and_stay_in_etcds_range() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
        assert_eq!(lease_seconds(Duration::MAX), MAX_LEASE_SECONDS);
    }

    #[test]
    fn a_ttl_of_duration_max_never_overflows_an_instant() {
        let now = Instant::now();
        for span in [Duration::MAX, Duration::MAX / 4, Duration::MAX / 3] {
            assert!(after(now, span) > now, "{span:?}");
        }
        // A session's deadline takes the granted (clamped) lease, not the ttl.
        let session = Session {
            id: 1,
            granted: Duration::from_secs(MAX_LEASE_SECONDS),
            refreshed: Mutex::new(now),
            dead: AtomicBool::new(false),
            keeper: tokio::sync::Mutex::new(None),
        };
        assert!(session.deadline(Duration::MAX) > now);
    }
}
