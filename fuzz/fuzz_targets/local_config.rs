//! Istio's local-config YAML (`LOCAL_XDS_PATH`: workloads, services, policies), as a
//! reload reads it. Any file is a state or an error, never a panic; a loaded state has
//! what validation demands (namespaced workloads with a uid, services with a namespace
//! and hostname, named policies); and its `/config_dump` (JSON, which YAML reads too)
//! loads back as the same state.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel::discovery::parse_local_config;

fuzz_target!(|data: &[u8]| {
    // A reload reads the file as UTF-8 first.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(state) = parse_local_config(text) else {
        return;
    };
    for w in state.workloads() {
        assert!(!w.namespace.is_empty() && !w.uid.is_empty(), "{w:?}");
    }
    for s in state.services() {
        assert!(!s.namespace.is_empty() && !s.hostname.is_empty(), "{s:?}");
    }
    for p in state.policies() {
        assert!(!p.name.is_empty(), "{p:?}");
    }
    // Every waypoint named resolves (to its instances, or to none).
    let named = state
        .workloads()
        .filter_map(|w| w.waypoint.clone())
        .chain(state.services().filter_map(|s| s.waypoint.clone()));
    for waypoint in named {
        let _ = state.gateway_workloads(&waypoint);
    }

    let dump = state.dump();
    let again = parse_local_config(&dump.to_string()).expect("a config dump loads");
    assert_eq!(again.dump(), dump);
});
