//! Hearing a held key's loss at once: a watcher per held key, all on one
//! watch stream per backend, that rings the backend's loss alarm
//! (`LockBackend::loss_alarm`) when the key is deleted (`etcdctl del`, or
//! `etcdctl lease revoke` of its session, which deletes its keys) or
//! rewritten by someone else, so the watchdog renews at once and the
//! renewal reports the lease lost, instead of at the next renewal (up to a
//! third of the ttl later; issue 65).
//!
//! - One stream: etcd multiplexes watchers on a stream, each named by a
//!   `watch_id` the client picks, so a key's watcher is created and
//!   cancelled by id with no answer awaited (no round trip on the acquire
//!   or release path). 50,000 held keys are 50,000 watchers on the server
//!   (a few hundred bytes each) and one stream, one HTTP/2 stream on the
//!   client's connection.
//! - No missed delete: a key's watcher starts at its create revision + 1,
//!   so a delete between the grant and the watcher's creation is replayed.
//! - A broken stream (a member restarted, a connection lost) is opened
//!   again and every watcher created again from its start revision (events
//!   seen twice are harmless), and the alarm rings, so the renewal reads
//!   every key once. A watcher cancelled by the server (its start revision
//!   compacted) rings the alarm too: the renewal's read decides.
//! - What the watch marks (`Held::deleted`) the renewal reports as
//!   [`Renewal::Deleted`](crate::backend::Renewal::Deleted); the renewal's
//!   own check of every key stays, so a loss is found even without the
//!   watch, as before, at the next renewal.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions, WatchStream};
use tokio::sync::mpsc;

use super::{lock, Inner};

/// How long to wait before opening a broken stream again.
const REOPEN_AFTER: Duration = Duration::from_millis(500);

/// What the backend tells its watch task.
enum Command {
    /// Watch `entry`, created at `revision`, as watcher `id`.
    Watch {
        id: i64,
        entry: String,
        revision: i64,
    },
    /// Stop watcher `id`.
    Cancel(i64),
}

/// The backend's side of the watch: where to send commands, and the ids.
pub(super) struct KeyWatch {
    commands: Option<mpsc::UnboundedSender<Command>>,
    next_id: i64,
    /// The id of each held key's watcher, by entry name.
    ids: HashMap<String, i64>,
    /// The loss alarm the watchdog listens to.
    pub(super) alarm: tokio::sync::watch::Sender<u64>,
}

impl Default for KeyWatch {
    fn default() -> Self {
        KeyWatch {
            commands: None,
            next_id: 0,
            ids: HashMap::new(),
            alarm: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// Rings `alarm`: a new value wakes the watchdog.
fn ring(alarm: &tokio::sync::watch::Sender<u64>) {
    alarm.send_modify(|n| *n = n.wrapping_add(1));
}

impl Inner {
    /// Starts watching `entry`, held from its create `revision` on; the
    /// watch task starts with the first key.
    pub(super) fn watch_key(self: &Arc<Self>, entry: &str, revision: i64) {
        let mut watch = lock(&self.key_watch);
        if let Some(old) = watch.ids.remove(entry)
            && let Some(commands) = &watch.commands
        {
            let _ = commands.send(Command::Cancel(old));
        }
        watch.next_id += 1;
        let id = watch.next_id;
        watch.ids.insert(entry.to_owned(), id);
        let command = Command::Watch {
            id,
            entry: entry.to_owned(),
            revision,
        };
        let command = match &watch.commands {
            Some(commands) => match commands.send(command) {
                Ok(()) => return,
                Err(mpsc::error::SendError(command)) => command,
            },
            None => command,
        };
        // No task yet, or it ended: a new one, which reads every watcher
        // the backend keeps when it opens its stream.
        let (commands, received) = mpsc::unbounded_channel();
        let _ = commands.send(command);
        watch.commands = Some(commands);
        crate::lease::background::spawn_daemon(follow(Arc::downgrade(self), received));
    }

    /// Stops watching `entry` (released, or found lost).
    pub(super) fn unwatch_key(&self, entry: &str) {
        let mut watch = lock(&self.key_watch);
        if let Some(id) = watch.ids.remove(entry)
            && let Some(commands) = &watch.commands
        {
            let _ = commands.send(Command::Cancel(id));
        }
    }

    /// The watch saw `seen` happen to `entry`: if that ends the key made
    /// at `revision` (a delete after it; a put that made another key, or
    /// moved ours off its session lease, as `etcdctl put` without the
    /// lease does), marks its record and rings.
    fn heard(&self, entry: &str, revision: i64, seen: Seen) {
        let marked = {
            let mut held = lock(&self.held);
            match held.get_mut(entry) {
                Some(h) if h.revision == revision => {
                    let lost = match seen {
                        Seen::Deleted { at } => at > revision,
                        Seen::Put { created, lease } => {
                            created != revision || lease != h.session.id
                        }
                    };
                    h.deleted |= lost;
                    lost
                }
                _ => false,
            }
        };
        if marked {
            tracing::debug!(entry, "watch: a held key was deleted or rewritten");
            self.ring_alarm();
        }
    }

    fn ring_alarm(&self) {
        ring(&lock(&self.key_watch).alarm);
    }

    /// The watchers this backend keeps (for the watch task, after a break).
    fn watched(&self) -> Vec<(i64, String, i64)> {
        let watch = lock(&self.key_watch);
        let held = lock(&self.held);
        watch
            .ids
            .iter()
            .filter_map(|(entry, id)| held.get(entry).map(|h| (*id, entry.clone(), h.revision)))
            .collect()
    }
}

/// The options of one key's watcher.
fn options(id: i64, revision: i64) -> WatchOptions {
    WatchOptions::new()
        .with_watch_id(id)
        .with_start_revision(revision.saturating_add(1))
}

/// The watch task: keeps one stream open while the backend lives, creates
/// and cancels watchers as told, and reports losses.
async fn follow(inner: Weak<Inner>, mut commands: mpsc::UnboundedReceiver<Command>) {
    // What each watcher stands for: its entry and the revision it was made at.
    let mut watchers: HashMap<i64, (String, i64)> = HashMap::new();
    let mut stream: Option<WatchStream> = None;
    loop {
        let Some(open_stream) = stream.as_mut() else {
            // (Re)open with every watcher the backend keeps, each from its
            // start revision. The records come first, then the commands
            // already sent (duplicates of them, or cancels).
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let mut pending = strong.watched();
            while let Ok(command) = commands.try_recv() {
                apply_offline(&mut pending, command);
            }
            pending.sort_unstable_by_key(|w| w.0);
            pending.dedup_by_key(|w| w.0);
            if pending.is_empty() {
                drop(strong);
                // Nothing to watch: wait for a key (its record is read on
                // the next turn), or the backend's end.
                match commands.recv().await {
                    Some(command) => {
                        let mut one = Vec::new();
                        apply_offline(&mut one, command);
                        if let Some(first) = one.pop() {
                            if let Some(s) = open(&inner, std::slice::from_ref(&first)).await {
                                watchers.insert(first.0, (first.1, first.2));
                                stream = Some(s);
                            } else {
                                tokio::time::sleep(REOPEN_AFTER).await;
                            }
                        }
                        continue;
                    }
                    None => return,
                }
            }
            drop(strong);
            match open(&inner, &pending).await {
                Some(s) => {
                    watchers = pending.into_iter().map(|(id, e, r)| (id, (e, r))).collect();
                    stream = Some(s);
                }
                None => tokio::time::sleep(REOPEN_AFTER).await,
            }
            continue;
        };
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                let sent = match command {
                    Command::Watch { id, entry, revision } => {
                        let key = entry.clone();
                        watchers.insert(id, (entry, revision));
                        open_stream.watch(key, Some(options(id, revision))).await
                    }
                    Command::Cancel(id) => {
                        watchers.remove(&id);
                        open_stream.cancel(id).await
                    }
                };
                if sent.is_err() {
                    stream = None;
                    watchers.clear();
                }
            }
            message = open_stream.message() => {
                let Some(strong) = inner.upgrade() else { return };
                let answer = match message {
                    Ok(Some(answer)) => answer,
                    _ => {
                        // Broken: open again, and let the renewal read every key.
                        tracing::debug!("watch of held keys broke; opening it again");
                        stream = None;
                        watchers.clear();
                        strong.ring_alarm();
                        drop(strong);
                        tokio::time::sleep(REOPEN_AFTER).await;
                        continue;
                    }
                };
                let Some((entry, revision)) = watchers.get(&answer.watch_id()).cloned() else {
                    continue;
                };
                if answer.canceled() {
                    // Compacted, or refused: the renewal's read decides.
                    watchers.remove(&answer.watch_id());
                    tracing::debug!(entry, reason = answer.cancel_reason(), "watch of a held key cancelled");
                    strong.ring_alarm();
                    continue;
                }
                for event in answer.events() {
                    let Some(kv) = event.kv() else { continue };
                    let seen = match event.event_type() {
                        EventType::Delete => Seen::Deleted { at: kv.mod_revision() },
                        EventType::Put => Seen::Put {
                            created: kv.create_revision(),
                            lease: kv.lease(),
                        },
                    };
                    strong.heard(&entry, revision, seen);
                }
            }
        }
    }
}

/// What a watcher saw happen to its key.
enum Seen {
    Deleted { at: i64 },
    Put { created: i64, lease: i64 },
}

/// A command that came while no stream was open.
fn apply_offline(pending: &mut Vec<(i64, String, i64)>, command: Command) {
    match command {
        Command::Watch {
            id,
            entry,
            revision,
        } => pending.push((id, entry, revision)),
        Command::Cancel(id) => pending.retain(|w| w.0 != id),
    }
}

/// Opens the stream with every watcher of `pending`.
async fn open(inner: &Weak<Inner>, pending: &[(i64, String, i64)]) -> Option<WatchStream> {
    let ((first_id, first, first_rev), rest) = pending.split_first()?;
    let (mut client, timeout) = {
        let inner = inner.upgrade()?;
        (inner.client.watch_client(), inner.timeout)
    };
    let opened = tokio::time::timeout(timeout, async {
        let mut stream = client
            .watch(first.as_str(), Some(options(*first_id, *first_rev)))
            .await?;
        for (id, entry, revision) in rest {
            stream
                .watch(entry.as_str(), Some(options(*id, *revision)))
                .await?;
        }
        Ok::<_, etcd_client::Error>(stream)
    })
    .await;
    match opened {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "no watch of held keys");
            None
        }
        Err(_) => None,
    }
}
