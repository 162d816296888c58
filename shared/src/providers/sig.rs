//! Helpers shared by every provider: MACs over several slices, constant-time
//! comparison, decoding, timestamp windows, secret rotation and header access (JSON
//! extraction is in `json.rs`). Error messages never contain secrets or body bytes.

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
    hex::decode(s).map_err(|_| ProviderError::MalformedHeader(header, "signature is not valid hex"))
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

/// One timestamp with the signatures sent for it (Stripe `t`/`v1`, Paddle `ts`/`h1`).
pub struct StampedSigs {
    pub ts: i64,
    pub sigs: Vec<Vec<u8>>,
}

/// A timestamp-signed request: the tenant's secrets (`NoSecret` first), then the groups
/// `parse_header` reads, checked by [`verify_timestamped_body`] with the tenant's
/// tolerance. Returns the body that held.
pub fn verify_stamped_request<'r>(
    request: &'r WebhookRequest,
    tenant: &TenantConfig,
    now_secs: i64,
    separator: &[u8],
    parse_header: impl FnOnce(&WebhookRequest) -> Result<Vec<StampedSigs>, ProviderError>,
) -> Result<&'r [u8], ProviderError> {
    let secrets = secrets(tenant)?;
    let groups = parse_header(request)?;
    let body = &request.body[..];
    verify_timestamped_body(
        groups.iter().map(|g| (g.ts, g.sigs.as_slice())),
        secrets,
        body,
        separator,
        now_secs,
        tenant.tolerance_secs,
    )?;
    Ok(body)
}

/// The timestamp and the hex HMAC-SHA256 of `"{ts}{separator}{body}"` with the tenant's
/// first secret, for generating a timestamp-signed delivery.
pub fn sign_stamped_hex(
    tenant: &TenantConfig,
    body: &[u8],
    separator: &[u8],
    now_secs: i64,
) -> Result<(String, String), ProviderError> {
    let secret = secrets(tenant)?[0].expose();
    let ts = now_secs.to_string();
    let mac = hmac_sha256(secret.as_bytes(), &[ts.as_bytes(), separator, body]);
    Ok((ts, hex::encode(mac)))
}

// ---- Standard Webhooks signing (Standard Webhooks / Svix, GitLab signing token) ----

/// Every `v1` signature in header `header`. Entries are space-separated `version,sig`;
/// API Gateway comma-joins repeated headers (`v1,a,v1,b`), so a token may hold several
/// pairs. Other versions (`v1a`, ed25519) are not ours to judge and are skipped.
pub fn standard_v1_signatures(
    request: &WebhookRequest,
    header: Name,
) -> Result<Vec<Vec<u8>>, ProviderError> {
    let name = header.as_str();
    let mut out = Vec::with_capacity(1);
    let mut seen = false;
    for value in header_values(request, header) {
        for token in value?.split_ascii_whitespace() {
            seen = true;
            let mut parts = token.split(',');
            while let Some(version) = parts.next() {
                let Some(signature) = parts.next() else {
                    return Err(ProviderError::MalformedHeader(
                        name,
                        "expected v1,<base64> entries",
                    ));
                };
                if version == "v1" {
                    out.push(decode_base64(name, signature)?);
                }
            }
        }
    }
    if !seen {
        return Err(ProviderError::MalformedHeader(name, "empty value"));
    }
    if out.is_empty() {
        return Err(ProviderError::MalformedHeader(name, "no v1 signature"));
    }
    Ok(out)
}

/// HMAC-SHA256 of the Standard Webhooks signed content `"{id}.{ts}.{body}"`.
fn standard_mac(key: &[u8], id: &str, ts: &[u8], body: &[u8]) -> [u8; 32] {
    hmac_sha256(key, &[id.as_bytes(), b".", ts, b".", body])
}

/// The `webhook-timestamp` and `webhook-signature` (`v1,<base64>`) values that sign
/// `body` as event `id` at `now_secs`.
pub fn sign_standard(key: &[u8], id: &str, body: &[u8], now_secs: i64) -> (String, String) {
    let ts = now_secs.to_string();
    let mac = standard_mac(key, id, ts.as_bytes(), body);
    let signature = format!("v1,{}", B64.encode(mac));
    (ts, signature)
}

/// Check `ts` against the tolerance, then every secret's key (`key` gives `None` for
/// an unusable secret) against the `v1` candidates over `"{id}.{ts}.{body}"`.
pub fn verify_standard(
    secrets: &[Secret],
    candidates: &[Vec<u8>],
    (id, ts): (&str, i64),
    (now_secs, tolerance_secs): (i64, u64),
    body: &[u8],
    key: impl Fn(&Secret) -> Option<Cow<'_, [u8]>>,
) -> Result<(), ProviderError> {
    check_timestamp(ts, now_secs, tolerance_secs, false)?;
    // parse_unix admits digits only, so the value is non-negative.
    let ts_text = Decimal::new(ts.unsigned_abs());
    verify_any(secrets, candidates, |s| {
        Some(standard_mac(&key(s)?, id, ts_text.as_bytes(), body))
    })
}

/// One header under its two names, first preferred (Shopify classic / Events preview,
/// Standard Webhooks / Svix), for [`single_header_of`] in a `static`.
macro_rules! header_names {
    ($first:literal, $second:literal) => {
        [
            http::HeaderName::from_static($first),
            http::HeaderName::from_static($second),
        ]
    };
}
pub(crate) use header_names;

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

/// The headers of a generated JSON delivery: each `(name, value)` in order, then
/// `Content-Type: application/json`.
pub fn json_headers(pairs: &[(Name, &str)]) -> Result<http::HeaderMap, ProviderError> {
    let mut headers = http::HeaderMap::new();
    for (name, value) in pairs {
        put(&mut headers, name, value)?;
    }
    put(
        &mut headers,
        &http::header::CONTENT_TYPE,
        "application/json",
    )?;
    Ok(headers)
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

/// Event ids become part of the inbox key: non-empty, bounded, no control or format characters (`crate::text`).
pub fn check_event_id(id: &str) -> Result<(), ProviderError> {
    if id.is_empty() {
        return Err(payload_error("event id is empty"));
    }
    if id.len() > MAX_EVENT_ID_LEN {
        return Err(payload_error("event id is longer than 256 bytes"));
    }
    if id.chars().any(crate::text::is_unsafe) {
        return Err(payload_error(
            "event id contains control or format characters",
        ));
    }
    Ok(())
}

pub fn payload_error(msg: impl Into<String>) -> ProviderError {
    ProviderError::MalformedPayload(msg.into())
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

/// Every value of the header `name`, each one base64 signature (HubSpot, Zendesk). An
/// absent header is `MissingHeader`; a value that is not base64 is `MalformedHeader`.
pub fn base64_signatures(req: &WebhookRequest, name: Name) -> Result<Vec<Vec<u8>>, ProviderError> {
    let header = name.as_str();
    let mut out = Vec::with_capacity(1);
    for value in header_values(req, name) {
        out.push(decode_base64(header, value?)?);
    }
    if out.is_empty() {
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
}
