//! Shopify: `X-Shopify-Hmac-Sha256: <base64>` = HMAC-SHA256(client secret as UTF-8,
//! raw body). Nothing time-related is signed, so replay protection is the dedup store.
//! The Events preview sends the same headers without the `X-` prefix; both are read.
//!
//! **Which shop** (issue 23, item 4). Only the body is signed, and a public app's
//! client secret is the same for every shop that installed it: a body signed for shop
//! A verifies for tenant B of the same app, and `X-Shopify-Shop-Domain` is unsigned.
//! So the shop comes from signed facts where the topic's body carries one, and the
//! header is a hint that must agree:
//! - the body's shop facts ([`body_shops`]): `myshopify_domain` and `domain` (the Shop
//!   resource: `shop/update`, `app/uninstalled`) and the host of `order_status_url`
//!   (the Order resource: `orders/*`). `admin_graphql_api_id` names no shop. Every
//!   `*.myshopify.com` fact must be the tenant's shop (`shop_domain`, else the header);
//!   another host (a custom domain) binds the shop only when it is the tenant's
//!   `storefront_domain`, and otherwise neither binds nor refuses.
//! - the header must equal `shop_domain` when it is set (and is the shop otherwise).
//! - a tenant whose secret another Shopify tenant also lists (`shared_app`, set by
//!   the configuration load, which also requires each of them to name its shop) takes
//!   only bodies that name its shop: a topic whose body carries no shop field
//!   (`refunds/create`, `fulfillments/create`, products, inventory, customers) is
//!   refused, since nothing signed says which of the shops it came from.
//!
//! Every refusal is [`ProviderError::TenantMismatch`]: 401, nothing stored.

use base64::Engine as _;
use http::HeaderName;

use super::json::{self, Raw};
use super::reconcile_source::{ReconcileMethod, ReconcileSource};
use super::sig::{self, header_names};
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Shopify;

// Each header under its classic name and its Events-preview name.
static HMAC: [HeaderName; 2] = header_names!("x-shopify-hmac-sha256", "shopify-hmac-sha256");
static TOPIC: [HeaderName; 2] = header_names!("x-shopify-topic", "shopify-topic");
static SHOP: [HeaderName; 2] = header_names!("x-shopify-shop-domain", "shopify-shop-domain");
static EVENT_ID: [HeaderName; 2] = header_names!("x-shopify-event-id", "shopify-event-id");
static WEBHOOK_ID: [HeaderName; 2] =
    sig::header_names!("x-shopify-webhook-id", "shopify-webhook-id");
static TRIGGERED_AT: [HeaderName; 2] =
    sig::header_names!("x-shopify-triggered-at", "shopify-triggered-at");
const DEFAULT_TOPIC: &str = "orders/create";

/// The tenant option naming the tenant's shop (`demo.myshopify.com`).
pub const SHOP_DOMAIN_OPTION: &str = "shop_domain";
/// The shop's primary (custom) domain, which Shopify uses in `order_status_url`.
pub const STOREFRONT_DOMAIN_OPTION: &str = "storefront_domain";
/// `"true"` when the tenant's app (and so its secret) serves other shops too (a public
/// app installed in several shops): only bodies naming the tenant's shop are taken.
/// The configuration load sets it for tenants that share a secret; an operator sets
/// it for a secret also used outside this configuration. (Not named `*_secret`: its
/// value is no credential, and the log redaction masks the values of such options.)
pub const SHARED_APP_OPTION: &str = "shared_app";

/// Why a delivery under a shared secret is refused when its body binds no shop.
const NOT_NAMED: &str =
    "the signed body does not name this tenant's shop, and the app secret is shared by several shops";

/// The shop domains named by the signed body, lower-cased: `myshopify_domain`,
/// `domain` (Shop resource) and the host of `order_status_url` (Order resource).
/// Absent, `null` or non-string fields name nothing.
pub fn body_shops(body: &[u8]) -> Result<Vec<String>, ProviderError> {
    let fields = json::json_fields(
        body,
        [&["myshopify_domain"], &["domain"], &["order_status_url"]],
    )?;
    let [myshopify, domain, status_url] = fields.map(|f| f.and_then(Raw::str));
    let mut shops = Vec::with_capacity(2);
    for host in [myshopify, domain]
        .into_iter()
        .flatten()
        .map(|d| normal_host(&d))
        .chain(status_url.as_deref().and_then(url_host))
    {
        if !host.is_empty() && !shops.contains(&host) {
            shops.push(host);
        }
    }
    Ok(shops)
}

/// A domain as compared: lower-case, without a trailing dot.
fn normal_host(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// The host of an `http(s)://` URL: after any userinfo (`a@b` is host `b`), before
/// the port, path, query or fragment. `None` for anything else.
fn url_host(url: &str) -> Option<String> {
    let url = url.trim();
    let rest = url
        .get(..8)
        .filter(|p| p.eq_ignore_ascii_case("https://"))
        .map(|_| &url[8..])
        .or_else(|| {
            url.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("http://"))
                .map(|_| &url[7..])
        })?;
    let authority = rest.split(['/', '?', '#', '\\']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    let host = host.split(':').next().unwrap_or_default();
    Some(normal_host(host)).filter(|h| !h.is_empty())
}

fn is_myshopify(host: &str) -> bool {
    host.ends_with(".myshopify.com")
}

/// Check the signed body's shop facts against the tenant's shop (`shop`: the option
/// `shop_domain`, else the header's): see the module docs.
fn check_body_shop(body: &[u8], tenant: &TenantConfig, shop: &str) -> Result<(), ProviderError> {
    let storefront = tenant.option(STOREFRONT_DOMAIN_OPTION).map(normal_host);
    let shared = tenant.option(SHARED_APP_OPTION) == Some("true");
    let mut bound = false;
    for fact in body_shops(body)? {
        if fact == shop || storefront.as_deref() == Some(fact.as_str()) {
            bound = true;
        } else if is_myshopify(&fact) {
            return Err(ProviderError::TenantMismatch(
                "the signed body names another shop",
            ));
        }
        // Otherwise a custom domain that is not the tenant's `storefront_domain`: it
        // cannot be compared, so it binds nothing (next to a `myshopify_domain` it is
        // that shop's own primary domain).
    }
    if shared && !bound {
        return Err(ProviderError::TenantMismatch(NOT_NAMED));
    }
    Ok(())
}

/// Signature candidates (the classic header, else the preview one). API Gateway may
/// comma-join repeats, and base64 never contains a comma.
fn candidates(request: &WebhookRequest) -> Result<Vec<Vec<u8>>, ProviderError> {
    let mut out = Vec::with_capacity(1);
    let names = if request.headers.contains_key(&HMAC[0]) {
        &HMAC[..1]
    } else {
        &HMAC[1..]
    };
    for name in names {
        for value in sig::header_values(request, name) {
            let value = value?;
            if value.is_empty() {
                return Err(ProviderError::MalformedHeader(name.as_str(), "empty value"));
            }
            for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                out.push(sig::decode_base64(name.as_str(), part)?);
            }
        }
    }
    Ok(out)
}

fn extract(request: &WebhookRequest, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let shop = sig::single_header_of(request, &SHOP)?;
    match (tenant.option(SHOP_DOMAIN_OPTION), shop) {
        (Some(want), Some(got)) if normal_host(want) == normal_host(got) => {}
        (Some(_), _) => return Err(ProviderError::TenantMismatch("shop domain")),
        (None, Some(_)) => {}
        (None, None) => return Err(sig::payload_error("missing X-Shopify-Shop-Domain header")),
    }
    let shop = normal_host(shop.unwrap_or_default());
    // The unsigned header agreed with the tenant; now the signed body must too.
    check_body_shop(&request.body, tenant, &shop)?;
    let topic = sig::single_header_of(request, &TOPIC)?
        .ok_or_else(|| sig::payload_error("missing X-Shopify-Topic header"))?;
    let event = sig::single_header_of(request, &EVENT_ID)?
        .ok_or_else(|| sig::payload_error("missing X-Shopify-Event-Id header"))?;
    // Event-Id is shared by every topic of one merchant action, so scope it.
    let mut event_id = String::with_capacity(shop.len() + topic.len() + event.len() + 2);
    for part in [&shop[..], ":", topic, ":", event] {
        event_id.push_str(part);
    }
    sig::check_event_id(&event_id)?;
    let [id, updated_at] = json::json_fields(&request.body, [&["id"], &["updated_at"]])?;
    let triggered = sig::single_header_of(request, &TRIGGERED_AT)?;
    Ok(Envelope {
        provider: "shopify".into(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type: topic.to_owned(),
        object_id: id.and_then(Raw::text).map(String::from),
        object_version: updated_at.and_then(Raw::text).map(String::from),
        occurred_at: triggered.and_then(crate::time::parse_rfc3339),
        delivery_id: sig::single_header_of(request, &WEBHOOK_ID)?.map(str::to_owned),
    })
}

impl Provider for Shopify {
    fn name(&self) -> &'static str {
        "shopify"
    }

    fn options(&self) -> &'static [&'static str] {
        &[
            SHOP_DOMAIN_OPTION,
            STOREFRONT_DOMAIN_OPTION,
            SHARED_APP_OPTION,
            "topic",
            "access_token",
            "api_base",
        ]
    }

    fn validate_tenant(&self, tenant: &TenantConfig) -> Result<(), String> {
        for name in [SHOP_DOMAIN_OPTION, STOREFRONT_DOMAIN_OPTION] {
            if let Some(value) = tenant.option(name) {
                let host_like = !value.is_empty()
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
                if !host_like {
                    return Err(format!(
                        "option `{name}` must be a domain name (`demo.myshopify.com`)"
                    ));
                }
            }
        }
        match tenant.option(SHARED_APP_OPTION) {
            None | Some("false") => Ok(()),
            Some("true") if tenant.option(SHOP_DOMAIN_OPTION).is_none() => Err(format!(
                "option `{SHARED_APP_OPTION}` needs `{SHOP_DOMAIN_OPTION}`: a shared secret says nothing about the shop"
            )),
            Some("true") => Ok(()),
            Some(_) => Err(format!(
                "option `{SHARED_APP_OPTION}` must be \"true\" or \"false\""
            )),
        }
    }

    /// 8 retries over 4 h.
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let candidates = candidates(request)?;
        if candidates.is_empty() {
            return Err(ProviderError::MissingHeader(HMAC[0].as_str()));
        }
        sig::verify_body_hmac_sha256(secrets, &candidates, &request.body)?;
        let envelope = extract(request, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let secret = sig::secrets(tenant)?[0].expose();
        let mac = sig::hmac_sha256(secret.as_bytes(), &[body]);
        let shop = match tenant.option(SHOP_DOMAIN_OPTION) {
            Some(d) => d.to_owned(),
            None => format!("{}.myshopify.com", tenant.tenant),
        };
        let topic = tenant.option("topic").unwrap_or(DEFAULT_TOPIC);
        let mut h = http::HeaderMap::new();
        sig::put(&mut h, &HMAC[0], &sig::B64.encode(mac))?;
        sig::put(&mut h, &TOPIC[0], topic)?;
        sig::put(&mut h, &SHOP[0], &shop)?;
        sig::put(&mut h, &EVENT_ID[0], event_id)?;
        sig::put(&mut h, &WEBHOOK_ID[0], &format!("{event_id}-{now_secs}"))?;
        sig::put(
            &mut h,
            &TRIGGERED_AT[0],
            &crate::time::format_rfc3339(now_secs),
        )?;
        sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        Ok(h)
    }

    fn reconcile(&self) -> Option<ReconcileSource> {
        Some(ReconcileSource {
            credential_option: "access_token",
            method: ReconcileMethod::ShopifyOrders,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};

    const BODY: &str = r#"{"id":820982911946154508,"email":"jon@example.com","updated_at":"2024-01-01T10:00:00-05:00","line_items":[{"id":1,"updated_at":"x"}]}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        TenantConfig {
            provider: "shopify".into(),
            tenant: "shop-1".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: [(
                "shop_domain".to_string(),
                "shop-1.myshopify.com".to_string(),
            )]
            .into(),
        }
    }

    fn mac(secret: &str, body: &str) -> String {
        sig::B64.encode(sig::hmac_sha256(secret.as_bytes(), &[body.as_bytes()]))
    }

    fn headers(hmacs: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in hmacs {
            h.append("X-Shopify-Hmac-Sha256", HeaderValue::from_str(v).unwrap());
        }
        h.insert("X-Shopify-Topic", HeaderValue::from_static("orders/create"));
        h.insert(
            "X-Shopify-Shop-Domain",
            HeaderValue::from_static("shop-1.myshopify.com"),
        );
        h.insert(
            "X-Shopify-Event-Id",
            HeaderValue::from_static("98880550-7158-44d4-b7cd-2c97c8a091b5"),
        );
        h.insert(
            "X-Shopify-Webhook-Id",
            HeaderValue::from_static("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
        );
        h.insert(
            "X-Shopify-Triggered-At",
            HeaderValue::from_static("2023-03-29T18:00:27.877041743Z"),
        );
        h
    }

    fn verify(h: HeaderMap, body: &str, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(h, body.to_owned());
        crate::providers::test_support::verify_one(&Shopify, &r, t, 0)
    }

    #[test]
    fn v11_vector() {
        let want = "UFwgrGBPZilFtmKh8TqcovA78LGYb1BdWu9I4Q2oyRg=";
        assert_eq!(mac("hush", "{}"), want);
        let env = verify(headers(&[want]), "{}", &tenant(&["hush"])).unwrap();
        assert_eq!(env.object_id, None);
        assert_eq!(env.object_version, None);
        assert_eq!(
            verify(headers(&[want]), "{} ", &tenant(&["hush"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn extracts_envelope() {
        let env = verify(headers(&[&mac("hush", BODY)]), BODY, &tenant(&["hush"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "shopify".into(),
                tenant: "shop-1".into(),
                event_id: "shop-1.myshopify.com:orders/create:98880550-7158-44d4-b7cd-2c97c8a091b5"
                    .into(),
                event_type: "orders/create".into(),
                object_id: Some("820982911946154508".into()),
                object_version: Some("2024-01-01T10:00:00-05:00".into()),
                occurred_at: Some(1_680_112_827),
                delivery_id: Some("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043".into()),
            }
        );
        let body = r#"{"id":"gid://shopify/Order/1","updated_at":null}"#;
        let env = verify(headers(&[&mac("hush", body)]), body, &tenant(&["hush"])).unwrap();
        assert_eq!(env.object_id.as_deref(), Some("gid://shopify/Order/1"));
        assert_eq!(env.object_version, None);
    }

    #[test]
    fn preview_header_names() {
        let mut h = HeaderMap::new();
        h.insert(
            "shopify-hmac-sha256",
            HeaderValue::from_str(&mac("hush", BODY)).unwrap(),
        );
        h.insert("shopify-topic", HeaderValue::from_static("orders/paid"));
        h.insert(
            "shopify-shop-domain",
            HeaderValue::from_static("SHOP-1.myshopify.com"),
        );
        h.insert("shopify-event-id", HeaderValue::from_static("e1"));
        let env = verify(h, BODY, &tenant(&["hush"])).unwrap();
        assert_eq!(env.event_id, "shop-1.myshopify.com:orders/paid:e1");
        assert_eq!((env.delivery_id, env.occurred_at), (None, None));
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let h = headers(&[&mac("hush", BODY)]);
        assert_eq!(
            verify(h.clone(), &BODY.replace("jon", "eve"), &tenant(&["hush"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(h, BODY, &tenant(&["other"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn rotation() {
        let both = tenant(&["new", "old"]);
        assert!(verify(headers(&[&mac("old", BODY)]), BODY, &both).is_ok());
        assert!(verify(headers(&[&mac("new", BODY)]), BODY, &both).is_ok());
        // Two signatures: as separate header values and comma-joined by API Gateway.
        let (o, n) = (mac("old", BODY), mac("new", BODY));
        assert!(verify(headers(&[&o, &n]), BODY, &tenant(&["new"])).is_ok());
        assert!(verify(headers(&[&format!("{o},{n}")]), BODY, &tenant(&["old"])).is_ok());
        assert!(verify(headers(&[&format!("{o}, {o}")]), BODY, &tenant(&["old"])).is_ok());
        assert_eq!(
            verify(headers(&[&o, &n]), BODY, &tenant(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn missing_and_garbled_headers() {
        let t = tenant(&["hush"]);
        assert_eq!(
            verify(headers(&[]), BODY, &t),
            Err(ProviderError::MissingHeader("x-shopify-hmac-sha256"))
        );
        assert_eq!(
            verify(headers(&[""]), BODY, &t),
            Err(ProviderError::MalformedHeader(
                "x-shopify-hmac-sha256",
                "empty value"
            ))
        );
        let garbled = ProviderError::MalformedHeader(
            "x-shopify-hmac-sha256",
            "signature is not valid base64",
        );
        assert_eq!(verify(headers(&["%%%"]), BODY, &t), Err(garbled));
        // Hex where base64 is expected decodes to the wrong length: a mismatch, not a panic.
        let hex_sig = hex::encode(sig::hmac_sha256(b"hush", &[BODY.as_bytes()]));
        assert_eq!(
            verify(headers(&[&hex_sig]), BODY, &t),
            Err(ProviderError::SignatureMismatch)
        );
        let mut h = headers(&[]);
        h.insert(
            "x-shopify-hmac-sha256",
            HeaderValue::from_bytes(b"\xfe\xff").unwrap(),
        );
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader(
                "x-shopify-hmac-sha256",
                "value is not visible ASCII"
            ))
        );
        assert_eq!(
            verify(headers(&[&mac("hush", BODY)]), BODY, &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn shop_domain_must_match() {
        let h = headers(&[&mac("hush", BODY)]);
        let mut t = tenant(&["hush"]);
        t.options
            .insert("shop_domain".into(), "other.myshopify.com".into());
        assert_eq!(
            verify(h.clone(), BODY, &t),
            Err(ProviderError::TenantMismatch("shop domain"))
        );
        let mut no_domain = h.clone();
        no_domain.remove("x-shopify-shop-domain");
        assert_eq!(
            verify(no_domain.clone(), BODY, &tenant(&["hush"])),
            Err(ProviderError::TenantMismatch("shop domain"))
        );
        t.options.clear();
        assert!(verify(h, BODY, &t).is_ok());
        assert_eq!(
            verify(no_domain, BODY, &t),
            Err(ProviderError::MalformedPayload(
                "missing X-Shopify-Shop-Domain header".into()
            ))
        );
    }

    /// An Order body naming its shop by `order_status_url` (as Shopify's samples do).
    fn order_of(host: &str) -> String {
        format!(
            r#"{{"id":820982911946154508,"admin_graphql_api_id":"gid://shopify/Order/820982911946154508","updated_at":"2024-01-01T10:00:00-05:00","order_status_url":"https://{host}/548380009/orders/123456abcd/authenticate?key=abcdefg"}}"#
        )
    }

    fn shared(mut t: TenantConfig) -> TenantConfig {
        t.options.insert(SHARED_APP_OPTION.into(), "true".into());
        t
    }

    #[test]
    fn body_shop_facts() {
        assert_eq!(
            body_shops(order_of("Shop-1.myshopify.com").as_bytes()).unwrap(),
            ["shop-1.myshopify.com"]
        );
        let shop_update = br#"{"id":548380009,"name":"John Smith Test Store","domain":"shop.apple.com","myshopify_domain":"jsmith.myshopify.com"}"#;
        assert_eq!(
            body_shops(shop_update).unwrap(),
            ["jsmith.myshopify.com", "shop.apple.com"]
        );
        // Userinfo, a port and a trailing dot do not hide the host.
        let tricky =
            br#"{"order_status_url":"https://shop-1.myshopify.com@demo.myshopify.com.:443/x"}"#;
        assert_eq!(body_shops(tricky).unwrap(), ["demo.myshopify.com"]);
        // admin_graphql_api_id names no shop; null and non-strings name nothing.
        let none = br#"{"id":1,"admin_graphql_api_id":"gid://shopify/Order/1","domain":null,"order_status_url":7}"#;
        assert!(body_shops(none).unwrap().is_empty());
        assert!(body_shops(BODY.as_bytes()).unwrap().is_empty());
        assert_eq!(url_host("ftp://x.myshopify.com/"), None);
    }

    #[test]
    fn a_body_signed_for_another_shop_is_refused_whatever_the_header_says() {
        // Shop demo's order, the header rewritten to shop-1's domain: same app secret.
        let body = order_of("demo.myshopify.com");
        let h = headers(&[&mac("hush", &body)]);
        for t in [tenant(&["hush"]), shared(tenant(&["hush"]))] {
            assert_eq!(
                verify(h.clone(), &body, &t),
                Err(ProviderError::TenantMismatch(
                    "the signed body names another shop"
                ))
            );
        }
        // Without `shop_domain` the header is the shop, and the body must agree with it.
        let mut t = tenant(&["hush"]);
        t.options.clear();
        assert_eq!(
            verify(h, &body, &t),
            Err(ProviderError::TenantMismatch(
                "the signed body names another shop"
            ))
        );
        assert!(ProviderError::TenantMismatch("").is_authentication_failure());
    }

    #[test]
    fn the_own_shop_is_accepted() {
        let body = order_of("shop-1.myshopify.com");
        let h = headers(&[&mac("hush", &body)]);
        for t in [tenant(&["hush"]), shared(tenant(&["hush"]))] {
            let env = verify(h.clone(), &body, &t).unwrap();
            assert_eq!(env.object_id.as_deref(), Some("820982911946154508"));
        }
        let shop_update =
            r#"{"id":1,"domain":"shop-1.myshopify.com","myshopify_domain":"SHOP-1.myshopify.com"}"#;
        let h = headers(&[&mac("hush", shop_update)]);
        assert!(verify(h, shop_update, &shared(tenant(&["hush"]))).is_ok());
        // A shop with a custom primary domain: `myshopify_domain` binds it.
        let shop_update =
            r#"{"id":1,"domain":"shop.example.com","myshopify_domain":"shop-1.myshopify.com"}"#;
        let h = headers(&[&mac("hush", shop_update)]);
        assert!(verify(h, shop_update, &shared(tenant(&["hush"]))).is_ok());
    }

    #[test]
    fn a_shared_secret_takes_only_bodies_that_name_the_shop() {
        let t = shared(tenant(&["hush"]));
        // refunds/create, fulfillments/create, …: nothing signed names the shop.
        let h = headers(&[&mac("hush", BODY)]);
        assert_eq!(
            verify(h.clone(), BODY, &t),
            Err(ProviderError::TenantMismatch(NOT_NAMED))
        );
        // A secret of this tenant alone: the same body is this shop's.
        assert!(verify(h, BODY, &tenant(&["hush"])).is_ok());
        // A custom storefront domain binds only when it is the tenant's.
        let body = order_of("shop.example.com");
        let h = headers(&[&mac("hush", &body)]);
        assert_eq!(
            verify(h.clone(), &body, &t),
            Err(ProviderError::TenantMismatch(NOT_NAMED))
        );
        assert!(verify(h.clone(), &body, &tenant(&["hush"])).is_ok());
        let mut own = t.clone();
        own.options
            .insert(STOREFRONT_DOMAIN_OPTION.into(), "Shop.Example.com".into());
        assert!(verify(h, &body, &own).is_ok());
    }

    #[test]
    fn tenant_options_are_checked() {
        let mut t = tenant(&["hush"]);
        assert_eq!(Shopify.validate_tenant(&t), Ok(()));
        t.options.insert(SHARED_APP_OPTION.into(), "yes".into());
        assert!(Shopify.validate_tenant(&t).is_err());
        t.options.insert(SHARED_APP_OPTION.into(), "true".into());
        assert_eq!(Shopify.validate_tenant(&t), Ok(()));
        t.options.remove(SHOP_DOMAIN_OPTION);
        assert!(Shopify.validate_tenant(&t).is_err());
        let mut t = tenant(&["hush"]);
        t.options
            .insert(SHOP_DOMAIN_OPTION.into(), "https://x.myshopify.com/".into());
        assert!(Shopify.validate_tenant(&t).is_err());
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&["hush"]);
        let mut h = headers(&[&mac("hush", BODY)]);
        h.remove("x-shopify-event-id");
        assert_eq!(
            verify(h, BODY, &t),
            Err(sig::payload_error("missing X-Shopify-Event-Id header"))
        );
        let mut h = headers(&[&mac("hush", BODY)]);
        h.remove("x-shopify-topic");
        assert_eq!(
            verify(h, BODY, &t),
            Err(sig::payload_error("missing X-Shopify-Topic header"))
        );
        let mut h = headers(&[&mac("hush", BODY)]);
        h.append("x-shopify-event-id", HeaderValue::from_static("other"));
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader(
                "x-shopify-event-id",
                "repeated with different values"
            ))
        );
        let body = "id=1&updated_at=2";
        let got = verify(headers(&[&mac("hush", body)]), body, &t);
        assert_eq!(got, Err(sig::payload_error("body is not a JSON object")));
        assert!(!got.unwrap_err().is_authentication_failure());
    }

    #[test]
    fn sign_round_trip() {
        let mut t = tenant(&["new", "old"]);
        t.options.insert("topic".into(), "orders/paid".into());
        let h = Shopify
            .sign(BODY.as_bytes(), &t, "ev-1", 1_700_000_000)
            .unwrap();
        let env = verify(h.clone(), BODY, &t).unwrap();
        assert_eq!(env.event_id, "shop-1.myshopify.com:orders/paid:ev-1");
        assert_eq!(env.occurred_at, Some(1_700_000_000));
        assert_eq!(env.delivery_id.as_deref(), Some("ev-1-1700000000"));
        assert_eq!(
            verify(h, BODY, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        // Defaults: topic orders/create, shop domain from the tenant name.
        t.options.clear();
        let h = Shopify.sign(b"{}", &t, "ev-2", 0).unwrap();
        assert_eq!(h["x-shopify-topic"], "orders/create");
        assert_eq!(h["x-shopify-shop-domain"], "shop-1.myshopify.com");
        assert!(Shopify.sign(b"{}", &t, "bad\nid", 0).is_err());
    }
}
