//! Adyen batches: one request with several `NotificationRequestItem`s becomes one inbox
//! item and one queue message per item; one bad item signature stores nothing.
//! Runs the real ingest pipeline on the embedded store (SQLite in a temp dir).

use std::sync::Arc;

use einmal::adapters::embedded::EmbeddedStore;
use einmal::config::Config;
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::ports::{Inbox, Queue, Source};
use einmal::providers::adyen::sign_notification;
use einmal::request::WebhookRequest;
use einmal_tests::fixtures::{all_items, drain};

const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
const OLD_KEY: &str = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF";

struct Backend {
    inbox: Arc<dyn Inbox>,
    queue: Arc<dyn Queue>,
    ingestor: Ingestor,
    _dir: tempfile::TempDir,
}

fn backend() -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).expect("store opens"));
    let config = Config::from_toml(&format!(
        r#"
[[tenant]]
provider = "adyen"
tenant = "m1"
secrets = ["{KEY}", "{OLD_KEY}"]
options = {{ merchant_account = "TestMerchant" }}
"#
    ))
    .expect("config parses");
    let inbox: Arc<dyn Inbox> = store.clone();
    let queue: Arc<dyn Queue> = store;
    Backend {
        ingestor: Ingestor::new(Arc::new(config), inbox.clone(), queue.clone()),
        inbox,
        queue,
        _dir: dir,
    }
}

fn item(psp: &str, code: &str, value: i64, original: Option<&str>) -> serde_json::Value {
    let mut item = serde_json::json!({
        "additionalData": {"authCode": "58747"},
        "amount": {"currency": "EUR", "value": value},
        "eventCode": code,
        "eventDate": "2024-01-01T10:00:00+01:00",
        "merchantAccountCode": "TestMerchant",
        "merchantReference": format!("order-{psp}"),
        "paymentMethod": "visa",
        "pspReference": psp,
        "success": "true",
    });
    if let Some(o) = original {
        item["originalReference"] = o.into();
    }
    item
}

/// Three items, each signed with `KEY`.
fn three_item_body() -> Vec<u8> {
    let body = serde_json::json!({
        "live": "false",
        "notificationItems": [
            {"NotificationRequestItem": item("8815000000000001", "AUTHORISATION", 1130, None)},
            {"NotificationRequestItem": item("8815000000000002", "CAPTURE", 1130, Some("8815000000000001"))},
            {"NotificationRequestItem": item("8815000000000003", "REFUND", 500, Some("8815000000000001"))},
        ],
    });
    sign_notification(body.to_string().as_bytes(), KEY).expect("signs")
}

fn request(body: &[u8]) -> WebhookRequest {
    WebhookRequest::post(http::HeaderMap::new(), body.to_vec())
}

/// Item `i`'s `NotificationRequestItem` object as written in `body` (the signed body
/// is compact serde_json output, so re-serializing the parsed item gives its bytes).
fn item_bytes(body: &[u8], i: usize) -> Vec<u8> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let bytes = v["notificationItems"][i]["NotificationRequestItem"]
        .to_string()
        .into_bytes();
    assert!(
        body.windows(bytes.len()).any(|w| w == &bytes[..]),
        "the item appears verbatim in the request"
    );
    bytes
}

const IDS: [&str; 3] = [
    "TestMerchant:8815000000000001:AUTHORISATION:true",
    "TestMerchant:8815000000000002:CAPTURE:true",
    "TestMerchant:8815000000000003:REFUND:true",
];

#[tokio::test]
async fn three_items_become_three_inbox_items_and_three_messages() {
    let b = backend();
    let body = three_item_body();
    let resp = b.ingestor.ingest("adyen", "m1", &request(&body)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    // Adyen's contract: the success body is the plain text `[accepted]`.
    assert_eq!(resp.render(), ("text/plain", "[accepted]".to_string()));
    assert_eq!(resp.body["status"], "accepted");
    assert_eq!(resp.body["duplicate"], false);
    let events = resp.body["events"].as_array().expect("one entry per item");
    assert_eq!(events.len(), 3);
    for (e, id) in events.iter().zip(IDS) {
        assert_eq!(e["event_id"], id);
        assert_eq!(e["duplicate"], false);
    }

    let items = all_items(&*b.inbox).await;
    assert_eq!(items.len(), 3);
    for (i, id) in IDS.iter().enumerate() {
        let key = InboxKey::new("adyen", "m1", id);
        let stored = b.inbox.get(&key).await.unwrap().expect("stored");
        assert_eq!(stored.source, Source::Webhook);
        assert_eq!(stored.envelope.tenant, "m1");
        // Adyen retries for 30 days: retention covers that plus the replay margin.
        let days = (stored.expires_at - stored.received_at_ms / 1000) / 86_400;
        assert_eq!(days, 37);
        assert_eq!(
            stored.envelope.event_type,
            ["AUTHORISATION", "CAPTURE", "REFUND"][i]
        );
        assert_eq!(
            stored.envelope.object_id.as_deref(),
            Some("8815000000000001")
        );
        assert_eq!(stored.envelope.occurred_at, Some(1_704_099_600));
        // Each item stores its own NotificationRequestItem bytes, exactly as sent.
        let want = item_bytes(&body, i);
        assert_eq!(stored.body_len as usize, want.len());
        assert_eq!(
            einmal::body::decompress(&stored.body, want.len()).unwrap(),
            want
        );
    }
    let mut pks: Vec<_> = drain(&*b.queue)
        .await
        .into_iter()
        .map(|d| d.message.pk)
        .collect();
    pks.sort();
    let mut want: Vec<_> = IDS
        .iter()
        .map(|id| InboxKey::new("adyen", "m1", id))
        .collect();
    want.sort();
    assert_eq!(pks, want);
}

#[tokio::test]
async fn the_same_batch_again_is_all_duplicates() {
    let b = backend();
    let body = three_item_body();
    let first = b.ingestor.ingest("adyen", "m1", &request(&body)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(drain(&*b.queue).await.len(), 3);

    // Adyen retries the same notification; re-signing (as a retry would) changes nothing.
    for retry in [body.clone(), three_item_body()] {
        let resp = b.ingestor.ingest("adyen", "m1", &request(&retry)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert_eq!(resp.body["duplicate"], true);
        let events = resp.body["events"].as_array().unwrap();
        assert_eq!(events.len(), 3);
        assert!(events.iter().all(|e| e["duplicate"] == true));
    }
    assert_eq!(all_items(&*b.inbox).await.len(), 3);
    assert!(
        drain(&*b.queue).await.is_empty(),
        "duplicates send no new message"
    );
    let counts = b.ingestor.metrics().snapshot();
    assert_eq!((counts.accepted, counts.duplicates), (3, 6));
}

#[tokio::test]
async fn one_bad_hmac_among_three_stores_nothing() {
    let b = backend();
    let mut body: serde_json::Value = serde_json::from_slice(&three_item_body()).unwrap();
    // Tamper with the second item after signing.
    body["notificationItems"][1]["NotificationRequestItem"]["amount"]["value"] = 99_999.into();
    let resp = b
        .ingestor
        .ingest("adyen", "m1", &request(body.to_string().as_bytes()))
        .await;
    assert_eq!(resp.status, 401, "{}", resp.body);
    assert_eq!(resp.render().0, "application/json", "errors stay JSON");
    assert_eq!(resp.body["error"], "invalid_signature");
    assert!(
        all_items(&*b.inbox).await.is_empty(),
        "inbox must stay empty"
    );
    assert!(drain(&*b.queue).await.is_empty(), "queue must stay empty");
}

#[tokio::test]
async fn items_signed_with_the_old_key_are_accepted_during_rotation() {
    let b = backend();
    let body = serde_json::json!({
        "live": "false",
        "notificationItems": [
            {"NotificationRequestItem": item("8815000000000009", "AUTHORISATION", 1, None)},
        ],
    });
    let body = sign_notification(body.to_string().as_bytes(), OLD_KEY).unwrap();
    let resp = b.ingestor.ingest("adyen", "m1", &request(&body)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        resp.body["event_id"],
        "TestMerchant:8815000000000009:AUTHORISATION:true"
    );
}

#[tokio::test]
async fn another_merchant_account_is_refused_and_nothing_stored() {
    let b = backend();
    let mut other = item("8815000000000010", "AUTHORISATION", 1, None);
    other["merchantAccountCode"] = "OtherMerchant".into();
    let body = serde_json::json!({
        "live": "false",
        "notificationItems": [
            {"NotificationRequestItem": item("8815000000000011", "AUTHORISATION", 1, None)},
            {"NotificationRequestItem": other},
        ],
    });
    let body = sign_notification(body.to_string().as_bytes(), KEY).unwrap();
    let resp = b.ingestor.ingest("adyen", "m1", &request(&body)).await;
    assert_eq!(resp.status, 401, "{}", resp.body);
    assert!(all_items(&*b.inbox).await.is_empty());
    assert!(drain(&*b.queue).await.is_empty());
}
