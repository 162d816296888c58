//! Keyed lanes: within one process, the decisions on one business record take turns.
//!
//! Two events that target the same record (orders of one best-selling SKU) would
//! otherwise load the same version, decide, and all but one would conflict, reload,
//! decide again — under load most of the work is thrown away and a run can run out
//! of rounds. A lane per record lets one run at a time load, decide and commit on it;
//! the next one then loads the version just committed, so the hot record's
//! throughput is its commit rate, not a storm of retries. Runs on different records
//! never wait for each other. Across processes (several Lambdas) the version guard
//! of the commit still decides, and conflicts are retried.
//!
//! The map holds only lanes that someone holds or waits for: the last guard of a lane
//! removes it, so nothing grows with the number of records ever touched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Lane = Arc<AsyncMutex<()>>;

#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<String, Lane>>,
}

/// The lanes of one run; released when dropped.
pub(crate) struct LaneGuard<'a> {
    lanes: &'a Lanes,
    held: Vec<(String, OwnedMutexGuard<()>)>,
}

impl Lanes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Lane>> {
        // Held only to look up or remove an entry, never across an await.
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lane(&self, key: &str) -> Lane {
        self.lock().entry(key.to_string()).or_default().clone()
    }

    /// Take the lanes of `keys` (sorted and deduplicated here, so two runs taking
    /// overlapping sets cannot deadlock). `on_wait` runs once, before the first lane
    /// that someone else holds is awaited (a gathered commit stops counting on this
    /// run while it waits).
    pub(crate) async fn enter<'a>(
        &'a self,
        keys: &[String],
        on_wait: impl FnOnce(),
    ) -> LaneGuard<'a> {
        let mut keys: Vec<&String> = keys.iter().collect();
        keys.sort();
        keys.dedup();
        let mut guard = LaneGuard {
            lanes: self,
            held: Vec::with_capacity(keys.len()),
        };
        let mut on_wait = Some(on_wait);
        for key in keys {
            let lane = self.lane(key);
            let held = match lane.clone().try_lock_owned() {
                Ok(held) => held,
                Err(_) => {
                    if let Some(f) = on_wait.take() {
                        f();
                    }
                    lane.lock_owned().await
                }
            };
            guard.held.push((key.clone(), held));
        }
        guard
    }

    /// Lanes currently held or waited for (tests: the map does not grow).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        for (key, held) in self.held.drain(..) {
            let lane = Arc::clone(OwnedMutexGuard::mutex(&held));
            drop(held);
            let mut lanes = self.lanes.lock();
            // Ours and the map's: nobody else holds or waits for it (a waiter clones
            // the lane under this same lock before it waits).
            if Arc::strong_count(&lane) == 2 {
                lanes.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn one_run_at_a_time_per_record_and_no_lane_left_behind() {
        let lanes = Arc::new(Lanes::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let waited = Arc::new(AtomicUsize::new(0));
        let runs = (0..16).map(|i| {
            let (lanes, inside, waited) = (lanes.clone(), inside.clone(), waited.clone());
            tokio::spawn(async move {
                // Every run shares the hot record; half also take a record of their own,
                // in either order.
                let keys = if i % 2 == 0 {
                    vec!["sku".to_string(), format!("order{i}")]
                } else {
                    vec![format!("order{i}"), "sku".to_string()]
                };
                let _guard = lanes
                    .enter(&keys, || {
                        waited.fetch_add(1, Ordering::SeqCst);
                    })
                    .await;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two runs inside");
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            })
        });
        for run in futures::future::join_all(runs).await {
            run.unwrap();
        }
        assert!(waited.load(Ordering::SeqCst) > 0, "nobody ever waited");
        assert_eq!(lanes.len(), 0, "lanes outlived their runs");
    }

    #[tokio::test]
    async fn runs_on_different_records_do_not_wait() {
        let lanes = Lanes::default();
        let a = lanes.enter(&["a".to_string()], || panic!("waited")).await;
        let b = lanes.enter(&["b".to_string()], || panic!("waited")).await;
        assert_eq!(lanes.len(), 2);
        drop((a, b));
        assert_eq!(lanes.len(), 0);
    }
}
