//! The AWS sinks (`einmal::adapters::aws::sinks`) against real servers:
//!
//! - SQS standard (moto): the message arrives with the body and the attributes; a body
//!   SQS cannot carry arrives base64, said so;
//! - SQS FIFO (moto): `MessageGroupId` = `provider#tenant#object`,
//!   `MessageDeduplicationId` = the key, and a second delivery of the same key while the
//!   first is still queued is not delivered twice;
//! - a queue that does not exist is a permanent failure;
//! - EventBridge (moto): a bus with a rule whose target is an SQS queue; the event read
//!   from that queue has `einmal.{provider}` as source, the event type as detail-type
//!   and the key and body in its detail; an event over the `PutEvents` limit is
//!   permanent without a call;
//! - Lambda (`cargo lambda watch`, as `lambda_watch` runs it): `echo-destination`
//!   (tests/echo-destination) receives the payload and answers, so the sink reports delivered;
//!   for a key it refuses, its function error is a retry.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use base64::Engine;
use einmal::adapters::aws::sinks::{
    AwsSinkFactory, ATTR_BODY_ENCODING, ATTR_EVENT_ID, ATTR_EVENT_TYPE, ATTR_KEY, ATTR_OBJECT_ID,
    ATTR_OBJECT_VERSION, ATTR_OCCURRED_AT, ATTR_PROVIDER, ATTR_TENANT, DEFAULT_AWS_SINK_TIMEOUT,
    EVENTBRIDGE_MAX_ENTRY_BYTES,
};
use einmal::destinations::config::{
    EventBridgeDestination, LambdaDestination, SqsDestination, DEFAULT_MAX_AGE_SECS,
    DEFAULT_MAX_ATTEMPTS,
};
use einmal::destinations::{
    delivery_key, Delivered, DestinationConfig, DestinationKind, Message, Sink, SinkError,
};
use einmal_tests::moto::{unique_name, Moto};
use serde_json::Value;

use crate::lambda_watch::{
    cargo_lambda_or_skip, free_port, root, tail, Group, FIRST_INVOKE_TIMEOUT,
};

fn destination(name: &str, kind: DestinationKind) -> DestinationConfig {
    DestinationConfig {
        name: name.to_string(),
        tenant: "demo".into(),
        provider: None,
        events: vec!["*".into()],
        outputs: vec![],
        ordered: false,
        max_attempts: DEFAULT_MAX_ATTEMPTS,
        max_age: Duration::from_secs(DEFAULT_MAX_AGE_SECS),
        kind,
    }
}

fn message(destination: &str, event_id: &str, object_id: Option<&str>) -> Message {
    let body = format!(
        r#"{{"id":"{event_id}","type":"payment_intent.succeeded","amount":12345678901234567890}}"#
    );
    Message {
        key: delivery_key(
            destination,
            "stripe",
            "demo",
            &format!("stripe#demo#{event_id}"),
        ),
        destination: destination.to_string(),
        provider: "stripe".into(),
        tenant: "demo".into(),
        event_id: event_id.to_string(),
        event_type: "payment_intent.succeeded".into(),
        object_id: object_id.map(str::to_string),
        object_version: object_id.map(|_| "1700000001".to_string()),
        occurred_at: Some(1_700_000_001),
        body: body.into_bytes(),
        content_type: "application/json".into(),
    }
}

async fn create_queue(sqs: &aws_sdk_sqs::Client, name: &str) -> String {
    let mut request = sqs.create_queue().queue_name(name);
    if name.ends_with(".fifo") {
        request = request.attributes(QueueAttributeName::FifoQueue, "true");
    }
    request
        .send()
        .await
        .expect("create queue on moto")
        .queue_url()
        .expect("queue url")
        .to_string()
}

/// Every message now in the queue (moto answers at once), each deleted after reading.
async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> Vec<aws_sdk_sqs::types::Message> {
    let mut all = Vec::new();
    loop {
        let received = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .expect("receive from moto");
        let messages = received.messages().to_vec();
        if messages.is_empty() {
            return all;
        }
        for m in &messages {
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(m.receipt_handle().expect("receipt handle"))
                .send()
                .await
                .expect("delete on moto");
        }
        all.extend(messages);
    }
}

fn attr<'a>(m: &'a aws_sdk_sqs::types::Message, name: &str) -> Option<&'a str> {
    m.message_attributes()
        .and_then(|a| a.get(name))
        .and_then(|v| v.string_value())
}

fn system_attr(m: &aws_sdk_sqs::types::Message, name: MessageSystemAttributeName) -> Option<&str> {
    m.attributes()
        .and_then(|a| a.get(&name))
        .map(String::as_str)
}

fn expect_delivered(result: Result<Delivered, SinkError>, what: &str) -> Delivered {
    result.unwrap_or_else(|e| panic!("{what}: not delivered: {e}"))
}

#[tokio::test]
async fn sqs_standard_gets_the_body_and_the_attributes() {
    let moto = Moto::shared();
    let sdk = moto.sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let url = create_queue(&sqs, &unique_name("dest")).await;
    let factory = AwsSinkFactory::new(&sdk);
    let sink = factory
        .build(&destination(
            "orders",
            DestinationKind::Sqs(SqsDestination {
                queue_url: url.clone(),
            }),
        ))
        .expect("an SQS sink");

    let sent = message("orders", "evt_std_1", Some("pi_1"));
    let delivered = expect_delivered(sink.deliver(&sent).await, "SQS standard");
    assert!(
        delivered
            .note
            .as_deref()
            .is_some_and(|n| n.starts_with("message ")),
        "{delivered:?}"
    );
    // Not UTF-8: base64, and the attribute says so.
    let mut binary = message("orders", "evt_std_2", None);
    binary.body = vec![0xff, 0x00, 0x01];
    binary.content_type = "application/octet-stream".into();
    expect_delivered(sink.deliver(&binary).await, "SQS standard, binary body");

    let received = drain(&sqs, &url).await;
    assert_eq!(received.len(), 2, "{received:?}");
    let text = received
        .iter()
        .find(|m| attr(m, ATTR_EVENT_ID) == Some("evt_std_1"))
        .expect("the JSON event arrived");
    assert_eq!(text.body().map(str::as_bytes), Some(sent.body.as_slice()));
    assert_eq!(attr(text, ATTR_KEY), Some(sent.key.as_str()));
    assert_eq!(attr(text, ATTR_PROVIDER), Some("stripe"));
    assert_eq!(attr(text, ATTR_TENANT), Some("demo"));
    assert_eq!(
        attr(text, ATTR_EVENT_TYPE),
        Some("payment_intent.succeeded")
    );
    assert_eq!(attr(text, ATTR_OBJECT_ID), Some("pi_1"));
    assert_eq!(attr(text, ATTR_OBJECT_VERSION), Some("1700000001"));
    assert_eq!(attr(text, ATTR_OCCURRED_AT), Some("1700000001"));
    assert_eq!(attr(text, ATTR_BODY_ENCODING), None);
    assert!(system_attr(text, MessageSystemAttributeName::MessageGroupId).is_none());

    let bin = received
        .iter()
        .find(|m| attr(m, ATTR_EVENT_ID) == Some("evt_std_2"))
        .expect("the binary event arrived");
    assert_eq!(attr(bin, ATTR_BODY_ENCODING), Some("base64"));
    assert_eq!(attr(bin, ATTR_OBJECT_ID), None, "no object, no attribute");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(bin.body().unwrap_or_default())
        .expect("base64 body");
    assert_eq!(decoded, binary.body);
}

#[tokio::test]
async fn sqs_fifo_groups_by_object_and_dedups_on_the_key() {
    let moto = Moto::shared();
    let sdk = moto.sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let url = create_queue(&sqs, &format!("{}.fifo", unique_name("dest"))).await;
    let sink = AwsSinkFactory::new(&sdk)
        .build(&destination(
            "ledger",
            DestinationKind::Sqs(SqsDestination {
                queue_url: url.clone(),
            }),
        ))
        .expect("an SQS sink");

    let first = message("ledger", "evt_fifo_1", Some("pi_9"));
    let no_object = message("ledger", "evt_fifo_2", None);
    expect_delivered(sink.deliver(&first).await, "FIFO");
    // The relay's retry after a lost answer: same key, inside SQS's 5 minutes, while
    // the first copy is still queued (moto's dedup window compares with those).
    expect_delivered(sink.deliver(&first).await, "FIFO resend");
    expect_delivered(sink.deliver(&no_object).await, "FIFO without object");

    let received = drain(&sqs, &url).await;
    let of = |event_id: &str| {
        received
            .iter()
            .filter(|m| attr(m, ATTR_EVENT_ID) == Some(event_id))
            .collect::<Vec<_>>()
    };
    let firsts = of("evt_fifo_1");
    assert_eq!(
        firsts.len(),
        1,
        "the resend was delivered again: {received:?}"
    );
    let m = firsts[0];
    assert_eq!(
        system_attr(m, MessageSystemAttributeName::MessageGroupId),
        Some("stripe#demo#pi_9")
    );
    assert_eq!(
        system_attr(m, MessageSystemAttributeName::MessageDeduplicationId),
        Some(first.key.as_str())
    );
    let seconds = of("evt_fifo_2");
    assert_eq!(seconds.len(), 1, "{received:?}");
    assert_eq!(
        system_attr(seconds[0], MessageSystemAttributeName::MessageGroupId),
        Some("stripe#demo#evt_fifo_2")
    );
    assert_eq!(received.len(), 2, "{received:?}");
}

#[tokio::test]
async fn a_missing_queue_is_permanent() {
    let moto = Moto::shared();
    let sdk = moto.sdk_config().await;
    let url = format!("{}/123456789012/{}", moto.endpoint, unique_name("absent"));
    let sink = AwsSinkFactory::new(&sdk)
        .build(&destination(
            "gone",
            DestinationKind::Sqs(SqsDestination { queue_url: url }),
        ))
        .expect("an SQS sink");
    match sink.deliver(&message("gone", "evt_gone", None)).await {
        Err(SinkError::Permanent { status, detail }) => {
            assert_eq!(status, Some(400), "{detail}");
            assert!(detail.contains("SQS SendMessage"), "{detail}");
        }
        other => panic!("a missing queue must be permanent: {other:?}"),
    }
}

#[tokio::test]
async fn bad_aws_destinations_are_refused_by_name() {
    let sdk = Moto::shared().sdk_config().await;
    let factory = AwsSinkFactory::new(&sdk);
    let err = factory
        .build(&destination(
            "typo",
            DestinationKind::Sqs(SqsDestination {
                queue_url: "orders-queue".into(),
            }),
        ))
        .err()
        .expect("not a queue URL");
    assert!(err.to_string().contains("destination typo"), "{err}");
    let err = factory
        .build(&destination(
            "nobus",
            DestinationKind::EventBridge(EventBridgeDestination { bus: " ".into() }),
        ))
        .err()
        .expect("an empty bus");
    assert!(
        err.to_string().contains("destination nobus: bus is empty"),
        "{err}"
    );
}

#[tokio::test]
async fn eventbridge_events_reach_a_rule_target_with_the_key() {
    let moto = Moto::shared();
    let sdk = moto.sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let events = aws_sdk_eventbridge::Client::new(&sdk);
    let bus = unique_name("bus");
    events
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .expect("create bus on moto");
    let target_url = create_queue(&sqs, &unique_name("bus-target")).await;
    let target_arn = sqs
        .get_queue_attributes()
        .queue_url(&target_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("queue attributes")
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .expect("queue ARN");
    let rule = unique_name("rule");
    events
        .put_rule()
        .name(&rule)
        .event_bus_name(&bus)
        .event_pattern(r#"{"source":["einmal.stripe"]}"#)
        .send()
        .await
        .expect("put rule on moto");
    events
        .put_targets()
        .rule(&rule)
        .event_bus_name(&bus)
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id("queue")
                .arn(target_arn)
                .build()
                .expect("target"),
        )
        .send()
        .await
        .expect("put targets on moto");

    let sink = AwsSinkFactory::new(&sdk)
        .build(&destination(
            "bus",
            DestinationKind::EventBridge(EventBridgeDestination { bus: bus.clone() }),
        ))
        .expect("an EventBridge sink");
    let sent = message("bus", "evt_eb_1", Some("pi_eb"));
    let delivered = expect_delivered(sink.deliver(&sent).await, "EventBridge");
    assert!(
        delivered
            .note
            .as_deref()
            .is_some_and(|n| n.starts_with("event ")),
        "{delivered:?}"
    );

    let received = drain(&sqs, &target_url).await;
    assert_eq!(received.len(), 1, "{received:?}");
    let event: Value =
        serde_json::from_str(received[0].body().unwrap_or_default()).expect("event JSON");
    assert_eq!(event["source"], "einmal.stripe", "{event}");
    assert_eq!(event["detail-type"], "payment_intent.succeeded", "{event}");
    let detail = &event["detail"];
    assert_eq!(detail["key"], sent.key.as_str(), "{event}");
    assert_eq!(detail["provider"], "stripe");
    assert_eq!(detail["tenant"], "demo");
    assert_eq!(detail["event_id"], "evt_eb_1");
    assert_eq!(detail["object_id"], "pi_eb");
    assert_eq!(detail["object_version"], "1700000001");
    assert_eq!(detail["occurred_at"], 1_700_000_001);
    assert_eq!(
        detail["body"]["id"], "evt_eb_1",
        "the body is JSON in the detail: {event}"
    );

    // Over the PutEvents limit: refused before any call, permanently.
    let mut huge = message("bus", "evt_eb_huge", None);
    huge.body = format!("\"{}\"", "x".repeat(EVENTBRIDGE_MAX_ENTRY_BYTES)).into_bytes();
    match sink.deliver(&huge).await {
        Err(SinkError::Permanent { detail, .. }) => assert!(detail.contains("limit"), "{detail}"),
        other => panic!("an oversized event must be permanent: {other:?}"),
    }
    assert!(drain(&sqs, &target_url).await.is_empty());
}

/// `echo-destination` under `cargo lambda watch`: delivered for a normal key (and the
/// function saw the payload), a retry for the key it refuses.
#[test]
fn lambda_invoke_delivers_and_a_function_error_is_a_retry() {
    let Some(bin) = cargo_lambda_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let seen = dir.path().join("seen");
    std::fs::create_dir(&seen).expect("seen dir");
    let good = message("fn", "evt_fn_ok", Some("pi_fn"));
    let bad = message("fn", "evt_fn_bad", Some("pi_fn"));

    let port = free_port();
    let log = dir.path().join("watch.log");
    let log_file = std::fs::File::create(&log).expect("watch log");
    let mut command = Command::new(&bin);
    command
        .args([
            "lambda",
            "watch",
            "--ignore-changes",
            "--invoke-address",
            "127.0.0.1",
        ])
        .args(["--invoke-port", &port.to_string()])
        .current_dir(root())
        .env("EINMAL_ECHO_DIR", &seen)
        .env("EINMAL_ECHO_FAIL_KEYS", &bad.key)
        .env("RUST_LOG", "info")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("watch log"))
        .stderr(log_file);
    let _watch = Group::spawn("cargo lambda watch", &mut command);
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "cargo lambda watch did not listen on {port}:\n{}",
            tail(&log, 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(format!("http://127.0.0.1:{port}"))
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(
                "testing",
                "testing",
                None,
                None,
                "einmal-watch",
            ))
            .load()
            .await;
        // The first call compiles the function.
        let factory =
            AwsSinkFactory::with_timeouts(&sdk, DEFAULT_AWS_SINK_TIMEOUT, FIRST_INVOKE_TIMEOUT);
        let sink = factory
            .build(&destination(
                "fn",
                DestinationKind::Lambda(LambdaDestination {
                    function: "echo-destination".into(),
                }),
            ))
            .expect("a Lambda sink");

        let delivered = sink.deliver(&good).await.unwrap_or_else(|e| {
            panic!("Lambda: not delivered: {e}\nwatch log:\n{}", tail(&log, 40))
        });
        assert_eq!(delivered.status, Some(200), "{delivered:?}");
        let payload: Value = serde_json::from_slice(
            &std::fs::read(seen.join(format!("{}.json", good.key)))
                .expect("the function saw the call"),
        )
        .expect("payload JSON");
        assert_eq!(payload["key"], good.key.as_str());
        assert_eq!(payload["detail-type"], "payment_intent.succeeded");
        assert_eq!(payload["event_id"], "evt_fn_ok");
        assert_eq!(payload["object_id"], "pi_fn");
        assert_eq!(payload["body"]["id"], "evt_fn_ok");

        // `cargo lambda watch` answers a function error with HTTP 500 (AWS: 200 with
        // X-Amz-Function-Error); both are a retry.
        match sink.deliver(&bad).await {
            Err(SinkError::Retry { detail, .. }) => {
                assert!(detail.contains("Lambda Invoke"), "{detail}");
            }
            other => panic!(
                "a function error must be a retry: {other:?}\nwatch log:\n{}",
                tail(&log, 40)
            ),
        }
        assert!(!seen.join(format!("{}.json", bad.key)).exists());
    });
}

/// What real AWS answers and the local servers do not: a 200 with
/// `X-Amz-Function-Error`, a 429 with `Retry-After`, 404 and 409 from Lambda, and a
/// `PutEvents` 200 whose entry failed. Served on loopback in the services' wire formats.
mod aws_answers {
    use std::sync::{Arc, Mutex};

    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;

    use super::*;

    /// Each invocation: the function name and its `X-Amz-Invocation-Type`.
    type Calls = Vec<(String, Option<String>)>;

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Calls>>);

    fn lambda_error(
        status: StatusCode,
        code: &str,
        extra: &[(&'static str, &str)],
        body: &str,
    ) -> Response {
        let mut headers = HeaderMap::new();
        headers.insert("x-amzn-errortype", code.parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        for (name, value) in extra {
            headers.insert(*name, value.parse().unwrap());
        }
        (status, headers, body.to_string()).into_response()
    }

    async fn invoke(
        State(seen): State<Seen>,
        Path(name): Path<String>,
        headers: HeaderMap,
    ) -> Response {
        let invocation_type = headers
            .get("x-amz-invocation-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        seen.0.lock().unwrap().push((name.clone(), invocation_type));
        match name.as_str() {
            "ok" => (
                StatusCode::OK,
                [
                    ("x-amz-executed-version", "3"),
                    ("content-type", "application/json"),
                ],
                r#"{"ok":true}"#,
            )
                .into_response(),
            "handled" => (
                StatusCode::OK,
                [
                    ("x-amz-function-error", "Handled"),
                    ("content-type", "application/json"),
                ],
                r#"{"errorType":"CardDeclined","errorMessage":"card 4242 of jane@example.com"}"#,
            )
                .into_response(),
            "throttled" => lambda_error(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequestsException",
                &[("retry-after", "7")],
                r#"{"Type":"User","message":"Rate exceeded","Reason":"CallerRateLimitExceeded"}"#,
            ),
            "conflict" => lambda_error(
                StatusCode::CONFLICT,
                "ResourceConflictException",
                &[],
                r#"{"Type":"User","message":"The function is being updated"}"#,
            ),
            _ => lambda_error(
                StatusCode::NOT_FOUND,
                "ResourceNotFoundException",
                &[],
                r#"{"Type":"User","message":"Function not found"}"#,
            ),
        }
    }

    /// `AWSEvents.PutEvents`: the bus name picks the entry's fate.
    async fn put_events(body: String) -> Response {
        let request: Value = serde_json::from_str(&body).unwrap_or_default();
        let bus = request["Entries"][0]["EventBusName"]
            .as_str()
            .unwrap_or_default();
        let answer = match bus {
            "throttled" => {
                r#"{"FailedEntryCount":1,"Entries":[{"ErrorCode":"ThrottlingException","ErrorMessage":"Rate exceeded"}]}"#
            }
            "malformed" => {
                r#"{"FailedEntryCount":1,"Entries":[{"ErrorCode":"MalformedDetail","ErrorMessage":"Detail is malformed"}]}"#
            }
            _ => r#"{"FailedEntryCount":0,"Entries":[{"EventId":"e-1"}]}"#,
        };
        (
            StatusCode::OK,
            [("content-type", "application/x-amz-json-1.1")],
            answer,
        )
            .into_response()
    }

    async fn serve() -> (String, Seen) {
        let seen = Seen::default();
        let app = Router::new()
            .route("/2015-03-31/functions/{name}/invocations", post(invoke))
            .route("/", post(put_events))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake AWS serves");
        });
        (format!("http://{address}"), seen)
    }

    async fn factory(endpoint: &str) -> AwsSinkFactory {
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(
                "testing",
                "testing",
                None,
                None,
                "einmal-fake",
            ))
            .load()
            .await;
        AwsSinkFactory::new(&sdk)
    }

    fn lambda(factory: &AwsSinkFactory, function: &str) -> std::sync::Arc<dyn Sink> {
        factory
            .build(&destination(
                "fn",
                DestinationKind::Lambda(LambdaDestination {
                    function: function.into(),
                }),
            ))
            .expect("a Lambda sink")
    }

    #[tokio::test]
    async fn lambda_answers_are_classified() {
        let (endpoint, seen) = serve().await;
        let factory = factory(&endpoint).await;
        let m = message("fn", "evt_answers", None);

        let delivered = expect_delivered(lambda(&factory, "ok").deliver(&m).await, "ok");
        assert_eq!(
            delivered,
            Delivered {
                status: Some(200),
                note: Some("version 3".into())
            }
        );
        assert_eq!(
            seen.0.lock().unwrap().first().cloned(),
            Some(("ok".to_string(), Some("RequestResponse".to_string())))
        );

        match lambda(&factory, "handled").deliver(&m).await {
            Err(SinkError::Retry { status, detail, .. }) => {
                assert_eq!(status, Some(200));
                assert!(
                    detail.contains("Handled") && detail.contains("CardDeclined"),
                    "{detail}"
                );
                assert!(
                    !detail.contains("4242") && !detail.contains("jane"),
                    "the function's message stays out: {detail}"
                );
            }
            other => panic!("a function error is a retry: {other:?}"),
        }
        match lambda(&factory, "throttled").deliver(&m).await {
            Err(SinkError::Retry {
                status,
                retry_after,
                ..
            }) => {
                assert_eq!(status, Some(429));
                assert_eq!(retry_after, Some(Duration::from_secs(7)));
            }
            other => panic!("a throttle is a retry: {other:?}"),
        }
        match lambda(&factory, "conflict").deliver(&m).await {
            Err(SinkError::Retry { status, .. }) => assert_eq!(status, Some(409)),
            other => panic!("a function being updated is a retry: {other:?}"),
        }
        match lambda(&factory, "missing").deliver(&m).await {
            Err(SinkError::Permanent { status, detail }) => {
                assert_eq!(status, Some(404));
                assert!(detail.contains("ResourceNotFoundException"), "{detail}");
            }
            other => panic!("a missing function is permanent: {other:?}"),
        }
        // One call per delivery: the SDK does not retry behind the relay's back.
        assert_eq!(seen.0.lock().unwrap().len(), 5);
    }

    #[tokio::test]
    async fn eventbridge_entry_failures_are_classified() {
        let (endpoint, _) = serve().await;
        let factory = factory(&endpoint).await;
        let m = message("bus", "evt_entries", None);
        let bus = |name: &str| {
            factory
                .build(&destination(
                    "bus",
                    DestinationKind::EventBridge(EventBridgeDestination { bus: name.into() }),
                ))
                .expect("an EventBridge sink")
        };
        let delivered = expect_delivered(bus("fine").deliver(&m).await, "fine");
        assert_eq!(delivered.note.as_deref(), Some("event e-1"));
        match bus("throttled").deliver(&m).await {
            Err(SinkError::Retry { detail, .. }) => {
                assert!(detail.contains("ThrottlingException"), "{detail}")
            }
            other => panic!("a throttled entry is a retry: {other:?}"),
        }
        match bus("malformed").deliver(&m).await {
            Err(SinkError::Permanent { detail, .. }) => {
                assert!(detail.contains("MalformedDetail"), "{detail}")
            }
            other => panic!("a malformed entry is permanent: {other:?}"),
        }
    }
}
