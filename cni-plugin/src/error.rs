//! CNI errors as the spec prints them on stdout: `{"cniVersion","code","msg","details"}`.
//! Codes below 100 are the spec's well-known ones; 999 is our generic failure.

use serde::Serialize;

/// The error codes this plugin uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    IncompatibleVersion = 1,
    InvalidEnvironment = 4,
    IoFailure = 5,
    DecodingFailure = 6,
    InvalidNetworkConfig = 7,
    /// A transient condition (agent down, not answering): the runtime retries the ADD.
    TryAgainLater = 11,
    Internal = 999,
}

/// An error the plugin reports to the runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: Code,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The JSON the spec wants on stdout; `cni_version` echoes the netconf's when known.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        serde_json::to_string(&Wire {
            cni_version,
            code: self.code as u32,
            msg: &self.msg,
            details: &self.details,
        })
        .unwrap_or_else(|_| format!("{{\"code\":{},\"msg\":\"error\"}}", self.code as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_spec_shape() {
        let e = CniError::new(Code::TryAgainLater, "agent \"down\"");
        let v: serde_json::Value = serde_json::from_str(&e.to_json("1.0.0")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion": "1.0.0", "code": 11, "msg": "agent \"down\""})
        );
        let v: serde_json::Value =
            serde_json::from_str(&e.details("more").to_json("0.4.0")).unwrap();
        assert_eq!(v["details"], "more");
        assert_eq!(v["code"], 11);
    }
}
