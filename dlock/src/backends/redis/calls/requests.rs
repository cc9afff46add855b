//! How one request reaches the server: a plain command or a script call, on
//! whichever connection the backend has, alone or in a batch, bounded by the
//! caller's deadline; the acquire script's run and how its answer reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::{RedisError, RedisResult, Script};

use crate::backend::silence::{rest_of_silence, Late};
use crate::backend::transient::Transient;
use crate::backend::{lease_deadline, AcquireRequest, Lease};
use crate::backends::redis::calls::batching::ops::AcquireOp;
use crate::backends::redis::calls::batching::{BatchFailed, LaneBatchers, Turn};
use crate::backends::redis::calls::unfinished::ReleaseIfDropped;
use crate::backends::redis::protocol::scripts::{
    millis, KeyNames, ACQUIRE, ACQUIRE_MANY, RELEASE, RELEASE_MANY,
};
use crate::backends::redis::{
    protocol::renew_many, protocol::scripts, Attempt, Conn, RedisBackend,
};
use crate::LockError;

impl RedisBackend {
    /// Sends one plain command, on whichever connection this backend has.
    pub(in crate::backends::redis) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, LockError> {
        self.count();
        let answer = match self.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        };
        answer.map_err(|e| self.error(e))
    }

    /// The answer of a request that went out in a batch.
    pub(in crate::backends::redis) async fn batched<T>(
        &self,
        answer: tokio::sync::oneshot::Receiver<Result<T, BatchFailed>>,
    ) -> Result<T, LockError> {
        match answer.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(BatchFailed { message, transient })) => Err(if transient {
                LockError::backend(self.options.shown.clone(), Transient::new(message))
            } else {
                LockError::backend(self.options.shown.clone(), message)
            }),
            Err(_) => Err(LockError::backend(
                self.options.shown.clone(),
                "the batch was dropped unsent (is the runtime shutting down?)",
            )),
        }
    }

    /// Loads the acquire, renew and release scripts (and their batched
    /// forms) into a single server's cache, all in one round trip, which
    /// also proves the connection and the credentials; a cluster is pinged
    /// instead (its scripts load on each node at first use).
    ///
    /// Why at connect: the first use of a script not in the cache costs three
    /// round trips (`EVALSHA`, `NOSCRIPT`, load, again). Redlock's per-node
    /// timeouts are short against that, and a local waiter's acquire sent
    /// right behind a first release would overtake the release's retry.
    pub(in crate::backends::redis) async fn load_scripts(&self) -> Result<(), LockError> {
        let Conn::Single(conn) = &self.conn else {
            return self.ping().await;
        };
        self.count();
        // Polled together, the loads go out in one write.
        let loads = [
            &*ACQUIRE,
            &*renew_many::RENEW_KEYS,
            &*RELEASE,
            &*ACQUIRE_MANY,
            &*RELEASE_MANY,
            &*scripts::ACQUIRE_ALL,
        ]
        .map(|script| {
            let mut conn = conn.clone();
            async move { script.load_async(&mut conn).await }
        });
        futures_util::future::try_join_all(loads)
            .await
            .map(drop)
            .map_err(|e| self.error(e))
    }

    pub(in crate::backends::redis) async fn ping(&self) -> Result<(), LockError> {
        self.count();
        let mut cmd = redis::cmd("PING");
        let answer: RedisResult<String> = match self.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.arg("dlock").query_async(&mut c).await,
        };
        answer.map(drop).map_err(|e| self.error(e))
    }

    /// Runs a script call built by [`scripts::evalsha`].
    pub(in crate::backends::redis) async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        call: &redis::Cmd,
    ) -> Result<T, LockError> {
        self.count();
        let answer = match self.conn.clone() {
            Conn::Single(mut c) => scripts::run(&mut c, script, call).await,
            Conn::Cluster(mut c) => scripts::run(&mut c, script, call).await,
        };
        answer.map_err(|e| self.error(e))
    }

    /// Bounds one request by the caller's deadline. When the wait runs out
    /// with the request in flight, the answer depends on what the wait has
    /// heard (`heard`, set here by every answer of the wait's requests):
    /// - an answer before: `ran_out` (a "held" that ends the wait, so the
    ///   caller gets `Timeout`): the server was there, the key was taken,
    ///   the caller's time ended;
    /// - none: the request gets the rest of
    ///   [`SILENT_FOR`](crate::backend::silence::SILENT_FOR) since it was
    ///   sent (`backend/silence.rs`). An answer then is used as if on time
    ///   (a grant is kept; "held" ends the wait as `Timeout`); none is a
    ///   transient `Backend` error, "no answer before the wait ended": no
    ///   holder was ever seen, and `Timeout` would tell the caller
    ///   "contention" during an outage (a stopped server and a 200 ms wait
    ///   answered 409 "in use" instead of 503). A short wait against a
    ///   healthy server still ends as `Timeout` on time (the conformance
    ///   case `short_waits_time_out_never_fail`: 50 ms waits).
    ///
    /// A request dropped unanswered gives back what it may have taken by
    /// its own release-if-dropped guard (`unfinished.rs`).
    pub(in crate::backends::redis) async fn within<T>(
        &self,
        deadline: Option<Instant>,
        request: impl std::future::Future<Output = Result<T, LockError>>,
        ran_out: T,
        heard: &AtomicBool,
    ) -> Result<T, LockError> {
        let sent = Instant::now();
        let mut request = std::pin::pin!(request);
        if let Some(answer) = crate::backend::deadline::until(deadline, &mut request).await {
            heard.store(true, Ordering::Relaxed);
            return answer;
        }
        if heard.load(Ordering::Relaxed) {
            return Ok(ran_out);
        }
        match rest_of_silence(sent, request).await {
            Late::Answered(answer) => {
                heard.store(true, Ordering::Relaxed);
                answer
            }
            Late::Silent(for_) => Err(LockError::backend(
                self.options.shown.clone(),
                Transient::new(format!(
                    "no answer from the server before the wait ended (the request was {for_:?} in flight)"
                )),
            )),
        }
    }

    /// One run of the acquire script, alone or in a batch. With
    /// `release_unclaimed`, a lease taken in a batch whose caller went away
    /// meanwhile is released at once (see `batching/ops.rs` for why Redlock
    /// declines).
    pub(crate) async fn attempt(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        release_unclaimed: bool,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let batchers = self.batchers.as_ref().map(LaneBatchers::here);
        let turn = batchers.as_ref().map(|b| {
            b.acquire.enter(|| AcquireOp {
                lock: names.lock.clone(),
                fence: self.fence_key(names).to_owned(),
                token: req.token.clone(),
                ttl_ms: millis(req.ttl),
                retention_ms: self.fence_retention_ms(),
                release_unclaimed: release_unclaimed.then(|| names.channel.clone()),
            })
        });
        let (won, value): (i64, i64) = match turn {
            Some(Turn::Queued(answer)) => self.batched(answer).await?,
            _alone => {
                let mut call = scripts::evalsha(&ACQUIRE, 2);
                call.arg(&names.lock)
                    .arg(self.fence_key(names))
                    .arg(&req.token)
                    .arg(millis(req.ttl))
                    .arg(self.fence_retention_ms());
                self.eval(&ACQUIRE, &call).await?
            }
        };
        self.attempt_answer(req, names, sent, won, value)
    }

    /// The fence counter the acquire scripts are given for the lock `names`:
    /// with `?fence=off` the lock key itself, which the scripts read as
    /// "issue no fence" (see `ACQUIRE_FUNCTIONS`), so the acquire neither
    /// reads nor writes a counter.
    pub(crate) fn fence_key<'a>(&self, names: &'a KeyNames) -> &'a str {
        if self.options.fenced {
            &names.fence
        } else {
            &names.lock
        }
    }

    /// The fencing token of a lease whose acquire script answered `fence`:
    /// none with `?fence=off` (the script answered 0, not a fence).
    pub(crate) fn issued_fence(&self, fence: u64) -> Option<u64> {
        self.options.fenced.then_some(fence)
    }

    /// The last argument of every script that issues fences: how long a
    /// fencing counter outlives its last fence, in ms (`?fence_retention=`).
    pub(crate) fn fence_retention_ms(&self) -> u64 {
        millis(self.options.fence_retention)
    }

    /// Reads the acquire scripts' answer: `{1, fence}` or `{0, pttl}`.
    pub(in crate::backends::redis) fn attempt_answer(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        sent: Instant,
        won: i64,
        value: i64,
    ) -> Result<Attempt, LockError> {
        if won == 1 {
            let fence = u64::try_from(value).map_err(|_| {
                self.error(RedisError::from((
                    redis::ErrorKind::Parse,
                    "fence counter is negative",
                    names.fence.clone(),
                )))
            })?;
            let fence = self.issued_fence(fence);
            return Ok(Attempt::Acquired(granted(req, names, sent, fence)));
        }
        Ok(Attempt::Held(holder_left(value)))
    }

    /// The compare-and-delete of `lease`, sent by this future itself and
    /// never queued in a release batch: on the connection at its first
    /// poll (unless the connection is being re-established), and never sent
    /// once the future is dropped. Redlock undoes a failed round with it,
    /// so that the undo is not held back behind other keys' releases while
    /// the next round's acquire of the same token goes out ahead of it.
    pub(crate) async fn release_unbatched(&self, lease: &Lease) -> Result<bool, LockError> {
        let names = KeyNames::new(&self.options.prefix, &lease.key).in_db(self.db);
        let mut call = scripts::evalsha(&RELEASE, 1);
        call.arg(&names.lock).arg(&lease.token).arg(&names.channel);
        let released: i64 = self.eval(&RELEASE, &call).await?;
        Ok(released == 1)
    }

    /// A guard that releases the lock `names` for `token` if dropped
    /// armed: an acquisition that may have been granted and was given up.
    pub(in crate::backends::redis) fn release_if_dropped<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
    ) -> ReleaseIfDropped<'a> {
        ReleaseIfDropped::arm(&self.conn, &RELEASE, &names.lock, token, &names.channel)
    }

    /// [`attempt`](Self::attempt) for this backend's own `acquire` and
    /// `try_acquire`: if the future is dropped (or fails) with the script in
    /// flight, the lease it may have taken is released, not left to its ttl.
    ///
    /// Not for Redlock, which retries with the same token after a dropped
    /// attempt: a release queued for the dropped one could delete the retry's
    /// lease. Here a dropped or failed attempt always ends the acquisition.
    pub(in crate::backends::redis) async fn attempt_or_release(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
    ) -> Result<Attempt, LockError> {
        let mut unfinished = self.release_if_dropped(names, &req.token);
        let answer = self.attempt(req, names, true).await?;
        unfinished.disarm();
        Ok(answer)
    }
}

/// The lease an acquire script (`ACQUIRE`, `ACQUIRE_ALL`) granted `req` on
/// the lock key of `names`, with its fence (none with `?fence=off`); sent at
/// `sent`, from which its validity runs.
pub(crate) fn granted(
    req: &AcquireRequest,
    names: &KeyNames,
    sent: Instant,
    fence: Option<u64>,
) -> Lease {
    Lease {
        key: req.key.clone(),
        token: req.token.clone(),
        ttl: req.ttl,
        fencing_token: fence,
        valid_until: lease_deadline(sent, req.ttl),
        resource: names.lock.clone(),
    }
}

/// A holder's time left from its key's `PTTL`: -2 the key vanished meanwhile
/// (retry now); -1 a key without expiry, set by someone else (unknown: wait
/// for a release).
pub(crate) fn holder_left(pttl: i64) -> Option<Duration> {
    match pttl {
        -2 => Some(Duration::ZERO),
        ms if ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
        _ => None,
    }
}
