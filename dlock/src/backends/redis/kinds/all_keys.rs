//! A `MultiLock`'s keys all or none in one script, on a single server: the
//! [`AllKeysBackend`] of a `redis://` backend (not Cluster, whose keys of
//! different locks live in different slots, nor Redlock).
//!
//! One run of `ACQUIRE_ALL` reads every key, and either writes nothing (a
//! key is held by someone else: its position and its holder's time left
//! come back) or takes every key as the one-key acquire does, each with its
//! own token and fence. A waiter subscribes to every key's release channel
//! and tries again when any is released, when the key in the way expires,
//! or when a re-check finds it gone (`subscriber/waiting.rs`).

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::{AcquireRequest, AllKeysBackend, AllOrNone, Lease};
use crate::backends::redis::calls::unfinished::ReleaseIfDropped;
use crate::backends::redis::protocol::scripts::{self, millis, KeyNames, ACQUIRE_ALL, RELEASE};
use crate::backends::redis::waiting::subscriber::waiting::{Pace, Try, Watched};
use crate::backends::redis::{check_ttl, granted, holder_left, RedisBackend};
use crate::LockError;

impl RedisBackend {
    /// One run of `ACQUIRE_ALL`. If this future is dropped (or fails) with
    /// the script in flight, every key it may have taken is released.
    async fn attempt_all(
        &self,
        reqs: &[AcquireRequest],
        names: &[KeyNames],
    ) -> Result<Try<Vec<Lease>>, LockError> {
        let mut unfinished: Vec<ReleaseIfDropped<'_>> = reqs
            .iter()
            .zip(names)
            .map(|(req, names)| {
                ReleaseIfDropped::arm(
                    &self.conn,
                    &RELEASE,
                    &names.lock,
                    &req.token,
                    &names.channel,
                )
            })
            .collect();
        let mut call = scripts::evalsha(&ACQUIRE_ALL, 2 * names.len());
        for names in names {
            call.arg(&names.lock).arg(self.fence_key(names));
        }
        for req in reqs {
            call.arg(&req.token);
        }
        for req in reqs {
            call.arg(millis(req.ttl));
        }
        call.arg(self.fence_retention_ms());
        let sent = Instant::now();
        let answer: Vec<i64> = self.eval(&ACQUIRE_ALL, &call).await?;
        unfinished.iter_mut().for_each(ReleaseIfDropped::disarm);
        self.all_answer(reqs, names, sent, &answer)
    }

    /// Reads `ACQUIRE_ALL`'s answer: `{1, fence…}` or `{0, index, pttl}`.
    fn all_answer(
        &self,
        reqs: &[AcquireRequest],
        names: &[KeyNames],
        sent: Instant,
        answer: &[i64],
    ) -> Result<Try<Vec<Lease>>, LockError> {
        let malformed = || {
            LockError::backend(
                self.options.shown.clone(),
                format!("unexpected answer {answer:?} to the multi-key acquire script"),
            )
        };
        match answer {
            [1, fences @ ..] if fences.len() == reqs.len() => reqs
                .iter()
                .zip(names)
                .zip(fences)
                .map(|((req, names), &fence)| {
                    let fence = u64::try_from(fence).map_err(|_| malformed())?;
                    Ok(granted(req, names, sent, self.issued_fence(fence)))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Try::Done),
            &[0, index, pttl] => {
                let on = usize::try_from(index)
                    .ok()
                    .filter(|&on| on < reqs.len())
                    .ok_or_else(malformed)?;
                Ok(Try::Held {
                    on: Some(on),
                    left: holder_left(pttl),
                })
            }
            _ => Err(malformed()),
        }
    }

    fn all_names(&self, reqs: &[AcquireRequest]) -> Result<Vec<KeyNames>, LockError> {
        reqs.iter()
            .map(|req| {
                check_ttl(req.ttl, &req.key, &self.options.shown)?;
                Ok(KeyNames::new(&self.options.prefix, &req.key).in_db(self.db))
            })
            .collect()
    }
}

fn answer(waited: Try<Vec<Lease>>) -> AllOrNone {
    match waited {
        Try::Done(leases) => AllOrNone::Taken(leases),
        Try::Held { on, .. } => AllOrNone::Held {
            index: on.unwrap_or(0),
        },
    }
}

#[async_trait]
impl AllKeysBackend for RedisBackend {
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<AllOrNone, LockError> {
        if reqs.is_empty() {
            return Ok(AllOrNone::Taken(Vec::new()));
        }
        let names = self.all_names(reqs)?;
        let ask = || async { Ok(answer(self.attempt_all(reqs, &names).await?)) };
        let arm = || self.all_if_dropped(reqs, &names);
        let undo = |granted| self.give_back_all(granted);
        self.replicated(&reqs[0].key, (None, true), ask, arm, undo)
            .await
    }

    async fn acquire_all(
        &self,
        reqs: &[AcquireRequest],
        deadline: Option<Instant>,
    ) -> Result<AllOrNone, LockError> {
        if reqs.is_empty() {
            return Ok(AllOrNone::Taken(Vec::new()));
        }
        let names = self.all_names(reqs)?;
        let ask = || self.wait_for_all(reqs, &names, deadline);
        let arm = || self.all_if_dropped(reqs, &names);
        let undo = |granted| self.give_back_all(granted);
        self.replicated(&reqs[0].key, (deadline, false), ask, arm, undo)
            .await
    }
}

impl RedisBackend {
    /// Every key of `reqs` at once, waiting up to `deadline`.
    async fn wait_for_all(
        &self,
        reqs: &[AcquireRequest],
        names: &[KeyNames],
        deadline: Option<Instant>,
    ) -> Result<AllOrNone, LockError> {
        let watched: Vec<Watched<'_>> = names
            .iter()
            .map(|names| Watched {
                channel: Some(&names.channel),
                key: Some(&names.lock),
            })
            .collect();
        // A key without expiry: retry after the shortest ttl we ask for.
        let shortest = reqs.iter().map(|req| req.ttl).min();
        let pace = Pace {
            unknown_expiry: shortest.unwrap_or(reqs[0].ttl),
            at_most: None,
        };
        // Whether a try of this wait was answered (see `within`).
        let heard = std::sync::atomic::AtomicBool::new(false);
        let waited = self
            .wait_on_keys(&watched, None, deadline, pace, |_| {
                self.within(
                    deadline,
                    self.attempt_all(reqs, names),
                    Try::Held {
                        on: None,
                        left: Some(Duration::ZERO),
                    },
                    &heard,
                )
            })
            .await?;
        Ok(match waited {
            Ok(leases) => AllOrNone::Taken(leases),
            Err(index) => AllOrNone::Held {
                index: index.unwrap_or(0),
            },
        })
    }

    /// Guards that release every key of `reqs` if dropped armed.
    fn all_if_dropped<'a>(
        &'a self,
        reqs: &'a [AcquireRequest],
        names: &'a [KeyNames],
    ) -> Vec<ReleaseIfDropped<'a>> {
        reqs.iter()
            .zip(names)
            .map(|(req, names)| self.release_if_dropped(names, &req.token))
            .collect()
    }

    /// Gives back every lease of a grant that replicas did not acknowledge.
    async fn give_back_all(&self, granted: AllOrNone) {
        if let AllOrNone::Taken(leases) = granted {
            for lease in &leases {
                let _ = self.release_unbatched(lease).await;
            }
        }
    }
}
