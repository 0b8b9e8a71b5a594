//! The head of an HBONE request once TLS is done: method, authority (the target) and
//! headers, as the inbound side checks them before it dials anything. A request is
//! accepted only as a CONNECT to an `ip:port` on the address the connection reached and
//! not to one of ztunnel's own ports; anything else is refused with Istio's status.
//!
//! The head is parsed from HTTP/1.1-style bytes with httparse (method, request-target,
//! headers) and built into an `http::Request` the way h2 hands it to us. Input: byte 0
//! picks the address the connection reached (10.0.0.1, fd00::1 or 127.0.0.1) and how
//! the URI is built (the request-target as it is, or h2's `https://<Host><target>`).

#![no_main]

use std::net::SocketAddr;

use http::{Method, Request, StatusCode, Uri};
use libfuzzer_sys::fuzz_target;
use ztunnel::proxy::inbound::connect_target;
use ztunnel::proxy::OwnPorts;

fn request(head: &httparse::Request<'_, '_>, h2_style: bool) -> Option<Request<()>> {
    let target = head.path?;
    let uri = if h2_style {
        let host = head
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("host"))?;
        Uri::builder()
            .scheme("https")
            .authority(host.value)
            .path_and_query(target)
            .build()
            .ok()?
    } else {
        target.parse::<Uri>().ok()?
    };
    let mut builder = Request::builder().method(head.method?).uri(uri);
    for h in head.headers.iter() {
        builder = builder.header(h.name, h.value);
    }
    builder.body(()).ok()
}

fuzz_target!(|input: &[u8]| {
    let [choice, bytes @ ..] = input else { return };
    let local: SocketAddr = match choice % 3 {
        0 => "10.0.0.1:15008",
        1 => "[fd00::1]:15008",
        _ => "127.0.0.1:15008",
    }
    .parse()
    .unwrap();
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Request::new(&mut headers);
    if head.parse(bytes).is_err() {
        return;
    }
    let Some(request) = request(&head, choice & 0x80 != 0) else {
        return;
    };
    let own_ports = OwnPorts::new([16008]);

    match connect_target(&request, local, &own_ports) {
        Ok(target) => {
            assert_eq!(request.method(), Method::CONNECT);
            assert_eq!(
                target.ip(),
                local.ip(),
                "a target the connection did not reach"
            );
            assert!(
                !own_ports.contains(target.port()),
                "a CONNECT to ztunnel's port {target}"
            );
            // The target is exactly what the authority says.
            let authority = request.uri().authority().expect("an authority").as_str();
            let said: SocketAddr = authority.parse().expect("the authority is ip:port");
            assert_eq!(
                (said.ip().to_canonical(), said.port()),
                (target.ip(), target.port())
            );
        }
        Err((status, reason)) => {
            let expected = match reason {
                "not_connect" => StatusCode::METHOD_NOT_ALLOWED,
                "bad_authority" | "authority_mismatch" => StatusCode::BAD_REQUEST,
                "self_call_hbone" => StatusCode::SERVICE_UNAVAILABLE,
                other => panic!("unknown refusal {other}"),
            };
            assert_eq!(status, expected, "{reason}");
            assert_eq!(reason == "not_connect", request.method() != Method::CONNECT);
        }
    }
});
