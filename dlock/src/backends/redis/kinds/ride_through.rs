//! Behind Sentinel, an acquisition that may wait rides through a failover:
//! a request that fails because the master is gone is asked again, of the
//! master the sentinels name by then, until the wait runs out.
//!
//! Why: after a `kill -9` of the master the sentinels go on naming it until
//! they agree it is down and promote a replica (`down-after-milliseconds`
//! plus an election: 2-3 s with `down-after` 1 s, over 30 s with the
//! default 30 s). Every request meanwhile fails (`Backend`: connection
//! refused or broken pipe), and an `acquire` with 15 s left of its wait
//! would end at once with an outage it could have waited out. A
//! `try_acquire` (no wait) still fails at once: it asked for one attempt.
//!
//! Each new attempt has a new owner token: the attempt that failed may have
//! been granted after all (on the old master, or on the new one if the
//! failure came after the switch), and its release-if-dropped guard sends a
//! compare-and-delete with its token; sent late, on the new master, it must
//! not delete the lease of the next attempt.

use std::time::{Duration, Instant};

use crate::backend::deadline::saturating_add;
use crate::backend::refusal::About;
use crate::backend::{AcquireRequest, Lease};
use crate::backends::redis::protocol::scripts::KeyNames;
use crate::backends::redis::topology::server::Server;
use crate::backends::redis::waiting::subscriber::turn::Ticket;
use crate::backends::redis::{Conn, RedisBackend};
use crate::LockError;

/// The pause between attempts while the master is gone: a failover takes
/// seconds, so a few attempts a second see the new master soon enough
/// without hammering the sentinels.
const PAUSE: Duration = Duration::from_millis(250);

/// How long an acquisition with no limit on its wait rides through
/// failures: longer than a failover with the sentinels' defaults
/// (`down-after-milliseconds` 30 s, then an election), short enough that an
/// outage still shows as `Backend`.
const NO_WAIT_LIMIT: Duration = Duration::from_secs(60);

impl RedisBackend {
    /// A lock's waiting acquisition with `req` until `deadline`, and behind
    /// Sentinel, after a `Backend` error with time left before `deadline`,
    /// again with a new owner token until one answers otherwise or the time
    /// is up (then the last error). Elsewhere one attempt, with `req` as
    /// it is (no copy on the common path).
    pub(in crate::backends::redis) async fn riding_failovers(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let Conn::Single(Server::Followed(sentinel)) = &self.conn else {
            return self.wait_for_lock(req, deadline).await;
        };
        let give_up = deadline.unwrap_or_else(|| saturating_add(Instant::now(), NO_WAIT_LIMIT));
        let mut req = req.clone();
        let mut failures = 0u32;
        loop {
            let failed = match self.wait_for_lock(&req, deadline).await {
                Err(e @ LockError::Backend { .. }) => e,
                answer => {
                    if failures > 0 {
                        tracing::info!(key = %req.key, failures, master = %sentinel.master_addr(),
                            "dlock: an acquisition rode through a failover");
                    }
                    return answer;
                }
            };
            if Instant::now() + PAUSE >= give_up {
                return Err(failed);
            }
            failures += 1;
            tracing::debug!(key = %req.key, error = %failed,
                "the master failed an acquisition; asking again once the sentinels name a master");
            tokio::time::sleep(PAUSE).await;
            // Follows a new master if the sentinels name one by now.
            if let Err(e) = sentinel.refresh().await {
                tracing::debug!(error = %e, "no sentinel named a master yet");
            }
            req.token = crate::backend::holder::owner_token(self)?;
        }
    }

    /// One waiting acquisition of a lock: queued on the server (see
    /// `waiter_queue.rs`), its grant acknowledged by the replicas, and a
    /// grant given up on the way released.
    async fn wait_for_lock(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let names = KeyNames::new(&self.options.prefix, &req.key).in_db(self.db);
        let ticket = Ticket::of(&req.token, self.subscriber.turn_channel());
        let ask = || self.wait_in_queue(req, &names, &ticket, deadline);
        let undo = |granted: Option<Lease>| async move {
            if let Some(lease) = granted {
                let _ = self.release_unbatched(&lease).await;
            }
        };
        let arm = || self.release_if_dropped(&names, &req.token);
        let answer = self
            .replicated(&req.key, (deadline, false), ask, arm, undo)
            .await;
        answer.map_err(|e| self.name_refusal(e, About::Lock(&req.key)))
    }
}
