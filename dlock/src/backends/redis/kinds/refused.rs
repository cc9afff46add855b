//! A request Redis refused for the ACL (`NOPERM`: a command, key or channel
//! the user may not use) becomes an error that names the lock, its keys
//! and channel, and the grant dlock needs.

use crate::backend::refusal::About;
use crate::backend::refusal::{explain, says, SEE_PERMISSIONS};
use crate::backends::redis::kinds::permits::PermitNames;
use crate::backends::redis::kinds::rw::RwNames;
use crate::backends::redis::protocol::scripts::KeyNames;
use crate::backends::redis::RedisBackend;
use crate::LockError;

/// The commands an ACL user of dlock needs, as `ACL SETUSER` takes them:
/// what dlock sends directly and what its scripts call (the ACL checks a
/// script's commands one by one). With `~<prefix>:*` and `&<prefix>:*`
/// this is the whole grant (Permissions in dlock::guide::backends; the
/// conformance, read-write and semaphore suites run with exactly it).
///
/// - `+info` and `+wait` are for replica acknowledgement: the default
///   `?replicas=auto` counts replicas with `INFO replication` and waits
///   for them with `WAIT` (`?replicas=0` needs neither; `?aof=` adds
///   `+waitaof`). A database other than 0 adds `+select`.
/// - Optional: `+config|get` lets dlock see whether the server sends
///   keyspace notifications, and `&__keyspace@<db>__:<prefix>:*` lets it
///   subscribe to them; without them waiters re-check instead.
pub const ACL_COMMANDS: &str = "+ping +evalsha +script|load +get +mget +set +del +exists +pttl +pexpire +pexpireat +time +zadd +zrem +zrange +zscore +zcard +zremrangebyscore +publish +subscribe +unsubscribe +info +wait";

/// What listing locks ([`list_locks`](crate::list_locks), `dlock list`)
/// adds to [`ACL_COMMANDS`]: `SCAN`, which names the database's keys (not
/// their values) whatever the key patterns, so grant it where an operator
/// lists; a Cluster's client also needs `+cluster|slots`.
///
/// ```
/// assert_eq!(dlock::backends::redis::ACL_LIST_COMMANDS, "+scan");
/// ```
pub const ACL_LIST_COMMANDS: &str = "+scan";

impl RedisBackend {
    /// `error`, or, if Redis refused it (`NOPERM`), an error that names
    /// `about`, its keys and channel, and the ACL rule dlock needs.
    pub(in crate::backends::redis) fn name_refusal(
        &self,
        error: LockError,
        about: About<'_>,
    ) -> LockError {
        explain(
            error,
            |source| says(source, "NOPERM") || says(source, "NoPerm"),
            || {
                let prefix = &self.options.prefix;
                let (keys, channel) = match about {
                    About::Lock(key) | About::Election(key) => {
                        let n = KeyNames::new(prefix, key).in_db(self.db);
                        (format!("`{}`, `{}`", n.lock, n.fence), n.channel)
                    }
                    About::Semaphore(name) => {
                        let n = PermitNames::new(prefix, name).in_db(self.db);
                        (format!("`{}`", n.set), n.channel)
                    }
                    About::Rw(key) => {
                        let n = RwNames::new(prefix, key).in_db(self.db);
                        (format!("`{}`, `{}`, ...", n.readers, n.writer), n.channel)
                    }
                };
                let (kind, name) = (about.kind(), about.name());
                format!(
                    "Redis refused a request for the {kind} `{name}` (keys {keys}, channel `{channel}`): the ACL user needs `~{prefix}:* &{prefix}:* {ACL_COMMANDS}` ({SEE_PERMISSIONS})"
                )
            },
        )
    }

    /// `error`, or, if Redis refused what `connect` sends (loading the
    /// scripts, `PING`), an error that names the ACL rule dlock needs.
    pub(in crate::backends::redis) fn name_connect_refusal(&self, error: LockError) -> LockError {
        explain(
            error,
            |source| says(source, "NOPERM") || says(source, "NoPerm"),
            || {
                let prefix = &self.options.prefix;
                format!(
                    "Redis refused what dlock sends at connect: the ACL user needs `~{prefix}:* &{prefix}:* {ACL_COMMANDS}` ({SEE_PERMISSIONS})"
                )
            },
        )
    }

    /// `error`, or, if Redis refused a listing, an error that names the
    /// prefix and the grant a listing adds.
    pub(in crate::backends::redis) fn name_list_refusal(
        &self,
        error: LockError,
        prefix: &str,
    ) -> LockError {
        explain(
            error,
            |source| says(source, "NOPERM") || says(source, "NoPerm"),
            || {
                let names = &self.options.prefix;
                format!(
                    "Redis refused to list the locks that start with `{prefix}`: the ACL user needs `~{names}:* &{names}:* {ACL_COMMANDS} {ACL_LIST_COMMANDS}` ({SEE_PERMISSIONS})"
                )
            },
        )
    }

    /// Each failed renewal's error, explained (see [`Self::name_refusal`]).
    pub(in crate::backends::redis) fn name_refusals<'a>(
        &self,
        leases: &'a [crate::backend::Lease],
        renewed: Vec<Result<crate::backend::Renewal, LockError>>,
        about: impl Fn(&'a str) -> About<'a>,
    ) -> Vec<Result<crate::backend::Renewal, LockError>> {
        renewed
            .into_iter()
            .zip(leases)
            .map(|(r, lease)| r.map_err(|e| self.name_refusal(e, about(&lease.key))))
            .collect()
    }
}
