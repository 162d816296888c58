//! [`AuditLog`] on DynamoDB: the audit log of manual actions in its own table
//! (`EINMAL_AUDIT_TABLE`), append-only by a conditional put.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, BillingMode, KeyType, ScalarAttributeType};

use super::error::describe;
use super::setup::{created_or_existing, key_attribute, key_element};
use super::AwsSetupError;
use crate::audit::{limit_or_default, AuditLog, AuditRecord};
use crate::ports::StoreError;

/// Names the DynamoDB audit table.
pub const AUDIT_TABLE_ENV: &str = "EINMAL_AUDIT_TABLE";
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

    /// The audit log when `EINMAL_AUDIT_TABLE` is set; `None` (not audited) otherwise.
    pub fn from_sdk_config_if_configured(
        sdk_config: &aws_config::SdkConfig,
    ) -> Result<Option<Self>, AwsSetupError> {
        if std::env::var(AUDIT_TABLE_ENV).is_ok_and(|t| !t.is_empty()) {
            Self::from_sdk_config(sdk_config).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Create the audit table (idempotent).
pub async fn create_audit_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), AwsSetupError> {
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(key_attribute(table, PK, ScalarAttributeType::S)?)
        .attribute_definitions(key_attribute(table, SK, ScalarAttributeType::S)?)
        .key_schema(key_element(table, PK, KeyType::Hash)?)
        .key_schema(key_element(table, SK, KeyType::Range)?)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    created_or_existing(created).map(|_| ())
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
