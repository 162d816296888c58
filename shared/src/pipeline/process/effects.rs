//! The guarded writes of a decision: effect keys dropped when applied, one write per
//! record, version checks of the records read, and whether it moved a payment status.

use super::outcome::Failure;
use crate::domain::state::{ReadCheck, StateKey, StateRecord, StateWrite, MAX_APPLIED_KEYS};
use crate::domain::Change;

/// The record field whose change makes an event a payment event (the business SLI).
pub const PAYMENT_STATUS_FIELD: &str = "payment_status";
/// A record created with this payment status is not a payment event.
const INITIAL_PAYMENT_STATUS: &str = "pending";

/// True when the writes move some record's [`PAYMENT_STATUS_FIELD`] away from its
/// loaded value (a new record only when it is not created in the initial status).
pub(super) fn moves_payment_status(current: &[StateRecord], writes: &[StateWrite]) -> bool {
    writes.iter().any(|write| {
        let Some(new) = write.record.data.get(PAYMENT_STATUS_FIELD) else {
            return false;
        };
        let old = current
            .iter()
            .find(|r| r.key == write.record.key)
            .and_then(|r| r.data.get(PAYMENT_STATUS_FIELD));
        match old {
            Some(old) => old != new,
            None => new.as_str() != Some(INITIAL_PAYMENT_STATUS),
        }
    })
}

/// The guarded writes of a decision: changes whose effect key is already applied are
/// dropped; the others become one write per record (version + 1, new data), expected
/// at the version that was loaded. Each effect key is added to the record that holds
/// it ([`Change::key_holder`]): a change keyed on an owner also writes the owner (with
/// its loaded data unless the owner changes too), so key and change commit together.
/// A write that would grow an `applied` set past [`MAX_APPLIED_KEYS`] is permanent.
pub(super) fn plan_writes(
    current: &[StateRecord],
    changes: Vec<Change>,
) -> Result<Vec<StateWrite>, Failure> {
    let loaded = |key: &StateKey, what: &str| {
        current.iter().find(|r| r.key == *key).ok_or_else(|| {
            Failure::Permanent(format!(
                "domain {what} record {} that it did not list in its targets",
                key.pk()
            ))
        })
    };
    let mut writes: Vec<StateWrite> = Vec::new();
    for change in changes {
        let record = loaded(&change.key, "changed")?;
        let holder = loaded(change.key_holder(), "keyed a change on")?;
        // The holder has the key once applied; the changed record itself may hold it
        // too, from before its changes were keyed on an owner.
        if holder.applied.contains(&change.effect_key)
            || record.applied.contains(&change.effect_key)
        {
            continue;
        }
        write_of(&mut writes, record).record.data = change.data;
        write_of(&mut writes, holder)
            .record
            .applied
            .insert(change.effect_key);
    }
    for write in &writes {
        let keys = write.record.applied.len();
        let before = current
            .iter()
            .find(|r| r.key == write.record.key)
            .map_or(0, |r| r.applied.len());
        if keys > MAX_APPLIED_KEYS && keys > before {
            return Err(Failure::Permanent(format!(
                "record {} would hold {keys} effect keys, more than {MAX_APPLIED_KEYS}: a \
                 record that many events change must not collect a key per event; key \
                 those changes on the record that owns the effect (Change::keyed_on)",
                write.record.key.pk()
            )));
        }
    }
    Ok(writes)
}

/// The pending write of `loaded`'s record, created from the loaded record if needed.
fn write_of<'w>(writes: &'w mut Vec<StateWrite>, loaded: &StateRecord) -> &'w mut StateWrite {
    let at = match writes.iter().position(|w| w.record.key == loaded.key) {
        Some(at) => at,
        None => {
            let mut record = loaded.clone();
            record.version = loaded.version + 1;
            writes.push(StateWrite {
                record,
                expected_version: loaded.version,
            });
            writes.len() - 1
        }
    };
    &mut writes[at]
}

/// A version check for every loaded record the writes leave alone and whose read the
/// domain guards, so the decision cannot commit on a stale read.
pub(super) fn read_checks(
    current: &[StateRecord],
    writes: &[StateWrite],
    guards_read: impl Fn(&StateKey) -> bool,
) -> Vec<ReadCheck> {
    let mut checks: Vec<ReadCheck> = Vec::new();
    for record in current {
        let written = writes.iter().any(|w| w.record.key == record.key);
        let checked = checks.iter().any(|c| c.key == record.key);
        if !written && !checked && guards_read(&record.key) {
            checks.push(ReadCheck {
                key: record.key.clone(),
                version: record.version,
            });
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(id: &str, version: u64, applied: &[&str]) -> StateRecord {
        StateRecord {
            key: StateKey::new("t", "counter", id),
            version,
            data: json!({ "count": version }),
            applied: applied.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn change(id: &str, effect: &str, count: u64) -> Change {
        Change::new(
            StateKey::new("t", "counter", id),
            effect,
            json!({ "count": count }),
        )
    }

    #[test]
    fn plan_drops_applied_effects_and_merges_per_record() {
        let current = [record("a", 3, &["e1"]), record("b", 0, &[])];
        let writes = plan_writes(
            &current,
            vec![
                change("a", "e1", 4),
                change("b", "e2", 1),
                change("b", "e3", 2),
            ],
        )
        .unwrap();
        assert_eq!(writes.len(), 1);
        let w = &writes[0];
        assert_eq!((w.expected_version, w.record.version), (0, 1));
        assert_eq!(w.record.data, json!({ "count": 2 }));
        assert_eq!(w.record.applied.iter().collect::<Vec<_>>(), ["e2", "e3"]);

        assert!(plan_writes(&current, vec![change("a", "e1", 9)])
            .unwrap()
            .is_empty());
        let writes = plan_writes(&current, vec![change("a", "e4", 4)]).unwrap();
        assert_eq!(
            (writes[0].expected_version, writes[0].record.version),
            (3, 4)
        );
        assert_eq!(writes[0].record.applied.len(), 2);
    }

    #[test]
    fn a_change_keyed_on_its_owner_leaves_the_shared_record_keyless() {
        let order = StateKey::new("t", "order", "o1");
        let sku = StateKey::new("t", "sku", "s1");
        let loaded = |key: &StateKey, version: u64, applied: &[&str]| StateRecord {
            key: key.clone(),
            version,
            data: json!({ "v": version }),
            applied: applied.iter().map(|s| s.to_string()).collect(),
        };
        let current = [loaded(&order, 0, &[]), loaded(&sku, 7, &["seed"])];
        let stock = |key: &str| Change::keyed_on(sku.clone(), order.clone(), key, json!(6));
        let writes = plan_writes(
            &current,
            vec![
                Change::new(order.clone(), "o1#created", json!("created")),
                stock("o1#stock#s1"),
            ],
        )
        .unwrap();
        assert_eq!(writes.len(), 2);
        let (o, s) = (&writes[0], &writes[1]);
        assert_eq!((o.expected_version, o.record.version), (0, 1));
        assert_eq!(o.record.data, json!("created"));
        assert_eq!(
            o.record.applied.iter().collect::<Vec<_>>(),
            ["o1#created", "o1#stock#s1"]
        );
        assert_eq!((s.expected_version, s.record.version), (7, 8));
        assert_eq!(s.record.data, json!(6));
        assert_eq!(s.record.applied.iter().collect::<Vec<_>>(), ["seed"]);

        // Alone, the companion still writes its owner (unchanged data) to hold the key.
        let writes = plan_writes(&current, vec![stock("o1#stock#s1")]).unwrap();
        assert_eq!(writes[0].record.key, sku);
        assert_eq!(writes[1].record.key, order);
        assert_eq!(writes[1].record.data, current[0].data);
        assert!(writes[1].record.applied.contains("o1#stock#s1"));

        // Applied on the owner, or on the shared record from before: dropped.
        let done = [loaded(&order, 1, &["o1#stock#s1"]), loaded(&sku, 8, &[])];
        assert!(plan_writes(&done, vec![stock("o1#stock#s1")])
            .unwrap()
            .is_empty());
        let legacy = [loaded(&order, 1, &[]), loaded(&sku, 8, &["o1#stock#s1"])];
        assert!(plan_writes(&legacy, vec![stock("o1#stock#s1")])
            .unwrap()
            .is_empty());

        // The owner must be one of the targets.
        let err = plan_writes(&current[1..], vec![stock("k")]).unwrap_err();
        assert!(
            matches!(err, Failure::Permanent(ref m) if m.contains("keyed a change on record t#order#o1")),
            "{err:?}"
        );
    }

    #[test]
    fn a_record_collecting_a_key_per_event_fails_at_the_bound() {
        let full: Vec<String> = (0..MAX_APPLIED_KEYS).map(|i| format!("e{i}")).collect();
        let keys: Vec<&str> = full.iter().map(String::as_str).collect();
        let current = [record("hot", 5, &keys)];
        let err = plan_writes(&current, vec![change("hot", "one-more", 6)]).unwrap_err();
        assert!(
            matches!(err, Failure::Permanent(ref m)
                if m.contains("t#counter#hot") && m.contains(&MAX_APPLIED_KEYS.to_string())),
            "{err:?}"
        );
        // At the bound but not growing (a companion write, a restated key): allowed.
        assert!(plan_writes(&current, vec![change("hot", "e1", 6)])
            .unwrap()
            .is_empty());
        let owner = StateKey::new("t", "counter", "owner");
        let with_owner = [current[0].clone(), record("owner", 1, &[])];
        let writes = plan_writes(
            &with_owner,
            vec![Change::keyed_on(
                current[0].key.clone(),
                owner,
                "new",
                json!(1),
            )],
        )
        .unwrap();
        assert_eq!(writes[0].record.applied.len(), MAX_APPLIED_KEYS);
    }

    #[test]
    fn every_unchanged_read_is_checked_unless_the_domain_opts_out() {
        let current = [
            record("a", 3, &[]),
            record("b", 0, &[]),
            record("c", 2, &[]),
            record("a", 3, &[]),
        ];
        let writes = plan_writes(&current, vec![change("a", "e", 4)]).unwrap();
        let checks = read_checks(&current, &writes, |_| true);
        assert_eq!(
            checks,
            [
                ReadCheck {
                    key: StateKey::new("t", "counter", "b"),
                    version: 0
                },
                ReadCheck {
                    key: StateKey::new("t", "counter", "c"),
                    version: 2
                },
            ]
        );
        let checks = read_checks(&current, &writes, |k| k.id != "c");
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].key.id, "b");
    }

    #[test]
    fn payment_events_move_a_payment_status() {
        let with = |id: &str, version: u64, status: Option<&str>| StateRecord {
            key: StateKey::new("t", "order", id),
            version,
            data: match status {
                Some(s) => json!({ "payment_status": s }),
                None => serde_json::Value::Null,
            },
            applied: Default::default(),
        };
        let write = |record: StateRecord| StateWrite {
            expected_version: record.version.saturating_sub(1),
            record,
        };
        let pending = with("1", 1, Some("pending"));
        assert!(moves_payment_status(
            std::slice::from_ref(&pending),
            &[write(with("1", 2, Some("paid")))]
        ));
        assert!(!moves_payment_status(
            std::slice::from_ref(&pending),
            &[write(with("1", 2, Some("pending")))]
        ));
        // A new order in its initial status is not a payment; a new paid one is.
        let missing = with("1", 0, None);
        assert!(!moves_payment_status(
            std::slice::from_ref(&missing),
            &[write(with("1", 1, Some("pending")))]
        ));
        assert!(moves_payment_status(
            &[missing],
            &[write(with("1", 1, Some("paid")))]
        ));
        // Records without the field (stock) never are.
        assert!(!moves_payment_status(&[], &[write(with("1", 1, None))]));
    }

    #[test]
    fn a_change_outside_the_targets_is_permanent() {
        let err = plan_writes(&[record("a", 1, &[])], vec![change("zzz", "e", 1)]).unwrap_err();
        assert!(
            matches!(err, Failure::Permanent(ref m) if m.contains("t#counter#zzz")),
            "{err:?}"
        );
    }
}
