//! The `einmal` binary, end to end: one test binary (one link) for every CLI scenario family.

mod common;

mod aws;
mod both_backends;
mod cli;
mod cli_ux;
mod config_check;
mod console;
mod listen;
mod relay_serve;
mod serve_aws;
mod serve_limits;
mod store_ops;
