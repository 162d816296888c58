//! The destination of `bench/destination.sh`: an HTTP endpoint on loopback that
//! answers 200 to every POST and records, per `webhook-id`, the first arrival (Unix
//! microseconds) with the event id, as `event_id arrival_us` lines in `--out`. A
//! repeated `webhook-id` (a retry after a lost answer) is counted, not recorded again.

use std::collections::HashSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Benchmark destination: answers 200, records arrival times")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Arrivals, one `event_id arrival_us` line per delivery key.
    #[arg(long)]
    out: PathBuf,
}

struct Recorder {
    seen: HashSet<String>,
    out: std::io::BufWriter<std::fs::File>,
    duplicates: u64,
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let file = std::fs::File::create(&args.out).map_err(|e| e.to_string())?;
    let recorder = Arc::new(Mutex::new(Recorder {
        seen: HashSet::new(),
        out: std::io::BufWriter::new(file),
        duplicates: 0,
    }));
    let state = recorder.clone();
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap| {
            let state = state.clone();
            async move {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_micros())
                    .unwrap_or(0);
                let text = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                let (key, event) = (text("webhook-id"), text("einmal-event-id"));
                let mut r = state.lock().unwrap();
                if r.seen.insert(key) {
                    // Flushed per line: the script counts lines while the run goes on.
                    let _ = writeln!(r.out, "{event} {now}");
                    let _ = r.out.flush();
                } else {
                    r.duplicates += 1;
                }
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| e.to_string())?;
    println!("{}", listener.local_addr().map_err(|e| e.to_string())?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string())?;
    let r = recorder.lock().unwrap();
    eprintln!(
        "bench sink: {} deliveries, {} repeated keys",
        r.seen.len(),
        r.duplicates
    );
    Ok(())
}
