//! Shared support for einmal's integration tests.

pub mod fixtures;
pub mod moto;
pub mod scenario;
