//! Secrets of the configuration: a value that never prints, and the references
//! (`{ env = "VAR" }`, `{ ssm = "/name" }`) that whoever loads the configuration resolves.

use std::fmt;

use serde::Deserialize;

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
pub(crate) enum SecretSpec {
    Inline(String),
    Env { env: String },
    Ssm { ssm: String },
}

/// A secret's reference, resolved by whoever loads the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretRef<'a> {
    /// `{ env = "VAR" }`: the process environment.
    Env(&'a str),
    /// `{ ssm = "/name" }`: an SSM parameter (SecureString), fetched before parsing.
    Ssm(&'a str),
}

/// Resolves secret references while a configuration is parsed.
pub type SecretLookup<'a> = &'a dyn Fn(SecretRef<'_>) -> Option<String>;

impl SecretSpec {
    /// The secret's value, or the problem (never containing a value) when its
    /// reference does not resolve.
    pub(crate) fn resolve(&self, lookup: SecretLookup<'_>) -> Result<String, String> {
        match self {
            SecretSpec::Inline(v) => Ok(v.clone()),
            SecretSpec::Env { env: var } => lookup(SecretRef::Env(var))
                .ok_or_else(|| format!("refers to environment variable {var}, which is not set")),
            SecretSpec::Ssm { ssm: name } => lookup(SecretRef::Ssm(name))
                .ok_or_else(|| format!("refers to SSM parameter {name}, which was not found")),
        }
    }
}
