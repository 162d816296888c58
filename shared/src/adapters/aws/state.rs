//! DynamoDB [`StateStore`]: one item per business record, in its own table
//! (`EINMAL_STATE_TABLE`).
//!
//! # Round trips (each is paid for)
//!
//! - `load`: one call. One key = GetItem (ConsistentRead); several = one BatchGetItem
//!   (ConsistentRead) for up to 100 distinct keys. Only keys DynamoDB left
//!   unprocessed (throttling, 16 MB response cap) cost further calls, with backoff.
//!   Unlike the embedded store, a BatchGetItem is not a snapshot across keys: each
//!   record is strongly consistent on its own, and the version guards of the commit
//!   catch anything that changed in between.
//! - `commit`: one call. One write = a conditional PutItem (the cheap path: a
//!   transaction costs twice the write units); several = one TransactWriteItems of
//!   conditional Puts, all or nothing, with a fresh ClientRequestToken so that an SDK
//!   retry of a transaction that did commit is answered as committed. Condition:
//!   `attribute_not_exists(pk)` for expected version 0, else `version = :expected`.
//!   Records the decision only read ([`ReadCheck`]) join the same transaction as
//!   `ConditionCheck`s with the same condition (each costs 2 WRU per started KB of the
//!   checked item, like a transactional write); a single write with read checks is
//!   therefore a transaction, not a PutItem.
//! - `list`: a Query on the `by_tenant_kind` GSI, never a Scan. GSIs are eventually
//!   consistent, which is fine for operator views; decisions always `load`.
//!
//! # Outcomes
//!
//! A failed condition is `Conflict`, matched on the SDK's service-error variants
//! (`ConditionalCheckFailedException`; for transactions the cancellation reason codes
//! `ConditionalCheckFailed` and `TransactionConflict`), never on message text. A write
//! that collided with a concurrent transaction (`TransactionConflictException`,
//! `ReplicatedWriteConflictException`) is a `Conflict` as well: reload and decide again.
//! A write DynamoDB validates as impossible (`ValidationException`, e.g. "Item size
//! has exceeded the maximum allowed size"; in a transaction the cancellation reason
//! `ValidationError`) can never succeed and is `StoreError::Rejected`: the event is
//! dead-lettered at once with DynamoDB's reason. Everything else (throttling,
//! timeouts, missing table, access denied) is `StoreError::Unavailable` with the class
//! from the shared error classifier: those heal.
//!
//! A commit of more than [`MAX_TRANSACTION_ITEMS`] writes and checks cannot be one
//! transaction and is refused as `StoreError::Rejected` before any call (splitting it
//! would break atomicity).
//!
//! # Item
//!
//! `pk` (S, `tenant#kind#id`), `tenant_kind` (S, `tenant#kind`, the GSI hash key),
//! `tenant`, `kind`, `id` (S), `version` (N), `data` (S, JSON text), `applied` (SS,
//! the effect keys; omitted when empty because DynamoDB sets cannot be empty),
//! `updated_at_ms` (N).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::batch_get::{batch_get, batch_keys, BATCH_GET_MAX};
use super::error::describe;
use super::setup::{created_or_existing, key_attribute, key_element};
use super::AwsSetupError;
use crate::domain::state::{
    check_writes, CommitOutcome, ReadCheck, StateKey, StateRecord, StateStore, StateWrite,
};
use crate::ports::StoreError;
use crate::time::now_millis;
use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, ConditionCheck, GlobalSecondaryIndex, IndexStatus, KeyType,
    KeysAndAttributes, Projection, ProjectionType, Put, ScalarAttributeType, TableStatus,
    TransactWriteItem,
};

/// State table name.
pub const STATE_TABLE_ENV: &str = "EINMAL_STATE_TABLE";
/// The GSI `list` queries: hash `tenant_kind`, range `pk`, all attributes projected.
pub const STATE_INDEX: &str = "by_tenant_kind";
/// The error code of a request DynamoDB validates as impossible (item too large, ...).
const VALIDATION_EXCEPTION: &str = "ValidationException";
/// The same inside a transaction: the cancellation reason of the offending item.
const VALIDATION_ERROR_REASON: &str = "ValidationError";

/// DynamoDB's limit of items in one TransactWriteItems.
pub const MAX_TRANSACTION_ITEMS: usize = 100;
/// `list` with `limit == 0` returns this many records (as the inbox listing does).
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// A new PAY_PER_REQUEST table (and its GSI) is usually ACTIVE within seconds.
const TABLE_ACTIVE_TIMEOUT: Duration = Duration::from_secs(300);

const PK: &str = "pk";
const TENANT_KIND: &str = "tenant_kind";
const TENANT: &str = "tenant";
const KIND: &str = "kind";
const ID: &str = "id";
const VERSION: &str = "version";
const DATA: &str = "data";
const APPLIED: &str = "applied";
const UPDATED_AT_MS: &str = "updated_at_ms";

type Item = HashMap<String, AttributeValue>;

/// Business records on DynamoDB. Cheap to clone (the SDK client is an `Arc` inside).
#[derive(Debug, Clone)]
pub struct DynamoStateStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl DynamoStateStore {
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        DynamoStateStore {
            client,
            table: table.into(),
        }
    }

    /// Table from `EINMAL_STATE_TABLE`; the client from the process's one SDK config.
    pub fn from_sdk_config(sdk_config: &aws_config::SdkConfig) -> Result<Self, AwsSetupError> {
        let table = std::env::var(STATE_TABLE_ENV)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .ok_or(AwsSetupError::MissingEnv(STATE_TABLE_ENV))?;
        Ok(Self::new(aws_sdk_dynamodb::Client::new(sdk_config), table))
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.client
    }

    async fn get_one(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, AttributeValue::S(pk.to_string()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB GetItem", &e)))?;
        Ok(out.item)
    }

    /// One consistent BatchGetItem for up to 100 distinct keys (unprocessed keys retried).
    async fn get_batch(&self, pks: &[String], found: &mut Vec<Item>) -> Result<(), StoreError> {
        let wanted = KeysAndAttributes::builder()
            .set_keys(Some(batch_keys(pks)))
            .consistent_read(true)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("DynamoDB BatchGetItem: {e}")))?;
        found.extend(batch_get(&self.client, &self.table, wanted).await?);
        Ok(())
    }

    async fn put_one(&self, w: &StateWrite) -> Result<CommitOutcome, StoreError> {
        let (condition, names, values) = condition(w.expected_version);
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(&w.record, now_millis())))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(values)
            .send()
            .await;
        match result {
            Ok(_) => Ok(CommitOutcome::Committed),
            Err(e) => match e.as_service_error() {
                Some(
                    PutItemError::ConditionalCheckFailedException(_)
                    | PutItemError::TransactionConflictException(_)
                    | PutItemError::ReplicatedWriteConflictException(_),
                ) => Ok(CommitOutcome::Conflict),
                _ => Err(write_failure("DynamoDB PutItem", &e)),
            },
        }
    }

    async fn transact(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<CommitOutcome, StoreError> {
        let now = now_millis();
        let unbuilt = |e: aws_sdk_dynamodb::error::BuildError| {
            StoreError::Unavailable(format!("DynamoDB TransactWriteItems: {e}"))
        };
        let mut items = Vec::with_capacity(writes.len());
        for w in writes {
            let (condition, names, values) = condition(w.expected_version);
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(encode(&w.record, now)))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .build()
                .map_err(unbuilt)?;
            items.push(TransactWriteItem::builder().put(put).build());
        }
        for r in reads {
            let (condition, names, values) = condition(r.version);
            let check = ConditionCheck::builder()
                .table_name(&self.table)
                .key(PK, AttributeValue::S(r.key.pk()))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .build()
                .map_err(unbuilt)?;
            items.push(TransactWriteItem::builder().condition_check(check).build());
        }
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(request_token())
            .send()
            .await;
        let e = match result {
            Ok(_) => return Ok(CommitOutcome::Committed),
            Err(e) => e,
        };
        if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            e.as_service_error()
        {
            // One reason per item, in request order; "None" for the items that were fine.
            let codes: Vec<&str> = cancelled
                .cancellation_reasons()
                .iter()
                .filter_map(|r| r.code())
                .collect();
            if codes
                .iter()
                .any(|c| matches!(*c, "ConditionalCheckFailed" | "TransactionConflict"))
            {
                return Ok(CommitOutcome::Conflict);
            }
            let message = format!(
                "{} [reasons: {}]",
                describe("DynamoDB TransactWriteItems", &e),
                codes.join(", ")
            );
            if codes.contains(&VALIDATION_ERROR_REASON) {
                return Err(StoreError::Rejected(message));
            }
            return Err(StoreError::Unavailable(message));
        }
        Err(write_failure("DynamoDB TransactWriteItems", &e))
    }
}

/// A failed write: `Rejected` when DynamoDB validated it as impossible (matched on the
/// service error's code: `ValidationException` is not a modelled variant of the SDK),
/// else `Unavailable`.
fn write_failure<E>(
    call: &str,
    e: &SdkError<E, aws_sdk_dynamodb::config::http::HttpResponse>,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let validation =
        matches!(e, SdkError::ServiceError(se) if se.err().code() == Some(VALIDATION_EXCEPTION));
    if validation {
        StoreError::Rejected(describe(call, e))
    } else {
        StoreError::Unavailable(describe(call, e))
    }
}

/// 32 hex digits (DynamoDB allows up to 36 characters).
fn request_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

type Names = HashMap<String, String>;
type Values = Option<HashMap<String, AttributeValue>>;

/// The version guard of one write.
fn condition(expected_version: u64) -> (&'static str, Names, Values) {
    if expected_version == 0 {
        (
            "attribute_not_exists(#pk)",
            HashMap::from([("#pk".to_string(), PK.to_string())]),
            None,
        )
    } else {
        (
            "#version = :expected",
            HashMap::from([("#version".to_string(), VERSION.to_string())]),
            Some(HashMap::from([(
                ":expected".to_string(),
                AttributeValue::N(expected_version.to_string()),
            )])),
        )
    }
}

fn tenant_kind(tenant: &str, kind: &str) -> String {
    format!("{tenant}#{kind}")
}

fn encode(record: &StateRecord, now_ms: i64) -> Item {
    let key = &record.key;
    let s = |v: &str| AttributeValue::S(v.to_string());
    let mut m = Item::with_capacity(9);
    m.insert(PK.into(), AttributeValue::S(key.pk()));
    m.insert(
        TENANT_KIND.into(),
        AttributeValue::S(tenant_kind(&key.tenant, &key.kind)),
    );
    m.insert(TENANT.into(), s(&key.tenant));
    m.insert(KIND.into(), s(&key.kind));
    m.insert(ID.into(), s(&key.id));
    m.insert(
        VERSION.into(),
        AttributeValue::N(record.version.to_string()),
    );
    // `Value`'s Display is its compact JSON text and cannot fail.
    m.insert(DATA.into(), AttributeValue::S(record.data.to_string()));
    if !record.applied.is_empty() {
        m.insert(
            APPLIED.into(),
            AttributeValue::Ss(record.applied.iter().cloned().collect()),
        );
    }
    m.insert(UPDATED_AT_MS.into(), AttributeValue::N(now_ms.to_string()));
    m
}

/// Decode a stored item. Errors name the key and the attribute, never values.
fn decode(mut m: Item) -> Result<StateRecord, StoreError> {
    let pk = match m.remove(PK) {
        Some(AttributeValue::S(pk)) => pk,
        _ => return Err(StoreError::Corrupt("state item without a pk".into())),
    };
    let corrupt = |what: &str| StoreError::Corrupt(format!("state {pk}: {what}"));
    let mut string = |name: &str| match m.remove(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(corrupt(&format!("{name} is missing or not a string"))),
    };
    let key = StateKey {
        tenant: string(TENANT)?,
        kind: string(KIND)?,
        id: string(ID)?,
    };
    let data = string(DATA)?;
    if key.pk() != pk {
        return Err(corrupt("tenant, kind and id do not match the key"));
    }
    let version = match m.remove(VERSION) {
        Some(AttributeValue::N(n)) => n
            .parse::<u64>()
            .map_err(|_| corrupt("version is not a whole number"))?,
        _ => return Err(corrupt("version is missing or not a number")),
    };
    let data = serde_json::from_str(&data).map_err(|_| corrupt("data is not JSON"))?;
    let applied: BTreeSet<String> = match m.remove(APPLIED) {
        None => BTreeSet::new(),
        Some(AttributeValue::Ss(keys)) => keys.into_iter().collect(),
        Some(_) => return Err(corrupt("applied is not a string set")),
    };
    Ok(StateRecord {
        key,
        version,
        data,
        applied,
    })
}

#[async_trait]
impl StateStore for DynamoStateStore {
    /// Duplicate keys are read once and returned at every position they were asked for.
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        let mut seen = HashSet::with_capacity(keys.len());
        let pks: Vec<String> = keys
            .iter()
            .map(StateKey::pk)
            .filter(|pk| seen.insert(pk.clone()))
            .collect();
        let mut items = Vec::with_capacity(pks.len());
        match pks.as_slice() {
            [] => return Ok(Vec::new()),
            [pk] => items.extend(self.get_one(pk).await?),
            _ => {
                for chunk in pks.chunks(BATCH_GET_MAX) {
                    self.get_batch(chunk, &mut items).await?;
                }
            }
        }
        let mut found: HashMap<String, StateRecord> = HashMap::with_capacity(items.len());
        for item in items {
            let record = decode(item)?;
            found.insert(record.key.pk(), record);
        }
        Ok(keys
            .iter()
            .map(|key| match found.get(&key.pk()) {
                // `decode` checked that the stored tenant/kind/id spell this pk.
                Some(record) if record.key == *key => Ok(record.clone()),
                Some(_) => Err(StoreError::Corrupt(format!(
                    "state {}: stored under a different tenant/kind/id",
                    key.pk()
                ))),
                None => Ok(StateRecord::missing(key.clone())),
            })
            .collect::<Result<_, _>>()?)
    }

    async fn commit(&self, writes: &[StateWrite]) -> Result<CommitOutcome, StoreError> {
        self.commit_checked(writes, &[]).await
    }

    async fn commit_checked(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<CommitOutcome, StoreError> {
        let items = writes.len() + reads.len();
        if items > MAX_TRANSACTION_ITEMS {
            return Err(StoreError::Rejected(format!(
                "invalid commit: a transaction of {items} items exceeds DynamoDB's {MAX_TRANSACTION_ITEMS}"
            )));
        }
        check_writes(writes, reads)?;
        match (writes, reads) {
            // Checks without writes change nothing, so there is nothing to make atomic.
            ([], _) => Ok(CommitOutcome::Committed),
            ([one], []) => self.put_one(one).await,
            (several, reads) => self.transact(several, reads).await,
        }
    }

    /// In key (`pk`) order, from the GSI (eventually consistent); `limit == 0` means
    /// [`DEFAULT_LIST_LIMIT`]. Pages until `limit` records are found.
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError> {
        let limit = crate::ports::limit_or(limit, DEFAULT_LIST_LIMIT);
        let request = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(STATE_INDEX)
            .key_condition_expression("#tk = :tk")
            // `tenant#kind` could be spelled by two different pairs if a kind contained
            // '#'; the filter makes the listing exact at no extra read cost.
            .filter_expression("#tenant = :tenant AND #kind = :kind")
            .expression_attribute_names("#tk", TENANT_KIND)
            .expression_attribute_names("#tenant", TENANT)
            .expression_attribute_names("#kind", KIND)
            .expression_attribute_values(":tk", AttributeValue::S(tenant_kind(tenant, kind)))
            .expression_attribute_values(":tenant", AttributeValue::S(tenant.to_string()))
            .expression_attribute_values(":kind", AttributeValue::S(kind.to_string()))
            .limit(i32::try_from(limit).unwrap_or(i32::MAX));
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = request
                .clone()
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(describe("DynamoDB Query", &e)))?;
            for item in page.items.unwrap_or_default() {
                out.push(decode(item)?);
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

/// Create the state table (hash key `pk`, on-demand) with the [`STATE_INDEX`] GSI
/// (hash `tenant_kind`, range `pk`, projection ALL), and wait until table and index
/// are ACTIVE. An existing table is accepted if it has the index, so this is
/// idempotent. Production tables come from the SAM template in `infra/`.
pub async fn create_state_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), AwsSetupError> {
    let bad = |e: aws_sdk_dynamodb::error::BuildError| {
        AwsSetupError::Resource(format!("table {table}: {e}"))
    };
    let attribute = |name: &str| key_attribute(table, name, ScalarAttributeType::S);
    let key = |name: &str, key_type: KeyType| key_element(table, name, key_type);
    let index = GlobalSecondaryIndex::builder()
        .index_name(STATE_INDEX)
        .key_schema(key(TENANT_KIND, KeyType::Hash)?)
        .key_schema(key(PK, KeyType::Range)?)
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .map_err(bad)?;
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(attribute(PK)?)
        .attribute_definitions(attribute(TENANT_KIND)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .global_secondary_indexes(index)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    created_or_existing(created)?;
    wait_active(client, table).await
}

/// Poll until the table and its index are ACTIVE; a table without the index is an error.
async fn wait_active(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<(), AwsSetupError> {
    let started = Instant::now();
    loop {
        let out = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| AwsSetupError::Resource(describe("DynamoDB DescribeTable", &e)))?;
        let description = out.table();
        let table_active = description.and_then(|t| t.table_status()) == Some(&TableStatus::Active);
        let index = description.and_then(|t| {
            t.global_secondary_indexes()
                .iter()
                .find(|i| i.index_name() == Some(STATE_INDEX))
        });
        if table_active {
            match index {
                None => {
                    return Err(AwsSetupError::Resource(format!(
                        "table {table} exists without the {STATE_INDEX} index"
                    )))
                }
                // Servers that do not report index status (moto) count as active.
                Some(i) if matches!(i.index_status(), None | Some(IndexStatus::Active)) => {
                    return Ok(())
                }
                Some(_) => {}
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(applied: &[&str]) -> StateRecord {
        StateRecord {
            key: StateKey::new("shop-1", "order", "1001"),
            version: 3,
            data: json!({"status": "paid", "total": 1999}),
            applied: applied.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn items_round_trip_and_empty_applied_is_omitted() {
        for applied in [&[][..], &["shop-1#1001#pay#1", "shop-1#1001#ship#1"][..]] {
            let r = record(applied);
            let item = encode(&r, 42);
            assert_eq!(item.contains_key(APPLIED), !applied.is_empty());
            assert_eq!(item[TENANT_KIND], AttributeValue::S("shop-1#order".into()));
            assert_eq!(item[PK], AttributeValue::S("shop-1#order#1001".into()));
            assert_eq!(decode(item).unwrap(), r);
        }
    }

    #[test]
    fn undecodable_items_are_corrupt_and_name_no_data() {
        let mut item = encode(&record(&[]), 1);
        item.insert(DATA.into(), AttributeValue::S("{secret".into()));
        let err = decode(item).unwrap_err().to_string();
        assert!(
            err.contains("shop-1#order#1001") && !err.contains("secret"),
            "{err}"
        );

        let mut item = encode(&record(&[]), 1);
        item.insert(VERSION.into(), AttributeValue::N("-1".into()));
        assert!(matches!(decode(item), Err(StoreError::Corrupt(_))));

        let mut item = encode(&record(&[]), 1);
        item.insert(APPLIED.into(), AttributeValue::S("x".into()));
        assert!(matches!(decode(item), Err(StoreError::Corrupt(_))));

        let mut item = encode(&record(&[]), 1);
        item.insert(ID.into(), AttributeValue::S("other".into()));
        assert!(matches!(decode(item), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn conditions_guard_existence_or_version() {
        let (c, names, values) = condition(0);
        assert_eq!(c, "attribute_not_exists(#pk)");
        assert_eq!(names["#pk"], PK);
        assert!(values.is_none());
        let (c, names, values) = condition(7);
        assert_eq!(c, "#version = :expected");
        assert_eq!(names["#version"], VERSION);
        assert_eq!(values.unwrap()[":expected"], AttributeValue::N("7".into()));
    }

    #[test]
    fn request_tokens_fit_dynamodb() {
        assert!(request_token().len() <= 36);
    }
}
