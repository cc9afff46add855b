//! Outage or contention, whatever the wait: how a wait that runs out tells
//! a server that answers nothing from a key that is taken.
//!
//! `Timeout` tells the caller "a holder was seen" (409 through `HttpError`),
//! `Backend` "the service failed" (503). A wait that ends while a request of
//! it is still unanswered has seen no holder: if the server has been silent
//! for [`SILENT_FOR`], the end is an outage. A wait shorter than that cannot
//! tell a frozen server from a loaded machine at its deadline, so the
//! request is given the rest of [`SILENT_FOR`]: a late answer is used (a
//! grant is kept, "taken" ends the wait as `Timeout`), silence is an
//! outage. So a short wait on a silent server ends as `Backend` at most
//! [`SILENT_FOR`] after the request went out, and a short wait on a healthy
//! server (which answers in a millisecond, a loaded one in tens) ends on
//! time as `Timeout`.

#[cfg(feature = "redis")]
use std::future::Future;
use std::time::Duration;
#[cfg(feature = "redis")]
use std::time::Instant;

/// How long a wait's request may go unanswered before the wait's end is an
/// outage rather than a timeout.
pub(crate) const SILENT_FOR: Duration = Duration::from_millis(250);

/// What a request still in flight when its wait ran out came to.
#[cfg(feature = "redis")]
pub(crate) enum Late<T> {
    /// It was answered within [`SILENT_FOR`] of being sent.
    Answered(T),
    /// It was not: the server is silent (for how long, since it was sent).
    Silent(Duration),
}

/// Gives `request`, sent at `sent` and still unanswered when its wait ran
/// out, the rest of [`SILENT_FOR`] since `sent` (dropping it after that).
#[cfg(feature = "redis")]
pub(crate) async fn rest_of_silence<T>(sent: Instant, request: impl Future<Output = T>) -> Late<T> {
    let until = sent + SILENT_FOR;
    match tokio::time::timeout_at(until.into(), request).await {
        Ok(answer) => Late::Answered(answer),
        Err(_) => Late::Silent(sent.elapsed()),
    }
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_late_answer_within_the_silence_is_used_and_silence_is_an_outage() {
        let sent = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let late = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            7
        };
        assert!(matches!(
            rest_of_silence(sent, late).await,
            Late::Answered(7)
        ));
        // The timer is tokio's (paused here), the stamps std's: the wait
        // lasts the rest of the silence on tokio's clock.
        let silent = std::future::pending::<u8>();
        let before = tokio::time::Instant::now();
        let late = rest_of_silence(sent, silent).await;
        assert!(
            matches!(late, Late::Silent(_)),
            "a pending request answered"
        );
        let waited = before.elapsed();
        assert!(waited <= SILENT_FOR, "{waited:?}");
    }
}
