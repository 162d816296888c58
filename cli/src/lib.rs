//! The embedded pipeline behind `einmal serve`, as a library: a user's binary runs it
//! with its own domain (`einmal_cli::serve::run(args, Arc::new(MyDomain))`). The other
//! commands (`send`, `events`, `replay`, …) need no domain: the stock `einmal` binary
//! works on the same data directory.

pub mod serve;
pub mod serve_http;

use std::path::PathBuf;

/// Where the demo configuration lives when `--config` is not given.
pub fn default_config_path() -> PathBuf {
    PathBuf::from("einmal.toml")
}
