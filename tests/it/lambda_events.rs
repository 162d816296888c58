//! The sample Lambda events under `events/` never go stale:
//! - regenerating them (`events/regenerate.sh`, the `regenerate-events` binary) yields
//!   exactly the checked-in files;
//! - every API Gateway event verifies with the demo configuration, at its signing time
//!   and, for providers that sign no timestamp, today; the providers whose signature
//!   carries a checked timestamp are exactly [`TIMESTAMPED`] (listed in
//!   `events/README.md`: re-sign those with `--now` before invoking).

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use einmal::config::Config;
use einmal::providers;
use einmal::request::WebhookRequest;
use serde_json::Value;

/// Providers whose checked-in event stops verifying after the tolerance.
const TIMESTAMPED: &[&str] = &[
    "generic",
    "gitlab",
    "hubspot",
    "mailgun",
    "paddle",
    "resend",
    "sendgrid",
    "slack",
    "standard-webhooks",
    "stripe",
    "zendesk",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate lives in the workspace")
        .to_path_buf()
}

fn generator() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_regenerate-events"));
    command.arg("--root").arg(root());
    command
}

#[test]
fn regenerating_yields_exactly_the_checked_in_events() {
    let output = generator()
        .arg("--check")
        .output()
        .expect("run regenerate-events");
    assert!(
        output.status.success(),
        "events/ is stale; run events/regenerate.sh\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The webhook request an API Gateway v2 event stands for.
fn request(event: &Value) -> WebhookRequest {
    let mut headers = http::HeaderMap::new();
    for (name, value) in event["headers"].as_object().expect("headers") {
        headers.insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            http::HeaderValue::from_str(value.as_str().expect("string header")).expect("value"),
        );
    }
    let body = match event["body"].as_str() {
        None => Vec::new(),
        Some(b) if event["isBase64Encoded"] == true => base64::engine::general_purpose::STANDARD
            .decode(b)
            .expect("base64 body"),
        Some(b) => b.as_bytes().to_vec(),
    };
    let query = event["rawQueryString"].as_str().unwrap_or_default();
    WebhookRequest {
        method: event["requestContext"]["http"]["method"]
            .as_str()
            .expect("method")
            .parse()
            .expect("http method"),
        headers,
        query: Some(query.to_string()).filter(|q| !q.is_empty()),
        body: body.into(),
        path_token: event["pathParameters"]["token"]
            .as_str()
            .map(str::to_string),
    }
}

#[test]
fn every_apigw_event_verifies_and_only_timestamped_ones_expire() {
    let root = root();
    let text = std::fs::read_to_string(root.join("einmal.toml")).expect("einmal.toml");
    let config = Config::from_toml_with_env(&text, |_| None).expect("einmal.toml parses");
    let dir = root.join("events/apigw");
    let mut seen = Vec::new();
    let mut expired = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("events/apigw")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for path in files {
        let event: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON event");
        let provider_name = event["pathParameters"]["provider"]
            .as_str()
            .expect("provider");
        let tenant_name = event["pathParameters"]["tenant"].as_str().expect("tenant");
        assert_eq!(event["version"], "2.0", "{}", path.display());
        assert_eq!(
            event["rawPath"],
            event["requestContext"]["http"]["path"],
            "{}",
            path.display()
        );
        let provider = providers::lookup(provider_name).expect("known provider");
        let tenant = config
            .tenant(provider_name, tenant_name)
            .expect("demo tenant");
        let signed_at = event["requestContext"]["timeEpoch"]
            .as_i64()
            .expect("timeEpoch")
            / 1000;
        let req = request(&event);
        provider
            .verify_and_extract(&req, tenant, signed_at)
            .unwrap_or_else(|e| panic!("{}: does not verify when signed: {e}", path.display()));
        let today = einmal::time::now_secs();
        match provider.verify_and_extract(&req, tenant, today) {
            Ok(_) => {}
            Err(providers::ProviderError::TimestampOutOfTolerance) => {
                expired.push(provider_name.to_string())
            }
            Err(e) if provider_name == "mailgun" => {
                // A replayed token (verified a moment ago) is the only other refusal.
                assert!(e.to_string().contains("replay"), "mailgun today: {e}");
            }
            Err(e) => panic!("{}: does not verify today: {e}", path.display()),
        }
        seen.push(provider_name.to_string());
    }
    // (Mailgun checks its timestamp before its one-time token, so it expires too.)
    expired.sort();
    expired.dedup();
    assert_eq!(
        expired, TIMESTAMPED,
        "providers whose checked-in event expired"
    );
    for &p in providers::all() {
        if p.name() != "paypal" {
            assert!(
                seen.iter().any(|s| s == p.name()),
                "no event for {}",
                p.name()
            );
        }
    }
}
