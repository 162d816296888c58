//! Tenant configuration: which providers and tenants exist, their secrets and options.
//!
//! One TOML structure serves both modes. Locally it is a file (`einmal serve --config`);
//! on AWS the functions read the same TOML from an SSM SecureString parameter
//! (`EINMAL_CONFIG_PARAMETER`) or, for tests and small setups, from `EINMAL_CONFIG`.
//! A secret is inline, a reference to an environment variable (`{ env = "VAR" }`), or a
//! reference to an SSM SecureString (`{ ssm = "/einmal/secrets/NAME" }`, which whoever
//! loads the configuration fetches first: the functions and the CLI), so the file itself
//! can be committed without secrets.

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;

use crate::destinations::DestinationConfig;
pub(crate) use crate::problems::line_of;
pub use crate::problems::{is_valid_name, nearest, Problem};
pub(crate) use crate::secret::SecretSpec;

/// A `[[destination]]` table with each key's position (its kind's parser reads it).
pub(crate) type RawDestination = BTreeMap<Spanned<String>, toml::Value>;
pub use crate::secret::{Secret, SecretLookup, SecretRef};

pub const DEFAULT_RETENTION_DAYS: u32 = 30;
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// DynamoDB items are capped at 400 KB; keep headroom for the other attributes.
pub const DEFAULT_MAX_STORED_BODY_BYTES: usize = 350 * 1024;
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// How much of a configuration a process reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigScope {
    /// Tenants, defaults and destinations, all checked.
    Whole,
    /// Tenants and defaults; the destinations are not read (nor their secrets
    /// checked). The receiver acts on nothing else, so a destination's problem never
    /// stops intake, and the receiver links no destination kind.
    TenantsOnly,
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// Only the position, the key and the parser's message without the value: the
    /// offending value may be a secret.
    #[error("{origin}:{line}: invalid config{}: {message}", at_key(key))]
    Parse {
        origin: String,
        line: usize,
        /// The key path of the offending value (`tenant[2].secrets`), when known.
        key: Option<String>,
        message: String,
    },
    /// Every problem found in a configuration that parsed (never a secret value).
    #[error("{}", render_problems(origin, problems))]
    Invalid {
        origin: String,
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// Each problem as `origin:line: message`, for `einmal config check`.
    pub fn lines(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid { origin, problems } => problems
                .iter()
                .map(|p| format!("{origin}:{}: {}", p.line, p.message))
                .collect(),
            other => vec![other.to_string()],
        }
    }
}

pub(crate) fn parse_raw(text: &str, origin: &str) -> Result<RawConfig, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let at = e.span().map(|s| s.start);
        ConfigError::Parse {
            origin: origin.to_string(),
            line: line_of(text, at.unwrap_or(0)),
            key: at.and_then(|at| key_path_at(text, at)),
            message: without_values(e.message()),
        }
    })
}

/// Only the structure of one part of a configuration (TOML syntax, keys and types),
/// for a configuration assembled from parts: its errors name the part and its lines.
pub fn check_structure(text: &str, origin: &str) -> Result<(), ConfigError> {
    parse_raw(text, origin).map(drop)
}

fn at_key(key: &Option<String>) -> String {
    key.as_ref()
        .map(|k| format!(" at `{k}`"))
        .unwrap_or_default()
}

/// serde's messages quote the offending value (`invalid type: string "whsec_…",
/// expected a sequence`), and that value may be a secret: keep its kind, drop the value.
pub(crate) fn without_values(message: &str) -> String {
    let kind_only = |unexpected: &str| {
        unexpected
            .split(['"', '`', '\''])
            .next()
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let (unexpected, expected) = rest.split_once(", expected").unwrap_or((rest, ""));
            let expected = if expected.is_empty() {
                String::new()
            } else {
                format!(", expected{}", drop_quoted(expected))
            };
            return format!("{prefix}{}{expected}", kind_only(unexpected));
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let expected = rest.split_once(", expected").map(|(_, e)| e).unwrap_or("");
        return format!("unknown variant, expected{expected}");
    }
    drop_quoted(message)
}

/// Any double-quoted literal replaced by `"…"`: a parser may quote the input.
fn drop_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('"');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    let rest: Vec<&str> = parts.collect();
    for (i, part) in rest.iter().enumerate() {
        // Odd pieces are inside quotes, unless the last quote is unmatched.
        if i % 2 == 0 && i + 1 < rest.len() {
            out.push_str("\"…\"");
        } else if i % 2 == 0 {
            out.push('"');
            out.push_str(part);
        } else {
            out.push_str(part);
        }
    }
    out
}

/// The dotted key path of the value at byte `offset` (`tenant[1].secrets`,
/// `defaults.tolerance_secs`), from the nearest key and table header above it.
pub(crate) fn key_path_at(text: &str, offset: usize) -> Option<String> {
    let end = offset.min(text.len());
    let before = text.get(..end)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let mut key = None;
    let mut header = None;
    // The value's own line, then the lines above it (a multi-line array).
    let lines: Vec<&str> = text[..line_end].lines().collect();
    for line in lines.iter().rev() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[') {
            let name = name.trim_start_matches('[');
            let name = name.split(']').next().unwrap_or_default().trim();
            header = Some(name.to_string());
            break;
        }
        if key.is_none() {
            if let Some((k, _)) = line.split_once('=') {
                let k = k.trim();
                if !k.is_empty() && !k.starts_with('#') && !k.contains('"') {
                    key = Some(k.to_string());
                }
            }
        }
    }
    let header = header.map(|h| {
        let array = format!("[[{h}]]");
        let index = lines
            .iter()
            .filter(|l| l.trim().starts_with(&array))
            .count();
        if index > 0 {
            format!("{h}[{}]", index - 1)
        } else {
            h
        }
    });
    match (header, key) {
        (Some(h), Some(k)) => Some(format!("{h}.{k}")),
        (None, Some(k)) => Some(k),
        (Some(h), None) => Some(h),
        (None, None) => None,
    }
}

fn render_problems(origin: &str, problems: &[Problem]) -> String {
    let mut out = format!("{origin}: {} configuration problem(s)", problems.len());
    for p in problems {
        out.push_str(&format!("; line {}: {}", p.line, p.message));
    }
    out
}

/// Most SSM secret references one configuration may hold (each is fetched at every
/// reload; GetParameters takes 10 names a call).
pub const MAX_SSM_REFERENCES: usize = 100;

/// The SSM parameter names a configuration's `{ ssm = "…" }` references name, sorted and
/// unique, so a loader can fetch them before [`Config::from_toml_resolved`]. Text that
/// is not TOML has none (its parse reports the error).
pub fn ssm_references(text: &str) -> Vec<String> {
    fn walk(value: &toml::Value, out: &mut std::collections::BTreeSet<String>) {
        match value {
            toml::Value::Table(table) => {
                if let (1, Some(toml::Value::String(name))) = (table.len(), table.get("ssm")) {
                    out.insert(name.clone());
                }
                table.values().for_each(|v| walk(v, out));
            }
            toml::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    if let Ok(value) = text.parse::<toml::Table>() {
        walk(&toml::Value::Table(value), &mut out);
    }
    out.into_iter().collect()
}

/// The process environment, and the SSM values a loader fetched (by name).
pub fn env_and_fetched(
    ssm: &BTreeMap<String, String>,
) -> impl Fn(SecretRef<'_>) -> Option<String> + '_ {
    move |reference| match reference {
        SecretRef::Env(var) => std::env::var(var).ok(),
        SecretRef::Ssm(name) => ssm.get(name).cloned(),
    }
}

/// The process environment, and no SSM values (the loader had none to fetch).
pub(crate) fn env_only(
    env: &dyn Fn(&str) -> Option<String>,
) -> impl Fn(SecretRef<'_>) -> Option<String> + '_ {
    move |reference| match reference {
        SecretRef::Env(var) => env(var),
        SecretRef::Ssm(_) => None,
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDefaults {
    pub(crate) retention_days: Option<u32>,
    pub(crate) max_body_bytes: Option<usize>,
    pub(crate) max_stored_body_bytes: Option<usize>,
    pub(crate) tolerance_secs: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenant {
    pub(crate) provider: Spanned<String>,
    pub(crate) tenant: String,
    #[serde(default)]
    pub(crate) secrets: Vec<SecretSpec>,
    pub(crate) tolerance_secs: Option<u64>,
    /// Keys with their position, so an unknown option is reported at its line.
    #[serde(default)]
    pub(crate) options: BTreeMap<Spanned<String>, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) defaults: RawDefaults,
    #[serde(default, rename = "tenant")]
    pub(crate) tenants: Vec<RawTenant>,
    #[serde(default, rename = "destination")]
    pub(crate) destinations: Vec<RawDestination>,
}

/// Limits and retention that apply to every tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestSettings {
    /// Inbox items expire (DynamoDB TTL / embedded purge) this long after receipt.
    pub retention_days: u32,
    /// Raw bodies larger than this are refused with 413 before verification.
    pub max_body_bytes: usize,
    /// Compressed bodies larger than this do not fit one inbox item: 413.
    pub max_stored_body_bytes: usize,
}

impl Default for IngestSettings {
    fn default() -> Self {
        Self {
            retention_days: DEFAULT_RETENTION_DAYS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_stored_body_bytes: DEFAULT_MAX_STORED_BODY_BYTES,
        }
    }
}

/// One provider/tenant pair: its secrets (several during rotation) and options.
#[derive(Debug, Clone)]
pub struct TenantConfig {
    pub provider: String,
    pub tenant: String,
    /// All currently valid secrets; a signature made with any of them is accepted.
    pub secrets: Vec<Secret>,
    /// Allowed clock difference for providers that sign a timestamp.
    pub tolerance_secs: u64,
    /// Provider-specific options, e.g. `shop_domain` for Shopify.
    pub options: BTreeMap<String, String>,
}

impl TenantConfig {
    pub fn option(&self, name: &str) -> Option<&str> {
        self.options.get(name).map(String::as_str)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Config {
    pub ingest: IngestSettings,
    pub(crate) tenants: BTreeMap<(String, String), TenantConfig>,
    pub(crate) destinations: Vec<DestinationConfig>,
}

impl Config {
    pub fn tenant(&self, provider: &str, tenant: &str) -> Option<&TenantConfig> {
        self.tenants
            .get(&(provider.to_string(), tenant.to_string()))
    }

    pub fn tenants(&self) -> impl Iterator<Item = &TenantConfig> {
        self.tenants.values()
    }

    /// Every configured destination, in configuration order.
    pub fn destinations(&self) -> &[DestinationConfig] {
        &self.destinations
    }

    /// The destinations that may receive events of `provider` for `tenant` (their
    /// event and output filters still apply).
    pub fn destinations_for<'a>(
        &'a self,
        provider: &'a str,
        tenant: &'a str,
    ) -> impl Iterator<Item = &'a DestinationConfig> + 'a {
        self.destinations.iter().filter(move |d| {
            d.tenant == tenant && d.provider.as_deref().is_none_or(|p| p == provider)
        })
    }

    /// Add a destination (`einmal listen`, tests); replaces one of the same tenant and
    /// name.
    pub fn insert_destination(&mut self, destination: DestinationConfig) {
        self.destinations
            .retain(|d| !(d.tenant == destination.tenant && d.name == destination.name));
        self.destinations.push(destination);
    }

    /// Add or replace a tenant (tests and programmatic setups).
    pub fn insert_tenant(&mut self, tenant: TenantConfig) {
        self.tenants
            .insert((tenant.provider.clone(), tenant.tenant.clone()), tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
        [defaults]
        retention_days = 45
        max_body_bytes = 2048

        [[tenant]]
        provider = "stripe"
        tenant = "shop-1"
        secrets = ["whsec_new", { env = "OLD_SECRET" }]

        [[tenant]]
        provider = "shopify"
        tenant = "shop-1"
        secrets = ["hush"]
        tolerance_secs = 60
        options = { shop_domain = "shop-1.myshopify.com" }
    "#;

    /// A value of the wrong type is reported by its key path and kind, never its text.
    #[test]
    fn a_value_of_the_wrong_type_is_named_by_key_without_its_value() {
        let cases = [
            (
                "[[tenant]]\nprovider = \"stripe\"\ntenant = \"a\"\nsecrets = [\"whsec_ok\"]\n\n[[tenant]]\nprovider = \"stripe\"\ntenant = \"b\"\nsecrets = \"whsec_LEAKED\"\n",
                "x.toml:9: invalid config at `tenant[1].secrets`: invalid type: string, expected a sequence",
            ),
            (
                "[defaults]\ntolerance_secs = \"whsec_LEAKED\"\n",
                "x.toml:2: invalid config at `defaults.tolerance_secs`: invalid type: string, expected u64",
            ),
            (
                "[[tenant]]\nprovider = \"stripe\"\ntenant = \"a\"\nsecrets = [\"whsec_ok\"]\noptions = { x = 123456789 }\n",
                "x.toml:5: invalid config at `tenant[0].options`: invalid type: integer, expected a string",
            ),
        ];
        for (text, expected) in cases {
            let err = Config::from_toml_named(text, "x.toml", |_| None).unwrap_err();
            let shown = err.to_string();
            assert_eq!(shown, expected);
            assert!(
                !shown.contains("LEAKED") && !shown.contains("123456789"),
                "{shown}"
            );
        }
    }

    #[test]
    fn serde_messages_lose_their_values() {
        assert_eq!(
            without_values("invalid value: string \"sk_live_1\", expected a port"),
            "invalid value: string, expected a port"
        );
        assert_eq!(
            without_values("unknown variant `sk_live_1`, expected `http` or `sqs`"),
            "unknown variant, expected `http` or `sqs`"
        );
        assert_eq!(
            without_values("unknown field `secretz`, expected one of `secrets`"),
            "unknown field `secretz`, expected one of `secrets`"
        );
        assert_eq!(without_values("bad \"sk_live_1\" here"), "bad \"…\" here");
    }

    #[test]
    fn parses_tenants_defaults_and_env_secrets() {
        let cfg = Config::from_toml_with_env(SAMPLE, |v| {
            (v == "OLD_SECRET").then(|| "whsec_old".to_string())
        })
        .unwrap();
        assert_eq!(cfg.ingest.retention_days, 45);
        assert_eq!(cfg.ingest.max_body_bytes, 2048);
        assert_eq!(
            cfg.ingest.max_stored_body_bytes,
            DEFAULT_MAX_STORED_BODY_BYTES
        );
        let stripe = cfg.tenant("stripe", "shop-1").unwrap();
        let values: Vec<_> = stripe.secrets.iter().map(Secret::expose).collect();
        assert_eq!(values, ["whsec_new", "whsec_old"]);
        assert_eq!(stripe.tolerance_secs, DEFAULT_TOLERANCE_SECS);
        let shopify = cfg.tenant("shopify", "shop-1").unwrap();
        assert_eq!(shopify.tolerance_secs, 60);
        assert_eq!(shopify.option("shop_domain"), Some("shop-1.myshopify.com"));
        assert!(cfg.tenant("stripe", "other").is_none());
    }

    #[test]
    fn missing_env_secret_is_an_error_naming_the_variable() {
        let err = Config::from_toml_with_env(SAMPLE, |_| None).unwrap_err();
        assert!(err.to_string().contains("OLD_SECRET"), "{err}");
    }

    const WITH_SSM: &str = r#"
[[tenant]]
provider = "stripe"
tenant = "demo"
secrets = [{ ssm = "/einmal/secrets/stripe" }, "whsec_inline"]

[[destination]]
name = "db"
tenant = "demo"
kind = "postgres"
events = ["*"]
dsn = { ssm = "/einmal/secrets/db" }
table = "events"
tls = false
"#;

    #[test]
    fn ssm_references_are_listed_once_and_resolved_by_the_lookup() {
        assert_eq!(
            ssm_references(WITH_SSM),
            ["/einmal/secrets/db", "/einmal/secrets/stripe"]
        );
        assert!(ssm_references("not toml [").is_empty());
        let fetched = BTreeMap::from([
            (
                "/einmal/secrets/stripe".to_string(),
                "whsec_fetched".to_string(),
            ),
            (
                "/einmal/secrets/db".to_string(),
                "host=db user=u".to_string(),
            ),
        ]);
        let cfg = Config::from_toml_resolved(WITH_SSM, "c", &env_and_fetched(&fetched)).unwrap();
        let secrets: Vec<&str> = cfg
            .tenant("stripe", "demo")
            .unwrap()
            .secrets
            .iter()
            .map(Secret::expose)
            .collect();
        assert_eq!(secrets, ["whsec_fetched", "whsec_inline"]);
        match &cfg.destinations()[0].kind {
            crate::destinations::DestinationKind::Postgres(p) => {
                assert_eq!(p.dsn.expose(), "host=db user=u")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unresolved_ssm_reference_is_a_problem_at_its_line() {
        let err = Config::from_toml_named(WITH_SSM, "c.toml", |_| None).unwrap_err();
        assert_eq!(
            err.lines(),
            [
                "c.toml:3: tenant stripe/demo: secret refers to SSM parameter /einmal/secrets/stripe, which was not found",
                "c.toml:12: destination demo/db: `dsn` refers to SSM parameter /einmal/secrets/db, which was not found",
            ]
        );
    }

    #[test]
    fn tenants_only_ignores_destinations_and_their_unset_secrets() {
        let fetched = BTreeMap::from([(
            "/einmal/secrets/stripe".to_string(),
            "whsec_fetched".to_string(),
        )]);
        let cfg =
            Config::tenants_from_toml_resolved(WITH_SSM, "c", &env_and_fetched(&fetched)).unwrap();
        assert!(cfg.destinations().is_empty());
        assert!(cfg.tenant("stripe", "demo").is_some());
        // The whole configuration still refuses the unresolved DSN.
        assert!(Config::from_toml_resolved(WITH_SSM, "c", &env_and_fetched(&fetched)).is_err());
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("whsec_topsecret");
        assert!(!format!("{s:?}").contains("topsecret"));
    }

    #[test]
    fn a_misspelt_option_is_rejected_with_its_line_and_the_nearest_name() {
        let text = "[[tenant]]\nprovider = \"shopify\"\ntenant = \"shop-1\"\nsecrets = [\"hush\"]\noptions = { shop_domian = \"shop-1.myshopify.com\" }\n";
        let err = Config::from_toml_named(text, "einmal.toml", |_| None).unwrap_err();
        assert_eq!(
            err.lines(),
            ["einmal.toml:5: tenant shopify/shop-1: unknown option `shop_domian` for provider shopify (did you mean `shop_domain`?)"]
        );
        // Nothing close: no suggestion.
        let text = text.replace("shop_domian", "colour");
        let err = Config::from_toml(&text).unwrap_err();
        assert!(err.to_string().contains("unknown option `colour`"), "{err}");
        assert!(!err.to_string().contains("did you mean"), "{err}");
    }

    #[test]
    fn every_problem_is_reported_at_its_line() {
        let text = r#"
[[tenant]]
provider = "stirpe"
tenant = "a"
secrets = ["x"]

[[tenant]]
provider = "stripe"
tenant = "b"
secrets = []

[[tenant]]
provider = "github"
tenant = "c"

[[tenant]]
provider = "twilio"
tenant = "d"
secrets = ["token", { env = "UNSET_TWILIO" }]
options = { url = "https://x.example/t", acount_sid = "AC1", colour = "red" }

[[tenant]]
provider = "generic"
tenant = "e"
secrets = ["k"]
options = { header = "x sig" }
"#;
        let err = Config::from_toml_named(text, "f.toml", |_| None).unwrap_err();
        assert_eq!(
            err.lines(),
            [
                "f.toml:3: tenant stirpe/a: unknown provider `stirpe` (did you mean `stripe`?)",
                "f.toml:8: tenant stripe/b: no secrets: `secrets` must list at least one",
                "f.toml:13: tenant github/c: no secrets: `secrets` must list at least one",
                "f.toml:17: tenant twilio/d: secret refers to environment variable UNSET_TWILIO, which is not set",
                "f.toml:20: tenant twilio/d: unknown option `acount_sid` for provider twilio (did you mean `account_sid`?)",
                "f.toml:20: tenant twilio/d: unknown option `colour` for provider twilio",
                "f.toml:23: tenant generic/e: option `header` is not a valid header name",
            ]
        );
        // The secret values never appear.
        assert!(!err.to_string().contains("token"), "{err}");
    }

    #[test]
    fn declared_options_and_hint_tenants_without_secrets_load() {
        let text = r#"
[[tenant]]
provider = "gopay"
tenant = "g"
options = { path_token = "p", api_base = "https://gw.sandbox.gopay.com", access_token = "env:X", max_hints_per_minute = "600" }

[[tenant]]
provider = "mollie"
tenant = "m"
options = { path_token = "p", api_key = "env:Y" }

[[tenant]]
provider = "twilio"
tenant = "t"
secrets = ["token"]
options = { url = "https://x.example/t", shared_key_secret = "env:Z" }
"#;
        let cfg = Config::from_toml(text).unwrap();
        assert_eq!(cfg.tenants().count(), 3);
        // Mollie next-gen (no path token) signs: it needs a secret.
        let text = "[[tenant]]\nprovider = \"mollie\"\ntenant = \"m\"\n";
        assert!(Config::from_toml(text).is_err());
    }

    fn shopify_tenants(tenants: &[(&str, &str, Option<&str>)]) -> String {
        tenants
            .iter()
            .map(|(name, secret, shop)| {
                let options = shop
                    .map(|d| format!("options = {{ shop_domain = \"{d}\" }}\n"))
                    .unwrap_or_default();
                format!("[[tenant]]\nprovider = \"shopify\"\ntenant = \"{name}\"\nsecrets = [\"{secret}\"]\n{options}\n")
            })
            .collect()
    }

    #[test]
    fn shopify_tenants_sharing_a_secret_must_each_name_their_shop() {
        let text = shopify_tenants(&[
            ("demo", "app-secret-XYZ", Some("demo.myshopify.com")),
            ("demo2", "app-secret-XYZ", None),
            ("other", "own-secret", None),
        ]);
        let err = Config::from_toml_named(&text, "s.toml", |_| None).unwrap_err();
        let lines = err.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("s.toml:2: tenants shopify/demo, shopify/demo2 share a secret"),
            "{lines:?}"
        );
        assert!(lines[0].contains("missing for demo2"), "{lines:?}");
        assert!(!err.to_string().contains("app-secret-XYZ"), "{err}");
        // The same shop twice under one secret is refused as well.
        let text = shopify_tenants(&[
            ("demo", "app-secret-XYZ", Some("demo.myshopify.com")),
            ("demo2", "app-secret-XYZ", Some("DEMO.myshopify.com")),
        ]);
        let err = Config::from_toml_named(&text, "s.toml", |_| None).unwrap_err();
        assert!(
            err.to_string().contains("name the same `shop_domain`"),
            "{err}"
        );
        assert!(!err.to_string().contains("app-secret-XYZ"), "{err}");
    }

    #[test]
    fn shopify_tenants_sharing_a_secret_with_their_shops_named_are_marked_shared() {
        // demo and demo3 share through demo2's rotation list.
        let mut text = shopify_tenants(&[
            ("demo", "s1", Some("demo.myshopify.com")),
            ("demo3", "s2", Some("demo3.myshopify.com")),
            ("alone", "s3", None),
        ]);
        text.push_str("[[tenant]]\nprovider = \"shopify\"\ntenant = \"demo2\"\nsecrets = [\"s1\", \"s2\"]\noptions = { shop_domain = \"demo2.myshopify.com\" }\n");
        // Another provider's tenant with the same secret does not count.
        text.push_str(
            "[[tenant]]\nprovider = \"github\"\ntenant = \"alone\"\nsecrets = [\"s3\"]\n",
        );
        let cfg = Config::from_toml(&text).unwrap();
        for name in ["demo", "demo2", "demo3"] {
            let t = cfg.tenant("shopify", name).unwrap();
            assert_eq!(t.option("shared_app"), Some("true"), "{name}");
        }
        assert_eq!(
            cfg.tenant("shopify", "alone").unwrap().option("shared_app"),
            None
        );
    }

    #[test]
    fn the_demo_configuration_is_valid() {
        let text = include_str!("../../einmal.toml");
        Config::from_toml_with_env(text, |_| Some("from-env".into())).unwrap();
    }

    #[test]
    fn rejects_unsafe_names_and_duplicates() {
        let bad = "[[tenant]]\nprovider = \"stripe\"\ntenant = \"a#b\"\n";
        assert!(Config::from_toml(bad).is_err());
        let dup = "[[tenant]]\nprovider = \"stripe\"\ntenant = \"a\"\n[[tenant]]\nprovider = \"stripe\"\ntenant = \"a\"\n";
        assert!(Config::from_toml(dup).is_err());
        assert!(Config::from_toml("[[tenant]]\nprovider = 1\n").is_err());
    }
}
