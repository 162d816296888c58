//! X-Ray trace context: the receiver passes its trace header to SQS as the message
//! system attribute `AWSTraceHeader`; the processor reads it from each record and logs
//! the trace id, so one trace id ties the webhook's receiver and processor lines.

/// The SQS message system attribute carrying the X-Ray trace header.
pub const AWS_TRACE_HEADER: &str = "AWSTraceHeader";
/// The environment variable the Lambda runtime sets per invocation.
pub const TRACE_ENV: &str = "_X_AMZN_TRACE_ID";
/// Longest header we pass on; X-Ray headers are about 80 bytes, SQS allows more.
const MAX_HEADER_LEN: usize = 256;

/// A validated X-Ray trace header (`Root=1-…;Parent=…;Sampled=…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeader(String);

impl TraceHeader {
    /// The header if it is one: printable ASCII without spaces or quotes, with a
    /// `Root=` part, at most 256 bytes. Anything else is dropped, never passed on.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        let valid = !raw.is_empty()
            && raw.len() <= MAX_HEADER_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
        let header = TraceHeader(raw.to_string());
        (valid && header.root().is_some()).then_some(header)
    }

    /// The header the Lambda runtime set for the current invocation (`_X_AMZN_TRACE_ID`).
    pub fn from_env() -> Option<Self> {
        std::env::var(TRACE_ENV).ok().and_then(|v| Self::parse(&v))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace id: the value of `Root=`.
    pub fn root(&self) -> Option<&str> {
        trace_id(&self.0)
    }
}

/// The `Root=` value of an X-Ray trace header.
pub fn trace_id(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|part| part.trim().strip_prefix("Root="))
        .find(|root| !root.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_roots_and_refuses_garbage() {
        let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let t = TraceHeader::parse(h).unwrap();
        assert_eq!(t.root(), Some("1-5759e988-bd862e3fe1be46a994272793"));
        assert_eq!(t.as_str(), h);
        assert_eq!(trace_id("Parent=1;Root=1-a-b"), Some("1-a-b"));
        assert_eq!(TraceHeader::parse("Parent=53995c3f42cd8ad8"), None);
        assert_eq!(TraceHeader::parse(""), None);
        assert_eq!(TraceHeader::parse("Root=1-a b"), None);
        assert_eq!(TraceHeader::parse("Root=1-\"x"), None);
        assert_eq!(
            TraceHeader::parse(&format!("Root={}", "a".repeat(300))),
            None
        );
    }
}
