//! What `#[distributed_lock]` does at run time, on the memory backend.
//!
//! Each test registers its own backend under its own name and locks through
//! `backend = "..."`, so tests running in parallel never share a lock.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::memory::MemoryBackend;
use dlock::{distributed_lock, LockError, LockGuard};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Invalid(&'static str),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

fn register(name: &str) -> Arc<MemoryBackend> {
    let backend = Arc::new(MemoryBackend::new());
    dlock::registry().register(name, backend.clone());
    backend
}

/// Waits until someone holds `key` on `backend`.
async fn until_held(backend: &MemoryBackend, key: &str) {
    while backend.holder(key).is_none() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

// --- the lock is held while the body runs, and released before return ----

#[distributed_lock(key = "held:{id}", wait = "0s", backend = "held")]
async fn hold_for(id: u64, pause: Duration) -> Result<(), AppError> {
    tokio::time::sleep(pause).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_runs_with_the_lock_held() {
    let backend = register("held");
    let first = tokio::spawn(hold_for(1, Duration::from_millis(300)));
    until_held(&backend, "held:1").await;
    let second = tokio::spawn(hold_for(1, Duration::ZERO)).await.unwrap();
    assert!(
        matches!(second, Err(AppError::Lock(LockError::Busy { ref key })) if key == "held:1"),
        "{second:?}"
    );
    // Another key is independent.
    tokio::spawn(hold_for(2, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    first.await.unwrap().unwrap();
    assert!(backend.holder("held:1").is_none());
}

#[distributed_lock(key = "slow", wait = "50ms", backend = "timeout")]
async fn wait_briefly() -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_wait_times_out() {
    let backend = register("timeout");
    let holder = dlock::Lock::new("slow")
        .backend("timeout")
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let result = tokio::spawn(wait_briefly()).await.unwrap();
    assert!(
        matches!(result, Err(AppError::Lock(LockError::Timeout { ref key, .. })) if key == "slow"),
        "{result:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(50));
    holder.release().await.unwrap();
    assert!(backend.holder("slow").is_none());
    wait_briefly().await.unwrap();
}

#[distributed_lock(key = "twice", wait = "0s", backend = "twice")]
async fn once_at_a_time() -> Result<u32, AppError> {
    Ok(7)
}

#[tokio::test]
async fn returns_only_after_release() {
    let backend = register("twice");
    // With a zero wait, the second call would be `Busy` if the first one's
    // release were still queued in the background.
    for _ in 0..3 {
        assert_eq!(once_at_a_time().await.unwrap(), 7);
        assert!(backend.holder("twice").is_none());
    }
}

// --- a lost lease ------------------------------------------------------------

#[distributed_lock(key = "job:{name}", ttl = "90ms", backend = "cancel")]
async fn cancelled_job(name: &str, finished: &AtomicBool) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_cancel_drops_the_body() {
    let backend = register("cancel");
    let finished = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let job = tokio::spawn({
        let finished = finished.clone();
        async move { cancelled_job("nightly", &finished).await }
    });
    until_held(&backend, "job:nightly").await;
    assert!(backend.force_expire("job:nightly"));
    let result = job.await.unwrap();
    assert!(
        matches!(result, Err(AppError::Lock(LockError::Lost { ref key })) if key == "job:nightly"),
        "{result:?}"
    );
    // The next renewal (every ttl/3) notices: far sooner than the body's 5 s.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(!finished.load(Ordering::SeqCst));
}

#[distributed_lock(
    key = "report",
    ttl = "90ms",
    backend = "continue",
    on_lost = "continue"
)]
async fn continued_job(guard: &LockGuard) -> Result<bool, AppError> {
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The body ran to its end; it can see that it lost the lease.
    Ok(guard.is_held())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_continue_lets_the_body_finish() {
    let backend = register("continue");
    let job = tokio::spawn(continued_job());
    until_held(&backend, "report").await;
    assert!(backend.force_expire("report"));
    let still_held = job.await.unwrap().unwrap();
    assert!(!still_held);
}

// --- `?`, `return`, and the guard parameter -----------------------------------

#[distributed_lock(key = "parse:{input}", backend = "early")]
async fn parse(input: &str) -> Result<u32, AppError> {
    if input.is_empty() {
        return Err(AppError::Invalid("empty"));
    }
    let n: u32 = input
        .parse()
        .map_err(|_| AppError::Invalid("not a number"))?;
    if n == 0 {
        return Ok(1);
    }
    Ok(n)
}

#[tokio::test]
async fn question_mark_and_return_leave_the_body_and_release() {
    let backend = register("early");
    assert!(matches!(
        parse("x").await,
        Err(AppError::Invalid("not a number"))
    ));
    assert!(backend.holder("parse:x").is_none());
    assert_eq!(parse("0").await.unwrap(), 1);
    assert_eq!(parse("12").await.unwrap(), 12);
    assert!(backend.holder("parse:12").is_none());
}

#[derive(Debug)]
struct User {
    name: String,
    tenant: (u32, &'static str),
}

#[distributed_lock(key = "user:{user.tenant.1}/{user.name}", backend = "fence")]
async fn write_user(user: &User, _guard: &dlock::LockGuard) -> Result<(String, u64), AppError> {
    Ok((
        _guard.key().to_owned(),
        _guard
            .fencing_token()
            .expect("the memory backend has fencing tokens"),
    ))
}

#[tokio::test]
async fn the_guard_parameter_gives_key_and_fencing_token() {
    register("fence");
    let user = User {
        name: "ada".into(),
        tenant: (7, "acme"),
    };
    let (key, first) = write_user(&user).await.unwrap();
    assert_eq!(key, "user:acme/ada");
    let (_, second) = write_user(&user).await.unwrap();
    assert!(second > first, "{second} > {first}");
    assert_eq!(user.tenant.0, 7);
}

// --- methods -------------------------------------------------------------------

struct Account {
    id: u64,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "account:{self.id}", backend = "methods")]
    async fn balance(&self, guard: &LockGuard) -> Result<(String, u64), LockError> {
        Ok((guard.key().to_owned(), self.balance))
    }

    #[distributed_lock(key = "account:{self.id}:{amount}", backend = "methods")]
    async fn deposit(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}", backend = "methods")]
    async fn close(self) -> Result<u64, LockError> {
        Ok(self.balance)
    }
}

trait Ledger {
    async fn post(&self, entry: u32) -> Result<u32, LockError>;
}

impl Ledger for Account {
    #[distributed_lock(key = "ledger:{self.id}:{entry}", wait = "0s", backend = "methods")]
    async fn post(&self, entry: u32) -> Result<u32, LockError> {
        Ok(entry + 1)
    }
}

#[dlock::backend::async_trait]
trait Journal {
    async fn record(&self, line: String) -> Result<usize, LockError>;
}

#[dlock::backend::async_trait]
impl Journal for Account {
    #[distributed_lock(key = "journal:{self.id}", wait = "0s", backend = "methods")]
    async fn record(&self, line: String, guard: &LockGuard) -> Result<usize, LockError> {
        assert_eq!(guard.key(), format!("journal:{}", self.id));
        if line.is_empty() {
            return Ok(0);
        }
        Ok(line.len())
    }
}

#[dlock::backend::async_trait]
trait Audit {
    async fn audit(&self) -> Result<u64, LockError>;
}

#[dlock::backend::async_trait]
impl Audit for Account {
    // A guard the body does not name: still removed from the signature.
    #[distributed_lock(key = "audit:{self.id}", backend = "methods")]
    async fn audit(&self, _: &LockGuard) -> Result<u64, LockError> {
        Ok(self.balance)
    }
}

#[tokio::test]
async fn methods_lock_on_fields_of_self() {
    let backend = register("methods");
    let mut account = Account { id: 9, balance: 1 };
    assert_eq!(account.balance().await.unwrap(), ("account:9".into(), 1));
    assert_eq!(account.deposit(4).await.unwrap(), 5);
    assert_eq!(account.post(1).await.unwrap(), 2);
    let journal: &dyn Journal = &account;
    assert_eq!(journal.record("hello".into()).await.unwrap(), 5);
    assert_eq!(journal.record(String::new()).await.unwrap(), 0);
    assert!(backend.holder("journal:9").is_none());
    assert_eq!(account.audit().await.unwrap(), 5);
    assert_eq!(account.close().await.unwrap(), 5);
}

// --- renew = false ---------------------------------------------------------------

#[distributed_lock(
    key = "lease",
    ttl = "120ms",
    renew = false,
    on_lost = "continue",
    backend = "hard"
)]
async fn outlive_a_hard_lease(calls: &AtomicU32, guard: &LockGuard) -> Result<bool, AppError> {
    calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(guard.is_held())
}

#[tokio::test]
async fn renew_false_makes_the_ttl_a_hard_lease() {
    register("hard");
    let calls = AtomicU32::new(0);
    assert!(!outlive_a_hard_lease(&calls).await.unwrap());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// --- several keys at once -----------------------------------------------------

#[distributed_lock(keys = ["acct:{to}", "acct:{from}"], ttl = "90ms", backend = "multi")]
async fn transfer(from: u32, to: u32, finished: &AtomicBool) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(keys = ["acct:{a}", "acct:{b}"], wait = "0s", backend = "multi")]
async fn both_held(a: u32, b: u32, guard: &dlock::MultiGuard) -> Result<Vec<String>, AppError> {
    assert!(guard.is_held());
    Ok(guard.keys().map(str::to_owned).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_every_key_and_losing_one_cancels_the_body() {
    let backend = register("multi");
    // Released before return, in canonical order.
    assert_eq!(both_held(2, 1).await.unwrap(), ["acct:1", "acct:2"]);
    assert!(backend.holder("acct:1").is_none() && backend.holder("acct:2").is_none());

    let finished = Arc::new(AtomicBool::new(false));
    let job = tokio::spawn({
        let finished = finished.clone();
        async move { transfer(1, 2, &finished).await }
    });
    until_held(&backend, "acct:1").await;
    until_held(&backend, "acct:2").await;
    // Both held by the body: a call naming them the other way is busy.
    assert!(matches!(
        both_held(2, 1).await,
        Err(AppError::Lock(LockError::Busy { .. }))
    ));
    assert!(backend.force_expire("acct:2"));
    let result = job.await.unwrap();
    assert!(
        matches!(result, Err(AppError::Lock(LockError::Lost { ref key })) if key == "acct:2"),
        "{result:?}"
    );
    assert!(!finished.load(Ordering::SeqCst));
    // The key that was not lost was released when the function returned.
    assert!(backend.holder("acct:1").is_none());
}

// --- mode = "read" | "write": one side of a read-write lock ---------------

#[distributed_lock(key = "prices:{region}", mode = "read", wait = "10s", backend = "rw")]
async fn read_prices(region: u32, inside: &AtomicU32, most: &AtomicU32) -> Result<(), AppError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    let _ = region;
    Ok(())
}

#[distributed_lock(key = "prices:{region}", mode = "write", wait = "10s", backend = "rw")]
async fn write_prices(region: u32, inside: &AtomicU32, most: &AtomicU32) -> Result<(), AppError> {
    // A writer is alone: no reader and no other writer is inside with it.
    let now = inside.fetch_add(100, Ordering::SeqCst) + 100;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    inside.fetch_sub(100, Ordering::SeqCst);
    let _ = region;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_mode_shares_and_write_mode_excludes() {
    register("rw");
    let inside = AtomicU32::new(0);
    let (most_readers, most_writers) = (AtomicU32::new(0), AtomicU32::new(0));
    let readers = (0..6).map(|_| read_prices(1, &inside, &most_readers));
    let (reads, writes) = tokio::join!(
        futures_util::future::join_all(readers),
        futures_util::future::join_all((0..3).map(|_| write_prices(1, &inside, &most_writers)))
    );
    assert!(reads.iter().chain(&writes).all(Result::is_ok));
    // Readers overlapped (six 50 ms bodies in one task's join); a writer
    // never saw anyone else inside (a reader adds 1, a writer 100).
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared"
    );
    assert_eq!(
        most_writers.load(Ordering::SeqCst),
        100,
        "a writer had company"
    );
    assert_eq!(inside.load(Ordering::SeqCst), 0);
}

// --- settings from configuration: evaluated at each call ---------------------

/// A service's configuration as it may change at run time (a reload): the
/// lock's ttl in milliseconds, and the backend's name.
static CONFIG_TTL_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(400);

fn configured_ttl() -> Duration {
    Duration::from_millis(CONFIG_TTL_MS.load(Ordering::SeqCst))
}

struct Jobs {
    backend: String,
}

impl Jobs {
    #[distributed_lock(key = "configured", ttl = configured_ttl(), wait = Duration::ZERO, backend = &self.backend, renew = false)]
    async fn run(&self, guard: &LockGuard) -> Result<Duration, LockError> {
        Ok(guard.remaining())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_from_expressions_are_read_at_each_call() {
    let backend = register("configured");
    let jobs = Jobs {
        backend: "configured".to_owned(),
    };
    let first = jobs.run().await.unwrap();
    assert!(
        first <= Duration::from_millis(400) && first > Duration::from_millis(100),
        "{first:?}"
    );
    // The configuration changes: the next call takes the new ttl.
    CONFIG_TTL_MS.store(20_000, Ordering::SeqCst);
    let second = jobs.run().await.unwrap();
    assert!(second > Duration::from_secs(10), "{second:?}");
    // A zero wait from an expression: one attempt, `Busy` while held.
    let _held = dlock::Lock::new("configured")
        .with_backend(backend)
        .acquire()
        .await
        .unwrap();
    assert!(matches!(jobs.run().await, Err(LockError::Busy { .. })));
    // An out-of-range value is refused at the call, as `Lock::ttl` would.
    CONFIG_TTL_MS.store(1, Ordering::SeqCst);
    let err = jobs.run().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
}
