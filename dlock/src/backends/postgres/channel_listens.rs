//! The `LISTEN`s of latches and barriers on the backend's one listening
//! connection (`listener.rs`, the lock waiters'): one per channel with
//! waiters in this process, shared by them (a [`Listened`] each holds),
//! sent by the first and taken back with `UNLISTEN` by the last one to go
//! (in the background, so a dropped wait leaves no subscription). The
//! notifications' payload is the waiters' key, woken through the
//! listener's `Waiters`. A listening connection that ended is noticed by a
//! local check ([`LISTENER_CHECK`], no request): the waiters listen again
//! on the next one and read again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::OnceCell;

use super::{failed, lock, PostgresBackend};
use crate::LockError;

/// How often a waiter checks that the listening connection still runs (a
/// local check, no request).
pub(super) const LISTENER_CHECK: Duration = Duration::from_secs(1);

/// The bound on a background `UNLISTEN` (a listener that does not answer
/// is one that ends, and its `LISTEN`s with it).
const UNLISTEN_BOUND: Duration = Duration::from_secs(5);

/// The `LISTEN`s of latches and barriers, one per channel with waiters in
/// this process.
#[derive(Debug, Default)]
pub(super) struct ChannelListens {
    by_key: Mutex<HashMap<i64, Weak<Listened>>>,
    /// Held while a `LISTEN` or `UNLISTEN` is decided and sent, so that an
    /// `UNLISTEN` of a channel's last waiter never lands after the `LISTEN`
    /// of a waiter that came next.
    order: tokio::sync::Mutex<()>,
}

/// One channel's `LISTEN` (a latch's, a barrier's), shared by its
/// waiters; the last one's drop sends `UNLISTEN`.
pub(super) struct Listened {
    key: i64,
    channel: String,
    /// The alive flag of the listening connection the `LISTEN` went out on;
    /// set once it was answered.
    on: OnceCell<Arc<AtomicBool>>,
    listens: Arc<ChannelListens>,
    listener: Arc<tokio::sync::Mutex<Option<super::listener::Listener>>>,
}

impl Listened {
    /// Whether the `LISTEN` was answered on a listening connection that
    /// still runs.
    pub(super) fn listening(&self) -> bool {
        self.on.get().is_some_and(|a| a.load(Ordering::SeqCst))
    }
}

impl Drop for Listened {
    fn drop(&mut self) {
        let (key, channel) = (self.key, self.channel.clone());
        let (listens, listener) = (self.listens.clone(), self.listener.clone());
        crate::lease::background::spawn(async move {
            let _order = listens.order.lock().await;
            {
                let mut map = lock(&listens.by_key);
                if map.get(&key).and_then(Weak::upgrade).is_some() {
                    // Another waiter came meanwhile: its `LISTEN` stands.
                    return;
                }
                map.remove(&key);
            }
            if let Some(l) = listener.lock().await.as_ref().filter(|l| l.is_alive()) {
                let unlisten = format!("UNLISTEN \"{channel}\"");
                let _ = tokio::time::timeout(UNLISTEN_BOUND, l.run(&unlisten)).await;
            }
        });
    }
}

impl PostgresBackend {
    /// The shared `LISTEN` on `channel` (a latch's or a barrier's, whose
    /// waiters are registered under `key`) on a live listening connection,
    /// sent if this is its first waiter.
    pub(super) async fn listen_on(
        &self,
        key: i64,
        channel: &str,
    ) -> Result<Arc<Listened>, LockError> {
        let listened = {
            let mut map = lock(&self.channel_listens.by_key);
            match map
                .get(&key)
                .and_then(Weak::upgrade)
                .filter(|l| l.on.get().is_none() || l.listening())
            {
                Some(listened) => listened,
                None => {
                    let listened = Arc::new(Listened {
                        key,
                        channel: channel.to_owned(),
                        on: OnceCell::new(),
                        listens: self.channel_listens.clone(),
                        listener: self.listener.clone(),
                    });
                    map.insert(key, Arc::downgrade(&listened));
                    listened
                }
            }
        };
        listened
            .on
            .get_or_try_init(|| async {
                if !self.ensure_listener().await {
                    return Err(failed(
                        &self.shown,
                        "the connection that listens for latches and barriers could not be opened",
                    ));
                }
                let _order = self.channel_listens.order.lock().await;
                let slot = self.listener.lock().await;
                let Some(listener) = slot.as_ref().filter(|l| l.is_alive()) else {
                    return Err(failed(&self.shown, "the listening connection ended"));
                };
                let flag = listener.alive_flag();
                self.bounded(listener.run(&format!("LISTEN \"{channel}\"")))
                    .await?;
                Ok(flag)
            })
            .await?;
        Ok(listened)
    }
}
