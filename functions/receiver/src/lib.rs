//! Receiver Lambda handler: API Gateway (HTTP API, payload v2; REST v1 also parses)
//! → [`Ingestor::ingest`] → JSON response. Everything else lives in the library.

use std::time::Instant;

use einmal::pipeline::ingest::{IngestResponse, Ingestor};
use einmal::request::WebhookRequest;
use einmal::telemetry::emf::{self, IntakeRecord, IntakeResult, UNKNOWN_PROVIDER};
use einmal::telemetry::trace::TraceHeader;
use lambda_http::{Body, Error, Request, RequestExt, Response};

/// Handle one API Gateway event. `lambda_http` has already base64-decoded the body
/// when `isBase64Encoded` was set, so `req.body()` is the exact raw bytes.
pub async fn handle(ingestor: &Ingestor, req: Request) -> Result<Response<Body>, Error> {
    handle_observed(ingestor, req)
        .await
        .map(|(response, _)| response)
}

/// [`handle`], then print the request's metrics as one EMF line on stdout.
pub async fn handle_and_emit(
    ingestor: &Ingestor,
    deployment: &str,
    req: Request,
) -> Result<Response<Body>, Error> {
    let (response, record) = handle_observed(ingestor, req).await?;
    emf::print(&record.emf(deployment, einmal::time::now_millis()).render());
    Ok(response)
}

/// [`handle`], also returning what the request counts for in the metrics. The
/// invocation's X-Ray trace header (the Lambda context's, else `_X_AMZN_TRACE_ID`)
/// goes with the queue message as `AWSTraceHeader`.
pub async fn handle_observed(
    ingestor: &Ingestor,
    req: Request,
) -> Result<(Response<Body>, IntakeRecord), Error> {
    let started = Instant::now();
    let trace = req
        .lambda_context_ref()
        .and_then(|c| c.xray_trace_id.as_deref())
        .and_then(TraceHeader::parse)
        .or_else(TraceHeader::from_env);
    let Some(Route {
        provider,
        tenant,
        token,
    }) = route(&req)
    else {
        let record = IntakeRecord {
            provider: UNKNOWN_PROVIDER,
            result: IntakeResult::Rejected,
            ack_ms: started.elapsed().as_secs_f64() * 1000.0,
        };
        return Ok((respond(&IngestResponse::not_found())?, record));
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
    let (response, mut record) = ingestor
        .ingest_traced(&provider, &tenant, &request, trace.as_ref())
        .await;
    record.ack_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok((respond(&response)?, record))
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
