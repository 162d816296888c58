//! Shared support for einmal's integration tests.

pub mod fake_thin_api;
pub mod fixtures;
pub mod moto;
pub mod scenario;
