//! The `--config` file as every command reads it: `{ env = … }` references from the
//! environment and `{ ssm = … }` references fetched from SSM with the caller's AWS
//! credentials (the same parameters the functions read), only when the file has some.

use std::collections::BTreeMap;
use std::path::Path;

use einmal::adapters::aws::fetch_ssm_references;
use einmal::config::{env_and_fetched, ssm_references, Config, ConfigError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigFileError {
    /// The file is unreadable or its configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Its SSM references could not be fetched (credentials, permissions, network).
    #[error("{0}")]
    Fetch(String),
}

/// The whole configuration (tenants and destinations).
pub async fn load(path: &Path) -> Result<Config, String> {
    load_checked(path).await.map_err(|e| e.to_string())
}

/// [`load`] with the configuration's own problems kept apart (`einmal config check`).
pub async fn load_checked(path: &Path) -> Result<Config, ConfigFileError> {
    let (text, fetched) = read(path).await?;
    let lookup = env_and_fetched(&fetched);
    let config = Config::from_toml_resolved(&text, &path.display().to_string(), &lookup)?;
    Ok(config)
}

/// Only the tenants (`einmal send` signs as a provider): destinations' secrets and DSNs
/// need not be set where the sender runs.
pub async fn load_tenants(path: &Path) -> Result<Config, String> {
    let (text, fetched) = read(path).await.map_err(|e| e.to_string())?;
    let lookup = env_and_fetched(&fetched);
    let config = Config::tenants_from_toml_resolved(&text, &path.display().to_string(), &lookup)
        .map_err(|e| e.to_string())?;
    Ok(config)
}

/// The file's text and the values of its SSM references.
async fn read(path: &Path) -> Result<(String, BTreeMap<String, String>), ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    if ssm_references(&text).is_empty() {
        return Ok((text, BTreeMap::new()));
    }
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let fetched = fetch_ssm_references(&aws_sdk_ssm::Client::new(&sdk), &text)
        .await
        .map_err(|e| ConfigFileError::Fetch(e.to_string()))?;
    Ok((text, fetched))
}
