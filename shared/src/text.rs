//! Text that reaches a terminal: which characters an identifier may not hold, and how
//! stored text is printed so it cannot drive the terminal.
//!
//! An event type or id comes from a webhook; `einmal listen`, `events list` and the
//! operator commands print it. A control character there (ESC starting an escape
//! sequence, BEL, a backspace) or a Unicode format character (a bidi override such as
//! U+202E that reverses what follows, a zero-width space that hides a difference)
//! would act on the operator's terminal or disguise what it shows. Ingest refuses such
//! identifiers ([`check_identifier`], a 400 before anything is stored); whatever else
//! is printed from stored data (error messages, results, bodies, names) goes through
//! [`terminal_safe`], or [`json_terminal_safe`] for JSON text.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Unicode general category Cf (format), as of Unicode 15.1, by ranges.
const FORMAT: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),   // soft hyphen
    (0x0600, 0x0605),   // Arabic number signs
    (0x061C, 0x061C),   // Arabic letter mark
    (0x06DD, 0x06DD),   // Arabic end of ayah
    (0x070F, 0x070F),   // Syriac abbreviation mark
    (0x0890, 0x0891),   // Arabic pound / piastre mark above
    (0x08E2, 0x08E2),   // Arabic disputed end of ayah
    (0x180E, 0x180E),   // Mongolian vowel separator
    (0x200B, 0x200F),   // zero-width space, (non-)joiner, LRM, RLM
    (0x202A, 0x202E),   // bidi embeddings and overrides
    (0x2060, 0x2064),   // word joiner, invisible operators
    (0x2066, 0x206F),   // bidi isolates, deprecated format characters
    (0xFEFF, 0xFEFF),   // zero-width no-break space (BOM)
    (0xFFF9, 0xFFFB),   // interlinear annotation
    (0x110BD, 0x110BD), // Kaithi number sign
    (0x110CD, 0x110CD), // Kaithi number sign above
    (0x13430, 0x1343F), // Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3), // shorthand format controls
    (0x1D173, 0x1D17A), // musical symbol format controls
    (0xE0001, 0xE0001), // language tag
    (0xE0020, 0xE007F), // tag characters
];

/// True for what must not reach a terminal raw: control characters (Cc: C0, DEL, C1),
/// format characters (Cf: bidi controls, zero-width characters, tags), and the line
/// and paragraph separators U+2028/U+2029, which some terminals and viewers break on.
pub fn is_unsafe(c: char) -> bool {
    if c.is_control() {
        return true;
    }
    let n = u32::from(c);
    if n == 0x2028 || n == 0x2029 {
        return true;
    }
    n >= 0xAD
        && FORMAT
            .binary_search_by(|&(lo, hi)| {
                if hi < n {
                    std::cmp::Ordering::Less
                } else if lo > n {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
}

/// `Err` naming the first unsafe character of `value` (by code point, never the
/// character itself) when it holds one: `"event type contains U+001B (a control or
/// format character)"`.
pub fn check_identifier(what: &str, value: &str) -> Result<(), String> {
    match value.chars().find(|c| is_unsafe(*c)) {
        None => Ok(()),
        Some(c) => Err(format!(
            "{what} contains U+{:04X} (a control or format character)",
            u32::from(c)
        )),
    }
}

/// `text` with every unsafe character written as Rust writes it escaped: ESC as
/// `\u{1b}`, U+202E as `\u{202e}`, a newline as `\u{a}` (a stored value never adds a
/// line). Text without one is returned as is.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Serialised JSON with every unsafe character that JSON leaves raw (DEL, C1 controls,
/// format characters) written as a `\uXXXX` escape: the same JSON value, safe to print.
/// Such characters can only occur inside JSON strings, where the escape means the same.
pub fn json_terminal_safe(json: &str) -> Cow<'_, str> {
    if !json.chars().any(is_unsafe_in_json) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if is_unsafe_in_json(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Unsafe, apart from the whitespace that structures pretty-printed JSON (serde_json
/// escapes every control character inside strings itself).
fn is_unsafe_in_json(c: char) -> bool {
    is_unsafe(c) && !matches!(c, '\n' | '\r' | '\t' | ' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_format_characters_are_unsafe() {
        for c in [
            '\0',
            '\u{7}',
            '\u{8}',
            '\t',
            '\n',
            '\r',
            '\u{1b}',
            '\u{7f}',
            '\u{85}',
            '\u{9b}',
            '\u{ad}',
            '\u{200b}',
            '\u{200d}',
            '\u{200e}',
            '\u{200f}',
            '\u{202a}',
            '\u{202e}',
            '\u{2028}',
            '\u{2029}',
            '\u{2060}',
            '\u{2066}',
            '\u{2069}',
            '\u{feff}',
            '\u{e0001}',
            '\u{e007f}',
        ] {
            assert!(is_unsafe(c), "U+{:04X}", u32::from(c));
        }
        for c in [
            'a', ' ', '.', '/', ':', '_', '-', '#', 'é', 'ß', 'Ж', '日', '😀', '\u{a0}',
            '\u{2027}', '\u{202f}', '\u{2065}', '\u{2070}', '\u{fffd}',
        ] {
            assert!(!is_unsafe(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn format_ranges_are_sorted_and_disjoint() {
        for pair in FORMAT.windows(2) {
            assert!(pair[0].0 <= pair[0].1 && pair[0].1 < pair[1].0, "{pair:?}");
        }
    }

    #[test]
    fn identifiers_with_unsafe_characters_are_refused_by_code_point() {
        assert_eq!(check_identifier("event type", "orders/create"), Ok(()));
        assert_eq!(check_identifier("event id", "évt_日本"), Ok(()));
        assert_eq!(
            check_identifier("event type", "orders/\u{1b}[2Jcreate"),
            Err("event type contains U+001B (a control or format character)".into())
        );
        let err = check_identifier("event id", "evt_\u{202e}1").unwrap_err();
        assert_eq!(
            err,
            "event id contains U+202E (a control or format character)"
        );
        assert!(!err.contains('\u{202e}'));
        assert!(check_identifier("event id", "a\u{200b}b").is_err());
        assert!(check_identifier("event id", "bell\u{7}").is_err());
    }

    #[test]
    fn terminal_safe_escapes_only_what_is_unsafe() {
        assert!(matches!(
            terminal_safe("payment_intent.succeeded"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            terminal_safe("x\u{1b}[31mred\u{7}\u{202e}cba\nnext"),
            "x\\u{1b}[31mred\\u{7}\\u{202e}cba\\u{a}next"
        );
        assert_eq!(terminal_safe("Grüße 日本"), "Grüße 日本");
        assert_eq!(terminal_safe("\u{e0001}"), "\\u{e0001}");
    }

    #[test]
    fn json_terminal_safe_keeps_the_value() {
        let value = serde_json::json!({"reason": "a\u{1b}b\u{9b}c\u{202e}d\u{7f}e\u{e0041}"});
        let text = serde_json::to_string_pretty(&value).unwrap();
        let safe = json_terminal_safe(&text);
        assert!(!safe.chars().any(is_unsafe_in_json), "{safe}");
        assert!(
            safe.contains("\\u202e") && safe.contains("\\udb40\\udc41"),
            "{safe}"
        );
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
        assert!(matches!(
            json_terminal_safe("{\n  \"a\": 1\n}"),
            Cow::Borrowed(_)
        ));
    }
}
