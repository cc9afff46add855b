//! How a waiter waits: `?recheck_ms=` (the cap of its re-checks of a held
//! key) and `?foreign_share=` (the share of a hand-off's time the key stays
//! free for clients that do not queue; see `waiter_queue.rs`).

use std::time::Duration;

/// The default cap of a waiter's re-checks: a release that announced itself
/// nowhere is noticed within about this long.
pub(crate) const DEFAULT_RECHECK: Duration = Duration::from_secs(1);
/// The default `?foreign_share=`: the percentage of the time a key stays
/// free, while the queue hands it on, for clients that do not queue.
pub(crate) const DEFAULT_FOREIGN_SHARE: u8 = 30;

/// `foreign_share=N`: a whole percentage from 0 (the queue's head takes a
/// vacated key at once) to 50 (the key is free as long as it was held).
pub(in crate::backends::redis) fn parse_foreign_share(value: &str) -> Result<u8, String> {
    match value.parse::<u8>() {
        Ok(share) if share <= 50 => Ok(share),
        _ => Err(format!(
            "`foreign_share={value}` is not a percentage from 0 to 50; give e.g. `foreign_share=30` (the default: clients that do not queue find the key free 30 % of the time while dlock's waiters hand it on) or `foreign_share=0` (strict queue)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::backends::redis::config::waiting::*;
    use crate::backends::redis::config::RedisOptions;

    #[test]
    fn recheck_ms_sets_the_cap_and_zero_turns_it_off() {
        let o = RedisOptions::parse("redis://h:1/3?recheck_ms=250").unwrap();
        assert_eq!(o.recheck, Some(Duration::from_millis(250)));
        assert_eq!(o.nodes, ["redis://h:1/3"], "not passed on to the client");
        let o = RedisOptions::parse("redis+cluster://h1:1,h2:2?recheck_ms=0").unwrap();
        assert_eq!(o.recheck, None);
        assert_eq!(o.nodes, ["redis://h1:1", "redis://h2:2"]);
    }

    #[test]
    fn foreign_share_is_a_percentage_up_to_half() {
        assert_eq!(parse_foreign_share("0"), Ok(0));
        assert_eq!(parse_foreign_share("20"), Ok(20));
        assert_eq!(parse_foreign_share("50"), Ok(50));
        for bad in ["51", "100", "-1", "", "20%", "0.5", "lots"] {
            let why = parse_foreign_share(bad).unwrap_err();
            assert!(why.contains(&format!("`foreign_share={bad}`")), "{why}");
            assert!(why.contains("0 to 50"), "{why}");
        }
    }
}
