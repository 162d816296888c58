//! Adyen standard webhooks: the signature sits INSIDE the body, one per item.
//!
//! The body is `{"live":"false","notificationItems":[{"NotificationRequestItem":{…}}, …]}`.
//! Every `NotificationRequestItem` carries `additionalData.hmacSignature`: base64 of
//! HMAC-SHA256, keyed with the HEX-DECODED tenant secret, over
//! `pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success`
//! (missing fields are empty strings, `value` is the integer minor units in decimal,
//! `success` the literal string). See providers.md §2.6 and vector V6.
//!
//! Because the signature is part of what is parsed, the body is parsed first (typed,
//! borrowed structs; a duplicate field is an error, never a silent pick). Then EVERY
//! item is verified, and one bad or missing signature rejects the whole request
//! (`SignatureMismatch`) before anything is extracted or stored. Adyen's Python SDK
//! checks only the first item; we do not copy that.
//!
//! Each item becomes its own [`VerifiedEvent`]:
//! - `event_id` = `{merchantAccountCode}:{pspReference}:{eventCode}:{success}`. Adyen
//!   has no event id (providers.md §0.7, §3); these four fields are what Adyen repeats
//!   unchanged on every retry of the same notification, and `success` is part of it
//!   because a failed and a later successful AUTHORISATION of one payment are two
//!   different events.
//! - `event_type` = `eventCode`; `occurred_at` = `eventDate` (RFC 3339) when present.
//! - `object_id` = the payment the event is about: `originalReference` when present
//!   (Adyen sets it on modifications only — CAPTURE, REFUND, CANCELLATION, and also
//!   CANCEL_OR_REFUND, *_FAILED, …, where `pspReference` names the modification
//!   itself), otherwise `pspReference`.
//! - `body` = the raw bytes of that item's `NotificationRequestItem` object exactly as
//!   they appear in the request (a zero-copy slice of the request body, found with
//!   `serde_json::value::RawValue`), so what is stored is what Adyen signed and sent.
//!
//! Tenant: option `merchant_account`, when set, must equal every item's
//! `merchantAccountCode` (`TenantMismatch`).
//!
//! Secrets are hex keys (several during rotation); a secret that is not valid hex is
//! skipped, and when none is usable the result is `NoSecret`.
//!
//! Signing: the trait's `sign` can only add headers, and Adyen uses none. Tests and
//! tools sign a body with [`sign_notification`], which fills in every item's
//! `hmacSignature`; `sign` then only confirms that a body is already signed for the
//! tenant and returns an empty header map.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use bytes::Bytes;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Adyen;

const NAME: &str = "adyen";

/// A JSON string, borrowed from the body unless it contains escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Str<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Notification<'a> {
    #[serde(rename = "notificationItems", borrow)]
    items: Vec<Wrapper<'a>>,
}

#[derive(Deserialize)]
struct Wrapper<'a> {
    /// Kept raw: its exact bytes are what we store for this event.
    #[serde(rename = "NotificationRequestItem", borrow)]
    item: &'a RawValue,
}

#[derive(Deserialize)]
struct Amount<'a> {
    value: Option<i64>,
    #[serde(borrow)]
    currency: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct AdditionalData<'a> {
    #[serde(rename = "hmacSignature", borrow)]
    hmac_signature: Option<Str<'a>>,
}

/// The fields of one `NotificationRequestItem` we sign, key or extract; others are ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Item<'a> {
    #[serde(borrow)]
    psp_reference: Option<Str<'a>>,
    #[serde(borrow)]
    original_reference: Option<Str<'a>>,
    #[serde(borrow)]
    merchant_account_code: Option<Str<'a>>,
    #[serde(borrow)]
    merchant_reference: Option<Str<'a>>,
    #[serde(borrow)]
    amount: Option<Amount<'a>>,
    #[serde(borrow)]
    event_code: Option<Str<'a>>,
    #[serde(borrow)]
    success: Option<Str<'a>>,
    #[serde(borrow)]
    event_date: Option<Str<'a>>,
    #[serde(borrow)]
    additional_data: Option<AdditionalData<'a>>,
}

fn text<'b>(field: &'b Option<Str<'_>>) -> &'b str {
    field.as_ref().map_or("", |s| &s.0)
}

/// A required, non-empty field for the event id.
fn required<'b>(
    field: &'b Option<Str<'_>>,
    index: usize,
    name: &str,
) -> Result<&'b str, ProviderError> {
    match text(field) {
        "" => Err(sig::payload_error(format!(
            "notification item {index} lacks `{name}`"
        ))),
        v => Ok(v),
    }
}

impl Item<'_> {
    /// `psp:origRef:merchantAccountCode:merchantRef:value:currency:eventCode:success`.
    fn signing_string(&self) -> Vec<u8> {
        let amount = self.amount.as_ref();
        let value = amount.and_then(|a| a.value);
        let currency = amount.map_or("", |a| text(&a.currency));
        let mut out = Vec::with_capacity(128);
        for (i, part) in [
            text(&self.psp_reference),
            text(&self.original_reference),
            text(&self.merchant_account_code),
            text(&self.merchant_reference),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                out.push(b':');
            }
            out.extend_from_slice(part.as_bytes());
        }
        out.push(b':');
        if let Some(v) = value {
            if v < 0 {
                out.push(b'-');
            }
            out.extend_from_slice(sig::Decimal::new(v.unsigned_abs()).as_bytes());
        }
        for part in [currency, text(&self.event_code), text(&self.success)] {
            out.push(b':');
            out.extend_from_slice(part.as_bytes());
        }
        out
    }

    fn signature(&self) -> Option<&str> {
        let sig = self.additional_data.as_ref()?.hmac_signature.as_ref()?;
        Some(&*sig.0).filter(|s| !s.is_empty())
    }
}

/// serde_json's own messages can quote body values; report only kind and position.
fn json_error(what: &str, e: &serde_json::Error) -> ProviderError {
    let kind = match e.classify() {
        serde_json::error::Category::Syntax => "is not valid JSON",
        serde_json::error::Category::Eof => "is truncated JSON",
        serde_json::error::Category::Data => "does not have the notification structure",
        serde_json::error::Category::Io => "could not be read",
    };
    sig::payload_error(format!(
        "{what} {kind} (line {}, column {})",
        e.line(),
        e.column()
    ))
}

/// The usable (hex-decodable, non-empty) keys among the tenant's secrets.
fn keys(tenant: &TenantConfig) -> Result<Vec<Vec<u8>>, ProviderError> {
    let keys: Vec<Vec<u8>> = sig::secrets(tenant)?
        .iter()
        .filter_map(|s| sig::decode_hex("hmacSignature", s.expose()).ok())
        .filter(|k| !k.is_empty())
        .collect();
    if keys.is_empty() {
        return Err(ProviderError::NoSecret);
    }
    Ok(keys)
}

/// Parse the envelope and every item (no verification yet).
fn parse(body: &[u8]) -> Result<Vec<(&RawValue, Item<'_>)>, ProviderError> {
    // The items are stored and read by the domain: no repeated keys, valid UTF-8.
    super::json::check_object(body)?;
    let notification: Notification<'_> =
        serde_json::from_slice(body).map_err(|e| json_error("body", &e))?;
    if notification.items.is_empty() {
        return Err(sig::payload_error("notification has no items"));
    }
    notification
        .items
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let item: Item<'_> = serde_json::from_str(w.item.get())
                .map_err(|e| json_error(&format!("notification item {i}"), &e))?;
            Ok((w.item, item))
        })
        .collect()
}

/// Does `item` carry a valid signature under any of `keys`? A missing or undecodable
/// signature is simply a mismatch.
fn item_is_authentic(item: &Item<'_>, keys: &[Vec<u8>]) -> bool {
    let Some(given) = item.signature().and_then(|s| sig::B64.decode(s).ok()) else {
        return false;
    };
    let signed = item.signing_string();
    keys.iter()
        .any(|k| sig::ct_eq(&sig::hmac_sha256(k, &[&signed]), &given))
}

fn envelope(
    item: &Item<'_>,
    index: usize,
    tenant: &TenantConfig,
) -> Result<Envelope, ProviderError> {
    let merchant = required(&item.merchant_account_code, index, "merchantAccountCode")?;
    if let Some(want) = tenant.option("merchant_account") {
        if want != merchant {
            return Err(ProviderError::TenantMismatch("merchantAccountCode"));
        }
    }
    let psp = required(&item.psp_reference, index, "pspReference")?;
    let code = required(&item.event_code, index, "eventCode")?;
    let success = required(&item.success, index, "success")?;
    let event_id = format!("{merchant}:{psp}:{code}:{success}");
    sig::check_event_id(&event_id)?;
    let object_id = match text(&item.original_reference) {
        "" => psp,
        original => original,
    };
    Ok(Envelope {
        provider: NAME.into(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type: code.to_owned(),
        object_id: Some(object_id.to_owned()),
        object_version: None,
        occurred_at: item
            .event_date
            .as_ref()
            .and_then(|d| crate::time::parse_rfc3339(&d.0)),
        delivery_id: None,
    })
}

/// Return `body` with every item's `additionalData.hmacSignature` set for `hex_key`
/// (creating `additionalData` when absent). For tests and tools: the result is
/// re-serialized compactly by serde_json (object keys may be reordered), which does
/// not matter because the signature covers fields, not bytes. A key that is not hex
/// gives `NoSecret`; a body that is not a notification gives `MalformedPayload`.
pub fn sign_notification(body: &[u8], hex_key: &str) -> Result<Vec<u8>, ProviderError> {
    let key = sig::decode_hex("hmacSignature", hex_key).map_err(|_| ProviderError::NoSecret)?;
    if key.is_empty() {
        return Err(ProviderError::NoSecret);
    }
    let mut value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| json_error("body", &e))?;
    let items = value
        .get_mut("notificationItems")
        .and_then(serde_json::Value::as_array_mut)
        .ok_or_else(|| sig::payload_error("body has no `notificationItems` array"))?;
    for (i, wrapper) in items.iter_mut().enumerate() {
        let item = wrapper
            .get_mut("NotificationRequestItem")
            .and_then(serde_json::Value::as_object_mut)
            .ok_or_else(|| sig::payload_error(format!("notification item {i} is not an object")))?;
        let text = serde_json::to_string(&*item).map_err(|e| json_error("item", &e))?;
        let parsed: Item<'_> = serde_json::from_str(&text)
            .map_err(|e| json_error(&format!("notification item {i}"), &e))?;
        let mac = sig::hmac_sha256(&key, &[&parsed.signing_string()]);
        let additional = item
            .entry("additionalData")
            .or_insert_with(|| serde_json::json!({}));
        let additional = additional.as_object_mut().ok_or_else(|| {
            sig::payload_error(format!(
                "notification item {i}: additionalData is not an object"
            ))
        })?;
        additional.insert(
            "hmacSignature".into(),
            serde_json::Value::String(sig::B64.encode(mac)),
        );
    }
    serde_json::to_vec(&value).map_err(|e| json_error("body", &e))
}

/// Header of Adyen's platform webhooks (Balance Platform, Management API), which sign
/// the raw body instead of each item. The name is UNCONFIRMED in providers.md; both
/// spellings are case-insensitive header lookups anyway.
static PLATFORM_SIGNATURE: http::HeaderName = http::HeaderName::from_static("hmacsignature");

/// Base64 HMAC-SHA256 of the raw body with a hex key: the platform-webhook signature.
pub fn payload_hmac(body: &[u8], hex_key: &str) -> Result<String, ProviderError> {
    let key = sig::decode_hex("hmacSignature", hex_key).map_err(|_| ProviderError::NoSecret)?;
    Ok(sig::B64.encode(sig::hmac_sha256(&key, &[body])))
}

/// Platform webhooks: verify the raw body, then key the event on stable fields. They
/// carry no event id, so the key is `platform:{type}:{data id}:{created}` where the
/// data id is `data.id`, else `data.merchantId`, else `data.companyId`, and created is
/// `createdAt`, else `timestamp`: all unchanged when Adyen retries the same payload.
fn verify_platform(
    request: &WebhookRequest,
    tenant: &TenantConfig,
    signature: &str,
) -> Result<Vec<VerifiedEvent>, ProviderError> {
    let keys = keys(tenant)?;
    let given = sig::decode_base64("hmacsignature", signature.trim())?;
    let body = &request.body[..];
    if !keys
        .iter()
        .any(|k| sig::ct_eq(&sig::hmac_sha256(k, &[body]), &given))
    {
        return Err(ProviderError::SignatureMismatch);
    }
    let [kind, id, merchant, company, created, timestamp] = json::json_fields(
        body,
        [
            &["type"],
            &["data", "id"],
            &["data", "merchantId"],
            &["data", "companyId"],
            &["createdAt"],
            &["timestamp"],
        ],
    )?;
    let kind = kind
        .and_then(Raw::str)
        .ok_or_else(|| sig::payload_error("platform webhook has no `type`"))?;
    let object = [id, merchant, company]
        .into_iter()
        .find_map(|v| v.and_then(Raw::text))
        .ok_or_else(|| sig::payload_error("platform webhook has no data id"))?;
    let created = [created, timestamp]
        .into_iter()
        .find_map(|v| v.and_then(Raw::text))
        .ok_or_else(|| sig::payload_error("platform webhook has no createdAt/timestamp"))?;
    let event_id = format!("platform:{kind}:{object}:{created}");
    sig::check_event_id(&event_id)?;
    let envelope = Envelope {
        provider: NAME.to_string(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type: kind.into_owned(),
        object_id: Some(object.into_owned()),
        object_version: None,
        occurred_at: crate::time::parse_rfc3339(&created),
        delivery_id: None,
    };
    Ok(VerifiedEvent::whole(envelope, request))
}

impl Provider for Adyen {
    fn name(&self) -> &'static str {
        NAME
    }

    fn options(&self) -> &'static [&'static str] {
        &["merchant_account"]
    }

    /// 3 quick retries, then a queue for up to 30 days.
    fn retry_window_days(&self) -> u32 {
        30
    }

    /// Adyen's notification contract: answer `[accepted]` once every item is stored.
    fn accepted_body(&self) -> Option<&'static str> {
        Some("[accepted]")
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        // No signed timestamp: replay protection is the dedup store (providers.md §0.6).
        if let Some(signature) = request.header(PLATFORM_SIGNATURE.as_str()) {
            return verify_platform(request, tenant, signature);
        }
        let keys = keys(tenant)?;
        let body = &request.body;
        let items = parse(body)?;
        // Every item first: one bad signature rejects the request before any extraction.
        if !items.iter().all(|(_, item)| item_is_authentic(item, &keys)) {
            return Err(ProviderError::SignatureMismatch);
        }
        items
            .iter()
            .enumerate()
            .map(|(i, (raw, item))| {
                Ok(VerifiedEvent {
                    envelope: envelope(item, i, tenant)?,
                    // `raw` borrows from `request.body`, so this is a zero-copy slice.
                    body: body.slice_ref(raw.get().as_bytes()),
                })
            })
            .collect()
    }

    /// Adyen sends no signature header, so there is nothing to add: this only checks
    /// that `body` is already signed for `tenant` (see [`sign_notification`]) and
    /// returns an empty header map, so tools fail loudly on an unsigned body.
    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let request = WebhookRequest::post(http::HeaderMap::new(), Bytes::copy_from_slice(body));
        match self.verify_and_extract(&request, tenant, now_secs) {
            Ok(_) => Ok(http::HeaderMap::new()),
            Err(ProviderError::SignatureMismatch) => Err(sig::payload_error(
                "Adyen signs inside the body: sign it with providers::adyen::sign_notification",
            )),
            Err(e) => Err(e),
        }
    }

    /// Adyen signs inside each item: fill in every `hmacSignature` with the first key.
    fn signed_request(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        _now_secs: i64,
    ) -> Result<(http::HeaderMap, bytes::Bytes), ProviderError> {
        let key = sig::secrets(tenant)?[0].expose();
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok((headers, sign_notification(body, key)?.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    /// providers.md V6 (Adyen python SDK `test_notification_request_item_hmac`).
    const V6_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    const V6_STRING: &str =
        "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true";
    const V6_SIG: &str = "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=";
    const OTHER_KEY: &str = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF";

    fn v6_item(signature: &str) -> String {
        format!(
            r#"{{"additionalData":{{"hmacSignature":"{signature}","authCode":"58747"}},"amount":{{"currency":"EUR","value":1130}},"eventCode":"AUTHORISATION","eventDate":"2014-08-06T13:39:06+02:00","merchantAccountCode":"TestMerchant","merchantReference":"TestPayment-1407325143704","operations":["CANCEL","CAPTURE","REFUND"],"paymentMethod":"visa","pspReference":"7914073381342284","success":"true"}}"#
        )
    }

    fn wrap(items: &[String]) -> String {
        let items: Vec<String> = items
            .iter()
            .map(|i| format!(r#"{{"NotificationRequestItem":{i}}}"#))
            .collect();
        format!(
            r#"{{"live":"false","notificationItems":[{}]}}"#,
            items.join(",")
        )
    }

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant(NAME, secrets)
    }

    fn req(body: impl Into<Bytes>) -> WebhookRequest {
        WebhookRequest::post(HeaderMap::new(), body)
    }

    fn verify(body: &[u8], t: &TenantConfig) -> Result<Vec<VerifiedEvent>, ProviderError> {
        Adyen.verify_and_extract(&req(body.to_vec()), t, 0)
    }

    /// An unsigned item with the given reference, code and amount.
    fn item(psp: &str, code: &str, value: i64, original: Option<&str>) -> String {
        let mut v = serde_json::json!({
            "amount": {"currency": "EUR", "value": value},
            "eventCode": code,
            "eventDate": "2024-01-01T10:00:00+01:00",
            "merchantAccountCode": "TestMerchant",
            "merchantReference": format!("order-{psp}"),
            "pspReference": psp,
            "success": "true",
        });
        if let Some(o) = original {
            v["originalReference"] = o.into();
        }
        v.to_string()
    }

    fn signed(items: &[String], key: &str) -> Vec<u8> {
        sign_notification(wrap(items).as_bytes(), key).unwrap()
    }

    #[test]
    fn v6_vector() {
        let body = wrap(&[v6_item(V6_SIG)]);
        let items = parse(body.as_bytes()).unwrap();
        assert_eq!(items[0].1.signing_string(), V6_STRING.as_bytes());
        let key = hex::decode(V6_KEY).unwrap();
        let mac = sig::hmac_sha256(&key, &[V6_STRING.as_bytes()]);
        assert_eq!(sig::B64.encode(mac), V6_SIG);

        let events = verify(body.as_bytes(), &tenant(&[V6_KEY])).unwrap();
        assert_eq!(events.len(), 1);
        let env = &events[0].envelope;
        assert_eq!(
            env.event_id,
            "TestMerchant:7914073381342284:AUTHORISATION:true"
        );
        assert_eq!(env.event_type, "AUTHORISATION");
        assert_eq!(env.object_id.as_deref(), Some("7914073381342284"));
        assert_eq!(env.occurred_at, Some(1_407_325_146));
        assert_eq!(env.delivery_id, None);
        assert_eq!(env.provider, "adyen");
        assert_eq!(env.tenant, "acme");
        // The stored body is the item's raw bytes, exactly as sent.
        assert_eq!(&events[0].body[..], v6_item(V6_SIG).as_bytes());

        // sign_notification reproduces the vector; lower-case hex keys work too.
        let resigned =
            sign_notification(wrap(&[v6_item("")]).as_bytes(), &V6_KEY.to_lowercase()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&resigned).unwrap();
        assert_eq!(
            v["notificationItems"][0]["NotificationRequestItem"]["additionalData"]["hmacSignature"],
            V6_SIG
        );
    }

    #[test]
    fn missing_fields_sign_as_empty_strings() {
        let body = wrap(&[
            r#"{"pspReference":"p","eventCode":"REPORT_AVAILABLE","success":"true"}"#.into(),
        ]);
        let items = parse(body.as_bytes()).unwrap();
        assert_eq!(items[0].1.signing_string(), b"p::::::REPORT_AVAILABLE:true");
        let body = wrap(&[r#"{"amount":{"value":-5,"currency":"EUR"}}"#.into()]);
        let items = parse(body.as_bytes()).unwrap();
        assert_eq!(items[0].1.signing_string(), b"::::-5:EUR::");
    }

    #[test]
    fn multi_item_request_yields_one_event_per_item_with_its_own_bytes() {
        let body = signed(
            &[
                item("psp1", "AUTHORISATION", 1000, None),
                item("psp2", "CAPTURE", 1000, Some("psp1")),
                item("psp3", "REFUND", 500, Some("psp1")),
            ],
            V6_KEY,
        );
        let events = verify(&body, &tenant(&[V6_KEY])).unwrap();
        let ids: Vec<_> = events
            .iter()
            .map(|e| e.envelope.event_id.as_str())
            .collect();
        assert_eq!(
            ids,
            [
                "TestMerchant:psp1:AUTHORISATION:true",
                "TestMerchant:psp2:CAPTURE:true",
                "TestMerchant:psp3:REFUND:true",
            ]
        );
        let objects: Vec<_> = events
            .iter()
            .map(|e| e.envelope.object_id.as_deref().unwrap())
            .collect();
        assert_eq!(objects, ["psp1", "psp1", "psp1"]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.envelope.occurred_at, Some(1_704_099_600));
            // Each stored body is a sub-slice of the request body: that item's object.
            let stored: serde_json::Value = serde_json::from_slice(&e.body).unwrap();
            assert_eq!(stored, v["notificationItems"][i]["NotificationRequestItem"]);
            let at = body.windows(e.body.len()).position(|w| w == &e.body[..]);
            assert!(at.is_some());
        }
    }

    #[test]
    fn tampered_amount_is_rejected() {
        let body = signed(&[item("psp1", "AUTHORISATION", 1130, None)], V6_KEY);
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("\"value\":1130"));
        let tampered = text.replace("\"value\":1130", "\"value\":1131");
        assert_eq!(
            verify(tampered.as_bytes(), &tenant(&[V6_KEY])).unwrap_err(),
            ProviderError::SignatureMismatch
        );
        let tampered = text.replace("\"currency\":\"EUR\"", "\"currency\":\"USD\"");
        assert_eq!(
            verify(tampered.as_bytes(), &tenant(&[V6_KEY])).unwrap_err(),
            ProviderError::SignatureMismatch
        );
    }

    #[test]
    fn wrong_key_is_rejected() {
        let body = signed(&[item("psp1", "AUTHORISATION", 1, None)], OTHER_KEY);
        assert_eq!(
            verify(&body, &tenant(&[V6_KEY])).unwrap_err(),
            ProviderError::SignatureMismatch
        );
    }

    #[test]
    fn rotated_keys_accept_old_and_new() {
        let t = tenant(&[V6_KEY, OTHER_KEY]);
        for key in [V6_KEY, OTHER_KEY] {
            let body = signed(&[item("psp1", "AUTHORISATION", 1, None)], key);
            assert_eq!(verify(&body, &t).unwrap().len(), 1);
        }
        // Items of one request may even be signed with different keys mid-rotation.
        let a = signed(&[item("psp1", "AUTHORISATION", 1, None)], V6_KEY);
        let b = signed(&[item("psp2", "AUTHORISATION", 1, None)], OTHER_KEY);
        let pick = |body: &[u8]| {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            v["notificationItems"][0]["NotificationRequestItem"].to_string()
        };
        let mixed = wrap(&[pick(&a), pick(&b)]);
        assert_eq!(verify(mixed.as_bytes(), &t).unwrap().len(), 2);
    }

    #[test]
    fn one_bad_item_rejects_the_whole_request() {
        let good = signed(
            &[
                item("psp1", "AUTHORISATION", 1, None),
                item("psp2", "AUTHORISATION", 2, None),
                item("psp3", "AUTHORISATION", 3, None),
            ],
            V6_KEY,
        );
        let text = String::from_utf8(good).unwrap();
        let bad = text.replace("\"value\":2", "\"value\":20");
        assert_eq!(
            verify(bad.as_bytes(), &tenant(&[V6_KEY])).unwrap_err(),
            ProviderError::SignatureMismatch
        );
    }

    #[test]
    fn missing_signature_is_rejected() {
        let no_field = v6_item(V6_SIG).replace(
            r#""hmacSignature":"coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=","#,
            "",
        );
        assert!(!no_field.contains("hmacSignature"));
        let empty = v6_item("");
        let no_additional = item("7914073381342284", "AUTHORISATION", 1130, None);
        let signed_one = v6_item(V6_SIG);
        for unsigned in [no_field, empty, no_additional] {
            for body in [
                wrap(std::slice::from_ref(&unsigned)),
                wrap(&[signed_one.clone(), unsigned.clone()]),
            ] {
                assert_eq!(
                    verify(body.as_bytes(), &tenant(&[V6_KEY])).unwrap_err(),
                    ProviderError::SignatureMismatch,
                    "{body}"
                );
            }
        }
    }

    #[test]
    fn garbled_base64_is_a_mismatch() {
        for garbled in [
            "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0", // unpadded: still accepted
            "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo1=", // non-canonical last char
            "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCW!0=",
            "not base64 at all",
            "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=coqC",
        ] {
            let r = verify(wrap(&[v6_item(garbled)]).as_bytes(), &tenant(&[V6_KEY]));
            if garbled.len() == 43 {
                assert!(r.is_ok(), "padding is optional");
            } else {
                assert_eq!(
                    r.unwrap_err(),
                    ProviderError::SignatureMismatch,
                    "{garbled}"
                );
            }
        }
    }

    #[test]
    fn unusable_keys_are_skipped() {
        let body = wrap(&[v6_item(V6_SIG)]);
        for bad in ["not hex", "ABC", "zz"] {
            assert_eq!(
                verify(body.as_bytes(), &tenant(&[bad])).unwrap_err(),
                ProviderError::NoSecret,
                "{bad}"
            );
        }
        assert_eq!(
            verify(body.as_bytes(), &tenant(&[])).unwrap_err(),
            ProviderError::NoSecret
        );
        assert_eq!(
            verify(body.as_bytes(), &tenant(&["not hex", V6_KEY]))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            sign_notification(body.as_bytes(), "xyz"),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn malformed_bodies_are_malformed_payloads() {
        let t = tenant(&[V6_KEY]);
        for bad in [
            "",
            "not json",
            r#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"secretvalue"}"#,
            r#"{"live":"false"}"#,
            r#"{"notificationItems":{}}"#,
            r#"[1,2]"#,
            r#"{"notificationItems":[{"Other":{}}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":null}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":{"pspReference":"secretvalue","pspReference":"x"}}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":{"amount":{"value":"secretvalue"}}}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":{"success":true}}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":{"amount":{"value":1.5}}}]}"#,
        ] {
            let err = verify(bad.as_bytes(), &t).unwrap_err();
            assert!(
                matches!(err, ProviderError::MalformedPayload(_)),
                "{bad}: {err:?}"
            );
            assert!(!err.to_string().contains("secretvalue"), "{err}");
            assert!(!err.is_authentication_failure());
        }
    }

    #[test]
    fn zero_items_is_malformed() {
        let err = verify(
            br#"{"live":"false","notificationItems":[]}"#,
            &tenant(&[V6_KEY]),
        );
        assert_eq!(
            err.unwrap_err(),
            ProviderError::MalformedPayload("notification has no items".into())
        );
    }

    #[test]
    fn authentic_item_without_id_fields_is_malformed() {
        // Signed, but no pspReference: cannot build an event id.
        let body = sign_notification(
            wrap(&[r#"{"merchantAccountCode":"TestMerchant","eventCode":"REPORT_AVAILABLE","success":"true"}"#.into()]).as_bytes(),
            V6_KEY,
        )
        .unwrap();
        assert_eq!(
            verify(&body, &tenant(&[V6_KEY])).unwrap_err(),
            ProviderError::MalformedPayload("notification item 0 lacks `pspReference`".into())
        );
    }

    #[test]
    fn tenant_merchant_account_must_match_every_item() {
        let mut t = tenant(&[V6_KEY]);
        t.options
            .insert("merchant_account".into(), "TestMerchant".into());
        let body = wrap(&[v6_item(V6_SIG)]);
        assert_eq!(verify(body.as_bytes(), &t).unwrap().len(), 1);

        let other = sign_notification(
            wrap(&[item("p2", "AUTHORISATION", 1, None).replace("TestMerchant", "OtherMerchant")])
                .as_bytes(),
            V6_KEY,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&other).unwrap();
        let other_item = v["notificationItems"][0]["NotificationRequestItem"].to_string();
        let mixed = wrap(&[v6_item(V6_SIG), other_item]);
        let err = verify(mixed.as_bytes(), &t).unwrap_err();
        assert_eq!(err, ProviderError::TenantMismatch("merchantAccountCode"));
        assert!(err.is_authentication_failure());
        // Without the option, any merchant account of this key is accepted.
        assert_eq!(
            verify(mixed.as_bytes(), &tenant(&[V6_KEY])).unwrap().len(),
            2
        );
    }

    #[test]
    fn event_id_is_stable_across_retries() {
        // A retry may be serialized differently (order, whitespace, escapes); the
        // signature covers fields, and so does the event id.
        let first = wrap(&[v6_item(V6_SIG)]);
        let v: serde_json::Value = serde_json::from_str(&first).unwrap();
        let retry = serde_json::to_string_pretty(&v)
            .unwrap()
            .replace("TestPayment-", "TestPayment\\u002d");
        assert_ne!(first, retry);
        let t = tenant(&[V6_KEY]);
        let a = verify(first.as_bytes(), &t).unwrap();
        let b = verify(retry.as_bytes(), &t).unwrap();
        assert_eq!(a[0].envelope, b[0].envelope);
        assert_eq!(a[0].envelope.key(), b[0].envelope.key());
        // The other outcome of the same payment is a different event.
        let failed = sign_notification(
            wrap(&[v6_item("").replace(r#""success":"true""#, r#""success":"false""#)]).as_bytes(),
            V6_KEY,
        )
        .unwrap();
        let c = verify(&failed, &t).unwrap();
        assert_eq!(
            c[0].envelope.event_id,
            "TestMerchant:7914073381342284:AUTHORISATION:false"
        );
    }

    #[test]
    fn sign_returns_no_headers_and_refuses_unsigned_bodies() {
        let t = tenant(&[V6_KEY]);
        let signed_body = wrap(&[v6_item(V6_SIG)]);
        let headers = Adyen.sign(signed_body.as_bytes(), &t, "", 0).unwrap();
        assert!(headers.is_empty());
        let err = Adyen
            .sign(wrap(&[v6_item("")]).as_bytes(), &t, "", 0)
            .unwrap_err();
        assert!(matches!(err, ProviderError::MalformedPayload(_)), "{err:?}");
        assert!(crate::providers::lookup("adyen").is_some());
    }

    const V7_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    /// providers.md V7: the exact 546-character payload of the Python SDK's
    /// `test_is_valid_hmac_payload`, leading newline and indentation included.
    const V7_PAYLOAD: &str = concat!(
        "\n        {\n",
        "            \"type\": \"merchant.created\",\n",
        "            \"environment\": \"test\",\n",
        "            \"createdAt\": \"01-01-2024\",\n",
        "            \"data\": {\n",
        "                \"capabilities\": {\n",
        "                    \"sendToTransferInstrument\": {\n",
        "                        \"requested\": true,\n",
        "                        \"requestedLevel\": \"notApplicable\"\n",
        "                    }\n",
        "                },\n",
        "                \"companyId\": \"YOUR_COMPANY_ID\",\n",
        "                \"merchantId\": \"YOUR_MERCHANT_ACCOUNT\",\n",
        "                \"status\": \"PreActive\"\n",
        "            }\n",
        "        }\n",
        "        "
    );

    fn platform_request(body: &str, signature: &str) -> WebhookRequest {
        let mut headers = http::HeaderMap::new();
        headers.insert("HmacSignature", signature.parse().unwrap());
        WebhookRequest::post(headers, body.to_owned())
    }

    #[test]
    fn v7_payload_hmac_vector_and_own_vector() {
        assert_eq!(V7_PAYLOAD.len(), 546);
        assert_eq!(
            payload_hmac(V7_PAYLOAD.as_bytes(), V7_KEY).unwrap(),
            "fX74xUdztFmaXAn3IusMFFUBUSkLmDQUK0tm8xL6ZTU="
        );
        assert_eq!(
            payload_hmac(br#"{"a":1}"#, V7_KEY).unwrap(),
            "sopa0BeSQdruGUL8JgyYbeHxoBY41sd5YDAMO/M4gPY="
        );
    }

    #[test]
    fn platform_webhook_verifies_the_raw_body_and_keys_on_stable_fields() {
        let t = tenant(&[V7_KEY]);
        let events = Adyen
            .verify_and_extract(
                &platform_request(V7_PAYLOAD, "fX74xUdztFmaXAn3IusMFFUBUSkLmDQUK0tm8xL6ZTU="),
                &t,
                0,
            )
            .unwrap();
        assert_eq!(events.len(), 1);
        let env = &events[0].envelope;
        assert_eq!(
            env.event_id,
            "platform:merchant.created:YOUR_MERCHANT_ACCOUNT:01-01-2024"
        );
        assert_eq!(env.event_type, "merchant.created");
        // The SDK's own negative case, a tampered body, and a wrong key.
        let bad = platform_request(V7_PAYLOAD, "MismatchingHmacKey=");
        assert!(Adyen.verify_and_extract(&bad, &t, 0).is_err());
        let tampered = V7_PAYLOAD.replace("PreActive", "Active");
        let sig = "fX74xUdztFmaXAn3IusMFFUBUSkLmDQUK0tm8xL6ZTU=";
        assert_eq!(
            Adyen.verify_and_extract(&platform_request(&tampered, sig), &t, 0),
            Err(ProviderError::SignatureMismatch)
        );
        let other = tenant(&["00112233445566778899AABBCCDDEEFF"]);
        assert_eq!(
            Adyen.verify_and_extract(&platform_request(V7_PAYLOAD, sig), &other, 0),
            Err(ProviderError::SignatureMismatch)
        );
        // Rotation: the old key still verifies next to a new one.
        let rotated = tenant(&["00112233445566778899AABBCCDDEEFF", V7_KEY]);
        assert!(Adyen
            .verify_and_extract(&platform_request(V7_PAYLOAD, sig), &rotated, 0)
            .is_ok());
        // Garbled signature header: a clean error, no panic.
        let garbled = platform_request(V7_PAYLOAD, "***");
        assert!(matches!(
            Adyen.verify_and_extract(&garbled, &t, 0),
            Err(ProviderError::MalformedHeader(..))
        ));
    }
}
