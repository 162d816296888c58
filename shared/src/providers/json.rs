//! The one JSON reader of the door: `serde_json` over the authenticated body.
//!
//! The receiver and the domain must see the same values, so the door accepts only what
//! every JSON reader reads the same way: valid UTF-8, exactly one JSON object and
//! nothing after it, no object anywhere that repeats a key (readers disagree on which
//! copy wins), keys compared after `\u` unescaping, at most serde_json's 128 levels of
//! nesting. The wanted fields are captured as borrowed raw values (`RawValue`); every
//! other value is walked without being built, only to check it. Errors name a line and
//! column or one of our own paths, never body content.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::sig::payload_error;
use super::ProviderError;

/// One JSON value exactly as it appears in the body (a string keeps its quotes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(pub &'a [u8]);

impl<'a> Raw<'a> {
    /// A JSON string, unescaped; borrowed when it holds no escapes. Other types: `None`.
    pub fn str(self) -> Option<Cow<'a, str>> {
        let inner = self.0.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        if inner.contains(&b'\\') {
            return serde_json::from_slice::<String>(self.0)
                .ok()
                .map(Cow::Owned);
        }
        std::str::from_utf8(inner).ok().map(Cow::Borrowed)
    }

    /// An integer token (`-?[0-9]+`) as written.
    fn int_token(self) -> Option<&'a str> {
        let digits = self.0.strip_prefix(b"-").unwrap_or(self.0);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(self.0).ok()
    }

    /// A string or an integer as text (ids, versions); other types give `None`, since
    /// such optional facts must not reject an authentic event.
    pub fn text(self) -> Option<Cow<'a, str>> {
        self.str().or_else(|| self.int_token().map(Cow::Borrowed))
    }

    /// Integer Unix seconds or an RFC 3339 string.
    pub fn time(self) -> Option<i64> {
        match self.int_token() {
            Some(t) => t.parse().ok(),
            None => crate::time::parse_rfc3339(&self.str()?),
        }
    }
}

/// The event id field: present, a JSON string, and valid as an inbox key. The two
/// messages name the provider's own field.
pub fn required_event_id<'a>(
    field: Option<Raw<'a>>,
    missing: &'static str,
    not_string: &'static str,
) -> Result<Cow<'a, str>, ProviderError> {
    let id = field.ok_or_else(|| payload_error(missing))?;
    let id = id.str().ok_or_else(|| payload_error(not_string))?;
    super::sig::check_event_id(&id)?;
    Ok(id)
}

/// A required non-empty JSON string (event types); absent, empty or not a string is
/// `missing`.
pub fn required_str<'a>(
    field: Option<Raw<'a>>,
    missing: &'static str,
) -> Result<Cow<'a, str>, ProviderError> {
    field
        .and_then(Raw::str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| payload_error(missing))
}

/// Check that `body` is one strict JSON object (see the module docs) without reading
/// any field: for providers that deserialize into their own structures.
pub fn check_object(body: &[u8]) -> Result<(), ProviderError> {
    json_fields(body, []).map(|[]| ())
}

/// Find the values at `paths` (e.g. `&["data", "object", "id"]`) in a JSON object body,
/// after checking the whole body (see the module docs). A path through an array or a
/// scalar is absent.
pub fn json_fields<'a, const N: usize>(
    body: &'a [u8],
    paths: [&[&str]; N],
) -> Result<[Option<Raw<'a>>; N], ProviderError> {
    const { assert!(N <= 32, "paths are tracked in a u32 bit set") };
    let text = std::str::from_utf8(body)
        .map_err(|e| payload_error(format!("body is not UTF-8 (byte {})", e.valid_up_to())))?;
    if !text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(payload_error("body is not a JSON object"));
    }
    let mut ctx = Ctx {
        paths: &paths,
        out: [None; N],
        keys: Vec::new(),
        duplicate: None,
    };
    let all = u32::MAX.checked_shr(32 - N as u32).unwrap_or(0);
    walk_text(text, &mut ctx, 0, all)?;
    Ok(ctx.out)
}

/// Walk one complete JSON text (the body, or a captured container inside it), then map
/// the error once, by what the walk recorded.
fn walk_text<'de, const N: usize>(
    text: &'de str,
    ctx: &mut Ctx<'_, 'de, N>,
    depth: usize,
    active: u32,
) -> Result<(), ProviderError> {
    walk_raw(text, ctx, depth, active).map_err(|e| match ctx.duplicate.take() {
        Some(Some(n)) => payload_error(format!("duplicate field `{}`", ctx.paths[n].join("."))),
        Some(None) => payload_error(format!(
            "body repeats an object key (line {}, column {})",
            e.line(),
            e.column()
        )),
        None if e.to_string().starts_with("recursion limit exceeded") => {
            payload_error("body nests deeper than 128 levels")
        }
        None => payload_error(format!(
            "body is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        )),
    })
}

fn walk_raw<'de, const N: usize>(
    text: &'de str,
    ctx: &mut Ctx<'_, 'de, N>,
    depth: usize,
    active: u32,
) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    Walk { ctx, depth, active }
        .deserialize(&mut de)
        .and_then(|()| de.end())
}

struct Ctx<'p, 'de, const N: usize> {
    paths: &'p [&'p [&'p str]; N],
    out: [Option<Raw<'de>>; N],
    /// The keys of every object currently open, innermost last; one buffer per body.
    keys: Vec<Cow<'de, str>>,
    /// Set with the error: a repeated key, `Some(n)` when it is on wanted path `n`.
    duplicate: Option<Option<usize>>,
}

/// Checks one value; `active` has a bit per path whose first `depth` keys led here.
struct Walk<'c, 'p, 'de, const N: usize> {
    ctx: &'c mut Ctx<'p, 'de, N>,
    depth: usize,
    active: u32,
}

impl<'de, const N: usize> DeserializeSeed<'de> for Walk<'_, '_, 'de, N> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for Walk<'_, '_, 'de, N> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        // Paths never lead through arrays; their elements are only checked.
        while seq
            .next_element_seed(Walk {
                ctx: &mut *self.ctx,
                depth: self.depth + 1,
                active: 0,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let ctx = self.ctx;
        let start = ctx.keys.len();
        while let Some(key) = map.next_key_seed(Key)? {
            let (mut here, mut deeper) = (0u32, 0u32);
            for (n, path) in ctx.paths.iter().enumerate() {
                if self.active & (1 << n) != 0 && path.get(self.depth) == Some(&&*key) {
                    if path.len() == self.depth + 1 {
                        here |= 1 << n;
                    } else {
                        deeper |= 1 << n;
                    }
                }
            }
            if here != 0 {
                let raw: &'de RawValue = map.next_value()?;
                let text = raw.get();
                for (n, slot) in ctx.out.iter_mut().enumerate() {
                    if here & (1 << n) != 0 {
                        *slot = Some(Raw(text.as_bytes()));
                    }
                }
                // A captured container is still checked, and may hold deeper paths; a
                // captured string's escapes must decode (no lone surrogates).
                if text.starts_with(['{', '[']) {
                    walk_raw(text, ctx, self.depth + 1, deeper).map_err(de::Error::custom)?;
                } else if text.starts_with('"') && text.contains('\\') {
                    serde_json::from_str::<String>(text).map_err(de::Error::custom)?;
                }
            } else {
                map.next_value_seed(Walk {
                    ctx: &mut *ctx,
                    depth: self.depth + 1,
                    active: deeper,
                })?;
            }
            ctx.keys.push(key);
        }
        // Repeats are found once per object, by sorting its keys (objects of 50+ keys
        // are common, so comparing each key with all before it would cost more).
        let own = &mut ctx.keys[start..];
        own.sort_unstable();
        if let Some(pair) = own.windows(2).find(|w| w[0] == w[1]) {
            let key = &*pair[0];
            let wanted = (0..N).find(|&n| {
                self.active & (1 << n) != 0 && ctx.paths[n].get(self.depth) == Some(&key)
            });
            ctx.duplicate = Some(wanted);
            return Err(de::Error::custom("repeated key"));
        }
        ctx.keys.truncate(start);
        Ok(())
    }
}

/// An object key, borrowed from the body unless it holds escapes (then decoded).
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_walks_paths_and_types_loosely() {
        let body = br#" {"id":"a\"b","at":"2024-01-01T00:00:00Z","x":[1,{"id":2}],
            "data":{"list":[{"id":"no"}],"object":{"meta":{"id":"no"},"id":12}},"n":-7} "#;
        let [id, at, nested, n, missing] = json_fields(
            body,
            [
                &["id"],
                &["at"],
                &["data", "object", "id"],
                &["n"],
                &["data", "id"],
            ],
        )
        .unwrap();
        assert_eq!(id.and_then(Raw::str).as_deref(), Some("a\"b"));
        assert_eq!(at.and_then(Raw::time), Some(1_704_067_200));
        assert_eq!(nested.and_then(Raw::text).as_deref(), Some("12"));
        assert_eq!(nested.and_then(Raw::str), None);
        assert_eq!(n.and_then(Raw::time), Some(-7));
        assert_eq!(missing, None);
        // Odd types are absent facts, not errors.
        let [id, at] = json_fields(br#"{"id":{"x":1},"at":"soon"}"#, [&["id"], &["at"]]).unwrap();
        assert_eq!(
            (id.and_then(Raw::text), at.and_then(Raw::time)),
            (None, None)
        );
        let [id] = json_fields(br#"{"id":1.5}"#, [&["id"]]).unwrap();
        assert_eq!(id.and_then(Raw::text), None);
        // A wanted path through a non-object is simply absent.
        let [x] = json_fields(br#"{"data":[{"id":1}]}"#, [&["data", "id"]]).unwrap();
        assert_eq!(x, None);
        // A path that is also the prefix of another is captured and walked.
        let [d, did] = json_fields(br#"{"d":{"id":7}}"#, [&["d"], &["d", "id"]]).unwrap();
        assert_eq!(d, Some(Raw(br#"{"id":7}"#)));
        assert_eq!(did, Some(Raw(b"7")));
    }

    #[test]
    fn json_fields_rejects_what_is_not_one_json_object() {
        for bad in [
            &b"[\"a\"]"[..],
            b"not json",
            b"tru",
            b"",
            b"{\"id\":",
            b"{\"id\":\"x}",
            b"{} trailing",
            b"{}{}",
            b"{\"a\":{\"b\":[1,2}}",
            b"{\"a\":[1,2}",
            b"{\"a\":]}",
            b"{\"a\":[\"\\\"]\"}",
            b"{\"a\":tru}",
            b"{\"a\":\"\xff\"}",
            b"\xef\xbb\xbf{\"id\":1}",
            b"{\"a\":1,}",
            b"{\"id\":2,\"a\" 1}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":01}",
        ] {
            assert!(
                matches!(
                    json_fields(bad, [&["id"]]),
                    Err(ProviderError::MalformedPayload(_))
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(
            json_fields(deep.as_bytes(), [&["id"]]),
            Err(payload_error("body nests deeper than 128 levels"))
        );
        let err = json_fields(br#"{"k":"secretvalue"]]"#, [&["id"]]).unwrap_err();
        assert!(!err.to_string().contains("secretvalue"), "{err}");
    }

    #[test]
    fn json_fields_rejects_repeated_keys_anywhere() {
        let dup = json_fields(br#"{"id":"a","x":1,"id":"b","t":1}"#, [&["id"], &["t"]]);
        assert_eq!(dup, Err(payload_error("duplicate field `id`")));
        let dup = json_fields(
            br#"{"d":{"id":1},"d":{"id":2},"t":1}"#,
            [&["d", "id"], &["t"]],
        );
        assert_eq!(dup, Err(payload_error("duplicate field `d.id`")));
        // Escapes are decoded before keys are compared: `d\u0061ta` is `data`.
        let dup = json_fields(
            br#"{"data":{"id":"pi_1"},"d\u0061ta":{"id":"pi_DECOY"}}"#,
            [&["data", "id"]],
        );
        assert_eq!(dup, Err(payload_error("duplicate field `data.id`")));
        let [id] = json_fields(br#"{"\u0069d":"x"}"#, [&["id"]]).unwrap();
        assert_eq!(id.and_then(Raw::str).as_deref(), Some("x"));
        // Keys off the wanted paths, and after the wanted fields, count too.
        for body in [
            &br#"{"id":"a","x":{"y":1,"y":2}}"#[..],
            br#"{"id":"a","x":[{"y":1,"y":2}]}"#,
            br#"{"x":1,"x":2,"id":"a"}"#,
            br#"{"id":{"y":1,"y":2}}"#,
        ] {
            let err = json_fields(body, [&["id"]]).unwrap_err();
            assert!(
                err.to_string().contains("repeats an object key"),
                "{err}: {}",
                String::from_utf8_lossy(body)
            );
        }
        // The same key in sibling objects is not a repeat.
        assert!(json_fields(
            br#"{"a":{"k":1},"b":{"k":2},"c":[{"k":1},{"k":2}]}"#,
            [&["id"]]
        )
        .is_ok());
        assert!(check_object(br#"{"a":1,"a":1}"#).is_err());
        assert_eq!(check_object(br#"{"a":1}"#), Ok(()));
    }

    fn rnd(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// A random JSON value whose strings and keys exercise quotes, escapes and brackets.
    fn random_value(seed: &mut u64, depth: u32) -> serde_json::Value {
        use serde_json::Value;
        const WORDS: [&str; 9] = ["id", "type", "data", "a\"b", "x\\", "{[", "]}", "é", "id "];
        let word = |seed: &mut u64| WORDS[(rnd(seed) % 9) as usize];
        match rnd(seed) % if depth > 3 { 4 } else { 7 } {
            0 => Value::Null,
            1 => Value::from(rnd(seed) as i64 % 100_000),
            2 => {
                let n = (rnd(seed) % 5) as usize;
                Value::from(word(seed).repeat(n))
            }
            3 => Value::Bool(rnd(seed) & 1 == 0),
            4 => {
                let n = rnd(seed) % 4;
                Value::Array((0..n).map(|_| random_value(seed, depth + 1)).collect())
            }
            _ => {
                let n = rnd(seed) % 6;
                let entries =
                    (0..n).map(|_| (word(seed).to_owned(), random_value(seed, depth + 1)));
                Value::Object(entries.collect())
            }
        }
    }

    const PATHS: [&[&str]; 4] = [
        &["id"],
        &["type"],
        &["data", "id"],
        &["data", "data", "type"],
    ];

    /// What serde_json reads at `PATHS` of a parsed value.
    fn serde_reads(value: &serde_json::Value) -> [Option<&serde_json::Value>; 4] {
        [
            value.get("id"),
            value.get("type"),
            value.get("data").and_then(|d| d.get("id")),
            value
                .get("data")
                .and_then(|d| d.get("data"))
                .and_then(|d| d.get("type")),
        ]
    }

    fn assert_reads_like_serde(text: &str, value: &serde_json::Value, what: &str) {
        let got =
            json_fields(text.as_bytes(), PATHS).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
        for (g, w) in got.iter().zip(serde_reads(value)) {
            let g = g.map(|r| serde_json::from_slice::<serde_json::Value>(r.0).unwrap());
            assert_eq!(g.as_ref(), w, "{what}: {text}");
        }
    }

    #[test]
    fn json_fields_matches_serde_on_random_objects() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..3000 {
            let serde_json::Value::Object(map) = random_value(&mut seed, 0) else {
                continue;
            };
            let value = serde_json::Value::Object(map);
            for text in [
                value.to_string(),
                serde_json::to_string_pretty(&value).unwrap(),
            ] {
                assert_reads_like_serde(&text, &value, &format!("round {round}"));
            }
        }
    }

    /// Documents built to split naive scanners from serde: every one is either refused,
    /// or read exactly as serde_json reads it (and then serde must accept it too).
    #[test]
    fn json_fields_agrees_with_serde_on_adversarial_documents() {
        let nested_ok = format!("{{\"id\":1,\"x\":{}0{}}}", "[".repeat(100), "]".repeat(100));
        let nested_deep = format!("{{\"id\":1,\"x\":{}0{}}}", "[".repeat(300), "]".repeat(300));
        let docs: Vec<(&str, String)> = vec![
            ("duplicate top key", r#"{"id":"a","id":"b"}"#.into()),
            (
                "duplicate object on path",
                r#"{"data":{"id":"pi_1"},"data":{"id":"pi_DECOY"}}"#.into(),
            ),
            (
                "escaped duplicate",
                r#"{"data":{"id":"pi_1"},"\u0064ata":{"id":"pi_DECOY"}}"#.into(),
            ),
            (
                "escaped key only",
                r#"{"\u0069\u0064":"evt_1","d\u0061ta":{"\u0069d":5}}"#.into(),
            ),
            (
                "surrogate pair key",
                r#"{"\ud83d\ude00":1,"id":"x"}"#.into(),
            ),
            ("lone surrogate", r#"{"id":"\ud800"}"#.into()),
            ("escaped slash", r#"{"id":"a\/b","type":"t\u0000"}"#.into()),
            ("bom", "\u{feff}{\"id\":\"x\"}".into()),
            ("trailing object", r#"{"id":"x"}{"id":"y"}"#.into()),
            ("trailing garbage", r#"{"id":"x"} ,"#.into()),
            ("trailing whitespace", "{\"id\":\"x\"}\n\t ".into()),
            ("leading whitespace", " \r\n{\"id\":\"x\"}".into()),
            ("nested ok", nested_ok),
            ("nested too deep", nested_deep),
            (
                "duplicate deep inside array",
                r#"{"id":1,"x":[[{"a":1,"a":2}]]}"#.into(),
            ),
            ("key equal to value", r#"{"a":"id","id":"real"}"#.into()),
            ("quoted key text", r#"{"x":"\"id\":1","id":2}"#.into()),
            (
                "big integer",
                r#"{"id":820982911946154508123456789}"#.into(),
            ),
            ("huge float", r#"{"id":1,"x":1e400}"#.into()),
            ("nul in string", "{\"id\":\"a\u{0}b\"}".into()),
            ("raw tab in string", "{\"id\":\"a\tb\"}".into()),
            ("single quotes", "{'id':'x'}".into()),
            ("literal prefix", r#"{"id":tru}"#.into()),
            ("mismatched brackets", r#"{"id":1,"x":[1,2}"#.into()),
            ("empty", String::new()),
            ("top-level array", r#"[{"id":1}]"#.into()),
        ];
        for (what, text) in &docs {
            let ours = json_fields(text.as_bytes(), PATHS);
            let theirs = strict_serde(text);
            match (&ours, theirs) {
                (Ok(_), Some(value)) => assert_reads_like_serde(text, &value, what),
                (Ok(_), None) => panic!("{what}: accepted what serde refuses or reads ambiguously"),
                (Err(ProviderError::MalformedPayload(_)), _) => {}
                (Err(e), _) => panic!("{what}: wrong error {e}"),
            }
        }
        // The refusals that matter, spelled out.
        for what in [
            "duplicate top key",
            "duplicate object on path",
            "escaped duplicate",
            "bom",
            "trailing object",
            "trailing garbage",
            "nested too deep",
            "duplicate deep inside array",
            "literal prefix",
            "mismatched brackets",
        ] {
            let (_, text) = docs.iter().find(|(w, _)| *w == what).unwrap();
            assert!(
                json_fields(text.as_bytes(), PATHS).is_err(),
                "{what} accepted"
            );
        }
        for what in [
            "escaped key only",
            "trailing whitespace",
            "nested ok",
            "big integer",
        ] {
            let (_, text) = docs.iter().find(|(w, _)| *w == what).unwrap();
            assert!(
                json_fields(text.as_bytes(), PATHS).is_ok(),
                "{what} refused"
            );
        }
    }

    /// serde_json's own reading, or `None` where it refuses or where keys repeat (then
    /// serde keeps the last copy, a reading the door must never share silently).
    fn strict_serde(text: &str) -> Option<serde_json::Value> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        (value.is_object() && !repeats_a_key(text)).then_some(value)
    }

    /// True when some object in `text` repeats a key (serde's `Value` cannot tell).
    fn repeats_a_key(text: &str) -> bool {
        struct Probe;
        impl<'de> serde::Deserialize<'de> for Probe {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(ProbeVisitor)
            }
        }
        struct ProbeVisitor;
        impl<'de> Visitor<'de> for ProbeVisitor {
            type Value = Probe;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("json")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Probe, E> {
                Ok(Probe)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Probe, E> {
                Ok(Probe)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Probe, E> {
                Ok(Probe)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Probe, E> {
                Ok(Probe)
            }
            fn visit_str<E>(self, _: &str) -> Result<Probe, E> {
                Ok(Probe)
            }
            fn visit_unit<E>(self) -> Result<Probe, E> {
                Ok(Probe)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Probe, A::Error> {
                while s.next_element::<Probe>()?.is_some() {}
                Ok(Probe)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Probe, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some(k) = m.next_key::<String>()? {
                    if !seen.insert(k) {
                        return Err(de::Error::custom("repeat"));
                    }
                    m.next_value::<Probe>()?;
                }
                Ok(Probe)
            }
        }
        serde_json::from_str::<Probe>(text).is_err()
    }
}
