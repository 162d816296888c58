//! Parked items on SQLite: the `wait_on` / `waiting_since_ms` columns, the partial
//! index `inbox_by_wait_on` of waiters by prerequisite record (as the sparse
//! `by_wait_shard` GSI on DynamoDB), and the sweeper's view of them through
//! `inbox_by_state_updated`.

use rusqlite::{params, Connection};

use super::DbError;
use crate::envelope::InboxKey;
use crate::ports::WaitingScan;

/// Added on open when missing (idempotent, so files from before waiting get them),
/// then the index. Both columns are NULL unless the item waits.
pub(super) fn ensure_waiting_columns(conn: &Connection) -> Result<(), DbError> {
    let has_column: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('inbox') WHERE name = 'wait_on'")?
        .exists([])?;
    if !has_column {
        conn.execute_batch(
            "BEGIN IMMEDIATE;
             ALTER TABLE inbox ADD COLUMN wait_on TEXT;
             ALTER TABLE inbox ADD COLUMN waiting_since_ms INTEGER;
             COMMIT;",
        )?;
    }
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS inbox_by_wait_on ON inbox(wait_on) WHERE wait_on IS NOT NULL;",
    )?;
    Ok(())
}

/// Items parked on `record_pk` (one range of the partial index).
pub(super) fn waiters_of(
    conn: &Connection,
    record_pk: &str,
    limit: usize,
) -> Result<Vec<InboxKey>, DbError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(
        "SELECT pk FROM inbox INDEXED BY inbox_by_wait_on \
         WHERE wait_on = ?1 AND state = 'waiting' ORDER BY pk LIMIT ?2",
    )?;
    let keys = stmt
        .query_map(params![record_pk, limit], |r| r.get::<_, String>(0))?
        .map(|pk| pk.map(InboxKey::from_stored))
        .collect::<Result<_, _>>()?;
    Ok(keys)
}

/// Count and oldest wait of at most `read_max` parked items, and the `limit` (at most
/// `read_max`) least recently touched of those last updated before `due_before_ms`.
/// The order is the cursor: a re-sent item is touched again when its re-run parks it
/// anew, so the next pass reaches the ones behind it.
pub(super) fn waiting_scan(
    conn: &Connection,
    due_before_ms: i64,
    limit: usize,
    read_max: usize,
) -> Result<WaitingScan, DbError> {
    let read_max = read_max.max(1);
    let cap = i64::try_from(read_max).unwrap_or(i64::MAX);
    let (count, oldest): (i64, Option<i64>) = conn
        .prepare_cached(
            "SELECT COUNT(*), MIN(waiting_since_ms) FROM \
             (SELECT waiting_since_ms FROM inbox INDEXED BY inbox_by_state_updated \
              WHERE state = 'waiting' ORDER BY updated_at_ms LIMIT ?1)",
        )?
        .query_row([cap], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let limit = i64::try_from(limit.min(read_max)).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(
        "SELECT pk FROM inbox INDEXED BY inbox_by_state_updated \
         WHERE state = 'waiting' AND updated_at_ms < ?1 ORDER BY updated_at_ms LIMIT ?2",
    )?;
    let due = stmt
        .query_map(params![due_before_ms, limit], |r| r.get::<_, String>(0))?
        .map(|pk| pk.map(InboxKey::from_stored))
        .collect::<Result<_, _>>()?;
    Ok(WaitingScan {
        count: usize::try_from(count).unwrap_or(0),
        oldest_since_ms: oldest,
        due,
    })
}
