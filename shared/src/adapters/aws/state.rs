//! DynamoDB [`StateStore`]: one item per business record, in its own table
//! (`EINMAL_STATE_TABLE`), keyed by hash `tenant_kind` (`tenant#kind`) and range `id`.
//!
//! # Why no index
//!
//! `list` (operators, the reconciler, `einmal orders list`) needs the records of one
//! tenant and kind. Keyed this way, that is a Query on the table itself, and no
//! global secondary index repeats every record write (the previous layout, hash `pk`
//! plus a `by_tenant_kind` GSI projecting ALL, paid one index WRU per written record:
//! three on a Shopify order's commit). A KEYS_ONLY index would still pay the entry of
//! every new record, which is most commits. A busy tenant does not make one hot
//! partition: one item is at most 1,000 WRU/s anyway, and DynamoDB splits a hot item
//! collection by sort key (`id`) across partitions (no local index here forbids
//! that); the GSI had the same hash key and took every write too. Existing tables
//! are copied once into the new layout with `einmal-migrate-state`
//! ([`migrate_state_table`], README "Deploy on AWS").
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
//!   `attribute_not_exists(version)` for expected version 0, else
//!   `version = :expected`. Records the decision only read ([`ReadCheck`]) join the
//!   same transaction as `ConditionCheck`s with the same condition (each costs 2 WRU
//!   per started KB of the checked item, like a transactional write); a single write
//!   with read checks is therefore a transaction, not a PutItem.
//! - `list`: a Query on the table (`tenant_kind = :tk`), never a Scan; eventually
//!   consistent, which is fine for operator views; decisions always `load`.
//!
//! # Wait marks (who to wake, without asking)
//!
//! An event that must wait for a record first marks it ([`StateStore::mark_waited`]:
//! one UpdateItem setting `wait_mark`; on a record that does not exist yet it creates
//! a mark-only item with a TTL, which `load` and `list` treat as no record and a
//! create's condition accepts). A commit replaces the whole item, so it removes the
//! mark, and reports it ([`StateStore::commit_waking`], [`Waiters::Marked`]): a
//! PutItem returns the replaced item (`ALL_OLD`, no read units); a transaction's puts
//! also require no mark and are retried without that requirement for the items that
//! carry one. The processor looks up waiters only for marked records, so a commit
//! nobody waits for costs no waiters Query. Why no wake is lost: the mark is set
//! before the event parks and the event re-reads the record after parking; a commit
//! after the mark sees it (the mark stays until a commit removes it), and a commit
//! before the re-read changes the version the re-read compares.
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
//! `tenant_kind` (S, `tenant#kind`, hash key), `id` (S, range key), `tenant`, `kind`
//! (S), `version` (N), `data` (S, JSON text), `applied` (SS, the effect keys; omitted
//! when empty because DynamoDB sets cannot be empty), `updated_at_ms` (N). A
//! mark-only item: the key, `wait_mark` (N, ms) and `expires_at` (N, TTL seconds).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::batch_get::{batch_get, BATCH_GET_MAX};
use super::error::describe;
use super::setup::{created_or_existing, key_attribute, key_element};
use super::AwsSetupError;
use crate::domain::state::{
    check_writes, Commit, CommitAnswer, CommitOutcome, ReadCheck, StateKey, StateRecord,
    StateStore, StateWrite, Waiters,
};
use crate::ports::StoreError;
use crate::time::now_millis;
use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, ConditionCheck, KeyType, KeysAndAttributes, Put, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TransactWriteItem,
};

/// State table name.
pub const STATE_TABLE_ENV: &str = "EINMAL_STATE_TABLE";
/// The error code of a request DynamoDB validates as impossible (item too large, ...).
const VALIDATION_EXCEPTION: &str = "ValidationException";
/// The same inside a transaction: the cancellation reason of the offending item.
const VALIDATION_ERROR_REASON: &str = "ValidationError";

/// DynamoDB's limit of items in one TransactWriteItems.
pub const MAX_TRANSACTION_ITEMS: usize = 100;
/// `list` with `limit == 0` returns this many records (as the inbox listing does).
pub const DEFAULT_LIST_LIMIT: usize = 100;

const TENANT_KIND: &str = "tenant_kind";
const TENANT: &str = "tenant";
const KIND: &str = "kind";
const ID: &str = "id";
const VERSION: &str = "version";
const DATA: &str = "data";
const APPLIED: &str = "applied";
const UPDATED_AT_MS: &str = "updated_at_ms";
/// Set (to the time, Unix ms) by an event about to park on the record; removed by the
/// next commit, which replaces the whole item and so learns it had waiters.
const WAIT_MARK: &str = "wait_mark";
/// TTL (Unix seconds) of a mark-only item, the mark of a record that does not exist.
const EXPIRES_AT: &str = "expires_at";
/// Tries of a commit whose items parkers keep marking, and of a mark whose record
/// keeps appearing and vanishing.
const MARK_TRIES: usize = 3;

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

    async fn get_one(&self, key: &StateKey) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item_key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB GetItem", &e)))?;
        Ok(out.item)
    }

    /// One consistent BatchGetItem for up to 100 distinct keys (unprocessed keys retried).
    async fn get_batch(&self, keys: &[&StateKey], found: &mut Vec<Item>) -> Result<(), StoreError> {
        let wanted = KeysAndAttributes::builder()
            .set_keys(Some(keys.iter().map(|k| item_key(k)).collect()))
            .consistent_read(true)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("DynamoDB BatchGetItem: {e}")))?;
        found.extend(batch_get(&self.client, &self.table, wanted).await?);
        Ok(())
    }

    /// One conditional PutItem. It returns the replaced item (`ALL_OLD`: no read units,
    /// only response bytes), so the commit learns whether it removed a wait mark.
    async fn put_one(&self, w: &StateWrite) -> Result<(CommitOutcome, Waiters), StoreError> {
        let (condition, names, values) = condition(w.expected_version);
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(&w.record, now_millis())))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(values)
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let marked = out
                    .attributes
                    .is_some_and(|old| old.contains_key(WAIT_MARK));
                let keys = if marked {
                    vec![w.record.key.clone()]
                } else {
                    Vec::new()
                };
                Ok((CommitOutcome::Committed, Waiters::Marked(keys)))
            }
            Err(e) => match e.as_service_error() {
                Some(
                    PutItemError::ConditionalCheckFailedException(_)
                    | PutItemError::TransactionConflictException(_)
                    | PutItemError::ReplicatedWriteConflictException(_),
                ) => Ok((CommitOutcome::Conflict, Waiters::Marked(Vec::new()))),
                _ => Err(write_failure("DynamoDB PutItem", &e)),
            },
        }
    }

    /// One TransactWriteItems. A transaction returns nothing on success, so its puts
    /// also require the item to carry no wait mark: a put refused only for a mark
    /// (the item DynamoDB returns on the failed condition has the expected version) is
    /// sent again without that requirement and reported as marked. A parker marking
    /// between two tries costs another try, at most [`MARK_TRIES`]; then `Conflict`
    /// (the processor reloads and decides again).
    async fn transact(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<(CommitOutcome, Waiters), StoreError> {
        let mut marked: HashSet<usize> = HashSet::new();
        for _ in 0..MARK_TRIES {
            match self.transact_once(writes, reads, &marked).await? {
                Transacted::Committed => {
                    let keys = marked.iter().map(|&i| writes[i].record.key.clone());
                    return Ok((CommitOutcome::Committed, Waiters::Marked(keys.collect())));
                }
                Transacted::Conflict => {
                    return Ok((CommitOutcome::Conflict, Waiters::Marked(Vec::new())))
                }
                Transacted::Marked(more) => marked.extend(more),
            }
        }
        Ok((CommitOutcome::Conflict, Waiters::Marked(Vec::new())))
    }

    async fn transact_once(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
        marked: &HashSet<usize>,
    ) -> Result<Transacted, StoreError> {
        let now = now_millis();
        let unbuilt = |e: aws_sdk_dynamodb::error::BuildError| {
            StoreError::Unavailable(format!("DynamoDB TransactWriteItems: {e}"))
        };
        let mut items = Vec::with_capacity(writes.len() + reads.len());
        for (i, w) in writes.iter().enumerate() {
            let (condition, mut names, values) = condition(w.expected_version);
            let condition = if marked.contains(&i) {
                condition.to_string()
            } else {
                names.insert("#mark".to_string(), WAIT_MARK.to_string());
                format!("({condition}) AND attribute_not_exists(#mark)")
            };
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(encode(&w.record, now)))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build()
                .map_err(unbuilt)?;
            items.push(TransactWriteItem::builder().put(put).build());
        }
        for r in reads {
            let (condition, names, values) = condition(r.version);
            let check = ConditionCheck::builder()
                .table_name(&self.table)
                .set_key(Some(item_key(&r.key)))
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
            Ok(_) => return Ok(Transacted::Committed),
            Err(e) => e,
        };
        if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            e.as_service_error()
        {
            // One reason per item, in request order; "None" for the items that were fine.
            let reasons = cancelled.cancellation_reasons();
            let codes: Vec<&str> = reasons.iter().filter_map(|r| r.code()).collect();
            let mut only_marks = Vec::new();
            let mut conflict = false;
            for (i, reason) in reasons.iter().enumerate() {
                match reason.code() {
                    Some("ConditionalCheckFailed") => {
                        let expected = writes.get(i).map(|w| w.expected_version);
                        match (expected, reason.item()) {
                            (Some(expected), Some(old)) if marked_at(old, expected) => {
                                only_marks.push(i)
                            }
                            _ => conflict = true,
                        }
                    }
                    Some("TransactionConflict") => conflict = true,
                    _ => {}
                }
            }
            if conflict {
                return Ok(Transacted::Conflict);
            }
            if !only_marks.is_empty() {
                return Ok(Transacted::Marked(only_marks));
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

    /// One UpdateItem: set the wait mark on a record that exists (condition: it has a
    /// version), else create the mark-only item with a TTL, so a mark for a record that
    /// never comes does not stay forever. A record created between the two tries costs
    /// a third; more than [`MARK_TRIES`] is `Unavailable` (retried like any).
    async fn commit_one(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<(CommitOutcome, Waiters), StoreError> {
        let items = writes.len() + reads.len();
        if items > MAX_TRANSACTION_ITEMS {
            return Err(StoreError::Rejected(format!(
                "invalid commit: a transaction of {items} items exceeds DynamoDB's {MAX_TRANSACTION_ITEMS}"
            )));
        }
        check_writes(writes, reads)?;
        match (writes, reads) {
            // Checks without writes change nothing, so there is nothing to make atomic.
            ([], _) => Ok((CommitOutcome::Committed, Waiters::Marked(Vec::new()))),
            ([one], []) => self.put_one(one).await,
            (several, reads) => self.transact(several, reads).await,
        }
    }

    async fn mark(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError> {
        let now = AttributeValue::N(now_millis().to_string());
        let expires = AttributeValue::N(keep_until_ms.div_euclid(1000).to_string());
        for attempt in 0..MARK_TRIES {
            // Waiting is mostly for a record that does not exist yet: try that first.
            let exists = attempt % 2 == 1;
            let update = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(item_key(key)))
                .expression_attribute_names("#mark", WAIT_MARK)
                .expression_attribute_names("#version", VERSION)
                .expression_attribute_values(":now", now.clone());
            let update = if exists {
                update
                    .update_expression("SET #mark = :now")
                    .condition_expression("attribute_exists(#version)")
            } else {
                // Only on a mark-only item: a TTL on a record would delete it.
                update
                    .update_expression("SET #mark = :now, #expires = :expires")
                    .condition_expression("attribute_not_exists(#version)")
                    .expression_attribute_names("#expires", EXPIRES_AT)
                    .expression_attribute_values(":expires", expires.clone())
            };
            match update.send().await {
                Ok(_) => return Ok(()),
                Err(e) => match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(_)) => {}
                    _ => {
                        return Err(StoreError::Unavailable(describe(
                            "DynamoDB UpdateItem (wait mark)",
                            &e,
                        )))
                    }
                },
            }
        }
        Err(StoreError::Unavailable(format!(
            "state {}: the record appeared and vanished while being marked",
            key.pk()
        )))
    }
}

/// One try of a transaction.
enum Transacted {
    Committed,
    Conflict,
    /// These writes (indexes) failed only because their items carry a wait mark.
    Marked(Vec<usize>),
}

/// Whether `old` (returned by a failed condition) is at `expected` and carries a wait
/// mark: the condition failed for the mark alone.
fn marked_at(old: &Item, expected: u64) -> bool {
    let version = match old.get(VERSION) {
        None => Some(0),
        Some(AttributeValue::N(n)) => n.parse::<u64>().ok(),
        Some(_) => None,
    };
    old.contains_key(WAIT_MARK) && version == Some(expected)
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
        // No record: a mark-only item (an event waits for this record) counts as none.
        (
            "attribute_not_exists(#version)",
            HashMap::from([("#version".to_string(), VERSION.to_string())]),
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

/// The table key of a record: hash `tenant_kind`, range `id`.
fn item_key(key: &StateKey) -> Item {
    Item::from([
        (
            TENANT_KIND.to_string(),
            AttributeValue::S(tenant_kind(&key.tenant, &key.kind)),
        ),
        (ID.to_string(), AttributeValue::S(key.id.clone())),
    ])
}

fn encode(record: &StateRecord, now_ms: i64) -> Item {
    let key = &record.key;
    let s = |v: &str| AttributeValue::S(v.to_string());
    let mut m = Item::with_capacity(9);
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
    let (tk, id) = match (m.remove(TENANT_KIND), m.get(ID)) {
        (Some(AttributeValue::S(tk)), Some(AttributeValue::S(id))) => (tk, id.clone()),
        _ => return Err(StoreError::Corrupt("state item without its key".into())),
    };
    let pk = format!("{tk}#{id}");
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
    if tenant_kind(&key.tenant, &key.kind) != tk || key.id != id {
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
        let distinct: Vec<&StateKey> = keys.iter().filter(|k| seen.insert(k.pk())).collect();
        let mut items = Vec::with_capacity(distinct.len());
        match distinct.as_slice() {
            [] => return Ok(Vec::new()),
            [key] => items.extend(self.get_one(key).await?),
            _ => {
                for chunk in distinct.chunks(BATCH_GET_MAX) {
                    self.get_batch(chunk, &mut items).await?;
                }
            }
        }
        let mut found: HashMap<String, StateRecord> = HashMap::with_capacity(items.len());
        // A mark-only item (an event waits for a record not written yet) is no record.
        for item in items.into_iter().filter(|m| m.contains_key(VERSION)) {
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

    async fn mark_waited(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError> {
        self.mark(key, keep_until_ms).await
    }

    fn gathers_commits(&self) -> bool {
        false
    }

    /// Each commit is its own request (a conditional put or a transaction), all of
    /// them under way at once: DynamoDB has no write that spans transactions.
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        futures::future::join_all(commits.iter().map(|c| self.commit_one(&c.writes, &c.reads)))
            .await
    }

    /// In `id` order, one Query on the table itself (eventually consistent, like the
    /// index it replaces: operator views); `limit == 0` means [`DEFAULT_LIST_LIMIT`].
    /// Pages until `limit` records are found.
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
            .key_condition_expression("#tk = :tk")
            // `tenant#kind` could be spelled by two different pairs if a kind contained
            // '#'; the filter makes the listing exact at no extra read cost. Mark-only
            // items (an event waits for a record not written yet) are no records.
            .filter_expression("#tenant = :tenant AND #kind = :kind AND attribute_exists(#version)")
            .expression_attribute_names("#tk", TENANT_KIND)
            .expression_attribute_names("#tenant", TENANT)
            .expression_attribute_names("#kind", KIND)
            .expression_attribute_names("#version", VERSION)
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

/// The state table's key: hash `tenant_kind`, range `id`.
pub const STATE_KEY_SCHEMA: [(&str, &str); 2] = [(TENANT_KIND, "HASH"), (ID, "RANGE")];

/// Create the state table (hash `tenant_kind`, range `id`, on-demand, TTL on
/// `expires_at` for mark-only items), wait until it is ACTIVE and turn TTL on. An
/// existing table is accepted if it has this key, so this is idempotent; a table of
/// the previous layout (hash `pk`) is refused with the way to migrate it
/// ([`migrate_state_table`]). Production tables come from the SAM template in
/// `infra/`.
pub async fn create_state_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), AwsSetupError> {
    let attribute = |name: &str| key_attribute(table, name, ScalarAttributeType::S);
    let key = |name: &str, key_type: KeyType| key_element(table, name, key_type);
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(attribute(TENANT_KIND)?)
        .attribute_definitions(attribute(ID)?)
        .key_schema(key(TENANT_KIND, KeyType::Hash)?)
        .key_schema(key(ID, KeyType::Range)?)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    created_or_existing(created)?;
    wait_active(client, table).await?;
    super::setup::enable_ttl(client, table).await
}

/// Poll until the table is ACTIVE; a table with another key is an error.
async fn wait_active(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<(), AwsSetupError> {
    super::setup::wait_table_active(client, table, |description| {
        let keys: Vec<(&str, &str)> = description
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name(), k.key_type().as_str()))
            .collect();
        if !keys.is_empty() && keys != STATE_KEY_SCHEMA {
            return Err(AwsSetupError::Resource(format!(
                "table {table} has the key {keys:?}, not {STATE_KEY_SCHEMA:?}: a state table \
                 of the previous layout; copy it into a new table with `einmal-migrate-state`"
            )));
        }
        Ok(())
    })
    .await
}

/// What [`migrate_state_table`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Records written into the new table.
    pub copied: u64,
    /// Records the new table already had at the same or a newer version (a re-run).
    pub already_there: u64,
}

/// Copy every record of the state table `from` (any layout: the previous one keyed by
/// `pk`, or this one) into `to`, created first if missing ([`create_state_table`]).
/// One Scan, page by page (memory bounded by a page, 1 MB), and one conditional
/// PutItem per record that never overwrites a newer version, so a re-run after a
/// failure is safe and copies only what is missing. Run it while the processor and
/// the reconciler are paused (README "Deploy on AWS"): a record written to `from`
/// after the Scan passed it would not be copied. Errors name the table and the
/// record's key, never its data.
pub async fn migrate_state_table(
    sdk_config: &aws_config::SdkConfig,
    from: &str,
    to: &str,
) -> Result<Migrated, AwsSetupError> {
    let client = aws_sdk_dynamodb::Client::new(sdk_config);
    if from == to {
        return Err(AwsSetupError::Resource(format!(
            "cannot migrate table {from} into itself"
        )));
    }
    create_state_table(&client, to).await?;
    let mut done = Migrated::default();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(from)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| AwsSetupError::Resource(describe("DynamoDB Scan", &e)))?;
        for mut item in page.items.unwrap_or_default() {
            // The previous layout's hash key; this layout spells the key with
            // `tenant_kind` and `id`.
            item.remove("pk");
            if !item.contains_key(VERSION) {
                continue; // a mark-only item: nobody waits across a migration
            }
            let record = decode(item.clone())
                .map_err(|e| AwsSetupError::Resource(format!("table {from}: {e}")))?;
            item.insert(
                TENANT_KIND.into(),
                AttributeValue::S(tenant_kind(&record.key.tenant, &record.key.kind)),
            );
            let put = client
                .put_item()
                .table_name(to)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(#version) OR #version < :version")
                .expression_attribute_names("#version", VERSION)
                .expression_attribute_values(
                    ":version",
                    AttributeValue::N(record.version.to_string()),
                )
                .send()
                .await;
            match put {
                Ok(_) => done.copied += 1,
                Err(e)
                    if matches!(
                        e.as_service_error(),
                        Some(PutItemError::ConditionalCheckFailedException(_))
                    ) =>
                {
                    done.already_there += 1
                }
                Err(e) => {
                    return Err(AwsSetupError::Resource(format!(
                        "{} (record {})",
                        describe("DynamoDB PutItem", &e),
                        record.key.pk()
                    )))
                }
            }
        }
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(done);
        }
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
            assert_eq!(item[ID], AttributeValue::S("1001".into()));
            assert!(!item.contains_key(WAIT_MARK));
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
        item.insert(TENANT.into(), AttributeValue::S("other".into()));
        assert!(matches!(decode(item), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn conditions_guard_existence_or_version() {
        let (c, names, values) = condition(0);
        assert_eq!(c, "attribute_not_exists(#version)");
        assert_eq!(names["#version"], VERSION);
        assert!(values.is_none());
        let (c, names, values) = condition(7);
        assert_eq!(c, "#version = :expected");
        assert_eq!(names["#version"], VERSION);
        assert_eq!(values.unwrap()[":expected"], AttributeValue::N("7".into()));
    }

    #[test]
    fn a_failed_condition_is_a_mark_only_at_the_expected_version() {
        let mark = || (WAIT_MARK.to_string(), AttributeValue::N("1".into()));
        let mut marked = encode(&record(&[]), 1);
        marked.extend([mark()]);
        assert!(marked_at(&marked, 3));
        assert!(!marked_at(&marked, 2), "another version: a real conflict");
        assert!(!marked_at(&encode(&record(&[]), 1), 3), "no mark");
        let mark_only = Item::from([mark()]);
        assert!(marked_at(&mark_only, 0));
        assert!(!marked_at(&mark_only, 1));
    }

    #[test]
    fn request_tokens_fit_dynamodb() {
        assert!(request_token().len() <= 36);
    }
}
