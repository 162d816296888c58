//! The Lambda handler answers API Gateway HTTP API (v2) events: base64 bodies are
//! decoded before verification, the route's path parameters pick provider/tenant.

use std::sync::Arc;

use base64::Engine;
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::ports::Inbox;
use einmal_tests::fixtures::{all_items, config, drain, signed, stripe_body};
use lambda_http::Body;

fn api_gateway_v2_event(
    provider: &str,
    tenant: &str,
    headers: &http::HeaderMap,
    body: &[u8],
    base64: bool,
) -> String {
    let headers: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap().into()))
        .collect();
    let body = if base64 {
        base64::engine::general_purpose::STANDARD.encode(body)
    } else {
        String::from_utf8(body.to_vec()).unwrap()
    };
    serde_json::json!({
        "version": "2.0",
        "routeKey": "POST /webhooks/{provider}/{tenant}",
        "rawPath": format!("/webhooks/{provider}/{tenant}"),
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012", "apiId": "abc123", "domainName": "abc123.execute-api.eu-central-1.amazonaws.com",
            "domainPrefix": "abc123",
            "http": {"method": "POST", "path": format!("/webhooks/{provider}/{tenant}"), "protocol": "HTTP/1.1",
                     "sourceIp": "192.0.2.10", "userAgent": "Stripe/1.0"},
            "requestId": "req-1", "routeKey": "POST /webhooks/{provider}/{tenant}", "stage": "$default",
            "time": "29/Nov/2026:10:00:00 +0000", "timeEpoch": 1764410400000u64
        },
        "pathParameters": {"provider": provider, "tenant": tenant},
        "body": body,
        "isBase64Encoded": base64
    })
    .to_string()
}

fn status_and_json(resp: lambda_http::Response<Body>) -> (u16, serde_json::Value) {
    let status = resp.status().as_u16();
    let json = match resp.body() {
        Body::Text(t) => serde_json::from_str(t).unwrap(),
        other => panic!("unexpected body {other:?}"),
    };
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base64_encoded_event_is_verified_on_the_decoded_bytes_and_stored_in_dynamodb() {
    let (store, _names) = einmal_tests::moto::aws_store(einmal_tests::moto::shared(), None).await;
    let store = Arc::new(store);
    let ingestor = Ingestor::new(config(), store.clone(), store.clone());
    let cfg = config();
    let body = stripe_body("evt_lambda_1", 200);
    let request = signed(&cfg, "stripe", "t1", "", &body);

    let event = api_gateway_v2_event("stripe", "t1", &request.headers, &body, true);
    let req = lambda_http::request::from_str(&event).expect("valid API Gateway event");
    let (status, json) = status_and_json(receiver::handle(&ingestor, req).await.unwrap());
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["duplicate"], false);
    let item = store
        .get(&InboxKey::new("stripe", "t1", "evt_lambda_1"))
        .await
        .unwrap();
    assert!(item.is_some());
    assert_eq!(drain(&*store).await.len(), 1);

    // The same event as plain text is a duplicate.
    let event = api_gateway_v2_event("stripe", "t1", &request.headers, &body, false);
    let req = lambda_http::request::from_str(&event).unwrap();
    let (status, json) = status_and_json(receiver::handle(&ingestor, req).await.unwrap());
    assert_eq!((status, json["duplicate"].as_bool()), (200, Some(true)));
}

#[tokio::test]
async fn bad_signature_is_401_json_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        einmal::adapters::embedded::EmbeddedStore::open(dir.path(), Default::default()).unwrap(),
    );
    let ingestor = Ingestor::new(config(), store.clone(), store.clone());
    let cfg = config();
    let body = stripe_body("evt_lambda_2", 10);
    let request = signed(&cfg, "stripe", "t2", "", &body); // other tenant's secret
    let event = api_gateway_v2_event("stripe", "t1", &request.headers, &body, true);
    let req = lambda_http::request::from_str(&event).unwrap();
    let (status, json) = status_and_json(receiver::handle(&ingestor, req).await.unwrap());
    assert_eq!(status, 401);
    assert_eq!(json["error"], "invalid_signature");
    assert!(all_items(&*store).await.is_empty());
    assert!(drain(&*store).await.is_empty());
}
