//! Small URL helpers shared by `connect` and the backends.

#[cfg(url_backend)]
pub(crate) mod options;
#[cfg(server_backend)]
pub(crate) mod parts;
#[cfg(url_backend)]
pub(crate) mod prefix;

/// Returns `url` with any password replaced by `***`, for `Debug`, errors and logs.
///
/// Works on every URL form dlock accepts, including multi-host ones
/// (`redlock://h1:1,h2:2`), which generic URL parsers reject, and on URLs
/// that do not parse at all: a password may hold `/`, `?`, `#` or `@`
/// unescaped, so everything up to the *last* `@` counts as credentials and
/// only a user name (the text before the first `:`, if it holds none of
/// those characters) is kept. That also hides a query value holding `@`:
/// showing too little is the safe side.
///
/// ```
/// assert_eq!(dlock::url::redact("redis://app:s3cret@10.0.0.1:6379/0"), "redis://app:***@10.0.0.1:6379/0");
/// assert_eq!(dlock::url::redact("redis://:s3cret@host"), "redis://:***@host");
/// assert_eq!(dlock::url::redact("redis://app:pa#ss/w@rd@host"), "redis://app:***@host");
/// assert_eq!(dlock::url::redact("etcd://h1:2379,h2:2379"), "etcd://h1:2379,h2:2379");
/// assert_eq!(
///     dlock::url::redact("redis+sentinel://h1:26379,h2:26379/mm?sentinel_password=s3cret"),
///     "redis+sentinel://h1:26379,h2:26379/mm?sentinel_password=***"
/// );
/// ```
///
/// A query parameter whose name ends in `password` is hidden the same way,
/// with the rest of the query after it.
pub fn redact(url: &str) -> String {
    redact_query_passwords(&redact_userinfo(url))
}

/// Hides the value of the first query parameter whose name ends in
/// `password` (`?sentinel_password=…`) and everything after it: a password
/// written with a raw `&` or `#` runs on past the next `&`.
fn redact_query_passwords(url: &str) -> String {
    let Some((before, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let mut shown = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((name, _)) if name.ends_with("password") => {
                shown.push(format!("{name}=***"));
                return format!("{before}?{}", shown.join("&"));
            }
            _ => shown.push(pair.to_owned()),
        }
    }
    url.to_owned()
}

fn redact_userinfo(url: &str) -> String {
    let rest_start = url.find("://").map_or(0, |end| end + 3);
    let rest = &url[rest_start..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo
        .split_once(':')
        .map(|(user, _)| user)
        .filter(|user| !user.contains(['/', '?', '#', '@']));
    let redacted_userinfo = match user {
        Some(user) => format!("{user}:***"),
        // A lone userinfo is a password for redis (`redis://secret@host`),
        // and one whose "user" holds a delimiter may be all password.
        None => "***".to_owned(),
    };
    format!("{}{}{}", &url[..rest_start], redacted_userinfo, &rest[at..])
}

/// Decodes `%XX` escapes (for passwords and names holding `@`, `:`, `&`,
/// `/`...). The error says what is wrong, without quoting `text`, which
/// may be a password.
#[cfg(url_backend)]
pub(crate) fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "a `%` escape must be followed by two hex digits".to_owned())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a `%` escape does not decode to UTF-8".to_owned())
}

/// The scheme of `url` (the part before `://`), if it has one.
pub fn scheme(url: &str) -> Option<&str> {
    url.find("://").map(|end| &url[..end])
}

/// Whether `url`'s query has `name=value` (a plain text match of one
/// pair; no decoding).
pub(crate) fn has_query_value(url: &str, name: &str, value: &str) -> bool {
    let Some((_, query)) = url.split_once('?') else {
        return false;
    };
    let query = query.split('#').next().unwrap_or("");
    query
        .split('&')
        .any(|pair| pair.split_once('=') == Some((name, value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_one_query_pair() {
        assert!(has_query_value("redis://h/?fence=off", "fence", "off"));
        assert!(has_query_value(
            "redis://h/?a=1&fence=off#x",
            "fence",
            "off"
        ));
        assert!(!has_query_value("redis://h/?fence=on", "fence", "off"));
        assert!(!has_query_value("redis://h/?xfence=off", "fence", "off"));
        assert!(!has_query_value("redis://h/fence=off", "fence", "off"));
    }

    #[test]
    fn hides_passwords_in_every_form() {
        assert_eq!(redact("redis://u:p@h:1/2"), "redis://u:***@h:1/2");
        assert_eq!(redact("rediss://u:p%40x@h"), "rediss://u:***@h");
        assert_eq!(redact("redis://pw@h"), "redis://***@h");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact("etcd://u:p@h1:1,h2:2"), "etcd://u:***@h1:1,h2:2");
    }

    #[test]
    fn hides_passwords_that_hold_delimiters() {
        for (url, want) in [
            (
                "redis://user:pa#ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            (
                "redis://user:pa?ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            (
                "redis://user:pa/ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            (
                "redis://user:p@ss@127.0.0.1:1",
                "redis://user:***@127.0.0.1:1",
            ),
            ("redis://pa#ss@127.0.0.1:1", "redis://***@127.0.0.1:1"),
            ("redis://us/er:pass@h", "redis://***@h"),
            ("zk://h:1/chroot?x=a@b", "zk://h:***@b"),
            ("redis//user:secret@h", "***@h"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn hides_password_parameters() {
        for (url, want) in [
            (
                "redis+sentinel://h:1/mm?db=2&sentinel_password=a%26b",
                "redis+sentinel://h:1/mm?db=2&sentinel_password=***",
            ),
            (
                "redis+sentinel://u:p@h:1/mm?db=1&sentinel_user=s&sentinel_password=x",
                "redis+sentinel://u:***@h:1/mm?db=1&sentinel_user=s&sentinel_password=***",
            ),
            (
                "redis+sentinel://h:1/mm?sentinel_password=ab&cd=ef&db=2",
                "redis+sentinel://h:1/mm?sentinel_password=***",
            ),
            ("redis://h:1?prefix=password", "redis://h:1?prefix=password"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn finds_the_scheme() {
        assert_eq!(scheme("redis+cluster://h:1"), Some("redis+cluster"));
        assert_eq!(scheme("h:1"), None);
    }
}
