//! The agent's host bridge across pod CIDR changes. The bridge plugin gives its bridge the
//! gateway address of the pod CIDR and refuses to work when the bridge already carries an
//! address of another CIDR — which happens when the Node object is deleted and re-created
//! and kube-controller-manager allocates it a new pod CIDR. At start-up the agent removes
//! such a stale bridge when no pod is attached to it, and refuses to start otherwise.

use std::future::Future;
use std::net::Ipv4Addr;

use super::CniError;

/// What the agent needs to know about, and do to, a host bridge.
pub trait BridgeOps: Send + Sync {
    /// The bridge's IPv4 addresses with prefix lengths, or `None` when it does not exist.
    fn addresses(
        &self,
        bridge: &str,
    ) -> impl Future<Output = Result<Option<Vec<(Ipv4Addr, u8)>>, CniError>> + Send;
    /// How many interfaces are attached to the bridge.
    fn ports(&self, bridge: &str) -> impl Future<Output = Result<usize, CniError>> + Send;
    /// Deletes the bridge.
    fn delete(&self, bridge: &str) -> impl Future<Output = Result<(), CniError>> + Send;
}

/// Bridges through the `ip` command: netlink answers for the agent's own network
/// namespace, where `/sys/class/net` shows the namespace sysfs was mounted in (not the
/// agent's, when it runs in a namespace of its own with the machine's mounts).
#[derive(Debug, Default, Clone, Copy)]
pub struct IpBridgeOps;

async fn ip(args: &[&str]) -> Result<String, CniError> {
    super::routes::run_tool("ip", args)
        .await
        .map_err(|e| CniError::Io {
            op: "running ip",
            path: args.join(" ").into(),
            source: std::io::Error::other(e.to_string()),
        })
}

impl BridgeOps for IpBridgeOps {
    async fn addresses(&self, bridge: &str) -> Result<Option<Vec<(Ipv4Addr, u8)>>, CniError> {
        let links = ip(&["-o", "link", "show"]).await?;
        if !link_names(&links).any(|name| name == bridge) {
            return Ok(None);
        }
        let text = ip(&["-o", "-4", "addr", "show", "dev", bridge]).await?;
        Ok(Some(parse_addresses(&text)))
    }

    async fn ports(&self, bridge: &str) -> Result<usize, CniError> {
        let text = ip(&["-o", "link", "show", "master", bridge]).await?;
        Ok(link_names(&text).count())
    }

    async fn delete(&self, bridge: &str) -> Result<(), CniError> {
        ip(&["link", "delete", bridge]).await.map(drop)
    }
}

/// The interface names of `ip -o link` output (`N: name[@peer]: <flags> ...`).
fn link_names(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let name = line.split(": ").nth(1)?;
        Some(name.split_once('@').map_or(name, |(n, _)| n))
    })
}

/// `inet A.B.C.D/N` words of `ip -o -4 addr` output.
fn parse_addresses(text: &str) -> Vec<(Ipv4Addr, u8)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().skip_while(|w| *w != "inet");
            let (addr, len) = words.nth(1)?.split_once('/')?;
            Some((addr.parse().ok()?, len.parse().ok()?))
        })
        .collect()
}

fn contains(cidr: (Ipv4Addr, u8), ip: Ipv4Addr) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(cidr.1)).unwrap_or(0);
    u32::from(cidr.0) & mask == u32::from(ip) & mask
}

/// Makes `bridge` usable for `pod_cidr`: absent or addressed inside it is fine; addressed
/// outside it with nothing attached is deleted (the bridge plugin re-creates it).
///
/// # Errors
/// [`CniError::StaleBridge`] when pods are still attached to a stale bridge; an unparsable
/// pod CIDR is [`CniError::InvalidConfig`].
pub async fn reconcile_bridge<B: BridgeOps>(
    ops: &B,
    bridge: &str,
    pod_cidr: &str,
) -> Result<(), CniError> {
    let invalid = || CniError::InvalidConfig {
        config: "pod CIDR".into(),
        reason: format!("{pod_cidr:?} is not an IPv4 CIDR"),
    };
    let (base, len) = pod_cidr.split_once('/').ok_or_else(invalid)?;
    let cidr: (Ipv4Addr, u8) = (
        base.parse().map_err(|_| invalid())?,
        len.parse().map_err(|_| invalid())?,
    );
    let Some(addresses) = ops.addresses(bridge).await? else {
        return Ok(());
    };
    let Some(stale) = addresses.iter().find(|(a, _)| !contains(cidr, *a)) else {
        return Ok(());
    };
    let ports = ops.ports(bridge).await?;
    if ports > 0 {
        return Err(CniError::StaleBridge {
            bridge: bridge.into(),
            address: format!("{}/{}", stale.0, stale.1),
            pod_cidr: pod_cidr.into(),
            ports,
        });
    }
    tracing::info!(bridge, address = %stale.0, pod_cidr, "removing a bridge left from an earlier pod CIDR");
    ops.delete(bridge).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_are_read_from_ip_link_output() {
        let text = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n\
            5: veth1a2b@if3: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 master rk0 state UP\n\
            7: rk0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\n";
        assert_eq!(
            link_names(text).collect::<Vec<_>>(),
            ["lo", "veth1a2b", "rk0"]
        );
    }
    use std::sync::Mutex;

    struct FakeBridge {
        addresses: Option<Vec<(Ipv4Addr, u8)>>,
        ports: usize,
        deleted: Mutex<Vec<String>>,
    }

    impl BridgeOps for FakeBridge {
        async fn addresses(&self, _: &str) -> Result<Option<Vec<(Ipv4Addr, u8)>>, CniError> {
            Ok(self.addresses.clone())
        }
        async fn ports(&self, _: &str) -> Result<usize, CniError> {
            Ok(self.ports)
        }
        async fn delete(&self, bridge: &str) -> Result<(), CniError> {
            self.deleted.lock().unwrap().push(bridge.into());
            Ok(())
        }
    }

    fn bridge(addr: Option<&str>, ports: usize) -> FakeBridge {
        FakeBridge {
            addresses: addr.map(|a| vec![(a.parse().unwrap(), 24)]),
            ports,
            deleted: Mutex::default(),
        }
    }

    #[test]
    fn reads_ip_addr_output() {
        let text = "7: rk0    inet 10.244.3.1/24 brd 10.244.3.255 scope global rk0\\       valid_lft forever\n";
        assert_eq!(parse_addresses(text), [("10.244.3.1".parse().unwrap(), 24)]);
    }

    #[tokio::test]
    async fn a_matching_or_missing_bridge_is_left_alone() {
        let ok = bridge(Some("10.244.3.1"), 2);
        reconcile_bridge(&ok, "rk0", "10.244.3.0/24").await.unwrap();
        let none = bridge(None, 0);
        reconcile_bridge(&none, "rk0", "10.244.3.0/24")
            .await
            .unwrap();
        assert!(ok.deleted.lock().unwrap().is_empty() && none.deleted.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_stale_empty_bridge_is_deleted_and_a_busy_one_refused() {
        let empty = bridge(Some("10.244.1.1"), 0);
        reconcile_bridge(&empty, "rk0", "10.244.3.0/24")
            .await
            .unwrap();
        assert_eq!(*empty.deleted.lock().unwrap(), ["rk0"]);
        let busy = bridge(Some("10.244.1.1"), 2);
        let err = reconcile_bridge(&busy, "rk0", "10.244.3.0/24")
            .await
            .unwrap_err();
        assert!(
            matches!(err, CniError::StaleBridge { ports: 2, .. }),
            "{err}"
        );
        assert!(reconcile_bridge(&busy, "rk0", "nonsense").await.is_err());
    }
}
