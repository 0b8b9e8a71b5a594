//! Certificate times: X.509 keeps whole seconds up to the year 9999.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::CaError;

/// 9999-12-31T23:59:59Z, the last instant an X.509 time can express.
const MAX_CERT_SECS: u64 = 253_402_300_799;

/// Truncates to whole seconds (what X.509 keeps) and checks the range is sane.
pub(crate) fn validity(
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<(SystemTime, SystemTime), CaError> {
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).ok();
    let (Some(from), Some(to)) = (secs(not_before), secs(not_after)) else {
        return Err(CaError::Validity("times before 1970 are not supported"));
    };
    if to > MAX_CERT_SECS {
        return Err(CaError::Validity("not_after is beyond the year 9999"));
    }
    if to <= from {
        return Err(CaError::Validity("not_after must be after not_before"));
    }
    let at = |s| UNIX_EPOCH + Duration::from_secs(s);
    Ok((at(from), at(to)))
}

pub(crate) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Human-readable time for error messages (the format openssl prints).
pub(crate) fn display_time(t: SystemTime) -> String {
    let secs = i64::try_from(unix_secs(t)).unwrap_or(i64::MAX);
    match x509_parser::time::ASN1Time::from_timestamp(secs) {
        Ok(time) => time.to_string(),
        Err(_) => format!("{secs} s after the Unix epoch"),
    }
}

pub(crate) fn to_system_time(secs: i64) -> SystemTime {
    match u64::try_from(secs) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH,
    }
}
