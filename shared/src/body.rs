//! Body compression for storage in one inbox item.

use thiserror::Error;

/// Encoding tag stored next to the body so future codecs can coexist.
pub const BODY_ENCODING: &str = "zstd";

#[derive(Debug, Error)]
pub enum BodyError {
    #[error("body could not be compressed: {0}")]
    Compress(std::io::Error),
    #[error("stored body could not be decompressed: {0}")]
    Decompress(std::io::Error),
}

/// Compress a raw body. Level 1: webhook JSON compresses well even at the fastest level.
pub fn compress(raw: &[u8]) -> Result<Vec<u8>, BodyError> {
    zstd::bulk::compress(raw, 1).map_err(BodyError::Compress)
}

/// Decompress a stored body; `limit` guards against a corrupt size header.
pub fn decompress(stored: &[u8], limit: usize) -> Result<Vec<u8>, BodyError> {
    zstd::bulk::decompress(stored, limit).map_err(BodyError::Decompress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_shrinks_json() {
        let raw =
            br#"{"id":"evt_1","object":"event","data":{"object":{"id":"pi_1","amount":1000}}}"#
                .repeat(20);
        let packed = compress(&raw).unwrap();
        assert!(packed.len() < raw.len() / 4);
        assert_eq!(decompress(&packed, raw.len()).unwrap(), raw);
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        assert!(decompress(b"not zstd at all", 1024).is_err());
    }
}
