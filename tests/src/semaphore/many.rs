//! The semaphore suite's cases for permits taken several at once
//! (`Semaphore::acquire_many`, `try_acquire_many`, `available`). On a
//! backend whose semaphores take one permit at a time (MySQL), each case
//! checks the typed refusal instead.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockBackend, LockError, Semaphore};

use crate::conformance::{unique_key, Fixture};

fn semaphore(backend: &Arc<dyn LockBackend>, name: &str, permits: usize) -> Semaphore {
    Semaphore::new(name, permits).with_backend(backend.clone())
}

/// True if the fixture's backend takes several permits at once; otherwise
/// checks that n > 1 is a typed `InvalidOption` naming the backends that
/// do, waiting or not, and that nothing was taken.
async fn takes_many<F: Fixture>(fixture: &F) -> bool {
    if fixture.many_permits() {
        return true;
    }
    let name = unique_key("semaphore-many-refused");
    let backend = fixture.backend().await;
    let s = semaphore(&backend, &name, 3).wait(Duration::from_secs(2));
    for err in [
        s.acquire_many(2).await.unwrap_err(),
        s.try_acquire_many(3).await.unwrap_err(),
    ] {
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("take one permit at a time") && text.contains("redis://"),
            "{text}"
        );
    }
    let one = s.try_acquire().await.unwrap().expect("nothing was taken");
    assert_eq!(one.count(), 1);
    one.release().await.unwrap();
    false
}

/// Holders weighed by their counts: how many permits are out at once.
#[derive(Default)]
struct Weight {
    out: AtomicUsize,
    most: AtomicUsize,
}

impl Weight {
    fn take(&self, n: usize) {
        let now = self.out.fetch_add(n, Ordering::SeqCst) + n;
        self.most.fetch_max(now, Ordering::SeqCst);
    }
    fn give(&self, n: usize) {
        self.out.fetch_sub(n, Ordering::SeqCst);
    }
}

/// 12 tasks on 3 clients take 1 to 4 permits of 10, 15 times each: never
/// more than 10 out at once, and every taker is served.
pub async fn mixed_counts_never_exceed_the_permits<F: Fixture>(fixture: &F) {
    if !takes_many(fixture).await {
        return;
    }
    const PERMITS: usize = 10;
    const CYCLES: usize = 15;
    let name = unique_key("semaphore-mixed");
    let weight = Arc::new(Weight::default());
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in 0..3 {
        let backend = fixture.backend().await;
        for task in 0..4 {
            let s = semaphore(&backend, &name, PERMITS).wait(Duration::from_secs(60));
            let (weight, served) = (weight.clone(), served.clone());
            tasks.push(tokio::spawn(async move {
                for cycle in 0..CYCLES {
                    let n = 1 + (client + task + cycle) % 4;
                    let permit = s.acquire_many(n).await.expect("acquire_many");
                    assert_eq!(permit.count(), n);
                    weight.take(n);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    weight.give(n);
                    permit.release().await.expect("release");
                    served.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    tokio::time::timeout(Duration::from_secs(240), async {
        for task in tasks {
            task.await.expect("a taker panicked");
        }
    })
    .await
    .expect("mixed takers did not finish within 240 s");
    let most = weight.most.load(Ordering::SeqCst);
    eprintln!("mixed counts: at most {most} of {PERMITS} permits out at once");
    assert!(most <= PERMITS, "{most} permits out with {PERMITS}");
    assert_eq!(served.load(Ordering::SeqCst), 12 * CYCLES);
}

/// `try_acquire_many(3)` with 2 free is `None` and takes nothing; with
/// `available()` before and after each step.
pub async fn try_acquire_many_is_all_or_nothing<F: Fixture>(fixture: &F) {
    if !takes_many(fixture).await {
        return;
    }
    let name = unique_key("semaphore-all-or-none");
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    assert_eq!(semaphore(&b, &name, 3).available().await.unwrap(), 3);
    let one = semaphore(&a, &name, 3).acquire().await.unwrap();
    assert_eq!(semaphore(&b, &name, 3).available().await.unwrap(), 2);
    let none = semaphore(&b, &name, 3).try_acquire_many(3).await.unwrap();
    assert!(none.is_none(), "3 permits granted with 2 free");
    assert_eq!(
        semaphore(&a, &name, 3).available().await.unwrap(),
        2,
        "a refused try_acquire_many left a partial hold"
    );
    let two = semaphore(&b, &name, 3)
        .try_acquire_many(2)
        .await
        .unwrap()
        .expect("2 of 2 free");
    assert_eq!(two.count(), 2);
    assert_eq!(semaphore(&a, &name, 3).available().await.unwrap(), 0);
    assert!(semaphore(&a, &name, 3)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    two.release().await.unwrap();
    assert_eq!(semaphore(&a, &name, 3).available().await.unwrap(), 2);
    one.release().await.unwrap();
    assert_eq!(semaphore(&b, &name, 3).available().await.unwrap(), 3);
}

/// n = 0 and n > permits are `InvalidOption` naming n and the permits,
/// waiting or not, and take nothing.
pub async fn counts_out_of_range_are_rejected<F: Fixture>(fixture: &F) {
    let name = unique_key("semaphore-bad-n");
    let a = fixture.backend().await;
    let s = semaphore(&a, &name, 3);
    for (n, err) in [
        (0, s.acquire_many(0).await.unwrap_err()),
        (4, s.acquire_many(4).await.unwrap_err()),
        (0, s.try_acquire_many(0).await.unwrap_err()),
        (
            usize::MAX,
            s.try_acquire_many(usize::MAX).await.unwrap_err(),
        ),
    ] {
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("acquire_many({n})")) && text.contains("of 3 permits"),
            "{text}"
        );
    }
    let all = s.clone().wait(Duration::from_secs(5));
    let taken = if fixture.many_permits() {
        all.acquire_many(3).await
    } else {
        all.acquire().await
    };
    taken.expect("nothing was taken").release().await.unwrap();
}

/// A waiting taker of 4 is not overtaken by later takers of 1: neither a
/// later `try_acquire` nor a later waiting `acquire` gets a permit before
/// it, though permits are free meanwhile.
pub async fn a_waiting_taker_of_many_is_not_overtaken<F: Fixture>(fixture: &F) {
    if !takes_many(fixture).await {
        return;
    }
    let name = unique_key("semaphore-fifo");
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let first = semaphore(&a, &name, 4).acquire().await.unwrap();
    let big = semaphore(&b, &name, 4).wait(Duration::from_secs(30));
    let big = tokio::spawn(async move {
        let permit = big.acquire_many(4).await;
        (Instant::now(), permit)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!big.is_finished(), "4 granted while 1 of 4 is out");
    let small = semaphore(&c, &name, 4);
    assert!(
        small.try_acquire().await.unwrap().is_none(),
        "a later try_acquire overtook the waiting taker of 4"
    );
    let later = small.clone().wait(Duration::from_secs(30));
    let later = tokio::spawn(async move {
        let permit = later.acquire().await;
        (Instant::now(), permit)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !later.is_finished(),
        "a later taker of 1 overtook the waiting taker of 4 (3 were free)"
    );
    first.release().await.unwrap();
    let (big_at, big) = tokio::time::timeout(Duration::from_secs(10), big)
        .await
        .expect("the taker of 4 was not woken")
        .unwrap();
    let big = big.expect("the taker of 4");
    assert_eq!(big.count(), 4);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !later.is_finished(),
        "a permit granted while 4 of 4 are out"
    );
    big.release().await.unwrap();
    let (later_at, later) = tokio::time::timeout(Duration::from_secs(10), later)
        .await
        .expect("the later taker was not woken")
        .unwrap();
    assert!(big_at < later_at);
    later.expect("the later taker").release().await.unwrap();
}

/// A waiting `acquire_many` that is dropped leaves nothing: no permit, and
/// no place in the queue that would stop the takers after it.
pub async fn a_cancelled_acquire_many_leaves_nothing<F: Fixture>(fixture: &F) {
    if !takes_many(fixture).await {
        return;
    }
    let name = unique_key("semaphore-many-cancel");
    let (a, b, c) = (
        fixture.backend().await,
        fixture.backend().await,
        fixture.backend().await,
    );
    let one = semaphore(&a, &name, 3).acquire().await.unwrap();
    let waiting = semaphore(&b, &name, 3).wait(Duration::from_secs(30));
    let dropped = tokio::time::timeout(Duration::from_millis(500), waiting.acquire_many(3)).await;
    assert!(dropped.is_err(), "3 granted while 1 of 3 is out");
    assert_eq!(semaphore(&c, &name, 3).available().await.unwrap(), 2);
    let two = semaphore(&c, &name, 3)
        .wait(Duration::from_secs(5))
        .acquire_many(2)
        .await
        .expect("a dropped taker of 3 kept its place in the queue");
    two.release().await.unwrap();
    one.release().await.unwrap();
    let all = semaphore(&c, &name, 3)
        .wait(Duration::from_secs(5))
        .acquire_many(3)
        .await
        .expect("every permit is back");
    all.release().await.unwrap();
    assert_eq!(semaphore(&c, &name, 3).available().await.unwrap(), 3);
}

/// A weighted permit left to expire (renewal off, kept alive) frees all of
/// its permits at once: a taker of all of them gets in after the ttl.
pub async fn an_expired_weighted_permit_frees_all_of_them<F: Fixture>(fixture: &F) {
    if !takes_many(fixture).await {
        return;
    }
    let name = unique_key("semaphore-many-expired");
    let ttl = fixture.short_ttl();
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let expiring = semaphore(&a, &name, 3)
        .ttl(ttl)
        .renew(false)
        .acquire_many(3)
        .await
        .unwrap();
    assert_eq!(semaphore(&b, &name, 3).available().await.unwrap(), 0);
    let start = Instant::now();
    let next = semaphore(&b, &name, 3)
        .wait(ttl * 3 + Duration::from_secs(2))
        .acquire_many(3)
        .await
        .expect("the expired permit kept its 3");
    let took = start.elapsed();
    eprintln!("a weighted permit of ttl {ttl:?} freed its 3 after {took:?}");
    assert!(!expiring.is_held());
    next.release().await.unwrap();
    drop(expiring);
}
