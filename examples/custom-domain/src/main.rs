//! The processor Lambda with the subscription domain deciding.

use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), processor::Error> {
    processor::run(Arc::new(custom_domain::Subscriptions)).await
}
