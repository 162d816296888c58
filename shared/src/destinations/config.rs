//! The destinations of the tenant configuration (`[[destination]]` tables of the same
//! TOML as the tenants), after parsing and checking. Parsing lives in `crate::config`.
//!
//! ```toml
//! [[destination]]
//! name = "shop-app"              # unique per tenant; names the key and the metrics
//! tenant = "demo"
//! provider = "stripe"            # optional: only this provider's events
//! kind = "http"                  # http | sqs | eventbridge | lambda | postgres
//! events = ["payment_intent.*", "charge.refunded"]   # provider event types, `*` wildcard
//! outputs = ["notification.*"]   # domain outputs (optional)
//! ordered = false                # per-object version order, one in flight per object
//! max_attempts = 10
//! max_age_secs = 259200          # 3 days, then dead letter
//! url = "https://shop.example/webhooks/einmal"
//! secrets = [{ env = "SHOP_APP_WEBHOOK_SECRET" }]   # whsec_…, a list for rotation
//! ```

use std::time::Duration;

use super::http::HttpDestination;
use crate::secret::Secret;

pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// Three days: as long as the providers themselves retry (Stripe, Shopify).
pub const DEFAULT_MAX_AGE_SECS: u64 = 3 * 24 * 3600;
/// Destinations one tenant may have: each event's delivery record holds one entry per
/// destination, so this bounds its size.
pub const MAX_DESTINATIONS_PER_TENANT: usize = 8;

/// One configured destination.
#[derive(Debug, Clone, PartialEq)]
pub struct DestinationConfig {
    pub name: String,
    pub tenant: String,
    /// `None` = every provider of the tenant.
    pub provider: Option<String>,
    /// Provider event types to deliver; `*` matches any run of characters. Empty =
    /// no provider events (an outputs-only destination).
    pub events: Vec<String>,
    /// Domain output kinds to deliver (same pattern syntax).
    pub outputs: Vec<String>,
    pub ordered: bool,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub kind: DestinationKind,
}

/// The technology and its options.
#[derive(Debug, Clone, PartialEq)]
pub enum DestinationKind {
    Http(HttpDestination),
    Sqs(SqsDestination),
    EventBridge(EventBridgeDestination),
    Lambda(LambdaDestination),
    Postgres(PostgresDestination),
}

impl DestinationKind {
    pub fn name(&self) -> &'static str {
        match self {
            DestinationKind::Http(_) => "http",
            DestinationKind::Sqs(_) => "sqs",
            DestinationKind::EventBridge(_) => "eventbridge",
            DestinationKind::Lambda(_) => "lambda",
            DestinationKind::Postgres(_) => "postgres",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsDestination {
    pub queue_url: String,
}

impl SqsDestination {
    /// FIFO queues' names end in `.fifo`.
    pub fn is_fifo(&self) -> bool {
        self.queue_url.ends_with(".fifo")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBridgeDestination {
    /// Bus name or ARN (`default` for the account's default bus).
    pub bus: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LambdaDestination {
    /// Function name or ARN (synchronous `RequestResponse` invoke).
    pub function: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PostgresDestination {
    /// libpq-style connection string (a secret: it may hold a password).
    pub dsn: Secret,
    /// The user's event table (schema-qualified allowed); created when missing.
    pub table: String,
    pub tls: bool,
    pub pool_size: usize,
}
