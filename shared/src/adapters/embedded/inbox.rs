//! [`Inbox`] and [`InboxProcessing`] on SQLite: the `inbox` table, its rows and
//! the claim / finish of an item under a lease.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

use super::item_row::{encode_deliveries, get_item, item_from_row, ITEM_COLUMNS};
use super::{waiting, DbError, EmbeddedStore};
use crate::envelope::InboxKey;
use crate::ports::{
    may_lack_body, ClaimOutcome, Delivery, Finish, Handout, Inbox, InboxFilter, InboxItem,
    InboxProcessing, InboxState, ItemVersion, PutOutcome, StoreError, WaitChange,
};
use crate::ports::{InboxPage, InboxQuery, SearchError, StateCounts};

/// `list` limit when the filter says 0.
const DEFAULT_LIST_LIMIT: usize = 100;

const INSERT_ITEM: &str = "INSERT INTO inbox (pk, provider, tenant, event_id, event_type, object_id, \
     object_version, occurred_at, delivery_id, state, source, attempts, received_at_ms, updated_at_ms, \
     expires_at, enqueue_failed, last_error, body_encoding, body_len, body, last_error_class, \
     lease_until_ms, lease_owner, result) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, \
     ?21, ?22, ?23, ?24) \
     ON CONFLICT(pk) DO NOTHING";

pub(super) fn put_item(conn: &Connection, item: &InboxItem) -> Result<PutOutcome, DbError> {
    let e = &item.envelope;
    let body_len = i64::try_from(item.body_len)
        .map_err(|_| DbError::Unavailable(format!("body_len {} out of range", item.body_len)))?;
    let inserted = conn.prepare_cached(INSERT_ITEM)?.execute(params![
        item.key.as_str(),
        e.provider,
        e.tenant,
        e.event_id,
        e.event_type,
        e.object_id,
        e.object_version,
        e.occurred_at,
        e.delivery_id,
        item.state.as_str(),
        item.source.as_str(),
        i64::from(item.attempts),
        item.received_at_ms,
        item.updated_at_ms,
        item.expires_at,
        i64::from(item.enqueue_failed),
        item.last_error,
        item.body_encoding,
        body_len,
        item.body,
        item.last_error_class,
        item.lease_until_ms,
        item.lease_owner,
        item.result,
    ])?;
    if inserted == 1 {
        return Ok(PutOutcome::Inserted);
    }
    match get_item(conn, item.key.as_str())? {
        // The row carries its body, written by the same INSERT, so this is for a row
        // stored without one by other means; the port's promise holds all the same.
        Some(existing)
            if lacks_body(&existing) && !item.body.is_empty() && may_lack_body(existing.state) =>
        {
            conn.prepare_cached(RESTORE_BODY)?.execute(params![
                item.key.as_str(),
                item.body,
                body_len,
                item.body_encoding,
                item.updated_at_ms,
            ])?;
            tracing::warn!(pk = %item.key, "body was missing; stored from a duplicate");
            let now = get_item(conn, item.key.as_str())?.ok_or_else(|| {
                DbError::Unavailable(format!("{} vanished while its body was restored", item.key))
            })?;
            Ok(PutOutcome::Restored(Box::new(now)))
        }
        Some(existing) => Ok(PutOutcome::Duplicate(Box::new(existing))),
        None => Err(DbError::Unavailable(format!(
            "insert of {} neither applied nor conflicted",
            item.key
        ))),
    }
}

/// A row without the body its length says it has (an empty body is empty).
fn lacks_body(item: &InboxItem) -> bool {
    item.body.is_empty() && item.body_len > 0
}

/// A duplicate's body into a row that has none; a `dead_letter` goes back to `queued`.
const RESTORE_BODY: &str = "UPDATE inbox SET body = ?2, body_len = ?3, body_encoding = ?4, \
     updated_at_ms = CASE state WHEN 'dead_letter' THEN ?5 ELSE updated_at_ms END, \
     state = CASE state WHEN 'dead_letter' THEN 'queued' ELSE state END \
     WHERE pk = ?1 AND (body IS NULL OR length(body) = 0)";

fn list_items(conn: &Connection, filter: &InboxFilter) -> Result<Vec<InboxItem>, DbError> {
    let mut conditions: Vec<&str> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    if let Some(state) = filter.state {
        conditions.push("state = ?");
        args.push(state.as_str().to_string());
    }
    if let Some(provider) = &filter.provider {
        conditions.push("provider = ?");
        args.push(provider.clone());
    }
    if let Some(tenant) = &filter.tenant {
        conditions.push("tenant = ?");
        args.push(tenant.clone());
    }
    let mut sql = format!("SELECT {ITEM_COLUMNS} FROM inbox");
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(" ORDER BY received_at_ms DESC, rowid DESC LIMIT ?");
    let limit = if filter.limit == 0 {
        DEFAULT_LIST_LIMIT
    } else {
        filter.limit
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);

    let mut stmt = conn.prepare_cached(&sql)?;
    let mut bound: Vec<&dyn rusqlite::ToSql> =
        args.iter().map(|a| a as &dyn rusqlite::ToSql).collect();
    bound.push(&limit);
    let mut rows = stmt.query(bound.as_slice())?;
    let mut items = Vec::new();
    while let Some(row) = rows.next()? {
        items.push(item_from_row(row)?);
    }
    Ok(items)
}

#[async_trait]
impl Inbox for EmbeddedStore {
    async fn put_new(&self, item: &InboxItem) -> Result<PutOutcome, StoreError> {
        let item = item.clone();
        Ok(self.write(move |conn| put_item(conn, &item)).await?)
    }

    async fn get(&self, key: &InboxKey) -> Result<Option<InboxItem>, StoreError> {
        let pk = key.as_str().to_string();
        Ok(self.read(move |conn| get_item(conn, &pk)).await?)
    }

    async fn list(&self, filter: &InboxFilter) -> Result<Vec<InboxItem>, StoreError> {
        let filter = filter.clone();
        Ok(self.read(move |conn| list_items(conn, &filter)).await?)
    }

    async fn search(&self, query: &InboxQuery) -> Result<InboxPage, SearchError> {
        let after = query
            .cursor
            .as_deref()
            .map(super::search::decode_cursor)
            .transpose()?;
        let query = query.clone();
        Ok(self
            .read(move |conn| super::search::search(conn, &query, after))
            .await
            .map_err(StoreError::from)?)
    }

    async fn count_states(&self, filter: &InboxFilter) -> Result<StateCounts, StoreError> {
        let filter = filter.clone();
        Ok(self
            .read(move |conn| super::search::count_states(conn, &filter))
            .await?)
    }

    /// Sets the flag only while the item is `received`; `updated_at_ms` is left alone
    /// (it tracks state changes). A missing key is not an error.
    async fn mark_enqueue_failed(&self, key: &InboxKey) -> Result<(), StoreError> {
        let pk = key.as_str().to_string();
        self.write(move |conn| {
            conn.prepare_cached(
                "UPDATE inbox SET enqueue_failed = 1 WHERE pk = ?1 AND state = 'received'",
            )?
            .execute([&pk])?;
            Ok(())
        })
        .await?;
        Ok(())
    }
}

// Processing (claim / finish under a lease)

/// Claim: the item is waiting, or held by a lease that ran out (`?4` = now). The
/// condition sits in the WHERE clause and the row comes back through RETURNING: one
/// statement, inside the writer's transaction.
const CLAIM_ITEM: &str = "UPDATE inbox SET state = 'processing', lease_owner = ?2, \
     lease_until_ms = ?3, updated_at_ms = ?4, attempts = attempts + 1 \
     WHERE pk = ?1 AND (state IN ('received', 'queued', 'retryable', 'waiting') \
     OR (state = 'processing' AND (lease_until_ms IS NULL OR lease_until_ms <= ?4)))";

/// A `completed` / `ignored` finish clears the last error (see [`Finish`]).
const FINISH_ITEM: &str = "UPDATE inbox SET state = ?3, updated_at_ms = ?4, \
     last_error_class = CASE WHEN ?3 IN ('completed', 'ignored') THEN NULL \
       ELSE COALESCE(?5, last_error_class) END, \
     last_error = CASE WHEN ?3 IN ('completed', 'ignored') THEN NULL \
       ELSE COALESCE(?6, last_error) END, \
     result = COALESCE(?7, result), lease_owner = NULL, lease_until_ms = NULL, \
     wait_on = CASE ?8 WHEN 1 THEN ?9 WHEN 2 THEN NULL ELSE wait_on END, \
     waiting_since_ms = CASE ?8 WHEN 1 THEN ?10 WHEN 2 THEN NULL ELSE waiting_since_ms END, \
     deliveries = CASE ?11 WHEN 1 THEN ?12 ELSE deliveries END, \
     relay_due_ms = CASE ?11 WHEN 1 THEN ?13 ELSE relay_due_ms END, \
     relay_dead_ms = CASE ?11 WHEN 1 THEN ?14 ELSE relay_dead_ms END \
     WHERE pk = ?1 AND state = 'processing' AND lease_owner = ?2";

const MARK_DEAD_LETTER: &str = "UPDATE inbox SET state = 'dead_letter', last_error = ?2, \
     updated_at_ms = ?3, lease_owner = NULL, lease_until_ms = NULL, wait_on = NULL, \
     waiting_since_ms = NULL \
     WHERE pk = ?1 AND (state IN ('received', 'queued', 'retryable', 'waiting') \
     OR (state = 'processing' AND (lease_until_ms IS NULL OR lease_until_ms <= ?3))) \
     AND state = ?4 AND updated_at_ms = ?5";

fn claim_item(
    conn: &Connection,
    pk: &str,
    owner: &str,
    now_ms: i64,
    lease_ms: i64,
) -> Result<ClaimOutcome, DbError> {
    let sql = format!("{CLAIM_ITEM} RETURNING {ITEM_COLUMNS}");
    let claimed = {
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![pk, owner, now_ms.saturating_add(lease_ms), now_ms])?;
        match rows.next()? {
            Some(row) => Some(item_from_row(row)?),
            None => None,
        }
    };
    if let Some(item) = claimed {
        if lacks_body(&item) {
            return Ok(ClaimOutcome::BodyMissing(Box::new(item)));
        }
        return Ok(ClaimOutcome::Claimed(Box::new(item)));
    }
    // Why not, read in the same transaction.
    let found: Option<(String, Option<i64>)> = conn
        .prepare_cached("SELECT state, lease_until_ms FROM inbox WHERE pk = ?1")?
        .query_row([pk], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((state, lease_until_ms)) = found else {
        return Ok(ClaimOutcome::Missing);
    };
    let state = InboxState::parse(&state)
        .ok_or_else(|| DbError::Corrupt(format!("inbox item {pk}: unknown state {state:?}")))?;
    match (state, lease_until_ms) {
        (s, _) if s.is_terminal() => Ok(ClaimOutcome::Finished(s)),
        (InboxState::Processing, Some(until_ms)) => Ok(ClaimOutcome::Leased { until_ms }),
        (s, _) => Err(DbError::Corrupt(format!(
            "inbox item {pk}: claim refused in state {s}"
        ))),
    }
}

fn finish_item(conn: &Connection, pk: &str, owner: &str, f: &Finish) -> Result<bool, DbError> {
    let (wait_mode, wait_on, since_ms) = match &f.wait {
        WaitChange::Keep => (0, None, None),
        WaitChange::Park(w) => (1, Some(w.on.as_str()), Some(w.since_ms)),
        WaitChange::Clear => (2, None, None),
    };
    let (relay_mode, deliveries, dead_ms) = match &f.deliveries {
        Some(deliveries) => (
            1,
            encode_deliveries(deliveries)?,
            crate::ports::dead_lettered_at(deliveries, f.now_ms),
        ),
        None => (0, None, None),
    };
    let changed = conn.prepare_cached(FINISH_ITEM)?.execute(params![
        pk,
        owner,
        f.state.as_str(),
        f.now_ms,
        f.error_class,
        f.error,
        f.result,
        wait_mode,
        wait_on,
        since_ms,
        relay_mode,
        deliveries,
        f.relay_due_ms,
        dead_ms,
    ])?;
    Ok(changed == 1)
}

#[async_trait]
impl InboxProcessing for EmbeddedStore {
    async fn claim(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let pk = key.as_str().to_string();
        let owner = owner.to_string();
        // Ordered, not durable: a claim lost with a power cut leaves the item
        // claimable again, as if the worker had died before claiming (see `writer`).
        Ok(self
            .write_ordered(move |conn| claim_item(conn, &pk, &owner, now_ms, lease_ms))
            .await?)
    }

    /// Claims, so an item handed out otherwise is not this store's.
    async fn begin(
        &self,
        delivery: &Delivery,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim(&delivery.message.pk, owner, now_ms, lease_ms)
            .await
    }

    async fn finish(
        &self,
        key: &InboxKey,
        run: &Handout,
        finish: &Finish,
    ) -> Result<bool, StoreError> {
        let Handout::Leased { owner } = run else {
            return Err(StoreError::Rejected(
                "the embedded store leases every run it hands out; an unleased finish is not its own"
                    .into(),
            ));
        };
        let pk = key.as_str().to_string();
        let owner = owner.clone();
        let durable_finish = finish.deliveries.is_some();
        let finish = finish.clone();
        let work = move |conn: &Connection| finish_item(conn, &pk, &owner, &finish);
        // A finish lost with a power cut is redone by the redelivery (the effect is
        // durable and guarded), so it needs no fsync of its own, unless it records
        // deliveries: destinations heard of the event, and the relay hands on the
        // object's next event once this finish returns.
        Ok(if durable_finish {
            self.write(work).await?
        } else {
            self.write_ordered(work).await?
        })
    }

    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        seen: ItemVersion,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let pk = key.as_str().to_string();
        let reason = reason.to_string();
        // Only the item as read: a claim, finish or replay since wins.
        Ok(self
            .write(move |conn| {
                let changed = conn.prepare_cached(MARK_DEAD_LETTER)?.execute(params![
                    pk,
                    reason,
                    now_ms,
                    seen.state.as_str(),
                    seen.updated_at_ms
                ])?;
                Ok(changed == 1)
            })
            .await?)
    }

    async fn waiters(&self, record_pk: &str, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        let record_pk = record_pk.to_string();
        Ok(self
            .read(move |conn| waiting::waiters_of(conn, &record_pk, limit))
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::adapters::embedded::tests::{item, msg, open};
    use crate::ports::Queue;

    #[tokio::test]
    async fn insert_then_duplicate_returns_the_stored_item() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let first = item("stripe", "acme", "evt_1", 1_000);
        assert_eq!(store.put_new(&first).await.unwrap(), PutOutcome::Inserted);

        // A retry carries a different delivery id and time: the stored original comes back.
        let mut retry = first.clone();
        retry.envelope.delivery_id = Some("dlv_other".into());
        retry.received_at_ms = 2_000;
        retry.body = b"other".to_vec();
        match store.put_new(&retry).await.unwrap() {
            PutOutcome::Duplicate(existing) => assert_eq!(*existing, first),
            other => panic!("expected a duplicate, got {other:?}"),
        }
        assert_eq!(store.get(&first.key).await.unwrap(), Some(first.clone()));
        let missing = InboxKey::new("stripe", "acme", "evt_missing");
        assert_eq!(store.get(&missing).await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_puts_of_one_key_insert_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let base = item("stripe", "acme", "evt_race", 1_000);
        let mut tasks = Vec::new();
        for i in 0..50 {
            let store = store.clone();
            let mut candidate = base.clone();
            candidate.envelope.delivery_id = Some(format!("dlv_{i}"));
            tasks.push(tokio::spawn(async move {
                (candidate.clone(), store.put_new(&candidate).await.unwrap())
            }));
        }
        let mut winners = Vec::new();
        let mut duplicates = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                (candidate, PutOutcome::Inserted) => winners.push(candidate),
                (_, PutOutcome::Duplicate(existing)) => duplicates.push(*existing),
                (_, other) => panic!("the row is stored with its body: {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1);
        assert_eq!(duplicates.len(), 49);
        assert!(duplicates.iter().all(|d| *d == winners[0]));
        assert_eq!(
            store.get(&base.key).await.unwrap(),
            Some(winners[0].clone())
        );
    }

    #[tokio::test]
    async fn mark_enqueue_failed_applies_only_while_received() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("stripe", "acme", "evt_a", 1_000);
        let b = item("stripe", "acme", "evt_b", 1_001);
        store.put_new(&a).await.unwrap();
        store.put_new(&b).await.unwrap();
        store.send(&msg(&b)).await.unwrap();

        store.mark_enqueue_failed(&a.key).await.unwrap();
        store.mark_enqueue_failed(&b.key).await.unwrap();
        store
            .mark_enqueue_failed(&InboxKey::new("x", "y", "z"))
            .await
            .unwrap();

        let a_now = store.get(&a.key).await.unwrap().unwrap();
        assert!(a_now.enqueue_failed);
        assert_eq!(a_now.state, InboxState::Received);
        assert_eq!(a_now.updated_at_ms, a.updated_at_ms);
        let b_now = store.get(&b.key).await.unwrap().unwrap();
        assert!(!b_now.enqueue_failed);
        assert_eq!(b_now.state, InboxState::Queued);
        // The flag comes back with a duplicate.
        match store.put_new(&a).await.unwrap() {
            PutOutcome::Duplicate(existing) => assert!(existing.enqueue_failed),
            other => panic!("expected a duplicate, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn list_filters_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let items = [
            item("stripe", "acme", "e1", 1_000),
            item("stripe", "beta", "e2", 2_000),
            item("shopify", "acme", "e3", 3_000),
            item("stripe", "acme", "e4", 4_000),
        ];
        for it in &items {
            assert_eq!(store.put_new(it).await.unwrap(), PutOutcome::Inserted);
        }
        store.send(&msg(&items[1])).await.unwrap();
        let ids = |v: Vec<InboxItem>| {
            v.into_iter()
                .map(|i| i.envelope.event_id)
                .collect::<Vec<_>>()
        };

        let all = store.list(&InboxFilter::default()).await.unwrap();
        assert_eq!(all[0].body, items[3].body);
        assert_eq!(ids(all), ["e4", "e3", "e2", "e1"]);
        let f = |state: Option<InboxState>,
                 provider: Option<&str>,
                 tenant: Option<&str>,
                 limit: usize| InboxFilter {
            state,
            provider: provider.map(String::from),
            tenant: tenant.map(String::from),
            limit,
        };
        assert_eq!(
            ids(store
                .list(&f(Some(InboxState::Queued), None, None, 0))
                .await
                .unwrap()),
            ["e2"]
        );
        assert_eq!(
            ids(store
                .list(&f(Some(InboxState::Received), None, None, 0))
                .await
                .unwrap()),
            ["e4", "e3", "e1"]
        );
        assert_eq!(
            ids(store.list(&f(None, Some("stripe"), None, 0)).await.unwrap()),
            ["e4", "e2", "e1"]
        );
        assert_eq!(
            ids(store.list(&f(None, None, Some("acme"), 0)).await.unwrap()),
            ["e4", "e3", "e1"]
        );
        assert_eq!(
            ids(store
                .list(&f(None, Some("stripe"), Some("acme"), 1))
                .await
                .unwrap()),
            ["e4"]
        );
        assert_eq!(
            ids(store
                .list(&f(
                    Some(InboxState::Received),
                    Some("stripe"),
                    Some("acme"),
                    0
                ))
                .await
                .unwrap()),
            ["e4", "e1"]
        );
        assert!(store
            .list(&f(Some(InboxState::Completed), None, None, 0))
            .await
            .unwrap()
            .is_empty());
        assert!(store
            .list(&f(None, Some("github"), None, 0))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn list_limit_zero_means_one_hundred() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let puts = (0..105).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put_new(&item("p", "t", &format!("e{i}"), i))
                    .await
                    .unwrap()
            })
        });
        for p in puts.collect::<Vec<_>>() {
            assert_eq!(p.await.unwrap(), PutOutcome::Inserted);
        }
        let listed = store.list(&InboxFilter::default()).await.unwrap();
        assert_eq!(listed.len(), 100);
        assert_eq!(listed[0].envelope.event_id, "e104");
        assert_eq!(listed[99].envelope.event_id, "e5");
    }

    fn finish(state: InboxState, now_ms: i64) -> Finish {
        Finish {
            state,
            error_class: None,
            error: None,
            result: None,
            now_ms,
            wait: Default::default(),
            deliveries: None,
            relay_due_ms: None,
        }
    }

    #[tokio::test]
    async fn claim_leases_and_finish_releases() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("stripe", "acme", "evt_claim", 1_000);
        store.put_new(&a).await.unwrap();
        store.send(&msg(&a)).await.unwrap();

        // Fresh: claimed with the body, attempts 1, leased to w1.
        let claimed = match store.claim(&a.key, "w1", 10_000, 30_000).await.unwrap() {
            ClaimOutcome::Claimed(item) => item,
            other => panic!("expected a claim, got {other:?}"),
        };
        assert_eq!(claimed.body, a.body);
        assert_eq!(claimed.state, InboxState::Processing);
        assert_eq!(claimed.attempts, 1);
        assert_eq!(claimed.lease_owner.as_deref(), Some("w1"));
        assert_eq!(claimed.lease_until_ms, Some(40_000));
        assert_eq!(claimed.updated_at_ms, 10_000);

        // Leased: another worker (or the same one again) is refused until it runs out.
        for (owner, now) in [("w2", 10_001), ("w1", 39_999)] {
            assert_eq!(
                store.claim(&a.key, owner, now, 30_000).await.unwrap(),
                ClaimOutcome::Leased { until_ms: 40_000 }
            );
        }
        // Expired (w1 crashed): w2 claims, attempts 2.
        let again = match store.claim(&a.key, "w2", 40_000, 30_000).await.unwrap() {
            ClaimOutcome::Claimed(item) => item,
            other => panic!("expected a claim, got {other:?}"),
        };
        assert_eq!(again.attempts, 2);
        assert_eq!(again.lease_owner.as_deref(), Some("w2"));

        // The old owner can no longer finish.
        assert!(!store
            .finish(
                &a.key,
                &Handout::leased("w1"),
                &finish(InboxState::Completed, 41_000)
            )
            .await
            .unwrap());
        let mut done = finish(InboxState::Completed, 41_000);
        done.result = Some("counter +1".into());
        assert!(store
            .finish(&a.key, &Handout::leased("w2"), &done)
            .await
            .unwrap());
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Completed);
        assert_eq!(stored.result.as_deref(), Some("counter +1"));
        assert_eq!((stored.lease_owner, stored.lease_until_ms), (None, None));
        assert_eq!(stored.updated_at_ms, 41_000);
        // Finished twice: the lease is gone.
        assert!(!store
            .finish(&a.key, &Handout::leased("w2"), &done)
            .await
            .unwrap());

        assert_eq!(
            store.claim(&a.key, "w3", 99_000, 30_000).await.unwrap(),
            ClaimOutcome::Finished(InboxState::Completed)
        );
        let missing = InboxKey::new("stripe", "acme", "nope");
        assert_eq!(
            store.claim(&missing, "w3", 99_000, 30_000).await.unwrap(),
            ClaimOutcome::Missing
        );
    }

    /// A row stored without its body (not by `put_new`'s own INSERT, which writes
    /// both): claimed, it says so; a duplicate stores the body and takes a
    /// `dead_letter` back to `queued`; the next duplicate is a plain one.
    #[tokio::test]
    async fn a_duplicate_restores_a_missing_body() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let full = item("p", "t", "evt_nobody", 1_000);
        let bare = InboxItem {
            body: Vec::new(),
            ..full.clone()
        };
        assert_eq!(store.put_new(&bare).await.unwrap(), PutOutcome::Inserted);
        assert!(matches!(
            store.claim(&full.key, "w1", 2_000, 10).await.unwrap(),
            ClaimOutcome::BodyMissing(_)
        ));
        let seen = ItemVersion::of(&store.get(&full.key).await.unwrap().unwrap());
        assert!(store
            .mark_dead_letter(&full.key, "body missing: gone", seen, 3_000)
            .await
            .unwrap());
        let mut retry = full.clone();
        retry.updated_at_ms = 4_000;
        match store.put_new(&retry).await.unwrap() {
            PutOutcome::Restored(now) => {
                assert_eq!(now.state, InboxState::Queued);
                assert_eq!(now.body, full.body);
                assert_eq!(now.updated_at_ms, 4_000);
            }
            other => panic!("expected a restore, got {other:?}"),
        }
        assert!(matches!(
            store.put_new(&retry).await.unwrap(),
            PutOutcome::Duplicate(_)
        ));
        assert!(matches!(
            store.claim(&full.key, "w2", 5_000, 1_000).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
    }

    #[tokio::test]
    async fn retryable_keeps_errors_and_is_claimable_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("p", "t", "evt_retry", 1);
        store.put_new(&a).await.unwrap();
        assert!(matches!(
            store.claim(&a.key, "w1", 100, 1_000).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        let retry = Finish {
            state: InboxState::Retryable,
            error_class: Some("transient".into()),
            error: Some("waiting: payment first".into()),
            result: None,
            now_ms: 200,
            wait: Default::default(),
            deliveries: None,
            relay_due_ms: None,
        };
        assert!(store
            .finish(&a.key, &Handout::leased("w1"), &retry)
            .await
            .unwrap());
        let claimed = match store.claim(&a.key, "w2", 300, 1_000).await.unwrap() {
            ClaimOutcome::Claimed(item) => item,
            other => panic!("expected a claim, got {other:?}"),
        };
        assert_eq!(claimed.attempts, 2);
        assert_eq!(claimed.last_error_class.as_deref(), Some("transient"));
        // Completing clears it: a completed event carries no error (its attempts tell).
        assert!(store
            .finish(
                &a.key,
                &Handout::leased("w2"),
                &finish(InboxState::Completed, 400)
            )
            .await
            .unwrap());
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Completed);
        assert_eq!((stored.last_error, stored.last_error_class), (None, None));
    }

    #[tokio::test]
    async fn mark_dead_letter_spares_terminal_and_live_items() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let waiting = item("p", "t", "waiting", 1);
        let live = item("p", "t", "live", 2);
        let done = item("p", "t", "done", 3);
        for it in [&waiting, &live, &done] {
            store.put_new(it).await.unwrap();
        }
        store.claim(&live.key, "w1", 100, 10_000).await.unwrap();
        store.claim(&done.key, "w1", 100, 10_000).await.unwrap();
        assert!(store
            .finish(
                &done.key,
                &Handout::leased("w1"),
                &finish(InboxState::Completed, 150)
            )
            .await
            .unwrap());
        for it in [&waiting, &live, &done] {
            let seen = ItemVersion::of(&store.get(&it.key).await.unwrap().unwrap());
            store
                .mark_dead_letter(&it.key, "redriven after 5 receives", seen, 200)
                .await
                .unwrap();
        }
        let nothing = ItemVersion {
            state: InboxState::Queued,
            updated_at_ms: 1,
        };
        assert!(!store
            .mark_dead_letter(&InboxKey::new("p", "t", "missing"), "x", nothing, 200)
            .await
            .unwrap());
        let state = |it: &InboxItem| {
            let key = it.key.clone();
            let store = &store;
            async move { store.get(&key).await.unwrap().unwrap() }
        };
        let w = state(&waiting).await;
        assert_eq!(w.state, InboxState::DeadLetter);
        assert_eq!(w.last_error.as_deref(), Some("redriven after 5 receives"));
        assert_eq!(state(&live).await.state, InboxState::Processing);
        assert_eq!(state(&done).await.state, InboxState::Completed);
        // Once the lease ran out, the stuck item is marked too, as read: not a
        // version read before its claim.
        let before_claim = ItemVersion {
            state: InboxState::Received,
            updated_at_ms: live.updated_at_ms,
        };
        assert!(!store
            .mark_dead_letter(&live.key, "redriven", before_claim, 20_000)
            .await
            .unwrap());
        let seen = ItemVersion::of(&state(&live).await);
        assert!(store
            .mark_dead_letter(&live.key, "redriven", seen, 20_000)
            .await
            .unwrap());
        let l = state(&live).await;
        assert_eq!(l.state, InboxState::DeadLetter);
        assert_eq!(l.lease_owner, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_claims_hand_out_one_lease() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let a = item("p", "t", "race", 1);
        store.put_new(&a).await.unwrap();
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = store.clone();
                let key = a.key.clone();
                tokio::spawn(async move {
                    store
                        .claim(&key, &format!("w{i}"), 1_000, 30_000)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut claimed = 0;
        for t in tasks {
            match t.await.unwrap() {
                ClaimOutcome::Claimed(_) => claimed += 1,
                ClaimOutcome::Leased { until_ms } => assert_eq!(until_ms, 31_000),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(claimed, 1);
    }
}
