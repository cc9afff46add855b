//! The wait of a read-write lease: what a reader or writer does between
//! attempts, on the shared subscriber, as a lock's waiter does (see
//! `subscriber/waiting.rs`), plus a waiting writer's mark refresh.

use std::time::{Duration, Instant};

use super::{mark_ttl, Blocker, RedisBackend, RwAttempt, RwNames};
use crate::backend::{Lease, RwMode, RwRequest};
use crate::backends::redis::jitter;
use crate::backends::redis::subscriber::waiting::nap_until;
use crate::LockError;

impl RedisBackend {
    /// Runs attempts until one is admitted or `deadline` passes
    /// (`Ok(None)`).
    ///
    /// A free lock is taken without subscribing. When blocked: subscribe
    /// to the lock's release channel (and, where the server notifies, to
    /// the keyspace channels of the writer, readers and marks keys), try
    /// again, then wait for a release message, the expiry of the lease or
    /// mark in the way (the script says which, and when), or a re-check
    /// that finds that key gone (an operator's `DEL` publishes nothing: see
    /// `recheck.rs`). A writer also tries again at least every third of its
    /// mark's lifetime, which refreshes the mark that keeps new readers out.
    pub(super) async fn wait_rw(
        &self,
        req: &RwRequest,
        names: &RwNames,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let writer = req.mode == RwMode::Write;
        let attempt = || self.within(deadline, self.attempt_rw(req, names, writer));
        if let RwAttempt::Acquired(lease) = attempt().await? {
            return Ok(Some(lease));
        }
        let mut channels = vec![names.channel.clone()];
        for key in [&names.writer, &names.readers, &names.waiting] {
            channels.extend(self.keyspace_channel(key));
        }
        let mut released = self.subscriber.subscribe(&channels, deadline).await;
        let refresh = writer.then(|| mark_ttl(req.ttl) / 3);
        loop {
            released.mark_seen();
            let (left, by) = match attempt().await? {
                RwAttempt::Acquired(lease) => return Ok(Some(lease)),
                RwAttempt::Blocked { left, by } => (left.unwrap_or(req.ttl), by),
            };
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
            let mut nap = left.saturating_add(jitter(left / 10 + Duration::from_millis(2)));
            if let Some(refresh) = refresh {
                nap = nap.min(refresh);
            }
            let expiry = nap_until(nap, deadline);
            tokio::pin!(expiry);
            // What a re-check looks at: the key in the way. A writer held
            // back by an older writer's mark has none (its own mark is in
            // the same keys); its refresh is its re-check.
            let watched = match by {
                Blocker::Writer => Some(&names.writer),
                Blocker::Readers => Some(&names.readers),
                Blocker::Waiting => (!writer).then_some(&names.waiting),
            };
            let mut rechecks = watched.and_then(|key| Some((key, self.recheck()?)));
            loop {
                let recheck = async {
                    let Some((key, schedule)) = rechecks.as_mut() else {
                        return std::future::pending().await;
                    };
                    tokio::time::sleep(schedule.pause()).await;
                    self.key_is_free(key).await
                };
                tokio::select! {
                    () = released.changed() => break,
                    () = &mut expiry => break,
                    free = recheck => match free {
                        Ok(true) => break,
                        Ok(false) => {}
                        // The next attempt reports an outage; until then
                        // the other wake-ups stand.
                        Err(e) => tracing::debug!(error = %e, "re-check failed"),
                    },
                }
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
        }
    }
}
