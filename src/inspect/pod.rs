//! `rkubelet inspect pod`: one pod as the node runs it — its sandbox and the pause
//! process holding its namespaces, the namespaces each container shares with it, its
//! network namespace with the veth pair and the bridge, its IP's host-local reservation,
//! the CNI result and port mappings with the NAT rules that carry them, and its
//! containers' processes, cgroups, logs, images and mounts.

use std::collections::HashMap;
use std::path::Path;

use super::netlink::{Interfaces, Link};
use super::view::{
    ContainerView, HostVeth, MountView, NamespaceView, PodNetwork, PodView, SandboxView,
};
use super::{InspectError, Locations, blocking, cni_store};
use crate::cri::{Cri, VerboseInfo, api};

/// The pod's interface in its network namespace.
pub const POD_IFNAME: &str = "eth0";

/// The runtime's sandboxes that match `filter`.
pub(super) async fn list_sandboxes<C: Cri>(
    cri: &C,
    filter: api::PodSandboxFilter,
) -> Result<Vec<api::PodSandbox>, InspectError> {
    cri.list_pod_sandbox(api::ListPodSandboxRequest {
        filter: Some(filter),
    })
    .await
    .map(|r| r.items)
    .map_err(|source| InspectError::Cri {
        what: "ListPodSandbox",
        source,
    })
}

/// The sandboxes of a pod, the newest ready one first.
async fn sandboxes<C: Cri>(
    cri: &C,
    namespace: &str,
    name: &str,
) -> Result<Vec<api::PodSandbox>, InspectError> {
    let labels = HashMap::from([
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
    ]);
    let filter = api::PodSandboxFilter {
        label_selector: labels,
        ..Default::default()
    };
    let mut found = list_sandboxes(cri, filter).await?;
    found.sort_by_key(|s| {
        (
            s.state != api::PodSandboxState::SandboxReady as i32,
            std::cmp::Reverse(s.created_at),
        )
    });
    Ok(found)
}

/// A sandbox's verbose status: the status, and what containerd's `info` adds.
pub(super) async fn sandbox_status<C: Cri>(
    cri: &C,
    id: &str,
) -> Result<(api::PodSandboxStatus, VerboseInfo), crate::cri::CriError> {
    let response = cri
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: true,
        })
        .await?;
    let info = VerboseInfo::parse(&response.info);
    Ok((response.status.unwrap_or_default(), info))
}

/// Whether the sandbox is on the host's network (no network namespace of its own).
pub(super) fn on_host_network(sandbox: &api::PodSandboxStatus) -> bool {
    sandbox
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network == api::NamespaceMode::Node as i32)
}

fn sandbox_state(state: i32) -> String {
    api::PodSandboxState::try_from(state)
        .map_or_else(|_| state.to_string(), |s| s.as_str_name().to_owned())
}

/// Reads one pod from the runtime and the system.
///
/// # Errors
/// The runtime cannot be asked, or has no sandbox of the pod.
pub async fn inspect<C: Cri>(
    cri: &C,
    at: &Locations,
    namespace: &str,
    name: &str,
) -> Result<PodView, InspectError> {
    let found = sandboxes(cri, namespace, name).await?;
    let Some((newest, older)) = found.split_first() else {
        return Err(InspectError::NoSandbox {
            pod: format!("{namespace}/{name}"),
        });
    };
    let mut view = PodView {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        other_sandboxes: older
            .iter()
            .map(|s| format!("{} {}", short(&s.id), sandbox_state(s.state)))
            .collect(),
        ..PodView::default()
    };
    let (sandbox, info) =
        sandbox_status(cri, &newest.id)
            .await
            .map_err(|source| InspectError::Cri {
                what: "PodSandboxStatus",
                source,
            })?;
    view.uid = sandbox.metadata.as_ref().map(|m| m.uid.clone());
    let host_network = on_host_network(&sandbox);
    view.sandbox = SandboxView {
        id: sandbox.id.clone(),
        state: sandbox_state(sandbox.state),
        created_at: crate::stats::rfc3339(sandbox.created_at),
        runtime_handler: newest.runtime_handler.clone(),
        pause_pid: info.pid,
        pause_image: info.image.clone(),
        netns_path: if host_network {
            None
        } else {
            info.netns_path()
        },
        namespaces: Vec::new(),
    };
    match info.pid {
        Some(pid) => match blocking({
            let proc = at.proc.clone();
            move || proc.namespaces_vs_host(pid, std::process::id())
        })
        .await
        {
            Ok(namespaces) => view.sandbox.namespaces = namespaces,
            Err(e) => view
                .notes
                .push(format!("the pause process {pid}'s namespaces: {e}")),
        },
        None => view.notes.push(
            "the runtime reports no pause process (the sandbox is stopped, or the runtime \
             gives no verbose status)"
                .into(),
        ),
    }
    if host_network {
        view.notes
            .push("the pod is on the host's network: no network namespace of its own".into());
    } else {
        view.network = Some(network(at, &view.sandbox, &mut view.notes).await);
    }
    view.containers = containers(cri, at, &view.sandbox, &mut view.notes).await?;
    Ok(view)
}

/// The pod's network namespace as netlink shows it, its veth's host end and bridge, and
/// what CNI left.
async fn network(at: &Locations, sandbox: &SandboxView, notes: &mut Vec<String>) -> PodNetwork {
    let mut net = PodNetwork::default();
    let netns = sandbox.netns_path.clone().or_else(|| {
        sandbox
            .pause_pid
            .map(|pid| at.proc.path(pid, "ns/net").display().to_string())
    });
    let inside = match netns {
        Some(path) => match read_interfaces(Some(path.clone())).await {
            Ok(i) => Some(i),
            Err(e) => {
                notes.push(format!("the pod's network namespace {path}: {e}"));
                None
            }
        },
        None => {
            notes.push("no network namespace path and no pause process to find it".into());
            None
        }
    };
    let eth0 = inside
        .as_ref()
        .and_then(|i| i.link_named(POD_IFNAME))
        .cloned();
    if let Some(inside) = inside {
        net.interfaces = inside.links;
        net.routes = inside.routes;
    }
    match &eth0 {
        Some(eth0) => match read_interfaces(None).await {
            Ok(host) => net.host_veth = host_end(&host, eth0),
            Err(e) => notes.push(format!("the host's interfaces: {e}")),
        },
        None => notes.push(format!("no {POD_IFNAME} in the pod's network namespace")),
    }
    if eth0.is_some() && net.host_veth.is_none() {
        notes.push(format!(
            "the host end of {POD_IFNAME}'s veth pair is not in the host's network namespace"
        ));
    }
    match cni_store::cached(at, &sandbox.id, POD_IFNAME).await {
        Some(cached) => {
            let ip = eth0.as_ref().and_then(Link::ipv4).map(|a| a.address);
            net.reservation = match ip {
                Some(ip) => cni_store::reservation(&cached, ip).await,
                None => None,
            };
            if net.reservation.is_none() {
                notes.push("no host-local reservation found for the pod's IP".into());
            }
            net.port_rules = cni_store::nat_rules(&sandbox.id).await.unwrap_or_else(|e| {
                notes.push(format!("the NAT rules: {e}"));
                Vec::new()
            });
            net.cni_cache = Some(format!("{} ({})", cached.path.display(), cached.owner));
            net.cni_result = Some(cached.result);
            net.port_mappings = cached.port_mappings;
        }
        None => notes.push(format!(
            "no CNI cache entry for sandbox {} in {} or {}",
            short(&sandbox.id),
            at.agent_cni_cache().display(),
            at.runtime_cni_cache().display()
        )),
    }
    net
}

/// The host end of `eth0`'s veth pair: the host link whose index is `eth0`'s peer and
/// whose own peer is `eth0`, with the bridge it is attached to.
pub(super) fn host_end(host: &Interfaces, eth0: &Link) -> Option<HostVeth> {
    let veth = host
        .link(eth0.peer_index?)
        .filter(|l| l.peer_index == Some(eth0.index))?;
    let bridge = veth.master.and_then(|m| host.link(m));
    Some(HostVeth {
        name: veth.name.clone(),
        index: veth.index,
        mac: veth.mac.clone(),
        bridge: bridge.map(|b| b.name.clone()),
        bridge_addresses: bridge.map(Link::cidrs).unwrap_or_default(),
    })
}

/// The interfaces of a network namespace (the host's when `None`).
pub(super) async fn read_interfaces(netns: Option<String>) -> Result<Interfaces, String> {
    blocking(move || super::netlink::read(netns.as_deref().map(Path::new)))
        .await
        .map_err(|e| e.to_string())
}

async fn containers<C: Cri>(
    cri: &C,
    at: &Locations,
    sandbox: &SandboxView,
    notes: &mut Vec<String>,
) -> Result<Vec<ContainerView>, InspectError> {
    let mut listed = cri
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                pod_sandbox_id: sandbox.id.clone(),
                ..Default::default()
            }),
        })
        .await
        .map_err(|source| InspectError::Cri {
            what: "ListContainers",
            source,
        })?
        .containers;
    listed.sort_by(|a, b| {
        let name = |c: &api::Container| c.metadata.as_ref().map(|m| m.name.clone());
        let attempt = |c: &api::Container| c.metadata.as_ref().map_or(0, |m| m.attempt);
        name(a).cmp(&name(b)).then(attempt(b).cmp(&attempt(a)))
    });
    let mut views = Vec::new();
    for container in listed {
        let response = match cri
            .container_status(api::ContainerStatusRequest {
                container_id: container.id.clone(),
                verbose: true,
            })
            .await
        {
            Ok(r) => r,
            Err(e) => {
                notes.push(format!("container {}: {e}", short(&container.id)));
                continue;
            }
        };
        let info = VerboseInfo::parse(&response.info);
        let status = response.status.unwrap_or_default();
        let metadata = status.metadata.clone().unwrap_or_default();
        let mut view = ContainerView {
            name: metadata.name,
            id: status.id.clone(),
            attempt: metadata.attempt,
            state: api::ContainerState::try_from(status.state)
                .map_or_else(|_| status.state.to_string(), |s| s.as_str_name().to_owned()),
            pid: info.pid,
            image: status.image.map(|i| i.image).unwrap_or_default(),
            image_id: status.image_ref,
            log_path: status.log_path,
            cgroup: None,
            shared_namespaces: Vec::new(),
            own_namespaces: Vec::new(),
            mounts: status
                .mounts
                .iter()
                .map(|m| MountView {
                    source: m.host_path.clone(),
                    destination: m.container_path.clone(),
                    read_only: m.readonly,
                })
                .collect(),
        };
        if let Some(pid) = info.pid {
            let proc = at.proc.clone();
            let (namespaces, cgroup) =
                blocking(move || (proc.namespaces(pid), proc.cgroup(pid))).await;
            view.cgroup = cgroup;
            match namespaces {
                Ok(own) => {
                    (view.shared_namespaces, view.own_namespaces) =
                        shared_with(&sandbox.namespaces, &own);
                }
                Err(e) => notes.push(format!("container {}'s namespaces: {e}", view.name)),
            }
        }
        if view.cgroup.is_none() {
            view.cgroup = info.spec["linux"]["cgroupsPath"]
                .as_str()
                .map(str::to_owned);
        }
        views.push(view);
    }
    Ok(views)
}

/// The kinds a container shares with the pause process, and those it has of its own.
fn shared_with(pause: &[NamespaceView], own: &[NamespaceView]) -> (Vec<String>, Vec<String>) {
    own.iter()
        .map(|ns| {
            let same = pause
                .iter()
                .any(|p| p.kind == ns.kind && p.inode == ns.inode);
            (ns.kind.clone(), same)
        })
        .fold(
            (Vec::new(), Vec::new()),
            |(mut shared, mut mine), (kind, same)| {
                if same {
                    shared.push(kind);
                } else {
                    mine.push(kind);
                }
                (shared, mine)
            },
        )
}

/// An id cut to 12 characters, as `crictl` shows them.
pub(super) fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::super::netlink::Address;
    use super::*;

    fn link(index: u32, name: &str, peer: Option<u32>, master: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            peer_index: peer,
            master,
            ..Link::default()
        }
    }

    #[test]
    fn the_host_end_is_the_peer_that_points_back() {
        let mut bridge = link(3, "cni0", None, None);
        bridge.addresses.push(Address {
            address: "10.88.0.1".parse().unwrap(),
            prefix_len: 24,
            scope: "universe".into(),
        });
        let host = Interfaces {
            links: vec![
                bridge,
                link(7, "veth1234", Some(2), Some(3)),
                link(8, "vethother", Some(5), Some(3)),
            ],
            routes: Vec::new(),
        };
        let veth = host_end(&host, &link(2, "eth0", Some(7), None)).expect("found");
        assert_eq!(veth.name, "veth1234");
        assert_eq!(veth.bridge.as_deref(), Some("cni0"));
        assert_eq!(veth.bridge_addresses, ["10.88.0.1/24"]);
        // An index that is some other pod's veth on the host is not ours.
        assert_eq!(host_end(&host, &link(2, "eth0", Some(8), None)), None);
        assert_eq!(host_end(&host, &link(2, "eth0", None, None)), None);
    }

    #[test]
    fn namespaces_are_split_into_shared_and_own() {
        let ns = |kind: &str, inode| NamespaceView {
            kind: kind.into(),
            inode,
            host: false,
        };
        let pause = [ns("net", 1), ns("ipc", 2), ns("uts", 3), ns("pid", 4)];
        let own = [
            ns("net", 1),
            ns("ipc", 2),
            ns("uts", 3),
            ns("pid", 9),
            ns("mnt", 10),
        ];
        assert_eq!(
            shared_with(&pause, &own),
            (
                vec!["net".into(), "ipc".into(), "uts".into()],
                vec!["pid".into(), "mnt".into()]
            )
        );
    }
}
