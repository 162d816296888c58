//! The AWS destinations: an SQS queue (standard or FIFO), an EventBridge bus
//! (`PutEvents`), a Lambda function (`Invoke`, `RequestResponse`). Each is a
//! [`Sink`]: one call per delivery, the answer classified once into
//! [`SinkError::Retry`] / [`SinkError::Permanent`] so the relay's policy never reads
//! strings.
//!
//! Build them with [`AwsSinkFactory`] from the process's one `SdkConfig` (endpoint,
//! region and credentials as every other AWS client here: `AWS_ENDPOINT_URL` points
//! them at moto or `cargo lambda watch` in tests). The SAM template grants exactly the
//! calls listed in [`SINK_ACTIONS`].
//!
//! What the consumer gets, so it can dedupe on the stable key (none of these services
//! dedupes for long: SQS FIFO for 5 minutes, EventBridge and Lambda not at all):
//! - SQS: the body as sent by the provider (base64 when SQS could not carry it, said so
//!   in `einmal-body-encoding`), message attributes [`SQS_ATTRIBUTES`]; on a FIFO queue
//!   `MessageGroupId` = `provider#tenant#object` ([`fifo_group_id`]) and
//!   `MessageDeduplicationId` = the key.
//! - EventBridge: `Source` = `einmal.{provider}`, `DetailType` = the event type, `Detail`
//!   = [`detail_json`].
//! - Lambda: the same JSON plus `detail-type`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
#[cfg(feature = "lambda")]
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::SdkConfig;
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::MessageAttributeValue;
use base64::Engine;
use serde::Serialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::error::{classify, describe, Failure};
use crate::destinations::config::SqsDestination;
use crate::destinations::fields::Fields;
use crate::destinations::http::config::shown_url;
use crate::destinations::{Delivered, Message, Sink, SinkError};
use crate::destinations::{DestinationConfig, DestinationKind};

// Each AWS kind beyond SQS in its file, behind its feature (a binary without it links no SDK of it).
#[cfg(feature = "eventbridge")]
mod eventbridge;
#[cfg(feature = "eventbridge")]
pub use eventbridge::{eventbridge_source, EventBridgeSink};
#[cfg(feature = "eventbridge")]
pub(crate) use eventbridge::{parse_eventbridge, EVENTBRIDGE_FIELDS};
#[cfg(feature = "lambda")]
mod lambda;
#[cfg(feature = "lambda")]
pub use lambda::LambdaSink;
#[cfg(feature = "lambda")]
pub(crate) use lambda::{parse_lambda, LAMBDA_FIELDS};

/// The IAM action of each AWS sink kind, by [`DestinationKind::name`]: the one call it
/// makes. The SAM template's destination statements grant exactly these.
pub const SINK_ACTIONS: &[(&str, &str)] = &[
    ("sqs", "sqs:SendMessage"),
    ("eventbridge", "events:PutEvents"),
    ("lambda", "lambda:InvokeFunction"),
];

/// Per-call bound of an SQS or EventBridge delivery (SDK retries of throttles included).
pub const DEFAULT_AWS_SINK_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-call bound of a Lambda delivery: the function runs inside the call.
pub const DEFAULT_LAMBDA_SINK_TIMEOUT: Duration = Duration::from_secs(30);

/// EventBridge's `PutEvents` limit: 256 KB for the request (the stricter of the two
/// readings of the docs), counted as `Time` (14) + `Source` + `DetailType` + `Detail`.
pub const EVENTBRIDGE_MAX_ENTRY_BYTES: usize = 256 * 1024;

/// SQS allows at most this many message attributes.
pub const SQS_MAX_ATTRIBUTES: usize = 10;

/// The message attributes an SQS delivery carries (at most these, each only when it has
/// a value): the key, the event's identity, the body's content type and encoding.
pub const SQS_ATTRIBUTES: &[&str] = &[
    ATTR_KEY,
    ATTR_PROVIDER,
    ATTR_TENANT,
    ATTR_EVENT_TYPE,
    ATTR_EVENT_ID,
    ATTR_OBJECT_ID,
    ATTR_OBJECT_VERSION,
    ATTR_OCCURRED_AT,
    ATTR_CONTENT_TYPE,
    ATTR_BODY_ENCODING,
];
pub const ATTR_KEY: &str = "einmal-key";
pub const ATTR_PROVIDER: &str = "einmal-provider";
pub const ATTR_TENANT: &str = "einmal-tenant";
pub const ATTR_EVENT_TYPE: &str = "einmal-event-type";
pub const ATTR_EVENT_ID: &str = "einmal-event-id";
pub const ATTR_OBJECT_ID: &str = "einmal-object-id";
pub const ATTR_OBJECT_VERSION: &str = "einmal-object-version";
/// Unix seconds, a `Number` attribute.
pub const ATTR_OCCURRED_AT: &str = "einmal-occurred-at";
pub const ATTR_CONTENT_TYPE: &str = "einmal-content-type";
/// `base64` when the body is not text SQS accepts; absent otherwise.
pub const ATTR_BODY_ENCODING: &str = "einmal-body-encoding";

/// `MessageGroupId`: up to 128 characters (SQS).
const MAX_GROUP_ID_CHARS: usize = 128;

/// A destination the factory cannot build. Configuration errors, so each names its
/// destination.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AwsSinkError {
    #[error("destination {destination}: kind {kind} is not an AWS destination")]
    NotAws {
        destination: String,
        kind: &'static str,
    },
    #[error(
        "destination {destination}: queue_url {url:?} is not an SQS queue URL \
         (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)"
    )]
    BadQueueUrl { destination: String, url: String },
    #[error("destination {destination}: {field} is empty")]
    Empty {
        destination: String,
        field: &'static str,
    },
}
/// How a process loads its SDK configuration (the binary's own loader: the library
/// has one, `AwsStore::from_env`, for the Lambdas).
pub type SdkLoader = Box<dyn Fn() -> futures::future::BoxFuture<'static, SdkConfig> + Send + Sync>;

/// The AWS kinds' sink factory of a process: on the SDK configuration a Lambda already
/// holds, or (`einmal serve`) on one loaded when the first AWS destination is built,
/// so a `serve` without one never reads the AWS environment.
pub enum AwsSinks {
    Given(AwsSinkFactory),
    OnFirstUse(tokio::sync::OnceCell<AwsSinkFactory>, SdkLoader),
}

impl AwsSinks {
    pub fn given(sdk: &SdkConfig) -> Self {
        AwsSinks::Given(AwsSinkFactory::new(sdk))
    }

    pub fn loaded_on_first_use(load: SdkLoader) -> Self {
        AwsSinks::OnFirstUse(tokio::sync::OnceCell::new(), load)
    }

    pub async fn factory(&self) -> &AwsSinkFactory {
        match self {
            AwsSinks::Given(factory) => factory,
            AwsSinks::OnFirstUse(cell, load) => {
                cell.get_or_init(|| async { AwsSinkFactory::new(&load().await) })
                    .await
            }
        }
    }
}

/// Builds the sinks of the AWS kinds on one SDK config: one client per service, shared
/// by every destination of that kind (and their connection pool with the rest of the
/// process).
#[derive(Debug, Clone)]
pub struct AwsSinkFactory {
    sqs: aws_sdk_sqs::Client,
    #[cfg(feature = "eventbridge")]
    eventbridge: aws_sdk_eventbridge::Client,
    #[cfg(feature = "lambda")]
    lambda: aws_sdk_lambda::Client,
}

impl AwsSinkFactory {
    /// Default per-call bounds ([`DEFAULT_AWS_SINK_TIMEOUT`],
    /// [`DEFAULT_LAMBDA_SINK_TIMEOUT`]).
    pub fn new(sdk: &SdkConfig) -> Self {
        Self::with_timeouts(sdk, DEFAULT_AWS_SINK_TIMEOUT, DEFAULT_LAMBDA_SINK_TIMEOUT)
    }

    pub fn with_timeouts(sdk: &SdkConfig, aws: Duration, lambda: Duration) -> Self {
        let bounded =
            |timeout: Duration| TimeoutConfig::builder().operation_timeout(timeout).build();
        let sqs = aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(bounded(aws))
            .build();
        #[cfg(feature = "eventbridge")]
        let eventbridge = aws_sdk_eventbridge::config::Builder::from(sdk)
            .timeout_config(bounded(aws))
            .build();
        // Every attempt runs the user's function: the relay decides about another one
        // (with its backoff and its record), never the SDK behind its back.
        #[cfg(feature = "lambda")]
        let lambda = aws_sdk_lambda::config::Builder::from(sdk)
            .timeout_config(bounded(lambda))
            .retry_config(RetryConfig::disabled())
            .build();
        #[cfg(not(feature = "lambda"))]
        let _ = lambda;
        AwsSinkFactory {
            sqs: aws_sdk_sqs::Client::from_conf(sqs),
            #[cfg(feature = "eventbridge")]
            eventbridge: aws_sdk_eventbridge::Client::from_conf(eventbridge),
            #[cfg(feature = "lambda")]
            lambda: aws_sdk_lambda::Client::from_conf(lambda),
        }
    }

    /// Whether this factory builds sinks of `kind`.
    pub fn handles(kind: &DestinationKind) -> bool {
        matches!(
            kind,
            DestinationKind::Sqs(_) | DestinationKind::EventBridge(_) | DestinationKind::Lambda(_)
        )
    }

    /// The sink of one destination of an AWS kind. No AWS call is made: a missing
    /// queue or function shows on the first delivery, as a permanent failure.
    pub fn build(&self, destination: &DestinationConfig) -> Result<Arc<dyn Sink>, AwsSinkError> {
        let name = &destination.name;
        #[cfg(any(feature = "eventbridge", feature = "lambda"))]
        let empty = |field| AwsSinkError::Empty {
            destination: name.clone(),
            field,
        };
        match &destination.kind {
            DestinationKind::Sqs(sqs) => {
                if !is_queue_url(&sqs.queue_url) {
                    return Err(AwsSinkError::BadQueueUrl {
                        destination: name.clone(),
                        url: sqs.queue_url.clone(),
                    });
                }
                Ok(Arc::new(SqsSink::new(self.sqs.clone(), &sqs.queue_url)))
            }
            #[cfg(feature = "eventbridge")]
            DestinationKind::EventBridge(eb) => {
                if eb.bus.trim().is_empty() {
                    return Err(empty("bus"));
                }
                Ok(Arc::new(EventBridgeSink::new(
                    self.eventbridge.clone(),
                    &eb.bus,
                )))
            }
            #[cfg(feature = "lambda")]
            DestinationKind::Lambda(lambda) => {
                if lambda.function.trim().is_empty() {
                    return Err(empty("function"));
                }
                Ok(Arc::new(LambdaSink::new(
                    self.lambda.clone(),
                    &lambda.function,
                )))
            }
            other => Err(AwsSinkError::NotAws {
                destination: name.clone(),
                kind: other.name(),
            }),
        }
    }
}

/// The options of kind `sqs`.
pub(crate) const SQS_FIELDS: &[&str] = &["queue_url"];

/// The options of kind `sqs`: the queue's URL.
pub(crate) fn parse_sqs(f: &mut Fields) -> Option<SqsDestination> {
    let (line, queue_url) = f.required_string("queue_url")?;
    if !(queue_url.starts_with("https://") || queue_url.starts_with("http://"))
        || queue_url.parse::<http::Uri>().is_err()
    {
        f.problem(line, format!("`queue_url` must be the queue's URL (https://sqs.<region>.amazonaws.com/<account>/<name>), not `{}`", shown_url(&queue_url)));
        return None;
    }
    Some(SqsDestination { queue_url })
}

/// `http(s)://host/ACCOUNT/NAME`: the SDK sends the URL as a parameter, the service
/// answers for a missing queue.
fn is_queue_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && !p.contains(char::is_whitespace))
}

// ---------------------------------------------------------------------------------------
// SQS

/// `SendMessage` to one queue; FIFO when the URL ends in `.fifo`.
#[derive(Debug, Clone)]
pub struct SqsSink {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    fifo: bool,
}

impl SqsSink {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: &str) -> Self {
        SqsSink {
            client,
            queue_url: queue_url.to_string(),
            fifo: queue_url.ends_with(".fifo"),
        }
    }
}

#[async_trait]
impl Sink for SqsSink {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError> {
        let (body, base64) = sqs_body(&message.body);
        if body.is_empty() {
            return Err(SinkError::Permanent {
                status: None,
                detail: "SQS SendMessage: the body is empty, which SQS does not accept".into(),
            });
        }
        let mut request = self
            .client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body);
        for (name, value) in sqs_attributes(message, base64) {
            request = request.message_attributes(name, value);
        }
        if self.fifo {
            request = request
                .message_group_id(fifo_group_id(message))
                .message_deduplication_id(&message.key);
        }
        match request.send().await {
            Ok(sent) => Ok(Delivered {
                status: None,
                note: sent.message_id().map(|id| format!("message {id}")),
            }),
            Err(err) => Err(sink_error("SQS SendMessage", &err, None)),
        }
    }
}

/// Characters SQS accepts in a body or string attribute.
fn sqs_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// The body as SQS text, and whether it had to be base64-encoded (not UTF-8, or a
/// character SQS refuses, such as NUL).
fn sqs_body(body: &[u8]) -> (String, bool) {
    match std::str::from_utf8(body) {
        Ok(text) if text.chars().all(sqs_char) => (text.to_string(), false),
        _ => (base64::engine::general_purpose::STANDARD.encode(body), true),
    }
}

fn sqs_attributes(message: &Message, base64: bool) -> Vec<(&'static str, MessageAttributeValue)> {
    let occurred_at = message.occurred_at.map(|t| t.to_string());
    let texts = [
        (ATTR_KEY, Some(message.key.as_str())),
        (ATTR_PROVIDER, Some(message.provider.as_str())),
        (ATTR_TENANT, Some(message.tenant.as_str())),
        (ATTR_EVENT_TYPE, Some(message.event_type.as_str())),
        (ATTR_EVENT_ID, Some(message.event_id.as_str())),
        (ATTR_OBJECT_ID, message.object_id.as_deref()),
        (ATTR_OBJECT_VERSION, message.object_version.as_deref()),
        (ATTR_CONTENT_TYPE, Some(message.content_type.as_str())),
        (ATTR_BODY_ENCODING, base64.then_some("base64")),
    ];
    let mut attributes: Vec<(&'static str, MessageAttributeValue)> = texts
        .into_iter()
        .filter_map(|(name, value)| {
            // SQS refuses empty values; a character it refuses becomes U+FFFD.
            let value: String = value?
                .chars()
                .map(|c| if sqs_char(c) { c } else { '\u{FFFD}' })
                .collect();
            if value.is_empty() {
                return None;
            }
            Some((name, attribute("String", value)?))
        })
        .collect();
    if let Some(value) = occurred_at.and_then(|t| attribute("Number", t)) {
        attributes.push((ATTR_OCCURRED_AT, value));
    }
    attributes
}

/// `None` only if the SDK refused the value (it requires just `data_type`, always set).
fn attribute(data_type: &str, value: String) -> Option<MessageAttributeValue> {
    MessageAttributeValue::builder()
        .data_type(data_type)
        .string_value(value)
        .build()
        .ok()
}

/// The FIFO message group: events of one object in order, other objects in parallel.
/// `provider#tenant#object_id`, or `provider#tenant#event_id` for an event without an
/// object. An id SQS would refuse (over 128 characters, or characters other than ASCII
/// letters, digits and punctuation) is replaced by `provider#tenant#sha256:HEX` of it, or
/// by `sha256:HEX` alone when even that would not fit: stable, so order still holds.
pub fn fifo_group_id(message: &Message) -> String {
    let object = message.object_id.as_deref().unwrap_or(&message.event_id);
    let group = format!("{}#{}#{object}", message.provider, message.tenant);
    if group_id_ok(&group) {
        return group;
    }
    let hash = format!("sha256:{}", hex::encode(Sha256::digest(group.as_bytes())));
    let prefixed = format!("{}#{}#{hash}", message.provider, message.tenant);
    if group_id_ok(&prefixed) {
        prefixed
    } else {
        hash
    }
}

fn group_id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_GROUP_ID_CHARS && id.chars().all(|c| c.is_ascii_graphic())
}

// ---------------------------------------------------------------------------------------
// Shared parts

/// The body inside the JSON of EventBridge and Lambda: the provider's JSON as it is
/// (numbers untouched), else text, else base64.
#[derive(Serialize)]
#[serde(untagged)]
enum BodyValue<'a> {
    Json(&'a RawValue),
    Text(&'a str),
    Base64(String),
}

#[derive(Serialize)]
struct Detail<'a> {
    #[serde(rename = "detail-type", skip_serializing_if = "Option::is_none")]
    detail_type: Option<&'a str>,
    key: &'a str,
    provider: &'a str,
    tenant: &'a str,
    event_id: &'a str,
    object_id: Option<&'a str>,
    object_version: Option<&'a str>,
    occurred_at: Option<i64>,
    content_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_encoding: Option<&'static str>,
    body: BodyValue<'a>,
}

/// EventBridge's `Detail` (and with `detail-type`, the Lambda payload):
/// `{"key", "provider", "tenant", "event_id", "object_id", "object_version",
/// "occurred_at", "content_type", "body"}`; `body` is the original body as a JSON value,
/// or a string when it is not JSON (then `"body_encoding": "base64"` if it is not
/// UTF-8 either).
pub fn detail_json(message: &Message, with_detail_type: bool) -> String {
    let text = std::str::from_utf8(&message.body).ok();
    let raw = text.and_then(|t| serde_json::from_str::<&RawValue>(t).ok());
    let (body, body_encoding) = match (raw, text) {
        (Some(json), _) => (BodyValue::Json(json), None),
        (None, Some(text)) => (BodyValue::Text(text), None),
        (None, None) => (
            BodyValue::Base64(base64::engine::general_purpose::STANDARD.encode(&message.body)),
            Some("base64"),
        ),
    };
    let detail = Detail {
        detail_type: with_detail_type.then_some(message.event_type.as_str()),
        key: &message.key,
        provider: &message.provider,
        tenant: &message.tenant,
        event_id: &message.event_id,
        object_id: message.object_id.as_deref(),
        object_version: message.object_version.as_deref(),
        occurred_at: message.occurred_at,
        content_type: &message.content_type,
        body_encoding,
        body,
    };
    // Borrowed strings and a checked raw value: serialising cannot fail.
    serde_json::to_string(&detail).unwrap_or_else(|_| String::from("{}"))
}

/// An SDK failure as a sink error: throttles, timeouts, connection failures, 5xx and
/// the conflicts 408/409 (a function being updated) are worth another attempt; the
/// service's other refusals (a missing queue or function, access denied, too large,
/// invalid contents) fail the same way every time. A request the SDK could not build
/// (credentials not loaded yet, most likely) is retried too: bounded by the relay.
fn sink_error<E>(
    call: &str,
    err: &SdkError<E, HttpResponse>,
    retry_after: Option<Duration>,
) -> SinkError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let detail = describe(call, err);
    let (status, header_retry_after) = match err {
        SdkError::ServiceError(se) => (
            Some(se.raw().status().as_u16()),
            retry_after_header(se.raw()),
        ),
        SdkError::ResponseError(re) => (Some(re.raw().status().as_u16()), None),
        _ => (None, None),
    };
    let retry_after = retry_after.or(header_retry_after);
    match classify(err) {
        Failure::Rejected if !matches!(status, Some(408 | 409)) => {
            SinkError::Permanent { status, detail }
        }
        _ => SinkError::Retry {
            status,
            retry_after,
            detail,
        },
    }
}

fn retry_after_header(response: &HttpResponse) -> Option<Duration> {
    response.headers().get("retry-after").and_then(seconds)
}

/// Delay-seconds (`Retry-After`, `retryAfterSeconds`); an HTTP date is left to the
/// relay's own backoff.
fn seconds(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(any(feature = "eventbridge", feature = "lambda"))]
fn short(text: &str) -> String {
    const MAX: usize = 120;
    match text.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> Message {
        Message {
            key: "msg_0123456789abcdef0123456789abcdef".into(),
            destination: "queue".into(),
            provider: "stripe".into(),
            tenant: "demo".into(),
            event_id: "evt_1".into(),
            event_type: "payment_intent.succeeded".into(),
            object_id: Some("pi_1".into()),
            object_version: Some("3".into()),
            occurred_at: Some(1_700_000_000),
            body: br#"{"id":"evt_1","amount":12345678901234567890}"#.to_vec(),
            content_type: "application/json".into(),
        }
    }

    #[test]
    fn attributes_stay_within_the_sqs_limit() {
        assert!(SQS_ATTRIBUTES.len() <= SQS_MAX_ATTRIBUTES);
        let attributes = sqs_attributes(&message(), true);
        assert_eq!(attributes.len(), SQS_ATTRIBUTES.len());
        for (name, _) in &attributes {
            assert!(SQS_ATTRIBUTES.contains(name), "{name}");
        }
    }

    #[test]
    fn attributes_skip_empty_values_and_replace_refused_characters() {
        let mut m = message();
        m.object_id = None;
        m.object_version = Some(String::new());
        m.event_type = "a\u{0}b".into();
        let attributes = sqs_attributes(&m, false);
        let names: Vec<&str> = attributes.iter().map(|(n, _)| *n).collect();
        assert!(!names.contains(&ATTR_OBJECT_ID) && !names.contains(&ATTR_OBJECT_VERSION));
        assert!(!names.contains(&ATTR_BODY_ENCODING));
        let event_type = attributes
            .iter()
            .find(|(n, _)| *n == ATTR_EVENT_TYPE)
            .unwrap();
        assert_eq!(event_type.1.string_value(), Some("a\u{FFFD}b"));
    }

    #[test]
    fn bodies_sqs_cannot_carry_are_base64() {
        assert_eq!(sqs_body(b"{\"a\":1}\n"), ("{\"a\":1}\n".to_string(), false));
        assert_eq!(sqs_body(&[0xff, 0x00]), ("/wA=".to_string(), true));
        // Valid UTF-8, but NUL is not an SQS character.
        assert_eq!(sqs_body(b"a\0b"), ("YQBi".to_string(), true));
    }

    #[test]
    fn fifo_groups_are_per_object_and_fit_sqs() {
        let m = message();
        assert_eq!(fifo_group_id(&m), "stripe#demo#pi_1");
        let mut no_object = message();
        no_object.object_id = None;
        assert_eq!(fifo_group_id(&no_object), "stripe#demo#evt_1");
        let mut long = message();
        long.object_id = Some("x".repeat(200));
        let group = fifo_group_id(&long);
        assert!(
            group.starts_with("stripe#demo#sha256:") && group.len() <= 128,
            "{group}"
        );
        assert_eq!(group, fifo_group_id(&long), "stable");
        let mut odd = message();
        odd.object_id = Some("ordre é".into());
        assert!(fifo_group_id(&odd).chars().all(|c| c.is_ascii_graphic()));
        let mut huge_tenant = message();
        huge_tenant.tenant = "t".repeat(150);
        let group = fifo_group_id(&huge_tenant);
        assert!(group.starts_with("sha256:") && group.len() == 71, "{group}");
    }

    #[test]
    fn detail_keeps_the_json_body_exactly() {
        let detail: serde_json::Value =
            serde_json::from_str(&detail_json(&message(), false)).unwrap();
        assert_eq!(detail["key"], "msg_0123456789abcdef0123456789abcdef");
        assert_eq!(detail["object_version"], "3");
        assert_eq!(detail["occurred_at"], 1_700_000_000);
        assert!(detail.get("detail-type").is_none());
        let text = detail_json(&message(), true);
        assert!(
            text.contains(r#""body":{"id":"evt_1","amount":12345678901234567890}"#),
            "{text}"
        );
        assert!(text.contains(r#""detail-type":"payment_intent.succeeded""#));
    }

    #[test]
    fn detail_carries_other_bodies_as_strings() {
        let mut form = message();
        form.body = b"a=1&b=2".to_vec();
        let detail: serde_json::Value = serde_json::from_str(&detail_json(&form, false)).unwrap();
        assert_eq!(detail["body"], "a=1&b=2");
        assert!(detail.get("body_encoding").is_none());
        let mut binary = message();
        binary.body = vec![0xff, 0xfe];
        let detail: serde_json::Value = serde_json::from_str(&detail_json(&binary, false)).unwrap();
        assert_eq!(detail["body"], "//4=");
        assert_eq!(detail["body_encoding"], "base64");
    }

    #[test]
    fn queue_urls_are_checked() {
        assert!(is_queue_url(
            "https://sqs.eu-west-1.amazonaws.com/123456789012/q.fifo"
        ));
        assert!(is_queue_url("http://127.0.0.1:5000/123456789012/q"));
        assert!(!is_queue_url("sqs://q"));
        assert!(!is_queue_url("https://sqs.eu-west-1.amazonaws.com/q"));
        assert!(!is_queue_url("https://sqs.eu-west-1.amazonaws.com/1/q/"));
    }

    #[test]
    fn retry_after_takes_delay_seconds() {
        assert_eq!(seconds(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(seconds("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}
