//! What the Redlock backend uses of a Redis backend, one per master: its
//! options, its subscriber, and the acquire that refuses to vote during a
//! restart quarantine. Built with the `redlock` feature only.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::backend::AcquireRequest;
use crate::backends::redis::protocol::scripts::{self, millis, KeyNames, ACQUIRE_GUARDED};
use crate::backends::redis::waiting::subscriber::Subscriber;
use crate::backends::redis::{Attempt, RedisBackend};
use crate::LockError;

pub(crate) use crate::backends::redis::waiting::subscriber::waiting::nap_until;

impl RedisBackend {
    /// The request timeout (`?timeout=`).
    pub(crate) fn response_timeout(&self) -> Duration {
        self.options.response_timeout
    }

    /// Takes this master's connections out of use: the next request opens
    /// new ones. Redlock calls it for a master silent longer than the
    /// request timeout (its rounds wait only the per-node timeout, so no
    /// request of theirs times out here and retires a dead flow by itself).
    pub(crate) fn retire_connections(&self) {
        if let crate::backends::redis::Conn::Single(
            crate::backends::redis::topology::server::Server::One(conn),
        ) = &self.conn
        {
            conn.retire_all();
        }
    }

    /// The `?recheck_ms=` cap (`None`: off).
    pub(crate) fn recheck_cap(&self) -> Option<Duration> {
        self.options.recheck
    }

    /// The shared pub/sub subscriber (Redlock waits on every master's).
    pub(crate) fn subscriber(&self) -> &Subscriber {
        &self.subscriber
    }

    /// The names of `key` on this master: its prefix, and the release
    /// channel of its database.
    pub(crate) fn key_names(&self, key: &str) -> KeyNames {
        KeyNames::new(&self.options.prefix, key).in_db(self.db)
    }

    /// Whether this backend talks to a Redis Cluster (Redlock needs
    /// independent masters, so it refuses one).
    pub(crate) fn is_cluster(&self) -> bool {
        self.options.cluster
    }

    /// [`attempt`](Self::attempt) on a Redlock master that refuses to vote
    /// for `quarantine` after it lost its data (see `ACQUIRE_GUARDED`).
    /// Never batched: the batch script has no boot marker.
    pub(crate) async fn attempt_guarded(
        &self,
        req: &AcquireRequest,
        names: &KeyNames,
        quarantine: Duration,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let mut call = scripts::evalsha(&ACQUIRE_GUARDED, 3);
        call.arg(&names.lock)
            .arg(&names.fence)
            .arg(format!("{}:boot", self.options.prefix))
            .arg(&req.token)
            .arg(millis(req.ttl))
            .arg(millis(quarantine))
            .arg(self.fence_retention_ms());
        let (won, value): (i64, i64) = self.eval(&ACQUIRE_GUARDED, &call).await?;
        self.attempt_answer(req, names, sent, won, value)
    }

    /// A master's vote, `attempt`, unless the master may now evict lock
    /// keys (see `eviction.rs`): read again before the vote when one of
    /// its connections was opened or broken since it was last read, and
    /// after a vote won on a connection that changed meanwhile. A refused
    /// master's vote is not counted (the error is logged once per
    /// reconnect); the round undoes what it may have granted there, as for
    /// any master that did not answer. The lock is still granted by a
    /// quorum of the others: a master that may evict is one that cannot
    /// be trusted to keep a key, not one whose refusal must stop the lock.
    pub(crate) async fn vote_unless_evicting(
        &self,
        attempt: impl Future<Output = Result<Attempt, LockError>>,
    ) -> Result<Attempt, LockError> {
        self.eviction_unchanged().await?;
        let connections = self.reconnects.now();
        let answer = attempt.await?;
        if matches!(answer, Attempt::Acquired(_)) && self.reconnects.now() != connections {
            self.eviction_unchanged().await?;
        }
        Ok(answer)
    }
}
