//! [`PostgresSink`]: the key and the event row in one transaction (see the module doc).

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    HookError, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime,
};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::DbError;
use tokio_postgres::IsolationLevel;

use super::{PostgresError, TableName, APPLIED_TABLE};
use crate::destinations::config::PostgresDestination;
use crate::destinations::{
    Delivered, DestinationConfig, DestinationKind, Message, Sink, SinkError,
};

/// The server cancels any one statement of ours (or a user's trigger under it) after
/// this long, so a stuck statement never keeps a pooled connection busy: set once per
/// connection. Also bounds connecting and waiting for a pooled connection.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// One whole delivery (pool wait or connect, the transaction, the commit) gives up
/// after this long as a retry; the server-side timeout normally answers first.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Delivers into one PostgreSQL database, exactly once per [`Message::key`]. Built
/// once per destination ([`PostgresSink::connect`]) and shared by every delivery: a
/// pool of `pool_size` connections.
pub struct PostgresSink {
    destination: String,
    table: TableName,
    /// `host:port/dbname as user`: for messages, without the password.
    target: String,
    pool: Pool,
    insert_key: String,
    insert_row: String,
}

impl std::fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSink")
            .field("destination", &self.destination)
            .field("table", &self.table)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl PostgresSink {
    /// [`connect`](Self::connect) for a configured destination of kind `postgres`
    /// (what the relay's sink factory calls).
    pub async fn for_destination(
        config: &DestinationConfig,
    ) -> Result<PostgresSink, PostgresError> {
        match &config.kind {
            DestinationKind::Postgres(postgres) => Self::connect(&config.name, postgres).await,
            other => Err(PostgresError::Config {
                destination: config.name.clone(),
                reason: format!("kind `{}` is not `postgres`", other.name()),
            }),
        }
    }

    /// Checks the configuration, opens the pool, connects once (so an unreachable or
    /// misnamed server fails at start, naming `destination`) and runs
    /// [`ensure_schema`](Self::ensure_schema). `tls = true` requires TLS, verified
    /// against the system's root certificates (rustls); `false` never uses it. The
    /// connection string (`dsn`, libpq key=value or URL form) is never logged.
    pub async fn connect(
        destination: &str,
        config: &PostgresDestination,
    ) -> Result<PostgresSink, PostgresError> {
        let config_error = |reason: String| PostgresError::Config {
            destination: destination.to_owned(),
            reason,
        };
        let table =
            TableName::parse(&config.table).map_err(|reason| PostgresError::InvalidTable {
                destination: destination.to_owned(),
                table: config.table.clone(),
                reason,
            })?;
        if config.pool_size == 0 {
            return Err(config_error("pool_size must be at least 1".into()));
        }
        // The parser's errors name the option, never its value.
        let mut pg: tokio_postgres::Config = config
            .dsn
            .expose()
            .parse()
            .map_err(|e| config_error(format!("invalid connection string: {e}")))?;
        if pg.get_hosts().is_empty() && pg.get_hostaddrs().is_empty() {
            return Err(config_error("the connection string names no host".into()));
        }
        if pg.get_ssl_mode() == SslMode::Require && !config.tls {
            return Err(config_error(
                "the connection string asks for sslmode=require but tls = false".into(),
            ));
        }
        pg.ssl_mode(if config.tls {
            SslMode::Require
        } else {
            SslMode::Disable
        });
        pg.connect_timeout(STATEMENT_TIMEOUT);
        if pg.get_application_name().is_none() {
            pg.application_name("einmal");
        }
        let target = describe(&pg);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = if config.tls {
            let tls = tls_connector().map_err(config_error)?;
            Manager::from_config(pg, tls, manager_config)
        } else {
            Manager::from_config(pg, tokio_postgres::NoTls, manager_config)
        };
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(STATEMENT_TIMEOUT))
            .post_create(deadpool_postgres::Hook::async_fn(|client, _| {
                Box::pin(async move {
                    let set = format!("SET statement_timeout = {}", STATEMENT_TIMEOUT.as_millis());
                    client.batch_execute(&set).await.map_err(HookError::Backend)
                })
            }))
            .build()
            .map_err(|e| config_error(format!("cannot build the connection pool: {e}")))?;
        let sink = PostgresSink {
            insert_key: format!(
                "INSERT INTO {} (key, destination, applied_at) VALUES ($1::text, $2::text, now()) \
                 ON CONFLICT (key) DO NOTHING RETURNING key",
                table.applied_quoted()
            ),
            insert_row: format!(
                "INSERT INTO {} (key, provider, tenant, event_type, event_id, object_id, \
                 object_version, occurred_at, body, body_raw, received_at) VALUES ($1::text, \
                 $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, \
                 to_timestamp($8::bigint), $9::text::jsonb, $10::bytea, now())",
                table.quoted()
            ),
            destination: destination.to_owned(),
            table,
            target,
            pool,
        };
        let connected = tokio::time::timeout(CALL_TIMEOUT, sink.pool.get()).await;
        match connected {
            Err(_) => {
                return Err(
                    sink.connect_error(format!("no connection within {}s", CALL_TIMEOUT.as_secs()))
                )
            }
            Ok(Err(e)) => return Err(sink.connect_error(describe_pool_error(&e))),
            Ok(Ok(client)) => drop(client),
        }
        sink.ensure_schema().await?;
        tracing::info!(
            destination = %sink.destination,
            target = %sink.target,
            table = %sink.table,
            "postgres destination ready"
        );
        Ok(sink)
    }

    /// Creates `einmal_applied` and the event table where they are missing (schema in
    /// the module doc), under an advisory lock so that relays starting together do
    /// not race on `CREATE TABLE`; then prepares both inserts, which checks that the
    /// existing tables have the columns and the unique key the sink needs.
    pub async fn ensure_schema(&self) -> Result<(), PostgresError> {
        self.try_ensure_schema()
            .await
            .map_err(|reason| PostgresError::Schema {
                destination: self.destination.clone(),
                target: self.target.clone(),
                reason,
            })
    }

    async fn try_ensure_schema(&self) -> Result<(), String> {
        let mut client = self.pool.get().await.map_err(|e| describe_pool_error(&e))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| schema_error("begin", &e))?;
        // Any constant: it only serialises einmal's own schema checks.
        tx.execute("SELECT pg_advisory_xact_lock(8367211042)", &[])
            .await
            .map_err(|e| schema_error("lock", &e))?;
        let applied = self.table.applied_quoted();
        if !exists(&tx, &applied).await? {
            let sql = format!(
                "CREATE TABLE {applied} (\
                   key text PRIMARY KEY, \
                   destination text NOT NULL, \
                   applied_at timestamptz NOT NULL DEFAULT now()); \
                 CREATE INDEX {APPLIED_TABLE}_applied_at ON {applied} (applied_at);"
            );
            tx.batch_execute(&sql)
                .await
                .map_err(|e| schema_error("create einmal_applied", &e))?;
        }
        let table = self.table.quoted();
        if !exists(&tx, &table).await? {
            let sql = format!(
                "CREATE TABLE {table} (\
                   key text PRIMARY KEY, \
                   provider text NOT NULL, \
                   tenant text NOT NULL, \
                   event_type text NOT NULL, \
                   event_id text NOT NULL, \
                   object_id text, \
                   object_version text, \
                   occurred_at timestamptz, \
                   body jsonb NOT NULL, \
                   body_raw bytea, \
                   received_at timestamptz NOT NULL DEFAULT now())"
            );
            tx.batch_execute(&sql)
                .await
                .map_err(|e| schema_error(&format!("create {}", self.table), &e))?;
        } else if !has_column(&tx, &table, "body_raw").await? {
            // Tables created before `body_raw` existed: the one column einmal adds.
            let sql = format!("ALTER TABLE {table} ADD COLUMN body_raw bytea");
            tx.batch_execute(&sql).await.map_err(|e| {
                schema_error(
                    &format!("add the column body_raw ({sql}; run it as the table's owner)"),
                    &e,
                )
            })?;
        }
        tx.commit().await.map_err(|e| schema_error("commit", &e))?;
        for sql in [&self.insert_key, &self.insert_row] {
            client
                .prepare_cached(sql)
                .await
                .map_err(|e| schema_error("check the insert", &e))?;
        }
        Ok(())
    }

    /// The destination's name, as configured.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The event table the sink writes.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    fn connect_error(&self, reason: String) -> PostgresError {
        PostgresError::Connect {
            destination: self.destination.clone(),
            target: self.target.clone(),
            reason,
        }
    }

    async fn apply(&self, message: &Message) -> Result<Delivered, SinkError> {
        let mut client = self.pool.get().await.map_err(|e| pool_error(&e))?;
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await
            .map_err(|e| classify("begin", &e))?;
        let insert_key = tx
            .prepare_cached(&self.insert_key)
            .await
            .map_err(|e| classify("prepare the key insert", &e))?;
        let new = tx
            .query_opt(&insert_key, &[&message.key, &self.destination])
            .await
            .map_err(|e| classify("insert the key", &e))?;
        if new.is_none() {
            // Applied before (a retry after a lost answer, a replay, a racing relay):
            // nothing to write. Dropping `tx` rolls back.
            return Ok(Delivered {
                status: None,
                note: Some("duplicate".into()),
            });
        }
        let insert_row = tx
            .prepare_cached(&self.insert_row)
            .await
            .map_err(|e| classify("prepare the row insert", &e))?;
        let (body, body_raw) = stored_body(&message.body);
        tx.execute(
            &insert_row,
            &[
                &message.key,
                &message.provider,
                &message.tenant,
                &message.event_type,
                &message.event_id,
                &message.object_id,
                &message.object_version,
                &message.occurred_at,
                &body,
                &body_raw,
            ],
        )
        .await
        .map_err(|e| classify("insert the row", &e))?;
        // Whatever the reason, a failed commit is worth a retry: if it did commit,
        // the retry finds the key and reports a duplicate.
        tx.commit().await.map_err(|e| SinkError::Retry {
            status: None,
            retry_after: None,
            detail: describe_error("commit", &e),
        })?;
        Ok(Delivered::default())
    }
}

#[async_trait]
impl Sink for PostgresSink {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError> {
        match tokio::time::timeout(CALL_TIMEOUT, self.apply(message)).await {
            Ok(result) => result,
            Err(_) => Err(SinkError::Retry {
                status: None,
                retry_after: None,
                detail: format!("no answer within {}s", CALL_TIMEOUT.as_secs()),
            }),
        }
    }
}

/// The body as JSON text for `jsonb`: a JSON body as it is, anything else (a form
/// post, plain text) as one JSON string (invalid UTF-8 replaced by U+FFFD).
fn json_body(body: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(body) {
        if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
            return text.to_owned();
        }
    }
    serde_json::Value::String(String::from_utf8_lossy(body).into_owned()).to_string()
}

/// The body for the `body` (jsonb) and `body_raw` (bytea) columns. jsonb cannot hold
/// U+0000 (SQLSTATE 22P05), so a body containing it is stored with each U+0000 as
/// U+FFFD in `body` and byte for byte in `body_raw`; every other body leaves
/// `body_raw` NULL.
fn stored_body(body: &[u8]) -> (String, Option<Vec<u8>>) {
    let json = json_body(body);
    // `\u0000` is the only way JSON text can carry U+0000 (raw control characters are
    // invalid JSON, and json_body escapes them in a non-JSON body).
    if !json.contains("\\u0000") {
        return (json, None);
    }
    match serde_json::from_str::<serde_json::Value>(&json) {
        Ok(mut value) => {
            if !replace_nul(&mut value) {
                // `\\u0000`: an escaped backslash, not U+0000.
                return (json, None);
            }
            (value.to_string(), Some(body.to_vec()))
        }
        Err(_) => (json, None),
    }
}

/// Replaces U+0000 in every string and key; whether any was found.
fn replace_nul(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) if s.contains('\0') => {
            *s = s.replace('\0', "\u{fffd}");
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |f, v| replace_nul(v) | f),
        Value::Object(map) if map.keys().any(|k| k.contains('\0')) => {
            let entries = std::mem::take(map);
            for (k, mut v) in entries {
                replace_nul(&mut v);
                map.insert(k.replace('\0', "\u{fffd}"), v);
            }
            true
        }
        Value::Object(map) => map.values_mut().fold(false, |f, v| replace_nul(v) | f),
        _ => false,
    }
}

async fn has_column(
    tx: &deadpool_postgres::Transaction<'_>,
    quoted_table: &str,
    column: &str,
) -> Result<bool, String> {
    let row = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1::text) \
             AND attname = $2::text AND NOT attisdropped)",
            &[&quoted_table, &column],
        )
        .await
        .map_err(|e| schema_error("look up the columns", &e))?;
    Ok(row.get(0))
}

async fn exists(tx: &deadpool_postgres::Transaction<'_>, quoted: &str) -> Result<bool, String> {
    let row = tx
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&quoted])
        .await
        .map_err(|e| schema_error("look up the tables", &e))?;
    Ok(row.get(0))
}

/// The rustls connector: the workspace's aws-lc-rs provider, the system's roots.
fn tls_connector() -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(
            "tls = true but no system root certificates could be loaded \
                    (install ca-certificates)"
                .into(),
        );
    }
    let config = rustls::ClientConfig::builder_with_provider(
        rustls::crypto::aws_lc_rs::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS setup: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// `host:port/dbname as user` (every host when there are several), no password.
fn describe(pg: &tokio_postgres::Config) -> String {
    let ports = pg.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let mut hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            Host::Unix(dir) => format!("{}:{}", dir.display(), port(i)),
        })
        .collect();
    if hosts.is_empty() {
        hosts = pg
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, addr)| format!("{addr}:{}", port(i)))
            .collect();
    }
    let user = pg.get_user().unwrap_or("(default user)");
    let dbname = pg.get_dbname().unwrap_or(user);
    format!("{}/{dbname} as {user}", hosts.join(","))
}

fn describe_pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => describe_error("connect", e),
        PoolError::PostCreateHook(HookError::Backend(e)) => describe_error("set up the session", e),
        PoolError::PostCreateHook(HookError::Message(m)) => format!("set up the session: {m}"),
        PoolError::Timeout(kind) => format!("timed out ({kind:?}) waiting for a connection"),
        PoolError::Closed => "the pool is closed".into(),
        PoolError::NoRuntimeSpecified => "no async runtime for the pool".into(),
    }
}

fn pool_error(e: &PoolError) -> SinkError {
    match e {
        PoolError::Backend(e) => classify("connect", e),
        PoolError::PostCreateHook(HookError::Backend(e)) => classify("set up the session", e),
        other => SinkError::Retry {
            status: None,
            retry_after: None,
            detail: describe_pool_error(other),
        },
    }
}

fn schema_error(step: &str, e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        // At start the server's message names what is wrong (a missing column, a
        // missing unique key) and holds no row data: there is no row yet.
        Some(db) => format!("{}: {}", describe_db(step, db), db.message()),
        None => describe_error(step, e),
    }
}

/// The one place a PostgreSQL error becomes a retry or a permanent failure (classes
/// in the module doc).
fn classify(step: &str, e: &tokio_postgres::Error) -> SinkError {
    let detail = describe_error(step, e);
    let retry = match e.as_db_error() {
        None => true,
        Some(db) => is_retryable(db.code().code()),
    };
    if retry {
        SinkError::Retry {
            status: None,
            retry_after: None,
            detail,
        }
    } else {
        SinkError::Permanent {
            status: None,
            detail,
        }
    }
}

/// SQLSTATE classes worth another attempt: the server or the connection, not the
/// data or the schema, failed.
fn is_retryable(sqlstate: &str) -> bool {
    let class = sqlstate.get(..2).unwrap_or_default();
    matches!(
        class,
        "08" | "25" | "40" | "53" | "55" | "57" | "58" | "72" | "F0" | "XX"
    )
}

/// Short and safe for logs: for a server error the SQLSTATE with its name and the
/// table/column/constraint the server names, never its message (it may quote
/// values of the row); otherwise the client's error (connection refused, closed).
fn describe_error(step: &str, e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => describe_db(step, db),
        None => format!("{step}: {e}"),
    }
}

fn describe_db(step: &str, db: &DbError) -> String {
    let code = db.code().code();
    let mut detail = format!("{step}: SQLSTATE {code}");
    if let Some(name) = sqlstate_name(code) {
        detail.push_str(&format!(" ({name})"));
    }
    for (what, value) in [
        ("schema", db.schema()),
        ("table", db.table()),
        ("column", db.column()),
        ("constraint", db.constraint()),
    ] {
        if let Some(value) = value {
            detail.push_str(&format!(", {what} {value}"));
        }
    }
    detail
}

fn sqlstate_name(code: &str) -> Option<&'static str> {
    Some(match code {
        "08000" => "connection_exception",
        "08006" => "connection_failure",
        "22P02" => "invalid_text_representation",
        "22P05" => "untranslatable_character",
        "22008" => "datetime_field_overflow",
        "23502" => "not_null_violation",
        "23503" => "foreign_key_violation",
        "23505" => "unique_violation",
        "23514" => "check_violation",
        "25006" => "read_only_sql_transaction",
        "28000" => "invalid_authorization_specification",
        "28P01" => "invalid_password",
        "3D000" => "invalid_catalog_name",
        "40001" => "serialization_failure",
        "40P01" => "deadlock_detected",
        "42501" => "insufficient_privilege",
        "42703" => "undefined_column",
        "42P01" => "undefined_table",
        "42P10" => "invalid_column_reference",
        "42804" => "datatype_mismatch",
        "53300" => "too_many_connections",
        "55P03" => "lock_not_available",
        "57014" => "query_canceled",
        "57P01" => "admin_shutdown",
        "57P02" => "crash_shutdown",
        "57P03" => "cannot_connect_now",
        "P0001" => "raise_exception",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstate_classes() {
        for code in [
            "40001", "40P01", "57P01", "53300", "08006", "55P03", "57014", "25006",
        ] {
            assert!(is_retryable(code), "{code}");
        }
        for code in [
            "42P01", "42501", "22P02", "23514", "P0001", "28P01", "3D000", "42703",
        ] {
            assert!(!is_retryable(code), "{code}");
        }
    }

    #[test]
    fn bodies_become_json() {
        assert_eq!(json_body(br#"{"a": [1, 2]}"#), r#"{"a": [1, 2]}"#);
        assert_eq!(json_body(b"a=1&b=two"), r#""a=1&b=two""#);
        assert_eq!(json_body(b"\"quoted\""), "\"quoted\"");
        assert_eq!(json_body(b"{not json"), r#""{not json""#);
        assert_eq!(json_body(&[b'a', 0xff]), "\"a\u{fffd}\"");
    }

    #[test]
    fn bodies_with_u0000_keep_their_bytes_beside_a_jsonb_safe_body() {
        let body = br#"{"note":"a\u0000b","k\u0000":[1,"\u0000"]}"#;
        let (json, raw) = stored_body(body);
        assert_eq!(raw.as_deref(), Some(&body[..]));
        assert!(!json.contains("\\u0000"), "{json}");
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["note"], "a\u{fffd}b");
        assert_eq!(value["k\u{fffd}"][1], "\u{fffd}");
        let (json, raw) = stored_body(b"a=1\0b");
        assert_eq!(json, "\"a=1\u{fffd}b\"");
        assert_eq!(raw.as_deref(), Some(&b"a=1\0b"[..]));
        // An escaped backslash before `u0000` is text, not U+0000.
        let plain = br#"{"path":"C:\\u0000"}"#;
        assert_eq!(
            stored_body(plain),
            (String::from_utf8(plain.to_vec()).unwrap(), None)
        );
        assert_eq!(stored_body(br#"{"a":1}"#), (r#"{"a":1}"#.to_string(), None));
    }

    #[test]
    fn targets_name_no_password() {
        let pg: tokio_postgres::Config = "postgresql://shop:hunter2@db.example:6432/orders"
            .parse()
            .unwrap();
        assert_eq!(describe(&pg), "db.example:6432/orders as shop");
        let pg: tokio_postgres::Config = "host=/run/pg,10.0.0.2 port=5433 user=u password=p"
            .parse()
            .unwrap();
        assert_eq!(describe(&pg), "/run/pg:5433,10.0.0.2:5433/u as u");
    }
}
