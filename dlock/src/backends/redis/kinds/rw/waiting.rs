//! The wait of a read-write lease: a lock's wait (`subscriber/waiting.rs`)
//! on the lock's one release channel and its three keys, plus a waiting
//! writer's mark refresh.

use std::time::{Duration, Instant};

use super::{mark_ttl, Blocker, RedisBackend, RwAttempt, RwNames};
use crate::backend::{Lease, RwMode, RwRequest};
use crate::backends::redis::waiting::subscriber::waiting::{Pace, Try, Watched};
use crate::LockError;

impl RedisBackend {
    /// Runs attempts until one is admitted or `deadline` passes
    /// (`Ok(None)`).
    ///
    /// As a lock's waiter: subscribed to the lock's release channel (and,
    /// where the server notifies, to the keyspace channels of the writer,
    /// readers and marks keys), woken by a release message, the expiry of
    /// the lease or mark in the way (the script says which, and when), or a
    /// re-check that finds that key gone (an operator's `DEL` publishes
    /// nothing: see `recheck.rs`). A writer also tries again at least every
    /// third of its mark's lifetime, which refreshes the mark that keeps new
    /// readers out.
    pub(super) async fn wait_rw(
        &self,
        req: &RwRequest,
        names: &RwNames,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let writer = req.mode == RwMode::Write;
        let watched = [
            Watched {
                channel: Some(&names.channel),
                key: Some(&names.writer),
            },
            Watched {
                channel: None,
                key: Some(&names.readers),
            },
            Watched {
                channel: None,
                key: Some(&names.waiting),
            },
        ];
        let pace = Pace {
            unknown_expiry: req.ttl,
            at_most: writer.then(|| mark_ttl(req.ttl) / 3),
        };
        // Whether a try of this wait was answered (see `within`).
        let heard = &std::sync::atomic::AtomicBool::new(false);
        let waited = self
            .wait_on_keys(&watched, None, deadline, pace, |_| async move {
                let tried = self
                    .within(
                        deadline,
                        self.attempt_rw(req, names, writer),
                        RwAttempt::Blocked {
                            left: Some(Duration::ZERO),
                            by: Blocker::Writer,
                        },
                        heard,
                    )
                    .await?;
                Ok(match tried {
                    RwAttempt::Acquired(lease) => Try::Done(lease),
                    // What a re-check looks at: the key in the way. A writer
                    // held back by an older writer's mark has none (its own
                    // mark is in the same keys); its refresh is its re-check.
                    RwAttempt::Blocked { left, by } => Try::Held {
                        on: match by {
                            Blocker::Writer => Some(0),
                            Blocker::Readers => Some(1),
                            Blocker::Waiting => (!writer).then_some(2),
                        },
                        left,
                    },
                })
            })
            .await?;
        Ok(waited.ok())
    }
}
