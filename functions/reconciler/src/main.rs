//! The reference reconciler Lambda: the library's reconciler reading the reference
//! domain's orders. A user's reconciler is the same few lines with its own view.

use std::sync::Arc;

use einmal::domain::reference::ReferenceDomain;

#[tokio::main]
async fn main() -> Result<(), reconciler::Error> {
    reconciler::run(Arc::new(ReferenceDomain)).await
}
