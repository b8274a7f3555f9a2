//! A small rtnetlink reader: the links, addresses and routes of one network namespace, as
//! `ip -d link`, `ip addr` and `ip route` show them, so that `rkubelet inspect` can show how a
//! pod's veth pair, the bridge and the routes are wired.
//!
//! It sends the three dump requests (`RTM_GETLINK`, `RTM_GETADDR`, `RTM_GETROUTE`) on a
//! `NETLINK_ROUTE` socket and parses the replies itself. A socket answers for the network
//! namespace it was created in, so to read another namespace the socket is created on a
//! short-lived thread of its own that first enters that namespace; no other thread ever
//! changes namespace. Everything here blocks: async callers use `spawn_blocking`.

use std::fmt;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, sockopt,
};
use nix::sys::time::TimeVal;
use serde::{Deserialize, Serialize};

// Kernel ABI (linux/netlink.h, rtnetlink.h, if_link.h, if_addr.h); netlink is host-endian.
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_DUMP: u16 = 0x300;
const NLA_TYPE_MASK: u16 = 0x3fff;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;
const RTMSG_LEN: usize = 12;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINK: u16 = 5;
const IFLA_MASTER: u16 = 10;
const IFLA_OPERSTATE: u16 = 16;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_TABLE: u16 = 15;
const RT_TABLE_MAIN: u32 = 254;
const IFF_UP: u32 = 0x1;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// How long one reply may take before the read gives up.
const RECV_TIMEOUT: Duration = Duration::from_secs(5);
/// A dump the kernel marks interrupted (the tables changed meanwhile) is asked again.
const DUMP_ATTEMPTS: usize = 3;

/// A network interface (`ip -d link`), with its addresses (`ip addr`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// The interface index in its namespace.
    pub index: u32,
    /// The interface name (`eth0`, `cni0`, `veth1a2b3c4d`).
    pub name: String,
    /// The link kind (`veth`, `bridge`, `vxlan`); none for physical devices and loopback.
    pub kind: Option<String>,
    /// The MTU.
    pub mtu: u32,
    /// The hardware address, as `aa:bb:cc:dd:ee:ff`.
    pub mac: Option<String>,
    /// The index of the bridge (or bond) this interface is enslaved to.
    pub master: Option<u32>,
    /// The index of the link under this one: a veth's peer, a vlan's parent. It is an index
    /// in the namespace [`peer_netns_id`](Self::peer_netns_id) names, when set.
    pub peer_index: Option<u32>,
    /// The namespace id (as this namespace numbers it) where the peer lives.
    pub peer_netns_id: Option<i32>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// The operational state: `up`, `down`, `lowerlayerdown`, `unknown`...
    pub oper_state: String,
    /// The addresses on the interface.
    pub addresses: Vec<Address>,
}

/// An address on an interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Address {
    /// The local address.
    pub address: IpAddr,
    /// The prefix length of the subnet.
    pub prefix_len: u8,
    /// The scope: `universe` (ip calls it global), `link`, `host`.
    pub scope: String,
}

/// A route of the main table (`ip route`, `ip -6 route`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// The destination subnet; none for the default route.
    pub destination: Option<(IpAddr, u8)>,
    /// The next hop.
    pub gateway: Option<IpAddr>,
    /// The index of the outgoing interface.
    pub device: Option<u32>,
    /// The name of the outgoing interface.
    pub device_name: Option<String>,
    /// The preferred source address.
    pub source: Option<IpAddr>,
    /// The scope: `universe`, `link`, `host`.
    pub scope: String,
    /// Who installed the route: `kernel`, `boot` (ip route add), `static`, `dhcp`, or a number.
    pub protocol: String,
    /// The routing table.
    pub table: u32,
}

/// What one network namespace holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interfaces {
    /// The links, by index.
    pub links: Vec<Link>,
    /// The routes of the main table, IPv4 then IPv6 as the kernel lists them.
    pub routes: Vec<Route>,
}

impl Interfaces {
    /// The link with this index.
    pub fn link(&self, index: u32) -> Option<&Link> {
        self.links.iter().find(|l| l.index == index)
    }

    /// The link with this name.
    pub fn link_named(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
    }
}

/// One of the dumps asked from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `RTM_GETLINK`.
    Links,
    /// `RTM_GETADDR`.
    Addresses,
    /// `RTM_GETROUTE`.
    Routes,
}

impl Request {
    /// The request type, the type of its replies and the length of its family header.
    fn types(self) -> (u16, u16, usize) {
        match self {
            Request::Links => (RTM_GETLINK, RTM_NEWLINK, IFINFOMSG_LEN),
            Request::Addresses => (RTM_GETADDR, RTM_NEWADDR, IFADDRMSG_LEN),
            Request::Routes => (RTM_GETROUTE, RTM_NEWROUTE, RTMSG_LEN),
        }
    }

    /// The dump request: a header and a zeroed family header (AF_UNSPEC: every family).
    fn message(self, seq: u32) -> Vec<u8> {
        let (ty, _, family_len) = self.types();
        let len = NLMSG_HDRLEN + family_len;
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.resize(len, 0);
        msg
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Request::Links => "RTM_GETLINK dump",
            Request::Addresses => "RTM_GETADDR dump",
            Request::Routes => "RTM_GETROUTE dump",
        })
    }
}

/// Why a namespace could not be read. `netns` names the namespace read.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The namespace file could not be opened.
    #[error("open network namespace {netns}: {source}")]
    OpenNetns {
        /// The namespace.
        netns: String,
        /// The error.
        source: std::io::Error,
    },
    /// The namespace could not be entered.
    #[error("enter network namespace {netns}: {source}")]
    Setns {
        /// The namespace.
        netns: String,
        /// The error.
        source: Errno,
    },
    /// No thread could be started to enter the namespace.
    #[error("start a thread to enter network namespace {netns}: {source}")]
    Thread {
        /// The namespace.
        netns: String,
        /// The error.
        source: std::io::Error,
    },
    /// The netlink socket could not be created.
    #[error("netlink socket in network namespace {netns}: {source}")]
    Socket {
        /// The namespace.
        netns: String,
        /// The error.
        source: Errno,
    },
    /// A request could not be sent.
    #[error("send {request} in network namespace {netns}: {source}")]
    Send {
        /// The namespace.
        netns: String,
        /// The request.
        request: Request,
        /// The error.
        source: Errno,
    },
    /// A reply could not be received.
    #[error("receive {request} in network namespace {netns}: {source}")]
    Recv {
        /// The namespace.
        netns: String,
        /// The request.
        request: Request,
        /// The error.
        source: Errno,
    },
    /// The kernel refused the request.
    #[error("{request} in network namespace {netns}: the kernel answered {errno}")]
    Kernel {
        /// The namespace.
        netns: String,
        /// The request.
        request: Request,
        /// The kernel's error.
        errno: Errno,
    },
    /// A reply could not be parsed.
    #[error("{request} in network namespace {netns}: malformed reply: {what}")]
    Malformed {
        /// The namespace.
        netns: String,
        /// The request.
        request: Request,
        /// What was wrong.
        what: String,
    },
}

/// Reads the interfaces of the netns at `netns` (a path like /var/run/netns/cni-… or
/// /proc/<pid>/ns/net), or of the caller's own when None. Blocking.
pub fn read(netns: Option<&Path>) -> Result<Interfaces, NetlinkError> {
    let name = netns.map_or_else(|| "(own)".to_owned(), |p| p.display().to_string());
    let fd = match netns {
        None => open_socket(&name)?,
        Some(path) => socket_in(path, name.clone())?,
    };
    let mut socket = Socket {
        fd,
        netns: name,
        seq: 0,
    };
    let links = socket.dump(Request::Links, |p| parse_link(p).map(Some))?;
    let addresses = socket.dump(Request::Addresses, parse_address)?;
    let routes = socket.dump(Request::Routes, parse_route)?;
    Ok(assemble(links, addresses, routes))
}

/// Puts each address on its link and names each route's device.
fn assemble(
    mut links: Vec<Link>,
    addresses: Vec<(u32, Address)>,
    mut routes: Vec<Route>,
) -> Interfaces {
    links.sort_by_key(|l| l.index);
    for (index, address) in addresses {
        if let Some(link) = links.iter_mut().find(|l| l.index == index) {
            link.addresses.push(address);
        }
    }
    for route in &mut routes {
        let link = route
            .device
            .and_then(|d| links.iter().find(|l| l.index == d));
        route.device_name = link.map(|l| l.name.clone());
    }
    Interfaces { links, routes }
}

/// A netlink socket created in the namespace at `path`, by a thread of its own that enters it
/// and then ends: the socket stays bound to the namespace, the caller's thread never leaves
/// its own.
fn socket_in(path: &Path, netns: String) -> Result<OwnedFd, NetlinkError> {
    let file = File::open(path).map_err(|source| NetlinkError::OpenNetns {
        netns: netns.clone(),
        source,
    })?;
    let thread_netns = netns.clone();
    let thread = std::thread::Builder::new()
        .name("netns-netlink".to_owned())
        .spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetlinkError::Setns {
                netns: thread_netns.clone(),
                source,
            })?;
            open_socket(&thread_netns)
        })
        .map_err(|source| NetlinkError::Thread { netns, source })?;
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A `NETLINK_ROUTE` socket in the calling thread's network namespace.
fn open_socket(netns: &str) -> Result<OwnedFd, NetlinkError> {
    let err = |source| NetlinkError::Socket {
        netns: netns.to_owned(),
        source,
    };
    let fd = socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(err)?;
    let timeout = TimeVal::new(RECV_TIMEOUT.as_secs() as _, 0);
    socket::setsockopt(&fd, sockopt::ReceiveTimeout, &timeout).map_err(err)?;
    Ok(fd)
}

struct Socket {
    fd: OwnedFd,
    netns: String,
    seq: u32,
}

impl Socket {
    /// Sends a dump request and parses each reply message with `parse`, until
    /// `NLMSG_DONE`; asks again when the kernel says the dump was interrupted.
    fn dump<T>(
        &mut self,
        request: Request,
        mut parse: impl FnMut(&[u8]) -> Result<Option<T>, Fault>,
    ) -> Result<Vec<T>, NetlinkError> {
        let mut buf = vec![0u8; 64 * 1024];
        for _ in 0..DUMP_ATTEMPTS {
            self.seq += 1;
            let kernel = NetlinkAddr::new(0, 0);
            socket::sendto(
                self.fd.as_raw_fd(),
                &request.message(self.seq),
                &kernel,
                MsgFlags::empty(),
            )
            .map_err(|source| NetlinkError::Send {
                netns: self.netns.clone(),
                request,
                source,
            })?;
            let mut replies = Replies::new(self.seq, request.types().1);
            let mut out = Vec::new();
            while !replies.done {
                // MSG_TRUNC: the length returned is the datagram's, even when longer than buf.
                let n = socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_TRUNC).map_err(
                    |source| NetlinkError::Recv {
                        netns: self.netns.clone(),
                        request,
                        source,
                    },
                )?;
                let chunk = match n {
                    0 => Err(Fault::Malformed(
                        "the socket closed before NLMSG_DONE".into(),
                    )),
                    n if n > buf.len() => Err(Fault::Malformed(format!("a {n}-byte datagram"))),
                    n => Ok(&buf[..n]),
                };
                chunk
                    .and_then(|chunk| {
                        replies.feed(chunk, |payload| {
                            out.extend(parse(payload)?);
                            Ok(())
                        })
                    })
                    .map_err(|fault| fault.into_error(&self.netns, request))?;
            }
            if !replies.interrupted {
                return Ok(out);
            }
        }
        Err(Fault::Kernel(Errno::EINTR).into_error(&self.netns, request))
    }
}

/// What went wrong in a reply, before the namespace and request are known.
#[derive(Debug, PartialEq)]
enum Fault {
    Kernel(Errno),
    Malformed(String),
}

impl Fault {
    fn into_error(self, netns: &str, request: Request) -> NetlinkError {
        let netns = netns.to_owned();
        match self {
            Fault::Kernel(errno) => NetlinkError::Kernel {
                netns,
                request,
                errno,
            },
            Fault::Malformed(what) => NetlinkError::Malformed {
                netns,
                request,
                what,
            },
        }
    }
}

fn malformed(what: &str) -> Fault {
    Fault::Malformed(what.to_owned())
}

/// The replies to one dump request, fed one datagram at a time.
struct Replies {
    seq: u32,
    reply_type: u16,
    done: bool,
    interrupted: bool,
}

impl Replies {
    fn new(seq: u32, reply_type: u16) -> Self {
        Replies {
            seq,
            reply_type,
            done: false,
            interrupted: false,
        }
    }

    /// Splits a datagram into messages and hands the payload of each reply to `each`.
    fn feed(
        &mut self,
        mut rest: &[u8],
        mut each: impl FnMut(&[u8]) -> Result<(), Fault>,
    ) -> Result<(), Fault> {
        while !rest.is_empty() {
            let len = u32_at(rest, 0).ok_or_else(|| malformed("a truncated message header"))?;
            let len = len as usize;
            if len < NLMSG_HDRLEN || len > rest.len() {
                return Err(Fault::Malformed(format!(
                    "a {len}-byte message in {} bytes",
                    rest.len()
                )));
            }
            let (ty, flags, seq) = (u16_at(rest, 4), u16_at(rest, 6), u32_at(rest, 8));
            let (Some(ty), Some(flags), Some(seq)) = (ty, flags, seq) else {
                return Err(malformed("a truncated message header"));
            };
            let payload = &rest[NLMSG_HDRLEN..len];
            rest = &rest[align(len).min(rest.len())..];
            if seq != self.seq {
                continue; // a late reply to an earlier request
            }
            self.interrupted |= flags & NLM_F_DUMP_INTR != 0;
            match ty {
                NLMSG_DONE => {
                    self.done = true;
                    match u32_at(payload, 0).map(|e| e as i32) {
                        Some(e) if e < 0 => return Err(Fault::Kernel(Errno::from_raw(-e))),
                        _ => return Ok(()),
                    }
                }
                NLMSG_ERROR => match u32_at(payload, 0).map(|e| e as i32) {
                    Some(0) => {} // an acknowledgement
                    Some(e) => return Err(Fault::Kernel(Errno::from_raw(-e))),
                    None => return Err(malformed("a truncated NLMSG_ERROR")),
                },
                ty if ty == self.reply_type => each(payload)?,
                _ => {}
            }
        }
        Ok(())
    }
}

/// Netlink messages and attributes are 4-byte aligned.
fn align(len: usize) -> usize {
    (len + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The attributes (type, value) that follow a family header.
fn attributes(mut rest: &[u8]) -> Result<Vec<(u16, &[u8])>, Fault> {
    let mut attrs = Vec::new();
    while rest.len() >= 4 {
        let (Some(len), Some(ty)) = (u16_at(rest, 0), u16_at(rest, 2)) else {
            break;
        };
        let len = len as usize;
        if len < 4 || len > rest.len() {
            return Err(Fault::Malformed(format!(
                "a {len}-byte attribute {ty} in {} bytes",
                rest.len()
            )));
        }
        attrs.push((ty & NLA_TYPE_MASK, &rest[4..len]));
        rest = &rest[align(len).min(rest.len())..];
    }
    Ok(attrs)
}

fn attr_u32(ty: u16, value: &[u8]) -> Result<u32, Fault> {
    u32_at(value, 0).ok_or_else(|| Fault::Malformed(format!("attribute {ty} is not a u32")))
}

fn attr_string(value: &[u8]) -> String {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

fn attr_ip(family: u8, ty: u16, value: &[u8]) -> Result<IpAddr, Fault> {
    let ip = match family {
        AF_INET => <[u8; 4]>::try_from(value).map(IpAddr::from).ok(),
        AF_INET6 => <[u8; 16]>::try_from(value).map(IpAddr::from).ok(),
        _ => None,
    };
    ip.ok_or_else(|| {
        Fault::Malformed(format!(
            "a {}-byte address (attribute {ty}) in family {family}",
            value.len()
        ))
    })
}

/// An `RTM_NEWLINK` payload: an `ifinfomsg` and `IFLA_*` attributes.
fn parse_link(payload: &[u8]) -> Result<Link, Fault> {
    let (Some(index), Some(flags)) = (u32_at(payload, 4), u32_at(payload, 8)) else {
        return Err(malformed("a truncated ifinfomsg"));
    };
    let mut link = Link {
        index,
        name: String::new(),
        kind: None,
        mtu: 0,
        mac: None,
        master: None,
        peer_index: None,
        peer_netns_id: None,
        up: flags & IFF_UP != 0,
        oper_state: oper_state(0),
        addresses: Vec::new(),
    };
    let mut lower = None;
    for (ty, value) in attributes(&payload[IFINFOMSG_LEN..])? {
        match ty {
            IFLA_IFNAME => link.name = attr_string(value),
            IFLA_MTU => link.mtu = attr_u32(ty, value)?,
            IFLA_ADDRESS if !value.is_empty() => {
                let hex: Vec<String> = value.iter().map(|b| format!("{b:02x}")).collect();
                link.mac = Some(hex.join(":"));
            }
            IFLA_LINK => lower = Some(attr_u32(ty, value)?),
            IFLA_MASTER => link.master = Some(attr_u32(ty, value)?),
            IFLA_LINK_NETNSID => link.peer_netns_id = Some(attr_u32(ty, value)? as i32),
            IFLA_OPERSTATE => {
                let state = value
                    .first()
                    .ok_or_else(|| malformed("an empty IFLA_OPERSTATE"))?;
                link.oper_state = oper_state(*state);
            }
            IFLA_LINKINFO => {
                let kind = attributes(value)?
                    .into_iter()
                    .find(|(t, _)| *t == IFLA_INFO_KIND);
                link.kind = kind.map(|(_, v)| attr_string(v));
            }
            _ => {}
        }
    }
    // A peer in another namespace may have the same index as this link.
    link.peer_index = lower.filter(|&l| l != 0 && (l != index || link.peer_netns_id.is_some()));
    Ok(link)
}

/// An `RTM_NEWADDR` payload: an `ifaddrmsg` and `IFA_*` attributes; the interface index and
/// the address, none for families other than IPv4 and IPv6.
fn parse_address(payload: &[u8]) -> Result<Option<(u32, Address)>, Fault> {
    let (Some(&[family, prefix_len, _, scope]), Some(index)) =
        (payload.get(..4), u32_at(payload, 4))
    else {
        return Err(malformed("a truncated ifaddrmsg"));
    };
    if family != AF_INET && family != AF_INET6 {
        return Ok(None);
    }
    let (mut local, mut address) = (None, None);
    for (ty, value) in attributes(&payload[IFADDRMSG_LEN..])? {
        match ty {
            IFA_LOCAL => local = Some(attr_ip(family, ty, value)?),
            IFA_ADDRESS => address = Some(attr_ip(family, ty, value)?),
            _ => {}
        }
    }
    // On point-to-point links IFA_ADDRESS is the peer's; IFA_LOCAL is ours.
    let address = local
        .or(address)
        .ok_or_else(|| malformed("an address without IFA_ADDRESS"))?;
    let scope = scope_name(scope);
    Ok(Some((
        index,
        Address {
            address,
            prefix_len,
            scope,
        },
    )))
}

/// An `RTM_NEWROUTE` payload: an `rtmsg` and `RTA_*` attributes; none for routes of other
/// tables or families.
fn parse_route(payload: &[u8]) -> Result<Option<Route>, Fault> {
    let Some(&[family, dst_len, _, _, table, protocol, scope, _]) = payload.get(..8) else {
        return Err(malformed("a truncated rtmsg"));
    };
    if payload.len() < RTMSG_LEN {
        return Err(malformed("a truncated rtmsg"));
    }
    if family != AF_INET && family != AF_INET6 {
        return Ok(None);
    }
    let mut route = Route {
        destination: None,
        gateway: None,
        device: None,
        device_name: None,
        source: None,
        scope: scope_name(scope),
        protocol: protocol_name(protocol),
        table: u32::from(table),
    };
    for (ty, value) in attributes(&payload[RTMSG_LEN..])? {
        match ty {
            RTA_DST if dst_len > 0 => {
                route.destination = Some((attr_ip(family, ty, value)?, dst_len))
            }
            RTA_GATEWAY => route.gateway = Some(attr_ip(family, ty, value)?),
            RTA_OIF => route.device = Some(attr_u32(ty, value)?),
            RTA_PREFSRC => route.source = Some(attr_ip(family, ty, value)?),
            RTA_TABLE => route.table = attr_u32(ty, value)?,
            _ => {}
        }
    }
    Ok((route.table == RT_TABLE_MAIN).then_some(route))
}

/// `IFLA_OPERSTATE` (RFC 2863), lowercase.
fn oper_state(state: u8) -> String {
    let names = [
        "unknown",
        "notpresent",
        "down",
        "lowerlayerdown",
        "testing",
        "dormant",
        "up",
    ];
    names
        .get(usize::from(state))
        .map_or_else(|| state.to_string(), |s| (*s).to_owned())
}

/// `RT_SCOPE_*`.
fn scope_name(scope: u8) -> String {
    match scope {
        0 => "universe".to_owned(),
        200 => "site".to_owned(),
        253 => "link".to_owned(),
        254 => "host".to_owned(),
        255 => "nowhere".to_owned(),
        n => n.to_string(),
    }
}

/// `RTPROT_*`, as iproute2 names them.
fn protocol_name(protocol: u8) -> String {
    let names = ["unspec", "redirect", "kernel", "boot", "static"];
    match protocol {
        9 => "ra".to_owned(),
        16 => "dhcp".to_owned(),
        n => names
            .get(usize::from(n))
            .map_or_else(|| n.to_string(), |s| (*s).to_owned()),
    }
}
