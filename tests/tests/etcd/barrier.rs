//! A barrier member whose session lease ends (revoked by an operator, as
//! etcd ends it when its process died and the ttl ran out) is counted out
//! at once, far within its 30 s ttl: the others' `leave` goes on, and the
//! member hears its loss.

use super::*;
use dlock::{Barrier, BarrierMember};

async fn enter(backend: &Arc<dyn LockBackend>) -> Result<BarrierMember, LockError> {
    Barrier::new("batch", 2)
        .with_backend(backend.clone())
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(30))
        .enter()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_session_lease_ends_is_counted_out() {
    let fixture = EtcdFixture::single();
    let (a, b) = (connect(fixture.url()).await, connect(fixture.url()).await);
    let (doomed, survivor) = tokio::join!(enter(&a), enter(&b));
    let (doomed, survivor) = (doomed.unwrap(), survivor.unwrap());
    let keys = blocking(|| {
        fixture.etcdctl(&[
            "get",
            "--prefix",
            "--keys-only",
            "dlock-barriers/batch/members/",
        ])
    });
    let doomed_key = keys
        .lines()
        .find(|k| k.ends_with(doomed.token()))
        .unwrap_or_else(|| panic!("no member key of the doomed member in {keys:?}"));
    let lease = doomed_key
        .rsplit('/')
        .next()
        .and_then(|entry| entry.split('-').next())
        .expect("<lease-hex>-<token>")
        .to_owned();
    let revoked = Instant::now();
    blocking(|| fixture.etcdctl(&["lease", "revoke", &lease]));
    survivor
        .leave()
        .await
        .expect("leave goes on once the member's lease ended");
    let took = revoked.elapsed();
    eprintln!(
        "barrier: a member whose etcd lease was revoked was counted out after {took:?} (ttl 30 s)"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    tokio::time::timeout(Duration::from_secs(10), doomed.lost())
        .await
        .expect("the counted-out member heard its loss");
    assert!(!doomed.is_held());
}
