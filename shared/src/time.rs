//! Wall-clock access in one place so tests can pin "now", and the RFC 3339 helpers
//! (provider timestamps, Shopify versions).

use std::time::{SystemTime, UNIX_EPOCH};

use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    now_millis() / 1000
}

/// Parse an RFC 3339 date-time (`YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, `T`, `t` or a
/// space between date and time) to Unix seconds, the fraction dropped. A leap second
/// (`23:59:60` at a month's end, UTC) counts as the second before it.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    // The `time` crate takes any byte as the separator; RFC 3339 names these three.
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    OffsetDateTime::parse(s, &Rfc3339)
        .ok()
        .map(OffsetDateTime::unix_timestamp)
}

/// Parse an HTTP-date in its preferred form, IMF-fixdate (`Sun, 06 Nov 1994 08:49:37
/// GMT`, RFC 9110 §5.6.7), to Unix seconds; the obsolete forms are not accepted.
pub fn parse_http_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.trim().split(' ').collect();
    let [weekday, day, month, year, time, "GMT"] = parts[..] else {
        return None;
    };
    if weekday.len() != 4 || !weekday.ends_with(',') || day.len() != 2 || year.len() != 4 {
        return None;
    }
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == month)? as u32 + 1;
    let digits = |t: &str| {
        t.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| t.parse::<u32>().ok())?
    };
    let (day, year) = (digits(day)?, digits(year)?);
    let hms: Vec<&str> = time.split(':').collect();
    let [h, m, sec] = hms[..] else { return None };
    if h.len() != 2 || m.len() != 2 || sec.len() != 2 {
        return None;
    }
    let (h, m, sec) = (digits(h)?, digits(m)?, digits(sec)?);
    let date = Date::from_calendar_date(year as i32, Month::try_from(month as u8).ok()?, day as u8)
        .ok()?;
    let time = Time::from_hms(h as u8, m as u8, sec as u8).ok()?;
    Some(
        PrimitiveDateTime::new(date, time)
            .assume_utc()
            .unix_timestamp(),
    )
}

/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z in Unix seconds.
const RFC3339_FIRST: i64 = -62_167_219_200;
const RFC3339_LAST: i64 = 253_402_300_799;

/// Format Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (for generated headers). RFC 3339
/// has four-digit years only: a time outside 0000–9999 is clamped to that range.
pub fn format_rfc3339(secs: i64) -> String {
    OffsetDateTime::from_unix_timestamp(secs.clamp(RFC3339_FIRST, RFC3339_LAST))
        .expect("clamped to the representable range")
        .format(&Rfc3339)
        .expect("a four-digit year formats")
}

/// `90s`, `45m`, `26h`, `3d`: the largest whole unit (for dead-letter reasons).
pub fn human_duration(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        s if s >= 2 * 86_400 => format!("{}d", s / 86_400),
        s if s >= 2 * 3_600 => format!("{}h", s / 3_600),
        s if s >= 2 * 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 UTC"), None);
        assert_eq!(parse_http_date("Sun, 6 Nov 1994 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Foo 1994 08:49:37 GMT"), None);
    }

    #[test]
    fn rfc3339_parse_and_format() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2023-03-29T18:00:27.877041743Z"),
            Some(1_680_112_827)
        );
        assert_eq!(
            parse_rfc3339("2024-01-01T10:00:00-05:00"),
            Some(1_704_121_200)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00+00:00"),
            Some(1_709_164_800)
        );
        for bad in [
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+0500",
            "2024-01-01",
            "２０２４-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        for secs in [0, 951_782_400, 1_700_000_000, 4_102_444_799, -86_401] {
            assert_eq!(parse_rfc3339(&format_rfc3339(secs)), Some(secs), "{secs}");
        }
        assert_eq!(format_rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(format_rfc3339(RFC3339_FIRST), "0000-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(i64::MIN), "0000-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(i64::MAX), "9999-12-31T23:59:59Z");
        // Separators RFC 3339 names, a leap second where one can be, and none elsewhere.
        assert_eq!(parse_rfc3339("1970-01-01t00:00:00z"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01 00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01X00:00:00Z"), None);
        assert_eq!(
            parse_rfc3339("2016-12-31T23:59:60Z"),
            parse_rfc3339("2016-12-31T23:59:59Z")
        );
        assert_eq!(parse_rfc3339("2016-12-30T12:00:60Z"), None);
    }

    #[test]
    fn wait_durations_read_in_their_largest_unit() {
        assert_eq!(human_duration(45_000), "45s");
        assert_eq!(human_duration(119_000), "119s");
        assert_eq!(human_duration(31 * 60_000), "31m");
        assert_eq!(human_duration(86_460_000), "24h");
        assert_eq!(human_duration(3 * 86_400_000 + 1), "3d");
        assert_eq!(human_duration(-1), "0s");
    }
}
