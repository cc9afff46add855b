//! The read-write lock suite, for backends that have read-write locks.
//!
//! Backends opt in with [`rw_suite!`](crate::rw_suite) beside their
//! `conformance_suite!`, with a fixture that also implements [`RwFixture`];
//! it is a separate macro so that backends without read-write locks yet
//! keep a passing conformance suite.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::{LockBackend, LockError, RwLock};
use tokio::sync::Barrier;

use crate::conformance::{unique_key, Fixture};
use crate::fixtures::forward::Forward;

/// A lock service whose read-write locks the suite can tamper with.
#[async_trait::async_trait]
pub trait RwFixture: Fixture {
    /// Removes every lease (readers and writer) of the read-write lock
    /// `key` behind their holders' backs, as an operator would.
    async fn steal_rw(&self, key: &str);
}

/// Expands to one `#[tokio::test]` per read-write lock case. The argument
/// is an expression that builds a fresh fixture, as for
/// `conformance_suite!`.
///
/// ```text
/// dlock_tests::rw_suite!(MemoryFixture::default());
/// ```
#[macro_export]
macro_rules! rw_suite {
    ($fixture:expr) => {
        $crate::rw_suite!(@cases $fixture;
            eight_readers_hold_at_once,
            a_writer_excludes_readers_and_writers,
            a_waiting_writer_is_served_while_readers_keep_arriving,
            a_lost_read_lease_fires_lost,
            each_reader_expires_on_its_own,
            fences_name_the_write_a_read_follows,
            try_read_and_try_write_answer_at_once,
            nested_leases_follow_the_reentrancy_rules,
            a_backend_without_read_write_locks_says_so,
            writers_joined_in_one_task_contend,
            a_cancelled_writer_does_not_keep_readers_out,
            a_read_lease_of_an_idle_runtime_lives_and_ends_with_it,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod rw {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    $crate::rw::$case(&fixture).await;
                }
            )*
        }
    };
}

fn rw(backend: &Arc<dyn LockBackend>, key: &str) -> RwLock {
    RwLock::new(key).with_backend(backend.clone())
}

/// While a reader holds the key and a writer has given up on it (its
/// `write()` dropped or cut): a reader that comes later gets in at once
/// (else the test fails with `kept_out`), and that writer, trying again for
/// 300 ms, times out behind the first reader.
pub async fn a_late_reader_gets_in_and_the_writer_times_out(
    late_reader: &RwLock,
    writer: &RwLock,
    kept_out: &str,
) {
    let late = late_reader.try_read().await.unwrap();
    late.expect(kept_out).release().await.unwrap();
    let err = writer
        .clone()
        .wait(Duration::from_millis(300))
        .write()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
}

/// 8 readers on 4 clients each hold a read lease and wait at a barrier of
/// 8 before letting go: the barrier opens only if all 8 hold at once.
pub async fn eight_readers_hold_at_once<F: RwFixture>(fixture: &F) {
    const READERS: usize = 8;
    let key = unique_key("rw-share");
    let barrier = Arc::new(Barrier::new(READERS));
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(fixture.backend().await);
    }
    let mut tasks = Vec::new();
    for i in 0..READERS {
        let lock = rw(&clients[i % clients.len()], &key).wait(Duration::from_secs(30));
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.read().await.expect("a reader waited");
            barrier.wait().await;
            assert!(guard.is_held());
            guard.release().await.expect("release a read lease");
        }));
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        for task in tasks {
            task.await.expect("a reader panicked");
        }
    })
    .await
    .expect("8 readers did not all hold at once within 60 s");
}

/// Who is inside a read-write critical section, and what went wrong.
#[derive(Default)]
struct Inside {
    readers: AtomicUsize,
    writers: AtomicUsize,
    most_readers: AtomicUsize,
    violations: AtomicUsize,
}

impl Inside {
    fn read(&self) {
        let now = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(now, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn unread(&self) {
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }
    fn write(&self) {
        let writers = self.writers.fetch_add(1, Ordering::SeqCst);
        if writers != 0 || self.readers.load(Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn unwrite(&self) {
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// 16 tasks on 4 clients × 50 cycles, a quarter of the cycles writes: no
/// writer is ever inside with a reader or another writer, no write is lost
/// (a non-atomic read-yield-write), and readers do share.
pub async fn a_writer_excludes_readers_and_writers<F: RwFixture>(fixture: &F) {
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 4;
    const CYCLES: usize = 50;
    let key = unique_key("rw-exclusion");
    let inside = Arc::new(Inside::default());
    let written = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let backend = fixture.backend().await;
        for task in 0..TASKS_PER_CLIENT {
            let lock = rw(&backend, &key).wait(Duration::from_secs(60));
            let (inside, written, writes) = (inside.clone(), written.clone(), writes.clone());
            let seed = client * TASKS_PER_CLIENT + task;
            tasks.push(tokio::spawn(async move {
                for cycle in 0..CYCLES {
                    if (seed + cycle).is_multiple_of(4) {
                        let guard = lock.write().await.expect("a writer waited");
                        inside.write();
                        let read = written.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        written.store(read + 1, Ordering::SeqCst);
                        writes.fetch_add(1, Ordering::SeqCst);
                        inside.unwrite();
                        guard.release().await.expect("release a write lease");
                    } else {
                        let guard = lock.read().await.expect("a reader waited");
                        inside.read();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        inside.unread();
                        guard.release().await.expect("release a read lease");
                    }
                }
            }));
        }
    }
    tokio::time::timeout(Duration::from_secs(240), async {
        for task in tasks {
            task.await.expect("a contending task panicked");
        }
    })
    .await
    .expect("a_writer_excludes_readers_and_writers did not finish within 240 s");
    assert_eq!(
        inside.violations.load(Ordering::SeqCst),
        0,
        "a writer was inside with another holder"
    );
    assert_eq!(
        written.load(Ordering::SeqCst),
        writes.load(Ordering::SeqCst),
        "writes were lost"
    );
    assert_eq!(
        writes.load(Ordering::SeqCst),
        CLIENTS * TASKS_PER_CLIENT * CYCLES / 4
    );
    assert!(
        inside.most_readers.load(Ordering::SeqCst) > 1,
        "12 reading tasks never shared the lock"
    );
}

/// A reader holds; a writer of another client waits; then a reader of a
/// third client arrives every 50 ms for 4 s, each holding 500 ms, and after
/// 1 s of that stream the first reader releases. The writer is served
/// before every reader that arrived after it was in line, and within
/// 2 × the readers' critical section of the first reader's release
/// (starved, it would wait for the whole stream).
pub async fn a_waiting_writer_is_served_while_readers_keep_arriving<F: RwFixture>(fixture: &F) {
    const HOLD: Duration = Duration::from_millis(500);
    const ARRIVALS: usize = 80;
    let key = unique_key("rw-starve");
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let first = rw(&a, &key).read().await.unwrap();
    let writer = rw(&b, &key).wait(Duration::from_secs(60));
    let writing = tokio::spawn(async move {
        let guard = writer.write().await?;
        let got = Instant::now();
        tokio::time::sleep(HOLD).await;
        guard.release().await?;
        Ok::<_, LockError>(got)
    });
    // The writer is in line once a new reader is turned away.
    let late = rw(&c, &key).wait(Duration::from_secs(60));
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(reader) = late.try_read().await.unwrap() {
            reader.release().await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the writer never stopped new readers");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let stream = tokio::spawn({
        let granted = granted.clone();
        async move {
            let mut readers = Vec::new();
            for _ in 0..ARRIVALS {
                let (late, granted) = (late.clone(), granted.clone());
                readers.push(tokio::spawn(async move {
                    let guard = late.read().await.expect("a late reader waited");
                    granted.lock().unwrap().push(Instant::now());
                    tokio::time::sleep(HOLD).await;
                    guard.release().await.expect("release a late reader");
                }));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for reader in readers {
                reader.await.expect("a late reader panicked");
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first_released = Instant::now();
    first.release().await.unwrap();
    let writer_got = tokio::time::timeout(Duration::from_secs(60), writing)
        .await
        .expect("the writer was not served within 60 s")
        .unwrap()
        .expect("the writer failed");
    tokio::time::timeout(Duration::from_secs(120), stream)
        .await
        .expect("the late readers did not finish within 120 s")
        .expect("the stream of readers panicked");
    let early = granted
        .lock()
        .unwrap()
        .iter()
        .filter(|got| **got < writer_got)
        .count();
    assert_eq!(
        early, 0,
        "late readers were served before the waiting writer"
    );
    let waited = writer_got.saturating_duration_since(first_released);
    assert!(
        waited <= 2 * HOLD,
        "the writer held {waited:?} after the reader ahead of it released (bound {:?})",
        2 * HOLD
    );
}

/// A read lease removed behind its holder's back fires `lost()` within the
/// ttl (plus a second), and its release says it was not held.
pub async fn a_lost_read_lease_fires_lost<F: RwFixture>(fixture: &F) {
    let key = unique_key("rw-lost");
    let ttl = fixture.short_ttl();
    let a = fixture.backend().await;
    let guard = rw(&a, &key).ttl(ttl).read().await.unwrap();
    let lost = guard.lost();
    fixture.steal_rw(&key).await;
    let bound = ttl + Duration::from_secs(1);
    tokio::time::timeout(bound, lost)
        .await
        .unwrap_or_else(|_| panic!("lost() of a read lease did not fire within {bound:?}"));
    assert!(!guard.is_held());
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err:?}");
    // Nothing is left in the way of a writer.
    let writer = rw(&a, &key).try_write().await.unwrap();
    writer
        .expect("the key is free after the loss")
        .release()
        .await
        .unwrap();
}

/// A reader whose lease is not renewed loses it after its ttl, while
/// another reader of the same key keeps its own, and keeps a writer out.
/// (The kept reader has the default ttl, so that a renewal delayed by a
/// loaded machine cannot be what this case measures.)
pub async fn each_reader_expires_on_its_own<F: RwFixture>(fixture: &F) {
    let key = unique_key("rw-expiry");
    let ttl = fixture.short_ttl();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let expiring = rw(&a, &key).ttl(ttl).renew(false).read().await.unwrap();
    let kept = rw(&b, &key).read().await.unwrap();
    let bound = ttl + Duration::from_secs(2);
    tokio::time::timeout(bound, expiring.lost())
        .await
        .unwrap_or_else(|_| panic!("an unrenewed reader was not lost within {bound:?}"));
    tokio::time::sleep(ttl).await;
    assert!(
        kept.is_held(),
        "a renewed reader lost its lease with another's"
    );
    assert!(
        rw(&a, &key).try_write().await.unwrap().is_none(),
        "a writer got in while a reader held"
    );
    kept.release().await.unwrap();
    drop(expiring);
}

/// Write fences strictly increase; a read's fence is at least the fence of
/// the write before it and below the fence of the write after it.
pub async fn fences_name_the_write_a_read_follows<F: RwFixture>(fixture: &F) {
    if !fixture.fencing() {
        return;
    }
    let key = unique_key("rw-fence");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let mut last_write = 0;
    for round in 0..5 {
        let writer = rw(&a, &key).write().await.unwrap();
        let write = writer
            .fencing_token()
            .expect("a write lease without a fence");
        assert!(write > last_write, "write fence {write} after {last_write}");
        writer.release().await.unwrap();
        let r1 = rw(&a, &key).read().await.unwrap();
        let r2 = rw(&b, &key).read().await.unwrap();
        for reader in [&r1, &r2] {
            let read = reader
                .fencing_token()
                .expect("a read lease without a fence");
            assert!(
                read >= write,
                "round {round}: read fence {read} below the write {write} it follows"
            );
        }
        let reads = [r1.fencing_token().unwrap(), r2.fencing_token().unwrap()];
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let next = rw(&b, &key).write().await.unwrap();
        let next_write = next.fencing_token().unwrap();
        assert!(
            reads.iter().all(|read| *read < next_write),
            "round {round}: read fences {reads:?} not below the next write's {next_write}"
        );
        next.release().await.unwrap();
        last_write = next_write;
    }
}

/// `try_read` and `try_write` never wait: a reader lets readers in and
/// keeps writers out, a writer keeps both out.
pub async fn try_read_and_try_write_answer_at_once<F: RwFixture>(fixture: &F) {
    let key = unique_key("rw-try");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let reader = rw(&a, &key).try_read().await.unwrap().expect("a free key");
    let second = rw(&b, &key).try_read().await.unwrap();
    let second = second.expect("readers share");
    assert!(rw(&b, &key).try_write().await.unwrap().is_none());
    let err = rw(&b, &key).wait(Duration::ZERO).write().await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err:?}");
    reader.release().await.unwrap();
    second.release().await.unwrap();
    let writer = rw(&a, &key).try_write().await.unwrap().expect("free again");
    assert!(rw(&b, &key).try_read().await.unwrap().is_none());
    assert!(rw(&b, &key).try_write().await.unwrap().is_none());
    writer.release().await.unwrap();
    let again = rw(&b, &key).try_write().await.unwrap();
    again
        .expect("free after the writer")
        .release()
        .await
        .unwrap();
}

/// Inside a write guard's scope, read and write re-enter; inside a read
/// guard's scope, read re-enters and write is refused at once.
pub async fn nested_leases_follow_the_reentrancy_rules<F: RwFixture>(fixture: &F) {
    let key = unique_key("rw-nested");
    let a = fixture.backend().await;
    let lock = rw(&a, &key).wait(Duration::from_secs(5));
    let writer = lock.write().await.unwrap();
    let nested = writer.scope(async { (lock.try_read().await, lock.try_write().await) });
    let (read, write) = nested.await;
    assert!(read.unwrap().expect("a writer reads").is_reentrant());
    assert!(write.unwrap().expect("a writer writes").is_reentrant());
    writer.release().await.unwrap();
    let reader = lock.read().await.unwrap();
    let nested = reader.scope(async { (lock.try_read().await, lock.write().await) });
    let (read, write) = nested.await;
    assert!(read.unwrap().expect("a reader reads").is_reentrant());
    let err = write.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    reader.release().await.unwrap();
}

/// A backend that has no read-write locks answers `RwLock` with one
/// `InvalidOption` naming it and the backends that have them.
pub async fn a_backend_without_read_write_locks_says_so<F: RwFixture>(fixture: &F) {
    let plain = Forward::without_rw(fixture.backend().await);
    let described = plain.describe();
    let key = unique_key("rw-none");
    for err in [
        rw(&plain, &key).read().await.unwrap_err(),
        rw(&plain, &key).try_write().await.unwrap_err(),
    ] {
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&described), "{text}");
        assert!(text.contains("memory://"), "{text}");
    }
}

/// Two writes and a read joined in one task (`join!`, as ordinary code
/// writes it) contend as if they came from three tasks: a task is not a
/// holder, only a guard's scope is. Each section records who is inside; a
/// writer must find nobody, and the two writes get distinct fences.
pub async fn writers_joined_in_one_task_contend<F: RwFixture>(fixture: &F) {
    let key = unique_key("rw-join");
    let backend = fixture.backend().await;
    let lock = rw(&backend, &key).wait(Duration::from_secs(30));
    let inside = AtomicUsize::new(0);
    let overlaps = AtomicUsize::new(0);
    let section = |write: bool| {
        let (lock, inside, overlaps) = (&lock, &inside, &overlaps);
        async move {
            let guard = if write {
                lock.write().await
            } else {
                lock.read().await
            }
            .expect("take a lease");
            let mine = if write { 1000 } else { 1 };
            let before = inside.fetch_add(mine, Ordering::SeqCst);
            if (write && before != 0) || (!write && before >= 1000) {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            inside.fetch_sub(mine, Ordering::SeqCst);
            let fence = guard.fencing_token();
            guard.release().await.expect("release");
            fence
        }
    };
    let (first, second, _) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(section(true), section(true), section(false))
    })
    .await
    .expect("the joined sections deadlocked");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "a writer had company");
    if fixture.fencing() {
        assert_ne!(first, second, "two writes shared one lease");
    }
}

/// A writer that waits behind a reader and is cancelled (its future
/// dropped by a `timeout`, as a `select!` would) stops keeping new readers
/// out: a reader asking right after gets in at once, or within the short
/// time a backend takes to clear what the writer left (well below any ttl).
pub async fn a_cancelled_writer_does_not_keep_readers_out<F: RwFixture>(fixture: &F) {
    let key = unique_key("rw-cancel");
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let reader = rw(&a, &key).read().await.unwrap();
    let cancelled = tokio::time::timeout(Duration::from_millis(300), rw(&b, &key).write()).await;
    assert!(cancelled.is_err(), "a writer got in beside a reader");
    let late = rw(&c, &key)
        .wait(Duration::from_secs(2))
        .read()
        .await
        .expect("a cancelled writer kept a reader out");
    late.release().await.unwrap();
    reader.release().await.unwrap();
    // And the key is free for a writer: nothing of the cancelled one is left.
    let writer = rw(&b, &key).try_write().await.unwrap();
    writer
        .expect("the key is free once the readers are gone")
        .release()
        .await
        .unwrap();
}

/// A read lease taken on a second runtime that then sits idle is renewed
/// (dlock's watchdog does not run on it) and keeps a writer out; dropped
/// with that runtime, it frees the key within its ttl.
pub async fn a_read_lease_of_an_idle_runtime_lives_and_ends_with_it<F: RwFixture>(fixture: &F) {
    let key = unique_key("rw-runtime");
    let ttl = fixture.short_ttl();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let lock = rw(&a, &key).ttl(ttl);
    let (reader, idle) =
        crate::ordinary_code::on_a_second_runtime(async move { lock.read().await }).await;
    let reader = reader.expect("read on the second runtime");
    tokio::time::sleep(ttl * 3 + ttl / 2).await;
    assert!(reader.is_held(), "a read lease of the idle runtime lapsed");
    assert!(
        rw(&b, &key).try_write().await.unwrap().is_none(),
        "a writer got in beside a reader of the idle runtime"
    );
    tokio::task::spawn_blocking(move || {
        drop(idle);
        drop(reader);
    })
    .await
    .unwrap();
    let start = Instant::now();
    let writer = rw(&b, &key)
        .wait(ttl * 3 + Duration::from_secs(5))
        .write()
        .await
        .expect("the read lease dropped with its runtime never freed the key");
    let took = start.elapsed();
    assert!(
        took <= ttl + Duration::from_secs(2),
        "freed after {took:?} (ttl {ttl:?})"
    );
    writer.release().await.unwrap();
}
