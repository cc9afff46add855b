//! Renewal of Redis leases (locks, permits, read-write leases): every due
//! lease in one pipeline on a single server (compare-and-`PEXPIRE`
//! scripts that renew up to 100 leases a call, see `renew_many.rs`, or
//! `SET … IFEQ` where the server takes it), all in flight at once on a
//! cluster (one call per hash slot's leases).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis::{RedisResult, Script};

use crate::backend::{lease_deadline, Lease, Renewal, RwMode};
use crate::backends::redis::kinds::permits::PermitNames;
use crate::backends::redis::kinds::rw::RwNames;
use crate::backends::redis::protocol::renew_many::{self, RENEW_KEYS, RENEW_MEMBERS};
use crate::backends::redis::protocol::scripts::{self, millis, KeyNames};
use crate::backends::redis::topology::server::Server;
use crate::backends::redis::{protocol::compare_set, Conn, RedisBackend};
use crate::LockError;

impl RedisBackend {
    /// `renew` of lock leases.
    pub(in crate::backends::redis) async fn renew_locks(
        &self,
        leases: &[Lease],
    ) -> Vec<Result<Renewal, LockError>> {
        self.renew_with(Renewed::Locks, leases).await
    }

    /// `renew_permits`: permit leases, members of their semaphore's set.
    pub(in crate::backends::redis) async fn renew_permit_leases(
        &self,
        leases: &[Lease],
    ) -> Vec<Result<Renewal, LockError>> {
        self.renew_with(Renewed::Permits, leases).await
    }

    /// `renew_rw`: read leases are members of the lock's readers set (as
    /// permits of a semaphore's), a write lease is the writer key (as a
    /// lock's key).
    pub(in crate::backends::redis) async fn renew_rw_leases(
        &self,
        mode: RwMode,
        leases: &[Lease],
    ) -> Vec<Result<Renewal, LockError>> {
        let what = match mode {
            RwMode::Read => Renewed::Readers,
            RwMode::Write => Renewed::Writers,
        };
        self.renew_with(what, leases).await
    }

    /// Renews `leases`; a renewal counts once replicas acknowledged it
    /// (`?replicas=`), else it is a failed one.
    async fn renew_with(&self, what: Renewed, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let master = self.master_generation();
        let renewals = match &self.conn {
            Conn::Single(c) => self.renew_single(c.clone(), what, leases).await,
            Conn::Cluster(_) => self.renew_cluster(what, leases).await,
        };
        self.replicated_renewals(leases, master, renewals).await
    }

    async fn renew_single(
        &self,
        mut conn: Server,
        what: Renewed,
        leases: &[Lease],
    ) -> Vec<Result<Renewal, LockError>> {
        let script = what.script();
        let sent = Instant::now();
        self.count();
        self.metrics
            .renew_round_trips
            .fetch_add(1, Ordering::Relaxed);
        if self.lua_free(what) {
            let mut pipe = redis::pipe();
            for lease in leases {
                let lock = what.key(&self.options.prefix, lease);
                pipe.add_command(compare_set::renew(&lock, &lease.token, millis(lease.ttl)));
            }
            let answer: RedisResult<Vec<Option<String>>> = pipe.query_async(&mut conn).await;
            match answer {
                // The server no longer takes the command: the same batch
                // goes again as scripts, at once, and counts from `sent`.
                Err(e) if compare_set::refused(&e) => {
                    self.set_ifeq_refused(&e);
                    self.count();
                }
                answer => {
                    let answer = answer.map(|a| a.into_iter().map(compare_set::renewed).collect());
                    return self.renewals(answer, leases, sent);
                }
            }
        }
        let keys: Vec<String> = leases
            .iter()
            .map(|lease| what.key(&self.options.prefix, lease))
            .collect();
        let calls = renew_many::calls(&keys, false);
        let mut pipe = redis::pipe();
        for call in &calls {
            pipe.add_command(renew_call(script, &keys, leases, call));
        }
        // Reloads the script if the server lost its cache, as every call does.
        let answer: RedisResult<Vec<Vec<i64>>> = scripts::run(&mut conn, script, &pipe).await;
        let answer = answer.and_then(|answers| spread(&calls, answers, leases.len()));
        self.renewals(answer, leases, sent)
    }

    /// Whether renewals of `what` go without a script (see
    /// [`renews_without_scripts`](Self::renews_without_scripts)): locks
    /// and writers only; a permit or a reader is a member of a sorted set,
    /// which `SET` cannot
    /// compare.
    fn lua_free(&self, what: Renewed) -> bool {
        self.renews_without_scripts() && matches!(what, Renewed::Locks | Renewed::Writers)
    }

    /// A server answered `SET … IFEQ` with a syntax error (`error`): a
    /// failover, or a rolling downgrade, to a server without it; on a
    /// Cluster, a node without it. Renewals use the script from now on,
    /// which every server and every node takes: cheaper than a probe per
    /// node per renewal, and a server that takes `IFEQ` renews correctly
    /// with the script too. Logged once.
    fn set_ifeq_refused(&self, error: &redis::RedisError) {
        if self.set_ifeq.swap(false, Ordering::Relaxed) {
            tracing::warn!(backend = %self.options.shown, %error,
                "the server refused SET … IFEQ; lock renewals use the script from now on");
        }
    }

    /// One renewal pipeline's answer (1 renewed, 0 refused, per lease) as
    /// the renewals of `leases`.
    fn renewals(
        &self,
        answer: RedisResult<Vec<i64>>,
        leases: &[Lease],
        sent: Instant,
    ) -> Vec<Result<Renewal, LockError>> {
        match answer {
            Ok(results) => leases
                .iter()
                .zip(results)
                .map(|(lease, extended)| Ok(renewal(extended, sent, lease.ttl)))
                .collect(),
            Err(e) => {
                let shown = self.options.shown.clone();
                let message = e.to_string();
                leases
                    .iter()
                    .map(|_| Err(LockError::backend(shown.clone(), message.clone())))
                    .collect()
            }
        }
    }

    /// A cluster cannot pipeline across slots; the cluster connection
    /// multiplexes concurrent requests per node instead, so all renewals are
    /// in flight at once: one script call per hash slot's leases (up to
    /// 100), or one `SET … IFEQ` per lease where the nodes take it.
    async fn renew_cluster(
        &self,
        what: Renewed,
        leases: &[Lease],
    ) -> Vec<Result<Renewal, LockError>> {
        self.metrics
            .renew_round_trips
            .fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let mut answers: Vec<Option<Result<Renewal, LockError>>> =
            leases.iter().map(|_| None).collect();
        if self.lua_free(what) {
            let calls = leases.iter().map(|lease| async move {
                let lock = what.key(&self.options.prefix, lease);
                let cmd = compare_set::renew(&lock, &lease.token, millis(lease.ttl));
                self.count();
                let mut conn = self.conn.clone();
                let answer: RedisResult<Option<String>> = match &mut conn {
                    Conn::Cluster(c) => cmd.query_async(c).await,
                    Conn::Single(c) => cmd.query_async(c).await,
                };
                match answer {
                    // This lease's node does not take it: the script, below.
                    Err(e) if compare_set::refused(&e) => {
                        self.set_ifeq_refused(&e);
                        None
                    }
                    answer => Some(
                        answer
                            .map(|a| renewal(compare_set::renewed(a), sent, lease.ttl))
                            .map_err(|e| self.error(e)),
                    ),
                }
            });
            let done = futures_util::future::join_all(calls).await;
            for (answer, renewed) in answers.iter_mut().zip(done) {
                *answer = renewed;
            }
        }
        // The leases no `SET … IFEQ` answered, in one script call per slot.
        let left: Vec<usize> = (0..leases.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        let keys: Vec<String> = left
            .iter()
            .map(|&i| what.key(&self.options.prefix, &leases[i]))
            .collect();
        let left_leases: Vec<&Lease> = left.iter().map(|&i| &leases[i]).collect();
        let script = what.script();
        let calls = renew_many::calls(&keys, true);
        let sent_calls = calls.iter().map(|call| {
            let cmd = renew_call(script, &keys, &left_leases, call);
            async move {
                self.count();
                let answer: RedisResult<Vec<i64>> = match self.conn.clone() {
                    Conn::Single(mut c) => scripts::run(&mut c, script, &cmd).await,
                    Conn::Cluster(mut c) => scripts::run(&mut c, script, &cmd).await,
                };
                answer
            }
        });
        let done = futures_util::future::join_all(sent_calls).await;
        for (call, answer) in calls.iter().zip(done) {
            match answer {
                Ok(renewed) if renewed.len() == call.len() => {
                    for (&j, extended) in call.iter().zip(renewed) {
                        let lease = &left_leases[j];
                        answers[left[j]] = Some(Ok(renewal(extended, sent, lease.ttl)));
                    }
                }
                Ok(_) => {
                    for &j in call {
                        answers[left[j]] = Some(Err(LockError::backend(
                            self.options.shown.clone(),
                            "a renewal script answered for fewer leases than it was given",
                        )));
                    }
                }
                Err(e) => {
                    for &j in call {
                        answers[left[j]] = Some(Err(self.error(e.clone())));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(LockError::backend(
                        self.options.shown.clone(),
                        "renewal got fewer answers than it asked for",
                    ))
                })
            })
            .collect()
    }
}

/// One renewal script call of the leases `call` (indexes into `keys` and
/// `leases`): the keys, then each lease's token and ttl.
fn renew_call<L: std::borrow::Borrow<Lease>>(
    script: &Script,
    keys: &[String],
    leases: &[L],
    call: &[usize],
) -> redis::Cmd {
    let mut cmd = scripts::evalsha(script, call.len());
    for &i in call {
        cmd.arg(&keys[i]);
    }
    for &i in call {
        let lease = leases[i].borrow();
        cmd.arg(&lease.token).arg(millis(lease.ttl));
    }
    cmd
}

/// The answers of a pipeline of renewal calls, one list per call, as one
/// answer per lease (`count` of them).
fn spread(calls: &[Vec<usize>], answers: Vec<Vec<i64>>, count: usize) -> RedisResult<Vec<i64>> {
    let mut per_lease = vec![0; count];
    if answers.len() != calls.len() {
        return Err(short_answer());
    }
    for (call, renewed) in calls.iter().zip(answers) {
        if renewed.len() != call.len() {
            return Err(short_answer());
        }
        for (&i, extended) in call.iter().zip(renewed) {
            per_lease[i] = extended;
        }
    }
    Ok(per_lease)
}

fn short_answer() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "a renewal script answered for fewer leases than it was given",
    ))
}

/// What a renewal batch renews. Both scripts take one key, the token and
/// the ttl; they differ in the key and the script. A read-write lock's
/// leases reuse them: a reader is a member of a sorted set scored by
/// expiry, as a permit is; the writer is a key holding its token, as a
/// lock is.
#[derive(Debug, Clone, Copy)]
enum Renewed {
    /// Lock leases: compare-and-`PEXPIRE` on the lock key.
    Locks,
    /// Permit leases: compare-and-extend the member of the semaphore's set.
    Permits,
    /// Read leases: compare-and-extend the member of the readers set.
    Readers,
    /// Write leases: compare-and-`PEXPIRE` on the writer key.
    Writers,
}

impl Renewed {
    fn script(self) -> &'static Script {
        match self {
            Renewed::Locks | Renewed::Writers => &RENEW_KEYS,
            Renewed::Permits | Renewed::Readers => &RENEW_MEMBERS,
        }
    }

    fn key(self, prefix: &str, lease: &Lease) -> String {
        match self {
            Renewed::Locks => KeyNames::new(prefix, &lease.key).lock,
            Renewed::Permits => PermitNames::new(prefix, &lease.key).set,
            Renewed::Readers => RwNames::new(prefix, &lease.key).readers,
            Renewed::Writers => RwNames::new(prefix, &lease.key).writer,
        }
    }
}

fn renewal(extended: i64, sent: Instant, ttl: Duration) -> Renewal {
    if extended == 1 {
        Renewal::Renewed {
            valid_until: lease_deadline(sent, ttl),
        }
    } else {
        Renewal::Refused
    }
}
