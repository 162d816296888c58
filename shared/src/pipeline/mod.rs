pub(crate) mod commit_group;
pub mod hint_limit;
pub mod ingest;
mod lanes;
pub mod process;
pub mod relay;
pub mod replay;
pub mod sink_set;
pub mod sweep;
