//! einmal: turn at-least-once webhooks into exactly-once business effects.
//!
//! The library holds everything that is not transport: provider verification
//! (`providers`), the envelope every provider is reduced to (`envelope`), the
//! ingest pipeline (`pipeline`), the storage ports (`ports`) and their two
//! adapters (`adapters::embedded` on SQLite, `adapters::aws` on DynamoDB + SQS).
//! Lambda handlers and the `einmal` CLI are thin shells around it.

pub mod adapters;
pub mod audit;
pub mod body;
pub mod config;
pub mod config_source;
pub mod destinations;
pub mod domain;
pub mod envelope;
pub mod https;
pub mod lookup;
pub mod lookup_guard;
pub mod order;
pub mod pipeline;
pub mod ports;
pub mod problems;
pub mod providers;
pub mod reconcile;
pub mod request;
pub mod retention;
pub mod secret;
pub mod store_error;
pub mod telemetry;
pub mod text;
pub mod time;
pub mod wiring;
