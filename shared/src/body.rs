//! Body compression for storage in one inbox item.

use std::cell::RefCell;

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

/// Level 1: webhook JSON compresses well even at the fastest level.
const LEVEL: i32 = 1;

thread_local! {
    // One zstd context per thread, reused for every body: creating a context per body
    // cost about 6% of the receiver's CPU. Bounded: one per runtime worker thread.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Compress a raw body.
pub fn compress(raw: &[u8]) -> Result<Vec<u8>, BodyError> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match slot.as_mut() {
            Some(compressor) => compressor,
            None => slot.insert(zstd::bulk::Compressor::new(LEVEL).map_err(BodyError::Compress)?),
        };
        compressor.compress(raw).map_err(BodyError::Compress)
    })
}

/// Decompress a stored body; `limit` guards against a corrupt size header.
pub fn decompress(stored: &[u8], limit: usize) -> Result<Vec<u8>, BodyError> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let decompressor = match slot.as_mut() {
            Some(decompressor) => decompressor,
            None => slot.insert(zstd::bulk::Decompressor::new().map_err(BodyError::Decompress)?),
        };
        decompressor
            .decompress(stored, limit)
            .map_err(BodyError::Decompress)
    })
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

    #[test]
    fn the_reused_contexts_carry_nothing_from_one_body_to_the_next() {
        let bodies: Vec<Vec<u8>> = (0..50)
            .map(|i| format!(r#"{{"id":"evt_{i}","pad":"{}"}}"#, "x".repeat(i * 97)).into_bytes())
            .collect();
        let packed: Vec<Vec<u8>> = bodies.iter().map(|b| compress(b).unwrap()).collect();
        // A corrupt body or a too-small limit in between leaves the context usable.
        assert!(decompress(b"not zstd at all", 1024).is_err());
        assert!(decompress(&packed[49], 10).is_err());
        for (body, stored) in bodies.iter().zip(&packed).rev() {
            assert_eq!(&decompress(stored, body.len()).unwrap(), body);
            // The same bytes as a fresh context would produce.
            assert_eq!(stored, &zstd::bulk::compress(body, LEVEL).unwrap());
        }
    }
}
