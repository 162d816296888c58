//! Business decisions follow from signed bytes only (issue 10, items 1, 5 and 7), on
//! both backends (embedded SQLite; DynamoDB + SQS in moto), through the real
//! `Ingestor` and processor with the reference domain:
//! - a genuine Shopify `orders/create` body replayed under every other topic, and
//!   under a fresh (unsigned) event id, changes no business record;
//! - genuine `orders/paid` and `orders/cancelled` bodies under their own topics still
//!   pay and cancel (and restock);
//! - a signed body that repeats a key, or is not JSON, is refused with 400 and nothing
//!   is stored;
//! - Slack's signed `url_verification` is answered with its challenge and nothing is
//!   stored.

use einmal::config::Config;
use einmal::domain::reference::{OrderStatus, PaymentStatus};
use einmal::ports::InboxState;
use einmal::providers;
use einmal::request::WebhookRequest;
use einmal_tests::on_both_backends;
use einmal_tests::scenario::{data_of, drain, sample, Backend, Event, Kind, TENANT};
use serde_json::json;

const RED: &str = "SKU-RED-M";
const BLUE: &str = "SKU-BLUE-L";
const SEEDS: [(&str, i64); 2] = [(RED, 10), (BLUE, 5)];

async fn fresh(kind: Kind) -> Backend {
    let b = kind.backend(10).await;
    b.seed(&SEEDS).await;
    b
}

/// The same signed body under another (unsigned) topic and event id header.
fn replayed(original: &Event, topic: &str, event_id: &str) -> Event {
    Event {
        provider: "shopify",
        kind: topic.into(),
        event_id: event_id.into(),
        body: original.body.clone(),
    }
}

async fn create_body_replayed_under_every_topic_changes_nothing(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let p = b.processor(300);
    let create = sample("shopify-orders-create");
    assert!(!b.send(&ingest, &create).await);
    drain(&b, &p).await;
    let o = b.order("1001").await;
    assert_eq!(
        (o.status, o.payment_status),
        (OrderStatus::Open, PaymentStatus::Pending)
    );
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));
    let before = data_of(&b.business_state().await);

    // Every topic the domain maps, plus the same topic under a fresh event id (the id
    // header is unsigned too).
    let replays = [
        (
            "orders/paid",
            "replay-paid",
            "financial_status is pending, not paid",
        ),
        (
            "orders/cancelled",
            "replay-cancelled",
            "has no cancelled_at",
        ),
        (
            "refunds/create",
            "replay-refund",
            "is an order, not a refund",
        ),
        (
            "fulfillments/create",
            "replay-fulfillment",
            "is an order, not a fulfillment",
        ),
        ("orders/updated", "replay-updated", "superseded"),
        ("orders/create", "replay-create", "already"),
    ];
    let replays: Vec<(Event, &str)> = replays
        .iter()
        .map(|(topic, id, why)| (replayed(&create, topic, id), *why))
        .collect();
    for (event, _) in &replays {
        assert!(
            !b.send(&ingest, event).await,
            "{} is new to the inbox",
            event.kind
        );
    }
    drain(&b, &p).await;

    let after = data_of(&b.business_state().await);
    assert_eq!(
        after, before,
        "{}: a replayed body changed business data",
        b.name
    );
    let o = b.order("1001").await;
    assert_eq!(o.payment_status, PaymentStatus::Pending);
    assert!(o.invoices.is_empty() && o.notifications.is_empty());
    assert_eq!(o.loyalty_points, 0);
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));
    for (event, why) in &replays {
        let item = b.item(event).await;
        assert!(
            matches!(item.state, InboxState::Ignored | InboxState::Completed),
            "{} {}: {:?} {:?}",
            b.name,
            event.kind,
            item.state,
            item.result
        );
        let result = item.result.clone().unwrap_or_default();
        assert!(result.contains(why), "{} {}: {result}", b.name, event.kind);
    }

    // The genuine bodies under their own topics still act, once.
    let paid = sample("shopify-orders-paid");
    assert!(!b.send(&ingest, &paid).await);
    drain(&b, &p).await;
    let o = b.order("1001").await;
    assert_eq!(o.payment_status, PaymentStatus::Paid);
    assert_eq!((o.invoices.len(), o.invoices[0].amount_minor), (1, 12_970));
    // The paid body under a fresh event id: no second invoice.
    assert!(!b.send(&ingest, &paid.with_event_id("paid-again")).await);
    let cancelled = sample("shopify-orders-cancelled");
    assert!(!b.send(&ingest, &cancelled).await);
    drain(&b, &p).await;
    let o = b.order("1001").await;
    assert_eq!(o.status, OrderStatus::Cancelled);
    assert_eq!(o.invoices.len(), 1, "{}", b.name);
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (10, 5));
    // The cancelled body again under a fresh id: no second restock.
    assert!(
        !b.send(&ingest, &cancelled.with_event_id("cancel-again"))
            .await
    );
    drain(&b, &p).await;
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (10, 5));
}

/// A signed request for `provider` whose body is `body` (Stripe signs the time).
fn signed(config: &Config, provider: &str, body: &[u8], event_id: &str) -> WebhookRequest {
    let p = providers::lookup(provider).expect("provider");
    let mut tenant = config.tenant(provider, TENANT).expect("tenant").clone();
    tenant.options.insert("topic".into(), "orders/paid".into());
    let headers = p
        .sign(body, &tenant, event_id, einmal::time::now_secs())
        .expect("signs");
    WebhookRequest::post(headers, body.to_vec())
}

async fn ambiguous_or_broken_json_is_refused_and_nothing_stored(kind: Kind) {
    let b = fresh(kind).await;
    let ingest = b.ingestor();
    let config = ingest.config();
    let stripe_object = |id: &str, order: &str| {
        json!({"id": id, "object": "payment_intent", "amount_received": 12970,
               "currency": "eur", "metadata": {"order_id": order}})
    };
    let genuine = json!({"id": "evt_dup", "object": "event", "type": "payment_intent.succeeded",
                         "created": 1_764_400_000, "data": {"object": stripe_object("pi_1", "1001")}});
    let text = genuine.to_string();
    let decoy = format!(
        r#","data":{{"object":{}}}}}"#,
        stripe_object("pi_DECOY", "9999")
    );
    let two_data = format!("{}{decoy}", &text[..text.len() - 1]);
    let escaped = two_data.replacen(
        r#","data":{"object":{"id":"pi_DECOY""#,
        r#","d\u0061ta":{"object":{"id":"pi_DECOY""#,
        1,
    );
    let bodies: Vec<(&str, &str, Vec<u8>)> = vec![
        ("stripe", "two data keys", two_data.clone().into_bytes()),
        ("stripe", "escaped second data key", escaped.into_bytes()),
        ("stripe", "trailing data", format!("{text} {{}}").into_bytes()),
        ("stripe", "bom", [&b"\xef\xbb\xbf"[..], text.as_bytes()].concat()),
        ("stripe", "not JSON", b"tru".to_vec()),
        (
            "shopify",
            "repeated financial_status",
            br#"{"id":1001,"updated_at":"2025-11-29T02:00:05-05:00","financial_status":"pending","financial_status":"paid","total_price":"1.00","line_items":[]}"#.to_vec(),
        ),
        (
            "shopify",
            "invalid UTF-8 in a skipped string",
            b"{\"id\":1001,\"note\":\"\xff\",\"updated_at\":\"2025-11-29T02:00:05-05:00\"}".to_vec(),
        ),
    ];
    for (provider, what, body) in &bodies {
        let request = signed(&config, provider, body, "evt-ambiguous");
        let response = ingest.ingest(provider, TENANT, &request).await;
        assert_eq!(response.status, 400, "{} {what}: {}", b.name, response.body);
        assert_eq!(response.body["error"], "malformed_request", "{what}");
    }
    assert!(
        b.items().await.is_empty(),
        "{}: a refused body was stored",
        b.name
    );
    assert!(b
        .receive_all(std::time::Duration::from_secs(30))
        .await
        .is_empty());
}

async fn slack_url_verification_is_answered_and_nothing_stored(kind: Kind) {
    let b = fresh(kind).await;
    let mut config = (*b.ingestor().config()).clone();
    let slack = providers::lookup("slack").unwrap();
    let mut tenant = config.tenant("stripe", TENANT).unwrap().clone();
    tenant.provider = "slack".into();
    tenant.secrets = vec![einmal::config::Secret::new("slack-signing-secret")];
    tenant.options.clear();
    config.insert_tenant(tenant.clone());
    let ingest = einmal::pipeline::ingest::Ingestor::new(
        std::sync::Arc::new(config),
        b.inbox.clone(),
        b.queue.clone(),
    );
    let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let now = einmal::time::now_secs();
    let headers = slack.sign(body, &tenant, "", now).unwrap();
    let response = ingest
        .ingest(
            "slack",
            TENANT,
            &WebhookRequest::post(headers, body.to_vec()),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(
        response.body,
        json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
    );
    assert_eq!(response.render().0, "application/json");
    // A forged one is refused.
    let mut forged = tenant.clone();
    forged.secrets = vec![einmal::config::Secret::new("not-the-secret")];
    let headers = slack.sign(body, &forged, "", now).unwrap();
    let response = ingest
        .ingest(
            "slack",
            TENANT,
            &WebhookRequest::post(headers, body.to_vec()),
        )
        .await;
    assert_eq!(response.status, 401, "{}", response.body);
    assert!(
        b.items().await.is_empty(),
        "{}: the handshake was stored",
        b.name
    );
    assert!(b
        .receive_all(std::time::Duration::from_secs(30))
        .await
        .is_empty());
}

on_both_backends!(
    create_body_replayed_under_every_topic_changes_nothing,
    ambiguous_or_broken_json_is_refused_and_nothing_stored,
    slack_url_verification_is_answered_and_nothing_stored,
);
