//! A ztunnel's `/config_dump` as `ztunnel-config` reads it: the answer of a remote
//! process, so anything. Any input is a dump or an error, never a panic; and a dump
//! written back (as `-o json` writes its sections) reads back and writes the same
//! (writing is Go's: an empty `omitempty` list reads back as absent, so the second
//! writing, not the first reading, is what must agree).
//!
//! A waypoint's routes (`waypointRoutes`) then go through `ztunnel-config route`'s
//! view: every route is at least one row of eight single-line cells (a rule, or
//! `INVALID` with the error), never a panic.
//!
//! The parser and the view are istioctl-lite's own modules (a binary crate),
//! compiled in here as they are.

#![no_main]

#[path = "../../istioctl-lite/src/configdump.rs"]
#[allow(dead_code)]
mod configdump;

#[path = "../../istioctl-lite/src/zroutes.rs"]
#[allow(dead_code)]
mod zroutes;

use configdump::Dump;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(dump) = Dump::parse(text) else { return };
    let rows = zroutes::rows(&dump.waypoint_routes);
    assert!(rows.len() >= dump.waypoint_routes.len());
    for row in &rows {
        assert_eq!(row.len(), zroutes::HEADER.len());
        assert!(row.iter().all(|cell| !cell.contains('\n')), "{row:?}");
    }
    let written = serde_json::to_string(&dump).expect("a dump serializes");
    let again = Dump::parse(&written).expect("a written dump reads back");
    assert_eq!(serde_json::to_string(&again).expect("serializes"), written);
});
