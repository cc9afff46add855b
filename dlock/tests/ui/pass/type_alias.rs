// The return type may be an alias: the check is on the type, not its spelling.
use dlock::{distributed_lock, LockError};

#[derive(Debug)]
struct MyErr(LockError);

impl From<LockError> for MyErr {
    fn from(e: LockError) -> Self {
        MyErr(e)
    }
}

type Res<T> = Result<T, MyErr>;

#[distributed_lock(key = "alias:{n}")]
async fn via_alias(n: u8) -> Res<u8> {
    if n == 0 {
        return Err(MyErr(LockError::InvalidOption { reason: "zero".into() }));
    }
    Ok(n)
}

// `impl Trait` in the return type works too.
#[distributed_lock(key = "display")]
async fn opaque() -> Result<impl std::fmt::Display, LockError> {
    Ok(5)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), MyErr> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    assert_eq!(via_alias(3).await?, 3);
    let MyErr(inner) = via_alias(0).await.unwrap_err();
    assert!(matches!(inner, LockError::InvalidOption { .. }));
    assert_eq!(opaque().await?.to_string(), "5");
    Ok(())
}
