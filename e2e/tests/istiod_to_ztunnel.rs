//! istiod-lite's model as ztunnel holds it: objects built into xDS resources by
//! istiod-lite, published and encoded as on the wire, then applied by ztunnel's own
//! xDS client code. What ztunnel enforces (endpoints, indexes, authorization) is
//! checked on that state. No root, no network: the two crates' code, end to end.

use std::sync::Arc;

use istiod_lite::model::peer_authn::{self, PeerAuthentications};
use istiod_lite::model::{build, Built, Options};
use istiod_lite::xds::store::ResourceStore;
use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use kube::core::DynamicObject;
use mesh_model::{ConnectionAttrs, Denied};
use shared_types::identity::Identity;
use shared_types::istio::xds::{
    resource, DeltaDiscoveryResponse, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use ztunnel::discovery::xds::Resources;
use ztunnel::state::ProxyState;

/// What a ztunnel sent `built` holds.
fn ztunnel_state(built: &Built) -> ProxyState {
    let store = ResourceStore::default();
    built.publish(&store);
    let mut held = Resources::default();
    for type_url in [AUTHORIZATION_TYPE_URL, ADDRESS_TYPE_URL] {
        let resources = store
            .all(type_url)
            .into_iter()
            .map(|(name, entry)| resource(&*name, entry.version(), entry.body.clone()))
            .collect();
        let response = DeltaDiscoveryResponse {
            type_url: type_url.into(),
            resources,
            ..Default::default()
        };
        let refused = held.apply(response);
        assert!(refused.is_empty(), "ztunnel refused {refused:?}");
    }
    held.state().clone()
}

fn pod(y: &str) -> Arc<Pod> {
    Arc::new(serde_yaml::from_str(y).unwrap())
}

fn service(y: &str) -> Arc<KubeService> {
    Arc::new(serde_yaml::from_str(y).unwrap())
}

fn opts() -> Options {
    Options {
        cluster_id: "c1".into(),
        trust_domain: "td.example".into(),
        cluster_domain: "cluster.local".into(),
        root_namespace: "istio-system".into(),
    }
}

#[test]
fn named_target_ports_resolve_per_endpoint_in_ztunnel() {
    let pods = vec![
        pod("metadata: {name: web-7d9f-abcde, namespace: app, labels: {app: web}, \
               annotations: {ambient.istio.io/redirection: enabled}}\n\
             spec: {containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}\n\
             status: {phase: Running, podIP: 10.0.0.5, conditions: [{type: Ready, status: \"True\"}]}\n"),
        pod("metadata: {name: a, namespace: app, labels: {app: web}}\n\
             status: {phase: Running, podIP: 10.0.0.9, conditions: [{type: Ready, status: \"True\"}]}\n"),
    ];
    let services = vec![service(
        "metadata: {name: web, namespace: app}\n\
         spec: {clusterIP: 10.96.0.10, selector: {app: web}, \
                ports: [{name: http, port: 80, targetPort: http}]}\n",
    )];
    let built = build(
        &pods,
        &services,
        &Default::default(),
        &[],
        &Default::default(),
        &opts(),
    );
    let state = ztunnel_state(&built);
    let svc = state.service_by_vip("10.96.0.10".parse().unwrap()).unwrap();
    let targets: Vec<(String, u16)> = state
        .service_endpoints(&svc, 80)
        .iter()
        .map(|(w, p)| (w.name.clone(), *p))
        .collect();
    // "a" has no `http` container port: its entry lacks 80 and falls back to the port.
    assert_eq!(
        targets,
        vec![("a".to_string(), 80), ("web-7d9f-abcde".to_string(), 8080)]
    );
}

#[test]
fn host_network_pods_are_known_by_name_never_by_the_nodes_ip() {
    let host = pod(
        "metadata: {name: h, namespace: kube-system, annotations: {ambient.istio.io/redirection: enabled}}\n\
         spec: {hostNetwork: true, containers: []}\nstatus: {phase: Running, podIP: 192.168.1.10}\n",
    );
    let built = build(
        &[host],
        &[],
        &Default::default(),
        &[],
        &Default::default(),
        &opts(),
    );
    let state = ztunnel_state(&built);
    assert!(state
        .workload_by_ip("192.168.1.10".parse().unwrap())
        .is_none());
    assert!(state.workload_by_name("kube-system", "h").is_some());
}

#[test]
fn strict_peer_authentication_refuses_plaintext_in_ztunnel() {
    const ROOT: &str = "istio-system";
    let pa = |ns: &str, name: &str, created: u32, spec: &str| {
        let y = format!(
            "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\n\
             metadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"2024-01-01T00:00:{created:02}Z\"}}\n\
             spec: {spec}\n"
        );
        let obj: DynamicObject = serde_yaml::from_str(&y).unwrap();
        peer_authn::parse(&obj).unwrap()
    };
    let enrolled = |name: &str, ip: &str, labels: &str| {
        pod(&format!(
            "metadata: {{name: {name}, namespace: app, labels: {labels}, \
               annotations: {{ambient.istio.io/redirection: enabled}}}}\n\
             status: {{phase: Running, podIP: {ip}, conditions: [{{type: Ready, status: \"True\"}}]}}\n"
        ))
    };
    let mut legacy = (*enrolled("old", "10.0.0.7", "{}")).clone();
    legacy.metadata.namespace = Some("legacy".into());
    let pods = vec![
        enrolled("web", "10.0.0.5", "{app: web}"),
        enrolled("db", "10.0.0.6", "{app: db}"),
        Arc::new(legacy),
    ];
    let peer_authentications = PeerAuthentications::new(
        vec![
            pa(ROOT, "default", 0, "{mtls: {mode: STRICT}}"),
            pa("legacy", "ns", 1, "{mtls: {mode: PERMISSIVE}}"),
            pa(
                "app",
                "db",
                2,
                "{selector: {matchLabels: {app: db}}, portLevelMtls: {\"5432\": {mode: PERMISSIVE}}}",
            ),
        ],
        ROOT,
    );
    let built = build(
        &pods,
        &[],
        &Default::default(),
        &[],
        &peer_authentications,
        &Options::default(),
    );
    let state = ztunnel_state(&built);
    let plaintext = |ip: &str, port: u16| ConnectionAttrs {
        src_identity: None,
        src_ip: "10.9.9.9".parse().unwrap(),
        dst: format!("{ip}:{port}").parse().unwrap(),
    };
    let wl = |ip: &str| state.workload_by_ip(ip.parse().unwrap()).unwrap();
    let denied = state
        .authorize(&plaintext("10.0.0.5", 80), &wl("10.0.0.5"))
        .unwrap_err();
    assert_eq!(denied.reason(), "strict_mtls");
    let mtls = ConnectionAttrs {
        src_identity: Some(Identity::new("cluster.local", "app", "client")),
        ..plaintext("10.0.0.5", 80)
    };
    assert_eq!(state.authorize(&mtls, &wl("10.0.0.5")), Ok(()));
    // A PERMISSIVE namespace, and a port-level PERMISSIVE exception.
    assert_eq!(
        state.authorize(&plaintext("10.0.0.7", 80), &wl("10.0.0.7")),
        Ok(())
    );
    assert_eq!(
        state.authorize(&plaintext("10.0.0.6", 5432), &wl("10.0.0.6")),
        Ok(())
    );
    assert_eq!(
        state
            .authorize(&plaintext("10.0.0.6", 80), &wl("10.0.0.6"))
            .map_err(|d| d.reason()),
        Err("strict_mtls")
    );
    // An AuthorizationPolicy denial keeps its own reason.
    assert_eq!(
        Denied::ByDeny("app/deny-all".into()).reason(),
        "policy_denied"
    );
}
