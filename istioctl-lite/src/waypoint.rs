//! `waypoint apply|generate|list|delete|status` (Istio's `istioctl waypoint`). A
//! waypoint is a Gateway API Gateway of class `istio-waypoint` with one HBONE listener;
//! the control plane deploys the proxy for it and reports `Programmed` in its status.
//! Gateways are handled as `DynamicObject`s (the kind is served only once the Gateway
//! API CRDs are installed).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::Client;
use serde::{Deserialize, Serialize};
use shared_types::constants::{
    DATAPLANE_MODE_AMBIENT, DATAPLANE_MODE_LABEL, HBONE_PORT, USE_WAYPOINT_LABEL, WAYPOINT_CLASS,
    WAYPOINT_FOR_LABEL,
};

use crate::apply::FIELD_MANAGER;
use crate::cli::{
    Global, Output, WaypointApplyArgs, WaypointDeleteArgs, WaypointGenerateArgs, WaypointListArgs,
    WaypointNamespace, WaypointSpecArgs, WaypointStatusArgs,
};
use crate::kubeclient;
use crate::output::{print_structured, Table};

/// Istio's name for a namespace's waypoint when none is given.
pub const DEFAULT_WAYPOINT_NAME: &str = "waypoint";
/// A waypoint name Istio reserves (`istio.io/use-waypoint: none` opts out of one).
const RESERVED_NAME: &str = "none";
/// Istio's revision label; a waypoint without it belongs to the `default` revision.
pub const REVISION_LABEL: &str = "istio.io/rev";
/// The Gateway status condition a waypoint reports once its proxy is deployed.
const PROGRAMMED: &str = "Programmed";
/// The one listener of a waypoint: HBONE on 15008, named `mesh`.
const LISTENER_NAME: &str = "mesh";
const LISTENER_PROTOCOL: &str = "HBONE";
/// How often `--wait` looks at the Gateway (Istio's istioctl: every second).
const POLL: Duration = Duration::from_millis(500);

/// `gateway.networking.k8s.io/v1` Gateway.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
        "gateways",
    )
}

/// A status condition (`metav1.Condition`), the fields shown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// What the commands read of one Gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct Gateway {
    pub namespace: String,
    pub name: String,
    pub class: String,
    pub labels: BTreeMap<String, String>,
    pub conditions: Vec<Condition>,
}

impl Gateway {
    pub fn from_object(obj: &DynamicObject) -> Self {
        let conditions = obj.data["status"]["conditions"]
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|c| serde_json::from_value(c.clone()).ok())
                    .collect()
            })
            .unwrap_or_default();
        Gateway {
            namespace: obj.metadata.namespace.clone().unwrap_or_default(),
            name: obj.metadata.name.clone().unwrap_or_default(),
            class: obj.data["spec"]["gatewayClassName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            labels: obj.metadata.labels.clone().unwrap_or_default(),
            conditions,
        }
    }

    pub fn is_waypoint(&self) -> bool {
        self.class == WAYPOINT_CLASS
    }

    /// Its `istio.io/rev`, else `default` (as Istio's list shows it).
    pub fn revision(&self) -> &str {
        self.label(REVISION_LABEL).unwrap_or("default")
    }

    /// Its `istio.io/waypoint-for`, else `none` (as Istio's list shows it).
    pub fn traffic_type(&self) -> &str {
        self.label(WAYPOINT_FOR_LABEL).unwrap_or("none")
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The Programmed condition's status, `False` when there is none (as Istio's).
    pub fn programmed(&self) -> &str {
        self.conditions
            .iter()
            .find(|c| c.type_ == PROGRAMMED)
            .map_or("False", |c| c.status.as_str())
    }

    pub fn is_programmed(&self) -> bool {
        self.programmed() == "True"
    }

    /// `Accepted=True (Accepted), Programmed=False (Pending: Waiting for controller)`.
    pub fn describe_conditions(&self) -> String {
        if self.conditions.is_empty() {
            return "no status conditions".into();
        }
        let parts: Vec<String> = self
            .conditions
            .iter()
            .map(|c| {
                let detail = match (c.reason.as_str(), c.message.as_str()) {
                    ("", "") => String::new(),
                    (r, "") => format!(" ({r})"),
                    ("", m) => format!(" ({m})"),
                    (r, m) => format!(" ({r}: {m})"),
                };
                format!("{}={}{detail}", c.type_, c.status)
            })
            .collect();
        parts.join(", ")
    }
}

/// The name to use: empty means the default; `none` is refused, as Istio does.
pub fn waypoint_name(name: &str) -> Result<&str> {
    match name {
        "" => Ok(DEFAULT_WAYPOINT_NAME),
        RESERVED_NAME => {
            bail!("invalid name provided for waypoint, '{RESERVED_NAME}' is a reserved value")
        }
        name => Ok(name),
    }
}

/// The Gateway `waypoint apply` applies and `generate` prints.
pub fn gateway_object(namespace: Option<&str>, spec: &WaypointSpecArgs) -> Result<DynamicObject> {
    let name = waypoint_name(&spec.name)?;
    let mut labels = serde_json::Map::new();
    labels.insert(WAYPOINT_FOR_LABEL.into(), spec.traffic.as_str().into());
    if let Some(rev) = spec.revision.as_deref().filter(|r| !r.is_empty()) {
        labels.insert(REVISION_LABEL.into(), rev.into());
    }
    let mut metadata = serde_json::json!({"name": name, "labels": labels});
    if let Some(ns) = namespace {
        metadata["namespace"] = ns.into();
    }
    let obj = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": metadata,
        "spec": {
            "gatewayClassName": WAYPOINT_CLASS,
            "listeners": [{"name": LISTENER_NAME, "port": HBONE_PORT, "protocol": LISTENER_PROTOCOL}],
        },
    });
    Ok(serde_json::from_value(obj)?)
}

/// `-n`, else the kubeconfig context's namespace (`default` when it names none).
fn namespace(client: &Client, flag: &WaypointNamespace) -> String {
    flag.namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// An error from listing or applying Gateways; 404 means the kind is not served.
fn gateway_api_error(e: kube::Error, what: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(ae) if ae.code == 404 => anyhow!(
            "missing Kubernetes Gateway CRDs need to be installed before {what} (`istioctl-lite install` adds them): {ae}"
        ),
        e => anyhow::Error::new(e).context(format!("{what} failed")),
    }
}

/// The object as printed: without the server's bookkeeping of field owners.
fn printable(mut obj: DynamicObject) -> DynamicObject {
    obj.metadata.managed_fields = None;
    obj
}

/// `waypoint generate`: the Gateway, as YAML (or JSON with `-o json`); nothing is
/// written, and no cluster is needed.
pub fn generate(global: &Global, args: &WaypointGenerateArgs) -> Result<()> {
    let obj = gateway_object(args.spec.namespace.namespace.as_deref(), &args.spec)?;
    let format = match global.output {
        Output::Json => Output::Json,
        _ => Output::Yaml,
    };
    print_structured(format, &obj)
}

/// `waypoint apply`.
pub async fn apply(global: &Global, args: &WaypointApplyArgs) -> Result<()> {
    let name = waypoint_name(&args.spec.name)?.to_string();
    let table = global.output == Output::Table;
    let client = kubeclient::client(global).await?;
    let ns = namespace(&client, &args.spec.namespace);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let current = namespaces
        .get_opt(&ns)
        .await
        .with_context(|| format!("failed to get namespace {ns}"))?
        .with_context(|| format!("namespace: {ns} not found"))?;
    let ns_labels = current.metadata.labels.unwrap_or_default();
    if args.enroll_namespace {
        let enrolled = ns_labels
            .get(USE_WAYPOINT_LABEL)
            .filter(|v| !v.is_empty() && **v != name);
        if let (Some(other), false) = (enrolled, args.overwrite) {
            // Istio's behaviour: a warning, not an error, and nothing applied.
            eprintln!(
                "⚠️ Warning: namespace ({ns}) already has an enrolled Waypoint ({other}). Consider adding the `--overwrite` flag to your apply command."
            );
            return Ok(());
        }
        if ns_labels.get(DATAPLANE_MODE_LABEL).map(String::as_str) != Some(DATAPLANE_MODE_AMBIENT) {
            eprintln!(
                "⚠️ Warning: namespace is not enrolled in ambient. Consider running `istioctl-lite dataplane-mode enable {ns}` (or `kubectl label namespace {ns} {DATAPLANE_MODE_LABEL}={DATAPLANE_MODE_AMBIENT}`)"
            );
        }
    }

    let gateways: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource());
    // Never turn another class's Gateway (an ingress, say) into a waypoint.
    if let Ok(Some(existing)) = gateways.get_opt(&name).await {
        let existing = Gateway::from_object(&existing);
        if !existing.is_waypoint() {
            bail!(
                "Gateway {ns}/{name} exists and is not a waypoint (gatewayClassName {:?}, not {WAYPOINT_CLASS}); choose another --name",
                existing.class
            );
        }
    }
    let obj = gateway_object(Some(&ns), &args.spec)?;
    let mut applied = gateways
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await
        .map_err(|e| gateway_api_error(e, "applying a waypoint"))?;
    if table {
        println!("✅ waypoint {ns}/{name} applied");
    }

    if args.wait {
        applied = wait_programmed(&gateways, &ns, &name, args.timeout).await?;
        if table {
            println!("✅ waypoint {ns}/{name} is ready!");
        }
    }

    if args.enroll_namespace {
        let patch = serde_json::json!({"metadata": {"labels": {USE_WAYPOINT_LABEL: name}}});
        namespaces
            .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("failed to label namespace {ns} with waypoint"))?;
        if table {
            println!("✅ namespace {ns} labeled with \"{USE_WAYPOINT_LABEL}: {name}\"");
        }
    }
    if !table {
        print_structured(global.output, &printable(applied))?;
    }
    Ok(())
}

/// Polls the Gateway until Programmed=True; on timeout, an error with its last
/// conditions.
async fn wait_programmed(
    gateways: &Api<DynamicObject>,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<DynamicObject> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match gateways.get_opt(name).await {
            Ok(Some(obj)) => {
                let gw = Gateway::from_object(&obj);
                if gw.is_programmed() {
                    return Ok(obj);
                }
                format!("its conditions: {}", gw.describe_conditions())
            }
            Ok(None) => "it does not exist".into(),
            Err(e) => format!("last error: {e}"),
        };
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "timed out while waiting for waypoint {ns}/{name} to be {PROGRAMMED} after {timeout:?}; {last}"
            );
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

/// Every Gateway `api` lists with `params`, those of class istio-waypoint only when
/// `waypoints_only`, sorted by namespace and name.
async fn list_gateways(
    api: &Api<DynamicObject>,
    params: &ListParams,
    waypoints_only: bool,
) -> Result<Vec<(Gateway, DynamicObject)>> {
    let list = api
        .list(params)
        .await
        .map_err(|e| gateway_api_error(e, "listing waypoints"))?;
    let mut out: Vec<(Gateway, DynamicObject)> = list
        .items
        .into_iter()
        .map(|obj| (Gateway::from_object(&obj), obj))
        .filter(|(gw, _)| !waypoints_only || gw.is_waypoint())
        .collect();
    out.sort_by(|(a, _), (b, _)| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(out)
}

/// `waypoint list`.
pub async fn list(global: &Global, args: &WaypointListArgs) -> Result<()> {
    let client = kubeclient::client(global).await?;
    let api: Api<DynamicObject> = if args.all_namespaces {
        Api::all_with(client.clone(), &resource())
    } else {
        Api::namespaced_with(
            client.clone(),
            &namespace(&client, &args.namespace),
            &resource(),
        )
    };
    let waypoints = list_gateways(&api, &ListParams::default(), true).await?;
    if global.output != Output::Table {
        let objects: Vec<DynamicObject> =
            waypoints.into_iter().map(|(_, o)| printable(o)).collect();
        return print_structured(global.output, &objects);
    }
    let gateways: Vec<Gateway> = waypoints.into_iter().map(|(g, _)| g).collect();
    print!("{}", list_table(&gateways, args.all_namespaces));
    Ok(())
}

/// Istio's list table (tabwriter padding 5).
pub fn list_table(waypoints: &[Gateway], all_namespaces: bool) -> String {
    if waypoints.is_empty() {
        return "No waypoints found.\n".into();
    }
    let mut header = vec!["NAME", "REVISION", "TRAFFIC TYPE", "PROGRAMMED"];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut table = Table::new(5, &header);
    for gw in waypoints {
        let mut row = vec![
            gw.name.clone(),
            gw.revision().to_string(),
            gw.traffic_type().to_string(),
            gw.programmed().to_string(),
        ];
        if all_namespaces {
            row.insert(0, gw.namespace.clone());
        }
        table.row(row);
    }
    table.render()
}

/// One deleted waypoint, for `-o json|yaml`.
#[derive(Debug, Serialize)]
struct Deleted {
    namespace: String,
    name: String,
}

/// `waypoint delete`: the named waypoints (all checked before any is deleted), or
/// every one of the namespace (`--all`), or of a revision (`--revision`).
pub async fn delete(global: &Global, args: &WaypointDeleteArgs) -> Result<()> {
    let table = global.output == Output::Table;
    let client = kubeclient::client(global).await?;
    let ns = namespace(&client, &args.namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource());
    let targets: Vec<String> = if args.names.is_empty() {
        let mut params = ListParams::default();
        if let Some(rev) = &args.revision {
            params = params.labels(&format!("{REVISION_LABEL}={rev}"));
        }
        list_gateways(&api, &params, true)
            .await?
            .into_iter()
            .map(|(gw, _)| gw.name)
            .collect()
    } else {
        let gateways = list_gateways(&api, &ListParams::default(), false).await?;
        let mut targets: Vec<String> = Vec::new();
        let mut problems = Vec::new();
        for name in &args.names {
            match gateways.iter().find(|(gw, _)| &gw.name == name) {
                Some((gw, _)) if gw.is_waypoint() => {
                    if !targets.contains(name) {
                        targets.push(name.clone());
                    }
                }
                Some((gw, _)) => problems.push(format!(
                    "Gateway {ns}/{name} is not a waypoint (gatewayClassName {:?}, not {WAYPOINT_CLASS})",
                    gw.class
                )),
                None => problems.push(format!("waypoint {ns}/{name} not found")),
            }
        }
        if !problems.is_empty() {
            bail!("{}; nothing deleted", problems.join("; "));
        }
        targets
    };

    let mut deleted = Vec::new();
    for name in targets {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                if table {
                    println!("waypoint {ns}/{name} deleted");
                }
                deleted.push(Deleted {
                    namespace: ns.clone(),
                    name,
                });
            }
            // Gone in the meantime: what was asked for holds.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                if table {
                    println!("waypoint {ns}/{name} not found");
                }
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("deleting waypoint {ns}/{name}")))
            }
        }
    }
    if !table {
        return print_structured(global.output, &deleted);
    }
    if deleted.is_empty() {
        println!("No waypoints found.");
    }
    Ok(())
}

/// One waypoint's status, for `-o json|yaml`.
#[derive(Debug, Serialize)]
struct Status {
    namespace: String,
    name: String,
    programmed: bool,
    conditions: Vec<Condition>,
}

/// `waypoint status`: the conditions of the namespace's waypoints (or of `--name`);
/// with `--wait`, once every one is programmed (or the timeout passed: an error).
pub async fn status(global: &Global, args: &WaypointStatusArgs) -> Result<()> {
    let client = kubeclient::client(global).await?;
    let ns = namespace(&client, &args.namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource());
    let deadline = Instant::now() + args.timeout;
    let waypoints = loop {
        let waypoints = match &args.name {
            Some(name) => vec![one_waypoint(&api, &ns, waypoint_name(name)?).await?],
            None => list_gateways(&api, &ListParams::default(), true)
                .await?
                .into_iter()
                .map(|(gw, _)| gw)
                .collect(),
        };
        let done = waypoints.iter().all(Gateway::is_programmed);
        let now = Instant::now();
        if !args.wait || done || now >= deadline {
            break waypoints;
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    };
    if global.output == Output::Table {
        print!("{}", status_table(&waypoints));
    } else {
        let report: Vec<Status> = waypoints
            .iter()
            .map(|gw| Status {
                namespace: gw.namespace.clone(),
                name: gw.name.clone(),
                programmed: gw.is_programmed(),
                conditions: gw.conditions.clone(),
            })
            .collect();
        print_structured(global.output, &report)?;
    }
    if args.wait {
        let late: Vec<&Gateway> = waypoints.iter().filter(|gw| !gw.is_programmed()).collect();
        let what = match late.as_slice() {
            [] => return Ok(()),
            [gw] => format!("waypoint {}/{}", gw.namespace, gw.name),
            _ => "waypoints".to_string(),
        };
        let each: Vec<String> = late
            .iter()
            .map(|gw| format!("{}/{}: {}", gw.namespace, gw.name, gw.describe_conditions()))
            .collect();
        bail!(
            "timed out while retrieving status for {what} after {:?}; not {PROGRAMMED}: {}",
            args.timeout,
            each.join("; ")
        );
    }
    Ok(())
}

/// The waypoint `name` of `ns`; an error when it is missing or another class's Gateway.
async fn one_waypoint(api: &Api<DynamicObject>, ns: &str, name: &str) -> Result<Gateway> {
    let obj = api
        .get_opt(name)
        .await
        .map_err(|e| gateway_api_error(e, "reading a waypoint"))?
        .with_context(|| format!("waypoint {ns}/{name} not found"))?;
    let gw = Gateway::from_object(&obj);
    if !gw.is_waypoint() {
        bail!(
            "Gateway {ns}/{name} is not a waypoint (gatewayClassName {:?}, not {WAYPOINT_CLASS})",
            gw.class
        );
    }
    Ok(gw)
}

/// Istio's status table (tabwriter padding 5), one row per condition.
pub fn status_table(waypoints: &[Gateway]) -> String {
    if waypoints.is_empty() {
        return "No waypoints found.\n".into();
    }
    let mut table = Table::new(5, &["NAME", "STATUS", "TYPE", "REASON", "MESSAGE"]);
    for gw in waypoints {
        if gw.conditions.is_empty() {
            table.row(vec![
                gw.name.clone(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        for c in &gw.conditions {
            table.row(vec![
                gw.name.clone(),
                c.status.clone(),
                c.type_.clone(),
                c.reason.clone(),
                c.message.clone(),
            ]);
        }
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command, WaypointCommand, WaypointFor};
    use clap::Parser;

    fn spec(args: &[&str]) -> WaypointSpecArgs {
        let cli = Cli::try_parse_from(
            ["istioctl-lite", "waypoint", "generate"]
                .iter()
                .chain(args)
                .copied(),
        )
        .unwrap();
        match cli.command {
            Command::Waypoint {
                command: WaypointCommand::Generate(a),
            } => a.spec,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_gateway_is_istios_waypoint() {
        let obj = gateway_object(Some("demo"), &spec(&[])).unwrap();
        assert_eq!(
            serde_json::to_value(&obj).unwrap(),
            serde_json::json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {
                    "name": "waypoint",
                    "namespace": "demo",
                    "labels": {"istio.io/waypoint-for": "service"},
                },
                "spec": {
                    "gatewayClassName": "istio-waypoint",
                    "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
                },
            })
        );
        let obj = gateway_object(
            None,
            &spec(&["--name", "w1", "--for", "all", "-r", "canary"]),
        )
        .unwrap();
        assert_eq!(obj.metadata.name.as_deref(), Some("w1"));
        assert_eq!(obj.metadata.namespace, None);
        let labels = obj.metadata.labels.unwrap();
        assert_eq!(labels[WAYPOINT_FOR_LABEL], "all");
        assert_eq!(labels[REVISION_LABEL], "canary");
    }

    #[test]
    fn names_and_traffic_types_are_checked_as_istio_does() {
        assert_eq!(waypoint_name("").unwrap(), "waypoint");
        assert_eq!(waypoint_name("w").unwrap(), "w");
        let err = waypoint_name("none").unwrap_err().to_string();
        assert!(err.contains("'none' is a reserved value"), "{err}");
        for (flag, want) in [
            ("service", WaypointFor::Service),
            ("workload", WaypointFor::Workload),
            ("all", WaypointFor::All),
            ("none", WaypointFor::None),
        ] {
            assert_eq!(spec(&["--for", flag]).traffic, want);
            assert_eq!(want.as_str(), flag);
        }
        assert!(
            Cli::try_parse_from(["istioctl-lite", "waypoint", "apply", "--for", "pods"]).is_err()
        );
    }

    fn gw(name: &str, labels: &[(&str, &str)], conditions: &[(&str, &str)]) -> Gateway {
        Gateway {
            namespace: "default".into(),
            name: name.into(),
            class: WAYPOINT_CLASS.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            conditions: conditions
                .iter()
                .map(|(t, s)| Condition {
                    type_: t.to_string(),
                    status: s.to_string(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn list_table_is_istios() {
        let rows = [
            gw("waypoint", &[], &[("Programmed", "True")]),
            gw(
                "bookinfo-rev",
                &[(REVISION_LABEL, "rev1"), (WAYPOINT_FOR_LABEL, "all")],
                &[],
            ),
        ];
        assert_eq!(
            list_table(&rows, false),
            "NAME             REVISION     TRAFFIC TYPE     PROGRAMMED\n\
             waypoint         default      none             True\n\
             bookinfo-rev     rev1         all              False\n"
        );
        assert!(list_table(&rows, true).starts_with("NAMESPACE     NAME "));
        assert_eq!(list_table(&[], true), "No waypoints found.\n");
    }

    #[test]
    fn conditions_are_read_from_the_status() {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "w", "namespace": "ns"},
            "spec": {"gatewayClassName": "istio-waypoint", "listeners": []},
            "status": {"conditions": [
                {"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
                {"type": "Programmed", "status": "False", "reason": "Invalid", "message": "no pods"},
            ]},
        }))
        .unwrap();
        let gw = Gateway::from_object(&obj);
        assert!(gw.is_waypoint() && !gw.is_programmed());
        assert_eq!(gw.programmed(), "False");
        assert_eq!(
            gw.describe_conditions(),
            "Accepted=True (Accepted), Programmed=False (Invalid: no pods)"
        );
        assert_eq!(
            status_table(&[gw]),
            "NAME     STATUS     TYPE           REASON       MESSAGE\n\
             w        True       Accepted       Accepted     \n\
             w        False      Programmed     Invalid      no pods\n"
        );
    }
}
