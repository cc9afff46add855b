//! A queued waiter's turn: the wake-up its turn message gives, and when that
//! turn was given and not yet taken.
//!
//! A waiter whose future is kept but not polled (a `select!` loop busy with
//! other work, a future stored for later) cannot take a turn handed to it,
//! while its process's heartbeat would keep its ticket first in line for
//! ever. The heartbeat asks [`Turn::overdue`] and, for a turn given longer
//! ago than its grace and still not taken, takes the ticket out of line and
//! wakes the next waiter (see `turns.rs`). The waiter queues again the next
//! time it is polled: each try marks its turn taken.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// One queued waiter's turn (shared by the subscriber, which gives it, the
/// waiter, which takes it, and its backend's heartbeat, which watches it).
#[derive(Debug, Default)]
pub(crate) struct Turn {
    wake: Notify,
    /// When a turn was given that the waiter has not tried since.
    given_at: Mutex<Option<Instant>>,
}

impl Turn {
    /// A turn message (or the heartbeat's bell) for this ticket: wakes its
    /// waiter, and starts the clock of an untaken turn unless one runs.
    pub(crate) fn give(&self) {
        self.given_at().get_or_insert_with(Instant::now);
        self.wake.notify_one();
    }

    /// The waiter tries: whatever turn it was given, it is taking it now.
    pub(crate) fn taken(&self) {
        *self.given_at() = None;
    }

    /// A turn was given more than `grace` ago and the waiter has not tried
    /// since: its future is not being polled.
    pub(crate) fn overdue(&self, grace: Duration) -> bool {
        self.given_at().is_some_and(|at| at.elapsed() >= grace)
    }

    /// Resolves when a turn is given (at once if one was given while
    /// nobody waited on it).
    pub(crate) async fn given(&self) {
        self.wake.notified().await;
    }

    fn given_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.given_at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_overdue_only_while_given_and_not_taken() {
        let turn = Turn::default();
        assert!(!turn.overdue(Duration::ZERO), "nothing given yet");
        turn.give();
        assert!(turn.overdue(Duration::ZERO));
        assert!(!turn.overdue(Duration::from_secs(60)), "within its grace");
        turn.taken();
        assert!(!turn.overdue(Duration::ZERO), "taken");
    }

    #[test]
    fn a_second_turn_keeps_the_clock_of_the_first() {
        let turn = Turn::default();
        turn.give();
        std::thread::sleep(Duration::from_millis(20));
        turn.give();
        assert!(turn.overdue(Duration::from_millis(20)));
    }

    #[tokio::test]
    async fn a_turn_given_before_the_wait_is_kept_for_it() {
        let turn = Turn::default();
        turn.give();
        tokio::time::timeout(Duration::from_secs(1), turn.given())
            .await
            .expect("the stored wake-up");
    }
}
