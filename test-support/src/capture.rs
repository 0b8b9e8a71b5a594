//! Packet capture on a test network, from Rust: an `AF_PACKET` socket opened inside a
//! namespace (on a dedicated thread, see [`Netns::run_inside`]), reading every frame
//! that enters a bridge through the given ports. Each frame between two nodes of the
//! local cluster enters the cluster bridge exactly once (on the sending node's port), so
//! capturing the ports' receive side sees every packet on the wire once.
//!
//! Only TCP over IPv4 or IPv6 is kept (parsed into [`Packet`]); other frames are
//! counted. Kernel
//! timestamps (`SO_TIMESTAMPNS`, wall clock) date each packet, so a test can compare
//! them with [`SystemTime::now`] taken between its steps even when the reader lags.
//! Drops are read from `PACKET_STATISTICS`: a test that needs "every packet" fails when
//! the kernel dropped any.

use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};

use crate::netns::Netns;

/// TCP flag: the sender has no more data.
pub const FIN: u8 = 0x01;
/// TCP flag: synchronise sequence numbers (opens a connection).
pub const SYN: u8 = 0x02;
/// TCP flag: reset the connection.
pub const RST: u8 = 0x04;
/// TCP flag: the acknowledgment number is valid.
pub const ACK: u8 = 0x10;

/// Stop reading once this many payload bytes are held (a runaway test).
const MAX_PAYLOAD_BYTES: usize = 1 << 30;
const SOL_PACKET: libc::c_int = 263;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_OUTGOING: u8 = 4;

/// One captured TCP segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// When the kernel received it.
    pub time: SystemTime,
    /// The bridge port it entered through.
    pub ifindex: i32,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// TCP sequence number.
    pub seq: u32,
    /// TCP flags ([`FIN`], [`SYN`], [`RST`], [`ACK`], ...).
    pub flags: u8,
    /// TCP payload (empty for a bare control segment).
    pub payload: Vec<u8>,
}

impl Packet {
    /// Whether this is a connection's opening SYN (SYN set, ACK not).
    pub fn is_syn(&self) -> bool {
        self.flags & SYN != 0 && self.flags & ACK == 0
    }
}

/// What a finished capture holds.
#[derive(Debug, Default)]
pub struct Captured {
    /// The TCP segments, in the order they were read.
    pub packets: Vec<Packet>,
    /// Frames read from the ports (any protocol).
    pub frames: u64,
    /// Frames the kernel dropped (socket buffer full): the capture is incomplete if > 0.
    pub dropped: u64,
    /// Frames longer than the read buffer.
    pub truncated: u64,
}

/// A running capture; [`Capture::stop`] returns what it saw.
pub struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Captured>>>,
}

impl Capture {
    /// Starts capturing, in `ns`, every frame received on the interfaces `ports`.
    pub fn start(ns: &Netns, ports: &[&str]) -> Result<Capture> {
        let names: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
        let (fd, ifindexes) = ns.run_inside(move || open_socket(&names))??;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || read_loop(fd, &ifindexes, &s))?;
        Ok(Capture {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops reading (after draining what the socket holds) and returns the packets.
    pub fn stop(mut self) -> Result<Captured> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => bail!("the capture thread panicked"),
            None => bail!("capture already stopped"),
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn check(rc: libc::c_int, what: &str) -> Result<libc::c_int> {
    if rc < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(rc)
}

fn set_int(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
    what: &str,
) -> Result<()> {
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(rc, what).map(drop)
}

/// Runs inside the namespace: the socket and the ports' interface indexes.
fn open_socket(ports: &[String]) -> Result<(OwnedFd, Vec<i32>)> {
    let mut ifindexes = Vec::new();
    for p in ports {
        let name = std::ffi::CString::new(p.as_str())?;
        // SAFETY: a NUL-terminated interface name.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            bail!("no interface {p}: {}", std::io::Error::last_os_error());
        }
        ifindexes.push(index as i32);
    }
    let protocol = (libc::ETH_P_ALL as u16).to_be() as libc::c_int;
    // SAFETY: socket(2) with constant arguments; the fd is owned right away.
    let raw = check(
        unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        },
        "socket(AF_PACKET)",
    )?;
    // SAFETY: `raw` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    set_int(
        &fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        256 << 20,
        "SO_RCVBUFFORCE",
    )?;
    set_int(
        &fd,
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMPNS,
        1,
        "SO_TIMESTAMPNS",
    )?;
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: setsockopt with a pointer to a live timeval and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    check(rc, "SO_RCVTIMEO")?;
    Ok((fd, ifindexes))
}

/// Kernel drop counter since the last call (reading resets it).
fn drops(fd: &OwnedFd) -> Result<u64> {
    #[repr(C)]
    #[derive(Default)]
    struct Stats {
        packets: u32,
        drops: u32,
    }
    let mut stats = Stats::default();
    let mut len = std::mem::size_of::<Stats>() as libc::socklen_t;
    // SAFETY: getsockopt into a live struct of the size we pass.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            SOL_PACKET,
            PACKET_STATISTICS,
            (&mut stats as *mut Stats).cast(),
            &mut len,
        )
    };
    check(rc, "PACKET_STATISTICS")?;
    Ok(u64::from(stats.drops))
}

fn read_loop(fd: OwnedFd, ifindexes: &[i32], stop: &AtomicBool) -> Result<Captured> {
    let mut out = Captured::default();
    let mut held = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    let mut control = [0u8; 256];
    // Reset the counter: what was dropped before we read is not ours.
    drops(&fd)?;
    // Once stopped, what was queued before the stop is still read; the first packet
    // stamped after it ends the capture (on a busy link the queue never runs dry).
    let mut stopped_at: Option<SystemTime> = None;
    loop {
        if stopped_at.is_none() && stop.load(Ordering::SeqCst) {
            stopped_at = Some(SystemTime::now());
        }
        // SAFETY: zeroed sockaddr_ll / msghdr are valid initial values.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut addr as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len();
        // SAFETY: every pointer in `msg` refers to a live buffer of the stated size.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_TRUNC) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    continue;
                }
                _ => return Err(e).context("recvmsg on the capture socket"),
            }
        }
        if !ifindexes.contains(&addr.sll_ifindex) || addr.sll_pkttype == PACKET_OUTGOING {
            continue;
        }
        out.frames += 1;
        let n = n as usize;
        if n > buf.len() || msg.msg_flags & libc::MSG_TRUNC != 0 {
            out.truncated += 1;
        }
        let time = timestamp(&msg).unwrap_or_else(SystemTime::now);
        if stopped_at.is_some_and(|at| time > at) {
            break;
        }
        if let Some(p) = parse_frame(&buf[..n.min(buf.len())], time, addr.sll_ifindex) {
            held += p.payload.len();
            out.packets.push(p);
            if held > MAX_PAYLOAD_BYTES {
                bail!("capture holds more than {MAX_PAYLOAD_BYTES} payload bytes");
            }
        }
    }
    out.dropped = drops(&fd)?;
    Ok(out)
}

/// The `SCM_TIMESTAMPNS` of a received message.
fn timestamp(msg: &libc::msghdr) -> Option<SystemTime> {
    // SAFETY: walking the control buffer recvmsg filled, with the libc macros.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                return Some(
                    SystemTime::UNIX_EPOCH + Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
                );
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

/// Parses an Ethernet frame; `None` unless it is TCP over IPv4 or IPv6 (an IPv6
/// packet whose first next header is TCP: these tests send no extension headers).
pub fn parse_frame(frame: &[u8], time: SystemTime, ifindex: i32) -> Option<Packet> {
    let mut ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let mut off = 14;
    if ethertype == 0x8100 {
        ethertype = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        off = 18;
    }
    let ip = frame.get(off..)?;
    // The IP length trims Ethernet padding; 0 (a GSO super-frame) means "the rest".
    let trim = |len: usize, header: usize| match len {
        0 => ip.len(),
        n => (n + header).min(ip.len()),
    };
    let (src, dst, tcp) = match ethertype {
        0x0800 => {
            if ip.first()? >> 4 != 4 || *ip.get(9)? != 6 {
                return None;
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let total = trim(usize::from(u16::from_be_bytes([ip[2], ip[3]])), 0);
            let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            (IpAddr::from(src), IpAddr::from(dst), ip.get(ihl..total)?)
        }
        0x86dd => {
            if ip.first()? >> 4 != 6 || *ip.get(6)? != 6 {
                return None;
            }
            let total = trim(usize::from(u16::from_be_bytes([ip[4], ip[5]])), 40);
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            (
                IpAddr::from(Ipv6Addr::from(src)),
                IpAddr::from(Ipv6Addr::from(dst)),
                ip.get(40..total)?,
            )
        }
        _ => return None,
    };
    let doff = usize::from(*tcp.get(12)? >> 4) * 4;
    Some(Packet {
        time,
        ifindex,
        src,
        dst,
        sport: u16::from_be_bytes([tcp[0], tcp[1]]),
        dport: u16::from_be_bytes([tcp[2], tcp[3]]),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        flags: *tcp.get(13)?,
        payload: tcp.get(doff..)?.to_vec(),
    })
}

/// One TCP connection as seen on the wire, keyed by its initiator's view.
#[derive(Debug, Clone)]
pub struct Flow {
    /// The initiator's address and port.
    pub client: (IpAddr, u16),
    /// The responder's address and port.
    pub server: (IpAddr, u16),
    /// When its first packet (normally the SYN) was seen.
    pub start: SystemTime,
    /// Whether the SYN was captured (else the initiator is a guess: the first sender).
    pub saw_syn: bool,
    /// Payload bytes, client to server and back, in capture order (no reassembly: a
    /// retransmission appears twice, which only makes searches stricter).
    pub to_server: Vec<u8>,
    /// Payload bytes, server to client, in capture order.
    pub to_client: Vec<u8>,
    /// First payload byte each way, taken from the lowest sequence number seen.
    pub first_to_server: Option<u8>,
    /// First payload byte server to client, from the lowest sequence number seen.
    pub first_to_client: Option<u8>,
    /// Number of packets in the flow, both ways.
    pub packets: usize,
    /// A FIN or RST was seen.
    pub ended: bool,
}

/// Groups packets into flows. A new SYN on a 4-tuple seen before starts a new flow.
pub fn flows(packets: &[Packet]) -> Vec<Flow> {
    use std::collections::HashMap;
    type End = (IpAddr, u16);
    let mut out: Vec<Flow> = Vec::new();
    let mut index: HashMap<(End, End), usize> = HashMap::new();
    // Lowest sequence number holding payload, per flow and direction.
    let mut lowest: HashMap<(usize, bool), u32> = HashMap::new();
    for p in packets {
        let (from, to) = ((p.src, p.sport), (p.dst, p.dport));
        let known = index
            .get(&(from, to))
            .map(|i| (*i, true))
            .or_else(|| index.get(&(to, from)).map(|i| (*i, false)));
        // A SYN on a known 4-tuple starts a new connection unless it repeats the first
        // SYN (nothing else was exchanged yet).
        let reused = |f: &Flow| f.ended || !f.to_server.is_empty() || !f.to_client.is_empty();
        let (i, to_server) = match known {
            Some((i, dir)) if !(p.is_syn() && reused(&out[i])) => (i, dir),
            _ => {
                out.push(Flow {
                    client: from,
                    server: to,
                    start: p.time,
                    saw_syn: p.is_syn(),
                    to_server: Vec::new(),
                    to_client: Vec::new(),
                    first_to_server: None,
                    first_to_client: None,
                    packets: 0,
                    ended: false,
                });
                let i = out.len() - 1;
                index.insert((from, to), i);
                index.remove(&(to, from));
                (i, true)
            }
        };
        let f = &mut out[i];
        f.packets += 1;
        f.ended |= p.flags & (FIN | RST) != 0;
        if p.payload.is_empty() {
            continue;
        }
        let low = lowest.entry((i, to_server)).or_insert(p.seq);
        let first = if to_server {
            &mut f.first_to_server
        } else {
            &mut f.first_to_client
        };
        // Sequence numbers wrap: "before" is a negative signed distance.
        if first.is_none() || (p.seq.wrapping_sub(*low) as i32) < 0 {
            *low = p.seq;
            *first = Some(p.payload[0]);
        }
        if to_server {
            f.to_server.extend_from_slice(&p.payload);
        } else {
            f.to_client.extend_from_slice(&p.payload);
        }
    }
    out
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn frame(
        src: [u8; 4],
        dst: [u8; 4],
        sport: u16,
        dport: u16,
        seq: u32,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let total = (20 + 20 + payload.len()) as u16;
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        with_tcp(0x0800, ip, sport, dport, seq, flags, payload)
    }

    fn frame6(src: Ipv6Addr, dst: Ipv6Addr, dport: u16, payload: &[u8]) -> Vec<u8> {
        let len = (20 + payload.len()) as u16;
        let mut ip = vec![0x60, 0, 0, 0, 0, 0, 6, 64];
        ip[4..6].copy_from_slice(&len.to_be_bytes());
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&dst.octets());
        with_tcp(0x86dd, ip, 40000, dport, 1, ACK, payload)
    }

    fn with_tcp(
        ethertype: u16,
        ip: Vec<u8>,
        sport: u16,
        dport: u16,
        seq: u32,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        let mut tcp = Vec::new();
        tcp.extend_from_slice(&sport.to_be_bytes());
        tcp.extend_from_slice(&dport.to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend(ip);
        f.extend(tcp);
        f.extend_from_slice(payload);
        // Ethernet padding, which the IP length must trim.
        f.extend_from_slice(&[0u8; 6]);
        f
    }

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn parses_ipv4_tcp_and_skips_the_rest() {
        let f = frame(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            40000,
            15008,
            7,
            ACK,
            b"\x16\x03\x01",
        );
        let p = parse_frame(&f, at(1), 3).unwrap();
        let v4 = |a, b, c, d| IpAddr::from(Ipv4Addr::new(a, b, c, d));
        assert_eq!((p.src, p.dst), (v4(10, 0, 0, 1), v4(10, 0, 0, 2)));
        assert_eq!((p.sport, p.dport, p.seq), (40000, 15008, 7));
        assert_eq!(p.payload, b"\x16\x03\x01");
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(parse_frame(&arp, at(1), 3).is_none());
        let mut udp = f.clone();
        udp[14 + 9] = 17;
        assert!(parse_frame(&udp, at(1), 3).is_none());
        assert!(parse_frame(&f[..20], at(1), 3).is_none());
    }

    #[test]
    fn parses_ipv6_tcp_and_skips_other_next_headers() {
        let (a, b): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let f = frame6(a, b, 9001, b"zte-marker");
        let p = parse_frame(&f, at(1), 3).unwrap();
        assert_eq!((p.src, p.dst), (IpAddr::from(a), IpAddr::from(b)));
        assert_eq!((p.sport, p.dport), (40000, 9001));
        assert_eq!(p.payload, b"zte-marker");
        let mut udp = f.clone();
        udp[14 + 6] = 17;
        assert!(parse_frame(&udp, at(1), 3).is_none());
        assert!(parse_frame(&f[..50], at(1), 3).is_none());
    }

    #[test]
    fn groups_flows_and_finds_first_bytes() {
        let a = [10, 244, 1, 5];
        let b = [10, 244, 2, 6];
        let pkts: Vec<Packet> = [
            frame(a, b, 5000, 15008, 100, SYN, b""),
            frame(b, a, 15008, 5000, 900, SYN | ACK, b""),
            // Out of order: the later segment first.
            frame(a, b, 5000, 15008, 104, ACK, b"rest"),
            frame(a, b, 5000, 15008, 101, ACK, b"\x16ab"),
            frame(b, a, 15008, 5000, 901, ACK, b"\x16srv"),
            frame(a, b, 5001, 9000, 1, SYN, b""),
            frame(a, b, 5001, 9000, 2, ACK, b"MARK-MARK"),
        ]
        .iter()
        .enumerate()
        .map(|(i, f)| parse_frame(f, at(i as u64), 1).unwrap())
        .collect();
        let flows = flows(&pkts);
        assert_eq!(flows.len(), 2);
        let tls = &flows[0];
        assert!(tls.saw_syn);
        assert_eq!(tls.server, (IpAddr::from(b), 15008));
        assert_eq!(
            (tls.first_to_server, tls.first_to_client),
            (Some(0x16), Some(0x16))
        );
        assert_eq!(tls.packets, 5);
        let plain = &flows[1];
        assert_eq!(plain.server.1, 9000);
        assert!(contains(&plain.to_server, b"MARK"));
        assert!(!contains(&tls.to_server, b"MARK"));
        assert_eq!(plain.start, at(5));
    }
}
