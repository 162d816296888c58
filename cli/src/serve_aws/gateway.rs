//! API Gateway HTTP API (payload format 2.0) in front of the receiver's own handler:
//! each HTTP request becomes the event the Lambda gets — raw path and query, headers
//! (lower-case, repeated ones joined with commas, cookies apart), the body base64
//! encoded unless it is text, and the `provider`/`tenant`/`token` path parameters of
//! the template's routes — and the handler's response goes back as API Gateway
//! returns it. Routes and methods outside the template's get API Gateway's own 404.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use base64::Engine as _;
use lambda_http::aws_lambda_events::apigw::{
    ApiGatewayV2httpRequest, ApiGatewayV2httpRequestContext,
    ApiGatewayV2httpRequestContextHttpDescription,
};
use lambda_http::request::LambdaRequest;
use receiver::Receiver;

use crate::serve_http::BodyBudget;

/// API Gateway's payload limit.
const MAX_PAYLOAD_BYTES: usize = 10 * 1024 * 1024;
/// The receiver's Lambda timeout (the template's `Timeout: 10`).
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The template's routes: GET and POST on `/webhooks/{provider}/{tenant}[/{token}]`.
const ROUTE: &str = "/webhooks/{provider}/{tenant}";
const ROUTE_WITH_TOKEN: &str = "/webhooks/{provider}/{tenant}/{token}";

/// The receiver and the memory budget of bodies in flight (`--max-body-bytes-in-flight`).
#[derive(Clone)]
pub struct Gateway {
    receiver: Arc<Receiver>,
    bodies: BodyBudget,
}

pub fn router(receiver: Arc<Receiver>, bodies: BodyBudget) -> Router {
    Router::new()
        .route(ROUTE, any(invoke))
        .route(ROUTE_WITH_TOKEN, any(invoke_with_token))
        .fallback(|| async { gateway_error(StatusCode::NOT_FOUND, "Not Found") })
        .with_state(Gateway { receiver, bodies })
}

async fn invoke(
    State(gateway): State<Gateway>,
    path: Option<Path<HashMap<String, String>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    call(&gateway, ROUTE, path, method, uri, headers, body).await
}

async fn invoke_with_token(
    State(gateway): State<Gateway>,
    path: Option<Path<HashMap<String, String>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    call(&gateway, ROUTE_WITH_TOKEN, path, method, uri, headers, body).await
}

async fn call(
    gateway: &Gateway,
    route: &str,
    path: Option<Path<HashMap<String, String>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if method != Method::GET && method != Method::POST {
        return gateway_error(StatusCode::NOT_FOUND, "Not Found");
    }
    // The body's memory is reserved before it is read (as `einmal serve` does): many
    // large bodies at once get 503 and a retry, not all of the machine's memory.
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(MAX_PAYLOAD_BYTES as u64)
        .min(MAX_PAYLOAD_BYTES as u64 + 1);
    let Some(_reserved) = gateway.bodies.try_reserve(declared) else {
        let mut busy = gateway_error(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable");
        busy.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            crate::serve_http::BODY_BUDGET_RETRY_AFTER_SECS.into(),
        );
        return busy;
    };
    let receiver = &gateway.receiver;
    let Ok(body) = axum::body::to_bytes(body, MAX_PAYLOAD_BYTES).await else {
        return gateway_error(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large");
    };
    // A segment that is not UTF-8 once decoded: no parameters; the receiver then
    // finds no route in the raw path either and answers 404 itself.
    let params = path.map(|Path(p)| p).unwrap_or_default();
    let event = event(route, &method, &uri, &headers, params, &body);
    let request: lambda_http::Request = LambdaRequest::ApiGatewayV2(event).into();
    match tokio::time::timeout(FUNCTION_TIMEOUT, receiver.handle(request)).await {
        Ok(Ok(response)) => response_of(response),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "receiver invocation failed");
            gateway_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
        }
        Err(_) => gateway_error(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable"),
    }
}

/// The payload 2.0 event API Gateway sends for this request.
fn event(
    route: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    path_parameters: HashMap<String, String>,
    body: &[u8],
) -> ApiGatewayV2httpRequest {
    let route_key = format!("{method} {route}");
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let mut folded = HeaderMap::new();
    for name in headers.keys() {
        if name == axum::http::header::COOKIE {
            continue;
        }
        let joined: Vec<&[u8]> = headers.get_all(name).iter().map(|v| v.as_bytes()).collect();
        if let Ok(value) = HeaderValue::from_bytes(&joined.join(&b", "[..])) {
            folded.insert(name.clone(), value);
        }
    }
    let cookies: Vec<String> = headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';').map(|c| c.trim().to_string()))
        .filter(|c| !c.is_empty())
        .collect();
    let (body, is_base64_encoded) = match (is_text(headers), std::str::from_utf8(body)) {
        _ if body.is_empty() => (None, false),
        (true, Ok(text)) => (Some(text.to_string()), false),
        _ => (
            Some(base64::engine::general_purpose::STANDARD.encode(body)),
            true,
        ),
    };
    let now_ms = einmal::time::now_millis();
    ApiGatewayV2httpRequest {
        version: Some("2.0".into()),
        route_key: Some(route_key.clone()),
        raw_path: Some(uri.path().to_string()),
        raw_query_string: Some(uri.query().unwrap_or_default().to_string()),
        cookies: (!cookies.is_empty()).then_some(cookies),
        headers: folded,
        path_parameters,
        request_context: ApiGatewayV2httpRequestContext {
            route_key: Some(route_key),
            account_id: Some("123456789012".into()),
            stage: Some("$default".into()),
            request_id: Some(format!("{:016x}", rand::random::<u64>())),
            apiid: Some("einmal-serve".into()),
            domain_name: header("host"),
            time_epoch: now_ms,
            http: ApiGatewayV2httpRequestContextHttpDescription {
                method: method.clone(),
                path: Some(uri.path().to_string()),
                protocol: Some("HTTP/1.1".into()),
                source_ip: header("x-forwarded-for")
                    .and_then(|v| v.split(',').next().map(|ip| ip.trim().to_string()))
                    .or_else(|| Some("127.0.0.1".into())),
                user_agent: header("user-agent"),
            },
            ..Default::default()
        },
        body,
        is_base64_encoded,
        ..Default::default()
    }
}

/// Bodies API Gateway passes as text; anything else arrives base64 encoded.
fn is_text(headers: &HeaderMap) -> bool {
    let Some(kind) = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let kind = kind.to_ascii_lowercase();
    kind.starts_with("text/")
        || ["json", "xml", "javascript", "x-www-form-urlencoded"]
            .iter()
            .any(|t| kind.contains(t))
}

/// The handler's response as API Gateway returns it to the caller.
fn response_of(response: lambda_http::Response<lambda_http::Body>) -> Response {
    let (parts, body) = response.into_parts();
    let body = match body {
        lambda_http::Body::Empty => Body::empty(),
        lambda_http::Body::Text(text) => Body::from(text),
        lambda_http::Body::Binary(bytes) => Body::from(bytes),
    };
    Response::from_parts(parts, body)
}

/// An error API Gateway itself answers, in its own shape.
fn gateway_error(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "message": message }).to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_body_is_base64_and_the_route_has_its_parameters() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.append("x-repeated", HeaderValue::from_static("a"));
        headers.append("x-repeated", HeaderValue::from_static("b"));
        let uri: Uri = "/webhooks/stripe/demo?x=1".parse().unwrap();
        let params = HashMap::from([
            ("provider".to_string(), "stripe".to_string()),
            ("tenant".to_string(), "demo".to_string()),
        ]);
        let e = event(ROUTE, &Method::POST, &uri, &headers, params, &[0xff, 0x00]);
        assert!(e.is_base64_encoded);
        assert_eq!(e.body.as_deref(), Some("/wA="));
        assert_eq!(e.raw_query_string.as_deref(), Some("x=1"));
        assert_eq!(e.headers["x-repeated"], "a, b");
        assert_eq!(
            e.route_key.as_deref(),
            Some("POST /webhooks/{provider}/{tenant}")
        );
        let request: lambda_http::Request = LambdaRequest::ApiGatewayV2(e).into();
        use lambda_http::RequestExt as _;
        assert_eq!(request.path_parameters().first("tenant"), Some("demo"));
        assert_eq!(request.body().as_ref(), &[0xff, 0x00]);
        assert_eq!(request.uri().query(), Some("x=1"));
    }
}
