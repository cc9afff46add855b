//! The advisory keys of lock and read-write keys: the numbers
//! `pg_advisory_lock` takes, the same in every version of dlock and computable
//! in psql.

use sha2::{Digest, Sha256};

use super::config;

/// The advisory key of the lock `key` under the default prefix (`dlock`):
/// what `SELECT pg_advisory_lock(<number>)` takes to exclude a dlock holder
/// of `key`, and to be excluded by one.
///
/// The number is the first 8 bytes of the SHA-256 of `dlock:<key>` (UTF-8),
/// read as a big-endian signed 64-bit integer. It never changes between
/// versions of dlock. psql computes the same number:
///
/// ```sql
/// SELECT ('x' || left(encode(sha256(convert_to('dlock:nightly-report', 'UTF8')), 'hex'), 16))::bit(64)::bigint;
/// -- then: SELECT pg_advisory_lock(that number);
/// ```
///
/// ```
/// use dlock::backends::postgres::advisory_key;
/// assert_eq!(advisory_key("job"), advisory_key("job"));
/// assert_ne!(advisory_key("job"), advisory_key("job2"));
/// ```
pub fn advisory_key(key: &str) -> i64 {
    advisory_key_in(config::DEFAULT_PREFIX, key)
}

/// The advisory key of the lock `key` for a backend whose URL says
/// `?prefix=<prefix>`: the first 8 bytes of the SHA-256 of
/// `<prefix>:<key>`, big-endian, signed (see [`advisory_key`]). The
/// backend refuses a prefix with `:` (it would make `<prefix>:<key>`
/// ambiguous), so such a prefix names no dlock lock.
///
/// ```
/// use dlock::backends::postgres::{advisory_key, advisory_key_in};
/// assert_eq!(advisory_key_in("dlock", "job"), advisory_key("job"));
/// ```
pub fn advisory_key_in(prefix: &str, key: &str) -> i64 {
    let digest = digest(prefix, key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The two `int4` keys of the read-write lock `key` under the default
/// prefix: what `SELECT pg_advisory_lock_shared(k1, k2)` takes to read
/// beside dlock's readers and exclude its writers, and
/// `pg_advisory_lock(k1, k2)` to write.
///
/// They are bytes 8..16 of the SHA-256 of `dlock:<key>` (the bytes after
/// those of [`advisory_key`]), big-endian, split into a signed high and
/// low half. psql computes the same numbers:
///
/// ```sql
/// SELECT ('x' || substr(encode(sha256(convert_to('dlock:prices', 'UTF8')), 'hex'), 17, 8))::bit(32)::int4,
///        ('x' || substr(encode(sha256(convert_to('dlock:prices', 'UTF8')), 'hex'), 25, 8))::bit(32)::int4;
/// -- then: SELECT pg_advisory_lock_shared(k1, k2);
/// ```
///
/// The two-`int4` form is a namespace of its own in PostgreSQL,
/// so the read-write lock and the plain lock of one key are separate
/// locks. Writers also take a writer-intent key, bytes 16..24 in the same
/// form, while they wait: readers that see it held stay out. Stable
/// across versions.
///
/// ```
/// use dlock::backends::postgres::{rw_advisory_key, rw_advisory_key_in};
/// assert_eq!(rw_advisory_key("job"), rw_advisory_key_in("dlock", "job"));
/// ```
pub fn rw_advisory_key(key: &str) -> (i32, i32) {
    rw_advisory_key_in(config::DEFAULT_PREFIX, key)
}

/// The two `int4` keys of the read-write lock `key` for a backend whose
/// URL says `?prefix=<prefix>` (see [`rw_advisory_key`]).
pub fn rw_advisory_key_in(prefix: &str, key: &str) -> (i32, i32) {
    let digest = digest(prefix, key);
    let hi = i32::from_be_bytes([digest[8], digest[9], digest[10], digest[11]]);
    let lo = i32::from_be_bytes([digest[12], digest[13], digest[14], digest[15]]);
    (hi, lo)
}

/// SHA-256 of `<prefix>:<key>`.
pub(super) fn digest(prefix: &str, key: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(prefix.as_bytes())
        .chain_update(b":")
        .chain_update(key.as_bytes())
        .finalize()
        .into()
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed vectors: these numbers are a public contract (SQL code takes
    /// them), so they must never change.
    #[test]
    fn advisory_keys_never_change() {
        assert_eq!(advisory_key("job"), advisory_key_in("dlock", "job"));
        assert_eq!(advisory_key("job"), FIXED_JOB);
        assert_eq!(advisory_key_in("billing", "invoice/7"), FIXED_BILLING);
        assert_eq!(advisory_key(""), FIXED_EMPTY);
    }
    // Computed independently: `SELECT ('x' || left(encode(sha256(convert_to(
    // 'dlock:job', 'UTF8')), 'hex'), 16))::bit(64)::bigint` in psql.
    const FIXED_JOB: i64 = -468_033_427_176_012_955;

    /// The read-write lock's numbers are a public contract too.
    #[test]
    fn rw_advisory_keys_never_change() {
        assert_eq!(rw_advisory_key("job"), (-1_341_658_790, 645_462_815));
        assert_eq!(
            rw_advisory_key_in("billing", "invoice/7"),
            (1_866_582_156, 827_806_218)
        );
    }
    const FIXED_BILLING: i64 = 2_343_783_483_635_354_943;
    const FIXED_EMPTY: i64 = -5_487_780_231_628_317_163;
}
