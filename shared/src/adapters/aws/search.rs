//! The operator's event search on DynamoDB: a **bounded** Scan of the inbox table.
//!
//! Why a Scan and no index: an index that serves every filter (provider, tenant,
//! type, object, time) would be written by every webhook, the cost the hot path is
//! kept free of (≤ 6 WRU a webhook is the target); a search is an operator's click. So one
//! page reads at most [`SCAN_REQUESTS_PER_PAGE`] Scan requests of
//! [`SCAN_ITEMS_PER_REQUEST`] items (≤ 2,000 items read, whatever the table's size)
//! with the filters as a filter expression, and the cursor is where the Scan stopped
//! (the key of the last item served, or the Scan's `LastEvaluatedKey`): a page may
//! be short or empty while `next_cursor` says more may follow. The order is the
//! table's key order, stable across pages.

use aws_sdk_dynamodb::operation::scan::builders::ScanFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, Select};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::error::describe;
use super::item;
use super::AwsStore;
use crate::ports::{
    InboxFilter, InboxItem, InboxPage, InboxQuery, InboxState, SearchError, StateCounts, StoreError,
};

/// Page size when the query says 0.
const DEFAULT_PAGE: usize = 100;
/// Largest page served.
const MAX_PAGE: usize = 1_000;
/// Items one Scan request reads (DynamoDB's `Limit`: read, before the filter).
pub const SCAN_ITEMS_PER_REQUEST: i32 = 500;
/// Scan requests one search page makes at most.
pub const SCAN_REQUESTS_PER_PAGE: usize = 4;
/// Scan requests one [`count_states`] makes at most (each reads ≤ 1 MB): beyond,
/// the counts are marked truncated (lower bounds).
pub const COUNT_SCAN_REQUESTS: usize = 16;

#[derive(Serialize, Deserialize)]
struct Cursor {
    v: u8,
    /// The table key (`pk`) to start after.
    k: String,
}

const CURSOR_VERSION: u8 = 1;

fn encode_cursor(pk: &str) -> String {
    let cursor = Cursor {
        v: CURSOR_VERSION,
        k: pk.to_owned(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

fn decode_cursor(raw: &str) -> Result<String, SearchError> {
    let bad = |why: &str| SearchError::InvalidCursor(why.to_owned());
    let bytes = URL_SAFE_NO_PAD
        .decode(raw.trim())
        .map_err(|_| bad("not base64url"))?;
    let cursor: Cursor =
        serde_json::from_slice(&bytes).map_err(|_| bad("not a cursor of this store"))?;
    if cursor.v != CURSOR_VERSION || cursor.k.is_empty() {
        return Err(bad("not a cursor of this store"));
    }
    Ok(cursor.k)
}

fn start_key(pk: String) -> std::collections::HashMap<String, AttributeValue> {
    std::collections::HashMap::from([(item::PK.to_owned(), AttributeValue::S(pk))])
}

fn pk_of(key: &std::collections::HashMap<String, AttributeValue>) -> Option<String> {
    match key.get(item::PK) {
        Some(AttributeValue::S(pk)) => Some(pk.clone()),
        _ => None,
    }
}

/// `request` with the query's filters as its filter expression.
fn filtered(mut request: ScanFluentBuilder, query: &InboxQuery) -> ScanFluentBuilder {
    let mut conditions: Vec<String> = Vec::new();
    let mut equal = |request: ScanFluentBuilder, name: &str, value: &str| {
        let n = conditions.len();
        conditions.push(format!("#f{n} = :f{n}"));
        request
            .expression_attribute_names(format!("#f{n}"), name)
            .expression_attribute_values(format!(":f{n}"), AttributeValue::S(value.to_owned()))
    };
    let filter = &query.filter;
    if let Some(state) = filter.state {
        request = equal(request, item::STATE, state.as_str());
    }
    for (name, value) in [
        (item::PROVIDER, &filter.provider),
        (item::TENANT, &filter.tenant),
        (item::EVENT_TYPE, &query.event_type),
        (item::OBJECT_ID, &query.object_id),
    ] {
        if let Some(value) = value {
            request = equal(request, name, value);
        }
    }
    if query.since_ms.is_some() || query.until_ms.is_some() {
        request = request.expression_attribute_names("#received", item::RECEIVED_AT_MS);
    }
    if let Some(since) = query.since_ms {
        conditions.push("#received >= :since".into());
        request =
            request.expression_attribute_values(":since", AttributeValue::N(since.to_string()));
    }
    if let Some(until) = query.until_ms {
        conditions.push("#received < :until".into());
        request =
            request.expression_attribute_values(":until", AttributeValue::N(until.to_string()));
    }
    if conditions.is_empty() {
        request
    } else {
        request.filter_expression(conditions.join(" AND "))
    }
}

impl AwsStore {
    pub(super) async fn search_scan(&self, query: &InboxQuery) -> Result<InboxPage, SearchError> {
        let mut start = query.cursor.as_deref().map(decode_cursor).transpose()?;
        let page = match query.filter.limit {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let request = filtered(
            self.dynamodb
                .scan()
                .table_name(&self.table)
                .limit(SCAN_ITEMS_PER_REQUEST),
            query,
        );
        let mut items: Vec<InboxItem> = Vec::new();
        for _ in 0..SCAN_REQUESTS_PER_PAGE {
            let out = request
                .clone()
                .set_exclusive_start_key(start.take().map(start_key))
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(describe("DynamoDB Scan", &e)))?;
            let next = out.last_evaluated_key.as_ref().and_then(pk_of);
            for m in out.items.unwrap_or_default() {
                // The relay's ordering cursors share the table; they are no events.
                if !item::is_event(&m) {
                    continue;
                }
                let found = item::decode(m).map_err(StoreError::Corrupt)?;
                items.push(found);
                if items.len() == page {
                    // The page is full mid-response: the next one starts after the
                    // last item served (key order), not after the whole response.
                    let last = items.last().map(|i| i.key.as_str().to_owned());
                    return Ok(InboxPage {
                        items,
                        next_cursor: last.map(|pk| encode_cursor(&pk)),
                    });
                }
            }
            match next {
                Some(pk) => start = Some(pk),
                None => {
                    return Ok(InboxPage {
                        items,
                        next_cursor: None,
                    })
                }
            }
        }
        // The read bound is reached: the caller pages on from here.
        Ok(InboxPage {
            items,
            next_cursor: start.map(|pk| encode_cursor(&pk)),
        })
    }

    pub(super) async fn count_states_scan(
        &self,
        filter: &InboxFilter,
    ) -> Result<StateCounts, StoreError> {
        let scope = InboxQuery {
            filter: InboxFilter {
                provider: filter.provider.clone(),
                tenant: filter.tenant.clone(),
                ..InboxFilter::default()
            },
            ..InboxQuery::default()
        };
        // Only the key and the state come back (the read still costs the items' size).
        let request = filtered(
            self.dynamodb
                .scan()
                .table_name(&self.table)
                .select(Select::SpecificAttributes)
                .projection_expression("#pk, #state")
                .expression_attribute_names("#pk", item::PK)
                .expression_attribute_names("#state", item::STATE),
            &scope,
        );
        let mut counts: Vec<(InboxState, u64)> = InboxState::ALL.iter().map(|s| (*s, 0)).collect();
        let mut start = None;
        for _ in 0..COUNT_SCAN_REQUESTS {
            let out = request
                .clone()
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(describe("DynamoDB Scan", &e)))?;
            for m in out.items.unwrap_or_default() {
                if !item::is_event(&m) {
                    continue;
                }
                let state = match m.get(item::STATE) {
                    Some(AttributeValue::S(s)) => InboxState::parse(s),
                    _ => None,
                };
                let state = state.ok_or_else(|| {
                    StoreError::Corrupt("inbox item without a known state".into())
                })?;
                if let Some(entry) = counts.iter_mut().find(|(s, _)| *s == state) {
                    entry.1 += 1;
                }
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(StateCounts {
                    counts,
                    truncated: false,
                });
            }
        }
        Ok(StateCounts {
            counts,
            truncated: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        assert_eq!(
            decode_cursor(&encode_cursor("stripe#t#e")).unwrap(),
            "stripe#t#e"
        );
        for bad in [
            "",
            "%%",
            "bm9wZQ",
            &URL_SAFE_NO_PAD.encode(br#"{"v":1,"k":""}"#),
        ] {
            assert!(
                matches!(decode_cursor(bad), Err(SearchError::InvalidCursor(_))),
                "{bad:?}"
            );
        }
    }
}
