//! What a worker reports, one line per event on its stdout, stamped with [`crate::clock`].
//!
//! | line | meaning |
//! |---|---|
//! | `READY <t>` | connected, about to loop |
//! | `ACQ <n> <lock\|segment\|permit> <key> <fence or -> <start> <returned>` | holding `n` began: `acquire()` was called at `start` and returned at `returned` |
//! | `LOST <n> <t>` | holding `n`'s `lost()` resolved at `t` |
//! | `END <n> <released\|not-held\|release-error\|dropped> <called> <t>` | holding `n` ended: `release()` was called at `called` and returned (with that result) at `t`, or the guard was dropped (both times the drop) |
//! | `ERR <operation> <kind> <t>` | an operation failed; `kind` is the `LockError` variant or `store` |

use std::fmt;

/// Which primitive a holding came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HoldKind {
    /// A `Lock` on one of the plain keys.
    Lock,
    /// A segment of a `SegmentedLock`.
    Segment,
    /// A `Semaphore` permit.
    Permit,
}

impl HoldKind {
    /// The word in the event line.
    pub fn name(self) -> &'static str {
        match self {
            HoldKind::Lock => "lock",
            HoldKind::Segment => "segment",
            HoldKind::Permit => "permit",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [HoldKind::Lock, HoldKind::Segment, HoldKind::Permit]
            .into_iter()
            .find(|k| k.name() == name)
    }
}

/// How a holding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndHow {
    /// `release()` returned `Ok`.
    Released,
    /// `release()` returned `NotHeld`: the lease was already gone.
    NotHeld,
    /// `release()` failed otherwise (the lease then expires by its ttl).
    ReleaseError,
    /// The guard was dropped (released in the background).
    Dropped,
}

impl EndHow {
    /// The word in the event line.
    pub fn name(self) -> &'static str {
        match self {
            EndHow::Released => "released",
            EndHow::NotHeld => "not-held",
            EndHow::ReleaseError => "release-error",
            EndHow::Dropped => "dropped",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [
            EndHow::Released,
            EndHow::NotHeld,
            EndHow::ReleaseError,
            EndHow::Dropped,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }
}

/// One event of a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The worker is connected.
    Ready {
        /// When.
        t: u64,
    },
    /// A holding began.
    Acquired(Acquisition),
    /// A holding's `lost()` resolved.
    Lost {
        /// The holding.
        n: u64,
        /// When.
        t: u64,
    },
    /// A holding ended.
    Ended {
        /// The holding.
        n: u64,
        /// How.
        how: EndHow,
        /// When `release()` was called (or the guard dropped): from then on the worker no
        /// longer claims the lock.
        called: u64,
        /// When `release()` returned.
        t: u64,
    },
    /// An operation failed.
    Error {
        /// `connect`, `acquire`, `release` or `store`.
        op: String,
        /// The error's kind.
        kind: String,
        /// When.
        t: u64,
    },
}

/// How a holding began: what its `ACQ` line says, and where the checker's
/// [`Holding`](crate::checker::Holding) starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquisition {
    /// The holding's number within this worker process.
    pub n: u64,
    /// Lock, segment or permit.
    pub kind: HoldKind,
    /// The key held (a segment's own key, the semaphore's name).
    pub key: String,
    /// Its fencing token.
    pub fence: Option<u64>,
    /// When `acquire()` was called.
    pub start: u64,
    /// When it returned.
    pub returned: u64,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Ready { t } => write!(f, "READY {t}"),
            Event::Acquired(a) => {
                let fence = a.fence.map_or("-".to_string(), |x| x.to_string());
                write!(
                    f,
                    "ACQ {} {} {} {fence} {} {}",
                    a.n,
                    a.kind.name(),
                    a.key,
                    a.start,
                    a.returned
                )
            }
            Event::Lost { n, t } => write!(f, "LOST {n} {t}"),
            Event::Ended { n, how, called, t } => {
                write!(f, "END {n} {} {called} {t}", how.name())
            }
            Event::Error { op, kind, t } => write!(f, "ERR {op} {kind} {t}"),
        }
    }
}

impl Event {
    /// Parses a line written by `Display`; `None` for anything else (a worker's stray
    /// output is not an event).
    ///
    /// ```
    /// use dlock_torture::events::Event;
    /// let e = Event::Lost { n: 3, t: 99 };
    /// assert_eq!(Event::parse(&e.to_string()), Some(e));
    /// assert_eq!(Event::parse("hello"), None);
    /// ```
    pub fn parse(line: &str) -> Option<Event> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| s.parse::<u64>().ok();
        match w.as_slice() {
            ["READY", t] => Some(Event::Ready { t: num(t)? }),
            ["ACQ", n, kind, key, fence, start, returned] => Some(Event::Acquired(Acquisition {
                n: num(n)?,
                kind: HoldKind::from_name(kind)?,
                key: (*key).to_string(),
                fence: if *fence == "-" {
                    None
                } else {
                    Some(num(fence)?)
                },
                start: num(start)?,
                returned: num(returned)?,
            })),
            ["LOST", n, t] => Some(Event::Lost {
                n: num(n)?,
                t: num(t)?,
            }),
            ["END", n, how, called, t] => Some(Event::Ended {
                n: num(n)?,
                how: EndHow::from_name(how)?,
                called: num(called)?,
                t: num(t)?,
            }),
            ["ERR", op, kind, t] => Some(Event::Error {
                op: (*op).to_string(),
                kind: (*kind).to_string(),
                t: num(t)?,
            }),
            _ => None,
        }
    }
}
