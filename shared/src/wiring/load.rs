//! The loader of the configuration: the one place that knows the providers (their
//! names and options), the destination kinds (through [`super::destinations`]) and
//! the limits other parts set (the hint intake limit), and checks a text against all
//! of them. The types it fills stay on the ground floor (`crate::config`); this sits
//! above everything it consults, so nothing below imports it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::{
    env_only, parse_raw, Config, ConfigError, ConfigScope, IngestSettings, TenantConfig,
    DEFAULT_TOLERANCE_SECS,
};
use crate::problems::{did_you_mean, is_valid_name, line_of, nearest, Problem};
use crate::providers;
use crate::secret::{Secret, SecretLookup};

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_named(&text, &path.display().to_string(), |name| {
            std::env::var(name).ok()
        })
    }

    /// Parse TOML and resolve `{ env = "VAR" }` secrets from the process environment.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_toml_with_env(text, |name| std::env::var(name).ok())
    }

    pub fn from_toml_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::from_toml_named(text, "config", env)
    }

    /// Parse and check a configuration strictly; `origin` (a file name, a parameter)
    /// names it in errors. A structural TOML error stops at once; otherwise every
    /// problem is collected: unknown providers, tenants without secrets, options the
    /// provider does not declare (with the nearest valid name), unset environment
    /// variables, empty secrets, unsafe names, tenants configured twice, and invalid
    /// generic-HMAC schemes; and for destinations ([`super::destinations`]):
    /// unknown kinds and fields, missing or malformed secrets, unsafe URLs, bad table
    /// names, unknown tenants and providers, duplicate names, too many per tenant,
    /// invalid patterns, destinations that would receive nothing.
    pub fn from_toml_named(
        text: &str,
        origin: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::from_toml_resolved(text, origin, &env_only(&env))
    }

    /// [`Config::from_toml_named`] with every kind of secret reference resolved by
    /// `lookup` (the SSM values fetched beforehand, see [`ssm_references`]).
    pub fn from_toml_resolved(
        text: &str,
        origin: &str,
        lookup: SecretLookup<'_>,
    ) -> Result<Self, ConfigError> {
        Self::parse(text, origin, lookup, ConfigScope::Whole)
    }

    /// Only the tenants, for a command that signs as a provider (`einmal send`): the
    /// destinations are not read, so their secrets need not be set here.
    pub fn tenants_from_toml_resolved(
        text: &str,
        origin: &str,
        lookup: SecretLookup<'_>,
    ) -> Result<Self, ConfigError> {
        Self::parse(text, origin, lookup, ConfigScope::TenantsOnly)
    }

    /// [`Config::from_toml_resolved`] reading `scope` of the text.
    pub fn from_toml_scoped(
        text: &str,
        origin: &str,
        lookup: SecretLookup<'_>,
        scope: ConfigScope,
    ) -> Result<Self, ConfigError> {
        Self::parse(text, origin, lookup, scope)
    }

    fn parse(
        text: &str,
        origin: &str,
        lookup: SecretLookup<'_>,
        scope: ConfigScope,
    ) -> Result<Self, ConfigError> {
        let raw = parse_raw(text, origin)?;
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
        let mut lines = BTreeMap::new();
        let mut problems = Vec::new();
        let written: std::collections::BTreeSet<(String, String)> = raw
            .tenants
            .iter()
            .map(|t| (t.provider.get_ref().clone(), t.tenant.clone()))
            .collect();
        for t in raw.tenants {
            let line = line_of(text, t.provider.span().start);
            let provider_name = t.provider.get_ref().clone();
            let mut problem = |message: String| {
                problems.push(Problem {
                    line,
                    message: format!("tenant {provider_name}/{}: {message}", t.tenant),
                })
            };
            if !is_valid_name(&provider_name) || !is_valid_name(&t.tenant) {
                problem(
                    "provider and tenant names may only use letters, digits, '-', '_' and '.'"
                        .into(),
                );
                continue;
            }
            let Some(provider) = providers::lookup(&provider_name) else {
                let known = providers::all().iter().map(|p| p.name());
                problem(format!(
                    "unknown provider `{provider_name}`{}",
                    did_you_mean(nearest(&provider_name, known))
                ));
                continue;
            };
            let mut secrets = Vec::with_capacity(t.secrets.len());
            for spec in &t.secrets {
                let value = match spec.resolve(lookup) {
                    Ok(value) => Some(value),
                    Err(reason) => {
                        problem(format!("secret {reason}"));
                        None
                    }
                };
                match value {
                    Some(v) if v.is_empty() => problem("a secret is empty".into()),
                    Some(v) => secrets.push(Secret::new(v)),
                    None => {}
                }
            }
            let mut options = BTreeMap::new();
            for (name, value) in t.options {
                let (span, name) = (name.span(), name.into_inner());
                if !provider.options().contains(&name.as_str()) {
                    problems.push(Problem {
                        line: line_of(text, span.start),
                        message: format!(
                            "tenant {provider_name}/{}: unknown option `{name}` for provider {provider_name}{}",
                            t.tenant,
                            did_you_mean(nearest(&name, provider.options().iter().copied()))
                        ),
                    });
                    continue;
                }
                options.insert(name, value);
            }
            let tenant = TenantConfig {
                provider: provider_name.clone(),
                tenant: t.tenant.clone(),
                secrets,
                tolerance_secs: t.tolerance_secs.unwrap_or(default_tolerance),
                options,
            };
            let mut problem = |message: String| {
                problems.push(Problem {
                    line,
                    message: format!("tenant {provider_name}/{}: {message}", t.tenant),
                })
            };
            if t.secrets.is_empty() && provider.needs_secret(&tenant) {
                problem("no secrets: `secrets` must list at least one".into());
            }
            if !t.secrets.is_empty() {
                if let Err(reason) = provider.validate_tenant(&tenant) {
                    problem(reason);
                }
            }
            let key = (tenant.provider.clone(), tenant.tenant.clone());
            if tenants.contains_key(&key) {
                problem("configured twice".into());
                continue;
            }
            // The hint intake limit (thin providers) must be a number, not a typo.
            if let Err(reason) = crate::pipeline::hint_limit::max_hints_per_minute(&tenant) {
                problem(reason);
            }
            lines.insert(key.clone(), line);
            tenants.insert(key, tenant);
        }
        shopify_shared_secrets(&mut tenants, &lines, &mut problems);
        let destinations = match scope {
            ConfigScope::Whole => super::destinations::parse_destinations(
                text,
                raw.destinations,
                &written,
                lookup,
                &mut problems,
            ),
            ConfigScope::TenantsOnly => Vec::new(),
        };
        if !problems.is_empty() {
            problems.sort_by_key(|p| p.line);
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                problems,
            });
        }
        Ok(Config {
            ingest,
            tenants,
            destinations,
        })
    }
}

/// Shopify tenants that list a common secret (one public app installed in several
/// shops: its client secret signs every shop's webhooks). Each must name its own shop
/// (`shop_domain`, all different), or a body signed for one shop would be taken by
/// another's tenant; each is then marked `shared_app`, so it takes only bodies that
/// name its shop (`providers::shopify`). The problem names the tenants, never the
/// secret.
fn shopify_shared_secrets(
    tenants: &mut BTreeMap<(String, String), TenantConfig>,
    lines: &BTreeMap<(String, String), usize>,
    problems: &mut Vec<Problem>,
) {
    use crate::providers::shopify::{SHARED_APP_OPTION, SHOP_DOMAIN_OPTION};
    let shopify: Vec<&TenantConfig> = tenants
        .values()
        .filter(|t| t.provider == "shopify")
        .collect();
    // Tenants connected by a common secret form one group (union by pairs).
    let mut group: Vec<usize> = (0..shopify.len()).collect();
    fn root(group: &mut [usize], mut i: usize) -> usize {
        while group[i] != i {
            group[i] = group[group[i]];
            i = group[i];
        }
        i
    }
    for a in 0..shopify.len() {
        for b in a + 1..shopify.len() {
            let common = shopify[a]
                .secrets
                .iter()
                .any(|x| shopify[b].secrets.iter().any(|y| x.expose() == y.expose()));
            if common {
                let (ra, rb) = (root(&mut group, a), root(&mut group, b));
                group[rb] = ra;
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..shopify.len() {
        groups.entry(root(&mut group, i)).or_default().push(i);
    }
    let mut shared = Vec::new();
    for members in groups.into_values().filter(|m| m.len() > 1) {
        let names: Vec<String> = members
            .iter()
            .map(|&i| format!("shopify/{}", shopify[i].tenant))
            .collect();
        let line = members
            .iter()
            .filter_map(|&i| {
                let t = shopify[i];
                lines.get(&(t.provider.clone(), t.tenant.clone())).copied()
            })
            .min()
            .unwrap_or(0);
        let unnamed: Vec<&str> = members
            .iter()
            .filter(|&&i| shopify[i].option(SHOP_DOMAIN_OPTION).is_none())
            .map(|&i| shopify[i].tenant.as_str())
            .collect();
        let mut domains: Vec<String> = members
            .iter()
            .filter_map(|&i| shopify[i].option(SHOP_DOMAIN_OPTION))
            .map(str::to_ascii_lowercase)
            .collect();
        domains.sort();
        let repeated = domains.windows(2).any(|w| w[0] == w[1]);
        if !unnamed.is_empty() {
            problems.push(Problem {
                line,
                message: format!(
                    "tenants {} share a secret (one app's client secret signs every shop's webhooks): each must name its shop with `{SHOP_DOMAIN_OPTION}`, missing for {}",
                    names.join(", "),
                    unnamed.join(", ")
                ),
            });
        } else if repeated {
            problems.push(Problem {
                line,
                message: format!(
                    "tenants {} share a secret and name the same `{SHOP_DOMAIN_OPTION}`: a shop's webhooks can belong to one tenant only",
                    names.join(", ")
                ),
            });
        } else {
            shared.extend(
                members
                    .iter()
                    .map(|&i| ("shopify".to_string(), shopify[i].tenant.clone())),
            );
        }
    }
    for key in shared {
        if let Some(t) = tenants.get_mut(&key) {
            t.options
                .insert(SHARED_APP_OPTION.to_string(), "true".to_string());
        }
    }
}
