//! The quorum round: acquire on every master at once, decide as soon as the
//! outcome is known, and unwind a partial acquisition; and the waiting on
//! every master's release channel between rounds.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::{RedlockBackend, SUBSCRIBE_WAIT, SUSPECT_FOR};
use crate::backend::{lease_deadline, AcquireRequest, Lease, LockBackend};
use crate::backends::redis::protocol::scripts::KeyNames;
use crate::backends::redis::waiting::subscriber::Subscription;
use crate::backends::redis::{Attempt, RedisBackend};

/// One master's answer to an acquire request.
pub(super) enum Vote {
    Won,
    /// Someone else holds the key there, for this much longer (`None`: unknown).
    Held(Option<Duration>),
    Silent,
    /// Not asked: an undo of this token on that master is unfinished (see
    /// [`Undos`]). Counts as silent, and surely not ours.
    NotAsked,
}

/// How one acquisition round ended.
pub(super) enum Outcome {
    Acquired(Lease),
    /// Another owner holds the key on enough masters to block us; its keys
    /// free a quorum after about `left` (`None`: unknown). `blockers[i]`:
    /// master `i` answered "held".
    Held {
        left: Option<Duration>,
        blockers: Vec<bool>,
    },
    /// Nobody has a quorum that blocks us (split vote, or too slow for the
    /// validity): worth retrying soon.
    Split,
    /// Fewer than a quorum of masters answered.
    NoQuorum {
        reached: usize,
    },
}

impl RedlockBackend {
    pub(super) fn is_suspect(&self, i: usize, now: Instant) -> bool {
        let suspect = self.suspect_until[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        suspect.until.is_some_and(|until| now < until)
    }

    /// Records whether master `i` failed or was silent (`suspect`) or
    /// answered. A master silent for longer than its request timeout, round
    /// after round, has its connections retired: a flow that a NAT forgot
    /// answers nothing and drops nothing, and a round's per-node timeout is
    /// too short to count as the request timeout that retires a connection
    /// by itself (`redis/connection.rs`).
    pub(super) fn set_suspect(&self, i: usize, suspect: bool) {
        let now = Instant::now();
        let retire = {
            let mut state = self.suspect_until[i]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            state.until = suspect.then(|| now + SUSPECT_FOR);
            if !suspect {
                state.silent_since = None;
                false
            } else {
                let since = *state.silent_since.get_or_insert(now);
                let retire =
                    now.saturating_duration_since(since) >= self.nodes[i].response_timeout();
                if retire {
                    state.silent_since = Some(now);
                }
                retire
            }
        };
        if retire {
            tracing::debug!(master = %self.nodes[i].describe(),
                "a Redlock master silent longer than its request timeout: its connections are retired");
            self.nodes[i].retire_connections();
        }
    }

    /// One Redlock round: acquire on all masters in parallel, decide as soon
    /// as the outcome is known, and undo a partial acquisition.
    pub(super) async fn round(&self, req: &AcquireRequest) -> Outcome {
        let n = self.nodes.len();
        let timeout = self.node_timeout_for(req.ttl);
        // The validity is measured from before the first request is sent.
        let start = Instant::now();
        let valid_until = lease_deadline(start, req.ttl);
        let resource = self.names(0, &req.key).lock;
        let lease = Lease::unfenced(&req.key, &req.token, req.ttl, valid_until, resource);
        // The token is reused round after round: an acquire with it must not
        // reach a master while an earlier round's delete of it there may
        // still land behind the acquire (see `Undos`).
        let shared_req = Arc::new(req.clone());
        let votes: FuturesUnordered<_> = (0..n)
            .map(|i| {
                let asked = (!self.undos.unfinished(i, &req.token))
                    .then(|| (self.nodes[i].clone(), self.acquire_names(i, &req.key)));
                let ask = Ask {
                    req: shared_req.clone(),
                    quarantine: self.restart_quarantine,
                    timeout,
                };
                vote(i, asked, ask)
            })
            .collect();
        // If this future is dropped mid-round, requests may still land:
        // release them in the background, once those still on their way
        // have been answered.
        let mut unwind = Unwind {
            nodes: &self.nodes,
            lease: &lease,
            timeout,
            votes,
            armed: true,
        };
        // Masters that failed recently are asked but not waited for.
        let suspect: Vec<bool> = (0..n).map(|i| self.is_suspect(i, start)).collect();
        let mut suspects_pending = suspect.iter().filter(|&&s| s).count();
        let mut won = 0;
        let mut silent = 0;
        let mut held: Vec<Option<Duration>> = Vec::new();
        // Masters that surely do not hold our token: they answered "held".
        let mut not_ours = vec![false; n];
        let mut answered = vec![false; n];
        while let Some((i, vote)) = unwind.votes.next().await {
            answered[i] = true;
            if suspect[i] {
                suspects_pending -= 1;
            }
            if !matches!(vote, Vote::NotAsked) {
                self.set_suspect(i, matches!(vote, Vote::Silent));
            }
            match vote {
                Vote::Won => won += 1,
                Vote::Held(left) => {
                    not_ours[i] = true;
                    held.push(left);
                }
                Vote::Silent => silent += 1,
                Vote::NotAsked => {
                    // Nothing was sent there this round: nothing to undo.
                    not_ours[i] = true;
                    silent += 1;
                }
            }
            if won >= self.quorum || held.len() + silent + suspects_pending > n - self.quorum {
                break;
            }
        }
        silent += suspects_pending;
        if won >= self.quorum && Instant::now() < valid_until {
            // Masters still pending are not waited for: their requests may
            // land, which the lease's own release covers.
            unwind.armed = false;
            drop(unwind);
            return Outcome::Acquired(lease);
        }
        // Failed: undo on every master that may hold our token. The deletes
        // go out before anything else happens here and finish even if this
        // round is dropped while it waits (see `release_on`). The next round
        // reuses the token, and a late delete must not remove the key that
        // round counts: this round waits for the masters not presumed down,
        // and the next one does not ask a master whose undo is unfinished
        // (`Delete::Undo`).
        //
        // A master still pending is undone only once its acquire has been
        // answered: its request may not be on the connection yet (a batch
        // being sent by another thread, a full send queue), and a delete
        // sent now could reach the master first. So this round first waits
        // for the pending masters not presumed down (each up to the
        // per-node timeout, as it would wait for their deletes; dropped
        // meanwhile, `Unwind` does it all); those presumed down are undone
        // by a task of their own once they answer (`undo_when_answered`).
        let mut surely_not = not_ours.clone();
        let mut awaited = (0..n).filter(|&i| !answered[i] && !suspect[i]).count();
        while awaited > 0 {
            let Some((i, vote)) = unwind.votes.next().await else {
                break;
            };
            answered[i] = true;
            if !suspect[i] {
                awaited -= 1;
            }
            surely_not[i] |= matches!(vote, Vote::Held(_) | Vote::NotAsked);
        }
        unwind.armed = false;
        let pending = std::mem::take(&mut unwind.votes);
        drop(unwind);
        let mut lease = lease;
        lease.valid_until = Instant::now();
        if !pending.is_empty() {
            self.undo_when_answered(&lease, timeout, pending, &answered);
        }
        let may_be_ours: Vec<bool> = (0..n).map(|i| answered[i] && !surely_not[i]).collect();
        if may_be_ours.contains(&true) {
            self.release_on(&lease, timeout, &may_be_ours, usize::MAX, Delete::Undo)
                .await;
        }
        let answered = won + held.len();
        if silent > n - self.quorum {
            return Outcome::NoQuorum { reached: answered };
        }
        // To win, `blocking` of the held masters must free up: wake when
        // that many of them have expired.
        let blocking = (held.len() + self.quorum).saturating_sub(n);
        if blocking == 0 {
            return Outcome::Split;
        }
        held.sort_by_key(|left| left.unwrap_or(Duration::MAX));
        Outcome::Held {
            left: held[blocking - 1],
            blockers: not_ours,
        }
    }

    /// Sends the compare-and-delete of `lease` to every master `i` with
    /// `send[i]`, in parallel, and returns (released, answered) of those
    /// heard before returning.
    ///
    /// The deletes are put on their masters' connections in this call's
    /// first poll (in the caller's lane, see `backends/redis/transport/lanes.rs`) and
    /// driven by the caller while it waits; those still in flight when it
    /// stops waiting or is dropped go on in a task of their own
    /// (`Leftovers`), so each one is sent and answered even if the caller
    /// goes on or is dropped meanwhile (a
    /// user's timeout, a `SegmentedLock` dropping the waits that lost: an
    /// undo cut short would leave our token on a minority of masters until
    /// its ttl). Sent first also means a later request of ours to the same
    /// master (the next round's acquire, the next local waiter's) goes out
    /// behind the delete.
    ///
    /// The caller waits for the masters not presumed down, each up to
    /// `timeout`, and goes on as soon as `enough` of them released; masters
    /// presumed down are counted if they answer meanwhile, never waited for.
    ///
    /// A [`Delete::Undo`] is sent alone, never queued in a master's release
    /// batch, and is listed in [`Undos`] until its future ends.
    pub(super) async fn release_on(
        &self,
        lease: &Lease,
        timeout: Duration,
        send: &[bool],
        enough: usize,
        kind: Delete,
    ) -> (usize, usize) {
        let now = Instant::now();
        let targets: Vec<usize> = (0..self.nodes.len()).filter(|&i| send[i]).collect();
        let waited_for: Vec<bool> = (0..self.nodes.len())
            .map(|i| send[i] && !self.is_suspect(i, now))
            .collect();
        let mut awaited = waited_for.iter().filter(|&&w| w).count();
        let mut tally = Tally::default();
        let nodes: Vec<(usize, Arc<RedisBackend>, Option<UndoInFlight>)> = targets
            .iter()
            .map(|&i| {
                // Listed from before the delete is sent until its future ends.
                let unfinished =
                    matches!(kind, Delete::Undo).then(|| self.undos.start(i, &lease.token));
                (i, self.nodes[i].clone(), unfinished)
            })
            .collect();
        let lease = Arc::new(lease.clone());
        let deletes: FuturesUnordered<_> = nodes
            .into_iter()
            .map(|(i, node, unfinished)| {
                let lease = lease.clone();
                async move {
                    let delete = async {
                        match kind {
                            Delete::Undo => node.release_unbatched(&lease).await,
                            Delete::Release => node.release(&lease).await,
                        }
                    };
                    let answer = tokio::time::timeout(timeout, delete).await;
                    drop(unfinished);
                    (i, answer.ok().and_then(Result::ok))
                }
            })
            .collect();
        // Driven here, in the caller's task: its first poll puts every
        // delete on its master's connection of this lane (our later
        // requests to each master, the next round's acquire or the next
        // local waiter's, which may go as soon as this call was first
        // polled, go out behind it), and the answers wake the caller
        // directly. What is left when the caller stops waiting (masters
        // presumed down, answers after `enough`) or is dropped goes on in a
        // task on dlock's runtime (`Leftovers`).
        let mut deletes = Leftovers(deletes);
        let mut first = Vec::new();
        std::future::poll_fn(|cx| {
            while let Poll::Ready(Some(answer)) = deletes.0.poll_next_unpin(cx) {
                first.push(answer);
            }
            Poll::Ready(())
        })
        .await;
        let mut first = first.into_iter();
        while awaited > 0 && tally.released < enough {
            let answer = match first.next() {
                Some(answer) => Some(answer),
                None => deletes.0.next().await,
            };
            let Some((i, answer)) = answer else {
                break;
            };
            if waited_for[i] {
                awaited -= 1;
            }
            self.count(&mut tally, i, answer);
        }
        (tally.released, tally.answered)
    }

    /// Counts master `i`'s answer to a delete (`None`: none in time, so it
    /// is presumed down for a while).
    pub(super) fn count(&self, tally: &mut Tally, i: usize, answer: Option<bool>) {
        self.set_suspect(i, answer.is_none());
        if let Some(was_ours) = answer {
            tally.answered += 1;
            tally.released += usize::from(was_ours);
        }
    }

    /// The undo of a failed round on the masters whose acquire is still
    /// `pending`: a task of its own waits for each answer (up to the
    /// per-node timeout), then deletes our token where it may have been
    /// set. The masters are listed in [`Undos`] from now until their delete
    /// is done, so the next round does not ask them meanwhile.
    fn undo_when_answered<V>(
        &self,
        lease: &Lease,
        timeout: Duration,
        pending: FuturesUnordered<V>,
        answered: &[bool],
    ) where
        V: Future<Output = (usize, Vote)> + Send + 'static,
    {
        let listed: Vec<(usize, Arc<RedisBackend>, UndoInFlight)> = (0..self.nodes.len())
            .filter(|&i| !answered[i])
            .map(|i| (i, self.nodes[i].clone(), self.undos.start(i, &lease.token)))
            .collect();
        let lease = lease.clone();
        crate::backends::redis::spawn_in_lane(async move {
            let votes: Vec<(usize, Vote)> = pending.collect().await;
            let deletes = listed.into_iter().map(|(i, node, unfinished)| {
                let lease = &lease;
                let surely_not = votes
                    .iter()
                    .any(|(v, vote)| *v == i && matches!(vote, Vote::Held(_) | Vote::NotAsked));
                async move {
                    if !surely_not {
                        let _ = tokio::time::timeout(timeout, node.release_unbatched(lease)).await;
                    }
                    drop(unfinished);
                }
            });
            futures_util::future::join_all(deletes).await;
        });
    }

    /// Subscribes to the key's release channel on every master at once,
    /// and to its keyspace channel on the masters that notify.
    pub(super) async fn subscribe_all(
        &self,
        key: &str,
        deadline: Option<Instant>,
    ) -> Vec<Subscription> {
        let bound = Instant::now() + SUBSCRIBE_WAIT;
        let bound = deadline.map_or(bound, |d| d.min(bound));
        let subscribing = (0..self.nodes.len()).map(|i| {
            let names = self.names(i, key);
            let mut channels = vec![names.channel];
            channels.extend(self.nodes[i].keyspace_channel(&names.lock));
            async move {
                self.nodes[i]
                    .subscriber()
                    .subscribe(&channels, Some(bound))
                    .await
            }
        });
        futures_util::future::join_all(subscribing).await
    }

    /// One re-check: a `PTTL` of the key on every master at once, each
    /// bounded by `timeout`. True when the key is gone from a quorum of
    /// them, so a round could win: a release by a client that is not dlock,
    /// which announced nothing.
    pub(super) async fn free_on_quorum(&self, key: &str, timeout: Duration) -> bool {
        let mut checks: FuturesUnordered<_> = (0..self.nodes.len())
            .map(|i| {
                let lock = self.names(i, key).lock;
                async move {
                    let free =
                        tokio::time::timeout(timeout, self.nodes[i].key_is_free(&lock)).await;
                    matches!(free, Ok(Ok(true)))
                }
            })
            .collect();
        let (mut free, mut not_free) = (0, 0);
        while let Some(is_free) = checks.next().await {
            if is_free {
                free += 1;
            } else {
                not_free += 1;
            }
            // Decided: no need to wait for the slowest master.
            if free >= self.quorum || not_free > self.nodes.len() - self.quorum {
                break;
            }
        }
        free >= self.quorum
    }
}

/// What a [`release_on`](RedlockBackend::release_on) deletes.
#[derive(Clone, Copy)]
pub(super) enum Delete {
    /// A guard's lease: its token is never used again, so the deletes may
    /// go out batched, in any order with later requests.
    Release,
    /// A failed round's partial acquisition, whose token the next round
    /// reuses.
    Undo,
}

/// The undos of a round's partial acquisition that are not finished yet,
/// per master: `(master, token)`.
///
/// Why: a master presumed down is not waited for, so its undo may still be
/// on its way when the next round of the same acquisition starts. Had that
/// round's acquire reached the master first, the late delete would remove
/// the key the round counted (a release batch of that master, busy with
/// other keys' releases, kept the undo back while the acquire went out
/// alone). So a round does not ask a master while an undo of its token
/// there is listed here ([`Vote::NotAsked`]). An entry goes when the
/// delete's future ends: answered, the delete ran; timed out, the future
/// is dropped, and a delete that was sent is ahead of any later request on
/// that master's connection while one that was not never will be (an undo
/// is sent by its own future, never by a batch).
#[derive(Default)]
pub(super) struct Undos(Arc<Mutex<Vec<(usize, String)>>>);

impl Undos {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<(usize, String)>> {
        // Pushes and removals only: a poisoned list is still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an undo of `token` on master `i` is unfinished.
    fn unfinished(&self, i: usize, token: &str) -> bool {
        self.list().iter().any(|(m, t)| *m == i && t == token)
    }

    /// Lists an undo of `token` on master `i` until the returned value is
    /// dropped.
    fn start(&self, i: usize, token: &str) -> UndoInFlight {
        self.list().push((i, token.to_owned()));
        UndoInFlight {
            undos: self.0.clone(),
            entry: Some((i, token.to_owned())),
        }
    }
}

/// One listed undo; dropping it takes it off the list.
pub(super) struct UndoInFlight {
    undos: Arc<Mutex<Vec<(usize, String)>>>,
    entry: Option<(usize, String)>,
}

impl Drop for UndoInFlight {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        let mut list = self.undos.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = list.iter().position(|e| *e == entry) {
            list.swap_remove(at);
        }
    }
}

/// Answers to deletes so far: how many masters answered, and how many of
/// them released our key.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) answered: usize,
    pub(super) released: usize,
}

/// Resolves when any master `i` with `from[i]` (every master without
/// `from`) announced a release since the last `mark_seen`.
pub(super) async fn any_released(subscriptions: &mut [Subscription], from: Option<&[bool]>) {
    let changes: Vec<_> = subscriptions
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| from.is_none_or(|from| from[*i]))
        .map(|(_, s)| Box::pin(s.changed()))
        .collect();
    if changes.is_empty() {
        return std::future::pending().await;
    }
    futures_util::future::select_all(changes).await;
}

/// Sends the compare-and-delete of `lease` to each of `nodes`, in
/// parallel, each bounded by `timeout`. Returns each master's answer
/// (`None`: no answer), in the order of `nodes`.
pub(super) async fn release_all(
    nodes: &[Arc<RedisBackend>],
    lease: &Lease,
    timeout: Duration,
) -> Vec<Option<bool>> {
    let releases = nodes.iter().map(|node| async move {
        match tokio::time::timeout(timeout, node.release(lease)).await {
            Ok(Ok(was_ours)) => Some(was_ours),
            _ => None,
        }
    });
    futures_util::future::join_all(releases).await
}

/// What every master of a round is asked, shared by the round's votes.
struct Ask {
    req: Arc<AcquireRequest>,
    quarantine: Option<Duration>,
    timeout: Duration,
}

/// Master `i`'s vote: its answer to the acquire (`asked`: the master and the
/// key's names there; `None`: not asked, see [`Undos`]), bounded by the
/// per-node timeout. Owns what it needs, so that a round that stops
/// waiting can hand its pending votes to a task that waits for them.
async fn vote(i: usize, asked: Option<(Arc<RedisBackend>, KeyNames)>, ask: Ask) -> (usize, Vote) {
    let Some((node, names)) = asked else {
        return (i, Vote::NotAsked);
    };
    let attempt = node.vote_unless_evicting(async {
        match ask.quarantine {
            Some(q) => node.attempt_guarded(&ask.req, &names, q).await,
            None => node.attempt(&ask.req, &names, false).await,
        }
    });
    let vote = match tokio::time::timeout(ask.timeout, attempt).await {
        Ok(Ok(Attempt::Acquired(_))) => Vote::Won,
        Ok(Ok(Attempt::Held(left) | Attempt::Behind(left))) => Vote::Held(left),
        Ok(Err(e)) => {
            tracing::debug!(master = %node.describe(), error = %e, "acquire failed on a master");
            Vote::Silent
        }
        Err(_) => {
            tracing::debug!(master = %node.describe(), timeout = ?ask.timeout, "acquire timed out on a master: no answer within the per-node timeout");
            Vote::Silent
        }
    };
    (i, vote)
}

/// A round's votes, and the release of its partial acquisition in the
/// background if the round's future is dropped before it decided.
pub(super) struct Unwind<'a, V: Future<Output = (usize, Vote)> + Send + 'static> {
    pub(super) nodes: &'a [Arc<RedisBackend>],
    pub(super) lease: &'a Lease,
    pub(super) timeout: Duration,
    /// The votes not counted yet.
    pub(super) votes: FuturesUnordered<V>,
    pub(super) armed: bool,
}

impl<V: Future<Output = (usize, Vote)> + Send + 'static> Drop for Unwind<'_, V> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let lease = self.lease.clone();
        let nodes = self.nodes.to_vec();
        let timeout = self.timeout;
        let pending = std::mem::take(&mut self.votes);
        // On dlock's background runtime: the round was likely dropped by a
        // runtime that is shutting down. In the round's lanes, on each
        // master's connection. The acquires still on their way are waited
        // for first (each up to the per-node timeout): one not yet on its
        // connection (a batch being sent by another thread) could otherwise
        // reach its master behind the delete. If the task cannot run at
        // all, the keys expire with the ttl.
        crate::backends::redis::spawn_following(async move {
            pending.for_each(|_| async {}).await;
            release_all(&nodes, &lease, timeout).await;
        });
    }
}

/// Deletes still in flight when `RedlockBackend::release_on`'s caller stops
/// waiting for them, or is dropped: finished by a task of their own (on
/// the lane's runtime, or on dlock's; see `backends/redis/transport/lanes.rs`), so
/// that each one
/// is sent and answered even if the caller goes on (a user's timeout, a
/// `SegmentedLock` dropping the waits that lost: an undo cut short would
/// leave our token on a minority of masters until its ttl), and nothing
/// depends on the caller's runtime being driven afterwards. None left: no
/// task at all.
struct Leftovers<F: Future + Send + 'static>(FuturesUnordered<F>);

impl<F: Future + Send + 'static> Drop for Leftovers<F> {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut deletes = std::mem::take(&mut self.0);
        crate::backends::redis::spawn_in_lane(async move {
            // The caller went on; each delete is done anyway.
            while deletes.next().await.is_some() {}
        });
    }
}
