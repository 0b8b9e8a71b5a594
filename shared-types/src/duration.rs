//! Durations in settings, written as Istio's Go flags take them.

use std::time::Duration;

/// `500ms`, `30s`, `5m`, `24h`, `1.5h`, or bare seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (e.g. 30s, 5m, 24h)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("invalid duration {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_forms() {
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86400));
        assert_eq!(
            parse_duration("2160h").unwrap(),
            Duration::from_secs(90 * 86400)
        );
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration(" 7 ").unwrap(), Duration::from_secs(7));
        for bad in ["", "5y", "x", "-1s", "1e400s", "h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
