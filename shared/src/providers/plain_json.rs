//! The envelope description shared by the plain-JSON providers: a body that is one JSON
//! object naming its own event id and type (Stripe, Paddle, Square, Klarna, Mollie
//! next-gen, Slack, PayPal and most of the newer providers). Each such provider states
//! where its facts live in one `static` [`PlainJson`]; [`PlainJson::extract`] reads them
//! from the authenticated body in one pass of the strict reader (`json.rs`).

use std::borrow::Cow;

use super::json::{self, Raw};
use super::ProviderError;
use crate::config::TenantConfig;
use crate::envelope::Envelope;

/// A path into the body, e.g. `&["data", "object", "id"]`.
pub type Path = &'static [&'static str];

/// Where a plain-JSON provider's body carries the envelope's facts.
pub struct PlainJson {
    /// The provider's path name (`Envelope::provider`).
    pub provider: &'static str,
    /// The event id (a JSON string, required), with the messages for a missing one and
    /// one that is not a string; they name the provider's own field.
    pub event_id: (Path, &'static str, &'static str),
    /// The event type: the first of these paths holding a non-empty string, else the
    /// message.
    pub event_type: (&'static [Path], &'static str),
    /// The object the event is about: the first of these paths present (string or
    /// integer).
    pub object_id: &'static [Path],
    /// When it happened: integer Unix seconds or RFC 3339.
    pub occurred_at: Option<Path>,
    /// A per-delivery id for logs (never for dedup).
    pub delivery_id: Option<Path>,
    /// The tenant check: the option that names the tenant's account and where the body
    /// names it.
    pub tenant: Option<TenantField>,
}

/// A body field that must equal a tenant option when the tenant sets it.
pub struct TenantField {
    pub option: &'static str,
    pub path: Path,
    /// `true`: a body without the field passes (Stripe: only Connect events carry
    /// `account`); `false`: the body must name the option's value.
    pub absent_passes: bool,
}

/// The reader takes a fixed number of paths; unused slots are the empty path, which
/// never matches a key.
const SLOTS: usize = 10;
const NONE: Path = &[];

impl PlainJson {
    /// The envelope of an authenticated body (see the module docs).
    pub fn extract(&self, body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
        let (types, missing_type) = self.event_type;
        assert!(
            types.len() + self.object_id.len() <= SLOTS - 4,
            "a PlainJson description fits the reader's slots"
        );
        let mut paths = [NONE; SLOTS];
        paths[0] = self.event_id.0;
        paths[1] = self.occurred_at.unwrap_or(NONE);
        paths[2] = self.delivery_id.unwrap_or(NONE);
        paths[3] = self.tenant.as_ref().map_or(NONE, |t| t.path);
        let types_at = 4;
        let objects_at = types_at + types.len();
        paths[types_at..objects_at].copy_from_slice(types);
        paths[objects_at..objects_at + self.object_id.len()].copy_from_slice(self.object_id);
        let fields = json::json_fields(body, paths)?;

        let (_, missing, not_string) = self.event_id;
        let id = json::required_event_id(fields[0], missing, not_string)?;
        let kind = fields[types_at..objects_at]
            .iter()
            .find_map(|f| f.and_then(Raw::str).filter(|k| !k.is_empty()))
            .ok_or_else(|| super::sig::payload_error(missing_type))?;
        if let Some(check) = &self.tenant {
            if let Some(want) = tenant.option(check.option) {
                let got = fields[3].and_then(Raw::str);
                let passes = match got {
                    None => check.absent_passes,
                    Some(got) => got == want,
                };
                if !passes {
                    return Err(ProviderError::TenantMismatch(check.option));
                }
            }
        }
        let object_id = fields[objects_at..objects_at + self.object_id.len()]
            .iter()
            .find_map(|f| *f)
            .and_then(Raw::text);
        Ok(Envelope {
            provider: self.provider.into(),
            tenant: tenant.tenant.clone(),
            event_id: id.into_owned(),
            event_type: kind.into_owned(),
            object_id: object_id.map(Cow::into_owned),
            object_version: None,
            occurred_at: self.occurred_at.and(fields[1]).and_then(Raw::time),
            delivery_id: self
                .delivery_id
                .and(fields[2])
                .and_then(Raw::text)
                .map(Cow::into_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static SPEC: PlainJson = PlainJson {
        provider: "p",
        event_id: (&["id"], "missing `id`", "`id` is not a string"),
        event_type: (&[&["event", "type"], &["type"]], "missing `type`"),
        object_id: &[&["data", "id"], &["ref"]],
        occurred_at: Some(&["at"]),
        delivery_id: Some(&["delivery"]),
        tenant: Some(TenantField {
            option: "account",
            path: &["account"],
            absent_passes: false,
        }),
    };

    fn tenant(account: Option<&str>) -> TenantConfig {
        let mut t = crate::providers::test_support::tenant("p", &["s"]);
        if let Some(a) = account {
            t.options.insert("account".into(), a.into());
        }
        t
    }

    #[test]
    fn reads_each_fact_from_its_path_with_fallbacks() {
        let body = br#"{"id":"e1","type":"outer","event":{"type":""},"ref":7,"at":"2024-01-01T00:00:00Z","delivery":"d1","account":"A"}"#;
        let env = SPEC.extract(body, &tenant(Some("A"))).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "p".into(),
                tenant: "acme".into(),
                event_id: "e1".into(),
                event_type: "outer".into(),
                object_id: Some("7".into()),
                object_version: None,
                occurred_at: Some(1_704_067_200),
                delivery_id: Some("d1".into()),
            }
        );
        let env = SPEC
            .extract(
                br#"{"id":"e1","event":{"type":"inner"},"type":"outer","data":{"id":"o"},"ref":1}"#,
                &tenant(None),
            )
            .unwrap();
        assert_eq!(
            (&*env.event_type, env.object_id.as_deref()),
            ("inner", Some("o"))
        );
    }

    #[test]
    fn names_what_is_missing_and_checks_the_tenant() {
        let t = tenant(None);
        let err = |body: &[u8], t: &TenantConfig| SPEC.extract(body, t).unwrap_err();
        assert_eq!(
            err(br#"{"type":"x"}"#, &t),
            super::super::sig::payload_error("missing `id`")
        );
        assert_eq!(
            err(br#"{"id":1,"type":"x"}"#, &t),
            super::super::sig::payload_error("`id` is not a string")
        );
        assert_eq!(
            err(br#"{"id":"e","type":""}"#, &t),
            super::super::sig::payload_error("missing `type`")
        );
        let body = br#"{"id":"e","type":"x","account":"B"}"#;
        assert_eq!(
            err(body, &tenant(Some("A"))),
            ProviderError::TenantMismatch("account")
        );
        assert_eq!(
            err(br#"{"id":"e","type":"x"}"#, &tenant(Some("A"))),
            ProviderError::TenantMismatch("account")
        );
        assert!(SPEC.extract(body, &tenant(Some("B"))).is_ok());
    }
}
