//! A `redis+sentinel://` URL: the sentinels, the master's name, its
//! database and credentials, the sentinels' own (`?sentinel_user=`,
//! `?sentinel_password=`), `?replica_gone_after=`, and the refusal of
//! sentinels anyone may talk to, in front of a master with a password:
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

use std::time::Duration;

use crate::url::{options, percent_decode};

/// The master a `redis+sentinel://` URL names, and how to reach it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelTarget {
    /// `host:port` of each sentinel, as written (port 26379 if none).
    pub(crate) sentinels: Vec<(String, u16)>,
    /// The master's name (`sentinel monitor <name> …`).
    pub(crate) master: String,
    /// `?db=N` on the master.
    pub(crate) db: i64,
    /// The data nodes' user and password (the URL's `user:password@`).
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    /// `?sentinel_user=` / `?sentinel_password=`: the sentinels' own.
    pub(crate) sentinel_user: Option<String>,
    pub(crate) sentinel_password: Option<String>,
    /// `?replica_gone_after=<duration>`: a replica the sentinels have not
    /// heard from for this long is no longer waited for (`None`: it is,
    /// as long as they list it; see `sentinel/listed.rs`).
    pub(crate) replica_gone_after: Option<Duration>,
}

/// The sentinels' default port.
const SENTINEL_PORT: u16 = 26379;
/// A sentinel URL's own query parameters.
#[derive(Default)]
pub(in crate::backends::redis) struct SentinelQuery {
    db: i64,
    user: Option<String>,
    pub(in crate::backends::redis) password: Option<String>,
    replica_gone_after: Option<Duration>,
    /// `?sentinel_auth=none`: sentinels without a password are accepted
    /// even when the master has one (see below).
    pub(in crate::backends::redis) open_sentinels: bool,
}

impl SentinelQuery {
    pub(in crate::backends::redis) fn take(
        &mut self,
        name: &str,
        value: &str,
    ) -> Result<(), String> {
        match name {
            "db" => {
                self.db = value
                    .parse()
                    .ok()
                    .filter(|db| *db >= 0)
                    .ok_or_else(|| format!("`db={value}` is not a database number"))?;
            }
            "replica_gone_after" => {
                self.replica_gone_after = Some(options::duration(name, value)?);
            }
            "sentinel_auth" => {
                self.open_sentinels = parse_sentinel_auth(value)?;
            }
            "sentinel_user" => {
                self.user =
                    Some(percent_decode(value).map_err(|e| format!("`sentinel_user`: {e}"))?);
            }
            _ => {
                self.password =
                    Some(percent_decode(value).map_err(|e| format!("`sentinel_password`: {e}"))?);
            }
        }
        Ok(())
    }
}

/// `[user:password@]host:port,host:port/<master>` of a sentinel URL.
pub(in crate::backends::redis) fn sentinel_target(
    before_query: &str,
    query: SentinelQuery,
) -> Result<SentinelTarget, String> {
    let (auth, rest) = match before_query.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, before_query),
    };
    let (user, password) = match auth {
        None => (None, None),
        Some(auth) => {
            let (user, password) = auth.split_once(':').unwrap_or(("", auth));
            let user = percent_decode(user).map_err(|e| format!("the user name: {e}"))?;
            let password = percent_decode(password).map_err(|e| format!("the password: {e}"))?;
            ((!user.is_empty()).then_some(user), Some(password))
        }
    };
    let (hosts, master) = rest.split_once('/').ok_or(
        "a sentinel URL names the master after the hosts: redis+sentinel://host:26379,host:26380/<master-name>",
    )?;
    let master = percent_decode(master).map_err(|e| format!("the master name: {e}"))?;
    if master.is_empty() || master.contains('/') {
        return Err(format!(
            "`{master}` is not a master name; write redis+sentinel://host:26379/<master-name>"
        ));
    }
    let sentinels = crate::url::parts::hosts(hosts, SENTINEL_PORT)?
        .into_iter()
        .map(|host| (host.bare_host().to_owned(), host.port))
        .collect();
    Ok(SentinelTarget {
        sentinels,
        master,
        db: query.db,
        user,
        password,
        sentinel_user: query.user,
        sentinel_password: query.password,
        replica_gone_after: query.replica_gone_after,
    })
}

/// `?sentinel_auth=`'s value: `none` accepts sentinels without a password.
fn parse_sentinel_auth(value: &str) -> Result<bool, String> {
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
    use crate::backends::redis::config::RedisOptions;
    use crate::backends::redis::config::Replicas;
    use std::time::Duration;

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_master_and_both_credentials() {
        let o = RedisOptions::parse(
            "redis+sentinel://app:p%40ss@127.0.0.1:26379,127.0.0.1:26380,h3/mm?db=2&sentinel_user=s&sentinel_password=x%26y&replicas=1&replica_timeout=50ms&replica_gone_after=2m",
        )
        .unwrap();
        let t = o.sentinel.as_ref().unwrap();
        assert_eq!(
            t.sentinels,
            [
                ("127.0.0.1".to_owned(), 26379),
                ("127.0.0.1".to_owned(), 26380),
                ("h3".to_owned(), 26379)
            ]
        );
        assert_eq!(t.master, "mm");
        assert_eq!(t.db, 2);
        assert_eq!(t.user.as_deref(), Some("app"));
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!(t.sentinel_user.as_deref(), Some("s"));
        assert_eq!(t.sentinel_password.as_deref(), Some("x&y"));
        assert_eq!(t.replica_gone_after, Some(Duration::from_secs(120)));
        assert_eq!(o.replicas, Replicas::Exactly(1));
        assert_eq!(o.replica_timeout, Some(Duration::from_millis(50)));
        assert!(!o.cluster && !o.tls);
        assert!(
            !o.shown.contains("p%40ss") && !o.shown.contains("x%26y"),
            "{}",
            o.shown
        );
        let o = RedisOptions::parse("rediss+sentinel://:pw@[::1]:26379/mm").unwrap();
        assert!(o.tls);
        let t = o.sentinel.unwrap();
        assert_eq!(t.sentinels, [("::1".to_owned(), 26379)]);
        assert_eq!((t.user, t.password.as_deref()), (None, Some("pw")));
    }

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
