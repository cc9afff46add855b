//! Text from a server made safe to print on a terminal: a key, a holder's
//! name or an error message may hold anything a client wrote (an `ESC[2J`
//! that clears the screen, a newline that forges a line, a right-to-left
//! override that reorders one), so every one of them is printed escaped.

use std::fmt::Write;

/// Whether `c` is printed escaped: control characters (C0, DEL, C1) and
/// characters that change how text prints without printing themselves
/// (bidirectional controls, zero-width characters, line separators).
fn hidden(c: char) -> bool {
    c.is_control() || dlock::backend::invisible_char(c).is_some()
}

/// `text` for a terminal line: a backslash doubled, `\n`, `\r` and `\t` as
/// such, every other [`hidden`] character as `\u{XXXX}`; the rest as it is.
pub(crate) fn text(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => shown.push_str("\\\\"),
            '\n' => shown.push_str("\\n"),
            '\r' => shown.push_str("\\r"),
            '\t' => shown.push_str("\\t"),
            c if hidden(c) => {
                let _ = write!(shown, "\\u{{{:04X}}}", u32::from(c));
            }
            c => shown.push(c),
        }
    }
    shown
}

/// JSON text (as `serde_json` writes it, which escapes C0 only) with DEL,
/// C1 and the invisible characters escaped as `\uXXXX` too. They occur only
/// inside strings, where the escape means the same character.
pub(crate) fn json(value: &serde_json::Value) -> String {
    let mut shown = String::new();
    for c in value.to_string().chars() {
        if hidden(c) {
            let _ = write!(shown, "\\u{:04x}", u32::from(c));
        } else {
            shown.push(c);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_invisible_characters_print_escaped() {
        assert_eq!(text("order:42"), "order:42");
        assert_eq!(text("é🔒"), "é🔒");
        assert_eq!(
            text("a\u{1b}[2J\nx: held by y\u{7f}\u{85}\u{202e}\u{200b}\\"),
            "a\\u{001B}[2J\\nx: held by y\\u{007F}\\u{0085}\\u{202E}\\u{200B}\\\\"
        );
        let value = serde_json::json!({ "key": "a\u{1b}\n\u{9b}\u{2066}b" });
        let out = json(&value);
        assert_eq!(out, r#"{"key":"a\u001b\n\u009b\u2066b"}"#);
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back, value, "the escapes mean the same text");
    }
}
