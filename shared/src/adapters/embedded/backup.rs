//! Backup and restore of `einmal.sqlite` while `einmal serve` runs.
//!
//! A backup is SQLite's online backup API on a connection of its own that holds one
//! read transaction from the first page to the last: in WAL mode that read blocks no
//! writer, and the copy is the store as of the moment it began (every write acked
//! before is in it, none that committed during the copy). It is copied in steps of
//! [`STEP_PAGES`] pages so progress can be shown. While it runs the WAL cannot be
//! checkpointed past its snapshot and grows by what is written meanwhile; the
//! checkpointer catches up after.
//!
//! A copy is checked before it is restored (`PRAGMA integrity_check`, an inbox table,
//! a schema version this build can open) and written next to the store first, then
//! renamed over it: a store is never left half restored. The store it replaces is
//! kept beside it (`einmal.sqlite.replaced-<unix ms>`).

use std::path::{Path, PathBuf};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use super::{schema, wal_path, DbError, BUSY_TIMEOUT, DB_FILE};
use crate::ports::StoreError;

/// Pages copied per backup step (4 MiB of 4 KiB pages).
pub const STEP_PAGES: i32 = 1024;

/// How far a copy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyProgress {
    pub copied_pages: u64,
    pub total_pages: u64,
}

/// A copy that passed the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedCopy {
    pub schema_version: i64,
    pub inbox_items: u64,
    pub bytes: u64,
}

fn unavailable(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{what} {}: {e}", path.display()))
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Copy the database `source` to `dest` (which must not exist), consistently, while
/// other connections write; `progress` hears of every step. Returns the copy's size.
pub fn backup_file(
    source: &Path,
    dest: &Path,
    mut progress: impl FnMut(CopyProgress),
) -> Result<u64, StoreError> {
    if dest.exists() {
        return Err(StoreError::Rejected(format!(
            "{} exists: a backup never overwrites a file",
            dest.display()
        )));
    }
    if !source.is_file() {
        return Err(StoreError::Unavailable(format!(
            "no store at {}",
            source.display()
        )));
    }
    let src = Connection::open_with_flags(
        source,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| unavailable("cannot open", source, e))?;
    src.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| unavailable("cannot open", source, e))?;
    // One snapshot for every step (see the module documentation).
    src.execute_batch("BEGIN; SELECT count(*) FROM sqlite_master;")
        .map_err(|e| unavailable("cannot read", source, e))?;
    let partial = with_suffix(dest, ".partial");
    let _ = std::fs::remove_file(&partial);
    let result = copy_pages(&src, &partial, &mut progress);
    let _ = src.execute_batch("COMMIT");
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    durable_rename(&partial, dest)?;
    Ok(std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0))
}

fn copy_pages(
    src: &Connection,
    partial: &Path,
    progress: &mut impl FnMut(CopyProgress),
) -> Result<(), StoreError> {
    let mut dst =
        Connection::open(partial).map_err(|e| unavailable("cannot create", partial, e))?;
    {
        let backup =
            Backup::new(src, &mut dst).map_err(|e| unavailable("cannot copy to", partial, e))?;
        loop {
            let step = backup
                .step(STEP_PAGES)
                .map_err(|e| unavailable("cannot copy to", partial, e))?;
            let p = backup.progress();
            let total = u64::try_from(p.pagecount).unwrap_or(0);
            let remaining = u64::try_from(p.remaining).unwrap_or(0);
            progress(CopyProgress {
                copied_pages: total.saturating_sub(remaining),
                total_pages: total,
            });
            match step {
                StepResult::Done => break,
                StepResult::More => {}
                // The destination is ours alone and the source only read: a lock is
                // some other process's, waited out briefly.
                StepResult::Busy | StepResult::Locked => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                _ => {}
            }
        }
    }
    // The copy is a plain file of its own: no WAL beside it.
    dst.query_row("PRAGMA journal_mode = DELETE", [], |r| {
        r.get::<_, String>(0)
    })
    .map_err(|e| unavailable("cannot finish", partial, e))?;
    drop(dst);
    Ok(())
}

/// Fsync `from`, rename it to `to`, fsync the directory.
fn durable_rename(from: &Path, to: &Path) -> Result<(), StoreError> {
    std::fs::File::open(from)
        .and_then(|f| f.sync_all())
        .map_err(|e| unavailable("cannot sync", from, e))?;
    std::fs::rename(from, to).map_err(|e| unavailable("cannot rename to", to, e))?;
    if let Some(dir) = to.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Check a copy: readable, `integrity_check` ok, an einmal store of a schema version
/// this build can open (older ones are migrated on open; a newer one is refused).
pub fn check_copy(file: &Path) -> Result<CheckedCopy, StoreError> {
    if !file.is_file() {
        return Err(StoreError::Unavailable(format!(
            "no file at {}",
            file.display()
        )));
    }
    let conn = Connection::open_with_flags(
        file,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| unavailable("cannot open", file, e))?;
    let corrupt = |e: rusqlite::Error| {
        StoreError::Corrupt(format!(
            "{} is not a readable einmal store: {e}",
            file.display()
        ))
    };
    let problems: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(corrupt)?;
    if problems != ["ok"] {
        return Err(StoreError::Corrupt(format!(
            "{} fails the integrity check: {}",
            file.display(),
            problems.into_iter().take(5).collect::<Vec<_>>().join("; ")
        )));
    }
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(corrupt)?;
    schema::check_version(version).map_err(|e| match e {
        DbError::Unavailable(m) => StoreError::Rejected(format!("{}: {m}", file.display())),
        other => StoreError::from(other),
    })?;
    let inbox_items: i64 = conn
        .query_row("SELECT count(*) FROM inbox", [], |r| r.get(0))
        .map_err(|e| {
            StoreError::Corrupt(format!("{} holds no einmal inbox: {e}", file.display()))
        })?;
    Ok(CheckedCopy {
        schema_version: version,
        inbox_items: u64::try_from(inbox_items).unwrap_or(0),
        bytes: std::fs::metadata(file).map(|m| m.len()).unwrap_or(0),
    })
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub copy: CheckedCopy,
    /// Where the store it replaced was moved to, if there was one.
    pub replaced: Option<PathBuf>,
}

/// Restore the checked copy `from` as the store of `dir` (created if missing). The
/// caller makes sure no process serves from `dir`.
pub fn restore_file(
    from: &Path,
    dir: &Path,
    mut progress: impl FnMut(CopyProgress),
) -> Result<Restored, StoreError> {
    let copy = check_copy(from)?;
    std::fs::create_dir_all(dir).map_err(|e| unavailable("cannot create", dir, e))?;
    let db = dir.join(DB_FILE);
    let incoming = with_suffix(&db, ".restoring");
    let _ = std::fs::remove_file(&incoming);
    backup_file(from, &incoming, &mut progress)?;
    let mut replaced = None;
    if db.exists() {
        let aside = with_suffix(&db, &format!(".replaced-{}", crate::time::now_millis()));
        std::fs::rename(&db, &aside).map_err(|e| unavailable("cannot move aside", &db, e))?;
        // The old WAL belongs to the old file: it goes with it, never onto the copy.
        for suffix in ["-wal", "-shm"] {
            let side = with_suffix(&db, suffix);
            if side.exists() {
                let _ = std::fs::rename(&side, with_suffix(&aside, suffix));
            }
        }
        replaced = Some(aside);
    }
    let _ = std::fs::remove_file(wal_path(&db));
    durable_rename(&incoming, &db)?;
    Ok(Restored { copy, replaced })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::adapters::embedded::tests::{item, open};
    use crate::ports::{Inbox, PutOutcome};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_under_load_holds_everything_acked_before_it_began() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut writers = Vec::new();
        for w in 0..4 {
            let (store, stop, acked) = (store.clone(), stop.clone(), acked.clone());
            writers.push(tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let mut it = item("stripe", "acme", &format!("w{w}_{i}"), 1);
                    it.body = vec![b'x'; 2000];
                    assert_eq!(store.put_new(&it).await.unwrap(), PutOutcome::Inserted);
                    acked.lock().unwrap().push(it.key);
                    i += 1;
                }
            }));
        }
        while acked.lock().unwrap().len() < 2000 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let before: Vec<_> = acked.lock().unwrap().clone();
        let dest = dir.path().join("copy.sqlite");
        let (db, dest2) = (store.path().to_path_buf(), dest.clone());
        let steps = tokio::task::spawn_blocking(move || {
            let mut steps = Vec::new();
            backup_file(&db, &dest2, |p| steps.push(p)).unwrap();
            steps
        })
        .await
        .unwrap();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.await.unwrap();
        }
        let last = steps.last().unwrap();
        assert_eq!(last.copied_pages, last.total_pages);
        let written = acked.lock().unwrap().len();
        assert!(written > before.len(), "writes went on during the backup");

        let checked = check_copy(&dest).unwrap();
        assert_eq!(checked.schema_version, schema::SCHEMA_VERSION);
        assert!(checked.inbox_items as usize >= before.len());
        // Restored into a directory of its own, it opens and holds every item.
        let target = tempfile::tempdir().unwrap();
        let restored = restore_file(&dest, target.path(), |_| {}).unwrap();
        assert_eq!(restored.replaced, None);
        let copy = open(target.path());
        for key in &before {
            assert!(
                copy.get(key).await.unwrap().is_some(),
                "{key:?} is in the copy"
            );
        }
        // A backup never overwrites.
        let again = backup_file(store.path(), &dest, |_| {});
        assert!(matches!(again, Err(StoreError::Rejected(_))));
    }

    #[test]
    fn a_damaged_or_newer_copy_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.sqlite");
        std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
        assert!(matches!(check_copy(&junk), Err(StoreError::Corrupt(_))));
        let other = dir.path().join("other.sqlite");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x); PRAGMA user_version = 2;")
            .unwrap();
        assert!(
            matches!(check_copy(&other), Err(StoreError::Corrupt(m)) if m.contains("no einmal inbox"))
        );
        let newer = dir.path().join("newer.sqlite");
        Connection::open(&newer)
            .unwrap()
            .execute_batch(&format!("{} PRAGMA user_version = 99;", schema::schema()))
            .unwrap();
        assert!(
            matches!(check_copy(&newer), Err(StoreError::Rejected(m)) if m.contains("schema version 99"))
        );
    }
}
