//! What a [`CountDownLatch`](crate::CountDownLatch) tells operators: one
//! `dlock.latch` span per call, and the `dlock_latch_total` counter,
//! `dlock_latch_waiting` gauge and `dlock_latch_wait_seconds` histogram
//! (names in `crate::guide::observability`).

use std::sync::Arc;
use std::time::Instant;

use tracing::field::Empty;
use tracing::Span;

/// Which latch call: the `op` field and label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LatchOp {
    SetCount,
    CountDown,
    Count,
    WaitZero,
}

impl LatchOp {
    fn as_str(self) -> &'static str {
        match self {
            LatchOp::SetCount => "set_count",
            LatchOp::CountDown => "count_down",
            LatchOp::Count => "count",
            LatchOp::WaitZero => "wait_zero",
        }
    }
}

/// How a latch call ended: the `outcome` field and label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LatchOutcome {
    /// `try_set_count` set the count.
    Set,
    /// `try_set_count` found a live count.
    Live,
    /// `count_down` or `count` answered.
    Done,
    /// `wait_zero` saw zero.
    Zero,
    Timeout,
    Error,
    /// The caller dropped the future before it ended.
    Cancelled,
}

impl LatchOutcome {
    fn as_str(self) -> &'static str {
        match self {
            LatchOutcome::Set => "set",
            LatchOutcome::Live => "live",
            LatchOutcome::Done => "done",
            LatchOutcome::Zero => "zero",
            LatchOutcome::Timeout => "timeout",
            LatchOutcome::Error => "error",
            LatchOutcome::Cancelled => "cancelled",
        }
    }
}

/// One latch call under watch; dropped unfinished, it counts as cancelled.
pub(crate) struct LatchCall {
    span: Span,
    start: Instant,
    backend: Arc<str>,
    op: LatchOp,
    finished: bool,
}

impl LatchCall {
    pub(crate) fn start(op: LatchOp, name: &str, backend: Arc<str>) -> Self {
        let span = tracing::debug_span!(
            "dlock.latch",
            latch = %name,
            backend = &*backend,
            op = op.as_str(),
            count = Empty,
            outcome = Empty,
            waited_us = Empty,
        );
        if op == LatchOp::WaitZero {
            metrics::waiting(&backend, 1.0);
        }
        LatchCall {
            span,
            start: Instant::now(),
            backend,
            op,
            finished: false,
        }
    }

    /// The span to run the call in.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Records a count the call set or read.
    pub(crate) fn count(&self, count: u64) {
        self.span.record("count", count);
    }

    /// Records how the call ended.
    pub(crate) fn finish(mut self, outcome: LatchOutcome) {
        self.end(outcome);
    }

    fn end(&mut self, outcome: LatchOutcome) {
        self.finished = true;
        let waited = self.start.elapsed();
        if !self.span.is_disabled() {
            self.span.record("outcome", outcome.as_str());
            self.span.record(
                "waited_us",
                u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
            );
        }
        if self.op == LatchOp::WaitZero {
            metrics::waiting(&self.backend, -1.0);
            if outcome == LatchOutcome::Zero {
                metrics::waited(&self.backend, waited);
            }
        }
        metrics::called(&self.backend, self.op, outcome);
    }
}

impl Drop for LatchCall {
    fn drop(&mut self) {
        if !self.finished {
            self.end(LatchOutcome::Cancelled);
        }
    }
}

/// Emits every span and metric of this file once (for the test that
/// nothing allocates when nobody listens).
pub(crate) fn everything_once(backend: &Arc<str>) {
    let call = LatchCall::start(LatchOp::WaitZero, "quiet", backend.clone());
    drop(call.span().clone().entered());
    call.count(3);
    call.finish(LatchOutcome::Zero);
    drop(LatchCall::start(
        LatchOp::SetCount,
        "quiet",
        backend.clone(),
    ));
}

#[cfg(feature = "metrics")]
mod metrics {
    use std::sync::Arc;
    use std::time::Duration;

    use metrics::SharedString;

    use super::{LatchOp, LatchOutcome};

    fn label(backend: &Arc<str>) -> SharedString {
        SharedString::from_shared(backend.clone())
    }

    pub(super) fn called(backend: &Arc<str>, op: LatchOp, outcome: LatchOutcome) {
        metrics::counter!(
            "dlock_latch_total",
            "backend" => label(backend), "op" => op.as_str(), "outcome" => outcome.as_str()
        )
        .increment(1);
    }

    pub(super) fn waiting(backend: &Arc<str>, delta: f64) {
        metrics::gauge!("dlock_latch_waiting", "backend" => label(backend)).increment(delta);
    }

    pub(super) fn waited(backend: &Arc<str>, waited: Duration) {
        metrics::histogram!("dlock_latch_wait_seconds", "backend" => label(backend))
            .record(waited.as_secs_f64());
    }
}

#[cfg(not(feature = "metrics"))]
mod metrics {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{LatchOp, LatchOutcome};

    pub(super) fn called(_: &Arc<str>, _: LatchOp, _: LatchOutcome) {}
    pub(super) fn waiting(_: &Arc<str>, _: f64) {}
    pub(super) fn waited(_: &Arc<str>, _: Duration) {}
}
