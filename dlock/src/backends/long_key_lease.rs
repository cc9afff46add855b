//! A lease of a long key, for the tests of how a backend cuts renewal reads
//! by count and by bytes.

use std::time::{Duration, Instant};

use crate::backend::Lease;

/// A lease of the key `k` × `key_len`, with a token as long as a UUID's;
/// `fencing_token` and `resource` are the backend's.
pub(crate) fn long_key_lease(
    key_len: usize,
    fencing_token: Option<u64>,
    resource: String,
) -> Lease {
    Lease {
        key: "k".repeat(key_len),
        token: "t".repeat(36),
        ttl: Duration::from_secs(3),
        fencing_token,
        valid_until: Instant::now(),
        resource,
    }
}
