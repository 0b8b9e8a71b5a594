//! Native nftables mode against golden files and real namespaces.
//!
//! `testdata/nftables/*.nft` hold the transaction text (Istio's spelling; the DNS
//! variant is exactly the text of Istio's golden), `*.state.json` what the kernel
//! reads back (`nft -j list ruleset`, handles dropped). Each variant is applied twice,
//! over our netlink path and as `nft -f` text, in two namespaces: both must read back
//! the same, which proves the netlink encoding is the rule set the text says.
//! `UPDATE_GOLDEN=1` rewrites the files (review the diff). Root-only tests build their
//! own namespaces and skip with a message when not root.

use mesh_runtime::netns::NetnsHandle;
use redirection::iptables::Backend;
use redirection::nft::{self, istio_tables, ruleset, HostProbe};
use redirection::rules::{InpodRules, IpFamily};
use redirection::{check_inpod, disable_inpod, enable_inpod, restore_inpod, CheckResult, Mode};
use serde_json::Value;
use test_support::netns::Netns;

const NFTABLES: Mode = Mode::Nftables {
    xtables: Backend::Nft,
};

fn assert_golden(name: &str, actual: &str) {
    test_support::golden::assert_golden(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/nftables")
            .join(name),
        actual,
    );
}

/// Every in-pod variant with its golden name.
fn variants() -> Vec<(&'static str, InpodRules)> {
    let base = InpodRules::default();
    vec![
        ("inpod_v4", base.clone()),
        (
            "inpod_dns_v4",
            InpodRules {
                dns_capture: true,
                ..base.clone()
            },
        ),
        (
            "inpod_dns_dual_stack",
            InpodRules {
                dns_capture: true,
                ipv6: true,
                ..base.clone()
            },
        ),
        (
            "inpod_bypass_inbound_dual_stack",
            InpodRules {
                ipv6: true,
                inbound_capture: false,
                ..base
            },
        ),
    ]
}

fn host_variants() -> Vec<(&'static str, HostProbe)> {
    vec![
        (
            "host_v4",
            HostProbe {
                ipv6: false,
                kubelet_uid: 0,
            },
        ),
        (
            "host_dual_stack",
            HostProbe {
                ipv6: true,
                kubelet_uid: 1000,
            },
        ),
    ]
}

fn inside<R: Send, E: std::fmt::Debug + Send>(
    ns: &Netns,
    job: impl FnOnce() -> Result<R, E> + Send,
) -> R {
    NetnsHandle::open(ns.path())
        .unwrap()
        .run(job)
        .unwrap()
        .unwrap()
}

/// `nft -j list ruleset` in `ns` without what differs between equal rule sets
/// (handles, the tool's metainfo), pretty-printed.
fn state(ns: &Netns) -> String {
    let json: Value = serde_json::from_str(&ns.stdout(&["nft", "-j", "list", "ruleset"]).unwrap())
        .expect("nft -j prints JSON");
    let mut objects: Vec<Value> = json["nftables"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|o| o.get("metainfo").is_none())
        .collect();
    for o in &mut objects {
        if let Some(inner) = o.as_object_mut().and_then(|m| m.values_mut().next()) {
            if let Some(fields) = inner.as_object_mut() {
                fields.remove("handle");
            }
        }
    }
    serde_json::to_string_pretty(&objects).unwrap() + "\n"
}

/// Loads `text` with `nft -f` inside `ns`.
fn nft_file(ns: &Netns, text: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    ns.exec(&["nft", "-f", file.path().to_str().unwrap()])
        .unwrap();
}

fn nft(ns: &Netns, line: &str) {
    let argv: Vec<&str> = std::iter::once("nft")
        .chain(line.split_whitespace())
        .collect();
    ns.exec(&argv).unwrap();
}

#[test]
fn rendered_transactions_match_golden_files() {
    for (name, rules) in variants() {
        assert_golden(
            &format!("{name}.nft"),
            &ruleset::render(&istio_tables::inpod_tables(&rules)),
        );
    }
    for (name, host) in host_variants() {
        assert_golden(&format!("{name}.nft"), &ruleset::render(&[host.table()]));
    }
}

#[test]
fn dns_variant_is_istios_golden_transaction() {
    let text = ruleset::render(&istio_tables::inpod_tables(&InpodRules {
        dns_capture: true,
        ..Default::default()
    }));
    // Spot checks of Istio's own spelling (double spaces included); the whole text is
    // the golden file, taken from Istio's.
    for line in [
        "add chain inet istio-ambient-nat prerouting { type nat hook prerouting priority -100 ; }\n",
        "add rule inet istio-ambient-nat istio-prerouting ip daddr != 127.0.0.1/32 tcp dport != 15008 mark and 0xfff  != 0x539 counter redirect to :15006\n",
        "add rule inet istio-ambient-mangle istio-prerouting meta mark & 0xfff == 0x539 counter ct mark set ct mark & 0xfffff000 |  0x111\n",
        "add rule inet istio-ambient-raw istio-prerouting udp sport 53 meta mark and 0xfff != 0x539 counter ct zone set 1\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert_eq!(text.lines().count(), 36);
}

#[test]
fn netlink_and_nft_text_read_back_as_the_same_golden_state() {
    if !test_support::can_run_root_tests() {
        return;
    }
    for (name, rules) in variants() {
        let (ours, text) = (Netns::new("nfa").unwrap(), Netns::new("nfb").unwrap());
        assert!(
            inside(&ours, || nft::apply_inpod(&rules)),
            "{name}: first apply changes"
        );
        nft_file(&text, &ruleset::render(&istio_tables::inpod_tables(&rules)));
        let state = state(&ours);
        assert_eq!(state, self::state(&text), "{name}: netlink vs nft -f");
        assert_golden(&format!("{name}.state.json"), &state);
        assert_eq!(inside(&ours, || nft::check_inpod(&rules)), CheckResult::Ok);
        // The nft -f namespace checks clean too: our reading of Istio's text is exact.
        assert_eq!(
            inside(&text, || nft::check_inpod(&rules)),
            CheckResult::Ok,
            "{name}"
        );
        assert!(
            !inside(&ours, || nft::apply_inpod(&rules)),
            "{name}: second apply is a no-op"
        );
    }
    for (name, host) in host_variants() {
        let (ours, text) = (Netns::new("nfa").unwrap(), Netns::new("nfb").unwrap());
        inside(&ours, || host.install());
        nft_file(&text, &ruleset::render(&[host.table()]));
        let state = state(&ours);
        assert_eq!(state, self::state(&text), "{name}: netlink vs nft -f");
        assert_golden(&format!("{name}.state.json"), &state);
    }
}

#[test]
fn drift_is_detected_and_repaired() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let ns = Netns::new("nfd").unwrap();
    let rules = InpodRules {
        dns_capture: true,
        ipv6: true,
        ..Default::default()
    };
    inside(&ns, || nft::apply_inpod(&rules));
    let golden = state(&ns);
    let drifts = [
        // A rule of ours deleted: capture of outbound traffic would be gone.
        "flush chain inet istio-ambient-nat istio-output",
        // A changed port.
        "add rule inet istio-ambient-nat istio-prerouting tcp dport 1 redirect to :15007",
        // A base chain re-hooked at another priority.
        "delete chain inet istio-ambient-raw output",
        // A whole table gone.
        "delete table inet istio-ambient-mangle",
    ];
    for drift in drifts {
        nft(&ns, drift);
        let found = inside(&ns, || nft::check_inpod(&rules));
        assert!(!found.is_ok(), "{drift}: not detected");
        assert!(
            inside(&ns, || nft::apply_inpod(&rules)),
            "{drift}: not repaired"
        );
        assert_eq!(state(&ns), golden, "{drift}");
    }
    // Turning DNS capture off drops the raw table and the DNS rules.
    let no_dns = InpodRules {
        dns_capture: false,
        ..rules
    };
    assert!(matches!(
        inside(&ns, || nft::check_inpod(&no_dns)),
        CheckResult::Partial(_) | CheckResult::Foreign(_)
    ));
    inside(&ns, || nft::apply_inpod(&no_dns));
    let text = ns.stdout(&["nft", "list", "tables"]).unwrap();
    assert!(!text.contains("istio-ambient-raw"), "{text}");
    assert!(!text.contains("15053"));
}

#[test]
fn removal_leaves_nothing_of_ours_and_everything_else() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let ns = Netns::new("nfr").unwrap();
    nft(&ns, "add table inet other");
    nft(
        &ns,
        "add chain inet other output { type filter hook output priority 0 ; }",
    );
    let before = state(&ns);
    let rules = InpodRules {
        dns_capture: true,
        ipv6: true,
        ..Default::default()
    };
    inside(&ns, || enable_inpod(NFTABLES, &rules));
    assert!(inside(&ns, || check_inpod(NFTABLES, &rules)).is_ok());
    inside(&ns, || disable_inpod(NFTABLES, &rules));
    assert_eq!(state(&ns), before);
    assert!(!ns.stdout(&["ip", "rule"]).unwrap().contains("0x111"));
    // Removing again (nothing there) is fine.
    inside(&ns, || disable_inpod(NFTABLES, &rules));
    assert_eq!(
        inside(&ns, || nft::check_inpod(&rules)),
        CheckResult::Missing
    );
}

#[test]
fn a_pod_converts_in_place_between_iptables_and_nftables() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let ns = Netns::new("nfc").unwrap();
    let rules = InpodRules {
        dns_capture: true,
        ipv6: true,
        ..Default::default()
    };
    let iptables = Mode::Iptables(Backend::Nft);
    let saves = |ns: &Netns| -> String {
        ["iptables-nft-save", "ip6tables-nft-save"]
            .iter()
            .map(|b| ns.stdout(&[b]).unwrap())
            .collect()
    };
    inside(&ns, || enable_inpod(iptables, &rules));
    assert!(saves(&ns).contains("ISTIO_OUTPUT"));

    // Without repair too: a pod in the other mode is always converted.
    assert!(inside(&ns, || restore_inpod(NFTABLES, &rules, false)));
    assert!(inside(&ns, || check_inpod(NFTABLES, &rules)).is_ok());
    assert!(
        !saves(&ns).contains("ISTIO"),
        "iptables rules left:\n{}",
        saves(&ns)
    );
    assert!(
        !inside(&ns, || restore_inpod(NFTABLES, &rules, true)),
        "nothing left to do"
    );

    assert!(inside(&ns, || restore_inpod(iptables, &rules, false)));
    assert!(inside(&ns, || check_inpod(iptables, &rules)).is_ok());
    let tables = ns.stdout(&["nft", "list", "tables"]).unwrap();
    assert!(!tables.contains("istio-ambient"), "{tables}");
}

#[test]
fn host_probe_sets_keep_members_with_their_pod_uids() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let ns = Netns::new("nfh").unwrap();
    let host = HostProbe {
        ipv6: true,
        kubelet_uid: 0,
    };
    let (ip4, ip6) = (
        "10.244.1.7".parse().unwrap(),
        "fd00:10:1::7".parse().unwrap(),
    );
    inside(&ns, || host.install());
    inside(&ns, || host.add(ip4, "uid-a"));
    inside(&ns, || host.add(ip6, "uid-a"));
    // Installing again (an agent restart) keeps the members.
    inside(&ns, || host.install());
    assert_eq!(inside(&ns, || host.check()), CheckResult::Ok);
    let v4 = inside(&ns, || host.members(IpFamily::V4));
    assert_eq!((v4[0].ip, v4[0].uid.as_deref()), (ip4, Some("uid-a")));
    // Re-labelled for a new pod that got the IP.
    inside(&ns, || host.add(ip4, "uid-b"));
    let v4 = inside(&ns, || host.members(IpFamily::V4));
    assert_eq!(v4.len(), 1);
    assert_eq!(v4[0].uid.as_deref(), Some("uid-b"));
    let listed = ns
        .stdout(&[
            "nft",
            "list",
            "set",
            "inet",
            "istio-ambient-nat",
            "istio-inpod-probes-v4",
        ])
        .unwrap();
    assert!(listed.contains("10.244.1.7 comment \"uid-b\""), "{listed}");
    inside(&ns, || host.remove(ip4));
    inside(&ns, || host.remove(ip4));
    assert!(inside(&ns, || host.members(IpFamily::V4)).is_empty());
    assert_eq!(inside(&ns, || host.members(IpFamily::V6)).len(), 1);
    inside(&ns, || host.uninstall());
    assert_eq!(ns.stdout(&["nft", "list", "ruleset"]).unwrap().trim(), "");
    assert!(inside(&ns, || host.members(IpFamily::V4)).is_empty());
}

#[test]
fn a_refused_batch_names_the_message_and_changes_nothing() {
    if !test_support::can_run_root_tests() {
        return;
    }
    use redirection::nft::session::Session;
    use redirection::nft::wire::{Attr, Msg, MsgType, NLM_F_ACK, NLM_F_CREATE};
    let ns = Netns::new("nfe").unwrap();
    inside(&ns, || nft::apply_inpod(&InpodRules::default()));
    let before = state(&ns);
    // A valid table, then a rule for a chain that does not exist: all or nothing.
    let batch = [
        ruleset::table_msg(MsgType::NewTable, "zz-refused"),
        Msg::new(
            MsgType::NewRule,
            NLM_F_CREATE | NLM_F_ACK,
            vec![
                Attr::string(1, "zz-refused"),
                Attr::string(2, "no-such-chain"),
            ],
        ),
    ];
    let err = NetnsHandle::open(ns.path())
        .unwrap()
        .run(|| Session::open().and_then(|mut s| s.transact(&batch)))
        .unwrap()
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("NewRule"), "{text}");
    assert!(text.contains("No such file or directory"), "{text}");
    assert_eq!(state(&ns), before, "the refused batch left something");
}
