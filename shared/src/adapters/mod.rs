//! Adapters for the storage ports: AWS (DynamoDB + SQS) and embedded (SQLite); and
//! PostgreSQL, the destination sink into the user's own database.

pub mod aws;
pub mod embedded;
pub mod postgres;
