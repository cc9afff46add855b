//! Read-write locks on Redis (one server or a Cluster): the key names, one
//! attempt, and the `RwBackend` methods; the scripts are in `rw/scripts.rs`,
//! the wait in `rw/waiting.rs`.
//!
//! Layout of the read-write lock `key` (default prefix `dlock`), every key
//! in the hash slot of `{key}`, apart from the plain lock of the same key:
//!
//! | Key | Type | Holds | Expiry |
//! |---|---|---|---|
//! | `dlock:{key}:rw:readers` | sorted set | reader token → its expiry (ms, server clock) | the latest reader's |
//! | `dlock:{key}:rw:writer` | string | the writer's token | `PX` ttl |
//! | `dlock:{key}:rw:waiting` | sorted set | waiting writer token → mark expiry (ms) | the latest mark's |
//! | `dlock:{key}:rw:order` | sorted set | waiting writer token → arrival (µs) | the latest mark's |
//! | `dlock:{key}:rw:fence` | string | the last write's fence | `?fence_retention=` after its last write (or read that set it), at least the ttl (as a lock's) |
//!
//! Releases are announced on `dlock:{key}:rw:released`.
//!
//! Rules (each attempt is one script, after pruning expired readers and
//! marks): a reader gets in when no writer holds and no waiting writer's
//! mark is live; a writer gets in when no writer holds, no reader is live,
//! and no other waiting writer arrived before it. A writer that must wait
//! marks itself, which turns new readers away (writers do not starve), and
//! keeps its mark alive by trying again at least every third of the mark's
//! lifetime ([`mark_ttl`]); a mark whose writer went away (crashed, gave up,
//! dropped its future) is removed at once, or expires within that lifetime.

mod scripts;
mod waiting;

use std::time::{Duration, Instant};

use async_trait::async_trait;

use self::scripts::{ABANDON, ACQUIRE_READ, ACQUIRE_WRITE, RELEASE_READ, RELEASE_WRITE};
use crate::backend::refusal::About;
use crate::backend::{lease_deadline, Lease, Renewal, RwBackend, RwMode, RwRequest};
use crate::backends::redis::protocol::scripts::{db_channel, evalsha, millis, run, KeyNames};
use crate::backends::redis::{check_ttl, Conn, RedisBackend};
use crate::LockError;

/// The shortest lifetime of a waiting writer's mark.
const MIN_MARK: Duration = Duration::from_millis(300);
/// The longest lifetime of a waiting writer's mark: how long a writer
/// that vanished without a word (a crashed or stopped process) keeps
/// readers and the writers behind it out. A second, as a queued lock
/// waiter's ticket (see `waiter_queue.rs`): the next is served within 1-2 s
/// of a release whoever died in the line. A live writer refreshes its mark
/// every third of it.
const MAX_MARK: Duration = Duration::from_secs(1);

/// The lifetime of the mark of a writer waiting with lease length `ttl`:
/// the ttl, within [`MIN_MARK`] and [`MAX_MARK`]. A writer that crashes
/// while waiting holds readers back no longer than one that crashes
/// holding (its ttl), or 1 s if that is shorter; the floor keeps a writer
/// with a tiny ttl from refreshing its mark every few ms.
pub(in crate::backends::redis) fn mark_ttl(ttl: Duration) -> Duration {
    ttl.clamp(MIN_MARK, MAX_MARK)
}

/// The Redis names of one read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RwNames {
    pub(crate) readers: String,
    pub(crate) writer: String,
    pub(crate) waiting: String,
    pub(crate) order: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
}

impl RwNames {
    /// Maps `key` into `prefix`'s namespace, with the plain lock's escaped
    /// hash tag (see [`KeyNames::new`]).
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let base = KeyNames::new(prefix, key).lock;
        let named = |suffix: &str| format!("{base}:rw:{suffix}");
        RwNames {
            readers: named("readers"),
            writer: named("writer"),
            waiting: named("waiting"),
            order: named("order"),
            fence: named("fence"),
            channel: named("released"),
        }
    }

    /// These names on database `db` (see [`db_channel`]).
    pub(crate) fn in_db(mut self, db: i64) -> Self {
        db_channel(&mut self.channel, db);
        self
    }

    /// The five keys every script takes, in its order.
    fn keys(&self) -> [&str; 5] {
        [
            &self.readers,
            &self.writer,
            &self.waiting,
            &self.order,
            &self.fence,
        ]
    }

    /// A call of `script` with the five keys; the caller adds the arguments.
    fn call(&self, script: &redis::Script) -> redis::Cmd {
        let mut call = evalsha(script, 5);
        for key in self.keys() {
            call.arg(key);
        }
        call
    }
}

/// What stood in an attempt's way (the scripts' blocker codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocker {
    /// 1: a writer holds.
    Writer,
    /// 2: readers hold (a writer's attempt).
    Readers,
    /// 3: a waiting writer's mark (ahead of this writer, or of any reader).
    Waiting,
}

/// What one attempt answered.
enum RwAttempt {
    Acquired(Lease),
    /// Not admitted; `left` is when the lease or mark in the way expires
    /// (`None`: unknown, a writer key without expiry).
    Blocked {
        left: Option<Duration>,
        by: Blocker,
    },
}

impl RedisBackend {
    /// One run of the acquire script of `req.mode`. A writer with `mark`
    /// marks itself as waiting when it is not admitted.
    async fn attempt_rw(
        &self,
        req: &RwRequest,
        names: &RwNames,
        mark: bool,
    ) -> Result<RwAttempt, LockError> {
        let sent = Instant::now();
        let (script, resource) = match req.mode {
            RwMode::Read => (&*ACQUIRE_READ, &names.readers),
            RwMode::Write => (&*ACQUIRE_WRITE, &names.writer),
        };
        let mut call = names.call(script);
        call.arg(&req.token).arg(millis(req.ttl));
        if req.mode == RwMode::Write {
            call.arg(if mark { millis(mark_ttl(req.ttl)) } else { 0 });
        }
        call.arg(self.fence_retention_ms());
        let (won, value, blocker): (i64, i64, i64) = self.eval(script, &call).await?;
        if won == 1 {
            let fence = u64::try_from(value).map_err(|_| {
                LockError::backend(
                    self.options.shown.clone(),
                    format!("the fence counter {} is negative", names.fence),
                )
            })?;
            return Ok(RwAttempt::Acquired(Lease {
                key: req.key.clone(),
                token: req.token.clone(),
                ttl: req.ttl,
                fencing_token: Some(fence),
                valid_until: lease_deadline(sent, req.ttl),
                resource: resource.clone(),
            }));
        }
        let by = match blocker {
            1 => Blocker::Writer,
            2 => Blocker::Readers,
            _ => Blocker::Waiting,
        };
        // -1: a writer key without expiry, set by someone else (unknown);
        // anything else below zero: gone meanwhile, try again now.
        let left = match value {
            -1 => None,
            ms => Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        };
        Ok(RwAttempt::Blocked { left, by })
    }

    /// Removes whatever `token` may hold or have marked on the lock
    /// `names` (see [`ABANDON`]).
    async fn abandon_rw(&self, names: &RwNames, token: &str) -> Result<(), LockError> {
        let mut call = names.call(&ABANDON);
        call.arg(token).arg(&names.channel);
        let _removed: i64 = self.eval(&ABANDON, &call).await?;
        Ok(())
    }
}

/// Removes what an acquisition of `token` left on the server (a lease its
/// script took, a waiting mark) if dropped armed: the caller's future was
/// dropped, or a request failed, with the outcome unknown. Queued on the
/// same connection behind the acquire script, so Redis runs it after.
///
/// It borrows what it needs and copies it only when it fires, so arming it
/// on every acquisition costs no allocation.
struct AbandonIfDropped<'a> {
    armed: Option<(&'a Conn, &'a RwNames, &'a str)>,
}

impl<'a> AbandonIfDropped<'a> {
    fn arm(backend: &'a RedisBackend, names: &'a RwNames, token: &'a str) -> Self {
        AbandonIfDropped {
            armed: Some((&backend.conn, names, token)),
        }
    }

    /// The caller owns the outcome now.
    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl crate::backends::redis::topology::replicas::Disarm for AbandonIfDropped<'_> {
    fn disarm(&mut self) {
        AbandonIfDropped::disarm(self);
    }
}

impl Drop for AbandonIfDropped<'_> {
    fn drop(&mut self) {
        let Some((conn, names, token)) = self.armed.take() else {
            return;
        };
        let mut call = names.call(&ABANDON);
        call.arg(token).arg(&names.channel);
        let (conn, key) = (conn.clone(), names.writer.clone());
        // On dlock's background runtime, as `unfinished.rs` does and for
        // the same reasons (in the acquisition's lane); if it cannot run,
        // the ttl (and the mark's lifetime) is the backstop.
        crate::backends::redis::transport::lanes::spawn_following(async move {
            let answer: redis::RedisResult<i64> = match conn {
                Conn::Single(mut c) => run(&mut c, &ABANDON, &call).await,
                Conn::Cluster(mut c) => run(&mut c, &ABANDON, &call).await,
            };
            if let Err(e) = answer {
                tracing::debug!(%key, error = %e,
                    "could not clean up an abandoned read-write acquisition; it expires by itself");
            }
        });
    }
}

#[async_trait]
impl RwBackend for RedisBackend {
    async fn try_acquire_rw(&self, req: &RwRequest) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.options.shown)?;
        let names = RwNames::new(&self.options.prefix, &req.key).in_db(self.db);
        let ask = || async {
            let mut abandon = AbandonIfDropped::arm(self, &names, &req.token);
            let answer = self.attempt_rw(req, &names, false).await?;
            abandon.disarm();
            Ok(match answer {
                RwAttempt::Acquired(lease) => Some(lease),
                RwAttempt::Blocked { .. } => None,
            })
        };
        let undo = |granted: Option<Lease>| async move {
            if let Some(lease) = granted {
                let _ = self.release_rw_now(req.mode, &lease).await;
            }
        };
        let arm = || AbandonIfDropped::arm(self, &names, &req.token);
        let answer = self
            .replicated(&req.key, (None, true), ask, arm, undo)
            .await;
        answer.map_err(|e| self.name_refusal(e, About::Rw(&req.key)))
    }

    async fn acquire_rw(
        &self,
        req: &RwRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(req.ttl, &req.key, &self.options.shown)?;
        let names = RwNames::new(&self.options.prefix, &req.key).in_db(self.db);
        let undo = |granted: Option<Lease>| async move {
            if let Some(lease) = granted {
                let _ = self.release_rw_now(req.mode, &lease).await;
            }
        };
        let ask = || self.wait_for_rw(req, &names, deadline);
        let arm = || AbandonIfDropped::arm(self, &names, &req.token);
        let answer = self
            .replicated(&req.key, (deadline, false), ask, arm, undo)
            .await;
        answer.map_err(|e| self.name_refusal(e, About::Rw(&req.key)))
    }

    async fn renew_rw(&self, mode: RwMode, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let renewed = self.renew_rw_leases(mode, leases).await;
        self.name_refusals(leases, renewed, About::Rw)
    }

    async fn release_rw(&self, mode: RwMode, lease: &Lease) -> Result<bool, LockError> {
        let answer = self.release_rw_now(mode, lease).await;
        answer.map_err(|e| self.name_refusal(e, About::Rw(&lease.key)))
    }
}

impl RedisBackend {
    /// One read or write lease, waiting up to `deadline`; a writer that
    /// gives up takes its mark away.
    async fn wait_for_rw(
        &self,
        req: &RwRequest,
        names: &RwNames,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let mut abandon = AbandonIfDropped::arm(self, names, &req.token);
        let lease = self.wait_rw(req, names, deadline).await?;
        if lease.is_none() {
            // The wait ran out. A writer takes its mark away now, so that
            // readers come in at once; if that fails, the armed guard tries
            // again. A reader's last try may have been cut off at the
            // deadline with its grant on the way: the armed guard takes
            // away whatever the token holds, in the background.
            if req.mode == RwMode::Write {
                match self.abandon_rw(names, &req.token).await {
                    Ok(()) => abandon.disarm(),
                    Err(e) => {
                        tracing::debug!(key = %req.key, error = %e, "could not remove a waiting writer's mark");
                    }
                }
            }
            return Ok(None);
        }
        abandon.disarm();
        Ok(lease)
    }

    /// Gives a read or write lease back (its release script, sent at once).
    async fn release_rw_now(&self, mode: RwMode, lease: &Lease) -> Result<bool, LockError> {
        let names = RwNames::new(&self.options.prefix, &lease.key).in_db(self.db);
        let script = match mode {
            RwMode::Read => &*RELEASE_READ,
            RwMode::Write => &*RELEASE_WRITE,
        };
        let mut call = names.call(script);
        call.arg(&lease.token).arg(&names.channel);
        let released: i64 = self.eval(script, &call).await?;
        Ok(released == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_lock_names_hash_tag_but_not_its_keys() {
        let n = RwNames::new("dlock", "prices");
        assert_eq!(n.readers, "dlock:{prices}:rw:readers");
        assert_eq!(n.writer, "dlock:{prices}:rw:writer");
        assert_eq!(n.waiting, "dlock:{prices}:rw:waiting");
        assert_eq!(n.order, "dlock:{prices}:rw:order");
        assert_eq!(n.fence, "dlock:{prices}:rw:fence");
        assert_eq!(n.channel, "dlock:{prices}:rw:released");
        let lock = KeyNames::new("dlock", "prices");
        for name in n.keys() {
            assert!(![&lock.lock, &lock.fence, &lock.channel].contains(&&name.to_owned()));
        }
        assert_eq!(
            RwNames::new("p", "a}b").writer,
            "p:{a%7Db}:rw:writer",
            "braces cannot end the tag"
        );
    }

    #[test]
    fn marks_live_between_the_floor_and_the_cap() {
        assert_eq!(mark_ttl(Duration::from_millis(30)), MIN_MARK);
        assert_eq!(mark_ttl(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(mark_ttl(Duration::from_secs(30)), MAX_MARK);
        assert_eq!(mark_ttl(Duration::MAX), MAX_MARK);
    }
}
