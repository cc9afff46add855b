//! The bounds of a lease's ttl, which the core checks before any backend
//! sees a value, and its default.

use std::time::Duration;

/// The lease length when none is given: Redisson's watchdog default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The shortest ttl dlock accepts: below it the drift margin and a renewal
/// round trip eat the whole lease.
pub const MIN_TTL: Duration = Duration::from_millis(30);

/// The longest ttl dlock accepts: 365 days. The ttl bounds how long a
/// crashed holder keeps everyone out; with renewal on, a lock is held for as
/// long as its guard lives whatever the ttl, so "forever" needs no huge ttl.
/// A longer one (`Duration::MAX`) is [`LockError::InvalidOption`](crate::LockError::InvalidOption) on every
/// backend, rather than a value each service would clamp its own way.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 86_400);
