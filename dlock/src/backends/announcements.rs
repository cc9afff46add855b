//! Announcements of an election's leader that carry the record: the text
//! Redis and PostgreSQL publish (`<term>\n<value>` when a leader publishes
//! a value, `-<term>` when it steps down), and the inbox in which one
//! observer keeps them until it reads them.
//!
//! Carrying the record is what lets an observer see every term however
//! short: a leader elected and resigned between two of its reads still
//! reaches it, in order. Anyone who may publish on the channel can write
//! such text, so the observer reports an announcement only once the
//! backend confirms it (`ElectionBackend::confirm`; Redis keeps a list of
//! what it announced, PostgreSQL confirms nothing and has them read). The inbox is bounded; an observer that falls
//! [`INBOX`] announcements behind gets [`LeaderChange::Unknown`] in their
//! place and reads the leader instead.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use crate::backend::{Leader, LeaderChange};

/// The most announcements an observer keeps unread.
pub(crate) const INBOX: usize = 256;

/// The announcement that `term`'s leader published `value` (written by the
/// backends' scripts and statements themselves; this is its form).
#[cfg(test)]
fn elected(term: u64, value: &str) -> String {
    format!("{term}\n{value}")
}

/// What an announcement says; [`LeaderChange::Unknown`] for text it does
/// not read (an older dlock's announcement: a bare term, or `0`).
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
pub(crate) fn parse(text: &[u8]) -> LeaderChange {
    let Ok(text) = std::str::from_utf8(text) else {
        return LeaderChange::Unknown;
    };
    if let Some(term) = text.strip_prefix('-') {
        return match term.parse() {
            Ok(term) => LeaderChange::Ended { term },
            Err(_) => LeaderChange::Unknown,
        };
    }
    match text.split_once('\n') {
        Some((term, value)) => match term.parse() {
            Ok(term) => LeaderChange::Elected(Leader {
                value: value.to_owned(),
                term,
            }),
            Err(_) => LeaderChange::Unknown,
        },
        None => LeaderChange::Unknown,
    }
}

/// One observer's unread announcements.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    unread: Mutex<VecDeque<LeaderChange>>,
    arrived: Notify,
}

impl Inbox {
    /// Keeps `change` for the observer; past [`INBOX`] unread, drops them
    /// all for one `Unknown` (the observer reads instead).
    pub(crate) fn push(&self, change: LeaderChange) {
        {
            let mut unread = self.unread.lock().unwrap_or_else(|p| p.into_inner());
            if unread.len() >= INBOX {
                unread.clear();
                unread.push_back(LeaderChange::Unknown);
            }
            unread.push_back(change);
        }
        self.arrived.notify_one();
    }

    /// Forgets the `Unknown`s kept so far: called once the watch is set up,
    /// since the observer reads the leader right after that anyway (a
    /// subscriber's first connection announces one), and a read ahead of
    /// the announcements kept would skip their terms.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    pub(crate) fn settle(&self) {
        self.unread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|change| *change != LeaderChange::Unknown);
    }

    /// The oldest unread announcement, waiting for one.
    pub(crate) async fn next(&self) -> LeaderChange {
        loop {
            let arrived = self.arrived.notified();
            if let Some(change) = self
                .unread
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front()
            {
                return change;
            }
            arrived.await;
        }
    }
}

/// The inboxes of one election's observers in one process; an observer's
/// goes when it drops it.
#[derive(Debug, Default)]
pub(crate) struct Inboxes(Vec<Weak<Inbox>>);

impl Inboxes {
    /// A new observer's inbox.
    pub(crate) fn add(&mut self) -> Arc<Inbox> {
        let inbox = Arc::new(Inbox::default());
        self.0.retain(|i| i.strong_count() > 0);
        self.0.push(Arc::downgrade(&inbox));
        inbox
    }

    /// Puts `change` in every observer's inbox, forgetting the observers
    /// that are gone; false once none is left.
    pub(crate) fn deliver(&mut self, change: &LeaderChange) -> bool {
        self.0.retain(|inbox| match inbox.upgrade() {
            Some(inbox) => {
                inbox.push(change.clone());
                true
            }
            None => false,
        });
        !self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_read_back() {
        let leader = Leader {
            value: "node-a:8080\nwith a newline".into(),
            term: 42,
        };
        assert_eq!(
            parse(elected(42, &leader.value).as_bytes()),
            LeaderChange::Elected(leader)
        );
        assert_eq!(parse(b"-42"), LeaderChange::Ended { term: 42 });
        for odd in [&b"0"[..], b"17", b"-x", b"x\ny", b"\xff"] {
            assert_eq!(parse(odd), LeaderChange::Unknown, "{odd:?}");
        }
    }

    #[tokio::test]
    async fn an_inbox_keeps_order_and_bounds_what_it_keeps() {
        let inbox = Inbox::default();
        inbox.push(LeaderChange::Ended { term: 1 });
        inbox.push(LeaderChange::Ended { term: 2 });
        assert_eq!(inbox.next().await, LeaderChange::Ended { term: 1 });
        assert_eq!(inbox.next().await, LeaderChange::Ended { term: 2 });
        for term in 0..(INBOX as u64 + 5) {
            inbox.push(LeaderChange::Ended { term });
        }
        assert_eq!(inbox.next().await, LeaderChange::Unknown);
        inbox.push(LeaderChange::Unknown);
        inbox.push(LeaderChange::Ended { term: 7 });
        inbox.settle();
        let mut left = Vec::new();
        while let Ok(change) =
            tokio::time::timeout(std::time::Duration::from_millis(10), inbox.next()).await
        {
            left.push(change);
        }
        assert_eq!(
            left.first(),
            Some(&LeaderChange::Ended { term: INBOX as u64 })
        );
        assert!(!left.contains(&LeaderChange::Unknown));
        assert_eq!(left.last(), Some(&LeaderChange::Ended { term: 7 }));
    }

    #[tokio::test]
    async fn inboxes_reach_live_observers_and_forget_gone_ones() {
        let mut inboxes = Inboxes::default();
        let kept = inboxes.add();
        drop(inboxes.add());
        assert!(inboxes.deliver(&LeaderChange::Ended { term: 3 }));
        assert_eq!(kept.next().await, LeaderChange::Ended { term: 3 });
        drop(kept);
        assert!(!inboxes.deliver(&LeaderChange::Unknown), "nobody left");
    }
}
