//! Conntrack in the CURRENT thread's netns: when DNS capture is turned on for a pod
//! already in the mesh, its apps' existing DNS flows are forgotten.
//!
//! NAT applies only to a flow's first packet. A pod in the mesh tracks connections (its
//! TCP capture needs conntrack), so an app that keeps one UDP socket for its queries
//! would keep reaching its resolver directly through the flow's old entry, past the
//! new redirect to 15053. Istio's raw-table zones keep ztunnel's own upstream queries
//! (zone 1) apart from apps' flows, but not an app's old flow from its new one.
//!
//! Call it from a plain thread that has entered the pod's netns (a netns job).

use std::io;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

const DNS_PORT: u16 = 53;
/// `CTA_ZONE` (linux/netfilter/nfnetlink_conntrack.h): not typed by the crate.
const CTA_ZONE: u16 = 18;

/// This netns's count of tracked flows (`nf_conntrack_count` is per network namespace,
/// and /proc/sys/net shows the opener's).
const FLOW_COUNT: &str = "/proc/sys/net/netfilter/nf_conntrack_count";

/// Deletes the entries of UDP flows to port 53 in conntrack zone 0 (the apps'; ztunnel's
/// own upstream queries are in zone 1), IPv4 and IPv6. Returns how many it deleted.
pub fn forget_app_dns_flows() -> io::Result<usize> {
    // A dump walks every bucket of the host's whole conntrack table, under its locks
    // (~7 ms, and most of the agent's CPU when 100 running pods enroll at once). Most
    // pods' netns track nothing before they join the mesh: conntrack starts in a netns
    // with its first rule that needs it, ours, so no flow can predate it.
    if tracked_flows()? == 0 {
        return Ok(0);
    }
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut forgotten = 0;
    for family in [NetfilterProtoFamily::IPv4, NetfilterProtoFamily::IPv6] {
        let flows = request(
            &socket,
            family,
            NLM_F_REQUEST | NLM_F_DUMP,
            ConntrackMessage::Get(vec![]),
        )?;
        for tuple in flows.into_iter().filter_map(app_dns_flow) {
            let delete = ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]);
            match request(&socket, family, NLM_F_REQUEST | NLM_F_ACK, delete) {
                Ok(_) => forgotten += 1,
                // Expired between the dump and the delete: gone either way.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(forgotten)
}

/// How many flows this netns tracks; none without the conntrack module.
fn tracked_flows() -> io::Result<u64> {
    match std::fs::read_to_string(FLOW_COUNT) {
        Ok(count) => count
            .trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{FLOW_COUNT}: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// The original tuple of `entry` if it is an app's UDP flow to port 53.
fn app_dns_flow(entry: Vec<ConntrackAttribute>) -> Option<Vec<Tuple>> {
    let mut original = None;
    let mut zone = 0;
    for attribute in entry {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => original = Some(tuple),
            ConntrackAttribute::Other(nla) if nla.kind() == CTA_ZONE => {
                let mut value = [0u8; 2];
                if nla.value_len() == value.len() {
                    nla.emit_value(&mut value);
                    zone = u16::from_be_bytes(value);
                }
            }
            _ => {}
        }
    }
    let original = original?;
    let proto = original.iter().find_map(|t| match t {
        Tuple::Proto(proto) => Some(proto),
        _ => None,
    })?;
    let udp = proto.contains(&ProtoTuple::Protocol(Protocol::Udp));
    let to_dns = proto.contains(&ProtoTuple::DestinationPort(DNS_PORT));
    (zone == 0 && udp && to_dns).then_some(original)
}

/// Sends one conntrack request and collects the entries of its answer (a dump's
/// entries; none for an acknowledged delete). A NACK is the kernel's errno.
fn request(
    socket: &Socket,
    family: NetfilterProtoFamily,
    flags: u16,
    message: ConntrackMessage,
) -> io::Result<Vec<Vec<ConntrackAttribute>>> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            message,
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let mut entries = Vec::new();
    let mut received = Vec::with_capacity(64 * 1024);
    loop {
        received.clear();
        let size = socket.recv(&mut received, 0)?;
        let mut offset = 0;
        while offset < size {
            let answer = NetlinkMessage::<NetfilterMessage>::deserialize(&received[offset..size])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let length = answer.header.length as usize;
            match answer.payload {
                NetlinkPayload::Done(_) => return Ok(entries),
                NetlinkPayload::Error(error) => {
                    return match error.code {
                        None => Ok(entries), // the ACK
                        Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                    };
                }
                // A dump's entries come as NEW messages.
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner:
                        NetfilterMessageInner::Conntrack(
                            ConntrackMessage::New(entry) | ConntrackMessage::Get(entry),
                        ),
                    ..
                }) => entries.push(entry),
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::DefaultNla;
    use netlink_packet_netfilter::conntrack::IPTuple;

    fn entry(protocol: Protocol, port: u16, zone: Option<u16>) -> Vec<ConntrackAttribute> {
        let mut entry = vec![ConntrackAttribute::CtaTupleOrig(vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress("10.244.1.5".parse().unwrap()),
                IPTuple::DestinationAddress("10.96.0.10".parse().unwrap()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(protocol),
                ProtoTuple::SourcePort(40053),
                ProtoTuple::DestinationPort(port),
            ]),
        ])];
        if let Some(zone) = zone {
            entry.push(ConntrackAttribute::Other(DefaultNla::new(
                CTA_ZONE,
                zone.to_be_bytes().to_vec(),
            )));
        }
        entry
    }

    #[test]
    fn only_apps_udp_flows_to_port_53_are_forgotten() {
        assert!(app_dns_flow(entry(Protocol::Udp, 53, None)).is_some());
        assert!(app_dns_flow(entry(Protocol::Udp, 53, Some(0))).is_some());
        // ztunnel's own upstream queries (zone 1), TCP, other ports: kept.
        assert!(app_dns_flow(entry(Protocol::Udp, 53, Some(1))).is_none());
        assert!(app_dns_flow(entry(Protocol::Tcp, 53, None)).is_none());
        assert!(app_dns_flow(entry(Protocol::Udp, 5353, None)).is_none());
        assert!(app_dns_flow(vec![]).is_none());
    }
}
