//! Wiring around the AWS adapter: resource names and config from the environment,
//! config from SSM, and table/queue creation for tests and local moto setups
//! (production resources come from the SAM template in `infra/`).

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::create_table::{CreateTableError, CreateTableOutput};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_sdk_dynamodb::types::{GlobalSecondaryIndex, Projection, ProjectionType, TableDescription};
use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_ssm::operation::get_parameter::GetParameterError;
use thiserror::Error;

use super::error::describe;
use super::item;
use crate::config::{
    env_and_fetched, ssm_references, Config, ConfigError, ConfigScope, Problem, MAX_SSM_REFERENCES,
};

/// Inbox table name.
pub const TABLE_ENV: &str = "EINMAL_INBOX_TABLE";
/// Main queue URL.
pub const QUEUE_URL_ENV: &str = "EINMAL_QUEUE_URL";
/// Dead-letter queue URL (optional; only operator tools read it).
pub const DLQ_URL_ENV: &str = "EINMAL_DLQ_URL";
/// Name of an SSM (SecureString) parameter holding the config TOML.
pub const CONFIG_PARAMETER_ENV: &str = "EINMAL_CONFIG_PARAMETER";
/// Inline config TOML (tests and small setups).
pub const CONFIG_ENV: &str = "EINMAL_CONFIG";

/// SQS keeps messages at most 14 days; dead letters should stay that long.
const DLQ_RETENTION_SECS: u32 = 14 * 24 * 3600;
/// A new PAY_PER_REQUEST table is usually ACTIVE within seconds.
const TABLE_ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Error)]
pub enum AwsSetupError {
    #[error("environment variable {0} is not set")]
    MissingEnv(&'static str),
    #[error("no configuration: set {CONFIG_PARAMETER_ENV} (SSM parameter name) or {CONFIG_ENV} (inline TOML)")]
    NoConfigSource,
    #[error("SSM parameter {name}: {reason}")]
    Ssm { name: String, reason: String },
    #[error("config from {origin}: {source}")]
    Config {
        origin: String,
        #[source]
        source: ConfigError,
    },
    /// Creating or inspecting tables and queues failed.
    #[error("{0}")]
    Resource(String),
}

/// Where the adapter's resources are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsNames {
    pub table: String,
    pub queue_url: String,
    pub dlq_url: Option<String>,
}

impl AwsNames {
    /// Read `EINMAL_INBOX_TABLE`, `EINMAL_QUEUE_URL` and optional `EINMAL_DLQ_URL`.
    pub fn from_env() -> Result<Self, AwsSetupError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`AwsNames::from_env`] with an injectable lookup (tests). Empty counts as unset.
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, AwsSetupError> {
        let get = |name: &'static str| env(name).filter(|v| !v.trim().is_empty());
        Ok(AwsNames {
            table: get(TABLE_ENV).ok_or(AwsSetupError::MissingEnv(TABLE_ENV))?,
            queue_url: get(QUEUE_URL_ENV).ok_or(AwsSetupError::MissingEnv(QUEUE_URL_ENV))?,
            dlq_url: get(DLQ_URL_ENV),
        })
    }
}

/// Read the config TOML from an SSM parameter (decrypted) and parse it. A name ending
/// in `/` is a path: every parameter below it (recursively, in name order) holds a part
/// of one configuration, so it is not bounded by one parameter's 4 KB (Standard) or
/// 8 KB (Advanced).
pub async fn load_config_from_ssm(
    client: &aws_sdk_ssm::Client,
    name: &str,
) -> Result<Config, AwsSetupError> {
    load_config_from_ssm_scoped(client, name, ConfigScope::Whole).await
}

/// [`load_config_from_ssm`] reading `scope` of the configuration.
pub async fn load_config_from_ssm_scoped(
    client: &aws_sdk_ssm::Client,
    name: &str,
    scope: ConfigScope,
) -> Result<Config, AwsSetupError> {
    if name.ends_with('/') {
        return load_config_from_ssm_path(client, name, scope).await;
    }
    let out = client
        .get_parameter()
        .name(name)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| AwsSetupError::Ssm {
            name: name.to_string(),
            reason: match e.as_service_error() {
                Some(GetParameterError::ParameterNotFound(_)) => "not found".to_string(),
                _ => describe("SSM GetParameter", &e),
            },
        })?;
    let text = out
        .parameter()
        .and_then(|p| p.value())
        .ok_or_else(|| AwsSetupError::Ssm {
            name: name.to_string(),
            reason: "parameter has no value".to_string(),
        })?;
    parse_resolving(client, text, &format!("SSM parameter {name}"), scope).await
}

/// Parse a configuration with its `{ ssm = "…" }` secret references fetched first
/// (decrypted, 10 names a GetParameters call; at most [`MAX_SSM_REFERENCES`]). A name SSM
/// does not have is reported by the parse at its line; any other SSM failure is an error
/// of the whole load (a reload keeps the previous configuration). `scope` says what is read.
pub async fn parse_resolving(
    client: &aws_sdk_ssm::Client,
    text: &str,
    origin: &str,
    scope: ConfigScope,
) -> Result<Config, AwsSetupError> {
    let values = fetch_ssm_references(client, text).await?;
    let lookup = env_and_fetched(&values);
    Config::from_toml_scoped(text, origin, &lookup, scope).map_err(|source| AwsSetupError::Config {
        origin: origin.to_string(),
        source,
    })
}

/// The values of the `{ ssm = "…" }` references in `text`, by parameter name.
pub async fn fetch_ssm_references(
    client: &aws_sdk_ssm::Client,
    text: &str,
) -> Result<std::collections::BTreeMap<String, String>, AwsSetupError> {
    let names = ssm_references(text);
    let mut values = std::collections::BTreeMap::new();
    if names.len() > MAX_SSM_REFERENCES {
        return Err(AwsSetupError::Ssm {
            name: names[0].clone(),
            reason: format!(
                "{} secret references, at most {MAX_SSM_REFERENCES} are allowed",
                names.len()
            ),
        });
    }
    for chunk in names.chunks(10) {
        let out = client
            .get_parameters()
            .set_names(Some(chunk.to_vec()))
            .with_decryption(true)
            .send()
            .await
            .map_err(|e| AwsSetupError::Ssm {
                name: chunk.join(", "),
                reason: describe("SSM GetParameters", &e),
            })?;
        for parameter in out.parameters() {
            if let (Some(name), Some(value)) = (parameter.name(), parameter.value()) {
                values.insert(name.to_string(), value.to_string());
            }
        }
    }
    Ok(values)
}

/// The parts of a configuration split below an SSM path, each a TOML fragment
/// (`[[tenant]]`, `[[destination]]`, at most one `[defaults]`), joined in name order
/// and checked as one; a problem names its parameter and its line there.
async fn load_config_from_ssm_path(
    client: &aws_sdk_ssm::Client,
    path: &str,
    scope: ConfigScope,
) -> Result<Config, AwsSetupError> {
    let ssm_error = |reason: String| AwsSetupError::Ssm {
        name: path.to_string(),
        reason,
    };
    let mut parts: Vec<(String, String)> = Vec::new();
    let mut pages = client
        .get_parameters_by_path()
        .path(path)
        .recursive(true)
        .with_decryption(true)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| ssm_error(describe("SSM GetParametersByPath", &e)))?;
        for parameter in page.parameters() {
            let (Some(name), Some(value)) = (parameter.name(), parameter.value()) else {
                continue;
            };
            parts.push((name.to_string(), value.to_string()));
        }
        if parts.len() > MAX_CONFIG_PARTS {
            return Err(ssm_error(format!(
                "more than {MAX_CONFIG_PARTS} parameters below the path"
            )));
        }
    }
    if parts.is_empty() {
        return Err(ssm_error("no parameter below the path".to_string()));
    }
    parts.sort();
    let config_error = |source| AwsSetupError::Config {
        origin: format!("SSM path {path}"),
        source,
    };
    for (name, value) in &parts {
        crate::config::check_structure(value, &format!("SSM parameter {name}"))
            .map_err(config_error)?;
    }
    let mut text = String::new();
    // (first line of the part in the joined text, its parameter's name)
    let mut starts: Vec<(usize, &str)> = Vec::with_capacity(parts.len());
    for (name, value) in &parts {
        starts.push((text.lines().count() + 1, name));
        text.push_str(value);
        if !value.ends_with('\n') {
            text.push('\n');
        }
    }
    let locate = |line: usize| -> (String, usize) {
        let (start, name) = starts
            .iter()
            .rev()
            .find(|(start, _)| *start <= line)
            .copied()
            .unwrap_or((1, path));
        (name.to_string(), line + 1 - start)
    };
    let values = fetch_ssm_references(client, &text).await?;
    let lookup = env_and_fetched(&values);
    Config::from_toml_scoped(&text, path, &lookup, scope).map_err(|source| {
        // Each part parsed alone above; what is left are problems across the whole.
        let source = match source {
            ConfigError::Invalid { problems, .. } => ConfigError::Invalid {
                origin: format!("SSM parameters below {path}"),
                problems: problems
                    .into_iter()
                    .map(|p| {
                        let (origin, line) = locate(p.line);
                        Problem {
                            line,
                            message: format!("(parameter {origin}) {}", p.message),
                        }
                    })
                    .collect(),
            },
            other => other,
        };
        config_error(source)
    })
}

/// Bounds what one reload reads (10 parameters per GetParametersByPath page).
const MAX_CONFIG_PARTS: usize = 200;

/// Reloads the tenant TOML from one SSM SecureString, for [`ConfigSource::refreshing`]:
/// a rotated secret takes effect within the TTL, without a redeploy.
///
/// [`ConfigSource::refreshing`]: crate::config_source::ConfigSource::refreshing
pub struct SsmConfigLoader {
    pub client: aws_sdk_ssm::Client,
    pub name: String,
    pub scope: ConfigScope,
}

#[async_trait::async_trait]
impl crate::config_source::ConfigLoader for SsmConfigLoader {
    async fn load(&self) -> Result<Config, String> {
        load_config_from_ssm_scoped(&self.client, &self.name, self.scope)
            .await
            .map_err(|e| e.to_string())
    }
}

/// How long a function keeps the SSM configuration before reloading it.
pub const CONFIG_TTL_ENV: &str = "EINMAL_CONFIG_TTL_SECS";
const DEFAULT_CONFIG_TTL: Duration = Duration::from_secs(60);

/// The functions' configuration: from SSM (reloaded every `EINMAL_CONFIG_TTL_SECS`,
/// default 60 s) when `EINMAL_CONFIG_PARAMETER` is set, else the inline `EINMAL_CONFIG`;
/// `scope` of it (the receiver reads only the tenants).
pub async fn config_source_from_env(
    sdk_config: &aws_config::SdkConfig,
    scope: ConfigScope,
) -> Result<crate::config_source::ConfigSource, AwsSetupError> {
    use crate::config_source::ConfigSource;
    let ttl = std::env::var(CONFIG_TTL_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_CONFIG_TTL);
    let initial = load_config_scoped(sdk_config, |name| std::env::var(name).ok(), scope).await?;
    match std::env::var(CONFIG_PARAMETER_ENV) {
        Ok(name) if !name.trim().is_empty() => {
            let loader = SsmConfigLoader {
                client: aws_sdk_ssm::Client::new(sdk_config),
                name: name.trim().to_string(),
                scope,
            };
            Ok(ConfigSource::refreshing(
                initial,
                std::sync::Arc::new(loader),
                ttl,
            ))
        }
        _ => Ok(ConfigSource::fixed(std::sync::Arc::new(initial))),
    }
}

/// The whole config for a Lambda, with an injectable lookup (tests): see
/// [`load_config_scoped`].
pub async fn load_config_with(
    sdk_config: &aws_config::SdkConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, AwsSetupError> {
    load_config_scoped(sdk_config, env, ConfigScope::Whole).await
}

/// The config for a Lambda: `EINMAL_CONFIG_PARAMETER` (SSM name) wins over
/// `EINMAL_CONFIG` (inline TOML); neither set is an error.
async fn load_config_scoped(
    sdk_config: &aws_config::SdkConfig,
    env: impl Fn(&str) -> Option<String>,
    scope: ConfigScope,
) -> Result<Config, AwsSetupError> {
    let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(parameter) = get(CONFIG_PARAMETER_ENV) {
        let ssm = aws_sdk_ssm::Client::new(sdk_config);
        return load_config_from_ssm_scoped(&ssm, parameter.trim(), scope).await;
    }
    if let Some(text) = get(CONFIG_ENV) {
        let ssm = aws_sdk_ssm::Client::new(sdk_config);
        return parse_resolving(&ssm, &text, CONFIG_ENV, scope).await;
    }
    Err(AwsSetupError::NoConfigSource)
}

/// Create the inbox table (pk hash key, on-demand, TTL on `expires_at`) and wait
/// until it is ACTIVE. An existing table is accepted, so this is idempotent.
pub async fn create_tables(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), AwsSetupError> {
    let created = dynamodb
        .create_table()
        .table_name(table)
        .attribute_definitions(key_attribute(table, item::PK, ScalarAttributeType::S)?)
        .key_schema(key_element(table, item::PK, KeyType::Hash)?)
        .attribute_definitions(key_attribute(
            table,
            item::SWEEP_SHARD,
            ScalarAttributeType::S,
        )?)
        .attribute_definitions(key_attribute(
            table,
            item::RECEIVED_AT_MS,
            ScalarAttributeType::N,
        )?)
        .global_secondary_indexes(sweep_index(table)?)
        // The reconciler's hint index; its range key `received_at_ms` is defined above.
        .attribute_definitions(key_attribute(
            table,
            item::HINT_SCOPE,
            ScalarAttributeType::S,
        )?)
        .global_secondary_indexes(hint_index(table)?)
        // The waiters' index: parked items by prerequisite record.
        .attribute_definitions(key_attribute(
            table,
            item::WAIT_SHARD,
            ScalarAttributeType::S,
        )?)
        .attribute_definitions(key_attribute(table, item::WAIT_ON, ScalarAttributeType::S)?)
        .global_secondary_indexes(wait_index(table)?)
        // The relay's index: items with a pending delivery, by next attempt.
        .attribute_definitions(key_attribute(
            table,
            item::RELAY_SHARD,
            ScalarAttributeType::S,
        )?)
        .attribute_definitions(key_attribute(
            table,
            item::RELAY_DUE_MS,
            ScalarAttributeType::N,
        )?)
        .global_secondary_indexes(relay_index(table)?)
        // The dead-lettered deliveries' index: items with one, most recent first.
        .attribute_definitions(key_attribute(
            table,
            item::RELAY_DEAD_SHARD,
            ScalarAttributeType::S,
        )?)
        .attribute_definitions(key_attribute(
            table,
            item::RELAY_DEAD_MS,
            ScalarAttributeType::N,
        )?)
        .global_secondary_indexes(relay_dead_index(table)?)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    let active = created_or_existing(created)?.is_some_and(|out| {
        out.table_description().and_then(|d| d.table_status()) == Some(&TableStatus::Active)
    });
    if !active {
        wait_table_active(dynamodb, table, |_| Ok(())).await?;
    }
    enable_ttl(dynamodb, table).await
}

/// A key attribute `name` of type `kind` for table `table`'s schema or an index.
pub(crate) fn key_attribute(
    table: &str,
    name: &str,
    kind: ScalarAttributeType,
) -> Result<AttributeDefinition, AwsSetupError> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(|e| AwsSetupError::Resource(format!("table {table}: {e}")))
}

/// A key schema element: attribute `name` as the `key_type` key of table `table`.
pub(crate) fn key_element(
    table: &str,
    name: &str,
    key_type: KeyType,
) -> Result<KeySchemaElement, AwsSetupError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .map_err(|e| AwsSetupError::Resource(format!("table {table}: {e}")))
}

/// CreateTable's outcome for idempotent setup: `Some` when created now, `None` when
/// the table already exists; any other failure is an error.
pub(crate) fn created_or_existing(
    created: Result<CreateTableOutput, SdkError<CreateTableError, HttpResponse>>,
) -> Result<Option<CreateTableOutput>, AwsSetupError> {
    match created {
        Ok(out) => Ok(Some(out)),
        Err(e)
            if matches!(
                e.as_service_error(),
                Some(CreateTableError::ResourceInUseException(_))
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(AwsSetupError::Resource(describe(
            "DynamoDB CreateTable",
            &e,
        ))),
    }
}

/// The sweeper's sparse GSI: only pending items carry `sweep_shard` (one of 16 shards,
/// constant while pending), ranged by `received_at_ms`, KEYS_ONLY: claims and retries
/// never write it; the sweeper reads the few candidates from the table.
fn sweep_index(table: &str) -> Result<GlobalSecondaryIndex, AwsSetupError> {
    keys_only_index(table, item::BY_SWEEP_SHARD, item::SWEEP_SHARD)
}

/// The reconciler's sparse GSI: only the hints of GoPay and Klarna push carry
/// `hint_scope` (`{provider}#{tenant}`, set by the put), ranged by `received_at_ms`,
/// KEYS_ONLY: a hint's state changes never write it.
fn hint_index(table: &str) -> Result<GlobalSecondaryIndex, AwsSetupError> {
    keys_only_index(table, item::BY_HINT, item::HINT_SCOPE)
}

/// The waiters' sparse GSI: only parked items carry `wait_shard` / `wait_on` (hash,
/// range), projecting the few attributes the wake and the sweeper need.
fn wait_index(table: &str) -> Result<GlobalSecondaryIndex, AwsSetupError> {
    inbox_index(
        table,
        item::BY_WAIT_SHARD,
        (item::WAIT_SHARD, item::WAIT_ON),
        including(&item::WAIT_INDEX_PROJECTION),
    )
}

/// A projection of the keys and `attributes`.
fn including(attributes: &[&str]) -> Projection {
    Projection::builder()
        .projection_type(ProjectionType::Include)
        .set_non_key_attributes(Some(attributes.iter().map(|a| a.to_string()).collect()))
        .build()
}

/// The relay's sparse GSI: only items with a pending delivery carry `relay_shard` /
/// `relay_due_ms` (hash, range), projecting the deliveries and the item's fields but
/// the body, so the backlog metrics read the index alone.
fn relay_index(table: &str) -> Result<GlobalSecondaryIndex, AwsSetupError> {
    inbox_index(
        table,
        item::BY_RELAY_DUE,
        (item::RELAY_SHARD, item::RELAY_DUE_MS),
        including(&item::RELAY_INDEX_PROJECTION),
    )
}

/// The dead-lettered deliveries' sparse GSI: only items with a dead-lettered delivery
/// carry `relay_dead_shard` / `relay_dead_ms` (hash, range), projecting what
/// `relay_index` does, so the operator's listings read the index alone.
fn relay_dead_index(table: &str) -> Result<GlobalSecondaryIndex, AwsSetupError> {
    inbox_index(
        table,
        item::BY_RELAY_DEAD,
        (item::RELAY_DEAD_SHARD, item::RELAY_DEAD_MS),
        including(&item::RELAY_INDEX_PROJECTION),
    )
}

/// A KEYS_ONLY inbox index `name`, hash `hash`, range `received_at_ms` (which never
/// changes): sparse when only some items carry `hash`.
fn keys_only_index(
    table: &str,
    name: &str,
    hash: &str,
) -> Result<GlobalSecondaryIndex, AwsSetupError> {
    let projection = Projection::builder()
        .projection_type(ProjectionType::KeysOnly)
        .build();
    inbox_index(table, name, (hash, item::RECEIVED_AT_MS), projection)
}

/// An inbox index `name` keyed by `(hash, range)` with `projection`.
fn inbox_index(
    table: &str,
    name: &str,
    (hash, range): (&str, &str),
    projection: Projection,
) -> Result<GlobalSecondaryIndex, AwsSetupError> {
    GlobalSecondaryIndex::builder()
        .index_name(name)
        .key_schema(key_element(table, hash, KeyType::Hash)?)
        .key_schema(key_element(table, range, KeyType::Range)?)
        .projection(projection)
        .build()
        .map_err(|e| AwsSetupError::Resource(format!("table {table}: {e}")))
}

/// Poll until `table` is ACTIVE, refusing it early when `check` finds its description
/// wrong (a state table of an older key layout): the one wait of every table created.
pub(super) async fn wait_table_active(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    check: impl Fn(&TableDescription) -> Result<(), AwsSetupError>,
) -> Result<(), AwsSetupError> {
    let started = Instant::now();
    loop {
        let out = dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| AwsSetupError::Resource(describe("DynamoDB DescribeTable", &e)))?;
        if let Some(description) = out.table() {
            check(description)?;
        }
        if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return Ok(());
        }
        if started.elapsed() > TABLE_ACTIVE_TIMEOUT {
            return Err(AwsSetupError::Resource(format!(
                "table {table} is not ACTIVE after {}s",
                TABLE_ACTIVE_TIMEOUT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Turn TTL on `expires_at` unless it already is (re-enabling is a ValidationException).
/// The inbox and the state table (its mark-only items) both expire on it.
pub(super) async fn enable_ttl(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), AwsSetupError> {
    let current = dynamodb
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await
        .map_err(|e| AwsSetupError::Resource(describe("DynamoDB DescribeTimeToLive", &e)))?;
    let status = current
        .time_to_live_description()
        .and_then(|d| d.time_to_live_status());
    if matches!(
        status,
        Some(TimeToLiveStatus::Enabled) | Some(TimeToLiveStatus::Enabling)
    ) {
        return Ok(());
    }
    let spec = TimeToLiveSpecification::builder()
        .attribute_name(item::EXPIRES_AT)
        .enabled(true)
        .build()
        .map_err(|e| AwsSetupError::Resource(format!("table {table}: {e}")))?;
    dynamodb
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(spec)
        .send()
        .await
        .map_err(|e| AwsSetupError::Resource(describe("DynamoDB UpdateTimeToLive", &e)))?;
    Ok(())
}

/// Create the queue `name` and its dead-letter queue `name-dlq`, with a redrive
/// policy after `max_receive_count` receives.
///
/// Returns names with `table` set to `name` too: a setup conventionally uses one base
/// name, so `create_tables(dynamodb, &names.table)` completes it. Idempotent as long
/// as the attributes match.
pub async fn create_queues(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    max_receive_count: u32,
) -> Result<AwsNames, AwsSetupError> {
    let dlq_name = format!("{name}-dlq");
    let dlq = sqs
        .create_queue()
        .queue_name(&dlq_name)
        .attributes(
            QueueAttributeName::MessageRetentionPeriod,
            DLQ_RETENTION_SECS.to_string(),
        )
        .send()
        .await
        .map_err(|e| AwsSetupError::Resource(describe("SQS CreateQueue", &e)))?;
    let dlq_url = dlq
        .queue_url()
        .ok_or_else(|| AwsSetupError::Resource(format!("queue {dlq_name}: no URL returned")))?
        .to_string();
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(&dlq_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| AwsSetupError::Resource(describe("SQS GetQueueAttributes", &e)))?;
    let dlq_arn = attrs
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .ok_or_else(|| AwsSetupError::Resource(format!("queue {dlq_name}: no ARN returned")))?;
    let redrive = serde_json::json!({
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": max_receive_count.max(1).to_string(),
    });
    let main = sqs
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::RedrivePolicy, redrive.to_string())
        .send()
        .await
        .map_err(|e| AwsSetupError::Resource(describe("SQS CreateQueue", &e)))?;
    let queue_url = main
        .queue_url()
        .ok_or_else(|| AwsSetupError::Resource(format!("queue {name}: no URL returned")))?
        .to_string();
    Ok(AwsNames {
        table: name.to_string(),
        queue_url,
        dlq_url: Some(dlq_url),
    })
}

/// Table, queue and dead-letter queue under one base name.
pub async fn create_all(
    dynamodb: &aws_sdk_dynamodb::Client,
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    max_receive_count: u32,
) -> Result<AwsNames, AwsSetupError> {
    create_tables(dynamodb, name).await?;
    create_queues(sqs, name, max_receive_count).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_env_require_table_and_queue() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let err = AwsNames::from_lookup(env(&[(QUEUE_URL_ENV, "http://q")])).unwrap_err();
        assert!(matches!(err, AwsSetupError::MissingEnv(TABLE_ENV)), "{err}");
        let err =
            AwsNames::from_lookup(env(&[(TABLE_ENV, "t"), (QUEUE_URL_ENV, " ")])).unwrap_err();
        assert!(err.to_string().contains(QUEUE_URL_ENV), "{err}");
        let names =
            AwsNames::from_lookup(env(&[(TABLE_ENV, "t"), (QUEUE_URL_ENV, "http://q")])).unwrap();
        assert_eq!(names.dlq_url, None);
    }
}
