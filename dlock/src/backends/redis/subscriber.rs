//! One pub/sub connection per backend, shared by every waiting key.
//!
//! A waiter subscribes to its key's release channel before it tries the lock,
//! so a release between its failed try and its wait is not missed: each
//! channel has a generation counter (a `watch`), bumped by every message, and
//! a waiter waits for the generation to move past the one it saw before its
//! try. The channel is subscribed on the server for its first waiter and
//! unsubscribed after its last. When the connection breaks, the task
//! reconnects, subscribes again and wakes every waiter once, because releases
//! during the outage were not heard.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

enum Command {
    Subscribe(String, oneshot::Sender<()>),
    Unsubscribe(String),
}

#[derive(Debug, Default)]
struct Channels {
    /// Channel name → (number of waiters, generation).
    by_name: HashMap<String, (usize, watch::Sender<u64>)>,
}

fn lock(m: &Mutex<Channels>) -> MutexGuard<'_, Channels> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channels {
    fn bump(&self, name: &str) {
        if let Some((_, generation)) = self.by_name.get(name) {
            generation.send_modify(|g| *g += 1);
        }
    }

    fn bump_all(&self) {
        for (_, generation) in self.by_name.values() {
            generation.send_modify(|g| *g += 1);
        }
    }
}

/// The shared subscriber of one backend.
#[derive(Debug)]
pub(crate) struct Subscriber {
    client: redis::Client,
    channels: Arc<Mutex<Channels>>,
    /// Started on first use, on the runtime of the first waiter; the task
    /// ends when this sender (and so the backend) is dropped.
    commands: Mutex<Option<mpsc::UnboundedSender<Command>>>,
}

/// A waiter's subscription to one channel; unsubscribes its share on drop.
pub(crate) struct Subscription {
    name: String,
    generation: watch::Receiver<u64>,
    channels: Arc<Mutex<Channels>>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Subscriber {
    pub(crate) fn new(client: redis::Client) -> Self {
        Subscriber {
            client,
            channels: Arc::default(),
            commands: Mutex::new(None),
        }
    }

    fn commands(&self) -> mpsc::UnboundedSender<Command> {
        let mut commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = commands.as_ref().filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(self.client.clone(), self.channels.clone(), rx));
        *commands = Some(tx.clone());
        tx
    }

    /// Subscribes to `name`, waiting (bounded) for the server's confirmation
    /// of a new subscription. If the confirmation does not come, the waiter
    /// still works: it falls back to the holder's remaining ttl.
    pub(crate) async fn subscribe(&self, name: &str, deadline: Option<Instant>) -> Subscription {
        let commands = self.commands();
        let (generation, first) = {
            let mut channels = lock(&self.channels);
            let entry = channels
                .by_name
                .entry(name.to_owned())
                .or_insert_with(|| (0, watch::channel(0).0));
            entry.0 += 1;
            (entry.1.subscribe(), entry.0 == 1)
        };
        let subscription = Subscription {
            name: name.to_owned(),
            generation,
            channels: self.channels.clone(),
            commands: commands.clone(),
        };
        if first {
            let (ack, acked) = oneshot::channel();
            if commands
                .send(Command::Subscribe(name.to_owned(), ack))
                .is_ok()
            {
                let give_up = Instant::now() + Duration::from_secs(2);
                let give_up = deadline.map_or(give_up, |d| d.min(give_up));
                let _ = tokio::time::timeout_at(give_up.into(), acked).await;
            }
        }
        subscription
    }
}

impl Subscription {
    /// Remembers the current generation: a later `changed` waits for a newer one.
    pub(crate) fn mark_seen(&mut self) {
        self.generation.borrow_and_update();
    }

    /// Resolves when a release was announced (or the connection came back)
    /// since the last `mark_seen`.
    pub(crate) async fn changed(&mut self) {
        if self.generation.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = lock(&self.channels);
        if let Some(entry) = channels.by_name.get_mut(&self.name) {
            entry.0 -= 1;
            if entry.0 == 0 {
                channels.by_name.remove(&self.name);
                let _ = self.commands.send(Command::Unsubscribe(self.name.clone()));
            }
        }
    }
}

/// The subscriber task: (re)connects, keeps the server's subscriptions equal
/// to the waited-on channels, and turns messages into generation bumps.
async fn run(
    client: redis::Client,
    channels: Arc<Mutex<Channels>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let connected =
            tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub()).await;
        let (mut sink, mut stream) = match connected {
            Ok(Ok(pubsub)) => pubsub.split(),
            _ => {
                // Waiters fall back to their timers meanwhile. Commands that
                // arrive now are answered by the resubscription below.
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    command = commands.recv() => match command {
                        None => return,
                        Some(Command::Subscribe(_, ack)) => drop(ack),
                        Some(Command::Unsubscribe(_)) => {}
                    },
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let names: Vec<String> = lock(&channels).by_name.keys().cloned().collect();
        if !names.is_empty() && sink.subscribe(&names).await.is_err() {
            continue;
        }
        // Releases during the outage were not heard: let every waiter retry.
        lock(&channels).bump_all();
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => lock(&channels).bump(message.get_channel_name()),
                    None => break,
                },
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Subscribe(name, ack)) => {
                        if sink.subscribe(&name).await.is_err() {
                            break;
                        }
                        let _ = ack.send(());
                    }
                    Some(Command::Unsubscribe(name)) => {
                        // A waiter may have come back for the channel meanwhile.
                        let still_wanted = lock(&channels).by_name.contains_key(&name);
                        if !still_wanted && sink.unsubscribe(&name).await.is_err() {
                            break;
                        }
                    }
                },
            }
        }
    }
}
