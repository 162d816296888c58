//! Acceptance tests: the processor with the reference domain, end to end, on both
//! backends (embedded SQLite; DynamoDB + SQS in moto). Events enter through the real
//! `Ingestor` as signed Stripe/Shopify requests; processors drain the real queue.
//! Every scenario fixes its business result in advance and ends with the shared
//! invariant checker (`scenario::check_invariants`): no second invoice, refund,
//! shipment, stock movement or notification, stock = seeded − reserved + restocked,
//! every inbox item terminal.

use einmal::ports::Handout;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use einmal::domain::reference::{order_key, sku_key, NotificationKind, OrderStatus, PaymentStatus};
use einmal::domain::state::StateRecord;
use einmal::envelope::InboxKey;
use einmal::pipeline::process::{AckMode, MessageOutcome, ALREADY_APPLIED};
use einmal::ports::{ClaimOutcome, Finish, InboxState, Queue};
use einmal_tests::fixtures::FailingQueue;
use einmal_tests::moto::OperationLog;
use einmal_tests::on_both_backends;
use einmal_tests::scenario::suite::{until_handled, Replay};
use einmal_tests::scenario::{
    self, assert_no_regression, check_invariants, data_of, drain, orders_create, orders_paid,
    retry_delays, sample, step, yesterday, Backend, CommitFails, FinishFails, Handled, Kind,
    SlowCommits,
};

const RED: &str = "SKU-RED-M";
const BLUE: &str = "SKU-BLUE-L";
const SEEDS: [(&str, i64); 2] = [(RED, 10), (BLUE, 5)];
/// Receives per message before redrive, for scenarios 1–6 and 9.
const MAX_RECEIVES: u32 = 10;
/// A short lease, so abandoned claims expire within the test.
const LEASE_MS: i64 = 300;

async fn fresh(kind: Kind) -> Backend {
    let b = kind.backend(MAX_RECEIVES).await;
    b.seed(&SEEDS).await;
    b
}

fn outcomes_for(handled: &[Handled], key: &InboxKey) -> Vec<MessageOutcome> {
    handled
        .iter()
        .filter(|h| h.key == *key)
        .map(|h| h.outcome)
        .collect()
}

// ---------------------------------------------------------------------------
// 1. The same delivery twice; two processors on the same messages

async fn same_delivery_twice_and_concurrent_processors_apply_once(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);

    // Sequential duplicates: the provider retries the same event.
    let create = sample("shopify-orders-create");
    let paid = sample("stripe-payment_intent.succeeded");
    assert!(!b.send(&ingest, &create).await, "first delivery is new");
    assert!(b.send(&ingest, &create).await, "second is a duplicate");
    let handled = drain(&b, &p).await;
    assert_eq!(
        outcomes_for(&handled, &create.inbox_key()),
        [MessageOutcome::Ack]
    );
    assert!(!b.send(&ingest, &paid).await);
    assert!(b.send(&ingest, &paid).await);
    // SQS delivers the same message twice: the second copy finds the item finished.
    let deliveries = b.receive_all(Duration::from_secs(30)).await;
    assert_eq!(deliveries.len(), 1, "one message per event");
    let d = &deliveries[0];
    assert_eq!(p.process_message(d, "w1").await, MessageOutcome::Ack);
    assert_eq!(p.process_message(d, "w2").await, MessageOutcome::Ack);
    assert!(!p.settle(d, MessageOutcome::Ack, AckMode::Delete).await);
    // The provider retries once more, after processing: acknowledged, nothing enqueued.
    assert!(b.send(&ingest, &create).await);
    assert!(b.send(&ingest, &paid).await);
    assert!(b.receive_all(Duration::from_secs(30)).await.is_empty());
    let item = b.item(&paid).await;
    assert_eq!((item.state, item.attempts), (InboxState::Completed, 1));
    assert_eq!(
        item.result.as_deref(),
        Some("order 1001 paid; invoice inv-1001-1")
    );

    let o = b.order("1001").await;
    assert_eq!(o.payment_status, PaymentStatus::Paid);
    assert_eq!((o.invoices.len(), o.invoices[0].amount_minor), (1, 12_970));
    assert_eq!(o.notifications.len(), 1);
    assert_eq!(o.loyalty_points, 129);
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));

    // Two processors on the same messages, at the same time, for three orders.
    let p1 = b.processor(LEASE_MS);
    let p2 = b.processor(LEASE_MS);
    let mut events = Vec::new();
    for id in [2001u64, 2002, 2003] {
        let items = [(RED, 1), (BLUE, 1)];
        events.push(orders_create(id, 1_764_600_000, &items, 7_980, "pending"));
        events.push(orders_paid(id, 1_764_600_060, &items, 7_980));
        events.push(scenario::fulfillment(
            id,
            id * 10,
            &format!("1Z{id}"),
            1_764_600_100,
        ));
    }
    for e in &events {
        assert!(!b.send(&ingest, e).await);
    }
    let deliveries = b.receive_all(Duration::from_secs(30)).await;
    assert_eq!(deliveries.len(), events.len());
    let (h1, h2) = tokio::join!(
        scenario::settle_all(&p1, &deliveries, "p1"),
        scenario::settle_all(&p2, &deliveries, "p2"),
    );
    assert_eq!(h1.len() + h2.len(), 2 * events.len());
    drain(&b, &p).await;
    for id in ["2001", "2002", "2003"] {
        let o = b.order(id).await;
        assert_eq!(o.payment_status, PaymentStatus::Paid, "{id}");
        assert_eq!(o.invoices.len(), 1, "{id}: one invoice");
        assert_eq!(o.shipments.len(), 1, "{id}: one shipment");
        let kinds: Vec<_> = o.notifications.iter().map(|n| n.kind).collect();
        assert_eq!(kinds.len(), 2, "{id}: {kinds:?}");
        assert!(kinds.contains(&NotificationKind::PaymentReceived));
        assert!(kinds.contains(&NotificationKind::Shipped));
        // The stock move's key is on the order; the SKU record carries none.
        let order = b.record(&order_key(scenario::TENANT, id)).await;
        let moves = order
            .applied
            .iter()
            .filter(|k| k.contains(&format!("order-{id}#stock#{RED}")))
            .count();
        assert_eq!(moves, 1, "{id}: one stock movement");
        let red = b.record(&sku_key(scenario::TENANT, RED)).await;
        assert!(
            !red.applied
                .iter()
                .any(|k| k.contains(&format!("order-{id}#"))),
            "{id}: {:?}",
            red.applied
        );
    }
    for e in &events {
        assert_eq!(
            b.item(e).await.state,
            InboxState::Completed,
            "{}",
            e.event_id
        );
    }
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (6, 0));
    check_invariants(&b, &SEEDS).await;
}

// ---------------------------------------------------------------------------
// 2. Two events (two providers / two event types) for one effect

async fn two_events_for_one_effect_apply_once(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);
    b.send(&ingest, &sample("shopify-orders-create")).await;
    drain(&b, &p).await;

    // Shopify orders/paid and Stripe payment_intent.succeeded, processed together.
    let shop_paid = sample("shopify-orders-paid");
    let stripe_paid = sample("stripe-payment_intent.succeeded");
    b.send(&ingest, &shop_paid).await;
    b.send(&ingest, &stripe_paid).await;
    drain(&b, &p).await;
    let mut results = vec![
        b.item(&shop_paid).await.result.unwrap(),
        b.item(&stripe_paid).await.result.unwrap(),
    ];
    results.sort();
    // The first issues the invoice; the second is recorded as the same money.
    assert_eq!(results[0], "order 1001 paid; invoice inv-1001-1");
    assert!(
        results[1].starts_with("order 1001 payment ")
            && results[1].ends_with(" recorded (paid total unchanged)"),
        "{results:?}"
    );

    // charge.refunded and refund.created for the same refund, plus the Stripe payment
    // re-sent under a new event id.
    let charge = sample("stripe-charge.refunded");
    let created = sample("stripe-refund.created");
    let resent = stripe_paid.with_event_id("evt_demo_ps_1001_resent");
    for e in [&charge, &created, &resent] {
        assert!(!b.send(&ingest, e).await);
    }
    drain(&b, &p).await;
    let mut results = vec![
        b.item(&charge).await.result.unwrap(),
        b.item(&created).await.result.unwrap(),
    ];
    results.sort();
    assert_eq!(
        results,
        [ALREADY_APPLIED, "order 1001 refund re_demo_1001_1 of 4990"]
    );
    let item = b.item(&resent).await;
    assert_eq!(
        (item.state, item.result.as_deref()),
        (InboxState::Completed, Some(ALREADY_APPLIED))
    );

    let o = b.order("1001").await;
    assert_eq!(o.invoices.len(), 1);
    assert_eq!(o.invoices[0].amount_minor, 12_970);
    assert_eq!(o.refunds.len(), 1);
    assert_eq!(
        (o.refunds[0].refund_id.as_str(), o.refunded_minor),
        ("re_demo_1001_1", 4_990)
    );
    assert_eq!(o.payment_status, PaymentStatus::PartiallyRefunded);
    assert_eq!(o.notifications.len(), 2);
    assert_eq!(o.loyalty_points, 79);
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));
    check_invariants(&b, &SEEDS).await;
}

// ---------------------------------------------------------------------------
// 3. Crash after the effect, before the acknowledgement

async fn crash_after_effect_before_ack_has_no_second_effect(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);
    b.send(&ingest, &sample("shopify-orders-create")).await;
    drain(&b, &p).await;

    // (a) The commit went through, the inbox finish did not (the process died).
    let paid = sample("stripe-payment_intent.succeeded");
    b.send(&ingest, &paid).await;
    let crashing = b.processor_with(
        Arc::new(FinishFails::new(b.processing.clone(), 1)),
        b.state.clone(),
        LEASE_MS,
    );
    let handled = step(&b, &crashing, "crashing").await;
    match outcomes_for(&handled, &paid.inbox_key())[..] {
        [MessageOutcome::Retry { delay }] => {
            assert!(delay >= Duration::from_millis(LEASE_MS as u64), "{delay:?}")
        }
        ref other => panic!("expected one Retry, got {other:?}"),
    }
    assert_eq!(
        b.order("1001").await.invoices.len(),
        1,
        "the effect is committed"
    );
    // On AWS nothing claims (the message carries the item): the crashed run left it
    // `received`; the embedded store claimed it.
    let crashed_state = match kind {
        Kind::Aws => InboxState::Received,
        Kind::Embedded => InboxState::Processing,
    };
    assert_eq!(b.item(&paid).await.state, crashed_state);
    let handled = drain(&b, &p).await;
    assert_eq!(
        outcomes_for(&handled, &paid.inbox_key()),
        [MessageOutcome::Ack]
    );
    let item = b.item(&paid).await;
    assert_eq!(item.state, InboxState::Completed);
    assert_eq!(item.result.as_deref(), Some(ALREADY_APPLIED));
    // The crashed attempt counts (a claim slower than the 300 ms lease may add one).
    assert!(item.attempts >= 2, "{}", item.attempts);

    // (b) Finished in the inbox, but the SQS delete never happened.
    let ship = sample("shopify-fulfillments-create");
    b.send(&ingest, &ship).await;
    let got = b.receive_all(Duration::from_secs(1)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        p.process_message(&got[0], "w-died").await,
        MessageOutcome::Ack
    );
    // ... no settle: the message comes back after its visibility timeout.
    let handled = until_handled(&b, &p, &ship.inbox_key()).await;
    let back: Vec<&Handled> = handled
        .iter()
        .filter(|h| h.key == ship.inbox_key())
        .collect();
    assert_eq!(back.len(), 1);
    assert_eq!(
        (back[0].receive_count, back[0].outcome),
        (2, MessageOutcome::Ack)
    );
    let item = b.item(&ship).await;
    assert_eq!((item.state, item.attempts), (InboxState::Completed, 1));

    let o = b.order("1001").await;
    assert_eq!(
        (o.invoices.len(), o.shipments.len(), o.notifications.len()),
        (1, 1, 2)
    );
    assert_eq!(o.payment_status, PaymentStatus::Paid);
    check_invariants(&b, &SEEDS).await;
}

// ---------------------------------------------------------------------------
// 4. Crash after claiming

async fn crash_after_claim_is_completed_after_the_lease(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);
    let create = sample("shopify-orders-create");
    b.send(&ingest, &create).await;
    // A worker claims the item and dies.
    let claimed = b
        .processing
        .claim(
            &create.inbox_key(),
            "dead-worker",
            einmal::time::now_millis(),
            400,
        )
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Claimed(_)), "{claimed:?}");

    if kind == Kind::Aws {
        // The message carries the item, so the run does not read the dead worker's
        // lease: it commits the effect (the dead worker committed nothing) and its
        // finish is refused while the lease lives. The message is acknowledged and the
        // sweeper finishes the item once the lease has run out.
        let handled = step(&b, &p, "w").await;
        assert_eq!(
            outcomes_for(&handled, &create.inbox_key()),
            [MessageOutcome::Ack]
        );
        assert_eq!(b.item(&create).await.state, InboxState::Processing);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sweeper = einmal::pipeline::sweep::Sweeper::new(
            b.inbox.clone(),
            b.sweep.clone(),
            b.processing.clone(),
            b.queue.clone(),
        )
        .with_settings(einmal::pipeline::sweep::SweepSettings {
            stuck_after_ms: 0,
            ..Default::default()
        });
        sweeper.sweep_once(einmal::time::now_millis()).await;
    }
    let handled = drain(&b, &p).await;
    let outcomes = outcomes_for(&handled, &create.inbox_key());
    if kind == Kind::Embedded {
        assert!(
            matches!(outcomes[0], MessageOutcome::LeaveForLater { .. }),
            "the live lease is respected first: {outcomes:?}"
        );
    }
    assert_eq!(outcomes.last(), Some(&MessageOutcome::Ack));
    let item = b.item(&create).await;
    assert_eq!((item.state, item.attempts), (InboxState::Completed, 2));
    // On AWS the run that committed could not finish (the lease); the run the sweeper
    // sent found the effect applied.
    let result = match kind {
        Kind::Aws => ALREADY_APPLIED,
        Kind::Embedded => "order 1001 created; SKU-BLUE-L -2; SKU-RED-M -1",
    };
    assert_eq!(item.result.as_deref(), Some(result));
    // The dead worker cannot finish over the new owner's result.
    let late = Finish {
        state: InboxState::Completed,
        error_class: None,
        error: None,
        result: Some("late".into()),
        now_ms: einmal::time::now_millis(),
        wait: Default::default(),
        deliveries: None,
        relay_due_ms: None,
    };
    assert!(!b
        .processing
        .finish(&create.inbox_key(), &Handout::leased("dead-worker"), &late)
        .await
        .unwrap());

    // (b) A slow worker: its commit stalls past its lease, the redelivered message is
    // taken over and applied; the late commit then conflicts and changes nothing.
    let paid = sample("stripe-payment_intent.succeeded");
    b.send(&ingest, &paid).await;
    let slow = Arc::new(b.processor_with(
        b.processing.clone(),
        Arc::new(SlowCommits::new(
            b.state.clone(),
            1,
            Duration::from_millis(2_500),
        )),
        LEASE_MS,
    ));
    let got = b.receive_all(Duration::from_secs(1)).await;
    assert_eq!(got.len(), 1);
    let stalled = {
        let (slow, d) = (slow.clone(), got[0].clone());
        tokio::spawn(async move { slow.process_message(&d, "slow-worker").await })
    };
    let handled = until_handled(&b, &p, &paid.inbox_key()).await;
    assert_eq!(
        outcomes_for(&handled, &paid.inbox_key()),
        [MessageOutcome::Ack]
    );
    assert_eq!(b.order("1001").await.invoices.len(), 1);
    match (kind, stalled.await.unwrap()) {
        (Kind::Embedded, MessageOutcome::LeaveForLater { .. }) => {}
        // On AWS no run holds a lease: the stalled commit conflicts, the reload finds
        // the effect applied and the finish is refused (already terminal): acknowledged.
        (Kind::Aws, MessageOutcome::Ack) => {}
        (_, other) => {
            panic!("the slow worker lost its lease: expected LeaveForLater, got {other:?}")
        }
    }
    let item = b.item(&paid).await;
    assert_eq!((item.state, item.attempts), (InboxState::Completed, 2));
    // Normally the new owner applies the payment and the stalled commit conflicts;
    // on a very slow machine the stalled commit may land first and the new owner
    // finds it applied. Either way: one effect, finished by the lease holder.
    let result = item.result.unwrap();
    assert!(
        result == "order 1001 paid; invoice inv-1001-1" || result == ALREADY_APPLIED,
        "{result}"
    );

    let o = b.order("1001").await;
    assert_eq!(o.stock_reserved.len(), 2);
    assert_eq!(o.payment_status, PaymentStatus::Paid);
    assert_eq!((o.invoices.len(), o.notifications.len()), (1, 1));
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));
    check_invariants(&b, &SEEDS).await;
}

// ---------------------------------------------------------------------------
// 5. Swapped arrival order ends where the in-order arrival ends

async fn swapped_order_converges_to_the_in_order_outcome(kind: Kind) {
    let create = sample("shopify-orders-create");
    let failed = sample("stripe-payment_intent.payment_failed");
    let paid = sample("stripe-payment_intent.succeeded");
    let updated = sample("shopify-orders-updated");
    let refund = sample("stripe-charge.refunded");

    // In order.
    let a = fresh(kind).await;
    let pa = a.processor(LEASE_MS);
    let ingest_a = a.ingestor();
    for e in [&create, &failed, &paid, &updated, &refund] {
        a.send(&ingest_a, e).await;
        let handled = drain(&a, &pa).await;
        assert!(
            handled.iter().all(|h| h.outcome == MessageOutcome::Ack),
            "in order nothing waits: {handled:?}"
        );
    }
    assert_eq!(a.item(&failed).await.state, InboxState::Completed);
    let in_order = check_invariants(&a, &SEEDS).await;

    // Swapped, with the state checked for regressions after every step.
    let b = fresh(kind).await;
    let p = b.processor(LEASE_MS);
    let ingest = b.ingestor();
    let mut seen = b.business_state().await;
    let mut observe = |now: BTreeMap<String, StateRecord>| {
        assert_no_regression(&seen, &now);
        seen = now;
    };

    // orders/updated before orders/create: parked (its message deleted), then woken
    // by the create's commit and applied.
    b.send(&ingest, &updated).await;
    let handled = step(&b, &p, "w").await;
    assert!(matches!(
        outcomes_for(&handled, &updated.inbox_key())[..],
        [MessageOutcome::Ack]
    ));
    let item = b.item(&updated).await;
    assert_eq!(item.state, InboxState::Waiting);
    assert_eq!(item.last_error_class.as_deref(), Some("transient"));
    assert!(
        item.last_error
            .as_deref()
            .unwrap()
            .contains("update before create"),
        "{item:?}"
    );
    observe(b.business_state().await);
    b.send(&ingest, &create).await;
    drain(&b, &p).await;
    let item = b.item(&updated).await;
    assert_eq!(item.state, InboxState::Completed);
    assert_eq!(
        item.result.as_deref(),
        Some("order 1001 updated to 2025-11-29T08:15:00Z")
    );
    observe(b.business_state().await);

    // A refund before the payment: waits until the payment arrives.
    b.send(&ingest, &refund).await;
    let handled = step(&b, &p, "w").await;
    assert!(matches!(
        outcomes_for(&handled, &refund.inbox_key())[..],
        [MessageOutcome::Ack]
    ));
    assert_eq!(b.item(&refund).await.state, InboxState::Waiting);
    assert!(b
        .item(&refund)
        .await
        .last_error
        .unwrap()
        .contains("refund before payment"));
    assert!(b.order("1001").await.refunds.is_empty());
    observe(b.business_state().await);
    b.send(&ingest, &paid).await;
    drain(&b, &p).await;
    assert_eq!(b.item(&refund).await.state, InboxState::Completed);
    observe(b.business_state().await);

    // The (older) payment failure after the payment: ignored, with the reason.
    b.send(&ingest, &failed).await;
    drain(&b, &p).await;
    let item = b.item(&failed).await;
    assert_eq!(item.state, InboxState::Ignored);
    assert_eq!(
        item.result.as_deref(),
        Some("superseded: order 1001 already paid")
    );
    observe(b.business_state().await);

    let swapped = check_invariants(&b, &SEEDS).await;
    assert_eq!(
        data_of(&swapped),
        data_of(&in_order),
        "same data whatever the order"
    );
    let o = b.order("1001").await;
    assert_eq!(o.status, OrderStatus::Open);
    assert_eq!(o.payment_status, PaymentStatus::PartiallyRefunded);
    assert_eq!(
        (o.invoices.len(), o.refunds.len(), o.shipments.len()),
        (1, 1, 0)
    );
    assert_eq!(o.refunded_minor, 4_990);
    assert_eq!(
        o.notifications.len(),
        2,
        "payment received + refunded; no failure notice"
    );
    assert_eq!(o.payment_event_at, None);
    assert_eq!(
        o.shopify_updated_at.as_deref(),
        Some("2025-11-29T08:15:00Z")
    );
    assert_eq!(o.loyalty_points, 79);
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));
}

// ---------------------------------------------------------------------------
// 6. Permanent errors dead-letter at once; transient ones retry with backoff

async fn permanent_error_dead_letters_and_transient_error_retries(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);

    // Permanent: an order for a SKU without inventory.
    let unknown = orders_create(
        5001,
        1_764_600_000,
        &[(RED, 1), ("SKU-NOPE", 2)],
        5_000,
        "pending",
    );
    assert!(!b.send(&ingest, &unknown).await);
    let handled = drain(&b, &p).await;
    assert_eq!(
        outcomes_for(&handled, &unknown.inbox_key()),
        [MessageOutcome::DeadLetterNow]
    );
    let item = b.item(&unknown).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert_eq!(item.last_error_class.as_deref(), Some("permanent"));
    assert!(
        item.last_error
            .as_deref()
            .unwrap()
            .contains("unknown SKU SKU-NOPE"),
        "{item:?}"
    );
    assert_eq!(b.dead_letters().await, [unknown.inbox_key()]);
    assert!(
        !b.record(&order_key(scenario::TENANT, "5001"))
            .await
            .exists(),
        "nothing applied"
    );
    assert_eq!(b.on_hand(RED).await, 10, "no partial stock movement");

    // Transient: the state store throttles three commits, then recovers.
    let create = sample("shopify-orders-create");
    b.send(&ingest, &create).await;
    let flaky = b.processor_with(
        b.processing.clone(),
        Arc::new(CommitFails::new(b.state.clone(), 3)),
        LEASE_MS,
    );
    let handled = drain(&b, &flaky).await;
    let delays = retry_delays(&handled, &create.inbox_key());
    assert_eq!(
        delays,
        [1, 2, 4].map(Duration::from_millis),
        "exponential backoff (jitter pinned to its ceiling)"
    );
    assert!(delays.windows(2).all(|w| w[0] < w[1]), "growing delays");
    let item = b.item(&create).await;
    // Completed after three retries: its attempts tell, and it carries no error.
    assert_eq!((item.state, item.attempts), (InboxState::Completed, 4));
    assert_eq!((item.last_error_class, item.last_error), (None, None));

    // Transient on the ack path: the queue send fails once; the provider's retry
    // re-enqueues the stored event and it is processed once.
    let failing: Arc<dyn Queue> = Arc::new(FailingQueue::new(b.queue.clone(), vec![1]));
    let flaky_ingest =
        einmal::pipeline::ingest::Ingestor::new(scenario::config(), b.inbox.clone(), failing);
    let paid = sample("shopify-orders-paid");
    let response = flaky_ingest
        .ingest(
            "shopify",
            scenario::TENANT,
            &paid.request(&scenario::config()),
        )
        .await;
    assert_eq!(response.status, 503);
    assert!(
        b.send(&flaky_ingest, &paid).await,
        "stored already; re-enqueued"
    );
    drain(&b, &p).await;
    assert_eq!(b.item(&paid).await.state, InboxState::Completed);

    let o = b.order("1001").await;
    assert_eq!(
        (o.payment_status, o.invoices.len()),
        (PaymentStatus::Paid, 1)
    );
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));
    let dead: Vec<InboxKey> = b
        .items()
        .await
        .into_iter()
        .filter(|i| i.state == InboxState::DeadLetter)
        .map(|i| i.key)
        .collect();
    assert_eq!(dead, [unknown.inbox_key()]);
    check_invariants(&b, &SEEDS).await;
}

// ---------------------------------------------------------------------------
// 7. Yesterday's stream: in order vs. twice, shuffled, concurrent

const STREAM_SEED: u64 = 20_251_201;
const SHUFFLE_SEED: u64 = 7;
const STREAM_MAX_RECEIVES: u32 = 1_000;
const STREAM_LEASE_MS: i64 = 2_000;

/// (a) One clean pass, in order, one event at a time: nothing waits, nothing
/// conflicts, and the result is the expected business state.
async fn clean_pass(kind: Kind, stream: &scenario::Stream) -> BTreeMap<String, StateRecord> {
    let a = kind.backend(STREAM_MAX_RECEIVES).await;
    a.seed(&stream.seeds()).await;
    let ingest = a.ingestor();
    let p = a.processor(STREAM_LEASE_MS);
    for e in &stream.events {
        assert!(!a.send(&ingest, e).await, "{}", e.event_id);
        let handled = until_handled(&a, &p, &e.inbox_key()).await;
        assert_eq!(
            handled.iter().map(|h| h.outcome).collect::<Vec<_>>(),
            [MessageOutcome::Ack],
            "{}: in order nothing waits",
            e.event_id
        );
    }
    let clean = check_invariants(&a, &stream.seeds()).await;
    assert_eq!(
        data_of(&clean),
        stream.expected_data(),
        "the clean pass gives the expected business state"
    );
    // What the clean pass ignores, and why: late payment failures, events that move
    // no money, unsupported types. Nothing else.
    let mut ignored: BTreeMap<String, usize> = BTreeMap::new();
    for item in a.items().await {
        if item.state == InboxState::Ignored {
            let reason = item.result.unwrap_or_default();
            let class = reason.split(':').next().unwrap_or("").to_owned();
            *ignored.entry(class).or_default() += 1;
        } else {
            assert_eq!(item.state, InboxState::Completed, "{}", item.key);
        }
    }
    let expected: BTreeMap<String, usize> = [
        ("superseded", 4),
        ("unsupported event type stripe charge.succeeded", 3),
        ("unsupported event type shopify orders/fulfilled", 3),
        ("no refund of order 3002 moves money", 1),
        ("refund 12505 moves no money", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(ignored, expected);
    clean
}

/// (b) Every event `copies` times in a seeded shuffled order, concurrently: the
/// generic conformance scenario (`scenario::suite::shuffled`) on the reference domain,
/// with its regression monitor and invariant check.
async fn replay(kind: Kind, stream: &scenario::Stream, shuffle_seed: u64, copies: usize) -> Replay {
    scenario::suite::shuffled(kind, stream, shuffle_seed, copies).await
}

async fn yesterdays_stream_replayed_shuffled_twice_matches_the_clean_pass(kind: Kind) {
    let started = Instant::now();
    let stream = yesterday(STREAM_SEED);
    let n = stream.events.len();
    assert!((180..=240).contains(&n), "{n} events");
    let clean = clean_pass(kind, &stream).await;
    let clean_secs = started.elapsed().as_secs_f64();
    let r = replay(kind, &stream, SHUFFLE_SEED, 2).await;
    assert_eq!(
        data_of(&r.state),
        data_of(&clean),
        "shuffled, duplicated, concurrent delivery ends in the clean pass's business state"
    );
    let retries = r
        .handled
        .iter()
        .filter(|h| matches!(h.outcome, MessageOutcome::Retry { .. }))
        .count();
    println!(
        "[{}] yesterday's stream: {n} events across {} orders; clean pass {clean_secs:.1}s; \
         replay of {} deliveries {:.1}s: {} messages handled ({retries} retries), {} \
         regression samples",
        kind_name(kind),
        stream.orders.len(),
        r.deliveries,
        r.secs,
        r.handled.len(),
        r.samples,
    );
}

/// More arrival orders, on the embedded store only (fast): other shuffles, three
/// copies of every event, all against the same expected business state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn yesterdays_stream_in_more_arrival_orders_embedded() {
    let stream = yesterday(STREAM_SEED);
    let expected = stream.expected_data();
    for (seed, copies) in [(1, 2), (2, 3), (3, 2), (4, 1)] {
        let r = replay(Kind::Embedded, &stream, seed, copies).await;
        assert_eq!(data_of(&r.state), expected, "shuffle {seed} x{copies}");
    }
    let other = yesterday(99);
    let r = replay(Kind::Embedded, &other, 5, 2).await;
    assert_eq!(data_of(&r.state), other.expected_data(), "another day");
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Embedded => "embedded",
        Kind::Aws => "aws",
    }
}

// ---------------------------------------------------------------------------
// 9. Cost: AWS calls per event

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aws_calls_per_event_with_the_reference_domain() {
    let ops = OperationLog::new();
    let b = scenario::aws_logged(MAX_RECEIVES, Some(ops.clone())).await;
    b.seed(&SEEDS).await;
    let calls = b.calls.clone().expect("AWS counts calls");
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);
    // Counts calls and names them (DynamoDB / SQS operation) for `what`.
    let measure = |what: &str| {
        let (n, names) = (calls.count(), ops.take());
        calls.reset();
        assert_eq!(n, names.len(), "{what}: every call is named");
        names
    };

    // A multi-record effect: orders/create changes the order and two SKUs.
    let create = sample("shopify-orders-create");
    b.send(&ingest, &create).await;
    let d = b.queue.receive(10, Duration::from_secs(30)).await.unwrap();
    measure("setup");
    assert_eq!(p.process_message(&d[0], "w").await, MessageOutcome::Ack);
    let multi = measure("orders/create");
    p.settle(&d[0], MessageOutcome::Ack, AckMode::Delete).await;

    // A single-record effect: Stripe payment_intent.succeeded on the existing order.
    let paid = sample("stripe-payment_intent.succeeded");
    measure("between");
    b.send(&ingest, &paid).await;
    let ack_path = measure("ack path");
    let d = b.queue.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(d.len(), 1);
    let receive = measure("receive");
    assert_eq!(p.process_message(&d[0], "w").await, MessageOutcome::Ack);
    let single = measure("payment_intent.succeeded");
    p.settle(&d[0], MessageOutcome::Ack, AckMode::Delete).await;
    let delete = measure("delete");
    // The same message again (SQS at-least-once).
    assert_eq!(p.process_message(&d[0], "w").await, MessageOutcome::Ack);
    let duplicate = measure("duplicate");

    println!(
        "AWS calls per event (reference domain): payment_intent.succeeded on an existing \
         order: ack path {} {ack_path:?}; processing {} {single:?}; local loop adds \
         {receive:?} (one per batch of up to 10) + {delete:?} (Lambda: the event source \
         does both); orders/create (order + 2 SKUs): processing {} {multi:?}; duplicate \
         message {} {duplicate:?}",
        ack_path.len(),
        single.len(),
        multi.len(),
        duplicate.len(),
    );
    // The conditional put of the event's item, the put of its body item (written once),
    // the send (the message carries the item).
    assert_eq!(ack_path, ["PutItem", "PutItem", "SendMessage"]);
    // No claim: load (consistent GetItem) + one conditional PutItem carrying the effect
    // key (its old image says whether an event marked the record to wait: none here, so
    // no waiters' Query) + finish.
    assert_eq!(single, ["GetItem", "PutItem", "UpdateItem"]);
    assert_eq!(multi, ["BatchGetItem", "TransactWriteItems", "UpdateItem"]);
    assert_eq!(receive, ["ReceiveMessage"]);
    assert_eq!(delete, ["DeleteMessage"]);
    // The same message again re-runs the decision: the load finds the effect applied,
    // the waiters of the unwritten record are asked (a crash may have hidden a mark),
    // the finish is refused (already terminal).
    assert_eq!(duplicate, ["GetItem", "Query", "UpdateItem"]);
    let o = b.order("1001").await;
    assert_eq!(
        (o.payment_status, o.invoices.len()),
        (PaymentStatus::Paid, 1)
    );
    check_invariants(&b, &SEEDS).await;
}

// ---------------------------------------------------------------------------
// 8. One refund reported by Shopify and Stripe; a deposit and a balance

/// A Shopify order paid through Stripe in two payments (deposit + balance), the
/// balance refunded, and that refund reported by Stripe (`refund.created`) and by
/// Shopify (`refunds/create`, whose Stripe transaction carries the refund id). All
/// sent at once, so refunds may come before the balance (they wait for it).
async fn one_refund_from_two_providers_and_two_payments_are_counted_once(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);
    let at = 1_764_400_000;
    let create = orders_create(7001, at, &[(RED, 2)], 12_970, "pending");
    let pi = |id: &str, amount: i64, created: i64| {
        scenario::stripe_event(
            "payment_intent.succeeded",
            &format!("evt_{id}"),
            created,
            serde_json::json!({"id": id, "object": "payment_intent", "amount": amount,
                   "amount_received": amount, "currency": "eur", "status": "succeeded",
                   "metadata": {"order_id": "7001"}}),
        )
    };
    let deposit = pi("pi_7001_dep", 3_000, at + 10);
    let balance = pi("pi_7001_bal", 9_970, at + 20);
    let shop_paid = orders_paid(7001, at + 30, &[(RED, 2)], 12_970);
    let stripe_refund = scenario::stripe_event(
        "refund.created",
        "evt_re_7001",
        at + 40,
        serde_json::json!({"id": "re_7001_bal", "object": "refund", "amount": 9_970,
               "currency": "eur", "status": "succeeded", "payment_intent": "pi_7001_bal",
               "metadata": {"order_id": "7001"}}),
    );
    let shop_refund = scenario::shopify_event(
        "refunds/create",
        "refund-7101",
        serde_json::json!({"id": 7101, "order_id": 7001, "restock": false, "transactions": [
            {"id": 71010, "order_id": 7001, "kind": "refund", "status": "success",
             "gateway": "stripe", "amount": "99.70", "currency": "EUR",
             "authorization": "re_7001_bal",
             "receipt": {"id": "re_7001_bal", "object": "refund", "charge": "ch_7001"}}
        ]}),
    );
    for e in [
        &stripe_refund,
        &shop_refund,
        &balance,
        &create,
        &deposit,
        &shop_paid,
    ] {
        assert!(!b.send(&ingest, e).await);
    }
    drain(&b, &p).await;
    assert!(b.dead_letters().await.is_empty());
    for e in [
        &stripe_refund,
        &shop_refund,
        &balance,
        &create,
        &deposit,
        &shop_paid,
    ] {
        assert_eq!(b.item(e).await.state, InboxState::Completed, "{}", e.kind);
    }

    let o = b.order("7001").await;
    assert_eq!(
        (o.invoices.len(), o.paid_minor(), o.payments.len()),
        (1, 12_970, 3),
        "deposit + balance counted once each; Shopify's report is the same money"
    );
    assert_eq!(o.refunds.len(), 1, "{:?}", o.refunds);
    assert_eq!(
        (o.refunds[0].refund_id.as_str(), o.refunded_minor),
        ("re_7001_bal", 9_970)
    );
    assert_eq!(
        (o.payment_status, o.loyalty_points),
        (PaymentStatus::PartiallyRefunded, 30)
    );
    let count = |kind| o.notifications.iter().filter(|n| n.kind == kind).count();
    assert_eq!(
        (
            count(NotificationKind::PaymentReceived),
            count(NotificationKind::Refunded)
        ),
        (1, 1)
    );
    assert_eq!(b.on_hand(RED).await, 10 - 2);
    check_invariants(&b, &SEEDS).await;
}

on_both_backends!(
    same_delivery_twice_and_concurrent_processors_apply_once,
    two_events_for_one_effect_apply_once,
    crash_after_effect_before_ack_has_no_second_effect,
    crash_after_claim_is_completed_after_the_lease,
    swapped_order_converges_to_the_in_order_outcome,
    permanent_error_dead_letters_and_transient_error_retries,
    yesterdays_stream_replayed_shuffled_twice_matches_the_clean_pass,
    one_refund_from_two_providers_and_two_payments_are_counted_once,
);
