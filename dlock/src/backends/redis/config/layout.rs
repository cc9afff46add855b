//! `?layout=`: the Redisson layout is a URL form of its own, built by
//! `dlock::connect` (or `RedissonBackend::connect`) on the URL without it;
//! the options it cannot honour are refused here, by name.

use crate::LockError;

/// The URL parameter that selects this layout.
const LAYOUT: &str = "layout";

/// Whether a Redis URL asks for Redisson's layout (`?layout=redisson`).
pub(crate) fn asks_for_redisson(url: &str) -> bool {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    query.split('&').any(|pair| pair == "layout=redisson")
}

/// What `?layout=<value>` on a Redis URL means outside `dlock::connect`'s
/// Redisson path: the error text.
pub(in crate::backends::redis) fn layout_not_here(value: &str) -> String {
    if value == "redisson" {
        "`layout=redisson` is built by `dlock::connect` or `RedissonBackend::connect`, not `RedisBackend::connect`".to_owned()
    } else {
        format!("`layout={value}` is not a layout; the one other layout is `layout=redisson` (Redisson's RLock)")
    }
}

/// The URL without `layout=redisson`, refusing what the layout cannot
/// honour.
pub(in crate::backends::redis) fn without_layout(url: &str) -> Result<String, LockError> {
    let shown = crate::url::redact(url);
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        match name {
            LAYOUT if pair == "layout=redisson" => {}
            LAYOUT => {
                let value = pair.split_once('=').map_or("", |(_, v)| v);
                return Err(LockError::invalid_option(format!(
                    "`{shown}`: {}",
                    layout_not_here(value)
                )));
            }
            "prefix" | "fence" | "fence_retention" | "foreign_share" => {
                return Err(LockError::invalid_option(format!(
                    "`{shown}`: `{name}` does not apply to `layout=redisson`: the Redis key is the lock's name itself, as Redisson's getLock(name), and its fence counter is RFencedLock's; drop `{name}`"
                )));
            }
            "replicas" | "replica_timeout" | "aof" => {
                return Err(LockError::invalid_option(format!(
                    "`{shown}`: `{name}` does not apply to `layout=redisson`: its grants and renewals are not acknowledged by replicas (`WAIT`); drop `{name}`"
                )));
            }
            _ => kept.push(pair),
        }
    }
    Ok(if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

#[cfg(test)]
mod tests {
    use crate::backends::redis::config::layout::*;

    #[test]
    fn the_layout_parameter_is_taken_out() {
        assert!(asks_for_redisson("redis://h:1?x=1&layout=redisson"));
        assert!(!asks_for_redisson("redis://h:1"));
        assert_eq!(
            without_layout("redis://h:1?layout=redisson&timeout_ms=5").unwrap(),
            "redis://h:1?timeout_ms=5"
        );
        assert_eq!(
            without_layout("redis://h:1?layout=redisson").unwrap(),
            "redis://h:1"
        );
        let err = without_layout("redis://:pw@h:1?layout=redisson&prefix=x").unwrap_err();
        assert!(err.to_string().contains("`prefix` does not apply"), "{err}");
        let err = without_layout("redis://h:1?layout=redisson&fence=off").unwrap_err();
        assert!(err.to_string().contains("`fence` does not apply"), "{err}");
        let err = without_layout("redis://h:1?layout=redisson&replicas=1").unwrap_err();
        assert!(
            err.to_string().contains("`replicas` does not apply"),
            "{err}"
        );
        assert!(!err.to_string().contains("pw"), "{err}");
        let Err(err) =
            crate::backends::redis::config::RedisOptions::parse("redis://h:1?layout=redisson")
        else {
            panic!("RedisBackend's own parser refuses the layout");
        };
        assert!(err.to_string().contains("dlock::connect"), "{err}");
        let err = without_layout("redis://h:1?layout=redison").unwrap_err();
        assert!(err.to_string().contains("layout=redisson"), "{err}");
    }
}
