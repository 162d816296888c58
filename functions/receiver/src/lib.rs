//! Receiver Lambda handler: API Gateway (HTTP API, payload v2; REST v1 also parses)
//! → [`Ingestor::ingest`] → JSON response. Everything else lives in the library.

use std::sync::Arc;
use std::time::Instant;

use einmal::adapters::aws::{config_source_from_env, AwsSetupError, AwsStore};
use einmal::config::ConfigScope;
use einmal::pipeline::ingest::{IngestResponse, Ingestor};
use einmal::request::WebhookRequest;
use einmal::telemetry::emf::{self, IntakeRecord, IntakeResult, UNKNOWN_PROVIDER};
use einmal::telemetry::trace::TraceHeader;
use lambda_http::{Body, Error, Request, RequestExt, Response};

/// The receiver function as its Lambda runs it: the ingestor on the inbox and the
/// tenant configuration (`EINMAL_CONFIG_PARAMETER`, reloaded every
/// `EINMAL_CONFIG_TTL_SECS`, or `EINMAL_CONFIG`), built once per execution environment.
/// `einmal serve --backend aws` builds the same and hands it each HTTP request.
pub struct Receiver {
    ingestor: Ingestor,
    deployment: String,
    emf: bool,
}

impl Receiver {
    /// The receiver on `store`, its configuration from the environment as the Lambda reads it.
    pub async fn new(
        sdk_config: &aws_config::SdkConfig,
        store: Arc<AwsStore>,
    ) -> Result<Self, AwsSetupError> {
        // The receiver acts on the tenants alone: a destination never stops intake.
        let source = config_source_from_env(sdk_config, ConfigScope::TenantsOnly).await?;
        // PayPal's certificates that verified a delivery are kept in the inbox table
        // (`cert#…` items): a new execution environment needs no fetch for them.
        if !einmal::providers::paypal::persist_verified_to(store.clone()) {
            tracing::debug!("the PayPal verifier already keeps its certificates elsewhere");
        }
        Ok(Receiver {
            ingestor: Ingestor::from_store(source, store),
            deployment: einmal::telemetry::emf::deployment_from_env(),
            emf: true,
        })
    }

    /// Whether each request's metrics are printed as an EMF line on stdout (the
    /// Lambda's CloudWatch metrics; on by default).
    pub fn with_emf(mut self, emf: bool) -> Self {
        self.emf = emf;
        self
    }

    pub fn ingestor(&self) -> &Ingestor {
        &self.ingestor
    }

    /// One API Gateway event, as the Lambda handles it.
    pub async fn handle(&self, req: Request) -> Result<Response<Body>, Error> {
        if self.emf {
            handle_and_emit(&self.ingestor, &self.deployment, req).await
        } else {
            handle(&self.ingestor, req).await
        }
    }
}

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
    let mut builder = Response::builder()
        .status(response.status)
        .header("content-type", content_type);
    if let Some(secs) = response.retry_after_secs {
        builder = builder.header("retry-after", secs);
    }
    Ok(builder.body(Body::Text(body))?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use einmal::telemetry::emf::{IntakeResult, UNKNOWN_PROVIDER};
    use einmal::telemetry::trace::AWS_TRACE_HEADER;
    use einmal_tests::fixtures::{config, signed, stripe_body};
    use einmal_tests::moto;
    use lambda_http::{Context, RequestExt};

    use super::*;

    const TRACE: &str =
        "Root=1-67a1b2c3-0123456789abcdef0000feed;Parent=53995c3f42cd8ad8;Sampled=1";

    fn api_gateway_v2_event(path: &str, headers: &http::HeaderMap, body: &[u8]) -> Request {
        let headers: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").into()))
            .collect();
        let event = serde_json::json!({
            "version": "2.0",
            "routeKey": "POST /webhooks/{provider}/{tenant}",
            "rawPath": path,
            "rawQueryString": "",
            "headers": headers,
            "requestContext": {
                "accountId": "123456789012", "apiId": "abc123",
                "domainName": "abc123.execute-api.eu-central-1.amazonaws.com",
                "domainPrefix": "abc123",
                "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1",
                         "sourceIp": "192.0.2.10", "userAgent": "Stripe/1.0"},
                "requestId": "req-1", "routeKey": "POST /webhooks/{provider}/{tenant}",
                "stage": "$default", "time": "29/Nov/2026:10:00:00 +0000",
                "timeEpoch": 1764410400000u64
            },
            "body": String::from_utf8_lossy(body),
            "isBase64Encoded": false
        });
        let mut context = Context::default();
        context.xray_trace_id = Some(TRACE.to_string());
        lambda_http::request::from_str(&event.to_string())
            .expect("valid API Gateway event")
            .with_lambda_context(context)
    }

    /// A Lambda function URL event (payload 2.0 as Lambda sends it for a URL): no
    /// `pathParameters`, route key `$default`, the whole path in `rawPath`, the domain
    /// `<url-id>.lambda-url.<region>.on.aws`. `body_base64` as Lambda does for bodies
    /// it does not treat as text.
    fn function_url_event(
        method: &str,
        raw_path: &str,
        raw_query: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        body_base64: bool,
    ) -> Request {
        use base64::Engine as _;
        let headers: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").into()))
            .collect();
        let body = if body_base64 {
            base64::engine::general_purpose::STANDARD.encode(body)
        } else {
            String::from_utf8_lossy(body).into_owned()
        };
        let event = serde_json::json!({
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": raw_path,
            "rawQueryString": raw_query,
            "headers": headers,
            "requestContext": {
                "accountId": "anonymous", "apiId": "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6",
                "domainName": "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6.lambda-url.eu-central-1.on.aws",
                "domainPrefix": "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6",
                "http": {"method": method, "path": raw_path, "protocol": "HTTP/1.1",
                         "sourceIp": "192.0.2.10", "userAgent": "Stripe/1.0"},
                "requestId": "req-url-1", "routeKey": "$default",
                "stage": "$default", "time": "29/Nov/2026:10:00:00 +0000",
                "timeEpoch": 1764410400000u64
            },
            "body": body,
            "isBase64Encoded": body_base64
        });
        lambda_http::request::from_str(&event.to_string()).expect("valid function URL event")
    }

    /// Behind a function URL (`ReceiverFunctionUrl=true`) no path parameters arrive:
    /// provider, tenant and token come from the raw path, and a signed webhook is
    /// accepted exactly as through the HTTP API (a base64 body decoded to the signed
    /// bytes; the redelivery a duplicate).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_function_url_event_routes_by_the_raw_path() {
        let route_of = |path: &str, query: &str| {
            let req = function_url_event("GET", path, query, &http::HeaderMap::new(), b"", false);
            assert!(req.path_parameters().is_empty(), "a function URL has none");
            route(&req).map(|r| (r.provider, r.tenant, r.token))
        };
        let owned = |p: &str, t: &str, k: Option<&str>| {
            Some((p.to_string(), t.to_string(), k.map(str::to_string)))
        };
        assert_eq!(
            route_of("/webhooks/stripe/t1", ""),
            owned("stripe", "t1", None)
        );
        assert_eq!(
            route_of("/webhooks/gopay/t1/tok_123", "id=3000006542"),
            owned("gopay", "t1", Some("tok_123"))
        );
        assert_eq!(
            route_of("/webhooks/stripe/t1/", ""),
            owned("stripe", "t1", None)
        );
        for path in [
            "/",
            "/webhooks",
            "/webhooks/stripe",
            "/webhooks/stripe/t1/tok/extra",
        ] {
            assert!(route_of(path, "").is_none(), "{path}");
        }
        let req = function_url_event(
            "GET",
            "/webhooks/gopay/t1/tok_123",
            "id=3000006542",
            &http::HeaderMap::new(),
            b"",
            false,
        );
        assert_eq!(req.uri().query(), Some("id=3000006542"));

        let (store, _) = moto::aws_store(moto::shared(), None).await;
        let store = Arc::new(store);
        let config = config();
        let ingestor = Ingestor::new(config.clone(), store.clone(), store.clone());
        let body = stripe_body("evt_url_1", 10);
        let request = signed(&config, "stripe", "t1", "evt_url_1", &body);
        for (base64, duplicate) in [(true, false), (false, true)] {
            let req = function_url_event(
                "POST",
                "/webhooks/stripe/t1",
                "",
                &request.headers,
                &body,
                base64,
            );
            let (response, record) = handle_observed(&ingestor, req).await.expect("handled");
            assert_eq!(response.status(), 200, "base64 body: {base64}");
            assert_eq!(record.provider, "stripe");
            let expected = if duplicate {
                IntakeResult::Accepted {
                    new: 0,
                    duplicates: 1,
                }
            } else {
                IntakeResult::Accepted {
                    new: 1,
                    duplicates: 0,
                }
            };
            assert_eq!(record.result, expected, "base64 body: {base64}");
        }
    }

    /// The invocation's X-Ray trace header (from the Lambda context) reaches SQS as the
    /// `AWSTraceHeader` system attribute (moto returns it), and the request's metrics
    /// come back for its EMF line.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_lambda_trace_header_goes_to_sqs_and_the_request_is_measured() {
        let (store, names) = moto::aws_store(moto::shared(), None).await;
        let store = Arc::new(store);
        let config = config();
        let ingestor = Ingestor::new(config.clone(), store.clone(), store.clone());
        let body = stripe_body("evt_trace_1", 10);
        let request = signed(&config, "stripe", "t1", "evt_trace_1", &body);
        let req = api_gateway_v2_event("/webhooks/stripe/t1", &request.headers, &body);

        let (response, record) = handle_observed(&ingestor, req).await.expect("handled");
        assert_eq!(response.status(), 200);
        assert_eq!(record.provider, "stripe");
        assert_eq!(
            record.result,
            IntakeResult::Accepted {
                new: 1,
                duplicates: 0
            }
        );
        assert!(record.ack_ms > 0.0);
        let line = &record.emf("einmal", 1).render()[0];
        let doc: serde_json::Value = serde_json::from_str(line).expect("EMF JSON");
        assert_eq!(doc["WebhooksAccepted"], 1);
        assert_eq!(doc["Provider"], "stripe");

        let out = store
            .sqs()
            .receive_message()
            .queue_url(&names.queue_url)
            .wait_time_seconds(1)
            .message_system_attribute_names(AWS_TRACE_HEADER.into())
            .send()
            .await
            .expect("receive");
        let messages = out.messages.unwrap_or_default();
        assert_eq!(messages.len(), 1);
        let attributes = messages[0].attributes.clone().unwrap_or_default();
        let header = attributes
            .iter()
            .find(|(name, _)| name.as_str() == AWS_TRACE_HEADER)
            .map(|(_, value)| value.as_str());
        assert_eq!(header, Some(TRACE), "{attributes:?}");

        // A path that is no webhook route: measured under the `unknown` provider.
        let req = api_gateway_v2_event("/elsewhere", &http::HeaderMap::new(), b"{}");
        let (response, record) = handle_observed(&ingestor, req).await.expect("handled");
        assert_eq!(response.status(), 404);
        assert_eq!(
            (record.provider, record.result),
            (UNKNOWN_PROVIDER, IntakeResult::Rejected)
        );
    }
}
