pub mod ingest;
pub mod process;
