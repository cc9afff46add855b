//! One parser for the part of a URL every backend shares: the scheme, the
//! credentials, the host list, the path and the query.
//!
//! Every backend's URL parser starts here, so that one rule decides where the
//! credentials end, for all of them, before anything is quoted in an error
//! and before any network I/O: the credentials run up to the *last* `@`. A
//! raw `/`, `?` or `#` before it is refused, since a generic URL parser (the
//! `redis` crate's, a resolver's) would end the authority there and take a
//! piece of the password for a host name; and the error never quotes any
//! of it.

use super::percent_decode;

/// A URL cut into the parts dlock reads.
#[derive(PartialEq, Eq)]
pub(crate) struct UrlParts<'a> {
    /// The text before `://`.
    pub(crate) scheme: &'a str,
    /// The credentials, decoded.
    pub(crate) credentials: Option<Credentials>,
    /// The host list, as written: from after the credentials to the first
    /// `/` or `?`.
    pub(crate) hosts: &'a str,
    /// From the first `/` after the hosts to the `?` (empty, or starting
    /// with `/`).
    pub(crate) path: &'a str,
    /// After the first `?` of the part after the credentials, without it.
    pub(crate) query: &'a str,
}

/// The decoded `user[:password]` before a URL's last `@`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// The text before the first `:` (all of it without a `:`), decoded.
    pub(crate) user: String,
    /// The text after the first `:`, decoded; `None` without a `:`.
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl std::fmt::Debug for UrlParts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlParts")
            .field("scheme", &self.scheme)
            .field("credentials", &self.credentials)
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("query", &self.query)
            .finish()
    }
}

/// What a raw delimiter in the credentials asks of the user.
pub(crate) const ENCODE_THE_PASSWORD: &str = "the credentials (the text before the last `@`) hold a raw `/`, `?` or `#`, which would end the host part for other URL readers: percent-encode the password (`/` as `%2F`, `?` as `%3F`, `#` as `%23`, `@` as `%40`), and write an `@` elsewhere in the URL as `%40`";

/// Cuts `url` into its parts. The error says what is wrong without quoting
/// anything before the last `@`; callers add the redacted URL.
pub(crate) fn split(url: &str) -> Result<UrlParts<'_>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "not a URL; write `scheme://host:port`".to_owned())?;
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let credentials = match userinfo {
        None => None,
        Some(info) => {
            if info.contains(['/', '?', '#']) {
                return Err(ENCODE_THE_PASSWORD.to_owned());
            }
            let (user, password) = match info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (info, None),
            };
            let user = percent_decode(user).map_err(|e| format!("the user name: {e}"))?;
            let password = password
                .map(percent_decode)
                .transpose()
                .map_err(|e| format!("the password: {e} (write a `%` in a password as `%25`)"))?;
            Some(Credentials { user, password })
        }
    };
    let (before_query, query) = after.split_once('?').unwrap_or((after, ""));
    let (hosts, path) = match before_query.find('/') {
        Some(slash) => before_query.split_at(slash),
        None => (before_query, ""),
    };
    Ok(UrlParts {
        scheme,
        credentials,
        hosts,
        path,
        query,
    })
}

/// One `host[:port]` of a host list; an IPv6 address keeps its brackets.
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HostPort {
    /// The host as written: a name, an IPv4 address or `[IPv6]`.
    pub(crate) host: String,
    pub(crate) port: u16,
}

#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
impl HostPort {
    /// The host without an IPv6 address's brackets, for clients that take
    /// the address alone.
    #[cfg(feature = "redis")]
    pub(crate) fn bare_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }
}

#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Reads a comma-separated host list (`h1:1,h2,[::1]:3`), giving each host
/// without a port `default_port`. Errors quote the host they are about:
/// text after the credentials, never a piece of them.
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) fn hosts(list: &str, default_port: u16) -> Result<Vec<HostPort>, String> {
    if list.is_empty() {
        return Err(format!(
            "no host; write at least one `host:port`, e.g. `127.0.0.1:{default_port}`"
        ));
    }
    list.split(',')
        .map(|host| host_port(host, default_port))
        .collect()
}

#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
fn host_port(text: &str, default_port: u16) -> Result<HostPort, String> {
    if text.is_empty() {
        return Err("an empty host in the host list; separate hosts with one `,`".into());
    }
    if text
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '?' | '#' | '@'))
    {
        return Err(format!("`{text}` is not a host name or address"));
    }
    let (host, port) = if let Some(bracketed) = text.strip_prefix('[') {
        let Some((address, after)) = bracketed.split_once(']') else {
            return Err(format!(
                "`{text}` opens an IPv6 address with `[` but never closes it"
            ));
        };
        if address.is_empty() || !address.contains(':') {
            return Err(format!("`{text}` has no IPv6 address between its brackets"));
        }
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err(format!("`{text}` has text after its IPv6 address")),
            },
        };
        (&text[..address.len() + 2], port)
    } else {
        match text.rsplit_once(':') {
            Some((_, _)) if text.matches(':').count() > 1 => {
                return Err(format!(
                    "`{text}` looks like an IPv6 address: write it in brackets, `[{text}]`"
                ))
            }
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(format!("`{text}` has a port but no host"));
    }
    if !host.starts_with('[') && host.contains(['[', ']']) {
        return Err(format!("`{text}` is not a host name or address"));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| format!("`{port}` in `{text}` is not a port number (1-65535)"))?,
    };
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_every_part() {
        let p = split("etcd://app:p%40ss@h1:1,h2:2/db?prefix=x&a=b").unwrap();
        assert_eq!(p.scheme, "etcd");
        let c = p.credentials.unwrap();
        assert_eq!(
            (c.user.as_str(), c.password.as_deref()),
            ("app", Some("p@ss"))
        );
        assert_eq!(
            (p.hosts, p.path, p.query),
            ("h1:1,h2:2", "/db", "prefix=x&a=b")
        );

        let p = split("zk://h:1?x=1").unwrap();
        assert_eq!(
            (p.credentials.is_none(), p.hosts, p.path, p.query),
            (true, "h:1", "", "x=1")
        );
        let p = split("redis://secret@h").unwrap();
        let c = p.credentials.unwrap();
        assert_eq!((c.user.as_str(), c.password), ("secret", None));
    }

    #[test]
    fn the_credentials_run_to_the_last_at() {
        let p = split("redis://u:p@ss@h:1/2").unwrap();
        assert_eq!(p.credentials.unwrap().password.as_deref(), Some("p@ss"));
        assert_eq!((p.hosts, p.path), ("h:1", "/2"));
    }

    #[test]
    fn a_raw_delimiter_before_the_last_at_is_refused_unquoted() {
        for url in [
            "etcd://app:Hunter2Secret?Tail9Zz@127.0.0.1:1",
            "etcd://app:Hunter2Secret/Tail9Zz@127.0.0.1:1",
            "redis://Hunter2Secret#Tail9Zz@127.0.0.1:1",
            "zk://app:Hunter2Secret?x=1&Tail9Zz@h1:1,h2:2",
            "redis://h:1?prefix=a@b",
        ] {
            let err = split(url).unwrap_err();
            assert_eq!(err, ENCODE_THE_PASSWORD, "{url}");
        }
        let err = split("etcd://app:Hunter2%zzTail@h").unwrap_err();
        assert!(!err.contains("Hunter2") && !err.contains("Tail"), "{err}");
        assert!(err.contains("password"), "{err}");
    }

    #[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
    #[test]
    fn host_lists_take_names_addresses_and_default_ports() {
        let list = hosts("a:1,b,[::1]:3,[::1],10.0.0.1:65535", 2379).unwrap();
        let shown: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["a:1", "b:2379", "[::1]:3", "[::1]:2379", "10.0.0.1:65535"]
        );
        #[cfg(feature = "redis")]
        assert_eq!(list[2].bare_host(), "::1");
    }

    #[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
    #[test]
    fn bad_hosts_are_named() {
        for (list, says) in [
            ("", "no host"),
            ("a,,b", "empty host"),
            ("a,", "empty host"),
            ("h:0", "not a port"),
            ("h:99999", "not a port"),
            ("h:x", "not a port"),
            (":1", "no host"),
            ("[::1", "never closes"),
            ("[]:1", "no IPv6 address"),
            ("[::1]x", "text after"),
            ("::1", "in brackets"),
            ("a b", "not a host"),
        ] {
            let err = hosts(list, 1).unwrap_err();
            assert!(err.contains(says), "{list:?}: {err}");
        }
    }

    #[test]
    fn debug_shows_no_password() {
        let p = split("etcd://app:s3cret@h").unwrap();
        let shown = format!("{p:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("app"),
            "{shown}"
        );
    }
}
