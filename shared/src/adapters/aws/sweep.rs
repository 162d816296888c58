//! [`InboxSweep`] on DynamoDB: the stuck items from the sparse `by_sweep_shard`
//! index, the waiting ones from the waiters' index.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};

use super::batch_get::{batch_get, batch_keys, BATCH_GET_MAX};
use super::error::describe;
use super::item::{self, n_attr, s_attr};
use super::AwsStore;
use crate::ports::{InboxItem, InboxState, InboxSweep, StoreError, WaitingScan};

/// Whether `item` is what [`crate::ports::InboxSweep::stuck`] returns for
/// `older_than_ms`: `received`, `queued` or `retryable` last updated before it, `processing`
/// whose lease ran out before it. The embedded store's SQL says the same.
fn sweepable(item: &InboxItem, older_than_ms: i64) -> bool {
    match item.state {
        InboxState::Received | InboxState::Queued | InboxState::Retryable => {
            item.updated_at_ms < older_than_ms
        }
        InboxState::Processing => {
            item.updated_at_ms < older_than_ms
                && item
                    .lease_until_ms
                    .is_none_or(|until| until < older_than_ms)
        }
        _ => false,
    }
}

/// One page of a shard's index range (`sweep_shard = shard AND received_at_ms < cutoff`).
struct ShardCursor {
    shard: String,
    start: Option<item::Item>,
    done: bool,
}

impl AwsStore {
    /// The keys of one page of `cursor`'s shard, oldest receipt first; advances it.
    async fn sweep_page(
        &self,
        cursor: &mut ShardCursor,
        older_than_ms: i64,
        page: i32,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let out = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .index_name(item::BY_SWEEP_SHARD)
            .key_condition_expression("#shard = :shard AND #received < :cutoff")
            .expression_attribute_names("#shard", item::SWEEP_SHARD)
            .expression_attribute_names("#received", item::RECEIVED_AT_MS)
            .expression_attribute_values(":shard", s_attr(&cursor.shard))
            .expression_attribute_values(":cutoff", n_attr(older_than_ms))
            .scan_index_forward(true)
            .limit(page)
            .set_exclusive_start_key(cursor.start.take())
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB Query", &e)))?;
        cursor.start = out.last_evaluated_key;
        cursor.done = cursor.start.is_none();
        let mut keys = Vec::new();
        for m in out.items.unwrap_or_default() {
            let pk = match m.get(item::PK) {
                Some(AttributeValue::S(pk)) => pk.clone(),
                _ => {
                    return Err(StoreError::Corrupt(format!(
                        "index {}: entry without a string pk",
                        item::BY_SWEEP_SHARD
                    )))
                }
            };
            let received = match m.get(item::RECEIVED_AT_MS) {
                Some(AttributeValue::N(n)) => n.parse().unwrap_or(i64::MAX),
                _ => i64::MAX,
            };
            keys.push((received, pk));
        }
        Ok(keys)
    }

    /// The current items of `keys` (consistent reads, BatchGetItem of up to 100),
    /// in no particular order; keys deleted in between are simply absent.
    async fn read_items(&self, keys: &[String]) -> Result<Vec<InboxItem>, StoreError> {
        let mut items = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH_GET_MAX) {
            let wanted = KeysAndAttributes::builder()
                .set_keys(Some(batch_keys(chunk)))
                .consistent_read(true)
                .build()
                .map_err(|e| StoreError::Unavailable(format!("DynamoDB BatchGetItem: {e}")))?;
            for m in batch_get(&self.dynamodb, &self.table, wanted).await? {
                items.push(item::decode(m).map_err(StoreError::Corrupt)?);
            }
        }
        Ok(items)
    }
}

/// The sweeper: one Query per shard of the sparse, KEYS_ONLY `by_sweep_shard` index
/// (hash `sweep_shard`, range `received_at_ms`), oldest receipt first, then a
/// consistent BatchGetItem of the candidates, which are checked against the same rules
/// as the embedded store's; never a Scan. An item's `updated_at_ms` is never before its
/// `received_at_ms`, so the index range holds every item that qualifies. Candidates
/// that do not (a live lease, a recent retry) cost a read each, and pending items are
/// few: those in flight and the rare stuck ones.
#[async_trait]
impl InboxSweep for AwsStore {
    async fn stuck(&self, older_than_ms: i64, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        let mut found: Vec<InboxItem> = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        let page = limit.min(1000) as i32;
        let mut cursors: Vec<ShardCursor> = item::sweep_shards()
            .map(|shard| ShardCursor {
                shard,
                start: None,
                done: false,
            })
            .collect();
        // Round by round, one page per unfinished shard, until `limit` items qualify
        // or every shard's range is read: candidates that do not qualify never hide
        // the ones behind them.
        while found.len() < limit && cursors.iter().any(|c| !c.done) {
            let mut candidates = Vec::new();
            for cursor in cursors.iter_mut().filter(|c| !c.done) {
                candidates.extend(self.sweep_page(cursor, older_than_ms, page).await?);
            }
            // Oldest receipt first, 100 keys per read, no more reads than `limit` needs
            // (a backlog of thousands costs one page of reads per pass, not all of it).
            candidates.sort();
            let keys: Vec<String> = candidates.into_iter().map(|(_, pk)| pk).collect();
            for chunk in keys.chunks(BATCH_GET_MAX) {
                found.extend(
                    self.read_items(chunk)
                        .await?
                        .into_iter()
                        .filter(|item| sweepable(item, older_than_ms)),
                );
                if found.len() >= limit {
                    break;
                }
            }
        }
        found.sort_by(|a, b| {
            a.updated_at_ms
                .cmp(&b.updated_at_ms)
                .then_with(|| a.key.cmp(&b.key))
        });
        found.truncate(limit);
        Ok(found)
    }

    async fn waiting(
        &self,
        due_before_ms: i64,
        limit: usize,
        read_max: usize,
    ) -> Result<WaitingScan, StoreError> {
        self.waiting_scan(due_before_ms, limit, read_max).await
    }
}
