// Inherent methods with `&self`, `&mut self` and `self`, keyed on fields of `self`.
use dlock::{distributed_lock, LockError, LockGuard};

struct Cart {
    id: u64,
    items: Vec<String>,
}

impl Cart {
    #[distributed_lock(key = "cart:{self.id}")]
    async fn count(&self, guard: &LockGuard) -> Result<(String, usize), LockError> {
        Ok((guard.key().to_owned(), self.items.len()))
    }

    #[distributed_lock(key = "cart:{self.id}")]
    async fn add(&mut self, item: &str) -> Result<(), LockError> {
        self.items.push(item.to_owned());
        Ok(())
    }

    #[distributed_lock(key = "cart:{self.id}")]
    async fn checkout(self) -> Result<Vec<String>, LockError> {
        Ok(self.items)
    }

    // A return type that borrows from `self`.
    #[distributed_lock(key = "cart:{self.id}")]
    async fn first(&self) -> Result<Option<&str>, LockError> {
        Ok(self.items.first().map(String::as_str))
    }

    // `self` itself, rendered with Display.
    #[distributed_lock(key = "{self}")]
    async fn by_display(&self) -> Result<(), LockError> {
        Ok(())
    }
}

impl std::fmt::Display for Cart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cart-{}", self.id)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    let mut cart = Cart { id: 5, items: vec![] };
    cart.add("apple").await?;
    assert_eq!(cart.count().await?, ("cart:5".to_owned(), 1));
    assert_eq!(cart.first().await?, Some("apple"));
    cart.by_display().await?;
    assert_eq!(cart.checkout().await?, vec!["apple".to_owned()]);
    Ok(())
}
