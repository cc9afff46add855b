//! Batching of acquire and release scripts under load: the queue
//! (`Batcher`), and in `ops.rs` the two batched requests.
//!
//! Why: a Lua script has a fixed cost on the server (a few µs of Redis's one
//! thread, several times a plain `SET`) that dominates the small acquire and
//! release scripts. When many tasks lock distinct keys at once, that fixed
//! cost is what limits throughput, and one script call that acquires 16 keys
//! costs the server little more than one that acquires 1.
//!
//! How: a request goes out at once, alone, while fewer than
//! [`MAX_IN_FLIGHT`] requests of its kind are on the connection, so an idle
//! or lightly loaded backend adds no latency and sends the same scripts as
//! without batching. Past that, requests queue; whenever a request in flight
//! finishes, the oldest queued (up to [`MAX_BATCH`]) go out together in one
//! script call that runs the same steps for each key, in order, atomically.
//! The busier the server, the larger the batches, up to that size: the
//! batching regulates itself.
//!
//! Cancellation: a queued request whose caller went away is dropped before
//! the batch is sent. One whose caller went away while its batch was in
//! flight has its answer handed to [`BatchKind::unclaimed`] (an acquisition
//! nobody will use is released there, not left to its ttl).
//!
//! Single servers only: a batch touches many keys, which a Redis Cluster
//! allows only within one hash slot.

mod hand_over;
pub(in crate::backends::redis) mod ops;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::{RedisResult, Script};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use self::ops::{Acquires, Releases};
use crate::backends::redis::protocol::scripts;
use crate::backends::redis::topology::server::Server;
use crate::backends::redis::transport::lanes::PerRuntime;

/// How many requests of one kind go out unbatched on one lane before further
/// ones queue. Small enough that batches form as soon as requests pile up,
/// large enough that a few concurrent callers never wait for each other.
/// Measured with `profile` (64 tasks on distinct keys, one lane, quiet
/// machine, alternating binaries): 16 ran 1.03× the cycles per second of 4
/// (within the noise) for 1.11× the server's CPU per cycle (8.2 against
/// 7.3 µs), 32 fewer cycles and more server CPU still: 4 it stays.
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// The most requests one batch carries on a single server; the rest wait
/// for the next slot. A batch of everything queued made the server run one
/// long script while the client waited, then the client read every answer
/// while the server waited: under 64 tasks on distinct keys, cycles ran in
/// lockstep and the two vCPU were 1.4 busy. Batches of a few keep both
/// sides working on different batches at once. Measured with `profile` (64
/// tasks, alternating with rslock in one process, four rounds each):
/// everything 0.65× rslock's cycles per second, at most 16: 0.70×, 8: 0.72×,
/// 6: 0.73× (within the noise of 8), for the same server CPU per cycle
/// (7.6 µs). 8 it is: fewer script calls than 6 for the same cycles.
///
/// A Redlock master takes much larger batches ([`MAX_MASTER_BATCH`]): there
/// every cycle costs each of the masters a script, the servers' time is what
/// limits (b), and the fewest script calls win. Measured with `bench` on 5
/// masters, four runs each, alternating: 23–27 k cycles/s capped at 8
/// against 27–35 k uncapped (3 masters: the same within the noise).
pub(crate) const MAX_BATCH: usize = 8;

/// The most requests one batch carries on a Redlock master (see
/// [`MAX_BATCH`]): far above what 64 tasks queue (the uncapped batches
/// measured there), and a bound on one script's size (about 150 bytes of
/// names and token per request) however many callers wait.
#[cfg(feature = "redlock")]
pub(crate) const MAX_MASTER_BATCH: usize = 128;

/// One kind of batchable request: its many-keys script, how to read its
/// answer, and what to do with an answer nobody claims.
pub(crate) trait BatchKind: Send + Sync + 'static {
    /// One request.
    type Op: Send + 'static;
    /// One request's answer.
    type Out: Send + 'static;

    /// The many-keys script.
    fn script() -> &'static Script;

    /// One call of [`script`](Self::script) that runs every op, in order.
    fn call(ops: &[Self::Op]) -> redis::Cmd;

    /// Splits the script's answer (a flat list of integers) into one answer
    /// per op, or `None` if it has the wrong shape.
    fn split(ops: usize, answer: Vec<i64>) -> Option<Vec<Self::Out>>;

    /// Called with the answer of an op whose caller went away while its
    /// batch was in flight.
    fn unclaimed(
        conn: Server,
        op: Self::Op,
        out: Self::Out,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A backend's batchers: a pair per lane (see `lanes.rs`). A batch goes
/// out on one connection, and what follows each of its requests (a `WAIT`
/// covering a grant, the release of a grant whose caller went away) goes on
/// that caller's lane: so a batch carries the requests of one lane only.
pub(crate) struct LaneBatchers {
    conn: Server,
    background: Arc<Batchers>,
    /// `None` when the connection has no lanes (Sentinel's masters).
    local: Option<PerRuntime<Batchers>>,
    /// Batches sent, on every lane.
    batches: Arc<AtomicU64>,
    /// The most requests a batch carries ([`MAX_BATCH`] or [`MAX_MASTER_BATCH`]).
    max_batch: usize,
}

/// The acquire and release batchers of one lane.
pub(crate) struct Batchers {
    pub(crate) acquire: Batcher<Acquires>,
    pub(crate) release: Batcher<Releases>,
}

impl LaneBatchers {
    /// Batchers for `conn`, with a pair per lane if `conn` has lanes, whose
    /// batches carry at most `max_batch` requests.
    pub(crate) fn new(conn: &Server, max_batch: usize) -> Self {
        let batches = Arc::new(AtomicU64::new(0));
        LaneBatchers {
            background: Arc::new(Batchers::new(conn, None, &batches, max_batch)),
            local: matches!(conn, Server::One(_)).then(PerRuntime::default),
            conn: conn.clone(),
            batches,
            max_batch,
        }
    }

    /// The batchers of the lane here.
    pub(crate) fn here(&self) -> Arc<Batchers> {
        let local = self.local.as_ref().and_then(|local| {
            local.here(|runtime| {
                Batchers::new(
                    &self.conn,
                    Some(runtime.clone()),
                    &self.batches,
                    self.max_batch,
                )
            })
        });
        local.unwrap_or_else(|| self.background.clone())
    }

    /// How many batched script calls were sent, on every lane.
    pub(crate) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
}

impl Batchers {
    fn new(
        conn: &Server,
        runtime: Option<Handle>,
        batches: &Arc<AtomicU64>,
        max_batch: usize,
    ) -> Self {
        Batchers {
            acquire: Batcher::new(conn.clone(), runtime.clone(), batches.clone(), max_batch),
            release: Batcher::new(conn.clone(), runtime, batches.clone(), max_batch),
        }
    }
}

/// The queue of one kind of request on one connection.
pub(crate) struct Batcher<K: BatchKind> {
    shared: Arc<Shared<K>>,
}

struct Shared<K: BatchKind> {
    conn: Server,
    /// The runtime of the lane, which sends the batches; `None`: dlock's.
    runtime: Option<Handle>,
    state: Mutex<State<K>>,
    batches: Arc<AtomicU64>,
    max_batch: usize,
}

struct State<K: BatchKind> {
    queue: Vec<Waiting<K>>,
    in_flight: usize,
}

struct Waiting<K: BatchKind> {
    op: K::Op,
    reply: oneshot::Sender<Result<K::Out, BatchFailed>>,
}

/// What a caller does with its request.
pub(crate) enum Turn<K: BatchKind> {
    /// Send it now, alone; the slot is taken until this is dropped.
    Alone { _slot: InFlight<K> },
    /// It is queued for the next batch; the answer (or the batch's error)
    /// arrives here.
    Queued(oneshot::Receiver<Result<K::Out, BatchFailed>>),
}

/// One request slot on the connection, given back on drop (which may send
/// the queued requests as a batch).
pub(crate) struct InFlight<K: BatchKind> {
    shared: Arc<Shared<K>>,
}

impl<K: BatchKind> Batcher<K> {
    fn new(
        conn: Server,
        runtime: Option<Handle>,
        batches: Arc<AtomicU64>,
        max_batch: usize,
    ) -> Self {
        Batcher {
            shared: Arc::new(Shared {
                conn,
                runtime,
                state: Mutex::new(State {
                    queue: Vec::new(),
                    in_flight: 0,
                }),
                batches,
                max_batch,
            }),
        }
    }

    /// Takes a slot if one is free, else queues the op that `op` builds
    /// (built only then, so the unbatched path allocates nothing extra).
    pub(crate) fn enter(&self, op: impl FnOnce() -> K::Op) -> Turn<K> {
        let mut state = self.shared.lock();
        if state.in_flight < MAX_IN_FLIGHT {
            state.in_flight += 1;
            return Turn::Alone {
                _slot: InFlight {
                    shared: self.shared.clone(),
                },
            };
        }
        // While the connection hangs (a dead server), callers give up and
        // their entries stay until the next batch: forget them now and then,
        // so the queue stays as long as the callers still waiting.
        if state.queue.len() >= 256 && state.queue.len().is_power_of_two() {
            state.queue.retain(|w| !w.reply.is_closed());
        }
        let (reply, answer) = oneshot::channel();
        state.queue.push(Waiting { op: op(), reply });
        Turn::Queued(answer)
    }
}

impl<K: BatchKind> Shared<K> {
    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // Every update is a push, a take or a counter step: a poisoned
        // mutex still guards consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the oldest queued requests, up to `max_batch` whose callers
    /// still wait (with those that went away among them, which `spawn`
    /// leaves out), as one batch, if a slot is free, and counts the batch in
    /// flight. The caller sends it with [`spawn`](Self::spawn) after letting
    /// go of the state: dropping a slot under the lock would take the lock
    /// again.
    fn take_batch(&self, state: &mut State<K>) -> Option<Vec<Waiting<K>>> {
        if state.in_flight >= MAX_IN_FLIGHT || state.queue.is_empty() {
            return None;
        }
        state.in_flight += 1;
        let mut waiting = 0;
        let end = state
            .queue
            .iter()
            .position(|w| {
                waiting += usize::from(!w.reply.is_closed());
                waiting > self.max_batch
            })
            .unwrap_or(state.queue.len());
        if end == state.queue.len() {
            return Some(std::mem::take(&mut state.queue));
        }
        Some(state.queue.drain(..end).collect())
    }

    /// Sends `batch` from a task of its own, in `slot` (the one
    /// `take_batch` took).
    fn spawn(slot: InFlight<K>, batch: Vec<Waiting<K>>) {
        // Callers that went away need no answer: their ops are not sent.
        let batch: Vec<Waiting<K>> = batch.into_iter().filter(|w| !w.reply.is_closed()).collect();
        if batch.is_empty() {
            return;
        }
        // On the lane's runtime (a multi-thread one, which runs it whether
        // or not the caller that gave the slot back is polled), where the
        // lane's connection is used in place; for the background lane on
        // dlock's runtime, not the caller's: the batch carries other
        // callers' requests, which must not wait for that runtime to be
        // driven. Should it not run at all, dropping the batch wakes every
        // caller with an error instead of leaving them waiting.
        let runtime = slot.shared.runtime.clone();
        let task = async move {
            slot.shared.send(batch).await;
            drop(slot);
        };
        // A runtime that is shutting down drops the task inside `spawn`,
        // which gives the slot back, which sends the next batch: see
        // `hand_over.rs` for why that does not nest.
        match runtime {
            Some(runtime) => {
                drop(runtime.spawn(crate::lease::background::in_flight::tracked(task)))
            }
            None => crate::lease::background::spawn(task),
        }
    }

    async fn send(&self, batch: Vec<Waiting<K>>) {
        // Filtered again here, in the same poll that puts the script on the
        // connection: a caller that went away since `spawn` must not be
        // sent either. Redlock relies on it: a round that gave up deletes its
        // token on each master with a request sent after this point, so an
        // acquisition still to be sent must not be (it would land after the
        // delete), and one already sent is ahead of the delete.
        let batch: Vec<Waiting<K>> = batch.into_iter().filter(|w| !w.reply.is_closed()).collect();
        if batch.is_empty() {
            return;
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        let (ops, replies): (Vec<K::Op>, Vec<_>) =
            batch.into_iter().map(|w| (w.op, w.reply)).unzip();
        let answer: RedisResult<Vec<i64>> =
            scripts::run(&mut self.conn.clone(), K::script(), &K::call(&ops)).await;
        let outs = answer.map_err(BatchFailed::from).and_then(|flat| {
            K::split(ops.len(), flat).ok_or_else(|| BatchFailed {
                message: "malformed batch answer".to_owned(),
                transient: false,
            })
        });
        match outs {
            Ok(outs) => {
                for ((op, reply), out) in ops.into_iter().zip(replies).zip(outs) {
                    if let Err(Ok(out)) = reply.send(Ok(out)) {
                        K::unclaimed(self.conn.clone(), op, out).await;
                    }
                }
            }
            Err(message) => {
                for reply in replies {
                    let _ = reply.send(Err(message.clone()));
                }
            }
        }
    }
}

/// Why a batch got no answers: the request's error, as text (each caller
/// of the batch gets a copy), and whether it may pass (it timed out, its
/// connection failed: see `backend/transient.rs`).
#[derive(Clone, Debug)]
pub(crate) struct BatchFailed {
    pub(crate) message: String,
    pub(crate) transient: bool,
}

impl From<redis::RedisError> for BatchFailed {
    fn from(e: redis::RedisError) -> Self {
        let transient = crate::backend::transient::is_transient_error(&e);
        BatchFailed {
            message: e.to_string(),
            transient,
        }
    }
}

impl<K: BatchKind> Drop for InFlight<K> {
    fn drop(&mut self) {
        let batch = {
            let mut state = self.shared.lock();
            state.in_flight -= 1;
            self.shared.take_batch(&mut state)
        };
        if let Some(batch) = batch {
            let slot = InFlight {
                shared: self.shared.clone(),
            };
            // Not sent here: this drop may be inside another batch's send
            // (see `hand_over.rs`).
            hand_over::hand_over(Box::new(move || Shared::spawn(slot, batch)));
        }
    }
}
