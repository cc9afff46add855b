//! Waiting for a cluster (etcd members, a ZooKeeper ensemble) to have a
//! leader again, e.g. after killing the old one.

use std::time::{Duration, Instant};

use crate::error::{HarnessError, HarnessResult};

/// Polls `leader` every 50 ms until it names a member, and returns it;
/// after `limit`, an error saying "no <`among()`> after <limit>".
pub(crate) fn wait_for_leader(
    limit: Duration,
    leader: impl Fn() -> Option<usize>,
    among: impl FnOnce() -> String,
) -> HarnessResult<usize> {
    let started = Instant::now();
    loop {
        if let Some(i) = leader() {
            return Ok(i);
        }
        if started.elapsed() >= limit {
            return Err(HarnessError::new(format!("no {} after {limit:?}", among())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
