//! The node's InternalIP, as the kubelet's `NodeAddress` setter chooses it: `--node-ip`
//! when given (it must be an address of this host, not loopback, multicast, link-local or
//! unspecified); else the node name when it is an IP address; else the first valid
//! address the node name resolves to (IPv4 preferred, IPv6 for `--node-ip ::`); else the
//! IPv4 address of the interface that holds the default route (`ChooseHostInterface`).

use std::net::IpAddr;

/// Why no node IP could be chosen, or the given one cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    /// `--node-ip` is not an address a node may have.
    #[error("failed to validate nodeIP: nodeIP can't be {0}")]
    Unusable(&'static str),
    /// `--node-ip` is none of this host's addresses.
    #[error("failed to validate nodeIP: node IP: {0:?} not found in the host's network interfaces")]
    NotLocal(IpAddr),
    /// Nothing gave an address.
    #[error("can't get ip address of node {node}. error: {reason}")]
    NotFound {
        /// The node.
        node: String,
        /// What the last attempt said.
        reason: String,
    },
}

/// What the choice reads from the host: behind a trait so that it is testable.
pub trait HostAddresses {
    /// Every address on this host's interfaces.
    fn local(&self) -> std::io::Result<Vec<IpAddr>>;
    /// The IPv4 addresses of the interfaces holding a default route, in route order.
    fn default_route(&self) -> std::io::Result<Vec<IpAddr>>;
    /// What `name` resolves to.
    fn lookup(&self, name: &str) -> impl Future<Output = Vec<IpAddr>> + Send;
}

/// Checks an address as the kubelet's `validateNodeIP` does.
///
/// # Errors
/// The address is loopback, multicast, link-local or unspecified, or not on this host.
pub fn validate(ip: IpAddr, local: &[IpAddr]) -> Result<(), AddressError> {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    let unusable = if ip.is_loopback() {
        Some("loopback address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if link_local {
        Some("a link-local unicast address")
    } else if ip.is_unspecified() {
        Some("an all zeros address")
    } else {
        None
    };
    if let Some(what) = unusable {
        return Err(AddressError::Unusable(what));
    }
    if local.contains(&ip) {
        Ok(())
    } else {
        Err(AddressError::NotLocal(ip))
    }
}

/// The node's InternalIP: `given` (validated), or the one found for `node_name`.
///
/// # Errors
/// `given` cannot be used, or no address was found.
pub async fn node_ip<H: HostAddresses>(
    given: Option<IpAddr>,
    node_name: &str,
    host: &H,
) -> Result<IpAddr, AddressError> {
    let not_found = |reason: String| AddressError::NotFound {
        node: node_name.to_owned(),
        reason,
    };
    let local = host
        .local()
        .map_err(|e| not_found(format!("listing the host's addresses: {e}")))?;
    if let Some(ip) = given.filter(|ip| !ip.is_unspecified()) {
        validate(ip, &local)?;
        return Ok(ip);
    }
    // `::` asks for IPv6 first; anything else (or nothing) for IPv4.
    let prefer_v4 = !given.is_some_and(|ip| ip.is_ipv6());
    if let Ok(ip) = node_name.parse::<IpAddr>() {
        return Ok(ip);
    }
    let mut found = None;
    for ip in host.lookup(node_name).await {
        if validate(ip, &local).is_ok() {
            if ip.is_ipv4() == prefer_v4 {
                return Ok(ip);
            }
            found.get_or_insert(ip);
        }
    }
    if let Some(ip) = found {
        return Ok(ip);
    }
    let routed = host
        .default_route()
        .map_err(|e| not_found(format!("reading the default routes: {e}")))?;
    routed
        .into_iter()
        .find(|ip| validate(*ip, &local).is_ok())
        .ok_or_else(|| not_found("unable to select an IP from default routes.".to_owned()))
}

/// This host, read through `getifaddrs`, `/proc/net/route` and the system resolver.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxHost;

impl LinuxHost {
    fn interface_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
        let addrs = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
        Ok(addrs
            .filter_map(|a| {
                let addr = a.address?;
                let ip = addr
                    .as_sockaddr_in()
                    .map(|s| IpAddr::V4(s.ip()))
                    .or_else(|| addr.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))?;
                Some((a.interface_name, ip))
            })
            .collect())
    }
}

impl HostAddresses for LinuxHost {
    fn local(&self) -> std::io::Result<Vec<IpAddr>> {
        Ok(Self::interface_addresses()?
            .into_iter()
            .map(|(_, ip)| ip)
            .collect())
    }

    fn default_route(&self) -> std::io::Result<Vec<IpAddr>> {
        let routes = std::fs::read_to_string("/proc/net/route")?;
        let interfaces = Self::interface_addresses()?;
        Ok(default_route_interfaces(&routes)
            .into_iter()
            .flat_map(|name| {
                interfaces
                    .iter()
                    .filter(move |(i, ip)| *i == name && ip.is_ipv4())
                    .map(|(_, ip)| *ip)
            })
            .collect())
    }

    async fn lookup(&self, name: &str) -> Vec<IpAddr> {
        tokio::net::lookup_host((name, 0))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .unwrap_or_default()
    }
}

/// The interfaces of the default routes in `/proc/net/route` (destination and mask 0,
/// the route up), in the file's order.
fn default_route_interfaces(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (iface, dest, flags, mask) = (f.first()?, f.get(1)?, f.get(3)?, f.get(7)?);
            let up = u32::from_str_radix(flags, 16).ok()? & 1 == 1;
            (*dest == "00000000" && *mask == "00000000" && up).then(|| (*iface).to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        local: Vec<IpAddr>,
        routed: Vec<IpAddr>,
        dns: Vec<IpAddr>,
    }

    impl HostAddresses for Fake {
        fn local(&self) -> std::io::Result<Vec<IpAddr>> {
            Ok(self.local.clone())
        }
        fn default_route(&self) -> std::io::Result<Vec<IpAddr>> {
            Ok(self.routed.clone())
        }
        async fn lookup(&self, _: &str) -> Vec<IpAddr> {
            self.dns.clone()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn host() -> Fake {
        Fake {
            local: vec![
                ip("127.0.0.1"),
                ip("198.18.0.5"),
                ip("fd00::5"),
                ip("10.1.2.3"),
            ],
            routed: vec![ip("10.1.2.3")],
            dns: vec![],
        }
    }

    #[tokio::test]
    async fn a_given_ip_must_be_local_and_usable() {
        let h = host();
        assert_eq!(
            node_ip(Some(ip("198.18.0.5")), "n", &h).await,
            Ok(ip("198.18.0.5"))
        );
        assert_eq!(
            node_ip(Some(ip("198.18.0.6")), "n", &h).await,
            Err(AddressError::NotLocal(ip("198.18.0.6")))
        );
        assert_eq!(
            node_ip(Some(ip("127.0.0.1")), "n", &h).await,
            Err(AddressError::Unusable("loopback address"))
        );
        assert_eq!(
            validate(ip("169.254.1.1"), &[ip("169.254.1.1")]),
            Err(AddressError::Unusable("a link-local unicast address"))
        );
        assert_eq!(
            validate(ip("224.0.0.1"), &[]),
            Err(AddressError::Unusable("a multicast address"))
        );
        // 0.0.0.0 means "choose one", as with the kubelet.
        assert_eq!(
            node_ip(Some(ip("0.0.0.0")), "n", &h).await,
            Ok(ip("10.1.2.3"))
        );
    }

    #[tokio::test]
    async fn a_node_name_that_is_an_ip_is_used() {
        assert_eq!(
            node_ip(None, "192.0.2.9", &host()).await,
            Ok(ip("192.0.2.9"))
        );
    }

    #[tokio::test]
    async fn the_name_resolves_to_a_local_address_ipv4_first() {
        let mut h = host();
        h.dns = vec![
            ip("127.0.1.1"),
            ip("fd00::5"),
            ip("203.0.113.1"),
            ip("198.18.0.5"),
        ];
        assert_eq!(node_ip(None, "node", &h).await, Ok(ip("198.18.0.5")));
        h.dns = vec![ip("127.0.1.1"), ip("fd00::5")];
        assert_eq!(node_ip(None, "node", &h).await, Ok(ip("fd00::5")));
        h.dns = vec![ip("198.18.0.5"), ip("fd00::5")];
        assert_eq!(node_ip(Some(ip("::")), "node", &h).await, Ok(ip("fd00::5")));
    }

    #[tokio::test]
    async fn else_the_default_routes_interface() {
        let mut h = host();
        h.dns = vec![ip("127.0.1.1")];
        assert_eq!(node_ip(None, "node", &h).await, Ok(ip("10.1.2.3")));
        h.routed.clear();
        assert_eq!(
            node_ip(None, "node", &h).await.unwrap_err().to_string(),
            "can't get ip address of node node. error: unable to select an IP from default routes."
        );
    }

    #[test]
    fn default_routes_are_read_from_proc_net_route() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
            eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n\
            down0\t00000000\t0101A8C0\t0002\t0\t0\t100\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_interfaces(table), ["eth0"]);
    }
}
