//! The Redis names of one lock in Redisson's layout (matched against
//! Redisson 4.7.0's `RedissonObject.prefixName`, `RedissonLock`,
//! `RedissonFencedLock`, and node-redisson 1.0.4's `RedissonBaseLock`).

use redis::cluster_routing::{Route, SlotAddr};

use crate::backends::redis::kinds::mix;

/// A new client id in the form of Redisson's (a random UUID, version 4).
pub(super) fn client_id() -> String {
    let high = getrandom::u64().unwrap_or_default();
    let low = getrandom::u64().unwrap_or_default();
    let hex = format!("{:016x}{:016x}", high, (low & !(0xc << 60)) | (0x8 << 60));
    format!(
        "{}-{}-4{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[13..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The names of the lock `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RedissonNames {
    /// The hash of holders: the lock's name itself, as `getLock(name)`.
    pub(super) lock: String,
    /// `RFencedLock`'s counter: `redisson_lock_token:{<name>}`.
    pub(super) fence: String,
    /// Java Redisson's unlock channel: `redisson_lock__channel:{<name>}`.
    pub(super) channel: String,
    /// node-redisson's unlock channel, where it differs from Java's (a
    /// name with a `{` that does not start with one).
    pub(super) node_channel: Option<String>,
    /// Whether the fence counter and Java's channel hash to the lock's
    /// cluster slot, so a script may name them beside it. Always on one
    /// server; on a Cluster not for names whose braces make an empty or
    /// unclosed hash tag (Redisson itself cannot lock those there).
    pub(super) same_slot: bool,
    /// dlock's own key of the name (`redis://` without the layout), which
    /// this layout's acquire finds held: one name, one lock.
    pub(super) dlock: String,
    /// Whether the acquire's script reads [`dlock`](Self::dlock) itself;
    /// else it is read after the grant (see `layouts.rs`).
    pub(super) dlock_in_script: bool,
}

impl RedissonNames {
    pub(super) fn new(key: &str, cluster: bool) -> Self {
        let fence = java_prefixed("redisson_lock_token", key);
        let channel = java_prefixed("redisson_lock__channel", key);
        let node = node_prefixed("redisson_lock__channel", key);
        let same_slot = !cluster || slot(key) == slot(&fence);
        RedissonNames {
            dlock: mix::dlock_key(key),
            dlock_in_script: !mix::needs_check_after_grant(cluster, key),
            lock: key.to_owned(),
            fence,
            node_channel: (node != channel).then_some(node),
            channel,
            same_slot,
        }
    }

    /// Every channel a release announces on and a waiter listens to.
    pub(super) fn channels(&self) -> Vec<String> {
        let mut all = vec![self.channel.clone()];
        all.extend(self.node_channel.clone());
        all
    }
}

/// Java's `prefixName`: `<prefix>:{<name>}`, or `<prefix>:<name>` when the
/// name already holds a `{` (its own hash tag, kept).
fn java_prefixed(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// node-redisson's `prefixName`: the name kept as it is only when it
/// *starts* with `{`.
fn node_prefixed(prefix: &str, name: &str) -> String {
    if name.starts_with('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

fn slot(name: &str) -> Route {
    Route::with_key(name, SlotAddr::Master)
}

/// The hash field of one dlock holder: `<client id>:<owner token>`, where
/// Redisson writes `<client id>:<thread id>`. The token is unique per
/// acquisition, so each dlock guard is a holder of its own.
pub(super) fn holder_field(client_id: &str, token: &str) -> String {
    format!("{client_id}:{token}")
}

/// The dlock client name in a holder field, if a dlock holder wrote it.
pub(super) fn holder_name(field: &str) -> Option<&str> {
    let (_, token) = field.split_once(':')?;
    crate::backend::holder::holder_of(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_java_redisson() {
        let names = RedissonNames::new("order:42", true);
        assert_eq!(names.lock, "order:42");
        assert_eq!(names.fence, "redisson_lock_token:{order:42}");
        assert_eq!(names.channel, "redisson_lock__channel:{order:42}");
        assert_eq!(names.node_channel, None);
        assert!(names.same_slot);
    }

    #[test]
    fn a_name_with_its_own_hash_tag_keeps_it() {
        let names = RedissonNames::new("{user:7}:cart", true);
        assert_eq!(names.channel, "redisson_lock__channel:{user:7}:cart");
        assert_eq!(names.node_channel, None);
        assert!(names.same_slot);
        let inner = RedissonNames::new("cart{user:7}", true);
        assert_eq!(inner.channel, "redisson_lock__channel:cart{user:7}");
        assert_eq!(
            inner.node_channel.as_deref(),
            Some("redisson_lock__channel:{cart{user:7}}")
        );
        assert_eq!(inner.channels().len(), 2);
    }

    #[test]
    fn odd_braces_leave_the_slot_on_a_cluster_only() {
        assert!(!RedissonNames::new("a{}b", true).same_slot);
        assert!(!RedissonNames::new("a}b", true).same_slot);
        assert!(RedissonNames::new("a}b", false).same_slot);
    }

    #[test]
    fn client_ids_look_like_uuids() {
        let id = client_id();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(id.matches('-').count(), 4, "{id}");
        assert_ne!(id, client_id());
    }

    #[test]
    fn holder_fields_name_dlock_holders_only() {
        let token = "0123456789abcdef0123456789abcdef@cron:42";
        let field = holder_field("6f1c", token);
        assert_eq!(holder_name(&field), Some("cron:42"));
        assert_eq!(holder_name("2b0e-uuid:1"), None);
    }
}
