//! `einmal send`: sign a sample event like the provider would and post it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use einmal::providers;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Provider path name (stripe, shopify, github, standard-webhooks).
    #[arg(long)]
    pub provider: String,
    /// Tenant as configured.
    #[arg(long)]
    pub tenant: String,
    /// The event body to send; defaults to events/samples/{provider}.json.
    #[arg(long)]
    pub event: Option<PathBuf>,
    /// Event id to use (Stripe: replaces the body's `id`; others: the id header).
    /// Sending the same id twice shows deduplication.
    #[arg(long)]
    pub event_id: Option<String>,
    /// The topic header for providers that carry the event type in a header
    /// (Shopify `X-Shopify-Topic`, GitHub `X-GitHub-Event`), e.g. `orders/paid`.
    #[arg(long)]
    pub topic: Option<String>,
    /// Tenant configuration holding the secret (TOML).
    #[arg(long, default_value_os_t = crate::default_config_path())]
    pub config: PathBuf,
    /// Base URL of a running `einmal serve`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Print `{"status": ..., "response": ...}` instead of the status and the body.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: SendArgs) -> Result<ExitCode, String> {
    let config = einmal_cli::config_file::load_tenants(&args.config).await?;
    let provider = providers::lookup(&args.provider).ok_or_else(|| {
        let known: Vec<_> = providers::all().iter().map(|p| p.name()).collect();
        format!(
            "unknown provider {:?}; known: {}",
            args.provider,
            known.join(", ")
        )
    })?;
    let mut tenant = config
        .tenant(&args.provider, &args.tenant)
        .cloned()
        .ok_or_else(|| {
            format!(
                "tenant {:?} is not configured for {} in {}",
                args.tenant,
                args.provider,
                args.config.display()
            )
        })?;
    if let Some(topic) = &args.topic {
        tenant.options.insert("topic".into(), topic.clone());
        tenant.options.insert("event".into(), topic.clone());
    }
    let path = args
        .event
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("events/samples/{}.json", args.provider)));
    let mut body =
        std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let event_id = match &args.event_id {
        Some(id) => id.clone(),
        None => format!("demo-{}-1", args.provider),
    };
    if args.provider == "stripe" {
        if let Some(id) = &args.event_id {
            body = with_top_level_id(&body, id).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let now = einmal::time::now_secs();
    let (headers, body) = provider
        .signed_request(&body, &tenant, &event_id, now)
        .map_err(|e| format!("cannot sign for {}: {e}", args.provider))?;

    let url = format!(
        "{}/webhooks/{}/{}",
        args.url.trim_end_matches('/'),
        args.provider,
        args.tenant
    );
    let mut request = http::Request::post(&url).header("content-type", "application/json");
    for (name, value) in &headers {
        request = request.header(name, value);
    }
    let request = request
        .body(Full::new(body))
        .map_err(|e| format!("invalid request: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("cannot reach {url}: {e} (is `einmal serve` running?)"))?;
    let status = response.status();
    let text = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .map_err(|e| format!("reading the response failed: {e}"))?;
    if args.json {
        let response = serde_json::from_str::<serde_json::Value>(&text)
            .unwrap_or(serde_json::Value::String(text));
        let out = serde_json::json!({"status": status.as_u16(), "response": response});
        println!("{}", einmal::text::json_terminal_safe(&out.to_string()));
    } else {
        println!("{} {}", status.as_u16(), einmal::text::terminal_safe(&text));
    }
    Ok(if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(einmal_cli::error::EXIT_NEGATIVE)
    })
}

fn with_top_level_id(body: &[u8], id: &str) -> Result<Vec<u8>, String> {
    let mut value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let object = value
        .as_object_mut()
        .ok_or("the event is not a JSON object")?;
    object.insert("id".into(), serde_json::Value::String(id.to_string()));
    serde_json::to_vec(&value).map_err(|e| e.to_string())
}
