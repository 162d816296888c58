//! [`InboxHints`] on SQLite: one range of the partial index `inbox_by_hint`, which
//! holds only the hints of GoPay and Klarna push (as the sparse `by_hint` GSI on
//! DynamoDB), ordered as the port promises (receipt time, then key).

use async_trait::async_trait;
use rusqlite::{params, Connection};

use super::{DbError, EmbeddedStore};
use crate::envelope::InboxKey;
use crate::ports::{indexed_hint_providers, InboxHint, InboxHints, InboxState, StoreError};
use crate::providers::thin::HINT_PREFIX;

/// The partial index's condition, written the same way in the index and the query
/// (SQLite uses a partial index only when the query's WHERE repeats its terms).
fn hint_condition() -> String {
    let providers: Vec<String> = indexed_hint_providers().map(|p| format!("'{p}'")).collect();
    format!(
        "provider IN ({}) AND substr(event_type, 1, {}) = '{HINT_PREFIX}'",
        providers.join(", "),
        HINT_PREFIX.len()
    )
}

/// Created on every open (idempotent), so files from before it get it too.
pub(super) fn hint_index_sql() -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS inbox_by_hint \
         ON inbox(provider, tenant, received_at_ms, pk) WHERE {};",
        hint_condition()
    )
}

fn hint_items(
    conn: &Connection,
    provider: &str,
    tenant: &str,
    since_ms: i64,
    limit: usize,
) -> Result<Vec<InboxHint>, DbError> {
    let sql = format!(
        "SELECT pk, object_id, state, received_at_ms FROM inbox INDEXED BY inbox_by_hint \
         WHERE {} AND provider = ?1 AND tenant = ?2 AND received_at_ms >= ?3 \
         ORDER BY received_at_ms, pk LIMIT ?4",
        hint_condition()
    );
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![provider, tenant, since_ms, limit])?;
    let mut hints = Vec::new();
    while let Some(row) = rows.next()? {
        let pk: String = row.get(0)?;
        let object_id: Option<String> = row.get(1)?;
        let state: String = row.get(2)?;
        let object_id =
            object_id.ok_or_else(|| DbError::Corrupt(format!("hint item {pk}: no object_id")))?;
        let state = InboxState::parse(&state)
            .ok_or_else(|| DbError::Corrupt(format!("hint item {pk}: unknown state {state}")))?;
        hints.push(InboxHint {
            object_id,
            state,
            received_at_ms: row.get(3)?,
            key: InboxKey::from_stored(pk),
        });
    }
    Ok(hints)
}

#[async_trait]
impl InboxHints for EmbeddedStore {
    async fn hints_since(
        &self,
        provider: &str,
        tenant: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<InboxHint>, StoreError> {
        if limit == 0 || !indexed_hint_providers().any(|p| p == provider) {
            return Ok(Vec::new());
        }
        let (provider, tenant) = (provider.to_string(), tenant.to_string());
        Ok(self
            .read(move |conn| hint_items(conn, &provider, &tenant, since_ms, limit))
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::{EmbeddedOptions, DB_FILE};
    use crate::envelope::Envelope;
    use crate::ports::{Finish, Handout, Inbox, InboxItem, InboxProcessing, Source};

    fn stored(provider: &str, tenant: &str, event_type: &str, object: &str, at: i64) -> InboxItem {
        let envelope = Envelope {
            provider: provider.into(),
            tenant: tenant.into(),
            event_id: format!("{object}:{at}"),
            event_type: event_type.into(),
            object_id: Some(object.into()),
            object_version: None,
            occurred_at: None,
            delivery_id: None,
        };
        InboxItem {
            key: envelope.key(),
            envelope,
            state: InboxState::Received,
            source: Source::Webhook,
            attempts: 0,
            received_at_ms: at,
            updated_at_ms: at,
            expires_at: at / 1000 + 86_400,
            enqueue_failed: false,
            last_error: None,
            last_error_class: None,
            lease_until_ms: None,
            lease_owner: None,
            result: None,
            body_encoding: "identity".into(),
            body_len: 0,
            body: Vec::new(),
            waiting: None,
            deliveries: Vec::new(),
            relay_due_ms: None,
        }
    }

    fn keys(hints: &[InboxHint]) -> Vec<&str> {
        hints.iter().map(|h| h.key.as_str()).collect()
    }

    #[tokio::test]
    async fn only_gopay_and_klarna_push_hints_of_the_tenant_since_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let t = 1_700_000_000_000i64;
        let early = stored("gopay", "t1", "hint.payment", "101", t - 10_000);
        let first = stored("gopay", "t1", "hint.payment", "101", t);
        let second = stored("gopay", "t1", "hint.payment", "102", t + 1);
        let klarna = stored("klarna-push", "t1", "hint.order", "k-1", t);
        for item in [
            &second,
            &first,
            &early,
            &klarna,
            &stored("gopay", "t2", "hint.payment", "201", t),
            &stored("mollie", "t1", "hint.payment", "tr_1", t),
            &stored("stripe", "t1", "payment_intent.succeeded", "pi_1", t),
        ] {
            store.put_new(item).await.unwrap();
        }
        let hints = store.hints_since("gopay", "t1", t, 100).await.unwrap();
        assert_eq!(keys(&hints), [first.key.as_str(), second.key.as_str()]);
        assert_eq!(
            (
                hints[0].object_id.as_str(),
                hints[0].state,
                hints[0].received_at_ms
            ),
            ("101", InboxState::Received, t)
        );
        let oldest = store.hints_since("gopay", "t1", 0, 2).await.unwrap();
        assert_eq!(keys(&oldest), [early.key.as_str(), first.key.as_str()]);
        assert_eq!(
            keys(
                &store
                    .hints_since("klarna-push", "t1", 0, 100)
                    .await
                    .unwrap()
            ),
            [klarna.key.as_str()]
        );
        for (provider, tenant) in [("mollie", "t1"), ("stripe", "t1"), ("gopay", "t9")] {
            assert!(store
                .hints_since(provider, tenant, 0, 100)
                .await
                .unwrap()
                .is_empty());
        }
        assert!(store
            .hints_since("gopay", "t1", 0, 0)
            .await
            .unwrap()
            .is_empty());

        // State changes show (the index keys never change).
        let now = t + 5;
        assert!(matches!(
            store.claim(&first.key, "w1", now, 30_000).await.unwrap(),
            crate::ports::ClaimOutcome::Claimed(_)
        ));
        let finish = Finish {
            state: InboxState::Ignored,
            error_class: None,
            error: None,
            result: Some("not final".into()),
            now_ms: now,
            wait: Default::default(),
            deliveries: None,
            relay_due_ms: None,
        };
        assert!(store
            .finish(&first.key, &Handout::leased("w1"), &finish)
            .await
            .unwrap());
        let hints = store.hints_since("gopay", "t1", t, 100).await.unwrap();
        assert_eq!(hints[0].state, InboxState::Ignored);
    }

    #[tokio::test]
    async fn the_partial_index_serves_the_query_and_older_files_get_it_on_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let ddl: String = raw
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'inbox_by_hint'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(
            ddl.contains("WHERE provider IN ('gopay', 'klarna-push')"),
            "{ddl}"
        );
        let plan: Vec<String> = raw
            .prepare(&format!(
                "EXPLAIN QUERY PLAN SELECT pk FROM inbox WHERE {} AND provider = 'gopay' \
                 AND tenant = 't1' AND received_at_ms >= 0 ORDER BY received_at_ms, pk",
                hint_condition()
            ))
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(plan.iter().any(|p| p.contains("inbox_by_hint")), "{plan:?}");
        assert!(!plan.iter().any(|p| p.contains("TEMP B-TREE")), "{plan:?}");
        // A file from before the index: created on the next open.
        raw.execute_batch("DROP INDEX inbox_by_hint").unwrap();
        drop(raw);
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        store
            .put_new(&stored("gopay", "t1", "hint.payment", "1", 5))
            .await
            .unwrap();
        assert_eq!(
            store.hints_since("gopay", "t1", 0, 10).await.unwrap().len(),
            1
        );
    }
}
