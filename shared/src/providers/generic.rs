//! Generic HMAC (`/webhooks/generic/{tenant}`): for senders that sign the raw body
//! with an HMAC in one header but have no module of their own. Everything about the
//! scheme is configured per tenant in `options`:
//!
//! | option | values | meaning |
//! |---|---|---|
//! | `header` | header name, **required** | the header holding the signature(s) |
//! | `algorithm` | `sha256` (default), `sha1` | HMAC hash |
//! | `encoding` | `hex` (default, either case), `base64` (standard, padding optional) | signature encoding |
//! | `prefix` | e.g. `sha256=` (optional, non-empty, no `,`) | stripped before decoding; when set, every signature must carry it (ASCII case-insensitive) |
//! | `signed_content` | `body` (default), `timestamp.body`, `timestamp:body` | what is signed: the raw body, or the timestamp header's exact text, `.`/`:`, the raw body |
//! | `timestamp_header` | header name | required with a `timestamp…` mode, refused with `body`; Unix seconds, checked against `tolerance_secs` in **both** directions |
//! | `event_id_header` | header name | dedup id from this header, **or** … |
//! | `event_id_pointer` | JSON pointer (RFC 6901), e.g. `/id`, `/data/event/id` | … from the body (string or integer); exactly one of the two is required |
//! | `event_type_header` / `event_type_pointer` | header name / JSON pointer | optional (at most one); absent → type `unknown` |
//! | `object_id_pointer` | JSON pointer | optional object id (string or integer) |
//!
//! Secrets are the tenant's secrets as UTF-8 bytes. Rotation: every configured secret
//! is tried against every signature; the header may be repeated and each value may
//! hold several comma-separated signatures.
//!
//! **Configuration errors** (a missing `header`, an unknown `algorithm`, `encoding` or
//! `signed_content`, a bad header name or pointer, both or neither of the event id
//! options, a `timestamp_header` that does not fit the mode, two options naming the
//! same header) make the tenant unverifiable: they are reported as
//! [`ProviderError::NoSecret`] (401, like a tenant without a secret), and the reason
//! is logged with `tracing::warn!` (option names only, never values of secrets).
//! [`validate`] returns the reason; loading a configuration runs it, so such a tenant
//! is refused at start. Besides the scheme's options only `event` is declared (which
//! `einmal send --topic` sets and [`Provider::sign`] uses as the `event_type_header`
//! value); any other option name is refused when the configuration loads.
//!
//! The body is parsed only when a pointer is configured, and only after the signature
//! holds. Pointers are resolved on a `serde_json::Value` (this provider is not on the
//! benchmark path) built by a strict visitor: a body with a repeated object key
//! anywhere is refused (400) rather than silently taking one of the values.
//!
//! Header names come from the configuration, but the shared header helpers and error
//! types want `'static` names: each distinct configured name is interned once
//! (leaked), so the leak is bounded by the configuration, never by requests.

use std::collections::HashMap;
use std::fmt;
use std::sync::{OnceLock, PoisonError, RwLock};

use base64::Engine as _;
use http::HeaderName;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::sig::{self, Name};
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct GenericHmac;

/// The event type when none is configured or found.
pub const UNKNOWN_TYPE: &str = "unknown";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Sha256,
    Sha1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Hex,
    Base64,
}

/// What the MAC covers: the body alone, or the timestamp text, a separator, the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signed {
    Body,
    Timestamp(&'static [u8]),
}

/// Where a value comes from: a request header or a JSON pointer into the body.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Locator {
    Header(Name),
    Pointer(Pointer),
}

/// A parsed RFC 6901 pointer (reference tokens, unescaped) and its text for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pointer {
    text: String,
    tokens: Vec<String>,
}

/// One tenant's scheme, parsed and validated from its options.
#[derive(Debug)]
struct Scheme<'a> {
    signature: Name,
    algorithm: Algorithm,
    encoding: Encoding,
    prefix: Option<&'a str>,
    signed: Signed,
    timestamp: Option<Name>,
    event_id: Locator,
    event_type: Option<Locator>,
    object_id: Option<Pointer>,
}

/// Why a tenant's options do not describe a usable scheme (never contains secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem(String);

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn problem(msg: impl Into<String>) -> ConfigProblem {
    ConfigProblem(msg.into())
}

/// Check a tenant's options (and that it has a secret) without a request.
fn validate(tenant: &TenantConfig) -> Result<(), ConfigProblem> {
    if tenant.secrets.is_empty() {
        return Err(problem("no secret is configured"));
    }
    Scheme::parse(tenant).map(|_| ())
}

/// A configured header name, interned so it can be used as a `'static` [`Name`].
fn header_name(option: &str, value: &str) -> Result<Name, ConfigProblem> {
    static NAMES: OnceLock<RwLock<HashMap<String, Name>>> = OnceLock::new();
    let names = NAMES.get_or_init(Default::default);
    let lower = value.to_ascii_lowercase();
    if let Some(name) = names
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&lower)
    {
        return Ok(name);
    }
    let parsed = HeaderName::from_bytes(lower.as_bytes())
        .map_err(|_| problem(format!("option `{option}` is not a valid header name")))?;
    let mut names = names.write().unwrap_or_else(PoisonError::into_inner);
    Ok(names
        .entry(lower)
        .or_insert_with(|| Box::leak(Box::new(parsed))))
}

/// Parse an RFC 6901 JSON pointer. The empty pointer (the whole document) is refused:
/// no option here can use it.
fn parse_pointer(option: &str, text: &str) -> Result<Pointer, ConfigProblem> {
    let bad = |why: &str| problem(format!("option `{option}` is not a JSON pointer: {why}"));
    let rest = text
        .strip_prefix('/')
        .ok_or_else(|| bad("it must start with `/`"))?;
    let mut tokens = Vec::new();
    for raw in rest.split('/') {
        let mut token = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c != '~' {
                token.push(c);
                continue;
            }
            match chars.next() {
                Some('0') => token.push('~'),
                Some('1') => token.push('/'),
                _ => return Err(bad("`~` must be followed by `0` or `1`")),
            }
        }
        tokens.push(token);
    }
    Ok(Pointer {
        text: text.to_owned(),
        tokens,
    })
}

impl Pointer {
    /// Resolve on a parsed document. Array tokens are decimal indexes without leading
    /// zeros (RFC 6901 §4); `-` (past the end) and anything else resolve to nothing.
    fn resolve<'v>(&self, doc: &'v Value) -> Option<&'v Value> {
        let mut at = doc;
        for token in &self.tokens {
            at = match at {
                Value::Object(map) => map.get(token)?,
                Value::Array(items) => {
                    let canonical = token == "0"
                        || (!token.starts_with('0') && token.bytes().all(|b| b.is_ascii_digit()));
                    if token.is_empty() || !canonical {
                        return None;
                    }
                    items.get(token.parse::<usize>().ok()?)?
                }
                _ => return None,
            };
        }
        Some(at)
    }
}

/// A string, or an integer as written; other types are not ids.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

impl<'a> Scheme<'a> {
    fn parse(tenant: &'a TenantConfig) -> Result<Self, ConfigProblem> {
        let opt = |name: &str| tenant.option(name);
        let header = |name: &str| -> Result<Option<Name>, ConfigProblem> {
            opt(name).map(|v| header_name(name, v)).transpose()
        };
        let pointer = |name: &str| -> Result<Option<Pointer>, ConfigProblem> {
            opt(name).map(|v| parse_pointer(name, v)).transpose()
        };
        let signature = header("header")?.ok_or_else(|| problem("option `header` is required"))?;
        let algorithm = match opt("algorithm") {
            None | Some("sha256") => Algorithm::Sha256,
            Some("sha1") => Algorithm::Sha1,
            Some(_) => return Err(problem("option `algorithm` must be `sha256` or `sha1`")),
        };
        let encoding = match opt("encoding") {
            None | Some("hex") => Encoding::Hex,
            Some("base64") => Encoding::Base64,
            Some(_) => return Err(problem("option `encoding` must be `hex` or `base64`")),
        };
        let prefix = match opt("prefix") {
            None => None,
            Some(p)
                if p.is_empty() || p.contains(',') || !p.bytes().all(|b| b.is_ascii_graphic()) =>
            {
                return Err(problem(
                    "option `prefix` must be non-empty visible ASCII without `,`",
                ))
            }
            Some(p) => Some(p),
        };
        let signed =
            match opt("signed_content") {
                None | Some("body") => Signed::Body,
                Some("timestamp.body") => Signed::Timestamp(b"."),
                Some("timestamp:body") => Signed::Timestamp(b":"),
                Some(_) => return Err(problem(
                    "option `signed_content` must be `body`, `timestamp.body` or `timestamp:body`",
                )),
            };
        let timestamp = header("timestamp_header")?;
        match (signed, timestamp) {
            (Signed::Timestamp(_), None) => {
                return Err(problem(
                    "option `timestamp_header` is required when `signed_content` signs a timestamp",
                ))
            }
            (Signed::Body, Some(_)) => {
                return Err(problem(
                    "option `timestamp_header` needs `signed_content = \"timestamp.body\"` or `\"timestamp:body\"`",
                ))
            }
            _ => {}
        }
        let event_id =
            match (header("event_id_header")?, pointer("event_id_pointer")?) {
                (Some(h), None) => Locator::Header(h),
                (None, Some(p)) => Locator::Pointer(p),
                _ => return Err(problem(
                    "exactly one of options `event_id_header` and `event_id_pointer` is required",
                )),
            };
        let event_type = match (header("event_type_header")?, pointer("event_type_pointer")?) {
            (Some(h), None) => Some(Locator::Header(h)),
            (None, Some(p)) => Some(Locator::Pointer(p)),
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(problem(
                    "options `event_type_header` and `event_type_pointer` exclude each other",
                ))
            }
        };
        let object_id = pointer("object_id_pointer")?;
        let mut headers = vec![signature];
        headers.extend(timestamp);
        for locator in [Some(&event_id), event_type.as_ref()].into_iter().flatten() {
            if let Locator::Header(h) = locator {
                headers.push(h);
            }
        }
        for (i, h) in headers.iter().enumerate() {
            if headers[..i].contains(h) {
                return Err(problem("two options name the same header"));
            }
        }
        Ok(Scheme {
            signature,
            algorithm,
            encoding,
            prefix,
            signed,
            timestamp,
            event_id,
            event_type,
            object_id,
        })
    }

    /// A usable scheme, or `NoSecret` (logged with the reason).
    fn for_tenant(tenant: &'a TenantConfig) -> Result<Self, ProviderError> {
        Scheme::parse(tenant).map_err(|reason| {
            tracing::warn!(
                provider = "generic",
                tenant = %tenant.tenant,
                %reason,
                "generic HMAC tenant is misconfigured"
            );
            ProviderError::NoSecret
        })
    }

    fn mac(&self, key: &[u8], timestamp: Option<&str>, body: &[u8]) -> Vec<u8> {
        let mut parts: [&[u8]; 3] = [b"", b"", body];
        if let (Signed::Timestamp(sep), Some(ts)) = (self.signed, timestamp) {
            parts = [ts.as_bytes(), sep, body];
        }
        match self.algorithm {
            Algorithm::Sha256 => sig::hmac_sha256(key, &parts).to_vec(),
            Algorithm::Sha1 => sig::hmac_sha1(key, &parts).to_vec(),
        }
    }

    fn encode(&self, mac: &[u8]) -> String {
        let text = match self.encoding {
            Encoding::Hex => hex::encode(mac),
            Encoding::Base64 => sig::B64.encode(mac),
        };
        format!("{}{text}", self.prefix.unwrap_or_default())
    }

    /// Every signature in every value of the signature header, decoded.
    fn candidates(&self, request: &WebhookRequest) -> Result<Vec<Vec<u8>>, ProviderError> {
        let name = self.signature.as_str();
        let mut out = Vec::with_capacity(1);
        for value in sig::header_values(request, self.signature) {
            let value = value?;
            if value.is_empty() {
                return Err(ProviderError::MalformedHeader(name, "empty value"));
            }
            for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let encoded = match self.prefix {
                    None => part,
                    Some(prefix) => match part.split_at_checked(prefix.len()) {
                        Some((p, rest)) if p.eq_ignore_ascii_case(prefix) => rest,
                        _ => {
                            return Err(ProviderError::MalformedHeader(
                                name,
                                "signature lacks the configured prefix",
                            ))
                        }
                    },
                };
                out.push(match self.encoding {
                    Encoding::Hex => sig::decode_hex(name, encoded)?,
                    Encoding::Base64 => sig::decode_base64(name, encoded)?,
                });
            }
        }
        if out.is_empty() {
            return Err(ProviderError::MissingHeader(name));
        }
        Ok(out)
    }

    /// The signed timestamp's exact text, checked against the window (both directions).
    fn timestamp<'r>(
        &self,
        request: &'r WebhookRequest,
        tolerance: u64,
        now_secs: i64,
    ) -> Result<Option<&'r str>, ProviderError> {
        let Some(name) = self.timestamp else {
            return Ok(None);
        };
        let text = sig::single_header(request, name)?
            .ok_or(ProviderError::MissingHeader(name.as_str()))?;
        let ts = sig::parse_unix(name.as_str(), text)?;
        sig::check_timestamp(ts, now_secs, tolerance, false)?;
        Ok(Some(text))
    }

    fn needs_body(&self) -> bool {
        matches!(self.event_id, Locator::Pointer(_))
            || matches!(self.event_type, Some(Locator::Pointer(_)))
            || self.object_id.is_some()
    }

    fn extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
    ) -> Result<Envelope, ProviderError> {
        let doc = if self.needs_body() {
            Some(parse_strict(&request.body)?)
        } else {
            None
        };
        let lookup = |p: &Pointer| doc.as_ref().and_then(|d| p.resolve(d));
        let event_id = match &self.event_id {
            Locator::Header(h) => sig::single_header(request, h)?
                .ok_or_else(|| sig::payload_error(format!("missing {} header", h.as_str())))?
                .to_owned(),
            Locator::Pointer(p) => lookup(p).and_then(scalar_text).ok_or_else(|| {
                sig::payload_error(format!("no string or integer event id at {}", p.text))
            })?,
        };
        sig::check_event_id(&event_id)?;
        let event_type = match &self.event_type {
            Some(Locator::Header(h)) => sig::single_header(request, h)?.map(str::to_owned),
            Some(Locator::Pointer(p)) => lookup(p).and_then(scalar_text),
            None => None,
        }
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| UNKNOWN_TYPE.to_owned());
        let object_id = self
            .object_id
            .as_ref()
            .and_then(lookup)
            .and_then(scalar_text);
        Ok(Envelope {
            provider: "generic".into(),
            tenant: tenant.tenant.clone(),
            event_id,
            event_type,
            object_id,
            object_version: None,
            occurred_at: None,
            delivery_id: None,
        })
    }
}

/// Parse an authenticated body, refusing repeated object keys. Errors never quote the body.
fn parse_strict(body: &[u8]) -> Result<Value, ProviderError> {
    struct Strict(Value);

    impl<'de> Deserialize<'de> for Strict {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(StrictVisitor).map(Strict)
        }
    }

    struct StrictVisitor;

    impl<'de> Visitor<'de> for StrictVisitor {
        type Value = Value;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut items = Vec::new();
            while let Some(Strict(v)) = seq.next_element()? {
                items.push(v);
            }
            Ok(Value::Array(items))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut object = serde_json::Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if object.contains_key(&key) {
                    return Err(de::Error::custom("duplicate key"));
                }
                let Strict(v) = map.next_value()?;
                object.insert(key, v);
            }
            Ok(Value::Object(object))
        }
    }

    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = Strict::deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(Strict(v @ Value::Object(_))) => Ok(v),
        Ok(_) => Err(sig::payload_error("body is not a JSON object")),
        Err(e) if e.to_string().starts_with("duplicate key") => {
            Err(sig::payload_error("body repeats an object key"))
        }
        Err(e) => Err(sig::payload_error(format!(
            "body is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))),
    }
}

impl Provider for GenericHmac {
    fn name(&self) -> &'static str {
        "generic"
    }

    fn options(&self) -> &'static [&'static str] {
        &[
            "header",
            "algorithm",
            "encoding",
            "prefix",
            "signed_content",
            "timestamp_header",
            "event_id_header",
            "event_id_pointer",
            "event_type_header",
            "event_type_pointer",
            "object_id_pointer",
            "event",
        ]
    }

    /// Unknown sender: one day, raised by `retention_days` if needed.
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn validate_tenant(&self, tenant: &TenantConfig) -> Result<(), String> {
        validate(tenant).map_err(|problem| problem.to_string())
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let scheme = Scheme::for_tenant(tenant)?;
        let candidates = scheme.candidates(request)?;
        let timestamp = scheme.timestamp(request, tenant.tolerance_secs, now_secs)?;
        sig::verify_any(secrets, &candidates, |s| {
            Some(scheme.mac(s.expose().as_bytes(), timestamp, &request.body))
        })?;
        let envelope = scheme.extract(request, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let key = sig::secrets(tenant)?[0].expose().as_bytes();
        let scheme = Scheme::for_tenant(tenant)?;
        let mut h = http::HeaderMap::new();
        let ts = now_secs.to_string();
        let timestamp = scheme.timestamp.map(|_| ts.as_str());
        if let Some(name) = scheme.timestamp {
            sig::put(&mut h, name, &ts)?;
        }
        let mac = scheme.mac(key, timestamp, body);
        sig::put(&mut h, scheme.signature, &scheme.encode(&mac))?;
        if let Locator::Header(name) = scheme.event_id {
            sig::put(&mut h, name, event_id)?;
        }
        if let (Some(Locator::Header(name)), Some(kind)) =
            (&scheme.event_type, tenant.option("event"))
        {
            sig::put(&mut h, name, kind)?;
        }
        if matches!(
            body.iter().find(|b| !b.is_ascii_whitespace()),
            Some(b'{' | b'[')
        ) {
            sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};

    const NOW: i64 = 1_700_000_000;
    const BODY: &str = r#"{"id":"evt_1","type":"order.paid","data":{"event":{"id":"inner/1","a~b":7},"object":{"id":42}},"items":[{"id":"i0"},{"id":"i1"}]}"#;

    fn tenant(secrets: &[&str], options: &[(&str, &str)]) -> TenantConfig {
        TenantConfig {
            provider: "generic".into(),
            tenant: "acme".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// GitHub's scheme: `X-Hub-Signature-256: sha256=<hex>`, id in `X-GitHub-Delivery`.
    fn github(secrets: &[&str]) -> TenantConfig {
        tenant(
            secrets,
            &[
                ("header", "X-Hub-Signature-256"),
                ("prefix", "sha256="),
                ("event_id_header", "X-GitHub-Delivery"),
                ("event_type_header", "X-GitHub-Event"),
            ],
        )
    }

    /// Shopify's scheme: `X-Shopify-Hmac-Sha256: <base64>`, id in `X-Shopify-Event-Id`.
    fn shopify(secrets: &[&str]) -> TenantConfig {
        tenant(
            secrets,
            &[
                ("header", "X-Shopify-Hmac-Sha256"),
                ("encoding", "base64"),
                ("event_id_header", "X-Shopify-Event-Id"),
                ("event_type_header", "X-Shopify-Topic"),
            ],
        )
    }

    /// A Standard-Webhooks-like scheme with a signed timestamp and ids from the body.
    fn timed(secrets: &[&str], mode: &str) -> TenantConfig {
        tenant(
            secrets,
            &[
                ("header", "x-sig"),
                ("signed_content", mode),
                ("timestamp_header", "x-ts"),
                ("event_id_pointer", "/id"),
                ("event_type_pointer", "/type"),
                ("object_id_pointer", "/data/object/id"),
            ],
        )
    }

    fn hex256(secret: &str, parts: &[&[u8]]) -> String {
        hex::encode(sig::hmac_sha256(secret.as_bytes(), parts))
    }

    fn req(pairs: &[(&str, &str)], body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v.as_bytes()).unwrap(),
            );
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        verify_at(r, t, NOW)
    }

    fn verify_at(
        r: &WebhookRequest,
        t: &TenantConfig,
        now: i64,
    ) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&GenericHmac, r, t, now)
    }

    fn gh_req(sigs: &[&str], body: &str) -> WebhookRequest {
        let mut pairs: Vec<(&str, &str)> =
            sigs.iter().map(|s| ("x-hub-signature-256", *s)).collect();
        pairs.push(("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"));
        pairs.push(("x-github-event", "issues"));
        req(&pairs, body)
    }

    #[test]
    fn v1_github_compatible_configuration() {
        let want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let t = github(&["It's a Secret to Everybody"]);
        let h = GenericHmac
            .sign(
                b"Hello, World!",
                &t,
                "72d3162e-cc78-11e3-81ab-4c9367dc0958",
                NOW,
            )
            .unwrap();
        assert_eq!(h["x-hub-signature-256"], want);
        assert_eq!(
            h["x-github-delivery"],
            "72d3162e-cc78-11e3-81ab-4c9367dc0958"
        );
        assert!(h.get(http::header::CONTENT_TYPE).is_none());
        // Header ids only: the body is never parsed, so a non-JSON body is fine.
        let env = verify(&gh_req(&[want], "Hello, World!"), &t).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "generic".into(),
                tenant: "acme".into(),
                event_id: "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
                event_type: "issues".into(),
                object_id: None,
                object_version: None,
                occurred_at: None,
                delivery_id: None,
            }
        );
        // The prefix is matched case-insensitively; hex in either case.
        let upper = format!("sha256={}", want[7..].to_uppercase());
        assert!(verify(&gh_req(&[&upper], "Hello, World!"), &t).is_ok());
        assert!(verify(
            &gh_req(&[&want.replace("sha256=", "SHA256=")], "Hello, World!"),
            &t
        )
        .is_ok());
        assert_eq!(
            verify(&gh_req(&[want], "Hello, World?"), &t),
            Err(ProviderError::SignatureMismatch)
        );
        // V2 (Octokit) through the same configuration.
        let v2 = "sha256=4864d2759938a15468b5df9ade20bf161da9b4f737ea61794142f3484236bda3";
        assert!(verify(&gh_req(&[v2], r#"{"foo":"bar"}"#), &github(&["mysecret"])).is_ok());
    }

    #[test]
    fn v11_shopify_compatible_base64_configuration() {
        let want = "UFwgrGBPZilFtmKh8TqcovA78LGYb1BdWu9I4Q2oyRg=";
        let mut t = shopify(&["hush"]);
        t.options.insert("event".into(), "orders/create".into());
        let h = GenericHmac.sign(b"{}", &t, "ev-1", NOW).unwrap();
        assert_eq!(h["x-shopify-hmac-sha256"], want);
        assert_eq!(h["x-shopify-event-id"], "ev-1");
        assert_eq!(h["x-shopify-topic"], "orders/create");
        assert_eq!(h[http::header::CONTENT_TYPE], "application/json");
        let env = verify(&WebhookRequest::post(h, "{}"), &t).unwrap();
        assert_eq!(
            (env.event_id.as_str(), env.event_type.as_str()),
            ("ev-1", "orders/create")
        );
        // Unpadded base64 is the same signature; garbled base64 is malformed.
        let r = req(
            &[
                ("x-shopify-hmac-sha256", want.trim_end_matches('=')),
                ("x-shopify-event-id", "ev-1"),
            ],
            "{}",
        );
        let env = verify(&r, &t).unwrap();
        assert_eq!(env.event_type, UNKNOWN_TYPE);
        let r = req(
            &[
                ("x-shopify-hmac-sha256", "not base64!"),
                ("x-shopify-event-id", "ev-1"),
            ],
            "{}",
        );
        assert_eq!(
            verify(&r, &t),
            Err(ProviderError::MalformedHeader(
                "x-shopify-hmac-sha256",
                "signature is not valid base64"
            ))
        );
        // sha1 + base64 (a Twilio-like digest over the body alone).
        t.options.insert("algorithm".into(), "sha1".into());
        let h = GenericHmac.sign(b"{}", &t, "ev-2", NOW).unwrap();
        assert_eq!(
            h["x-shopify-hmac-sha256"],
            sig::B64.encode(sig::hmac_sha1(b"hush", &[b"{}"])).as_str()
        );
        assert!(verify(&WebhookRequest::post(h, "{}"), &t).is_ok());
    }

    #[test]
    fn timestamp_modes_and_window() {
        for (mode, sep) in [("timestamp.body", "."), ("timestamp:body", ":")] {
            let t = timed(&["s"], mode);
            let ts = NOW.to_string();
            let good = hex256("s", &[ts.as_bytes(), sep.as_bytes(), BODY.as_bytes()]);
            let env = verify(&req(&[("x-sig", &good), ("x-ts", &ts)], BODY), &t).unwrap();
            assert_eq!(env.event_id, "evt_1");
            assert_eq!(env.event_type, "order.paid");
            assert_eq!(env.object_id.as_deref(), Some("42"));
            // sign() reproduces it.
            let h = GenericHmac
                .sign(BODY.as_bytes(), &t, "ignored", NOW)
                .unwrap();
            assert_eq!(h["x-sig"], good.as_str());
            assert_eq!(h["x-ts"], ts.as_str());
            // The timestamp is signed: moving it breaks the signature.
            let moved = (NOW + 1).to_string();
            assert_eq!(
                verify(&req(&[("x-sig", &good), ("x-ts", &moved)], BODY), &t),
                Err(ProviderError::SignatureMismatch)
            );
            // Window: ±tolerance inclusive, both directions.
            for (at, ok) in [
                (NOW - 300, true),
                (NOW + 300, true),
                (NOW - 301, false),
                (NOW + 301, false),
            ] {
                let h = GenericHmac.sign(BODY.as_bytes(), &t, "", at).unwrap();
                let got = verify_at(&WebhookRequest::post(h, BODY), &t, NOW);
                if ok {
                    assert!(got.is_ok(), "{mode} {at}");
                } else {
                    assert_eq!(
                        got,
                        Err(ProviderError::TimestampOutOfTolerance),
                        "{mode} {at}"
                    );
                }
            }
            // Missing or garbled timestamp.
            assert_eq!(
                verify(&req(&[("x-sig", &good)], BODY), &t),
                Err(ProviderError::MissingHeader("x-ts"))
            );
            for bad in ["soon", "-1", "1.5"] {
                assert_eq!(
                    verify(&req(&[("x-sig", &good), ("x-ts", bad)], BODY), &t),
                    Err(ProviderError::MalformedHeader(
                        "x-ts",
                        "timestamp is not a Unix time in seconds"
                    )),
                    "{bad}"
                );
            }
        }
        // A body-mode signature does not verify in timestamp mode and vice versa.
        let t = timed(&["s"], "timestamp.body");
        let body_only = hex256("s", &[BODY.as_bytes()]);
        let ts = NOW.to_string();
        assert_eq!(
            verify(&req(&[("x-sig", &body_only), ("x-ts", &ts)], BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn pointer_and_header_event_ids() {
        let base = [("header", "x-sig")];
        let sig_for = |body: &str| hex256("s", &[body.as_bytes()]);
        let with = |extra: &[(&str, &str)]| {
            let mut o = base.to_vec();
            o.extend_from_slice(extra);
            tenant(&["s"], &o)
        };
        let cases: [(&str, Option<&str>); 8] = [
            ("/id", Some("evt_1")),
            ("/data/event/id", Some("inner/1")),
            ("/data/event/a~0b", Some("7")),
            ("/data/object/id", Some("42")),
            ("/items/1/id", Some("i1")),
            ("/items/01/id", None),
            ("/items/-/id", None),
            ("/data", None),
        ];
        for (pointer, want) in cases {
            let t = with(&[("event_id_pointer", pointer)]);
            let got = verify(&req(&[("x-sig", &sig_for(BODY))], BODY), &t);
            match want {
                Some(id) => assert_eq!(got.unwrap().event_id, id, "{pointer}"),
                None => assert_eq!(
                    got,
                    Err(sig::payload_error(format!(
                        "no string or integer event id at {pointer}"
                    ))),
                    "{pointer}"
                ),
            }
        }
        // `~1` addresses a key holding `/`.
        let body = r#"{"a/b":{"id":"slash"}}"#;
        let t = with(&[("event_id_pointer", "/a~1b/id")]);
        assert_eq!(
            verify(&req(&[("x-sig", &sig_for(body))], body), &t)
                .unwrap()
                .event_id,
            "slash"
        );
        // Header id; type and object from the body.
        let t = with(&[
            ("event_id_header", "x-event-id"),
            ("event_type_pointer", "/type"),
            ("object_id_pointer", "/data/event/id"),
        ]);
        let r = req(&[("x-sig", &sig_for(BODY)), ("x-event-id", "hdr-1")], BODY);
        let env = verify(&r, &t).unwrap();
        assert_eq!(
            (
                env.event_id.as_str(),
                env.event_type.as_str(),
                env.object_id.as_deref()
            ),
            ("hdr-1", "order.paid", Some("inner/1"))
        );
        // Authentic but without an id: 400-class errors.
        let r = req(&[("x-sig", &sig_for(BODY))], BODY);
        let err = verify(&r, &t).unwrap_err();
        assert_eq!(err, sig::payload_error("missing x-event-id header"));
        assert!(!err.is_authentication_failure());
        let long = "x".repeat(300);
        let r = req(&[("x-sig", &sig_for(BODY)), ("x-event-id", &long)], BODY);
        assert_eq!(
            verify(&r, &t),
            Err(sig::payload_error("event id is longer than 256 bytes"))
        );
        // Pointers need a JSON object body, without repeated keys; errors quote nothing.
        let t = with(&[("event_id_pointer", "/id")]);
        for (body, why) in [
            (
                "not json secretvalue",
                "body is not valid JSON (line 1, column 2)",
            ),
            (r#"["a"]"#, "body is not a JSON object"),
            (
                r#"{"id":"a"} x"#,
                "body is not valid JSON (line 1, column 12)",
            ),
            (
                r#"{"id":"a","d":{"k":1,"k":2}}"#,
                "body repeats an object key",
            ),
            (r#"{"id":"a","id":"b"}"#, "body repeats an object key"),
        ] {
            let got = verify(&req(&[("x-sig", &sig_for(body))], body), &t);
            assert_eq!(got, Err(sig::payload_error(why)), "{body}");
        }
        // Types other than string/integer are not ids; a missing type is "unknown".
        let body = r#"{"id":1.5}"#;
        assert!(verify(&req(&[("x-sig", &sig_for(body))], body), &t).is_err());
        let body = r#"{"id":-3,"type":{"x":1}}"#;
        let t = with(&[("event_id_pointer", "/id"), ("event_type_pointer", "/type")]);
        let env = verify(&req(&[("x-sig", &sig_for(body))], body), &t).unwrap();
        assert_eq!(
            (env.event_id.as_str(), env.event_type.as_str()),
            ("-3", UNKNOWN_TYPE)
        );
    }

    #[test]
    fn tampered_body_wrong_secret_and_rotation() {
        let t = github(&["s"]);
        let s = format!("sha256={}", hex256("s", &[BODY.as_bytes()]));
        assert_eq!(
            verify(&gh_req(&[&s], &BODY.replace("evt_1", "evt_2")), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&gh_req(&[&s], BODY), &github(&["t"])),
            Err(ProviderError::SignatureMismatch)
        );
        let old = format!("sha256={}", hex256("old", &[BODY.as_bytes()]));
        let new = format!("sha256={}", hex256("new", &[BODY.as_bytes()]));
        let both = github(&["new", "old"]);
        assert!(verify(&gh_req(&[&old], BODY), &both).is_ok());
        assert!(verify(&gh_req(&[&new], BODY), &both).is_ok());
        // Several signatures: repeated headers or comma-joined values.
        assert!(verify(&gh_req(&[&old, &new], BODY), &github(&["new"])).is_ok());
        assert!(verify(
            &gh_req(&[&format!("{new}, {old}")], BODY),
            &github(&["old"])
        )
        .is_ok());
        assert_eq!(
            verify(&gh_req(&[&old, &new], BODY), &github(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
        // sign() uses the first secret only.
        let h = GenericHmac.sign(BODY.as_bytes(), &both, "d", NOW).unwrap();
        assert!(verify(&WebhookRequest::post(h.clone(), BODY), &github(&["new"])).is_ok());
        assert_eq!(
            verify(&WebhookRequest::post(h, BODY), &github(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn missing_and_garbled_headers() {
        let t = github(&["s"]);
        const H: &str = "x-hub-signature-256";
        assert_eq!(
            verify(&gh_req(&[], BODY), &t),
            Err(ProviderError::MissingHeader(H))
        );
        let hex = hex256("s", &[BODY.as_bytes()]);
        let cases = [
            ("", "empty value"),
            ("sha256=zz", "signature is not valid hex"),
            ("sha256=abc", "signature is not valid hex"),
            (hex.as_str(), "signature lacks the configured prefix"),
            ("sha2", "signature lacks the configured prefix"),
            ("sha256=é", "value is not visible ASCII"),
        ];
        for (v, why) in cases {
            assert_eq!(
                verify(&gh_req(&[v], BODY), &t),
                Err(ProviderError::MalformedHeader(H, why)),
                "{v}"
            );
        }
        // Right format, wrong length: a mismatch. A lone comma is no signature at all.
        assert_eq!(
            verify(&gh_req(&["sha256=00"], BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&gh_req(&[","], BODY), &t),
            Err(ProviderError::MissingHeader(H))
        );
        // Without a prefix option, a prefixed value is just bad hex.
        let bare = tenant(&["s"], &[("header", "x-sig"), ("event_id_pointer", "/id")]);
        let r = req(&[("x-sig", &format!("sha256={hex}"))], BODY);
        assert_eq!(
            verify(&r, &bare),
            Err(ProviderError::MalformedHeader(
                "x-sig",
                "signature is not valid hex"
            ))
        );
        assert!(verify(&req(&[("x-sig", &hex)], BODY), &bare).is_ok());
        // No secret.
        assert_eq!(
            verify(&gh_req(&[&hex], BODY), &github(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn bad_configuration_is_no_secret() {
        const NONE: &str = "<remove>";
        const ONE_ID: &str =
            "exactly one of options `event_id_header` and `event_id_pointer` is required";
        let ok: &[(&str, &str)] = &[("header", "x-sig"), ("event_id_pointer", "/id")];
        let bad: &[(&[(&str, &str)], &str)] = &[
            (&[("header", NONE)], "option `header` is required"),
            (&[("header", "x sig")], "option `header` is not a valid header name"),
            (&[("event_id_pointer", NONE)], ONE_ID),
            (&[("event_id_header", "x-id")], ONE_ID),
            (&[("algorithm", "sha512")], "option `algorithm` must be `sha256` or `sha1`"),
            (&[("algorithm", "SHA256")], "option `algorithm` must be `sha256` or `sha1`"),
            (&[("encoding", "base32")], "option `encoding` must be `hex` or `base64`"),
            (&[("prefix", "")], "option `prefix` must be non-empty visible ASCII without `,`"),
            (&[("prefix", "a,b")], "option `prefix` must be non-empty visible ASCII without `,`"),
            (
                &[("signed_content", "body.timestamp")],
                "option `signed_content` must be `body`, `timestamp.body` or `timestamp:body`",
            ),
            (
                &[("signed_content", "timestamp.body")],
                "option `timestamp_header` is required when `signed_content` signs a timestamp",
            ),
            (
                &[("timestamp_header", "x-ts")],
                "option `timestamp_header` needs `signed_content = \"timestamp.body\"` or `\"timestamp:body\"`",
            ),
            (&[("event_id_pointer", "id")], "option `event_id_pointer` is not a JSON pointer: it must start with `/`"),
            (&[("event_id_pointer", "")], "option `event_id_pointer` is not a JSON pointer: it must start with `/`"),
            (
                &[("object_id_pointer", "/a~2")],
                "option `object_id_pointer` is not a JSON pointer: `~` must be followed by `0` or `1`",
            ),
            (
                &[("event_type_pointer", "/t"), ("event_type_header", "x-type")],
                "options `event_type_header` and `event_type_pointer` exclude each other",
            ),
            (&[("event_type_header", "X-SIG")], "two options name the same header"),
        ];
        let body = r#"{"id":"e"}"#;
        let r = req(&[("x-sig", &hex256("s", &[body.as_bytes()]))], body);
        assert!(verify(&r, &tenant(&["s"], ok)).is_ok());
        for (options, why) in bad {
            // Each case overrides, extends or removes options of the working one.
            let mut t = tenant(&["s"], ok);
            for (k, v) in options.iter() {
                if *v == NONE {
                    t.options.remove(*k);
                } else {
                    t.options.insert(k.to_string(), v.to_string());
                }
            }
            assert_eq!(validate(&t), Err(problem(*why)), "{options:?}");
            assert_eq!(verify(&r, &t), Err(ProviderError::NoSecret), "{options:?}");
            assert_eq!(
                GenericHmac.sign(body.as_bytes(), &t, "e", NOW),
                Err(ProviderError::NoSecret)
            );
        }
        assert_eq!(
            validate(&tenant(&[], ok)),
            Err(problem("no secret is configured"))
        );
        assert_eq!(validate(&tenant(&["s"], ok)), Ok(()));
    }

    #[test]
    fn header_names_are_interned_once() {
        let a = header_name("header", "X-Custom-Sig").unwrap();
        let b = header_name("header", "x-custom-sig").unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(a.as_str(), "x-custom-sig");
    }
}
