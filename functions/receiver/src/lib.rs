//! Receiver Lambda handler: API Gateway (HTTP API, payload v2; REST v1 also parses)
//! → [`Ingestor::ingest`] → JSON response. Everything else lives in the library.

use einmal::pipeline::ingest::{IngestResponse, Ingestor};
use einmal::request::WebhookRequest;
use lambda_http::{Body, Error, Request, RequestExt, Response};

/// Handle one API Gateway event. `lambda_http` has already base64-decoded the body
/// when `isBase64Encoded` was set, so `req.body()` is the exact raw bytes.
pub async fn handle(ingestor: &Ingestor, req: Request) -> Result<Response<Body>, Error> {
    let Some(Route {
        provider,
        tenant,
        token,
    }) = route(&req)
    else {
        return respond(&IngestResponse::not_found());
    };
    let (parts, body) = req.into_parts();
    let request = WebhookRequest {
        method: parts.method,
        headers: parts.headers,
        query: parts.uri.query().map(str::to_string),
        body: match body {
            Body::Empty => Default::default(),
            Body::Text(text) => text.into_bytes().into(),
            Body::Binary(bytes) => bytes.into(),
        },
        path_token: token,
    };
    let response = ingestor.ingest(&provider, &tenant, &request).await;
    respond(&response)
}

struct Route {
    provider: String,
    tenant: String,
    token: Option<String>,
}

/// `{provider}`, `{tenant}` and the optional `{token}` from the route's path parameters,
/// falling back to the raw path (`…/webhooks/{provider}/{tenant}[/{token}]`).
fn route(req: &Request) -> Option<Route> {
    let params = req.path_parameters();
    if let (Some(p), Some(t)) = (params.first("provider"), params.first("tenant")) {
        return Some(Route {
            provider: p.to_string(),
            tenant: t.to_string(),
            token: params.first("token").map(str::to_string),
        });
    }
    let mut segments = req
        .uri()
        .path()
        .split('/')
        .skip_while(|s| *s != "webhooks")
        .skip(1);
    let provider = segments.next().filter(|s| !s.is_empty())?;
    let tenant = segments.next().filter(|s| !s.is_empty())?;
    let token = segments
        .next()
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    if segments.next().is_some() {
        return None;
    }
    Some(Route {
        provider: provider.to_string(),
        tenant: tenant.to_string(),
        token,
    })
}

fn respond(response: &IngestResponse) -> Result<Response<Body>, Error> {
    let (content_type, body) = response.render();
    Ok(Response::builder()
        .status(response.status)
        .header("content-type", content_type)
        .body(Body::Text(body))?)
}
