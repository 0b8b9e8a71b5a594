//! A container's environment as kubelet builds it from the pod spec: `envFrom`
//! sources first, then `env` in order (a later entry wins), with `valueFrom`
//! resolved against the pod, the node, ConfigMaps and Secrets, and `$(VAR)`
//! references expanded against what was defined before.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use serde_json::Value;

use crate::api::Api;

/// Where ConfigMaps and Secrets come from (the API server; a map in unit tests).
pub trait ObjectSource {
    /// `kind` is `configmaps` or `secrets`; `None` when the object does not exist.
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>>;
}

impl ObjectSource for Api {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>> {
        self.get_opt(&format!("/api/v1/namespaces/{namespace}/{kind}/{name}"))
    }
}

/// What the downward API can tell a container beyond its Pod object.
pub struct PodRuntime<'a> {
    pub pod_ips: &'a [String],
    pub host_ips: &'a [String],
    /// Node allocatable, for `resourceFieldRef` on a resource without a limit.
    pub node_cpu_millis: u64,
    pub node_memory_bytes: u64,
}

/// The container's environment, in definition order (the last definition of a
/// name wins). A missing ConfigMap, Secret or key that is not `optional` is an
/// error, as kubelet's `CreateContainerConfigError`.
pub fn resolve(
    objects: &dyn ObjectSource,
    pod: &Value,
    container: &Value,
    rt: &PodRuntime,
) -> Result<Vec<(String, String)>> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let mut env: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let mut order = 0usize;
    let mut define = |env: &mut BTreeMap<String, (usize, String)>, k: String, v: String| {
        order += 1;
        env.insert(k, (order, v));
    };

    for source in container["envFrom"].as_array().into_iter().flatten() {
        let prefix = source["prefix"].as_str().unwrap_or_default();
        let (kind, reference) = if source["configMapRef"].is_object() {
            ("configmaps", &source["configMapRef"])
        } else if source["secretRef"].is_object() {
            ("secrets", &source["secretRef"])
        } else {
            bail!("envFrom entry names neither configMapRef nor secretRef: {source}");
        };
        let Some(data) = source_data(objects, kind, namespace, reference)? else {
            continue;
        };
        for (key, value) in data {
            // kubelet skips keys that are not valid variable names (with an event).
            let name = format!("{prefix}{key}");
            if is_env_name(&name) {
                define(&mut env, name, value);
            }
        }
    }

    for entry in container["env"].as_array().into_iter().flatten() {
        let name = entry["name"]
            .as_str()
            .ok_or_else(|| anyhow!("env entry without a name: {entry}"))?
            .to_owned();
        let value = if let Some(value) = entry["value"].as_str() {
            let defined: BTreeMap<&str, &str> = env
                .iter()
                .map(|(k, (_, v))| (k.as_str(), v.as_str()))
                .collect();
            expand(value, &defined)
        } else if let Some(from) = entry["valueFrom"].as_object() {
            match value_from(objects, pod, container, rt, namespace, from)
                .with_context(|| format!("env {name}"))?
            {
                Some(v) => v,
                None => continue,
            }
        } else {
            String::new()
        };
        define(&mut env, name, value);
    }

    let mut out: Vec<(usize, String, String)> =
        env.into_iter().map(|(k, (o, v))| (o, k, v)).collect();
    out.sort();
    Ok(out.into_iter().map(|(_, k, v)| (k, v)).collect())
}

/// `$(VAR)` in command and args, against the container's environment.
pub fn expand_args(words: &[String], env: &[(String, String)]) -> Vec<String> {
    let defined: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    words.iter().map(|w| expand(w, &defined)).collect()
}

fn value_from(
    objects: &dyn ObjectSource,
    pod: &Value,
    container: &Value,
    rt: &PodRuntime,
    namespace: &str,
    from: &serde_json::Map<String, Value>,
) -> Result<Option<String>> {
    if let Some(field) = from.get("fieldRef") {
        let path = field["fieldPath"].as_str().unwrap_or_default();
        return field_ref(pod, rt, path).map(Some);
    }
    if let Some(resource) = from.get("resourceFieldRef") {
        return resource_field_ref(pod, container, rt, resource).map(Some);
    }
    for (key, kind) in [
        ("configMapKeyRef", "configmaps"),
        ("secretKeyRef", "secrets"),
    ] {
        let Some(reference) = from.get(key) else {
            continue;
        };
        let wanted = reference["key"].as_str().unwrap_or_default();
        let optional = reference["optional"].as_bool().unwrap_or(false);
        let Some(data) = source_data(objects, kind, namespace, reference)? else {
            return Ok(None);
        };
        return match data.get(wanted) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => bail!(
                "couldn't find key {wanted} in {} {namespace}/{}",
                singular(kind),
                reference["name"].as_str().unwrap_or_default()
            ),
        };
    }
    bail!(
        "valueFrom names no source kubelet knows: {}",
        Value::Object(from.clone())
    )
}

/// The string data of a ConfigMap or Secret; `None` when absent and `optional`.
fn source_data(
    objects: &dyn ObjectSource,
    kind: &str,
    namespace: &str,
    reference: &Value,
) -> Result<Option<BTreeMap<String, String>>> {
    let name = reference["name"].as_str().unwrap_or_default();
    let optional = reference["optional"].as_bool().unwrap_or(false);
    let Some(object) = objects.get(kind, namespace, name)? else {
        if optional {
            return Ok(None);
        }
        bail!("{} {namespace:?}/{name:?} not found", singular(kind));
    };
    let mut data = BTreeMap::new();
    for (k, v) in object["data"].as_object().into_iter().flatten() {
        let text = v.as_str().unwrap_or_default();
        let value = if kind == "secrets" {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .with_context(|| format!("secret {name} key {k} is not base64"))?;
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            text.to_owned()
        };
        data.insert(k.clone(), value);
    }
    if kind == "secrets" {
        for (k, v) in object["stringData"].as_object().into_iter().flatten() {
            data.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
        }
    }
    Ok(Some(data))
}

fn singular(kind: &str) -> &str {
    if kind == "secrets" {
        "secret"
    } else {
        "configmap"
    }
}

/// The downward API's `fieldRef` paths kubelet supports for env.
fn field_ref(pod: &Value, rt: &PodRuntime, path: &str) -> Result<String> {
    let meta = &pod["metadata"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let keyed = |field: &str| -> Option<String> {
        let key = path
            .strip_prefix(&format!("metadata.{field}['"))?
            .strip_suffix("']")?;
        Some(text(&meta[field][key]))
    };
    Ok(match path {
        "metadata.name" => text(&meta["name"]),
        "metadata.namespace" => text(&meta["namespace"]),
        "metadata.uid" => text(&meta["uid"]),
        "spec.nodeName" => text(&pod["spec"]["nodeName"]),
        "spec.serviceAccountName" => pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_owned(),
        "status.podIP" => rt.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => rt.pod_ips.join(","),
        "status.hostIP" => rt.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => rt.host_ips.join(","),
        _ => keyed("labels")
            .or_else(|| keyed("annotations"))
            .ok_or_else(|| anyhow!("unsupported fieldRef fieldPath {path:?}"))?,
    })
}

/// `resourceFieldRef`: the container's limit (node allocatable when unset) or
/// request, divided by `divisor` and rounded up, as kubelet does.
fn resource_field_ref(
    pod: &Value,
    container: &Value,
    rt: &PodRuntime,
    reference: &Value,
) -> Result<String> {
    let target = match reference["containerName"].as_str() {
        Some(name) => pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .ok_or_else(|| anyhow!("resourceFieldRef names no container {name:?}"))?,
        None => container,
    };
    let resource = reference["resource"].as_str().unwrap_or_default();
    let (section, what) = resource
        .split_once('.')
        .ok_or_else(|| anyhow!("unsupported resource {resource:?}"))?;
    let cpu = match what {
        "cpu" => true,
        "memory" | "ephemeral-storage" => false,
        _ => bail!("unsupported resource {resource:?}"),
    };
    let given = |section: &str| {
        target["resources"][section][what]
            .as_str()
            .map(str::to_owned)
            .or_else(|| {
                target["resources"][section][what]
                    .as_u64()
                    .map(|n| n.to_string())
            })
    };
    // In milli-units for cpu, bytes otherwise.
    let scale = |q: &str| -> Result<f64> { Ok(quantity(q)? * if cpu { 1000.0 } else { 1.0 }) };
    let node = if cpu {
        rt.node_cpu_millis
    } else {
        rt.node_memory_bytes
    } as f64;
    let amount = match section {
        "limits" => given("limits")
            .map(|q| scale(&q))
            .transpose()?
            .unwrap_or(node),
        // A request defaults to the limit, and that to nothing (0).
        "requests" => match given("requests").or_else(|| given("limits")) {
            Some(q) => scale(&q)?,
            None => 0.0,
        },
        _ => bail!("unsupported resource {resource:?}"),
    };
    let divisor = match reference["divisor"].as_str() {
        Some(d) => scale(d)?,
        None if cpu => 1000.0,
        None => 1.0,
    };
    if divisor <= 0.0 {
        bail!("resourceFieldRef divisor must be positive");
    }
    Ok(format!("{}", (amount / divisor).ceil() as u64))
}

/// A Kubernetes quantity (`500m`, `2`, `128Mi`, `1G`, `1e3`) as a number.
pub fn quantity(q: &str) -> Result<f64> {
    let q = q.trim();
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (number, factor) = SUFFIXES
        .iter()
        .find_map(|(s, f)| q.strip_suffix(s).map(|n| (n, *f)))
        .unwrap_or((q, 1.0));
    let n: f64 = number
        .parse()
        .map_err(|_| anyhow!("invalid quantity {q:?}"))?;
    if !n.is_finite() || n < 0.0 {
        bail!("invalid quantity {q:?}");
    }
    Ok(n * factor)
}

/// `$(NAME)` → its value when defined; `$$` → `$`; anything else stays as written.
fn expand(text: &str, defined: &BTreeMap<&str, &str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(close) = tail.strip_prefix("$(").and_then(|t| t.find(')')) {
            let name = &tail[2..2 + close];
            match defined.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&tail[..close + 3]),
            }
            rest = &tail[close + 3..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// A C identifier-like name, as kubelet accepts from `envFrom`.
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    struct Objects(Vec<(&'static str, &'static str, Value)>);

    impl ObjectSource for Objects {
        fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>> {
            assert_eq!(namespace, "ns");
            Ok(self
                .0
                .iter()
                .find(|(k, n, _)| *k == kind && *n == name)
                .map(|(_, _, v)| v.clone()))
        }
    }

    fn objects() -> Objects {
        Objects(vec![
            (
                "configmaps",
                "cfg",
                json!({"data": {"LEVEL": "debug", "MODE": "a", "bad key": "x"}}),
            ),
            // "s3cret"
            ("secrets", "creds", json!({"data": {"TOKEN": "czNjcmV0"}})),
        ])
    }

    fn pod(container: Value) -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                         "labels": {"app": "web"}, "annotations": {"a/b": "c"}},
            "spec": {"nodeName": "node-1", "serviceAccountName": "sa", "containers": [container]},
        })
    }

    fn rt() -> PodRuntime<'static> {
        static POD: [String; 0] = [];
        PodRuntime {
            pod_ips: &POD,
            host_ips: &POD,
            node_cpu_millis: 2000,
            node_memory_bytes: 4 << 30,
        }
    }

    fn env_of(container: Value) -> Result<Vec<(String, String)>> {
        let pod = pod(container);
        let pod_ips = ["10.244.1.5".to_owned(), "fd00::5".to_owned()];
        let host_ips = ["172.18.0.11".to_owned()];
        let rt = PodRuntime {
            pod_ips: &pod_ips,
            host_ips: &host_ips,
            ..rt()
        };
        resolve(&objects(), &pod, &pod["spec"]["containers"][0], &rt)
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn resolves_every_source_kubelet_knows() {
        let fields = [
            ("NAME", "metadata.name", "p"),
            ("NS", "metadata.namespace", "ns"),
            ("NODE", "spec.nodeName", "node-1"),
            ("SA", "spec.serviceAccountName", "sa"),
            ("IP", "status.podIP", "10.244.1.5"),
            ("IPS", "status.podIPs", "10.244.1.5,fd00::5"),
            ("HOST", "status.hostIP", "172.18.0.11"),
            ("APP", "metadata.labels['app']", "web"),
            ("ANN", "metadata.annotations['a/b']", "c"),
        ];
        let mut env: Vec<Value> = fields
            .iter()
            .map(|(n, p, _)| json!({"name": n, "valueFrom": {"fieldRef": {"fieldPath": p}}}))
            .collect();
        env.extend([
            json!({"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}),
            json!({"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}}}),
            json!({"name": "NODE_CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m", "containerName": "c"}}}),
            json!({"name": "LVL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "LEVEL"}}}),
            json!({"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "TOKEN"}}}),
            json!({"name": "MODE", "value": "b"}),
            json!({"name": "URL", "value": "http://$(IP):80/$(UNSET)/$$(IP)"}),
        ]);
        let got = env_of(json!({
            "name": "c",
            "resources": {"limits": {"cpu": "1500m"}, "requests": {"memory": "64Mi"}},
            "envFrom": [{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "creds"}, "prefix": "S_"}],
            "env": env,
        }))
        .unwrap();
        for (name, _, want) in fields {
            assert_eq!(get(&got, name), Some(want), "{name}");
        }
        assert_eq!(get(&got, "CPU"), Some("2"), "1500m rounds up to 2 cores");
        assert_eq!(get(&got, "MEM_MI"), Some("64"));
        assert_eq!(get(&got, "NODE_CPU_M"), Some("1500"));
        assert_eq!(get(&got, "LVL"), Some("debug"));
        assert_eq!(get(&got, "TOKEN"), Some("s3cret"));
        assert_eq!(
            get(&got, "S_TOKEN"),
            Some("s3cret"),
            "envFrom with a prefix"
        );
        assert_eq!(get(&got, "MODE"), Some("b"), "env overrides envFrom");
        assert_eq!(
            get(&got, "bad key"),
            None,
            "invalid names from envFrom are skipped"
        );
        assert_eq!(
            get(&got, "URL"),
            Some("http://10.244.1.5:80/$(UNSET)/$(IP)")
        );
    }

    #[test]
    fn limits_default_to_node_allocatable() {
        let got = env_of(json!({"name": "c", "env": [
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Gi"}}},
        ]}))
        .unwrap();
        assert_eq!(get(&got, "CPU"), Some("2"));
        assert_eq!(get(&got, "MEM"), Some("4"));
    }

    #[test]
    fn missing_sources_fail_unless_optional() {
        let missing_cm = env_of(json!({"name": "c", "env": [
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}]}));
        assert!(missing_cm.unwrap_err().to_string().contains("env X"));
        let missing_key = env_of(json!({"name": "c", "env": [
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope"}}}]}));
        assert!(format!("{:#}", missing_key.unwrap_err()).contains("couldn't find key nope"));
        let optional = env_of(json!({"name": "c",
            "envFrom": [{"configMapRef": {"name": "nope", "optional": true}}],
            "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}}]}))
        .unwrap();
        assert!(optional.is_empty(), "{optional:?}");
        let bad_field = env_of(json!({"name": "c", "env": [
            {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}}]}));
        assert!(bad_field.is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m").unwrap(), 0.5);
        assert_eq!(quantity("128Mi").unwrap(), 134217728.0);
        assert_eq!(quantity("1G").unwrap(), 1e9);
        assert_eq!(quantity("1e3").unwrap(), 1000.0);
        assert!(quantity("lots").is_err());
        assert!(quantity("-1").is_err());
    }

    #[test]
    fn args_expand_against_the_environment() {
        let env = vec![("PORT".to_owned(), "8080".to_owned())];
        let args = vec!["--listen=:$(PORT)".to_owned(), "$(NOPE)".to_owned()];
        assert_eq!(expand_args(&args, &env), ["--listen=:8080", "$(NOPE)"]);
    }
}
