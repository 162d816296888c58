//! Regenerate the sample Lambda events under `events/` (API Gateway HTTP API payload v2
//! per provider, an SQS batch of pointer messages, EventBridge schedule events).
//!
//! Every webhook is signed with the library's own signing code (`Provider::sign` /
//! `signed_request`, as `einmal send` does) for the demo tenant of `einmal.toml`, and
//! verified again with the provider's `verify_and_extract` before it is written, so a
//! file this tool writes is one the receiver accepts at the signing time.
//!
//! ```text
//! regenerate-events                   rewrite events/{apigw,sqs,schedule} at the fixed time
//! regenerate-events --check           exit 1 (listing the files) if any of them is stale
//! regenerate-events --now [--out D]   sign at the current time into D (default
//!                                     target/lambda-events): for providers whose signature
//!                                     carries a timestamp checked against a tolerance
//! regenerate-events --at SECS         sign at SECS (Unix seconds) instead
//! ```
//! `--root DIR` points at the workspace (default: this crate's parent directory).
//! The output depends only on the signing time, `einmal.toml` and `events/samples/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base64::Engine as _;
use einmal::config::{Config, TenantConfig};
use einmal::providers::{self, sig, Provider};
use einmal::request::WebhookRequest;
use einmal::time::format_rfc3339;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The signing time of the checked-in files: 2026-11-29T10:00:00Z.
const FIXED_AT: i64 = 1_795_946_400;
const TENANT: &str = "demo";
const ACCOUNT: &str = "123456789012";
const REGION: &str = "us-east-1";
const API_ID: &str = "einmaldemo";
/// The directories this tool owns (everything in them is generated).
const OWNED_DIRS: [&str; 3] = ["apigw", "sqs", "schedule"];

/// Providers without a generated event, and why (also in events/README.md).
const SKIPPED: &[(&str, &str)] = &[(
    "paypal",
    "verified with PayPal's certificate fetched from PAYPAL-CERT-URL; no demo tenant can sign it",
)];

/// Thin providers: the request a provider sends, with the token and the id in the URL.
struct Thin {
    method: &'static str,
    body: &'static str,
    query: &'static str,
}

fn thin(provider: &str) -> Option<Thin> {
    Some(match provider {
        "gopay" => Thin {
            method: "GET",
            body: "",
            query: "id=3000006529",
        },
        "klarna-push" => Thin {
            method: "POST",
            body: "",
            query: "klarna_order_id=6f3b0e6c-demo-4d0b-9c1a-klarnapush01",
        },
        // Mollie classic (the signed next-gen form is `mollie.json`).
        "mollie-classic" => Thin {
            method: "POST",
            body: "id=tr_DEMOmollie01",
            query: "",
        },
        _ => return None,
    })
}

/// What a provider's request looks like to API Gateway.
struct Webhook {
    /// File stem: the provider name, or `mollie-classic`.
    name: String,
    provider: &'static dyn Provider,
    method: String,
    headers: http::HeaderMap,
    query: String,
    token: Option<String>,
    body: Vec<u8>,
}

struct Args {
    root: PathBuf,
    out: Option<PathBuf>,
    at: Option<i64>,
    now: bool,
    check: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        root: Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
        out: None,
        at: None,
        now: false,
        check: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--root" => args.root = PathBuf::from(value("--root")?),
            "--out" => args.out = Some(PathBuf::from(value("--out")?)),
            "--at" => {
                let v = value("--at")?;
                args.at = Some(
                    v.parse()
                        .map_err(|_| format!("--at {v}: not Unix seconds"))?,
                )
            }
            "--now" => args.now = true,
            "--check" => args.check = true,
            "-h" | "--help" => {
                println!("{}", USAGE);
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.now && args.at.is_some() {
        return Err("--now and --at exclude each other".into());
    }
    if args.check && (args.now || args.at.is_some() || args.out.is_some()) {
        return Err(
            "--check compares the checked-in files at the fixed time; it takes only --root".into(),
        );
    }
    Ok(args)
}

const USAGE: &str =
    "usage: regenerate-events [--root DIR] [--check | [--now | --at SECS] [--out DIR]]";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("regenerate-events: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let args = parse_args()?;
    let at = if args.now {
        einmal::time::now_secs()
    } else {
        args.at.unwrap_or(FIXED_AT)
    };
    let files = generate(&args.root, at)?;
    let events_dir = args.root.join("events");
    if args.check {
        let stale = compare(&events_dir, &files)?;
        if stale.is_empty() {
            println!("events/ is up to date ({} files)", files.len());
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("stale sample events (run events/regenerate.sh):");
        for s in &stale {
            eprintln!("  {s}");
        }
        return Ok(ExitCode::from(1));
    }
    let out = match (&args.out, args.now || args.at.is_some()) {
        (Some(out), _) => out.clone(),
        (None, true) => args.root.join("target/lambda-events"),
        (None, false) => events_dir,
    };
    write_all(&out, &files)?;
    println!(
        "wrote {} events signed at {at} to {}",
        files.len(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Relative path -> file content.
type Files = BTreeMap<String, String>;

fn generate(root: &Path, at: i64) -> Result<Files, String> {
    let config_path = root.join("einmal.toml");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    // `env:` options are resolved when used, not here; the demo secrets are inline.
    let config = Config::from_toml_with_env(&text, |_| None)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;

    let mut files = Files::new();
    let mut keys = BTreeMap::new();
    for &provider in providers::all() {
        let name = provider.name();
        if SKIPPED.iter().any(|(s, _)| *s == name) {
            continue;
        }
        let tenant = config
            .tenant(name, TENANT)
            .ok_or_else(|| format!("einmal.toml has no {name}/{TENANT} tenant"))?;
        let mut hooks = vec![webhook(root, provider, name, tenant, at)?];
        if name == "mollie" {
            hooks.push(webhook(root, provider, "mollie-classic", tenant, at)?);
        }
        for hook in hooks {
            let key = verify(&hook, tenant, at)?;
            keys.insert(hook.name.clone(), key);
            files.insert(
                format!("apigw/{}.json", hook.name),
                pretty(&apigw_event(&hook, at)),
            );
        }
    }

    // The processor's batch: pointers to the items the receiver events above create
    // (Stripe, Shopify, GitHub), one of them on its second receive.
    let mut records = Vec::new();
    for (i, (name, receive_count)) in [("stripe", 1), ("shopify", 1), ("github", 2)]
        .into_iter()
        .enumerate()
    {
        let key = keys.get(name).ok_or_else(|| format!("no {name} event"))?;
        records.push(sqs_record(i, key, receive_count, at));
    }
    files.insert(
        "sqs/batch.json".into(),
        pretty(&json!({ "Records": records })),
    );

    files.insert(
        "schedule/sweeper.json".into(),
        pretty(&scheduled_event("einmal-sweeper", at, json!({}))),
    );
    files.insert(
        "schedule/reconciler.json".into(),
        pretty(&scheduled_event("einmal-reconciler", at, json!({}))),
    );
    // A schedule with a constant input narrows the run (see functions/reconciler).
    // GoPay has no list API: its reconciliation reads the hint items in the inbox and
    // looks up the payments still pending, so it runs offline against a fresh inbox.
    files.insert(
        "schedule/reconciler-gopay.json".into(),
        pretty(&json!({"provider": "gopay", "tenant": TENANT, "reason": "sample: one tenant"})),
    );
    Ok(files)
}

/// Sign the provider's sample (or build the thin request) for `tenant` at `at`.
fn webhook(
    root: &Path,
    provider: &'static dyn Provider,
    name: &str,
    tenant: &TenantConfig,
    at: i64,
) -> Result<Webhook, String> {
    let pname = provider.name();
    let event_id = format!("demo-{pname}-1");
    if let Some(thin) = thin(name) {
        // Nothing is signed (Mollie's signed form would add its header: not here).
        let mut headers = http::HeaderMap::new();
        if !thin.body.is_empty() {
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/x-www-form-urlencoded"),
            );
        }
        let token = tenant
            .option("path_token")
            .ok_or_else(|| format!("{name}: the demo tenant has no path_token"))?;
        return Ok(Webhook {
            name: name.to_string(),
            provider,
            method: thin.method.to_string(),
            headers,
            query: thin.query.to_string(),
            token: Some(token.to_string()),
            body: thin.body.as_bytes().to_vec(),
        });
    }
    let path = root.join(format!("events/samples/{pname}.json"));
    let sample = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (mut headers, body) = if pname == "mailgun" {
        mailgun(&sample, tenant, at)?
    } else {
        let (h, b) = provider
            .signed_request(&sample, tenant, &event_id, at)
            .map_err(|e| format!("{pname}: cannot sign the sample: {e}"))?;
        (h, b.to_vec())
    };
    // An ECDSA signature (SendGrid) is randomized: keep the checked-in one while it
    // still verifies for the same body and time, so regenerating yields the same bytes.
    if RANDOMIZED_SIGNATURE.iter().any(|(p, _)| *p == pname) {
        keep_checked_in_signature(root, pname, &mut headers, &body, tenant, at)?;
    }
    // Per-request random headers (GitLab's X-Gitlab-Webhook-UUID) are not signed:
    // replace them with a value derived from the provider, so the output is stable.
    let (again, _) = match pname {
        "mailgun" => (headers.clone(), Vec::new()),
        _ if RANDOMIZED_SIGNATURE.iter().any(|(p, _)| *p == pname) => (headers.clone(), Vec::new()),
        _ => provider
            .signed_request(&sample, tenant, &event_id, at)
            .map(|(h, b)| (h, b.to_vec()))
            .map_err(|e| format!("{pname}: {e}"))?,
    };
    let random: Vec<http::HeaderName> = headers
        .keys()
        .filter(|k| headers.get_all(*k).iter().ne(again.get_all(*k).iter()))
        .cloned()
        .collect();
    for name in random {
        let stable = hex::encode(&digest(&format!("{pname}/{name}"))[..16]);
        headers.insert(
            name,
            http::HeaderValue::from_str(&stable).map_err(|e| e.to_string())?,
        );
    }
    Ok(Webhook {
        name: name.to_string(),
        provider,
        method: "POST".into(),
        headers,
        query: String::new(),
        token: None,
        body,
    })
}

/// Providers whose signature is randomized (ECDSA), with the header that carries it.
const RANDOMIZED_SIGNATURE: &[(&str, &str)] =
    &[("sendgrid", "x-twilio-email-event-webhook-signature")];

/// Replace the fresh signature in `headers` by the one of the checked-in
/// `events/apigw/{pname}.json` when that file holds the same body and the same other
/// headers and its signature verifies at `at`; otherwise keep the fresh one.
fn keep_checked_in_signature(
    root: &Path,
    pname: &str,
    headers: &mut http::HeaderMap,
    body: &[u8],
    tenant: &TenantConfig,
    at: i64,
) -> Result<(), String> {
    let Some((_, sig_name)) = RANDOMIZED_SIGNATURE.iter().find(|(p, _)| *p == pname) else {
        return Ok(());
    };
    let path = root.join(format!("events/apigw/{pname}.json"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let Ok(old) = serde_json::from_str::<Value>(&text) else {
        return Ok(());
    };
    if old["body"].as_str().map(str::as_bytes) != Some(body) {
        return Ok(());
    }
    let Some(old_sig) = old["headers"][*sig_name].as_str() else {
        return Ok(());
    };
    let same_others = headers.iter().all(|(k, v)| {
        k.as_str() == *sig_name || old["headers"][k.as_str()].as_str() == v.to_str().ok()
    });
    if !same_others {
        return Ok(());
    }
    let mut candidate = headers.clone();
    candidate.insert(
        http::HeaderName::from_static(sig_name),
        http::HeaderValue::from_str(old_sig).map_err(|e| e.to_string())?,
    );
    let request = WebhookRequest::post(candidate.clone(), body.to_vec());
    let provider = providers::lookup(pname).ok_or_else(|| format!("{pname}: unknown"))?;
    if provider.verify_and_extract(&request, tenant, at).is_ok() {
        *headers = candidate;
    }
    Ok(())
}

/// Mailgun signs `timestamp + token` inside the body; the library's `signed_body`
/// draws a random token, so build it here with a token derived from the time.
fn mailgun(
    event_data: &[u8],
    tenant: &TenantConfig,
    at: i64,
) -> Result<(http::HeaderMap, Vec<u8>), String> {
    let event_data: Value =
        serde_json::from_slice(event_data).map_err(|e| format!("mailgun sample: {e}"))?;
    let key = sig::secrets(tenant).map_err(|e| format!("mailgun: {e}"))?[0].expose();
    let ts = at.to_string();
    let token = hex::encode(&digest(&format!("mailgun/token/{at}"))[..25]);
    let mac = hex::encode(sig::hmac_sha256(
        key.as_bytes(),
        &[ts.as_bytes(), token.as_bytes()],
    ));
    let body = json!({
        "signature": {"timestamp": ts, "token": token, "signature": mac},
        "event-data": event_data,
    });
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok((headers, body.to_string().into_bytes()))
}

/// The receiver's own check: the request verifies at `at`. Returns the inbox key.
fn verify(hook: &Webhook, tenant: &TenantConfig, at: i64) -> Result<String, String> {
    let request = WebhookRequest {
        method: hook.method.parse().map_err(|_| "bad method".to_string())?,
        headers: hook.headers.clone(),
        query: Some(hook.query.clone()).filter(|q| !q.is_empty()),
        body: hook.body.clone().into(),
        path_token: hook.token.clone(),
    };
    let events = hook
        .provider
        .verify_and_extract(&request, tenant, at)
        .map_err(|e| format!("{}: the generated request does not verify: {e}", hook.name))?;
    let first = events
        .first()
        .ok_or_else(|| format!("{}: no event", hook.name))?;
    Ok(first.envelope.key().as_str().to_string())
}

fn apigw_event(hook: &Webhook, at: i64) -> Value {
    let provider = hook.provider.name();
    let mut path = format!("/webhooks/{provider}/{TENANT}");
    let mut route = "/webhooks/{provider}/{tenant}".to_string();
    let mut params = json!({"provider": provider, "tenant": TENANT});
    if let Some(token) = &hook.token {
        path.push('/');
        path.push_str(token);
        route.push_str("/{token}");
        params["token"] = json!(token);
    }
    let route_key = format!("{} {route}", hook.method);
    let domain = format!("{API_ID}.execute-api.{REGION}.amazonaws.com");
    let user_agent = user_agent(provider);
    let request_id = id_like(&format!("apigw/{}/{at}", hook.name));

    // HTTP API lower-cases header names and comma-joins repeated headers.
    let mut headers = BTreeMap::<String, String>::new();
    for name in hook.headers.keys() {
        let values: Vec<&str> = hook
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        headers.insert(name.as_str().to_string(), values.join(","));
    }
    headers.insert("host".into(), domain.clone());
    headers.insert("user-agent".into(), user_agent.into());
    headers.insert("x-forwarded-for".into(), "192.0.2.10".into());
    headers.insert("x-forwarded-port".into(), "443".into());
    headers.insert("x-forwarded-proto".into(), "https".into());
    headers.insert(
        "x-amzn-trace-id".into(),
        format!(
            "Root=1-{:08x}-{}",
            at,
            &hex::encode(digest(&request_id))[..24]
        ),
    );
    if !hook.body.is_empty() {
        headers.insert("content-length".into(), hook.body.len().to_string());
    }

    let mut event = json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": hook.query,
        "headers": headers,
        "pathParameters": params,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": API_ID,
            "domainName": domain,
            "domainPrefix": API_ID,
            "http": {
                "method": hook.method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "192.0.2.10",
                "userAgent": user_agent,
            },
            "requestId": request_id,
            "routeKey": route_key,
            "stage": "$default",
            "time": clf_time(at),
            "timeEpoch": at * 1000,
        },
        "isBase64Encoded": false,
    });
    if !hook.query.is_empty() {
        let params: BTreeMap<String, String> = form_pairs(&hook.query);
        event["queryStringParameters"] = json!(params);
    }
    if !hook.body.is_empty() {
        let content_type = headers.get("content-type").map(String::as_str);
        let textual = matches!(content_type, Some(t) if t.starts_with("application/json") || t.contains("xml") || t.starts_with("text/"));
        match (textual, std::str::from_utf8(&hook.body)) {
            (true, Ok(text)) => event["body"] = json!(text),
            // HTTP API base64-encodes form and binary bodies.
            _ => {
                event["body"] = json!(base64::engine::general_purpose::STANDARD.encode(&hook.body));
                event["isBase64Encoded"] = json!(true);
            }
        }
    }
    event
}

fn sqs_record(i: usize, key: &str, receive_count: u32, at: i64) -> Value {
    let body = serde_json::to_string(&json!({ "pk": key })).unwrap_or_default();
    let sent = at * 1000 + i as i64;
    json!({
        "messageId": uuid_like(&format!("sqs/{key}")),
        "receiptHandle": format!("AQEB{}", hex::encode(digest(&format!("receipt/{key}/{receive_count}")))),
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": receive_count.to_string(),
            "SentTimestamp": sent.to_string(),
            "SenderId": "AROADEMO0RECEIVER0001:receiver",
            "ApproximateFirstReceiveTimestamp": (sent + 25).to_string(),
        },
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": format!("arn:aws:sqs:{REGION}:{ACCOUNT}:einmal-queue"),
        "awsRegion": REGION,
    })
}

fn scheduled_event(rule: &str, at: i64, detail: Value) -> Value {
    json!({
        "version": "0",
        "id": uuid_like(&format!("schedule/{rule}/{at}")),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": format_rfc3339(at),
        "region": REGION,
        "resources": [format!("arn:aws:events:{REGION}:{ACCOUNT}:rule/{rule}")],
        "detail": detail,
    })
}

fn user_agent(provider: &str) -> &'static str {
    match provider {
        "stripe" => "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        "shopify" => "Shopify-Captain-Hook",
        "github" => "GitHub-Hookshot/einmal",
        "slack" => "Slackbot 1.0 (+https://api.slack.com/robots)",
        "twilio" => "TwilioProxy/1.1",
        "woocommerce" => "WooCommerce/9.4.0 Hookshot (WordPress/6.7)",
        "gitlab" => "GitLab/17.6.0",
        "adyen" => "Adyen HttpClient 1.0",
        "braintree" => "Braintree Webhooks",
        "mailgun" => "mailgun/treq-16.12.0",
        "square" => "Square Connect v2",
        "paddle" => "Paddle",
        "klarna" | "klarna-push" => "Klarna",
        "mollie" => "Mollie.nl HTTP client/1.0",
        "gopay" => "GoPay",
        "lemonsqueezy" => "LemonSqueezy-Hookshot",
        "standard-webhooks" => "Svix-Webhooks/1.0",
        _ => "einmal-regenerate-events",
    }
}

fn form_pairs(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// A UUID-shaped id derived from `seed` (stable output).
fn uuid_like(seed: &str) -> String {
    let h = hex::encode(&digest(seed)[..16]);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// An API Gateway request id shape (`AbCdEfGhIjKlMnO=`).
fn id_like(seed: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(&digest(seed)[..11]);
    format!("{}=", &b64[..15])
}

/// `29/Nov/2026:10:00:00 +0000`, as in `requestContext.time`.
fn clf_time(at: i64) -> String {
    let iso = format_rfc3339(at); // 2026-11-29T10:00:00Z
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month: usize = iso[5..7].parse().unwrap_or(1);
    format!(
        "{}/{}/{}:{} +0000",
        &iso[8..10],
        MONTHS[month.saturating_sub(1).min(11)],
        &iso[..4],
        &iso[11..19]
    )
}

fn pretty(value: &Value) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    s
}

fn write_all(out: &Path, files: &Files) -> Result<(), String> {
    // Leftovers of a provider that is gone would go stale: clear the owned directories.
    for dir in OWNED_DIRS {
        let dir = out.join(dir);
        if dir.is_dir() {
            for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
                let path = entry.map_err(|e| e.to_string())?.path();
                if path.extension().is_some_and(|e| e == "json") {
                    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                }
            }
        }
    }
    for (rel, content) in files {
        let path = out.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, content).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Files that differ, are missing, or are in an owned directory without being generated.
fn compare(events_dir: &Path, files: &Files) -> Result<Vec<String>, String> {
    let mut stale = Vec::new();
    for (rel, content) in files {
        match std::fs::read_to_string(events_dir.join(rel)) {
            Ok(on_disk) if on_disk == *content => {}
            Ok(_) => stale.push(format!("events/{rel} differs")),
            Err(_) => stale.push(format!("events/{rel} is missing")),
        }
    }
    for dir in OWNED_DIRS {
        let Ok(entries) = std::fs::read_dir(events_dir.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let rel = format!("{dir}/{}", entry.file_name().to_string_lossy());
            if rel.ends_with(".json") && !files.contains_key(&rel) {
                stale.push(format!("events/{rel} is not generated (remove it)"));
            }
        }
    }
    Ok(stale)
}
