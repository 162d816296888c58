//! A user's own domain without a fork: `examples/custom-domain` (subscriptions and
//! invoices from Stripe events) under the framework's conformance scenarios
//! (`scenario::suite`: in order, duplicates, concurrent workers, a crash between
//! commit and finish, shuffled copies) on both backends, with its own invariants; the
//! reference domain passes the same scenarios.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use custom_domain::{Subscriptions, INVOICE, SUBSCRIPTION};
use einmal::domain::state::{StateKey, StateRecord};
use einmal::domain::Domain;
use einmal::ports::InboxState;
use einmal_tests::scenario::suite::{self, Subject};
use einmal_tests::scenario::{stripe_event, yesterday, Backend, Event, Handled, Kind, TENANT};
use serde_json::{json, Value};

/// A day of a subscription service: six subscriptions created, upgraded, some moved
/// to a team plan or cancelled, their invoices paid (one reported twice under two event
/// ids), and an event type the domain does not handle.
struct Day {
    events: Vec<Event>,
    /// The business data the rules give, by record pk.
    expected: BTreeMap<String, Value>,
}

fn subscription(id: &str, status: &str, plan: &str) -> Value {
    json!({"id": id, "object": "subscription", "customer": format!("cus_{id}"),
           "status": status, "items": {"object": "list",
           "data": [{"id": format!("si_{id}"), "price": {"id": plan}}]}})
}

fn invoice(id: &str, sub: &str, amount: i64) -> Value {
    json!({"id": id, "object": "invoice", "subscription": sub, "amount_paid": amount,
           "currency": "eur", "status": "paid"})
}

fn day() -> Day {
    let mut events = Vec::new();
    let mut expected = BTreeMap::new();
    for i in 1..=6i64 {
        let sub = format!("sub_{i}");
        let t = 1_764_600_000 + i * 1_000;
        let mut changes = vec![
            ("created", t, "trialing", "price_basic"),
            ("updated", t + 100, "active", "price_pro"),
        ];
        let mut invoices = vec![(format!("in_{i}_1"), t + 110, 1_000 * i)];
        if i % 2 == 0 {
            changes.push(("updated", t + 200, "active", "price_team"));
            invoices.push((format!("in_{i}_2"), t + 210, 2_500));
        }
        if i % 3 == 0 {
            changes.push(("deleted", t + 300, "canceled", changes.last().unwrap().3));
        }
        for (n, (action, at, status, plan)) in changes.iter().enumerate() {
            let kind = format!("customer.subscription.{action}");
            let object = subscription(&sub, status, plan);
            events.push(stripe_event(&kind, &format!("evt_{sub}_{n}"), *at, object));
        }
        for (id, at, amount) in &invoices {
            let object = invoice(id, &sub, *amount);
            events.push(stripe_event(
                "invoice.paid",
                &format!("evt_{id}"),
                *at,
                object,
            ));
            let data = json!({"invoice_id": id, "subscription": sub, "amount_minor": amount,
                              "currency": "eur"});
            expected.insert(StateKey::new(TENANT, INVOICE, id).pk(), data);
        }
        let (_, version, status, plan) = *changes.last().unwrap();
        let data = json!({"subscription_id": sub, "customer": format!("cus_{sub}"),
            "plan": plan, "status": status, "version": version,
            "paid_minor": invoices.iter().map(|(_, _, a)| a).sum::<i64>(),
            "invoices": invoices.len()});
        expected.insert(StateKey::new(TENANT, SUBSCRIPTION, &sub).pk(), data);
    }
    // The same invoice reported again under another event id counts once.
    let resent = events.iter().find(|e| e.event_id == "evt_in_1_1").unwrap();
    events.push(resent.with_event_id("evt_in_1_1_resent"));
    let customer = json!({"id": "cus_sub_1", "object": "customer"});
    events.push(stripe_event(
        "customer.created",
        "evt_cus_1",
        1_764_600_001,
        customer,
    ));
    Day { events, expected }
}

#[async_trait::async_trait]
impl Subject for Day {
    fn domain(&self) -> Arc<dyn Domain> {
        Arc::new(Subscriptions)
    }
    fn events(&self) -> Vec<Event> {
        self.events.clone()
    }
    /// Each invoice carries exactly its own effect key; a subscription carries only
    /// its own versions' keys (the invoices' are on the invoices), and its totals are
    /// the sum of its invoices; every inbox item is terminal.
    async fn check(&self, b: &Backend) -> BTreeMap<String, StateRecord> {
        let mut keys = Vec::new();
        for kind in [SUBSCRIPTION, INVOICE] {
            let listed = b.state.list(TENANT, kind, 1_000).await.expect("state list");
            keys.extend(listed.into_iter().map(|r| r.key));
        }
        let state = b.load_all(&keys).await;
        let mut paid: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for record in state.values().filter(|r| r.key.kind == INVOICE) {
            let key = format!("{TENANT}#invoice-{}#paid", record.key.id);
            assert_eq!(record.applied, BTreeSet::from([key]), "{}", record.key.pk());
            let sub = record.data["subscription"].as_str().unwrap().to_owned();
            let total = paid.entry(sub).or_default();
            *total = (
                total.0 + record.data["amount_minor"].as_i64().unwrap(),
                total.1 + 1,
            );
        }
        for record in state.values().filter(|r| r.key.kind == SUBSCRIPTION) {
            let own = format!("{TENANT}#subscription-{}#v", record.key.id);
            assert!(
                record.applied.iter().all(|k| k.starts_with(&own)),
                "{}: {:?}",
                record.key.pk(),
                record.applied
            );
            let (minor, count) = paid.get(&record.key.id).copied().unwrap_or_default();
            assert_eq!(record.data["paid_minor"], minor, "{}", record.key.pk());
            assert_eq!(record.data["invoices"], count, "{}", record.key.pk());
        }
        let items = b.items().await;
        let open: Vec<String> = (items.iter())
            .filter(|i| !i.state.is_terminal())
            .map(|i| format!("{} {}", i.key, i.state))
            .collect();
        assert!(
            open.is_empty(),
            "{}: inbox items not terminal: {open:?}",
            b.name
        );
        state
    }
}

async fn the_custom_domain_passes_the_conformance_scenarios(kind: Kind) {
    let day = day();
    suite::run_all(kind, &day, Some(&day.expected)).await;
}

einmal_tests::on_both_backends!(the_custom_domain_passes_the_conformance_scenarios);

/// The reference domain runs the same scenarios (yesterday's stream, embedded).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reference_domain_passes_the_same_scenarios() {
    let stream = yesterday(20_251_201);
    suite::run_all(Kind::Embedded, &stream, Some(&stream.expected_data())).await;
}

/// An invoice before its subscription waits for it (not a failure); one the domain
/// cannot read is dead-lettered with the reason naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_early_invoice_waits_and_a_bad_one_dead_letters() {
    let day = day();
    let b = suite::fresh(Kind::Embedded, &day).await;
    let ingest = b.ingestor();
    let early = stripe_event(
        "invoice.paid",
        "evt_early",
        1,
        invoice("in_9", "sub_9", 100),
    );
    let mut bad = invoice("in_8", "sub_1", 100);
    bad.as_object_mut().unwrap().remove("amount_paid");
    let bad = stripe_event("invoice.paid", "evt_bad", 1, bad);
    for e in [&early, &bad] {
        assert!(!b.send(&ingest, e).await);
    }
    let p = b.processor(suite::LEASE_MS);
    let mut handled = Vec::new();
    for e in [&early, &bad] {
        if !handled.iter().any(|h: &Handled| h.key == e.inbox_key()) {
            handled.extend(suite::until_handled(&b, &p, &e.inbox_key()).await);
        }
    }
    let item = b.item(&early).await;
    assert_eq!(item.state, InboxState::Waiting, "{:?}", item.last_error);
    let item = b.item(&bad).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    let reason = item.last_error.unwrap_or_default();
    assert!(
        reason.contains("`amount_paid` is not an integer"),
        "{reason}"
    );
}
