pub mod ingest;
pub mod process;
pub mod replay;
pub mod sweep;
