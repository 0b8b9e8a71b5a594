//! `/logging`, as Istio's ztunnel answers it: POST lists the filter, or with
//! `?level=` (and `&reset`) changes it live; bad input gets 400 with the usage and
//! changes nothing; other methods get 405.

use http::{Method, StatusCode};
use mesh_runtime::http_server::{text, Request, Response};
use mesh_runtime::logging::{valid_level_request, LogHandle};

/// Istio's usage text, appended to every refusal.
pub const HELP: &str = "\nusage: POST /logging\t\t\t\t\t\t(To list current level)\nusage: POST /logging?level=<level>\t\t\t\t(To change global levels)\nusage: POST /logging?level={mod1}:{level1},{mod2}:{level2}\t(To change specific mods' logging level)\n\nhint: loglevel:\terror|warn|info|debug|trace|off\nhint: mod_name:\tthe module name, i.e. ztunnel::proxy\n";

/// Answers `/logging`; `handle` is `None` when this process's logging cannot be
/// changed (a test without a subscriber).
pub fn handle(request: &Request, handle: Option<&LogHandle>) -> Response {
    if request.method != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("Invalid HTTP method\n {HELP}"),
        );
    }
    let (mut level, mut reset) = (None, false);
    for (key, value) in form_urlencoded::parse(request.query.as_deref().unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "level" => level = Some(value.into_owned()),
            "reset" => reset = true,
            _ => {}
        }
    }
    let level = level.unwrap_or_default();
    if level.is_empty() && !reset {
        return list(handle);
    }
    if !level.is_empty() && !valid_level_request(&level) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("Invalid level provided: {level}\n{HELP}"),
        );
    }
    let changed = match handle {
        Some(h) => h.set(&level, reset).map_err(|e| e.to_string()),
        None => Err("logging is not initialized".to_owned()),
    };
    match changed {
        Ok(filter) => {
            tracing::info!("new log filter is {filter}");
            list(handle)
        }
        Err(e) => text(
            StatusCode::BAD_REQUEST,
            format!("Failed to set new level: {e}\n{HELP}"),
        ),
    }
}

fn list(handle: Option<&LogHandle>) -> Response {
    let current = match handle {
        Some(h) => h.current().map_err(|e| e.to_string()),
        None => Err("logging is not initialized".to_owned()),
    };
    match current {
        Ok(filter) => text(StatusCode::OK, format!("current log level is {filter}\n")),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to get the log level: {e}\n {HELP}"),
        ),
    }
}
