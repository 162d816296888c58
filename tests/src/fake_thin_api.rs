//! A fake of the thin-event providers' APIs on loopback, for the lookup and reconcile
//! tests: Mollie `GET /v2/payments/{id}` (and, when enabled, the payment list
//! `GET /v2/payments` with `from`/`limit` paging), GoPay
//! `GET /api/payments/payment/{id}` and Klarna `GET /ordermanagement/v1/orders/{id}`.
//!
//! Each provider's API checks its own credential, as the real ones do. For every path
//! the fake answers first the queued one-shot statuses ([`FakeThinApi::fail_next`]),
//! then the resource (or 404 when there is none). Every request to a provider path is
//! counted, credential right or wrong ([`FakeThinApi::calls`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

/// The credentials each provider's API expects.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// Mollie: `Authorization: Bearer {mollie_key}`.
    pub mollie_key: String,
    /// GoPay: `Authorization: Bearer {gopay_access}`.
    pub gopay_access: String,
    /// Klarna: HTTP Basic `{klarna_user}:{klarna_password}`.
    pub klarna_user: String,
    pub klarna_password: String,
}

impl Credentials {
    pub fn new(
        mollie_key: &str,
        gopay_access: &str,
        klarna_user: &str,
        klarna_password: &str,
    ) -> Credentials {
        Credentials {
            mollie_key: mollie_key.into(),
            gopay_access: gopay_access.into(),
            klarna_user: klarna_user.into(),
            klarna_password: klarna_password.into(),
        }
    }
}

/// How the fake behaves where the tests differ.
#[derive(Clone, Debug)]
pub struct Options {
    pub credentials: Credentials,
    /// `Some(page size)`: serve Mollie's payment list `GET /v2/payments` (newest first,
    /// `from` = the first id of the page, inclusive; pages of at most this many), and
    /// count its requests. `None`: the list path is unknown (404, not counted).
    pub mollie_list_page_size: Option<usize>,
}

#[derive(Default)]
struct FakeState {
    /// Mollie payments added with [`FakeThinApi::mollie`], newest first.
    mollie: Vec<Value>,
    /// Resources by path (see [`FakeThinApi::set`]).
    resources: HashMap<String, Value>,
    one_shot: HashMap<String, VecDeque<u16>>,
    calls: HashMap<String, usize>,
    /// The query of every Mollie list request, in order.
    list_queries: Vec<String>,
}

struct Shared {
    options: Options,
    base: String,
    state: Mutex<FakeState>,
}

/// A running fake; clones share it.
#[derive(Clone)]
pub struct FakeThinApi {
    /// `http://127.0.0.1:{port}`, no trailing slash.
    pub base: String,
    shared: Arc<Shared>,
}

impl FakeThinApi {
    /// Serve single resources only (no Mollie list).
    pub async fn start(credentials: Credentials) -> FakeThinApi {
        FakeThinApi::start_with(Options {
            credentials,
            mollie_list_page_size: None,
        })
        .await
    }

    /// Serve on a free loopback port.
    pub async fn start_with(options: Options) -> FakeThinApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake API binds");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let shared = Arc::new(Shared {
            options,
            base: base.clone(),
            state: Mutex::new(FakeState::default()),
        });
        let app = Router::new().fallback(answer).with_state(shared.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake API serves");
        });
        FakeThinApi { base, shared }
    }

    /// Add or replace a Mollie payment (kept newest first by `createdAt`); it is
    /// listed and answered at `/v2/payments/{id}`.
    pub fn mollie(&self, payment: Value) {
        let mut s = self.shared.state.lock().unwrap();
        s.mollie.retain(|p| p["id"] != payment["id"]);
        s.mollie.push(payment);
        s.mollie
            .sort_by(|a, b| b["createdAt"].as_str().cmp(&a["createdAt"].as_str()));
    }

    /// Answer `resource` at `path` (a Mollie payment added with [`Self::mollie`] wins
    /// over one set here for the same path).
    pub fn set(&self, path: &str, resource: Value) {
        let mut s = self.shared.state.lock().unwrap();
        s.resources.insert(path.to_string(), resource);
    }

    /// Answer the next requests to `path` with these statuses, one each, in order.
    pub fn fail_next(&self, path: &str, statuses: &[u16]) {
        let mut s = self.shared.state.lock().unwrap();
        s.one_shot
            .entry(path.to_string())
            .or_default()
            .extend(statuses);
    }

    /// Requests to `path` so far.
    pub fn calls(&self, path: &str) -> usize {
        let s = self.shared.state.lock().unwrap();
        s.calls.get(path).copied().unwrap_or(0)
    }

    /// Requests to every provider path so far.
    pub fn total_calls(&self) -> usize {
        self.shared.state.lock().unwrap().calls.values().sum()
    }

    /// The query string of every Mollie list request so far, in order.
    pub fn list_queries(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().list_queries.clone()
    }
}

/// The `Authorization` value of HTTP Basic authentication.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// The value of `name` in a query string (as written, not decoded).
pub fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

async fn answer(State(shared): State<Arc<Shared>>, headers: HeaderMap, uri: Uri) -> Response {
    let credentials = &shared.options.credentials;
    let page_size = shared.options.mollie_list_page_size;
    let path = uri.path().to_string();
    let mollie = match page_size {
        Some(_) => path.starts_with("/v2/payments"),
        None => path.starts_with("/v2/payments/"),
    };
    let expected = if mollie {
        format!("Bearer {}", credentials.mollie_key)
    } else if path.starts_with("/api/payments/payment/") {
        format!("Bearer {}", credentials.gopay_access)
    } else if path.starts_with("/ordermanagement/v1/orders/") {
        basic(&credentials.klarna_user, &credentials.klarna_password)
    } else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut s = shared.state.lock().unwrap();
    *s.calls.entry(path.clone()).or_default() += 1;
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if auth != expected {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if let Some(status) = s.one_shot.get_mut(&path).and_then(VecDeque::pop_front) {
        return StatusCode::from_u16(status).unwrap().into_response();
    }
    if let (Some(page_size), "/v2/payments") = (page_size, path.as_str()) {
        // Mollie's list: newest first, `from` = the first id of the page (inclusive).
        let base = &shared.base;
        let query = uri.query().unwrap_or_default().to_string();
        s.list_queries.push(query.clone());
        let limit: usize = query_param(&query, "limit")
            .and_then(|v| v.parse().ok())
            .unwrap_or(50);
        let size = limit.min(page_size);
        let start = match query_param(&query, "from") {
            Some(from) => match s.mollie.iter().position(|p| p["id"] == json!(from)) {
                Some(i) => i,
                None => return StatusCode::BAD_REQUEST.into_response(),
            },
            None => 0,
        };
        let page: Vec<Value> = s.mollie.iter().skip(start).take(size).cloned().collect();
        let next = s.mollie.get(start + size).map(|p| {
            json!({"href": format!("{base}/v2/payments?from={}&limit={limit}",
                                   p["id"].as_str().unwrap_or_default()),
                   "type": "application/hal+json"})
        });
        let body = json!({
            "count": page.len(),
            "_embedded": {"payments": page},
            "_links": {"self": {"href": format!("{base}/v2/payments?{query}")},
                       "previous": null, "next": next},
        });
        return axum::Json(body).into_response();
    }
    if let Some(id) = path.strip_prefix("/v2/payments/") {
        if let Some(p) = s.mollie.iter().find(|p| p["id"] == json!(id)) {
            return axum::Json(p.clone()).into_response();
        }
    }
    match s.resources.get(&path) {
        Some(body) => axum::Json(body.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
