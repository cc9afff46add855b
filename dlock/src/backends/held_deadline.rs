//! The wait of a lease's reaper, for the backends whose server keeps a lock
//! for as long as the session (or the open file) lives (PostgreSQL, MySQL,
//! ZooKeeper, files): a dlock lease
//! ends at its ttl when it is not renewed (renewal off, a leaked guard, a
//! holder whose watchdog cannot run), so the lock must go then too, or the
//! key stays blocked by a lease nobody holds.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

/// How long after a lease's local deadline its reaper lets the lock go.
/// At the deadline itself the watchdog marks the lease lost (`lost()`
/// fires, `is_held()` turns false); the reaper, a timer of its own at the
/// same instant, could otherwise unlock first on a loaded machine, and a
/// successor be granted before the holder was told. A server's own expiry
/// comes later than the local deadline too (by the drift margin, at least
/// 2 ms): this keeps the same order where dlock is the one that expires.
pub(crate) const REAP_AFTER: Duration = Duration::from_millis(5);

/// When the reaper of a lease whose local deadline is `deadline` lets the
/// lock go: [`REAP_AFTER`] later.
fn reap_at(deadline: Instant) -> Instant {
    crate::backend::deadline::saturating_add(deadline, REAP_AFTER)
}

/// Waits until the record `name` of `held` has passed its local deadline
/// (`valid_until` of the record, moved by each renewal) by [`REAP_AFTER`]
/// without a renewal, then takes it out of the map and returns it. `None` if the record went
/// first: removed (released, or `gone`, its end signal, fired), or the
/// map itself dropped. `at` is the deadline the record had when it was
/// made.
pub(crate) async fn ran_out<H>(
    held: Weak<Mutex<HashMap<String, H>>>,
    name: &str,
    mut at: Instant,
    mut gone: tokio::sync::oneshot::Receiver<()>,
    valid_until: impl Fn(&H) -> Instant,
) -> Option<H> {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(reap_at(at).into()) => {}
            // The entry was removed (released or reaped): nothing to watch.
            _ = &mut gone => return None,
        }
        let map = held.upgrade()?;
        // Every update under these mutexes is one insert, remove or
        // assignment, so a poisoned mutex still guards consistent data.
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(name) {
            None => return None,
            Some(h) if reap_at(valid_until(h)) > Instant::now() => at = valid_until(h),
            Some(_) => return map.remove(name),
        }
    }
}

/// Records `entry` under `token` in `held` and starts its reaper on dlock's
/// background runtime: when the entry's deadline (`deadline_of`, first
/// `valid_until`) passes without a renewal, it is taken out of the map and
/// handed to `expired`, which lets the lock go. `entry` is made with the
/// reaper's end signal, which the entry keeps: dropping it (a release)
/// ends the reaper at once. Returns the entry `token` had before, if any.
#[cfg(any(
    feature = "postgres",
    feature = "mysql",
    all(feature = "file", target_os = "linux")
))]
pub(crate) fn remember<H: Send + 'static>(
    held: &std::sync::Arc<Mutex<HashMap<String, H>>>,
    token: &str,
    valid_until: Instant,
    entry: impl FnOnce(tokio::sync::oneshot::Sender<()>) -> H,
    deadline_of: fn(&H) -> Instant,
    expired: impl FnOnce(H) + Send + 'static,
) -> Option<H> {
    let (reaper, gone) = tokio::sync::oneshot::channel();
    let before = held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(token.to_owned(), entry(reaper));
    let map = std::sync::Arc::downgrade(held);
    let token = token.to_owned();
    crate::lease::background::spawn_daemon(async move {
        if let Some(h) = ran_out(map, &token, valid_until, gone, deadline_of).await {
            expired(h);
        }
    });
    before
}
