//! How a wait that ran out without a "held" from the server ends: as
//! contention (`Timeout`) or as an outage (`Backend`, 503 through
//! `HttpError`).
//!
//! The rule (issue 68): at the deadline, if the server's last word about
//! the key was an answer ("held by another", or a grant to a waiter ahead
//! in this process's line), the wait ends as `Timeout`; if the wait never
//! got an answer, or everything since the last answer failed (refused,
//! reset, timed out, unanswered), it ends as `Backend` with the last
//! failure. A wait of any length: a 200 ms wait on a stopped server used to
//! end as `Timeout` because its one request was cut by the deadline, and
//! an HTTP handler answered 409 "in use" for an outage.
//!
//! What was heard is kept per key in the local line (`queue.rs`'s
//! `Hearing`), since only the front waiter of a process asks the server:
//! - a backend call reports, while it is out, each request it sends and
//!   each answer it hears (`backend/hearing.rs`: a task-local set around
//!   the call by `acquire.rs`; Redis, Redisson, PostgreSQL, MySQL,
//!   etcd and ZooKeeper locks report, a custom backend need not);
//! - a waiter that runs out in the line is told contention if a local
//!   holder has the key, if the line heard an answer during its wait, or
//!   if the call ahead is waiting after its "held"; an outage if the line's
//!   last word is a failure or the call ahead has had a request unanswered
//!   since before the waiter began (one sent during its wait may just be in
//!   flight); a zero wait that finds the line busy is `Busy`;
//! - a call cut by the deadline with nothing heard in it (the backends'
//!   `Unanswered`) is still contention if the line heard an answer during
//!   this wait (its turn came late, behind a holder): a short wait behind
//!   contention is never an outage.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::hearing;
use crate::backend::transient::Transient;
use crate::backend::LockBackend;
use crate::lease::queue::{KeySlot, Verdict};
use crate::lease::ride_through::RideThrough;
use crate::LockError;

/// Runs the backend call `call` for a waiter of `line`, so that what it
/// sends and hears (`backend/hearing.rs`) is the line's (cancel safe: the
/// mark of a call out goes when `call` is dropped).
pub(crate) async fn reporting_to<F: Future>(line: Arc<KeySlot>, call: F) -> F::Output {
    let calling = line.clone();
    let _out = calling.calling();
    hearing::listened(line, call).await
}

impl hearing::Listener for KeySlot {
    fn sending(&self) {
        KeySlot::sending(self);
    }

    fn answered(&self) {
        KeySlot::answered(self);
    }
}

/// A wait that ran out in this process's line for the key, before its
/// turn to ask the server: `Timeout` (`Ok(None)`) behind contention;
/// `Backend` when the line shows an outage (see the module docs).
pub(crate) fn in_line<T>(
    backend: &dyn LockBackend,
    verdict: Verdict,
) -> Result<Option<T>, LockError> {
    match verdict {
        Verdict::Contention => Ok(None),
        Verdict::Outage(why) => Err(LockError::backend(backend.describe(), Transient::new(why))),
    }
}

/// The backend call of a wait that began at `began` ended unanswered at the
/// deadline (`error`): `Ok` (the caller's `Timeout`) if the key's line
/// heard an answer from the server during this wait and nothing failed
/// since; else the last failure of this wait (its own message: a refused
/// connection says more than "no answer"), or `error`.
pub(crate) fn unanswered(
    line: &KeySlot,
    began: Instant,
    ride: &mut RideThrough,
    error: LockError,
) -> Result<(), LockError> {
    if line.answered_since(began) {
        return Ok(());
    }
    let failure = ride.take_last_failure().unwrap_or(error);
    line.failed(failure_text(&failure));
    Err(failure)
}

/// A failure as the line keeps it: the error's own message (a backend's
/// error shows its address with credentials redacted; its source is the
/// server's or the connection's word).
pub(crate) fn failure_text(error: &LockError) -> String {
    match error {
        LockError::Backend { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::transient::{is_unanswered, unanswered as silent};
    use crate::backends::memory::MemoryBackend;
    use crate::lease::queue::LocalQueue;

    fn ride(began: Instant) -> RideThrough {
        RideThrough::new(false, Some(began + Duration::from_secs(1)))
    }

    #[test]
    fn a_wait_that_heard_nothing_is_an_outage() {
        let queue = LocalQueue::default();
        let line = queue.slot("k");
        let began = Instant::now();
        let ended = unanswered(&line, began, &mut ride(began), silent("test://", began));
        assert!(is_unanswered(&ended.unwrap_err()));
        // The failure is the line's last word: a waiter that runs out in
        // the line behind it is told the outage too, not `Timeout`.
        let queued = in_line::<()>(&MemoryBackend::new(), line.verdict_in_line(began));
        let queued = queued.unwrap_err().to_string();
        assert!(queued.contains("no answer from the server"), "{queued}");
    }

    #[test]
    fn an_answer_to_the_line_during_the_wait_is_contention() {
        let queue = LocalQueue::default();
        let line = queue.slot("k");
        // Heard before the wait began: not this wait's word.
        line.answered();
        std::thread::sleep(Duration::from_millis(2));
        let began = Instant::now();
        let before = unanswered(&line, began, &mut ride(began), silent("test://", began));
        assert!(before.is_err(), "an answer before the wait counted");
        // Heard during the wait (a waiter ahead was told "held").
        let began = Instant::now();
        line.answered();
        assert!(unanswered(&line, began, &mut ride(began), silent("test://", began)).is_ok());
        assert_eq!(line.verdict_in_line(began), Verdict::Contention);
    }

    #[test]
    fn behind_a_call_that_heard_nothing_is_an_outage() {
        let queue = LocalQueue::default();
        let line = queue.slot("k");
        let call = line.calling();
        line.sending();
        let began = Instant::now();
        // A waiter that ran out behind it (a `join!` of waits on one key
        // during an outage) is told so.
        assert!(matches!(line.verdict_in_line(began), Verdict::Outage(_)));
        // The call heard "held" and waits on the server: contention, even
        // for a waiter that began after the answer.
        line.answered();
        std::thread::sleep(Duration::from_millis(2));
        let later = Instant::now();
        assert_eq!(line.verdict_in_line(later), Verdict::Contention);
        // Its next request unanswered, but an answer came during the
        // first waiter's wait: contention for it. For a waiter that began
        // after that request, in flight during its whole wait, an outage;
        // for one that began before it was sent, the request may just be
        // in flight: contention.
        line.sending();
        std::thread::sleep(Duration::from_millis(2));
        let latest = Instant::now();
        assert_eq!(line.verdict_in_line(began), Verdict::Contention);
        assert_eq!(line.verdict_in_line(later), Verdict::Contention);
        assert!(matches!(line.verdict_in_line(latest), Verdict::Outage(_)));
        // The call's end (or cancel) takes its silence with it.
        drop(call);
        assert_eq!(line.verdict_in_line(latest), Verdict::Contention);
    }

    #[tokio::test]
    async fn a_local_holder_is_contention_whatever_failed() {
        let queue = Arc::new(LocalQueue::default());
        let line = queue.slot("k");
        line.failed("reset".into());
        let began = Instant::now();
        let mut turn = queue.turn(line.clone(), true, None).await.expect("turn");
        turn.hold();
        assert_eq!(line.verdict_in_line(began), Verdict::Contention);
        // The hold's end is the line's answer: a wait during it was behind
        // contention.
        drop(turn);
        assert!(line.answered_since(began));
    }

    #[tokio::test]
    async fn reports_reach_the_line_only_inside_the_call() {
        let queue = LocalQueue::default();
        let line = queue.slot("k");
        let began = Instant::now();
        hearing::answered();
        assert!(!line.answered_since(began), "heard outside any call");
        reporting_to(line.clone(), async { hearing::answered() }).await;
        assert!(line.answered_since(began));
    }
}
