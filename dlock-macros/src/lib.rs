//! The `#[distributed_lock]` attribute of [dlock](https://docs.rs/dlock).
//!
//! Use it through the `dlock` crate (`use dlock::distributed_lock;`): the
//! code it generates calls `::dlock::...`, so `dlock` must be a dependency.
//!
//! ```text
//! #[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]
//! async fn pay(id: u64, guard: &LockGuard) -> Result<Receipt, AppError> { ... }
//! ```
//!
//! # Arguments
//!
//! | argument | value | default |
//! |---|---|---|
//! | `key` | template, required: `"order:{id}"`, `"user:{user.id}"`, `"{self.tenant}:jobs"` | — |
//! | `ttl` | lease length, humantime: `"30s"`, `"1m 30s"`, `"250ms"`; at least `"30ms"` | 30 s |
//! | `wait` | how long to wait for the lock; `"0s"` = one attempt, then `LockError::Busy` | no limit |
//! | `backend` | name registered in `dlock::registry()` | the default backend |
//! | `renew` | `true` / `false`: watchdog renewal every ttl/3 | `true` |
//! | `on_lost` | `"cancel"` / `"continue"`: what a lost lease does to the running body | `"cancel"` |
//! | `keys` | instead of `key`: an array of templates, `["account:{from}", "account:{to}"]`: hold every key at once (`dlock::MultiLock`) | — |
//! | `segments` | positive integer: take any free one of N segments `<key>#0`..`<key>#N-1` (`dlock::SegmentedLock`) | one plain lock |
//! | `mode` | `"read"` / `"write"`: one side of a read-write lock on `key` (`dlock::RwLock`) | one plain lock |
//!
//! - **`key`**: `{name}` and `{name.field.sub}` name any binding of the
//!   parameters' patterns: `id: u64`, `Path(id): Path<u64>`,
//!   `Json(req): Json<PayRequest>` (then `{req.order_id}`), and tuple,
//!   struct, nested, `ref` and `mut` bindings; `{self.field}` works in
//!   methods with a `self` receiver; tuple fields are `{pair.0}`. Each
//!   placeholder is rendered with `Display`. `{{` and `}}` are literal
//!   braces. Placeholders are checked at compile time, and so is the fixed
//!   text (no control characters, not over dlock's 512-byte key limit).
//!   Format specs (`{id:?}`) are not supported: implement `Display`, or
//!   pass a parameter that is already formatted.
//! - **`ttl`**, **`wait`**: parsed at compile time with humantime and turned
//!   into `Duration` constants.
//! - **`keys = [..]`**: each element is a key template as for `key`; the
//!   function holds all of them at once, taken in sorted order (so callers
//!   naming them in any order never deadlock), and its body runs inside
//!   every key's scope (a lock on any of them re-enters). The guard
//!   parameter is `&MultiGuard`. `key` and `keys` together, an empty `keys`
//!   and `keys` with `segments` are compile errors.
//! - **`segments = 5`**: the key names a resource split into 5 segments;
//!   each call holds one free segment (a `dlock::SegmentedLock`), and
//!   `guard.segment()` in the body says which (`Some(0..5)`).
//! - **`mode = "read"`**: the body holds a shared read lease of the
//!   `dlock::RwLock` on `key` (`RwLock::read`); other readers of the key run
//!   at the same time, a writer (`mode = "write"`, `RwLock::write`) holds it
//!   alone. The guard parameter is `&LockGuard`. `mode` with `keys` or
//!   `segments` and any value but `"read"` or `"write"` are compile errors.
//! - **`on_lost = "cancel"`**: if the lease is lost while the body runs, the
//!   body's future is dropped at its current `.await` and the function
//!   returns `Err(LockError::Lost { .. }.into())`. With `"continue"` the body
//!   runs to its end; check `guard.is_held()` yourself.
//!
//! # The function
//!
//! - It must be an `async fn` returning `Result<T, E>` with
//!   `E: From<dlock::LockError>` (a type alias for such a `Result` is fine).
//!   Lock failures (`Busy`, `Timeout`, `Lost`, backend errors) come back as
//!   `Err(E::from(error))`.
//! - An optional parameter of type `&LockGuard` (any path ending in
//!   `LockGuard`; `&MultiGuard` with `keys`) is removed from the
//!   signature: callers do not pass it, and the body sees the held guard
//!   under that name.
//! - Free functions, inherent methods (`&self`, `&mut self`, `self`) and
//!   trait-impl methods work; attributes, docs, generics, `where` clauses
//!   and visibility are kept.
//! - With `#[async_trait]` on the `impl`, write `#[distributed_lock]` on the
//!   method as usual: `#[async_trait]` runs first and the attribute wraps
//!   the future it produces. The same goes for a hand-written `fn` that
//!   returns `Pin<Box<dyn Future<Output = Result<T, E>> + ..>>` with a body
//!   of `Box::pin(async move { .. })`: the lock is taken when the future
//!   first runs, not when the function is called.
//! - The function returns only after the lease has been released, so
//!   calling it twice in a row never contends with itself.
//! - Inside one tokio task, a call to another locked function with the same
//!   key is reentrant (it does not wait for itself). The future given to
//!   `block_on` (`#[tokio::main]`'s and `#[tokio::test]`'s body) counts as
//!   one task too: it never leaves its thread, and dlock scopes it by thread.
//!
//! # What it expands to
//!
//! ```text
//! #[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]
//! async fn pay(id: u64, guard: &LockGuard) -> Result<Receipt, AppError> {
//!     let fence = guard.fencing_token();
//!     charge(id, fence).await?;
//!     Ok(Receipt { id })
//! }
//! ```
//!
//! becomes (names starting with `__dlock_` are hygienic: the body cannot
//! see them)
//!
//! ```text
//! async fn pay(id: u64) -> Result<Receipt, AppError> {
//!     // Checks, spanned on the return type, that it can carry a LockError.
//!     let __dlock_fail = ::dlock::__private::fail_with::<Result<Receipt, AppError>>();
//!     let __dlock_lock = ::dlock::__private::Lock::new(::std::format!("order:{id}"))
//!         .ttl(::core::time::Duration::new(30u64, 0u32))
//!         .wait(::core::time::Duration::new(5u64, 0u32));
//!     let __dlock_guard = match __dlock_lock.acquire().await {
//!         ::core::result::Result::Ok(guard) => guard,
//!         ::core::result::Result::Err(error) => return __dlock_fail(error),
//!     };
//!     let __dlock_output = {
//!         let guard: &LockGuard = &__dlock_guard;
//!         // Races the body against `guard.lost()` (on_lost = "cancel").
//!         ::dlock::__private::run_body(&__dlock_guard, ::dlock::__private::OnLost::Cancel, __dlock_fail, async move {
//!             // The body runs in its own async block: `return` and `?` leave
//!             // the block, not the function, so the lock is still released.
//!             // This `if` only tells the block its output type, for `?`.
//!             if let ::core::option::Option::Some(__dlock_ret) =
//!                 ::core::option::Option::None::<Result<Receipt, AppError>>
//!             {
//!                 #[allow(unreachable_code)]
//!                 return __dlock_ret;
//!             }
//!             let fence = guard.fencing_token();
//!             charge(id, fence).await?;
//!             Ok(Receipt { id })
//!         })
//!         .await
//!     };
//!     // Releases the lease (compare-and-delete) before returning.
//!     ::dlock::__private::finish(__dlock_guard, __dlock_output).await
//! }
//! ```
//!
//! # Compile errors
//!
//! Every misuse is an error on the offending token that says what to write
//! instead: a missing `key`, a placeholder that names no parameter (the
//! message lists them), a bad duration, an unknown argument (with the
//! closest valid one), a function that is not `async`, a return type that
//! cannot carry a `LockError`, two `&LockGuard` parameters. On an error the
//! function is emitted as its callers would see it (without the
//! `&LockGuard` parameter, its body kept), so the error is not followed by a
//! cascade at call sites or where a web framework checks it.
#![forbid(unsafe_code)]

mod args;
mod bindings;
mod error;
mod expand;
mod key;

use proc_macro::TokenStream;

/// Runs an `async fn` while holding a distributed lock.
///
/// `#[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s", backend
/// = "etcd", renew = true, on_lost = "cancel")]`: only `key` is required.
/// See the [crate docs](crate) for every argument and for what the
/// attribute expands to, and the `dlock` crate docs for a runnable example.
///
/// ```text
/// use dlock::{distributed_lock, LockError, LockGuard};
///
/// #[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]
/// async fn pay(id: u64, guard: &LockGuard) -> Result<u64, LockError> {
///     // Only one caller in the whole fleet runs this for a given `id` at a time.
///     Ok(guard.fencing_token().unwrap_or(0))
/// }
///
/// let fence = pay(42).await?; // callers do not pass the guard
/// ```
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
