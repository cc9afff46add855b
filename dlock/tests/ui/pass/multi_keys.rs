// `keys = [..]` holds every key at once (a `MultiLock`), in one canonical
// order whatever order the templates name them in; the body runs inside
// every key's critical section.
use dlock::{distributed_lock, Lock, LockError, MultiGuard};

#[distributed_lock(keys = ["account:{from}", "account:{to}"], ttl = "30s", wait = "5s")]
async fn transfer(from: u64, to: u64, guard: &MultiGuard) -> Result<Vec<String>, LockError> {
    assert!(guard.is_held());
    // Inside the body a lock on one of the keys re-enters.
    let inner = Lock::new(format!("account:{to}")).try_acquire().await?;
    assert!(inner.is_some_and(|g| g.is_reentrant()));
    Ok(guard.keys().map(str::to_owned).collect())
}

#[distributed_lock(keys = ["ledger"])]
async fn one_key() -> Result<(), LockError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    assert_eq!(transfer(2, 1).await?, ["account:1", "account:2"]);
    // Released before `transfer` returned: the other order runs at once.
    assert_eq!(transfer(1, 2).await?, ["account:1", "account:2"]);
    one_key().await
}
