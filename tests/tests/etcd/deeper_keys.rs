//! Deeper keys (another resource's) hold nothing: `etcdctl lock` on a deeper name, raw clients' keys.

use super::*;
use crate::etcdctl::Etcdctl;

/// A raw etcd client on the fixture's member, as another program would use.
pub(crate) async fn raw_client(fixture: &EtcdFixture) -> etcd_client::Client {
    let endpoint = fixture.url().trim_start_matches("etcd://").to_owned();
    tokio::time::timeout(
        Duration::from_secs(5),
        etcd_client::Client::connect([endpoint], None),
    )
    .await
    .expect("connect within 5 s")
    .expect("connect a raw etcd client")
}

/// `tenant` and `tenant/7` are different names: while `etcdctl lock
/// dlock/tenant/7` holds (its key `dlock/tenant/7/<lease>` lies inside the
/// range of `dlock/tenant/`), `Lock("tenant")` is free, and a waiter for
/// `tenant` watches the holder of `tenant`, not etcdctl's younger, deeper
/// key: it gets the lock at our release, while etcdctl still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeper_etcdctl_lock_is_another_resource() {
    let fixture = EtcdFixture::single();
    let endpoints = fixture.url().trim_start_matches("etcd://").to_owned();
    let (first, second) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let held = lock(&first, "tenant").acquire().await.unwrap();
    let mut theirs = Etcdctl::lock(&endpoints, "dlock/tenant/7");
    let their_key = theirs
        .acquired_within(Duration::from_secs(5))
        .await
        .expect("etcdctl lock dlock/tenant/7 is another lock than ours");
    assert!(their_key.starts_with("dlock/tenant/7/"), "{their_key}");
    // Our holder of `tenant` is first; etcdctl's deeper key is younger.
    assert!(lock(&second, "tenant")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let waiting = wait_for(lock(&second, "tenant").wait(Duration::from_secs(5)));
    wait_for_queue(&fixture, "tenant", 3).await; // ours, etcdctl's (deeper), the waiter's
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = got_within(
        waiting,
        released,
        Duration::from_secs(2),
        "the waiter watched etcdctl's deeper key, not our holder",
    )
    .await;
    guard.release().await.unwrap();
    // etcdctl still holds `tenant/7`: `tenant` is free.
    let again = lock(&first, "tenant").try_acquire().await.unwrap();
    assert!(
        again.is_some(),
        "etcdctl's lock of dlock/tenant/7 blocked `tenant`"
    );
    again.unwrap().release().await.unwrap();
    theirs.unlock().await;
}

/// Writes `keys` with a raw client (no lease), as another program would.
async fn put_foreign(fixture: &EtcdFixture, keys: &[String]) -> etcd_client::Client {
    let mut raw = raw_client(fixture).await;
    for key in keys {
        raw.put(key.as_str(), "foreign", None).await.unwrap();
    }
    raw
}

/// The foreign keys are still there.
async fn untouched(raw: &mut etcd_client::Client, keys: &[String]) {
    for key in keys {
        let got = raw.get(key.as_str(), None).await.unwrap();
        assert_eq!(got.kvs().len(), 1, "{key} was deleted");
    }
}

/// More keys one level deeper than a lock's entries than one read's page
/// (a raw client's, another resource's): none holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeper_keys_of_a_raw_client_hold_no_lock() {
    let fixture = EtcdFixture::single();
    let foreign: Vec<String> = (0..40).map(|i| format!("dlock/jobs/x/{i:02}")).collect();
    let mut raw = put_foreign(&fixture, &foreign).await;
    let (backend, other) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let guard = lock(&backend, "jobs").try_acquire().await.unwrap();
    let guard = guard.expect("deeper keys under dlock/jobs/ held `jobs`");
    assert!(lock(&other, "jobs").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    untouched(&mut raw, &foreign).await;
}

/// A raw client's keys deeper than a read-write lock's entries
/// (`<dir>eu/write/<n>`, and a key below a `write/<n>`) are no reader and
/// no writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeper_keys_of_a_raw_client_hold_no_rw_lease() {
    let fixture = EtcdFixture::single();
    let foreign = [
        "dlock-rw/prices/eu/write/1".to_owned(),
        "dlock-rw/prices/write/1/read/2".to_owned(),
    ];
    let mut raw = put_foreign(&fixture, &foreign).await;
    let backend = connect(fixture.url()).await;
    let rw = || dlock::RwLock::new("prices").with_backend(backend.clone());
    let read = rw().try_read().await.unwrap();
    read.expect("a key below dlock-rw/prices/write/1 counted as a writer")
        .release()
        .await
        .unwrap();
    let write = rw().try_write().await.unwrap();
    let write = write.expect("a deeper key under dlock-rw/prices/ counted as a reader or writer");
    assert!(
        rw().try_read().await.unwrap().is_none(),
        "a read beside our write"
    );
    write.release().await.unwrap();
    untouched(&mut raw, &foreign).await;
}

/// More of a raw client's keys one level deeper than a semaphore's entries
/// than one read's page: none holds a permit, and a freed permit is found
/// past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeper_keys_of_a_raw_client_hold_no_permit() {
    let fixture = EtcdFixture::single();
    let foreign: Vec<String> = (0..40)
        .map(|i| format!("dlock-semaphores/jobs/eu/{i:02}"))
        .collect();
    let mut raw = put_foreign(&fixture, &foreign).await;
    let (backend, other) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let semaphore = dlock::Semaphore::new("jobs", 2).with_backend(backend.clone());
    let one = semaphore.try_acquire().await.unwrap();
    let two = semaphore.try_acquire().await.unwrap();
    assert!(
        one.is_some() && two.is_some(),
        "deeper keys under dlock-semaphores/jobs/ took its permits"
    );
    let others = dlock::Semaphore::new("jobs", 2).with_backend(other.clone());
    assert!(
        others.try_acquire().await.unwrap().is_none(),
        "a third permit"
    );
    one.unwrap().release().await.unwrap();
    let three = others.try_acquire().await.unwrap();
    assert!(
        three.is_some(),
        "a freed permit was not found past the deeper keys"
    );
    for permit in [two, three].into_iter().flatten() {
        permit.release().await.unwrap();
    }
    untouched(&mut raw, &foreign).await;
}

/// `list_semaphores` reads their root in pages, past each semaphore's
/// entries: 600 semaphores with a permit out (more than a page of 512
/// keys) are all listed, in order, each once; a deeper key under a
/// semaphore (another resource's, as for locks) names no semaphore; the
/// prefix filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_semaphores_pages_past_each_one() {
    let fixture = EtcdFixture::single();
    let backend = connect(fixture.url()).await;
    let mut permits = Vec::new();
    let mut names: Vec<String> = (0..600).map(|i| format!("listed:{i:04}")).collect();
    for name in &names {
        // Two entries in some directories: a holder and a second holder.
        for _ in 0..if name.ends_with('7') { 2 } else { 1 } {
            let permit = dlock::Semaphore::new(name.clone(), 3)
                .with_backend(backend.clone())
                .acquire()
                .await
                .unwrap();
            permits.push(permit);
        }
    }
    let mut raw = raw_client(&fixture).await;
    raw.put("dlock-semaphores/deeper/x/y", "", None)
        .await
        .unwrap();
    names.sort();
    let listed = |prefix: &'static str| {
        let backend = backend.clone();
        async move {
            let all = dlock::list_semaphores(&*backend, prefix).await.unwrap();
            all.into_iter().map(|(name, _)| name).collect::<Vec<_>>()
        }
    };
    assert_eq!(listed("").await, names);
    assert_eq!(listed("listed:001").await, names[10..20].to_vec());
    for permit in permits {
        permit.release().await.unwrap();
    }
}
