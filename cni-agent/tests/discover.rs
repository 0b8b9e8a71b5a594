//! Finding an already-running pod's network namespace through `/proc` (the node
//! agent's discovery, for pods that were running before the agent): by IP address,
//! by pod UID in the cgroups, never the host's own namespace. Root-only tests build
//! their own namespaces and skip with a message when not root.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use cni_agent::enrollment::discover::{MatchedBy, ProcScan};
use mesh_runtime::netns::NetnsHandle;
use test_support::netns::Netns;
use test_support::topology::Node;

/// Starts `sleep` inside `ns` and waits until it has entered the netns.
fn sleeper(ns: &Netns, name: &str) -> test_support::process::ChildGuard {
    let mut cmd = ns.command("sleep");
    cmd.arg("30");
    let child = test_support::process::ChildGuard::spawn(name, cmd).unwrap();
    let want = std::fs::metadata(ns.path())
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    let pid = child.pid();
    test_support::poll::wait_for("sleep inside the pod netns", Duration::from_secs(5), || {
        let ino = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (std::os::unix::fs::MetadataExt::ino(&ino) == want && comm.trim() == "sleep").then_some(())
    })
    .unwrap();
    child
}

#[test]
fn discover_finds_a_running_pod_by_ip_and_skips_the_host_netns() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let node = Node::new("rd", 205).unwrap();
    let pod = node.add_pod("rd", "p").unwrap();
    let mut child = sleeper(&pod.ns, "redirect-discover-sleep");
    let ip: IpAddr = pod.ip.parse().unwrap();
    let pod_inode = handle(&pod.ns).inode();

    // No cgroup names this pod: the IP alone finds it.
    let found = ProcScan::new("/proc")
        .unwrap()
        .find("0b8d2c1e-unknown-uid", &[ip])
        .unwrap();
    let found = found.expect("pod netns found by IP");
    assert_eq!(found.matched_by, MatchedBy::IpOnly);
    assert_eq!(found.netns.inode(), pod_inode);
    assert_eq!(
        found.netns.path(),
        Path::new(&format!("/proc/{}/ns/net", found.pid))
    );

    // A proc root whose pid 1 lives in the pod netns: that netns is now "the host".
    let fake = tempfile::tempdir().unwrap();
    proc_entry(
        fake.path(),
        1,
        Path::new(&format!("/proc/{}/ns/net", child.pid())),
        "0::/init.scope\n",
    );
    proc_entry(
        fake.path(),
        7,
        Path::new(&format!("/proc/{}/ns/net", child.pid())),
        "0::/x\n",
    );
    assert!(ProcScan::new(fake.path())
        .unwrap()
        .find("uid", &[ip])
        .unwrap()
        .is_none());
    child.kill();
}

#[test]
fn discover_finds_an_ipv6_only_pod_by_its_ipv6_address() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let node = Node::dual_stack("r6", 206).unwrap();
    let pod = node.add_pod_ipv6_only("r6", "p").unwrap();
    let mut child = sleeper(&pod.ns, "redirect-discover6-sleep");
    let ip: IpAddr = pod.ip.parse().unwrap();
    assert!(ip.is_ipv6(), "{ip}");
    let found = ProcScan::new("/proc")
        .unwrap()
        .find("0b8d2c1e-unknown-uid", &[ip])
        .unwrap()
        .expect("pod netns found by its IPv6 address");
    assert_eq!(found.netns.inode(), handle(&pod.ns).inode());
    child.kill();
}

/// Writes `<root>/<pid>/ns/net` (a symlink to a real netns) and `<root>/<pid>/cgroup`.
fn proc_entry(root: &Path, pid: u32, netns: &Path, cgroup: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    std::os::unix::fs::symlink(netns, dir.join("ns/net")).unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
}

#[test]
fn discover_matches_pod_uid_in_cgroups_and_confirms_by_ip() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let node = Node::new("rs", 206).unwrap();
    let a = node.add_pod("rs", "a").unwrap();
    let b = node.add_pod("rs", "b").unwrap();
    let (uid_a, uid_b, uid_host) = (
        "11111111-2222-4333-8444-555555555555",
        "66666666-7777-4888-9999-000000000000",
        "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
    );
    let root = tempfile::tempdir().unwrap();
    proc_entry(
        root.path(),
        1,
        Path::new("/proc/self/ns/net"),
        "0::/init.scope\n",
    );
    proc_entry(
        root.path(),
        100,
        &a.ns.path(),
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11111111_2222_4333_8444_555555555555.slice/cri-containerd-1.scope\n",
    );
    proc_entry(
        root.path(),
        200,
        &b.ns.path(),
        "12:memory:/kubepods/besteffort/pod66666666-7777-4888-9999-000000000000/abc\n",
    );
    // A hostNetwork pod: named by its cgroup but in the host netns.
    proc_entry(
        root.path(),
        300,
        Path::new("/proc/self/ns/net"),
        "0::/kubepods/podaaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee/x\n",
    );

    let scan = ProcScan::new(root.path()).unwrap();
    let ip_a: IpAddr = a.ip.parse().unwrap();
    let ip_b: IpAddr = b.ip.parse().unwrap();
    let found = scan.find(uid_a, &[ip_a]).unwrap().expect("systemd layout");
    assert_eq!((found.pid, found.matched_by), (100, MatchedBy::Cgroup));
    assert_eq!(found.netns.inode(), handle(&a.ns).inode());
    assert_eq!(found.netns.path(), root.path().join("100/ns/net"));
    // The cgroup names pod b, but the netns does not carry the asked IP.
    assert!(scan.find(uid_b, &[ip_a]).unwrap().is_none());
    let found = scan.find(uid_b, &[ip_b]).unwrap().expect("cgroupfs layout");
    assert_eq!(found.pid, 200);
    assert!(
        scan.find(uid_host, &[ip_a]).unwrap().is_none(),
        "hostNetwork pod: no IP fallback"
    );
}

fn handle(ns: &Netns) -> NetnsHandle {
    NetnsHandle::open(ns.path()).unwrap()
}
