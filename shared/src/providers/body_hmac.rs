//! The commonest scheme of the newer providers: one header carrying HMAC-SHA256 (or
//! -SHA512) of the raw body, keyed with the secret's UTF-8 bytes, in hex or base64.
//! Nothing time-related is signed, so replays inside the retry window are stopped by
//! the dedup store alone (`../shared/providers.md` §0.6).

use super::sig::{self, Name};
use super::ProviderError;
use crate::config::{Secret, TenantConfig};
use crate::request::WebhookRequest;

use hmac::{Hmac, Mac};
use sha2::Sha512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Hex,
    Base64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    Sha256,
    Sha512,
}

/// One provider's body-HMAC header.
pub struct BodyHmac {
    pub header: Name,
    pub encoding: Encoding,
    pub digest: Digest,
}

/// HMAC-SHA512 of `body` (Paystack).
fn hmac_sha512(key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

impl BodyHmac {
    fn mac(&self, key: &[u8], body: &[u8]) -> Vec<u8> {
        match self.digest {
            Digest::Sha256 => sig::hmac_sha256(key, &[body]).to_vec(),
            Digest::Sha512 => hmac_sha512(key, body),
        }
    }

    /// Every signature the header carries (repeats and comma-joins count: rotation).
    fn candidates(&self, request: &WebhookRequest) -> Result<Vec<Vec<u8>>, ProviderError> {
        match self.encoding {
            Encoding::Hex => sig::hex_signatures(request, self.header, "", false),
            Encoding::Base64 => {
                let name = self.header.as_str();
                let mut out = Vec::with_capacity(1);
                let mut present = false;
                for value in sig::header_values(request, self.header) {
                    present = true;
                    for part in value?.split(',').map(str::trim) {
                        if part.is_empty() {
                            return Err(ProviderError::MalformedHeader(name, "empty value"));
                        }
                        out.push(sig::decode_base64(name, part)?);
                    }
                }
                if !present {
                    return Err(ProviderError::MissingHeader(name));
                }
                Ok(out)
            }
        }
    }

    /// Verify `request` against every secret `key` makes usable (`None`: skipped).
    pub fn verify_with(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        key: impl Fn(&Secret) -> Option<&str>,
    ) -> Result<(), ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let candidates = self.candidates(request)?;
        sig::verify_any(secrets, &candidates, |s| {
            key(s).map(|k| self.mac(k.as_bytes(), &request.body))
        })
    }

    /// Verify with each secret's whole text as the key.
    pub fn verify(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
    ) -> Result<(), ProviderError> {
        self.verify_with(request, tenant, |s| Some(s.expose()))
    }

    /// The header value that signs `body` with `key`.
    pub fn signature(&self, key: &str, body: &[u8]) -> String {
        let mac = self.mac(key.as_bytes(), body);
        match self.encoding {
            Encoding::Hex => hex::encode(mac),
            Encoding::Base64 => base64::Engine::encode(&sig::B64, mac),
        }
    }

    /// JSON delivery headers signed with the tenant's first secret, plus `extra`.
    pub fn sign(
        &self,
        tenant: &TenantConfig,
        body: &[u8],
        extra: &[(Name, &str)],
    ) -> Result<http::HeaderMap, ProviderError> {
        let signature = self.signature(sig::secrets(tenant)?[0].expose(), body);
        let mut pairs = vec![(self.header, signature.as_str())];
        pairs.extend_from_slice(extra);
        sig::json_headers(&pairs)
    }
}
