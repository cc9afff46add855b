//! The lease machinery every kind of lock shares: how a lease is taken,
//! held, renewed, lost and given back.
//!
//! - `acquire.rs`: the one acquire path (local queue, then the backend, then
//!   the watchdog), cancellation-safe at every await.
//! - `queue.rs`: per-key local queue, so one process sends one waiter to the server.
//! - `local.rs`: per backend, its queue and its watchdog.
//! - `held.rs`: the held lease (record, status, loss, release path).
//! - `watchdog.rs`: renewal and the lease's deadlines.
//! - `background.rs`: dlock's own runtime (watchdog, background releases,
//!   every backend's connections), so renewal never waits on the caller's runtime.
//! - `options.rs`: the one `LeaseOptions` every kind is configured with.
//! - `ttl.rs`: the ttl bounds.
//! - `on_time.rs`: a waiting backend call cut a second past its wait, so a
//!   silent server cannot stretch a short wait to a request timeout.
//! - `observe.rs`: spans, events and metrics of every operation.
//!
//! # How the modules use each other
//!
//! The core's modules import one way only (between floors `dlock/tests/layers.rs` checks
//! it; inside `lease/` and `locks/` it is this order): in `lease/`, `queue` ← `held` ←
//! `watchdog` ← `local` ← `acquire`, and nothing in `lease/` imports `locks/`; in `locks/`,
//! `guard` uses `held`, `watchdog`, `scope` and `queue`; `scope` uses `held`; `within` (the
//! way in, reentrant) uses `scope`, `guard` and `acquire`. The multi-key facade sits on top:
//! `multi` uses `within` (`lock_watched`) and `multi_guard`, which uses `guard` and `scope`;
//! nothing in the core imports them. A held lease does not point at its
//! `BackendLocal`: reentrancy compares the backend object itself (`LeaseShared::is_on`), and the
//! guard that took a lease holds the watchdog that lets it go.
//!
//! # The life of one lease
//!
//! 1. **Acquire**. Every public `acquire` and `try_acquire` goes through `acquire::acquire` /
//!    `acquire::try_acquire`: the `dlock.acquire` span, and not acquired → `Busy` (one attempt)
//!    or `Timeout`, written once. The attempt validates the key and ttl
//!    (`LeaseOptions::check`: `backend/key.rs`, `MIN_TTL..=MAX_TTL`), resolves the backend, then
//!    (the reentrancy steps in `locks/within.rs`, the rest here):
//!    - **Reentrancy** (locks and segments): if the running code is inside the critical section
//!      of a held lease on the same key and backend (`scope::enclosing`), return a reentrant
//!      guard sharing it. The frame is a `tokio::task_local!` set by `LockGuard::scope`, so it is
//!      in force only while the holder's own future is polled: `join!` siblings and spawned
//!      tasks do not see it.
//!    - **Reentrancy** (read-write locks, `locks/within.rs`'s `rw_within`): inside the scope of a lease on
//!      the same read-write lock (`scope::enclosing_rw`, which never matches a plain lock of the
//!      key, nor `enclosing` a read-write lease): a write holder's read or write and a read
//!      holder's read return a reentrant guard; a read holder's write is `InvalidOption` at
//!      once, since its turn would wait for the holder's own reader permit for ever.
//!    - `acquire::take`, the one path of every lease (`Target::Lock`, `Target::Permit` or
//!      `Target::Rw(mode)`):
//!      - **Local turn**: wait for the key's `KeySlot` gate (`lease/queue.rs`: one permit for a
//!        lock, N for a semaphore; a segmented lock first waits for one of N admissions; a
//!        read-write lock's slot, named apart from the key's plain lock, has `RW_READERS`
//!        permits: a reader takes one, a writer all, and tokio's fair semaphore hands a
//!        waiting writer the permits as they come back, so later readers queue behind it). The
//!        `Turn` holds the permit and the slot; dropping it gives the permit back and prunes the
//!        slot when nobody else uses it, so a slot lives exactly as long as a holder or waiter.
//!      - **Backend call**: `try_acquire` (zero wait) or `acquire(deadline)`; for a permit, the
//!        same on `backend.permits()`, and a backend without it gets `no_semaphores` here, the
//!        one place that error is made; for a read or write lease, `backend.rw()` and
//!        `no_rw_locks` likewise. The backend owns the waiting on the server (pub/sub,
//!        watches) and must be cancel safe.
//!      - **Live at hand-over**: a lease whose answer came after its `valid_until` (a reply
//!        slower than the ttl: the server may have expired it and granted the key to another
//!        client) is given back (`release_on`, compare-and-delete) and asked for again within
//!        the wait, the local turn still held; `observe::stale_grant` (`reason = late_answer`).
//!      - **Register**: `LeaseShared` (lease/held.rs) keeps the lease, its kind, its turns, its
//!        `Holding` (lease/observe.rs) and the runtime it was taken on; the backend's watchdog starts
//!        watching it, and it is handed over as a `Taken`, of which the lock kind makes its
//!        `LockGuard` (or the `Permit` around one).
//! 2. **Hold**. The watchdog (one task per backend, on dlock's background runtime) renews due
//!    leases in one batch per kind (lock, permit, read, write: `watchdog::by_kind`) and marks a lease lost when its local deadline passes without
//!    a renewal, or when the backend answers `Refused`/`Deleted`/`SessionExpired`. Which backend
//!    call renews or releases a lease of which kind is decided in one place, `lease::renew_on`
//!    and `lease::release_on`.
//! 3. **Loss** (`LeaseShared::mark_lost`). Status → Lost, the WARN event and metrics, `lost()`
//!    fires, and the lease's turns are given back at once: the process's next waiter goes to
//!    the server, even while the lost guard object lives on.
//! 4. **Release** (`LockGuard::release` or `Drop`). `begin_release` (status) and the
//!    watchdog's deregistration run at once; `finish_release` (lease/held.rs) sends the
//!    compare-and-delete, gives the turns back after its first poll (the local hand-off), and
//!    records the `dlock.release` span. `Drop` and a cancelled `release()` finish in the
//!    background on the lease's runtime, or, when that runtime is gone or shutting down, on
//!    dlock's background runtime (`ReleaseElsewhere`). A release before the lease's
//!    `hold_until` (`hold_at_least` after registration) goes to `release_later`: a lock on a
//!    backend whose `LockBackend::release_after` answers (Redis: the `KEEP_FOR` script sets the
//!    key's expiry to the time left; Redlock: on every master, kept if a quorum kept it) gives
//!    the turns back and is done; anything else (memory, etcd, ZooKeeper, read-write leases
//!    and permits) stays registered in nobody's watchdog but its
//!    own task on dlock's background runtime (`keep_until`: renewed every ttl/3), and is
//!    released at that time, the process's turns held until then.
//!
//! # Invariants each layer keeps
//!
//! - **The hand-over rule**: a lease is handed to the caller (a guard returned, a body
//!   started, a `MultiGuard` returned) only if, at that instant, every lease it stands for is
//!   within its local deadline and not marked lost; otherwise the acquisition gives back what
//!   it took and, within the caller's wait, tries again, or reports `Busy`/`Timeout` (`Lost` for
//!   a body). The points that check it: `acquire::take` (every lock, segment, permit, read and
//!   write lease, and each key of a key-by-key `MultiLock`: the answer against
//!   `valid_until`), `MultiLock::take_in_order` (every key, both paths, once all are taken),
//!   `scope::innermost` (a reentrant guard shares only a held lease; otherwise a fresh one is
//!   taken), and `private::until_lost` (a macro body is not polled unless its lease is held,
//!   and a fired loss wins over a ready body). Redlock's quorum adds its own validity check.
//!
//! - **The local deadline rule**: every `Lease::valid_until` is `sent + ttl − drift` (or
//!   stricter: Redlock's validity, ZooKeeper's 11/20 of the session timeout) from the instant the
//!   request was *sent*; the core treats a lease as lost no later than that.
//! - **The local hand-off is safe because the server decides**: the next local waiter's acquire
//!   goes out after the release's first poll. Where a backend keeps a process's requests in order
//!   (one Redis connection, one ZooKeeper session) it lands behind the release; where it does not,
//!   the waiter finds the key held and waits. A backend must never let an acquire take over a key
//!   another guard of the same process may still delete (etcd deletes and recreates instead).
//! - **A lost lease frees its turn**, and a released one frees it once the release is sent.
//! - **Nothing depends on the caller's runtime staying alive or driven**: renewals and deadline
//!   checks run on `lease/background.rs`'s runtime (a current-thread runtime on the thread
//!   `dlock-background`, alive until `dlock::shutdown` stops it; after that `run` answers each
//!   client library's own "shut down" error, `spawn` drops its task, and the facade refuses
//!   work with `LockError::ShutDown` before any of it is reached); background releases fall back to it. So do the connections, sessions
//!   and subscribers that renewal, release and wake-ups need, whatever runtime called
//!   `connect`: every backend connects through `background::run` (a future run there and
//!   awaited), so the tasks a client library spawns where it connects (a Redis connection's
//!   driver, a Redis Cluster's driver, the etcd client's channel workers, a ZooKeeper session)
//!   live there. A single Redis server's `ConnectionManager` also reconnects on the runtime of
//!   the request that found the connection broken, so `redis/connection.rs` runs each request
//!   made elsewhere as a task there (a hand-over per request, see its docs); a ZooKeeper session
//!   reopened after an expiry is opened there too. Work a backend spawns that other runtimes'
//!   callers wait on, or that must outlive the caller (the Redis subscriber, request batches,
//!   clean-ups of abandoned acquisitions, Redlock's deletes, etcd's clean-ups that hold a
//!   key's turn), is spawned there with `background::spawn`. Such a task is counted in flight
//!   (`background/in_flight.rs`) until it ends, and `dlock::shutdown` waits for the count to
//!   reach zero (at most 1 s) before it stops the runtime: what a drop handed off (a queue
//!   departure, a release) is done before the process exits. Tasks that live as long as their
//!   backend or lease (the watchdog, etcd's idle-session check and deletion watcher,
//!   PostgreSQL's reaper, an election's loss watcher, `hold_at_least`'s keeper) use
//!   `background::spawn_daemon`, which is not counted; ZooKeeper's background node delete runs
//!   on its session's runtime, counted through `in_flight::tracked`.
//! - **No value makes the core panic**: instants are built with `deadline::after` and
//!   `deadline::saturating_add` (a century or more is "no limit"); counts are bounded
//!   (`Semaphore::MAX_PERMITS`, `SegmentedLock::MAX_SEGMENTS`) before tokio sees them.

pub(crate) mod acquire;
pub(crate) mod background;
pub(crate) mod held;
pub(crate) mod local;
pub(crate) mod observe;
pub(crate) mod on_time;
pub(crate) mod options;
pub(crate) mod queue;
pub(crate) mod ride_through;
pub(crate) mod ttl;
pub(crate) mod watchdog;
