//! An operator's view of a lock key: who holds it (`GET` of the owner token,
//! whose client name is the holder; `PTTL`; the fence counter, which holds
//! the holder's fence; the waiters' queue: how many, since when) and its forced release (`DEL` and the release
//! message, so waiters wake). One script each, so the reads agree.

use std::sync::LazyLock;
use std::time::Duration;

use crate::backends::redis::transport::cluster::ClusterConn;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisError, Script, Value};

use crate::backend::holder::Waiting;
use crate::backend::refusal::About;
use crate::backends::redis::protocol::scripts::{self, KeyNames};
use crate::backends::redis::RedisBackend;
use crate::{LockError, LockInfo};

/// `{0, '', -2, '', 0, 0}` when free, else `{1, value, pttl, fence or '',
/// tickets queued, ms the oldest has waited}` (see `waiter_queue.rs` for
/// the queue). KEYS: lock, fence.
static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if not v then return {0, '', -2, '', 0, 0} end
local f = ''
if KEYS[2] ~= KEYS[1] then f = redis.call('GET', KEYS[2]) or '' end
local queue = KEYS[1] .. ':queue'
local queued = redis.call('ZCARD', queue)
local waited = 0
if queued > 0 then
  local oldest = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')[2]
  local t = redis.call('TIME')
  waited = math.max(0, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(oldest))
end
return {1, v, redis.call('PTTL', KEYS[1]), f, queued, waited}
",
    )
});

/// Deletes the lock key whoever holds it and announces the release.
/// KEYS: lock; ARGV: the release channel.
static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.pcall('PUBLISH', ARGV[1], '1')
  return 1
end
return 0
",
    )
});

/// The most `SCAN` calls of one listing (over every master of a Cluster).
const MAX_SCANS: usize = 10_000;

/// The next `SCAN` call of a listing (this layout's or Redisson's): the
/// command for `cursor`, once the listing's count of calls, `scans`, is
/// checked against [`MAX_SCANS`] and counted.
pub(in crate::backends::redis) fn next_scan(
    scans: &mut usize,
    cursor: u64,
    pattern: &str,
    prefix: &str,
    shown: &str,
) -> Result<redis::Cmd, LockError> {
    if *scans == MAX_SCANS {
        return Err(LockError::invalid_option(format!(
            "listing the locks that start with `{prefix}` on {shown} took more than {MAX_SCANS} `SCAN` calls; list a longer prefix"
        )));
    }
    *scans += 1;
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    Ok(cmd)
}

/// What [`INSPECT`] answers, read.
type Answer = (i64, Option<String>, Option<i64>, Option<String>, u64, u64);

impl RedisBackend {
    /// The names of the lock `key` on this server.
    fn names_of(&self, key: &str) -> KeyNames {
        KeyNames::new(&self.options.prefix, key).in_db(self.db)
    }

    /// Who holds the lock `key` on this server; with `fenced`, its fence
    /// (Redlock's masters keep none).
    pub(crate) async fn inspect_lock(
        &self,
        key: &str,
        fenced: bool,
    ) -> Result<Option<LockInfo>, LockError> {
        let names = self.names_of(key);
        let mut call = scripts::evalsha(&INSPECT, 2);
        call.arg(&names.lock)
            .arg(if fenced { &names.fence } else { &names.lock });
        let (held, value, pttl, fence, queued, waited): Answer =
            self.eval(&INSPECT, &call)
                .await
                .map_err(|e| self.name_refusal(e, About::Lock(key)))?;
        if held != 1 {
            return Ok(None);
        }
        let remaining = match pttl.unwrap_or(-2) {
            ms if ms >= 0 => Duration::from_millis(ms as u64),
            -1 => Duration::MAX,
            // Expired between the reads.
            _ => return Ok(None),
        };
        let fencing_token = fence.and_then(|f| f.parse::<u64>().ok());
        let holder = value
            .as_deref()
            .and_then(crate::backend::holder::holder_of)
            .map(str::to_owned);
        let info = LockInfo::new(remaining, fencing_token, holder);
        Ok(Some(if queued > 0 {
            info.with_waiting(Waiting::new(
                usize::try_from(queued).unwrap_or(usize::MAX),
                Duration::from_millis(waited),
            ))
        } else {
            info
        }))
    }

    /// Deletes the lock `key` on this server whoever holds it.
    pub(crate) async fn force_release_lock(&self, key: &str) -> Result<bool, LockError> {
        let names = self.names_of(key);
        let mut call = scripts::evalsha(&FORCE_RELEASE, 1);
        call.arg(&names.lock).arg(&names.channel);
        let freed: i64 = self
            .eval(&FORCE_RELEASE, &call)
            .await
            .map_err(|e| self.name_refusal(e, About::Lock(key)))?;
        Ok(freed == 1)
    }

    /// The held lock keys starting with `prefix`, each inspected (see
    /// [`lock_keys`](Self::lock_keys)).
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, LockInfo)>, LockError> {
        let mut held = Vec::new();
        for key in self.lock_keys(prefix).await? {
            if let Some(info) = self.inspect_lock(&key, self.options.fenced).await? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    /// The lock keys starting with `prefix` that have a lock value now,
    /// sorted: `SCAN` for `<prefix>:{…}` names on the server (or the
    /// Sentinel master), or on every master of a Cluster. At most
    /// [`MAX_LISTED`](crate::inspect::MAX_LISTED) keys and [`MAX_SCANS`]
    /// `SCAN` calls.
    pub(crate) async fn lock_keys(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.names_ending(prefix, "").await
    }

    /// As [`lock_keys`](Self::lock_keys), for the Redis names
    /// `<prefix>:{<escaped key>}<suffix>` (`:permits`: the semaphores).
    pub(crate) async fn names_ending(
        &self,
        prefix: &str,
        suffix: &str,
    ) -> Result<Vec<String>, LockError> {
        let pattern = format!("{}{}", self.scan_pattern(prefix), glob_escaped(suffix));
        let mut keys = std::collections::BTreeSet::new();
        let mut scans = 0;
        match self.conn.clone() {
            crate::backends::redis::Conn::Single(_) => {
                self.scan(&pattern, prefix, suffix, None, &mut scans, &mut keys)
                    .await?
            }
            crate::backends::redis::Conn::Cluster(mut c) => {
                for slot in self.cluster_masters(&mut c).await? {
                    self.scan(
                        &pattern,
                        prefix,
                        suffix,
                        Some((&mut c, slot)),
                        &mut scans,
                        &mut keys,
                    )
                    .await?;
                }
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// `<prefix>:{<escaped listing prefix>*}`, glob characters escaped.
    fn scan_pattern(&self, prefix: &str) -> String {
        let escaped = KeyNames::new("", prefix).lock;
        let escaped = glob_escaped(escaped[2..].trim_end_matches('}'));
        format!("{}:{{{escaped}*}}", self.options.prefix)
    }

    /// One whole `SCAN` of one server (on a Cluster, the master that serves
    /// `slot`), adding the lock keys it names to `keys`.
    async fn scan(
        &self,
        pattern: &str,
        prefix: &str,
        suffix: &str,
        mut node: Option<(&mut ClusterConn, u16)>,
        scans: &mut usize,
        keys: &mut std::collections::BTreeSet<String>,
    ) -> Result<(), LockError> {
        let mut cursor = 0u64;
        loop {
            let cmd = next_scan(scans, cursor, pattern, prefix, &self.options.shown)?;
            let (next, found): (u64, Vec<String>) = match node.as_mut() {
                None => self.query(&cmd).await?,
                Some((c, slot)) => {
                    self.count();
                    let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::new(*slot, SlotAddr::Master),
                    ));
                    let answer = c.route_command(cmd, to).await.map_err(|e| self.error(e))?;
                    redis::from_redis_value(answer).map_err(|e| self.error(RedisError::from(e)))?
                }
            };
            keys.extend(
                found
                    .iter()
                    .filter_map(|k| self.key_of(k.strip_suffix(suffix)?)),
            );
            if keys.len() > crate::backend::holder::MAX_LISTED {
                return Err(crate::backend::holder::too_many_to_list(
                    &self.options.shown,
                    prefix,
                ));
            }
            cursor = next;
            if cursor == 0 {
                return Ok(());
            }
        }
    }

    /// One slot of each master of a Cluster (the first of its ranges in
    /// `CLUSTER SLOTS`), to route a `SCAN` to that master.
    pub(in crate::backends::redis) async fn cluster_masters(
        &self,
        c: &mut ClusterConn,
    ) -> Result<Vec<u16>, LockError> {
        self.count();
        let answer: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(c)
            .await
            .map_err(|e| self.error(e))?;
        let mut masters = std::collections::BTreeMap::new();
        if let Value::Array(ranges) = answer {
            for range in ranges {
                let Value::Array(parts) = range else { continue };
                if let (Some(Value::Int(start)), Some(Value::Array(master))) =
                    (parts.first(), parts.get(2))
                {
                    // Host and port name the master.
                    let node = format!("{:?}", &master[..master.len().min(2)]);
                    if let Ok(slot) = u16::try_from(*start) {
                        masters.entry(node).or_insert(slot);
                    }
                }
            }
        }
        if masters.is_empty() {
            return Err(self.error(RedisError::from((
                redis::ErrorKind::Io,
                "`CLUSTER SLOTS` named no master: the cluster is not serving slots",
            ))));
        }
        Ok(masters.into_values().collect())
    }

    /// The lock key of a lock's Redis name (`<prefix>:{<escaped key>}`).
    fn key_of(&self, name: &str) -> Option<String> {
        let inner = name
            .strip_prefix(self.options.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        if inner.contains('{') || inner.contains('}') {
            return None;
        }
        Some(
            inner
                .replace("%7B", "{")
                .replace("%7D", "}")
                .replace("%25", "%"),
        )
    }

    /// The client name this backend writes.
    pub(crate) fn own_client_name(&self) -> &str {
        self.options
            .client_name
            .as_deref()
            .unwrap_or(crate::backend::holder::default_client_name())
    }
}

/// `text` with `SCAN`'s glob characters escaped, to match only itself.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}
