//! A ztunnel's `/config_dump` as `ztunnel-config` reads it: the answer of a remote
//! process, so anything. Any input is a dump or an error, never a panic; and a dump
//! written back (as `-o json` writes its sections) reads back and writes the same
//! (writing is Go's: an empty `omitempty` list reads back as absent, so the second
//! writing, not the first reading, is what must agree).
//!
//! The parser is istioctl-lite's own module (a binary crate), compiled in here as is.

#![no_main]

#[path = "../../istioctl-lite/src/configdump.rs"]
#[allow(dead_code)]
mod configdump;

use configdump::Dump;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(dump) = Dump::parse(text) else { return };
    let written = serde_json::to_string(&dump).expect("a dump serializes");
    let again = Dump::parse(&written).expect("a written dump reads back");
    assert_eq!(serde_json::to_string(&again).expect("serializes"), written);
});
