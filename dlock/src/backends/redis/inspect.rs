//! An operator's view of a lock key: who holds it (`GET` of the owner token,
//! whose client name is the holder; `PTTL`; the fence counter, which holds
//! the holder's fence) and its forced release (`DEL` and the release
//! message, so waiters wake). One script each, so the reads agree.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::refused::About;
use super::scripts::{self, KeyNames};
use super::RedisBackend;
use crate::{LockError, LockInfo};

/// `{0, '', -2, ''}` when free, else `{1, value, pttl, fence or ''}`. KEYS: lock, fence.
static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if not v then return {0, '', -2, ''} end
local f = ''
if KEYS[2] ~= KEYS[1] then f = redis.call('GET', KEYS[2]) or '' end
return {1, v, redis.call('PTTL', KEYS[1]), f}
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

/// The most `SCAN` calls of one listing.
const MAX_SCANS: usize = 10_000;

/// What [`INSPECT`] answers, read.
type Answer = (i64, Option<String>, Option<i64>, Option<String>);

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
        let (held, value, pttl, fence): Answer = self
            .eval(&INSPECT, &call)
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
            .and_then(crate::inspect::holder_of)
            .map(str::to_owned);
        Ok(Some(LockInfo::new(remaining, fencing_token, holder)))
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

    /// The held lock keys starting with `prefix` on a single server (or
    /// the Sentinel master): `SCAN` for `<prefix>:{…}` names, then each
    /// inspected. A Cluster would need a scan per node: not supported.
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, LockInfo)>, LockError> {
        if !matches!(self.conn, super::Conn::Single(_)) {
            return Err(crate::inspect::not_supported(
                &self.options.shown,
                "listing locks on a Redis Cluster",
            ));
        }
        let mut pattern = format!("{}:{{", self.options.prefix);
        for c in KeyNames::new("", prefix).lock[2..]
            .trim_end_matches('}')
            .chars()
        {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str("*}");
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        for _ in 0..MAX_SCANS {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, found): (u64, Vec<String>) = self.query(&cmd).await?;
            keys.extend(found.iter().filter_map(|k| self.key_of(k)));
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        if cursor != 0 {
            return Err(self.error(redis::RedisError::from((
                redis::ErrorKind::Io,
                "too many keys to list; give a longer prefix",
            ))));
        }
        keys.sort();
        keys.dedup();
        let mut held = Vec::new();
        for key in keys {
            if let Some(info) = self.inspect_lock(&key, true).await? {
                held.push((key, info));
            }
        }
        Ok(held)
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
            .unwrap_or(crate::inspect::default_client_name())
    }
}
