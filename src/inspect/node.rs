//! `rkubelet inspect node`: the node's pod network — the pod CIDR, the bridge and the
//! veths attached to it, each pod's IP and veth, the host's routes, and who runs the CNI
//! plugins.

use std::path::Path;

use super::netlink::{Interfaces, Link, Route};
use super::pod::{
    POD_IFNAME, host_end, list_sandboxes, on_host_network, read_interfaces, sandbox_status,
};
use super::view::{BridgeView, NodeView, PodLink, RoutesView};
use super::{InspectError, Locations, cni_store};
use crate::cri::{Cri, api};

/// Reads the node's pod network from the runtime and the system. `pod_cidr` is the
/// Node's, when the API was asked; otherwise it comes from the CNI config.
///
/// # Errors
/// The runtime cannot be asked for its sandboxes.
pub async fn inspect<C: Cri>(
    cri: &C,
    at: &Locations,
    node_name: Option<String>,
    pod_cidr: Option<String>,
) -> Result<NodeView, InspectError> {
    let mut view = NodeView {
        node_name,
        network_owner: network_owner(&at.runtime_cni_conf_dir).await.into(),
        ..NodeView::default()
    };
    let host = match read_interfaces(None).await {
        Ok(host) => Some(host),
        Err(e) => {
            view.notes.push(format!("the host's interfaces: {e}"));
            None
        }
    };
    let ready = list_sandboxes(
        cri,
        api::PodSandboxFilter {
            state: Some(api::PodSandboxStateValue {
                state: api::PodSandboxState::SandboxReady as i32,
            }),
            ..Default::default()
        },
    )
    .await?;
    for sandbox in ready {
        if let Some(link) = pod_link(cri, host.as_ref(), &sandbox, &mut view.notes).await {
            view.pods.push(link);
        }
    }
    view.pods
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let cached = cni_store::all_cached(at).await;
    if let Some(host) = &host {
        view.bridge = bridge(host, &view.pods, &cached);
        // As `ip route` shows them: IPv4.
        view.routes = host
            .routes
            .iter()
            .filter(|r| {
                r.destination.is_none_or(|(ip, _)| ip.is_ipv4())
                    && r.gateway.is_none_or(|g| g.is_ipv4())
            })
            .map(route_line)
            .collect();
    }
    view.pod_network_routes = pod_network_routes(at, &mut view.notes).await;
    view.pod_cidr = pod_cidr
        .or_else(|| cached.iter().flat_map(cni_store::Cached::subnets).next())
        .or_else(|| {
            view.bridge
                .as_ref()
                .and_then(|b| b.addresses.first())
                .map(|a| format!("{a} (the bridge's network)"))
        });
    Ok(view)
}

/// The routes the agent wrote down it programmed, each checked against the live tables.
async fn pod_network_routes(at: &Locations, notes: &mut Vec<String>) -> Option<RoutesView> {
    use crate::cni::routes::{IpRoute2, RouteOps, RoutesState, STATE_FILE, live_check};
    let state = match RoutesState::read(&at.root_dir.join(STATE_FILE)).await {
        Ok(state) => state?,
        Err(e) => {
            notes.push(format!("the pod network routes: {e}"));
            return None;
        }
    };
    let missing = match IpRoute2::default()
        .programmed(state.device.as_deref())
        .await
    {
        Ok(live) => Some(
            live_check(&state, &live)
                .into_iter()
                .map(|(_, missing)| missing.into_iter().map(str::to_owned).collect())
                .collect(),
        ),
        Err(e) => {
            notes.push(format!("the live pod network routes: {e}"));
            None
        }
    };
    Some(RoutesView { state, missing })
}

/// Who runs the CNI plugins: the agent when its thin plugin's conflist is in the
/// runtime's CNI conf dir, the runtime when other configs are there.
async fn network_owner(conf_dir: &Path) -> &'static str {
    let dir = conf_dir.to_owned();
    let names: Vec<String> = super::blocking(move || {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    })
    .await;
    if names.iter().any(|n| n == crate::cni::shim::CONFLIST_NAME) {
        "agent"
    } else if names
        .iter()
        .any(|n| n.ends_with(".conflist") || n.ends_with(".conf") || n.ends_with(".json"))
    {
        "runtime"
    } else {
        "unknown"
    }
}

async fn pod_link<C: Cri>(
    cri: &C,
    host: Option<&Interfaces>,
    sandbox: &api::PodSandbox,
    notes: &mut Vec<String>,
) -> Option<PodLink> {
    let metadata = sandbox.metadata.clone().unwrap_or_default();
    let pod = format!("{}/{}", metadata.namespace, metadata.name);
    let (status, info) = match sandbox_status(cri, &sandbox.id).await {
        Ok(s) => s,
        Err(e) => {
            notes.push(format!("pod {pod}: {e}"));
            return None;
        }
    };
    if on_host_network(&status) {
        return None;
    }
    let mut link = PodLink {
        namespace: metadata.namespace,
        name: metadata.name,
        sandbox_id: sandbox.id.clone(),
        pause_pid: info.pid,
        netns: info.netns_path(),
        ..PodLink::default()
    };
    let ip_of_status = status.network.map(|n| n.ip).filter(|ip| !ip.is_empty());
    let eth0 = match &link.netns {
        Some(netns) => match read_interfaces(Some(netns.clone())).await {
            Ok(inside) => inside.link_named(POD_IFNAME).cloned(),
            Err(e) => {
                notes.push(format!("pod {pod}'s network namespace: {e}"));
                None
            }
        },
        None => None,
    };
    link.ip = eth0
        .as_ref()
        .and_then(Link::ipv4)
        .map(super::netlink::Address::cidr)
        .or(ip_of_status);
    if let (Some(eth0), Some(host)) = (&eth0, host)
        && let Some(veth) = host_end(host, eth0)
    {
        link.host_veth = Some(veth.name);
        link.host_veth_index = Some(veth.index);
        link.bridge = veth.bridge;
    }
    Some(link)
}

/// The pods' bridge: the one their veths are attached to, else the bridge the CNI config
/// names.
fn bridge(host: &Interfaces, pods: &[PodLink], cached: &[cni_store::Cached]) -> Option<BridgeView> {
    let named_in_config = || {
        cached.iter().find_map(|c| {
            c.config["plugins"]
                .as_array()?
                .iter()
                .find(|p| p["type"] == "bridge")
                .map(|p| p["bridge"].as_str().unwrap_or("cni0").to_owned())
        })
    };
    let name = pods
        .iter()
        .find_map(|p| p.bridge.clone())
        .or_else(named_in_config)?;
    let bridge = host.link_named(&name)?;
    Some(BridgeView {
        name: bridge.name.clone(),
        index: bridge.index,
        mac: bridge.mac.clone(),
        mtu: bridge.mtu,
        addresses: bridge.cidrs(),
        ports: host
            .links
            .iter()
            .filter(|l| l.master == Some(bridge.index))
            .map(|l| l.name.clone())
            .collect(),
    })
}

/// A route as `ip route` prints it.
#[must_use]
pub fn route_line(route: &Route) -> String {
    let mut line = match route.destination {
        Some((ip, len)) => format!("{ip}/{len}"),
        None => "default".to_owned(),
    };
    if let Some(gw) = route.gateway {
        line.push_str(&format!(" via {gw}"));
    }
    match (&route.device_name, route.device) {
        (Some(name), _) => line.push_str(&format!(" dev {name}")),
        (None, Some(index)) => line.push_str(&format!(" dev if{index}")),
        (None, None) => {}
    }
    if route.protocol != "boot" {
        line.push_str(&format!(" proto {}", route.protocol));
    }
    if route.scope != "universe" {
        line.push_str(&format!(" scope {}", route.scope));
    }
    if let Some(src) = route.source {
        line.push_str(&format!(" src {src}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_print_as_ip_route_does() {
        let connected = Route {
            destination: Some(("10.244.0.0".parse().unwrap(), 24)),
            device_name: Some("cni0".into()),
            protocol: "kernel".into(),
            scope: "link".into(),
            source: Some("10.244.0.1".parse().unwrap()),
            ..Route::default()
        };
        assert_eq!(
            route_line(&connected),
            "10.244.0.0/24 dev cni0 proto kernel scope link src 10.244.0.1"
        );
        let default = Route {
            gateway: Some("198.18.0.1".parse().unwrap()),
            device: Some(2),
            protocol: "boot".into(),
            scope: "universe".into(),
            ..Route::default()
        };
        assert_eq!(route_line(&default), "default via 198.18.0.1 dev if2");
    }
}
