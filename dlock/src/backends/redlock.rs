//! The Redlock backend: one lock over N independent Redis masters
//! (`redlock://host:port,host:port,...`), after antirez's Redlock algorithm.
//!
//! Capabilities: ✓ mutual exclusion across processes and machines while a
//! majority of masters is up and clocks run at about the same rate · ✓ no
//! single point of failure: N/2 masters may crash or hang · ✓ lease expiry ·
//! ✓ waiters woken by pub/sub on every master · ✓ batched renewal (one
//! pipeline per master per tick) · ✗ fencing tokens ([`fencing_token`] is
//! always `None`) · ✓ safety when a master restarts without its data, with
//! [`RedlockBackend::restart_quarantine`] (off by default; see *Limits*) ·
//! ✗ safety against long process pauses of the holder (no
//! fencing; see *Limits*).
//!
//! [`fencing_token`]: crate::LockGuard::fencing_token
//!
//! # Protocol
//!
//! The masters share nothing: no replication, no cluster. Every step uses
//! the Redis backend's own Lua scripts on each master.
//!
//! - **Acquire**: take a monotonic [`Instant`] *before* the first request,
//!   then run the acquire script on all N masters in parallel: a plain
//!   `SET NX PX ttl`, answering the holder's `PTTL` when the key is taken,
//!   and without the Redis backend's fence counter (Redlock has no fencing
//!   token, so it pays for none: no `TIME`, no counter write). Under load
//!   the attempts on one master go out batched, as on the Redis backend.
//!   Each is bounded by a per-node timeout that is small against the
//!   ttl (default ttl/100, at least 10 ms; `?node_timeout_ms=`). The lock is
//!   ours when a quorum of N/2+1 masters said yes **and** the validity
//!   `ttl − elapsed − drift` is still positive, with drift = ttl × 1 % + 2 ms
//!   ([`drift`]). The answer comes as soon as it is decided: a slow or
//!   frozen master is not waited on once a quorum (or a refusal by a
//!   blocking minority) is known. A ttl above [`MAX_TTL`] is refused with
//!   [`LockError::InvalidOption`], as on the Redis backend. A master that failed or timed out is
//!   *presumed down* for one second: it is still asked, and its vote counts
//!   if it comes before the round is decided, but no round waits for it —
//!   so a dead master does not cost every contended round its timeout.
//!   Not counting a vote can only lose a lock, never grant one twice.
//! - On failure, the partial lock is released on **every** master that did
//!   not clearly answer "held by someone else" — including masters that
//!   timed out, since the request may still have landed — and the attempt is
//!   retried after a random delay. The deletes are put on every master's
//!   connection at once and finish in the background if the acquisition is
//!   cancelled meanwhile (a caller's timeout, a `SegmentedLock` dropping the
//!   waits that lost), so a cancelled round leaves no token behind. A
//!   master whose acquire is still unanswered is undone only once it
//!   answers (or its timeout passes): its request may not be on the
//!   connection yet, and a delete sent first would reach the master first.
//! - The lease's local deadline ([`Lease::valid_until`]) is the validity,
//!   `start + ttl − drift`, where `start` is the instant before the first
//!   request: the core treats the lease as lost from then on unless a
//!   renewal succeeded.
//! - **Renew**: compare-and-`PEXPIRE` on all N in parallel (all due leases
//!   in one pipeline per master). A lease is renewed when a quorum extended
//!   it within the new validity (computed the same way, from the renewal's
//!   start). When more than N − quorum masters *refuse* (the key is gone or
//!   someone else's), a quorum can never be reached again and the lease is
//!   reported [`Renewal::Refused`]: the guard is lost at once. When fewer
//!   than a quorum *answer*, the renewal is an error and the local deadline
//!   decides: the core retries and marks the lease lost when its validity
//!   runs out.
//! - **Release**: compare-and-delete on all N in parallel; the script also
//!   publishes on the key's release channel, so waiters wake. It returns as
//!   soon as a quorum released; the other deletes finish in the background
//!   (each bounded by the per-node timeout, at least 500 ms).
//! - **Waiting**: the waiter subscribes to the release channel on every
//!   master (one shared pub/sub connection per master, as in the Redis
//!   backend), and to the key's keyspace channel on every master that has
//!   keyspace notifications on; any master's notification wakes it. As a
//!   fallback it wakes when the holder's keys would expire on a quorum
//!   (from their `PTTL`), and after a lost vote (several clients split the
//!   masters) it retries after a random delay. A release that announces
//!   nothing (a client that is not dlock deleting the key on a quorum) is
//!   found by a re-check: a `PTTL` on every master at once, backing off
//!   from 5 ms to the cap (`recheck_ms`; at the cap only when every master
//!   notifies), and a round when the key is gone from a quorum.
//! - [`LockError::Quorum`] when fewer than a quorum of masters answer at all:
//!   at once for `try_acquire`; for `acquire` when its wait runs out with the
//!   last round still short of answers (without a wait limit, after three
//!   such rounds in a row), so a blip of one round does not fail the caller.
//!
//! # Time: why the wall clock cannot extend a lease
//!
//! Every duration above — the elapsed time of an acquisition, the validity,
//! the renewal deadline, the per-node timeout — is measured with
//! [`std::time::Instant`], the monotonic clock, and never with
//! `SystemTime`. The validity is `start + ttl − drift` with both `start` and
//! the check "is it still in the future" read from `Instant`. Setting the
//! wall clock forward or back (NTP step, an operator's `date -s`) changes
//! `SystemTime` only; `Instant` keeps counting real elapsed time, so no
//! wall-clock change can make a lease look valid for longer than `ttl −
//! drift` after its request was sent. (The servers' clocks are another
//! matter: Redis expires keys by its own clock, see *Limits*.) The masters
//! themselves are only ever told durations (`PX`, `PEXPIRE`), never instants.
//!
//! # When to use Redlock, and its limits
//!
//! Redlock is for **efficiency** locks — "do this job once, not five times"
//! — where you already run Redis and want no single Redis server to be a
//! point of failure: with 5 masters, any 2 may crash, hang or be cut off and
//! locks keep working. It is **not** a correctness lock for data that must
//! never be written by two holders. For that, use the etcd or ZooKeeper
//! backend and pass the guard's fencing token with every write. Martin
//! Kleppmann's critique ("How to do distributed locking", 2016) and antirez's
//! answer are the background; dlock documents the points where they agree
//! something can go wrong:
//!
//! - **No fencing token.** The masters do not agree on an order of holders,
//!   so no counter can be strictly increasing across holders (each master's
//!   counter moves independently). `fencing_token()` returns `None`; a
//!   storage service cannot reject a write from a holder whose lease ran out.
//! - **Process pauses.** A holder paused by a GC, swap or `SIGSTOP` longer
//!   than its lease wakes up still believing it holds the lock while
//!   another client does. `lost()` fires when the local deadline passes, but
//!   a paused process cannot observe it. Without fencing nothing downstream
//!   stops the stale writer. Keep critical sections short against the ttl
//!   and check [`LockGuard::is_held`](crate::LockGuard::is_held) before
//!   side effects.
//! - **Clock jumps on the servers.** Redis expires keys by its own wall
//!   clock. A master whose clock jumps forward expires a lease early and
//!   may vote for a second client; two such masters in a set of five are
//!   enough for two holders. Run the masters with a slewing clock (ntpd or
//!   chrony set not to step) — the client side is immune, as said above.
//! - **Restarts without persistence.** A master that restarts with an empty
//!   dataset (no AOF with `appendfsync always`) forgets the locks it voted
//!   for and can vote again at once; with one restart in a set of five,
//!   held by a quorum of three, a second client can reach three votes.
//!   Antirez's mitigation is a *delayed restart*: a crashed master must not
//!   vote for at least the longest ttl in use.
//!   [`RedlockBackend::restart_quarantine`] (`?restart_quarantine_ms=`)
//!   makes the masters enforce it themselves: a master that lost its data
//!   refuses to vote for the quarantine. It is off by default because a
//!   master without the boot marker cannot tell a restart from its first
//!   use, so the first acquisitions wait out the quarantine. Without it,
//!   operators must delay restarts (e.g. a systemd `ExecStartPre=/bin/sleep
//!   <max ttl>`) or enable AOF with `appendfsync always`.
//! - **Odd N.** Use an odd number of masters (3, 5, 7): an even N needs the
//!   same quorum as N + 1 (N/2 + 1) while tolerating no more failures.
//! - **Liveness.** All N masters must be reachable when the backend
//!   connects; later, locks work while a quorum answers.
//!
//! # URL
//!
//! `redlock://[user:pass@]host:port,host:port,...[/db][?params]` — at least
//! three distinct masters. The credentials and `/db` apply to every master.
//! Parameters: `node_timeout_ms=N` (the per-node timeout; default ttl/100,
//! at least 10 ms), `restart_quarantine_ms=N` (see
//! [`RedlockBackend::restart_quarantine`]; off by default; at most
//! [`MAX_TTL`]), and the Redis
//! backend's `prefix=`, `timeout_ms=` and `recheck_ms=`,
//! passed to every master (with masters of different `recheck_ms`, the
//! smallest non-zero one applies; the re-check is off only when every
//! master says `0`). Masters over TLS, or with different credentials,
//! are built with [`RedlockBackend::from_urls`] or
//! [`RedlockBackend::from_backends`].

// The files of this backend, by concern (what ARCHITECTURE.md's "Inside a backend"
// table points to):
// - building the backend (from a URL, URLs or backends) and its settings: `setup.rs`
// - URL / configuration: `config.rs`
// - waiting in line: each master's subscriber, `quorum.rs` (between rounds)
// - the round on N masters: `quorum.rs` (round, unwinding)
// - renewal: `redlock.rs`
// - clean-up of abandoned entries: `quorum.rs` (`Unwind`; `Undos`: a retry with the same token
//   skips a master whose undo is unfinished)
// - leader election (`ElectionBackend`): none (`no_elections`: no fence to be the term)
// - read-write locks (`RwBackend`): none (`rw()` is `None`: `no_rw_locks`)
mod config;
mod quorum;
mod setup;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use self::quorum::{any_released, Delete, Outcome, Undos};
use crate::backend::{drift, lease_deadline, AcquireRequest, Lease, LockBackend, Renewal};
use crate::backends::redis::protocol::scripts::KeyNames;
use crate::backends::redis::waiting::recheck::Recheck;
use crate::backends::redis::{check_ttl, jitter, nap_until, RedisBackend, MAX_TTL};
use crate::LockError;

/// The smallest default per-node timeout: below it, scheduling noise on a
/// busy client host alone makes healthy masters look dead.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(10);

/// Consecutive rounds without a quorum of answers before an `acquire`
/// without a wait limit gives up with [`LockError::Quorum`] (with a limit,
/// it tries until the wait runs out): enough to ride out a blip, few enough
/// to report an outage promptly.
const QUORUM_ROUNDS: u32 = 3;

/// The least time a release waits for a master that is not presumed down.
const RELEASE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a master that failed or timed out is not waited on. Rounds
/// still send it every request and count its vote if it comes in time, so
/// safety is untouched (a vote not waited for is a vote not counted); only a
/// dead master stops costing each undecided round its full timeout. After
/// this, one round waits for it again, to notice that it is back.
const SUSPECT_FOR: Duration = Duration::from_secs(1);

/// How long a waiter waits for a master to confirm a new subscription. A
/// missed confirmation costs only latency (the timers still wake the
/// waiter), so a dead master must not hold the waiter up.
const SUBSCRIBE_WAIT: Duration = Duration::from_millis(100);

/// Locks on N independent Redis masters with the Redlock algorithm.
///
/// See the [module docs](self) for the protocol, the guarantees and the
/// limits (no fencing tokens). Use an odd number of masters.
///
/// ```no_run
/// use dlock::backends::redlock::RedlockBackend;
/// use std::sync::Arc;
///
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// let redlock = RedlockBackend::connect(
///     "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379,10.0.0.4:6379,10.0.0.5:6379",
/// )
/// .await?;
/// dlock::registry().set_default(Arc::new(redlock));
/// let guard = dlock::Lock::new("nightly-report").acquire().await?;
/// assert_eq!(guard.fencing_token(), None); // Redlock cannot give one
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct RedlockBackend {
    nodes: Vec<Arc<RedisBackend>>,
    /// Per master: until when it counts as down (it failed or timed out on
    /// its last request), so rounds do not wait for it; and since when it
    /// has been silent without a break (see `quorum.rs`'s `set_suspect`).
    suspect_until: Vec<Mutex<Suspect>>,
    /// Failed rounds' undos still on their way, which the next round of the
    /// same token waits out per master (see `quorum.rs`).
    undos: Undos,
    quorum: usize,
    node_timeout: Option<Duration>,
    restart_quarantine: Option<Duration>,
    shown: String,
}

/// What rounds know of one master's silence.
#[derive(Debug, Default)]
pub(super) struct Suspect {
    /// Until when rounds do not wait for it.
    pub(super) until: Option<Instant>,
    /// Since when it has failed or been silent, every round.
    pub(super) silent_since: Option<Instant>,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("masters", &self.shown)
            .field("quorum", &self.quorum)
            .field("node_timeout", &self.node_timeout)
            .field("restart_quarantine", &self.restart_quarantine)
            .finish_non_exhaustive()
    }
}

impl RedlockBackend {
    /// The answers of the masters that answered, if a quorum did: else the
    /// one error when none answered, or `Quorum` with how many did.
    fn answered_by_quorum<T>(
        &self,
        answers: Vec<Result<T, LockError>>,
    ) -> Result<Vec<T>, LockError> {
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum {
            return Err(match answers.into_iter().find_map(Result::err) {
                Some(e) if answered == 0 => e,
                _ => LockError::Quorum {
                    reached: answered,
                    needed: self.quorum,
                },
            });
        }
        Ok(answers.into_iter().filter_map(Result::ok).collect())
    }

    /// Refuses a ttl, or a restart quarantine, above [`MAX_TTL`].
    fn check(&self, req: &AcquireRequest) -> Result<(), LockError> {
        check_ttl(req.ttl, &req.key, &self.shown)?;
        match self.restart_quarantine {
            Some(q) if q > MAX_TTL => Err(LockError::invalid_option(format!(
                "restart_quarantine {q:?} on `{}` is longer than the maximum of {MAX_TTL:?}; \
                 give the longest ttl in use",
                self.shown
            ))),
            _ => Ok(()),
        }
    }

    /// The per-node timeout used for a lease of length `ttl`.
    pub fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 100).max(MIN_NODE_TIMEOUT))
    }

    /// How many masters make a quorum: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// How many masters the set has.
    pub fn masters(&self) -> usize {
        self.nodes.len()
    }

    fn names(&self, i: usize, key: &str) -> KeyNames {
        self.nodes[i].key_names(key)
    }

    /// The keys of an acquire on master `i`: the lock's, without a fence
    /// counter. Redlock has no fencing token, so its acquire is a plain
    /// `SET NX PX` (the acquire script issues no fence for an empty counter
    /// name): no `TIME`, no counter write, no counter key on the masters.
    fn acquire_names(&self, i: usize, key: &str) -> KeyNames {
        KeyNames {
            fence: String::new(),
            ..self.names(i, key)
        }
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.check(req)?;
        match self.round(req).await {
            Outcome::Acquired(lease) => Ok(Some(lease)),
            Outcome::Held { .. } | Outcome::Split => Ok(None),
            Outcome::NoQuorum { reached } => Err(LockError::Quorum {
                reached,
                needed: self.quorum,
            }),
        }
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        self.check(req)?;
        // A free lock is taken with one round and no subscription at all:
        // subscribing costs a SUBSCRIBE and an UNSUBSCRIBE on every master.
        // If the round fails, the loop below runs a new one after the
        // subscriptions are in place, so a release between a lost round and
        // the wait is still heard.
        if let Outcome::Acquired(lease) = self.round(req).await {
            return Ok(Some(lease));
        }
        let mut released = self.subscribe_all(&req.key, deadline).await;
        let timeout = self.node_timeout_for(req.ttl);
        // Releases that publish nothing are re-checked (see `recheck.rs`);
        // when every master notifies, only at the cap.
        let notified = self.nodes.iter().all(|n| n.keyspace_notifications());
        let cap = self.nodes.iter().filter_map(|n| n.recheck_cap()).min();
        let mut silent_rounds = 0;
        // `outage` below: how many masters answered the last round, if too
        // few did. A wait that runs out after such a round is an outage
        // (`Quorum`), not a busy lock (`Timeout`).
        let out_of_time = |outage: Option<usize>| match outage {
            Some(reached) => Err(LockError::Quorum {
                reached,
                needed: self.quorum,
            }),
            None => Ok(None),
        };
        loop {
            for subscription in &mut released {
                subscription.mark_seen();
            }
            // A new schedule per round: the holder may be a new one.
            let mut rechecks = None;
            // The masters whose messages may mean a release that lets us win
            // (all, unless the holder blocked us).
            let mut listen_to = None;
            let (delay, outage) = match self.round(req).await {
                Outcome::Acquired(lease) => return Ok(Some(lease)),
                Outcome::NoQuorum { reached } => {
                    silent_rounds += 1;
                    // With a wait, keep trying until it runs out (masters
                    // may come back); without one, report the outage soon.
                    let give_up = match deadline {
                        Some(d) => d <= Instant::now(),
                        None => silent_rounds >= QUORUM_ROUNDS,
                    };
                    if give_up {
                        return Err(LockError::Quorum {
                            reached,
                            needed: self.quorum,
                        });
                    }
                    // Give the masters a moment to come back.
                    let pause =
                        (req.ttl / 20).clamp(Duration::from_millis(10), Duration::from_millis(200));
                    (pause + jitter(pause), Some(reached))
                }
                Outcome::Held { left, blockers } => {
                    silent_rounds = 0;
                    rechecks = Recheck::new(cap, notified);
                    // Only a release on a master that blocked us can let us
                    // win. The others include the masters this round won
                    // and undid, whose undo announced itself (the release
                    // script's `PUBLISH`, a keyspace `del`): heeding those
                    // ran round after round until the holder let go.
                    listen_to = Some(blockers);
                    // Expiry announces nothing: wake when the holder's keys
                    // would have expired on a quorum.
                    let expiry = left.unwrap_or(req.ttl);
                    (
                        expiry.saturating_add(jitter(expiry / 10 + Duration::from_millis(2))),
                        None,
                    )
                }
                Outcome::Split => {
                    silent_rounds = 0;
                    // Contenders split the votes: retry after a random
                    // delay of about a round, so that one of them gets
                    // ahead. (A round longer than the ttl could never win:
                    // with a huge per-node timeout, the ttl bounds it.)
                    let round = timeout.min(req.ttl);
                    let delay = Duration::from_millis(1) + jitter(round + Duration::from_millis(5));
                    (delay, None)
                }
            };
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return out_of_time(outage);
            }
            let nap = nap_until(delay, deadline);
            tokio::pin!(nap);
            loop {
                let recheck = async {
                    let Some(schedule) = rechecks.as_mut() else {
                        return std::future::pending().await;
                    };
                    tokio::time::sleep(schedule.pause()).await;
                    self.free_on_quorum(&req.key, timeout).await
                };
                tokio::select! {
                    () = any_released(&mut released, listen_to.as_deref()) => break,
                    () = &mut nap => break,
                    free = recheck => if free {
                        break;
                    },
                }
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return out_of_time(outage);
            }
        }
    }

    async fn renew(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let n = self.nodes.len();
        let Some(shortest) = leases.iter().map(|l| l.ttl).min() else {
            return Vec::new();
        };
        let timeout = self.node_timeout_for(shortest);
        let start = Instant::now();
        let per_node = self.nodes.iter().map(|node| async move {
            tokio::time::timeout(timeout, node.renew(leases))
                .await
                .unwrap_or_default()
        });
        // One pipeline per master; a master that timed out answered nothing.
        let answers: Vec<Vec<Result<Renewal, LockError>>> =
            futures_util::future::join_all(per_node).await;
        let now = Instant::now();
        leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let mut extended = 0;
                let mut refused = 0;
                for node in &answers {
                    match node.get(i) {
                        Some(Ok(Renewal::Renewed { .. })) => extended += 1,
                        Some(Ok(_)) => refused += 1,
                        Some(Err(_)) | None => {}
                    }
                }
                // More refusals than the masters we can spare: no quorum can
                // hold this lease any more, whatever the silent ones say.
                if refused > n - self.quorum {
                    return Ok(Renewal::Refused);
                }
                let valid_until = lease_deadline(start, lease.ttl);
                if extended >= self.quorum && now < valid_until {
                    return Ok(Renewal::Renewed { valid_until });
                }
                let answered = extended + refused;
                if answered < self.quorum {
                    Err(LockError::Quorum {
                        reached: answered,
                        needed: self.quorum,
                    })
                } else {
                    // Unknown: the old deadline decides, and the core retries.
                    Err(LockError::backend(
                        self.shown.clone(),
                        format!(
                            "{extended} of {n} masters extended the lease within its validity of {:?}; {} needed",
                            lease.ttl.saturating_sub(drift(lease.ttl)),
                            self.quorum
                        ),
                    ))
                }
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let all = vec![true; self.nodes.len()];
        // A release may wait longer than an acquisition: nothing's validity
        // depends on it, and giving up early would leave the key to expire
        // instead of handing it over. Masters presumed down are not waited on.
        let timeout = self.node_timeout_for(lease.ttl).max(RELEASE_TIMEOUT);
        // Back to the caller once a quorum released: the slowest masters are
        // not waited for (their deletes complete in the background).
        let (released, answered) = self
            .release_on(lease, timeout, &all, self.quorum, Delete::Release)
            .await;
        if released >= self.quorum {
            Ok(true)
        } else if answered >= self.quorum {
            Ok(false)
        } else {
            Err(LockError::Quorum {
                reached: answered,
                needed: self.quorum,
            })
        }
    }

    /// Each master keeps its key until `remaining` from now (the
    /// single-server script); kept where a quorum kept it, so no other
    /// client can win a quorum before then.
    async fn release_after(
        &self,
        lease: &Lease,
        remaining: Duration,
    ) -> Result<Option<bool>, LockError> {
        let timeout = self.node_timeout_for(lease.ttl).max(RELEASE_TIMEOUT);
        let answers = self.nodes.iter().map(|node| async move {
            match tokio::time::timeout(timeout, node.release_after(lease, remaining)).await {
                Ok(Ok(kept)) => Some(kept == Some(true)),
                _ => None,
            }
        });
        let answers = futures_util::future::join_all(answers).await;
        let kept = answers.iter().filter(|a| **a == Some(true)).count();
        let answered = answers.iter().filter(|a| a.is_some()).count();
        if kept >= self.quorum {
            Ok(Some(true))
        } else if answered >= self.quorum {
            Ok(Some(false))
        } else {
            Err(LockError::Quorum {
                reached: answered,
                needed: self.quorum,
            })
        }
    }

    fn client_name(&self) -> Option<&str> {
        self.nodes.first().map(|n| n.own_client_name())
    }

    /// Held when a quorum of masters hold the key for one holder; the time
    /// left is the least of theirs. No fencing token.
    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, LockError> {
        crate::backend::key::validate(key)?;
        let answers =
            futures_util::future::join_all(self.nodes.iter().map(|n| n.inspect_lock(key, false)))
                .await;
        let held: Vec<crate::LockInfo> = self
            .answered_by_quorum(answers)?
            .into_iter()
            .flatten()
            .collect();
        let mut best: Option<(usize, &crate::LockInfo)> = None;
        for info in &held {
            let same = held.iter().filter(|o| o.holder == info.holder).count();
            if best.is_none_or(|(n, _)| same > n) {
                best = Some((same, info));
            }
        }
        Ok(match best {
            Some((votes, info)) if votes >= self.quorum => {
                let remaining = held
                    .iter()
                    .filter(|o| o.holder == info.holder)
                    .map(|o| o.remaining)
                    .min()
                    .unwrap_or_default();
                Some(crate::LockInfo::new(remaining, None, info.holder.clone()))
            }
            _ => None,
        })
    }

    /// The keys some master holds, each listed when
    /// [`inspect`](LockBackend::inspect) finds a quorum of masters holding
    /// it for one holder. A quorum of masters must answer the scans.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, crate::LockInfo)>, LockError> {
        let answers =
            futures_util::future::join_all(self.nodes.iter().map(|n| n.lock_keys(prefix))).await;
        let mut keys = std::collections::BTreeSet::new();
        for found in self.answered_by_quorum(answers)? {
            keys.extend(found);
            if keys.len() > crate::backend::holder::MAX_LISTED {
                return Err(crate::backend::holder::too_many_to_list(
                    &self.describe(),
                    prefix,
                ));
            }
        }
        let mut held = Vec::new();
        for key in keys {
            if let Some(info) = self.inspect(&key).await? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    /// Deletes the key on every master; `true` if any master held it.
    async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        crate::backend::key::validate(key)?;
        let answers =
            futures_util::future::join_all(self.nodes.iter().map(|n| n.force_release_lock(key)))
                .await;
        Ok(self
            .answered_by_quorum(answers)?
            .into_iter()
            .any(|freed| freed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_is_measured_on_the_monotonic_clock_from_before_the_request() {
        // The lease deadline of a round is `start + ttl − drift`, an Instant:
        // nothing in it reads the wall clock, so a wall-clock step cannot
        // move it.
        let start = Instant::now();
        let ttl = Duration::from_secs(10);
        assert_eq!(lease_deadline(start, ttl) - start, ttl - drift(ttl));
        assert_eq!(drift(ttl), Duration::from_millis(102));
    }
}
