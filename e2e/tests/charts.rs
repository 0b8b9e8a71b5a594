//! The charts against the binaries they run: every environment variable a chart sets
//! is one its binary reads (a misspelt or stale name would be silently ignored).

use e2e::charts::{install_manifests, unread_env};

/// Value sets whose renders differ in the environment they give.
const VARIANTS: &[&[&str]] = &[
    &[],
    &[
        "ztunnel.discovery.source=local",
        "ztunnel.crds.enabled=true",
    ],
    &["cni.nativeNftables=true", "cni.ambient.dnsCapture=false"],
];

#[test]
fn every_env_var_the_charts_set_is_read_by_its_binary() {
    if !e2e::prerequisite(
        istioctl_lite_charts_render(),
        "helm on PATH (scripts/install-chart-tools.sh)",
    ) {
        return;
    }
    for sets in VARIANTS {
        let objects = install_manifests(sets).unwrap();
        let containers = e2e::charts::containers(&objects).unwrap();
        // The mesh's three workloads, each with a non-empty environment.
        for workload in [
            "DaemonSet/istio-cni-node",
            "DaemonSet/ztunnel",
            "Deployment/istiod",
        ] {
            let c = containers.iter().find(|c| c.workload == workload);
            assert!(
                c.is_some_and(|c| !c.env_names.is_empty()),
                "{workload} with env in {sets:?}: {containers:#?}"
            );
        }
        let unread = unread_env(&objects).unwrap();
        assert!(
            unread.is_empty(),
            "with --set {sets:?}, names the binaries do not read:\n{}",
            unread.join("\n")
        );
    }
}

fn istioctl_lite_charts_render() -> bool {
    std::process::Command::new("helm")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}
