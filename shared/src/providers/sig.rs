//! Helpers shared by every provider: MACs over several slices, constant-time
//! comparison, decoding, timestamp windows, secret rotation, header access and
//! cheap JSON extraction. Error messages never contain secrets or body bytes.

use std::borrow::Cow;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use hmac::{Hmac, Mac};
use http::HeaderName;
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

/// Hex (either case) to bytes; errors name the header, never the value.
pub fn decode_hex(header: &'static str, s: &str) -> Result<Vec<u8>, ProviderError> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bad = || ProviderError::MalformedHeader(header, "signature is not valid hex");
    let pairs = s.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(pairs.len());
    for pair in pairs {
        let (hi, lo) = nibble(pair[0]).zip(nibble(pair[1])).ok_or_else(bad)?;
        out.push(hi << 4 | lo);
    }
    Ok(out)
}

/// Standard base64 (padding optional) to bytes.
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

/// HMAC-SHA256 of the raw body keyed with each secret's UTF-8 bytes (Shopify, GitHub).
pub fn verify_body_hmac_sha256(
    secrets: &[Secret],
    candidates: &[Vec<u8>],
    body: &[u8],
) -> Result<(), ProviderError> {
    verify_any(secrets, candidates, |s| {
        Some(hmac_sha256(s.expose().as_bytes(), &[body]))
    })
}

/// Timestamp-signed schemes (Stripe `t=…,v1=…`, Paddle `ts=…;h1=…`): HMAC-SHA256 over
/// `"{ts}{separator}{body}"`. Groups outside the tolerance are skipped before any HMAC:
/// a valid signature on a stale timestamp is a replay either way.
pub fn verify_timestamped_body<'a>(
    groups: impl IntoIterator<Item = (i64, &'a [Vec<u8>])>,
    secrets: &[Secret],
    body: &[u8],
    separator: &[u8],
    now_secs: i64,
    tolerance_secs: u64,
) -> Result<(), ProviderError> {
    let mut result = Err(ProviderError::TimestampOutOfTolerance);
    for (ts, sigs) in groups {
        if sigs.is_empty() || check_timestamp(ts, now_secs, tolerance_secs, false).is_err() {
            continue;
        }
        // Timestamps are parsed from digits only, so the value is non-negative.
        let ts = Decimal::new(ts.unsigned_abs());
        result = verify_any(secrets, sigs, |s| {
            Some(hmac_sha256(
                s.expose().as_bytes(),
                &[ts.as_bytes(), separator, body],
            ))
        });
        if result.is_ok() {
            break;
        }
    }
    result
}

/// A header name built once in a `static` (`HeaderName::from_static`), so lookups do
/// not parse names per request. Errors report its lower-case spelling.
pub type Name = &'static HeaderName;

/// All values of a header (repeated headers kept), each must be visible ASCII.
pub fn header_values<'a>(
    req: &'a WebhookRequest,
    name: Name,
) -> impl Iterator<Item = Result<&'a str, ProviderError>> + 'a {
    req.headers.get_all(name).iter().map(move |v| {
        v.to_str().map(str::trim).map_err(|_| {
            ProviderError::MalformedHeader(name.as_str(), "value is not visible ASCII")
        })
    })
}

/// A header that must have one value. Repeats (separate or comma-joined by API
/// Gateway) are fine when identical; different values are an error. A comma-joined
/// value whose parts differ is kept whole, since ids may legitimately contain commas.
pub fn single_header(req: &WebhookRequest, name: Name) -> Result<Option<&str>, ProviderError> {
    let mut found: Option<&str> = None;
    for raw in header_values(req, name) {
        let raw = raw?;
        let mut parts = raw.split(',').map(str::trim);
        let first = parts.next().unwrap_or_default();
        let value = if parts.all(|p| p == first) {
            first
        } else {
            raw
        };
        if value.is_empty() {
            return Err(ProviderError::MalformedHeader(name.as_str(), "empty value"));
        }
        match found {
            Some(prev) if prev != value => {
                return Err(ProviderError::MalformedHeader(
                    name.as_str(),
                    "repeated with different values",
                ))
            }
            _ => found = Some(value),
        }
    }
    Ok(found)
}

/// The first of several header names that is present (e.g. `webhook-id` / `svix-id`).
pub fn single_header_of<'a>(
    req: &'a WebhookRequest,
    names: &'static [HeaderName],
) -> Result<Option<&'a str>, ProviderError> {
    for name in names {
        if let Some(v) = single_header(req, name)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// Insert a generated header, mapping invalid characters to a clean error.
pub fn put(headers: &mut http::HeaderMap, name: Name, value: &str) -> Result<(), ProviderError> {
    let value = http::HeaderValue::from_str(value).map_err(|_| {
        ProviderError::MalformedHeader(name.as_str(), "value cannot be sent as a header")
    })?;
    headers.insert(name, value);
    Ok(())
}

/// `n` in decimal on the stack: signed content embeds timestamps on every request.
pub struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    pub fn new(mut n: u64) -> Self {
        let mut d = Decimal {
            buf: [b'0'; 20],
            start: 20,
        };
        loop {
            d.start -= 1;
            d.buf[d.start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return d;
            }
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
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
            None => parse_rfc3339(&self.str()?),
        }
    }
}

fn not_json(at: usize) -> ProviderError {
    payload_error(format!("body is not valid JSON (byte {at})"))
}

/// Find the values at `paths` (e.g. `&["data", "object", "id"]`) in a JSON object body.
/// Objects on the paths are walked exactly until everything wanted in them is found;
/// all other values, and the rest of an object once done, are skipped structurally,
/// so literals there are not validated. Errors name a byte offset or a path, never
/// body content. A wanted key repeated while its object is walked is an error.
pub fn json_fields<'a, const N: usize>(
    body: &'a [u8],
    paths: [&[&str]; N],
) -> Result<[Option<Raw<'a>>; N], ProviderError> {
    let mut cur = Cursor { b: body, i: 0 };
    cur.ws();
    if cur.peek() != Some(b'{') {
        return Err(payload_error("body is not a JSON object"));
    }
    const { assert!(N >= 1 && N <= 32, "paths are tracked in a u32 bit set") };
    let mut out = [None; N];
    let all = u32::MAX >> (32 - N);
    let walked = cur.object(&paths, 0, all, &mut out).and_then(|()| {
        cur.ws();
        if cur.i == body.len() {
            Ok(())
        } else {
            Err(Bad::At(cur.i))
        }
    });
    match walked {
        Ok(()) => Ok(out),
        Err(Bad::At(at)) => Err(not_json(at)),
        Err(Bad::Duplicate(n)) => Err(payload_error(format!(
            "duplicate field `{}`",
            paths[n].join(".")
        ))),
    }
}

/// Internal, allocation-free error of the walker.
enum Bad {
    At(usize),
    Duplicate(usize),
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.i += 1;
        }
    }

    #[inline]
    fn eat(&mut self, c: u8) -> Result<(), Bad> {
        self.ws();
        if self.peek() != Some(c) {
            return Err(Bad::At(self.i));
        }
        self.i += 1;
        Ok(())
    }

    /// The string token at the cursor, quotes included.
    #[inline]
    fn string(&mut self) -> Result<&'a [u8], Bad> {
        let start = self.i;
        let mut j = start + 1;
        loop {
            j = quote_or_backslash(self.b, j).ok_or(Bad::At(start))?;
            if self.b[j] == b'"' {
                break;
            }
            j += 2;
        }
        self.i = j + 1;
        Ok(&self.b[start..self.i])
    }

    fn value(&mut self) -> Result<&'a [u8], Bad> {
        self.ws();
        let start = self.i;
        match self.peek() {
            Some(b'"') => return self.string(),
            Some(b'{' | b'[') => self.i = skip_nested(self.b, start, 0).ok_or(Bad::At(start))?,
            Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
                while matches!(
                    self.peek(),
                    Some(b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'E')
                ) {
                    self.i += 1;
                }
            }
            _ => return Err(Bad::At(start)),
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
    ) -> Result<(), Bad> {
        self.eat(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(Bad::At(self.i));
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
                        return Err(Bad::Duplicate(n));
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
                _ => return Err(Bad::At(self.i)),
            }
            // Everything wanted here is found: skim the rest instead of walking it.
            if (0..N).all(|n| active & (1 << n) == 0 || out[n].is_some()) {
                self.i = skip_nested(self.b, self.i, 1).ok_or(Bad::At(self.i))?;
                return Ok(());
            }
        }
    }
}

/// Index of the next `"` or `\` at or after `from`.
fn quote_or_backslash(b: &[u8], from: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    let from = {
        let mut from = from;
        while let Some(chunk) = b.get(from..from + 16) {
            use std::arch::x86_64::*;
            // SAFETY: SSE2 is part of the x86_64 baseline; the unaligned load reads
            // exactly the 16 bytes of `chunk`.
            let hits = unsafe {
                let v = _mm_loadu_si128(chunk.as_ptr().cast());
                let q = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
                let bs = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
                _mm_movemask_epi8(_mm_or_si128(q, bs)) as u32
            };
            if hits != 0 {
                return Some(from + hits.trailing_zeros() as usize);
            }
            from += 16;
        }
        from
    };
    let rest = b.get(from..)?;
    rest.iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| from + k)
}

/// Bit masks of one 64-byte block: quotes, backslashes, `{`/`[`, `}`/`]`.
/// (`[`|0x20 == `{` and `]`|0x20 == `}`; no other byte maps onto those.)
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline(always)]
fn masks_portable(block: &[u8; 64]) -> [u64; 4] {
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    macro_rules! classify {
        ($lanes:expr, $load:ident, $or:ident, $eq:ident, $set1:ident, $movemask:ident, $t:ty, $block:expr) => {{
            let mut m = [0u64; 4];
            for (k, chunk) in $block.chunks_exact($lanes).enumerate() {
                let v = $load(chunk.as_ptr().cast());
                let folded = $or(v, $set1(0x20));
                let hits = [
                    $eq(v, $set1(b'"' as i8)),
                    $eq(v, $set1(b'\\' as i8)),
                    $eq(folded, $set1(b'{' as i8)),
                    $eq(folded, $set1(b'}' as i8)),
                ];
                for (mask, hit) in m.iter_mut().zip(hits) {
                    *mask |= u64::from($movemask(hit) as $t) << ($lanes * k);
                }
            }
            m
        }};
    }

    /// SSE2 is part of the x86_64 baseline.
    #[inline(always)]
    pub fn masks_sse2(block: &[u8; 64]) -> [u64; 4] {
        // SAFETY: SSE2 is always available on x86_64; each unaligned load reads exactly
        // the 16 bytes of its chunk.
        unsafe {
            classify!(
                16,
                _mm_loadu_si128,
                _mm_or_si128,
                _mm_cmpeq_epi8,
                _mm_set1_epi8,
                _mm_movemask_epi8,
                u16,
                block
            )
        }
    }

    /// # Safety
    /// The CPU must support AVX2, PCLMULQDQ and POPCNT.
    #[target_feature(enable = "avx2,pclmulqdq,popcnt")]
    pub unsafe fn skip_avx2(b: &[u8], start: usize, depth: u32) -> Option<usize> {
        let masks = |block: &[u8; 64]| {
            // SAFETY: AVX2 is enabled for this function; each unaligned load reads
            // exactly the 32 bytes of its chunk.
            unsafe {
                classify!(
                    32,
                    _mm256_loadu_si256,
                    _mm256_or_si256,
                    _mm256_cmpeq_epi8,
                    _mm256_set1_epi8,
                    _mm256_movemask_epi8,
                    u32,
                    block
                )
            }
        };
        // Carry-less multiplication by all-ones is a prefix XOR in one instruction.
        let prefix = |x: u64| {
            // SAFETY: register-only intrinsics of features this function enables (the
            // block is required before Rust 1.86 made such calls safe).
            #[allow(unused_unsafe)]
            unsafe {
                let r = _mm_clmulepi64_si128(_mm_set_epi64x(0, x as i64), _mm_set1_epi8(-1), 0);
                _mm_cvtsi128_si64(r) as u64
            }
        };
        super::skip_with(b, start, depth, masks, prefix)
    }
}

/// Bit i set when an odd number of bits at or below i are set in `x`.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// Bits of the characters escaped by a backslash in this block (simdjson's escape
/// scanner): runs of backslashes escape alternately, and a run may continue from the
/// previous block (`carry`).
#[inline(always)]
fn escaped(backslash: u64, carry: &mut u64) -> u64 {
    const ODD: u64 = 0xAAAA_AAAA_AAAA_AAAA;
    let potential = backslash & !*carry;
    // 1 on the code after an odd run and on the escapes inside runs, 0 elsewhere.
    let code = ((potential << 1) | ODD).wrapping_sub(potential) ^ ODD;
    let escaped = code ^ (backslash | *carry);
    *carry = (code & backslash) >> 63;
    escaped
}

/// Scan from `start` (outside any string) with `depth` brackets open; return the index
/// just past the bracket that closes them all. Each 64-byte block is classified with
/// bit tricks, so cost does not depend on how many strings or escapes it holds.
fn skip_nested(b: &[u8], start: usize, depth: u32) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("popcnt")
        {
            // SAFETY: all three features were just detected.
            return unsafe { x86::skip_avx2(b, start, depth) };
        }
        skip_with(b, start, depth, x86::masks_sse2, prefix_xor)
    }
    #[cfg(not(target_arch = "x86_64"))]
    skip_with(b, start, depth, masks_portable, prefix_xor)
}

#[inline(always)]
fn skip_with(
    b: &[u8],
    start: usize,
    mut depth: u32,
    masks: impl Fn(&[u8; 64]) -> [u64; 4],
    prefix_xor: impl Fn(u64) -> u64,
) -> Option<usize> {
    let (mut in_str, mut carry) = (0u64, 0u64);
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
        let [mut quote, backslash, mut open, mut close] = masks(block);
        if backslash | carry != 0 {
            let esc = escaped(backslash, &mut carry);
            (quote, open, close) = (quote & !esc, open & !esc, close & !esc);
        }
        // Bits from an opening quote up to (not including) its closing quote.
        let inside = prefix_xor(quote) ^ in_str;
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
        in_str = ((inside >> 63) & 1).wrapping_neg();
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

// ---- Hex signature headers (Mollie, Lemon Squeezy, Klarna, Slack) -------------------

/// Every hex signature in every value of the header `name`. Repeated headers (Mollie
/// rotation) and API Gateway comma-joins both count; hex never contains a comma.
/// `prefix` (e.g. `sha256=`, `v0=`; may be empty) is matched case-insensitively; when
/// `prefix_required` is false a value without it is taken as bare hex. An absent
/// header is `MissingHeader`; empty, unprefixed or non-hex parts are `MalformedHeader`.
pub fn hex_signatures(
    req: &WebhookRequest,
    name: Name,
    prefix: &str,
    prefix_required: bool,
) -> Result<Vec<Vec<u8>>, ProviderError> {
    let header = name.as_str();
    let mut out = Vec::with_capacity(1);
    let mut present = false;
    for value in header_values(req, name) {
        present = true;
        let value = value?;
        let mut parts = value.split(',').map(str::trim).peekable();
        if value.is_empty() || parts.peek().is_none() {
            return Err(ProviderError::MalformedHeader(header, "empty value"));
        }
        for part in parts {
            let hex = match part.split_at_checked(prefix.len()) {
                Some((p, rest)) if p.eq_ignore_ascii_case(prefix) => rest,
                _ if !prefix_required => part,
                _ => {
                    return Err(ProviderError::MalformedHeader(
                        header,
                        "missing signature scheme prefix",
                    ))
                }
            };
            if hex.is_empty() {
                return Err(ProviderError::MalformedHeader(header, "empty value"));
            }
            out.push(decode_hex(header, hex)?);
        }
    }
    if !present {
        return Err(ProviderError::MissingHeader(header));
    }
    Ok(out)
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
        static N: [HeaderName; 7] = [
            HeaderName::from_static("x-id"),
            HeaderName::from_static("x-j"),
            HeaderName::from_static("x-k"),
            HeaderName::from_static("x-l"),
            HeaderName::from_static("x-e"),
            HeaderName::from_static("x-u"),
            HeaderName::from_static("x-missing"),
        ];
        static FALLBACK: [HeaderName; 2] = [
            HeaderName::from_static("x-missing"),
            HeaderName::from_static("x-id"),
        ];
        let mut h = HeaderMap::new();
        h.append("X-Id", "abc".parse().unwrap());
        h.append("x-id", "abc".parse().unwrap());
        h.append("x-j", "abc,abc".parse().unwrap());
        h.append("x-k", "a,b".parse().unwrap());
        h.append("x-l", "a".parse().unwrap());
        h.append("x-l", "b".parse().unwrap());
        h.append("x-e", " ".parse().unwrap());
        h.append("x-u", http::HeaderValue::from_bytes(b"\xff").unwrap());
        let r = WebhookRequest::post(h, "");
        let bad = |name, why| Err(ProviderError::MalformedHeader(name, why));
        assert_eq!(single_header(&r, &N[0]), Ok(Some("abc")));
        assert_eq!(single_header(&r, &N[1]), Ok(Some("abc")));
        assert_eq!(single_header(&r, &N[2]), Ok(Some("a,b")));
        assert_eq!(
            single_header(&r, &N[3]),
            bad("x-l", "repeated with different values")
        );
        assert_eq!(single_header(&r, &N[4]), bad("x-e", "empty value"));
        assert_eq!(
            single_header(&r, &N[5]),
            bad("x-u", "value is not visible ASCII")
        );
        assert_eq!(single_header(&r, &N[6]), Ok(None));
        assert_eq!(single_header_of(&r, &FALLBACK), Ok(Some("abc")));
        assert_eq!(Decimal::new(0).as_bytes(), b"0");
        assert_eq!(Decimal::new(1_700_000_000).as_bytes(), b"1700000000");
        assert_eq!(
            Decimal::new(u64::MAX).as_bytes(),
            u64::MAX.to_string().as_bytes()
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
    }

    #[test]
    fn json_fields_rejects_non_objects_broken_json_and_duplicates() {
        for bad in [
            &b"[\"a\"]"[..],
            b"not json",
            b"",
            b"{\"id\":",
            b"{\"id\":\"x}",
            b"{} trailing",
            b"{\"a\":{\"b\":[1,2}}",
            b"{\"a\":]}",
            b"{\"a\":[\"\\\"]\"}",
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
        // A repeated wanted key is ambiguous while we still walk that object...
        let dup = json_fields(br#"{"id":"a","x":1,"id":"b","t":1}"#, [&["id"], &["t"]]);
        assert_eq!(dup, Err(payload_error("duplicate field `id`")));
        let dup = json_fields(
            br#"{"d":{"id":1},"d":{"id":2},"t":1}"#,
            [&["d", "id"], &["t"]],
        );
        assert_eq!(dup, Err(payload_error("duplicate field `d.id`")));
        // ...but once everything wanted is found, the rest is only skimmed for structure.
        let [id] = json_fields(br#"{"id":"a","x":{"y":[1]},"id":"b"}"#, [&["id"]]).unwrap();
        assert_eq!(id, Some(Raw(b"\"a\"")));
        let rest = json_fields(br#"{"id":"a","x":{"y":[1}"#, [&["id"]]);
        assert_eq!(rest, Err(not_json(10)));
        let err = json_fields(br#"{"k":"secretvalue"]]"#, [&["id"]]).unwrap_err();
        assert!(!err.to_string().contains("secretvalue"), "{err}");
    }

    #[test]
    fn json_fields_checks_grammar_until_done_then_structure() {
        // Walked parts are checked exactly...
        assert!(json_fields(br#"{"a" 1,"id":2}"#, [&["id"]]).is_err());
        // ...the rest, once every wanted field is found, only for balanced structure.
        assert!(json_fields(br#"{"id":2,"a" 1,}"#, [&["id"]]).is_ok());
        let [id] = json_fields(br#"{"x":"\"id\":1","id":2}"#, [&["id"]]).unwrap();
        assert_eq!(id, Some(Raw(b"2")));
        // A string value equal to a wanted key is not a key.
        let [id] = json_fields(br#"{"a":"id","b":["id"],"id" :3}"#, [&["id"]]).unwrap();
        assert_eq!(id, Some(Raw(b"3")));
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
                let got = json_fields(
                    text.as_bytes(),
                    [
                        &["id"],
                        &["type"],
                        &["data", "id"],
                        &["data", "data", "type"],
                    ],
                )
                .unwrap_or_else(|e| panic!("round {round}: {e}: {text}"));
                let want = [
                    value.get("id"),
                    value.get("type"),
                    value.get("data").and_then(|d| d.get("id")),
                    value
                        .get("data")
                        .and_then(|d| d.get("data"))
                        .and_then(|d| d.get("type")),
                ];
                for (g, w) in got.iter().zip(want) {
                    let g = g.map(|r| serde_json::from_slice::<serde_json::Value>(r.0).unwrap());
                    assert_eq!(g.as_ref(), w, "round {round}: {text}");
                }
            }
        }
    }

    /// Byte-by-byte reference for `skip_nested`.
    fn skip_slow(b: &[u8], start: usize) -> Option<usize> {
        let (mut depth, mut in_str, mut esc) = (0u32, false, false);
        for (k, &c) in b.iter().enumerate().skip(start) {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = !in_str;
            } else if !in_str && (c | 0x20) == b'{' {
                depth += 1;
            } else if !in_str && (c | 0x20) == b'}' {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k + 1);
                }
            }
        }
        None
    }

    /// Every block classifier must agree; returns their common answer.
    fn variants(b: &[u8]) -> Option<usize> {
        let portable = skip_with(b, 0, 0, masks_portable, prefix_xor);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(skip_with(b, 0, 0, x86::masks_sse2, prefix_xor), portable);
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
                && std::arch::is_x86_feature_detected!("popcnt")
            {
                // SAFETY: features detected.
                assert_eq!(unsafe { x86::skip_avx2(b, 0, 0) }, portable);
            }
        }
        portable
    }

    #[test]
    fn skip_nested_matches_reference_on_random_input() {
        let alphabet = b"\\\\\"\"{}[]ab";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut doc = vec![b'['];
            let len = (seed >> 40) as usize % 300;
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                doc.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            doc.push(b']');
            assert_eq!(
                variants(&doc),
                skip_slow(&doc, 0),
                "{}",
                String::from_utf8_lossy(&doc)
            );
        }
    }

    #[test]
    fn skip_nested_matches_serde_at_every_block_offset() {
        let inner = r#"{"s":"q\"uo{te}[","e":"\\","u":"\u00e9","a":[[],{}],"t":true,"n":-1.5e3,"k":{"x":"]"}}"#;
        for pad in 0..140 {
            for lead in ["", "\"\\\\\",", "\"x\\\"\","] {
                let doc = format!(r#"[{lead}"{}",{inner},{inner}]"#, "p".repeat(pad));
                let b = doc.as_bytes();
                let want = b.len();
                assert_eq!(skip_nested(b, 0, 0), Some(want), "pad {pad} lead {lead}");
                let at = doc.find("{\"s\"").unwrap();
                let mut it = serde_json::Deserializer::from_slice(&b[at..])
                    .into_iter::<serde::de::IgnoredAny>();
                assert!(it.next().is_some_and(|r| r.is_ok()));
                assert_eq!(
                    skip_nested(b, at, 0),
                    Some(at + it.byte_offset()),
                    "pad {pad}"
                );
                assert_eq!(skip_nested(&b[..want - 1], 0, 0), None);
            }
        }
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
