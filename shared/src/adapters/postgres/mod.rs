//! PostgreSQL: the destination that delivers each event exactly once into the user's
//! own database ([`PostgresSink`]).
//!
//! Each delivery is ONE transaction (`READ COMMITTED`):
//!
//! ```sql
//! BEGIN ISOLATION LEVEL READ COMMITTED;
//! INSERT INTO einmal_applied (key, destination, applied_at) VALUES ($1, $2, now())
//!     ON CONFLICT (key) DO NOTHING RETURNING key;
//! -- only if a row came back (the key is new):
//! INSERT INTO <table> (key, provider, tenant, event_type, event_id, object_id,
//!                      object_version, occurred_at, body, body_raw, received_at) VALUES (…, now());
//! COMMIT;
//! ```
//!
//! The key is the relay's delivery key (one per event per destination, the same on
//! every retry and replay), so the event row commits exactly when its key does: a
//! retry after a lost answer, a replay, or eight relays racing on one event all find
//! the key and write nothing (`Delivered { note: Some("duplicate") }`); a transaction
//! that fails after the key insert leaves no key behind, so its retry applies. Under
//! `READ COMMITTED` the unique index does the serialisation: a concurrent second
//! insert of the key waits for the first transaction and then skips (or proceeds if
//! it rolled back), so no serialization failures and no advisory locks are needed.
//!
//! # Schema
//!
//! [`PostgresSink::ensure_schema`] (run by [`PostgresSink::connect`]) creates the two
//! tables when they are missing, in the schema of `table` when it is qualified
//! (`shop.einmal_events` → `shop.einmal_applied`), else in the first schema of the
//! connection's `search_path`. Existing tables are used as they are (the user may
//! add columns with defaults, indexes, triggers, partitions):
//!
//! ```sql
//! CREATE TABLE einmal_applied (
//!     key         text PRIMARY KEY,             -- the delivery key, msg_<32 hex>
//!     destination text NOT NULL,                -- the destination's name
//!     applied_at  timestamptz NOT NULL DEFAULT now()
//! );
//! CREATE INDEX einmal_applied_applied_at ON einmal_applied (applied_at);
//!
//! CREATE TABLE <table> (
//!     key            text PRIMARY KEY,          -- the same delivery key
//!     provider       text NOT NULL,             -- stripe, shopify, …
//!     tenant         text NOT NULL,
//!     event_type     text NOT NULL,             -- the provider's type, or an output's kind
//!     event_id       text NOT NULL,             -- the provider's event id
//!     object_id      text,                      -- the object the event is about
//!     object_version text,                      -- its version, where the provider has one
//!     occurred_at    timestamptz,               -- when the provider says it happened
//!     body           jsonb NOT NULL,            -- the body; a non-JSON body as a JSON string
//!     body_raw       bytea,                     -- the exact bytes of a body jsonb cannot hold (U+0000)
//!     received_at    timestamptz NOT NULL DEFAULT now()  -- when einmal wrote the row
//! );
//! ```
//!
//! The user's trigger (`AFTER INSERT ON <table> FOR EACH ROW`) or worker
//! (`SELECT … FOR UPDATE SKIP LOCKED`, or `LISTEN`/`NOTIFY` from such a trigger) then
//! sees each event exactly once. `einmal_applied` only has to remember keys as long as
//! the relay may redeliver them (the replay window): a periodic
//! `DELETE FROM einmal_applied WHERE applied_at < now() - interval '30 days'` keeps it
//! small (see `docs/destinations-postgres.md`).
//!
//! # Errors
//!
//! Connection errors and SQLSTATE classes 08 (connection), 25 (transaction state, e.g.
//! a read-only standby after a failover), 40 (serialization failure, deadlock), 53
//! (too many connections, out of resources), 55 (lock not available), 57 (admin
//! shutdown, statement timeout), 58, 72, F0, XX, and every failed `COMMIT` are
//! [`SinkError::Retry`](crate::destinations::SinkError). Everything else (an undefined
//! table or column 42P01/42703, permission 42501, a data error 22xxx, a constraint
//! 23xxx, a trigger's `RAISE` P0001, authentication 28xxx) will fail the same way on
//! every attempt: [`SinkError::Permanent`](crate::destinations::SinkError). A trigger
//! that wants a retry raises with a retryable SQLSTATE, e.g. `USING ERRCODE = '55P03'`.
//! The detail names the SQLSTATE, the step, and the table, column and constraint the
//! server reported; never the server's message, which may quote the row's values.

pub(crate) mod parse;
mod sink;

pub use parse::DEFAULT_POOL_SIZE;
pub use sink::{PostgresSink, CALL_TIMEOUT, STATEMENT_TIMEOUT};

use thiserror::Error;

/// The name of the key table, next to the user's table.
pub const APPLIED_TABLE: &str = "einmal_applied";

/// PostgreSQL limits identifiers to 63 bytes (`NAMEDATALEN - 1`).
const MAX_IDENTIFIER: usize = 63;

/// Why a PostgreSQL destination cannot start. Every variant names the destination;
/// none carries the connection string or its password.
#[derive(Debug, Error)]
pub enum PostgresError {
    #[error("destination `{destination}`: {reason}")]
    Config { destination: String, reason: String },
    #[error(
        "destination `{destination}`: table `{table}` is not a valid name: {reason} \
         (use lower-case `name` or `schema.name`: letters a-z, digits, `_`, \
         not starting with a digit, at most 63 characters each)"
    )]
    InvalidTable {
        destination: String,
        table: String,
        reason: &'static str,
    },
    #[error("destination `{destination}`: cannot connect to PostgreSQL at {target}: {reason}")]
    Connect {
        destination: String,
        /// `host:port/dbname as user`, without the password.
        target: String,
        reason: String,
    },
    #[error(
        "destination `{destination}`: cannot create or check the tables at {target}: {reason}"
    )]
    Schema {
        destination: String,
        target: String,
        reason: String,
    },
}

impl PostgresError {
    /// A configuration that can never work (fix it); the others may heal (a server
    /// down or restarting, DNS, TLS, a missing privilege for the schema check).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            PostgresError::Config { .. } | PostgresError::InvalidTable { .. }
        )
    }
}

/// Whether every host of the connection string `dsn` is on this machine (loopback or a
/// Unix socket), where TLS is not needed by default. `None` when it does not parse (the
/// parser's message is dropped: it may quote the string, and so a password).
pub fn dsn_is_local(dsn: &str) -> Option<bool> {
    let parsed = dsn.parse::<tokio_postgres::Config>().ok()?;
    Some(parsed.get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => crate::https::address::is_loopback_host(name),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => true,
    }))
}

/// Whether a connection string asks for TLS itself (`sslmode=require`), which `tls = false`
/// would contradict; a string that does not parse asks for nothing.
pub fn dsn_requires_tls(dsn: &str) -> bool {
    dsn.parse::<tokio_postgres::Config>()
        .is_ok_and(|c| c.get_ssl_mode() == tokio_postgres::config::SslMode::Require)
}

/// A checked table name: `name` or `schema.name`, lower-case identifiers only, so the
/// quoted name means what the unquoted one would and no SQL can be smuggled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// Parses `table` (e.g. `einmal_events`, `shop.events`); the error says why not.
    pub fn parse(table: &str) -> Result<TableName, &'static str> {
        let mut parts = table.split('.');
        let first = parts.next().unwrap_or_default();
        let second = parts.next();
        if parts.next().is_some() {
            return Err("more than one `.`");
        }
        let (schema, name) = match second {
            Some(name) => (Some(first), name),
            None => (None, first),
        };
        if let Some(schema) = schema {
            check_identifier(schema)?;
        }
        check_identifier(name)?;
        if name == APPLIED_TABLE {
            return Err("`einmal_applied` is einmal's key table");
        }
        Ok(TableName {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The quoted, possibly schema-qualified name for SQL: `"shop"."events"`.
    pub fn quoted(&self) -> String {
        self.qualify(&self.name)
    }

    /// The key table beside it: `"shop"."einmal_applied"` or `"einmal_applied"`.
    pub fn applied_quoted(&self) -> String {
        self.qualify(APPLIED_TABLE)
    }

    /// The bare table name (without schema), for index names.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn qualify(&self, name: &str) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{name}\""),
            None => format!("\"{name}\""),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

fn check_identifier(part: &str) -> Result<(), &'static str> {
    if part.is_empty() {
        return Err("an empty name");
    }
    if part.len() > MAX_IDENTIFIER {
        return Err("a name longer than 63 characters");
    }
    if part.as_bytes()[0].is_ascii_digit() {
        return Err("a name starting with a digit");
    }
    if !part
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err("a character other than a-z, 0-9 and `_`");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked_and_quoted() {
        let plain = TableName::parse("einmal_events").unwrap();
        assert_eq!(plain.quoted(), "\"einmal_events\"");
        assert_eq!(plain.applied_quoted(), "\"einmal_applied\"");
        let qualified = TableName::parse("shop.events_2").unwrap();
        assert_eq!(qualified.quoted(), "\"shop\".\"events_2\"");
        assert_eq!(qualified.applied_quoted(), "\"shop\".\"einmal_applied\"");
        assert_eq!(qualified.to_string(), "shop.events_2");
        // Reserved words are fine: the name is always quoted.
        assert_eq!(TableName::parse("user").unwrap().quoted(), "\"user\"");
    }

    #[test]
    fn bad_table_names_say_why() {
        for (table, why) in [
            ("", "an empty name"),
            ("shop.", "an empty name"),
            (".events", "an empty name"),
            ("a.b.c", "more than one `.`"),
            ("Events", "a character other than a-z, 0-9 and `_`"),
            (
                "events; DROP TABLE x",
                "a character other than a-z, 0-9 and `_`",
            ),
            ("ev\"ents", "a character other than a-z, 0-9 and `_`"),
            ("1events", "a name starting with a digit"),
            ("einmal_applied", "`einmal_applied` is einmal's key table"),
        ] {
            assert_eq!(TableName::parse(table), Err(why), "{table:?}");
        }
        assert_eq!(
            TableName::parse(&"e".repeat(64)),
            Err("a name longer than 63 characters")
        );
        assert!(TableName::parse(&"e".repeat(63)).is_ok());
    }
}
