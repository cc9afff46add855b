//! Java Redisson's unlock messages on a Redis 7+ Cluster: Redisson publishes
//! them there with `SPUBLISH` (its `shardedSubscriptionMode`, `AUTO` by
//! default), which a plain `SUBSCRIBE` never hears. So on such a Cluster a
//! waiter also listens with `SSUBSCRIBE`, on a cluster connection of its own
//! (RESP3, pushes into [`listen`]) that routes each channel to the master
//! of its slot and subscribes again after a reconnect or a slot move.
//!
//! As the plain subscriber's, each channel has a generation, bumped by each
//! message on it (and every channel's by a lost connection: messages may
//! have been missed); a waiter subscribes before its try and waits for the
//! generation to move past the one it saw. A channel is unsubscribed when
//! its last waiter leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch};

use crate::backends::redis::config::{tls_cluster, RedisOptions};
use crate::LockError;

type Channels = Arc<Mutex<HashMap<String, Entry>>>;

struct Entry {
    waiters: usize,
    generation: watch::Sender<u64>,
}

/// The sharded listener of one backend.
pub(super) struct Sharded {
    conn: ClusterConnection,
    channels: Channels,
}

/// One waiter's sharded subscription; its share is given back on drop.
pub(super) struct ShardedWait {
    channel: String,
    generation: watch::Receiver<u64>,
    channels: Channels,
    conn: ClusterConnection,
}

fn lock(channels: &Channels) -> MutexGuard<'_, HashMap<String, Entry>> {
    channels.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sharded {
    /// A RESP3 cluster connection to the nodes of `options`, made on dlock's
    /// background runtime (where its driver stays), and its listening task.
    pub(super) async fn connect(options: &RedisOptions) -> Result<Self, LockError> {
        let fail = |e: redis::RedisError| LockError::backend(options.shown.clone(), e);
        let (pushes, received) = mpsc::unbounded_channel::<PushInfo>();
        let mut builder = redis::cluster::ClusterClientBuilder::new(options.nodes.clone())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(options.response_timeout)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes);
        if options.tls {
            builder = tls_cluster(builder, options)?;
        }
        let client = builder.build().map_err(fail)?;
        let connected =
            crate::lease::background::run(async move { client.get_async_connection().await });
        let conn = connected.await.map_err(fail)?;
        let channels = Channels::default();
        crate::lease::background::spawn_daemon(listen(received, channels.clone()));
        Ok(Sharded { conn, channels })
    }

    /// Listens to `channel` (the server's confirmation awaited, at most 2 s:
    /// without it the waiter still has its timers).
    pub(super) async fn subscribe(&self, channel: &str) -> ShardedWait {
        let (first, generation) = {
            let mut channels = lock(&self.channels);
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Entry {
                waiters: 0,
                generation: watch::Sender::new(0),
            });
            entry.waiters += 1;
            (entry.waiters == 1, entry.generation.subscribe())
        };
        if first {
            let mut conn = self.conn.clone();
            let subscribed = tokio::time::timeout(Duration::from_secs(2), conn.ssubscribe(channel));
            match subscribed.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%channel, error = %e, "SSUBSCRIBE failed; the waiter re-checks")
                }
                Err(_) => {
                    tracing::debug!(%channel, "SSUBSCRIBE unanswered in 2 s; the waiter re-checks")
                }
            }
        }
        ShardedWait {
            channel: channel.to_owned(),
            generation,
            channels: self.channels.clone(),
            conn: self.conn.clone(),
        }
    }
}

impl ShardedWait {
    /// Remembers the current generation: a later `changed` waits for a newer one.
    pub(super) fn mark_seen(&mut self) {
        self.generation.borrow_and_update();
    }

    /// Resolves when a message came on the channel (or the connection was
    /// lost) since the last `mark_seen`.
    pub(super) async fn changed(&mut self) {
        if self.generation.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for ShardedWait {
    fn drop(&mut self) {
        let last = {
            let mut channels = lock(&self.channels);
            let entry = channels.get_mut(&self.channel);
            let last = entry.is_some_and(|entry| {
                entry.waiters -= 1;
                entry.waiters == 0
            });
            if last {
                channels.remove(&self.channel);
            }
            last
        };
        if last {
            let (mut conn, channel, channels) = (
                self.conn.clone(),
                self.channel.clone(),
                self.channels.clone(),
            );
            crate::lease::background::spawn(async move {
                // A waiter that came back meanwhile keeps the subscription.
                if !lock(&channels).contains_key(&channel) {
                    let _ = conn.sunsubscribe(&channel).await;
                }
            });
        }
    }
}

/// Turns the connection's pushes into generation bumps.
async fn listen(mut received: mpsc::UnboundedReceiver<PushInfo>, channels: Channels) {
    while let Some(push) = received.recv().await {
        match push.kind {
            PushKind::SMessage => {
                let Some(Value::BulkString(name)) = push.data.first() else {
                    continue;
                };
                let Ok(name) = std::str::from_utf8(name) else {
                    continue;
                };
                if let Some(entry) = lock(&channels).get(name) {
                    entry.generation.send_modify(|g| *g += 1);
                }
            }
            // Messages in between may have been missed: every waiter tries again.
            PushKind::Disconnection => {
                for entry in lock(&channels).values() {
                    entry.generation.send_modify(|g| *g += 1);
                }
            }
            _ => {}
        }
    }
}
