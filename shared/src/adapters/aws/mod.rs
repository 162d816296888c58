//! AWS adapter: the inbox on DynamoDB, the work queue on SQS.
//!
//! One file per port: `inbox` (`Inbox`, `InboxProcessing`), `queue`, `sweep`, `hints`,
//! `certs` (`CertificateCache`, PayPal's verified certificates),
//! `replay`, `relay` (`InboxRelay`, with the ordering cursors in `cursor`), `state`
//! (the business records' `StateStore`), `audit`; the shared parts are
//! `item` (the inbox item's attributes), `batch_get`, `query` (paged index reads),
//! `waiting` (the waiters' index), `error` (SDK error classification) and `setup`
//! (tables, queues, config). `sinks` holds the destinations on SQS, EventBridge and
//! Lambda (the relay's `Sink`s).
//!
//! Round trips are paid for, so each port method is one call where possible:
//! `put_new` is a single conditional PutItem that returns the existing item on a
//! duplicate (`ReturnValuesOnConditionCheckFailure=ALL_OLD`), `send` one SendMessage.
//! Conditional failures are matched on the SDK's service error variants, never on
//! strings; every other failure is classified once in [`error`].
//!
//! The processor's inbox writes (`InboxProcessing`) are one UpdateItem each, with
//! the allowed transitions in the condition expression. Processing starts from the
//! item the SQS message carries (no claim; see `inbox.rs`); an explicit claim returns
//! the claimed item with `ReturnValues=ALL_NEW`, and on a failed condition the stored
//! item (`ReturnValuesOnConditionCheckFailure=ALL_OLD`), which tells a finished item
//! from one leased by a live worker without a second read. The body is in an item of
//! its own (`item.rs`), written once.

mod audit;
mod batch_get;
mod certs;
mod cursor;
pub(crate) mod error;
mod hints;
mod inbox;
mod item;
mod query;
mod queue;
mod relay;
mod relay_setup;
mod replay;
mod search;
mod setup;
pub mod sinks;
mod state;
mod sweep;
mod waiting;

use aws_sdk_dynamodb::types::AttributeValue;

pub use audit::{create_audit_table, DynamoAuditLog, AUDIT_TABLE_ENV};
pub use item::RELAY_INDEX_PROJECTION;
pub use queue::{decode_message_body, MAX_CARRIED_BYTES};
pub use relay_setup::{function_relay, relay_pass, RelayPass};
pub use setup::{
    config_source_from_env, create_all, create_queues, create_tables, fetch_ssm_references,
    load_config_from_ssm, load_config_from_ssm_scoped, load_config_with, parse_resolving, AwsNames,
    AwsSetupError, SsmConfigLoader, CONFIG_ENV, CONFIG_PARAMETER_ENV, DLQ_URL_ENV, QUEUE_URL_ENV,
    TABLE_ENV,
};
#[cfg(feature = "eventbridge")]
pub use sinks::EventBridgeSink;
#[cfg(feature = "lambda")]
pub use sinks::LambdaSink;
pub use sinks::{AwsSinkError, AwsSinkFactory, SqsSink, SINK_ACTIONS};
pub use state::{
    create_state_table, migrate_state_table, DynamoStateStore, Migrated, STATE_KEY_SCHEMA,
    STATE_TABLE_ENV,
};

use crate::envelope::InboxKey;

/// `list` with `limit == 0` returns this many items.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// DynamoDB inbox + SQS queue. Cheap to clone (the SDK clients are `Arc`s inside).
#[derive(Debug, Clone)]
pub struct AwsStore {
    dynamodb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
    table: String,
    queue_url: String,
    dlq_url: Option<String>,
}

impl AwsStore {
    pub fn new(
        dynamodb: aws_sdk_dynamodb::Client,
        sqs: aws_sdk_sqs::Client,
        names: AwsNames,
    ) -> Self {
        AwsStore {
            dynamodb,
            sqs,
            table: names.table,
            queue_url: names.queue_url,
            dlq_url: names.dlq_url,
        }
    }

    /// Clients for both services from one shared SDK config.
    pub fn from_sdk_config(sdk_config: &aws_config::SdkConfig, names: AwsNames) -> Self {
        Self::new(
            aws_sdk_dynamodb::Client::new(sdk_config),
            aws_sdk_sqs::Client::new(sdk_config),
            names,
        )
    }

    /// A Lambda's start: the resource names are checked first (a missing variable
    /// fails before any AWS lookup), then the one SDK config (one connection pool per
    /// service) that every client of the process shares, and the store on it.
    pub async fn from_env() -> Result<(aws_config::SdkConfig, Self), AwsSetupError> {
        let names = AwsNames::from_env()?;
        let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let store = Self::from_sdk_config(&sdk_config, names);
        Ok((sdk_config, store))
    }

    pub fn names(&self) -> AwsNames {
        AwsNames {
            table: self.table.clone(),
            queue_url: self.queue_url.clone(),
            dlq_url: self.dlq_url.clone(),
        }
    }

    pub fn dynamodb(&self) -> &aws_sdk_dynamodb::Client {
        &self.dynamodb
    }

    pub fn sqs(&self) -> &aws_sdk_sqs::Client {
        &self.sqs
    }

    fn key_attr(key: &InboxKey) -> AttributeValue {
        AttributeValue::S(key.as_str().to_string())
    }
}
