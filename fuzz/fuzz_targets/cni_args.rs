//! `CNI_ARGS` (`K=V;K2=V2`, libcni's `LoadArgs`): accepted only when every pair is
//! exactly `key=value` and unknown keys are allowed by `IgnoreUnknown`; the pod identity
//! read is the last value of each key; refusals are code 4.

#![no_main]

use cni_plugin::args::{self, K8sArgs};
use cni_plugin::error::Code;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The plugin reads the variable with `to_string_lossy`.
    let text = String::from_utf8_lossy(data);
    let parsed = args::parse(&text);
    let a = match parsed {
        Ok(a) => a,
        Err(e) => {
            assert_eq!(e.code, Code::InvalidEnvironment, "{e:?}");
            return;
        }
    };
    if text.is_empty() {
        assert_eq!(a, K8sArgs::default());
        return;
    }

    // A model of libcni's rules, pair by pair.
    let mut expected = K8sArgs::default();
    let mut unknown = false;
    for pair in text.split(';') {
        let (key, value) = pair.split_once('=').expect("accepted pairs have a '='");
        assert!(!value.contains('='), "accepted {pair:?}");
        match key {
            "IgnoreUnknown" => {
                expected.ignore_unknown =
                    matches!(value.to_ascii_lowercase().as_str(), "1" | "true")
            }
            "K8S_POD_NAME" => expected.pod_name = value.into(),
            "K8S_POD_NAMESPACE" => expected.pod_namespace = value.into(),
            "K8S_POD_UID" => expected.pod_uid = value.into(),
            "K8S_POD_INFRA_CONTAINER_ID" => expected.pod_infra_container_id = value.into(),
            _ => unknown = true,
        }
    }
    assert_eq!(a, expected);
    assert!(
        !unknown || a.ignore_unknown,
        "unknown keys accepted without IgnoreUnknown"
    );
    match a.pod() {
        Some(pod) => assert_eq!(pod, format!("{}/{}", a.pod_namespace, a.pod_name)),
        None => assert!(a.pod_name.is_empty() || a.pod_namespace.is_empty()),
    }

    // What we read, written back in canonical form, reads the same.
    let canonical = format!(
        "IgnoreUnknown={};K8S_POD_NAME={};K8S_POD_NAMESPACE={};K8S_POD_UID={};K8S_POD_INFRA_CONTAINER_ID={}",
        a.ignore_unknown, a.pod_name, a.pod_namespace, a.pod_uid, a.pod_infra_container_id
    );
    assert_eq!(args::parse(&canonical).as_ref(), Ok(&a));
});
