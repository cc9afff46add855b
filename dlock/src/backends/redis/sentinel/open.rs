//! Sentinels anyone may talk to, in front of a master with a password.
//!
//! A sentinel without a password lets any client that reaches it run
//! `SENTINEL REMOVE` and `SENTINEL MONITOR`: it then names a master of the
//! client's choosing, and dlock would send that node the master's password
//! (`AUTH`). Redis sentinels have no password by default, so this is the
//! ordinary setup, not a rare one.
//!
//! dlock therefore refuses, before any connection, a `redis+sentinel://`
//! URL that gives the master a password but gives the sentinels none: dlock
//! itself would talk to them unauthenticated, so they answer anyone. The
//! fixes, named in the error:
//! - `?sentinel_password=` (and `?sentinel_user=`): the sentinels'
//!   `requirepass` (or ACL user), so only clients that know it reconfigure
//!   them;
//! - `rediss+sentinel://`: TLS to the sentinels and to the master, whose
//!   certificate must be valid for its address under `?ca=` (or the system
//!   roots), so the password goes to no node without one;
//! - `?sentinel_auth=none`: the operator accepts open sentinels (they are
//!   reachable only from trusted hosts, say); dlock logs a `WARN` at
//!   connect then.
//!
//! Refusing rather than warning: a warning is read after the password was
//! sent, and a careful user expects a secret not to go to a node anyone
//! could name.

use super::super::config::SentinelTarget;

/// `?sentinel_auth=`'s value: `none` accepts sentinels without a password.
pub(in crate::backends::redis) fn parse_sentinel_auth(value: &str) -> Result<bool, String> {
    match value {
        "none" => Ok(true),
        other => Err(format!(
            "`sentinel_auth={other}`: the only value is `none` (accept sentinels without a password although the master has one); give the sentinels' password with `sentinel_password=` instead"
        )),
    }
}

/// Refuses a master password sent on the word of sentinels that answer
/// anyone; `open_accepted` is `?sentinel_auth=none`.
pub(in crate::backends::redis) fn refuse_open_sentinels(
    target: &SentinelTarget,
    tls: bool,
    open_accepted: bool,
) -> Result<(), String> {
    let sentinels_authenticated =
        target.sentinel_password.is_some() || target.sentinel_user.is_some();
    if target.password.is_none() || sentinels_authenticated || tls {
        return Ok(());
    }
    if open_accepted {
        tracing::warn!(
            master = %target.master,
            "dlock: the sentinels have no password (`sentinel_auth=none`): anyone who reaches them can point dlock at another node, which then receives the master's password"
        );
        return Ok(());
    }
    Err(
        "the master has a password but the sentinels get none: anyone who reaches a sentinel without a password can point it (SENTINEL REMOVE + MONITOR) at a node of their own, which would receive the master's password. \
         Give the sentinels a password (`requirepass` in sentinel.conf) and pass it as `?sentinel_password=`, or use `rediss+sentinel://` (TLS, the master's certificate checked), \
         or accept open sentinels with `?sentinel_auth=none`"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::super::config::RedisOptions;

    fn parsed(url: &str) -> Result<(), String> {
        RedisOptions::parse(url)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_master_password_needs_sentinels_with_one() {
        let refused = parsed("redis+sentinel://:masterpw@127.0.0.1:26379/mm").unwrap_err();
        assert!(
            refused.contains("sentinel_password") && refused.contains("sentinel_auth=none"),
            "{refused}"
        );
        assert!(
            !refused.contains("masterpw"),
            "the password is not shown: {refused}"
        );
        let refused = parsed("redis+sentinel://app:pw@127.0.0.1:26379/mm").unwrap_err();
        assert!(refused.contains("SENTINEL REMOVE"), "{refused}");
        for fine in [
            "redis+sentinel://127.0.0.1:26379/mm",
            "redis+sentinel://:masterpw@127.0.0.1:26379/mm?sentinel_password=s",
            "redis+sentinel://:masterpw@127.0.0.1:26379/mm?sentinel_user=u&sentinel_password=s",
            "redis+sentinel://:masterpw@127.0.0.1:26379/mm?sentinel_auth=none",
        ] {
            parsed(fine).unwrap_or_else(|e| panic!("{fine}: {e}"));
        }
        let odd = parsed("redis+sentinel://:pw@127.0.0.1:26379/mm?sentinel_auth=yes").unwrap_err();
        assert!(odd.contains("the only value is `none`"), "{odd}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_to_sentinels_and_master_is_a_fix() {
        parsed("rediss+sentinel://:masterpw@127.0.0.1:26379/mm").unwrap();
    }
}
