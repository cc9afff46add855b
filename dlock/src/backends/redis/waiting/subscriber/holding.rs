//! Holders hearing their key's loss at once: where the server sends keyspace
//! notifications, each held lock's keyspace channel is subscribed on the
//! backend's one subscriber connection (the waiters' connection: 50,000 held
//! locks cost one connection, not 50,000), and an event that means the key
//! is gone or no longer ours (`del`, `expired`, `evicted`, renamed or moved
//! away, or written by someone else) rings the backend's loss alarm
//! (`LockBackend::loss_alarm`): the watchdog then renews every lease of the
//! backend at once, and the renewal reports the lost ones. Without
//! notifications the renewal interval (a third of the ttl) is the bound.
//!
//! Own operations make events too: the renewals' `expire` is not among the
//! alarming events. A `set` is: it is how another client overwrites the key,
//! but it is also the grant's own `SET` and, on servers that renew with
//! `SET … IFEQ`, every renewal's. So:
//! - a lock granted while its channel was not subscribed yet cannot hear its
//!   own grant (the `SUBSCRIBE` goes out after it): every later `set`
//!   alarms;
//! - one granted while the channel was already subscribed (its waiter
//!   listened to it) may still hear its own grant's `set`: the first `set`
//!   within [`OWN_SET_GRACE`] of the grant is taken for it (an overwrite in
//!   that second is found by the next renewal instead);
//! - a backend that renews with `SET … IFEQ` does not alarm on `set` at all
//!   (each renewal would ring, and the ring renews: a loop); there an
//!   overwrite is found by the next renewal.
//!
//! The channels are subscribed without waiting for the server's answer: the
//! acquire costs no round trip for it; a `DEL` in the microseconds between
//! the grant and the subscription is found by the renewal. When the
//! subscriber's connection breaks, events may have been missed: the alarm is
//! rung once it is back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How long after a grant a `set` on its key may be its own.
pub(crate) const OWN_SET_GRACE: Duration = Duration::from_secs(1);

/// One held key's channel.
#[derive(Debug)]
pub(super) struct Held {
    /// The owner tokens of this backend's leases on the key (a reentrant
    /// holder may have two): a lease ended twice (lost, then released) is
    /// forgotten once.
    tokens: Vec<String>,
    /// When the first lease was granted and whether its own `set` may still
    /// come (see the module docs).
    own_set_until: Option<Instant>,
}

/// The held keys' channels of one backend and its loss alarm.
#[derive(Debug)]
pub(super) struct Holdings {
    pub(super) by_channel: HashMap<String, Held>,
    alarm: watch::Sender<u64>,
    /// Whether a `set` alarms (not where renewals are `SET … IFEQ`).
    pub(super) set_alarms: bool,
}

impl Default for Holdings {
    fn default() -> Self {
        Holdings {
            by_channel: HashMap::new(),
            alarm: watch::channel(0).0,
            set_alarms: true,
        }
    }
}

/// What a keyspace event means for a held key.
pub(super) fn alarming(event: &[u8], set_alarms: bool) -> Option<bool> {
    match event {
        b"del" | b"expired" | b"evicted" | b"rename_from" | b"move_from" => Some(true),
        // Written by someone: maybe our own grant (see `Holdings::heard`).
        b"set" | b"restore" | b"copy_to" | b"rename_to" | b"move_to" if set_alarms => Some(false),
        _ => None,
    }
}

impl Holdings {
    /// A new receiver of the loss alarm.
    pub(super) fn alarm(&self) -> watch::Receiver<u64> {
        self.alarm.subscribe()
    }

    /// Rings the alarm: the watchdog renews every lease at once.
    pub(super) fn ring(&self) {
        self.alarm.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A lease (owner token `token`) on the key of `channel` was granted; `subscribed`: whether
    /// the channel was already subscribed (its own `set` may still come).
    /// Whether the channel is new here.
    pub(super) fn hold(&mut self, channel: &str, token: &str, subscribed: bool) -> bool {
        if let Some(held) = self.by_channel.get_mut(channel) {
            if !held.tokens.iter().any(|t| t == token) {
                held.tokens.push(token.to_owned());
            }
            return false;
        }
        let own_set_until = subscribed.then(|| Instant::now() + OWN_SET_GRACE);
        self.by_channel.insert(
            channel.to_owned(),
            Held {
                tokens: vec![token.to_owned()],
                own_set_until,
            },
        );
        true
    }

    /// The lease `token` on the key of `channel` ended (released, lost). Whether the
    /// channel is no longer held.
    pub(super) fn unhold(&mut self, channel: &str, token: &str) -> bool {
        let Some(held) = self.by_channel.get_mut(channel) else {
            return false;
        };
        held.tokens.retain(|t| t != token);
        if held.tokens.is_empty() {
            self.by_channel.remove(channel);
            return true;
        }
        false
    }

    /// The event `event` on `channel`: rings the alarm if it may mean a
    /// held key was lost.
    pub(super) fn heard(&mut self, channel: &str, event: &[u8]) {
        let set_alarms = self.set_alarms;
        let Some(held) = self.by_channel.get_mut(channel) else {
            return;
        };
        let Some(gone) = alarming(event, set_alarms) else {
            return;
        };
        if !gone
            && let Some(until) = held.own_set_until.take()
            && event == b"set"
            && Instant::now() < until
        {
            return;
        }
        self.ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(h: &Holdings, rx: &mut watch::Receiver<u64>) -> bool {
        let _ = h;
        rx.has_changed().unwrap_or(false) && {
            rx.borrow_and_update();
            true
        }
    }

    #[test]
    fn a_deleted_held_key_rings_and_a_renewal_does_not() {
        let mut h = Holdings::default();
        let mut rx = h.alarm();
        assert!(h.hold("ks:a", "t1", false));
        h.heard("ks:a", b"expire");
        assert!(!rung(&h, &mut rx), "a renewal's PEXPIRE");
        h.heard("ks:other", b"del");
        assert!(!rung(&h, &mut rx), "a key not held");
        for event in ["del", "expired", "evicted", "set"] {
            h.heard("ks:a", event.as_bytes());
            assert!(rung(&h, &mut rx), "{event}");
        }
    }

    #[test]
    fn the_grants_own_set_is_absorbed_once_when_already_subscribed() {
        let mut h = Holdings::default();
        let mut rx = h.alarm();
        h.hold("ks:a", "t1", true);
        h.heard("ks:a", b"set");
        assert!(!rung(&h, &mut rx), "the grant's own SET");
        h.heard("ks:a", b"set");
        assert!(rung(&h, &mut rx), "a second SET is an overwrite");
    }

    #[test]
    fn set_renewals_do_not_ring() {
        let mut h = Holdings {
            set_alarms: false,
            ..Holdings::default()
        };
        let mut rx = h.alarm();
        h.hold("ks:a", "t1", false);
        h.heard("ks:a", b"set");
        assert!(!rung(&h, &mut rx));
        h.heard("ks:a", b"del");
        assert!(rung(&h, &mut rx));
    }

    #[test]
    fn the_channel_is_held_until_its_last_lease_ends() {
        let mut h = Holdings::default();
        assert!(h.hold("ks:a", "t1", false));
        assert!(!h.hold("ks:a", "t2", false));
        assert!(!h.unhold("ks:a", "t1"));
        assert!(!h.unhold("ks:a", "t1"), "the same lease ended twice");
        assert!(h.unhold("ks:a", "t2"));
        assert!(!h.unhold("ks:a", "t2"), "already gone");
    }
}
