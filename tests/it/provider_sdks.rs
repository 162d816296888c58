//! The new providers proven with the providers' own code: each official SDK (PyPI,
//! installed by `tests/run.sh` into the venv) verifies what einmal signs and refuses a
//! tampered body or a wrong secret; where the SDK can sign (svix for Resend, Coinbase
//! Commerce's signature helper) einmal accepts what the SDK signed. Through the real
//! ingest path (embedded store) einmal accepts the delivery once, takes its replay as a
//! duplicate without storing it again, and refuses a tampered body, a wrong secret and
//! (where a timestamp is signed) an expired one with 401, storing nothing.
//!
//! HubSpot's SDK signs and verifies its v3 scheme (`hubspot-api-client`).
//! SendGrid's SDK (`sendgrid`, `EventWebhook.verify_signature`) only verifies; what
//! einmal must accept is signed with `cryptography`, the ECDSA library that SDK verifies
//! with (the SDK's published vector is a unit test in `providers/sendgrid.rs`).
//! Paystack has no official server SDK that verifies; its HMAC-SHA512 is fixed by RFC
//! 4231's published vector in `shared/src/providers/paystack.rs`. Zendesk ships no SDK
//! that verifies either; its documented formula is spelled out in
//! `shared/src/providers/zendesk.rs`.
//! `EINMAL_REQUIRE_PROVIDER_SDKS=1` (set by `tests/run.sh`) makes a missing SDK fail.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use einmal::adapters::embedded::EmbeddedStore;
use einmal::config::{Config, Secret, TenantConfig};
use einmal::pipeline::ingest::Ingestor;
use einmal::ports::{Inbox, Queue};
use einmal::providers::{self, Provider};
use einmal::request::WebhookRequest;
use einmal_tests::fixtures::all_items;
use serde_json::{json, Value};

/// One Python process runs every SDK operation of the test: `verify` answers whether
/// the SDK accepts `body` with `headers` and `secret`; `sign` returns the headers the
/// SDK produces.
const SDK_SCRIPT: &str = r#"
import json, sys
from datetime import datetime, timezone

def sendgrid_public_key(secret):
    # The demo tenant holds a PKCS#8 private key; SendGrid shows its public half (SPKI).
    import base64
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_der_private_key(base64.b64decode(secret), None)
    spki = key.public_key().public_bytes(serialization.Encoding.DER,
        serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(spki).decode()

def verify(op):
    p, body, h, secret = op["provider"], bytes.fromhex(op["body"]), op["headers"], op["secret"]
    try:
        if p == "razorpay":
            from razorpay.utility.utility import Utility
            return bool(Utility(None).verify_webhook_signature(body.decode(), h["x-razorpay-signature"], secret))
        if p == "coinbase-commerce":
            from coinbase_commerce.webhook import Webhook
            return Webhook.construct_event(body.decode(), h["x-cc-webhook-signature"], secret) is not None
        if p == "worldline":
            from onlinepayments.sdk.communication.request_header import RequestHeader
            from onlinepayments.sdk.json.default_marshaller import DefaultMarshaller
            from onlinepayments.sdk.webhooks.in_memory_secret_key_store import InMemorySecretKeyStore
            from onlinepayments.sdk.webhooks.webhooks_helper import WebhooksHelper
            kid, key = secret.split(":", 1)
            store = InMemorySecretKeyStore.instance()
            store.clear()
            store.store_secret_key(kid, key)
            headers = [RequestHeader(k, v) for k, v in h.items()]
            return WebhooksHelper(DefaultMarshaller.instance(), store).unmarshal(body, headers).id is not None
        if p == "resend":
            from svix.webhooks import Webhook
            Webhook(secret).verify(body, h)
            return True
        if p == "sendgrid":
            from sendgrid.helpers.eventwebhook import EventWebhook
            from sendgrid.helpers.eventwebhook.eventwebhook_header import EventWebhookHeader
            hl = {k.lower(): v for k, v in h.items()}
            return EventWebhook(sendgrid_public_key(secret)).verify_signature(body.decode(),
                hl[EventWebhookHeader.SIGNATURE.lower()], hl[EventWebhookHeader.TIMESTAMP.lower()])
        if p == "hubspot":
            from hubspot.utils.signature import Signature
            return Signature.is_valid(signature=h["x-hubspot-signature-v3"], client_secret=secret,
                request_body=body.decode(), http_uri=op["url"], http_method="POST",
                signature_version="v3", timestamp=h["x-hubspot-request-timestamp"])
    except Exception as e:
        if type(e).__name__ in ("ModuleNotFoundError", "ImportError"):
            raise
        return False
    raise SystemExit("no SDK check for " + p)

def sign(op):
    p, body, secret = op["provider"], bytes.fromhex(op["body"]), op["secret"]
    if p == "coinbase-commerce":
        from coinbase_commerce.webhook import WebhookSignature
        return {"x-cc-webhook-signature": WebhookSignature._compute_signature(body.decode(), secret)}
    if p == "resend":
        from svix.webhooks import Webhook
        ts = datetime.fromtimestamp(op["now"], tz=timezone.utc)
        sig = Webhook(secret).sign(op["id"], ts, body.decode())
        return {"svix-id": op["id"], "svix-timestamp": str(op["now"]), "svix-signature": sig}
    if p == "hubspot":
        from hubspot.utils.signature import Signature
        ts = str(op["now"] * 1000)
        sig = Signature.get_signature(secret, body.decode(), "v3", op["url"], "POST", ts)
        return {"x-hubspot-signature-v3": sig, "x-hubspot-request-timestamp": ts}
    if p == "sendgrid":
        # The sendgrid SDK does not sign: `cryptography`, which it verifies with, does.
        import base64
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        key = serialization.load_der_private_key(base64.b64decode(secret), None)
        ts = str(op["now"])
        sig = key.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256()))
        return {"x-twilio-email-event-webhook-signature": base64.b64encode(sig).decode(),
                "x-twilio-email-event-webhook-timestamp": ts}
    raise SystemExit("the SDK of " + p + " does not sign")

ops = json.load(open(sys.argv[1]))
print(json.dumps([verify(op) if op["op"] == "verify" else sign(op) for op in ops]))
"#;

/// Run the SDK operations; `Err` when Python or an SDK is missing.
fn run_sdks(ops: &[Value]) -> Result<Vec<Value>, String> {
    let python = einmal_tests::moto::moto_python()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("ops.json");
    std::fs::write(&path, Value::from(ops.to_vec()).to_string()).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(&python)
        .args(["-c", SDK_SCRIPT])
        .arg(&path)
        .output()
        .map_err(|e| format!("{python}: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("ModuleNotFoundError") || stderr.contains("ImportError") {
        return Err(format!("{python} lacks a provider SDK: {stderr}"));
    }
    assert!(out.status.success(), "SDK script failed: {stderr}");
    serde_json::from_slice(&out.stdout).map_err(|e| format!("SDK output: {e}"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate lives in the workspace")
        .to_path_buf()
}

fn demo_config() -> Config {
    let text = std::fs::read_to_string(repo_root().join("einmal.toml")).expect("einmal.toml");
    Config::from_toml_with_env(&text, |_| None).expect("einmal.toml parses")
}

fn sample(provider: &str) -> Vec<u8> {
    std::fs::read(repo_root().join(format!("events/samples/{provider}.json"))).expect("sample")
}

fn headers_json(headers: &http::HeaderMap) -> Value {
    headers
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(v.to_str().unwrap_or_default())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn header_map(value: &Value) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in value.as_object().expect("headers object") {
        h.insert(
            http::HeaderName::try_from(k.as_str()).unwrap(),
            http::HeaderValue::from_str(v.as_str().unwrap()).unwrap(),
        );
    }
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    h
}

fn with_secret(tenant: &TenantConfig, secret: &str) -> TenantConfig {
    let mut t = tenant.clone();
    t.secrets = vec![Secret::new(secret)];
    t
}

fn wrong_secret(provider: &str) -> &'static str {
    match provider {
        "worldline" => "demo-key-id:not-the-secret",
        "resend" => "whsec_bm90LXRoZS1zZWNyZXQ=",
        // Another P-256 key (PKCS#8), not the demo tenant's.
        "sendgrid" => "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgaSdpaIQpWdIG8QqlaCMCl17SyIx0zbuz9STykVDpm5GhRANCAARsIlizHPg3NIPOUDI+WeSus8czBJFwTuA1JK9pFFO2NTc6t5d/ALOB//reCvdzxHEu9MGbLt79Wml5c38zoV7O",
        _ => "not-the-secret",
    }
}

const WITH_SDK: &[&str] = &[
    "razorpay",
    "coinbase-commerce",
    "worldline",
    "resend",
    "hubspot",
    "sendgrid",
];
/// What signs what einmal must accept: the SDK itself, or (SendGrid, whose SDK only
/// verifies) the crypto library the SDK verifies with.
const SDK_SIGNS: &[&str] = &["coinbase-commerce", "resend", "hubspot", "sendgrid"];
/// No SDK verifies or signs: their published vector (or RFC 4231's) is a unit test in
/// the provider's module; through ingest they are checked like the others.
const NO_SDK: &[&str] = &["paystack", "zendesk"];
/// Providers whose scheme signs a timestamp (an expired delivery must be refused).
const SIGNS_TIME: &[&str] = &["resend", "hubspot", "sendgrid", "zendesk"];

#[tokio::test]
async fn provider_sdks_verify_what_einmal_signs_and_einmal_takes_each_once() {
    let config = Arc::new(demo_config());
    let now = einmal::time::now_secs();
    let mut ops = Vec::new();
    let mut cases = Vec::new();
    for &name in WITH_SDK.iter().chain(NO_SDK) {
        let provider = providers::lookup(name).expect("registered");
        let tenant = config.tenant(name, "demo").expect("demo tenant").clone();
        let body = sample(name);
        let (headers, _) = provider
            .signed_request(&body, &tenant, &format!("msg_{name}_1"), now)
            .unwrap();
        let mut tampered = body.clone();
        let at = tampered.iter().rposition(u8::is_ascii_digit).unwrap();
        tampered[at] = if tampered[at] == b'9' {
            b'0'
        } else {
            tampered[at] + 1
        };
        let wrong = provider
            .sign(
                &body,
                &with_secret(&tenant, wrong_secret(name)),
                &format!("msg_{name}_1"),
                now,
            )
            .unwrap();
        if WITH_SDK.contains(&name) {
            let secret = tenant.secrets[0].expose().to_owned();
            let url = tenant.option("url").unwrap_or_default().to_owned();
            for (b, h, want) in [
                (&body, &headers, true),
                (&tampered, &headers, false),
                (&body, &wrong, false),
            ] {
                ops.push(json!({"op": "verify", "provider": name, "secret": secret, "body": hex::encode(b), "headers": headers_json(h), "url": url}));
                cases.push((name, want));
            }
            if SDK_SIGNS.contains(&name) {
                ops.push(json!({"op": "sign", "provider": name, "secret": secret, "body": hex::encode(&body), "id": format!("msg_{name}_sdk"), "now": now, "url": url}));
                cases.push((name, true));
            }
        }
    }
    let required = std::env::var("EINMAL_REQUIRE_PROVIDER_SDKS").is_ok_and(|v| v == "1");
    let answers = match run_sdks(&ops) {
        Ok(a) => a,
        Err(e) if !required => {
            eprintln!("skipped the SDK half: {e}");
            Vec::new()
        }
        Err(e) => panic!("{e}"),
    };
    let mut sdk_signed = Vec::new();
    for (answer, (name, want)) in answers.iter().zip(&cases) {
        match answer {
            Value::Bool(verified) => assert_eq!(verified, want, "{name}: SDK verdict"),
            signed => sdk_signed.push((*name, header_map(signed))),
        }
    }

    // einmal's side, through the ingest path.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).unwrap());
    let inbox: Arc<dyn Inbox> = store.clone();
    let queue: Arc<dyn Queue> = store;
    let ingest = Ingestor::new(config.clone(), inbox.clone(), queue);
    let mut stored = 0;
    for &name in WITH_SDK.iter().chain(NO_SDK) {
        let provider: &dyn Provider = providers::lookup(name).unwrap();
        let tenant = config.tenant(name, "demo").unwrap().clone();
        let body = sample(name);
        let refused = |req: WebhookRequest| {
            let ingest = &ingest;
            async move { ingest.ingest(name, "demo", &req).await }
        };
        // Tampered body, wrong secret, expired timestamp: 401, nothing stored.
        let (headers, _) = provider
            .signed_request(&body, &tenant, "msg_x", now)
            .unwrap();
        let mut tampered = body.clone();
        let at = tampered.iter().rposition(u8::is_ascii_digit).unwrap();
        tampered[at] = if tampered[at] == b'9' {
            b'0'
        } else {
            tampered[at] + 1
        };
        let resp = refused(WebhookRequest::post(headers, tampered)).await;
        assert_eq!(resp.status, 401, "{name}: tampered: {}", resp.body);
        let wrong = provider
            .sign(
                &body,
                &with_secret(&tenant, wrong_secret(name)),
                "msg_x",
                now,
            )
            .unwrap();
        let resp = refused(WebhookRequest::post(wrong, body.clone())).await;
        assert_eq!(resp.status, 401, "{name}: wrong secret: {}", resp.body);
        if SIGNS_TIME.contains(&name) {
            let old = now - tenant.tolerance_secs as i64 - 60;
            let (stale, _) = provider
                .signed_request(&body, &tenant, "msg_old", old)
                .unwrap();
            let resp = refused(WebhookRequest::post(stale, body.clone())).await;
            assert_eq!(resp.status, 401, "{name}: expired: {}", resp.body);
        }
        assert_eq!(
            all_items(&*inbox).await.len(),
            stored,
            "{name}: refusals store nothing"
        );

        // Accepted once; the replay is a duplicate and stores nothing.
        let (headers, _) = provider
            .signed_request(&body, &tenant, &format!("msg_{name}_1"), now)
            .unwrap();
        let mut events = 1;
        for duplicate in [false, true] {
            let resp = ingest
                .ingest(
                    name,
                    "demo",
                    &WebhookRequest::post(headers.clone(), body.clone()),
                )
                .await;
            assert_eq!(resp.status, 200, "{name}: {}", resp.body);
            assert_eq!(resp.body["duplicate"], duplicate, "{name}: {}", resp.body);
            // A batch (SendGrid, HubSpot) stores each of its events.
            events = resp.body["events"].as_array().map_or(1, Vec::len);
        }
        stored += events;
        // What the SDK signed is accepted too (a new event id for Svix).
        for (_, headers) in sdk_signed.iter().filter(|(n, _)| *n == name) {
            let resp = ingest
                .ingest(
                    name,
                    "demo",
                    &WebhookRequest::post(headers.clone(), body.clone()),
                )
                .await;
            assert_eq!(resp.status, 200, "{name}: SDK-signed: {}", resp.body);
            if name == "resend" {
                stored += 1;
            } else {
                assert_eq!(
                    resp.body["duplicate"], true,
                    "{name}: same body, same event"
                );
            }
        }
        assert_eq!(
            all_items(&*inbox).await.len(),
            stored,
            "{name}: one item per event"
        );
    }
}
