//! Helpers shared by every provider: MACs over several slices, constant-time
//! comparison, decoding, timestamp windows, secret rotation, header access and
//! cheap JSON extraction. Error messages never contain secrets or body bytes.

use std::borrow::Cow;
use std::fmt;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::ProviderError;
use crate::config::{Secret, TenantConfig};
use crate::request::WebhookRequest;

/// Longest event id we accept (it becomes part of the inbox key).
pub const MAX_EVENT_ID_LEN: usize = 256;

/// Standard base64; padding optional because senders differ. Non-canonical trailing
/// bits are still rejected, so one signature has exactly one accepted spelling.
pub const B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn mac_parts<M: Mac>(mut mac: M, parts: &[&[u8]]) -> M {
    for p in parts {
        mac.update(p);
    }
    mac
}

/// HMAC-SHA256 of the concatenation of `parts`, without concatenating them.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail here.
    let mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac_parts(mac, parts).finalize().into_bytes().into()
}

/// HMAC-SHA1 of the concatenation of `parts` (legacy schemes only).
pub fn hmac_sha1(key: &[u8], parts: &[&[u8]]) -> [u8; 20] {
    let mac = Hmac::<Sha1>::new_from_slice(key).expect("HMAC takes any key length");
    mac_parts(mac, parts).finalize().into_bytes().into()
}

/// Constant-time equality of decoded bytes; the length is not secret, so check it first.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

pub fn decode_hex(header: &'static str, s: &str) -> Result<Vec<u8>, ProviderError> {
    hex::decode(s).map_err(|_| ProviderError::MalformedHeader(header, "signature is not valid hex"))
}

pub fn decode_base64(header: &'static str, s: &str) -> Result<Vec<u8>, ProviderError> {
    B64.decode(s)
        .map_err(|_| ProviderError::MalformedHeader(header, "signature is not valid base64"))
}

/// A Unix timestamp in seconds: ASCII digits only, so what we re-render is what was signed.
pub fn parse_unix(header: &'static str, s: &str) -> Result<i64, ProviderError> {
    let bad = ProviderError::MalformedHeader(header, "timestamp is not a Unix time in seconds");
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad);
    }
    s.parse().map_err(|_| bad)
}

/// Reject timestamps older than `tolerance` seconds, and newer ones too unless `allow_future`.
pub fn check_timestamp(
    ts: i64,
    now: i64,
    tolerance: u64,
    allow_future: bool,
) -> Result<(), ProviderError> {
    let age = i128::from(now) - i128::from(ts);
    let tol = i128::from(tolerance);
    if age > tol || (!allow_future && -age > tol) {
        return Err(ProviderError::TimestampOutOfTolerance);
    }
    Ok(())
}

/// The tenant's secrets, or `NoSecret` when none is configured.
pub fn secrets(tenant: &TenantConfig) -> Result<&[Secret], ProviderError> {
    if tenant.secrets.is_empty() {
        return Err(ProviderError::NoSecret);
    }
    Ok(&tenant.secrets)
}

/// Try every secret (rotation) against every signature candidate. `mac` computes the
/// expected MAC for one secret, or `None` if that secret is unusable for this scheme
/// (it is then skipped; if no secret is usable the result is `NoSecret`).
pub fn verify_any<M: AsRef<[u8]>>(
    secrets: &[Secret],
    candidates: &[Vec<u8>],
    mut mac: impl FnMut(&Secret) -> Option<M>,
) -> Result<(), ProviderError> {
    let mut usable = false;
    for secret in secrets {
        let Some(expected) = mac(secret) else {
            continue;
        };
        usable = true;
        if candidates.iter().any(|c| ct_eq(expected.as_ref(), c)) {
            return Ok(());
        }
    }
    Err(if usable {
        ProviderError::SignatureMismatch
    } else {
        ProviderError::NoSecret
    })
}

/// All values of a header (repeated headers kept), each must be visible ASCII.
pub fn header_values<'a>(
    req: &'a WebhookRequest,
    name: &'static str,
) -> Result<Vec<&'a str>, ProviderError> {
    req.headers
        .get_all(name)
        .iter()
        .map(|v| {
            v.to_str()
                .map(str::trim)
                .map_err(|_| ProviderError::MalformedHeader(name, "value is not visible ASCII"))
        })
        .collect()
}

/// A header that must have one value. Repeats (separate or comma-joined by API
/// Gateway) are fine when identical; different values are an error. A comma-joined
/// value whose parts differ is kept whole, since ids may legitimately contain commas.
pub fn single_header<'a>(
    req: &'a WebhookRequest,
    name: &'static str,
) -> Result<Option<&'a str>, ProviderError> {
    let mut found: Option<&str> = None;
    for raw in header_values(req, name)? {
        let mut parts = raw.split(',').map(str::trim);
        let first = parts.next().unwrap_or_default();
        let value = if parts.all(|p| p == first) {
            first
        } else {
            raw
        };
        if value.is_empty() {
            return Err(ProviderError::MalformedHeader(name, "empty value"));
        }
        match found {
            Some(prev) if prev != value => {
                return Err(ProviderError::MalformedHeader(
                    name,
                    "repeated with different values",
                ))
            }
            _ => found = Some(value),
        }
    }
    Ok(found)
}

/// The first of several header names that is present (e.g. `webhook-id` / `svix-id`),
/// with the name that matched for error messages.
pub fn single_header_of<'a>(
    req: &'a WebhookRequest,
    names: &[&'static str],
) -> Result<Option<&'a str>, ProviderError> {
    for name in names {
        if let Some(v) = single_header(req, name)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// Event ids become part of the inbox key: non-empty, bounded, no control characters.
pub fn check_event_id(id: &str) -> Result<(), ProviderError> {
    if id.is_empty() {
        return Err(payload_error("event id is empty"));
    }
    if id.len() > MAX_EVENT_ID_LEN {
        return Err(payload_error("event id is longer than 256 bytes"));
    }
    if id.chars().any(char::is_control) {
        return Err(payload_error("event id contains control characters"));
    }
    Ok(())
}

pub fn payload_error(msg: impl Into<String>) -> ProviderError {
    ProviderError::MalformedPayload(msg.into())
}

// ---- Targeted JSON extraction ------------------------------------------------------
//
// Providers need three to six fields of a body that is already authenticated. Building
// a serde value, or even deserializing with `IgnoredAny`, costs more than the HMAC, so
// we walk only the objects on the wanted paths and skip every other value by its
// structure (strings, escapes and bracket depth), 64 bytes at a time.

/// One JSON value exactly as it appears in the body (a string keeps its quotes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(pub &'a [u8]);

impl<'a> Raw<'a> {
    /// A JSON string, unescaped; borrowed when it holds no escapes. Other types: `None`.
    pub fn str(self) -> Option<Cow<'a, str>> {
        let inner = self.0.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        if inner.contains(&b'\\') {
            return serde_json::from_slice::<String>(self.0).ok().map(Cow::Owned);
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
            None => parse_rfc3339(&self.str()?),
        }
    }
}

fn not_json(at: usize) -> ProviderError {
    payload_error(format!("body is not valid JSON (byte {at})"))
}

/// Find the values at `paths` (e.g. `&["data", "object", "id"]`) in a JSON object body.
/// Objects on the paths are walked exactly; everything else is skipped structurally,
/// so literals inside skipped values are not validated. Errors name a byte offset or a
/// path, never body content. A key repeated on a wanted path is an error (ambiguous).
pub fn json_fields<'a, const N: usize>(
    body: &'a [u8],
    paths: [&[&str]; N],
) -> Result<[Option<Raw<'a>>; N], ProviderError> {
    let mut cur = Cursor { b: body, i: 0 };
    cur.ws();
    if cur.peek() != Some(b'{') {
        return Err(payload_error("body is not a JSON object"));
    }
    let mut out = [None; N];
    let all = if N >= 32 { u32::MAX } else { (1u32 << N) - 1 };
    cur.object(&paths, 0, all, &mut out)?;
    cur.ws();
    if cur.i != body.len() {
        return Err(not_json(cur.i));
    }
    Ok(out)
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Result<(), ProviderError> {
        self.ws();
        if self.peek() != Some(c) {
            return Err(not_json(self.i));
        }
        self.i += 1;
        Ok(())
    }

    /// The string token at the cursor, quotes included.
    fn string(&mut self) -> Result<&'a [u8], ProviderError> {
        let start = self.i;
        let mut j = start + 1;
        loop {
            match self.b.get(j) {
                Some(b'"') => break,
                Some(b'\\') => j += 2,
                Some(_) => j += 1,
                None => return Err(not_json(start)),
            }
        }
        self.i = j + 1;
        Ok(&self.b[start..self.i])
    }

    fn value(&mut self) -> Result<&'a [u8], ProviderError> {
        self.ws();
        let start = self.i;
        match self.peek() {
            Some(b'"') => return self.string(),
            Some(b'{' | b'[') => self.i = skip_container(self.b, start).ok_or(not_json(start))?,
            Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
                while matches!(self.peek(), Some(b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'E')) {
                    self.i += 1;
                }
            }
            _ => return Err(not_json(start)),
        }
        Ok(&self.b[start..self.i])
    }

    /// Walk the object at the cursor; `active` has a bit per path still matching at `depth`.
    fn object<const N: usize>(
        &mut self,
        paths: &[&[&str]; N],
        depth: usize,
        active: u32,
        out: &mut [Option<Raw<'a>>; N],
    ) -> Result<(), ProviderError> {
        self.eat(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(not_json(self.i));
            }
            let key = self.string()?;
            let key = &key[1..key.len() - 1];
            self.eat(b':')?;
            let (mut here, mut deeper) = (0u32, 0u32);
            for (n, path) in paths.iter().enumerate() {
                if active & (1 << n) != 0 && path.get(depth).is_some_and(|k| k.as_bytes() == key) {
                    if path.len() == depth + 1 {
                        here |= 1 << n;
                    } else {
                        deeper |= 1 << n;
                    }
                }
            }
            self.ws();
            if deeper != 0 && here == 0 && self.peek() == Some(b'{') {
                self.object(paths, depth + 1, deeper, out)?;
            } else {
                let v = self.value()?;
                for (n, slot) in out.iter_mut().enumerate() {
                    if here & (1 << n) != 0 && slot.replace(Raw(v)).is_some() {
                        return Err(payload_error(format!("duplicate field `{}`", paths[n].join("."))));
                    }
                }
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(not_json(self.i)),
            }
        }
    }
}

/// Bit masks of one 64-byte block: quotes, backslashes, `{`/`[`, `}`/`]`.
#[cfg(target_arch = "x86_64")]
fn masks(block: &[u8; 64]) -> [u64; 4] {
    use std::arch::x86_64::*;
    let mut m = [0u64; 4];
    for (k, chunk) in block.chunks_exact(16).enumerate() {
        // SAFETY: SSE2 is part of the x86_64 baseline; the load is unaligned and reads
        // exactly the 16 bytes of `chunk`.
        unsafe {
            let v = _mm_loadu_si128(chunk.as_ptr().cast());
            // `[`|0x20 == `{` and `]`|0x20 == `}`; no other byte maps onto those.
            let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
            let hits = [
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
                _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'{' as i8)),
                _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'}' as i8)),
            ];
            for (mask, hit) in m.iter_mut().zip(hits) {
                *mask |= u64::from(_mm_movemask_epi8(hit) as u16) << (16 * k);
            }
        }
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
fn masks(block: &[u8; 64]) -> [u64; 4] {
    let mut m = [0u64; 4];
    for (i, &c) in block.iter().enumerate() {
        let folded = c | 0x20;
        m[0] |= u64::from(c == b'"') << i;
        m[1] |= u64::from(c == b'\\') << i;
        m[2] |= u64::from(folded == b'{') << i;
        m[3] |= u64::from(folded == b'}') << i;
    }
    m
}

/// Bit i set when an odd number of bits at or below i are set in `x`.
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// Index just past the object or array that opens at `start`, or `None` if it never
/// closes. Blocks without backslashes are classified with bit tricks; blocks with
/// escapes (rare) or starting after a pending backslash go byte by byte.
fn skip_container(b: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut in_str, mut escaped) = (0u32, false, false);
    let mut pos = start;
    let mut tail = [0u8; 64];
    while pos < b.len() {
        let block: &[u8; 64] = match b.get(pos..pos + 64) {
            Some(s) => s.try_into().ok()?,
            None => {
                // Zero padding is neither quote, backslash nor bracket.
                tail[..b.len() - pos].copy_from_slice(&b[pos..]);
                &tail
            }
        };
        let [quote, backslash, open, close] = masks(block);
        if backslash != 0 || escaped {
            for (k, &c) in block.iter().enumerate() {
                if escaped {
                    escaped = false;
                } else if in_str {
                    match c {
                        b'\\' => escaped = true,
                        b'"' => in_str = false,
                        _ => {}
                    }
                } else {
                    match c | 0x20 {
                        _ if c == b'"' => in_str = true,
                        b'{' => depth += 1,
                        b'}' => {
                            depth = depth.checked_sub(1)?;
                            if depth == 0 {
                                return Some(pos + k + 1);
                            }
                        }
                        _ => {}
                    }
                }
            }
        } else {
            let inside = prefix_xor(quote) ^ if in_str { u64::MAX } else { 0 };
            let (open, close) = (open & !inside, close & !inside);
            if close.count_ones() < depth {
                depth = depth + open.count_ones() - close.count_ones();
            } else {
                let mut brackets = open | close;
                while brackets != 0 {
                    let k = brackets.trailing_zeros();
                    brackets &= brackets - 1;
                    if open & (1 << k) != 0 {
                        depth += 1;
                    } else {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(pos + k as usize + 1);
                        }
                    }
                }
            }
            in_str = inside >> 63 == 1;
        }
        pos += 64;
    }
    None
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    // Howard Hinnant's algorithm: days since 1970-01-01 in the proleptic Gregorian calendar.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Parse `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` to Unix seconds (fraction dropped).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(r)?;
        part.iter().all(u8::is_ascii_digit).then(|| {
            part.iter()
                .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'))
        })
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month) || day == 0 || day > month_days[month as usize - 1] {
        return None;
    }
    if hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let off = i64::from(oh * 3600 + om * 60);
            if *sign == b'+' {
                off
            } else {
                -off
            }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), month, day);
    Some(days * 86_400 + i64::from(hour * 3600 + min * 60 + sec) - offset)
}

/// Format Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (for generated headers).
pub fn format_rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Build a header value, mapping invalid characters to a clean error.
pub fn header_value(name: &'static str, v: &str) -> Result<http::HeaderValue, ProviderError> {
    http::HeaderValue::from_str(v)
        .map_err(|_| ProviderError::MalformedHeader(name, "value cannot be sent as a header"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        TenantConfig {
            provider: "p".into(),
            tenant: "t".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: Default::default(),
        }
    }

    #[test]
    fn hmac_over_parts_equals_hmac_over_concatenation() {
        assert_eq!(
            hmac_sha256(b"k", &[b"ab", b"", b"c"]),
            hmac_sha256(b"k", &[b"abc"])
        );
        assert_eq!(hmac_sha1(b"k", &[b"a", b"bc"]), hmac_sha1(b"k", &[b"abc"]));
        // RFC 4231 test case 2.
        assert_eq!(
            hex::encode(hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // RFC 2202 test case 2.
        assert_eq!(
            hex::encode(hmac_sha1(b"Jefe", &[b"what do ya want for nothing?"])),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
    }

    #[test]
    fn ct_eq_checks_length_and_content() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(!ct_eq(b"", b"a"));
    }

    #[test]
    fn decoding_errors_are_malformed_header() {
        assert_eq!(decode_hex("h", "0a0b").unwrap(), vec![10, 11]);
        assert_eq!(
            decode_hex("h", "zz"),
            Err(ProviderError::MalformedHeader(
                "h",
                "signature is not valid hex"
            ))
        );
        assert_eq!(decode_base64("h", "AQI=").unwrap(), vec![1, 2]);
        assert_eq!(decode_base64("h", "AQI").unwrap(), vec![1, 2]);
        assert_eq!(
            decode_base64("h", "A!=="),
            Err(ProviderError::MalformedHeader(
                "h",
                "signature is not valid base64"
            ))
        );
        // Non-canonical trailing bits: a second spelling of the same bytes is refused.
        assert!(decode_base64("h", "AQJ=").is_err());
        assert_eq!(parse_unix("t", "1700000000"), Ok(1_700_000_000));
        for bad in ["", "abc", "-5", "+5", "1.5", "9999999999999999999"] {
            assert!(parse_unix("t", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn timestamp_window() {
        let now = 1_000_000;
        assert_eq!(check_timestamp(now - 300, now, 300, false), Ok(()));
        assert_eq!(check_timestamp(now + 300, now, 300, false), Ok(()));
        assert_eq!(
            check_timestamp(now - 301, now, 300, false),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(
            check_timestamp(now + 301, now, 300, false),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(check_timestamp(now + 10_000, now, 300, true), Ok(()));
        assert!(check_timestamp(i64::MIN, i64::MAX, u64::MAX, false).is_ok());
        assert!(check_timestamp(i64::MIN, i64::MAX, 0, true).is_err());
    }

    #[test]
    fn rotation_tries_every_secret_and_candidate() {
        let t = tenant(&["old", "new"]);
        let mac = |s: &Secret| Some(hmac_sha256(s.expose().as_bytes(), &[b"body"]));
        let new = hmac_sha256(b"new", &[b"body"]).to_vec();
        let old = hmac_sha256(b"old", &[b"body"]).to_vec();
        assert_eq!(
            verify_any(&t.secrets, &[vec![0; 32], new.clone()], mac),
            Ok(())
        );
        assert_eq!(verify_any(&t.secrets, &[old], mac), Ok(()));
        assert_eq!(
            verify_any(&t.secrets, &[vec![0; 32]], mac),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify_any(&t.secrets, &[new], |_| None::<[u8; 32]>),
            Err(ProviderError::NoSecret)
        );
        assert_eq!(secrets(&tenant(&[])), Err(ProviderError::NoSecret));
    }

    #[test]
    fn single_header_handles_repeats() {
        let mut h = HeaderMap::new();
        h.append("x-id", "abc".parse().unwrap());
        h.append("x-id", "abc".parse().unwrap());
        h.append("x-j", "abc,abc".parse().unwrap());
        h.append("x-k", "a,b".parse().unwrap());
        h.append("x-l", "a".parse().unwrap());
        h.append("x-l", "b".parse().unwrap());
        h.append("x-e", " ".parse().unwrap());
        h.append("x-u", http::HeaderValue::from_bytes(b"\xff").unwrap());
        let r = WebhookRequest::post(h, "");
        assert_eq!(single_header(&r, "X-Id"), Ok(Some("abc")));
        assert_eq!(single_header(&r, "x-j"), Ok(Some("abc")));
        assert_eq!(single_header(&r, "x-k"), Ok(Some("a,b")));
        assert_eq!(single_header(&r, "x-missing"), Ok(None));
        assert_eq!(
            single_header_of(&r, &["x-missing", "x-id"]),
            Ok(Some("abc"))
        );
        assert_eq!(
            single_header(&r, "x-l"),
            Err(ProviderError::MalformedHeader(
                "x-l",
                "repeated with different values"
            ))
        );
        assert_eq!(
            single_header(&r, "x-e"),
            Err(ProviderError::MalformedHeader("x-e", "empty value"))
        );
        assert_eq!(
            single_header(&r, "x-u"),
            Err(ProviderError::MalformedHeader(
                "x-u",
                "value is not visible ASCII"
            ))
        );
    }

    #[test]
    fn event_id_limits() {
        assert!(check_event_id("evt_1").is_ok());
        assert!(check_event_id("").is_err());
        assert!(check_event_id(&"a".repeat(257)).is_err());
        assert!(check_event_id(&"a".repeat(256)).is_ok());
        assert!(check_event_id("a\nb").is_err());
    }

    #[derive(Debug, Deserialize)]
    struct Probe<'a> {
        #[serde(borrow, default)]
        id: LooseStr<'a>,
        #[serde(default)]
        at: LooseTime,
    }

    #[test]
    fn json_extraction_is_loose_about_optional_fields_and_strict_about_json() {
        let p: Probe =
            parse_json_object(br#" {"id":"a\"b","at":"2024-01-01T00:00:00Z","x":[1,{"y":2}]}"#)
                .unwrap();
        assert_eq!(p.id.into_string().as_deref(), Some("a\"b"));
        assert_eq!(p.at, LooseTime(Some(1_704_067_200)));
        let p: Probe = parse_json_object(br#"{"id":12,"at":1700000000}"#).unwrap();
        assert_eq!(p.id.into_string().as_deref(), Some("12"));
        assert_eq!(p.at, LooseTime(Some(1_700_000_000)));
        let p: Probe = parse_json_object(br#"{"id":{"nested":true},"at":"soon"}"#).unwrap();
        assert_eq!((p.id, p.at), (LooseStr(None), LooseTime(None)));
        for bad in [
            &b"[\"a\"]"[..],
            b"not json",
            b"{\"id\":",
            b"{} trailing",
            b"",
        ] {
            assert!(
                matches!(
                    parse_json_object::<Probe>(bad),
                    Err(ProviderError::MalformedPayload(_))
                ),
                "{bad:?}"
            );
        }
        // Duplicate keys are ambiguous: refuse rather than pick one.
        assert!(parse_json_object::<Probe>(br#"{"id":"a","id":"b"}"#).is_err());
        // No body content in the message.
        let err = parse_json_object::<Probe>(br#"{"id":"secretvalue" x}"#).unwrap_err();
        assert!(!err.to_string().contains("secretvalue"), "{err}");
    }

    #[test]
    fn rfc3339_parse_and_format() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2023-03-29T18:00:27.877041743Z"),
            Some(1_680_112_827)
        );
        assert_eq!(
            parse_rfc3339("2024-01-01T10:00:00-05:00"),
            Some(1_704_121_200)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00+00:00"),
            Some(1_709_164_800)
        );
        for bad in [
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+0500",
            "2024-01-01",
            "２０２４-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        for secs in [0, 951_782_400, 1_700_000_000, 4_102_444_799, -86_401] {
            assert_eq!(parse_rfc3339(&format_rfc3339(secs)), Some(secs), "{secs}");
        }
        assert_eq!(format_rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
