//! Paged DynamoDB Queries on the inbox table's indexes, shared by the hint and the
//! waiting readers.

use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;

use super::error::describe;
use super::item;
use crate::ports::StoreError;

/// Largest Query page asked for.
const QUERY_PAGE_MAX: usize = 1_000;

/// Up to `limit` items of `query` (table, index and conditions set), read page by
/// page, [`QUERY_PAGE_MAX`] at most a page, until `limit` or the end of the range.
pub(super) async fn query_up_to(
    query: QueryFluentBuilder,
    limit: usize,
) -> Result<Vec<item::Item>, StoreError> {
    let mut items = Vec::new();
    let mut start = None;
    while items.len() < limit {
        let page = (limit - items.len()).min(QUERY_PAGE_MAX) as i32;
        let out = query
            .clone()
            .limit(page)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB Query", &e)))?;
        items.extend(out.items.unwrap_or_default());
        start = out.last_evaluated_key;
        if start.is_none() {
            break;
        }
    }
    items.truncate(limit);
    Ok(items)
}

/// The `pk` of an entry of `index`.
pub(super) fn pk_of(m: &item::Item, index: &str) -> Result<String, StoreError> {
    match m.get(item::PK) {
        Some(AttributeValue::S(pk)) => Ok(pk.clone()),
        _ => Err(StoreError::Corrupt(format!(
            "index {index}: entry without a string pk"
        ))),
    }
}
