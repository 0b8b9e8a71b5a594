//! The waypoint's routes: a YAML stream of objects (as `WAYPOINT_CONFIG_PATH` and, as
//! JSON specs, istiod-lite's route resources carry them) decoded and compiled, then
//! requests routed through the table and every filter applied. Any input either
//! loads or is refused with an error; routing never panics, and a rule picked for a
//! request is one of the Service's.

#![no_main]

use http::{HeaderMap, Request};
use libfuzzer_sys::fuzz_target;
use mesh_model::route::{Filter, RequestView, Route, RouteTable};
use waypoint::objects::parse_objects;
use waypoint::routing;

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(objects) = parse_objects(yaml) else {
        return;
    };
    let routes: Vec<Route> = objects
        .routes
        .iter()
        .map(|r| {
            Route::from_spec(&r.kind, &r.namespace, &r.name, &r.spec_json)
                .expect("a route the file loaded compiles again")
        })
        .collect();
    let table = RouteTable::new(routes);
    let mut headers = HeaderMap::new();
    headers.insert("x-version", "v2".parse().unwrap());
    headers.insert("host", "echo.default:8080".parse().unwrap());
    for route in table.routes() {
        for parent in &route.parents {
            let service = (parent.namespace.as_str(), parent.name.as_str());
            for (method, uri) in [
                ("GET", "/"),
                ("POST", "/v1/items/7?canary=1&x"),
                ("GET", "/a%2F/b"),
            ] {
                let request: Request<()> =
                    Request::builder().method(method).uri(uri).body(()).unwrap();
                let (mut parts, ()) = request.into_parts();
                parts.headers = headers.clone();
                let view = RequestView {
                    method,
                    path: parts.uri.path(),
                    query: parts.uri.query(),
                    headers: &parts.headers,
                };
                let port = parent.port.unwrap_or(8080);
                let Some(selected) = table.http(service, port, &view) else {
                    continue;
                };
                assert!(selected.route.parents.iter().any(|p| p.name == parent.name));
                let matched = selected.matched;
                let mut response = HeaderMap::new();
                for filter in &selected.rule.filters {
                    match filter {
                        Filter::RequestHeaders(m) => routing::modify_headers(m, &mut parts.headers),
                        Filter::ResponseHeaders(m) => routing::modify_headers(m, &mut response),
                        Filter::Rewrite(r) => routing::rewrite(r, &mut parts, matched),
                        Filter::Redirect(r) => {
                            routing::redirect_location(
                                r,
                                &parts.uri,
                                &parts.headers,
                                matched,
                                port,
                            );
                        }
                        Filter::Mirror(m) => {
                            routing::sampled(m.fraction);
                        }
                    }
                }
                routing::pick_backend(&selected.rule.backends);
            }
            table.tcp(service, parent.port.unwrap_or(80));
        }
    }
});
