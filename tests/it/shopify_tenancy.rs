//! Shopify tenancy from signed facts (issue 23, item 4), on both backends through the
//! real `Ingestor` and processor with the reference domain. One public app's client
//! secret signs every shop's webhooks, so tenants `t1` (shop `t1.myshopify.com`) and
//! `t2` (`t2.myshopify.com`) share it here, as a configuration of such an app must:
//! - an order body signed for shop t1 (its `order_status_url` names the shop), sent to
//!   t2 with `X-Shopify-Shop-Domain` rewritten to t2's, is refused (401) and nothing is
//!   stored, enqueued or changed in either shop's records; so is the same body with the
//!   header left as it was, and a body that names no shop (`refunds/create`);
//! - the same body delivered to t1 under t1's header is accepted and reserves t1's
//!   stock, and only t1's.
//!
//! The configuration that shares the secret without naming the shops is refused at
//! load (unit tests in `shared/src/config.rs`; here, that it never reaches ingest).

use einmal::domain::state::CommitOne;
use std::sync::Arc;

use einmal::config::Config;
use einmal::domain::reference::{seed_sku, sku_key};
use einmal::domain::state::CommitOutcome;
use einmal::pipeline::ingest::Ingestor;
use einmal::providers;
use einmal::request::WebhookRequest;
use einmal_tests::on_both_backends;
use einmal_tests::scenario::{data_of, drain, order_body, Backend, Kind};
use serde_json::json;

const APP_SECRET: &str = "one-public-app-client-secret";
const RED: &str = "SKU-RED-M";

fn two_shops() -> Config {
    let toml = format!(
        r#"
[[tenant]]
provider = "shopify"
tenant = "t1"
secrets = ["{APP_SECRET}"]
options = {{ shop_domain = "t1.myshopify.com" }}

[[tenant]]
provider = "shopify"
tenant = "t2"
secrets = ["{APP_SECRET}"]
options = {{ shop_domain = "t2.myshopify.com" }}
"#
    );
    Config::from_toml(&toml).expect("two shops of one app, each named")
}

/// Shop t1's order 1001 (one red M), as Shopify sends it: `order_status_url` on the
/// shop's domain.
fn t1_order() -> Vec<u8> {
    let mut body = order_body(1001, 1_764_400_000, &[(RED, 1)], 4990, "pending");
    body["order_status_url"] =
        json!("https://t1.myshopify.com/548380009/orders/123456abcd/authenticate?key=abcdefg");
    body.to_string().into_bytes()
}

/// `body` signed with the app secret, as Shopify would send it under `topic`, with
/// `X-Shopify-Shop-Domain: header_shop` (which anyone can rewrite).
fn delivery(config: &Config, header_shop: &str, topic: &str, body: &[u8]) -> WebhookRequest {
    let mut signer = config.tenant("shopify", "t1").unwrap().clone();
    signer
        .options
        .insert("shop_domain".into(), header_shop.into());
    signer.options.insert("topic".into(), topic.into());
    let headers = providers::lookup("shopify")
        .unwrap()
        .sign(body, &signer, "ev-1", einmal::time::now_secs())
        .expect("signs");
    WebhookRequest::post(headers, body.to_vec())
}

async fn stocked(kind: Kind) -> (Backend, Ingestor) {
    let b = kind.backend(10).await;
    for tenant in ["t1", "t2"] {
        let outcome = b
            .state
            .commit(&[seed_sku(tenant, RED, 10)])
            .await
            .expect("seed");
        assert_eq!(outcome, CommitOutcome::Committed);
    }
    let ingest = Ingestor::new(Arc::new(two_shops()), b.inbox.clone(), b.queue.clone());
    (b, ingest)
}

async fn on_hand(b: &Backend, tenant: &str) -> i64 {
    let records = b.load_all(&[sku_key(tenant, RED)]).await;
    let record = records.values().next().expect("seeded");
    record.data["on_hand"].as_i64().expect("on_hand")
}

async fn a_body_signed_for_another_shop_is_refused_and_nothing_stored(kind: Kind) {
    let (b, ingest) = stocked(kind).await;
    let config = ingest.config();
    let before = data_of(&b.business_state().await);
    let refund = json!({"id": 9001, "order_id": 1001, "created_at": "2025-12-02T10:00:00-05:00",
                        "refund_line_items": [{"line_item_id": 100100, "quantity": 1,
                        "restock_type": "cancel"}], "transactions": []});
    let cases = [
        (
            "t1's order, header rewritten to t2",
            delivery(&config, "t2.myshopify.com", "orders/create", &t1_order()),
            "the signed body names another shop",
        ),
        (
            "t1's order, t1's header",
            delivery(&config, "t1.myshopify.com", "orders/create", &t1_order()),
            "shop domain",
        ),
        (
            "a refund (its body names no shop), header t2",
            delivery(
                &config,
                "t2.myshopify.com",
                "refunds/create",
                refund.to_string().as_bytes(),
            ),
            "does not name this tenant's shop",
        ),
    ];
    for (what, request, why) in &cases {
        let response = ingest.ingest("shopify", "t2", request).await;
        assert_eq!(response.status, 401, "{} {what}: {}", b.name, response.body);
        let message = response.body["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{what}: {message}");
    }
    assert!(
        b.items().await.is_empty(),
        "{}: a refused delivery was stored",
        b.name
    );
    assert!(b
        .receive_all(std::time::Duration::from_secs(30))
        .await
        .is_empty());
    let p = b.processor(300);
    drain(&b, &p).await;
    assert_eq!(data_of(&b.business_state().await), before, "{}", b.name);
    assert_eq!((on_hand(&b, "t1").await, on_hand(&b, "t2").await), (10, 10));
}

async fn the_same_shop_delivery_is_accepted_and_acts_for_that_shop_only(kind: Kind) {
    let (b, ingest) = stocked(kind).await;
    let config = ingest.config();
    let request = delivery(&config, "t1.myshopify.com", "orders/create", &t1_order());
    let response = ingest.ingest("shopify", "t1", &request).await;
    assert_eq!(response.status, 200, "{}: {}", b.name, response.body);
    let items = b.items().await;
    assert_eq!(items.len(), 1);
    assert_eq!(
        items[0].key.as_str(),
        "shopify#t1#t1.myshopify.com:orders/create:ev-1"
    );
    let p = b.processor(300);
    drain(&b, &p).await;
    assert_eq!(
        (on_hand(&b, "t1").await, on_hand(&b, "t2").await),
        (9, 10),
        "{}",
        b.name
    );
}

on_both_backends!(
    a_body_signed_for_another_shop_is_refused_and_nothing_stored,
    the_same_shop_delivery_is_accepted_and_acts_for_that_shop_only,
);

#[test]
fn shops_sharing_a_secret_without_naming_themselves_do_not_load() {
    let toml = format!(
        "[[tenant]]\nprovider = \"shopify\"\ntenant = \"t1\"\nsecrets = [\"{APP_SECRET}\"]\n\n\
         [[tenant]]\nprovider = \"shopify\"\ntenant = \"t2\"\nsecrets = [\"{APP_SECRET}\"]\n"
    );
    let err = Config::from_toml(&toml).unwrap_err().to_string();
    assert!(
        err.contains("tenants shopify/t1, shopify/t2 share a secret"),
        "{err}"
    );
    assert!(!err.contains(APP_SECRET), "{err}");
    // Both named: loads, each marked as sharing.
    let config = two_shops();
    for t in ["t1", "t2"] {
        let tenant = config.tenant("shopify", t).unwrap();
        assert_eq!(tenant.option("shared_app"), Some("true"));
    }
}
