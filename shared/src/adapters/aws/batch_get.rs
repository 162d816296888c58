//! BatchGetItem with retries of the keys DynamoDB leaves unprocessed: the one loop the
//! inbox (sweeper, hints) and the state store share.

use std::time::Duration;

use aws_sdk_dynamodb::types::KeysAndAttributes;
use rand::Rng;

use super::error::describe;
use super::item::{self, s_attr};
use crate::ports::StoreError;

/// BatchGetItem reads at most this many keys per call.
pub(crate) const BATCH_GET_MAX: usize = 100;
/// Calls per BatchGetItem before unprocessed keys make the read fail.
const BATCH_GET_ATTEMPTS: u32 = 8;
const BATCH_GET_BASE_DELAY: Duration = Duration::from_millis(25);
const BATCH_GET_MAX_DELAY: Duration = Duration::from_secs(1);

/// The key maps of `pks` (the hash key `pk`) for a BatchGetItem request.
pub(crate) fn batch_keys(pks: &[String]) -> Vec<item::Item> {
    pks.iter()
        .map(|pk| item::Item::from([(item::PK.to_string(), s_attr(pk))]))
        .collect()
}

/// One BatchGetItem of at most [`BATCH_GET_MAX`] keys on `table`, retrying the keys
/// DynamoDB leaves unprocessed (throttling, the 16 MB response cap) with backoff.
/// Found items come in no particular order; absent keys are simply missing.
pub(crate) async fn batch_get(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    mut wanted: KeysAndAttributes,
) -> Result<Vec<item::Item>, StoreError> {
    let mut found = Vec::new();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let out = client
            .batch_get_item()
            .request_items(table, wanted)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB BatchGetItem", &e)))?;
        // Only one table is asked for; take whatever name the service echoes.
        for items in out.responses.unwrap_or_default().into_values() {
            found.extend(items);
        }
        let left = out
            .unprocessed_keys
            .unwrap_or_default()
            .into_values()
            .find(|left| !left.keys().is_empty());
        match left {
            None => return Ok(found),
            Some(left) if attempt >= BATCH_GET_ATTEMPTS => {
                return Err(StoreError::Unavailable(format!(
                    "DynamoDB BatchGetItem: {} keys still unprocessed after {attempt} calls",
                    left.keys().len()
                )))
            }
            Some(left) => {
                tokio::time::sleep(backoff(attempt)).await;
                // The unprocessed part keeps the request's projection and consistency.
                wanted = left;
            }
        }
    }
}

/// Exponential backoff with jitter: 25 ms << attempt, capped at 1 s, waiting between
/// half of it and all of it so that throttled readers do not retry in step.
fn backoff(attempt: u32) -> Duration {
    let cap = BATCH_GET_BASE_DELAY
        .saturating_mul(1 << attempt.min(16))
        .min(BATCH_GET_MAX_DELAY);
    let millis = cap.as_millis() as u64;
    Duration::from_millis(rand::thread_rng().gen_range(millis / 2..=millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        for attempt in 1..20 {
            let d = backoff(attempt);
            assert!(d <= BATCH_GET_MAX_DELAY, "{d:?}");
            assert!(d >= BATCH_GET_BASE_DELAY / 2, "{d:?}");
        }
    }
}
