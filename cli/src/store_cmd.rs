//! The embedded store in production: the retention purge's flags of `einmal serve`,
//! the lock a serving store holds, and the operational commands (`store stats`,
//! `backup`, `restore`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::process::ExitCode;

use clap::Args;
use einmal::adapters::embedded::{
    backup_file, check_copy, purge_clock_ms, restore_file, CopyProgress, EmbeddedOptions,
    EmbeddedStore, PurgeSettings, StoreStats,
};
use einmal::ports::StoreError;

use crate::error::CliError;

/// File in the data directory that `einmal serve` holds locked while it runs, so
/// `einmal restore` can refuse to overwrite a live store.
pub const SERVE_LOCK_FILE: &str = "serve.lock";

/// The retention purge of `einmal serve` (see `einmal::adapters::embedded::purge`).
#[derive(Debug, Clone, Args)]
pub struct PurgeArgs {
    /// Rows one purge pass deletes at most (expired inbox items, stale order cursors,
    /// old dead letters); the next pass goes on where it stopped.
    #[arg(long, default_value_t = einmal::adapters::embedded::purge_defaults::MAX_ROWS)]
    pub purge_max_rows: usize,
    /// Seconds between purge passes (one runs at start).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub purge_interval_secs: u64,
}

impl PurgeArgs {
    /// The settings for a configuration with `retention_days`.
    pub fn settings(&self, retention_days: u32) -> PurgeSettings {
        PurgeSettings {
            max_rows: self.purge_max_rows.max(1),
            interval: Duration::from_secs(self.purge_interval_secs),
            ..PurgeSettings::for_retention(retention_days)
        }
    }
}

/// The lock `einmal serve` holds on its data directory while it runs (released when
/// the process ends, however it ends).
#[derive(Debug)]
pub struct ServeLock {
    _file: File,
}

/// Take the serve lock of `dir`; an error names the directory when another process
/// holds it.
pub fn lock_serving(dir: &Path) -> Result<ServeLock, String> {
    let path = dir.join(SERVE_LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(ServeLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another einmal serve runs on {} (it holds {SERVE_LOCK_FILE})",
            dir.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

/// Whether a process serves from `dir` now.
pub fn is_serving(dir: &Path) -> Result<bool, String> {
    let path = dir.join(SERVE_LOCK_FILE);
    let file = match File::options().write(true).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    match file.try_lock() {
        Ok(()) => Ok(false),
        Err(std::fs::TryLockError::WouldBlock) => Ok(true),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

/// Where the embedded store of a directory keeps its database.
pub fn db_path(dir: &Path) -> PathBuf {
    dir.join(einmal::adapters::embedded::DB_FILE)
}

/// The data directory of a store command.
#[derive(Debug, Clone, Args)]
pub struct DataDirArgs {
    /// Directory of the embedded store.
    #[arg(long, default_value = ".einmal")]
    pub data_dir: PathBuf,
}

impl DataDirArgs {
    fn existing(&self) -> Result<&Path, CliError> {
        if db_path(&self.data_dir).is_file() {
            return Ok(&self.data_dir);
        }
        Err(CliError::NotFound(format!(
            "no einmal store in {} (is --data-dir the one `einmal serve` uses?)",
            self.data_dir.display()
        )))
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// Rows per table, file and WAL size, the oldest item and the next purge.
    Stats(DataDirArgs),
}

/// `einmal backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The copy to write (must not exist).
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
    #[command(flatten)]
    pub dir: DataDirArgs,
}

/// `einmal restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// A copy made by `einmal backup` (or any consistent copy of einmal.sqlite).
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// The store directory to restore into; no `einmal serve` may run on it.
    #[arg(long)]
    pub data_dir: PathBuf,
}

fn store_error(e: StoreError) -> CliError {
    match e {
        StoreError::Rejected(m) | StoreError::Corrupt(m) => CliError::Usage(m),
        other => CliError::Failure(other.to_string()),
    }
}

/// `einmal store …`.
pub async fn run_store(command: StoreCommand, json: bool) -> Result<ExitCode, CliError> {
    match command {
        StoreCommand::Stats(args) => {
            let dir = args.existing()?;
            let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).map_err(|e| {
                CliError::Failure(format!("cannot open the store in {}: {e}", dir.display()))
            })?;
            let stats = store.stats().await.map_err(store_error)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&stats).map_err(|e| CliError::Failure(e.to_string()))?
                );
            } else {
                print!("{}", describe_stats(&stats, purge_clock_ms()));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `store stats` for a person.
pub fn describe_stats(stats: &StoreStats, now_ms: i64) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "schema version  {}", stats.schema_version);
    for t in &stats.tables {
        let _ = writeln!(out, "{:<15} {} rows", t.table, t.rows);
    }
    let _ = writeln!(
        out,
        "file            {} ({} pages of {} bytes, {} free; auto_vacuum {})",
        mib(stats.file_bytes),
        stats.page_count,
        stats.page_size,
        stats.free_pages,
        stats.auto_vacuum
    );
    let _ = writeln!(out, "wal             {}", mib(stats.wal_bytes));
    let ago = |ms: i64| format!("{}s ago", now_ms.saturating_sub(ms).max(0) / 1000);
    let _ = writeln!(
        out,
        "oldest item     {}",
        stats
            .oldest_item_received_ms
            .map(|at| format!("{} ({})", einmal::time::format_rfc3339(at / 1000), ago(at)))
            .unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        out,
        "next expiry     {}",
        stats
            .next_expiry_secs
            .map(einmal::time::format_rfc3339)
            .unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        out,
        "last purge      {}",
        stats
            .last_purge_ms
            .map(ago)
            .unwrap_or_else(|| "never".into())
    );
    let _ = writeln!(
        out,
        "next purge      {}",
        stats
            .next_purge_ms
            .map(|at| {
                let secs = at.saturating_sub(now_ms) / 1000;
                if secs >= 0 {
                    format!("in {secs}s (while einmal serve runs)")
                } else {
                    "due (when einmal serve runs)".into()
                }
            })
            .unwrap_or_else(|| "at the next start of einmal serve".into())
    );
    out
}

/// Progress on stderr: a line per tenth of the copy.
fn progress_printer(what: &'static str) -> impl FnMut(CopyProgress) {
    let mut shown = u64::MAX;
    move |p: CopyProgress| {
        let tenth = (p.copied_pages * 10)
            .checked_div(p.total_pages)
            .unwrap_or(10);
        if tenth != shown {
            shown = tenth;
            eprintln!(
                "einmal: {what}: {}% ({} of {} pages)",
                tenth * 10,
                p.copied_pages,
                p.total_pages
            );
        }
    }
}

/// `einmal backup --to FILE`: a consistent copy while `serve` runs.
pub async fn run_backup(args: BackupArgs, json: bool) -> Result<ExitCode, CliError> {
    let dir = args.dir.existing()?.to_path_buf();
    let to = args.to.clone();
    let bytes = tokio::task::spawn_blocking(move || {
        backup_file(&db_path(&dir), &to, progress_printer("backup"))
    })
    .await
    .map_err(|e| CliError::Failure(format!("the backup stopped: {e}")))?
    .map_err(store_error)?;
    let checked = check_copy(&args.to).map_err(store_error)?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "to": args.to.display().to_string(),
                "bytes": bytes,
                "schema_version": checked.schema_version,
                "inbox_items": checked.inbox_items,
            })
        );
    } else {
        eprintln!(
            "einmal: backup: {} written ({}, {} inbox items, schema version {}); integrity check ok",
            args.to.display(),
            mib(bytes),
            checked.inbox_items,
            checked.schema_version
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `einmal restore --from FILE --data-dir D`: refuses a directory `serve` runs on,
/// checks the copy, keeps the store it replaces beside it.
pub async fn run_restore(args: RestoreArgs, json: bool) -> Result<ExitCode, CliError> {
    std::fs::create_dir_all(&args.data_dir).map_err(|e| {
        CliError::Failure(format!("cannot create {}: {e}", args.data_dir.display()))
    })?;
    // Held while restoring: a `serve` starting meanwhile refuses to start.
    let _lock = lock_serving(&args.data_dir).map_err(|e| {
        CliError::Failure(format!(
            "{e}: stop it before restoring (a restore never overwrites a running store)"
        ))
    })?;
    let (from, dir) = (args.from.clone(), args.data_dir.clone());
    let restored =
        tokio::task::spawn_blocking(move || restore_file(&from, &dir, progress_printer("restore")))
            .await
            .map_err(|e| CliError::Failure(format!("the restore stopped: {e}")))?
            .map_err(store_error)?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "data_dir": args.data_dir.display().to_string(),
                "schema_version": restored.copy.schema_version,
                "inbox_items": restored.copy.inbox_items,
                "replaced": restored.replaced.as_ref().map(|p| p.display().to_string()),
            })
        );
    } else {
        eprintln!(
            "einmal: restore: {} restored into {} ({} inbox items, schema version {}){}",
            args.from.display(),
            args.data_dir.display(),
            restored.copy.inbox_items,
            restored.copy.schema_version,
            restored
                .replaced
                .as_ref()
                .map(|p| format!("; the store it replaced is kept as {}", p.display()))
                .unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}
