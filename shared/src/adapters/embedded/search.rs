//! The operator's event search on SQLite: keyset paging, newest first.
//!
//! The order is (`received_at_ms` DESC, `pk` DESC), a total order, so a cursor is the
//! last row's pair and the next page starts strictly after it: no offsets, no row
//! seen twice or skipped when items arrive between pages.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};

use super::item_row::{item_from_row, ITEM_COLUMNS};
use super::DbError;
use crate::ports::{InboxFilter, InboxPage, InboxQuery, InboxState, SearchError, StateCounts};

/// Page size when the query says 0.
const DEFAULT_PAGE: usize = 100;
/// Largest page served: one page is one bounded read.
pub(super) const MAX_PAGE: usize = 1_000;

/// Where a page stopped. Versioned so a cursor of another format is refused, not
/// misread.
#[derive(Serialize, Deserialize)]
struct Cursor {
    v: u8,
    /// `received_at_ms` of the last item served.
    r: i64,
    /// `pk` of the last item served.
    k: String,
}

const CURSOR_VERSION: u8 = 1;

fn encode_cursor(received_at_ms: i64, pk: &str) -> String {
    let cursor = Cursor {
        v: CURSOR_VERSION,
        r: received_at_ms,
        k: pk.to_owned(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

/// The cursor's (received_at_ms, pk), or why it is not one of ours.
pub(super) fn decode_cursor(raw: &str) -> Result<(i64, String), SearchError> {
    let bad = |why: &str| SearchError::InvalidCursor(why.to_owned());
    let bytes = URL_SAFE_NO_PAD
        .decode(raw.trim())
        .map_err(|_| bad("not base64url"))?;
    let cursor: Cursor =
        serde_json::from_slice(&bytes).map_err(|_| bad("not a cursor of this store"))?;
    if cursor.v != CURSOR_VERSION {
        return Err(bad("not a cursor of this store"));
    }
    Ok((cursor.r, cursor.k))
}

/// One page of `query`; `after` is the decoded cursor.
pub(super) fn search(
    conn: &Connection,
    query: &InboxQuery,
    after: Option<(i64, String)>,
) -> Result<InboxPage, DbError> {
    let mut conditions: Vec<&str> = Vec::new();
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    let text = |s: &str| rusqlite::types::Value::Text(s.to_owned());
    let filter = &query.filter;
    if let Some(state) = filter.state {
        conditions.push("state = ?");
        args.push(text(state.as_str()));
    }
    for (column, value) in [
        ("provider = ?", &filter.provider),
        ("tenant = ?", &filter.tenant),
        ("event_type = ?", &query.event_type),
        ("object_id = ?", &query.object_id),
    ] {
        if let Some(value) = value {
            conditions.push(column);
            args.push(text(value));
        }
    }
    if let Some(since) = query.since_ms {
        conditions.push("received_at_ms >= ?");
        args.push(since.into());
    }
    if let Some(until) = query.until_ms {
        conditions.push("received_at_ms < ?");
        args.push(until.into());
    }
    if let Some((received, pk)) = after {
        conditions.push("(received_at_ms < ? OR (received_at_ms = ? AND pk < ?))");
        args.push(received.into());
        args.push(received.into());
        args.push(pk.into());
    }
    let mut sql = format!("SELECT {ITEM_COLUMNS} FROM inbox");
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(" ORDER BY received_at_ms DESC, pk DESC LIMIT ?");
    let page = page_size(filter.limit);
    // One row more than the page tells whether another page follows.
    args.push(i64::try_from(page + 1).unwrap_or(i64::MAX).into());

    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(args.iter()))?;
    let mut items = Vec::new();
    while let Some(row) = rows.next()? {
        items.push(item_from_row(row)?);
    }
    let next_cursor = if items.len() > page {
        items.truncate(page);
        items
            .last()
            .map(|last| encode_cursor(last.received_at_ms, last.key.as_str()))
    } else {
        None
    };
    Ok(InboxPage { items, next_cursor })
}

/// The page size asked for, 0 meaning the default, capped at [`MAX_PAGE`].
fn page_size(limit: usize) -> usize {
    if limit == 0 {
        DEFAULT_PAGE
    } else {
        limit.min(MAX_PAGE)
    }
}

/// Items per state in the filter's provider and tenant: one GROUP BY (the
/// `inbox_by_state` index covers it when no scope is given).
pub(super) fn count_states(
    conn: &Connection,
    filter: &InboxFilter,
) -> Result<StateCounts, DbError> {
    let mut conditions: Vec<&str> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    if let Some(provider) = &filter.provider {
        conditions.push("provider = ?");
        args.push(provider.clone());
    }
    if let Some(tenant) = &filter.tenant {
        conditions.push("tenant = ?");
        args.push(tenant.clone());
    }
    let mut sql = "SELECT state, COUNT(*) FROM inbox".to_owned();
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(" GROUP BY state");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(args.iter()))?;
    let mut counts: Vec<(InboxState, u64)> = InboxState::ALL.iter().map(|s| (*s, 0)).collect();
    while let Some(row) = rows.next()? {
        let state: String = row.get(0)?;
        let n: i64 = row.get(1)?;
        let state = InboxState::parse(&state)
            .ok_or_else(|| DbError::Corrupt(format!("unknown inbox state {state:?}")))?;
        if let Some(entry) = counts.iter_mut().find(|(s, _)| *s == state) {
            entry.1 = u64::try_from(n).unwrap_or(0);
        }
    }
    Ok(StateCounts {
        counts,
        truncated: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        let raw = encode_cursor(1_700_000_000_123, "stripe#t1#evt_1");
        assert_eq!(
            decode_cursor(&raw).unwrap(),
            (1_700_000_000_123, "stripe#t1#evt_1".to_owned())
        );
        for bad in [
            "",
            "!!!",
            "bm90IGpzb24",
            &URL_SAFE_NO_PAD.encode(br#"{"v":9,"r":1,"k":"x"}"#),
        ] {
            assert!(
                matches!(decode_cursor(bad), Err(SearchError::InvalidCursor(_))),
                "{bad:?}"
            );
        }
    }
}
