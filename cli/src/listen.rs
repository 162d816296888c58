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
    DEFAULT_MAX_AGE_SECS, DEFAULT_MAX_ATTEMPTS, MAX_DESTINATIONS_PER_TENANT,
};
use einmal::destinations::filter::validate_pattern;
use einmal::destinations::http::signing::{decode_secret, generate_secret};
use einmal::destinations::http::{check_url, HttpDestination, DEFAULT_HTTP_TIMEOUT};
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

/// The signing secret: `--secret` (checked) or a fresh one.
fn signing_secret(args: &ListenArgs) -> Result<Secret, String> {
    match &args.secret {
        Some(secret) => {
            decode_secret(secret).map_err(|e| format!("--secret: {e}"))?;
            Ok(Secret::new(secret.clone()))
        }
        None => Ok(generate_secret()),
    }
}

/// `einmal listen --backend aws`: `einmal serve --backend aws` (the Lambdas' handlers
/// on the tables and queues the EINMAL_* variables name) with the same `listen`
/// destination for every tenant. The functions read their configuration from
/// EINMAL_CONFIG: the tenants' configuration (EINMAL_CONFIG_PARAMETER's SSM parameter,
/// else EINMAL_CONFIG, else --config) plus the `listen` destinations is handed to them
/// there, read once at start. Each attempt is recorded on its event (`einmal events
/// show --backend aws`), as every delivery on AWS.
pub async fn run_aws(
    args: ListenArgs,
    domain: std::sync::Arc<dyn Domain>,
) -> Result<ExitCode, einmal_cli::error::CliError> {
    use einmal::adapters::aws::{CONFIG_ENV, CONFIG_PARAMETER_ENV};
    use einmal_cli::error::CliError;
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let (text, origin) = if let Some(parameter) = set(CONFIG_PARAMETER_ENV) {
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let value = aws_sdk_ssm::Client::new(&sdk)
            .get_parameter()
            .name(parameter.trim())
            .with_decryption(true)
            .send()
            .await
            .map_err(|e| {
                CliError::Failure(format!(
                    "cannot read the configuration parameter {} ({CONFIG_PARAMETER_ENV}): {}",
                    parameter.trim(),
                    aws_sdk_ssm::error::DisplayErrorContext(&e)
                ))
            })?
            .parameter
            .and_then(|p| p.value)
            .unwrap_or_default();
        (
            value,
            format!("{CONFIG_PARAMETER_ENV} {}", parameter.trim()),
        )
    } else if let Some(inline) = set(CONFIG_ENV) {
        (inline, CONFIG_ENV.to_string())
    } else {
        let text = std::fs::read_to_string(&args.serve.config).map_err(|e| {
            CliError::Failure(format!(
                "cannot read --config {}: {e}",
                args.serve.config.display()
            ))
        })?;
        (text, format!("--config {}", args.serve.config.display()))
    };
    let mut config =
        Config::from_toml(&text).map_err(|e| CliError::Usage(format!("{origin}: {e}")))?;
    let secret = signing_secret(&args).map_err(CliError::Usage)?;
    let before = config.destinations().len();
    add_destinations(&mut config, &args, secret.clone()).map_err(CliError::Usage)?;
    let added: Vec<DestinationConfig> = config.destinations()[before..].to_vec();
    let mut combined = text;
    for destination in &added {
        combined.push_str(&destination_toml(destination, &args));
    }
    // What the functions will parse: the same destinations, or the start stops here.
    let check = Config::from_toml(&combined)
        .map_err(|e| CliError::Failure(format!("the listen destinations do not parse: {e}")))?;
    if check.destinations().len() != config.destinations().len() {
        return Err(CliError::Failure(
            "the listen destinations did not all reach the configuration".into(),
        ));
    }
    // Before any function starts and before any task reads the environment.
    std::env::set_var(CONFIG_ENV, combined);
    std::env::remove_var(CONFIG_PARAMETER_ENV);
    println!(
        "Ready! Your webhook signing secret is {} (forwarding to {})",
        secret.expose(),
        args.forward_to
    );
    einmal_cli::serve_aws::run(args.serve, domain, None).await
}

/// One `listen` destination as the configuration file writes it (strings quoted as
/// TOML basic strings: JSON's escapes are TOML's).
fn destination_toml(d: &DestinationConfig, args: &ListenArgs) -> String {
    let quote = |s: &str| serde_json::to_string(s).expect("a string encodes");
    let list = |items: &[String]| {
        let quoted: Vec<String> = items.iter().map(|i| quote(i)).collect();
        format!("[{}]", quoted.join(", "))
    };
    let secret = match &d.kind {
        DestinationKind::Http(http) => http.secrets.first().map(|s| s.expose().to_owned()),
        _ => None,
    }
    .unwrap_or_default();
    format!(
        "\n[[destination]]\nname = {}\ntenant = {}\nkind = \"http\"\nevents = {}\noutputs = {}\n\
         url = {}\nsecrets = [{}]\nbody = {}\ntimeout_ms = {}\nallow_private = true\n",
        quote(&d.name),
        quote(&d.tenant),
        list(&d.events),
        list(&d.outputs),
        quote(&args.forward_to),
        quote(&secret),
        quote(if args.envelope {
            "envelope"
        } else {
            "original"
        }),
        args.timeout_ms,
    )
}

/// `einmal listen` with `domain` deciding (the stock binary passes the reference domain).
pub async fn run(args: ListenArgs, domain: std::sync::Arc<dyn Domain>) -> Result<ExitCode, String> {
    let mut config = einmal_cli::config_file::load(&args.serve.config).await?;
    let secret = signing_secret(&args)?;
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
        let outcome = retry_client_errors(self.inner.deliver(message).await);
        println!("{}", attempt_line(message, &outcome, started.elapsed()));
        outcome
    }
}

/// While an app is developed a 4xx is usually the bug being fixed, not a verdict: it is
/// retried (on the destination's backoff) instead of dead-lettered, so the event arrives
/// once the fix is in. `410 Gone` stays final.
fn retry_client_errors(outcome: Result<Delivered, SinkError>) -> Result<Delivered, SinkError> {
    match outcome {
        Err(SinkError::Permanent {
            status: Some(status),
            detail,
        }) if (400..500).contains(&status) && status != 410 => Err(SinkError::Retry {
            status: Some(status),
            retry_after: None,
            detail: format!("{detail}; listen retries a 4xx, fix the app and it is sent again"),
        }),
        other => other,
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
    // What came from the webhook or the destination's answer is escaped.
    let safe = einmal::text::terminal_safe;
    format!(
        "{}  {}/{}  {}  {}  --> {}  {} ms",
        einmal::time::format_rfc3339(einmal::time::now_secs()),
        safe(&message.provider),
        safe(&message.tenant),
        safe(&message.event_type),
        safe(&message.event_id),
        safe(&result),
        latency.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_error_is_retried_except_gone() {
        let permanent = |status| {
            Err(SinkError::Permanent {
                status: Some(status),
                detail: "Bad Request".into(),
            })
        };
        assert!(matches!(
            retry_client_errors(permanent(400)),
            Err(SinkError::Retry {
                status: Some(400),
                ..
            })
        ));
        assert!(matches!(
            retry_client_errors(permanent(410)),
            Err(SinkError::Permanent {
                status: Some(410),
                ..
            })
        ));
        // Not an answer of the app (a refused address): unchanged.
        assert!(matches!(
            retry_client_errors(Err(SinkError::Permanent {
                status: None,
                detail: "refused".into()
            })),
            Err(SinkError::Permanent { status: None, .. })
        ));
    }

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

    #[test]
    fn an_attempt_line_escapes_control_characters_of_stored_data() {
        let message = Message {
            key: "msg_1".into(),
            destination: DESTINATION.into(),
            provider: "stripe".into(),
            tenant: "demo".into(),
            event_id: "evt_\u{202e}1".into(),
            event_type: "x\u{1b}]0;owned\u{7}".into(),
            object_id: None,
            object_version: None,
            occurred_at: None,
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
        };
        let failed = Err(SinkError::Retry {
            status: Some(500),
            retry_after: None,
            detail: "boom\u{1b}[2J\nforged line".into(),
        });
        let line = attempt_line(&message, &failed, Duration::from_millis(3));
        assert!(!line.chars().any(einmal::text::is_unsafe), "{line:?}");
        assert!(
            line.contains("  stripe/demo  x\\u{1b}]0;owned\\u{7}  evt_\\u{202e}1  --> "),
            "{line}"
        );
        assert!(line.contains("boom\\u{1b}[2J\\u{a}forged line"), "{line}");
    }
}
