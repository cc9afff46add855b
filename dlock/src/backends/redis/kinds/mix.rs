//! One name, one lock, whatever the layout: a `Lock` taken through
//! `redis://h` (dlock's layout, the key `dlock:{<name>}`) and one taken
//! through `redis://h?layout=redisson` (Redisson's, the hash `<name>`)
//! exclude each other, so a fleet that moves to the Redisson layout one
//! instance at a time never has two holders.
//!
//! **Where the scripts can see both keys** (one server, Sentinel's master,
//! and on a Cluster every name whose two keys share a slot: a name without
//! `{`, `}` or `%`), each layout's acquire looks at the other's key in the
//! same script, atomically:
//! - dlock's acquire (every script that takes a lock key, see
//!   `scripts.rs`) finds the Redisson lock of the name its key spells, when
//!   the key has dlock's default prefix (a prefix is a namespace: other
//!   prefixes are other locks). A Redisson lock is a hash with an expiry
//!   and a field `<uuid>:<holder>`: an application's own key that merely
//!   shares the name (a string, a hash of data) does not block the lock.
//! - the Redisson layout's acquire finds dlock's key `dlock:{<name>}`.
//!
//! A waiter kept out by the other layout is not woken by that layout's
//! release (each announces on its own channels), so it tries again at
//! least every 200 ms (`OTHER_LAYOUT_RETRY_MS` in the scripts): a fleet in
//! the middle of a move polls, five times a second, only on names that
//! both layouts hold.
//!
//! **Where they cannot** (a Cluster name whose two keys live in different
//! slots: no script may touch both), each layout looks at the other's key
//! right after a grant, in a request of its own. If the other layout holds
//! the name, the grant is given back and the acquire fails with
//! [`LockError::InvalidKey`] naming the mix: on such a name the two
//! layouts cannot wait for each other, so the mix is refused rather than
//! half-served. Two such acquires at once cannot both go through: each
//! writes its own key before it reads the other's, so the later reader
//! sees the earlier writer (both may refuse).

use std::sync::LazyLock;

use redis::Script;

use crate::backend::Lease;
use crate::backends::redis::config::DEFAULT_PREFIX;
use crate::backends::redis::protocol::scripts::{evalsha, other_layout_lua, KeyNames};
use crate::backends::redis::RedisBackend;
use crate::LockError;

/// Whether dlock's key of `name` and Redisson's may live in different
/// Cluster slots, so that no script sees both and each layout checks the
/// other's key after a grant: on a Cluster, a name holding `{`, `}` or `%`
/// (dlock escapes them inside its hash tag; Redisson keeps the name as it
/// is).
pub(crate) fn needs_check_after_grant(cluster: bool, name: &str) -> bool {
    cluster && name.contains(['{', '}', '%'])
}

/// Whether a hash is a held Redisson lock: KEYS the name; answers the
/// holder's time left (at most 200 ms), or 0.
static REDISSON_HELD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        other_layout_lua!(),
        "return redisson_left(KEYS[1]) or 0\n"
    ))
});

impl RedisBackend {
    /// `granted` as it is, unless it is a Cluster name whose Redisson key
    /// lives in another slot and Redisson's layout holds that name: then
    /// the lease is given back and the mix refused (see the module's doc).
    pub(in crate::backends::redis) async fn unless_redisson_holds(
        &self,
        granted: Option<Lease>,
    ) -> Result<Option<Lease>, LockError> {
        let Some(lease) = granted else {
            return Ok(None);
        };
        if self.options.prefix != DEFAULT_PREFIX
            || !needs_check_after_grant(self.options.cluster, &lease.key)
        {
            return Ok(Some(lease));
        }
        // The grant is not the caller's yet: dropped during the check (a
        // `timeout`, a `select!`), or refused by it, it is given back.
        let names = KeyNames::new(&self.options.prefix, &lease.key).in_db(self.db);
        let token = lease.token.clone();
        let mut unfinished = self.release_if_dropped(&names, &token);
        let mut call = evalsha(&REDISSON_HELD, 1);
        call.arg(&lease.key);
        let held = self.eval::<i64>(&REDISSON_HELD, &call).await;
        unfinished.disarm();
        if matches!(held, Ok(0)) {
            return Ok(Some(lease));
        }
        let _ = self.release_unbatched(&lease).await;
        held?;
        Err(mixed_layouts(&lease.key, &lease.resource, "redisson"))
    }
}

/// The refusal of a grant that the other layout's hold of the same name
/// made void (see the module's doc).
pub(crate) fn mixed_layouts(name: &str, dlock_key: &str, holder_layout: &str) -> LockError {
    let (ours, theirs) = if holder_layout == "redisson" {
        ("dlock's layout", "Redisson's layout (`?layout=redisson`)")
    } else {
        ("Redisson's layout (`?layout=redisson`)", "dlock's layout")
    };
    LockError::InvalidKey {
        key: name.to_owned(),
        reason: format!(
            "it is held in {theirs} on this Redis Cluster while this client locks it in {ours}; \
             for this name the two keys (`{name}` and `{dlock_key}`) live in different slots, so the \
             layouts cannot wait for each other and the mix is refused; lock this name through one \
             layout only, or use a name without `{{`, `}}` or `%` while both layouts run"
        ),
    }
}

/// dlock's key of `name` with the default prefix.
pub(crate) fn dlock_key(name: &str) -> String {
    crate::backends::redis::protocol::scripts::KeyNames::new(
        crate::backends::redis::config::DEFAULT_PREFIX,
        name,
    )
    .lock
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cluster_names_with_escaped_characters_are_checked_after_the_grant() {
        assert!(!needs_check_after_grant(false, "cart{user:7}"));
        assert!(!needs_check_after_grant(true, "order:42"));
        assert!(needs_check_after_grant(true, "{user:7}:cart"));
        assert!(needs_check_after_grant(true, "50%"));
        assert_eq!(dlock_key("a{b}"), "dlock:{a%7Bb%7D}");
    }

    #[test]
    fn the_refusal_names_both_keys_and_what_to_do() {
        let err = mixed_layouts("{user:7}:cart", "dlock:{%7Buser:7%7D:cart}", "redisson");
        let text = err.to_string();
        assert!(text.contains("Redisson's layout"), "{text}");
        assert!(text.contains("dlock:{%7Buser:7%7D:cart}"), "{text}");
        assert!(text.contains("one layout only"), "{text}");
    }
}
