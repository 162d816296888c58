//! Twilio: `X-Twilio-Signature: base64(HMAC-SHA1(auth token, url + Σ name+value))`,
//! as twilio-python's `RequestValidator.validate`:
//! - the URL is the exact public URL Twilio called. It comes from tenant option `url`:
//!   the endpoint's public base URL **without** query, to which `?` + the request's
//!   raw query string is appended when there is one (Lambda's own view of host and
//!   path is not what Twilio signed). A configured `url` that already holds a `?` is
//!   taken as the complete URL and used as is.
//! - form bodies: the decoded parameters sorted by name, and for each name its
//!   distinct values sorted (`sorted(set(values))`, so a repeated identical pair
//!   counts once), each appended as `name + value`.
//! - JSON bodies: the URL carries `bodySHA256=<hex sha256(raw body)>`; the HMAC covers
//!   the URL alone and the body hash is compared separately (both must hold).
//! - the URL is tried with and without its port (adding 443/80 when absent, removing
//!   any port when present), like the SDK.
//!
//! Nothing time-related is signed; the auth token is the key (several during rotation).
//! Missing option `url` is reported as `NoSecret`: the tenant cannot be verified.
//!
//! HMAC-SHA256 mode (a Webhooks Rule with a shared key, twilio 9.x): Twilio adds
//! `X-Twilio-Webhooks-Signature-Settings: key=<…>,algorithm=HMAC_SHA256` and signs the
//! same string with the rule's shared key (tenant option `shared_key_secret`, inline or
//! `env:VAR`) and that algorithm; the signature stays in `X-Twilio-Signature`. When the
//! header is present its algorithm must be `HMAC_SHA256` or `HMAC_SHA1` (anything else
//! is refused) and only the shared key is tried: never the auth token with SHA-1, so the
//! header cannot be used to downgrade. Present without a configured shared key: the
//! tenant cannot verify it (`NoSecret`, 401).
//!
//! Dedup id (Twilio has no event id): `{Sid}:{status}[:{SequenceNumber}]` where Sid/status
//! is the most specific pair present (`RecordingSid`/`RecordingStatus`,
//! `TranscriptionSid`/`TranscriptionStatus`, `ConferenceSid`/`StatusCallbackEvent`,
//! `MessageSid`/`MessageStatus` (or `SmsStatus`), `SmsSid`/`SmsStatus`,
//! `CallSid`/`CallStatus`); type `{kind}.{status}`. Tenant check: param `AccountSid`
//! must equal option `account_sid` when configured. The (unconfirmed)
//! `I-Twilio-Idempotency-Token` header is kept as the delivery id only.

use std::borrow::Cow;

use base64::Engine as _;
use http::HeaderName;
use sha2::{Digest, Sha256};

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::{Secret, TenantConfig};
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Twilio;

const SIGNATURE_NAME: &str = "x-twilio-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);
static IDEMPOTENCY: HeaderName = HeaderName::from_static("i-twilio-idempotency-token");
const SETTINGS_NAME: &str = "x-twilio-webhooks-signature-settings";
static SETTINGS: HeaderName = HeaderName::from_static(SETTINGS_NAME);
/// The tenant option holding a Webhooks Rule's shared key.
pub const SHARED_KEY_OPTION: &str = "shared_key_secret";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Sha1,
    Sha256,
}

impl Algorithm {
    fn mac(self, key: &[u8], message: &[u8]) -> Vec<u8> {
        match self {
            Algorithm::Sha1 => sig::hmac_sha1(key, &[message]).to_vec(),
            Algorithm::Sha256 => sig::hmac_sha256(key, &[message]).to_vec(),
        }
    }
}

/// The shared key of a Webhooks Rule, resolving `env:VAR`; `None` when not configured.
fn shared_key(tenant: &TenantConfig) -> Option<Secret> {
    let raw = tenant.option(SHARED_KEY_OPTION).filter(|v| !v.is_empty())?;
    let value = match raw.strip_prefix("env:") {
        Some(var) => std::env::var(var.trim()).ok()?,
        None => raw.to_owned(),
    };
    (!value.is_empty()).then(|| Secret::new(value))
}

/// The keys and algorithm this request must be verified with (see the module docs).
fn signing_mode(
    request: &WebhookRequest,
    tenant: &TenantConfig,
) -> Result<(Algorithm, Vec<Secret>), ProviderError> {
    let Some(settings) = sig::single_header(request, &SETTINGS)? else {
        return Ok((Algorithm::Sha1, sig::secrets(tenant)?.to_vec()));
    };
    let mut algorithm = None;
    for part in settings.split(',').map(str::trim) {
        if let Some((name, value)) = part.split_once('=') {
            if name.trim().eq_ignore_ascii_case("algorithm") {
                algorithm = match value.trim() {
                    "HMAC_SHA256" => Some(Algorithm::Sha256),
                    "HMAC_SHA1" => Some(Algorithm::Sha1),
                    _ => {
                        return Err(ProviderError::MalformedHeader(
                            SETTINGS_NAME,
                            "unsupported algorithm",
                        ))
                    }
                };
            }
        }
    }
    let algorithm = algorithm.ok_or(ProviderError::MalformedHeader(
        SETTINGS_NAME,
        "no algorithm",
    ))?;
    let key = shared_key(tenant).ok_or(ProviderError::NoSecret)?;
    Ok((algorithm, vec![key]))
}

/// The public URL Twilio called, from configuration plus the request's query.
fn public_url<'a>(
    tenant: &'a TenantConfig,
    query: Option<&str>,
) -> Result<Cow<'a, str>, ProviderError> {
    let base = tenant.option("url").ok_or(ProviderError::NoSecret)?;
    Ok(match query.filter(|q| !q.is_empty()) {
        Some(q) if !base.contains('?') => Cow::Owned(format!("{base}?{q}")),
        _ => Cow::Borrowed(base),
    })
}

/// The URL with and without its port, as the SDK tries both.
fn url_variants(url: &str) -> Vec<String> {
    let mut out = vec![url.to_owned()];
    let Some((scheme, rest)) = url.split_once("://") else {
        return out;
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (&authority[..=u.len()], h),
        None => ("", authority),
    };
    let port_at = hostport.rfind(':').filter(|&i| {
        !hostport[i..].contains(']') && hostport[i + 1..].bytes().all(|b| b.is_ascii_digit())
    });
    match port_at {
        Some(i) => out.push(format!("{scheme}://{userinfo}{}{tail}", &hostport[..i])),
        None => {
            let port = match scheme.to_ascii_lowercase().as_str() {
                "https" => "443",
                "http" => "80",
                _ => return out,
            };
            out.push(format!("{scheme}://{userinfo}{hostport}:{port}{tail}"));
        }
    }
    out
}

/// `bodySHA256` in the URL's query, if any.
fn body_sha256_param(url: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or_default();
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "bodySHA256")
        .map(|(_, v)| v.into_owned())
}

/// The string Twilio signs for a form body: url, then sorted distinct name+value pairs.
pub fn signing_string(url: &str, params: &[(Cow<'_, str>, Cow<'_, str>)]) -> String {
    let mut pairs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (&**k, &**v)).collect();
    pairs.sort_unstable();
    pairs.dedup();
    let mut s = String::with_capacity(
        url.len() + pairs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(),
    );
    s.push_str(url);
    for (k, v) in pairs {
        s.push_str(k);
        s.push_str(v);
    }
    s
}

fn candidates(request: &WebhookRequest) -> Result<Vec<Vec<u8>>, ProviderError> {
    let mut out = Vec::with_capacity(1);
    for value in sig::header_values(request, &SIGNATURE) {
        let value = value?;
        if value.is_empty() {
            return Err(ProviderError::MalformedHeader(
                SIGNATURE_NAME,
                "empty value",
            ));
        }
        // API Gateway comma-joins repeats; base64 never contains a comma.
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out.push(sig::decode_base64(SIGNATURE_NAME, part)?);
        }
    }
    if out.is_empty() {
        return Err(ProviderError::MissingHeader(SIGNATURE_NAME));
    }
    Ok(out)
}

type Params<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// A parameter that must not be ambiguous: several different values are an error.
fn param<'p>(params: &'p Params<'_>, name: &str) -> Result<Option<&'p str>, ProviderError> {
    let mut found: Option<&str> = None;
    for (k, v) in params {
        if k == name {
            match found {
                Some(prev) if prev != v => {
                    return Err(sig::payload_error(format!(
                        "parameter {name} repeated with different values"
                    )))
                }
                _ => found = Some(v),
            }
        }
    }
    Ok(found.filter(|v| !v.is_empty()))
}

const KINDS: [(&str, &[&str], &str); 6] = [
    ("RecordingSid", &["RecordingStatus"], "recording"),
    (
        "TranscriptionSid",
        &["TranscriptionStatus"],
        "transcription",
    ),
    ("ConferenceSid", &["StatusCallbackEvent"], "conference"),
    ("MessageSid", &["MessageStatus", "SmsStatus"], "message"),
    ("SmsSid", &["SmsStatus"], "message"),
    ("CallSid", &["CallStatus"], "call"),
];

fn extract(
    request: &WebhookRequest,
    tenant: &TenantConfig,
    params: &Params<'_>,
) -> Result<Envelope, ProviderError> {
    if let Some(want) = tenant.option("account_sid") {
        if param(params, "AccountSid")? != Some(want) {
            return Err(ProviderError::TenantMismatch("AccountSid"));
        }
    }
    let mut found = None;
    for (sid_name, status_names, kind) in KINDS {
        if let Some(sid) = param(params, sid_name)? {
            let mut status = None;
            for s in status_names {
                status = status.or(param(params, s)?);
            }
            found = Some((sid, status, kind));
            break;
        }
    }
    let (sid, status, kind) = found
        .ok_or_else(|| sig::payload_error("no MessageSid, CallSid or other *Sid parameter"))?;
    let mut event_id = sid.to_owned();
    if let Some(status) = status {
        event_id.push(':');
        event_id.push_str(status);
    }
    if let Some(seq) = param(params, "SequenceNumber")? {
        event_id.push(':');
        event_id.push_str(seq);
    }
    sig::check_event_id(&event_id)?;
    let event_type = match status {
        Some(s) => format!("{kind}.{s}"),
        None => kind.to_owned(),
    };
    let occurred_at = param(params, "Timestamp")?.and_then(parse_rfc2822);
    Ok(Envelope {
        provider: "twilio".into(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type,
        object_id: Some(sid.to_owned()),
        object_version: None,
        occurred_at,
        delivery_id: sig::single_header(request, &IDEMPOTENCY)?.map(str::to_owned),
    })
}

/// Twilio's `Timestamp` ("Thu, 06 Jun 2024 10:00:00 +0000"); best effort.
fn parse_rfc2822(s: &str) -> Option<i64> {
    let mut it = s.split_ascii_whitespace();
    let _weekday = it.next()?;
    let day: u32 = it.next()?.parse().ok()?;
    let month = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: u32 = it.next()?.parse().ok()?;
    let time = it.next()?;
    let zone = it.next()?;
    let zone = match zone {
        "+0000" | "GMT" | "UTC" => "Z".to_owned(),
        z if z.len() == 5 => format!("{}:{}", &z[..3], &z[3..]),
        _ => return None,
    };
    crate::time::parse_rfc3339(&format!("{year:04}-{month:02}-{day:02}T{time}{zone}"))
}

impl Provider for Twilio {
    fn name(&self) -> &'static str {
        "twilio"
    }

    fn options(&self) -> &'static [&'static str] {
        &["url", "account_sid", "shared_key_secret"]
    }

    /// No retries by default for most products (unconfirmed).
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let (algorithm, secrets) = signing_mode(request, tenant)?;
        let candidates = candidates(request)?;
        let url = public_url(tenant, request.query.as_deref())?;
        let body = &request.body[..];
        let body_hash = body_sha256_param(&url);
        let params: Params<'_> = if body_hash.is_some() {
            Vec::new()
        } else {
            form_urlencoded::parse(body).collect()
        };
        let signed: Vec<String> = url_variants(&url)
            .into_iter()
            .map(|u| signing_string(&u, &params))
            .collect();
        let mut ok = sig::verify_any(&secrets, &candidates, |s| {
            let key = s.expose().as_bytes();
            // Either URL spelling may match: report the first that does.
            let mut macs: Vec<Vec<u8>> = signed
                .iter()
                .map(|m| algorithm.mac(key, m.as_bytes()))
                .collect();
            let hit = macs
                .iter()
                .position(|m| candidates.iter().any(|c| sig::ct_eq(m, c)))
                .unwrap_or(0);
            Some(macs.swap_remove(hit))
        });
        if let (Ok(()), Some(want)) = (&ok, &body_hash) {
            let want = sig::decode_hex("bodySHA256", want)
                .map_err(|_| ProviderError::SignatureMismatch)?;
            if !sig::ct_eq(&Sha256::digest(body), &want) {
                ok = Err(ProviderError::SignatureMismatch);
            }
        }
        ok?;
        let params: Params<'_> = if body_hash.is_some() {
            json_params(body)?
        } else {
            params
        };
        let envelope = extract(request, tenant, &params)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    /// Form bodies: signs option `url` + the body's parameters. JSON bodies (first
    /// non-space byte `{`): signs option `url` with `bodySHA256=<hex>` appended to its
    /// query; the sender must call exactly that URL. With option `shared_key_secret`
    /// it signs as a Webhooks Rule does: HMAC-SHA256 with that key, plus the settings
    /// header.
    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        _now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let shared = shared_key(tenant);
        let (algorithm, key) = match &shared {
            Some(k) => (Algorithm::Sha256, k.expose().as_bytes()),
            None => (
                Algorithm::Sha1,
                sig::secrets(tenant)?[0].expose().as_bytes(),
            ),
        };
        let url = tenant.option("url").ok_or(ProviderError::NoSecret)?;
        let mut h = http::HeaderMap::new();
        if shared.is_some() {
            sig::put(&mut h, &SETTINGS, "key=,algorithm=HMAC_SHA256")?;
        }
        let is_json = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let signed = if is_json {
            let sep = if url.contains('?') { '&' } else { '?' };
            sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
            format!("{url}{sep}bodySHA256={}", hex::encode(Sha256::digest(body)))
        } else {
            sig::put(
                &mut h,
                &http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )?;
            signing_string(url, &form_urlencoded::parse(body).collect::<Vec<_>>())
        };
        let mac = algorithm.mac(key, signed.as_bytes());
        sig::put(&mut h, &SIGNATURE, &sig::B64.encode(mac))?;
        Ok(h)
    }
}

/// The top-level string fields of a JSON body that identify the event.
fn json_params(body: &[u8]) -> Result<Params<'_>, ProviderError> {
    const NAMES: [&str; 12] = [
        "AccountSid",
        "RecordingSid",
        "RecordingStatus",
        "TranscriptionSid",
        "TranscriptionStatus",
        "ConferenceSid",
        "StatusCallbackEvent",
        "MessageSid",
        "MessageStatus",
        "SmsSid",
        "SmsStatus",
        "CallSid",
    ];
    let [a, b, c, d, e, f, g, h, i, j, k, l, m, n] = json::json_fields(
        body,
        [
            &[NAMES[0]],
            &[NAMES[1]],
            &[NAMES[2]],
            &[NAMES[3]],
            &[NAMES[4]],
            &[NAMES[5]],
            &[NAMES[6]],
            &[NAMES[7]],
            &[NAMES[8]],
            &[NAMES[9]],
            &[NAMES[10]],
            &[NAMES[11]],
            &["CallStatus"],
            &["SequenceNumber"],
        ],
    )?;
    let names = NAMES
        .iter()
        .copied()
        .chain(["CallStatus", "SequenceNumber"]);
    Ok(names
        .zip([a, b, c, d, e, f, g, h, i, j, k, l, m, n])
        .filter_map(|(name, v)| Some((Cow::Borrowed(name), v.and_then(Raw::text)?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};

    const V10_URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";
    const V10_BODY: &str = "CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";
    const V10_SIG: &str = "RSOYDt4T1cUTdK1PDd93/VVr8B8=";

    fn tenant(secrets: &[&str], url: &str) -> TenantConfig {
        let mut t = TenantConfig {
            provider: "twilio".into(),
            tenant: "acme".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: Default::default(),
        };
        t.options.insert("url".into(), url.into());
        t
    }

    fn request(sigs: &[&str], body: &str, query: Option<&str>) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for s in sigs {
            h.append("X-Twilio-Signature", HeaderValue::from_str(s).unwrap());
        }
        let mut r = WebhookRequest::post(h, body.to_owned());
        r.query = query.map(str::to_owned);
        r
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&Twilio, r, t, 0)
    }

    fn b64sha1(key: &str, s: &str) -> String {
        sig::B64.encode(sig::hmac_sha1(key.as_bytes(), &[s.as_bytes()]))
    }

    #[test]
    fn v10_form_vector() {
        // Base URL configured without query; the request's own query is appended.
        let t = tenant(&["12345"], "https://mycompany.com/myapp.php");
        let r = request(&[V10_SIG], V10_BODY, Some("foo=1&bar=2"));
        let env = verify(&r, &t).unwrap();
        assert_eq!(env.event_id, "CA1234567890ABCDE");
        assert_eq!(env.event_type, "call");
        // The complete URL configured as is works too.
        assert!(verify(
            &request(&[V10_SIG], V10_BODY, None),
            &tenant(&["12345"], V10_URL)
        )
        .is_ok());
        // Parameter order in the body does not matter.
        let shuffled = "To=%2B18005551212&From=%2B14158675309&Digits=1234&Caller=%2B14158675309&CallSid=CA1234567890ABCDE";
        assert!(verify(&request(&[V10_SIG], shuffled, Some("foo=1&bar=2")), &t).is_ok());
        // A different query is a different URL.
        assert_eq!(
            verify(&request(&[V10_SIG], V10_BODY, Some("foo=1&bar=3")), &t),
            Err(ProviderError::SignatureMismatch)
        );
    }

    /// The V10 request as a Webhooks Rule with shared key `shared-key-1` signs it:
    /// HMAC-SHA256 over the same string (computed independently with Python's `hmac`).
    const SHA256_SIG: &str = "kRdFuCME7BzK6NbPCCasSwFZRhhO2ssWqg1omdi/FEM=";

    fn with_settings(mut r: WebhookRequest, settings: &str) -> WebhookRequest {
        r.headers.insert(
            "X-Twilio-Webhooks-Signature-Settings",
            HeaderValue::from_str(settings).unwrap(),
        );
        r
    }

    #[test]
    fn hmac_sha256_mode_vector_and_no_downgrade() {
        let mut t = tenant(&["12345"], "https://mycompany.com/myapp.php");
        t.options
            .insert(SHARED_KEY_OPTION.into(), "shared-key-1".into());
        let signed = |sig: &str, settings: &str| {
            with_settings(request(&[sig], V10_BODY, Some("foo=1&bar=2")), settings)
        };
        let env = verify(&signed(SHA256_SIG, "key=,algorithm=HMAC_SHA256"), &t).unwrap();
        assert_eq!(env.event_id, "CA1234567890ABCDE");
        // The key part's format is not confirmed; only the algorithm matters.
        assert!(verify(&signed(SHA256_SIG, "key=KS123, algorithm=HMAC_SHA256"), &t).is_ok());
        // The header says SHA-256: a SHA-1 signature with the auth token is refused.
        assert_eq!(
            verify(&signed(V10_SIG, "key=,algorithm=HMAC_SHA256"), &t),
            Err(ProviderError::SignatureMismatch)
        );
        // HMAC_SHA1 in the header still uses the shared key, not the auth token.
        assert_eq!(
            verify(&signed(V10_SIG, "key=,algorithm=HMAC_SHA1"), &t),
            Err(ProviderError::SignatureMismatch)
        );
        let sha1_shared = b64sha1(
            "shared-key-1",
            "https://mycompany.com/myapp.php?foo=1&bar=2CallSidCA1234567890ABCDECaller+14158675309Digits1234From+14158675309To+18005551212",
        );
        assert!(verify(&signed(&sha1_shared, "algorithm=HMAC_SHA1"), &t).is_ok());
        // Unknown or missing algorithms are refused (401), never guessed.
        for bad in ["key=,algorithm=HMAC_MD5", "key=abc", "algorithm="] {
            let err = verify(&signed(SHA256_SIG, bad), &t).unwrap_err();
            assert!(err.is_authentication_failure(), "{bad}: {err}");
        }
        // Without the settings header the auth token and SHA-1 apply as before.
        let plain = request(&[V10_SIG], V10_BODY, Some("foo=1&bar=2"));
        assert!(verify(&plain, &t).is_ok());
        let sha256_without_header = request(&[SHA256_SIG], V10_BODY, Some("foo=1&bar=2"));
        assert_eq!(
            verify(&sha256_without_header, &t),
            Err(ProviderError::SignatureMismatch)
        );
        // A tenant without a shared key cannot verify the SHA-256 mode.
        let no_key = tenant(&["12345"], "https://mycompany.com/myapp.php");
        assert_eq!(
            verify(&signed(SHA256_SIG, "key=,algorithm=HMAC_SHA256"), &no_key),
            Err(ProviderError::NoSecret)
        );
        // `sign` with a shared key produces what `verify` accepts (einmal send).
        let mut full = tenant(&["12345"], V10_URL);
        full.options
            .insert(SHARED_KEY_OPTION.into(), "shared-key-1".into());
        let h = Twilio.sign(V10_BODY.as_bytes(), &full, "", 0).unwrap();
        let r = WebhookRequest::post(h, V10_BODY.to_owned());
        assert_eq!(r.header("x-twilio-signature"), Some(SHA256_SIG));
        assert!(verify(&r, &full).is_ok());
    }

    #[test]
    fn v10_duplicate_params() {
        let body = "Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234&Digits=1234";
        let params: Vec<_> = form_urlencoded::parse(body.as_bytes()).collect();
        let s = signing_string(V10_URL, &params);
        assert_eq!(b64sha1("12345", &s), "IK+Dwps556ElfBT0I3Rgjkr1wJU=");
        // Through verify: authentic, but no *Sid we know of (Sid alone) → 400.
        let r = request(&["IK+Dwps556ElfBT0I3Rgjkr1wJU="], body, None);
        let err = verify(&r, &tenant(&["12345"], V10_URL)).unwrap_err();
        assert!(matches!(err, ProviderError::MalformedPayload(_)), "{err:?}");
    }

    #[test]
    fn v10_json_body_sha256() {
        let body = r#"{"property": "value", "boolean": true}"#;
        let hash = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
        assert_eq!(hex::encode(Sha256::digest(body)), hash);
        let query = format!("bodySHA256={hash}");
        let t = tenant(&["12345"], "https://mycompany.com/myapp.php");
        let sig = b64sha1("12345", &format!("https://mycompany.com/myapp.php?{query}"));
        // Authentic, but no Sid: malformed.
        let err = verify(&request(&[&sig], body, Some(&query)), &t).unwrap_err();
        assert!(matches!(err, ProviderError::MalformedPayload(_)), "{err:?}");
        // A tampered body fails the hash even though the URL signature holds.
        assert_eq!(
            verify(
                &request(
                    &[&sig],
                    r#"{"property": "other", "boolean": true}"#,
                    Some(&query)
                ),
                &t
            ),
            Err(ProviderError::SignatureMismatch)
        );
        // A JSON body with ids.
        let body = r#"{"AccountSid":"AC1","MessageSid":"SM1","MessageStatus":"delivered"}"#;
        let h = Twilio.sign(body.as_bytes(), &t, "", 0).unwrap();
        let query = format!("bodySHA256={}", hex::encode(Sha256::digest(body)));
        let mut r = request(&[], body, Some(&query));
        r.headers.extend(h);
        let env = verify(&r, &t).unwrap();
        assert_eq!(
            (env.event_id.as_str(), env.event_type.as_str()),
            ("SM1:delivered", "message.delivered")
        );
        // A garbled bodySHA256 is a mismatch, not a panic.
        let sig = b64sha1("12345", "https://mycompany.com/myapp.php?bodySHA256=zz");
        assert_eq!(
            verify(&request(&[&sig], body, Some("bodySHA256=zz")), &t),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn v10_port_handling() {
        // Twilio signed the URL without port; we are configured with a port, and vice versa.
        let with_port = tenant(
            &["12345"],
            "https://mycompany.com:1234/myapp.php?foo=1&bar=2",
        );
        assert!(verify(&request(&[V10_SIG], V10_BODY, None), &with_port).is_ok());
        let sig443 = b64sha1(
            "12345",
            &signing_string(
                "https://mycompany.com:443/myapp.php?foo=1&bar=2",
                &form_urlencoded::parse(V10_BODY.as_bytes()).collect::<Vec<_>>(),
            ),
        );
        assert!(verify(
            &request(&[&sig443], V10_BODY, None),
            &tenant(&["12345"], V10_URL)
        )
        .is_ok());
        assert_eq!(
            url_variants("http://h.example/p"),
            ["http://h.example/p", "http://h.example:80/p"]
        );
        assert_eq!(
            url_variants("https://u:p@h.example:8443?q=1"),
            [
                "https://u:p@h.example:8443?q=1",
                "https://u:p@h.example?q=1"
            ]
        );
        assert_eq!(
            url_variants("https://[::1]/x"),
            ["https://[::1]/x", "https://[::1]:443/x"]
        );
        assert_eq!(url_variants("garbage"), ["garbage"]);
    }

    #[test]
    fn status_callback_key_and_tenant() {
        let body = "AccountSid=AC1&CallSid=CA9&CallStatus=completed&SequenceNumber=3&Timestamp=Thu%2C+06+Jun+2024+10%3A00%3A00+%2B0000";
        let mut t = tenant(&["tok"], "https://hooks.example/twilio/acme");
        let s = Twilio.sign(body.as_bytes(), &t, "", 0).unwrap();
        let sig = s["x-twilio-signature"].to_str().unwrap().to_owned();
        let env = verify(&request(&[&sig], body, None), &t).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "twilio".into(),
                tenant: "acme".into(),
                event_id: "CA9:completed:3".into(),
                event_type: "call.completed".into(),
                object_id: Some("CA9".into()),
                object_version: None,
                occurred_at: Some(1_717_668_000),
                delivery_id: None,
            }
        );
        t.options.insert("account_sid".into(), "AC1".into());
        assert!(verify(&request(&[&sig], body, None), &t).is_ok());
        t.options.insert("account_sid".into(), "AC2".into());
        assert_eq!(
            verify(&request(&[&sig], body, None), &t),
            Err(ProviderError::TenantMismatch("AccountSid"))
        );
        // Message status with SmsSid too: MessageSid wins.
        let body = "AccountSid=AC1&SmsSid=SM5&MessageSid=SM5&SmsStatus=sent&MessageStatus=sent";
        let t = tenant(&["tok"], "https://hooks.example/twilio/acme");
        let sig = Twilio.sign(body.as_bytes(), &t, "", 0).unwrap()["x-twilio-signature"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            verify(&request(&[&sig], body, None), &t).unwrap().event_id,
            "SM5:sent"
        );
    }

    #[test]
    fn tampered_wrong_secret_rotation_missing() {
        let t = tenant(&["12345"], V10_URL);
        assert_eq!(
            verify(
                &request(&[V10_SIG], &V10_BODY.replace("1234&", "1235&"), None),
                &t
            ),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(
                &request(&[V10_SIG], V10_BODY, None),
                &tenant(&["54321"], V10_URL)
            ),
            Err(ProviderError::SignatureMismatch)
        );
        assert!(verify(
            &request(&[V10_SIG], V10_BODY, None),
            &tenant(&["new", "12345"], V10_URL)
        )
        .is_ok());
        assert!(verify(
            &request(&[V10_SIG], V10_BODY, None),
            &tenant(&["12345", "old"], V10_URL)
        )
        .is_ok());
        assert_eq!(
            verify(&request(&[], V10_BODY, None), &t),
            Err(ProviderError::MissingHeader(SIGNATURE_NAME))
        );
        let mut no_url = t.clone();
        no_url.options.clear();
        assert_eq!(
            verify(&request(&[V10_SIG], V10_BODY, None), &no_url),
            Err(ProviderError::NoSecret)
        );
        assert_eq!(
            verify(&request(&[V10_SIG], V10_BODY, None), &tenant(&[], V10_URL)),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn garbled_and_duplicated_headers() {
        let t = tenant(&["12345"], V10_URL);
        for (v, why) in [
            (" ", "empty value"),
            ("!!", "signature is not valid base64"),
        ] {
            assert_eq!(
                verify(&request(&[v], V10_BODY, None), &t),
                Err(ProviderError::MalformedHeader(SIGNATURE_NAME, why))
            );
        }
        assert!(verify(&request(&["AAAA", V10_SIG], V10_BODY, None), &t).is_ok());
        assert!(verify(&request(&[&format!("AAAA,{V10_SIG}")], V10_BODY, None), &t).is_ok());
        let mut r = request(&[], V10_BODY, None);
        r.headers.insert(
            "x-twilio-signature",
            HeaderValue::from_bytes(b"\xff").unwrap(),
        );
        assert!(matches!(
            verify(&r, &t),
            Err(ProviderError::MalformedHeader(SIGNATURE_NAME, _))
        ));
        // Garbled form bodies never panic.
        for body in ["%", "%zz=%", "&&&", "a=\u{e9}"] {
            let sig = Twilio.sign(body.as_bytes(), &t, "", 0).unwrap()["x-twilio-signature"]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(matches!(
                verify(&request(&[&sig], body, None), &t),
                Err(ProviderError::MalformedPayload(_))
            ));
        }
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&["tok"], "https://hooks.example/t");
        let body = "AccountSid=AC1&CallSid=CA1&CallSid=CA2";
        let sig = Twilio.sign(body.as_bytes(), &t, "", 0).unwrap()["x-twilio-signature"]
            .to_str()
            .unwrap()
            .to_owned();
        let err = verify(&request(&[&sig], body, None), &t).unwrap_err();
        assert!(matches!(err, ProviderError::MalformedPayload(_)));
        assert!(!err.is_authentication_failure());
    }

    #[test]
    fn sign_round_trip() {
        let t = tenant(&["new", "old"], "https://hooks.example/t");
        let body = "AccountSid=AC1&MessageSid=SM1&MessageStatus=delivered";
        let h = Twilio.sign(body.as_bytes(), &t, "", 0).unwrap();
        let sig = h["x-twilio-signature"].to_str().unwrap();
        assert_eq!(
            verify(&request(&[sig], body, None), &t).unwrap().event_type,
            "message.delivered"
        );
        assert_eq!(
            verify(
                &request(&[sig], body, None),
                &tenant(&["old"], "https://hooks.example/t")
            ),
            Err(ProviderError::SignatureMismatch)
        );
    }
}
