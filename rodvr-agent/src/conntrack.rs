//! The kernel's connection tracking, over netlink (ctnetlink), from the agent itself.
//!
//! A route re-targeted to another GPU server must cut the VM's open connections to the old one
//! (see `nft.rs`): their conntrack entries keep sending them to the old target. Running the
//! `conntrack` program for that cost a process per cut, 11-16 ms of a re-target that should take
//! 5; here one dump of the table's IPv4 TCP entries and one delete per matching entry go over a
//! socket the agent keeps. The `conntrack_command` setting still runs a program instead (an
//! operator's wrapper, or a test's failing one).

use std::io;
use std::net::{IpAddr, SocketAddrV4};
use std::time::Duration;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

/// How long one answer may take before the kernel is deemed not to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// One tracked IPv4 TCP connection: where it was sent (the original direction) and who answers
/// (the reply's source: the DNAT target when it was rerouted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpEntry {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub reply_src: SocketAddrV4,
}

/// A ctnetlink socket of this network namespace.
#[derive(Debug)]
pub struct Conntrack {
    socket: Socket,
    sequence: u32,
}

impl Conntrack {
    pub fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        set_receive_timeout(&socket, ANSWER_TIMEOUT)?;
        Ok(Self { socket, sequence: 0 })
    }

    /// Every IPv4 TCP connection the kernel tracks.
    pub fn tcp_entries(&mut self) -> io::Result<Vec<TcpEntry>> {
        let answers = self.ask(NLM_F_REQUEST | NLM_F_DUMP, ConntrackMessage::Get(vec![]))?;
        Ok(answers.iter().filter_map(tcp_entry).collect())
    }

    /// Deletes `entry`'s connection; `false` when it was gone already.
    pub fn delete(&mut self, entry: &TcpEntry) -> io::Result<bool> {
        let tuple = vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(IpAddr::V4(*entry.src.ip())),
                IPTuple::DestinationAddress(IpAddr::V4(*entry.dst.ip())),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(Protocol::Tcp),
                ProtoTuple::SourcePort(entry.src.port()),
                ProtoTuple::DestinationPort(entry.dst.port()),
            ]),
        ];
        let delete = ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]);
        match self.ask(NLM_F_REQUEST | NLM_F_ACK, delete) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends `message` and reads the answers up to the dump's end or the acknowledgement; a
    /// refusal is the kernel's error.
    fn ask(&mut self, flags: u16, message: ConntrackMessage) -> io::Result<Vec<ConntrackMessage>> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.sequence;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::from(NetfilterMessage::new(
                NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
                message,
            )),
        );
        packet.finalize();
        let mut buffer = vec![0; packet.buffer_len()];
        packet.serialize(&mut buffer);
        self.socket.send(&buffer, 0)?;
        let mut answers = Vec::new();
        loop {
            let (datagram, _) = self.socket.recv_from_full()?;
            let mut at = 0;
            while at < datagram.len() {
                let answer = NetlinkMessage::<NetfilterMessage>::deserialize(&datagram[at..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let length = answer.header.length as usize;
                if answer.header.sequence_number != self.sequence {
                    // A late answer to an earlier question that timed out.
                    at += length.max(1);
                    continue;
                }
                match answer.payload {
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::Error(error) => {
                        return match error.code {
                            None => Ok(answers),
                            Some(_) => Err(error.to_io()),
                        }
                    }
                    NetlinkPayload::InnerMessage(NetfilterMessage {
                        inner: NetfilterMessageInner::Conntrack(entry),
                        ..
                    }) => answers.push(entry),
                    _ => {}
                }
                if length == 0 {
                    break;
                }
                at += length;
            }
        }
    }
}

/// The connection a dumped entry describes, if it is IPv4 TCP with both directions given.
fn tcp_entry(message: &ConntrackMessage) -> Option<TcpEntry> {
    let (ConntrackMessage::New(attributes) | ConntrackMessage::Get(attributes)) = message else {
        return None;
    };
    let mut original = None;
    let mut reply = None;
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => original = endpoints(tuple),
            ConntrackAttribute::CtaTupleReply(tuple) => reply = endpoints(tuple),
            _ => {}
        }
    }
    let (src, dst) = original?;
    let (reply_src, _) = reply?;
    Some(TcpEntry { src, dst, reply_src })
}

/// A TCP tuple's (source, destination).
fn endpoints(tuple: &[Tuple]) -> Option<(SocketAddrV4, SocketAddrV4)> {
    let (mut src_ip, mut dst_ip, mut src_port, mut dst_port, mut tcp) =
        (None, None, None, None, false);
    for part in tuple {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(IpAddr::V4(a)) => src_ip = Some(*a),
                        IPTuple::DestinationAddress(IpAddr::V4(a)) => dst_ip = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(protos) => {
                for proto in protos {
                    match proto {
                        ProtoTuple::Protocol(p) => tcp = *p == Protocol::Tcp,
                        ProtoTuple::SourcePort(p) => src_port = Some(*p),
                        ProtoTuple::DestinationPort(p) => dst_port = Some(*p),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    tcp.then_some(())?;
    Some((SocketAddrV4::new(src_ip?, src_port?), SocketAddrV4::new(dst_ip?, dst_port?)))
}

/// Bounds each wait for the kernel's answer.
fn set_receive_timeout(socket: &Socket, timeout: Duration) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt::ReceiveTimeout};
    use nix::sys::time::TimeVal;
    let timeout = TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
    setsockopt(socket, ReceiveTimeout, &timeout).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src: &str, dst: &str, protocol: Protocol) -> Vec<Tuple> {
        let (src, dst): (SocketAddrV4, SocketAddrV4) = (src.parse().unwrap(), dst.parse().unwrap());
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(IpAddr::V4(*src.ip())),
                IPTuple::DestinationAddress(IpAddr::V4(*dst.ip())),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(protocol),
                ProtoTuple::SourcePort(src.port()),
                ProtoTuple::DestinationPort(dst.port()),
            ]),
        ]
    }

    #[test]
    fn a_dumped_tcp_entry_gives_both_ends_and_who_answers() {
        let dnated = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(tuple(
                "10.0.0.5:40000",
                "100.127.0.1:9000",
                Protocol::Tcp,
            )),
            ConntrackAttribute::CtaTupleReply(tuple(
                "10.232.0.2:8308",
                "10.232.0.9:40000",
                Protocol::Tcp,
            )),
            ConntrackAttribute::CtaMark(0),
        ]);
        assert_eq!(
            tcp_entry(&dnated),
            Some(TcpEntry {
                src: "10.0.0.5:40000".parse().unwrap(),
                dst: "100.127.0.1:9000".parse().unwrap(),
                reply_src: "10.232.0.2:8308".parse().unwrap(),
            })
        );
        // UDP, or an entry without its reply, is none of the agent's.
        let udp = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(tuple("10.0.0.5:53", "10.0.0.1:53", Protocol::Udp)),
            ConntrackAttribute::CtaTupleReply(tuple("10.0.0.1:53", "10.0.0.5:53", Protocol::Udp)),
        ]);
        assert_eq!(tcp_entry(&udp), None);
        let half = ConntrackMessage::New(vec![ConntrackAttribute::CtaTupleOrig(tuple(
            "10.0.0.5:40000",
            "100.127.0.1:9000",
            Protocol::Tcp,
        ))]);
        assert_eq!(tcp_entry(&half), None);
    }
}
