// Generics, `where` clauses, visibility, docs and other attributes are kept.
use dlock::LockError;

mod shop {
    use dlock::{distributed_lock, LockError, LockGuard};
    use std::fmt::Display;

    /// Visible outside the module only if the macro keeps `pub(crate)`.
    #[distributed_lock(key = "item:{id}")]
    #[must_use = "the result says whether the lock was taken"]
    #[inline]
    pub(crate) async fn touch<'a, T, U: Clone>(id: T, tag: &'a U, guard: &LockGuard) -> Result<U, LockError>
    where
        T: Display + Send,
    {
        assert!(guard.key().starts_with("item:"));
        Ok(tag.clone())
    }

    // An attribute after ours is kept too: this copy is compiled out, so the
    // plain `fn hidden` below is not a duplicate.
    #[distributed_lock(key = "hidden")]
    #[cfg(any())]
    pub(crate) async fn hidden() -> Result<u8, LockError> {
        Ok(0)
    }

    pub(crate) fn hidden() -> u8 {
        1
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    assert_eq!(shop::touch("x", &5u8).await?, 5);
    assert_eq!(shop::hidden(), 1);
    Ok(())
}
