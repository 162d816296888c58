//! Tenant configuration: which providers and tenants exist, their secrets and options.
//!
//! One TOML structure serves both modes. Locally it is a file (`einmal serve --config`);
//! on AWS the functions read the same TOML from an SSM SecureString parameter
//! (`EINMAL_CONFIG_PARAMETER`) or, for tests and small setups, from `EINMAL_CONFIG`.
//! A secret is either inline or a reference to an environment variable, so the file
//! itself can be committed without secrets.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

pub const DEFAULT_RETENTION_DAYS: u32 = 30;
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// DynamoDB items are capped at 400 KB; keep headroom for the other attributes.
pub const DEFAULT_MAX_STORED_BODY_BYTES: usize = 350 * 1024;
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// Only the position and the parser's message: the offending line may hold a secret.
    #[error("invalid config at byte {offset}: {message}")]
    Parse { offset: usize, message: String },
    #[error(
        "tenant {provider}/{tenant}: secret refers to environment variable {var}, which is not set"
    )]
    MissingEnvSecret {
        provider: String,
        tenant: String,
        var: String,
    },
    #[error("tenant {provider}/{tenant}: {reason}")]
    Invalid {
        provider: String,
        tenant: String,
        reason: String,
    },
}

/// A secret value. `Debug` and `Display` never print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum SecretSpec {
    Inline(String),
    Env { env: String },
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    retention_days: Option<u32>,
    max_body_bytes: Option<usize>,
    max_stored_body_bytes: Option<usize>,
    tolerance_secs: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    provider: String,
    tenant: String,
    #[serde(default)]
    secrets: Vec<SecretSpec>,
    tolerance_secs: Option<u64>,
    #[serde(default)]
    options: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default, rename = "tenant")]
    tenants: Vec<RawTenant>,
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
    tenants: BTreeMap<(String, String), TenantConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Parse TOML and resolve `{ env = "VAR" }` secrets from the process environment.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_toml_with_env(text, |name| std::env::var(name).ok())
    }

    pub fn from_toml_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            offset: e.span().map(|s| s.start).unwrap_or(0),
            message: e.message().to_string(),
        })?;
        let defaults = IngestSettings::default();
        let ingest = IngestSettings {
            retention_days: raw
                .defaults
                .retention_days
                .unwrap_or(defaults.retention_days),
            max_body_bytes: raw
                .defaults
                .max_body_bytes
                .unwrap_or(defaults.max_body_bytes),
            max_stored_body_bytes: raw
                .defaults
                .max_stored_body_bytes
                .unwrap_or(defaults.max_stored_body_bytes),
        };
        let default_tolerance = raw
            .defaults
            .tolerance_secs
            .unwrap_or(DEFAULT_TOLERANCE_SECS);
        let mut tenants = BTreeMap::new();
        for t in raw.tenants {
            let invalid = |reason: &str| ConfigError::Invalid {
                provider: t.provider.clone(),
                tenant: t.tenant.clone(),
                reason: reason.to_string(),
            };
            if !is_valid_name(&t.provider) || !is_valid_name(&t.tenant) {
                return Err(invalid(
                    "provider and tenant names may only use letters, digits, '-', '_' and '.'",
                ));
            }
            let mut secrets = Vec::with_capacity(t.secrets.len());
            for spec in &t.secrets {
                let value = match spec {
                    SecretSpec::Inline(v) => v.clone(),
                    SecretSpec::Env { env: var } => {
                        env(var).ok_or_else(|| ConfigError::MissingEnvSecret {
                            provider: t.provider.clone(),
                            tenant: t.tenant.clone(),
                            var: var.clone(),
                        })?
                    }
                };
                if value.is_empty() {
                    return Err(invalid("a secret is empty"));
                }
                secrets.push(Secret(value));
            }
            let key = (t.provider.clone(), t.tenant.clone());
            if tenants.contains_key(&key) {
                return Err(invalid("configured twice"));
            }
            let tenant = TenantConfig {
                provider: t.provider.clone(),
                tenant: t.tenant.clone(),
                secrets,
                tolerance_secs: t.tolerance_secs.unwrap_or(default_tolerance),
                options: t.options.clone(),
            };
            // The hint intake limit (thin providers) must be a number, not a typo.
            crate::pipeline::hint_limit::max_hints_per_minute(&tenant)
                .map_err(|reason| invalid(&reason))?;
            tenants.insert(key, tenant);
        }
        Ok(Config { ingest, tenants })
    }

    pub fn tenant(&self, provider: &str, tenant: &str) -> Option<&TenantConfig> {
        self.tenants
            .get(&(provider.to_string(), tenant.to_string()))
    }

    pub fn tenants(&self) -> impl Iterator<Item = &TenantConfig> {
        self.tenants.values()
    }

    /// Add or replace a tenant (tests and programmatic setups).
    pub fn insert_tenant(&mut self, tenant: TenantConfig) {
        self.tenants
            .insert((tenant.provider.clone(), tenant.tenant.clone()), tenant);
    }
}

/// Names end up in keys joined with `#`, so keep them to a safe alphabet.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
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

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("whsec_topsecret");
        assert!(!format!("{s:?}").contains("topsecret"));
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
