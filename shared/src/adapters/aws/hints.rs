//! [`InboxHints`] on DynamoDB: a Query on the sparse, KEYS_ONLY `by_hint` index
//! (hash `hint_scope` = `{provider}#{tenant}`, range `received_at_ms`), then an
//! eventually consistent BatchGetItem of the few attributes reconciliation needs.
//! Never a Scan: the cost follows the tenant's hints since the checkpoint, not the
//! table.
//!
//! Why KEYS_ONLY: an index entry is written when a hint is put and deleted by TTL,
//! nothing else. With the state projected (INCLUDE or ALL) every claim and finish of
//! a hint would also write the index (about three more write units per hint), while
//! the reads it saves are half a read unit per hint and run (a read unit costs a fifth
//! of a write unit), and a hint is read by one or two hourly runs.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};

use super::batch_get::{batch_get, batch_keys, BATCH_GET_MAX};
use super::item;
use super::query::{pk_of, query_up_to};
use super::AwsStore;
use crate::envelope::InboxKey;
use crate::ports::{hint_scope_of, InboxHint, InboxHints, InboxState, StoreError};

#[async_trait]
impl InboxHints for AwsStore {
    async fn hints_since(
        &self,
        provider: &str,
        tenant: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<InboxHint>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let keys = self
            .hint_keys(&hint_scope_of(provider, tenant), since_ms, limit)
            .await?;
        let mut hints = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH_GET_MAX) {
            hints.extend(self.read_hints(chunk).await?);
        }
        hints.sort_by(|a, b| {
            a.received_at_ms
                .cmp(&b.received_at_ms)
                .then_with(|| a.key.cmp(&b.key))
        });
        Ok(hints)
    }
}

impl AwsStore {
    /// Up to `limit` keys of the scope's index range from `since_ms`, oldest first.
    async fn hint_keys(
        &self,
        scope: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let query = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .index_name(item::BY_HINT)
            .key_condition_expression("#scope = :scope AND #received >= :since")
            .expression_attribute_names("#scope", item::HINT_SCOPE)
            .expression_attribute_names("#received", item::RECEIVED_AT_MS)
            .expression_attribute_values(":scope", AttributeValue::S(scope.to_string()))
            .expression_attribute_values(":since", AttributeValue::N(since_ms.to_string()))
            .scan_index_forward(true);
        query_up_to(query, limit)
            .await?
            .iter()
            .map(|m| pk_of(m, item::BY_HINT))
            .collect()
    }

    /// The hints of up to [`BATCH_GET_MAX`] keys (eventually consistent: a stale
    /// state only makes reconciliation look again next run, or look up once more);
    /// keys expired in between are absent.
    async fn read_hints(&self, keys: &[String]) -> Result<Vec<InboxHint>, StoreError> {
        let wanted = KeysAndAttributes::builder()
            .set_keys(Some(batch_keys(keys)))
            .projection_expression("#pk, #object, #state, #received")
            .expression_attribute_names("#pk", item::PK)
            .expression_attribute_names("#object", item::OBJECT_ID)
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_names("#received", item::RECEIVED_AT_MS)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("DynamoDB BatchGetItem: {e}")))?;
        batch_get(&self.dynamodb, &self.table, wanted)
            .await?
            .into_iter()
            .map(|m| decode_hint(m).map_err(StoreError::Corrupt))
            .collect()
    }
}

/// One hint from its projected attributes; errors name the key and the attribute.
fn decode_hint(m: item::Item) -> Result<InboxHint, String> {
    let pk = match m.get(item::PK) {
        Some(AttributeValue::S(pk)) => pk.clone(),
        _ => return Err("hint item without a string pk".to_string()),
    };
    let text = |attr: &str| match m.get(attr) {
        Some(AttributeValue::S(v)) => Ok(v.clone()),
        _ => Err(format!(
            "hint item {pk}: attribute {attr}: missing or not a string"
        )),
    };
    let state = text(item::STATE)?;
    let state = InboxState::parse(&state)
        .ok_or_else(|| format!("hint item {pk}: attribute {}: unknown state", item::STATE))?;
    let received_at_ms = match m.get(item::RECEIVED_AT_MS) {
        Some(AttributeValue::N(n)) => n.parse().map_err(|_| {
            format!(
                "hint item {pk}: attribute {}: number out of range",
                item::RECEIVED_AT_MS
            )
        })?,
        _ => {
            return Err(format!(
                "hint item {pk}: attribute {}: missing or not a number",
                item::RECEIVED_AT_MS
            ))
        }
    };
    Ok(InboxHint {
        object_id: text(item::OBJECT_ID)?,
        state,
        received_at_ms,
        key: InboxKey::from_stored(pk),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_projection_and_names_what_is_wrong() {
        let mut m = item::Item::new();
        m.insert(
            item::PK.into(),
            AttributeValue::S("gopay#t1#7:hint:1".into()),
        );
        m.insert(item::OBJECT_ID.into(), AttributeValue::S("7".into()));
        m.insert(item::STATE.into(), AttributeValue::S("ignored".into()));
        m.insert(
            item::RECEIVED_AT_MS.into(),
            AttributeValue::N("1700".into()),
        );
        let hint = decode_hint(m.clone()).unwrap();
        assert_eq!(
            (hint.key.as_str(), hint.object_id.as_str(), hint.state),
            ("gopay#t1#7:hint:1", "7", InboxState::Ignored)
        );
        assert_eq!(hint.received_at_ms, 1700);

        let mut bad = m.clone();
        bad.insert(item::STATE.into(), AttributeValue::S("nonsense".into()));
        assert!(decode_hint(bad).unwrap_err().contains("state"));
        let mut bad = m.clone();
        bad.remove(item::OBJECT_ID);
        assert!(decode_hint(bad).unwrap_err().contains("object_id"));
        let mut bad = m;
        bad.insert(item::RECEIVED_AT_MS.into(), AttributeValue::S("x".into()));
        assert!(decode_hint(bad).unwrap_err().contains("received_at_ms"));
    }
}
