//! The log redaction rule and the lean JSON log format.
//!
//! Secrets, signatures and payload bodies never reach the logs, whoever logs them
//! (our code, the Lambda runtime at TRACE, which logs the raw event as `body`, or an
//! SDK at DEBUG):
//!
//! 1. **By field name**: a field whose name has a sensitive part ([`is_sensitive_name`]:
//!    `secret`, `signature`, `authorization`, `body`, `payload`, `token`, `password`,
//!    `headers`, `cookie`, `credentials`, `api_key`, ...) is written as `"[redacted]"`,
//!    in events and in span fields alike.
//! 2. **By value**: every configured secret value (signing secrets, path tokens, API
//!    credentials; [`register_config`]) is replaced by `[redacted]` wherever it appears
//!    in a line, the message and error texts included.
//!
//! The format is one flat JSON object per line: `ts`, `level`, the event's fields
//! (`message` first), then the fields of the spans in scope (root first). Our own
//! lines carry no `target` (bytes are billed); lines of other crates do.
//!
//! Every field value is capped at [`MAX_FIELD_BYTES`] (masked first, then cut with a
//! marker): a value a client chose (a 20 kB path segment) cannot make a line huge.

use std::fmt;
use std::sync::RwLock;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::emf::push_json_str;
use crate::config::Config;

/// What a masked value becomes.
pub const REDACTED: &str = "[redacted]";
/// The most bytes of one field value in a line; longer ones are cut with a marker.
pub const MAX_FIELD_BYTES: usize = 512;
/// What follows a cut value.
const CUT_MARKER: &str = "…[truncated]";
/// Shorter secret values are not masked by value (they would mask innocent text);
/// field-name masking still applies.
pub const MIN_SECRET_LEN: usize = 8;

/// Name parts that mark a field as sensitive.
const SENSITIVE_PARTS: &[&str] = &[
    "secret",
    "secrets",
    "signature",
    "signatures",
    "sig",
    "hmac",
    "authorization",
    "auth",
    "body",
    "payload",
    "raw",
    "token",
    "password",
    "passwd",
    "apikey",
    "headers",
    "header",
    "cookie",
    "credential",
    "credentials",
];

/// Two-part names that are sensitive together (`api_key`, `private_key`).
const SENSITIVE_PAIRS: &[(&str, &str)] = &[("api", "key"), ("private", "key"), ("signing", "key")];

/// True when a field (or tenant option) name denotes a secret, a signature or a body.
/// Case-insensitive; names are split on `_`, `-`, `.` and camelCase.
pub fn is_sensitive_name(name: &str) -> bool {
    let parts = name_parts(name);
    parts.iter().any(|p| SENSITIVE_PARTS.contains(&p.as_str()))
        || parts
            .windows(2)
            .any(|w| SENSITIVE_PAIRS.contains(&(w[0].as_str(), w[1].as_str())))
}

/// A name in lower-case parts, split on `_`, `-`, `.`, spaces and camelCase.
fn name_parts(name: &str) -> Vec<String> {
    let mut parts: Vec<String> = Vec::with_capacity(4);
    let mut current = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if c == '_' || c == '-' || c == '.' || c == ' ' {
            if !current.is_empty() {
                parts.push(std::mem::take(&mut current));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !current.is_empty() {
            parts.push(std::mem::take(&mut current));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

/// Name parts of tenant options that hold credentials (their values are masked).
const CREDENTIAL_PARTS: &[&str] = &[
    "secret",
    "secrets",
    "token",
    "password",
    "passwd",
    "apikey",
    "credential",
    "credentials",
];

/// True when a tenant option holds a credential (`path_token`, `api_key`,
/// `access_token`, `api_password`), not a header name or a flag (`header`,
/// `require_signature`).
pub fn is_credential_option(name: &str) -> bool {
    let parts = name_parts(name);
    parts.iter().any(|p| CREDENTIAL_PARTS.contains(&p.as_str()))
        || parts
            .windows(2)
            .any(|w| SENSITIVE_PAIRS.contains(&(w[0].as_str(), w[1].as_str())))
}

/// The registered secret values and a bitmap of their first two bytes, so a line is
/// scanned once (one bitmap probe per byte) whatever the number of secrets.
struct Secrets {
    /// Longest first, so a secret containing another is masked whole.
    values: Vec<String>,
    /// Bit `b0 * 256 + b1` is set when some secret starts with bytes `b0 b1`.
    pairs: Vec<u64>,
}

impl Secrets {
    const fn new() -> Self {
        Secrets {
            values: Vec::new(),
            pairs: Vec::new(),
        }
    }

    fn insert(&mut self, value: String) {
        if self.values.contains(&value) {
            return;
        }
        if self.pairs.is_empty() {
            self.pairs = vec![0; 65_536 / 64];
        }
        let bytes = value.as_bytes();
        let bit = usize::from(bytes[0]) << 8 | usize::from(bytes[1]);
        self.pairs[bit / 64] |= 1 << (bit % 64);
        self.values.push(value);
        self.values.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    /// Byte ranges of the secrets in `line`, in order, not overlapping.
    fn find(&self, line: &[u8]) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        if self.values.is_empty() {
            return found;
        }
        let mut i = 0;
        while i + 1 < line.len() {
            let bit = usize::from(line[i]) << 8 | usize::from(line[i + 1]);
            if self.pairs[bit / 64] & (1 << (bit % 64)) != 0 {
                if let Some(s) = self
                    .values
                    .iter()
                    .find(|s| line[i..].starts_with(s.as_bytes()))
                {
                    found.push((i, i + s.len()));
                    i += s.len();
                    continue;
                }
            }
            i += 1;
        }
        found
    }
}

static SECRETS: RwLock<Secrets> = RwLock::new(Secrets::new());

/// Mask `value` in every log line from now on (and its JSON-escaped form). Values
/// shorter than [`MIN_SECRET_LEN`] are ignored.
pub fn register_secret(value: &str) {
    if value.len() < MIN_SECRET_LEN {
        return;
    }
    let mut escaped = String::with_capacity(value.len() + 2);
    push_json_str(&mut escaped, value);
    let escaped = escaped[1..escaped.len() - 1].to_string();
    let mut secrets = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    secrets.insert(value.to_string());
    secrets.insert(escaped);
}

/// Register every secret of a configuration: each tenant's signing secrets, and the
/// values of credential options ([`is_credential_option`]; an `env:VAR` value is
/// resolved from the environment).
pub fn register_config(config: &Config) {
    for tenant in config.tenants() {
        for secret in &tenant.secrets {
            register_secret(secret.expose());
        }
        for (name, value) in &tenant.options {
            if !is_credential_option(name) {
                continue;
            }
            match value.strip_prefix("env:") {
                Some(var) => {
                    if let Ok(resolved) = std::env::var(var) {
                        register_secret(&resolved);
                    }
                }
                None => register_secret(value),
            }
        }
    }
}

/// Replace every registered secret in `line`.
pub fn mask_secrets(line: &mut String) {
    let found = SECRETS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .find(line.as_bytes());
    if found.is_empty() {
        return;
    }
    let mut masked = String::with_capacity(line.len());
    let mut at = 0;
    for (start, end) in found {
        // Secrets are whole strings, so their ranges fall on char boundaries.
        masked.push_str(line.get(at..start).unwrap_or_default());
        masked.push_str(REDACTED);
        at = end;
    }
    masked.push_str(line.get(at..).unwrap_or_default());
    *line = masked;
}

/// `value` cut to [`MAX_FIELD_BYTES`] (on a char boundary) with a marker. A long value
/// is masked before the cut, so a cut never leaves the prefix of a secret behind; a
/// short one is masked with the whole line.
pub fn clip(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() <= MAX_FIELD_BYTES {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut owned = value.to_string();
    mask_secrets(&mut owned);
    if owned.len() > MAX_FIELD_BYTES {
        let mut end = MAX_FIELD_BYTES;
        while !owned.is_char_boundary(end) {
            end -= 1;
        }
        owned.truncate(end);
        owned.push_str(CUT_MARKER);
    }
    std::borrow::Cow::Owned(owned)
}

/// Span fields left out of every line: the Lambda runtime's invocation span carries
/// the whole X-Ray header (~90 bytes); our ingest and processing lines carry its
/// `trace_id` (the root) where it matters, and log bytes are billed.
const DROPPED_SPAN_FIELDS: &[&str] = &["xrayTraceId"];

/// Writes fields as `"name":value` pairs separated by commas, masking sensitive names.
struct JsonFieldsVisitor<'a> {
    out: &'a mut String,
    first: bool,
    span: bool,
}

impl JsonFieldsVisitor<'_> {
    fn key(&mut self, field: &Field) -> bool {
        let name = field.name();
        if name.starts_with("log.") || (self.span && DROPPED_SPAN_FIELDS.contains(&name)) {
            return false;
        }
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        push_json_str(self.out, name);
        self.out.push(':');
        if name != "message" && is_sensitive_name(name) {
            push_json_str(self.out, REDACTED);
            return false;
        }
        true
    }
}

impl Visit for JsonFieldsVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.key(field) {
            push_json_str(self.out, &clip(value));
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.key(field) {
            self.out.push_str(&value.to_string());
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.key(field) {
            self.out.push_str(&value.to_string());
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.key(field) {
            self.out.push_str(if value { "true" } else { "false" });
        }
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.key(field) {
            if value.is_finite() {
                self.out.push_str(&value.to_string());
            } else {
                push_json_str(self.out, &value.to_string());
            }
        }
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.key(field) {
            push_json_str(self.out, &clip(&value.to_string()));
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.key(field) {
            push_json_str(self.out, &clip(&format!("{value:?}")));
        }
    }
}

/// Span fields in the same flat, masked form (stored per span by the fmt layer).
#[derive(Debug, Default, Clone, Copy)]
pub struct RedactingFields;

impl<'writer> FormatFields<'writer> for RedactingFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut out = String::new();
        fields.record(&mut JsonFieldsVisitor {
            out: &mut out,
            first: true,
            span: true,
        });
        writer.write_str(&out)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut out = String::new();
        fields.record(&mut JsonFieldsVisitor {
            out: &mut out,
            first: current.fields.is_empty(),
            span: true,
        });
        current.fields.push_str(&out);
        Ok(())
    }
}

/// One flat JSON object per event, secrets masked (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct RedactingJson;

impl<S, N> FormatEvent<S, N> for RedactingJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = String::with_capacity(320);
        line.push_str("{\"ts\":\"");
        SystemTime.format_time(&mut Writer::new(&mut line))?;
        line.push_str("\",\"level\":\"");
        line.push_str(event.metadata().level().as_str());
        line.push('"');
        let target = event.metadata().target();
        if !target.starts_with("einmal") {
            line.push_str(",\"target\":");
            push_json_str(&mut line, target);
        }
        line.push(',');
        event.record(&mut JsonFieldsVisitor {
            out: &mut line,
            first: true,
            span: false,
        });
        if line.ends_with(',') {
            line.pop();
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>() {
                    if !fields.fields.is_empty() {
                        line.push(',');
                        line.push_str(&fields.fields);
                    }
                }
            }
        }
        line.push('}');
        mask_secrets(&mut line);
        line.push('\n');
        writer.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn long_values_are_masked_then_cut() {
        assert_eq!(clip("short"), "short");
        let secret = "clip-secret-value-0123456789";
        register_secret(secret);
        // The secret straddles the cut: masked first, so no prefix of it is left.
        let value = format!(
            "{}{secret}{}",
            "a".repeat(MAX_FIELD_BYTES - 5),
            "b".repeat(100)
        );
        let cut = clip(&value);
        assert!(
            cut.len() <= MAX_FIELD_BYTES + CUT_MARKER.len(),
            "{}",
            cut.len()
        );
        assert!(cut.ends_with(CUT_MARKER));
        assert!(!cut.contains("clip-"), "{cut}");
        let wide = "é".repeat(MAX_FIELD_BYTES);
        assert!(clip(&wide).ends_with(CUT_MARKER), "cut on a char boundary");
    }

    #[test]
    fn secrets_are_masked_in_one_pass_longest_first() {
        register_secret("s3cr3t-value-one");
        register_secret("s3cr3t-value-one-and-more");
        register_secret("other\"quoted-secret");
        let mut line =
            "a s3cr3t-value-one-and-more b s3cr3t-value-one c other\\\"quoted-secret d s3cr3t"
                .to_string();
        mask_secrets(&mut line);
        assert_eq!(line, "a [redacted] b [redacted] c [redacted] d s3cr3t");
        let mut clean = "nothing here: é ü".to_string();
        mask_secrets(&mut clean);
        assert_eq!(clean, "nothing here: é ü");
    }

    #[test]
    fn sensitive_names() {
        for name in [
            "secret",
            "webhook_secret",
            "signature",
            "Stripe-Signature",
            "x_hub_signature_256",
            "authorization",
            "body",
            "raw_body",
            "payload",
            "path_token",
            "access_token",
            "api_key",
            "apiKey",
            "api_password",
            "headers",
            "privateKey",
        ] {
            assert!(is_sensitive_name(name), "{name}");
        }
        for name in [
            "provider",
            "tenant",
            "event_id",
            "delivery_id",
            "object_id",
            "trace_id",
            "state",
            "pk",
            "message",
            "api_base",
            "api_username",
            "shop_domain",
            "requestId",
            "xrayTraceId",
        ] {
            assert!(!is_sensitive_name(name), "{name}");
        }
        for name in [
            "path_token",
            "api_key",
            "access_token",
            "api_password",
            "secret",
        ] {
            assert!(is_credential_option(name), "{name}");
        }
        for name in [
            "header",
            "timestamp_header",
            "require_signature",
            "signed_content",
            "api_username",
            "shop_domain",
            "shared_app",
        ] {
            assert!(!is_credential_option(name), "{name}");
        }
    }

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn lines_are_flat_json_with_names_and_values_masked() {
        register_secret("whsec_unit_test_secret_value");
        register_secret("short");
        let capture = Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .event_format(RedactingJson)
            .fmt_fields(RedactingFields)
            .with_writer(capture.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "invoke",
                requestId = "req-1",
                xrayTraceId = "Root=1-abc;Parent=def;Sampled=1",
                token = "tok-xyz"
            );
            let _g = span.enter();
            tracing::info!(
                provider = "stripe",
                event_id = "evt_1",
                attempts = 3u64,
                ok = true,
                signature = "t=1,v1=abcdef",
                "accepted with whsec_unit_test_secret_value inside"
            );
            tracing::trace!(body = "{\"card\":\"4242\"}", "raw JSON event received");
            tracing::warn!(error = %"quote \" and short", "x");
        });
        let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        let first = &lines[0];
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["provider"], "stripe");
        assert_eq!(first["event_id"], "evt_1");
        assert_eq!(first["attempts"], 3);
        assert_eq!(first["ok"], true);
        assert_eq!(first["signature"], REDACTED);
        assert_eq!(first["requestId"], "req-1");
        assert_eq!(first["token"], REDACTED);
        assert_eq!(first["message"], "accepted with [redacted] inside");
        assert!(first.get("target").is_none());
        assert!(first.get("xrayTraceId").is_none(), "dropped: {first}");
        assert_eq!(lines[1]["body"], REDACTED);
        assert_eq!(lines[2]["error"], "quote \" and short");
        for bad in ["whsec_unit_test", "abcdef", "4242", "tok-xyz"] {
            assert!(!text.contains(bad), "{bad} leaked: {text}");
        }
    }
}
