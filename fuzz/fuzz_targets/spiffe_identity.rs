//! SPIFFE ids read from peers: the `ImpersonatedIdentity` a node proxy asks the CA for,
//! the URI SAN of a peer's certificate. Parsing is strict, so an accepted id is already
//! in canonical form: it prints back exactly as it was read, and its parts hold no
//! separator that could make it name another identity.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shared_types::identity::Identity;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(id) = text.parse::<Identity>() else {
        return;
    };
    assert_eq!(id.to_uri(), text);
    assert_eq!(id.to_string(), text);
    assert_eq!(format!("spiffe://{}", id.principal()), text);
    for part in [&id.trust_domain, &id.namespace, &id.service_account] {
        assert!(!part.is_empty() && !part.contains('/') && part != "." && part != "..");
    }
    assert!(!id.trust_domain.contains(':') && !id.trust_domain.contains('@'));
    let again: Identity = id.to_uri().parse().expect("a printed id parses");
    assert_eq!(again, id);
});
