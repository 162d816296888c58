//! The reference processor Lambda: the library's processor with the reference domain
//! deciding. A user's processor is the same few lines with its own domain.

use std::sync::Arc;

use einmal::domain::reference::ReferenceDomain;

#[tokio::main]
async fn main() -> Result<(), processor::Error> {
    processor::run(Arc::new(ReferenceDomain::new())).await
}
