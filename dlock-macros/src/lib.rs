//! The `#[distributed_lock]` attribute of [dlock](https://docs.rs/dlock-rs) (package
//! `dlock-rs`, library `dlock`).
//!
//! Use it through the `dlock` crate (`use dlock::distributed_lock;`): the
//! code it generates calls `::dlock::...`, so `dlock` must be a dependency,
//! and this crate comes with it. The attribute's reference is on
//! [`distributed_lock`], which `dlock` re-exports: docs.rs shows it as
//! `dlock::distributed_lock`.
#![forbid(unsafe_code)]

mod args;
mod bindings;
mod error;
mod expand;
mod guard_param;
mod key;
mod setting;
mod shape;

use proc_macro::TokenStream;

/// Runs an `async fn` while holding a distributed lock.
///
/// `#[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]`:
/// only `key` is required. The function is acquire → body with the lease
/// held → release; a lock that cannot be taken is the function's `Err`.
///
/// # Arguments
///
/// | argument | value | default |
/// |---|---|---|
/// | `key` | template, required: `"order:{id}"`, `"user:{user.id}"`, `"{self.tenant}:jobs"` | — |
/// | `ttl` | lease length, humantime: `"30s"`, `"1m 30s"`, `"250ms"`; at least `"30ms"`; or a `Duration` expression | 30 s |
/// | `wait` | how long to wait for the lock; `"0s"` = one attempt, then `LockError::Busy`; or a `Duration` expression | no limit |
/// | `backend` | name registered in `dlock::registry()`; or a `&str`/`String` expression | the default backend |
/// | `renew` | `true` / `false`: watchdog renewal every ttl/3 | `true` |
/// | `on_lost` | `"cancel"` / `"continue"`: what a lost lease does to the running body | `"cancel"` |
/// | `keys` | instead of `key`: an array of templates, `["account:{from}", "account:{to}"]`: hold every key at once (`dlock::MultiLock`) | — |
/// | `segments` | positive integer: take any free one of N segments `<key>#0`..`<key>#N-1` (`dlock::SegmentedLock`) | one plain lock |
/// | `mode` | `"read"` / `"write"`: one side of a read-write lock on `key` (`dlock::RwLock`) | one plain lock |
/// | `hold_at_least` | humantime: the key stays taken this long after the acquisition, even when the body ends sooner (`Lock::hold_at_least`): a job run once per tick across replicas; or a `Duration` expression | none |
///
/// - **`key`**: `{name}` and `{name.field.sub}` name any binding of the
///   parameters' patterns: `id: u64`, `Path(id): Path<u64>`,
///   `Json(req): Json<PayRequest>` (then `{req.order_id}`), and tuple,
///   struct, nested, `ref` and `mut` bindings; `{self.field}` works in
///   methods with a `self` receiver; tuple fields are `{pair.0}`. Each
///   placeholder is rendered with `Display`. `{{` and `}}` are literal
///   braces. Placeholders are checked at compile time, and so is the fixed
///   text (no control characters, not over dlock's 512-byte key limit).
///   Format specs (`{id:?}`) are not supported: implement `Display`, or
///   pass a parameter that is already formatted.
/// - **`ttl`**, **`wait`**, **`hold_at_least`**, **`backend`**: a string
///   literal is parsed and checked at compile time (humantime, turned into
///   a `Duration` constant); any other expression of the right type
///   (`ttl = CONFIG.lock_ttl`, `wait = self.settings.wait()`, `backend =
///   &self.backend`) is evaluated at each call, before the lock is taken,
///   in the function's scope. A `Duration` is what the durations take (an
///   out-of-range one is `LockError::InvalidOption` at the call), a `&str`
///   or `String` what `backend` takes; another type is an error on the
///   expression that says so.
/// - **`keys = [..]`**: each element is a key template as for `key`; the
///   function holds all of them at once, taken in sorted order (so callers
///   naming them in any order never deadlock), and its body runs inside
///   every key's scope (a lock on any of them re-enters). The guard
///   parameter is `&MultiGuard`. `key` and `keys` together, an empty `keys`
///   and `keys` with `segments` are compile errors.
/// - **`segments = 5`**: the key names a resource split into 5 segments;
///   each call holds one free segment (a `dlock::SegmentedLock`), and
///   `guard.segment()` in the body says which (`Some(0..5)`).
/// - **`mode = "read"`**: the body holds a shared read lease of the
///   `dlock::RwLock` on `key` (`RwLock::read`); other readers of the key run
///   at the same time, a writer (`mode = "write"`, `RwLock::write`) holds it
///   alone. The guard parameter is `&LockGuard`. `mode` with `keys` or
///   `segments` and any value but `"read"` or `"write"` are compile errors.
/// - **`hold_at_least = "50s"`**: a release before that time leaves the key
///   taken until then (on Redis and Redlock the server keeps it; elsewhere
///   the release is deferred). Over 365 days, or with `keys`, is a compile
///   error.
/// - **`on_lost = "cancel"`**: if the lease is lost while the body runs, the
///   body's future is dropped at its current `.await` and the function
///   returns `Err(LockError::Lost { .. }.into())`. With `"continue"` the body
///   runs to its end; check `guard.is_held()` yourself.
///
/// # Web handlers
///
/// - Extractors bind names through patterns, and the key may use them:
///   `async fn pay(Path(id): Path<u64>, State(app): State<App>, guard:
///   &LockGuard)` with `key = "order:{id}"`.
/// - With dlock's `axum` feature, `LockError` implements axum's
///   `IntoResponse` (409 for `Busy`/`Timeout` with `Retry-After`, 503 for an
///   outage, see `LockError::status`): return `Result<_, LockError>`, or an
///   error type built `From` it.
/// - `#[axum::debug_handler]` goes **below** `#[distributed_lock]`.
///   Attributes expand top to bottom: below, it checks the function as
///   callers see it, without the guard parameter. Above, it checks the
///   function before the guard parameter is removed and fails with
///   `E0637`/`E0061` about an argument of type `!`; this attribute cannot
///   see that it ran.
///
/// # The function
///
/// - It must be an `async fn` returning `Result<T, E>` with
///   `E: From<dlock::LockError>` (a type alias for such a `Result` is fine).
///   Lock failures (`Busy`, `Timeout`, `Lost`, backend errors) come back as
///   `Err(E::from(error))`.
/// - An optional parameter of type `&LockGuard` (any path ending in
///   `LockGuard`; `&MultiGuard` with `keys`) is removed from the
///   signature: callers do not pass it, and the body sees the held guard
///   under that name.
/// - Free functions, inherent methods (`&self`, `&mut self`, `self`) and
///   trait-impl methods work; attributes, docs, generics, `where` clauses
///   and visibility are kept.
/// - With `#[async_trait]` on the `impl`, write `#[distributed_lock]` on the
///   method as usual: `#[async_trait]` runs first and the attribute wraps
///   the future it produces. The same goes for a hand-written `fn` that
///   returns `Pin<Box<dyn Future<Output = Result<T, E>> + ..>>` with a body
///   of `Box::pin(async move { .. })`: the lock is taken when the future
///   first runs, not when the function is called.
/// - The function returns only after the lease has been released, so
///   calling it twice in a row never contends with itself.
/// - Reentrancy follows the critical section, not the task: a lock of the
///   same key (and backend) taken *inside* the body, by anything it calls
///   or awaits (also `join!` branches inside it), succeeds at once without a
///   round trip. Everything else contends like any other caller, the same
///   task's code outside the body and concurrent calls such as
///   `join!(pay(42), pay(42))` included: those run one after the other.
///
/// # What it expands to
///
/// ```text
/// #[distributed_lock(key = "order:{id}", ttl = "30s", wait = "5s")]
/// async fn pay(id: u64, guard: &LockGuard) -> Result<Receipt, AppError> {
///     let fence = guard.fencing_token();
///     charge(id, fence).await?;
///     Ok(Receipt { id })
/// }
/// ```
///
/// becomes (names starting with `__dlock_` are hygienic: the body cannot
/// see them)
///
/// ```text
/// async fn pay(id: u64) -> Result<Receipt, AppError> {
///     // Checks, spanned on the return type, that it can carry a LockError.
///     let __dlock_fail = ::dlock::__private::fail_with::<Result<Receipt, AppError>>();
///     let __dlock_lock = ::dlock::__private::Lock::new(::std::format!("order:{id}"))
///         .ttl(::core::time::Duration::new(30u64, 0u32))
///         .wait(::core::time::Duration::new(5u64, 0u32));
///     let __dlock_guard = match __dlock_lock.acquire().await {
///         ::core::result::Result::Ok(guard) => guard,
///         ::core::result::Result::Err(error) => return __dlock_fail(error),
///     };
///     let __dlock_output = {
///         let guard: &LockGuard = &__dlock_guard;
///         // Races the body against `guard.lost()` (on_lost = "cancel").
///         ::dlock::__private::run_body(&__dlock_guard, ::dlock::__private::OnLost::Cancel, __dlock_fail, async move {
///             // The body runs in its own async block: `return` and `?` leave
///             // the block, not the function, so the lock is still released.
///             // This `if` only tells the block its output type, for `?`.
///             if let ::core::option::Option::Some(__dlock_ret) =
///                 ::core::option::Option::None::<Result<Receipt, AppError>>
///             {
///                 #[allow(unreachable_code)]
///                 return __dlock_ret;
///             }
///             let fence = guard.fencing_token();
///             charge(id, fence).await?;
///             Ok(Receipt { id })
///         })
///         .await
///     };
///     // Releases the lease (compare-and-delete) before returning.
///     ::dlock::__private::finish(__dlock_guard, __dlock_output).await
/// }
/// ```
///
/// # Compile errors
///
/// Every misuse is an error on the offending token that says what to write
/// instead: a missing `key`, a placeholder that names no parameter (the
/// message lists them), a bad duration, an unknown argument (with the
/// closest valid one), a function that is not `async`, a return type that
/// cannot carry a `LockError`, two `&LockGuard` parameters, a placeholder
/// that no parameter's pattern binds (the message lists the bound names). On an error the
/// function is emitted as its callers would see it (without the
/// `&LockGuard` parameter, its body kept), so the error is not followed by a
/// cascade at call sites or where a web framework checks it.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
