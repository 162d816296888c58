//! Above everything: the loader of the configuration ([`load`], with the destinations'
//! common part in [`destinations`]), the registry of destination kinds and the one
//! sink context that builds every sink ([`kinds`]). The composition roots (`einmal
//! serve`, the Lambdas) start here; nothing in the library below imports it.

pub mod destinations;
pub mod kinds;
mod load;

pub use kinds::SinkContext;
