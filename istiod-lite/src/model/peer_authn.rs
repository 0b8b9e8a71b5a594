//! Istio PeerAuthentication (`security.istio.io/v1`, `v1beta1`) -> the L4 policies that
//! make a destination refuse plaintext.
//!
//! Follows istiod's conversion for ztunnel: the effective mode of a workload is its
//! workload-selector policy's, else its namespace policy's, else the mesh-wide policy's
//! (a selector-less policy in the root namespace); `UNSET` inherits, the default is
//! PERMISSIVE. DISABLE acts as PERMISSIVE (ztunnel always accepts plaintext then).
//! Several candidates at one level: the oldest wins (ties: by name, for a stable result).
//!
//! A workload whose effective mode is STRICT on every port lists the static policy
//! `<root>/istio_converted_static_strict`: DENY when the peer has no identity, which is
//! exactly a plaintext connection on 15006 (HBONE always has one). `portLevelMtls` on a
//! workload-selector policy that makes some ports differ from the rest converts into
//! `<ns>/converted_peer_authentication_<name>`, a DENY limited to (or excluding) those
//! ports. Both go through the ordinary policy evaluation, so a new STRICT policy also
//! closes live plaintext connections.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::{ApiResource, DynamicObject};
use serde::Deserialize;

use super::convert::selects;
use mesh_model::policy::{CONVERTED_PEER_AUTHN_PREFIX, STATIC_STRICT_POLICY};
use mesh_model::{Action, Authorization, RbacMatch, Scope, StringMatch};

/// `security.istio.io/v1` PeerAuthentication, read as a dynamic object (the API server
/// serves v1beta1 objects under v1 too).
pub fn resource() -> ApiResource {
    ApiResource {
        group: "security.istio.io".into(),
        version: "v1".into(),
        api_version: "security.istio.io/v1".into(),
        kind: "PeerAuthentication".into(),
        plural: "peerauthentications".into(),
    }
}

/// `mtls.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Inherit from the parent (namespace, then mesh); PERMISSIVE at the top.
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

impl Mode {
    fn parse(s: Option<&str>) -> Result<Mode, String> {
        match s.unwrap_or("") {
            "" | "UNSET" => Ok(Mode::Unset),
            "DISABLE" => Ok(Mode::Disable),
            "PERMISSIVE" => Ok(Mode::Permissive),
            "STRICT" => Ok(Mode::Strict),
            other => Err(format!("unknown mTLS mode {other:?}")),
        }
    }

    /// This mode, or `parent` when unset.
    fn or(self, parent: Mode) -> Mode {
        if self == Mode::Unset {
            parent
        } else {
            self
        }
    }
}

/// One PeerAuthentication, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAuthn {
    pub name: String,
    pub namespace: String,
    created: Option<Time>,
    /// Non-empty `selector.matchLabels` (an empty selector is namespace-wide, as istiod).
    selector: Option<BTreeMap<String, String>>,
    pub mode: Mode,
    /// `portLevelMtls` (target ports), unset entries dropped.
    pub ports: BTreeMap<u16, Mode>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    selector: Option<Selector>,
    mtls: Option<Mtls>,
    port_level_mtls: Option<BTreeMap<String, Option<Mtls>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    match_labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
struct Mtls {
    mode: Option<String>,
}

/// Parses one object; an error names what is wrong (the object is then ignored, as
/// istiod's validation would have refused it).
pub fn parse(obj: &DynamicObject) -> Result<PeerAuthn, String> {
    let name = obj.metadata.name.clone().filter(|n| !n.is_empty());
    let namespace = obj.metadata.namespace.clone().filter(|n| !n.is_empty());
    let (Some(name), Some(namespace)) = (name, namespace) else {
        return Err("the object has no name or namespace".into());
    };
    let spec: Spec = match obj.data.get("spec") {
        None | Some(serde_json::Value::Null) => Spec::default(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("invalid spec: {e}"))?,
    };
    let mode = Mode::parse(spec.mtls.as_ref().and_then(|m| m.mode.as_deref()))?;
    let mut ports = BTreeMap::new();
    for (port, mtls) in spec.port_level_mtls.into_iter().flatten() {
        let port = port
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("invalid port {port:?} in portLevelMtls"))?;
        let port_mode = Mode::parse(mtls.as_ref().and_then(|m| m.mode.as_deref()))?;
        if port_mode != Mode::Unset {
            ports.insert(port, port_mode);
        }
    }
    let selector = spec
        .selector
        .and_then(|s| s.match_labels)
        .filter(|l| !l.is_empty());
    Ok(PeerAuthn {
        name,
        namespace,
        created: obj.metadata.creation_timestamp.clone(),
        selector,
        mode,
        ports,
    })
}

/// What a workload's effective PeerAuthentication makes of plaintext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effective {
    /// Plaintext accepted on every port.
    Permissive,
    /// Plaintext refused on every port: the static STRICT policy.
    Strict,
    /// Some ports differ: the converted workload policy (key and policy).
    Ports(Authorization),
}

/// All PeerAuthentications, indexed for [`PeerAuthentications::effective`].
#[derive(Debug, Clone, Default)]
pub struct PeerAuthentications {
    root_namespace: String,
    /// The oldest selector-less policy in the root namespace.
    mesh: Option<PeerAuthn>,
    /// Namespace -> its oldest selector-less policy.
    namespaces: BTreeMap<String, PeerAuthn>,
    /// Selector policies outside the root namespace, oldest first.
    selectors: Vec<PeerAuthn>,
    any: bool,
}

impl PeerAuthentications {
    pub fn new(mut all: Vec<PeerAuthn>, root_namespace: &str) -> Self {
        all.sort_by(|a, b| {
            (&a.created, &a.name, &a.namespace).cmp(&(&b.created, &b.name, &b.namespace))
        });
        let mut out = PeerAuthentications {
            root_namespace: root_namespace.to_owned(),
            any: !all.is_empty(),
            ..Default::default()
        };
        for pa in all {
            match (&pa.selector, pa.namespace == root_namespace) {
                (None, true) => {
                    out.mesh.get_or_insert(pa);
                }
                (None, false) => {
                    out.namespaces.entry(pa.namespace.clone()).or_insert(pa);
                }
                // istiod ignores selector policies in the root namespace for ztunnel.
                (Some(_), true) => {}
                (Some(_), false) => out.selectors.push(pa),
            }
        }
        out
    }

    /// Whether any PeerAuthentication exists (istiod then publishes the static policy).
    pub fn is_empty(&self) -> bool {
        !self.any
    }

    /// The static STRICT policy (`<root>/istio_converted_static_strict`).
    pub fn static_strict(&self) -> Authorization {
        deny_plaintext(
            STATIC_STRICT_POLICY,
            &self.root_namespace,
            RbacMatch::default(),
        )
    }

    /// The effective mode for a workload in `namespace` with `labels`.
    pub fn effective(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Effective {
        let mesh = self.mesh.as_ref().map_or(Mode::Unset, |p| p.mode);
        let parent = self
            .namespaces
            .get(namespace)
            .map_or(Mode::Unset, |p| p.mode)
            .or(mesh);
        let workload = self.selectors.iter().find(|p| {
            p.namespace == namespace && p.selector.as_ref().is_some_and(|s| selects(s, labels))
        });
        let Some(workload) = workload else {
            return strict_or_permissive(parent);
        };
        let base = workload.mode.or(parent);
        let strict = base == Mode::Strict;
        // Ports whose effective mode differs from the workload's.
        let differ: BTreeSet<u16> = workload
            .ports
            .iter()
            .filter(|(_, m)| (**m == Mode::Strict) != strict)
            .map(|(p, _)| *p)
            .collect();
        if differ.is_empty() {
            return strict_or_permissive(base);
        }
        let ports: Vec<u16> = differ.into_iter().collect();
        let only = if strict {
            // Plaintext refused except on these ports.
            RbacMatch {
                not_destination_ports: ports,
                ..Default::default()
            }
        } else {
            // Plaintext refused on these ports only.
            RbacMatch {
                destination_ports: ports,
                ..Default::default()
            }
        };
        Effective::Ports(deny_plaintext(
            &format!("{CONVERTED_PEER_AUTHN_PREFIX}{}", workload.name),
            &workload.namespace,
            only,
        ))
    }
}

fn strict_or_permissive(mode: Mode) -> Effective {
    if mode == Mode::Strict {
        Effective::Strict
    } else {
        Effective::Permissive
    }
}

/// A WorkloadSelector DENY matching connections without a peer identity (plaintext),
/// narrowed by `only` (ports).
fn deny_plaintext(name: &str, namespace: &str, only: RbacMatch) -> Authorization {
    let m = RbacMatch {
        not_principals: vec![StringMatch::Presence],
        ..only
    };
    Authorization {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![vec![vec![m]]],
        dry_run: false,
        warnings: Vec::new(),
    }
}

#[cfg(test)]
#[path = "peer_authn_tests.rs"]
mod tests;
