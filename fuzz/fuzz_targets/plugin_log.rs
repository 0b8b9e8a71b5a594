//! The body of `POST /log` on `log.sock`: a JSON array of strings, each a JSON-encoded
//! `PluginLogEntry`. Anything else is refused; every string of an accepted batch becomes
//! one line, decoded when it is an entry, kept as text when it is not.

#![no_main]

use cni_agent::plugin_api::log::{emit, map_level, parse_batch};
use libfuzzer_sys::fuzz_target;
use shared_types::cni::PluginLogEntry;

fuzz_target!(|data: &[u8]| {
    let Ok(lines) = parse_batch(data) else {
        assert!(serde_json::from_slice::<Vec<String>>(data).is_err());
        return;
    };
    let raw: Vec<String> = serde_json::from_slice(data).expect("an accepted batch");
    assert_eq!(lines.len(), raw.len());
    for (line, text) in lines.iter().zip(&raw) {
        match serde_json::from_str::<PluginLogEntry>(text) {
            Ok(entry) => {
                assert_eq!(line.level, map_level(&entry.level));
                assert_eq!(line.time.as_deref(), Some(entry.time.as_str()));
                assert_eq!(line.msg, entry.msg);
                assert_eq!(line.extra.is_some(), !entry.fields.is_empty());
                if let Some(extra) = &line.extra {
                    let fields: serde_json::Value =
                        serde_json::from_str(extra).expect("extra is JSON");
                    assert_eq!(fields, serde_json::Value::Object(entry.fields));
                }
            }
            Err(_) => {
                assert_eq!(line.msg, text.trim_end());
                assert_eq!((line.time.as_ref(), line.extra.as_ref()), (None, None));
            }
        }
        emit(line);
    }
});
