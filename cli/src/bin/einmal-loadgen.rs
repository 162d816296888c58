//! Load generator for the receiver path: signed Stripe-like payloads (~3 KB) with a
//! share of duplicates, several concurrent keep-alive clients, against a running
//! `einmal serve`. Prints webhooks/s and ack latency percentiles. With `--sku`, every
//! event is a Shopify `orders/create` of one unit of that SKU (a best-selling SKU:
//! `bench/hot-sku.sh`). With `--orders N`, the Stripe payments pay N orders over and
//! over, so the business records stay N however long the stream runs
//! (`bench/retention.sh`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use einmal::config::Config;
use einmal::providers;
use http_body_util::{BodyExt, Full};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[derive(Parser)]
#[command(about = "Load generator for einmal's receiver")]
struct Args {
    /// Base URL of `einmal serve`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Configuration holding the tenant's secret.
    #[arg(long, default_value = "einmal.toml")]
    config: PathBuf,
    #[arg(long, default_value = "stripe")]
    provider: String,
    #[arg(long, default_value = "demo")]
    tenant: String,
    /// Number of requests to send.
    #[arg(long, default_value_t = 100_000)]
    requests: usize,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Share of requests that repeat an earlier event (0..1).
    #[arg(long, default_value_t = 0.2)]
    duplicates: f64,
    /// Approximate body size in bytes.
    #[arg(long, default_value_t = 3000)]
    body_bytes: usize,
    /// Random seed, so runs are reproducible.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Write `event_id ack_us` (Unix microseconds of the 200) per accepted new event,
    /// for end-to-end latencies (`bench/destination.sh`).
    #[arg(long)]
    ack_log: Option<PathBuf>,
    /// Send at most this many requests per second in total (0 = as fast as the
    /// connections go): request i leaves at `start + i / rate`, whoever is free.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Send Shopify `orders/create` of one unit of this SKU each (with `--provider
    /// shopify`; the tenant's `topic` option must be `orders/create`).
    #[arg(long)]
    sku: Option<String>,
    /// Stripe payments pay this many orders in turn (event i pays `order-{i mod N}`
    /// through `pi_{i mod N}`), so the shop's records stay N rows; 0 = a new order per
    /// event.
    #[arg(long, default_value_t = 0)]
    orders: usize,
}

struct Prepared {
    event_id: String,
    path: String,
    headers: http::HeaderMap,
    body: Bytes,
}

/// A Stripe `payment_intent.succeeded` `id` of about `pad` bytes: payment intent
/// `pi_{payer}` paying order `order-{payer}`.
fn stripe_event(id: &str, payer: &str, pad: usize) -> Vec<u8> {
    // Stamped now, so the effect lag and the payment SLI read true figures.
    let created = einmal::time::now_millis() / 1000;
    let base = serde_json::json!({
        "id": id, "object": "event", "api_version": "2024-06-20", "created": created,
        "livemode": false, "pending_webhooks": 1, "type": "payment_intent.succeeded",
        "data": {"object": {"id": format!("pi_{payer}"), "object": "payment_intent", "amount": 4990,
            "currency": "eur", "status": "succeeded", "customer": "cus_123",
            "metadata": {"order_id": format!("order-{payer}")}, "description": ""}}
    });
    let len = base.to_string().len();
    let mut value = base;
    value["data"]["object"]["description"] = "x".repeat(pad.saturating_sub(len)).into();
    value.to_string().into_bytes()
}

/// A Shopify order of one unit of `sku`; `order` is its id and number.
fn shopify_order(order: u64, sku: &str) -> Vec<u8> {
    serde_json::json!({
        "id": order, "name": format!("#{order}"), "order_number": order,
        "email": "jon@example.com", "created_at": "2025-11-29T02:00:00-05:00",
        "updated_at": "2025-11-29T02:00:00-05:00", "currency": "EUR",
        "financial_status": "pending", "total_price": "49.90", "subtotal_price": "49.90",
        "line_items": [{"id": order * 10, "sku": sku, "title": "T-shirt", "quantity": 1,
            "price": "49.90"}]
    })
    .to_string()
    .into_bytes()
}

fn prepare(args: &Args) -> Result<Vec<Prepared>, String> {
    if args.sku.is_some() && args.provider != "shopify" {
        return Err("--sku sends Shopify orders: use --provider shopify".into());
    }
    if args.sku.is_some() && args.orders > 0 {
        return Err("--orders shapes Stripe payments: it does not go with --sku".into());
    }
    let config = Config::load(&args.config).map_err(|e| e.to_string())?;
    let provider = providers::lookup(&args.provider).ok_or("unknown provider")?;
    let tenant = config
        .tenant(&args.provider, &args.tenant)
        .ok_or("tenant not configured")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let run: u32 = rng.gen();
    let unique = ((args.requests as f64) * (1.0 - args.duplicates))
        .ceil()
        .max(1.0) as usize;
    let mut ids: Vec<usize> = (0..unique).collect();
    while ids.len() < args.requests {
        ids.push(rng.gen_range(0..unique));
    }
    ids.shuffle(&mut rng);
    let now = einmal::time::now_secs();
    let path = format!("/webhooks/{}/{}", args.provider, args.tenant);
    ids.into_iter()
        .map(|i| {
            let event_id = format!("evt_load_{run:08x}_{i}");
            let body = match &args.sku {
                // Order ids unique per run (run's low bits above the index).
                Some(sku) => shopify_order(u64::from(run >> 8) * 1_000_000_000 + i as u64, sku),
                None if args.orders > 0 => {
                    stripe_event(&event_id, &(i % args.orders).to_string(), args.body_bytes)
                }
                None => stripe_event(&event_id, &event_id, args.body_bytes),
            };
            let (headers, body) = provider
                .signed_request(&body, tenant, &event_id, now)
                .map_err(|e| e.to_string())?;
            Ok(Prepared {
                event_id,
                path: path.clone(),
                headers,
                body,
            })
        })
        .collect()
}

async fn worker(
    addr: String,
    host: String,
    work: Arc<Vec<Prepared>>,
    next: Arc<AtomicUsize>,
    pace: Option<(tokio::time::Instant, f64)>,
) -> Result<(Vec<Duration>, [usize; 3], Vec<(usize, u128)>), String> {
    let stream = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut latencies = Vec::new();
    let mut outcomes = [0usize; 3]; // fresh, duplicate, error
    let mut acks = Vec::new(); // (work index, ack time in Unix µs) of fresh events
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(p) = work.get(i) else { break };
        if let Some((start, rate)) = pace {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        }
        let mut req = http::Request::post(p.path.as_str())
            .header("host", host.as_str())
            .header("content-type", "application/json");
        for (k, v) in &p.headers {
            req = req.header(k, v);
        }
        let req = req
            .body(Full::new(p.body.clone()))
            .map_err(|e| e.to_string())?;
        let start = Instant::now();
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        latencies.push(start.elapsed());
        if !status.is_success() {
            outcomes[2] += 1;
        } else if body.windows(16).any(|w| w == b"\"duplicate\":true") {
            outcomes[1] += 1;
        } else {
            outcomes[0] += 1;
            acks.push((i, unix_micros()));
        }
    }
    Ok((latencies, outcomes, acks))
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let hostport = args
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    eprintln!("preparing {} signed requests ...", args.requests);
    let work = Arc::new(prepare(&args)?);
    let next = Arc::new(AtomicUsize::new(0));
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        return Err(format!("--rate {} must be a number >= 0", args.rate));
    }
    let started_unix_us = unix_micros();
    let started = Instant::now();
    let pace = (args.rate > 0.0).then(|| (tokio::time::Instant::now(), args.rate));
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        tasks.push(tokio::spawn(worker(
            hostport.clone(),
            hostport.clone(),
            work.clone(),
            next.clone(),
            pace,
        )));
    }
    let mut latencies = Vec::with_capacity(args.requests);
    let mut totals = [0usize; 3];
    let mut acks = Vec::new();
    for t in tasks {
        let (l, o, a) = t.await.map_err(|e| e.to_string())??;
        latencies.extend(l);
        acks.extend(a);
        for k in 0..3 {
            totals[k] += o[k];
        }
    }
    let elapsed = started.elapsed();
    let finished_unix_us = unix_micros();
    latencies.sort();
    let pct = |p: f64| {
        let idx = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies.get(idx).copied().unwrap_or_default()
    };
    let rate = latencies.len() as f64 / elapsed.as_secs_f64();
    println!(
        "{} requests in {:.2}s over {} connections: {:.0} webhooks/s; accepted {}, duplicates {}, errors {}",
        latencies.len(), elapsed.as_secs_f64(), args.concurrency, rate, totals[0], totals[1], totals[2]
    );
    println!(
        "ack latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.90).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    // For end-to-end benchmarks (`bench/end-to-end.sh`): the run's wall-clock span.
    println!(
        "run span: first send {started_unix_us} us, last answer {finished_unix_us} us (Unix time)"
    );
    if let Some(path) = &args.ack_log {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
        );
        for (i, at) in acks {
            writeln!(out, "{} {at}", work[i].event_id).map_err(|e| e.to_string())?;
        }
        out.flush().map_err(|e| e.to_string())?;
    }
    if totals[2] > 0 {
        return Err(format!("{} requests failed", totals[2]));
    }
    Ok(())
}

fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}
