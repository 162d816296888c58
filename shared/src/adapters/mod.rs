//! Adapters for the storage ports: AWS (DynamoDB + SQS) and embedded (SQLite); and
//! PostgreSQL, the destination sink into the user's own database.

pub mod aws;
#[cfg(feature = "embedded")]
pub mod embedded;
#[cfg(feature = "postgres")]
pub mod postgres;
