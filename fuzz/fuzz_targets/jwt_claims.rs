//! The claims peek of a refused bearer token (`authorization: Bearer <JWT>` of a
//! `CreateCertificate` call): the payload is read, never trusted, to say why the API
//! server refused. Any token gives claims or none, never a panic; the claims read are
//! exactly the payload's `exp`, `aud` (one string or a list) and `kubernetes.io` pod.

#![no_main]

use base64::Engine;
use istiod_lite::ca::authn::Claims;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // gRPC metadata values are visible ASCII; the peek takes any &str.
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let Some(claims) = Claims::peek(token) else {
        return;
    };

    let payload = token
        .split('.')
        .nth(1)
        .expect("a token with claims has a payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .expect("the payload is base64url");
    // serde skips a field the peek does not read (`sub`, say) without checking its
    // UTF-8, so claims can come from a payload that is not JSON as a whole; the
    // oracle below needs the whole payload, so such tokens stop here.
    let Ok(json) = serde_json::from_slice::<Value>(&bytes) else {
        return;
    };
    let Value::Object(json) = json else {
        panic!("claims from a payload that is no object: {json}")
    };
    assert_eq!(claims.exp, json.get("exp").and_then(Value::as_u64));
    let aud: Vec<String> = match json.get("aud") {
        None => vec![],
        Some(Value::String(one)) => vec![one.clone()],
        Some(Value::Array(many)) => many
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect(),
        Some(other) => panic!("aud {other} accepted"),
    };
    assert_eq!(claims.aud, aud);
    let k8s = json.get("kubernetes.io").filter(|k| !k.is_null());
    assert_eq!(claims.kubernetes.is_some(), k8s.is_some());
    if let (Some(ours), Some(k8s)) = (&claims.kubernetes, k8s) {
        assert_eq!(
            ours.namespace,
            k8s.get("namespace").and_then(Value::as_str).unwrap_or("")
        );
        let pod = k8s.get("pod").filter(|p| !p.is_null());
        assert_eq!(ours.pod.is_some(), pod.is_some());
        if let (Some(ours), Some(pod)) = (&ours.pod, pod) {
            assert_eq!(Some(ours.name.as_str()), pod["name"].as_str());
            assert_eq!(Some(ours.uid.as_str()), pod["uid"].as_str());
        }
    }
});
