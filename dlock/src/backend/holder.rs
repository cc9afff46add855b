//! Who holds a lock, in the contract's words: the owner token every lock
//! lease carries (`<32 hex digits>@<client name>`), client names, what
//! [`LockBackend::inspect`] answers ([`LockInfo`]), and the errors of an
//! operation a backend cannot do or a listing too long to return. The core
//! makes the tokens; every backend stores and reads them back; `dlock::inspect`
//! and the crate root re-export the public items.
//!
//! What the identity is for, and how each backend stores it: `dlock::inspect`'s
//! docs (`inspect.rs`).

use std::sync::LazyLock;
use std::time::Duration;

use crate::backend::LockBackend;
use crate::LockError;

/// What [`Lock::inspect`](crate::Lock::inspect) sees of a held key.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://?client_name=billing-7").await?;
/// let lock = dlock::Lock::new("invoice:9").with_backend(backend);
/// assert!(lock.inspect().await?.is_none()); // free
/// let guard = lock.acquire().await?;
/// let info = lock.inspect().await?.expect("held");
/// assert_eq!(info.holder.as_deref(), Some("billing-7"));
/// assert_eq!(info.fencing_token, guard.fencing_token());
/// assert!(info.remaining <= std::time::Duration::from_secs(30));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// How long the server keeps the lease if nobody renews it (ZooKeeper:
    /// the session timeout of this client's session, an upper bound: a
    /// node lives as long as its holder's session).
    pub remaining: Duration,
    /// The holder's fencing token, where the backend gives one (not Redlock).
    pub fencing_token: Option<u64>,
    /// The client name the holder wrote (`hostname:pid` by default,
    /// `?client_name=` on its URL); `None` for a holder that is not dlock or
    /// wrote none. Never the owner token.
    pub holder: Option<String>,
    /// Who waits in the server's queue for the key, where the backend keeps
    /// one it can read at no cost to the lock (Redis's plain layout); `None`
    /// elsewhere, and on Redis when nobody is queued.
    pub waiting: Option<Waiting>,
}

/// The waiters queued on the server for a held key (see
/// [`LockInfo::waiting`]): a process queues one ticket per key, whatever
/// the number of its own waiters (they line up in the process).
///
/// ```
/// use std::time::Duration;
/// let waiting = dlock::inspect::Waiting::new(3, Duration::from_millis(1_500));
/// assert_eq!(waiting.processes, 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiting {
    /// Tickets in the queue: one per waiting process (a ticket whose
    /// waiter died stays until it lapses, a second at most, or until the
    /// queue passes it).
    pub processes: usize,
    /// How long the oldest ticket has waited, by the server's clock.
    pub oldest: Duration,
}

impl Waiting {
    /// A queue of `processes` tickets whose oldest has waited `oldest`.
    pub fn new(processes: usize, oldest: Duration) -> Self {
        Waiting { processes, oldest }
    }
}

impl LockInfo {
    /// A description of a held key, for backends outside this crate.
    ///
    /// ```
    /// use std::time::Duration;
    /// let info = dlock::LockInfo::new(Duration::from_secs(3), Some(7), Some("cron:42".into()));
    /// assert_eq!(info.fencing_token, Some(7));
    /// ```
    pub fn new(remaining: Duration, fencing_token: Option<u64>, holder: Option<String>) -> Self {
        LockInfo {
            remaining,
            fencing_token,
            holder,
            waiting: None,
        }
    }

    /// The same description with the server's queue for the key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::inspect::Waiting;
    /// let info = dlock::LockInfo::new(Duration::from_secs(3), Some(7), None)
    ///     .with_waiting(Waiting::new(2, Duration::from_millis(40)));
    /// assert_eq!(info.waiting.map(|w| w.processes), Some(2));
    /// ```
    pub fn with_waiting(mut self, waiting: Waiting) -> Self {
        self.waiting = Some(waiting);
        self
    }
}

/// Between the random part of an owner token and the client name.
const SEPARATOR: char = '@';

/// The longest client name, in bytes.
///
/// ```
/// assert!(dlock::inspect::check_client_name(&"a".repeat(dlock::inspect::MAX_CLIENT_NAME + 1)).is_err());
/// ```
pub const MAX_CLIENT_NAME: usize = 128;

/// This process's client name when the URL gives none: `hostname:pid`.
///
/// ```
/// let name = dlock::default_client_name();
/// assert!(name.ends_with(&format!(":{}", std::process::id())));
/// ```
pub fn default_client_name() -> &'static str {
    static NAME: LazyLock<String> = LazyLock::new(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .unwrap_or_default();
        let host: String = host.trim().chars().filter(|c| allowed(*c)).collect();
        let host = if host.is_empty() {
            "localhost".into()
        } else {
            host
        };
        format!("{host}:{}", std::process::id())
    });
    &NAME
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/' | '+')
}

/// Checks a `?client_name=` value: 1..=[`MAX_CLIENT_NAME`] bytes of ASCII
/// letters, digits and `. _ - : / +`.
///
/// # Errors
/// [`LockError::InvalidOption`] naming the value and what is allowed.
///
/// ```
/// assert!(dlock::inspect::check_client_name("billing-7.eu:4412").is_ok());
/// assert!(dlock::inspect::check_client_name("two words").is_err());
/// ```
pub fn check_client_name(name: &str) -> Result<String, LockError> {
    if name.is_empty() || name.len() > MAX_CLIENT_NAME || !name.chars().all(allowed) {
        return Err(LockError::invalid_option(format!(
            "`?client_name={name}` is not a client name: use 1 to {MAX_CLIENT_NAME} ASCII letters, digits and `. _ - : / +`"
        )));
    }
    Ok(name.to_owned())
}

/// The client name in a stored owner token, if it has one: what follows the
/// `@` after 32 hex digits. The random part is never returned.
///
/// ```
/// assert_eq!(dlock::inspect::holder_of("0123456789abcdef0123456789abcdef@cron:42"), Some("cron:42"));
/// assert_eq!(dlock::inspect::holder_of("0123456789abcdef0123456789abcdef"), None);
/// ```
pub fn holder_of(stored: &str) -> Option<&str> {
    let (random, name) = stored.split_once(SEPARATOR)?;
    (random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit()) && !name.is_empty())
        .then_some(name)
}

/// A new owner token for a lock lease on `backend`: random, then the
/// backend's client name.
pub(crate) fn owner_token(backend: &dyn LockBackend) -> Result<String, LockError> {
    let name = backend.client_name();
    // Made room for the name at once: one allocation per token, not two.
    let mut token = token_with_room(name.map_or(0, |n| n.len() + SEPARATOR.len_utf8()))?;
    if let Some(name) = name {
        token.push(SEPARATOR);
        token.push_str(name);
    }
    Ok(token)
}

/// The error of an operation a backend cannot do (an
/// [`InvalidOption`](LockError::InvalidOption) that names the backend).
///
/// ```
/// let e = dlock::inspect::not_supported("my-store://", "listing locks");
/// assert_eq!(e.to_string(), "invalid option: listing locks is not supported by my-store://");
/// ```
pub fn not_supported(backend: &str, what: &str) -> LockError {
    LockError::invalid_option(format!("{what} is not supported by {backend}"))
}

/// The most lock keys one listing returns (and inspects). A prefix that
/// matches more is refused with [`too_many_to_list`]: list a longer one.
///
/// ```
/// assert_eq!(dlock::inspect::MAX_LISTED, 10_000);
/// ```
pub const MAX_LISTED: usize = 10_000;

/// The error of a listing whose `prefix` matches more than [`MAX_LISTED`]
/// lock keys on `backend` (an [`InvalidOption`](LockError::InvalidOption):
/// the caller narrows the prefix).
///
/// ```
/// let e = dlock::inspect::too_many_to_list("redis://127.0.0.1:6379", "order:");
/// assert!(e.to_string().contains("more than 10000 lock keys start with `order:`"));
/// ```
pub fn too_many_to_list(backend: &str, prefix: &str) -> LockError {
    LockError::invalid_option(format!(
        "more than {MAX_LISTED} lock keys start with `{prefix}` on {backend}; list a longer prefix (e.g. `{prefix}<first characters of the keys you want>`)"
    ))
}

/// 128 random bits from the OS, hex encoded: the owner token.
pub(crate) fn new_token() -> Result<String, LockError> {
    token_with_room(0)
}

/// [`new_token`] in a string with room for `extra` more bytes.
fn token_with_room(extra: usize) -> Result<String, LockError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        LockError::backend("os-rng", format!("no randomness for the owner token: {e}"))
    })?;
    // Encoded by hand: a `format!` per byte costs more than the syscall.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut token = String::with_capacity(2 * bytes.len() + extra);
    for b in bytes {
        token.push(char::from(HEX[usize::from(b >> 4)]));
        token.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_differ() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
