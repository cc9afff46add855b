//! One pub/sub connection per backend, shared by every waiting key.
//!
//! A waiter subscribes to its key's release channel (and, where the server
//! sends keyspace notifications, to the key's keyspace channel: see
//! `recheck.rs`) before it tries the lock, so a release between its failed
//! try and its wait is not missed: each channel has a generation counter (a
//! `watch`), bumped by every message that may mean a release, and a waiter
//! waits for a generation to move past the one it saw before its try. A
//! channel is subscribed on the server for its first waiter and unsubscribed
//! [`LINGER`] after its last (unless a waiter came back meanwhile). When the
//! connection breaks, the task reconnects, subscribes again and wakes every
//! waiter once, because releases during the outage were not heard.
//!
//! A server whose ACL refuses the keyspace channels (a user limited to
//! `&dlock:*`, say) must not cost the release channels, nor the connection:
//! after such a refusal the release channels are subscribed alone, and
//! keyspace channels are not asked for again on this backend; its waiters
//! re-check instead. A server that refuses dlock's release channels too (a
//! user allowed no channel at all) must not make the task reconnect in a
//! loop: the refusal is logged once, nothing is subscribed again, and
//! waiters wake by their timers and re-checks alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

mod holding;
mod task;
pub(crate) mod turn;
pub(crate) mod waiting;

use crate::backend::LeaderChange;
use crate::backends::announcements::{self, Inbox, Inboxes};
use crate::backends::redis::waiting::recheck::is_keyspace;
use turn::Turn;

enum Command {
    Subscribe(Vec<String>, oneshot::Sender<()>),
    Unsubscribe(Vec<String>),
    /// Held keys' channels: subscribed, nobody waits for the answer.
    Hold(Vec<String>),
    /// Channels no longer held: unsubscribed unless a waiter listens.
    Unhold(Vec<String>),
}

#[derive(Debug, Default)]
struct Channels {
    /// Channel name → its waiters and generation. A channel without
    /// waiters stays subscribed for [`LINGER`] (see [`Entry::idle_since`]).
    by_name: HashMap<String, Entry>,
    /// Queued waiters' tickets → their wake-up (see `waiter_queue.rs`): a
    /// turn message wakes its ticket's waiter alone, not the channel.
    tickets: HashMap<String, Arc<Turn>>,
    /// Channel name → the inboxes of election observers (see
    /// `backends::announcements`): each message on it is put in each.
    inboxes: HashMap<String, Inboxes>,
    /// `by_name`'s length, readable without the lock: the uncontended
    /// acquire asks [`Subscriber::is_subscribed`] on every wait, and with
    /// nothing subscribed it must not take a lock every task shares.
    subscribed: Arc<AtomicUsize>,
    /// The held keys' channels and the loss alarm (see `holding.rs`).
    holdings: holding::Holdings,
}

fn lock(m: &Mutex<Channels>) -> MutexGuard<'_, Channels> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One subscribed channel.
#[derive(Debug)]
struct Entry {
    /// Waiters subscribed to it now.
    waiters: usize,
    /// Bumped by every message that may mean a release.
    generation: watch::Sender<u64>,
    /// Since when it has had no waiter: it stays subscribed for [`LINGER`]
    /// after its last waiter, so a key that is waited for again and again
    /// (a hot key's processes taking turns) costs no `SUBSCRIBE` and
    /// `UNSUBSCRIBE` per wait, and its waiter may queue at its first try
    /// (see [`Subscriber::is_subscribed`]).
    idle_since: Option<Instant>,
}

impl Entry {
    fn new() -> Self {
        Entry {
            waiters: 0,
            generation: watch::channel(0).0,
            idle_since: None,
        }
    }
}

/// How long a channel stays subscribed after its last waiter.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

impl Channels {
    /// Drops `name` if it has been idle for [`LINGER`]: whether it did
    /// (and is to be unsubscribed on the server).
    fn forget_if_idle(&mut self, name: &str) -> bool {
        let idle = self
            .by_name
            .get(name)
            .and_then(|entry| entry.idle_since)
            .is_some_and(|since| since.elapsed() >= LINGER);
        if idle {
            self.by_name.remove(name);
            self.subscribed.store(self.by_name.len(), Ordering::Relaxed);
        }
        // A holder listens to it still: it stays subscribed on the server.
        idle && !self.holdings.by_channel.contains_key(name)
    }

    fn bump(&self, name: &str) {
        if let Some(entry) = self.by_name.get(name) {
            entry.generation.send_modify(|g| *g += 1);
        }
    }

    /// A turn message (`turn:<ticket>`): wakes that ticket's waiter if it
    /// waits here (a permit is stored if it is between two waits).
    fn give_turn(&self, ticket: &[u8]) {
        let Ok(ticket) = std::str::from_utf8(ticket) else {
            return;
        };
        if let Some(turn) = self.tickets.get(ticket) {
            turn.give();
        }
    }

    fn bump_all(&mut self) {
        for entry in self.by_name.values() {
            entry.generation.send_modify(|g| *g += 1);
        }
        // Announcements during the outage were not heard.
        self.inboxes
            .retain(|_, inboxes| inboxes.deliver(&LeaderChange::Unknown));
    }

    /// Puts the announcement `payload` into the inboxes of `name`'s
    /// observers, forgetting those that are gone.
    fn deliver(&mut self, name: &str, payload: &[u8]) {
        let Some(inboxes) = self.inboxes.get_mut(name) else {
            return;
        };
        if !inboxes.deliver(&announcements::parse(payload)) {
            self.inboxes.remove(name);
        }
    }
}

/// Where the subscriber connects: one server, or the master a Sentinel
/// deployment names at each (re)connect, so it follows a failover.
#[derive(Clone)]
pub(crate) enum Source {
    Fixed(Box<redis::Client>),
    Master(crate::backends::redis::topology::sentinel::Sentinel),
}

impl Source {
    fn client(&self) -> redis::Client {
        match self {
            Source::Fixed(client) => (**client).clone(),
            Source::Master(sentinel) => sentinel.master_client(),
        }
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Fixed(_) => "Fixed",
            Source::Master(_) => "Master",
        })
    }
}

/// The shared subscriber of one backend.
#[derive(Debug)]
pub(crate) struct Subscriber {
    source: Source,
    /// This backend's own channel for turns (see `turns.rs`): a queued
    /// release wakes the head's process on it, and no other.
    turns: String,
    channels: Arc<Mutex<Channels>>,
    /// How many channels are subscribed (see `Channels::subscribed`).
    subscribed: Arc<AtomicUsize>,
    /// What the server's ACL refused; never asked for again.
    refused: Arc<Refused>,
    /// Started on first use, on dlock's background runtime (so waiters on
    /// every runtime are woken, whichever runtime came first and whether
    /// it is still driven); the task ends when this sender (and so the
    /// backend) is dropped.
    commands: Mutex<Option<mpsc::UnboundedSender<Command>>>,
}

/// The channels the server refused (an ACL error reply, `NOPERM`).
#[derive(Debug, Default)]
struct Refused {
    /// A keyspace channel was refused: none is asked for again.
    keyspace: AtomicBool,
    /// A release channel was refused, alone: nothing is subscribed again.
    release: AtomicBool,
}

/// Wakes a queued waiter of this backend from within the process (see
/// `turns.rs`: the heartbeat found its ticket out of line).
#[derive(Clone)]
pub(crate) struct Bell {
    channels: Arc<Mutex<Channels>>,
}

impl Bell {
    /// Wakes the waiter of `ticket`, as its turn message would.
    pub(crate) fn ring(&self, ticket: &str) {
        lock(&self.channels).give_turn(ticket.as_bytes());
    }
}

/// A waiter's subscription to one key's channels; unsubscribes its share on
/// drop.
pub(crate) struct Subscription {
    /// Channel name and its generation, per channel.
    generations: Vec<(String, watch::Receiver<u64>)>,
    /// A queued waiter's ticket and its wake-up.
    ticket: Option<(String, Arc<Turn>)>,
    channels: Arc<Mutex<Channels>>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Subscriber {
    /// The subscriber of a backend whose keys start with `prefix`.
    pub(crate) fn new(source: Source, prefix: &str) -> Self {
        let channels = Channels::default();
        Subscriber {
            source,
            turns: turn::turn_channel(prefix),
            subscribed: channels.subscribed.clone(),
            channels: Arc::new(Mutex::new(channels)),
            refused: Arc::default(),
            commands: Mutex::new(None),
        }
    }

    fn commands(&self) -> mpsc::UnboundedSender<Command> {
        let mut commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = commands.as_ref().filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        crate::lease::background::spawn_daemon(task::run(
            self.source.clone(),
            self.channels.clone(),
            self.refused.clone(),
            rx,
        ));
        *commands = Some(tx.clone());
        tx
    }

    /// Whether `channel` is subscribed (waited on, or lingering after its
    /// last waiter): a waiter that subscribes to it now needs no round
    /// trip, so it may queue at its first try without missing its turn.
    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.subscribed.load(Ordering::Relaxed) > 0
            && !self.release_refused()
            && lock(&self.channels).by_name.contains_key(channel)
    }

    /// What wakes this backend's queued waiters from within the process.
    pub(crate) fn bell(&self) -> Bell {
        Bell {
            channels: self.channels.clone(),
        }
    }

    /// This backend's channel for turns, on which queued releases wake its
    /// waiters one by one (see `turns.rs`).
    pub(crate) fn turn_channel(&self) -> &str {
        &self.turns
    }

    /// Whether the server refused a keyspace channel: none is asked for again.
    pub(crate) fn keyspace_refused(&self) -> bool {
        self.refused.keyspace.load(Ordering::Relaxed)
    }

    /// Whether the server refused dlock's release channels: waiters wake by
    /// their timers and re-checks alone.
    pub(crate) fn release_refused(&self) -> bool {
        self.refused.release.load(Ordering::Relaxed)
    }

    /// The backend's loss alarm (`LockBackend::loss_alarm`), rung when a
    /// held key's keyspace channel says it was lost (see `holding.rs`).
    pub(crate) fn loss_alarm(&self) -> watch::Receiver<u64> {
        lock(&self.channels).holdings.alarm()
    }

    /// Rings the loss alarm for a reason of the backend's own (a server
    /// that may now evict, see `eviction.rs`): the watchdog renews every
    /// lease at once.
    pub(crate) fn ring_loss_alarm(&self) {
        lock(&self.channels).holdings.ring();
    }

    /// Whether a `set` on a held key rings the alarm: not where renewals
    /// are `SET … IFEQ` (see `holding.rs`).
    pub(crate) fn set_alarms(&self, alarms: bool) {
        lock(&self.channels).holdings.set_alarms = alarms;
    }

    /// A lock on the key of keyspace channel `channel` was granted: its
    /// events are listened to (see `holding.rs`). Costs the caller no round
    /// trip.
    pub(crate) fn hold(&self, channel: String, token: &str) {
        if self.keyspace_refused() || self.release_refused() {
            return;
        }
        let new = {
            let mut channels = lock(&self.channels);
            let subscribed = channels.by_name.contains_key(&channel);
            channels.holdings.hold(&channel, token, subscribed) && !subscribed
        };
        if new {
            let _ = self.commands().send(Command::Hold(vec![channel]));
        }
    }

    /// The lock with owner token `token` on the key of `channel` ended
    /// here (released, lost).
    pub(crate) fn unhold(&self, channel: &str, token: &str) {
        let gone = {
            let mut channels = lock(&self.channels);
            channels.holdings.unhold(channel, token) && !channels.by_name.contains_key(channel)
        };
        if gone {
            let _ = self
                .commands()
                .send(Command::Unhold(vec![channel.to_owned()]));
        }
    }

    /// An inbox for the announcements on `channel` (an election's): each
    /// message on it from now on is kept there, parsed, for as long as the
    /// inbox lives. Made before the channel is subscribed, so nothing the
    /// subscription hears is missed.
    pub(crate) fn inbox(&self, channel: &str) -> Arc<Inbox> {
        lock(&self.channels)
            .inboxes
            .entry(channel.to_owned())
            .or_default()
            .add()
    }

    /// Subscribes to `names` (one key's channels), waiting (bounded) for the
    /// server's confirmation of the new subscriptions. If the confirmation
    /// does not come, the waiter still works: it falls back to its timers.
    /// Keyspace channels are left out once the server refused one.
    pub(crate) async fn subscribe(
        &self,
        names: &[String],
        deadline: Option<Instant>,
    ) -> Subscription {
        let commands = self.commands();
        let skip_keyspace = self.keyspace_refused();
        let mut generations = Vec::with_capacity(names.len());
        let mut first = Vec::new();
        {
            let mut channels = lock(&self.channels);
            for name in names.iter().filter(|n| !(skip_keyspace && is_keyspace(n))) {
                // A lingering channel is still subscribed on the server.
                if !channels.by_name.contains_key(name) {
                    first.push(name.clone());
                }
                let entry = channels
                    .by_name
                    .entry(name.clone())
                    .or_insert_with(Entry::new);
                entry.waiters += 1;
                entry.idle_since = None;
                generations.push((name.clone(), entry.generation.subscribe()));
                let count = channels.by_name.len();
                channels.subscribed.store(count, Ordering::Relaxed);
            }
        }
        let subscription = Subscription {
            generations,
            ticket: None,
            channels: self.channels.clone(),
            commands: commands.clone(),
        };
        if !first.is_empty() {
            let (ack, acked) = oneshot::channel();
            if commands.send(Command::Subscribe(first, ack)).is_ok() {
                let give_up = Instant::now() + Duration::from_secs(2);
                let give_up = deadline.map_or(give_up, |d| d.min(give_up));
                let _ = tokio::time::timeout_at(give_up.into(), acked).await;
            }
        }
        subscription
    }
}

impl Subscription {
    /// Registers `ticket`: a turn message for it now wakes this waiter (see
    /// [`turned`](Self::turned)). Before the waiter's first queued try, so
    /// a turn given right after it is not missed.
    pub(crate) fn queue_as(&mut self, ticket: &str) {
        let turn = Arc::new(Turn::default());
        lock(&self.channels)
            .tickets
            .insert(ticket.to_owned(), turn.clone());
        self.ticket = Some((ticket.to_owned(), turn));
    }

    /// What resolves when this waiter's ticket is given its turn: see
    /// [`turned`].
    pub(crate) fn turn(&self) -> Option<Arc<Turn>> {
        self.ticket.as_ref().map(|(_, turn)| turn.clone())
    }

    /// Remembers the current generations: a later `changed` waits for a newer one.
    pub(crate) fn mark_seen(&mut self) {
        for (_, generation) in &mut self.generations {
            generation.borrow_and_update();
        }
    }

    /// Resolves when a release was announced on any of the channels (or the
    /// connection came back) since the last `mark_seen`.
    pub(crate) async fn changed(&mut self) {
        let changes = self.generations.iter_mut().map(|(_, generation)| {
            Box::pin(async move {
                if generation.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            })
        });
        let changes: Vec<_> = changes.collect();
        if changes.is_empty() {
            return std::future::pending().await;
        }
        futures_util::future::select_all(changes).await;
    }
}

/// Resolves when `turn` (a [`Subscription::turn`]) is given; never
/// without one.
pub(crate) async fn turned(turn: Option<&Turn>) {
    match turn {
        Some(turn) => turn.given().await,
        None => std::future::pending().await,
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = lock(&self.channels);
        if let Some((ticket, _)) = &self.ticket {
            channels.tickets.remove(ticket);
        }
        let mut idle = Vec::new();
        for (name, _) in &self.generations {
            if let Some(entry) = channels.by_name.get_mut(name) {
                entry.waiters -= 1;
                if entry.waiters == 0 {
                    entry.idle_since = Some(Instant::now());
                    idle.push(name.clone());
                }
            }
        }
        if !idle.is_empty() {
            // Unsubscribed after the linger, unless a waiter came back.
            let commands = self.commands.clone();
            crate::lease::background::spawn_daemon(async move {
                tokio::time::sleep(LINGER).await;
                let _ = commands.send(Command::Unsubscribe(idle));
            });
        }
    }
}
