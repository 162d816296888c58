//! The rules of one order cursor (one ordered destination and one object), pure and
//! shared by both stores: SQLite keeps a cursor as a JSON row, DynamoDB as an item
//! written conditionally on the version read. Each store only loads, applies
//! [`Cursor::acquire`] / [`Cursor::release`], and writes back when the cursor changed.
//!
//! What "ordered" promises:
//! - one delivery in flight per object, held by one run ([`Holder`]): a second run of
//!   the same event (a duplicate message, a relay pass beside the processor) waits;
//! - queued events go out lowest [`OrderPosition`] first (the object version, else
//!   `occurred_at`, else the receipt; ties in arrival order), after the window a burst
//!   opens on an idle object;
//! - an event is `superseded` only when its provider's own object version is strictly
//!   older than the newest version the destination has; ties and events without a
//!   version are always delivered, never dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::envelope::InboxKey;
use crate::ports::MAX_ORDER_QUEUE;
use crate::ports::{OrderClaim, OrderGate, OrderPosition, OrderRelease, ReleaseOutcome};

/// A key waiting for its object's turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The inbox item it delivers (handed the turn on a release).
    pub item: String,
    pub position: OrderPosition,
    /// When it was queued (Unix ms): entries older than a claim's `stale_before_ms`
    /// are dropped as abandoned.
    pub since_ms: i64,
}

/// The run whose delivery is in flight: only it may go until it releases or its hold
/// ends (a crashed run's hold lapses by itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub key: String,
    pub run: String,
    pub until_ms: i64,
}

/// One cursor's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The last event delivered (a re-run of it is told it went out before).
    pub delivered: Option<OrderPosition>,
    /// The newest provider version delivered: only what is strictly older is superseded.
    pub delivered_version: Option<i64>,
    pub holder: Option<Holder>,
    /// Nothing is sent before this time (the window the first queued event opened).
    pub window_until_ms: Option<i64>,
    /// The waiting keys.
    pub queue: BTreeMap<String, Entry>,
}

impl Cursor {
    /// The queued key with the lowest position.
    fn head(&self) -> Option<(&String, &Entry)> {
        self.queue
            .iter()
            .min_by(|a, b| a.1.position.cmp(&b.1.position))
    }

    fn is_superseded(&self, position: &OrderPosition) -> bool {
        older_than(position, self.delivered_version)
    }

    /// The decision of [`crate::ports::InboxRelay::order_acquire`].
    pub fn acquire(&mut self, claim: &OrderClaim, now_ms: i64) -> OrderGate {
        self.queue
            .retain(|key, e| *key == claim.key || e.since_ms >= claim.stale_before_ms);
        if self.holder.as_ref().is_some_and(|h| h.until_ms <= now_ms) {
            self.holder = None;
        }
        let went_before = self.delivered.as_ref() == Some(&claim.position);
        if went_before || self.is_superseded(&claim.position) {
            self.queue.remove(&claim.key);
            if self.holder.as_ref().is_some_and(|h| h.key == claim.key) {
                self.holder = None;
            }
            let delivered = if went_before {
                claim.position.clone()
            } else {
                // Superseded: report what the destination has.
                self.delivered
                    .clone()
                    .unwrap_or_else(|| claim.position.clone())
            };
            return OrderGate::Superseded { delivered };
        }
        let retry = now_ms.saturating_add(claim.window_ms.max(1_000));
        if !self.queue.contains_key(&claim.key) {
            if self.queue.len() >= MAX_ORDER_QUEUE {
                // Full: wait outside the queue and ask again later.
                return OrderGate::Wait { until_ms: retry };
            }
            if self.queue.is_empty() && self.holder.is_none() {
                // The first on an idle object opens the window.
                self.window_until_ms = Some(now_ms.saturating_add(claim.window_ms));
            }
            self.queue.insert(
                claim.key.clone(),
                Entry {
                    item: claim.item.as_str().to_string(),
                    position: claim.position.clone(),
                    since_ms: now_ms,
                },
            );
        }
        if let Some(holder) = &self.holder {
            if holder.key == claim.key && holder.run == claim.run {
                return OrderGate::Go;
            }
            // Another run holds the object (of this event: a second run in flight;
            // of another: its release hands the turn on at once).
            let until_ms = if holder.key == claim.key {
                holder.until_ms
            } else {
                retry
            };
            return OrderGate::Wait { until_ms };
        }
        if let Some(window) = self.window_until_ms.filter(|w| now_ms < *w) {
            return OrderGate::Wait { until_ms: window };
        }
        if self.head().is_some_and(|(key, _)| *key == claim.key) {
            self.holder = Some(Holder {
                key: claim.key.clone(),
                run: claim.run.clone(),
                until_ms: now_ms.saturating_add(claim.hold_ms),
            });
            OrderGate::Go
        } else {
            // An older event goes first; its release hands the turn on at once.
            OrderGate::Wait { until_ms: retry }
        }
    }

    /// The decision of [`crate::ports::InboxRelay::order_release`]. Returns the item
    /// now heading the queue (to be handed the turn).
    pub fn release(&mut self, release: &OrderRelease) -> Option<InboxKey> {
        let holds = self
            .holder
            .as_ref()
            .is_some_and(|h| h.key == release.key && h.run == release.run);
        if holds {
            self.holder = None;
        }
        match &release.outcome {
            // Keeps its place in the queue: the retry goes first again.
            ReleaseOutcome::Retrying => {}
            ReleaseOutcome::Failed => {
                self.queue.remove(&release.key);
            }
            ReleaseOutcome::Delivered(position) => {
                self.queue.remove(&release.key);
                if self.delivered.as_ref().is_none_or(|d| d < position) {
                    self.delivered = Some(position.clone());
                }
                if let Some(version) = position.version {
                    self.delivered_version =
                        Some(self.delivered_version.map_or(version, |v| v.max(version)));
                }
                // Entries strictly older than the delivered version are superseded:
                // their own acquire says so; queued they would only hold the turn.
                let newest = self.delivered_version;
                self.queue.retain(|_, e| !older_than(&e.position, newest));
            }
        }
        if self.holder.is_some() {
            return None;
        }
        self.head()
            .map(|(_, e)| InboxKey::from_stored(e.item.clone()))
    }
}

/// Whether `position` has a provider version strictly older than `newest`.
fn older_than(position: &OrderPosition, newest: Option<i64>) -> bool {
    matches!((position.version, newest), (Some(version), Some(newest)) if version < newest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(id: &str, at: i64, version: Option<i64>) -> OrderPosition {
        OrderPosition {
            at,
            received_ms: 0,
            event_id: id.into(),
            version,
        }
    }

    fn claim(key: &str, at: i64, version: Option<i64>) -> OrderClaim {
        OrderClaim {
            cursor: "shop#shopify#t1#1001".into(),
            key: key.into(),
            run: format!("run-{key}"),
            item: InboxKey::from_stored(format!("shopify#t1#evt_{key}")),
            position: position(&format!("evt_{key}"), at, version),
            window_ms: 2_000,
            hold_ms: 60_000,
            stale_before_ms: 0,
            retain_until_secs: 0,
        }
    }

    fn released(c: &mut Cursor, claim: &OrderClaim, outcome: ReleaseOutcome) -> Option<InboxKey> {
        c.release(&OrderRelease {
            cursor: claim.cursor.clone(),
            key: claim.key.clone(),
            run: claim.run.clone(),
            outcome,
        })
    }

    fn delivered(c: &mut Cursor, claim: &OrderClaim) -> Option<InboxKey> {
        released(c, claim, ReleaseOutcome::Delivered(claim.position.clone()))
    }

    #[test]
    fn a_shuffled_burst_goes_out_in_order_one_at_a_time() {
        let mut c = Cursor::default();
        let (k1, k2, k3) = (
            claim("k1", 1, Some(1)),
            claim("k2", 2, Some(2)),
            claim("k3", 3, Some(3)),
        );
        // k3 first opens the window: nothing goes before it ends.
        assert_eq!(c.acquire(&k3, 100), OrderGate::Wait { until_ms: 2_100 });
        assert!(matches!(c.acquire(&k1, 200), OrderGate::Wait { .. }));
        assert!(matches!(c.acquire(&k2, 300), OrderGate::Wait { .. }));
        // After the window only the oldest goes, and holds the object.
        assert!(matches!(c.acquire(&k3, 2_200), OrderGate::Wait { .. }));
        assert_eq!(c.acquire(&k1, 2_200), OrderGate::Go);
        let before = c.clone();
        assert_eq!(c.acquire(&k1, 2_300), OrderGate::Go, "the same run again");
        assert_eq!(c, before, "asking again changes nothing");
        assert!(matches!(c.acquire(&k2, 2_300), OrderGate::Wait { .. }));
        let next = delivered(&mut c, &k1);
        assert_eq!(
            next.as_ref().map(InboxKey::as_str),
            Some("shopify#t1#evt_k2")
        );
        assert_eq!(c.acquire(&k2, 2_400), OrderGate::Go);
        delivered(&mut c, &k2);
        assert_eq!(c.acquire(&k3, 2_500), OrderGate::Go);
        assert_eq!(delivered(&mut c, &k3), None);
        // A straggler with an older version is superseded, never queued.
        assert_eq!(
            c.acquire(&claim("k0", 0, Some(0)), 3_000),
            OrderGate::Superseded {
                delivered: k3.position.clone()
            }
        );
        assert!(c.queue.is_empty());
        // A re-run of the delivered event hears that it went out before.
        assert_eq!(
            c.acquire(&k3, 3_100),
            OrderGate::Superseded {
                delivered: k3.position.clone()
            }
        );
    }

    #[test]
    fn ties_and_events_without_a_version_are_delivered_in_arrival_order() {
        // Stripe: no object version; two events stamped in the same second, the
        // second's id sorting before the first's.
        let mut processing = claim("processing", 5_000, None);
        processing.position.event_id = "evt_B".into();
        processing.position.received_ms = 10;
        let mut succeeded = claim("succeeded", 5_000, None);
        succeeded.position.event_id = "evt_A".into();
        succeeded.position.received_ms = 20;
        let mut c = Cursor::default();
        processing.window_ms = 0;
        succeeded.window_ms = 0;
        assert_eq!(c.acquire(&processing, 0), OrderGate::Go);
        delivered(&mut c, &processing);
        assert_eq!(c.acquire(&succeeded, 1), OrderGate::Go, "a tie goes out");
        delivered(&mut c, &succeeded);
        // An older event without a version arriving late is still delivered.
        let mut late = claim("late", 1_000, None);
        late.window_ms = 0;
        assert_eq!(c.acquire(&late, 2), OrderGate::Go);
        delivered(&mut c, &late);
        // Shopify: the same updated_at is a tie, delivered; strictly older is not.
        let mut c = Cursor::default();
        let mut v = claim("v", 9_000, Some(9_000));
        v.window_ms = 0;
        assert_eq!(c.acquire(&v, 0), OrderGate::Go);
        delivered(&mut c, &v);
        let mut same = claim("same", 9_000, Some(9_000));
        same.position.received_ms = 5;
        same.window_ms = 0;
        assert_eq!(c.acquire(&same, 1), OrderGate::Go);
        delivered(&mut c, &same);
        let mut older = claim("older", 8_000, Some(8_000));
        older.window_ms = 0;
        assert!(matches!(c.acquire(&older, 2), OrderGate::Superseded { .. }));
    }

    #[test]
    fn one_run_holds_the_turn_and_a_crashed_runs_hold_lapses() {
        let mut c = Cursor::default();
        let mut first = claim("k1", 1, Some(1));
        first.window_ms = 0;
        assert_eq!(c.acquire(&first, 0), OrderGate::Go);
        // A second run of the same event (a duplicate message) waits for the hold.
        let mut second = first.clone();
        second.run = "run-other".into();
        assert_eq!(c.acquire(&second, 10), OrderGate::Wait { until_ms: 60_000 });
        // The first run never releases (killed): its hold lapses, the second goes.
        assert_eq!(c.acquire(&second, 60_000), OrderGate::Go);
        // The first run's late release does not free the second's hold.
        assert_eq!(delivered(&mut c, &first), None);
        assert_eq!(c.holder.as_ref().map(|h| h.run.as_str()), Some("run-other"));
    }

    #[test]
    fn a_retrying_delivery_keeps_its_place_and_a_failed_one_hands_on() {
        let mut c = Cursor::default();
        let (k1, k2) = (claim("k1", 1, Some(1)), claim("k2", 2, Some(2)));
        c.acquire(&k1, 0);
        c.acquire(&k2, 0);
        assert_eq!(c.acquire(&k1, 2_000), OrderGate::Go);
        // A failed attempt that will be retried frees the hold, keeps the head.
        assert_eq!(
            released(&mut c, &k1, ReleaseOutcome::Retrying),
            Some(InboxKey::from_stored("shopify#t1#evt_k1"))
        );
        assert!(matches!(c.acquire(&k2, 2_100), OrderGate::Wait { .. }));
        let mut retry = k1.clone();
        retry.run = "run-k1-retry".into();
        assert_eq!(c.acquire(&retry, 7_000), OrderGate::Go);
        // Dead-lettered: leaves without raising the position, the next goes.
        assert_eq!(
            released(&mut c, &retry, ReleaseOutcome::Failed),
            Some(InboxKey::from_stored("shopify#t1#evt_k2"))
        );
        assert_eq!(c.delivered, None);
        assert_eq!(c.acquire(&k2, 7_100), OrderGate::Go);
    }

    #[test]
    fn stale_entries_are_dropped_and_a_full_queue_waits_outside() {
        let mut c = Cursor::default();
        let mut lost = claim("lost", 1, Some(1));
        lost.window_ms = 0;
        c.acquire(&lost, 0);
        released(&mut c, &lost, ReleaseOutcome::Retrying);
        let mut next = claim("k2", 2, Some(2));
        next.window_ms = 0;
        assert!(matches!(c.acquire(&next, 20), OrderGate::Wait { .. }));
        next.stale_before_ms = 15;
        assert_eq!(c.acquire(&next, 30), OrderGate::Go);
        assert!(!c.queue.contains_key("lost"));

        let mut full = Cursor::default();
        for i in 0..MAX_ORDER_QUEUE {
            full.acquire(&claim(&format!("q{i}"), 10 + i as i64, None), 1);
        }
        let before = full.clone();
        assert!(matches!(
            full.acquire(&claim("late", 99, None), 2),
            OrderGate::Wait { .. }
        ));
        assert_eq!(full, before);
    }
}
