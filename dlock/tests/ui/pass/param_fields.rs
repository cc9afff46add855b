// Placeholders reach into parameters: fields, nested fields, tuple fields,
// references; `{{` and `}}` are literal braces.
use dlock::{distributed_lock, LockError, LockGuard};

struct Tenant {
    name: String,
}

struct User {
    id: u32,
    tenant: Tenant,
    pair: (u8, &'static str),
}

#[distributed_lock(key = "{{user}}:{user.tenant.name}/{user.id}/{user.pair.1}/{n}")]
async fn key_of(user: &User, n: usize, guard: &LockGuard) -> Result<String, LockError> {
    Ok(guard.key().to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    let user = User {
        id: 7,
        tenant: Tenant { name: "acme".into() },
        pair: (1, "x"),
    };
    assert_eq!(key_of(&user, 3).await?, "{user}:acme/7/x/3");
    // The key borrows: the parameters are still usable afterwards.
    assert_eq!(user.pair.0, 1);
    Ok(())
}
