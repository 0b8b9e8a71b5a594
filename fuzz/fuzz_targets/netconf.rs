//! The netconf on stdin, with its `prevResult`, and the conversion of that result
//! between spec versions: whatever the runtime pipes in decodes or is refused with the
//! spec's code, the `cniVersion` echoed in an error is the netconf's when it parses, and
//! a `prevResult` printed in another version reads back as the same result and converts
//! back without loss, except for what the target shape cannot carry (the CNI spec:
//! `ips[].version` exists only before 1.0.0, interface `mtu`/`socketPath`/`pciID` only
//! from 1.1.0).

#![no_main]

use std::net::IpAddr;

use cni_plugin::error::{CniError, Code};
use cni_plugin::netconf::{self, NetConf, MAX_AGENT_TIMEOUT_SECONDS};
use cni_plugin::result::CniResult;
use cni_plugin::version::SpecVersion;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// `"4"` or `"6"` as libcni derives it from an address (IPv4-mapped IPv6 counts as 4).
fn family(cidr: &str) -> &'static str {
    match cidr.split('/').next().unwrap_or("").parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none() => "6",
        _ => "4",
    }
}

/// A refused netconf or result carries one of the spec's codes for bad configuration.
fn assert_config_refusal(e: &CniError) {
    assert!(
        matches!(
            e.code,
            Code::DecodingFailure | Code::InvalidNetworkConfig | Code::IncompatibleVersion
        ),
        "{e:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let echoed = netconf::error_version(data);
    assert!(SpecVersion::parse(&echoed).is_some(), "echoed {echoed:?}");
    let conf = match NetConf::parse(data) {
        Ok(conf) => conf,
        Err(e) => return assert_config_refusal(&e),
    };
    assert_eq!(echoed, conf.cni_version.as_str());
    assert!(!conf.name.is_empty());
    assert!((1..=MAX_AGENT_TIMEOUT_SECONDS).contains(&conf.agent_timeout.as_secs()));
    assert!(!conf.system_namespace.is_empty());

    let Some(raw) = &conf.prev_result else { return };
    let parsed = match CniResult::parse(raw, conf.cni_version) {
        Ok(parsed) => parsed,
        Err(e) => return assert_config_refusal(&e),
    };
    let source = SpecVersion::parse(&parsed.cni_version).expect("a supported source version");
    // What ADD prints when the netconf is in the result's own version.
    let same = parsed.clone().convert(source);
    for target in SpecVersion::SUPPORTED {
        let out = parsed.clone().convert(target);
        assert_eq!(out.cni_version, target.as_str());
        for ip in out.ips.iter().flatten() {
            assert_eq!(
                ip.version.is_some(),
                target.is_legacy(),
                "{ip:?} in {target}"
            );
        }
        if target.is_legacy() {
            for intf in out.interfaces.iter().flatten() {
                assert!(intf.mtu.is_none() && intf.socket_path.is_none() && intf.pci_id.is_none());
            }
        }

        // What the next plugin in the chain reads: the printed JSON, as a prevResult.
        let printed: Value = serde_json::from_str(&out.to_json()).expect("printed JSON parses");
        let reread = CniResult::parse(&printed, target).expect("a printed result parses back");
        assert_eq!(reread, out, "printed in {target}");

        // And back to the version it came in: equal, but for what `target` cannot carry.
        let mut expected = same.clone();
        if source.is_legacy() && !target.is_legacy() {
            for ip in expected.ips.iter_mut().flatten() {
                ip.version = Some(family(&ip.address).to_string());
            }
        }
        if target.is_legacy() {
            for intf in expected.interfaces.iter_mut().flatten() {
                (intf.mtu, intf.socket_path, intf.pci_id) = (None, None, None);
            }
        }
        assert_eq!(
            out.convert(source),
            expected,
            "{source} -> {target} -> {source}"
        );
    }
});
