//! Workload identities: the SPIFFE ids Istio gives service accounts.

use std::fmt;
use std::str::FromStr;

const SCHEME: &str = "spiffe://";
/// SPIFFE caps ids at 2048 bytes and trust domains at 255; peers are held to it.
const MAX_URI_LEN: usize = 2048;
const MAX_TRUST_DOMAIN_LEN: usize = 255;

/// A SPIFFE identity in Istio's `ns/<namespace>/sa/<service-account>` shape.
///
/// [`Identity::new`] does not validate (callers build identities from data they
/// already trust); anything read from a peer goes through [`FromStr`], which is strict.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// SPIFFE trust domain, e.g. `cluster.local`.
    pub trust_domain: String,
    /// Kubernetes namespace of the service account.
    pub namespace: String,
    /// Name of the Kubernetes service account.
    pub service_account: String,
}

impl Identity {
    /// Builds an identity from its parts, without validating them.
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Self {
        Identity {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        }
    }

    /// `spiffe://<td>/ns/<ns>/sa/<sa>`, the form carried in certificates.
    pub fn to_uri(&self) -> String {
        format!("{SCHEME}{}", self.principal())
    }

    /// Istio's principal form, without the scheme: `<td>/ns/<ns>/sa/<sa>`.
    /// Authorization policies compare principals in this form.
    pub fn principal(&self) -> String {
        format!(
            "{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// Why a string is not an Istio SPIFFE id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Longer than the 2048 bytes SPIFFE allows.
    #[error("SPIFFE id is {len} bytes long, more than the {MAX_URI_LEN} allowed")]
    TooLong {
        /// Length of the input in bytes.
        len: usize,
    },
    /// Does not start with `spiffe://`.
    #[error("{input:?} is not a SPIFFE id: it must start with \"spiffe://\"")]
    NotSpiffe {
        /// The rejected input.
        input: String,
    },
    /// The trust domain is empty, too long, a dot segment or has forbidden characters.
    #[error("SPIFFE id {input:?} has an invalid trust domain: {reason}")]
    TrustDomain {
        /// The rejected input.
        input: String,
        /// What is wrong with the trust domain.
        reason: &'static str,
    },
    /// The path is not `/ns/<namespace>/sa/<service-account>` with valid segments.
    #[error(
        "SPIFFE id {input:?} does not have the path /ns/<namespace>/sa/<service-account>: {reason}"
    )]
    Path {
        /// The rejected input.
        input: String,
        /// What is wrong with the path.
        reason: &'static str,
    },
}

impl FromStr for Identity {
    type Err = IdentityError;

    /// Strict parse: no query, fragment, port, user info, percent-encoding, empty or
    /// dot segments, and trust domains in lowercase as SPIFFE requires.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.len() > MAX_URI_LEN {
            return Err(IdentityError::TooLong { len: input.len() });
        }
        let rest = input
            .strip_prefix(SCHEME)
            .ok_or_else(|| IdentityError::NotSpiffe {
                input: input.to_owned(),
            })?;
        let (trust_domain, path) = rest.split_once('/').unwrap_or((rest, ""));
        let td_err = |reason| IdentityError::TrustDomain {
            input: input.to_owned(),
            reason,
        };
        if trust_domain.is_empty() {
            return Err(td_err("it is empty"));
        }
        // Found by fuzzing (mesh-ca/fuzz, spiffe_identity): "." and ".." passed the
        // character check although they name no domain.
        if trust_domain == "." || trust_domain == ".." {
            return Err(td_err("it is a dot segment"));
        }
        if trust_domain.len() > MAX_TRUST_DOMAIN_LEN {
            return Err(td_err("it is longer than 255 bytes"));
        }
        if !trust_domain.bytes().all(is_trust_domain_char) {
            return Err(td_err(
                "only lowercase letters, digits, '.', '-' and '_' are allowed",
            ));
        }
        let path_err = |reason| IdentityError::Path {
            input: input.to_owned(),
            reason,
        };
        let segments: Vec<&str> = path.split('/').collect();
        let [ns_key, namespace, sa_key, service_account] = segments.as_slice() else {
            return Err(path_err("expected exactly four path segments"));
        };
        if *ns_key != "ns" || *sa_key != "sa" {
            return Err(path_err("expected the segments \"ns\" and \"sa\""));
        }
        for segment in [namespace, service_account] {
            if segment.is_empty() || *segment == "." || *segment == ".." {
                return Err(path_err("namespace and service account must be named"));
            }
            if !segment.bytes().all(is_path_char) {
                return Err(path_err(
                    "only letters, digits, '.', '-' and '_' are allowed in segments",
                ));
            }
        }
        Ok(Identity::new(trust_domain, *namespace, *service_account))
    }
}

fn is_trust_domain_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
}

fn is_path_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')
}

/// Serialized as the URI, the form operators see in certificates and config dumps.
impl serde::Serialize for Identity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Identity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity::new("cluster.local", "default", "client")
    }

    #[test]
    fn uri_principal_and_display() {
        assert_eq!(id().to_uri(), "spiffe://cluster.local/ns/default/sa/client");
        assert_eq!(id().to_string(), id().to_uri());
        assert_eq!(id().principal(), "cluster.local/ns/default/sa/client");
    }

    #[test]
    fn parse_round_trips() {
        let parsed: Identity = id().to_uri().parse().unwrap();
        assert_eq!(parsed, id());
        let odd: Identity = "spiffe://td_1.example-x/ns/My.ns-1/sa/s_a".parse().unwrap();
        assert_eq!(odd, Identity::new("td_1.example-x", "My.ns-1", "s_a"));
    }

    #[test]
    fn parse_rejects_malformed_ids() {
        let cases = [
            ("https://cluster.local/ns/a/sa/b", "must start with"),
            ("spiffe://", "trust domain"),
            ("spiffe:///ns/a/sa/b", "trust domain"),
            // The input libFuzzer found (spiffe_identity target).
            ("spiffe://../ns/aB/sa/b", "trust domain"),
            ("spiffe://./ns/a/sa/b", "trust domain"),
            ("spiffe://Cluster.local/ns/a/sa/b", "trust domain"),
            ("spiffe://cluster.local:80/ns/a/sa/b", "trust domain"),
            ("spiffe://user@cluster.local/ns/a/sa/b", "trust domain"),
            ("spiffe://cluster.local", "four path segments"),
            ("spiffe://cluster.local/", "four path segments"),
            ("spiffe://cluster.local/ns/a/sa/b/", "four path segments"),
            ("spiffe://cluster.local/ns/a/sa", "four path segments"),
            ("spiffe://cluster.local/ns//sa/b", "must be named"),
            ("spiffe://cluster.local/ns/../sa/b", "must be named"),
            ("spiffe://cluster.local/sa/a/ns/b", "\"ns\" and \"sa\""),
            ("spiffe://cluster.local/ns/a/sa/b?x=1", "segments"),
            ("spiffe://cluster.local/ns/a/sa/b#f", "segments"),
            ("spiffe://cluster.local/ns/a%20/sa/b", "segments"),
        ];
        for (input, want) in cases {
            let err = input.parse::<Identity>().unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err}");
        }
        let long = format!("spiffe://cluster.local/ns/a/sa/{}", "b".repeat(3000));
        assert!(matches!(
            long.parse::<Identity>(),
            Err(IdentityError::TooLong { .. })
        ));
    }

    #[test]
    fn serde_uses_the_uri() {
        let json = serde_json::to_string(&id()).unwrap();
        assert_eq!(json, "\"spiffe://cluster.local/ns/default/sa/client\"");
        let back: Identity = serde_json::from_str(&json).unwrap();
        assert_eq!(back, id());
        assert!(serde_json::from_str::<Identity>("\"nope\"").is_err());
    }

    #[test]
    fn ordering_is_by_trust_domain_then_namespace_then_account() {
        let mut ids = [
            Identity::new("b", "a", "a"),
            Identity::new("a", "b", "a"),
            Identity::new("a", "a", "b"),
        ];
        ids.sort();
        assert_eq!(ids[0], Identity::new("a", "a", "b"));
        assert_eq!(ids[2], Identity::new("b", "a", "a"));
    }
}
