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
//!
//! Turns come on a channel of the backend's own ([`turn_channel`]), so a
//! release wakes one process, not every listener of the key.

use std::hash::{BuildHasher, RandomState};
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A new backend's channel for turns: `<prefix>:turns:<random>`.
pub(crate) fn turn_channel(prefix: &str) -> String {
    // Without the OS's randomness, a per-process key hashing the clock:
    // unique enough for a channel name, which guards no secret.
    let drawn = getrandom::u64().unwrap_or_else(|_| {
        std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::time::Instant::now())
    });
    format!("{prefix}:turns:{drawn:016x}")
}

/// The ticket of the waiter acquiring with owner token `token` whose
/// backend hears its turns on `turns`: a hash of the token under a key
/// drawn once per process, in hex, then `@` and that channel (see
/// `turns.rs`). Tickets are published and the token is a secret, so the
/// ticket must not reveal it; derived rather than drawn, so an uncontended
/// acquire (which never queues) costs no randomness for it, and a retry
/// with the same token keeps its place.
fn ticket_of(token: &str, turns: &str) -> String {
    static KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    format!("{:016x}@{turns}", KEY.hash_one(token))
}

/// A waiter's ticket, derived from its token (see [`ticket_of`]) the
/// first time it is asked for: an acquire that takes a free key at its
/// first try never needs one.
pub(crate) struct Ticket<'a> {
    token: &'a str,
    turns: &'a str,
    derived: OnceLock<String>,
}

impl<'a> Ticket<'a> {
    /// The ticket of the waiter with owner token `token`, whose backend
    /// hears its turns on channel `turns`.
    pub(crate) fn of(token: &'a str, turns: &'a str) -> Self {
        Ticket {
            token,
            turns,
            derived: OnceLock::new(),
        }
    }

    /// The ticket itself.
    pub(crate) fn get(&self) -> &str {
        self.derived
            .get_or_init(|| ticket_of(self.token, self.turns))
    }
}

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

    #[test]
    fn each_backend_draws_its_own_turn_channel() {
        let a = turn_channel("dlock");
        let b = turn_channel("dlock");
        assert_ne!(a, b);
        assert!(a.starts_with("dlock:turns:"), "{a}");
        assert_eq!(a.len(), "dlock:turns:".len() + 16);
    }
}
