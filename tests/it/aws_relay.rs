//! The relay's port on DynamoDB (moto): the delivery record on the processor's finish,
//! the sparse `by_relay_due` index (due items, the backlog), the relay lease, and the
//! per-object order cursors, each checked on the stored data and on the calls made
//! (index Queries and single UpdateItems, never a Scan).

use einmal::ports::Handout;
use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use einmal::envelope::{Envelope, InboxKey};
use einmal::ports::{
    ClaimOutcome, DeliveryState, DeliveryStatus, Finish, Inbox, InboxFilter, InboxItem, InboxRelay,
    InboxState, OrderClaim, OrderGate, OrderPosition, OrderRelease, ReleaseOutcome, Source,
};
use einmal_tests::moto::{self, aws_store, OperationLog};

fn item(event_id: &str, received_at_ms: i64) -> InboxItem {
    let envelope = Envelope {
        provider: "stripe".into(),
        tenant: "t1".into(),
        event_id: event_id.into(),
        event_type: "payment_intent.succeeded".into(),
        object_id: Some("pi_1".into()),
        object_version: None,
        occurred_at: Some(1_700_000_000),
        delivery_id: None,
    };
    InboxItem {
        key: envelope.key(),
        envelope,
        state: InboxState::Received,
        source: Source::Webhook,
        attempts: 0,
        received_at_ms,
        updated_at_ms: received_at_ms,
        expires_at: received_at_ms / 1000 + 30 * 86_400,
        enqueue_failed: false,
        last_error: None,
        last_error_class: None,
        lease_until_ms: None,
        lease_owner: None,
        result: None,
        body_encoding: "identity".into(),
        body_len: 2,
        body: b"{}".to_vec(),
        waiting: None,
        deliveries: Vec::new(),
        relay_due_ms: None,
    }
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
        detail: None,
        output: None,
        release_owed: false,
    }
}

/// Put `it`, claim it as `w1` and finish it `completed` with `deliveries`.
async fn finished(
    store: &dyn einmal::ports::InboxStore,
    it: &InboxItem,
    deliveries: Vec<DeliveryStatus>,
    relay_due_ms: Option<i64>,
) {
    store.put_new(it).await.unwrap();
    let claimed = store.claim(&it.key, "w1", 1_000, 30_000).await.unwrap();
    assert!(matches!(claimed, ClaimOutcome::Claimed(_)), "{claimed:?}");
    let done = Finish {
        state: InboxState::Completed,
        error_class: None,
        error: None,
        result: Some("ok".into()),
        now_ms: 1_100,
        wait: Default::default(),
        deliveries: Some(deliveries),
        relay_due_ms,
    };
    assert!(store
        .finish(&it.key, &Handout::leased("w1"), &done)
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_delivery_is_due_claimed_once_and_leaves_the_index_when_delivered() {
    let operations = OperationLog::new();
    let (store, _) = aws_store(moto::shared(), None).await;
    // The same table through a client that logs every operation.
    let logged = {
        let sdk = moto::shared().sdk_config().await;
        let dynamodb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .interceptor(operations.clone())
                .build(),
        );
        einmal::adapters::aws::AwsStore::new(dynamodb, store.sqs().clone(), store.names())
    };
    let due = 5_000;
    let it = item("evt_pending", 900);
    let recorded = vec![
        delivery("shop", DeliveryState::Pending, Some(due)),
        delivery("crm", DeliveryState::Delivered, None),
    ];
    finished(&store, &it, recorded.clone(), Some(due)).await;
    let stored = store.get(&it.key).await.unwrap().unwrap();
    assert_eq!(stored.deliveries, recorded);
    assert_eq!(stored.relay_due_ms, Some(due));

    operations.take();
    assert!(logged.relay_due(due - 1, 10).await.unwrap().is_empty());
    assert_eq!(
        logged.relay_due(due, 10).await.unwrap(),
        vec![it.key.clone()]
    );
    let ops = operations.take();
    // One Query per shard of the relay's index for each call, nothing else.
    assert_eq!(ops.len(), 32, "{ops:?}");
    assert!(ops.iter().all(|op| op == "Query"), "{ops:?}");

    // The backlog reads the index alone: the deliveries, no body.
    let pending = logged.relay_pending(10).await.unwrap();
    assert!(operations.take().iter().all(|op| op == "Query"));
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].key, it.key);
    assert_eq!(pending[0].deliveries, recorded);
    assert_eq!(pending[0].relay_due_ms, Some(due));
    assert!(pending[0].body.is_empty());

    // One relay gets the lease (one UpdateItem, the item; then its body item, a
    // GetItem); a second one does not while it lives, and cannot finish.
    let claimed = logged
        .claim_relay(&it.key, "relay-a", due, 10_000)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(operations.take(), ["UpdateItem", "GetItem"]);
    assert_eq!(claimed.body, it.body);
    assert_eq!(claimed.deliveries, recorded);
    assert_eq!(
        store
            .claim_relay(&it.key, "relay-b", due + 1, 10_000)
            .await
            .unwrap(),
        None
    );
    // The claim leaves the index alone: still due (a relay that dies keeps it due).
    assert_eq!(
        store.relay_due(due + 1, 10).await.unwrap(),
        vec![it.key.clone()]
    );
    let delivered = vec![
        delivery("shop", DeliveryState::Delivered, None),
        delivery("crm", DeliveryState::Delivered, None),
    ];
    assert!(!store
        .finish_relay(&it.key, "relay-b", &delivered, None, due + 2)
        .await
        .unwrap());
    assert!(logged
        .finish_relay(&it.key, "relay-a", &delivered, None, due + 2)
        .await
        .unwrap());
    assert_eq!(operations.take(), ["UpdateItem"]);

    let stored = store.get(&it.key).await.unwrap().unwrap();
    assert_eq!(stored.deliveries, delivered);
    assert_eq!(stored.relay_due_ms, None);
    assert!(store.relay_due(i64::MAX, 10).await.unwrap().is_empty());
    assert!(store.relay_pending(10).await.unwrap().is_empty());
    // The lease is released: a replay may claim it again at once, due or not.
    assert!(store
        .claim_relay(&it.key, "relay-c", due + 3, 10_000)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_moves_the_due_time_and_only_finished_items_are_claimed() {
    let (store, _) = aws_store(moto::shared(), None).await;
    let a = item("evt_a", 1);
    let b = item("evt_b", 2);
    finished(
        &store,
        &a,
        vec![delivery("shop", DeliveryState::Pending, Some(3_000))],
        Some(3_000),
    )
    .await;
    finished(
        &store,
        &b,
        vec![delivery("shop", DeliveryState::Pending, Some(2_000))],
        Some(2_000),
    )
    .await;
    // Earliest first, across shards.
    assert_eq!(
        store.relay_due(10_000, 10).await.unwrap(),
        vec![b.key.clone(), a.key.clone()]
    );
    assert_eq!(
        store.relay_due(10_000, 1).await.unwrap(),
        vec![b.key.clone()]
    );

    // A failed retry: the next attempt moves later, the item stays pending.
    store
        .claim_relay(&b.key, "r", 2_000, 1_000)
        .await
        .unwrap()
        .expect("claimed");
    let again = vec![delivery("shop", DeliveryState::Pending, Some(20_000))];
    assert!(store
        .finish_relay(&b.key, "r", &again, Some(20_000), 2_100)
        .await
        .unwrap());
    assert_eq!(
        store.relay_due(10_000, 10).await.unwrap(),
        vec![a.key.clone()]
    );
    assert_eq!(
        store.relay_due(20_000, 10).await.unwrap(),
        vec![a.key.clone(), b.key.clone()]
    );
    // An expired relay lease is taken over.
    store
        .claim_relay(&a.key, "dead", 3_000, 100)
        .await
        .unwrap()
        .expect("claimed");
    assert!(store
        .claim_relay(&a.key, "next", 3_050, 100)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .claim_relay(&a.key, "next", 3_101, 100)
        .await
        .unwrap()
        .is_some());
    assert!(!store
        .finish_relay(&a.key, "dead", &again, None, 3_200)
        .await
        .unwrap());

    // Not finished yet (the processor holds it), or missing: no relay claim.
    let open = item("evt_open", 3);
    store.put_new(&open).await.unwrap();
    assert!(store
        .claim_relay(&open.key, "r", 5_000, 1_000)
        .await
        .unwrap()
        .is_none());
    let missing = item("evt_missing", 4).key;
    assert!(store
        .claim_relay(&missing, "r", 5_000, 1_000)
        .await
        .unwrap()
        .is_none());
    assert_eq!(store.get(&missing).await.unwrap(), None, "no item created");

    // The dead relay's lease is gone, its record untouched.
    let stored = store.get(&a.key).await.unwrap().unwrap();
    assert_eq!(stored.deliveries.len(), 1);
    assert_eq!(stored.relay_due_ms, Some(3_000));
}

fn claim(object: &str, key: &str, at: i64, window_ms: i64) -> OrderClaim {
    OrderClaim {
        cursor: einmal::ports::order_cursor_id("shop", "shopify", "t1", object),
        key: key.into(),
        run: format!("run-{key}"),
        item: InboxKey::from_stored(format!("shopify#t1#evt_{key}")),
        position: OrderPosition {
            at,
            received_ms: at,
            event_id: format!("evt_{key}"),
            version: Some(at),
        },
        window_ms,
        hold_ms: 60_000,
        stale_before_ms: 0,
        retain_until_secs: 0,
    }
}

fn delivered(claim: &OrderClaim) -> OrderRelease {
    OrderRelease {
        cursor: claim.cursor.clone(),
        key: claim.key.clone(),
        run: claim.run.clone(),
        outcome: ReleaseOutcome::Delivered(claim.position.clone()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_cursors_hand_an_object_to_one_key_at_a_time_in_version_order() {
    let (store, _) = aws_store(moto::shared(), None).await;
    // A shuffled burst: v2 opens the window, v1 arrives inside it.
    let gate = store
        .order_acquire(&claim("o1", "k2", 2, 1_000), 100)
        .await
        .unwrap();
    assert_eq!(gate, OrderGate::Wait { until_ms: 1_100 });
    let gate = store
        .order_acquire(&claim("o1", "k1", 1, 1_000), 200)
        .await
        .unwrap();
    assert!(matches!(gate, OrderGate::Wait { .. }), "{gate:?}");
    // After the window the oldest goes first; asking again gives the same answer.
    let gate = store
        .order_acquire(&claim("o1", "k2", 2, 1_000), 1_200)
        .await
        .unwrap();
    assert!(matches!(gate, OrderGate::Wait { .. }), "{gate:?}");
    for _ in 0..2 {
        let gate = store
            .order_acquire(&claim("o1", "k1", 1, 1_000), 1_200)
            .await
            .unwrap();
        assert_eq!(gate, OrderGate::Go);
    }
    // Another object is not held back by this one.
    let gate = store
        .order_acquire(&claim("o2", "x1", 7, 0), 1_200)
        .await
        .unwrap();
    assert_eq!(gate, OrderGate::Go);
    // The release hands the turn on and raises the delivered position.
    let next = store
        .order_release(&delivered(&claim("o1", "k1", 1, 0)), 1_300)
        .await
        .unwrap();
    assert_eq!(next, Some(InboxKey::from_stored("shopify#t1#evt_k2")));
    let gate = store
        .order_acquire(&claim("o1", "k2", 2, 1_000), 1_300)
        .await
        .unwrap();
    assert_eq!(gate, OrderGate::Go);
    let next = store
        .order_release(&delivered(&claim("o1", "k2", 2, 0)), 1_400)
        .await
        .unwrap();
    assert_eq!(next, None);
    // A straggler strictly older than the delivered version is superseded.
    let gate = store
        .order_acquire(&claim("o1", "k0", 0, 1_000), 1_500)
        .await
        .unwrap();
    assert_eq!(
        gate,
        OrderGate::Superseded {
            delivered: claim("o1", "k2", 2, 0).position
        }
    );
    // Releasing what is not there is no error.
    let mut nowhere = delivered(&claim("o9", "k", 1, 0));
    nowhere.outcome = ReleaseOutcome::Failed;
    assert_eq!(store.order_release(&nowhere, 1_600).await.unwrap(), None);

    // Cursors share the table with the events but never show up as events.
    let it = item("evt_listed", 1);
    store.put_new(&it).await.unwrap();
    let listed = store.list(&InboxFilter::default()).await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.key.clone()).collect::<Vec<_>>(),
        vec![it.key]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_cursor_lives_at_least_as_long_as_the_items_that_queued_on_it() {
    let moto = moto::shared();
    let (store, names) = aws_store(moto, None).await;
    let now_ms = einmal::time::now_millis();
    // An item kept for a configured 400 days: far past the default cursor lifetime.
    let mut long_kept = claim("o-retained", "k1", 1, 0);
    long_kept.retain_until_secs = now_ms / 1000 + 400 * 86_400;
    assert_eq!(
        store.order_acquire(&long_kept, now_ms).await.unwrap(),
        OrderGate::Go
    );
    let expires_at =
        |m: &std::collections::HashMap<String, AttributeValue>| match m.get("expires_at") {
            Some(AttributeValue::N(n)) => n.parse::<i64>().unwrap(),
            other => panic!("no expiry: {other:?}"),
        };
    let dynamodb = aws_sdk_dynamodb::Client::new(&moto.sdk_config().await);
    let read = || async {
        dynamodb
            .get_item()
            .table_name(&names.table)
            .key(
                "pk",
                AttributeValue::S(format!("cursor#{}", long_kept.cursor)),
            )
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
            .expect("the cursor is stored")
    };
    assert!(expires_at(&read().await) >= long_kept.retain_until_secs);
    // A later write with a shorter-lived item never shortens it.
    let short = claim("o-retained", "k2", 2, 0);
    store
        .order_release(&delivered(&long_kept), now_ms + 10)
        .await
        .unwrap();
    store.order_acquire(&short, now_ms + 20).await.unwrap();
    assert!(expires_at(&read().await) >= long_kept.retain_until_secs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_relays_racing_on_one_object_let_exactly_one_go() {
    let (store, _) = aws_store(moto::shared(), None).await;
    let store = Arc::new(store);
    // Eight keys of one object, no window: the conditional writes decide who heads.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let c = claim("hot", &format!("k{i}"), 10 + i, 0);
                let gate = store.order_acquire(&c, 5_000).await.unwrap();
                (c.key, gate)
            })
        })
        .collect();
    let mut go = BTreeSet::new();
    for t in tasks {
        let (key, gate) = t.await.unwrap();
        if gate == OrderGate::Go {
            go.insert(key);
        }
    }
    assert!(go.len() <= 1, "more than one in flight: {go:?}");
    // Whoever asks now: one holder at most, and once it is released the lowest
    // position goes next.
    let mut holders = Vec::new();
    for i in 0..8 {
        let c = claim("hot", &format!("k{i}"), 10 + i, 0);
        if store.order_acquire(&c, 5_100).await.unwrap() == OrderGate::Go {
            holders.push(c.key);
        }
    }
    assert_eq!(holders.len(), 1, "{holders:?}");
}
