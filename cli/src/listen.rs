//! `einmal listen --forward-to http://localhost:3000/webhooks`: like `stripe listen`.
//! Runs the embedded pipeline (`einmal serve`, same flags) with one more HTTP
//! destination, `listen`, for every configured tenant, forwarding to the local app;
//! prints the signing secret first, for the app to verify with the `standardwebhooks`
//! library, then one line per delivery attempt. `einmal send` posts to it as to
//! `einmal serve`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Args;
use einmal::config::{Config, Secret};
use einmal::destinations::config::{
    HttpDestination, DEFAULT_HTTP_TIMEOUT, DEFAULT_MAX_AGE_SECS, DEFAULT_MAX_ATTEMPTS,
    MAX_DESTINATIONS_PER_TENANT,
};
use einmal::destinations::filter::validate_pattern;
use einmal::destinations::parse::check_url;
use einmal::destinations::signing::{decode_secret, generate_secret};
use einmal::destinations::{
    BodyFormat, Delivered, DestinationConfig, DestinationKind, Message, Sink, SinkError,
};

use einmal::domain::Domain;
use einmal_cli::serve::ServeArgs;

/// The name of the destination `einmal listen` adds to every tenant.
pub const DESTINATION: &str = "listen";

#[derive(Debug, Args)]
pub struct ListenArgs {
    /// Your app's webhook endpoint: http:// to localhost / 127.0.0.1 / [::1], or https://.
    #[arg(long, value_name = "URL")]
    pub forward_to: String,
    /// Event types to forward, `*` as wildcard (repeat, or separate with commas).
    /// Default: every event.
    #[arg(long = "events", value_name = "PATTERN", value_delimiter = ',')]
    pub events: Vec<String>,
    /// Also forward the domain's outputs of these kinds (e.g. `notification.*`).
    #[arg(long = "outputs", value_name = "PATTERN", value_delimiter = ',')]
    pub outputs: Vec<String>,
    /// The signing secret (`whsec_` + base64); a fresh one is generated when omitted.
    #[arg(long, env = "EINMAL_LISTEN_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// Forward einmal's envelope instead of the provider's original body.
    #[arg(long)]
    pub envelope: bool,
    /// Per-call timeout of the forward, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_HTTP_TIMEOUT.as_millis() as u64)]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `einmal listen` with `domain` deciding (the stock binary passes the reference domain).
pub async fn run(args: ListenArgs, domain: std::sync::Arc<dyn Domain>) -> Result<ExitCode, String> {
    if args.serve.aws.is_aws() {
        return Err("einmal listen runs on the embedded store only (--backend embedded)".into());
    }
    let mut config = Config::load(&args.serve.config).map_err(|e| e.to_string())?;
    let secret = match &args.secret {
        Some(secret) => {
            decode_secret(secret).map_err(|e| format!("--secret: {e}"))?;
            Secret::new(secret.clone())
        }
        None => generate_secret(),
    };
    add_destinations(&mut config, &args, secret.clone())?;
    // First, so a script can read it from the first line.
    println!(
        "Ready! Your webhook signing secret is {} (forwarding to {})",
        secret.expose(),
        args.forward_to
    );
    let wrap: einmal_cli::relay::SinkWrap =
        Arc::new(|d: &DestinationConfig, sink: Arc<dyn Sink>| {
            if d.name == DESTINATION {
                Arc::new(Printing { inner: sink }) as Arc<dyn Sink>
            } else {
                sink
            }
        });
    einmal_cli::serve::run_with(args.serve, config, Some(wrap), domain).await
}

/// One `listen` destination per tenant of the configuration.
fn add_destinations(config: &mut Config, args: &ListenArgs, secret: Secret) -> Result<(), String> {
    check_url(&args.forward_to, true).map_err(|e| format!("--forward-to: {e}"))?;
    let events = if args.events.is_empty() && args.outputs.is_empty() {
        vec!["*".to_string()]
    } else {
        args.events.clone()
    };
    for pattern in events.iter().chain(&args.outputs) {
        validate_pattern(pattern).map_err(|e| format!("--events/--outputs: {e}"))?;
    }
    if args.timeout_ms == 0 {
        return Err("--timeout-ms must be at least 1".into());
    }
    let mut tenants: Vec<String> = config.tenants().map(|t| t.tenant.clone()).collect();
    tenants.sort();
    tenants.dedup();
    if tenants.is_empty() {
        return Err(format!(
            "{} configures no tenant: nothing to listen to",
            args.serve.config.display()
        ));
    }
    for tenant in tenants {
        let existing: Vec<_> = config
            .destinations()
            .iter()
            .filter(|d| d.tenant == tenant)
            .collect();
        if existing.iter().any(|d| d.name == DESTINATION) {
            return Err(format!(
                "tenant {tenant} already has a destination named `{DESTINATION}`: rename it to use einmal listen"
            ));
        }
        if existing.len() >= MAX_DESTINATIONS_PER_TENANT {
            return Err(format!(
                "tenant {tenant} already has {MAX_DESTINATIONS_PER_TENANT} destinations, the most allowed: no room for `{DESTINATION}`"
            ));
        }
        config.insert_destination(DestinationConfig {
            name: DESTINATION.into(),
            tenant,
            provider: None,
            events: events.clone(),
            outputs: args.outputs.clone(),
            ordered: false,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_age: Duration::from_secs(DEFAULT_MAX_AGE_SECS),
            kind: DestinationKind::Http(HttpDestination {
                url: args.forward_to.clone(),
                secrets: vec![secret.clone()],
                body: if args.envelope {
                    BodyFormat::Envelope
                } else {
                    BodyFormat::Original
                },
                timeout: Duration::from_millis(args.timeout_ms),
                // The developer's own machine and network: a LAN address is intended.
                allow_private: true,
            }),
        });
    }
    Ok(())
}

/// The `listen` sink: the HTTP sink, plus one line per attempt on stdout.
struct Printing {
    inner: Arc<dyn Sink>,
}

#[async_trait]
impl Sink for Printing {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError> {
        let started = Instant::now();
        let outcome = self.inner.deliver(message).await;
        println!("{}", attempt_line(message, &outcome, started.elapsed()));
        outcome
    }
}

/// `time  provider/tenant  type  event id  -> outcome  (latency)`.
fn attempt_line(
    message: &Message,
    outcome: &Result<Delivered, SinkError>,
    latency: Duration,
) -> String {
    let result = match outcome {
        Ok(Delivered {
            status: Some(status),
            ..
        }) => format!("[{status}]"),
        Ok(_) => "[delivered]".to_string(),
        Err(e) => format!("[{e}]"),
    };
    format!(
        "{}  {}/{}  {}  {}  --> {}  {} ms",
        einmal::time::format_rfc3339(einmal::time::now_secs()),
        message.provider,
        message.tenant,
        message.event_type,
        message.event_id,
        result,
        latency.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_line_names_the_event_and_the_outcome() {
        let message = Message {
            key: "msg_1".into(),
            destination: DESTINATION.into(),
            provider: "stripe".into(),
            tenant: "demo".into(),
            event_id: "evt_1".into(),
            event_type: "payment_intent.succeeded".into(),
            object_id: None,
            object_version: None,
            occurred_at: None,
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
        };
        let ok = Ok(Delivered {
            status: Some(200),
            note: None,
        });
        let line = attempt_line(&message, &ok, Duration::from_millis(12));
        assert!(
            line.ends_with("  stripe/demo  payment_intent.succeeded  evt_1  --> [200]  12 ms"),
            "{line}"
        );
        let failed = Err(SinkError::Retry {
            status: Some(500),
            retry_after: None,
            detail: "Internal Server Error".into(),
        });
        let line = attempt_line(&message, &failed, Duration::from_millis(3));
        assert!(
            line.contains("--> [retryable (status 500): Internal Server Error]  3 ms"),
            "{line}"
        );
    }
}
