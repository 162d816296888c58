//! Opening the store the operator asked for: embedded (default) or AWS.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use einmal::adapters::aws::{AwsNames, AwsStore, DynamoStateStore};
use einmal::adapters::embedded::EmbeddedStateStore;
use einmal::adapters::embedded::{EmbeddedAuditLog, EmbeddedOptions, EmbeddedStore};
use einmal::domain::state::StateStore;
use einmal::ports::InboxStore;
use einmal_cli::error::CliError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The SQLite store in --data-dir.
    Embedded,
    /// DynamoDB/SQS named by EINMAL_INBOX_TABLE, EINMAL_QUEUE_URL, EINMAL_DLQ_URL.
    Aws,
}

/// The provider and tenant a listing narrows to.
#[derive(Debug, Clone, Args)]
pub struct ScopeArgs {
    #[arg(long)]
    pub provider: Option<String>,
    #[arg(long)]
    pub tenant: Option<String>,
}

/// What every listing takes: how many, how printed, from which store.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Which store to read.
    #[arg(long, value_enum, default_value_t = Backend::Embedded)]
    pub backend: Backend,
    /// Directory of the embedded store (must exist: `einmal serve` or `einmal setup`
    /// creates it).
    #[arg(long, default_value = ".einmal")]
    pub data_dir: PathBuf,
}

/// The process's one AWS SDK config: every client shares it (and its connection pools),
/// whichever of the `open_*` calls a command makes. Its credentials are resolved once
/// first ([`einmal_cli::aws_credentials::check`]).
pub(crate) async fn sdk_config() -> Result<&'static aws_config::SdkConfig, CliError> {
    static SDK_CONFIG: tokio::sync::OnceCell<aws_config::SdkConfig> =
        tokio::sync::OnceCell::const_new();
    static CREDENTIALS: tokio::sync::OnceCell<Result<(), CliError>> =
        tokio::sync::OnceCell::const_new();
    let config = SDK_CONFIG
        .get_or_init(|| aws_config::load_defaults(aws_config::BehaviorVersion::latest()))
        .await;
    let checked = CREDENTIALS
        .get_or_init(|| einmal_cli::aws_credentials::check(config))
        .await;
    match checked {
        Ok(()) => Ok(config),
        Err(CliError::Usage(m)) => Err(CliError::Usage(m.clone())),
        Err(e) => Err(CliError::Failure(e.to_string())),
    }
}

/// The inbox on AWS; the names are checked first, so a missing variable fails before
/// any AWS lookup.
async fn open_aws_store() -> Result<Arc<AwsStore>, CliError> {
    let names = AwsNames::from_env().map_err(|e| e.to_string())?;
    Ok(Arc::new(AwsStore::from_sdk_config(
        sdk_config().await?,
        names,
    )))
}

impl StoreArgs {
    /// The business-state store next to the inbox.
    pub async fn open_state(&self) -> Result<Arc<dyn StateStore>, CliError> {
        match self.backend {
            Backend::Embedded => Ok(Arc::new(
                EmbeddedStateStore::open(self.existing_data_dir()?).map_err(|e| {
                    format!(
                        "cannot open the state store in {}: {e}",
                        self.data_dir.display()
                    )
                })?,
            )),
            Backend::Aws => Ok(Arc::new(
                DynamoStateStore::from_sdk_config(sdk_config().await?)
                    .map_err(|e| e.to_string())?,
            )),
        }
    }

    /// The inbox store: every inbox port of the chosen backend in one.
    pub async fn open(&self) -> Result<Arc<dyn InboxStore>, CliError> {
        match self.backend {
            Backend::Embedded => {
                let store = Arc::new(self.open_embedded_store()?);
                Ok(store)
            }
            Backend::Aws => {
                let store = open_aws_store().await?;
                Ok(store)
            }
        }
    }
}

/// What the operator commands (`dlq`, `replay`, `audit`) need.
pub struct OpsStores {
    pub replayer: einmal::pipeline::replay::Replayer,
    pub audit: Arc<dyn einmal::audit::AuditLog>,
}

impl StoreArgs {
    /// --data-dir, if it exists: opening a store there would create one, so a mistyped
    /// path would silently show an empty inbox. Only `serve`, `listen` and `setup`
    /// create the directory.
    fn existing_data_dir(&self) -> Result<&std::path::Path, CliError> {
        if self.data_dir.is_dir() {
            return Ok(&self.data_dir);
        }
        Err(CliError::NotFound(format!(
            "no einmal store in {}: the directory does not exist (is --data-dir the one `einmal serve` uses? `einmal setup --data-dir {}` creates an empty store)",
            self.data_dir.display(),
            self.data_dir.display()
        )))
    }

    /// The embedded inbox store in --data-dir, its error naming the folder.
    fn open_embedded_store(&self) -> Result<EmbeddedStore, CliError> {
        EmbeddedStore::open(self.existing_data_dir()?, EmbeddedOptions::default()).map_err(|e| {
            CliError::Failure(format!(
                "cannot open the store in {}: {e}",
                self.data_dir.display()
            ))
        })
    }

    /// The embedded audit log (`audit.sqlite` in --data-dir), its error naming the folder.
    fn open_embedded_audit(&self) -> Result<EmbeddedAuditLog, CliError> {
        EmbeddedAuditLog::open(self.existing_data_dir()?).map_err(|e| {
            CliError::Failure(format!(
                "cannot open the audit log in {}: {e}",
                self.data_dir.display()
            ))
        })
    }

    /// The audit log alone: `audit.sqlite` in --data-dir, or on AWS the table named by
    /// EINMAL_AUDIT_TABLE (`None` when that is not set).
    pub async fn open_audit(&self) -> Result<Option<Arc<dyn einmal::audit::AuditLog>>, CliError> {
        use einmal::adapters::aws::DynamoAuditLog;
        match self.backend {
            Backend::Embedded => Ok(Some(Arc::new(self.open_embedded_audit()?))),
            Backend::Aws => {
                let audit = DynamoAuditLog::from_sdk_config_if_configured(sdk_config().await?)
                    .map_err(|e| e.to_string())?;
                Ok(audit.map(|audit| Arc::new(audit) as Arc<dyn einmal::audit::AuditLog>))
            }
        }
    }

    /// The inbox, the replay service and the audit log (`audit.sqlite` in --data-dir,
    /// or the DynamoDB table named by EINMAL_AUDIT_TABLE).
    pub async fn open_ops(&self) -> Result<OpsStores, CliError> {
        use einmal::adapters::aws::DynamoAuditLog;
        use einmal::audit::AuditLog;
        use einmal::pipeline::replay::Replayer;
        match self.backend {
            Backend::Embedded => {
                let store = Arc::new(self.open_embedded_store()?);
                let audit: Arc<dyn AuditLog> = Arc::new(self.open_embedded_audit()?);
                Ok(OpsStores {
                    replayer: Replayer::from_store(store, audit.clone()),
                    audit,
                })
            }
            Backend::Aws => {
                let store = open_aws_store().await?;
                let audit: Arc<dyn AuditLog> = Arc::new(
                    DynamoAuditLog::from_sdk_config(sdk_config().await?)
                        .map_err(|e| e.to_string())?,
                );
                Ok(OpsStores {
                    replayer: Replayer::from_store(store, audit.clone()),
                    audit,
                })
            }
        }
    }
}
