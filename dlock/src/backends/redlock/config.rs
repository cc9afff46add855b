//! The backend's configuration: the `redlock://` URL, with the options only
//! Redlock reads, turned into one `redis://` URL per master.

use std::time::Duration;

use crate::backends::redis::{MAX_TTL, REDIS_PORT};
use crate::url::options;
use crate::LockError;

pub(super) fn check_count(n: usize, shown: &str) -> Result<(), LockError> {
    if n < 3 {
        return Err(LockError::invalid_option(format!(
            "`{shown}` names {n} master(s); Redlock needs at least 3 independent masters (an odd number: 3, 5 or 7)"
        )));
    }
    Ok(())
}

/// What a `redlock://` URL says.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ParsedUrl {
    /// One `redis://` URL per master, with the shared credentials, db and parameters.
    pub(super) nodes: Vec<String>,
    pub(super) node_timeout: Option<Duration>,
    pub(super) restart_quarantine: Option<Duration>,
    pub(super) shown: String,
}

pub(super) fn parse_url(url: &str) -> Result<ParsedUrl, LockError> {
    let shown = crate::url::redact(url);
    let bad = |why: &str| LockError::invalid_option(format!("`{shown}`: {why}"));
    crate::url::parts::split(url).map_err(|why| bad(&why))?;
    let rest = url
        .strip_prefix("redlock://")
        .ok_or_else(|| bad("not a Redlock URL; write redlock://host:port,host:port,host:port"))?;
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut node_timeout = None;
    let mut restart_quarantine = None;
    let mut passed_on = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("node_timeout_ms", value)) => {
                let timeout =
                    options::millis("node_timeout_ms", value, false).map_err(|why| bad(&why))?;
                node_timeout = Some(timeout);
            }
            Some(("restart_quarantine_ms", value)) => {
                let quarantine = options::millis("restart_quarantine_ms", value, false)
                    .map_err(|why| bad(&why))?;
                if quarantine > MAX_TTL {
                    return Err(bad(&format!(
                        "`restart_quarantine_ms={value}` is longer than the maximum of {MAX_TTL:?}; give the longest ttl in use"
                    )));
                }
                restart_quarantine = Some(quarantine);
            }
            Some(("fence", _)) => {
                return Err(bad(
                    "`fence` does not apply to Redlock: it issues no fencing tokens already (`fencing_token()` is None); remove the parameter",
                ));
            }
            Some(("fence_retention", _)) => {
                return Err(bad(
                    "`fence_retention` does not apply to Redlock: it issues no fencing tokens, so it keeps no fence counter; remove the parameter",
                ));
            }
            _ => passed_on.push(pair),
        }
    }
    let query = if passed_on.is_empty() {
        String::new()
    } else {
        format!("?{}", passed_on.join("&"))
    };
    let (auth, hosts) = match before_query.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), before_query),
    };
    let (hosts, db) = match hosts.split_once('/') {
        Some((hosts, "")) => (hosts, String::new()),
        Some((hosts, db)) => (hosts, format!("/{db}")),
        None => (hosts, String::new()),
    };
    let mut seen = std::collections::HashSet::new();
    let mut nodes = Vec::new();
    for host in crate::url::parts::hosts(hosts, REDIS_PORT).map_err(|why| bad(&why))? {
        if !seen.insert(host.clone()) {
            return Err(bad(&format!(
                "the master `{host}` is named twice; a repeated master would vote twice"
            )));
        }
        nodes.push(format!("redis://{auth}{host}{db}{query}"));
    }
    check_count(nodes.len(), &shown)?;
    Ok(ParsedUrl {
        nodes,
        node_timeout,
        restart_quarantine,
        shown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_gives_one_node_url_per_master() {
        let p = parse_url("redlock://u:pw@h1:1,h2:2,h3:3/4?prefix=app&node_timeout_ms=25").unwrap();
        assert_eq!(
            p.nodes,
            [
                "redis://u:pw@h1:1/4?prefix=app",
                "redis://u:pw@h2:2/4?prefix=app",
                "redis://u:pw@h3:3/4?prefix=app"
            ]
        );
        assert_eq!(p.node_timeout, Some(Duration::from_millis(25)));
        assert_eq!(p.restart_quarantine, None);
        assert_eq!(
            p.shown,
            "redlock://u:***@h1:1,h2:2,h3:3/4?prefix=app&node_timeout_ms=25"
        );
    }

    #[test]
    fn url_turns_on_the_restart_quarantine() {
        let p = parse_url("redlock://h1:1,h2:2,h3:3?restart_quarantine_ms=30000").unwrap();
        assert_eq!(p.restart_quarantine, Some(Duration::from_secs(30)));
        assert_eq!(p.nodes[0], "redis://h1:1", "not passed on to the masters");
    }

    #[test]
    fn bad_urls_name_the_url_and_say_what_to_write() {
        for (url, says) in [
            ("redlock://:secret@h1:1,h2:2", "at least 3"),
            ("redlock://:secret@h1:1", "at least 3"),
            ("redlock://:secret@h1:1,,h2:2", "empty host"),
            ("redlock://:secret@h1:1,h2:2,h1:1", "twice"),
            (
                "redlock://:secret@h1:1,h2:2,h3:3?node_timeout_ms=0",
                "positive",
            ),
            (
                "redlock://:secret@h1:1,h2:2,h3:3?restart_quarantine_ms=soon",
                "restart_quarantine_ms=soon",
            ),
            ("redis://:secret@h1:1", "not a Redlock URL"),
            (
                "redlock://:secret@h1:1,h2:2,h3:3?fence_retention=1h",
                "`fence_retention` does not apply to Redlock",
            ),
            (
                "redlock://:secret@h1:1,h2:2,h3:3?fence=off",
                "`fence` does not apply to Redlock",
            ),
        ] {
            let msg = parse_url(url).unwrap_err().to_string();
            assert!(msg.contains(says), "{url}: {msg}");
            assert!(msg.contains(":***@h1:1"), "{url}: {msg}");
            assert!(!msg.contains("secret"), "{msg}");
        }
    }
}
