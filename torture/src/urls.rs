//! Backend URLs taken apart into their host list and put together again with other hosts,
//! so that each worker can be sent through its own fault proxies.

use std::net::{SocketAddr, ToSocketAddrs};

/// A lock service URL: `scheme://[userinfo@]host:port[,host:port…][/path][?query]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    /// `redis`, `redis+cluster`, `redlock`, `etcd`, `zk`, …
    pub scheme: String,
    /// `user:pass`, kept verbatim (never printed: see [`ServiceUrl::redacted`]).
    pub userinfo: Option<String>,
    /// `host:port` entries, as written (none for `file:///dir`).
    pub hosts: Vec<String>,
    /// Path and query, verbatim (`/chroot?session_timeout=4s`).
    pub rest: String,
}

impl ServiceUrl {
    /// Takes `url` apart.
    ///
    /// ```
    /// use dlock_torture::urls::ServiceUrl;
    /// let url = ServiceUrl::parse("zk://u:p@127.0.0.1:1,127.0.0.1:2/app?session_timeout=4s").unwrap();
    /// assert_eq!(url.hosts, ["127.0.0.1:1", "127.0.0.1:2"]);
    /// assert_eq!(url.with_hosts(&["127.0.0.1:9".into()]), "zk://u:p@127.0.0.1:9/app?session_timeout=4s");
    /// ```
    ///
    /// `file:///dir` has no host: its path is `rest`.
    ///
    /// ```
    /// use dlock_torture::urls::ServiceUrl;
    /// let url = ServiceUrl::parse("file:///tmp/locks").unwrap();
    /// assert!(url.hosts.is_empty());
    /// assert_eq!(url.with_hosts(&[]), "file:///tmp/locks");
    /// ```
    ///
    /// # Errors
    /// No `://`, or no host (but for `file://`).
    pub fn parse(url: &str) -> Result<ServiceUrl, String> {
        let (scheme, after) = url.split_once("://").ok_or_else(|| {
            "the URL has no `scheme://`; write e.g. redis://127.0.0.1:6379".to_string()
        })?;
        let query_at = after.find('?').unwrap_or(after.len());
        let (userinfo, authority_and_path) = match after[..query_at].rfind('@') {
            Some(at) => (Some(after[..at].to_string()), &after[at + 1..]),
            None => (None, after),
        };
        let host_end = authority_and_path
            .find(['/', '?'])
            .unwrap_or(authority_and_path.len());
        let hosts: Vec<String> = authority_and_path[..host_end]
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .collect();
        // `file:///dir` names a directory of this host, no server
        if hosts.is_empty() && scheme != "file" {
            return Err("the URL names no host; write host:port after `://`".to_string());
        }
        Ok(ServiceUrl {
            scheme: scheme.to_string(),
            userinfo,
            hosts,
            rest: authority_and_path[host_end..].to_string(),
        })
    }

    /// The same URL with `hosts` in place of its own.
    pub fn with_hosts(&self, hosts: &[String]) -> String {
        let userinfo = self
            .userinfo
            .as_ref()
            .map_or(String::new(), |u| format!("{u}@"));
        format!(
            "{}://{}{}{}",
            self.scheme,
            userinfo,
            hosts.join(","),
            self.rest
        )
    }

    /// The URL as printed in reports: credentials replaced by `***`.
    pub fn redacted(&self) -> String {
        let mut shown = self.clone();
        if shown.userinfo.is_some() {
            shown.userinfo = Some("***".to_string());
        }
        shown.with_hosts(&self.hosts)
    }

    /// Whether the backend gives fencing tokens (every one but Redlock).
    pub fn fencing(&self) -> bool {
        self.scheme != "redlock"
    }
}

/// `url` with the query parameter `name=value` added (after `?`, or `&` if it has a query).
///
/// ```
/// use dlock_torture::urls::with_param;
/// assert_eq!(with_param("postgres://h:1/db", "a", "b"), "postgres://h:1/db?a=b");
/// assert_eq!(with_param("postgres://h:1/db?x=1", "a", "b"), "postgres://h:1/db?x=1&a=b");
/// ```
pub fn with_param(url: &str, name: &str, value: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{name}={value}")
}

/// Resolves `host:port` to one socket address.
pub fn resolve(host: &str) -> Option<SocketAddr> {
    host.to_socket_addrs().ok()?.next()
}
