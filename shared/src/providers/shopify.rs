//! PLACEHOLDER: being written.
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::request::WebhookRequest;

pub struct Shopify;

impl Provider for Shopify {
    fn name(&self) -> &'static str {
        "shopify"
    }
    fn verify_and_extract(&self, _r: &WebhookRequest, _t: &TenantConfig, _n: i64) -> Result<Vec<VerifiedEvent>, ProviderError> {
        Err(ProviderError::NoSecret)
    }
    fn sign(&self, _b: &[u8], _t: &TenantConfig, _e: &str, _n: i64) -> Result<http::HeaderMap, ProviderError> {
        Err(ProviderError::NoSecret)
    }
}
