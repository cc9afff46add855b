//! How a waiter learns of a release that nobody announced.
//!
//! dlock's own release publishes on the key's release channel, and an expiry
//! is foreseen from the holder's `PTTL`. A release by anything else — another
//! client library (redis-py's `Lock.release`), `redis-cli DEL`, `FLUSHALL`,
//! an operator — announces nothing there, and a waiter would sleep until the
//! old holder's ttl. Two remedies, both on the single waiter per key that
//! the core's local queue lets through to the server:
//!
//! - **Keyspace notifications**, when the server has them on for generic and
//!   expired events (`notify-keyspace-events` with `K` and `g` and `x`, or
//!   `K` and `A`; read once at connect, never changed by dlock): the waiter
//!   also subscribes to the key's keyspace channel
//!   `__keyspace@<db>__:<prefix>:{key}` on the shared subscriber, and an
//!   event that may have freed the key (see [`frees_the_key`]) wakes it.
//! - **A re-check**: one `PTTL` of the key, first after a few ms, then after
//!   twice as long each time up to a cap (default 1 s, `?recheck_ms=`, `0`
//!   turns it off). With notifications on it runs at the cap only, as a net
//!   for what sends no event (`FLUSHALL`, a subscription lost meanwhile).
//!
//! A read-write lock's waiter does the same on the key in its way, as its
//! last attempt named it: the writer key, the readers set, or (a reader's)
//! the waiting writers' marks; its keyspace channels are those three keys'
//! (see `rw/waiting.rs`).
//!
//! Why `PTTL` and not another try of the acquire: both are one round trip
//! and both are correct (a `PTTL` that finds the key gone is followed by the
//! real acquire, which decides), but almost every re-check finds the key
//! still held, and there a `PTTL` is a plain read where the acquire is a
//! script (several times the server's CPU of a read) that, on Redlock, runs
//! on every master and is undone on those that voted for us. The one
//! re-check that finds the key gone costs one round trip more than an
//! acquire would have.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::backends::redis::RedisBackend;
use crate::LockError;

/// The first pause of a waiter's re-checks when the server does not notify.
pub(crate) const FIRST_RECHECK: Duration = Duration::from_millis(5);

/// The pauses between one waiter's re-checks of a held key: from
/// [`FIRST_RECHECK`] doubling up to the cap, or the cap alone when the
/// server's keyspace notifications cover the common releases.
#[derive(Debug, Clone)]
pub(crate) struct Recheck {
    next: Duration,
    cap: Duration,
}

impl Recheck {
    /// The schedule for a cap of `cap` (`None`: no re-check at all).
    pub(crate) fn new(cap: Option<Duration>, notified: bool) -> Option<Recheck> {
        let cap = cap?;
        let next = if notified {
            cap
        } else {
            FIRST_RECHECK.min(cap)
        };
        Some(Recheck { next, cap })
    }

    /// The pause before the next re-check.
    pub(crate) fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        pause
    }
}

impl RedisBackend {
    /// The keyspace channel of the lock key `lock` if the server notifies
    /// (see [`keyspace_notifications`](Self::keyspace_notifications)).
    pub(crate) fn keyspace_channel(&self, lock: &str) -> Option<String> {
        self.notifying_db
            .filter(|_| self.keyspace_notifications())
            .map(|db| keyspace_channel(db, lock))
    }

    /// A waiter's re-check schedule on this server (`None`: off).
    pub(in crate::backends::redis) fn recheck(&self) -> Option<Recheck> {
        Recheck::new(self.options.recheck, self.keyspace_notifications())
    }

    /// One re-check: whether the key `lock` is gone (`PTTL` = -2). Queued
    /// waiters do not re-check: their heartbeat tries are their checks
    /// (see `waiter_queue.rs`).
    pub(crate) async fn key_is_free(&self, lock: &str) -> Result<bool, LockError> {
        self.metrics.rechecks.fetch_add(1, Ordering::Relaxed);
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(lock);
        let pttl: i64 = self.query(&cmd).await?;
        Ok(pttl == -2)
    }
}

/// Whether a server's `notify-keyspace-events` setting publishes, on the
/// keyspace channels (`K`), the generic events (`g`: `DEL`, `UNLINK`, ...)
/// and the expiries (`x`). `A` stands for every class, `g` and `x` among
/// them. Keyevent channels alone (`E`) are not used: each carries the events
/// of every key on the server.
pub(crate) fn notifies_releases(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('A') || (flags.contains('g') && flags.contains('x')))
}

/// The keyspace channel of `key` in database `db`.
pub(crate) fn keyspace_channel(db: i64, key: &str) -> String {
    format!("__keyspace@{db}__:{key}")
}

/// Whether `name` is a keyspace channel.
pub(crate) fn is_keyspace(name: &str) -> bool {
    name.starts_with("__keyspace@")
}

/// Whether a keyspace event may have freed the key: deleted, expired,
/// evicted, renamed or moved away. Others (the holder's `PEXPIRE` renewals,
/// a `SET`) leave it held and would only cost the waiter a useless try. An
/// event missing here costs at most the re-check's cap.
pub(crate) fn frees_the_key(event: &[u8]) -> bool {
    matches!(
        event,
        b"del" | b"expired" | b"evicted" | b"rename_from" | b"move_from"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rechecks_back_off_from_a_few_ms_to_the_cap() {
        let mut r = Recheck::new(Some(Duration::from_secs(1)), false).unwrap();
        let pauses: Vec<u64> = (0..10).map(|_| r.pause().as_millis() as u64).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }

    #[test]
    fn with_notifications_only_the_cap() {
        let mut r = Recheck::new(Some(Duration::from_secs(1)), true).unwrap();
        assert_eq!(r.pause(), Duration::from_secs(1));
        assert_eq!(r.pause(), Duration::from_secs(1));
    }

    #[test]
    fn a_cap_below_the_first_pause_and_no_cap() {
        let mut r = Recheck::new(Some(Duration::from_millis(2)), false).unwrap();
        assert_eq!(r.pause(), Duration::from_millis(2));
        assert_eq!(r.pause(), Duration::from_millis(2));
        assert!(Recheck::new(None, false).is_none());
        let mut huge = Recheck::new(Some(Duration::MAX), false).unwrap();
        for _ in 0..200 {
            huge.pause();
        }
        assert_eq!(huge.pause(), Duration::MAX, "saturates, never panics");
    }

    #[test]
    fn flags_that_notify_releases() {
        // As `CONFIG GET` shows them (Redis normalises the order).
        for on in ["Kgx", "gxK", "AK", "AKE", "KEA", "Kgxe", "K$gxz"] {
            assert!(notifies_releases(on), "{on}");
        }
        for off in ["", "E", "Egx", "AE", "Kg", "Kx", "K", "gx", "A"] {
            assert!(!notifies_releases(off), "{off}");
        }
    }

    #[test]
    fn events_that_free_the_key() {
        for event in ["del", "expired", "evicted", "rename_from", "move_from"] {
            assert!(frees_the_key(event.as_bytes()), "{event}");
        }
        for event in ["expire", "set", "rename_to", "persist", "move_to"] {
            assert!(!frees_the_key(event.as_bytes()), "{event}");
        }
    }

    #[test]
    fn channel_names() {
        let channel = keyspace_channel(3, "dlock:{order:42}");
        assert_eq!(channel, "__keyspace@3__:dlock:{order:42}");
        assert!(is_keyspace(&channel));
        assert!(!is_keyspace("dlock:{order:42}:released"));
    }
}
