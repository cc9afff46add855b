//! The key round trip of the conformance suite: every key `dlock` accepts
//! (any printable Unicode, up to 512 bytes) works on every backend, and
//! distinct keys are distinct locks (issue 31: characters above U+FFFF could
//! not be locked on ZooKeeper).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use dlock::MAX_KEY_BYTES;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::conformance::{lock, Fixture};

/// Characters a generated key is made of, by kind, weighted towards what
/// stores escape: separators, `%`, spaces, characters above U+FFFF.
fn random_char(rng: &mut StdRng) -> char {
    const SPECIAL: &[char] = &[
        '/', '%', ' ', '.', ':', '{', '}', '*', '?', '#', '\\', '"', '\'', '@', '&', '=', '+',
    ];
    let picked = match rng.random_range(0..6) {
        0 => SPECIAL[rng.random_range(0..SPECIAL.len())],
        1 => char::from(rng.random_range(b' '..=b'~')),
        // Above U+FFFF: emoji, the first and the last code point, anything.
        2 => ['😀', '\u{10000}', '\u{10ffff}', '𝄞'][rng.random_range(0..4)],
        3 => char::from_u32(rng.random_range(0x1_0000..=0x10_ffff)).unwrap_or('𝄞'),
        // The private-use block and the specials ZooKeeper forbids.
        4 => ['\u{e000}', '\u{f8ff}', '\u{fff0}', '\u{ffff}', 'é', '日'][rng.random_range(0..6)],
        _ => char::from_u32(rng.random_range(0xa0..0x1_0000)).unwrap_or('é'),
    };
    // Control characters and the invisible ones dlock refuses in keys
    // (bidirectional controls, zero-width characters) are not valid keys.
    if picked.is_control() || dlock::backend::invisible_char(picked).is_some() {
        'x'
    } else {
        picked
    }
}

/// `base` padded with `fill` to exactly [`MAX_KEY_BYTES`] bytes (`fill`
/// repeated while it fits, then ASCII).
fn exactly_max(base: &str, fill: char) -> String {
    let mut key = base.to_owned();
    while key.len() + fill.len_utf8() <= MAX_KEY_BYTES {
        key.push(fill);
    }
    while key.len() < MAX_KEY_BYTES {
        key.push('k');
    }
    key
}

/// The keys of one run: fixed edge cases, then random keys from `seed`.
/// Each but the bare ones starts with a tag unique to the run, so cases
/// sharing a server never meet.
fn keys(seed: u64) -> Vec<String> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let tag = format!(
        "rt{}.{}:",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    );
    let mut keys: Vec<String> = [".", "..", "/", "%", " ", "%2F", "😀"]
        .iter()
        .map(|k| k.to_string())
        .collect();
    for rest in [
        "a/b",
        "a%2Fb",
        "a%2fb",
        "user:😀",
        " spaced out ",
        "\u{10ffff}",
        "%F0%9F%98%80",
    ] {
        keys.push(format!("{tag}{rest}"));
    }
    keys.push(exactly_max(&tag, 'k'));
    keys.push(exactly_max(&tag, '😀'));
    keys.push(exactly_max(&format!("{tag}/"), '%'));
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..24 {
        let len = rng.random_range(1..=40);
        let mut key = tag.clone();
        for _ in 0..len {
            let c = random_char(&mut rng);
            if key.len() + c.len_utf8() > MAX_KEY_BYTES {
                break;
            }
            key.push(c);
        }
        keys.push(key);
    }
    keys.sort();
    keys.dedup();
    keys
}

/// Every key of a generated set (edge cases, characters above U+FFFF, `/`,
/// `%`, spaces, 512-byte keys, random Unicode) is taken by one client,
/// refused to another while held, and free for it once released; the first
/// half held never blocks the second half, so distinct keys are distinct
/// locks. The seed is in every failure message.
pub async fn every_valid_key_round_trips<F: Fixture>(fixture: &F) {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let keys = keys(seed);
    let (a, b) = (fixture.backend().await, fixture.backend().await);
    let (first, second) = keys.split_at(keys.len() / 2);

    let mut held = Vec::new();
    for key in first {
        let guard = lock(&a, key).try_acquire().await;
        let guard = guard.unwrap_or_else(|e| panic!("seed {seed}: lock {key:?}: {e}"));
        let guard = guard.unwrap_or_else(|| panic!("seed {seed}: {key:?} was busy"));
        assert!(guard.is_held(), "seed {seed}: {key:?}");
        if fixture.fencing() {
            assert!(guard.fencing_token().is_some(), "seed {seed}: {key:?}");
        }
        held.push(guard);
    }
    for key in first {
        let other = lock(&b, key).try_acquire().await;
        let other = other.unwrap_or_else(|e| panic!("seed {seed}: {key:?} from b: {e}"));
        assert!(other.is_none(), "seed {seed}: {key:?} held twice");
    }
    // Distinct keys, distinct locks: none of the held half blocks the other.
    for key in second {
        let guard = lock(&b, key).try_acquire().await;
        let guard = guard.unwrap_or_else(|e| panic!("seed {seed}: lock {key:?}: {e}"));
        let guard = guard.unwrap_or_else(|| panic!("seed {seed}: {key:?} blocked by another key"));
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: release {key:?}: {e}"));
    }
    for guard in held {
        guard.release().await.expect("release a held key");
    }
    for key in first {
        let again = lock(&b, key).try_acquire().await;
        let again = again.unwrap_or_else(|e| panic!("seed {seed}: {key:?} from b: {e}"));
        let again = again.unwrap_or_else(|| panic!("seed {seed}: {key:?} not free after release"));
        again.release().await.expect("release a key taken again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_valid_and_reach_the_edges() {
        let keys = keys(7);
        assert!(keys
            .iter()
            .all(|k| !k.is_empty() && k.len() <= MAX_KEY_BYTES));
        assert!(keys.iter().all(|k| !k
            .chars()
            .any(|c| c.is_control() || dlock::backend::invisible_char(c).is_some())));
        assert!(keys.iter().filter(|k| k.len() == MAX_KEY_BYTES).count() >= 3);
        assert!(keys.iter().any(|k| k.chars().any(|c| c > '\u{ffff}')));
    }
}
