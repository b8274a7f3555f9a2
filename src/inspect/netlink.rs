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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

impl Address {
    /// The address with its prefix length, as `ip addr` shows it: `10.88.0.1/24`.
    #[must_use]
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.address, self.prefix_len)
    }
}

impl Link {
    /// Its first IPv4 address.
    #[must_use]
    pub fn ipv4(&self) -> Option<&Address> {
        self.addresses.iter().find(|a| a.address.is_ipv4())
    }

    /// Its addresses with their prefix lengths.
    #[must_use]
    pub fn cidrs(&self) -> Vec<String> {
        self.addresses.iter().map(Address::cidr).collect()
    }
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
    let name = netns.map_or_else(
        || "(the caller's own)".to_owned(),
        |p| p.display().to_string(),
    );
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

/// A `NETLINK_ROUTE` socket, the namespace it reads (for errors) and the last request's
/// sequence number.
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

/// The attributes after a family header of `len` bytes.
fn attributes_after<'a>(
    payload: &'a [u8],
    len: usize,
    header: &str,
) -> Result<Vec<(u16, &'a [u8])>, Fault> {
    let rest = payload
        .get(len..)
        .ok_or_else(|| Fault::Malformed(format!("a truncated {header}")))?;
    attributes(rest)
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
    for (ty, value) in attributes_after(payload, IFINFOMSG_LEN, "ifinfomsg")? {
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
    let attrs = attributes_after(payload, IFADDRMSG_LEN, "ifaddrmsg")?;
    if family != AF_INET && family != AF_INET6 {
        return Ok(None);
    }
    let (mut local, mut address) = (None, None);
    for (ty, value) in attrs {
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
    let attrs = attributes_after(payload, RTMSG_LEN, "rtmsg")?;
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
    for (ty, value) in attrs {
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

#[cfg(test)]
mod tests {
    use super::*;

    const NLA_F_NESTED: u16 = 0x8000;

    fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize(align(a.len()), 0);
        a
    }

    fn message(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&4242u32.to_ne_bytes());
        m.extend_from_slice(payload);
        m
    }

    fn ifinfomsg(index: u32, flags: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut p = vec![0u8, 0, 1, 0]; // AF_UNSPEC, ARPHRD_ETHER
        p.extend_from_slice(&index.to_ne_bytes());
        p.extend_from_slice(&flags.to_ne_bytes());
        p.extend_from_slice(&0u32.to_ne_bytes());
        p.extend(attrs.concat());
        p
    }

    fn ifaddrmsg(family: u8, prefix_len: u8, scope: u8, index: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut p = vec![family, prefix_len, 0, scope];
        p.extend_from_slice(&index.to_ne_bytes());
        p.extend(attrs.concat());
        p
    }

    /// An rtmsg: family, dst_len, table, protocol, scope, then attributes.
    fn rtmsg(
        family: u8,
        dst_len: u8,
        table: u8,
        proto: u8,
        scope: u8,
        attrs: &[Vec<u8>],
    ) -> Vec<u8> {
        let mut p = vec![family, dst_len, 0, 0, table, proto, scope, 1];
        p.extend_from_slice(&0u32.to_ne_bytes());
        p.extend(attrs.concat());
        p
    }

    /// The host end of a pod's veth pair: enslaved to cni0 (index 3), its peer eth0 (index
    /// 2) in the namespace numbered 1.
    fn veth_payload() -> Vec<u8> {
        let info = attr(IFLA_INFO_KIND, b"veth\0");
        ifinfomsg(
            7,
            IFF_UP | 0x1000,
            &[
                attr(IFLA_IFNAME, b"veth1a2b3c4d\0"),
                attr(IFLA_MTU, &1450u32.to_ne_bytes()),
                attr(IFLA_ADDRESS, &[0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x01]),
                attr(IFLA_LINK, &2u32.to_ne_bytes()),
                attr(IFLA_MASTER, &3u32.to_ne_bytes()),
                attr(IFLA_OPERSTATE, &[6]),
                attr(IFLA_LINKINFO | NLA_F_NESTED, &info),
                attr(IFLA_LINK_NETNSID, &1i32.to_ne_bytes()),
            ],
        )
    }

    fn lo_payload() -> Vec<u8> {
        ifinfomsg(
            1,
            IFF_UP,
            &[
                attr(IFLA_IFNAME, b"lo\0"),
                attr(IFLA_MTU, &65536u32.to_ne_bytes()),
                attr(IFLA_ADDRESS, &[0; 6]),
                attr(IFLA_OPERSTATE, &[0]),
            ],
        )
    }

    fn default_route() -> Vec<u8> {
        rtmsg(
            AF_INET,
            0,
            254,
            3,
            0,
            &[
                attr(RTA_TABLE, &254u32.to_ne_bytes()),
                attr(RTA_GATEWAY, &[10, 88, 0, 1]),
                attr(RTA_OIF, &2u32.to_ne_bytes()),
            ],
        )
    }

    fn connected_route() -> Vec<u8> {
        rtmsg(
            AF_INET,
            16,
            254,
            2,
            253,
            &[
                attr(RTA_TABLE, &254u32.to_ne_bytes()),
                attr(RTA_DST, &[10, 88, 0, 0]),
                attr(RTA_PREFSRC, &[10, 88, 0, 5]),
                attr(RTA_OIF, &2u32.to_ne_bytes()),
            ],
        )
    }

    /// Feeds one datagram as the replies to request `seq`; the payloads of the replies.
    fn feed(replies: &mut Replies, datagram: &[u8]) -> Result<Vec<Vec<u8>>, Fault> {
        let mut payloads = Vec::new();
        replies.feed(datagram, |p| {
            payloads.push(p.to_vec());
            Ok(())
        })?;
        Ok(payloads)
    }

    #[test]
    fn a_veth_link_names_its_master_and_its_peer_in_another_namespace() {
        let link = parse_link(&veth_payload()).expect("veth");
        assert_eq!(
            link,
            Link {
                index: 7,
                name: "veth1a2b3c4d".into(),
                kind: Some("veth".into()),
                mtu: 1450,
                mac: Some("0a:58:0a:f4:00:01".into()),
                master: Some(3),
                peer_index: Some(2),
                peer_netns_id: Some(1),
                up: true,
                oper_state: "up".into(),
                addresses: vec![],
            }
        );
    }

    #[test]
    fn loopback_has_no_kind_and_no_peer() {
        let lo = parse_link(&lo_payload()).expect("lo");
        assert_eq!((lo.kind, lo.peer_index, lo.master), (None, None, None));
        assert_eq!((lo.mtu, lo.oper_state.as_str()), (65536, "unknown"));
        assert_eq!(lo.mac.as_deref(), Some("00:00:00:00:00:00"));
        // A link whose lower link is itself, in the same namespace, has no peer.
        let own = ifinfomsg(
            4,
            0,
            &[
                attr(IFLA_LINK, &4u32.to_ne_bytes()),
                attr(IFLA_OPERSTATE, &[2]),
            ],
        );
        let own = parse_link(&own).expect("own");
        assert_eq!(
            (own.peer_index, own.up, own.oper_state.as_str()),
            (None, false, "down")
        );
        // ...but a peer in another namespace may share its index.
        let same = ifinfomsg(
            4,
            0,
            &[
                attr(IFLA_LINK, &4u32.to_ne_bytes()),
                attr(IFLA_LINK_NETNSID, &0i32.to_ne_bytes()),
            ],
        );
        assert_eq!(parse_link(&same).expect("same").peer_index, Some(4));
    }

    #[test]
    fn an_address_is_the_local_one_with_its_prefix() {
        let v4 = ifaddrmsg(
            AF_INET,
            24,
            0,
            2,
            &[
                attr(IFA_ADDRESS, &[10, 88, 0, 99]),
                attr(IFA_LOCAL, &[10, 88, 0, 5]),
            ],
        );
        let expected = Address {
            address: "10.88.0.5".parse().expect("ip"),
            prefix_len: 24,
            scope: "universe".into(),
        };
        assert_eq!(parse_address(&v4), Ok(Some((2, expected))));
        let fe80: std::net::Ipv6Addr = "fe80::858:aff:fef4:1".parse().expect("ip");
        let v6 = ifaddrmsg(AF_INET6, 64, 253, 7, &[attr(IFA_ADDRESS, &fe80.octets())]);
        let (index, address) = parse_address(&v6).expect("v6").expect("some");
        assert_eq!(
            (index, address.address, address.prefix_len),
            (7, IpAddr::V6(fe80), 64)
        );
        assert_eq!(address.scope, "link");
        assert_eq!(
            parse_address(&ifaddrmsg(17, 0, 0, 1, &[])),
            Ok(None),
            "AF_PACKET is skipped"
        );
    }

    #[test]
    fn default_and_connected_routes_of_the_main_table() {
        let default = parse_route(&default_route())
            .expect("default")
            .expect("main");
        assert_eq!(
            default,
            Route {
                destination: None,
                gateway: Some("10.88.0.1".parse().expect("ip")),
                device: Some(2),
                device_name: None,
                source: None,
                scope: "universe".into(),
                protocol: "boot".into(),
                table: 254,
            }
        );
        let connected = parse_route(&connected_route())
            .expect("connected")
            .expect("main");
        assert_eq!(
            connected.destination,
            Some(("10.88.0.0".parse().expect("ip"), 16))
        );
        assert_eq!(connected.source, Some("10.88.0.5".parse().expect("ip")));
        assert_eq!(
            (connected.scope.as_str(), connected.protocol.as_str()),
            ("link", "kernel")
        );
        assert_eq!(connected.gateway, None);
        // The local table is not shown; RTA_TABLE wins over the 8-bit rtm_table.
        let local = rtmsg(AF_INET, 32, 255, 2, 254, &[attr(RTA_DST, &[10, 88, 0, 5])]);
        assert_eq!(parse_route(&local), Ok(None));
        for (table, shown) in [(1000u32, None), (254, Some("200"))] {
            let route = rtmsg(
                AF_INET6,
                0,
                252,
                200,
                0,
                &[attr(RTA_TABLE, &table.to_ne_bytes())],
            );
            let route = parse_route(&route).expect("v6");
            assert_eq!(route.as_ref().map(|r| r.table), shown.map(|_| table));
            assert_eq!(
                route.as_ref().map(|r| r.protocol.as_str()),
                shown,
                "an unnamed protocol"
            );
        }
    }

    #[test]
    fn a_datagram_holds_many_messages_and_the_dump_ends_at_done() {
        let mut datagram = message(RTM_NEWLINK, 2, 9, &lo_payload());
        datagram.extend(message(RTM_NEWLINK, 2, 8, &veth_payload())); // an older request's
        datagram.extend(message(RTM_NEWLINK, 2, 9, &veth_payload()));
        let mut replies = Replies::new(9, RTM_NEWLINK);
        let payloads = feed(&mut replies, &datagram).expect("links");
        assert_eq!(payloads, vec![lo_payload(), veth_payload()]);
        assert!(!replies.done);
        let done = message(NLMSG_DONE, 2, 9, &0i32.to_ne_bytes());
        assert_eq!(feed(&mut replies, &done), Ok(vec![]));
        assert!(replies.done && !replies.interrupted);
    }

    #[test]
    fn an_interrupted_dump_is_noticed() {
        let mut replies = Replies::new(1, RTM_NEWROUTE);
        let datagram = [
            message(RTM_NEWROUTE, 2 | NLM_F_DUMP_INTR, 1, &default_route()),
            message(NLMSG_DONE, 2, 1, &[0; 4]),
        ]
        .concat();
        assert_eq!(feed(&mut replies, &datagram).map(|p| p.len()), Ok(1));
        assert!(replies.done && replies.interrupted);
    }

    #[test]
    fn kernel_errors_are_errors_and_acks_are_not() {
        let mut replies = Replies::new(1, RTM_NEWLINK);
        let ack = message(NLMSG_ERROR, 0, 1, &[0i32.to_ne_bytes(), [0; 4]].concat());
        assert_eq!(feed(&mut replies, &ack), Ok(vec![]));
        let eperm = message(NLMSG_ERROR, 0, 1, &(-(Errno::EPERM as i32)).to_ne_bytes());
        assert_eq!(feed(&mut replies, &eperm), Err(Fault::Kernel(Errno::EPERM)));
        let done = message(NLMSG_DONE, 2, 1, &(-(Errno::ENOBUFS as i32)).to_ne_bytes());
        assert_eq!(
            feed(&mut replies, &done),
            Err(Fault::Kernel(Errno::ENOBUFS))
        );
        let error = Fault::Kernel(Errno::EPERM).into_error("/proc/1/ns/net", Request::Links);
        assert_eq!(
            error.to_string(),
            "RTM_GETLINK dump in network namespace /proc/1/ns/net: the kernel answered EPERM: Operation not permitted"
        );
    }

    #[test]
    fn truncated_or_malformed_replies_are_errors_never_panics() {
        let datagram = [
            message(RTM_NEWLINK, 2, 1, &veth_payload()),
            message(
                RTM_NEWADDR,
                2,
                1,
                &ifaddrmsg(AF_INET, 24, 0, 2, &[attr(IFA_LOCAL, &[10, 88, 0, 5])]),
            ),
            message(RTM_NEWROUTE, 2, 1, &connected_route()),
            message(NLMSG_DONE, 2, 1, &[0; 4]),
        ]
        .concat();
        let parse_all = |buf: &[u8]| -> Result<(), Fault> {
            let mut replies = Replies::new(1, RTM_NEWLINK);
            replies.feed(buf, |p| parse_link(p).map(drop))?;
            for reply in [RTM_NEWADDR, RTM_NEWROUTE] {
                Replies::new(1, reply).feed(buf, |p| {
                    parse_address(p)?;
                    parse_route(p).map(drop)
                })?;
            }
            Ok(())
        };
        for len in 0..datagram.len() {
            let _ = parse_all(&datagram[..len]);
            for value in [0x00, 0x03, 0xff] {
                let mut corrupt = datagram.clone();
                corrupt[len] = value;
                let _ = parse_all(&corrupt);
            }
        }
        // Each truncation is reported, not skipped.
        let link = message(RTM_NEWLINK, 2, 1, &veth_payload());
        let mut replies = Replies::new(1, RTM_NEWLINK);
        assert!(
            matches!(feed(&mut replies, &link[..10]), Err(Fault::Malformed(_))),
            "header"
        );
        assert!(
            matches!(
                feed(&mut replies, &link[..link.len() - 1]),
                Err(Fault::Malformed(_))
            ),
            "body"
        );
        let mut short = link.clone();
        short[..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(
            matches!(feed(&mut replies, &short), Err(Fault::Malformed(_))),
            "length < header"
        );
        assert!(matches!(
            parse_link(&veth_payload()[..12]),
            Err(Fault::Malformed(_))
        ));
        let bad_attr = ifinfomsg(1, 0, &[vec![200, 0, 3, 0, b'l', b'o']]);
        assert!(
            matches!(parse_link(&bad_attr), Err(Fault::Malformed(_))),
            "attribute length"
        );
        let bad_mtu = ifinfomsg(1, 0, &[attr(IFLA_MTU, &[1, 0])]);
        assert!(
            matches!(parse_link(&bad_mtu), Err(Fault::Malformed(_))),
            "short u32"
        );
        let bad_ip = ifaddrmsg(AF_INET, 24, 0, 2, &[attr(IFA_LOCAL, &[10, 88, 0])]);
        assert!(
            matches!(parse_address(&bad_ip), Err(Fault::Malformed(_))),
            "3-byte IPv4"
        );
        assert!(matches!(
            parse_address(&ifaddrmsg(AF_INET, 24, 0, 2, &[])),
            Err(Fault::Malformed(_))
        ));
        assert!(
            matches!(
                parse_route(&connected_route()[..10]),
                Err(Fault::Malformed(_))
            ),
            "rtmsg"
        );
    }

    #[test]
    fn a_dump_request_asks_every_family() {
        let msg = Request::Routes.message(7);
        assert_eq!(msg.len(), NLMSG_HDRLEN + RTMSG_LEN);
        assert_eq!(u32_at(&msg, 0), Some(28));
        assert_eq!(
            (u16_at(&msg, 4), u16_at(&msg, 6)),
            (Some(RTM_GETROUTE), Some(0x301))
        );
        assert_eq!((u32_at(&msg, 8), u32_at(&msg, 12)), (Some(7), Some(0)));
        assert!(msg[NLMSG_HDRLEN..].iter().all(|&b| b == 0));
        assert_eq!(Request::Links.message(1).len(), 32);
        assert_eq!(Request::Addresses.message(1).len(), 24);
    }

    #[test]
    fn addresses_join_their_links_and_routes_name_their_devices() {
        let eth0 = Link {
            index: 2,
            name: "eth0".into(),
            ..parse_link(&lo_payload()).expect("lo")
        };
        let lo = parse_link(&lo_payload()).expect("lo");
        let address = Address {
            address: "10.88.0.5".parse().expect("ip"),
            prefix_len: 16,
            scope: "universe".into(),
        };
        let route = parse_route(&default_route()).expect("route").expect("main");
        let orphan = Route {
            device: Some(99),
            ..route.clone()
        };
        let interfaces = assemble(
            vec![eth0, lo],
            vec![(2, address.clone()), (98, address.clone())],
            vec![route, orphan],
        );
        assert_eq!(
            interfaces.links.iter().map(|l| l.index).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(
            interfaces.link_named("eth0").map(|l| l.addresses.clone()),
            Some(vec![address])
        );
        assert_eq!(interfaces.link(1).map(|l| l.addresses.len()), Some(0));
        assert_eq!(interfaces.routes[0].device_name.as_deref(), Some("eth0"));
        assert_eq!(interfaces.routes[1].device_name, None);
        let json = serde_json::to_value(&interfaces).expect("json");
        assert_eq!(json["links"][1]["operState"], "unknown");
        assert_eq!(json["routes"][0]["deviceName"], "eth0");
    }
}
