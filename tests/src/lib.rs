//! Shared support for einmal's integration tests.

pub mod cfn;
pub mod destination_server;
pub mod fake_thin_api;
pub mod fault_proxy;
pub mod fixtures;
pub mod moto;
pub mod paypal;
pub mod postgres;
pub mod scenario;

/// Runs each named `async fn(Kind)` scenario of the calling test module once on each
/// backend, as `embedded_store::<name>` (SQLite file) and `aws_moto::<name>` (moto).
#[macro_export]
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod embedded_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::scenario::Kind::Embedded).await
                }
            )*
        }
        mod aws_moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::scenario::Kind::Aws).await
                }
            )*
        }
    };
}
