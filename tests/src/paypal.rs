//! PayPal fixtures: a certificate chain minted in-process with rcgen (root →
//! intermediate → leaf, like PayPal's DigiCert chain), a tenant that signs with the
//! leaf's key, and a certificate source that serves the chain from memory (PayPal's
//! host; TLS to `api.paypal.com` cannot be served locally) and can be taken down.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use einmal::config::Config;
use einmal::providers::paypal::{Anchors, CertSource, FetchError, PayPal, PayPalVerifier};
use einmal::providers::Provider;
use einmal::request::WebhookRequest;
use futures::future::{BoxFuture, FutureExt};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_RSA_SHA256,
};

/// The URL PayPal's genuine deliveries name (the shape of PayPal's own names).
pub const CERT_URL: &str =
    "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-0000600d";
pub const WEBHOOK_ID: &str = "4JH86294D6297924G";
pub const TENANT: &str = "t1";

/// The minted chain.
pub struct Minted {
    pub root_pem: String,
    /// Leaf, then intermediate: what PayPal's host serves.
    pub chain_pem: String,
    pub leaf_key_pem: String,
}

/// Minted once per process (RSA key generation is slow in debug builds).
pub fn minted() -> &'static Minted {
    static MINTED: OnceLock<Minted> = OnceLock::new();
    MINTED.get_or_init(|| {
        let key = || KeyPair::generate_for(&PKCS_RSA_SHA256).expect("RSA key");
        let (root_key, inter_key, leaf_key) = (key(), key(), key());
        let ca = |cn: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2045, 1, 1);
            p
        };
        let root_params = ca("Test Root CA");
        let root = root_params.self_signed(&root_key).unwrap();
        let root_issuer = Issuer::new(root_params, root_key);
        let inter_params = ca("Test PayPal Issuing CA");
        let inter = inter_params.signed_by(&inter_key, &root_issuer).unwrap();
        let inter_issuer = Issuer::new(inter_params, inter_key);
        let cn = "messageverificationcerts.paypal.com";
        let mut leaf = CertificateParams::new(vec![cn.to_string()]).unwrap();
        leaf.distinguished_name
            .push(DnType::OrganizationName, "PayPal, Inc.");
        leaf.distinguished_name.push(DnType::CommonName, cn);
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf.not_before = rcgen::date_time_ymd(2024, 1, 1);
        leaf.not_after = rcgen::date_time_ymd(2040, 1, 1);
        let leaf = leaf.signed_by(&leaf_key, &inter_issuer).unwrap();
        Minted {
            root_pem: root.pem(),
            chain_pem: format!("{}{}", leaf.pem(), inter.pem()),
            leaf_key_pem: leaf_key.serialize_pem(),
        }
    })
}

/// PayPal's certificate host: serves the chain at [`CERT_URL`], 404 for any other
/// name; while down, every fetch fails as unreachable. Counts fetches per kind.
#[derive(Default)]
pub struct CertHost {
    down: AtomicBool,
    genuine: AtomicUsize,
    other: AtomicUsize,
}

impl CertHost {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Fetches of [`CERT_URL`] that reached the host while it was up.
    pub fn genuine_fetches(&self) -> usize {
        self.genuine.load(Ordering::SeqCst)
    }

    /// Fetches of every other name.
    pub fn other_fetches(&self) -> usize {
        self.other.load(Ordering::SeqCst)
    }
}

impl CertSource for CertHost {
    fn fetch(&self, url: &str) -> BoxFuture<'static, Result<Vec<u8>, FetchError>> {
        let answer = if self.down.load(Ordering::SeqCst) {
            Err(FetchError::Unreachable("connection refused".into()))
        } else if url == CERT_URL {
            self.genuine.fetch_add(1, Ordering::SeqCst);
            Ok(minted().chain_pem.clone().into_bytes())
        } else {
            self.other.fetch_add(1, Ordering::SeqCst);
            Err(FetchError::Refused("HTTP 404".into()))
        };
        futures::future::ready(answer).boxed()
    }
}

/// A verifier as one process (one Lambda instance) has it: default fetch limits, the
/// minted root as its anchor, certificates from `host`.
pub fn verifier(host: &Arc<CertHost>) -> PayPalVerifier {
    let anchors = Anchors::from_pem(minted().root_pem.as_bytes()).expect("root parses");
    PayPalVerifier::new(host.clone(), anchors)
}

/// Tenant [`TENANT`] of PayPal, signing with the leaf's key.
pub fn config() -> Arc<Config> {
    let toml = format!(
        r#"
[[tenant]]
provider = "paypal"
tenant = "{TENANT}"
secrets = ['''
{}''']
options = {{ webhook_id = "{WEBHOOK_ID}", cert_url = "{CERT_URL}" }}
"#,
        minted().leaf_key_pem
    );
    Arc::new(Config::from_toml(&toml).expect("PayPal config parses"))
}

/// A genuine delivery of event `event_id` as PayPal sends it at `now_secs`.
pub fn delivery(config: &Config, event_id: &str, now_secs: i64) -> WebhookRequest {
    let tenant = config.tenant("paypal", TENANT).expect("tenant");
    let body = format!(
        r#"{{"id":"{event_id}","create_time":"2026-01-01T00:00:00Z","event_type":"PAYMENT.CAPTURE.COMPLETED","resource":{{"id":"CAP-{event_id}","status":"COMPLETED"}}}}"#
    );
    let (headers, body) = PayPal
        .signed_request(body.as_bytes(), tenant, event_id, now_secs)
        .expect("signs");
    WebhookRequest::post(headers, body)
}

/// An unauthenticated request that passes every check before the certificate: fresh
/// time, well-formed headers, a random-looking `CERT-…` name of PayPal's format (a
/// shape no certificate had) and a signature that is base64 but garbage.
pub fn forged(i: usize, now_secs: i64) -> WebhookRequest {
    let mut h = http::HeaderMap::new();
    let mut put = |k: &'static str, v: String| {
        h.insert(k, http::HeaderValue::from_str(&v).unwrap());
    };
    put("paypal-transmission-id", format!("forged-{i}"));
    put(
        "paypal-transmission-time",
        einmal::time::format_rfc3339(now_secs),
    );
    put("paypal-transmission-sig", "c2lnbmF0dXJl".into());
    let n = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    put(
        "paypal-cert-url",
        format!(
            "https://api.paypal.com/v1/notifications/certs/CERT-{:08x}-{:08x}-{:08x}",
            (n >> 32) as u32,
            n as u32,
            i
        ),
    );
    put("paypal-auth-algo", "SHA256withRSA".into());
    WebhookRequest::post(
        h,
        format!(r#"{{"id":"WH-FORGED-{i}","event_type":"PAYMENT.CAPTURE.COMPLETED"}}"#),
    )
}
