//! The conclusion of a run, arm by arm: one row per result the run can find.

use super::*;
use crate::envelope::Envelope;
use crate::ports::{QueueMessage, Source};

const DAY_MS: i64 = 86_400_000;
/// The run begins a minute after the event was received.
const RECEIVED_MS: i64 = 1_700_000_000_000;
const BEGAN_MS: i64 = RECEIVED_MS + 60_000;

fn item(attempts: u32, result: Option<&str>, waiting_since: Option<i64>) -> InboxItem {
    let envelope = Envelope {
        provider: "stripe".into(),
        tenant: "acme".into(),
        event_id: "evt_1".into(),
        event_type: "payment_intent.succeeded".into(),
        object_id: Some("pi_1".into()),
        object_version: None,
        occurred_at: None,
        delivery_id: None,
    };
    InboxItem {
        key: envelope.key(),
        envelope,
        state: InboxState::Processing,
        source: Source::Webhook,
        attempts,
        received_at_ms: RECEIVED_MS,
        updated_at_ms: BEGAN_MS,
        expires_at: 0,
        enqueue_failed: false,
        last_error: None,
        last_error_class: None,
        lease_until_ms: None,
        lease_owner: None,
        result: result.map(str::to_string),
        body_encoding: String::new(),
        body_len: 0,
        body: Vec::new(),
        waiting: waiting_since.map(|since_ms| Waiting {
            on: "acme#order#1".into(),
            since_ms,
        }),
        deliveries: Vec::new(),
        relay_due_ms: None,
    }
}

fn delivery(receive_count: u32) -> Delivery {
    Delivery {
        message: QueueMessage {
            pk: crate::envelope::InboxKey::new("stripe", "acme", "evt_1"),
        },
        receipt: "r1".into(),
        receive_count,
        item: None,
        postponed: 0,
    }
}

fn conclude_at(
    item: &InboxItem,
    now_ms: i64,
    body_missing: bool,
    result: Result<Applied, Failure>,
) -> Conclusion {
    let delivery = delivery(1);
    let run = RunFacts {
        delivery: &delivery,
        item,
        body_missing,
        began_ms: now_ms,
        now_ms,
        jitter: 1.0,
    };
    conclude(&run, &ProcessSettings::default(), result)
}

fn wait_on(version: u64) -> Failure {
    Failure::Wait(WaitFor {
        reason: "waiting: order 1".into(),
        record: Some((StateKey::new("acme", "order", "1"), version)),
    })
}

fn transient() -> Failure {
    Failure::Transient(RetryCause::Contention, "lock contention".into())
}

/// What a row expects: the state written, its error class, the message's outcome.
struct Row {
    name: &'static str,
    item: InboxItem,
    now_ms: i64,
    body_missing: bool,
    result: Result<Applied, Failure>,
    state: InboxState,
    error_class: Option<&'static str>,
    outcome: MessageOutcome,
    /// Text the error (or else the result) must contain.
    detail: &'static str,
}

#[test]
fn every_result_concludes_in_its_state_and_outcome() {
    let committed = Committed {
        at_ms: BEGAN_MS,
        payment: true,
    };
    let rows = vec![
        Row {
            name: "committed",
            item: item(1, None, None),
            now_ms: BEGAN_MS,
            body_missing: false,
            result: Ok(Applied::Completed(
                "order 1 paid".into(),
                Some(committed),
                vec![],
            )),
            state: InboxState::Completed,
            error_class: None,
            outcome: MessageOutcome::Ack,
            detail: "order 1 paid",
        },
        Row {
            name: "ignored",
            item: item(1, None, None),
            now_ms: BEGAN_MS,
            body_missing: false,
            result: Ok(Applied::Ignored("not an order event".into())),
            state: InboxState::Ignored,
            error_class: None,
            outcome: MessageOutcome::Ack,
            detail: "not an order event",
        },
        Row {
            name: "permanent",
            item: item(1, None, None),
            now_ms: BEGAN_MS,
            body_missing: false,
            result: Err(Failure::Permanent("unknown SKU".into())),
            state: InboxState::DeadLetter,
            error_class: Some(ERROR_CLASS_PERMANENT),
            outcome: MessageOutcome::DeadLetterNow,
            detail: "unknown SKU",
        },
        Row {
            name: "waits within its window",
            item: item(1, None, None),
            now_ms: BEGAN_MS,
            body_missing: false,
            result: Err(wait_on(3)),
            state: InboxState::Waiting,
            error_class: Some(ERROR_CLASS_TRANSIENT),
            outcome: MessageOutcome::Ack,
            detail: "waiting: order 1",
        },
        Row {
            name: "waited past its window (stripe: 3 days)",
            item: item(4, None, Some(BEGAN_MS)),
            now_ms: BEGAN_MS + 3 * DAY_MS,
            body_missing: false,
            result: Err(wait_on(3)),
            state: InboxState::DeadLetter,
            error_class: Some(ERROR_CLASS_TRANSIENT),
            outcome: MessageOutcome::DeadLetterNow,
            detail: "waited 3d (window 3d) for waiting: order 1",
        },
        Row {
            name: "transient within the horizon",
            item: item(3, None, None),
            now_ms: BEGAN_MS,
            body_missing: false,
            result: Err(transient()),
            state: InboxState::Retryable,
            error_class: Some(ERROR_CLASS_TRANSIENT),
            // Retry 3 at full jitter: 2 s doubled twice.
            outcome: MessageOutcome::Retry {
                delay: Duration::from_secs(8),
            },
            detail: "lock contention",
        },
        Row {
            name: "transient past the horizon",
            item: item(9, None, None),
            now_ms: RECEIVED_MS + 3 * DAY_MS,
            body_missing: false,
            result: Err(transient()),
            state: InboxState::DeadLetter,
            error_class: Some(ERROR_CLASS_TRANSIENT),
            outcome: MessageOutcome::DeadLetterNow,
            detail: "retries exhausted: transient failures for 3d (horizon 3d), 9 attempts: lock contention",
        },
        Row {
            name: "body still missing past the horizon",
            item: item(9, None, None),
            now_ms: RECEIVED_MS + 3 * DAY_MS,
            body_missing: true,
            result: Err(Failure::body_missing()),
            state: InboxState::DeadLetter,
            error_class: Some(ERROR_CLASS_TRANSIENT),
            outcome: MessageOutcome::DeadLetterNow,
            detail: "never stored (its request was not acknowledged; the provider's retry stores it); retries exhausted",
        },
    ];
    for row in rows {
        let c = conclude_at(&row.item, row.now_ms, row.body_missing, row.result);
        assert_eq!(c.finish.state, row.state, "{}", row.name);
        assert_eq!(
            c.finish.error_class.as_deref(),
            row.error_class,
            "{}",
            row.name
        );
        assert_eq!(c.outcome, row.outcome, "{}", row.name);
        assert_eq!(c.finish.now_ms, row.now_ms, "{}", row.name);
        let detail = c.finish.error.as_deref().or(c.finish.result.as_deref());
        assert!(
            detail.is_some_and(|d| d.contains(row.detail)),
            "{}: {detail:?}",
            row.name
        );
    }
}

#[test]
fn a_park_names_its_record_and_keeps_its_first_time() {
    let fresh = conclude_at(&item(1, None, None), BEGAN_MS, false, Err(wait_on(3)));
    assert_eq!(
        fresh.finish.wait,
        WaitChange::Park(Waiting {
            on: "acme#order#1".into(),
            since_ms: BEGAN_MS
        })
    );
    assert_eq!(fresh.parked, Some((StateKey::new("acme", "order", "1"), 3)));
    // Woken and parked again: the window counts from the first park.
    let again = conclude_at(
        &item(2, None, Some(BEGAN_MS - 1_000)),
        BEGAN_MS,
        false,
        Err(wait_on(4)),
    );
    assert!(matches!(&again.finish.wait, WaitChange::Park(w) if w.since_ms == BEGAN_MS - 1_000));
    // A wait on no record parks on NO_RECORD and re-checks nothing.
    let nowhere = conclude_at(
        &item(1, None, None),
        BEGAN_MS,
        false,
        Err(Failure::Wait(WaitFor {
            reason: "waiting: nothing".into(),
            record: None,
        })),
    );
    assert!(matches!(&nowhere.finish.wait, WaitChange::Park(w) if w.on == NO_RECORD));
    assert_eq!(nowhere.parked, None);
}

#[test]
fn a_woken_waiter_that_completes_leaves_the_waiting_index() {
    let woken = item(2, None, Some(BEGAN_MS - 1_000));
    let done = conclude_at(
        &woken,
        BEGAN_MS,
        false,
        Ok(Applied::Completed("refund 1".into(), None, vec![])),
    );
    assert_eq!(done.finish.wait, WaitChange::Clear);
    let retried = conclude_at(&woken, BEGAN_MS, false, Err(transient()));
    assert_eq!(retried.finish.wait, WaitChange::Clear);
    assert_eq!(retried.retry_cause, Some(RetryCause::Contention));
    let fresh = conclude_at(&item(1, None, None), BEGAN_MS, false, Err(transient()));
    assert_eq!(fresh.finish.wait, WaitChange::Keep);
}

#[test]
fn a_rerun_that_finds_everything_applied_keeps_the_result() {
    let replayed = item(2, Some("order 1 paid"), None);
    let again = conclude_at(
        &replayed,
        BEGAN_MS,
        false,
        Ok(Applied::Completed(ALREADY_APPLIED.into(), None, vec![])),
    );
    assert!(again.kept_result);
    assert_eq!(again.finish.result, None, "the stored result stays");
    // The first run that finds its effects applied (a crash after the commit) says so.
    let first = conclude_at(
        &item(2, None, None),
        BEGAN_MS,
        false,
        Ok(Applied::Completed(ALREADY_APPLIED.into(), None, vec![])),
    );
    assert!(!first.kept_result);
    assert_eq!(first.finish.result.as_deref(), Some(ALREADY_APPLIED));
}

#[test]
fn a_wait_is_not_a_transient_failure() {
    assert_eq!(
        Failure::from(DomainError::Wait("order 1".into())),
        Failure::Wait(WaitFor {
            reason: "waiting: order 1".into(),
            record: None
        })
    );
}
