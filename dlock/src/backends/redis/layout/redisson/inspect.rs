//! The operator's view of Redisson-layout locks: `inspect` (the hash's
//! first holder, its `PTTL`, `RFencedLock`'s counter) and `list` (a `SCAN`
//! of the names under a prefix on every master, each inspected).

use std::collections::BTreeSet;
use std::time::Duration;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::RedisError;

use super::names::holder_name;
use super::scripts::INSPECT;
use super::RedissonBackend;
use crate::backends::redis::kinds::inspect::next_scan;
use crate::backends::redis::protocol::scripts::evalsha;
use crate::backends::redis::Conn;
use crate::{LockError, LockInfo};

type Answer = (i64, Option<String>, Option<i64>, Option<String>);

impl RedissonBackend {
    pub(super) async fn inspect_lock(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let names = self.names(key);
        let mut call = evalsha(&INSPECT, if names.same_slot { 2 } else { 1 });
        call.arg(&names.lock);
        if names.same_slot {
            call.arg(&names.fence);
        }
        let (held, field, pttl, fence): Answer = self.redis.eval(&INSPECT, &call).await?;
        if held != 1 {
            return Ok(None);
        }
        let remaining = match pttl.unwrap_or(-2) {
            ms if ms >= 0 => Duration::from_millis(ms.unsigned_abs()),
            -1 => Duration::MAX,
            _ => return Ok(None),
        };
        let fence = match fence {
            Some(f) if names.same_slot => f,
            _ => {
                let mut get = redis::cmd("GET");
                get.arg(&names.fence);
                self.redis
                    .query::<Option<String>>(&get)
                    .await?
                    .unwrap_or_default()
            }
        };
        let holder = field.as_deref().and_then(holder_name).map(str::to_owned);
        Ok(Some(LockInfo::new(remaining, fence.parse().ok(), holder)))
    }

    pub(super) async fn list_locks(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, LockInfo)>, LockError> {
        let pattern = scan_pattern(prefix);
        let mut keys = BTreeSet::new();
        let mut scans = 0;
        match self.redis.conn.clone() {
            Conn::Single(_) => {
                self.scan(&pattern, prefix, None, &mut scans, &mut keys)
                    .await?
            }
            Conn::Cluster(mut c) => {
                for slot in self.redis.cluster_masters(&mut c).await? {
                    self.scan(&pattern, prefix, Some(slot), &mut scans, &mut keys)
                        .await?;
                }
            }
        }
        let mut held = Vec::new();
        for key in keys {
            // Keys under the prefix that are not locks (no hash) are skipped.
            if let Some(info) = self.inspect_lock(&key).await? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    /// `SCAN … MATCH pattern` on one server, or on the master of `slot`.
    async fn scan(
        &self,
        pattern: &str,
        prefix: &str,
        slot: Option<u16>,
        scans: &mut usize,
        keys: &mut BTreeSet<String>,
    ) -> Result<(), LockError> {
        let shown = &self.redis.options.shown;
        let mut cursor = 0u64;
        loop {
            let cmd = next_scan(scans, cursor, pattern, prefix, shown)?;
            let (next, found): (u64, Vec<String>) = match (slot, self.redis.conn.clone()) {
                (Some(slot), Conn::Cluster(mut c)) => {
                    let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::new(slot, SlotAddr::Master),
                    ));
                    let answer = c
                        .route_command(cmd, to)
                        .await
                        .map_err(|e| self.redis.error(e))?;
                    redis::from_redis_value(answer)
                        .map_err(|e| self.redis.error(RedisError::from(e)))?
                }
                _ => self.redis.query(&cmd).await?,
            };
            keys.extend(found.into_iter().filter(|k| k.starts_with(prefix)));
            if keys.len() > crate::backend::holder::MAX_LISTED {
                return Err(crate::backend::holder::too_many_to_list(shown, prefix));
            }
            cursor = next;
            if cursor == 0 {
                return Ok(());
            }
        }
    }
}

/// `prefix*`, with the pattern's special characters escaped.
fn scan_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

#[cfg(test)]
mod tests {
    #[test]
    fn scan_patterns_escape_globs() {
        assert_eq!(super::scan_pattern("a*b[c]"), r"a\*b\[c\]*");
    }
}
