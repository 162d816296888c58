//! [`CertificateCache`] on DynamoDB: one small item per certificate URL that verified a
//! genuine delivery, in the inbox table under pk `cert#{url}` (no event key starts
//! with it; listings skip it, see [`item::is_event`]). It holds the PEM chain and the
//! table's TTL attribute at the certificate's expiry, so DynamoDB deletes it after
//! that; TTL deletes late, so a read checks the expiry itself. The receiver's role
//! already may GetItem and PutItem on the table: the template needs no new statement.
//! Only the PayPal verifier writes, once per certificate and process, after a
//! signature verified with it: unauthenticated requests cost at most one GetItem.

use async_trait::async_trait;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::error::describe;
use super::item::{self, n_attr, s_attr, Item};
use super::AwsStore;
use crate::ports::{CertificateCache, StoreError};

const PEM: &str = "pem";

fn cert_key(url: &str) -> String {
    format!("{}{url}", item::CERT_PREFIX)
}

#[async_trait]
impl CertificateCache for AwsStore {
    async fn get_certificate(
        &self,
        url: &str,
        now_secs: i64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let out = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key(item::PK, s_attr(&cert_key(url)))
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB GetItem", &e)))?;
        let Some(mut m) = out.item else {
            return Ok(None);
        };
        let expires_at = match m.get(item::EXPIRES_AT) {
            Some(AttributeValue::N(n)) => n.parse::<i64>().ok(),
            _ => None,
        }
        .ok_or_else(|| StoreError::Corrupt(format!("{}: no expires_at", cert_key(url))))?;
        if expires_at <= now_secs {
            return Ok(None);
        }
        match m.remove(PEM) {
            Some(AttributeValue::B(pem)) => Ok(Some(pem.into_inner())),
            _ => Err(StoreError::Corrupt(format!("{}: no pem", cert_key(url)))),
        }
    }

    async fn put_certificate(
        &self,
        url: &str,
        pem: &[u8],
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let m = Item::from([
            (item::PK.to_string(), s_attr(&cert_key(url))),
            (PEM.to_string(), AttributeValue::B(Blob::new(pem.to_vec()))),
            (item::EXPIRES_AT.to_string(), n_attr(expires_at)),
        ]);
        self.dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(m))
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB PutItem", &e)))?;
        Ok(())
    }
}
