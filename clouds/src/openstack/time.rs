//! RFC 3339 timestamps as Keystone writes them (`2015-11-07T02:58:43.578887Z`).
//!
//! Only token expiry needs a calendar, so a few lines of civil-date arithmetic replace a date crate
//! (the one already in the build has its parser behind a feature that would rebuild half the tree).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days from 1970-01-01 to the given proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn number(s: &str, range: std::ops::Range<usize>) -> Option<u32> {
    let part = s.get(range)?;
    if part.bytes().all(|b| b.is_ascii_digit()) {
        part.parse().ok()
    } else {
        None
    }
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`; `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let year = i64::from(number(s, 0..4)?);
    let (month, day) = (number(s, 5..7)?, number(s, 8..10)?);
    let (hour, minute, second) = (number(s, 11..13)?, number(s, 14..16)?, number(s, 17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        for (i, d) in fraction[..digits].bytes().take(9).enumerate() {
            nanos += u32::from(d - b'0') * 10u32.pow(8 - i as u32);
        }
        rest = &fraction[digits..];
    }
    // Compared as bytes: a request's text may put a character of several bytes anywhere.
    let offset = rest.as_bytes();
    let offset_secs: i64 = match rest {
        "Z" | "z" => 0,
        _ if offset.len() == 6 && matches!(offset[0], b'+' | b'-') && offset[3] == b':' => {
            let minutes = i64::from(number(rest, 1..3)? * 60 + number(rest, 4..6)?);
            if rest.starts_with('-') {
                -minutes * 60
            } else {
                minutes * 60
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(year, month, day) * 86_400
        + i64::from(hour * 3600 + minute * 60 + second)
        - offset_secs;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Parses a time as a request may give it: RFC 3339, or UTC without a zone as Nova's usage API
/// takes it (`YYYY-MM-DDTHH:MM:SS[.fraction]`, or a day: `YYYY-MM-DD`, its midnight).
pub fn parse_utc(s: &str) -> Option<SystemTime> {
    if s.len() == 10 {
        return parse_rfc3339(&format!("{s}T00:00:00Z"));
    }
    parse_rfc3339(s).or_else(|| parse_rfc3339(&format!("{s}Z")))
}

/// The first millisecond of the UTC month that holds `ms` (milliseconds since the Unix epoch).
pub fn month_start_ms(ms: i64) -> i64 {
    let (year, month, _) = civil_from_days(ms.div_euclid(86_400_000));
    days_from_civil(year, month, 1) * 86_400_000
}

/// Formats `ms` (milliseconds since the Unix epoch; none before it) as [`format_rfc3339`] does.
pub fn format_ms(ms: i64) -> String {
    format_rfc3339(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

/// Formats `t` as `YYYY-MM-DDTHH:MM:SS.ffffffZ`, the way Keystone does.
pub fn format_rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keystone_timestamps_parse() {
        let t = parse_rfc3339("2015-11-07T02:58:43.578887Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap(),
            Duration::new(1_446_865_123, 578_887_000)
        );
        assert_eq!(format_rfc3339(t), "2015-11-07T02:58:43.578887Z");
        let offset = parse_rfc3339("2015-11-07T04:58:43.578887+02:00").unwrap();
        assert_eq!(offset, t);
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00Z").unwrap(),
            UNIX_EPOCH + Duration::from_secs(951_782_400)
        );
        for bad in [
            "",
            "2015-11-07",
            "2015-13-07T02:58:43Z",
            "2015-11-07T02:58:43",
            "x015-11-07T02:58:43Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn request_times_parse_as_utc() {
        let midnight = UNIX_EPOCH + Duration::from_secs(1_446_854_400);
        assert_eq!(parse_utc("2015-11-07"), Some(midnight));
        assert_eq!(parse_utc("2015-11-07T00:00:00"), Some(midnight));
        assert_eq!(parse_utc("2015-11-07T02:00:00+02:00"), Some(midnight));
        for bad in ["", "2015-11-7", "2015-11-07T", "yesterday", "2015-11-07T25:00:00"] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
        assert_eq!(month_start_ms(1_446_865_123_000), 1_446_336_000_000);
        assert_eq!(month_start_ms(1_446_336_000_000), 1_446_336_000_000);
    }

    /// Characters of two, three and four bytes anywhere in a time, or a time cut anywhere, are
    /// refused, never a panic (a request's `start=...%C3%A91:00` closed its connection).
    #[test]
    fn times_with_characters_of_several_bytes_are_refused() {
        for valid in ["2026-11-01T00:00:00.5+01:00", "2026-11-01T00:00:00Z", "2026-11-01"] {
            for extra in ["é", "€", "𝟙"] {
                for at in 0..=valid.len() {
                    let spliced = format!("{}{extra}{}", &valid[..at], &valid[at..]);
                    assert_eq!(parse_utc(&spliced), None, "{spliced}");
                    let replaced =
                        format!("{}{extra}{}", &valid[..at], valid.get(at + 1..).unwrap_or(""));
                    assert_eq!(parse_utc(&replaced), None, "{replaced}");
                    assert_eq!(parse_rfc3339(&replaced), None, "{replaced}");
                }
            }
            for at in 0..valid.len() {
                let _ = parse_utc(&valid[..at]);
            }
        }
        assert_eq!(parse_utc("2026-11-01T00:00:00é1:00"), None);
        assert_eq!(parse_utc("2026-11-01T00:00:00+0é00"), None);
    }

    #[test]
    fn formatting_round_trips() {
        for secs in [0u64, 951_782_400, 1_446_865_123, 4_102_444_800] {
            let t = UNIX_EPOCH + Duration::new(secs, 123_000);
            assert_eq!(parse_rfc3339(&format_rfc3339(t)), Some(t));
        }
    }
}
