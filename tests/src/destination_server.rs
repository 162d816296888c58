//! A real HTTP destination for the relay tests: an axum server on loopback that
//! verifies every call with the `standardwebhooks` crate (the spec's own verifier),
//! answers as a script says (fail, 429 with `Retry-After`, 4xx, stall past the
//! sender's timeout), and applies each `webhook-id` at most once, the way a user's
//! receiver dedups: `effects` holds one entry per id it answered 2xx for.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

/// A fixed test secret (`whsec_` + base64 of 32 bytes).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// What the server answers to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Status(u16, &'static str),
    /// 429 with `Retry-After: secs`.
    TooMany(u64),
    /// Answer 200 only after this long (past the sender's timeout).
    Stall(Duration),
}

/// One call as the server saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: String,
    pub event_type: String,
    pub object_id: Option<String>,
    pub object_version: Option<String>,
    pub idempotency_key: Option<String>,
    pub body: Vec<u8>,
    pub verified: bool,
    pub at: Instant,
    pub answer: Answer,
}

type Script = Box<dyn FnMut(&Call, usize) -> Answer + Send>;

struct Inner {
    calls: Vec<Call>,
    /// webhook-id → the call that applied it (the first answered 2xx).
    effects: BTreeMap<String, Call>,
    /// Object → calls in flight now, and the most seen at once.
    in_flight: BTreeMap<String, usize>,
    max_in_flight: BTreeMap<String, usize>,
    script: Script,
}

#[derive(Clone)]
pub struct DestinationServer {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

impl DestinationServer {
    /// Start on a free loopback port; `script(call, nth call of this webhook-id)`
    /// decides each answer (`nth` counts from 1).
    pub async fn start(script: impl FnMut(&Call, usize) -> Answer + Send + 'static) -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            calls: Vec::new(),
            effects: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            max_in_flight: BTreeMap::new(),
            script: Box::new(script),
        }));
        let app = Router::new()
            .route("/hook", post(receive))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        DestinationServer {
            url: format!("http://{addr}/hook"),
            inner,
        }
    }

    /// Every call so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().unwrap().calls.clone()
    }

    /// The applied calls, one per webhook-id.
    pub fn effects(&self) -> BTreeMap<String, Call> {
        self.inner.lock().unwrap().effects.clone()
    }

    /// The most calls of one object in flight at once, per object.
    pub fn max_in_flight(&self) -> BTreeMap<String, usize> {
        self.inner.lock().unwrap().max_in_flight.clone()
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn receive(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let verified = standardwebhooks::Webhook::new(SECRET)
        .and_then(|w| w.verify(&body, &headers))
        .is_ok();
    let mut call = Call {
        id: header(&headers, "webhook-id").unwrap_or_default(),
        event_type: header(&headers, "einmal-event-type").unwrap_or_default(),
        object_id: header(&headers, "einmal-object-id"),
        object_version: header(&headers, "einmal-object-version"),
        idempotency_key: header(&headers, "idempotency-key"),
        body: body.to_vec(),
        verified,
        at: Instant::now(),
        answer: Answer::Ok,
    };
    let object = call.object_id.clone().unwrap_or_default();
    let answer = {
        let mut inner = inner.lock().unwrap();
        let nth = inner.calls.iter().filter(|c| c.id == call.id).count() + 1;
        let answer = if verified {
            (inner.script)(&call, nth)
        } else {
            Answer::Status(401, "signature does not verify")
        };
        call.answer = answer.clone();
        inner.calls.push(call.clone());
        let now = {
            let n = inner.in_flight.entry(object.clone()).or_default();
            *n += 1;
            *n
        };
        let max = inner.max_in_flight.entry(object.clone()).or_default();
        *max = (*max).max(now);
        answer
    };
    let response = match &answer {
        Answer::Ok => StatusCode::NO_CONTENT.into_response(),
        Answer::Status(code, text) => {
            (StatusCode::from_u16(*code).unwrap(), text.to_string()).into_response()
        }
        Answer::TooMany(secs) => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", secs.to_string())],
            "slow down",
        )
            .into_response(),
        Answer::Stall(d) => {
            tokio::time::sleep(*d).await;
            StatusCode::OK.into_response()
        }
    };
    let mut inner = inner.lock().unwrap();
    if let Some(n) = inner.in_flight.get_mut(&object) {
        *n -= 1;
    }
    if response.status().is_success() {
        inner.effects.entry(call.id.clone()).or_insert(call);
    }
    response
}
