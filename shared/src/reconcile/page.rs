//! One page of a provider's list API: GET with the credential, bounded, retried on
//! transient failures; every failure names the call.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};

use super::{ReconcileError, Reconciler, MAX_PAGE_BYTES, PAGE_ATTEMPTS};
use crate::lookup::{classify_status, LookupError};

impl Reconciler {
    /// One page: GET `url` with `credential` = (header, value, the tenant option it
    /// comes from), retried on 5xx, 429, timeouts and connection failures
    /// ([`PAGE_ATTEMPTS`], backoff from [`PAGE_RETRY_BASE`]). The body and the `Link`
    /// header; any failure names the call and, on 401/403, the option to fix.
    pub(super) async fn get(
        &self,
        url: &str,
        credential: (&str, &str, &str),
        page_no: usize,
    ) -> Result<(Vec<u8>, Option<String>), ReconcileError> {
        let (auth_header, auth_value, option) = credential;
        let call = page_call(url, page_no);
        let mut pause = self.retry_base;
        let mut attempt = 1;
        loop {
            let error = match self.get_once(url, auth_header, auth_value).await {
                Ok(page) => return Ok(page),
                Err(PageError::Refused(status)) => {
                    return Err(ReconcileError::Page {
                        call,
                        reason: format!(
                            "provider API answered {status}: the credential was refused; check the tenant option `{option}`"
                        ),
                    })
                }
                Err(PageError::Permanent(reason)) => {
                    return Err(ReconcileError::Page { call, reason })
                }
                Err(PageError::Transient(reason)) => reason,
            };
            if attempt >= PAGE_ATTEMPTS {
                return Err(ReconcileError::Page {
                    call,
                    reason: format!("{error} (after {attempt} attempts)"),
                });
            }
            tracing::info!(call = %call, attempt, error = %error, "provider API page failed; retrying");
            tokio::time::sleep(pause).await;
            pause *= 2;
            attempt += 1;
        }
    }

    async fn get_once(
        &self,
        url: &str,
        auth_header: &str,
        auth_value: &str,
    ) -> Result<(Vec<u8>, Option<String>), PageError> {
        let request = http::Request::get(url)
            .header(auth_header, auth_value)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "einmal-reconcile")
            .body(Empty::<Bytes>::new())
            .map_err(|_| PageError::Permanent("cannot build the API request".into()))?;
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| PageError::Transient(format!("provider API unreachable: {e}")))?;
            let status = response.status();
            if status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN {
                return Err(PageError::Refused(status.as_u16()));
            }
            if !status.is_success() {
                return Err(match classify_status(status) {
                    LookupError::Transient(m) => PageError::Transient(m),
                    LookupError::Permanent(m) => PageError::Permanent(m),
                });
            }
            let link = response
                .headers()
                .get(http::header::LINK)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = Limited::new(response.into_body(), MAX_PAGE_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    PageError::Transient(format!("reading the provider API response: {e}"))
                })?;
            Ok((body.to_bytes().to_vec(), link))
        };
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(PageError::Transient(format!(
                "provider API timed out after {} ms",
                self.request_timeout.as_millis()
            ))),
        }
    }
}

/// Why one page request failed.
enum PageError {
    /// 5xx, 429, 408, timeout, connection: worth another attempt.
    Transient(String),
    /// 401 / 403: the credential.
    Refused(u16),
    /// Other 4xx and request errors.
    Permanent(String),
}

/// `GET {url without its query} (page n)`: names the call, never a credential.
fn page_call(url: &str, page_no: usize) -> String {
    let path = url.split('?').next().unwrap_or(url);
    format!("GET {path} (page {page_no})")
}

/// A `next` link to another host than the API base: not followed, so the run fails.
pub(super) fn foreign_next(
    current: &str,
    page_no: usize,
    next: &str,
    base: &str,
) -> ReconcileError {
    let next_host = next.split('?').next().unwrap_or(next);
    ReconcileError::Page {
        call: page_call(current, page_no),
        reason: format!(
            "its next page is on another host ({next_host}), not under the API base {base}; \
             not followed (the credential stays with the API base), so the pages after \
             this one are unread and the checkpoint is not moved"
        ),
    }
}
