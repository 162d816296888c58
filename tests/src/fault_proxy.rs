//! A fault layer for AWS: an HTTP proxy between einmal's SDK clients and moto that
//! injects, by configuration, what AWS does on a bad day — throttling
//! (`ProvisionedThroughputExceededException`, `ThrottlingException`, SQS
//! `RequestThrottled`), 500/503, connections closed without an answer, 1–3 s of
//! latency, and the nastiest: the request applied by moto but its answer dropped.
//!
//! The SDK sees real wire answers, so its own retry layer and our error mapping run
//! exactly as against AWS. A service is told apart by the `X-Amz-Target` header
//! (`DynamoDB_20120810.*`, `AmazonSQS.*`; both speak AWS JSON).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The service's throttling error (DynamoDB
    /// `ProvisionedThroughputExceededException`, SQS `RequestThrottled`), HTTP 400.
    Throttle,
    /// `ThrottlingException` (the generic one), HTTP 400.
    ThrottlingException,
    /// HTTP 500 `InternalServerError`.
    ServerError,
    /// HTTP 503 `ServiceUnavailable`.
    Unavailable,
    /// The connection is closed without an answer; moto never sees the request.
    Reset,
    /// 1–3 s before the request goes on.
    Latency,
    /// moto applies the request, the answer is dropped (the connection closes).
    LostAnswer,
    /// The request never goes on and never gets an answer (a caller killed while it
    /// waits: drop its future). Only for [`Faults::add_rule`], not a random fault.
    Hang,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::Throttle,
        Fault::ThrottlingException,
        Fault::ServerError,
        Fault::Unavailable,
        Fault::Reset,
        Fault::Latency,
        Fault::LostAnswer,
    ];
}

/// Which service a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    DynamoDb,
    Sqs,
    Other,
}

fn service_of<B>(request: &Request<B>) -> Service {
    let target = request
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if target.starts_with("DynamoDB_") {
        Service::DynamoDb
    } else if target.starts_with("AmazonSQS.") {
        Service::Sqs
    } else {
        Service::Other
    }
}

/// What the proxy injects now; every switch can change while it runs.
#[derive(Debug, Default)]
pub struct Faults {
    /// Every DynamoDB call is throttled (an outage of the table).
    dynamodb_down: AtomicBool,
    /// Every SQS call is throttled.
    sqs_down: AtomicBool,
    /// Per mille of calls (of the services in `random_services`) that get a fault.
    random_per_mille: AtomicU32,
    /// Bit set of [`Fault::ALL`] indexes the random faults choose from.
    random_kinds: AtomicU32,
    /// Bit 0: DynamoDB, bit 1: SQS.
    random_services: AtomicU32,
    /// Targeted faults, checked before the random ones ([`Faults::add_rule`]).
    rules: std::sync::Mutex<Vec<Rule>>,
}

/// One targeted fault: requests for `operation` whose body contains `needle`.
#[derive(Debug)]
struct Rule {
    /// The `X-Amz-Target` header, e.g. `DynamoDB_20120810.PutItem`.
    operation: String,
    needle: String,
    fault: Fault,
    /// How many more requests get it.
    left: u32,
}

impl Faults {
    pub fn set_dynamodb_down(&self, down: bool) {
        self.dynamodb_down.store(down, Ordering::SeqCst);
    }

    pub fn set_sqs_down(&self, down: bool) {
        self.sqs_down.store(down, Ordering::SeqCst);
    }

    /// `per_mille` of the calls to `services` get one of `kinds` (uniformly); 0 stops.
    pub fn set_random(&self, per_mille: u32, kinds: &[Fault], services: &[Service]) {
        let kinds = kinds.iter().fold(0u32, |bits, kind| {
            bits | 1 << Fault::ALL.iter().position(|k| k == kind).unwrap()
        });
        let services = services.iter().fold(0u32, |bits, s| match s {
            Service::DynamoDb => bits | 1,
            Service::Sqs => bits | 2,
            Service::Other => bits,
        });
        self.random_kinds.store(kinds, Ordering::SeqCst);
        self.random_services.store(services, Ordering::SeqCst);
        self.random_per_mille.store(per_mille, Ordering::SeqCst);
    }

    /// The next `count` requests for `operation` (the `X-Amz-Target` header, e.g.
    /// `DynamoDB_20120810.PutItem`) whose body contains `needle` get `fault`
    /// (`u32::MAX`: until [`Faults::clear_rules`]).
    pub fn add_rule(&self, operation: &str, needle: &str, fault: Fault, count: u32) {
        self.rules.lock().unwrap().push(Rule {
            operation: operation.to_owned(),
            needle: needle.to_owned(),
            fault,
            left: count,
        });
    }

    pub fn clear_rules(&self) {
        self.rules.lock().unwrap().clear();
    }

    fn pick_rule(&self, operation: &str, body: &[u8]) -> Option<Fault> {
        let mut rules = self.rules.lock().unwrap();
        let rule = rules.iter_mut().find(|r| {
            r.left > 0
                && r.operation == operation
                && body
                    .windows(r.needle.len().max(1))
                    .any(|w| w == r.needle.as_bytes())
        })?;
        rule.left = rule.left.saturating_sub(1);
        Some(rule.fault)
    }

    fn pick(&self, service: Service) -> Option<Fault> {
        match service {
            Service::DynamoDb if self.dynamodb_down.load(Ordering::SeqCst) => {
                return Some(Fault::Throttle)
            }
            Service::Sqs if self.sqs_down.load(Ordering::SeqCst) => return Some(Fault::Throttle),
            _ => {}
        }
        let bit = match service {
            Service::DynamoDb => 1,
            Service::Sqs => 2,
            Service::Other => return None,
        };
        let per_mille = self.random_per_mille.load(Ordering::SeqCst);
        if per_mille == 0 || self.random_services.load(Ordering::SeqCst) & bit == 0 {
            return None;
        }
        let mut rng = rand::thread_rng();
        if rng.gen_range(0..1000) >= per_mille {
            return None;
        }
        let kinds = self.random_kinds.load(Ordering::SeqCst);
        let chosen: Vec<Fault> = Fault::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| kinds & (1 << i) != 0)
            .map(|(_, k)| *k)
            .collect();
        (!chosen.is_empty()).then(|| chosen[rng.gen_range(0..chosen.len())])
    }
}

/// The running proxy; it stops when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:port`: the endpoint to give the SDK clients.
    pub endpoint: String,
    pub faults: Arc<Faults>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a connection is closed without an answer (hyper drops it on a service error).
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fault proxy: answer dropped")
    }
}

impl std::error::Error for Dropped {}

type Upstream = Client<HttpConnector, Full<Bytes>>;

impl FaultProxy {
    /// A proxy on a free loopback port in front of `upstream` (moto's endpoint).
    pub async fn start(upstream: &str) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fault proxy binds");
        let addr: SocketAddr = listener.local_addr().expect("local addr");
        let faults = Arc::new(Faults::default());
        let client: Upstream = Client::builder(TokioExecutor::new()).build_http();
        let upstream = upstream.trim_end_matches('/').to_string();
        let shared = faults.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (faults, client, upstream) = (shared.clone(), client.clone(), upstream.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        forward(request, faults.clone(), client.clone(), upstream.clone())
                    });
                    // A dropped answer ends the connection with an error: expected.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FaultProxy {
            endpoint: format!("http://{addr}"),
            faults,
            task,
        }
    }
}

async fn forward(
    request: Request<Incoming>,
    faults: Arc<Faults>,
    client: Upstream,
    upstream: String,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let service = service_of(&request);
    let operation = request
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
    let fault = faults
        .pick_rule(&operation, &body)
        .or_else(|| faults.pick(service));
    match fault {
        Some(Fault::Throttle) => {
            let code = match service {
                Service::Sqs => "AWS.SimpleQueueService.RequestThrottled",
                _ => "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
            };
            return Ok(error(StatusCode::BAD_REQUEST, code, service));
        }
        Some(Fault::ThrottlingException) => {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "com.amazon.coral.availability#ThrottlingException",
                service,
            ))
        }
        Some(Fault::ServerError) => {
            return Ok(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "com.amazonaws.dynamodb.v20120810#InternalServerError",
                service,
            ))
        }
        Some(Fault::Unavailable) => {
            return Ok(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "com.amazon.coral.availability#ServiceUnavailableException",
                service,
            ))
        }
        Some(Fault::Reset) => return Err(Dropped),
        Some(Fault::Latency) => {
            let ms = rand::thread_rng().gen_range(1_000..=3_000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Some(Fault::Hang) => std::future::pending::<()>().await,
        Some(Fault::LostAnswer) | None => {}
    }
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut upstream_request = Request::builder()
        .method(parts.method)
        .uri(format!("{upstream}{path}"));
    for (name, value) in &parts.headers {
        upstream_request = upstream_request.header(name, value);
    }
    let upstream_request = upstream_request
        .body(Full::new(body))
        .map_err(|_| Dropped)?;
    let answer = client
        .request(upstream_request)
        .await
        .map_err(|_| Dropped)?;
    let (parts, body) = answer.into_parts();
    let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
    if fault == Some(Fault::LostAnswer) {
        // Applied by moto; the caller never learns it.
        return Err(Dropped);
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}

/// An AWS JSON error answer, as DynamoDB and SQS (JSON protocol) send it.
fn error(status: StatusCode, code: &str, service: Service) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "__type": code, "message": "injected by the fault proxy" });
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amzn-requestid", "fault-proxy");
    if service == Service::Sqs {
        // SQS's JSON protocol also names the query-protocol code.
        let short = code.rsplit(['#', '.']).next().unwrap_or(code);
        response = response.header("x-amzn-query-error", format!("{short};Sender"));
    }
    response
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid error answer")
}
