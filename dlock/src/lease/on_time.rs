//! A wait ends on time, however silent the server.
//!
//! Each backend bounds its own requests (a request timeout, 5 s by
//! default), and a waiting call is meant to end at its deadline. But a call
//! in flight when the deadline passes, on a server that answers nothing
//! (frozen, a dead flow), ran on to its request timeout: a 200 ms wait
//! ended after 5 s on PostgreSQL, MariaDB and Redis (a write lock), and
//! after 2.2 s on ZooKeeper. An HTTP handler with a short wait must answer
//! within about that wait.
//!
//! So the backend call of a waiting acquisition is cut [`PAST_THE_WAIT`]
//! after its deadline. Cutting is safe: every backend call is cancel-safe
//! (a dropped call leaves no queue entry, and a grant answered as it was
//! dropped is released in the background). The cut is an outage, not
//! contention: the server had been silent past the wait, so the result is
//! `Backend` (`Timeout` means a holder was seen). The margin is generous
//! so that a loaded but healthy server, which answers a wait that ran out
//! a few hundred milliseconds late, is still heard: then its answer
//! (usually `Timeout`) stands.
//!
//! A single attempt (`try_acquire`, a zero wait) and a wait without a
//! limit are left to the backend's own request limits.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::backend::deadline::saturating_add;
use crate::backend::transient::Transient;
use crate::LockError;

/// How long past its deadline a waiting backend call may stay unanswered
/// before it is cut.
pub(crate) const PAST_THE_WAIT: Duration = Duration::from_secs(1);

/// Runs `call`, a waiting backend call up to `deadline` (`None`: no limit,
/// or a single attempt), cut [`PAST_THE_WAIT`] after it as an outage of
/// the backend `describe` names.
pub(crate) async fn within_the_wait<T>(
    describe: impl FnOnce() -> String,
    deadline: Option<Instant>,
    call: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    let Some(deadline) = deadline else {
        return call.await;
    };
    let cut_at = saturating_add(deadline, PAST_THE_WAIT);
    match tokio::time::timeout_at(cut_at.into(), call).await {
        Ok(answer) => answer,
        Err(_) => Err(LockError::backend(
            describe(),
            Transient::new(format!(
                "no answer {PAST_THE_WAIT:?} after the wait ended: the server is silent"
            )),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_silent_past_the_wait_is_cut_as_an_outage() {
        let deadline = Instant::now() + Duration::from_millis(200);
        let started = tokio::time::Instant::now();
        let silent = std::future::pending::<Result<(), LockError>>();
        let err = within_the_wait(|| "test://silent".to_owned(), Some(deadline), silent)
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
        assert!(crate::backend::transient::is_transient(&err));
        assert!(err.to_string().contains("after the wait ended"), "{err}");
        let took = started.elapsed();
        assert!(took >= PAST_THE_WAIT, "{took:?}");
        assert!(
            took <= Duration::from_millis(250) + PAST_THE_WAIT,
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_late_within_the_margin_stands() {
        let deadline = Instant::now();
        let late = async {
            tokio::time::sleep(PAST_THE_WAIT / 2).await;
            Ok::<_, LockError>(7)
        };
        let answer = within_the_wait(|| unreachable!(), Some(deadline), late).await;
        assert_eq!(answer.unwrap(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn no_deadline_is_no_cut() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, LockError>(())
        };
        within_the_wait(|| unreachable!(), None, slow)
            .await
            .unwrap();
    }
}
