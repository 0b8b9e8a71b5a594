use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use kube::core::DynamicObject;

use super::*;
use crate::model::{build, policy};

fn opts() -> Options {
    Options {
        cluster_id: "c1".into(),
        trust_domain: "td.example".into(),
        cluster_domain: "cluster.local".into(),
        root_namespace: "istio-system".into(),
    }
}

fn pod_yaml(y: &str) -> Arc<Pod> {
    Arc::new(serde_yaml::from_str(y).unwrap())
}

fn svc_yaml(y: &str) -> Arc<KubeService> {
    Arc::new(serde_yaml::from_str(y).unwrap())
}

const POD: &str = r#"
metadata:
  name: web-7d9f-abcde
  namespace: app
  labels: {app: web, pod-template-hash: 7d9f, version: v2}
  annotations: {ambient.istio.io/redirection: enabled}
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: web-7d9f, uid: x, controller: true}
spec:
  serviceAccountName: web-sa
  nodeName: node-1
  containers:
  - name: c
    ports:
    - {name: http, containerPort: 8080}
    - {name: dns, containerPort: 5353, protocol: UDP}
status:
  phase: Running
  podIP: 10.0.0.5
  podIPs: [{ip: 10.0.0.5}, {ip: "fd00::5"}]
  conditions: [{type: Ready, status: "True"}]
"#;

const SVC: &str = r#"
metadata: {name: web, namespace: app}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: PreferDualStack
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: admin, port: 9000, targetPort: 9090}
  - {name: plain, port: 7000}
  - {name: dns, port: 53, targetPort: dns}
"#;

fn services(list: &[Arc<KubeService>]) -> Vec<ServiceInfo> {
    list.iter().filter_map(|s| service(s, &opts())).collect()
}

fn workload(p: &Pod, svcs: &[ServiceInfo]) -> Option<Workload> {
    pod(p, &ServiceIndex::new(svcs), &[], &opts())
}

#[test]
fn running_pod_with_redirection_is_an_hbone_workload() {
    let w = workload(&pod_yaml(POD), &[]).unwrap();
    assert_eq!(w.uid, "c1//Pod/app/web-7d9f-abcde");
    assert_eq!(w.name, "web-7d9f-abcde");
    assert_eq!(w.namespace, "app");
    assert_eq!(w.service_account, "web-sa");
    assert_eq!(w.trust_domain, "td.example");
    assert_eq!(w.node, "node-1");
    assert_eq!(w.protocol, Protocol::Hbone);
    assert_eq!(w.status, HealthStatus::Healthy);
    assert_eq!(w.network_mode, NetworkMode::Standard);
    assert_eq!(
        w.workload_ips,
        vec![
            "10.0.0.5".parse::<IpAddr>().unwrap(),
            "fd00::5".parse().unwrap()
        ]
    );
    assert_eq!(w.workload_name, "web");
    assert_eq!(w.workload_type, "deployment");
    assert_eq!(
        (w.canonical_name.as_str(), w.canonical_revision.as_str()),
        ("web", "v2")
    );
    assert_eq!(w.cluster_id, "c1");
    // Our uid matches what the local source derives for uid-less workloads.
    let local = Workload {
        uid: String::new(),
        ..w.clone()
    };
    assert_eq!(local.effective_uid(), w.uid);
}

#[test]
fn pod_without_annotation_is_tcp_with_defaults() {
    let p = pod_yaml(
        "metadata: {name: a, namespace: n}\nspec: {containers: []}\n\
         status: {phase: Pending, podIP: 10.0.0.7}\n",
    );
    let w = workload(&p, &[]).unwrap();
    assert_eq!(w.protocol, Protocol::Tcp);
    assert_eq!(w.service_account, "default");
    assert_eq!(w.status, HealthStatus::Unhealthy, "not Ready");
    assert_eq!(w.workload_type, "pod");
    assert_eq!(w.workload_ips, vec!["10.0.0.7".parse::<IpAddr>().unwrap()]);

    let pending = pod_yaml(
        "metadata: {name: a, namespace: n, annotations: {ambient.istio.io/redirection: pending}}\n\
         status: {phase: Running, podIP: 10.0.0.7}\n",
    );
    assert_eq!(workload(&pending, &[]).unwrap().protocol, Protocol::Tcp);
}

#[test]
fn finished_or_ip_less_pods_are_not_workloads() {
    for phase in ["Succeeded", "Failed", "Unknown"] {
        let p = pod_yaml(&format!(
            "metadata: {{name: a, namespace: n}}\nstatus: {{phase: {phase}, podIP: 10.0.0.1}}\n"
        ));
        assert!(workload(&p, &[]).is_none(), "{phase}");
    }
    let no_ip = pod_yaml("metadata: {name: a, namespace: n}\nstatus: {phase: Pending}\n");
    assert!(workload(&no_ip, &[]).is_none());
    let bad_ip =
        pod_yaml("metadata: {name: a, namespace: n}\nstatus: {phase: Running, podIP: nope}\n");
    assert!(workload(&bad_ip, &[]).is_none());
    let no_status = pod_yaml("metadata: {name: a, namespace: n}\n");
    assert!(workload(&no_status, &[]).is_none());
}

#[test]
fn host_network_pods_are_included_but_never_hbone() {
    let p = pod_yaml(
        "metadata: {name: h, namespace: kube-system, annotations: {ambient.istio.io/redirection: enabled}}\n\
         spec: {hostNetwork: true, containers: []}\nstatus: {phase: Running, podIP: 192.168.1.10}\n",
    );
    let w = workload(&p, &[]).unwrap();
    assert_eq!(w.protocol, Protocol::Tcp);
    assert_eq!(w.network_mode, NetworkMode::HostNetwork);
}

#[test]
fn service_converts_vips_ports_and_hostname() {
    let s = &services(&[svc_yaml(SVC)])[0];
    assert_eq!(s.service.hostname, "web.app.svc.cluster.local");
    assert_eq!(s.service.key(), "app/web.app.svc.cluster.local");
    let vips: Vec<String> = s.service.vips.iter().map(|v| v.to_string()).collect();
    assert_eq!(vips, vec!["/10.96.0.10", "/fd00:96::10"]);
    // Named targets are 0 on the service (resolved per workload), unset = the port.
    assert_eq!(s.service.ports.get(&80), Some(&0));
    assert_eq!(s.service.ports.get(&9000), Some(&9090));
    assert_eq!(s.service.ports.get(&7000), Some(&7000));
    assert_eq!(s.targets.len(), 4);
    let json = serde_json::to_value(&s.service).unwrap();
    assert_eq!(json["vips"][0], "/10.96.0.10");
    // `spec.ipFamilies` as Istio's `ip_families`: both, one, or unset.
    assert_eq!(s.service.ip_families, Some(IpFamilies::Dual));
    let v6 = svc_yaml(
        "metadata: {name: s, namespace: n}\nspec: {clusterIP: \"fd00::1\", ipFamilies: [IPv6]}\n",
    );
    assert_eq!(
        services(&[v6])[0].service.ip_families,
        Some(IpFamilies::IPv6)
    );
    let unset = svc_yaml("metadata: {name: s, namespace: n}\nspec: {clusterIP: 10.96.0.1}\n");
    assert_eq!(services(&[unset])[0].service.ip_families, None);
}

#[test]
fn port_protocols_come_from_app_protocol_then_the_name_prefix() {
    let svc = svc_yaml(
        r#"
metadata: {name: p, namespace: n}
spec:
  clusterIP: 10.96.0.9
  ports:
  - {name: http, port: 80}
  - {name: http-web, port: 81}
  - {name: grpc-api, port: 82}
  - {name: tcp, port: 83, appProtocol: kubernetes.io/h2c}
  - {name: http-but-tcp, port: 84, appProtocol: tcp}
  - {name: https, port: 443}
  - {port: 85, appProtocol: HTTP}
"#,
    );
    let protocols = &services(&[svc])[0].service.app_protocols;
    let want = [
        (80, AppProtocol::Http11),
        (81, AppProtocol::Http11),
        (82, AppProtocol::Grpc),
        (83, AppProtocol::Http2),
        (85, AppProtocol::Http11),
    ];
    assert_eq!(protocols, &want.into_iter().collect());
}

#[test]
fn headless_external_name_and_load_balancer_services() {
    let headless = svc_yaml(
        "metadata: {name: h, namespace: n}\nspec: {clusterIP: None, selector: {a: b}, ports: [{port: 80}]}\n",
    );
    assert!(services(&[headless])[0].service.vips.is_empty());
    let ext = svc_yaml(
        "metadata: {name: e, namespace: n}\nspec: {type: ExternalName, externalName: x.com}\n",
    );
    assert!(services(&[ext]).is_empty());
    let lb = svc_yaml(
        "metadata: {name: l, namespace: n}\nspec: {type: LoadBalancer, clusterIP: 10.96.0.3}\n\
         status: {loadBalancer: {ingress: [{ip: 203.0.113.7}, {hostname: lb.example}]}}\n",
    );
    let vips: Vec<String> = services(&[lb])[0]
        .service
        .vips
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(vips, vec!["/10.96.0.3", "/203.0.113.7"]);
}

#[test]
fn workload_services_map_resolves_named_and_numeric_target_ports() {
    let svcs = services(&[svc_yaml(SVC)]);
    let w = workload(&pod_yaml(POD), &svcs).unwrap();
    let ports = &w.services["app/web.app.svc.cluster.local"];
    assert_eq!(
        ports.get(&80),
        Some(&8080),
        "named targetPort via container port"
    );
    assert_eq!(ports.get(&9000), Some(&9090), "numeric targetPort");
    assert_eq!(ports.get(&7000), Some(&7000), "unset targetPort");
    // `dns` is a UDP container port: no TCP match, so the port is left out (istiod).
    assert_eq!(ports.get(&53), None);
    assert_eq!(ports.len(), 3);
}

#[test]
fn services_select_only_matching_pods_in_their_namespace() {
    let other_ns = svc_yaml("metadata: {name: web, namespace: other}\nspec: {selector: {app: web}, ports: [{port: 80}]}\n");
    let wrong_labels = svc_yaml(
        "metadata: {name: db, namespace: app}\nspec: {selector: {app: db}, ports: [{port: 80}]}\n",
    );
    let no_selector =
        svc_yaml("metadata: {name: manual, namespace: app}\nspec: {ports: [{port: 80}]}\n");
    // The first selector label matches, the second does not.
    let partly = svc_yaml("metadata: {name: web-v1, namespace: app}\nspec: {selector: {app: web, version: v1}, ports: [{port: 80}]}\n");
    let svcs = services(&[other_ns, wrong_labels, no_selector, partly]);
    let w = workload(&pod_yaml(POD), &svcs).unwrap();
    assert!(w.services.is_empty(), "{:?}", w.services);

    // Every label of a selector must match, whichever one the index keys it by.
    let both = svc_yaml("metadata: {name: web-v2, namespace: app}\nspec: {selector: {app: web, version: v2}, ports: [{port: 80}]}\n");
    let by_version = svc_yaml("metadata: {name: v2, namespace: app}\nspec: {selector: {version: v2}, ports: [{port: 80}]}\n");
    let w = workload(&pod_yaml(POD), &services(&[both, by_version])).unwrap();
    let mut keys: Vec<&String> = w.services.keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "app/v2.app.svc.cluster.local",
            "app/web-v2.app.svc.cluster.local"
        ]
    );
}

fn ap(y: &str) -> policy::ConvertedPolicy {
    let obj: DynamicObject = serde_yaml::from_str(y).unwrap();
    policy::convert(&obj, "istio-system").unwrap()
}

#[test]
fn selector_policies_are_listed_on_selected_workloads() {
    let policies = vec![
        ap("metadata: {name: sel, namespace: app}\nspec: {selector: {matchLabels: {app: web}}}\n"),
        ap("metadata: {name: other, namespace: app}\nspec: {selector: {matchLabels: {app: db}}}\n"),
        ap("metadata: {name: elsewhere, namespace: b}\nspec: {selector: {matchLabels: {app: web}}}\n"),
        ap("metadata: {name: mesh, namespace: istio-system}\nspec: {selector: {matchLabels: {version: v2}}}\n"),
        ap("metadata: {name: ns-wide, namespace: app}\nspec: {}\n"),
    ];
    let w = pod(&pod_yaml(POD), &ServiceIndex::default(), &policies, &opts()).unwrap();
    assert_eq!(
        w.authorization_policies,
        vec!["app/sel", "istio-system/mesh"]
    );
}

#[test]
fn build_is_sorted_and_deterministic() {
    let pods = vec![
        pod_yaml(POD),
        pod_yaml(
            "metadata: {name: a, namespace: app, labels: {app: web}}\n\
             status: {phase: Running, podIP: 10.0.0.9, conditions: [{type: Ready, status: \"True\"}]}\n",
        ),
    ];
    let svcs = vec![svc_yaml(SVC)];
    let one = build(
        &pods,
        &svcs,
        &Default::default(),
        &[],
        &Default::default(),
        &opts(),
    );
    let mut reversed = pods.clone();
    reversed.reverse();
    assert_eq!(
        one,
        build(
            &reversed,
            &svcs,
            &Default::default(),
            &[],
            &Default::default(),
            &opts()
        )
    );
    assert_eq!(one.workloads[0].name, "a");
}

#[test]
fn use_waypoint_labels_bind_pods_and_services_as_istiod_does() {
    let labels = |y: &str| -> BTreeMap<String, String> { serde_yaml::from_str(y).unwrap() };
    let ns = labels("{istio.io/use-waypoint: wp}");
    let named = |labels, namespace_labels| waypoint_ref("app", labels, namespace_labels);
    let wp = || Some(("app".to_string(), "wp".to_string()));
    // A namespace's label applies to its objects without their own.
    let web = labels("{app: web}");
    assert_eq!(named(Some(&web), Some(&ns)), wp());
    let address = waypoint_address("app", "wp", "cluster.local");
    assert_eq!(
        address.destination.to_string(),
        "app/wp.app.svc.cluster.local"
    );
    assert_eq!(address.hbone_mtls_port, 15008);
    // The object's own label wins, `none` included; the waypoint may live elsewhere.
    let none = labels("{istio.io/use-waypoint: none}");
    assert_eq!(named(Some(&none), Some(&ns)), None);
    let elsewhere = labels("{istio.io/use-waypoint: mine, istio.io/use-waypoint-namespace: infra}");
    assert_eq!(
        named(Some(&elsewhere), None),
        Some(("infra".to_string(), "mine".to_string()))
    );
    // A waypoint never uses one; no label anywhere means none.
    let managed = labels("{gateway.istio.io/managed: istio.io-mesh-controller}");
    assert_eq!(named(Some(&managed), Some(&ns)), None);
    assert_eq!(named(None, None), None);

    // Through build: the Gateway's `waypoint-for` says which of the namespace's
    // objects are bound; without a Gateway, Istio's default (Services).
    let bound = |takes: Option<WaypointFor>| {
        let mut bindings = WaypointBindings {
            namespaces: [("app".to_string(), ns.clone())].into(),
            ..Default::default()
        };
        if let Some(takes) = takes {
            bindings.gateways.insert(wp().unwrap(), takes);
        }
        let built = build(
            &[pod_yaml(POD)],
            &[svc_yaml(SVC)],
            &bindings,
            &[],
            &Default::default(),
            &opts(),
        );
        (
            built.workloads[0].waypoint.is_some(),
            built.services[0].waypoint.is_some(),
        )
    };
    assert_eq!(bound(None), (false, true));
    assert_eq!(bound(Some(WaypointFor::Service)), (false, true));
    assert_eq!(bound(Some(WaypointFor::Workload)), (true, false));
    assert_eq!(bound(Some(WaypointFor::All)), (true, true));
    assert_eq!(bound(Some(WaypointFor::None)), (false, false));
    assert_eq!(WaypointFor::parse("workload"), WaypointFor::Workload);
    assert_eq!(WaypointFor::parse("bogus"), WaypointFor::Service);
    let unlabelled = build(
        &[pod_yaml(POD)],
        &[svc_yaml(SVC)],
        &Default::default(),
        &[],
        &Default::default(),
        &opts(),
    );
    assert!(unlabelled.workloads[0].waypoint.is_none());
    assert!(unlabelled.services[0].waypoint.is_none());
}
