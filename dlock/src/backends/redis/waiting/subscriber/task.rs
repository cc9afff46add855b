//! The subscriber's task: the one pub/sub connection, (re)connected with a
//! back-off, its subscriptions kept equal to the channels waited on, and
//! each message turned into a generation bump, a turn or an announcement.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::ErrorKind;
use tokio::sync::mpsc;

use super::{lock, Channels, Command, Refused, Source};
use crate::backends::redis::waiting::recheck::{frees_the_key, is_keyspace};

/// Subscribes to `names` in one `SUBSCRIBE`; `Err` when the connection
/// failed. A server that refuses the keyspace channels among them (an ACL
/// error reply, which refuses the whole command) sets `refused.keyspace`,
/// and the release channels are subscribed again alone: the waiters of the
/// keyspace channels still have their re-check. A server that refuses the
/// release channels alone sets `refused.release`: from then on nothing is
/// subscribed, and the answer is `Ok` (the connection is fine; breaking it
/// would only reconnect and be refused again, in a loop).
async fn subscribe_on(
    sink: &mut PubSubSink,
    names: &[String],
    refused: &Refused,
) -> Result<(), redis::RedisError> {
    if refused.release.load(Ordering::Relaxed) {
        return Ok(());
    }
    let skip_keyspace = refused.keyspace.load(Ordering::Relaxed);
    let mut names: Vec<&String> = names
        .iter()
        .filter(|n| !(skip_keyspace && is_keyspace(n)))
        .collect();
    loop {
        if names.is_empty() {
            return Ok(());
        }
        match sink.subscribe(&names).await {
            // An error reply (`NOPERM`): the server refused, the connection is fine.
            Err(e) if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
                if names.iter().any(|n| is_keyspace(n)) {
                    tracing::debug!(error = %e, "the server refused keyspace channels; waiters re-check instead");
                    refused.keyspace.store(true, Ordering::Relaxed);
                    names.retain(|n| !is_keyspace(n));
                    continue;
                }
                tracing::warn!(
                    error = %e,
                    "the server refused dlock's release channels (allow them with an ACL rule such as `&dlock:*`); waiters now wake at the holder's expiry or by re-checking"
                );
                refused.release.store(true, Ordering::Relaxed);
                return Ok(());
            }
            answer => return answer,
        }
    }
}

/// The subscriber task: (re)connects, keeps the server's subscriptions equal
/// to the waited-on channels, and turns messages into generation bumps.
pub(super) async fn run(
    source: Source,
    channels: Arc<Mutex<Channels>>,
    refused: Arc<Refused>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut reconnected = false;
    loop {
        let client = source.client();
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
                        // Held channels are in `holdings`: subscribed below.
                        Some(Command::Unsubscribe(_) | Command::Hold(_) | Command::Unhold(_)) => {}
                    },
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let names: Vec<String> = {
            let channels = lock(&channels);
            let held = channels.holdings.by_channel.keys();
            let held = held.filter(|n| !channels.by_name.contains_key(*n));
            channels.by_name.keys().chain(held).cloned().collect()
        };
        if subscribe_on(&mut sink, &names, &refused).await.is_err() {
            continue;
        }
        // Releases during the outage were not heard: let every waiter retry.
        lock(&channels).bump_all();
        // Nor were held keys' losses: renew them all (not at the first
        // connection, which no loss can have preceded unheard but the one
        // the renewal would find anyway).
        if reconnected && !lock(&channels).holdings.by_channel.is_empty() {
            lock(&channels).holdings.ring();
        }
        reconnected = true;
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => {
                        let name = message.get_channel_name();
                        let payload = message.get_payload_bytes();
                        // A keyspace event wakes only if it may have freed
                        // the key: the holder's renewals are events too. A
                        // turn wakes its ticket's waiter alone.
                        if is_keyspace(name) {
                            let mut channels = lock(&channels);
                            if frees_the_key(payload) {
                                channels.bump(name);
                            }
                            channels.holdings.heard(name, payload);
                        } else if let Some(ticket) = payload.strip_prefix(b"turn:") {
                            lock(&channels).give_turn(ticket);
                        } else {
                            let mut channels = lock(&channels);
                            channels.bump(name);
                            channels.deliver(name, payload);
                        }
                    }
                    None => break,
                },
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Hold(mut names)) => {
                        // Many grants at once: one SUBSCRIBE for all the
                        // held channels queued meanwhile.
                        let mut next = None;
                        while names.len() < 1000 {
                            match commands.try_recv() {
                                Ok(Command::Hold(more)) => names.extend(more),
                                Ok(other) => {
                                    next = Some(other);
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        if subscribe_on(&mut sink, &names, &refused).await.is_err() {
                            break;
                        }
                        if let Some(other) = next
                            && handle(other, &mut sink, &channels, &refused).await.is_err() {
                                break;
                            }
                    }
                    Some(other) => {
                        if handle(other, &mut sink, &channels, &refused).await.is_err() {
                            break;
                        }
                    }
                },
            }
        }
    }
}

/// Carries out one command on the connection; `Err` when it failed.
async fn handle(
    command: Command,
    sink: &mut PubSubSink,
    channels: &Mutex<Channels>,
    refused: &Refused,
) -> Result<(), redis::RedisError> {
    match command {
        Command::Subscribe(names, ack) => {
            subscribe_on(sink, &names, refused).await?;
            let _ = ack.send(());
        }
        Command::Hold(names) => subscribe_on(sink, &names, refused).await?,
        Command::Unhold(names) => {
            // A waiter may listen to it now, or a holder again.
            let unwanted: Vec<String> = {
                let channels = lock(channels);
                names
                    .into_iter()
                    .filter(|n| {
                        !channels.by_name.contains_key(n)
                            && !channels.holdings.by_channel.contains_key(n)
                    })
                    .collect()
            };
            if !unwanted.is_empty() {
                sink.unsubscribe(&unwanted).await?;
            }
        }
        Command::Unsubscribe(names) => {
            // A waiter may have come back for a channel meanwhile.
            let unwanted: Vec<String> = {
                let mut channels = lock(channels);
                names
                    .into_iter()
                    .filter(|n| channels.forget_if_idle(n))
                    .collect()
            };
            if !unwanted.is_empty() {
                sink.unsubscribe(&unwanted).await?;
            }
        }
    }
    Ok(())
}
