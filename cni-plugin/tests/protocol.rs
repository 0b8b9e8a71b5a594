//! The CNI protocol as a runtime sees it from the built binary: VERSION, result
//! pass-through and conversion, spec error JSON and codes, the quiet commands.

mod common;

use common::{run_plugin, run_with_env};
use serde_json::{json, Value};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn conf(version: &str, prev: Option<Value>) -> Value {
    let mut c = json!({"cniVersion": version, "name": "k8s-pod-network", "type": "istio-cni"});
    if let Some(prev) = prev {
        c["prevResult"] = prev;
    }
    c
}

/// A bridge-like result in the shape of `version`.
fn result(version: &str) -> Value {
    let legacy = version.starts_with("0.");
    let ip = |v: &str, address: &str, gw: &str| {
        let mut ip = json!({"interface": 2, "address": address, "gateway": gw});
        if legacy {
            ip["version"] = json!(v);
        }
        ip
    };
    json!({
        "cniVersion": version,
        "interfaces": [
            {"name": "cni0", "mac": "0a:58:0a:f4:00:01"},
            {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:ff"},
            {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/p"}
        ],
        "ips": [ip("4", "10.244.0.5/24", "10.244.0.1"), ip("6", "fd00:10:244::5/64", "fd00:10:244::1")],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
    })
}

#[test]
fn version_lists_supported_versions() {
    let run = run_with_env(&[("CNI_COMMAND", "VERSION")], b"{\"cniVersion\":\"1.0.0\"}");
    run.success();
    assert_eq!(
        run.json(),
        json!({"cniVersion": "1.1.0", "supportedVersions": VERSIONS})
    );
}

#[test]
fn add_prints_prev_result_converted_to_the_config_version() {
    for from in VERSIONS {
        for to in VERSIONS {
            let run = run_plugin("ADD", &conf(to, Some(result(from))), "");
            run.success();
            assert_eq!(run.json(), result(to), "{from} -> {to}");
        }
    }
}

#[test]
fn add_without_prev_result_prints_an_empty_result() {
    for v in VERSIONS {
        let run = run_plugin("ADD", &conf(v, None), "");
        run.success();
        assert_eq!(run.json(), json!({"cniVersion": v}));
    }
}

#[test]
fn check_del_status_gc_print_nothing() {
    let run = run_plugin("CHECK", &conf("1.0.0", Some(result("1.0.0"))), "");
    run.success();
    assert_eq!(run.stdout, "");
    for command in ["DEL", "STATUS", "GC"] {
        let run = run_plugin(command, &conf("1.1.0", Some(result("1.1.0"))), "");
        run.success();
        assert_eq!(run.stdout, "", "{command}");
    }
    // DEL without a netns, as the spec allows.
    let run = run_with_env(
        &[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ],
        conf("1.0.0", None).to_string().as_bytes(),
    );
    run.success();
    // STATUS and GC with only CNI_PATH.
    for command in ["STATUS", "GC"] {
        let run = run_with_env(
            &[("CNI_COMMAND", command), ("CNI_PATH", "/opt/cni/bin")],
            conf("1.1.0", None).to_string().as_bytes(),
        );
        run.success();
    }
}

#[test]
fn bad_netconf_gives_decode_and_config_errors() {
    for (stdin, code) in [
        ("", 6),
        ("{\"cniVersion\":", 6),
        ("[]", 6),
        (
            r#"{"cniVersion":"1.0.0","name":"n","ambient_enabled":"yes"}"#,
            6,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":{}}}"#,
            6,
        ),
        (r#"{"cniVersion":"1.0.0","type":"istio-cni"}"#, 7),
        (r#"{"cniVersion":"1.0.0","name":"no spaces"}"#, 7),
        (
            r#"{"cniVersion":"1.0.0","name":"n","agent_timeout_seconds":0}"#,
            7,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{"address":"10.0.0.1"}]}}"#,
            7,
        ),
    ] {
        let run = run_with_env(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "abc"),
                ("CNI_NETNS", "/var/run/netns/p"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/opt/cni/bin"),
            ],
            stdin.as_bytes(),
        );
        run.error(code);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

#[test]
fn unsupported_versions_are_code_1() {
    for v in ["0.1.0", "0.2.0", "2.0.0", ""] {
        let e = run_plugin("ADD", &conf(v, None), "").error(1);
        assert_eq!(e["msg"], "incompatible CNI versions");
        assert!(e["details"].as_str().unwrap().contains("1.1.0"), "{e}");
    }
    // CHECK exists from 0.4.0, STATUS and GC from 1.1.0.
    let e = run_plugin("CHECK", &conf("0.3.1", None), "").error(1);
    assert_eq!(e["cniVersion"], "0.3.1");
    run_plugin("STATUS", &conf("1.0.0", None), "").error(1);
    run_plugin("GC", &conf("0.4.0", None), "").error(1);
    // A prevResult of an unsupported version.
    let old = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}});
    run_plugin("ADD", &conf("1.0.0", Some(old)), "").error(1);
}

#[test]
fn bad_cni_args_are_code_4() {
    for args in [
        "K8S_POD_NAME=a;UNKNOWN=b",
        "IgnoreUnknown=1;K8S_POD_NAME",
        "IgnoreUnknown=1;A=b=c",
        "IgnoreUnknown=yes",
    ] {
        let e = run_plugin("ADD", &conf("1.0.0", None), args).error(4);
        assert!(e["msg"].as_str().unwrap().starts_with("ARGS:"), "{e}");
    }
    run_plugin("ADD", &conf("1.0.0", None), "IgnoreUnknown=1;UNKNOWN=b").success();
}

#[test]
fn missing_or_bad_environment_is_code_4() {
    let stdin = conf("1.0.0", None).to_string();
    let e = run_with_env(&[("CNI_COMMAND", "ADD")], stdin.as_bytes()).error(4);
    assert_eq!(
        e["msg"],
        "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing"
    );
    let base = [
        ("CNI_CONTAINERID", "abc"),
        ("CNI_NETNS", "/var/run/netns/p"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];
    let mut env = base.to_vec();
    env.push(("CNI_COMMAND", "FROB"));
    let e = run_with_env(&env, stdin.as_bytes()).error(4);
    assert_eq!(e["msg"], "unknown CNI_COMMAND: FROB");
    let mut env = base.to_vec();
    env.push(("CNI_COMMAND", "ADD"));
    env[2].1 = "not/an/ifname";
    run_with_env(&env, stdin.as_bytes()).error(4);
}

#[test]
fn without_a_command_it_describes_itself() {
    let run = run_with_env(&[], b"");
    run.success();
    assert_eq!(run.stdout, "");
    assert!(run
        .stderr
        .contains("CNI protocol versions supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"));
}

#[test]
fn never_panics_on_odd_input() {
    let inputs: [&[u8]; 8] = [
        b"\xff\xfe\x00garbage",
        b"null",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"prevResult\":[]}",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"prevResult\":{\"ips\":[{\"address\":\"10.0.0.1/24\",\"interface\":-1}]}}",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"prevResult\":{\"cniVersion\":7}}",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"exclude_namespaces\":\"kube-system\"}",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"agent_timeout_seconds\":-1}",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"prevResult\":{\"routes\":[{\"dst\":\"::/129\"}]}}",
    ];
    for stdin in inputs {
        for command in ["ADD", "CHECK", "DEL"] {
            let run = run_with_env(
                &[
                    ("CNI_COMMAND", command),
                    ("CNI_CONTAINERID", "abc"),
                    ("CNI_NETNS", "/var/run/netns/p"),
                    ("CNI_IFNAME", "eth0"),
                    ("CNI_PATH", "/opt/cni/bin"),
                    ("CNI_ARGS", "K8S_POD_NAME=\u{1F600};IgnoreUnknown=1"),
                ],
                stdin,
            );
            assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
            assert!(matches!(run.exit, Some(0) | Some(1)), "{run:?}");
            if run.exit == Some(1) {
                let e = run.json();
                assert!(e["code"].as_u64().is_some(), "{e}");
            }
        }
    }
}
