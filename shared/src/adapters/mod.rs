//! Adapters for the storage ports: AWS (DynamoDB + SQS) and embedded (SQLite).

pub mod aws;
pub mod embedded;
