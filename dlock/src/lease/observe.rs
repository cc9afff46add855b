//! What dlock tells operators: `tracing` spans and events, and metrics
//! through the `metrics` facade (cargo feature `metrics`). Names, fields and
//! labels are listed in `crate::guide::observability`; this module
//! is the only place that emits them.
//!
//! Nothing here allocates when nobody listens: span fields are recorded
//! only on enabled spans, and without the `metrics` feature the metric
//! calls compile to nothing. Keys are never metric labels (they are
//! unbounded); they go on spans and events only.

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use tracing::field::Empty;
use tracing::{Instrument, Span};

pub(crate) mod latch;
pub(crate) mod operation;

/// What kind of lease an operation is about: the `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lock,
    Segment,
    Permit,
    /// A read lease of a read-write lock.
    Read,
    /// A write lease of a read-write lock.
    Write,
    /// A member of a double barrier.
    Barrier,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Segment => "segment",
            Kind::Permit => "permit",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Barrier => "barrier",
        }
    }
}

/// How an acquisition ended: the `outcome` field and label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired,
    Reentered,
    /// Held by someone else: a zero wait, or a `try_acquire` that found it held.
    Busy,
    Timeout,
    Error,
    /// The caller dropped the acquire future before it ended.
    Cancelled,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Reentered => "reentered",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// Why a lease was lost: the `reason` field and label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// The server answered that the lease is no longer ours.
    Refused,
    /// The key was deleted behind the holder's back.
    Deleted,
    /// The session (etcd lease, ZooKeeper session) that carried it ended.
    SessionExpired,
    /// No renewal succeeded before the local deadline.
    Unreachable,
    /// Renewal was off and the ttl ran out.
    Expired,
}

impl LossReason {
    fn as_str(self) -> &'static str {
        match self {
            LossReason::Refused => "refused",
            LossReason::Deleted => "deleted",
            LossReason::SessionExpired => "session_expired",
            LossReason::Unreachable => "unreachable",
            LossReason::Expired => "expired",
        }
    }
}

/// Why a lease that was granted was given back instead of being handed to
/// the caller: the `reason` field and label of a stale grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StaleReason {
    /// The backend's answer arrived after the lease's local deadline (a
    /// reply slower than the ttl): the server may have expired it already.
    LateAnswer,
    /// One key of a [`MultiLock`](crate::MultiLock) was not live once every
    /// key was taken: it lapsed or was lost while the acquisition waited
    /// for another key, or its answer came late.
    Lapsed,
}

impl StaleReason {
    fn as_str(self) -> &'static str {
        match self {
            StaleReason::LateAnswer => "late_answer",
            StaleReason::Lapsed => "lapsed",
        }
    }
}

/// A lease was granted but not handed over, because it was no longer live
/// at that instant (the hand-over rule in `lease`'s module docs): a `WARN`
/// event and the `dlock_stale_grants_total` counter. The acquisition gives
/// it back and tries again within its wait.
pub(crate) fn stale_grant(
    key: &str,
    backend: &Arc<str>,
    kind: Kind,
    reason: StaleReason,
    late_by: Duration,
) {
    tracing::warn!(
        key = %key,
        backend = &**backend,
        kind = kind.as_str(),
        reason = reason.as_str(),
        late_by_ms = millis(late_by),
        "dlock: a lease was no longer live when it would have been handed over; given back, trying again within the wait"
    );
    metrics::stale(backend, kind, reason);
}

/// The `backend` label of locks that use the registry's default backend.
pub(crate) static DEFAULT_BACKEND: LazyLock<Arc<str>> =
    LazyLock::new(|| Arc::from(crate::registry::DEFAULT_NAME));

/// One acquisition under watch: its `dlock.acquire` span, when it started,
/// and its place in the `dlock_waiting` gauge. Dropped unfinished, it
/// counts as cancelled.
pub(crate) struct Acquisition {
    span: Span,
    start: Instant,
    backend: Arc<str>,
    kind: Kind,
    finished: bool,
}

impl Acquisition {
    pub(crate) fn start(
        kind: Kind,
        key: &str,
        backend: Arc<str>,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Self {
        let span = tracing::debug_span!(
            "dlock.acquire",
            key = %key,
            backend = &*backend,
            kind = kind.as_str(),
            ttl_ms = millis(ttl),
            wait_ms = wait.map(millis),
            outcome = Empty,
            waited_us = Empty,
            fence = Empty,
        );
        metrics::waiting(&backend, kind, 1.0);
        Acquisition {
            span,
            start: Instant::now(),
            backend,
            kind,
            finished: false,
        }
    }

    /// The span to run the acquisition in.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Records how the acquisition ended.
    pub(crate) fn finish(mut self, outcome: Outcome, fence: Option<u64>) {
        self.end(outcome, fence);
    }

    fn end(&mut self, outcome: Outcome, fence: Option<u64>) {
        self.finished = true;
        let waited = self.start.elapsed();
        if !self.span.is_disabled() {
            self.span.record("outcome", outcome.as_str());
            self.span.record("waited_us", micros(waited));
            if let Some(fence) = fence {
                self.span.record("fence", fence);
            }
        }
        metrics::waiting(&self.backend, self.kind, -1.0);
        metrics::acquired(&self.backend, self.kind, outcome, waited);
    }
}

impl Drop for Acquisition {
    fn drop(&mut self) {
        if !self.finished {
            self.end(Outcome::Cancelled, None);
        }
    }
}

/// Runs `work` (an acquisition that gives `Some` when it got the lease) in
/// the span of `watch`, and records how it ended: `what` tells, of a lease,
/// whether it re-entered and its fence. `once`: a single attempt, whose
/// `None` is `busy` rather than `timeout`.
pub(crate) async fn watched<T>(
    watch: Acquisition,
    once: bool,
    work: impl Future<Output = Result<Option<T>, crate::LockError>>,
    what: impl Fn(&T) -> (bool, Option<u64>),
) -> Result<Option<T>, crate::LockError> {
    let result = work.instrument(watch.span().clone()).await;
    let (outcome, fence) = match &result {
        Ok(Some(held)) => match what(held) {
            (true, fence) => (Outcome::Reentered, fence),
            (false, fence) => (Outcome::Acquired, fence),
        },
        Ok(None) if once => (Outcome::Busy, None),
        Ok(None) => (Outcome::Timeout, None),
        Err(_) => (Outcome::Error, None),
    };
    watch.finish(outcome, fence);
    result
}

/// The `dlock.acquire_all` span of one [`MultiLock`](crate::MultiLock)
/// acquisition: the parent of one `dlock.acquire` span per key taken, so an
/// operator sees which key a slow or failed multi-key acquire waited on.
pub(crate) fn acquire_all_span(keys: &[String], backend: &str, wait: Option<Duration>) -> Span {
    tracing::debug_span!(
        "dlock.acquire_all",
        keys = %KeyList(keys),
        count = keys.len(),
        backend = backend,
        wait_ms = wait.map(millis),
        outcome = Empty,
        blocked_on = Empty,
        waited_us = Empty,
    )
}

/// Records how a multi-key acquisition ended on its span: `blocked_on`
/// names the key that was busy, timed out or failed.
pub(crate) fn acquired_all(span: &Span, start: Instant, outcome: &str, blocked_on: Option<&str>) {
    if !span.is_disabled() {
        span.record("outcome", outcome);
        span.record("waited_us", micros(start.elapsed()));
        if let Some(key) = blocked_on {
            span.record("blocked_on", key);
        }
    }
}

/// Keys as `a, b, c`, formatted only when a subscriber records them.
struct KeyList<'a>(&'a [String]);

impl std::fmt::Display for KeyList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, key) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(key)?;
        }
        Ok(())
    }
}

/// What a held lease needs to report its hold and its loss.
#[derive(Debug)]
pub(crate) struct Holding {
    pub(crate) backend: Arc<str>,
    pub(crate) kind: Kind,
    since: Instant,
}

impl Holding {
    /// A lease became held: counted in `dlock_held_leases`.
    pub(crate) fn begin(backend: Arc<str>, kind: Kind) -> Self {
        metrics::held(&backend, kind, 1.0);
        Holding {
            backend,
            kind,
            since: Instant::now(),
        }
    }

    /// The lease stopped being held (released or lost): its hold time.
    pub(crate) fn end(&self) {
        metrics::held(&self.backend, self.kind, -1.0);
        metrics::hold_time(&self.backend, self.kind, self.since.elapsed());
    }

    /// The lease was lost: a `WARN` event and the `dlock_lost_total` counter.
    pub(crate) fn lost(&self, key: &str, fence: Option<u64>, reason: LossReason) {
        tracing::warn!(
            key = %key,
            fence,
            held_for_ms = millis(self.since.elapsed()),
            reason = reason.as_str(),
            backend = &*self.backend,
            "dlock: lease lost; stop the work it guards"
        );
        metrics::lost(&self.backend, self.kind, reason);
    }
}

/// The `dlock.release` span of one release.
pub(crate) fn release_span(key: &str, backend: &str, kind: Kind) -> Span {
    tracing::debug_span!(
        "dlock.release",
        key = %key,
        backend,
        kind = kind.as_str(),
        outcome = Empty,
    )
}

/// Records a release's outcome on its span.
pub(crate) fn released(span: &Span, outcome: &Result<(), crate::LockError>) {
    if !span.is_disabled() {
        let outcome = match outcome {
            Ok(()) => "released",
            Err(crate::LockError::NotHeld { .. }) => "not_held",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
    }
}

/// The `dlock.renew` span of one watchdog batch.
pub(crate) fn renew_span(backend: &str, leases: usize) -> Span {
    tracing::debug_span!(
        "dlock.renew",
        backend,
        leases = leases as u64,
        renewed = Empty,
        failed = Empty,
    )
}

/// How one renewal batch went, lease by lease.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RenewCounts {
    pub(crate) renewed: u64,
    /// The server said no: the lease is lost.
    pub(crate) refused: u64,
    /// The backend failed; the lease is tried again until its deadline.
    pub(crate) failed: u64,
    /// No answer before the batch's earliest deadline.
    pub(crate) timeout: u64,
}

/// Records one renewal batch: its span's counts, and its metrics.
pub(crate) fn renewed(span: &Span, backend: &Arc<str>, took: Duration, counts: RenewCounts) {
    if !span.is_disabled() {
        span.record("renewed", counts.renewed);
        span.record("failed", counts.refused + counts.failed + counts.timeout);
    }
    metrics::renewals(backend, took, counts);
}

/// The `dlock.held` span a `#[distributed_lock]` body runs in, so every
/// event the body logs carries the key and the fence that guard it.
pub(crate) fn held_span(key: &str, fence: Option<u64>) -> Span {
    tracing::info_span!("dlock.held", key = %key, fence)
}

/// A held key as the `dlock.held` span of several keys shows it (the lock
/// kinds' guards are one; this layer does not know them).
pub(crate) trait HeldKey {
    fn held_key(&self) -> &str;
    fn held_fence(&self) -> Option<u64>;
}

/// A key and its fence, as they are.
impl HeldKey for (&str, Option<u64>) {
    fn held_key(&self) -> &str {
        self.0
    }

    fn held_fence(&self) -> Option<u64> {
        self.1
    }
}

/// The `dlock.held` span a `#[distributed_lock(keys = ..)]` body runs in:
/// every key and its fence.
pub(crate) fn held_all_span<G: HeldKey>(guards: &[G]) -> Span {
    let held = HeldKeys(guards);
    tracing::info_span!("dlock.held", keys = %held, count = held.0.len())
}

/// Held keys as `a (fence 7), b (fence 9)`, formatted only when a
/// subscriber records them.
struct HeldKeys<'a, G>(&'a [G]);

impl<G: HeldKey> std::fmt::Display for HeldKeys<'_, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, guard) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match guard.held_fence() {
                Some(fence) => write!(f, "{} (fence {fence})", guard.held_key())?,
                None => f.write_str(guard.held_key())?,
            }
        }
        Ok(())
    }
}

/// The `dlock.campaign` span of one [`Election::campaign`](crate::Election::campaign).
pub(crate) fn campaign_span(election: &str, backend: &str) -> Span {
    tracing::debug_span!(
        "dlock.campaign",
        election = %election,
        backend,
        outcome = Empty,
        term = Empty,
    )
}

/// How a campaign ended: its span's `outcome` and `term`; when elected, an
/// `INFO` event, `dlock_leader` = 1, `dlock_elections_total` + 1 and
/// `dlock_leader_term` = the term.
pub(crate) fn campaigned(span: &Span, backend: &Arc<str>, election: &str, term: Option<u64>) {
    if !span.is_disabled() {
        span.record("outcome", if term.is_some() { "elected" } else { "error" });
        if let Some(term) = term {
            span.record("term", term);
        }
    }
    if let Some(term) = term {
        tracing::info!(election = %election, term, backend = &**backend, "dlock: elected leader");
        metrics::elected(backend, election, term);
    }
}

/// A leadership ended (`reason`: `resigned` or `lost`): an `INFO` event
/// (`WARN` for a loss) and `dlock_leader` = 0.
pub(crate) fn leadership_ended(
    backend: &Arc<str>,
    election: &str,
    term: u64,
    reason: &'static str,
) {
    if reason == "lost" {
        tracing::warn!(election = %election, term, backend = &**backend, reason, "dlock: leadership lost; stop acting as the leader");
    } else {
        tracing::info!(election = %election, term, backend = &**backend, reason, "dlock: leadership ended");
    }
    metrics::leader(backend, election, 0.0);
}

/// Emits every span, event and metric of this module once, as the core
/// does: for the test that no heap allocation happens when nobody listens
/// (`dlock/tests/quiet_observability.rs`, through `__private`).
pub(crate) fn everything_once() {
    let backend: Arc<str> = DEFAULT_BACKEND.clone();
    let watch = Acquisition::start(
        Kind::Lock,
        "quiet",
        backend.clone(),
        Duration::from_secs(30),
        Some(Duration::from_secs(5)),
    );
    let span = watch.span().clone();
    drop(span.enter());
    watch.finish(Outcome::Acquired, Some(7));
    drop(Acquisition::start(
        Kind::Permit,
        "quiet",
        backend.clone(),
        Duration::from_secs(1),
        None,
    ));
    let holding = Holding::begin(backend.clone(), Kind::Segment);
    holding.end();
    holding.lost("quiet", Some(7), LossReason::Deleted);
    stale_grant(
        "quiet",
        &backend,
        Kind::Lock,
        StaleReason::LateAnswer,
        Duration::from_millis(3),
    );
    let release = release_span("quiet", &backend, Kind::Lock);
    released(&release, &Ok(()));
    let renew = renew_span(&backend, 3);
    renewed(
        &renew,
        &backend,
        Duration::from_millis(1),
        RenewCounts::default(),
    );
    drop(held_span("quiet", Some(7)).enter());
    // No keys: a `String` made here would be this function's own allocation.
    let all = acquire_all_span(&[], &backend, None);
    acquired_all(&all, Instant::now(), "timeout", Some("quiet"));
    drop(held_all_span::<(&str, Option<u64>)>(&[]).enter());
    latch::everything_once(&backend);
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The metric calls: real with the `metrics` feature, nothing without.
#[cfg(feature = "metrics")]
mod metrics {
    use std::sync::Arc;
    use std::time::Duration;

    use metrics::SharedString;

    use super::{Kind, LossReason, Outcome, RenewCounts, StaleReason};

    fn label(backend: &Arc<str>) -> SharedString {
        SharedString::from_shared(backend.clone())
    }

    pub(super) fn waiting(backend: &Arc<str>, kind: Kind, delta: f64) {
        metrics::gauge!("dlock_waiting", "backend" => label(backend), "kind" => kind.as_str())
            .increment(delta);
    }

    pub(super) fn acquired(backend: &Arc<str>, kind: Kind, outcome: Outcome, waited: Duration) {
        metrics::counter!(
            "dlock_acquire_total",
            "backend" => label(backend), "kind" => kind.as_str(), "outcome" => outcome.as_str()
        )
        .increment(1);
        if matches!(outcome, Outcome::Acquired | Outcome::Reentered) {
            metrics::histogram!(
                "dlock_acquire_wait_seconds",
                "backend" => label(backend), "kind" => kind.as_str()
            )
            .record(waited.as_secs_f64());
        }
    }

    pub(super) fn held(backend: &Arc<str>, kind: Kind, delta: f64) {
        metrics::gauge!("dlock_held_leases", "backend" => label(backend), "kind" => kind.as_str())
            .increment(delta);
    }

    pub(super) fn hold_time(backend: &Arc<str>, kind: Kind, held: Duration) {
        metrics::histogram!("dlock_hold_seconds", "backend" => label(backend), "kind" => kind.as_str())
            .record(held.as_secs_f64());
    }

    pub(super) fn lost(backend: &Arc<str>, kind: Kind, reason: LossReason) {
        metrics::counter!(
            "dlock_lost_total",
            "backend" => label(backend), "kind" => kind.as_str(), "reason" => reason.as_str()
        )
        .increment(1);
    }

    pub(super) fn stale(backend: &Arc<str>, kind: Kind, reason: StaleReason) {
        metrics::counter!(
            "dlock_stale_grants_total",
            "backend" => label(backend), "kind" => kind.as_str(), "reason" => reason.as_str()
        )
        .increment(1);
    }

    pub(super) fn renewals(backend: &Arc<str>, took: Duration, counts: RenewCounts) {
        metrics::histogram!("dlock_renew_seconds", "backend" => label(backend))
            .record(took.as_secs_f64());
        for (outcome, n) in [
            ("renewed", counts.renewed),
            ("refused", counts.refused),
            ("failed", counts.failed),
            ("timeout", counts.timeout),
        ] {
            if n > 0 {
                metrics::counter!("dlock_renew_total", "backend" => label(backend), "outcome" => outcome)
                    .increment(n);
            }
        }
    }

    /// An election's name is its label: elections are few and named in
    /// code, unlike lock keys.
    pub(super) fn elected(backend: &Arc<str>, election: &str, term: u64) {
        leader(backend, election, 1.0);
        metrics::counter!("dlock_elections_total", "backend" => label(backend), "election" => election.to_owned())
            .increment(1);
        metrics::counter!("dlock_leader_term", "backend" => label(backend), "election" => election.to_owned())
            .absolute(term);
    }

    pub(super) fn leader(backend: &Arc<str>, election: &str, value: f64) {
        metrics::gauge!("dlock_leader", "backend" => label(backend), "election" => election.to_owned())
            .set(value);
    }
}

#[cfg(not(feature = "metrics"))]
mod metrics {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Kind, LossReason, Outcome, RenewCounts, StaleReason};

    pub(super) fn waiting(_: &Arc<str>, _: Kind, _: f64) {}
    pub(super) fn acquired(_: &Arc<str>, _: Kind, _: Outcome, _: Duration) {}
    pub(super) fn held(_: &Arc<str>, _: Kind, _: f64) {}
    pub(super) fn hold_time(_: &Arc<str>, _: Kind, _: Duration) {}
    pub(super) fn lost(_: &Arc<str>, _: Kind, _: LossReason) {}
    pub(super) fn stale(_: &Arc<str>, _: Kind, _: StaleReason) {}
    pub(super) fn renewals(_: &Arc<str>, _: Duration, _: RenewCounts) {}
    pub(super) fn elected(_: &Arc<str>, _: &str, _: u64) {}
    pub(super) fn leader(_: &Arc<str>, _: &str, _: f64) {}
}
