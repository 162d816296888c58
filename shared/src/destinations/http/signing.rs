//! Standard Webhooks signatures (symmetric `v1`): what the official `standardwebhooks`
//! libraries of every language verify. The signed content is `{id}.{timestamp}.{body}`
//! with the exact body bytes sent; the key is the base64-decoded part of a `whsec_`
//! secret; one `v1,<base64 HMAC-SHA256>` per secret, space-separated, so a consumer
//! holding either the old or the new secret accepts during a rotation.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

use crate::secret::Secret;

pub const SECRET_PREFIX: &str = "whsec_";
/// The spec's bounds for a symmetric secret's decoded length.
pub const MIN_SECRET_BYTES: usize = 24;
pub const MAX_SECRET_BYTES: usize = 64;

/// Why a secret cannot sign; never shows the secret.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SecretError {
    #[error("a signing secret must start with `whsec_`")]
    Prefix,
    #[error("a signing secret must be `whsec_` followed by base64")]
    Base64,
    #[error(
        "a signing secret must decode to {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes (this one has {0})"
    )]
    Length(usize),
}

/// The HMAC key of a `whsec_` secret.
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, SecretError> {
    let encoded = secret
        .strip_prefix(SECRET_PREFIX)
        .ok_or(SecretError::Prefix)?;
    let key = BASE64.decode(encoded).map_err(|_| SecretError::Base64)?;
    if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&key.len()) {
        return Err(SecretError::Length(key.len()));
    }
    Ok(key)
}

/// A fresh random secret (32 bytes), e.g. for `einmal listen`.
pub fn generate_secret() -> Secret {
    let key: [u8; 32] = rand::random();
    Secret::new(format!("{SECRET_PREFIX}{}", BASE64.encode(key)))
}

/// Keys decoded once per destination, then used for every attempt.
#[derive(Clone)]
pub struct SigningKeys(Vec<Vec<u8>>);

impl SigningKeys {
    pub fn new(secrets: &[Secret]) -> Result<Self, SecretError> {
        secrets
            .iter()
            .map(|s| decode_secret(s.expose()))
            .collect::<Result<_, _>>()
            .map(SigningKeys)
    }

    /// The `webhook-signature` header value.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut out = String::new();
        for key in &self.0 {
            let mut mac =
                Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
            mac.update(msg_id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str("v1,");
            out.push_str(&BASE64.encode(mac.finalize().into_bytes()));
        }
        out
    }
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKeys({} keys)", self.0.len())
    }
}

/// The `webhook-signature` value for `body` sent as `msg_id` at `timestamp` (Unix
/// seconds), one `v1` entry per secret.
pub fn sign(
    secrets: &[Secret],
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SecretError> {
    Ok(SigningKeys::new(secrets)?.sign(msg_id, timestamp, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_test_vector() {
        // destinations.md §1.2: the Rust library's own `test_sign`.
        let secret = Secret::new("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD");
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        let sig = sign(
            &[secret],
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            body,
        )
        .unwrap();
        assert_eq!(sig, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
    }

    #[test]
    fn every_secret_signs_for_a_rotation() {
        let (new, old) = (generate_secret(), generate_secret());
        let both = sign(&[new.clone(), old.clone()], "msg_1", 1, b"{}").unwrap();
        let parts: Vec<_> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(&[new], "msg_1", 1, b"{}").unwrap());
        assert_eq!(parts[1], sign(&[old], "msg_1", 1, b"{}").unwrap());
    }

    #[test]
    fn bad_secrets_are_refused_without_showing_them() {
        assert_eq!(decode_secret("C2FVsBQIhrscChlQ"), Err(SecretError::Prefix));
        assert_eq!(decode_secret("whsec_not base64!"), Err(SecretError::Base64));
        // 12 bytes: too short for the spec.
        assert_eq!(
            decode_secret("whsec_AAAAAAAAAAAAAAAA"),
            Err(SecretError::Length(12))
        );
        let long = format!("whsec_{}", BASE64.encode([7u8; 65]));
        assert_eq!(decode_secret(&long), Err(SecretError::Length(65)));
        let err = SigningKeys::new(&[Secret::new("whsec_hunter2hunter2")]).unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
        let generated = generate_secret();
        assert_eq!(decode_secret(generated.expose()).unwrap().len(), 32);
    }
}
