//! Waking waiters: one connection per backend `LISTEN`s on the release
//! channel, and wakes the waiters of the advisory key each notification
//! names. Waiters also re-check on a slow timer, since a lock freed by
//! another client (psql's `pg_advisory_unlock`, a session that ended)
//! announces nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client};

use super::config::Config;
use super::sql::{CHANNEL, ELECTED};
use super::{failed, lock, Failure};
use crate::backend::LeaderChange;
use crate::backends::announcements::{self, Inbox, Inboxes};
use crate::LockError;

/// The waiters of each advisory key, with a count of registrations, and
/// the watchers of each (election observers).
#[derive(Debug, Default)]
pub(super) struct Waiters {
    by_key: Mutex<HashMap<i64, (Arc<Notify>, usize)>>,
    /// Each election observer has an inbox of its own: announcements are
    /// kept there, in order, while it is busy elsewhere (reading the
    /// leader).
    watchers: Mutex<HashMap<i64, Inboxes>>,
}

/// A waiter's registration, removed on drop.
pub(super) struct Waiting<'a> {
    waiters: &'a Waiters,
    key: i64,
    pub(super) notify: Arc<Notify>,
}

impl Waiters {
    pub(super) fn register(&self, key: i64) -> Waiting<'_> {
        let mut map = lock(&self.by_key);
        let entry = map
            .entry(key)
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Waiting {
            waiters: self,
            key,
            notify: entry.0.clone(),
        }
    }

    /// An inbox for the announcements of the election of advisory key
    /// `key`: every later one is kept there, for as long as it lives.
    pub(super) fn watch(&self, key: i64) -> Arc<Inbox> {
        lock(&self.watchers).entry(key).or_default().add()
    }

    fn wake(&self, key: i64) {
        if let Some((notify, _)) = lock(&self.by_key).get(&key) {
            notify.notify_waiters();
        }
    }

    /// An election's announcement (`<key>\n<announcement>`): into the
    /// inboxes of that election's observers.
    fn announce(&self, payload: &str) {
        let Some((key, announcement)) = payload.split_once('\n') else {
            return;
        };
        let Ok(key) = key.parse::<i64>() else {
            return;
        };
        let mut watchers = lock(&self.watchers);
        if let Some(list) = watchers.get_mut(&key)
            && !list.deliver(&announcements::parse(announcement.as_bytes()))
        {
            watchers.remove(&key);
        }
    }

    /// Wakes every waiter and watcher (the listener reconnected: it may
    /// have missed news).
    fn wake_all(&self) {
        for (notify, _) in lock(&self.by_key).values() {
            notify.notify_waiters();
        }
        lock(&self.watchers).retain(|_, list| list.deliver(&LeaderChange::Unknown));
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut map = lock(&self.waiters.by_key);
        if let Some(entry) = map.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The listening connection.
pub(super) struct Listener {
    _client: Client,
    alive: Arc<AtomicBool>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl Listener {
    pub(super) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && !self._client.is_closed()
    }

    /// Runs `statement` (a latch's `LISTEN` or `UNLISTEN`) on the listening
    /// connection.
    pub(super) fn run<'a>(
        &'a self,
        statement: &'a str,
    ) -> impl std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a {
        self._client.batch_execute(statement)
    }

    /// Turns false when the listening connection ends.
    pub(super) fn alive_flag(&self) -> Arc<AtomicBool> {
        self.alive.clone()
    }

    /// Connects and listens; notifications wake `waiters`. Run on dlock's
    /// background runtime.
    pub(super) async fn open(
        config: &Config,
        shown: &str,
        waiters: std::sync::Weak<Waiters>,
    ) -> Result<Listener, LockError> {
        let (client, mut connection) = super::session::connect(config, shown).await?;
        let alive = Arc::new(AtomicBool::new(true));
        let task_alive = alive.clone();
        tokio::spawn(async move {
            loop {
                let message = std::future::poll_fn(|cx| connection.poll_message(cx)).await;
                match message {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        let Some(waiters) = waiters.upgrade() else {
                            break;
                        };
                        if n.channel() == ELECTED {
                            waiters.announce(n.payload());
                        } else if let Ok(key) = n.payload().parse::<i64>() {
                            waiters.wake(key);
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
            task_alive.store(false, Ordering::SeqCst);
        });
        let statement = format!("LISTEN {CHANNEL}; LISTEN {ELECTED}");
        let listen = client.batch_execute(&statement);
        match tokio::time::timeout(config.session.timeout, listen).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(failed(shown, e)),
            Err(_) => {
                return Err(failed(
                    shown,
                    Failure::unanswered(format!(
                        "LISTEN did not answer within {:?}",
                        config.session.timeout
                    )),
                ))
            }
        }
        Ok(Listener {
            _client: client,
            alive,
        })
    }
}

/// Wakes every waiter once a new listener is up.
pub(super) fn listening_again(waiters: &Waiters) {
    waiters.wake_all();
}
