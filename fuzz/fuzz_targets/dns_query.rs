//! The DNS proxy's query path: whatever a pod sends to 15053 gets a well-formed
//! answer to the same id, within the client's UDP size, or no answer at all; never a
//! panic.

#![no_main]

use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};

use hickory_proto::op::{Message, MessageType};
use libfuzzer_sys::fuzz_target;
use ztunnel::dns::{DnsHandler, Forwarder, LocalZone, Protocol, Step};
use ztunnel::identity::Identity;
use ztunnel::proxy::LocalWorkload;
use ztunnel::socket::LocalSocketFactory;
use ztunnel::state::{NetworkAddress, ProxyState, Service, StateStore};

fn handler() -> &'static DnsHandler {
    static HANDLER: OnceLock<DnsHandler> = OnceLock::new();
    HANDLER.get_or_init(|| {
        let mut state = ProxyState::new();
        for (name, vips) in [("server", 1u8), ("wide", 60)] {
            state.insert_service(Service {
                name: name.into(),
                namespace: "demo".into(),
                hostname: format!("{name}.demo.svc.cluster.local"),
                vips: (1..=vips)
                    .map(|i| NetworkAddress {
                        network: String::new(),
                        address: Ipv4Addr::new(10, 96, 1, i).into(),
                    })
                    .collect(),
                ..Default::default()
            });
        }
        let store = StateStore::new();
        store.replace_source("fuzz", state);
        DnsHandler {
            state: store,
            zone: Arc::new(LocalZone {
                cluster_domain: "cluster.local".into(),
                ipv6_enabled: true,
            }),
            metrics: Arc::default(),
            forwarder: Forwarder {
                upstreams: Arc::new([]),
                sockets: Arc::new(LocalSocketFactory { mark: 0 }),
            },
            client: LocalWorkload {
                namespace: "demo".into(),
                name: "client".into(),
                identity: Identity::new("cluster.local", "demo", "client"),
            },
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let parsed = Message::from_vec(data).ok();
    for protocol in [Protocol::Udp, Protocol::Tcp] {
        match handler().step(data, protocol) {
            Step::Reply(answer) => {
                let answer = Message::from_vec(&answer).expect("every answer parses");
                assert_eq!(answer.message_type(), MessageType::Response);
                assert_eq!(answer.id().to_be_bytes(), data[..2], "the client's id");
                if protocol == Protocol::Udp {
                    let limit = parsed
                        .as_ref()
                        .and_then(|q| q.extensions().as_ref().map(|e| e.max_payload()))
                        .map_or(512, |p| usize::from(p).max(512));
                    let size = answer.to_vec().map(|b| b.len()).unwrap_or(0);
                    assert!(size <= limit, "{size} bytes over UDP, client takes {limit}");
                }
            }
            // Only a parsed query goes upstream.
            Step::Forward(_) => assert!(parsed.is_some()),
            // Silence only for what is no query: too short for a header, or a response.
            Step::Ignore => assert!(data.len() < 12 || data[2] & 0x80 != 0),
        }
    }
});
