//! The ingest conformance suite: the same scenarios on the embedded store (a real
//! SQLite file in a temp dir) and on the AWS adapter (DynamoDB + SQS in moto).

use einmal::ports::Handout;
use std::sync::Arc;

use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::ports::{
    ClaimOutcome, DeliveryState, DeliveryStatus, Finish, Inbox, InboxItem, InboxProcessing,
    InboxRelay, InboxReplay, InboxState, OrderClaim, OrderGate, OrderPosition, OrderRelease,
    PutOutcome, Queue, ReleaseOutcome, RequeueOutcome, Source,
};
use einmal_tests::fixtures::{all_items, config, drain, signed, stripe_body, FailingQueue};

/// One backend under test: both ports plus whatever keeps it alive.
pub struct Backend {
    pub inbox: Arc<dyn Inbox>,
    pub queue: Arc<dyn Queue>,
    pub processing: Arc<dyn InboxProcessing>,
    pub relay: Arc<dyn InboxRelay>,
    pub replay: Arc<dyn InboxReplay>,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn embedded() -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(
        einmal::adapters::embedded::EmbeddedStore::open(dir.path(), Default::default())
            .expect("embedded store opens"),
    );
    Backend {
        inbox: store.clone(),
        queue: store.clone(),
        processing: store.clone(),
        relay: store.clone(),
        replay: store,
        _keep: Box::new(dir),
    }
}

async fn aws() -> Backend {
    let moto = einmal_tests::moto::shared();
    let (store, _names) = einmal_tests::moto::aws_store(moto, None).await;
    let store = Arc::new(store);
    Backend {
        inbox: store.clone(),
        queue: store.clone(),
        processing: store.clone(),
        relay: store.clone(),
        replay: store,
        _keep: Box::new(()),
    }
}

fn ingestor(b: &Backend) -> Ingestor {
    Ingestor::new(config(), b.inbox.clone(), b.queue.clone())
}

async fn assert_nothing_stored(b: &Backend) {
    assert!(
        all_items(&*b.inbox).await.is_empty(),
        "inbox must stay empty"
    );
    assert!(drain(&*b.queue).await.is_empty(), "queue must stay empty");
}

async fn new_event_is_stored_once_and_enqueued(b: Backend) {
    let ingest = ingestor(&b);
    let cfg = config();
    let body = stripe_body("evt_new_1", 100);
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["duplicate"], false);
    assert_eq!(resp.body["event_id"], "evt_new_1");

    let key = InboxKey::new("stripe", "t1", "evt_new_1");
    let item = b.inbox.get(&key).await.unwrap().expect("stored");
    assert!(matches!(
        item.state,
        InboxState::Received | InboxState::Queued
    ));
    assert_eq!(item.source, Source::Webhook);
    assert_eq!(item.envelope.event_type, "payment_intent.succeeded");
    assert_eq!(item.envelope.object_id.as_deref(), Some("pi_1"));
    assert_eq!(item.body_len as usize, body.len());
    assert_eq!(
        einmal::body::decompress(&item.body, body.len()).unwrap(),
        body
    );
    let retention = 30 * 86_400;
    assert!((item.expires_at - item.received_at_ms / 1000 - retention).abs() <= 1);

    let messages = drain(&*b.queue).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].message.pk, key);
}

async fn duplicate_is_acknowledged_without_a_second_message(b: Backend) {
    let ingest = ingestor(&b);
    let cfg = config();
    let body = stripe_body("evt_dup_1", 10);
    for attempt in 0..3 {
        let resp = ingest
            .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
            .await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body["duplicate"], attempt > 0, "attempt {attempt}");
    }
    assert_eq!(all_items(&*b.inbox).await.len(), 1);
    assert_eq!(drain(&*b.queue).await.len(), 1);
    let counts = ingest.metrics().snapshot();
    assert_eq!(
        (counts.accepted, counts.duplicates, counts.reenqueued),
        (1, 2, 0)
    );
}

async fn fifty_concurrent_identical_deliveries_store_one_item_and_one_message(b: Backend) {
    // The put's atomicity is under test, not the in-flight grace: on a busy machine the
    // shared single-threaded moto can queue the 50 puts and the first one's send for
    // longer than the 15 s grace, and then a duplicate rightly re-enqueues.
    let ingest = Arc::new(ingestor(&b).with_inflight_grace_ms(600_000));
    let cfg = config();
    let body = stripe_body("evt_race_1", 500);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let ingest = ingest.clone();
        let request = signed(&cfg, "stripe", "t1", "", &body);
        tasks.push(tokio::spawn(async move {
            ingest.ingest("stripe", "t1", &request).await
        }));
    }
    let mut fresh = 0;
    for task in tasks {
        let resp = task.await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.body);
        if resp.body["duplicate"] == false {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1, "exactly one delivery is new");
    assert_eq!(all_items(&*b.inbox).await.len(), 1);
    assert_eq!(drain(&*b.queue).await.len(), 1);
}

async fn enqueue_failure_answers_503_and_the_retry_enqueues(b: Backend) {
    let failing: Arc<dyn Queue> = Arc::new(FailingQueue::new(b.queue.clone(), vec![1]));
    let ingest = Ingestor::new(config(), b.inbox.clone(), failing);
    let cfg = config();
    let body = stripe_body("evt_sendfail_1", 10);
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 503, "{}", resp.body);
    assert_eq!(resp.body["error"], "unavailable");

    let key = InboxKey::new("stripe", "t1", "evt_sendfail_1");
    let item = b.inbox.get(&key).await.unwrap().expect("the put happened");
    assert_eq!(item.state, InboxState::Received);
    assert!(item.enqueue_failed, "the failed send is recorded");
    assert!(drain(&*b.queue).await.is_empty());

    // The provider retries (well within the in-flight grace period).
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body["duplicate"], true);
    let messages = drain(&*b.queue).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].message.pk, key);
    assert_eq!(ingest.metrics().snapshot().reenqueued, 1);
}

async fn stored_but_never_sent_is_reenqueued_by_the_next_retry_after_the_grace(b: Backend) {
    // A receiver crashed between the put and the send long ago: nothing was marked.
    let cfg = config();
    let body = stripe_body("evt_crash_1", 10);
    let ingest = ingestor(&b).with_inflight_grace_ms(15_000);
    let key = InboxKey::new("stripe", "t1", "evt_crash_1");
    let old = einmal::time::now_millis() - 60_000;
    let item = InboxItem {
        key: key.clone(),
        envelope: einmal::envelope::Envelope {
            provider: "stripe".into(),
            tenant: "t1".into(),
            event_id: "evt_crash_1".into(),
            event_type: "payment_intent.succeeded".into(),
            object_id: Some("pi_1".into()),
            object_version: None,
            occurred_at: None,
            delivery_id: None,
        },
        state: InboxState::Received,
        source: Source::Webhook,
        attempts: 0,
        received_at_ms: old,
        updated_at_ms: old,
        expires_at: old / 1000 + 86_400,
        enqueue_failed: false,
        last_error: None,
        last_error_class: None,
        lease_until_ms: None,
        lease_owner: None,
        result: None,
        body_encoding: einmal::body::BODY_ENCODING.into(),
        body_len: body.len() as u64,
        body: einmal::body::compress(&body).unwrap(),
        waiting: None,
        deliveries: Vec::new(),
        relay_due_ms: None,
    };
    assert_eq!(b.inbox.put_new(&item).await.unwrap(), PutOutcome::Inserted);
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body["duplicate"], true);
    assert_eq!(drain(&*b.queue).await.len(), 1, "re-enqueued once");
}

async fn every_rejected_request_leaves_inbox_and_queue_empty(b: Backend) {
    let ingest = ingestor(&b);
    let cfg = config();
    let body = stripe_body("evt_reject_1", 10);

    // Bad signature: signed for the other tenant's secret.
    let other = signed(&cfg, "stripe", "t2", "", &body);
    let resp = ingest.ingest("stripe", "t1", &other).await;
    assert_eq!(
        (resp.status, resp.body["error"].as_str()),
        (401, Some("invalid_signature"))
    );

    // Tampered body, original signature.
    let mut tampered = signed(&cfg, "stripe", "t1", "", &body);
    tampered.body = stripe_body("evt_reject_1", 11).into();
    assert_eq!(ingest.ingest("stripe", "t1", &tampered).await.status, 401);

    // No signature header at all.
    let unsigned = einmal::request::WebhookRequest::post(http::HeaderMap::new(), body.clone());
    assert_eq!(ingest.ingest("stripe", "t1", &unsigned).await.status, 401);

    // Authentic but not JSON.
    let resp = ingest
        .ingest(
            "stripe",
            "t1",
            &signed(&cfg, "stripe", "t1", "", b"not json"),
        )
        .await;
    assert_eq!(
        (resp.status, resp.body["error"].as_str()),
        (400, Some("malformed_request"))
    );

    // Authentic JSON without an event id.
    let no_id = br#"{"object":"event","type":"payment_intent.succeeded"}"#;
    assert_eq!(
        ingest
            .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", no_id))
            .await
            .status,
        400
    );

    // Over the body limit (64 KiB in the fixture config).
    let big = stripe_body("evt_big", 70_000);
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &big))
        .await;
    assert_eq!(
        (resp.status, resp.body["error"].as_str()),
        (413, Some("payload_too_large"))
    );

    // Unknown tenant and unknown provider: the same 404, no detail.
    let r1 = ingest
        .ingest("stripe", "nobody", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    let r2 = ingest
        .ingest("paypalx", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!((r1.status, r2.status), (404, 404));
    assert_eq!(r1.body, r2.body);

    let counts = ingest.metrics().snapshot();
    assert_eq!(counts.signature_failures, 3);
    assert_eq!(counts.malformed, 2);
    assert_eq!(counts.oversize, 1);
    assert_eq!(counts.not_found, 2);
    assert_eq!(counts.accepted, 0);
    assert_nothing_stored(&b).await;
}

async fn body_that_cannot_fit_one_item_compressed_is_refused(b: Backend) {
    let mut cfg = (*config()).clone();
    cfg.ingest.max_body_bytes = 1024 * 1024;
    cfg.ingest.max_stored_body_bytes = 2048;
    let cfg = Arc::new(cfg);
    let ingest = Ingestor::new(cfg.clone(), b.inbox.clone(), b.queue.clone());
    // Pseudo-random letters (xorshift) barely compress.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: String = (0..20_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    let body = stripe_body("evt_incompressible", 0);
    let mut value: serde_json::Value = serde_json::from_slice(&body).unwrap();
    value["data"]["object"]["metadata"]["note"] = noise.into();
    let body = value.to_string().into_bytes();
    let resp = ingest
        .ingest("stripe", "t1", &signed(&cfg, "stripe", "t1", "", &body))
        .await;
    assert_eq!(resp.status, 413, "{}", resp.body);
    assert_eq!(ingest.metrics().snapshot().oversize, 1);
    assert_nothing_stored(&b).await;
}

async fn tenants_are_isolated_and_each_provider_ingests(b: Backend) {
    let ingest = ingestor(&b);
    let cfg = config();
    let cases = [
        (
            "stripe",
            "evt_iso_1".to_string(),
            stripe_body("evt_iso_1", 10),
        ),
        (
            "shopify",
            "1001".to_string(),
            br#"{"id":450789469,"updated_at":"2026-11-29T10:00:00Z"}"#.to_vec(),
        ),
        (
            "github",
            "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_string(),
            br#"{"action":"opened"}"#.to_vec(),
        ),
        (
            "standard-webhooks",
            "msg_iso_1".to_string(),
            br#"{"type":"invoice.paid","data":{"id":"inv_1"}}"#.to_vec(),
        ),
    ];
    for (provider, id, body) in &cases {
        let resp = ingest
            .ingest(provider, "t1", &signed(&cfg, provider, "t1", id, body))
            .await;
        assert_eq!(resp.status, 200, "{provider}: {}", resp.body);
    }
    // Tenant t2 has its own secret: t1's signature does not open it.
    let resp = ingest
        .ingest(
            "stripe",
            "t2",
            &signed(&cfg, "stripe", "t1", "", &stripe_body("evt_iso_2", 1)),
        )
        .await;
    assert_eq!(resp.status, 401);
    let items = all_items(&*b.inbox).await;
    assert_eq!(items.len(), cases.len());
    assert!(items.iter().all(|i| i.envelope.tenant == "t1"));
    assert_eq!(drain(&*b.queue).await.len(), cases.len());
}

// ---------------------------------------------------------------------------
// The relay port

/// A stored, claimed and finished (`completed`) event with `deliveries`.
async fn finished_with(
    b: &Backend,
    event_id: &str,
    deliveries: Vec<DeliveryStatus>,
    relay_due_ms: Option<i64>,
) -> InboxKey {
    let body = stripe_body(event_id, 1);
    let resp = ingestor(b)
        .ingest(
            "stripe",
            "t1",
            &signed(&config(), "stripe", "t1", "", &body),
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let key = InboxKey::new("stripe", "t1", event_id);
    let now = einmal::time::now_millis();
    assert!(matches!(
        b.processing.claim(&key, "w1", now, 30_000).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    let finish = Finish {
        state: InboxState::Completed,
        error_class: None,
        error: None,
        result: Some("done".into()),
        now_ms: now,
        wait: Default::default(),
        deliveries: Some(deliveries),
        relay_due_ms,
    };
    assert!(b
        .processing
        .finish(&key, &Handout::leased("w1"), &finish)
        .await
        .unwrap());
    key
}

fn delivery(destination: &str, state: DeliveryState, next: Option<i64>) -> DeliveryStatus {
    DeliveryStatus {
        destination: destination.into(),
        key: format!("msg_{destination}"),
        state,
        attempts: 1,
        last_status: Some(if state == DeliveryState::Delivered {
            200
        } else {
            503
        }),
        last_latency_ms: Some(12),
        last_attempt_ms: Some(1_000),
        next_attempt_ms: next,
        detail: (state != DeliveryState::Delivered).then(|| "retryable (status 503): busy".into()),
        output: None,
        release_owed: false,
    }
}

async fn due_keys(b: &Backend, now_ms: i64) -> Vec<InboxKey> {
    b.relay.relay_due(now_ms, 100).await.unwrap()
}

async fn the_finish_records_deliveries_and_the_due_index_finds_pending_ones(b: Backend) {
    let due_at = einmal::time::now_millis() + 60_000;
    let deliveries = vec![
        delivery("shop", DeliveryState::Delivered, None),
        delivery("crm", DeliveryState::Pending, Some(due_at)),
    ];
    let pending = finished_with(&b, "evt_rel_1", deliveries.clone(), Some(due_at)).await;
    let done = finished_with(
        &b,
        "evt_rel_2",
        vec![delivery("shop", DeliveryState::Delivered, None)],
        None,
    )
    .await;
    let stored = b.inbox.get(&pending).await.unwrap().unwrap();
    assert_eq!(stored.deliveries, deliveries);
    assert_eq!(stored.relay_due_ms, Some(due_at));
    let stored = b.inbox.get(&done).await.unwrap().unwrap();
    assert_eq!(stored.relay_due_ms, None);
    assert_eq!(stored.deliveries.len(), 1);
    // Only the pending one is indexed, and only once due. (The AWS index is eventually
    // consistent: poll briefly.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while due_keys(&b, due_at).await != vec![pending.clone()] {
        assert!(
            std::time::Instant::now() < deadline,
            "due index never showed the item"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(due_keys(&b, due_at - 1).await.is_empty());
    let backlog = b.relay.relay_pending(100).await.unwrap();
    assert_eq!(backlog.len(), 1);
    assert_eq!(backlog[0].key, pending);
    assert_eq!(backlog[0].deliveries, deliveries);
}

/// Poll `read` until it gives `want` (the AWS indexes are eventually consistent).
async fn eventually_keys<F, Fut>(what: &str, want: Vec<InboxKey>, read: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<InboxItem>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got: Vec<InboxKey> = read().await.into_iter().map(|i| i.key).collect();
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn dead_lettered_deliveries_are_listed_newest_first_until_replayed(b: Backend) {
    let mut dead = delivery("shop", DeliveryState::DeadLetter, None);
    dead.last_status = Some(410);
    dead.detail = Some("permanent failure: status 410: gone".into());
    let older = finished_with(
        &b,
        "evt_dead_1",
        vec![
            delivery("crm", DeliveryState::Delivered, None),
            dead.clone(),
        ],
        None,
    )
    .await;
    let mut newer_dead = dead.clone();
    newer_dead.last_attempt_ms = Some(2_000);
    let newer = finished_with(&b, "evt_dead_2", vec![newer_dead], None).await;
    // Neither a delivered nor a pending delivery is a dead letter.
    let due_at = einmal::time::now_millis() + 60_000;
    finished_with(
        &b,
        "evt_dead_3",
        vec![delivery("shop", DeliveryState::Pending, Some(due_at))],
        Some(due_at),
    )
    .await;
    finished_with(
        &b,
        "evt_dead_4",
        vec![delivery("shop", DeliveryState::Delivered, None)],
        None,
    )
    .await;
    eventually_keys(
        "dead-lettered deliveries",
        vec![newer.clone(), older.clone()],
        || async { b.relay.relay_dead(100).await.unwrap() },
    )
    .await;
    let listed = b.relay.relay_dead(100).await.unwrap();
    assert_eq!(listed[1].deliveries[1], dead, "the record as written");
    assert_eq!(listed[1].envelope.event_type, "payment_intent.succeeded");
    assert_eq!(listed[1].state, InboxState::Completed);
    assert_eq!(b.relay.relay_dead(1).await.unwrap().len(), 1, "bounded");

    // Scheduled again (as a replay does): out of the listing, into the due index.
    let now = einmal::time::now_millis();
    assert!(b
        .relay
        .claim_relay(&older, "r1", now, 5_000)
        .await
        .unwrap()
        .is_some());
    let mut again = b.inbox.get(&older).await.unwrap().unwrap().deliveries;
    again[1].state = DeliveryState::Pending;
    again[1].next_attempt_ms = Some(now);
    assert!(b
        .relay
        .finish_relay(&older, "r1", &again, Some(now), now)
        .await
        .unwrap());
    eventually_keys("after the replay", vec![newer.clone()], || async {
        b.relay.relay_dead(100).await.unwrap()
    })
    .await;
    // Given up again by the relay: listed again, now the newest.
    assert!(b
        .relay
        .claim_relay(&older, "r2", now + 1, 5_000)
        .await
        .unwrap()
        .is_some());
    again[1].state = DeliveryState::DeadLetter;
    again[1].next_attempt_ms = None;
    again[1].last_attempt_ms = Some(now);
    assert!(b
        .relay
        .finish_relay(&older, "r2", &again, None, now + 1)
        .await
        .unwrap());
    eventually_keys("dead again", vec![older.clone(), newer.clone()], || async {
        b.relay.relay_dead(100).await.unwrap()
    })
    .await;
    assert!(due_keys(&b, now + 1).await.is_empty());
}

async fn the_relay_lease_is_exclusive_and_its_finish_clears_the_due_time(b: Backend) {
    let now = einmal::time::now_millis();
    let key = finished_with(
        &b,
        "evt_rel_3",
        vec![delivery("crm", DeliveryState::Pending, Some(now))],
        Some(now),
    )
    .await;
    let claimed = b.relay.claim_relay(&key, "r1", now, 5_000).await.unwrap();
    let claimed = claimed.expect("a finished item is claimable");
    assert_eq!(claimed.deliveries.len(), 1);
    assert!(!claimed.body.is_empty(), "the claim returns the body");
    assert!(b
        .relay
        .claim_relay(&key, "r2", now + 1, 5_000)
        .await
        .unwrap()
        .is_none());
    let delivered = vec![delivery("crm", DeliveryState::Delivered, None)];
    assert!(!b
        .relay
        .finish_relay(&key, "r2", &delivered, None, now + 2)
        .await
        .unwrap());
    assert!(b
        .relay
        .finish_relay(&key, "r1", &delivered, None, now + 2)
        .await
        .unwrap());
    let stored = b.inbox.get(&key).await.unwrap().unwrap();
    assert_eq!((stored.deliveries, stored.relay_due_ms), (delivered, None));
    // Released: claimable again at once; an expired lease is too.
    assert!(b
        .relay
        .claim_relay(&key, "r2", now + 3, 1)
        .await
        .unwrap()
        .is_some());
    assert!(b
        .relay
        .claim_relay(&key, "r3", now + 10, 5_000)
        .await
        .unwrap()
        .is_some());
    // An item that is not finished is never the relay's.
    let resp = ingestor(&b)
        .ingest(
            "stripe",
            "t1",
            &signed(&config(), "stripe", "t1", "", &stripe_body("evt_rel_4", 1)),
        )
        .await;
    assert_eq!(resp.status, 200);
    let queued = InboxKey::new("stripe", "t1", "evt_rel_4");
    assert!(b
        .relay
        .claim_relay(&queued, "r1", now, 5_000)
        .await
        .unwrap()
        .is_none());
    let missing = InboxKey::new("stripe", "t1", "evt_nope");
    assert!(b
        .relay
        .claim_relay(&missing, "r1", now, 5_000)
        .await
        .unwrap()
        .is_none());
}

fn order_claim(cursor: &str, version: i64) -> OrderClaim {
    OrderClaim {
        cursor: cursor.into(),
        key: format!("msg_v{version}"),
        run: format!("run-v{version}"),
        item: InboxKey::new("shopify", "t1", &format!("v{version}")),
        position: OrderPosition {
            at: version,
            received_ms: version,
            event_id: format!("v{version}"),
            version: Some(version),
        },
        window_ms: 0,
        hold_ms: 60_000,
        stale_before_ms: 0,
        retain_until_secs: 0,
    }
}

fn release_of(claim: &OrderClaim, outcome: ReleaseOutcome) -> OrderRelease {
    OrderRelease {
        cursor: claim.cursor.clone(),
        key: claim.key.clone(),
        run: claim.run.clone(),
        outcome,
    }
}

fn delivered(claim: &OrderClaim) -> OrderRelease {
    release_of(claim, ReleaseOutcome::Delivered(claim.position.clone()))
}

async fn the_order_cursor_hands_an_object_out_lowest_version_first(b: Backend) {
    let now = einmal::time::now_millis();
    let cursor = format!("ledger#shopify#t1#{now}");
    let (v1, v2, v3) = (
        order_claim(&cursor, 1),
        order_claim(&cursor, 2),
        order_claim(&cursor, 3),
    );
    assert_eq!(
        b.relay.order_acquire(&v3, now).await.unwrap(),
        OrderGate::Go
    );
    // v3 holds the object until released; v1 queues below it and goes next, only
    // after v3 is done: one in flight at a time.
    assert!(matches!(
        b.relay.order_acquire(&v1, now).await.unwrap(),
        OrderGate::Wait { .. }
    ));
    assert!(matches!(
        b.relay.order_acquire(&v2, now).await.unwrap(),
        OrderGate::Wait { .. }
    ));
    // The same run asking again gets the same answer; another run of v3 waits.
    assert_eq!(
        b.relay.order_acquire(&v3, now).await.unwrap(),
        OrderGate::Go
    );
    let mut v3_again = v3.clone();
    v3_again.run = "run-v3-duplicate".into();
    assert!(matches!(
        b.relay.order_acquire(&v3_again, now).await.unwrap(),
        OrderGate::Wait { .. }
    ));
    // Dead-lettered (no delivered position): the turn goes to the lowest left.
    let next = b
        .relay
        .order_release(&release_of(&v3, ReleaseOutcome::Failed), now)
        .await
        .unwrap();
    assert_eq!(next, Some(v1.item.clone()));
    assert_eq!(
        b.relay.order_acquire(&v1, now).await.unwrap(),
        OrderGate::Go
    );
    let next = b.relay.order_release(&delivered(&v1), now).await.unwrap();
    assert_eq!(next, Some(v2.item.clone()));
    assert_eq!(
        b.relay.order_acquire(&v2, now).await.unwrap(),
        OrderGate::Go
    );
    let next = b.relay.order_release(&delivered(&v2), now).await.unwrap();
    assert_eq!(next, None);
    // Strictly older than the delivered version: superseded, never sent.
    assert!(matches!(
        b.relay.order_acquire(&v1, now).await.unwrap(),
        OrderGate::Superseded { delivered } if delivered == v2.position
    ));
    // The same version (another event stamped in the same second) is a tie: it goes.
    let mut tie = order_claim(&cursor, 2);
    tie.key = "msg_v2_tie".into();
    tie.run = "run-v2-tie".into();
    tie.position.event_id = "v0-sorts-first".into();
    tie.position.received_ms = 10;
    assert_eq!(
        b.relay.order_acquire(&tie, now).await.unwrap(),
        OrderGate::Go
    );
    b.relay.order_release(&delivered(&tie), now).await.unwrap();
    // Without a version nothing is ever superseded, however old.
    let mut unversioned = order_claim(&cursor, 0);
    unversioned.position.version = None;
    assert_eq!(
        b.relay.order_acquire(&unversioned, now).await.unwrap(),
        OrderGate::Go
    );
    // A release of an unknown key or cursor is no error.
    let mut nowhere = order_claim("nope", 1);
    nowhere.key = "msg_x".into();
    assert_eq!(
        b.relay
            .order_release(&release_of(&nowhere, ReleaseOutcome::Failed), now)
            .await
            .unwrap(),
        None
    );
}

async fn claim(b: &Backend, key: &InboxKey, owner: &str) {
    let now = einmal::time::now_millis();
    assert!(matches!(
        b.processing.claim(key, owner, now, 30_000).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
}

fn finish_as(state: InboxState, error: Option<&str>, result: Option<&str>) -> Finish {
    Finish {
        state,
        error_class: error.map(|_| "permanent".into()),
        error: error.map(Into::into),
        result: result.map(Into::into),
        now_ms: einmal::time::now_millis(),
        wait: Default::default(),
        deliveries: None,
        relay_due_ms: None,
    }
}

async fn a_replayed_dead_letter_completes_without_its_error_and_a_forced_replay_keeps_its_result(
    b: Backend,
) {
    let body = stripe_body("evt_fixed_1", 10);
    let resp = ingestor(&b)
        .ingest(
            "stripe",
            "t1",
            &signed(&config(), "stripe", "t1", "", &body),
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let key = InboxKey::new("stripe", "t1", "evt_fixed_1");
    let item = |b: &Backend| {
        let key = key.clone();
        let inbox = b.inbox.clone();
        async move { inbox.get(&key).await.unwrap().expect("stored") }
    };

    claim(&b, &key, "w1").await;
    let dead = finish_as(InboxState::DeadLetter, Some("unknown SKU SKU-NOPE"), None);
    assert!(b
        .processing
        .finish(&key, &Handout::leased("w1"), &dead)
        .await
        .unwrap());
    let failed = item(&b).await;
    assert_eq!(failed.last_error.as_deref(), Some("unknown SKU SKU-NOPE"));

    // Fixed and replayed: queued with its error, then completed without it.
    assert!(matches!(
        b.replay
            .requeue(&key, false, einmal::time::now_millis())
            .await
            .unwrap(),
        RequeueOutcome::Requeued {
            from: InboxState::DeadLetter
        }
    ));
    assert_eq!(
        item(&b).await.last_error,
        failed.last_error,
        "kept while queued"
    );
    claim(&b, &key, "w2").await;
    let done = finish_as(InboxState::Completed, None, Some("order 1001 paid"));
    assert!(b
        .processing
        .finish(&key, &Handout::leased("w2"), &done)
        .await
        .unwrap());
    let completed = item(&b).await;
    assert_eq!(completed.state, InboxState::Completed);
    assert_eq!(
        (completed.last_error, completed.last_error_class),
        (None, None),
        "a completed event keeps no error"
    );
    assert_eq!(completed.result.as_deref(), Some("order 1001 paid"));

    // A forced replay keeps the result; a re-run that changes nothing leaves it.
    assert!(matches!(
        b.replay
            .requeue(&key, true, einmal::time::now_millis())
            .await
            .unwrap(),
        RequeueOutcome::Requeued {
            from: InboxState::Completed
        }
    ));
    let forced = item(&b).await;
    assert_eq!(forced.state, InboxState::Queued);
    assert_eq!(forced.result.as_deref(), Some("order 1001 paid"));
    claim(&b, &key, "w3").await;
    let rerun = finish_as(InboxState::Completed, None, None);
    assert!(b
        .processing
        .finish(&key, &Handout::leased("w3"), &rerun)
        .await
        .unwrap());
    let rerun = item(&b).await;
    assert_eq!(rerun.state, InboxState::Completed);
    assert_eq!(rerun.result.as_deref(), Some("order 1001 paid"));
}

macro_rules! conformance {
    ($($scenario:ident),* $(,)?) => {
        mod embedded_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario(super::embedded().await).await
                }
            )*
        }
        mod aws_moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario(super::aws().await).await
                }
            )*
        }
    };
}

conformance!(
    new_event_is_stored_once_and_enqueued,
    duplicate_is_acknowledged_without_a_second_message,
    fifty_concurrent_identical_deliveries_store_one_item_and_one_message,
    enqueue_failure_answers_503_and_the_retry_enqueues,
    stored_but_never_sent_is_reenqueued_by_the_next_retry_after_the_grace,
    every_rejected_request_leaves_inbox_and_queue_empty,
    body_that_cannot_fit_one_item_compressed_is_refused,
    tenants_are_isolated_and_each_provider_ingests,
    the_finish_records_deliveries_and_the_due_index_finds_pending_ones,
    the_relay_lease_is_exclusive_and_its_finish_clears_the_due_time,
    dead_lettered_deliveries_are_listed_newest_first_until_replayed,
    the_order_cursor_hands_an_object_out_lowest_version_first,
    a_replayed_dead_letter_completes_without_its_error_and_a_forced_replay_keeps_its_result,
);
