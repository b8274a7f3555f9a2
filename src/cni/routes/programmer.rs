//! The agent's side of the routes: [`Programmer`] turns the Node objects into the kernel
//! entries of the chosen backend and makes the kernel match them ([`Programmer::sync`]);
//! [`run`] drives it from a watch on every Node, resyncing periodically, and publishes
//! this node's VTEP MAC.
//!
//! Two guards keep a bad Node from hurting this one. A pod CIDR that would capture traffic
//! this node sends elsewhere (it overlaps this node's own pod CIDR or the network of the
//! interface holding the node IP, or holds a Node's address or the API server's) gets no
//! route: it is logged once and reported once as a Warning event [`POD_CIDR_REFUSED`] on
//! the offending Node, until it changes. And a change the kernel refuses is tried again
//! after its own back-off (2 s doubling to 5 min, forgotten once it succeeds or is no
//! longer wanted), not on every Node event of the cluster.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::program::{Change, Cidr, RouteOps, Underlay, device_plan, plan};
use super::remote::RemoteNode;
use super::state::{RemoteRoute, RoutesState, entries};
use super::{Mode, RoutesError, hostgw, vxlan};
use crate::backoff::Backoff;

/// How often the tables are compared with the Nodes even when no Node changed (flannel's
/// route check period), repairing whatever else changed them.
const RESYNC: Duration = Duration::from_secs(10);
/// How soon a sync that failed as a whole is tried again.
const RETRY: Duration = Duration::from_secs(2);
/// The back-off of one change the kernel refused: 2 s doubling to 5 min.
const CHANGE_BACKOFF: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(300));
/// The reason of the Warning event on a Node whose pod CIDR gets no route (rkubelet's own:
/// the kubelet programs no routes).
pub const POD_CIDR_REFUSED: &str = "PodCIDROverlap";

/// The Nodes other than `own` that have an IPv4 pod CIDR and an IPv4 InternalIP, by name.
/// (Two may claim one pod CIDR: [`Programmer::wanted`] refuses the second.)
#[must_use]
pub fn remote_nodes(nodes: &[Arc<Node>], own: &str) -> Vec<RemoteNode> {
    let mut remotes: Vec<RemoteNode> = nodes
        .iter()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|name| name != own))
        .filter_map(|node| {
            let spec = node.spec.as_ref()?;
            let pod_cidr = spec
                .pod_cidr
                .iter()
                .chain(spec.pod_cidrs.iter().flatten())
                .find_map(|c| c.parse::<Cidr>().ok())?
                .network();
            let ip = node
                .status
                .as_ref()?
                .addresses
                .iter()
                .flatten()
                .filter(|a| a.type_ == "InternalIP")
                .find_map(|a| a.address.parse().ok())?;
            Some(RemoteNode {
                name: node.metadata.name.clone()?,
                pod_cidr,
                ip,
                vtep_mac: vxlan::published_mac(node),
            })
        })
        .collect();
    remotes.sort_by(|a, b| a.name.cmp(&b.name));
    remotes
}

/// Every Node's IPv4 addresses, by Node name.
fn node_addresses(nodes: &[Arc<Node>]) -> Vec<(String, Ipv4Addr)> {
    nodes
        .iter()
        .flat_map(|node| {
            let name = node.metadata.name.clone().unwrap_or_default();
            node.status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .filter_map(move |a| Some((name.clone(), a.address.parse().ok()?)))
        })
        .collect()
}

/// The IPv4 addresses of the API server at `url`: its host if an address, else what the
/// name resolves to (within 5 s; none, with a warning, if it does not).
pub async fn api_server_addresses(url: &hyper::Uri) -> Vec<Ipv4Addr> {
    let host = url.host().unwrap_or_default();
    let port = url.port_u16().unwrap_or(443);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return match ip {
            IpAddr::V4(ip) => vec![ip],
            IpAddr::V6(_) => Vec::new(),
        };
    }
    let lookup = tokio::net::lookup_host((host, port));
    match tokio::time::timeout(Duration::from_secs(5), lookup).await {
        Ok(Ok(addresses)) => addresses
            .filter_map(|a| match a.ip() {
                IpAddr::V4(ip) => Some(ip),
                IpAddr::V6(_) => None,
            })
            .collect(),
        _ => {
            tracing::warn!(%url, "could not resolve the API server; pod CIDRs are not checked against its address");
            Vec::new()
        }
    }
}

/// What the programmer is set up with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The backend (not [`Mode::None`]).
    pub mode: Mode,
    /// This node's name.
    pub node_name: String,
    /// This node's IP.
    pub node_ip: IpAddr,
    /// This node's pod CIDR.
    pub pod_cidr: String,
    /// The API server's addresses, which no pod CIDR may hold.
    pub api_server: Vec<Ipv4Addr>,
}

/// Another Node's pod CIDR that gets no route: it would capture traffic this node sends
/// elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Refused {
    /// The Node.
    pub node: String,
    /// Its pod CIDR.
    pub pod_cidr: Cidr,
    /// What the pod CIDR would capture.
    pub captures: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pod CIDR {} of node {} {}: no route is programmed to it",
            self.pod_cidr, self.node, self.captures
        )
    }
}

/// What the Nodes call for: the ways to their pods, and the pod CIDRs refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// The ways to the other nodes' pods.
    pub routes: Vec<RemoteRoute>,
    /// The pod CIDRs that get none.
    pub refused: Vec<Refused>,
}

/// The outcome of one [`Programmer::sync`].
#[derive(Debug, Clone)]
pub struct SyncReport {
    /// How many changes were made (or tried).
    pub changes: usize,
    /// How many of them failed.
    pub failed: usize,
    /// How many were not tried: they wait for their back-off.
    pub deferred: usize,
    /// When the first change waiting for its back-off may be tried again.
    pub retry_at: Option<std::time::Instant>,
    /// What is wanted now.
    pub state: RoutesState,
}

/// Keeps this node's routes to the other nodes' pods.
#[derive(Debug)]
pub struct Programmer<O> {
    ops: O,
    mode: Mode,
    node_name: String,
    node_ip: Ipv4Addr,
    pod_cidr: Cidr,
    underlay: Underlay,
    vtep_mac: Option<String>,
    api_server: Vec<Ipv4Addr>,
    /// The changes the kernel refused, each with its back-off.
    retries: Vec<(Change, Backoff)>,
}

impl<O: RouteOps> Programmer<O> {
    /// Finds the interface holding the node IP and, for vxlan, sets up the VXLAN device
    /// (keeping an existing one that fits, and its MAC).
    ///
    /// # Errors
    /// The node IP or pod CIDR is not IPv4, no interface holds the node IP, or the device
    /// cannot be set up.
    pub async fn start(ops: O, settings: &Settings) -> Result<Self, RoutesError> {
        let IpAddr::V4(node_ip) = settings.node_ip else {
            return Err(RoutesError::NotIpv4 {
                what: "node IP",
                value: settings.node_ip.to_string(),
            });
        };
        let pod_cidr: Cidr = settings
            .pod_cidr
            .parse()
            .map_err(|_| RoutesError::NotIpv4 {
                what: "pod CIDR",
                value: settings.pod_cidr.clone(),
            })?;
        let underlay = ops.underlay(node_ip).await?;
        let mut programmer = Self {
            ops,
            mode: settings.mode,
            node_name: settings.node_name.clone(),
            node_ip,
            pod_cidr: pod_cidr.network(),
            underlay,
            vtep_mac: None,
            api_server: settings.api_server.clone(),
            retries: Vec::new(),
        };
        if programmer.mode == Mode::Vxlan {
            programmer.ensure_device().await?;
        }
        tracing::info!(mode = %programmer.mode, underlay = %programmer.underlay.name, mtu = programmer.underlay.mtu, vtep_mac = ?programmer.vtep_mac, "pod network routes set up");
        Ok(programmer)
    }

    /// The MTU the pods must use, when the backend lowers it (vxlan).
    #[must_use]
    pub fn pod_mtu(&self) -> Option<u32> {
        (self.mode == Mode::Vxlan).then(|| vxlan::mtu(&self.underlay))
    }

    /// This node's VTEP MAC (vxlan).
    #[must_use]
    pub fn vtep_mac(&self) -> Option<&str> {
        self.vtep_mac.as_deref()
    }

    /// This node's name.
    #[must_use]
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Creates or repairs the VXLAN device; notes its MAC.
    async fn ensure_device(&mut self) -> Result<(), RoutesError> {
        let spec = vxlan::spec(self.node_ip, &self.underlay, self.pod_cidr);
        let existing = self.ops.link(&spec.name).await?;
        for change in device_plan(existing.as_ref(), &spec) {
            self.ops.apply(&change).await?;
            tracing::info!(%change, "VXLAN device");
        }
        let device = |reason: &str| RoutesError::Device {
            device: spec.name.clone(),
            reason: reason.to_owned(),
        };
        let link = self
            .ops
            .link(&spec.name)
            .await?
            .ok_or_else(|| device("missing after it was set up"))?;
        if link.mac.is_empty() {
            return Err(device("it has no MAC"));
        }
        if self.vtep_mac.as_deref() != Some(link.mac.as_str()) {
            tracing::info!(device = %spec.name, mac = %link.mac, "VTEP MAC");
            self.vtep_mac = Some(link.mac);
        }
        Ok(())
    }

    /// What `nodes` call for: the ways to the other nodes' pods, but none to a pod CIDR
    /// that would capture traffic this node sends elsewhere, and none to a second Node
    /// claiming one pod CIDR (its route would flap between the two: the first by name
    /// keeps it).
    #[must_use]
    pub fn wanted(&self, nodes: &[Arc<Node>]) -> Wanted {
        let addresses = node_addresses(nodes);
        let mut wanted = Wanted::default();
        let mut claimed: std::collections::BTreeMap<Cidr, String> = Default::default();
        for remote in remote_nodes(nodes, &self.node_name) {
            let captures = match claimed.get(&remote.pod_cidr) {
                Some(first) => Some(format!("is claimed by node {first} already")),
                None => self.captures(remote.pod_cidr, &addresses),
            };
            if let Some(captures) = captures {
                wanted.refused.push(Refused {
                    node: remote.name,
                    pod_cidr: remote.pod_cidr,
                    captures,
                });
                continue;
            }
            claimed.insert(remote.pod_cidr, remote.name.clone());
            let route = match self.mode {
                Mode::None => None,
                Mode::HostGw => Some(hostgw::remote_route(&remote, &self.underlay.name)),
                Mode::Vxlan => vxlan::remote_route(&remote),
            };
            wanted.routes.extend(route);
        }
        wanted
    }

    /// What a route to `pod_cidr` would take from this node, if anything: its own pod
    /// CIDR, its network, a Node's address (of `addresses`), or the API server.
    fn captures(&self, pod_cidr: Cidr, addresses: &[(String, Ipv4Addr)]) -> Option<String> {
        if pod_cidr.overlaps(self.pod_cidr) {
            return Some(format!(
                "overlaps the pod CIDR {} of node {}",
                self.pod_cidr, self.node_name
            ));
        }
        if let Some(subnet) = self.underlay.subnets.iter().find(|s| s.overlaps(pod_cidr)) {
            return Some(format!(
                "overlaps the node network {subnet} on {}",
                self.underlay.name
            ));
        }
        if let Some((node, ip)) = addresses.iter().find(|(_, ip)| pod_cidr.contains(*ip)) {
            return Some(format!("holds the address {ip} of node {node}"));
        }
        self.api_server
            .iter()
            .find(|ip| pod_cidr.contains(**ip))
            .map(|ip| format!("holds the API server's address {ip}"))
    }

    /// Makes the kernel's tables carry the ways to the pods of `nodes`: reads what the
    /// agent has programmed, and changes only what differs. A change that fails is logged
    /// and counted, and waits for its back-off before it is tried again; the others are
    /// still made.
    ///
    /// # Errors
    /// The tables, or the VXLAN device, cannot be read or set up.
    pub async fn sync(&mut self, nodes: &[Arc<Node>]) -> Result<SyncReport, RoutesError> {
        self.sync_at(nodes, std::time::Instant::now()).await
    }

    /// [`Self::sync`] at `now`.
    async fn sync_at(
        &mut self,
        nodes: &[Arc<Node>],
        now: std::time::Instant,
    ) -> Result<SyncReport, RoutesError> {
        let device = if self.mode == Mode::Vxlan {
            self.ensure_device().await?;
            Some(vxlan::DEVICE)
        } else {
            None
        };
        let remotes = self.wanted(nodes).routes;
        let current = self.ops.programmed(device).await?;
        let changes = plan(&current, &entries(&remotes));
        // A change no longer wanted, or wanted otherwise, starts afresh.
        self.retries.retain(|(c, _)| changes.contains(c));
        let (mut failed, mut deferred) = (0, 0);
        for change in &changes {
            let retry = self.retries.iter().position(|(c, _)| c == change);
            if retry.is_some_and(|i| self.retries[i].1.waiting(now)) {
                deferred += 1;
                continue;
            }
            match self.ops.apply(change).await {
                Ok(()) => {
                    tracing::info!(%change, "pod network route");
                    if let Some(i) = retry {
                        self.retries.swap_remove(i);
                    }
                }
                Err(e) => {
                    failed += 1;
                    let i = retry.unwrap_or_else(|| {
                        let backoff = Backoff::new(CHANGE_BACKOFF.0, CHANGE_BACKOFF.1);
                        self.retries.push((change.clone(), backoff));
                        self.retries.len() - 1
                    });
                    let retry_in = self.retries[i].1.failed(now);
                    tracing::warn!(%change, error = %e, ?retry_in, "could not program a pod network route");
                }
            }
        }
        Ok(SyncReport {
            changes: changes.len(),
            failed,
            deferred,
            retry_at: self.retries.iter().filter_map(|(_, b)| b.until()).min(),
            state: RoutesState {
                mode: self.mode,
                underlay: self.underlay.name.clone(),
                device: device.map(str::to_owned),
                vtep_mac: self.vtep_mac.clone(),
                pod_mtu: self.pod_mtu(),
                remotes,
            },
        })
    }
}

/// Logs each pod CIDR of `refused` that is not in `reported` (refused already), and
/// reports it as a Warning event on its Node.
fn report_refused(
    refused: &[Refused],
    reported: &[Refused],
    store: &Store<Node>,
    client: &kube::Client,
    node_name: &str,
) {
    for r in refused.iter().filter(|r| !reported.contains(r)) {
        tracing::warn!(node = %r.node, pod_cidr = %r.pod_cidr, reason = POD_CIDR_REFUSED, "{r}");
        if let Some(node) = store.get(&ObjectRef::new(&r.node)) {
            let (client, reporter, message) = (client.clone(), node_name.to_owned(), r.to_string());
            tokio::spawn(async move {
                crate::events::warn_about_node(client, reporter, &node, POD_CIDR_REFUSED, &message)
                    .await;
            });
        }
    }
}

/// Publishes this node's VTEP MAC on its Node, if the Node lacks it.
async fn publish_mac(client: &kube::Client, node: &Node, mac: &str) -> Result<(), RoutesError> {
    let Some(patch) = vxlan::annotation_patch(node, mac) else {
        return Ok(());
    };
    let name = node.metadata.name.clone().unwrap_or_default();
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| RoutesError::Annotate {
            node: name.clone(),
            source,
        })?;
    tracing::info!(node = %name, mac, "VTEP MAC published");
    Ok(())
}

/// Keeps the routes in step with every Node until `cancel` fires: syncs once the Nodes are
/// listed (never from an empty list, which would remove every route), again whenever what
/// the Nodes call for changes, when a refused change's back-off ends, and every 10 s
/// (`RESYNC`); writes what it programmed to `state_file`; reports each refused pod CIDR
/// once. The routes stay when the agent stops.
pub async fn run<O: RouteOps>(
    programmer: Programmer<O>,
    client: kube::Client,
    state_file: PathBuf,
    cancel: CancellationToken,
) {
    let changed = Arc::new(tokio::sync::Notify::new());
    let (store, feed) =
        crate::node::nodes_lister(client.clone(), kube::runtime::watcher::Config::default(), {
            let changed = changed.clone();
            move || changed.notify_one()
        });
    let feed = tokio::spawn(feed);
    let nodes = Watched {
        store,
        changed,
        client,
    };
    follow(programmer, nodes, state_file, cancel).await;
    feed.abort();
}

/// The Nodes as the watch reflects them, a wake-up on every change, and the client that
/// publishes this node's VTEP MAC.
struct Watched {
    store: Store<Node>,
    changed: Arc<tokio::sync::Notify>,
    client: kube::Client,
}

/// [`run`]'s loop, on Nodes watched elsewhere.
async fn follow<O: RouteOps>(
    mut programmer: Programmer<O>,
    nodes: Watched,
    state_file: PathBuf,
    cancel: CancellationToken,
) {
    let Watched {
        store,
        changed,
        client,
    } = nodes;
    tokio::select! {
        () = cancel.cancelled() => return,
        ready = store.wait_until_ready() => if ready.is_err() { return },
    }
    let mut synced: Option<Vec<RemoteRoute>> = None;
    let mut written: Option<RoutesState> = None;
    let mut reported: Vec<Refused> = Vec::new();
    let mut next = tokio::time::Instant::now();
    // After a failed sync: the wait before the next one, doubling up to the resync period.
    let mut retry = RETRY;
    loop {
        let nodes = store.state();
        let Wanted {
            routes: wanted,
            refused,
        } = programmer.wanted(&nodes);
        report_refused(&refused, &reported, &store, &client, programmer.node_name());
        reported = refused;
        if tokio::time::Instant::now() >= next || synced.as_ref() != Some(&wanted) {
            let span = tracing::info_span!("pod_network_routes", nodes = nodes.len());
            next = tokio::time::Instant::now() + RESYNC;
            synced = None;
            match programmer.sync(&nodes).instrument(span).await {
                Ok(report) => {
                    // What is wanted, also when some of it failed: `inspect node` shows
                    // which entries are missing.
                    if written.as_ref() != Some(&report.state) {
                        match report.state.write(&state_file).await {
                            Ok(()) => written = Some(report.state.clone()),
                            Err(e) => {
                                tracing::warn!(error = %e, "could not write the pod network routes state")
                            }
                        }
                    }
                    // Refused changes wait for their back-off, not for the next Node event.
                    synced = Some(report.state.remotes);
                    retry = RETRY;
                    if let Some(at) = report.retry_at {
                        next = next.min(tokio::time::Instant::from_std(at));
                    }
                    if report.failed > 0 {
                        tracing::warn!(
                            failed = report.failed,
                            "some pod network routes could not be programmed"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?retry, "could not program the pod network routes");
                    next = tokio::time::Instant::now() + retry;
                    retry = (retry * 2).min(RESYNC);
                }
            }
        }
        if let (Some(mac), Some(own)) = (
            programmer.vtep_mac(),
            store.get(&ObjectRef::new(programmer.node_name())),
        ) && let Err(e) = publish_mac(&client, &own, mac).await
        {
            tracing::warn!(error = %e, "could not publish the VTEP MAC; retrying");
            next = next.min(tokio::time::Instant::now() + RETRY);
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = changed.notified() => {}
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};

    use super::*;
    use crate::cni::routes::program::{Change, FdbEntry, LinkState, Neighbour, Programmed, Route};
    use crate::cni::routes::{ROUTE_PROTOCOL, live_check};

    /// An in-memory kernel: routes of every protocol, neighbours, FDB and links, with the
    /// kernel's refusals (a second route to a destination, deleting a route of another
    /// protocol); every change made is recorded.
    #[derive(Default)]
    struct Kernel {
        routes: Vec<(Route, u8)>,
        neighbours: BTreeSet<Neighbour>,
        fdb: BTreeSet<FdbEntry>,
        links: BTreeMap<String, LinkState>,
        applied: Vec<Change>,
        macs: u8,
        /// Reads of the tables (each a process or three of `ip` and `bridge`).
        reads: usize,
    }

    #[derive(Clone, Default)]
    struct FakeOps(Arc<Mutex<Kernel>>);

    impl FakeOps {
        fn kernel(&self) -> std::sync::MutexGuard<'_, Kernel> {
            self.0.lock().unwrap()
        }
        fn applied(&self) -> Vec<String> {
            self.kernel()
                .applied
                .iter()
                .map(ToString::to_string)
                .collect()
        }
        fn take_applied(&self) -> Vec<String> {
            let all = self.applied();
            self.kernel().applied.clear();
            all
        }
        fn foreign_route(&self, dst: &str, via: &str) {
            self.kernel()
                .routes
                .push((route(dst, via, "eth0", false), 3));
        }
        fn all_routes(&self) -> Vec<(String, u8)> {
            self.kernel()
                .routes
                .iter()
                .map(|(r, p)| (Change::AddRoute(r.clone()).to_string(), *p))
                .collect()
        }
    }

    fn refused(message: &str) -> RoutesError {
        RoutesError::Failed {
            command: "fake".into(),
            message: message.into(),
        }
    }

    impl RouteOps for FakeOps {
        async fn underlay(&self, ip: Ipv4Addr) -> Result<Underlay, RoutesError> {
            if ip == Ipv4Addr::new(198, 18, 0, 11) {
                Ok(Underlay {
                    name: "eth0".into(),
                    mtu: 1500,
                    subnets: vec!["198.18.0.0/24".parse().unwrap()],
                })
            } else {
                Err(RoutesError::NoUnderlay { ip })
            }
        }

        async fn link(&self, name: &str) -> Result<Option<LinkState>, RoutesError> {
            Ok(self.kernel().links.get(name).cloned())
        }

        async fn programmed(&self, device: Option<&str>) -> Result<Programmed, RoutesError> {
            let mut k = self.kernel();
            k.reads += 1;
            let on = |dev: &str| Some(dev) == device;
            Ok(Programmed {
                routes: k
                    .routes
                    .iter()
                    .filter(|(_, p)| *p == ROUTE_PROTOCOL)
                    .map(|(r, _)| r.clone())
                    .collect(),
                neighbours: k
                    .neighbours
                    .iter()
                    .filter(|n| on(&n.dev))
                    .cloned()
                    .collect(),
                fdb: k.fdb.iter().filter(|e| on(&e.dev)).cloned().collect(),
            })
        }

        async fn apply(&self, change: &Change) -> Result<(), RoutesError> {
            let mut k = self.kernel();
            k.applied.push(change.clone());
            match change {
                Change::AddRoute(r) => {
                    if k.routes.iter().any(|(o, _)| o.dst == r.dst) {
                        return Err(refused("RTNETLINK answers: File exists"));
                    }
                    k.routes.push((r.clone(), ROUTE_PROTOCOL));
                }
                Change::ReplaceRoute(r) => {
                    k.routes.retain(|(o, _)| o.dst != r.dst);
                    k.routes.push((r.clone(), ROUTE_PROTOCOL));
                }
                Change::DeleteRoute(r) => {
                    let before = k.routes.len();
                    k.routes.retain(|(o, p)| !(o == r && *p == ROUTE_PROTOCOL));
                    if k.routes.len() == before {
                        return Err(refused("RTNETLINK answers: No such process"));
                    }
                }
                Change::SetNeighbour(n) => {
                    k.neighbours.retain(|o| (o.ip, &o.dev) != (n.ip, &n.dev));
                    k.neighbours.insert(n.clone());
                }
                Change::DeleteNeighbour(n) => {
                    k.neighbours.remove(n);
                }
                Change::SetFdb(e) => {
                    k.fdb.retain(|o| (&o.mac, &o.dev) != (&e.mac, &e.dev));
                    k.fdb.insert(e.clone());
                }
                Change::DeleteFdb(e) => {
                    k.fdb.remove(e);
                }
                Change::CreateVxlan(spec) => {
                    k.macs += 1;
                    let link = LinkState {
                        kind: Some("vxlan".into()),
                        vni: Some(spec.vni),
                        local: Some(spec.local),
                        port: Some(spec.port),
                        underlay: Some(spec.underlay.clone()),
                        mtu: 1500,
                        mac: format!("0a:00:00:00:00:{:02x}", k.macs),
                        ..LinkState::default()
                    };
                    k.links.insert(spec.name.clone(), link);
                }
                Change::DeleteLink(name) => {
                    k.links.remove(name);
                    k.routes.retain(|(r, _)| r.dev != *name);
                    k.neighbours.retain(|n| n.dev != *name);
                    k.fdb.retain(|e| e.dev != *name);
                }
                Change::SetMtu { dev, mtu } => k.links.get_mut(dev).unwrap().mtu = *mtu,
                Change::AddAddress { dev, address } => {
                    k.links.get_mut(dev).unwrap().addresses.push(*address);
                }
                Change::DeleteAddress { dev, address } => {
                    k.links
                        .get_mut(dev)
                        .unwrap()
                        .addresses
                        .retain(|a| a != address);
                }
                Change::SetUp(dev) => k.links.get_mut(dev).unwrap().up = true,
            }
            Ok(())
        }
    }

    fn route(dst: &str, via: &str, dev: &str, onlink: bool) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            via: via.parse().unwrap(),
            dev: dev.into(),
            onlink,
        }
    }

    fn node(name: &str, pod_cidr: Option<&str>, ip: &str, mac: Option<&str>) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        if let Some(mac) = mac {
            n.metadata.annotations = Some(BTreeMap::from([(
                vxlan::VTEP_MAC_ANNOTATION.to_owned(),
                mac.to_owned(),
            )]));
        }
        n.spec = Some(NodeSpec {
            pod_cidr: pod_cidr.map(str::to_owned),
            ..NodeSpec::default()
        });
        n.status = Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.into(),
                },
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.into(),
                },
            ]),
            ..NodeStatus::default()
        });
        Arc::new(n)
    }

    fn settings(mode: Mode) -> Settings {
        Settings {
            mode,
            node_name: "a".into(),
            node_ip: "198.18.0.11".parse().unwrap(),
            pod_cidr: "10.244.1.0/24".into(),
            api_server: vec!["172.16.0.10".parse().unwrap()],
        }
    }

    fn cluster() -> Vec<Arc<Node>> {
        vec![
            node(
                "a",
                Some("10.244.1.0/24"),
                "198.18.0.11",
                Some("0a:00:00:00:00:01"),
            ),
            node(
                "b",
                Some("10.244.2.0/24"),
                "198.18.0.12",
                Some("0a:00:00:00:00:b0"),
            ),
            node("c", Some("10.244.3.0/24"), "198.18.0.13", None),
            node("d", None, "198.18.0.14", None),
        ]
    }

    #[tokio::test]
    async fn host_gw_follows_nodes_added_changed_and_deleted() {
        let ops = FakeOps::default();
        let mut p = Programmer::start(ops.clone(), &settings(Mode::HostGw))
            .await
            .unwrap();
        assert_eq!(p.pod_mtu(), None);
        let mut nodes = cluster();
        let report = p.sync(&nodes).await.unwrap();
        assert_eq!((report.changes, report.failed), (2, 0));
        assert_eq!(
            ops.take_applied(),
            [
                "add route 10.244.2.0/24 via 198.18.0.12 dev eth0",
                "add route 10.244.3.0/24 via 198.18.0.13 dev eth0"
            ],
            "the node without a pod CIDR and this node itself get none"
        );
        // c moves to another IP: its route is replaced in place.
        nodes[2] = node("c", Some("10.244.3.0/24"), "198.18.0.23", None);
        p.sync(&nodes).await.unwrap();
        assert_eq!(
            ops.take_applied(),
            ["replace route 10.244.3.0/24 via 198.18.0.23 dev eth0"]
        );
        // c gets another pod CIDR: the old route goes, the new one comes.
        nodes[2] = node("c", Some("10.244.7.0/24"), "198.18.0.23", None);
        p.sync(&nodes).await.unwrap();
        assert_eq!(
            ops.take_applied(),
            [
                "delete route 10.244.3.0/24 via 198.18.0.23 dev eth0",
                "add route 10.244.7.0/24 via 198.18.0.23 dev eth0"
            ]
        );
        // b is deleted.
        nodes.remove(1);
        let report = p.sync(&nodes).await.unwrap();
        assert_eq!(
            ops.take_applied(),
            ["delete route 10.244.2.0/24 via 198.18.0.12 dev eth0"]
        );
        assert_eq!(report.state.remotes.len(), 1);
        assert_eq!(report.state.remotes[0].node, "c");
    }

    #[tokio::test]
    async fn a_restart_changes_nothing_that_is_right_and_repairs_drift() {
        for mode in [Mode::HostGw, Mode::Vxlan] {
            let ops = FakeOps::default();
            let mut first = Programmer::start(ops.clone(), &settings(mode))
                .await
                .unwrap();
            first.sync(&cluster()).await.unwrap();
            let mac = first.vtep_mac().map(str::to_owned);
            assert!(!ops.take_applied().is_empty());
            let mut again = Programmer::start(ops.clone(), &settings(mode))
                .await
                .unwrap();
            let report = again.sync(&cluster()).await.unwrap();
            assert_eq!(report.changes, 0, "{mode}: {:?}", ops.applied());
            assert!(ops.applied().is_empty(), "{mode}: {:?}", ops.applied());
            assert_eq!(
                again.vtep_mac(),
                mac.as_deref(),
                "{mode}: the device is kept"
            );
            // Somebody deletes a route of ours: the next sync puts it back, and only it.
            let lost = ops.kernel().routes.remove(0).0;
            again.sync(&cluster()).await.unwrap();
            assert_eq!(
                ops.take_applied(),
                [Change::AddRoute(lost).to_string()],
                "{mode}"
            );
        }
    }

    #[tokio::test]
    async fn routes_of_others_are_never_touched() {
        let ops = FakeOps::default();
        ops.foreign_route("10.99.0.0/24", "198.18.0.1");
        // Somebody else routes c's pod CIDR: ours cannot be added, and theirs stays.
        ops.foreign_route("10.244.3.0/24", "198.18.0.1");
        let mut p = Programmer::start(ops.clone(), &settings(Mode::HostGw))
            .await
            .unwrap();
        let report = p.sync(&cluster()).await.unwrap();
        assert_eq!((report.changes, report.failed), (2, 1));
        let routes = ops.all_routes();
        assert!(routes.contains(&("add route 10.99.0.0/24 via 198.18.0.1 dev eth0".into(), 3)));
        assert!(routes.contains(&("add route 10.244.3.0/24 via 198.18.0.1 dev eth0".into(), 3)));
        assert!(routes.contains(&(
            "add route 10.244.2.0/24 via 198.18.0.12 dev eth0".into(),
            ROUTE_PROTOCOL
        )));
        // With every node gone, only the agent's own route goes.
        ops.take_applied();
        p.sync(&cluster()[..1]).await.unwrap();
        assert_eq!(
            ops.take_applied(),
            ["delete route 10.244.2.0/24 via 198.18.0.12 dev eth0"]
        );
        assert_eq!(ops.all_routes().len(), 2);
    }

    #[tokio::test]
    async fn vxlan_programs_device_neighbour_fdb_and_route() {
        let ops = FakeOps::default();
        let mut p = Programmer::start(ops.clone(), &settings(Mode::Vxlan))
            .await
            .unwrap();
        assert_eq!(
            ops.take_applied(),
            [
                "create vxlan rkvx.1 id 1 local 198.18.0.11 dev eth0 dstport 8472",
                "set rkvx.1 mtu 1450",
                "add address 10.244.1.0/32 dev rkvx.1",
                "set rkvx.1 up"
            ]
        );
        assert_eq!(p.pod_mtu(), Some(1450));
        assert_eq!(p.vtep_mac(), Some("0a:00:00:00:00:01"));
        let mut nodes = cluster();
        p.sync(&nodes).await.unwrap();
        assert_eq!(
            ops.take_applied(),
            [
                "set fdb 0a:00:00:00:00:b0 dst 198.18.0.12 dev rkvx.1",
                "set neighbour 10.244.2.0 lladdr 0a:00:00:00:00:b0 dev rkvx.1",
                "add route 10.244.2.0/24 via 10.244.2.0 dev rkvx.1 onlink"
            ],
            "c has published no VTEP yet"
        );
        // b's agent re-created its device: a new MAC; the route stays as it is.
        nodes[1] = node(
            "b",
            Some("10.244.2.0/24"),
            "198.18.0.12",
            Some("0A:00:00:00:00:B1"),
        );
        p.sync(&nodes).await.unwrap();
        assert_eq!(
            ops.take_applied(),
            [
                "delete fdb 0a:00:00:00:00:b0 dst 198.18.0.12 dev rkvx.1",
                "set fdb 0a:00:00:00:00:b1 dst 198.18.0.12 dev rkvx.1",
                "set neighbour 10.244.2.0 lladdr 0a:00:00:00:00:b1 dev rkvx.1"
            ]
        );
        // b is deleted.
        nodes.remove(1);
        p.sync(&nodes).await.unwrap();
        assert_eq!(
            ops.take_applied(),
            [
                "delete route 10.244.2.0/24 via 10.244.2.0 dev rkvx.1 onlink",
                "delete neighbour 10.244.2.0 dev rkvx.1",
                "delete fdb 0a:00:00:00:00:b1 dst 198.18.0.12 dev rkvx.1"
            ]
        );
    }

    #[tokio::test]
    async fn a_lost_or_foreign_device_is_made_again_with_a_new_mac() {
        let ops = FakeOps::default();
        ops.kernel().links.insert(
            vxlan::DEVICE.into(),
            LinkState {
                kind: Some("vxlan".into()),
                vni: Some(2),
                mac: "0a:ff:00:00:00:01".into(),
                ..LinkState::default()
            },
        );
        let mut p = Programmer::start(ops.clone(), &settings(Mode::Vxlan))
            .await
            .unwrap();
        assert_eq!(ops.take_applied()[0], "delete link rkvx.1");
        let first = p.vtep_mac().unwrap().to_owned();
        assert_ne!(first, "0a:ff:00:00:00:01");
        p.sync(&cluster()).await.unwrap();
        ops.kernel().links.clear();
        ops.kernel().neighbours.clear();
        ops.kernel().fdb.clear();
        ops.kernel().routes.clear();
        p.sync(&cluster()).await.unwrap();
        assert_ne!(
            p.vtep_mac().unwrap(),
            first,
            "a new device, a new MAC to publish"
        );
        assert_eq!(ops.kernel().routes.len(), 1);
        assert_eq!(ops.kernel().fdb.len(), 1);
    }

    #[tokio::test]
    async fn ipv6_and_missing_underlays_are_refused() {
        let mut s = settings(Mode::HostGw);
        s.node_ip = "fd00::1".parse().unwrap();
        let Err(err) = Programmer::start(FakeOps::default(), &s).await else {
            panic!("started")
        };
        assert!(matches!(err, RoutesError::NotIpv4 { .. }), "{err}");
        let mut s = settings(Mode::HostGw);
        s.node_ip = "198.18.0.99".parse().unwrap();
        let Err(err) = Programmer::start(FakeOps::default(), &s).await else {
            panic!("started")
        };
        assert!(
            err.to_string()
                .contains("no interface holds the node IP 198.18.0.99"),
            "{err}"
        );
    }

    #[test]
    fn the_vtep_mac_is_published_only_when_it_differs() {
        let own = node(
            "a",
            Some("10.244.1.0/24"),
            "198.18.0.11",
            Some("0A:00:00:00:00:01"),
        );
        assert_eq!(vxlan::annotation_patch(&own, "0a:00:00:00:00:01"), None);
        let patch = vxlan::annotation_patch(&own, "0a:00:00:00:00:02").unwrap();
        assert_eq!(
            patch["metadata"]["annotations"][vxlan::VTEP_MAC_ANNOTATION],
            "0a:00:00:00:00:02"
        );
        let bad = node("b", Some("10.244.2.0/24"), "198.18.0.12", Some("not-a-mac"));
        assert_eq!(remote_nodes(&[bad], "a")[0].vtep_mac, None);
    }

    /// Two Nodes with one pod CIDR: the first by name gets the route, so it cannot flap;
    /// the second is refused.
    #[tokio::test]
    async fn a_pod_cidr_claimed_twice_goes_to_the_first_node_by_name() {
        let nodes = [
            node("c", Some("10.244.2.0/24"), "198.18.0.13", None),
            node("b", Some("10.244.2.0/24"), "198.18.0.12", None),
            node("d", Some("10.244.3.0/24"), "198.18.0.14", None),
        ];
        let p = Programmer::start(FakeOps::default(), &settings(Mode::HostGw))
            .await
            .unwrap();
        let wanted = p.wanted(&nodes);
        let names: Vec<&str> = wanted.routes.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(names, ["b", "d"]);
        assert_eq!(
            wanted.refused[0].to_string(),
            "pod CIDR 10.244.2.0/24 of node c is claimed by node b already: no route is programmed to it"
        );
    }

    #[tokio::test]
    async fn inspect_sees_what_is_missing_from_the_live_tables() {
        let ops = FakeOps::default();
        let mut p = Programmer::start(ops.clone(), &settings(Mode::Vxlan))
            .await
            .unwrap();
        let state = p.sync(&cluster()).await.unwrap().state;
        ops.kernel().fdb.clear();
        let live = ops.programmed(Some(vxlan::DEVICE)).await.unwrap();
        let checked = live_check(&state, &live);
        assert_eq!(checked.len(), 1);
        assert_eq!(checked[0].0.node, "b");
        assert_eq!(checked[0].1, ["fdb"]);
    }

    /// An API server that records the body of every request and answers it with an
    /// empty Node.
    async fn recording_api() -> (kube::Client, Requests) {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Requests = Arc::default();
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let record = record.clone();
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let record = record.clone();
                        async move {
                            let what = format!("{} {}", req.method(), req.uri().path());
                            let body = req.into_body().collect().await?.to_bytes();
                            let body = serde_json::from_slice(&body).unwrap_or_default();
                            record.lock().unwrap().push((what, body));
                            let node = serde_json::json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "a"}});
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(http_body_util::Full::new(hyper::body::Bytes::from(
                                    node.to_string(),
                                )))
                                .map_err(std::io::Error::other)
                                .map_err(Into::<Box<dyn std::error::Error + Send + Sync>>::into)
                        }
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), service),
                );
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        (kube::Client::try_from(config).unwrap(), seen)
    }

    /// Requests the recording API server got: what, and the body.
    type Requests = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

    /// [`follow`] running on a Node store that the test feeds, with a recording API server.
    struct Following {
        writer: kube::runtime::reflector::store::Writer<Node>,
        changed: Arc<tokio::sync::Notify>,
        requests: Requests,
        state_file: PathBuf,
        cancel: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        _dir: crate::cni::testutil::TempDir,
    }

    impl Following {
        async fn start(programmer: Programmer<FakeOps>) -> Self {
            let (client, requests) = recording_api().await;
            let (store, writer) = kube::runtime::reflector::store();
            let changed = Arc::new(tokio::sync::Notify::new());
            let dir = crate::cni::testutil::TempDir::new("routes");
            let state_file = dir.path().join(crate::cni::routes::STATE_FILE);
            let cancel = CancellationToken::new();
            let nodes = Watched {
                store,
                changed: changed.clone(),
                client,
            };
            let task = tokio::spawn(follow(
                programmer,
                nodes,
                state_file.clone(),
                cancel.clone(),
            ));
            Self {
                writer,
                changed,
                requests,
                state_file,
                cancel,
                task,
                _dir: dir,
            }
        }

        /// A watch event: into the store, and the loop woken.
        fn event(&mut self, e: kube::runtime::watcher::Event<Node>) {
            self.writer.apply_watcher_event(&e);
            self.changed.notify_one();
        }

        /// The first list of the watch: `nodes`.
        fn listed(&mut self, nodes: impl IntoIterator<Item = Node>) {
            use kube::runtime::watcher::Event;
            self.event(Event::Init);
            for node in nodes {
                self.event(Event::InitApply(node));
            }
            self.event(Event::InitDone);
        }

        async fn stop(self) {
            self.cancel.cancel();
            tokio::time::timeout(Duration::from_secs(2), self.task)
                .await
                .unwrap()
                .unwrap();
        }
    }

    /// Waits up to 2 s for a change starting with `prefix` (`what`) to be made.
    async fn added(ops: &FakeOps, what: &str, prefix: &str) {
        soon(what, || ops.applied().iter().any(|c| c.starts_with(prefix))).await;
    }

    /// Waits up to 2 s for `done`.
    async fn soon(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..100 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("not within 2 s: {what}");
    }

    #[tokio::test]
    async fn the_loop_waits_for_the_list_then_follows_node_events_and_publishes_the_mac() {
        use kube::runtime::watcher::Event;
        let ops = FakeOps::default();
        let programmer = Programmer::start(ops.clone(), &settings(Mode::Vxlan))
            .await
            .unwrap();
        let mac = programmer.vtep_mac().unwrap().to_owned();
        ops.take_applied();
        let mut following = Following::start(programmer).await;
        let (requests, state_file) = (following.requests.clone(), following.state_file.clone());
        let all: Vec<Node> = cluster().into_iter().map(|n| (*n).clone()).collect();
        let [mut own, b, c, _]: [Node; 4] = all.try_into().unwrap();
        // This node has not published its MAC yet.
        own.metadata.annotations = None;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            ops.applied().is_empty(),
            "synced before the Nodes were listed"
        );
        following.listed([own, b.clone()]);
        added(&ops, "b's route", "add route 10.244.2.0/24").await;
        soon("the state file", || state_file.exists()).await;
        soon("the MAC published", || {
            requests.lock().unwrap().iter().any(|(what, body)| {
                what == "PATCH /api/v1/nodes/a"
                    && body["metadata"]["annotations"][vxlan::VTEP_MAC_ANNOTATION] == mac.as_str()
            })
        })
        .await;
        let mut c = c;
        c.metadata.annotations = Some(BTreeMap::from([(
            vxlan::VTEP_MAC_ANNOTATION.to_owned(),
            "0a:00:00:00:00:c0".to_owned(),
        )]));
        following.event(Event::Apply(c));
        added(&ops, "c's route", "add route 10.244.3.0/24").await;
        following.event(Event::Delete(b));
        added(&ops, "b's route gone", "delete route 10.244.2.0/24").await;
        soon("the state file follows", || {
            std::fs::read_to_string(&state_file).is_ok_and(|t| !t.contains("10.244.2.0"))
        })
        .await;
        let state = RoutesState::read(&state_file).await.unwrap().unwrap();
        assert_eq!(state.vtep_mac.as_deref(), Some(mac.as_str()));
        following.stop().await;
    }

    /// A pod CIDR that would capture this node's own pods, its network, a Node's address or
    /// the API server gets no route, in either mode; the others do.
    #[tokio::test]
    async fn a_pod_cidr_that_would_capture_local_traffic_gets_no_route() {
        let nodes = [
            cluster()[0].clone(),
            node(
                "b",
                Some("10.244.2.0/24"),
                "198.18.0.12",
                Some("0a:00:00:00:00:b0"),
            ),
            node(
                "e",
                Some("10.244.1.128/25"),
                "198.18.0.15",
                Some("0a:00:00:00:00:e0"),
            ),
            node("f", Some("10.244.0.0/16"), "198.18.0.16", None),
            node("g", Some("198.18.0.128/25"), "198.18.0.17", None),
            node("h", Some("10.250.0.0/24"), "10.250.0.5", None),
            node("i", Some("10.251.0.0/24"), "198.18.0.19", None),
            node("j", Some("172.16.0.0/24"), "198.18.0.20", None),
        ];
        let mut extra = (*nodes[7]).clone();
        extra
            .status
            .as_mut()
            .unwrap()
            .addresses
            .as_mut()
            .unwrap()
            .push(NodeAddress {
                type_: "ExternalIP".into(),
                address: "10.251.0.9".into(),
            });
        let mut nodes = nodes.to_vec();
        nodes[7] = Arc::new(extra);
        for mode in [Mode::HostGw, Mode::Vxlan] {
            let ops = FakeOps::default();
            let mut p = Programmer::start(ops.clone(), &settings(mode))
                .await
                .unwrap();
            let wanted = p.wanted(&nodes);
            let routed: Vec<&str> = wanted.routes.iter().map(|r| r.node.as_str()).collect();
            assert_eq!(routed, ["b"], "{mode}");
            let refused: Vec<String> = wanted.refused.iter().map(ToString::to_string).collect();
            assert_eq!(
                refused,
                [
                    "pod CIDR 10.244.1.128/25 of node e overlaps the pod CIDR 10.244.1.0/24 of node a: no route is programmed to it",
                    "pod CIDR 10.244.0.0/16 of node f overlaps the pod CIDR 10.244.1.0/24 of node a: no route is programmed to it",
                    "pod CIDR 198.18.0.128/25 of node g overlaps the node network 198.18.0.0/24 on eth0: no route is programmed to it",
                    "pod CIDR 10.250.0.0/24 of node h holds the address 10.250.0.5 of node h: no route is programmed to it",
                    "pod CIDR 10.251.0.0/24 of node i holds the address 10.251.0.9 of node j: no route is programmed to it",
                    "pod CIDR 172.16.0.0/24 of node j holds the API server's address 172.16.0.10: no route is programmed to it",
                ],
                "{mode}"
            );
            ops.take_applied();
            p.sync(&nodes).await.unwrap();
            let added: Vec<String> = ops
                .take_applied()
                .into_iter()
                .filter(|c| c.contains("route"))
                .collect();
            assert_eq!(added.len(), 1, "{mode}: {added:?}");
            assert!(
                added[0].starts_with("add route 10.244.2.0/24"),
                "{mode}: {added:?}"
            );
        }
    }

    /// How often `change` was tried.
    fn tries(ops: &FakeOps, change: &str) -> usize {
        ops.applied()
            .iter()
            .filter(|c| c.as_str() == change)
            .count()
    }

    /// A route the kernel refuses is tried again only after its back-off (2 s, 4 s, ...),
    /// however often the Nodes are synced meanwhile; a change of the Node, or success,
    /// starts afresh; the others are made at once.
    #[tokio::test]
    async fn a_refused_route_waits_for_its_back_off() {
        let ops = FakeOps::default();
        // Somebody else routes c's pod CIDR: ours is refused ("File exists").
        ops.foreign_route("10.244.3.0/24", "198.18.0.1");
        let mut p = Programmer::start(ops.clone(), &settings(Mode::HostGw))
            .await
            .unwrap();
        let c_route = "add route 10.244.3.0/24 via 198.18.0.13 dev eth0";
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let report = p.sync_at(&cluster(), at(0)).await.unwrap();
        assert_eq!((report.failed, report.deferred), (1, 0));
        assert_eq!(report.retry_at, Some(at(2000)));
        // Twenty Node events within the first 2 s: no new attempt.
        for i in 0..20 {
            let report = p.sync_at(&cluster(), at(100 * i)).await.unwrap();
            assert_eq!((report.failed, report.deferred), (0, 1));
        }
        assert_eq!(tries(&ops, c_route), 1);
        let report = p.sync_at(&cluster(), at(2000)).await.unwrap();
        assert_eq!(report.failed, 1);
        assert_eq!(report.retry_at, Some(at(6000)), "doubled to 4 s");
        p.sync_at(&cluster(), at(5900)).await.unwrap();
        assert_eq!(tries(&ops, c_route), 2);
        p.sync_at(&cluster(), at(6000)).await.unwrap();
        assert_eq!(tries(&ops, c_route), 3);

        // c moves: the new route is another change, tried at once.
        let mut moved = cluster();
        moved[2] = node("c", Some("10.244.3.0/24"), "198.18.0.23", None);
        let report = p.sync_at(&moved, at(6100)).await.unwrap();
        assert_eq!((report.failed, report.deferred), (1, 0));
        assert_eq!(
            tries(&ops, "add route 10.244.3.0/24 via 198.18.0.23 dev eth0"),
            1
        );
        assert_eq!(p.retries.len(), 1, "the old change is forgotten");

        // The foreign route goes: once the back-off ends, the route is made, and nothing
        // waits any more.
        ops.kernel()
            .routes
            .retain(|(_, proto)| *proto == ROUTE_PROTOCOL);
        let report = p.sync_at(&moved, at(8100)).await.unwrap();
        assert_eq!((report.failed, report.deferred), (0, 0));
        assert_eq!(report.retry_at, None);
        assert!(p.retries.is_empty());
        let report = p.sync_at(&moved, at(8200)).await.unwrap();
        assert_eq!(report.changes, 0);
    }

    #[test]
    fn prefixes_overlap_when_one_holds_the_other() {
        let c = |s: &str| s.parse::<Cidr>().unwrap();
        assert!(c("10.244.1.0/24").overlaps(c("10.244.1.128/25")));
        assert!(c("10.244.1.128/25").overlaps(c("10.244.0.0/16")));
        assert!(c("0.0.0.0/0").overlaps(c("10.0.0.0/8")));
        assert!(!c("10.244.1.0/24").overlaps(c("10.244.2.0/24")));
        assert!(!c("10.244.1.0/25").overlaps(c("10.244.1.128/25")));
        assert!(c("10.244.1.0/24").contains("10.244.1.255".parse().unwrap()));
        assert!(!c("10.244.1.0/24").contains("10.244.2.0".parse().unwrap()));
    }

    /// While a route waits for its back-off, Node events that change nothing wanted read
    /// no tables (no `ip`/`bridge` process); a refused pod CIDR is reported once, as one
    /// Warning event on its Node, however often its Node changes otherwise.
    #[tokio::test]
    async fn node_events_neither_retry_a_refused_route_nor_repeat_a_refusal() {
        use kube::runtime::watcher::Event;
        let ops = FakeOps::default();
        ops.foreign_route("10.244.3.0/24", "198.18.0.1");
        let programmer = Programmer::start(ops.clone(), &settings(Mode::HostGw))
            .await
            .unwrap();
        let mut following = Following::start(programmer).await;
        let requests = following.requests.clone();
        let [own, b, c, _]: [Node; 4] = cluster()
            .into_iter()
            .map(|n| (*n).clone())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        let mut e = (*node("e", Some("10.244.1.128/25"), "198.18.0.15", None)).clone();
        e.metadata.uid = Some("uid-e".into());
        following.listed([own, b.clone(), c, e.clone()]);
        added(&ops, "b's route", "add route 10.244.2.0/24").await;
        let warnings = || {
            requests
                .lock()
                .unwrap()
                .iter()
                .filter(|(what, _)| what == "POST /api/v1/namespaces/default/events")
                .map(|(_, body)| body.clone())
                .collect::<Vec<_>>()
        };
        soon("the warning on e", || !warnings().is_empty()).await;
        let reads = ops.kernel().reads;
        // Heartbeats: b and e change, what is wanted does not.
        for i in 0..20 {
            for mut n in [b.clone(), e.clone()] {
                n.metadata.labels = Some(BTreeMap::from([("beat".to_owned(), i.to_string())]));
                following.event(Event::Apply(n));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            ops.kernel().reads,
            reads,
            "no sync for events that change nothing"
        );
        assert_eq!(
            tries(&ops, "add route 10.244.3.0/24 via 198.18.0.13 dev eth0"),
            1
        );
        let warnings = warnings();
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        let warning = &warnings[0];
        assert_eq!(warning["type"], "Warning");
        assert_eq!(warning["reason"], POD_CIDR_REFUSED);
        assert_eq!(warning["involvedObject"]["kind"], "Node");
        assert_eq!(warning["involvedObject"]["name"], "e");
        assert_eq!(warning["involvedObject"]["uid"], "uid-e");
        assert_eq!(warning["source"]["host"], "a");
        assert_eq!(
            warning["message"],
            "pod CIDR 10.244.1.128/25 of node e overlaps the pod CIDR 10.244.1.0/24 of node a: no route is programmed to it"
        );
        following.stop().await;
    }
}
