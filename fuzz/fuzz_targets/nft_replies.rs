//! What the kernel answers on the nf_tables netlink socket, as the agent reads it to
//! verify a pod's tables: datagrams split into messages, errors, object attributes, and
//! the comparison of a dumped rule with the one we sent. No input panics or reads
//! past its end; a rule's own encoding always matches itself.
//!
//! Input: a datagram as `recv` returns it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use redirection::nft::istio_tables::inpod_tables;
use redirection::nft::ruleset::rule_exprs;
use redirection::nft::wire::{parse_attrs, parse_replies, Attr, Value};
use redirection::rules::InpodRules;

fuzz_target!(|data: &[u8]| {
    let tables = inpod_tables(&InpodRules {
        dns_capture: true,
        ipv6: true,
        ..Default::default()
    });
    let wanted: Vec<Attr> = tables
        .iter()
        .flat_map(|t| t.rules.iter().map(rule_exprs))
        .collect();
    for reply in parse_replies(data).unwrap_or_default() {
        let _ = reply.errno();
        for (_, payload) in reply.attrs().unwrap_or_default() {
            let _ = parse_attrs(payload);
            for rule in &wanted {
                let _ = rule.is_within(payload);
            }
        }
    }
    // Our own encoding, dumped back as is, is within itself.
    let rule = &wanted[data.first().copied().unwrap_or(0) as usize % wanted.len()];
    if let Value::Nested(ours) = &rule.value {
        let mut bytes = Vec::new();
        for a in ours {
            bytes.extend(encode(a));
        }
        assert!(rule.is_within(&bytes));
    }
});

/// One attribute as the kernel would put it on the wire.
fn encode(attr: &Attr) -> Vec<u8> {
    let msg = redirection::nft::wire::encode_message(0, 0, 0, 0, std::slice::from_ref(attr));
    // Skip nlmsghdr (16) and nfgenmsg (4).
    msg[20..].to_vec()
}
