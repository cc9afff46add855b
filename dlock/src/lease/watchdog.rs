//! Renewal of live leases, batched per backend, and the lost-lease deadline.
//!
//! One watchdog task per backend (not one per guard) wakes when the earliest
//! lease is due and renews every lease that is due, or nearly due, in one
//! `LockBackend::renew` call. The leases are kept in time order (see
//! `watchdog/schedule.rs`), so a wake-up costs the leases it concerns, not
//! every lease of the backend. The same task marks a lease lost when its local
//! deadline passes without a successful renewal, so `lost()` fires on time
//! even while a renewal hangs on a dead connection.
//!
//! The task runs on dlock's background runtime, not on the runtime that took
//! a lease: a lease of any runtime is renewed, or reported lost by its
//! deadline, even while that runtime is idle or gone. Its arithmetic
//! saturates, so no lease's values (a ttl of `Duration::MAX` given to a
//! backend directly) can make it panic and stop renewing the others.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinSet;

use tracing::Instrument;

use crate::backend::deadline::saturating_add;
use crate::backend::suspend::{self, SuspendClock};
use crate::backend::{Lease, LockBackend, Renewal};
use crate::lease::held::{release_on, renew_on, LeaseKind, LeaseShared, Status};
use crate::lease::observe::{self, LossReason, RenewCounts};
use crate::LockError;

mod schedule;

use schedule::{id, Scanned, Schedule};

/// The renewals of one backend.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    state: Mutex<WatchdogState>,
    wake: Arc<Notify>,
    /// The backend's loss alarm (`LockBackend::loss_alarm`), subscribed
    /// when the watchdog is made so that no alarm is missed while no task
    /// runs; each task works on a copy and marks here what it answered.
    alarm: Mutex<Option<tokio::sync::watch::Receiver<u64>>>,
    /// A test's clock of suspends instead of the process's.
    #[cfg(test)]
    clock: Option<&'static SuspendClock>,
}

#[derive(Debug, Default)]
struct WatchdogState {
    leases: Schedule,
    running: bool,
    /// When the task will next look, if it is asleep: a new lease due
    /// earlier must wake it; one due later need not (no cross-thread wake-up
    /// on the hot path of every acquire).
    sleeping_until: Option<Instant>,
    /// The suspends of the host seen so far (`SuspendClock::suspends`).
    suspends_seen: u64,
}

/// How often a watchdog with leases looks whether the host was suspended:
/// its timers are monotonic and stand still in a suspend, so without a look
/// `lost()` would wait for the next renewal (up to ttl/3) after the resume.
/// Where suspends cannot be measured, no look.
#[cfg(target_os = "linux")]
const SUSPEND_LOOK: Option<Duration> = Some(Duration::from_secs(1));
#[cfg(not(target_os = "linux"))]
const SUSPEND_LOOK: Option<Duration> = None;

/// How long an idle watchdog task stays around for the next lease, so a
/// steady stream of short critical sections does not spawn one per lease.
const IDLE_LINGER: Duration = Duration::from_secs(5);

/// How soon a failed renewal is tried again: often enough to catch a server
/// that comes back, rarely enough not to hammer one that is down.
fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// One renewal batch that came back: its leases, when it was sent, the
/// backend's answers (`Err`: none before the batch's earliest deadline), and
/// its `dlock.renew` span.
struct RenewResult {
    batch: Vec<Arc<LeaseShared>>,
    sent: Instant,
    answers: Result<Vec<Result<Renewal, LockError>>, ()>,
    span: tracing::Span,
}

impl Watchdog {
    /// The watchdog of a backend whose loss alarm is `alarm`.
    pub(crate) fn new(alarm: Option<tokio::sync::watch::Receiver<u64>>) -> Self {
        Watchdog {
            alarm: Mutex::new(alarm),
            ..Watchdog::default()
        }
    }

    /// A watchdog whose suspends come from `clock` (a test's).
    #[cfg(test)]
    fn with_clock(clock: &'static SuspendClock) -> Self {
        Watchdog {
            clock: Some(clock),
            ..Watchdog::default()
        }
    }

    fn clock(&self) -> &SuspendClock {
        #[cfg(test)]
        if let Some(clock) = self.clock {
            return clock;
        }
        suspend::system_clock()
    }

    fn lock_state(&self) -> MutexGuard<'_, WatchdogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts watching `lease` (again, after its times changed: an
    /// extension); spawns the watchdog task on dlock's background runtime
    /// if none runs.
    pub(crate) fn register(self: &Arc<Self>, lease: &Arc<LeaseShared>) {
        let mut state = self.lock_state();
        let first_event = state.leases.insert(lease);
        if !state.running {
            state.running = true;
            state.sleeping_until = None;
            let me = self.clone();
            crate::lease::background::spawn_daemon(async move { me.run().await });
            return;
        }
        let wake = state.sleeping_until.is_none_or(|at| first_event < at);
        drop(state);
        if wake {
            self.wake.notify_one();
        }
    }

    /// Stops watching `lease` (it was released).
    pub(crate) fn deregister(&self, lease: &LeaseShared) {
        self.lock_state().leases.remove(id(lease));
    }

    /// Stops watching every lease and returns them (`dlock::shutdown`).
    pub(crate) fn take_all(&self) -> Vec<Arc<LeaseShared>> {
        self.lock_state().leases.drain()
    }

    /// How many leases this watchdog keeps alive.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock_state().leases.len()
    }

    async fn run(self: Arc<Self>) {
        let mut idle_since: Option<Instant> = None;
        // If the runtime shuts down under us, let a later registration start
        // a new task instead of trusting one that is gone.
        let mut stopped = StoppedOnDrop {
            watchdog: &self,
            armed: true,
        };
        let mut in_flight: JoinSet<RenewResult> = JoinSet::new();
        // The backend's alarm, as of the last one a task of this watchdog
        // answered: one raised while no task ran (between a grant and
        // here) still counts.
        let mut alarm = self.alarm.lock().unwrap_or_else(|p| p.into_inner()).clone();
        loop {
            let idle_for = idle_since.map(|t| t.elapsed());
            let Some((due, next_event)) = self.scan(!in_flight.is_empty(), idle_for) else {
                // `scan` already marked the watchdog stopped, under its lock.
                stopped.armed = false;
                return;
            };
            if !due.is_empty() {
                // Each kind of lease renews through its own backend call
                // (locks, permits, read and write leases): one batch per kind.
                for batch in by_kind(due) {
                    Self::start_renewal(&mut in_flight, batch);
                }
                continue;
            }
            // Nothing to watch: linger a while for the next lease, then end.
            let next_event = match next_event {
                Some(at) => {
                    idle_since = None;
                    let look = SUSPEND_LOOK.map(|every| saturating_add(Instant::now(), every));
                    Some(look.map_or(at, |look| at.min(look)))
                }
                None if in_flight.is_empty() => {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    Some(saturating_add(since, IDLE_LINGER))
                }
                None => None,
            };
            self.lock_state().sleeping_until = next_event;
            tokio::select! {
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    if let Ok(result) = done {
                        self.apply(result);
                    }
                }
                _ = sleep_until(next_event) => {}
                _ = self.wake.notified() => {}
                changed = changed(alarm.as_mut()) => {
                    if changed {
                        self.renew_all_now();
                        // Answered: the next task need not answer it again.
                        *self.alarm.lock().unwrap_or_else(|p| p.into_inner()) = alarm.clone();
                    } else {
                        alarm = None;
                    }
                }
            }
        }
    }

    /// Makes every renewed lease due now: the backend raised its alarm.
    fn renew_all_now(&self) {
        self.lock_state().leases.all_due(Instant::now());
    }

    /// Marks overdue leases lost, forgets finished ones, and returns the
    /// leases to renew now plus when to look again. `None` ends the task.
    fn scan(
        &self,
        busy: bool,
        idle_for: Option<Duration>,
    ) -> Option<(Vec<Arc<LeaseShared>>, Option<Instant>)> {
        let mut state = self.lock_state();
        state.sleeping_until = None;
        // After a suspend, first the leases it ended: their deadlines are
        // still ahead on the monotonic clock the schedule keeps.
        let mut lapsed = Vec::new();
        let suspends = self.clock().suspends();
        if suspends != state.suspends_seen {
            state.suspends_seen = suspends;
            lapsed = state.leases.overdue_after_suspend(self.clock());
        }
        let Scanned {
            due,
            mut overdue,
            next,
        } = state.leases.scan(Instant::now(), busy);
        overdue.append(&mut lapsed);
        for shared in overdue {
            let expired = shared.lock_state().lease.clone();
            shared.mark_lost(if shared.renew {
                LossReason::Unreachable
            } else {
                LossReason::Expired
            });
            give_back(shared.backend.clone(), shared.kind, expired);
        }
        let lingered = idle_for.is_some_and(|idle| idle >= IDLE_LINGER);
        if state.leases.is_empty() && !busy && lingered {
            state.running = false;
            return None;
        }
        Some((due, next))
    }

    fn start_renewal(in_flight: &mut JoinSet<RenewResult>, due: Vec<Arc<LeaseShared>>) {
        let backend: Arc<dyn LockBackend> = due[0].backend.clone();
        let kind = due[0].kind;
        let leases: Vec<Lease> = due.iter().map(|s| s.lock_state().lease.clone()).collect();
        // A renewal that outlives the earliest deadline in its batch is
        // useless: by then those leases are lost. Bound it there.
        let give_up = leases.iter().map(|l| l.valid_until).min();
        let span = observe::renew_span(due[0].label(), leases.len());
        let sent = Instant::now();
        in_flight.spawn(
            async move {
                let call = renew_on(&*backend, kind, &leases);
                let answers = match give_up {
                    Some(at) => tokio::time::timeout_at(at.into(), call)
                        .await
                        .map_err(|_| ()),
                    None => Ok(call.await),
                };
                RenewResult {
                    batch: due,
                    sent,
                    answers,
                    span: tracing::Span::current(),
                }
            }
            .instrument(span),
        );
    }

    fn apply(&self, result: RenewResult) {
        let RenewResult {
            batch,
            sent,
            answers,
            span,
        } = result;
        let now = Instant::now();
        let mut counts = RenewCounts::default();
        for (i, shared) in batch.iter().enumerate() {
            let answer = answers.as_ref().ok().and_then(|a| a.get(i));
            match answer {
                Some(Ok(Renewal::Renewed { .. })) => counts.renewed += 1,
                Some(Ok(_)) => counts.refused += 1,
                Some(Err(_)) => counts.failed += 1,
                None => counts.timeout += 1,
            }
            let mut state = shared.lock_state();
            state.renewing = false;
            if state.status != Status::Held {
                continue;
            }
            let lost = match answer {
                Some(Ok(Renewal::Renewed { valid_until })) => {
                    state.lease.valid_until = *valid_until;
                    state.next_renew = saturating_add(sent, state.lease.ttl / 3);
                    None
                }
                Some(Ok(Renewal::Refused)) => Some(LossReason::Refused),
                Some(Ok(Renewal::Deleted)) => Some(LossReason::Deleted),
                Some(Ok(Renewal::SessionExpired)) => Some(LossReason::SessionExpired),
                Some(Err(e)) => {
                    tracing::debug!(key = %shared.key, error = %e, "renewal failed; retrying");
                    state.next_renew = saturating_add(now, retry_delay(state.lease.ttl));
                    None
                }
                None => {
                    tracing::debug!(key = %shared.key, "renewal got no answer in time; retrying");
                    state.next_renew = saturating_add(now, retry_delay(state.lease.ttl));
                    None
                }
            };
            drop(state);
            if let Some(reason) = lost {
                shared.mark_lost(reason);
            }
        }
        {
            let mut state = self.lock_state();
            for shared in &batch {
                state.leases.renewed(shared);
            }
        }
        if let Some(first) = batch.first() {
            observe::renewed(&span, first.label(), now - sent, counts);
        }
    }
}

/// `due` cut into batches of one kind each, in the order kinds first appear.
fn by_kind(due: Vec<Arc<LeaseShared>>) -> Vec<Vec<Arc<LeaseShared>>> {
    let mut batches: Vec<(LeaseKind, Vec<Arc<LeaseShared>>)> = Vec::new();
    for shared in due {
        match batches.iter_mut().find(|(kind, _)| *kind == shared.kind) {
            Some((_, batch)) => batch.push(shared),
            None => batches.push((shared.kind, vec![shared])),
        }
    }
    batches.into_iter().map(|(_, batch)| batch).collect()
}

/// Deletes a lease whose local deadline passed, if the server still has it.
///
/// The holder has been told it lost the lease, so nothing relies on it any
/// more; and where the server's lease is longer than ours (an etcd lease
/// rounded up to whole seconds, a ZooKeeper session, a leaked guard with
/// renewal off) this frees the key for the next holder at once.
fn give_back(backend: Arc<dyn LockBackend>, kind: LeaseKind, lease: Lease) {
    tokio::spawn(async move {
        if let Err(e) = release_on(&*backend, kind, &lease).await {
            tracing::debug!(key = %lease.key, error = %e, "could not delete an expired lease; the server expires it");
        }
    });
}

/// Resolves when `alarm` is raised (`true`) or its backend is gone
/// (`false`); never without one.
async fn changed(alarm: Option<&mut tokio::sync::watch::Receiver<u64>>) -> bool {
    match alarm {
        Some(alarm) => alarm.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Marks the watchdog stopped if its task is dropped (runtime shutdown).
struct StoppedOnDrop<'a> {
    watchdog: &'a Watchdog,
    armed: bool,
}

impl Drop for StoppedOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.watchdog.lock_state().running = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::backend::LockBackend;
    use crate::backends::memory::MemoryBackend;
    use crate::lease::ttl::DEFAULT_TTL;
    use crate::{lease::local, Lock, LockGuard};

    /// `key` taken on `backend` for `ttl`.
    async fn take(
        backend: &Arc<dyn LockBackend>,
        key: impl Into<String>,
        ttl: std::time::Duration,
    ) -> LockGuard {
        Lock::new(key)
            .ttl(ttl)
            .with_backend(backend.clone())
            .acquire()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn watches_a_lease_until_it_is_released() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let watchdog = local::for_backend(&backend).watchdog.clone();
        let guard = take(&backend, "watched", DEFAULT_TTL).await;
        assert_eq!(watchdog.len(), 1);
        guard.release().await.unwrap();
        assert_eq!(watchdog.len(), 0);
    }

    #[tokio::test]
    async fn released_keys_leave_no_local_state_behind() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let local = local::for_backend(&backend);
        for i in 0..100 {
            let guard = take(&backend, format!("key:{i}"), DEFAULT_TTL).await;
            if i % 2 == 0 {
                guard.release().await.unwrap();
            } else {
                drop(guard);
            }
        }
        // Background releases of dropped guards run on this runtime.
        for _ in 0..100 {
            if local.slot_count() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(local.slot_count(), 0, "one slot per released key was kept");
    }

    /// A memory backend with a loss alarm, whose renewals report every
    /// lease's session ended once `ended` is set; it reports the lease of
    /// the key `forever` as a huge one, as a backend whose server clamps
    /// long leases may.
    #[derive(Debug)]
    struct Odd {
        inner: MemoryBackend,
        alarm: tokio::sync::watch::Sender<u64>,
        ended: std::sync::atomic::AtomicBool,
    }

    impl Odd {
        fn new() -> Self {
            Odd {
                inner: MemoryBackend::new(),
                alarm: tokio::sync::watch::channel(0).0,
                ended: std::sync::atomic::AtomicBool::new(false),
            }
        }
    }

    #[async_trait::async_trait]
    impl LockBackend for Odd {
        fn describe(&self) -> String {
            "odd".into()
        }
        async fn try_acquire(
            &self,
            req: &crate::backend::AcquireRequest,
        ) -> Result<Option<crate::backend::Lease>, crate::LockError> {
            self.inner.try_acquire(req).await
        }
        async fn acquire(
            &self,
            req: &crate::backend::AcquireRequest,
            deadline: Option<std::time::Instant>,
        ) -> Result<Option<crate::backend::Lease>, crate::LockError> {
            let lease = self.inner.acquire(req, deadline).await?;
            Ok(lease.map(|mut lease| {
                if lease.key == "forever" {
                    lease.ttl = std::time::Duration::MAX;
                    lease.valid_until =
                        crate::backend::lease_deadline(std::time::Instant::now(), lease.ttl);
                }
                lease
            }))
        }
        async fn renew(
            &self,
            leases: &[crate::backend::Lease],
        ) -> Vec<Result<crate::backend::Renewal, crate::LockError>> {
            if self.ended.load(std::sync::atomic::Ordering::SeqCst) {
                return leases
                    .iter()
                    .map(|_| Ok(crate::backend::Renewal::SessionExpired))
                    .collect();
            }
            self.inner.renew(leases).await
        }
        async fn release(&self, lease: &crate::backend::Lease) -> Result<bool, crate::LockError> {
            self.inner.release(lease).await
        }
        fn loss_alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
            Some(self.alarm.subscribe())
        }
    }

    /// A suspend of the host longer than the ttl (the monotonic clock and
    /// the watchdog's timers stood still) is a loss as soon as the host
    /// resumes: `lost()` fires within the watchdog's look at the suspends,
    /// not at the next renewal (a third of a 30 s ttl).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_suspend_longer_than_the_ttl_is_a_loss_at_resume() {
        use super::{SuspendClock, Watchdog};
        use std::time::Instant;
        let clock: &'static SuspendClock = Box::leak(Box::new(SuspendClock::fake()));
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let ttl = std::time::Duration::from_secs(30);
        let guard = take(&backend, "suspended", ttl).await;
        // Watched by a watchdog on the fake clock instead of the backend's.
        local::for_backend(&backend)
            .watchdog
            .deregister(guard.lease());
        let watchdog = Arc::new(Watchdog::with_clock(clock));
        watchdog.register(guard.lease());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(guard.is_held());
        clock.fake_suspend(2 * ttl);
        let resumed = Instant::now();
        let lost = tokio::time::timeout(std::time::Duration::from_secs(10), guard.lost()).await;
        eprintln!(
            "suspend of 2x the ttl: lost() fired {:?} after the resume",
            resumed.elapsed()
        );
        assert!(
            lost.is_ok(),
            "lost() did not fire within 10 s of the resume"
        );
        assert!(!guard.is_held());
        assert_eq!(watchdog.len(), 0);
    }

    /// A raised alarm makes the watchdog renew at once: a lease whose
    /// session ended is reported lost then, not at its next renewal.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_raised_alarm_renews_at_once() {
        let alarmed = Arc::new(Odd::new());
        let backend: Arc<dyn LockBackend> = alarmed.clone();
        let guard = take(&backend, "alarmed", std::time::Duration::from_secs(60)).await;
        alarmed
            .ended
            .store(true, std::sync::atomic::Ordering::SeqCst);
        alarmed.alarm.send_modify(|g| *g += 1);
        tokio::time::timeout(std::time::Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() right after the alarm, not at the 20 s renewal");
        assert!(!guard.is_held());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_huge_lease_does_not_stop_the_renewal_of_the_others() {
        let backend: Arc<dyn LockBackend> = Arc::new(Odd::new());
        let ttl = std::time::Duration::from_millis(300);
        let forever = take(&backend, "forever", DEFAULT_TTL).await;
        let normal = take(&backend, "normal", ttl).await;
        tokio::time::sleep(ttl * 4).await;
        assert!(forever.is_held());
        assert!(normal.is_held(), "the watchdog stopped renewing");
        normal.release().await.unwrap();
        forever.release().await.unwrap();
    }

    /// An extension to a shorter ttl moves the lease earlier in the
    /// watchdog's time order: it is renewed every third of the new ttl,
    /// not first at the old ttl's third (20 s here, long after the new
    /// ttl ran out).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_extended_to_a_shorter_ttl_is_renewed_on_time() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let guard = take(&backend, "shortened", std::time::Duration::from_secs(60)).await;
        guard
            .extend(std::time::Duration::from_millis(300))
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
        assert!(guard.is_held(), "the shortened lease was not renewed");
        guard.release().await.unwrap();
    }

    /// Many leases of different ttls, taken and released in a churn: each
    /// is renewed on its own schedule, and the released ones leave nothing
    /// behind in the watchdog.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_of_mixed_ttls_are_each_renewed_and_released_ones_forgotten() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let watchdog = local::for_backend(&backend).watchdog.clone();
        let mut kept = Vec::new();
        for i in 0..60u64 {
            let ttl = std::time::Duration::from_millis(150 + 50 * (i % 6));
            let guard = take(&backend, format!("mixed:{i}"), ttl).await;
            if i % 3 == 0 {
                kept.push(guard);
            } else {
                guard.release().await.unwrap();
            }
        }
        assert_eq!(watchdog.len(), kept.len());
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        for guard in &kept {
            assert!(guard.is_held(), "{guard:?} was not renewed");
        }
        for guard in kept {
            guard.release().await.unwrap();
        }
        assert_eq!(watchdog.len(), 0);
    }

    #[tokio::test]
    async fn leases_of_an_idle_second_runtime_are_renewed() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let ttl = std::time::Duration::from_millis(300);
        // The backend's first lease comes from a runtime that then idles.
        let idle = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let first = {
            let backend = backend.clone();
            let handle = idle.handle().clone();
            std::thread::spawn(move || {
                handle.block_on(Lock::new("first").ttl(ttl).with_backend(backend).acquire())
            })
            .join()
            .unwrap()
            .unwrap()
        };
        let main = take(&backend, "main", ttl).await;
        tokio::time::sleep(ttl * 4).await;
        assert!(main.is_held() && first.is_held(), "renewal stopped");
        drop((main, first));
        std::thread::spawn(move || drop(idle)).join().unwrap();
    }
}
