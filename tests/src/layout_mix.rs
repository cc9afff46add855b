//! One name, one lock, whatever the layout: dlock's own (`redis://…`) and
//! Redisson's (`…?layout=redisson`) on the same servers exclude each other,
//! as a fleet moving from one to the other one instance at a time needs.
//! Run on one server, behind Sentinel and on a Cluster by
//! `tests/tests/redisson_interop.rs`. Where a Cluster keeps the two keys of
//! a name in different slots (a name with `{`, `}` or `%`), the mix is
//! refused with an error that names it instead.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError};

use crate::conformance::unique_key;

/// The two clients of one name: dlock's layout and Redisson's.
pub struct Layouts {
    /// `redis://…` (dlock's layout).
    pub plain: Arc<dyn LockBackend>,
    /// `…?layout=redisson`.
    pub redisson: Arc<dyn LockBackend>,
    /// Whether the servers are a Cluster.
    pub cluster: bool,
}

impl Layouts {
    /// Connects both layouts to the servers of `plain_url` (a URL without
    /// `layout=`).
    pub async fn connect(plain_url: &str, cluster: bool) -> Self {
        let join = if plain_url.contains('?') { '&' } else { '?' };
        let redisson_url = format!("{plain_url}{join}layout=redisson");
        let connect = |url: String| async move {
            dlock::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("connect to {}: {e}", dlock::url::redact(&url)))
        };
        Layouts {
            plain: connect(plain_url.to_owned()).await,
            redisson: connect(redisson_url).await,
            cluster,
        }
    }

    fn both(&self) -> [(&'static str, &Arc<dyn LockBackend>); 2] {
        [("dlock", &self.plain), ("redisson", &self.redisson)]
    }

    /// The layout that is not `kind`.
    fn other_than(&self, kind: &str) -> (&'static str, &Arc<dyn LockBackend>) {
        if kind == "dlock" {
            ("redisson", &self.redisson)
        } else {
            ("dlock", &self.plain)
        }
    }
}

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key)
        .with_backend(backend.clone())
        .ttl(Duration::from_secs(10))
}

/// Names that put each layout's keys in one slot, and (on a Cluster, for
/// the names with `{`, `}` or `%`) in different ones.
fn names() -> Vec<String> {
    let base = unique_key("layout-mix");
    vec![
        base.clone(),
        format!("{base}:cart{{user:7}}"),
        format!("{{{base}}}:cart"),
        format!("{base}:50%off"),
    ]
}

fn in_one_slot(cluster: bool, name: &str) -> bool {
    !cluster || !name.contains(['{', '}', '%'])
}

/// Each layout's holder keeps the other layout out, without a wait and
/// with one: where one script sees both keys the other is refused as by any
/// holder; where a Cluster keeps them apart the other's acquire fails with
/// `InvalidKey` naming the mix, and the holder's lock is untouched.
pub async fn each_layout_keeps_the_other_out(layouts: &Layouts) {
    let mut refused = 0;
    for name in names() {
        for (holder_kind, holder) in layouts.both() {
            let (other_kind, other) = layouts.other_than(holder_kind);
            let guard = lock(holder, &name).try_acquire().await.unwrap();
            let guard = guard.unwrap_or_else(|| panic!("{holder_kind} took free {name}"));
            let tried = lock(other, &name).try_acquire().await;
            let waited = lock(other, &name)
                .wait(Duration::from_millis(300))
                .acquire()
                .await;
            if in_one_slot(layouts.cluster, &name) {
                assert!(
                    matches!(tried, Ok(None)),
                    "{other_kind} beside a {holder_kind} holder of {name}: {tried:?}"
                );
                assert!(
                    matches!(waited, Err(LockError::Timeout { .. })),
                    "{other_kind} waiting beside a {holder_kind} holder of {name}: {waited:?}"
                );
            } else {
                // The other key in another slot: refused as the mix it is,
                // or (a slot of the same node, which a script may read)
                // kept out as by any holder.
                for answer in [tried.map(|g| g.is_some()), waited.map(|_| true)] {
                    match &answer {
                        Err(LockError::InvalidKey { reason, .. }) => {
                            assert!(reason.contains("one layout only"), "{reason}");
                            refused += 1;
                        }
                        Ok(false) | Err(LockError::Timeout { .. }) => {}
                        _ => panic!(
                            "{other_kind} beside a {holder_kind} holder of {name} on a Cluster: {answer:?}"
                        ),
                    }
                }
            }
            guard.ensure().unwrap_or_else(|e| {
                panic!("the {holder_kind} holder of {name} lost it to {other_kind}'s try: {e}")
            });
            guard.release().await.unwrap_or_else(|e| {
                panic!("the {holder_kind} holder of {name}: its release after {other_kind}'s tries: {e}")
            });
            let after = lock(other, &name).try_acquire().await.unwrap();
            let after = after.unwrap_or_else(|| {
                panic!("{other_kind} kept out of {name} after the {holder_kind} release")
            });
            after.release().await.unwrap();
        }
    }
    // Redisson's layout checks dlock's key after its grant wherever its
    // script cannot see it: those names are refused at least there.
    if layouts.cluster {
        assert!(
            refused >= 4,
            "only {refused} refusals of the mix on a Cluster"
        );
    }
}

/// A waiter of one layout is served soon after the other layout's holder
/// releases, though that release does not announce itself to it: it tries
/// again at least every 200 ms.
pub async fn a_waiter_is_served_after_the_other_layouts_release(layouts: &Layouts) {
    let name = unique_key("layout-mix-wait");
    for (holder_kind, holder) in layouts.both() {
        let (other_kind, other) = layouts.other_than(holder_kind);
        let guard = lock(holder, &name).acquire().await.unwrap();
        let waiter = lock(other, &name).wait(Duration::from_secs(10));
        let releaser = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        };
        let (granted, released) = tokio::join!(
            async {
                let g = waiter.acquire().await;
                (Instant::now(), g)
            },
            releaser
        );
        let (at, granted) = granted;
        let granted = granted.unwrap_or_else(|e| {
            panic!("{other_kind} waiting for {name} after a {holder_kind} holder: {e}")
        });
        let after = at.saturating_duration_since(released);
        println!("{holder_kind} release -> {other_kind} waiter granted after {after:?}");
        assert!(
            after < Duration::from_secs(2),
            "{other_kind} waiter served {after:?} after the {holder_kind} release"
        );
        granted.release().await.unwrap();
    }
}

/// Two clients of each layout take one name in turns for 3 s, each with a
/// wait: no two are ever inside at once, and both layouts are served.
pub async fn no_two_holders_across_layouts(plain_url: &str, cluster: bool) {
    let name = unique_key("layout-mix-turns");
    let inside = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(Layouts::connect(plain_url, cluster).await);
    }
    let until = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for layouts in &clients {
        for (kind, backend) in layouts.both() {
            let (backend, name, inside) = (backend.clone(), name.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                let mut turns = 0u32;
                while Instant::now() < until && turns < 500 {
                    let guard = lock(&backend, &name)
                        .wait(Duration::from_secs(5))
                        .acquire()
                        .await
                        .unwrap_or_else(|e| panic!("{kind} in turns on {name}: {e}"));
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders of {name}"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                    turns += 1;
                }
                (kind, turns)
            }));
        }
    }
    let mut by_kind = [("dlock", 0u32), ("redisson", 0u32)];
    for task in tasks {
        let (kind, turns) = task.await.unwrap();
        by_kind.iter_mut().find(|(k, _)| *k == kind).unwrap().1 += turns;
    }
    println!("turns across layouts in 3 s: {by_kind:?}");
    for (kind, turns) in by_kind {
        assert!(turns > 0, "{kind} never held {name}: {by_kind:?}");
    }
}

/// An application's own key that shares a lock's name (a string, a hash of
/// data, even with an expiry) is not a Redisson lock: dlock's layout takes
/// the lock beside it.
pub async fn an_application_key_of_the_same_name_does_not_block(
    layouts: &Layouts,
    redis_cli: impl Fn(&[&str]) -> String,
) {
    let string = unique_key("layout-mix-string");
    let hash = unique_key("layout-mix-hash");
    redis_cli(&["SET", &string, "some value", "PX", "60000"]);
    redis_cli(&["HSET", &hash, "name", "Ada", "visits:2026-11-29", "3"]);
    redis_cli(&["PEXPIRE", &hash, "60000"]);
    for name in [&string, &hash] {
        let guard = lock(&layouts.plain, name).try_acquire().await.unwrap();
        let guard = guard.unwrap_or_else(|| panic!("an application key kept the lock {name} out"));
        guard.release().await.unwrap();
    }
    assert_eq!(redis_cli(&["GET", &string]), "some value");
    assert_eq!(redis_cli(&["HGET", &hash, "name"]), "Ada");
}
