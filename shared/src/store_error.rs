//! The storage ports' one error: on the ground floor, so that code below the ports
//! (a provider's certificate cache) can name it without reaching up.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    /// The store could not be reached or refused the call (throttling, I/O, timeouts):
    /// the provider should retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored item could not be decoded.
    #[error("stored item is corrupt: {0}")]
    Corrupt(String),
    /// The store refused this write and always will (an item over the size limit,
    /// a request it validates as invalid): retrying cannot help.
    #[error("store rejected the write: {0}")]
    Rejected(String),
}
