//! The black-box scenarios, each written once and run on both backends through the real
//! binary: `einmal serve` on the embedded store, and `einmal serve --backend aws` (the
//! four Lambdas' own handlers) on moto, one moto for this test binary. A client thread
//! acts as the provider: it retries every webhook until it is acknowledged, and sends
//! each one twice. The outcome is read with the CLI (`events list`, `orders show`,
//! `inventory show`, `dlq list`) and at the destinations.
//!
//! - kill -9 every few seconds while clients send: nothing acknowledged is lost, no
//!   effect is doubled, nothing is dead-lettered, all drained soon after the last start;
//! - one SKU ordered from 8 clients at once: stock moves exactly once per order;
//! - a shuffled stream ends in the same business state as the same stream in order;
//! - destinations (HTTP verified with the Standard Webhooks library, PostgreSQL, an SQS
//!   FIFO queue on moto) get each event exactly once across a kill -9;
//! - AWS only, through a fault proxy in front of moto: each fault at 10% of the
//!   DynamoDB and SQS calls for a whole stream with a kill -9 in it, and a DynamoDB
//!   outage in the middle of a stream with a kill -9 during it (2 minutes in
//!   production terms; `EINMAL_BB_OUTAGE_SECS`, 15 s here); an HTTP destination gets
//!   every event exactly once after its dedup.
//!
//! Sizes are small (moto serves ~30 calls/s, one at a time) and set by `EINMAL_BB_*`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::stack::{Backend, Sender, Stack};
use einmal::destinations::delivery_key;
use einmal_tests::destination_server::{Answer, DestinationServer, SECRET};
use einmal_tests::fault_proxy::{Fault, FaultProxy, Service};
use einmal_tests::scenario::sized;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};

const DRAIN: Duration = Duration::from_secs(240);

/// A Shopify event: (topic, event id, body).
type Webhook = (&'static str, String, Value);

/// `orders/create` of order `id`, paid: one invoice, `qty` of `sku` reserved.
fn order_created(id: u64, sku: &str, qty: i64) -> Webhook {
    (
        "orders/create",
        format!("create-{id}"),
        json!({
            "id": id, "name": format!("#{id}"), "order_number": id, "email": "jon@example.com",
            "created_at": "2026-11-30T10:00:00-05:00", "updated_at": "2026-11-30T10:00:00-05:00",
            "currency": "EUR", "total_price": "20.00", "subtotal_price": "20.00",
            "financial_status": "paid",
            "line_items": [{"id": id * 100, "sku": sku, "quantity": qty, "title": "T-shirt",
                            "price": "10.00"}]
        }),
    )
}

/// Send every webhook twice (the provider's retry), from `clients` threads, each
/// retried until acknowledged.
fn send_all(stack: &Sender, webhooks: &[Webhook], clients: usize) {
    send_counted(stack, webhooks, clients, &AtomicUsize::new(0));
}

/// [`send_all`], counting the acknowledgements in `acked`.
fn send_counted(stack: &Sender, webhooks: &[Webhook], clients: usize, acked: &AtomicUsize) {
    std::thread::scope(|scope| {
        for chunk in webhooks.chunks(webhooks.len().div_ceil(clients).max(1)) {
            scope.spawn(move || {
                for (topic, id, body) in chunk.iter().chain(chunk.iter()) {
                    stack.send_until_acked("shopify", Some(topic), id, body);
                    acked.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
}

/// [`send_all`] while `stack` is killed with SIGKILL and started again `kills` times,
/// spread over the stream by acknowledgements (the same on a fast and a slow
/// backend), and once more after the last acknowledgement.
fn send_while_killing(stack: &mut Stack, webhooks: &[Webhook], clients: usize, kills: usize) {
    let done = AtomicBool::new(false);
    let acked = AtomicUsize::new(0);
    let sends = webhooks.len() * 2;
    let sender = stack.sender();
    std::thread::scope(|scope| {
        let (sender, done, acked) = (&sender, &done, &acked);
        scope.spawn(move || {
            send_counted(sender, webhooks, clients, acked);
            done.store(true, Ordering::SeqCst);
        });
        for k in 1..=kills {
            let mark = sends * k / (kills + 1);
            while acked.load(Ordering::SeqCst) < mark && !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            stack.kill();
            stack.start();
        }
        while !done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        stack.kill();
        stack.start();
    });
}

/// Every order once: one invoice each, and the SKU's stock moved once per order.
fn assert_orders_applied_once(stack: &Stack, ids: &[u64], sku: &str, stock: i64, qty: i64) {
    for id in ids {
        let order = stack.order(&id.to_string());
        assert_eq!(
            order["invoices"].as_array().map(Vec::len),
            Some(1),
            "order {id}: {order}"
        );
    }
    assert_eq!(
        stack.on_hand(sku),
        stock - qty * ids.len() as i64,
        "{sku}: stock moved once per order"
    );
    assert_eq!(stack.dead_letters(), json!([]), "nothing dead-lettered");
}

fn killed_every_few_seconds_while_clients_send(backend: Backend) {
    let orders = sized("EINMAL_BB_KILL_ORDERS", 24);
    let kills = sized("EINMAL_BB_KILLS", 4) as usize;
    let mut stack = Stack::new(backend, "");
    stack.set_stock("SKU-KILL", 10_000);
    stack.start();
    let ids: Vec<u64> = (0..orders).map(|n| 81_000 + n).collect();
    let webhooks: Vec<Webhook> = ids
        .iter()
        .map(|id| order_created(*id, "SKU-KILL", 1))
        .collect();
    send_while_killing(&mut stack, &webhooks, 4, kills);
    let started = Instant::now();
    stack.until_all_completed(ids.len(), DRAIN);
    eprintln!(
        "{backend:?}: {orders} orders, {} kills, drained {:.1} s after the last start",
        kills + 1,
        started.elapsed().as_secs_f64()
    );
    assert_orders_applied_once(&stack, &ids, "SKU-KILL", 10_000, 1);
}

#[test]
fn embedded_killed_every_few_seconds_while_clients_send_loses_and_doubles_nothing() {
    killed_every_few_seconds_while_clients_send(Backend::Embedded);
}

#[test]
fn aws_killed_every_few_seconds_while_clients_send_loses_and_doubles_nothing() {
    killed_every_few_seconds_while_clients_send(Backend::Aws);
}

fn hot_sku_from_eight_clients(backend: Backend) {
    let orders = sized("EINMAL_BB_HOT_ORDERS", 40);
    let mut stack = Stack::new(backend, "");
    stack.set_stock("SKU-HOT", 100_000);
    stack.start();
    let ids: Vec<u64> = (0..orders).map(|n| 82_000 + n).collect();
    let webhooks: Vec<Webhook> = ids
        .iter()
        .map(|id| order_created(*id, "SKU-HOT", 2))
        .collect();
    send_all(&stack.sender(), &webhooks, 8);
    stack.until_all_completed(ids.len(), DRAIN);
    assert_orders_applied_once(&stack, &ids, "SKU-HOT", 100_000, 2);
}

#[test]
fn embedded_one_sku_from_eight_clients_moves_stock_once_per_order() {
    hot_sku_from_eight_clients(Backend::Embedded);
}

#[test]
fn aws_one_sku_from_eight_clients_moves_stock_once_per_order() {
    hot_sku_from_eight_clients(Backend::Aws);
}

/// Each order's life: created (paid), shipped, partly refunded, updated later.
fn order_lives(ids: &[u64]) -> Vec<Webhook> {
    let mut webhooks = Vec::new();
    for &id in ids {
        webhooks.push(order_created(id, "SKU-SHUF", 1));
        webhooks.push((
            "fulfillments/create",
            format!("ful-{id}"),
            json!({"id": id * 10, "order_id": id, "status": "success",
                "created_at": "2026-11-30T11:00:00-05:00", "updated_at": "2026-11-30T11:00:00-05:00",
                "tracking_company": "UPS", "tracking_number": format!("1Z{id}"),
                "tracking_numbers": [format!("1Z{id}")]}),
        ));
        webhooks.push((
            "refunds/create",
            format!("ref-{id}"),
            json!({"id": id * 10 + 1, "order_id": id,
                "created_at": "2026-11-30T12:00:00-05:00", "restock": false,
                "transactions": [{"id": id * 100 + 1, "order_id": id, "kind": "refund",
                    "status": "success", "amount": "5.00", "currency": "EUR"}]}),
        ));
        let (_, _, mut updated) = order_created(id, "SKU-SHUF", 1);
        updated["updated_at"] = json!("2026-11-30T13:00:00-05:00");
        updated["email"] = json!("jon.updated@example.com");
        webhooks.push(("orders/updated", format!("upd-{id}"), updated));
    }
    webhooks
}

/// The business state of `ids` as the CLI shows it, with the times einmal stamped.
fn business_state(stack: &Stack, ids: &[u64]) -> BTreeMap<u64, Value> {
    ids.iter()
        .map(|id| {
            let mut order = stack.order(&id.to_string());
            strip_times(&mut order);
            (*id, order)
        })
        .collect()
}

/// Drop the fields that are wall-clock times of processing, not business facts.
fn strip_times(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|k, _| !(k.ends_with("_at_ms") || k == "updated_ms" || k == "version"));
            map.values_mut().for_each(strip_times);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_times),
        _ => {}
    }
}

fn shuffled_stream_matches_the_ordered_one(backend: Backend) {
    let ids: Vec<u64> = (0..sized("EINMAL_BB_SHUFFLED_ORDERS", 6))
        .map(|n| 83_000 + n)
        .collect();
    let stream = order_lives(&ids);

    // The stream in order, one client, on the embedded store: the reference.
    let mut ordered = Stack::new(Backend::Embedded, "");
    ordered.set_stock("SKU-SHUF", 1_000);
    ordered.start();
    send_all(&ordered.sender(), &stream, 1);
    ordered.until_all_completed(stream.len(), DRAIN);
    let expected = business_state(&ordered, &ids);
    drop(ordered);

    let mut shuffled_stream = stream.clone();
    shuffled_stream.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    let mut stack = Stack::new(backend, "");
    stack.set_stock("SKU-SHUF", 1_000);
    stack.start();
    send_all(&stack.sender(), &shuffled_stream, 4);
    stack.until_all_completed(stream.len(), DRAIN);
    assert_eq!(business_state(&stack, &ids), expected);
    for id in &ids {
        let order = &expected[id];
        assert_eq!(
            order["shipments"].as_array().map(Vec::len),
            Some(1),
            "{order}"
        );
        assert_eq!(order["refunded_minor"], 500, "{order}");
    }
    assert_eq!(stack.on_hand("SKU-SHUF"), 1_000 - ids.len() as i64);
    assert_eq!(stack.dead_letters(), json!([]));
}

#[test]
fn embedded_a_shuffled_stream_ends_as_the_ordered_one() {
    shuffled_stream_matches_the_ordered_one(Backend::Embedded);
}

#[test]
fn aws_a_shuffled_stream_ends_as_the_ordered_one() {
    shuffled_stream_matches_the_ordered_one(Backend::Aws);
}

/// A Stripe `customer.updated` (delivered to every destination below).
fn customer_updated(i: u64) -> Value {
    json!({
        "id": format!("evt_bb{i}"), "object": "event", "type": "customer.updated",
        "created": 1_764_400_000 + i as i64,
        "data": {"object": {"id": format!("cus_bb{i}"), "object": "customer"}}
    })
}

fn destinations_get_each_event_exactly_once(backend: Backend) {
    let Some(pg) = einmal_tests::postgres::PgServer::shared_or_skip() else {
        return;
    };
    let events = sized("EINMAL_BB_DESTINATION_EVENTS", 12);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let moto = einmal_tests::moto::shared();
    let (hook, db, fifo_url, sqs) = runtime.block_on(async {
        // The app answers 503 to each event's first call: every event is retried.
        let hook = DestinationServer::start(|_, nth| {
            if nth == 1 {
                Answer::Status(503, "starting")
            } else {
                Answer::Ok
            }
        })
        .await;
        let db = pg.create_database("both_backends").await;
        let sqs = aws_sdk_sqs::Client::new(&moto.sdk_config().await);
        let fifo = sqs
            .create_queue()
            .queue_name(format!(
                "{}.fifo",
                einmal_tests::moto::unique_name("bb-dest")
            ))
            .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
            .send()
            .await
            .expect("FIFO queue");
        (hook, db, fifo.queue_url().expect("url").to_owned(), sqs)
    });
    let destinations = format!(
        "\n[[destination]]\nname = \"app\"\ntenant = \"demo\"\nprovider = \"stripe\"\nkind = \"http\"\n\
         events = [\"customer.*\"]\nurl = \"{}\"\nsecrets = [\"{SECRET}\"]\ntimeout_ms = 5000\nmax_attempts = 1000\n\
         \n[[destination]]\nname = \"warehouse\"\ntenant = \"demo\"\nprovider = \"stripe\"\nkind = \"postgres\"\n\
         events = [\"customer.*\"]\ndsn = \"{}\"\ntable = \"einmal_events\"\nmax_attempts = 1000\n\
         \n[[destination]]\nname = \"queue\"\ntenant = \"demo\"\nprovider = \"stripe\"\nkind = \"sqs\"\n\
         events = [\"customer.*\"]\nqueue_url = \"{fifo_url}\"\nmax_attempts = 1000\n",
        hook.url,
        pg.dsn(&db),
    );
    let mut stack = Stack::new(backend, &destinations);
    if backend == Backend::Embedded {
        stack.with_aws_sdk();
    }
    stack.start();
    let bodies: Vec<Value> = (0..events).map(customer_updated).collect();
    let half = bodies.len() / 2;
    for (n, body) in bodies.iter().enumerate() {
        if n == half {
            // kill -9 with deliveries in flight; the restart delivers what is left.
            stack.kill();
            stack.start();
        }
        let id = body["id"].as_str().unwrap().to_owned();
        stack.send_until_acked("stripe", None, &id, body);
        stack.send_until_acked("stripe", None, &id, body);
    }
    stack.until_all_completed(bodies.len(), DRAIN);

    let keys = |destination: &str| -> BTreeSet<String> {
        (0..events)
            .map(|i| delivery_key(destination, "stripe", "demo", &format!("evt_bb{i}")))
            .collect()
    };
    let deadline = Instant::now() + DRAIN;
    runtime.block_on(async {
        // HTTP: every call verified with the `standardwebhooks` crate, one effect each.
        while hook.effects().len() < events as usize {
            assert!(
                Instant::now() < deadline,
                "HTTP: {} of {events}",
                hook.effects().len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            hook.calls().iter().all(|c| c.verified),
            "every call verifies"
        );
        let applied: BTreeSet<String> = hook.effects().into_keys().collect();
        assert_eq!(applied, keys("app"));

        // PostgreSQL: one row per event (the table is made on the first connection).
        let client = pg.client(&db).await;
        loop {
            let rows: i64 = match client
                .query_one("SELECT count(*) FROM einmal_events", &[])
                .await
            {
                Ok(row) => row.get(0),
                Err(_) => 0,
            };
            if rows >= events as i64 {
                break;
            }
            assert!(Instant::now() < deadline, "PostgreSQL: {rows} of {events}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let rows: Vec<String> = client
            .query("SELECT key FROM einmal_events", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(rows.len(), events as usize, "one row per event: {rows:?}");
        assert_eq!(rows.into_iter().collect::<BTreeSet<_>>(), keys("warehouse"));

        // SQS FIFO: one message per event, deduplicated on the key.
        let mut seen = Vec::new();
        while seen.len() < events as usize && Instant::now() < deadline {
            let got = sqs
                .receive_message()
                .queue_url(&fifo_url)
                .max_number_of_messages(10)
                .message_system_attribute_names(
                    aws_sdk_sqs::types::MessageSystemAttributeName::MessageDeduplicationId,
                )
                .send()
                .await
                .expect("receive");
            for m in got.messages() {
                let dedup = m
                    .attributes()
                    .and_then(|a| {
                        a.get(
                            &aws_sdk_sqs::types::MessageSystemAttributeName::MessageDeduplicationId,
                        )
                    })
                    .cloned()
                    .expect("a deduplication id");
                seen.push(dedup);
                sqs.delete_message()
                    .queue_url(&fifo_url)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .expect("delete");
            }
        }
        assert_eq!(
            seen.len(),
            events as usize,
            "one message per event: {seen:?}"
        );
        assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), keys("queue"));
    });
    assert_eq!(stack.dead_letters(), json!([]));
}

#[test]
fn embedded_destinations_get_each_event_exactly_once_across_a_kill() {
    destinations_get_each_event_exactly_once(Backend::Embedded);
}

#[test]
fn aws_destinations_get_each_event_exactly_once_across_a_kill() {
    destinations_get_each_event_exactly_once(Backend::Aws);
}

/// An HTTP destination `app` for the demo tenant's Shopify orders, served on `runtime`,
/// and its configuration (TOML).
fn app_destination(runtime: &tokio::runtime::Runtime) -> (DestinationServer, String) {
    let hook = runtime.block_on(DestinationServer::start(|_, _| Answer::Ok));
    let toml = format!(
        "\n[[destination]]\nname = \"app\"\ntenant = \"demo\"\nprovider = \"shopify\"\nkind = \"http\"\n\
         events = [\"orders/*\"]\nurl = \"{}\"\nsecrets = [\"{SECRET}\"]\ntimeout_ms = 5000\nmax_attempts = 1000\n",
        hook.url
    );
    (hook, toml)
}

/// Every stored event (`items`, from `events list`) reached the app exactly once after
/// its dedup on `webhook-id`, and every call verified with the Standard Webhooks crate.
fn assert_delivered_once(hook: &DestinationServer, items: &[Value]) {
    let expected: BTreeSet<String> = items
        .iter()
        .map(|item| {
            let key = item["key"].as_str().expect("a key");
            let event_id = key.splitn(3, '#').nth(2).expect("provider#tenant#event_id");
            delivery_key("app", "shopify", "demo", event_id)
        })
        .collect();
    let deadline = Instant::now() + DRAIN;
    while hook.effects().len() < expected.len() {
        assert!(
            Instant::now() < deadline,
            "delivered {} of {}",
            hook.effects().len(),
            expected.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let applied: BTreeSet<String> = hook.effects().into_keys().collect();
    assert_eq!(applied, expected, "one effect per event at the destination");
    assert!(
        hook.calls().iter().all(|c| c.verified),
        "every call verifies"
    );
}

/// A fault proxy in front of the shared moto, on a runtime of its own.
fn proxy() -> (tokio::runtime::Runtime, FaultProxy) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let proxy = runtime.block_on(FaultProxy::start(&einmal_tests::moto::shared().endpoint));
    (runtime, proxy)
}

/// `fault` at 10% of the DynamoDB and SQS calls of `serve --backend aws` for a whole
/// stream, killed with SIGKILL once in the middle of it.
fn aws_fault_at_ten_percent(fault: Fault) {
    let orders = sized("EINMAL_BB_FAULT_ORDERS", 10);
    let (runtime, proxy) = proxy();
    let (hook, destination) = app_destination(&runtime);
    let mut stack = Stack::new(Backend::Aws, &destination);
    stack.set_stock("SKU-FAULT", 1_000);
    stack.serve_through(&proxy.endpoint);
    stack.start();
    proxy
        .faults
        .set_random(100, &[fault], &[Service::DynamoDb, Service::Sqs]);
    let ids: Vec<u64> = (0..orders).map(|n| 84_000 + n).collect();
    let webhooks: Vec<Webhook> = ids
        .iter()
        .map(|id| order_created(*id, "SKU-FAULT", 1))
        .collect();
    let (first, second) = webhooks.split_at(webhooks.len() / 2);
    send_all(&stack.sender(), first, 2);
    stack.kill();
    stack.start();
    send_all(&stack.sender(), second, 2);
    // The faults stay on until every event is done and delivered.
    let items = stack.until_all_completed(ids.len(), DRAIN);
    assert_delivered_once(&hook, &items);
    proxy.faults.set_random(0, &[], &[]);
    assert_orders_applied_once(&stack, &ids, "SKU-FAULT", 1_000, 1);
}

#[test]
fn aws_throttling_at_ten_percent_loses_and_doubles_nothing() {
    aws_fault_at_ten_percent(Fault::Throttle);
}

#[test]
fn aws_throttling_exceptions_at_ten_percent_lose_and_double_nothing() {
    aws_fault_at_ten_percent(Fault::ThrottlingException);
}

#[test]
fn aws_server_errors_at_ten_percent_lose_and_double_nothing() {
    aws_fault_at_ten_percent(Fault::ServerError);
}

#[test]
fn aws_unavailable_at_ten_percent_loses_and_doubles_nothing() {
    aws_fault_at_ten_percent(Fault::Unavailable);
}

#[test]
fn aws_connection_resets_at_ten_percent_lose_and_double_nothing() {
    aws_fault_at_ten_percent(Fault::Reset);
}

#[test]
fn aws_latency_at_ten_percent_loses_and_doubles_nothing() {
    aws_fault_at_ten_percent(Fault::Latency);
}

#[test]
fn aws_lost_answers_at_ten_percent_lose_and_double_nothing() {
    aws_fault_at_ten_percent(Fault::LostAnswer);
}

/// DynamoDB answers every call with a throttle for `EINMAL_BB_OUTAGE_SECS` in the
/// middle of a stream; `serve` is killed with SIGKILL during the outage. The provider
/// keeps retrying what was refused; afterwards every event completes once.
#[test]
fn aws_a_dynamodb_outage_mid_stream_with_a_kill_loses_nothing() {
    let orders = sized("EINMAL_BB_OUTAGE_ORDERS", 12);
    let outage = Duration::from_secs(sized("EINMAL_BB_OUTAGE_SECS", 15));
    let (runtime, proxy) = proxy();
    let (hook, destination) = app_destination(&runtime);
    let mut stack = Stack::new(Backend::Aws, &destination);
    stack.set_stock("SKU-OUTAGE", 1_000);
    stack.serve_through(&proxy.endpoint);
    stack.start();
    let ids: Vec<u64> = (0..orders).map(|n| 85_000 + n).collect();
    let webhooks: Vec<Webhook> = ids
        .iter()
        .map(|id| order_created(*id, "SKU-OUTAGE", 1))
        .collect();
    let (before, during) = webhooks.split_at(webhooks.len() / 2);
    send_all(&stack.sender(), before, 2);
    let faults = Arc::clone(&proxy.faults);
    faults.set_dynamodb_down(true);
    let sender = stack.sender();
    std::thread::scope(|scope| {
        let sender = &sender;
        // The provider's deliveries during the outage: refused (5xx), retried until the
        // table is back.
        let clients = scope.spawn(move || send_all(sender, during, 2));
        scope.spawn(move || {
            std::thread::sleep(outage);
            faults.set_dynamodb_down(false);
        });
        std::thread::sleep(outage / 2);
        stack.kill();
        // The restart's checks wait the outage out, as a cold start would.
        stack.start_within(outage + Duration::from_secs(60));
        clients.join().expect("clients");
    });
    let items = stack.until_all_completed(ids.len(), DRAIN);
    assert_delivered_once(&hook, &items);
    assert_orders_applied_once(&stack, &ids, "SKU-OUTAGE", 1_000, 1);
}
