//! The options of a PostgreSQL destination (`kind = "postgres"`) and their check, with
//! the connection-string rules of the sink that uses them, so `config check` refuses
//! what the sink would.

use crate::destinations::config::PostgresDestination;
use crate::destinations::fields::Fields;
use crate::secret::SecretLookup;

pub const DEFAULT_POOL_SIZE: usize = 4;
const MAX_POOL_SIZE: u64 = 64;
/// The options of kind `postgres`.
pub(crate) const FIELDS: &[&str] = &["dsn", "table", "tls", "pool_size"];

/// The options of kind `postgres`, checked (a DSN that parses, a plain table name,
/// TLS unless the server is on this machine).
pub(crate) fn parse(f: &mut Fields, lookup: SecretLookup<'_>) -> Option<PostgresDestination> {
    let mut ok = true;
    let dsn = match f.take("dsn") {
        None => {
            let line = f.line;
            f.problem(line, "missing `dsn` (a connection string, inline, { env = \"VARIABLE\" } or { ssm = \"/parameter\" })");
            None
        }
        Some((line, value)) => f.secret("dsn", line, value, lookup).and_then(|dsn| {
            match super::dsn_is_local(dsn.expose()) {
                Some(local) => Some((line, dsn, local)),
                // The parser's message may quote the string, which may hold a password.
                None => {
                    f.problem(line, "`dsn` is not a valid PostgreSQL connection string (key=value or postgresql:// URL)");
                    None
                }
            }
        }),
    };
    let table = match f.required_string("table") {
        Some((line, table)) => match super::TableName::parse(&table) {
            Ok(_) => Some(table),
            Err(why) => {
                f.problem(line, format!("`table` `{table}` is not a valid table name ({why}): lower-case letters, digits and '_', optionally `schema.table`"));
                ok = false;
                None
            }
        },
        None => None,
    };
    // TLS unless the server is on this machine (loopback or a Unix socket). Both are
    // read even when the DSN did not resolve, so they are not reported as unknown.
    let local = dsn.as_ref().is_some_and(|(_, _, local)| *local);
    let tls = f.bool("tls", !local);
    let pool_size = f.number("pool_size", DEFAULT_POOL_SIZE as u64, 1, MAX_POOL_SIZE) as usize;
    // The sink refuses this at start; say it here, so `config check` agrees with `serve`.
    if let Some((line, dsn, _)) = &dsn {
        if !tls && super::dsn_requires_tls(dsn.expose()) {
            f.problem(
                *line,
                "`dsn` asks for sslmode=require but `tls = false`: set `tls = true` or drop sslmode",
            );
            ok = false;
        }
    }
    let (_, dsn, _) = dsn?;
    let table = table?;
    ok.then_some(PostgresDestination {
        dsn,
        table,
        tls,
        pool_size,
    })
}
