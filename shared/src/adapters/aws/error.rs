//! AWS call failures, classified once. Every adapter method maps its `SdkError`
//! through [`describe`], so the wording and the classification live in one place.
//!
//! Callers of the ports only need one answer for all of these: the store or queue is
//! unavailable right now and the provider must retry (`StoreError::Unavailable` /
//! `QueueError::Unavailable`). The class goes into the message for operators.

use std::collections::HashMap;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::ports::StoreError;

/// An item as DynamoDB returns it.
pub(crate) type Attributes = HashMap<String, AttributeValue>;

/// A DynamoDB write error with a condition-failed variant that carries the old item.
pub(crate) trait ConditionFailed:
    ProvideErrorMetadata + std::error::Error + Sized + 'static
{
    const CALL: &'static str;
    fn is_condition_failed(&self) -> bool;
    /// The old item of the condition-failed variant, if DynamoDB returned it.
    fn old_item(self) -> Option<Attributes>;
}

macro_rules! condition_failed {
    ($error:ty, $call:literal) => {
        impl ConditionFailed for $error {
            const CALL: &'static str = $call;
            fn is_condition_failed(&self) -> bool {
                self.is_conditional_check_failed_exception()
            }
            fn old_item(self) -> Option<Attributes> {
                match self {
                    Self::ConditionalCheckFailedException(failed) => failed.item,
                    _ => None,
                }
            }
        }
    };
}
condition_failed!(PutItemError, "DynamoDB PutItem");
condition_failed!(UpdateItemError, "DynamoDB UpdateItem");

/// A failed conditional write: `Ok` with the item that was there (when the request asked
/// for it with `ReturnValuesOnConditionCheckFailure::AllOld`) if the condition failed,
/// any other failure as unavailable. Only a real failure is described: a duplicate
/// delivery refused on the receiver's ack path formats nothing.
pub(crate) fn refused<E: ConditionFailed>(
    err: SdkError<E, HttpResponse>,
) -> Result<Option<Attributes>, StoreError> {
    match err {
        SdkError::ServiceError(service) if service.err().is_condition_failed() => {
            Ok(service.into_err().old_item())
        }
        other => Err(StoreError::Unavailable(describe(E::CALL, &other))),
    }
}

/// Why a call failed, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Throttling or provisioned-throughput errors (HTTP 400/429 with a throttling code).
    Throttled,
    /// Our own timeouts (connect, attempt, operation).
    Timeout,
    /// No HTTP response at all: connection refused, reset, DNS, TLS.
    Connection,
    /// HTTP 5xx.
    Server,
    /// A response the SDK could not parse.
    BadResponse,
    /// The service refused the call (4xx): missing table, access denied, validation.
    Rejected,
    /// The SDK could not build the request.
    Request,
}

impl Failure {
    fn as_str(self) -> &'static str {
        match self {
            Failure::Throttled => "throttled",
            Failure::Timeout => "timed out",
            Failure::Connection => "connection failed",
            Failure::Server => "server error",
            Failure::BadResponse => "unreadable response",
            Failure::Rejected => "rejected",
            Failure::Request => "request could not be built",
        }
    }
}

/// Error codes that mean "slow down" across DynamoDB and SQS.
const THROTTLING_CODES: &[&str] = &[
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "Throttling",
    "ThrottledException",
    "TooManyRequestsException",
    "KMS.ThrottlingException",
];

/// Service messages are short, but cap them so a log line stays small.
const MAX_MESSAGE_CHARS: usize = 200;

pub(crate) fn classify<E>(err: &SdkError<E, HttpResponse>) -> Failure
where
    E: ProvideErrorMetadata,
{
    match err {
        SdkError::ConstructionFailure(_) => Failure::Request,
        SdkError::TimeoutError(_) => Failure::Timeout,
        SdkError::DispatchFailure(d) if d.is_timeout() => Failure::Timeout,
        SdkError::DispatchFailure(_) => Failure::Connection,
        SdkError::ResponseError(_) => Failure::BadResponse,
        SdkError::ServiceError(se) => {
            let status = se.raw().status();
            let code = se.err().code().unwrap_or_default();
            if status.as_u16() == 429 || THROTTLING_CODES.contains(&code) {
                Failure::Throttled
            } else if status.is_server_error() {
                Failure::Server
            } else {
                Failure::Rejected
            }
        }
        // `SdkError` is non-exhaustive; anything new is treated as transient.
        _ => Failure::Connection,
    }
}

/// One line for an operator: `"DynamoDB PutItem: throttled (HTTP 400, ThrottlingException): ..."`.
///
/// Only error metadata goes in, never request or item contents.
pub(crate) fn describe<E>(call: &str, err: &SdkError<E, HttpResponse>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let failure = classify(err);
    match err {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            let code = se.err().code().unwrap_or("unknown error");
            match se.err().message() {
                Some(msg) if !msg.is_empty() => format!(
                    "{call}: {} (HTTP {status}, {code}): {}",
                    failure.as_str(),
                    truncate(msg)
                ),
                _ => format!("{call}: {} (HTTP {status}, {code})", failure.as_str()),
            }
        }
        SdkError::ResponseError(re) => format!(
            "{call}: {} (HTTP {})",
            failure.as_str(),
            re.raw().status().as_u16()
        ),
        // The source chain names the cause (e.g. "Connection refused (os error 111)").
        _ => format!("{call}: {}: {}", failure.as_str(), truncate(&chain(err))),
    }
}

/// `outer: inner: root`, each level's Display once (unlike `DisplayErrorContext`,
/// which appends a Debug dump).
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        // Some layers repeat their source's message; print it once.
        if parts.last() != Some(&text) && !text.is_empty() {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_char_boundaries() {
        let long = "ä".repeat(MAX_MESSAGE_CHARS + 5);
        let t = truncate(&long);
        assert_eq!(t.chars().count(), MAX_MESSAGE_CHARS + 3);
        assert_eq!(truncate("short"), "short");
    }
}
