//! Lua-free renewal on servers that take `SET … IFEQ` (Valkey 8.1 and
//! later, Redis 8.4 and later): detected at connect, used for lock renewals
//! instead of the compare-and-`PEXPIRE` script, which stays the fallback:
//! a server that answers the command with a syntax error later (a failover
//! or a downgrade to an older one, a Cluster node without it) gets that
//! renewal again as the script at once, and the backend renews with the
//! script from then on (`renew.rs`, [`refused`]).
//!
//! `SET <lock> <token> IFEQ <token> PX <ttl>` sets the key to the value it
//! already has, with a new expiry, only while it holds `token`: the same
//! effect as the script, as one plain command. What it saves is the script's
//! fixed cost on the server (a Lua call, its argument tables, two
//! `redis.call`s), on every renewal of every lease. Release has no Lua-free
//! form on these versions (`DELIFEQ` is Valkey 9, `DELEX … IFEQ` Redis
//! 8.4, neither on a server these tests can start), so it keeps its script.

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisResult};

/// Whether the server takes `SET … IFEQ`. The probe names a key that does
/// not exist, so a server that takes it writes nothing and answers nil; one
/// that does not answers a syntax error. Any other failure (an ACL that
/// forbids the key, a timeout) counts as "no": renewals then use the script,
/// which is always correct.
pub(crate) async fn probe<C: ConnectionLike + Send>(conn: &mut C, prefix: &str) -> bool {
    let mut cmd = redis::cmd("SET");
    cmd.arg(format!("{prefix}:{{dlock-probe}}:set-ifeq"))
        .arg("x")
        .arg("IFEQ")
        .arg("y")
        .arg("PX")
        .arg(1);
    let answer: RedisResult<Option<String>> = cmd.query_async(conn).await;
    answer.is_ok()
}

/// The renewal of one lease: extends `lock` to `ttl_ms` if it holds `token`.
/// Answers `OK` if it did, nil if the key is gone or someone else's.
pub(crate) fn renew(lock: &str, token: &str, ttl_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(lock)
        .arg(token)
        .arg("IFEQ")
        .arg(token)
        .arg("PX")
        .arg(ttl_ms);
    cmd
}

/// Whether `error` is a server's refusal of `SET … IFEQ` itself: a
/// server without the option answers `ERR syntax error` (Redis before 8.4,
/// Valkey before 8.1). Not a refusal: a connection error, a timeout, or an
/// error about something else, after which the script would fare no
/// better.
pub(crate) fn refused(error: &RedisError) -> bool {
    // Matched on the text: in a pipeline's answer the server's error may
    // come back wrapped, without its code.
    !error.is_io_error()
        && error
            .to_string()
            .to_ascii_lowercase()
            .contains("syntax error")
}

/// Reads [`renew`]'s answer as the renewal script's: 1 renewed, 0 refused.
pub(crate) fn renewed(answer: Option<String>) -> i64 {
    i64::from(answer.is_some())
}
