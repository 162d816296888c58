//! The audit log of manual actions (replays, …): who, when, why, which events,
//! result. Append-only: records are inserted, never updated or deleted.
//!
//! Two adapters: [`EmbeddedAuditLog`] (`audit.sqlite` next to the embedded store)
//! and [`DynamoAuditLog`] (the DynamoDB table named by [`AUDIT_TABLE_ENV`]).

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::adapters::aws::error::describe;
use crate::adapters::aws::AwsSetupError;
use crate::ports::StoreError;

/// Names the DynamoDB audit table.
pub const AUDIT_TABLE_ENV: &str = "EINMAL_AUDIT_TABLE";
/// File name of the embedded audit log inside the store directory.
pub const AUDIT_FILE: &str = "audit.sqlite";
/// `list` limit when asked for 0.
const DEFAULT_LIMIT: usize = 100;

/// One manual action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Unique, sortable by time (`<at_ms>-<random>`).
    pub id: String,
    pub at_ms: i64,
    /// Who: `$USER` or `--actor`.
    pub actor: String,
    /// `replay`, `replay-bulk`, …
    pub action: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// What was selected: the event, or the bulk filter (JSON).
    pub selector: Value,
    /// Inbox keys the action touched.
    pub events: Vec<String>,
    /// What happened (counts, per-event outcomes).
    pub result: Value,
}

impl AuditRecord {
    /// A fresh id for a record written at `at_ms`.
    pub fn new_id(at_ms: i64) -> String {
        format!("{at_ms:013}-{:016x}", rand::random::<u64>())
    }
}

#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Append a record (refused if its id exists: records are never overwritten).
    async fn append(&self, record: &AuditRecord) -> Result<(), StoreError>;
    /// Newest first; `limit` 0 means 100.
    async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, StoreError>;
}

fn limit_or_default(limit: usize) -> usize {
    if limit == 0 {
        DEFAULT_LIMIT
    } else {
        limit
    }
}

// ---------------------------------------------------------------------------
// Embedded

/// `audit.sqlite` in the store directory: one row per record, the record as JSON.
#[derive(Clone)]
pub struct EmbeddedAuditLog {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for EmbeddedAuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedAuditLog").finish_non_exhaustive()
    }
}

fn sqlite_err(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("audit log: {e}"))
}

impl EmbeddedAuditLog {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
        })?;
        let conn = Connection::open(dir.join(AUDIT_FILE)).map_err(sqlite_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sqlite_err)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS audit (
                 id     TEXT PRIMARY KEY NOT NULL,
                 at_ms  INTEGER NOT NULL,
                 record TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS audit_by_time ON audit(at_ms);",
        )
        .map_err(sqlite_err)?;
        Ok(EmbeddedAuditLog {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let conn = conn
                .lock()
                .map_err(|_| StoreError::Unavailable("audit log: poisoned lock".into()))?;
            work(&conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("audit log task failed: {e}")))?
    }
}

#[async_trait]
impl AuditLog for EmbeddedAuditLog {
    async fn append(&self, record: &AuditRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(record)
            .map_err(|e| StoreError::Unavailable(format!("audit record: {e}")))?;
        let (id, at_ms) = (record.id.clone(), record.at_ms);
        self.with(move |conn| {
            // Plain INSERT: a duplicate id fails instead of overwriting.
            conn.execute(
                "INSERT INTO audit (id, at_ms, record) VALUES (?1, ?2, ?3)",
                params![id, at_ms, json],
            )
            .map_err(sqlite_err)?;
            Ok(())
        })
        .await
    }

    async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        let limit = i64::try_from(limit_or_default(limit)).unwrap_or(i64::MAX);
        self.with(move |conn| {
            let mut stmt = conn
                .prepare("SELECT record FROM audit ORDER BY at_ms DESC, id DESC LIMIT ?1")
                .map_err(sqlite_err)?;
            let rows = stmt
                .query_map([limit], |r| r.get::<_, String>(0))
                .map_err(sqlite_err)?;
            let mut out = Vec::new();
            for row in rows {
                let text = row.map_err(sqlite_err)?;
                out.push(
                    serde_json::from_str(&text)
                        .map_err(|e| StoreError::Corrupt(format!("audit record: {e}")))?,
                );
            }
            Ok(out)
        })
        .await
    }
}

// ---------------------------------------------------------------------------
// DynamoDB

/// Hash key: one constant partition (the audit log is small and read in time order).
const PK: &str = "pk";
/// Range key: `<at_ms, 13 digits>-<random>` = the record id.
const SK: &str = "sk";
const PARTITION: &str = "audit";
const RECORD: &str = "record";

/// Audit records in DynamoDB: `pk = "audit"`, `sk = id`, the record as JSON.
#[derive(Debug, Clone)]
pub struct DynamoAuditLog {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl DynamoAuditLog {
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        DynamoAuditLog {
            client,
            table: table.into(),
        }
    }

    /// Table from `EINMAL_AUDIT_TABLE`; the client from the process's one SDK config.
    pub fn from_sdk_config(sdk_config: &aws_config::SdkConfig) -> Result<Self, AwsSetupError> {
        let table = std::env::var(AUDIT_TABLE_ENV)
            .ok()
            .filter(|t| !t.is_empty())
            .ok_or(AwsSetupError::MissingEnv(AUDIT_TABLE_ENV))?;
        Ok(Self::new(aws_sdk_dynamodb::Client::new(sdk_config), table))
    }
}

/// Create the audit table (idempotent).
pub async fn create_audit_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), AwsSetupError> {
    let bad = |e: aws_sdk_dynamodb::error::BuildError| {
        AwsSetupError::Resource(format!("table {table}: {e}"))
    };
    let attribute = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(bad)
    };
    let key = |name: &str, key_type: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(key_type)
            .build()
            .map_err(bad)
    };
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(attribute(PK)?)
        .attribute_definitions(attribute(SK)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .key_schema(key(SK, KeyType::Range)?)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) =>
        {
            Ok(())
        }
        Err(e) => Err(AwsSetupError::Resource(describe(
            "DynamoDB CreateTable",
            &e,
        ))),
    }
}

#[async_trait]
impl AuditLog for DynamoAuditLog {
    async fn append(&self, record: &AuditRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(record)
            .map_err(|e| StoreError::Unavailable(format!("audit record: {e}")))?;
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(PK, AttributeValue::S(PARTITION.into()))
            .item(SK, AttributeValue::S(record.id.clone()))
            .item(RECORD, AttributeValue::S(json))
            .condition_expression("attribute_not_exists(#sk)")
            .expression_attribute_names("#sk", SK)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(PutItemError::is_conditional_check_failed_exception) =>
            {
                Err(StoreError::Unavailable(format!(
                    "audit record {} exists (append-only)",
                    record.id
                )))
            }
            Err(e) => Err(StoreError::Unavailable(describe("DynamoDB PutItem", &e))),
        }
    }

    async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        let limit = limit_or_default(limit);
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("#pk = :pk")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":pk", AttributeValue::S(PARTITION.into()))
                .scan_index_forward(false)
                .consistent_read(true)
                .limit(i32::try_from(limit - out.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(describe("DynamoDB Query", &e)))?;
            for item in page.items.unwrap_or_default() {
                let text = item
                    .get(RECORD)
                    .and_then(|v| v.as_s().ok())
                    .ok_or_else(|| StoreError::Corrupt("audit item without record".into()))?;
                out.push(
                    serde_json::from_str(text)
                        .map_err(|e| StoreError::Corrupt(format!("audit record: {e}")))?,
                );
            }
            start = page.last_evaluated_key;
            if start.is_none() || out.len() >= limit {
                break;
            }
        }
        out.truncate(limit);
        Ok(out)
    }
}
