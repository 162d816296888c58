//! `einmal config check`: load a tenant configuration exactly as `serve` and the
//! Lambdas do, and report every problem.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use einmal::config::ConfigError;
use einmal_cli::config_file::ConfigFileError;

/// Exit code of `einmal config check` when the configuration has problems (4 means it
/// could not be read, like every other failure).
pub const EXIT_INVALID: u8 = einmal_cli::error::EXIT_NEGATIVE;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Check a tenant configuration: print each problem as `file:line: message` and
    /// exit 1 if there is any (0 when valid, 4 when the file cannot be read).
    Check {
        /// Tenant configuration (TOML).
        #[arg(long, default_value_os_t = crate::default_config_path())]
        config: PathBuf,
        /// Print `{"file", "valid", "problems", …}` as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What one SSM parameter holds (Standard tier; Advanced holds 8,192).
const SSM_STANDARD_BYTES: u64 = 4096;

/// A configuration larger than one SSM parameter cannot be deployed as one.
fn size_warning(config: &std::path::Path) -> Option<String> {
    let bytes = std::fs::metadata(config).ok()?.len();
    (bytes > SSM_STANDARD_BYTES).then(|| {
        format!(
            "warning: {} is {bytes} bytes: one SSM parameter holds 4,096 (Standard) or 8,192 \
             (Advanced); on AWS split it into parameters below a path (a ConfigParameterName \
             ending in /, see README \"Tenant configuration\")",
            config.display()
        )
    })
}

pub async fn run(command: ConfigCommand) -> Result<ExitCode, String> {
    let ConfigCommand::Check { config, json } = command;
    if let Some(warning) = size_warning(&config) {
        eprintln!("{warning}");
    }
    match einmal_cli::config_file::load_checked(&config).await {
        Ok(loaded) if json => {
            println!(
                "{}",
                serde_json::json!({
                    "file": config.display().to_string(),
                    "valid": true,
                    "tenants": loaded.tenants().count(),
                    "destinations": loaded.destinations().len(),
                    "problems": [],
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(loaded) => {
            println!(
                "{}: valid ({} tenants, {} destinations)",
                config.display(),
                loaded.tenants().count(),
                loaded.destinations().len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(ConfigFileError::Fetch(reason)) => Err(reason),
        Err(ConfigFileError::Config(err @ ConfigError::Read { .. })) => Err(err.to_string()),
        Err(ConfigFileError::Config(err)) if json => {
            println!(
                "{}",
                serde_json::json!({
                    "file": config.display().to_string(),
                    "valid": false,
                    "problems": err.lines(),
                })
            );
            Ok(ExitCode::from(EXIT_INVALID))
        }
        Err(ConfigFileError::Config(err)) => {
            for line in err.lines() {
                println!("{line}");
            }
            Ok(ExitCode::from(EXIT_INVALID))
        }
    }
}
