//! `?fence_retention=`, read the same way by every backend that keeps a
//! fence counter per key on the server (Redis, PostgreSQL, MySQL): how long
//! a key's counter outlives the fence it last issued. Each backend says in
//! its own docs why a counter may go (its fences are `max(last + 1, the
//! server's clock in µs)`, so a lost counter restarts above them).

use std::time::Duration;

/// The retention when the URL sets none: one day.
pub(crate) const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest `?fence_retention=`: dlock's `MAX_TTL` (365 days). Past a
/// year a counter is as good as kept for ever, and below it every expiry
/// computed from it stays exact.
pub(crate) const MAX_FENCE_RETENTION: Duration = crate::lease::ttl::MAX_TTL;

/// `fence_retention=<duration>`: humantime, longer than zero, at most
/// [`MAX_FENCE_RETENTION`].
pub(crate) fn parse(value: &str) -> Result<Duration, String> {
    let retention = crate::url::options::duration("fence_retention", value)?;
    if retention > MAX_FENCE_RETENTION {
        return Err(format!(
            "`fence_retention={value}` is longer than the maximum of 365 days; give e.g. `fence_retention=1d` (the default) or `fence_retention=7d`"
        ));
    }
    Ok(retention)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_is_a_duration_up_to_a_year() {
        assert_eq!(parse("365d"), Ok(MAX_FENCE_RETENTION));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        let why = parse("366d").unwrap_err();
        assert!(
            why.contains("365 days") && why.contains("fence_retention=1d"),
            "{why}"
        );
        assert!(parse("0s").is_err() && parse("soon").is_err());
    }
}
