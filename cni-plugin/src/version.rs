//! The CNI spec versions this plugin speaks. The result shape changed once, at 1.0.0
//! (`ips[].version` is gone); STATUS and GC exist from 1.1.0, CHECK from 0.4.0.

use crate::error::{CniError, Code};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpecVersion {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl SpecVersion {
    pub const SUPPORTED: [SpecVersion; 5] = [
        SpecVersion::V0_3_0,
        SpecVersion::V0_3_1,
        SpecVersion::V0_4_0,
        SpecVersion::V1_0_0,
        SpecVersion::V1_1_0,
    ];
    /// What we answer in when the caller's version is unknown (VERSION, early errors).
    pub const LATEST: SpecVersion = SpecVersion::V1_1_0;

    pub fn parse(text: &str) -> Option<Self> {
        Self::SUPPORTED.into_iter().find(|v| v.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SpecVersion::V0_3_0 => "0.3.0",
            SpecVersion::V0_3_1 => "0.3.1",
            SpecVersion::V0_4_0 => "0.4.0",
            SpecVersion::V1_0_0 => "1.0.0",
            SpecVersion::V1_1_0 => "1.1.0",
        }
    }

    /// True for the 0.3.x/0.4.0 result shape, where each IP carries `"version"`.
    pub fn is_legacy(self) -> bool {
        self < SpecVersion::V1_0_0
    }

    /// Checks a netconf `cniVersion` (code 1 when we do not speak it, as libcni's skel).
    pub fn from_config(text: &str) -> Result<Self, CniError> {
        Self::parse(text).ok_or_else(|| {
            let shown = if text.is_empty() {
                "\"\" (cniVersion missing)".to_string()
            } else {
                format!("{text:?}")
            };
            CniError::new(Code::IncompatibleVersion, "incompatible CNI versions").details(format!(
                "config is {shown}, plugin supports {}",
                supported_list()
            ))
        })
    }
}

impl std::fmt::Display for SpecVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn supported_list() -> String {
    let names: Vec<_> = SpecVersion::SUPPORTED.iter().map(|v| v.as_str()).collect();
    format!("{names:?}")
}

/// The VERSION command's answer.
pub fn version_info() -> String {
    serde_json::json!({
        "cniVersion": SpecVersion::LATEST.as_str(),
        "supportedVersions": SpecVersion::SUPPORTED.map(|v| v.as_str()),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_supported_versions() {
        for v in SpecVersion::SUPPORTED {
            assert_eq!(SpecVersion::parse(v.as_str()), Some(v));
        }
        for bad in ["", "0.1.0", "0.2.0", "1.0", "2.0.0", "1.0.0 "] {
            let err = SpecVersion::from_config(bad).unwrap_err();
            assert_eq!(err.code, Code::IncompatibleVersion, "{bad:?}");
        }
    }

    #[test]
    fn legacy_shape_ends_at_1_0() {
        assert!(SpecVersion::V0_4_0.is_legacy());
        assert!(!SpecVersion::V1_0_0.is_legacy());
    }

    #[test]
    fn version_info_lists_all() {
        let v: serde_json::Value = serde_json::from_str(&version_info()).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(
            v["supportedVersions"],
            serde_json::json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
    }
}
