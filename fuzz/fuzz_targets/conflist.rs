//! The CNI config files the primary CNI writes to the node's conf dir, read by the
//! agent to chain `istio-cni` in. A file is accepted only as libcni would accept it;
//! the chain we write from it parses as a conflist holding our entry exactly once in
//! place of any earlier ones, writing it again changes nothing, and taking our entry out
//! leaves every other plugin as it was.
//!
//! Input: byte 0 picks the file kind (even: `.conflist`, odd: `.conf`), the rest is the
//! file.

#![no_main]

use std::path::{Path, PathBuf};

use cni_agent::install::conflist::{parse, render, ConfKind, PluginSettings};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some("istio-cni")
}

fuzz_target!(|input: &[u8]| {
    let [kind, data @ ..] = input else { return };
    let path = Path::new(if kind % 2 == 0 {
        "/etc/cni/net.d/10-x.conflist"
    } else {
        "/etc/cni/net.d/10-x.conf"
    });
    let Ok(file) = parse(path, data) else { return };
    let settings = PluginSettings {
        log_level: "info".into(),
        run_dir: PathBuf::from("/var/run/istio-cni"),
        exclude_namespaces: vec!["kube-system".into()],
        system_namespace: "istio-system".into(),
    };
    let entry = settings.entry();

    // The chain we would write, as the runtime reads it back.
    let list_path = file.list_path();
    let written = file.with_entry(&entry);
    let chained = parse(&list_path, &render(&written)).expect("the chain we write parses");
    assert_eq!(chained.kind, ConfKind::List);
    assert_eq!(chained.json, written);
    assert!(chained.has_entry());
    let plugins = written["plugins"].as_array().expect("a plugins list");
    assert_eq!(plugins.iter().filter(|p| ours(p)).count(), 1);
    assert!(plugins.contains(&entry));

    // Writing it again is a no-op.
    assert_eq!(chained.with_entry(&entry), written);

    // Without our entry: every other plugin, in order.
    let others = |list: &Value| -> Vec<Value> {
        list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| !ours(p))
            .cloned()
            .collect()
    };
    let without = chained
        .without_entry()
        .expect("our entry is there to remove");
    assert_eq!(others(&without), others(&written));
    assert!(!without["plugins"].as_array().unwrap().iter().any(ours));
    match file.kind {
        ConfKind::List => {
            assert_eq!(others(&without), others(&file.json));
            if !file.has_entry() {
                assert_eq!(without, file.json, "uninstall restores what was there");
            }
        }
        ConfKind::Conf => {
            if !ours(&file.json) {
                assert_eq!(others(&without), vec![file.json.clone()]);
            }
        }
    }
});
