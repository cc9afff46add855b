//! Validation of lock keys, shared by every backend.

use crate::LockError;

/// The longest key, in bytes, that every backend can store.
pub const MAX_KEY_BYTES: usize = 512;

/// Checks that `key` is a usable lock key: UTF-8 (by type), 1..=512 bytes and
/// free of control characters. Backends escape what their store cannot hold;
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
    Ok(())
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
    }

    #[test]
    fn rejects_bad_keys_with_a_reason() {
        for bad in ["", "a\nb", "tab\there", "nul\0"] {
            let err = validate(bad).unwrap_err();
            assert!(matches!(err, LockError::InvalidKey { .. }), "{bad:?}");
        }
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let msg = validate(&long).unwrap_err().to_string();
        assert!(msg.contains("513 bytes"), "{msg}");
    }
}
