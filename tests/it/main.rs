//! The integration tests of einmal as one test binary: one module per concern, so the
//! AWS SDK and SQLite are linked once, not once per file. Tests are named
//! `<module>::<test>` (filter with `cargo test -p einmal-tests --test it <module>::`).
//! A test that needs a process of its own is a file in `tests/tests/` (see `tests/Cargo.toml`).

mod acceptance;
mod ack_path_calls;
mod adyen;
mod all_providers;
mod aws_adapter;
mod aws_relay;
mod capacity;
mod config_refresh;
mod conformance;
mod control_characters;
mod crate_seams;
mod custom_domain;
mod destination_aws;
mod destination_http;
mod destination_postgres;
mod destinations;
mod disk_full;
mod hint_limits;
mod hot_record;
mod import_graph;
mod inbox_fences;
mod infra;
mod lambda_events;
mod lambda_watch;
mod layout;
mod log_redaction;
mod lost_bodies;
mod outage;
mod paypal_certs;
mod processing;
mod provider_sdks;
mod reconcile;
mod reconcile_thin;
mod replay;
mod search;
mod shopify_tenancy;
mod signed_facts;
mod state_migration;
mod state_store;
mod store_upgrade;
mod sweeper;
mod telemetry;
mod thin_events;
mod wait_marks;
mod waiting;
