//! zstd compression of a ~3 KB webhook body as the receiver stores it: `body::compress`
//! (one compressor per thread, reused) next to a new context per body (what it did
//! before: `zstd::bulk::compress`, same level, same bytes out).
//!
//! cargo bench -p einmal-tests --bench compress -- --warm-up-time 1 --measurement-time 3
//!
//! Here rather than in shared/benches: a bench there is built with shared's dev
//! features (tokio's `test-util`), which recompiles the AWS SDK in release.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};

/// A Stripe `payment_intent.succeeded` event of about 3 KB (compact JSON), its ids varied like real ones.
fn body() -> Vec<u8> {
    let charge = |i: u32| {
        serde_json::json!({
            "id": format!("ch_3OEdX2LkdIwHu7ix{i:04}cRzJ5Tq"),
            "object": "charge",
            "amount": 2000 + i,
            "balance_transaction": format!("txn_3OEdX2LkdIwHu7ix{i:04}Hq9mKp"),
            "billing_details": {
                "address": {"city": "Berlin", "country": "DE", "line1": "Torstraße 1",
                            "postal_code": "10119", "state": null},
                "email": format!("customer{i}@example.com"),
                "name": "Jenny Rosen",
            },
            "created": 1_699_999_990 + i,
            "currency": "eur",
            "paid": true,
            "payment_method": format!("pm_1OEdX1LkdIwHu7ix{i:04}Z0aQnR"),
            "payment_method_details": {
                "card": {"brand": "visa", "country": "US", "exp_month": 12, "exp_year": 2030,
                         "fingerprint": format!("Xt5EWLLDS7FJ{i:04}"), "funding": "credit",
                         "last4": "4242", "network": "visa"},
                "type": "card",
            },
            "receipt_url": format!("https://pay.stripe.com/receipts/payment/CAcaFwoVYWNjdF8x{i:04}"),
            "status": "succeeded",
        })
    };
    let event = serde_json::json!({
        "id": "evt_3OEdX2LkdIwHu7ix1bVqO8Gk",
        "object": "event",
        "api_version": "2023-10-16",
        "created": 1_699_999_990,
        "data": {"object": {
            "id": "pi_3OEdX2LkdIwHu7ix1cRzJ5Tq",
            "object": "payment_intent",
            "amount": 2000,
            "amount_received": 2000,
            "capture_method": "automatic",
            "charges": {"object": "list", "data": [charge(1), charge(2), charge(3)]},
            "client_secret": "pi_3OEdX2LkdIwHu7ix1cRzJ5Tq_secret_kXbD7Q2GkqYlq0G4pCQfTtKQd",
            "currency": "eur",
            "customer": "cus_P2jvQ9v3e0Kq1m",
            "metadata": {"order_id": "order-20231114-0042", "tenant": "demo"},
            "status": "succeeded",
        }},
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": "req_8fQm2LkdIwHu7i", "idempotency_key": "0f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098"},
        "type": "payment_intent.succeeded",
    });
    let body = serde_json::to_vec(&event).expect("JSON");
    assert!(
        (2_000..=4_000).contains(&body.len()),
        "{} bytes",
        body.len()
    );
    body
}

fn compress(c: &mut Criterion) {
    let body = body();
    assert_eq!(
        einmal::body::compress(&body).expect("compress"),
        zstd::bulk::compress(&body, 1).expect("compress"),
        "the same bytes either way"
    );
    let mut group = c.benchmark_group(format!("zstd level 1, {} B body", body.len()));
    group.bench_function("reused per thread (body::compress)", |b| {
        b.iter(|| einmal::body::compress(black_box(&body)).expect("compress"))
    });
    group.bench_function("new context per body", |b| {
        b.iter(|| zstd::bulk::compress(black_box(&body), 1).expect("compress"))
    });
    group.finish();
}

criterion_group!(benches, compress);
criterion_main!(benches);
