//! CustomResourceDefinitions, as kube-apiserver's apiextensions server treats them: a
//! CRD is checked when written (names, versions, one storage version, a structural
//! schema per version, the approval annotation of protected groups), gets a status
//! from the server (accepted names, `NamesAccepted`, `Established`, stored versions),
//! and, once established, what it defines is served (see `catalog.rs`).

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use serde_json::{json, Value};

use crate::meta;
use crate::resources::Resource;
use crate::schema::{FieldError, Schema};

/// The CRD resource's group, for errors about CRDs.
pub const GROUP: &str = "apiextensions.k8s.io";
/// The finalizer a real server puts on a CRD being deleted.
const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// A column `kubectl get` prints for a custom resource (`additionalPrinterColumns`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// The column header.
    pub name: String,
    /// `string`, `integer`, `date`, ...
    pub kind: String,
    /// Where the cell comes from, e.g. `.spec.action`.
    pub json_path: String,
    /// 0: always shown; above: only with `-o wide`.
    pub priority: u64,
}

/// One version of a custom resource.
#[derive(Debug, Clone)]
pub struct CrdVersion {
    /// `v1`, `v1beta1`, ...
    pub name: String,
    /// Whether requests may use it.
    pub served: bool,
    /// Its `openAPIV3Schema`.
    pub schema: Option<Schema>,
    /// Its `additionalPrinterColumns`.
    pub columns: Vec<PrinterColumn>,
}

/// What an established CRD makes the server serve.
#[derive(Debug, Clone)]
pub struct CustomResource {
    /// The resource row (served versions, preferred first).
    pub resource: &'static Resource,
    /// `kubectl get <category>` names it answers to.
    pub categories: Vec<String>,
    /// Every version, served or not.
    pub versions: Vec<CrdVersion>,
    /// The CRD is being deleted: no new objects.
    pub terminating: bool,
}

impl CustomResource {
    /// The definition of `version`.
    pub fn version(&self, version: &str) -> Option<&CrdVersion> {
        self.versions.iter().find(|v| v.name == version)
    }
}

/// `spec.group`, `spec.names.plural` of a CRD object.
pub fn group_and_plural(crd: &Value) -> (String, String) {
    let text = |p: &str| {
        crd.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (text("/spec/group"), text("/spec/names/plural"))
}

/// Groups whose CRDs need `api-approved.kubernetes.io` (Kubernetes' own names).
fn protected(group: &str) -> bool {
    ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|d| group == *d || group.ends_with(&format!(".{d}")))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// What is wrong with a CRD a client writes (its status is the server's).
pub fn validate(crd: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let invalid = |field: &str, value: &str, detail: &str| FieldError {
        reason: "FieldValueInvalid",
        field: field.into(),
        message: format!("Invalid value: {value:?}: {detail}"),
    };
    let required = |field: &str, detail: &str| FieldError {
        reason: "FieldValueRequired",
        field: field.into(),
        message: if detail.is_empty() {
            "Required value".into()
        } else {
            format!("Required value: {detail}")
        },
    };
    let (group, plural) = group_and_plural(crd);
    let text = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or("");
    if group.is_empty() {
        errors.push(required("spec.group", ""));
    } else if !group.contains('.') {
        errors.push(invalid(
            "spec.group",
            &group,
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        errors.push(required("spec.names.plural", ""));
    } else if !is_dns_label(&plural) {
        errors.push(invalid(
            "spec.names.plural",
            &plural,
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
        ));
    }
    if text("/spec/names/kind").is_empty() {
        errors.push(required("spec.names.kind", ""));
    }
    let name = meta::name_of(crd);
    if name != format!("{plural}.{group}") {
        errors.push(invalid(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    match text("/spec/scope") {
        "Namespaced" | "Cluster" => {}
        other => errors.push(FieldError {
            reason: "FieldValueNotSupported",
            field: "spec.scope".into(),
            message: format!(
                "Unsupported value: {other:?}: supported values: \"Cluster\", \"Namespaced\""
            ),
        }),
    }
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
    match versions {
        None => errors.push(required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        )),
        Some(versions) => {
            let mut seen = HashSet::new();
            let mut storage = 0;
            for (i, v) in versions.iter().enumerate() {
                let field = format!("spec.versions[{i}]");
                let vname = v.get("name").and_then(Value::as_str).unwrap_or("");
                if !is_dns_label(vname) {
                    errors.push(invalid(
                        &format!("{field}.name"),
                        vname,
                        "must be a DNS-1035 label",
                    ));
                }
                if !seen.insert(vname) {
                    errors.push(invalid(
                        "spec.versions",
                        vname,
                        "must contain unique version names",
                    ));
                }
                if v.get("storage").and_then(Value::as_bool) == Some(true) {
                    storage += 1;
                }
                match v.pointer("/schema/openAPIV3Schema") {
                    None => errors.push(required(
                        &format!("{field}.schema.openAPIV3Schema"),
                        "schemas are required",
                    )),
                    Some(schema) => errors.extend(
                        Schema::new(schema.clone())
                            .structural_errors(&format!("{field}.schema.openAPIV3Schema")),
                    ),
                }
            }
            if storage != 1 {
                errors.push(invalid(
                    "spec.versions",
                    &format!("{storage} storage versions"),
                    "must have exactly one version marked as storage version",
                ));
            }
        }
    }
    if protected(&group) {
        let annotation = crd
            .pointer("/metadata/annotations/api-approved.kubernetes.io")
            .and_then(Value::as_str)
            .unwrap_or("");
        if annotation.is_empty() {
            errors.push(required(
                "metadata.annotations[api-approved.kubernetes.io]",
                "protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111",
            ));
        }
    }
    errors
}

/// The names a CRD takes in its group: plural, singular, short names, kind, list kind.
fn names_of(names: &Value) -> Vec<String> {
    let text = |k: &str| {
        names
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut out = vec![
        text("plural"),
        text("singular"),
        text("kind"),
        list_kind(names),
    ];
    out.extend(
        names
            .get("shortNames")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from),
    );
    out.retain(|n| !n.is_empty());
    out
}

fn list_kind(names: &Value) -> String {
    names
        .get("listKind")
        .and_then(Value::as_str)
        .map(String::from)
        .unwrap_or_else(|| {
            format!(
                "{}List",
                names.get("kind").and_then(Value::as_str).unwrap_or("")
            )
        })
}

/// `crd` with the status the server gives it: its names accepted unless another CRD
/// of the group holds one of them, then established; a terminating CRD keeps what it
/// had. `others` are the other stored CRDs; `old` the CRD before this write.
pub fn with_status(mut crd: Value, others: &[Value], old: Option<&Value>) -> Value {
    let (group, _) = group_and_plural(&crd);
    let names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut taken: HashSet<String> = HashSet::new();
    for other in others
        .iter()
        .filter(|o| group_and_plural(o).0 == group && meta::name_of(o) != meta::name_of(&crd))
    {
        if let Some(accepted) = other.pointer("/status/acceptedNames") {
            taken.extend(names_of(accepted));
        }
    }
    let conflict = [
        ("plural", "PluralConflict"),
        ("singular", "SingularConflict"),
        ("kind", "KindConflict"),
    ]
    .into_iter()
    .find_map(|(field, reason)| {
        let name = names.get(field).and_then(Value::as_str).unwrap_or("");
        (!name.is_empty() && taken.contains(name))
            .then(|| (reason, format!("{name:?} is already in use")))
    })
    .or_else(|| {
        names_of(&json!({"shortNames": names.get("shortNames").cloned().unwrap_or(Value::Null)}))
            .into_iter()
            .find(|n| taken.contains(n))
            .map(|n| ("ShortNamesConflict", format!("{n:?} is already in use")))
    });
    let old_conditions = old
        .and_then(|o| o.pointer("/status/conditions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        let since = old_conditions
            .iter()
            .find(|c| c["type"] == kind && c["status"] == status)
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(meta::now_rfc3339()));
        json!({"type": kind, "status": status, "lastTransitionTime": since, "reason": reason, "message": message})
    };
    let mut conditions = Vec::new();
    let accepted = match &conflict {
        None => {
            conditions.push(condition(
                "NamesAccepted",
                "True",
                "NoConflicts",
                "no conflicts found",
            ));
            conditions.push(condition(
                "Established",
                "True",
                "InitialNamesAccepted",
                "the initial names have been accepted",
            ));
            let mut accepted = names.clone();
            accepted["listKind"] = json!(list_kind(&names));
            accepted
        }
        Some((reason, message)) => {
            conditions.push(condition("NamesAccepted", "False", reason, message));
            conditions.push(condition(
                "Established",
                "False",
                "NotAccepted",
                "not all names are accepted",
            ));
            old.and_then(|o| o.pointer("/status/acceptedNames").cloned())
                .unwrap_or_else(|| json!({"plural": "", "kind": ""}))
        }
    };
    if protected(&group) {
        let url = crd
            .pointer("/metadata/annotations/api-approved.kubernetes.io")
            .and_then(Value::as_str)
            .unwrap_or("");
        let (status, reason, message) = if url.starts_with("unapproved") {
            (
                "False",
                "UnapprovedAnnotation",
                format!("not approved: {url:?}"),
            )
        } else {
            ("True", "ApprovedAnnotation", format!("approved in {url}"))
        };
        conditions.push(condition(
            "KubernetesAPIApprovalPolicyConformant",
            status,
            reason,
            &message,
        ));
    }
    if crd.pointer("/metadata/deletionTimestamp").is_some() {
        conditions.push(condition(
            "Terminating",
            "True",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
        ));
    }
    let mut stored: Vec<Value> = old
        .and_then(|o| o.pointer("/status/storedVersions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(storage) = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .and_then(|v| v.get("name").cloned())
    {
        if !stored.contains(&storage) {
            stored.push(storage);
        }
    }
    meta::set_path(
        &mut crd,
        "/status",
        json!({
            "acceptedNames": accepted,
            "conditions": conditions,
            "storedVersions": stored,
        }),
    );
    crd
}

/// Marks a CRD being deleted, as the real server does before it removes the
/// instances: a deletion timestamp, the cleanup finalizer, `Terminating`.
pub fn terminating(crd: &Value) -> Value {
    let mut crd = crd.clone();
    meta::set_path(
        &mut crd,
        "/metadata/deletionTimestamp",
        json!(meta::now_rfc3339()),
    );
    meta::set_path(&mut crd, "/metadata/finalizers", json!([CLEANUP_FINALIZER]));
    with_status(crd.clone(), &[], Some(&crd))
}

/// What a stored CRD serves, `None` unless it is established.
pub fn served(crd: &Value) -> Option<CustomResource> {
    let established = crd
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Established" && c["status"] == "True");
    if !established {
        return None;
    }
    let accepted = crd.pointer("/status/acceptedNames")?;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let strings = |v: &Value, k: &str| -> Vec<String> {
        v.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect()
    };
    let group = text(crd.pointer("/spec")?, "group");
    let versions: Vec<CrdVersion> = crd
        .pointer("/spec/versions")?
        .as_array()?
        .iter()
        .map(|v| CrdVersion {
            name: text(v, "name"),
            served: v.get("served").and_then(Value::as_bool).unwrap_or(false),
            schema: v
                .pointer("/schema/openAPIV3Schema")
                .cloned()
                .map(Schema::new),
            columns: v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| PrinterColumn {
                    name: text(c, "name"),
                    kind: text(c, "type"),
                    json_path: text(c, "jsonPath"),
                    priority: c.get("priority").and_then(Value::as_u64).unwrap_or(0),
                })
                .collect(),
        })
        .collect();
    let mut served: Vec<String> = versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.clone())
        .collect();
    served.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    let status = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| v.pointer("/subresources/status").is_some());
    let resource = intern(Resource {
        group: leak(&group),
        versions: leak_list(&served),
        plural: leak(&text(accepted, "plural")),
        singular: leak(&text(accepted, "singular")),
        kind: leak(&text(accepted, "kind")),
        namespaced: crd.pointer("/spec/scope").and_then(Value::as_str) == Some("Namespaced"),
        short_names: leak_list(&strings(accepted, "shortNames")),
        status,
        create_only: false,
    });
    Some(CustomResource {
        resource,
        categories: strings(accepted, "categories"),
        versions,
        terminating: crd.pointer("/metadata/deletionTimestamp").is_some(),
    })
}

/// Orders versions as Kubernetes does: GA before beta before alpha, higher numbers
/// first; names that are not Kubernetes-like last.
fn version_priority(version: &str) -> (u8, u64, u64) {
    let Some(rest) = version.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(major) = digits.parse::<u64>() else {
        return (0, 0, 0);
    };
    let tail = &rest[digits.len()..];
    let stage = |prefix: &str, level: u8| {
        tail.strip_prefix(prefix)
            .and_then(|n| n.parse::<u64>().ok())
            .map(|minor| (level, major, minor))
    };
    match tail {
        "" => (3, major, 0),
        _ => stage("beta", 2)
            .or_else(|| stage("alpha", 1))
            .unwrap_or((0, 0, 0)),
    }
}

/// Strings of CRD-defined resources live as long as the process: each distinct one is
/// kept once.
fn leak(s: &str) -> &'static str {
    static STRINGS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut set = STRINGS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(found) = set.get(s) {
        return found;
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    set.insert(leaked);
    leaked
}

fn leak_list(items: &[String]) -> &'static [&'static str] {
    let leaked: Vec<&'static str> = items.iter().map(|s| leak(s)).collect();
    Box::leak(leaked.into_boxed_slice())
}

/// One `&'static Resource` per distinct definition, so the store and watches can hold
/// custom resources as they hold built-in ones.
fn intern(resource: Resource) -> &'static Resource {
    static RESOURCES: OnceLock<Mutex<Vec<&'static Resource>>> = OnceLock::new();
    let mut all = RESOURCES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(found) = all.iter().find(|r| ***r == resource) {
        return found;
    }
    let leaked: &'static Resource = Box::leak(Box::new(resource));
    all.push(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(name: &str, group: &str, plural: &str, kind: &str, short: &[&str]) -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {
                "group": group, "scope": "Namespaced",
                "names": {"plural": plural, "singular": plural.trim_end_matches('s'), "kind": kind, "shortNames": short},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": true, "subresources": {"status": {}},
                     "schema": {"openAPIV3Schema": {"type": "object"}}},
                    {"name": "v1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object"}},
                     "additionalPrinterColumns": [{"name": "Action", "type": "string", "jsonPath": ".spec.action"}]},
                ],
            },
        })
    }

    #[test]
    fn a_valid_crd_is_established_and_serves_its_versions_preferred_first() {
        let c = crd("widgets.x.io", "x.io", "widgets", "Widget", &["wd"]);
        assert!(validate(&c).is_empty(), "{:?}", validate(&c));
        let stored = with_status(c, &[], None);
        assert_eq!(stored["status"]["acceptedNames"]["listKind"], "WidgetList");
        assert_eq!(stored["status"]["storedVersions"], json!(["v1beta1"]));
        let served = served(&stored).unwrap();
        assert_eq!(served.resource.versions, ["v1", "v1beta1"]);
        assert_eq!(served.resource.short_names, ["wd"]);
        assert!(served.resource.status && served.resource.namespaced);
        assert_eq!(
            served.version("v1").unwrap().columns[0].json_path,
            ".spec.action"
        );
    }

    #[test]
    fn names_taken_in_the_group_keep_a_crd_from_being_established() {
        let first = with_status(
            crd("widgets.x.io", "x.io", "widgets", "Widget", &["w"]),
            &[],
            None,
        );
        let second = with_status(
            crd("gadgets.x.io", "x.io", "gadgets", "Gadget", &["w"]),
            std::slice::from_ref(&first),
            None,
        );
        assert_eq!(
            second["status"]["conditions"][0]["reason"],
            "ShortNamesConflict"
        );
        assert!(served(&second).is_none());
        let other_group = with_status(
            crd("gadgets.y.io", "y.io", "gadgets", "Gadget", &["w"]),
            &[first],
            None,
        );
        assert!(served(&other_group).is_some());
    }

    #[test]
    fn invalid_crds_are_refused_with_their_fields() {
        let mut c = crd("wrong.x.io", "x.io", "widgets", "Widget", &[]);
        c["spec"]["versions"][1]["storage"] = json!(true);
        c["spec"]["versions"][0]["schema"] = json!({"openAPIV3Schema": {"type": "string"}});
        let fields: Vec<String> = validate(&c).into_iter().map(|e| e.field).collect();
        assert!(fields.contains(&"metadata.name".to_string()), "{fields:?}");
        assert!(fields.contains(&"spec.versions".to_string()), "{fields:?}");
        assert!(
            fields.contains(&"spec.versions[0].schema.openAPIV3Schema.type".to_string()),
            "{fields:?}"
        );
        let protected = crd(
            "gateways.gateway.networking.k8s.io",
            "gateway.networking.k8s.io",
            "gateways",
            "Gateway",
            &[],
        );
        assert!(validate(&protected)
            .iter()
            .any(|e| e.field == "metadata.annotations[api-approved.kubernetes.io]"));
    }

    #[test]
    fn versions_sort_as_kubernetes_sorts_them() {
        let mut v = vec!["v1alpha1", "v1beta1", "foo", "v2", "v1", "v1beta2"];
        v.sort_by_key(|x| std::cmp::Reverse(version_priority(x)));
        assert_eq!(v, ["v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "foo"]);
    }
}
