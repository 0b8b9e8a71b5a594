//! The body of `POST /cmdadd` on `pluginevent.sock` (Istio's `CNIPluginAddEvent`, Go
//! encodings for `net.IPNet` and `net.IP`): decoded and checked as the agent's handler
//! does before anything acts on it. An accepted event names its pod and netns, its
//! addresses are well formed, and it encodes to JSON that decodes to the same event.

#![no_main]

use cni_agent::plugin_api::event::validate;
use libfuzzer_sys::fuzz_target;
use shared_types::cni::CniPluginAddEvent;

fuzz_target!(|data: &[u8]| {
    // As `uds::event::route`: decode, then validate.
    let Ok(event) = serde_json::from_slice::<CniPluginAddEvent>(data) else {
        return;
    };
    let valid = validate(&event);
    match &valid {
        Ok(()) => assert!(
            !event.pod_name.is_empty()
                && !event.pod_namespace.is_empty()
                && !event.netns.is_empty()
        ),
        Err(reason) => assert!(reason.starts_with("missing "), "{reason}"),
    }
    for ip in &event.ips {
        let max = if ip.address.ip.is_ipv4() { 32 } else { 128 };
        assert!(ip.address.prefix_len <= max, "{:?}", ip.address);
    }

    let json = serde_json::to_vec(&event).expect("an event encodes");
    let back: CniPluginAddEvent = serde_json::from_slice(&json).expect("its encoding decodes");
    assert_eq!(back, event);
    assert_eq!(validate(&back), valid);
});
