//! [`CertificateCache`] on SQLite: table `certificates`, one row per certificate URL
//! that verified a genuine delivery (only the PayPal verifier writes, and only then).
//! A put first deletes the rows that have expired, so the table holds the few
//! certificates PayPal signs with now, whatever the traffic.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};

use super::{DbError, EmbeddedStore};
use crate::ports::{CertificateCache, StoreError};

/// Created on every open (idempotent), so files from before it get it too.
pub(super) const CERTIFICATE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS certificates (
    url        TEXT PRIMARY KEY NOT NULL,
    pem        BLOB NOT NULL,
    expires_at INTEGER NOT NULL
);
";

#[async_trait]
impl CertificateCache for EmbeddedStore {
    async fn get_certificate(
        &self,
        url: &str,
        now_secs: i64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let url = url.to_owned();
        let pem = self
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT pem FROM certificates WHERE url = ?1 AND expires_at > ?2",
                )?;
                Ok(stmt
                    .query_row(params![url, now_secs], |row| row.get::<_, Vec<u8>>(0))
                    .optional()?)
            })
            .await?;
        Ok(pem)
    }

    async fn put_certificate(
        &self,
        url: &str,
        pem: &[u8],
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let (url, pem) = (url.to_owned(), pem.to_vec());
        let now = crate::time::now_secs();
        self.write(move |conn| {
            conn.prepare_cached("DELETE FROM certificates WHERE expires_at <= ?1")?
                .execute([now])?;
            conn.prepare_cached(
                "INSERT INTO certificates (url, pem, expires_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(url) DO UPDATE SET pem = excluded.pem, expires_at = excluded.expires_at",
            )?
            .execute(params![url, pem, expires_at])?;
            Ok::<_, DbError>(())
        })
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ports::CertificateCache;

    const URL: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77";

    #[tokio::test]
    async fn certificates_survive_a_reopen_until_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::time::now_secs();
        {
            let store = super::super::tests::open(dir.path());
            assert_eq!(store.get_certificate(URL, now).await.unwrap(), None);
            store
                .put_certificate(URL, b"pem one", now + 100)
                .await
                .unwrap();
            store
                .put_certificate(URL, b"pem two", now + 200)
                .await
                .unwrap();
            store
                .put_certificate("other", b"old", now - 1)
                .await
                .unwrap();
        }
        let store = super::super::tests::open(dir.path());
        assert_eq!(
            store.get_certificate(URL, now).await.unwrap().as_deref(),
            Some(&b"pem two"[..])
        );
        assert_eq!(store.get_certificate(URL, now + 200).await.unwrap(), None);
        assert_eq!(store.get_certificate("other", now).await.unwrap(), None);
        // Expired rows go with the next put.
        store
            .put_certificate(URL, b"pem two", now + 200)
            .await
            .unwrap();
        let raw = rusqlite::Connection::open(store.path()).unwrap();
        let rows: i64 = raw
            .query_row("SELECT count(*) FROM certificates", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
    }
}
