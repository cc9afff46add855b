//! Validation of lock keys, shared by every backend.

use crate::LockError;

/// The longest key, in bytes, that every backend can store.
pub const MAX_KEY_BYTES: usize = 512;

/// Checks that `key` is a usable lock key: UTF-8 (by type), 1..=512 bytes,
/// free of control characters (C0, DEL, C1) and of characters that change
/// how text prints without printing ([`invisible_char`]: bidirectional controls,
/// zero-width characters, line and paragraph separators). Backends escape what their store cannot hold;
/// this is the one rule every backend shares.
pub(crate) fn validate(key: &str) -> Result<(), LockError> {
    let invalid = |reason: String| {
        Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason,
        })
    };
    if key.is_empty() {
        return invalid("the key is empty; name the resource, e.g. \"order:42\"".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return invalid(format!(
            "the key is {} bytes, longer than the {MAX_KEY_BYTES}-byte limit; hash long parts of it",
            key.len()
        ));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return invalid(format!(
            "the key contains the control character {c:?}; use printable characters only"
        ));
    }
    if let Some((c, what)) = key
        .chars()
        .find_map(|c| invisible_char(c).map(|what| (c, what)))
    {
        return invalid(format!(
            "the key contains U+{:04X} ({what}), which changes how a key prints without showing: \
             two keys that print alike would be different locks; remove it",
            u32::from(c)
        ));
    }
    Ok(())
}

/// What `c` is, if it is a character that changes how text prints without
/// printing itself: a bidirectional control (U+061C, U+200E, U+200F,
/// U+202A–U+202E, U+2066–U+2069), a zero-width character (U+200B–U+200D,
/// U+2060, U+FEFF), a line or paragraph separator (U+2028, U+2029). Keys
/// may not hold them (nor control characters), so two keys that print
/// alike are the same lock; a tool that prints text from a server escapes
/// them.
///
/// ```
/// use dlock::backend::invisible_char;
/// assert_eq!(invisible_char('\u{202E}'), Some("a bidirectional embedding or override"));
/// assert_eq!(invisible_char('a'), None);
/// ```
pub fn invisible_char(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{200E}' | '\u{200F}' | '\u{061C}' => "a bidirectional mark",
        '\u{202A}'..='\u{202E}' => "a bidirectional embedding or override",
        '\u{2066}'..='\u{2069}' => "a bidirectional isolate",
        '\u{200B}' => "a zero-width space",
        '\u{200C}' | '\u{200D}' => "a zero-width joiner or non-joiner",
        '\u{2060}' => "a word joiner",
        '\u{FEFF}' => "a zero-width no-break space (byte order mark)",
        '\u{2028}' => "a line separator",
        '\u{2029}' => "a paragraph separator",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_keys() {
        assert!(validate("order:42").is_ok());
        assert!(validate("stock/10001#3").is_ok());
        assert!(validate(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(validate("заказ:7").is_ok());
        assert!(
            validate("שלום:7").is_ok(),
            "right-to-left letters are not controls"
        );
        assert!(validate("emoji:🔒").is_ok());
    }

    #[test]
    fn rejects_bad_keys_with_a_reason() {
        for bad in ["", "a\nb", "tab\there", "nul\0"] {
            let err = validate(bad).unwrap_err();
            assert!(matches!(err, LockError::InvalidKey { .. }), "{bad:?}");
        }
        for (bad, code) in [
            ("admin\u{202E}txt", "U+202E"),
            ("a\u{200B}b", "U+200B"),
            ("line\u{2028}two", "U+2028"),
            ("\u{FEFF}bom", "U+FEFF"),
            ("iso\u{2066}late", "U+2066"),
            ("arabic\u{061C}mark", "U+061C"),
        ] {
            let err = validate(bad).unwrap_err();
            assert!(matches!(err, LockError::InvalidKey { .. }), "{bad:?}");
            let msg = err.to_string();
            assert!(msg.contains(code) && msg.contains("print alike"), "{msg}");
        }
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let msg = validate(&long).unwrap_err().to_string();
        assert!(msg.contains("513 bytes"), "{msg}");
    }
}
