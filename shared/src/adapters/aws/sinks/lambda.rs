//! The Lambda kind: a synchronous `Invoke` per delivery.

use async_trait::async_trait;
use aws_sdk_lambda::error::SdkError;
use aws_sdk_lambda::operation::invoke::InvokeError;
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;

use super::{detail_json, seconds, short, sink_error};
use crate::destinations::config::LambdaDestination;
use crate::destinations::fields::Fields;
use crate::destinations::{Delivered, Message, Sink, SinkError};

/// Synchronous `Invoke` of one function (name, ARN or qualified ARN).
#[derive(Debug, Clone)]
pub struct LambdaSink {
    client: aws_sdk_lambda::Client,
    function: String,
}

impl LambdaSink {
    pub fn new(client: aws_sdk_lambda::Client, function: &str) -> Self {
        LambdaSink {
            client,
            function: function.to_string(),
        }
    }
}

#[async_trait]
impl Sink for LambdaSink {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError> {
        let payload = detail_json(message, true);
        let answer = self
            .client
            .invoke()
            .function_name(&self.function)
            .invocation_type(InvocationType::RequestResponse)
            .payload(Blob::new(payload.into_bytes()))
            .send()
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(err) => {
                let retry_after = match &err {
                    SdkError::ServiceError(se) => match se.err() {
                        InvokeError::TooManyRequestsException(e) => {
                            e.retry_after_seconds().and_then(seconds)
                        }
                        _ => None,
                    },
                    _ => None,
                };
                return Err(sink_error("Lambda Invoke", &err, retry_after));
            }
        };
        let status = u16::try_from(answer.status_code()).ok();
        if let Some(kind) = answer.function_error() {
            // The function ran and failed (a 200 with `X-Amz-Function-Error`): its own
            // error type names the cause; its message may carry the payload, so not it.
            let error_type = answer
                .payload()
                .and_then(|p| serde_json::from_slice::<serde_json::Value>(p.as_ref()).ok())
                .and_then(|v| v.get("errorType").and_then(|t| t.as_str()).map(short));
            let detail = match error_type {
                Some(t) => format!("Lambda Invoke: function error ({kind}, {t})"),
                None => format!("Lambda Invoke: function error ({kind})"),
            };
            return Err(SinkError::Retry {
                status,
                retry_after: None,
                detail,
            });
        }
        Ok(Delivered {
            status,
            note: answer.executed_version().map(|v| format!("version {v}")),
        })
    }
}

/// The options of kind `lambda`.
pub(crate) const LAMBDA_FIELDS: &[&str] = &["function"];

/// The options of kind `lambda`: the function.
pub(crate) fn parse_lambda(f: &mut Fields) -> Option<LambdaDestination> {
    let (line, function) = f.required_string("function")?;
    if function.trim().is_empty() {
        f.problem(line, "`function` is empty");
        return None;
    }
    Some(LambdaDestination { function })
}
