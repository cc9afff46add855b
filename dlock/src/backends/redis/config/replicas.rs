//! `?replicas=` and `?replica_timeout=`: how many replicas acknowledge a
//! write that grants or extends a lease, and for how long it waits for them
//! (`?aof=` is read with them in `config.rs`).

use std::time::Duration;

/// How many replicas must acknowledge (`WAIT`) each write that grants or
/// extends a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replicas {
    /// Every replica of the master: those connected to it and, behind
    /// Sentinel, those the sentinels list (refreshed as it changes; see
    /// `replicas/count.rs`); none, no `WAIT`.
    Auto,
    /// Exactly this many; 0 turns acknowledgement off.
    Exactly(u32),
}

/// The replica acknowledgement wait for a lease of `ttl` when the URL sets
/// none: a tenth of the ttl, within 10 ms and 1 s. Short against the ttl,
/// since the lease's time runs while the grant waits for its replicas.
pub(crate) fn replica_timeout(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// `replicas=auto|N`.
pub(in crate::backends::redis) fn parse_replicas(value: &str) -> Result<Replicas, String> {
    if value == "auto" {
        return Ok(Replicas::Auto);
    }
    value.parse().map(Replicas::Exactly).map_err(|_| {
        format!("`replicas={value}` is neither `auto` nor a number of replicas (0 turns acknowledgement off)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::redis::config::RedisOptions;

    #[test]
    fn replicas_default_to_auto_on_every_form() {
        for url in [
            "redis://h:1",
            "redis+cluster://h:1,h:2",
            "redis+sentinel://h:1/mm",
        ] {
            let o = RedisOptions::parse(url).unwrap();
            assert_eq!(o.replicas, Replicas::Auto, "{url}");
            assert_eq!(o.replica_timeout, None, "{url}");
        }
        let o = RedisOptions::parse("redis://h:1?aof=true").unwrap();
        assert!(o.aof);
        assert!(!RedisOptions::parse("redis://h:1").unwrap().aof);
        assert!(RedisOptions::parse("redis://h:1?aof=maybe").is_err());
        let o = RedisOptions::parse("redis://h:1?replicas=0&replica_timeout=2s").unwrap();
        assert_eq!(o.replicas, Replicas::Exactly(0));
        assert_eq!(o.replica_timeout, Some(Duration::from_secs(2)));
        assert_eq!(o.nodes, ["redis://h:1"], "not passed on to the client");
        assert_eq!(
            replica_timeout(Duration::from_secs(30)),
            Duration::from_secs(1)
        );
        assert_eq!(
            replica_timeout(Duration::from_millis(500)),
            Duration::from_millis(50)
        );
        assert_eq!(
            replica_timeout(Duration::from_millis(30)),
            Duration::from_millis(10)
        );
    }
}
