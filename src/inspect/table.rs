//! The human-readable form of what `rkubelet inspect` reports: aligned tables and
//! indented sections, as `kubectl describe` and `crictl inspect` users read them.

use std::fmt::Write;

use super::netlink::Link;
use super::node::route_line;
use super::pod::short;
use super::view::{NodeView, PodView, RoutesView};
use crate::timeline::PodTimeline;

/// Rows of cells, aligned into columns (the last one unpadded).
fn columns(rows: &[Vec<String>], indent: &str) -> String {
    let widths: Vec<usize> = (0..rows.iter().map(Vec::len).max().unwrap_or(0))
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = indent.to_owned();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn cells<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| (*c).to_owned()).collect()
}

fn or_dash(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn addresses(link: &Link) -> String {
    let all = link.cidrs();
    if all.is_empty() {
        "-".into()
    } else {
        all.join(",")
    }
}

fn notes(out: &mut String, notes: &[String]) {
    if !notes.is_empty() {
        out.push_str("\nNot seen:\n");
        for note in notes {
            let _ = writeln!(out, "  - {note}");
        }
    }
}

/// `rkubelet inspect pod`'s table.
#[must_use]
pub fn pod(view: &PodView) -> String {
    let mut out = String::new();
    let s = &view.sandbox;
    let _ = writeln!(
        out,
        "Pod {}/{} (uid {})",
        view.namespace,
        view.name,
        or_dash(view.uid.as_ref())
    );
    let _ = writeln!(
        out,
        "Sandbox {} {}, created {}, runtime handler {}",
        short(&s.id),
        s.state,
        s.created_at,
        if s.runtime_handler.is_empty() {
            "(default)"
        } else {
            &s.runtime_handler
        }
    );
    let _ = writeln!(
        out,
        "  pause process: PID {}, image {}",
        or_dash(s.pause_pid),
        or_dash(s.pause_image.as_ref())
    );
    let _ = writeln!(
        out,
        "  network namespace: {}",
        or_dash(s.netns_path.as_ref())
    );
    for other in &view.other_sandboxes {
        let _ = writeln!(out, "  older sandbox: {other}");
    }
    out.push_str("\nNamespaces of the pause process, and the containers sharing them:\n");
    let mut rows = vec![cells(["KIND", "INODE", "SHARED BY"])];
    for ns in &s.namespaces {
        let sharing: Vec<&str> = view
            .containers
            .iter()
            .filter(|c| c.shared_namespaces.contains(&ns.kind))
            .map(|c| c.name.as_str())
            .collect();
        rows.push(vec![
            ns.kind.clone(),
            if ns.host {
                format!("{} (the host's)", ns.inode)
            } else {
                ns.inode.to_string()
            },
            if sharing.is_empty() {
                "-".into()
            } else {
                sharing.join(",")
            },
        ]);
    }
    out.push_str(&columns(&rows, "  "));
    if let Some(net) = &view.network {
        out.push_str("\nInside the pod's network namespace:\n");
        let mut rows = vec![cells([
            "IF",
            "INDEX",
            "KIND",
            "MAC",
            "MTU",
            "STATE",
            "PEER INDEX",
            "ADDRESSES",
        ])];
        for l in &net.interfaces {
            rows.push(vec![
                l.name.clone(),
                l.index.to_string(),
                or_dash(l.kind.as_ref()),
                or_dash(l.mac.as_ref()),
                l.mtu.to_string(),
                l.oper_state.clone(),
                or_dash(l.peer_index),
                addresses(l),
            ]);
        }
        out.push_str(&columns(&rows, "  "));
        let ipv4 = |r: &&super::netlink::Route| {
            r.destination.is_none_or(|(ip, _)| ip.is_ipv4())
                && r.gateway.is_none_or(|g| g.is_ipv4())
        };
        for route in net.routes.iter().filter(ipv4) {
            let _ = writeln!(out, "  route: {}", route_line(route));
        }
        out.push_str("\nOn the host:\n");
        if let Some(veth) = &net.host_veth {
            let _ = writeln!(
                out,
                "  veth {} (ifindex {}, MAC {}) attached to bridge {} ({})",
                veth.name,
                veth.index,
                or_dash(veth.mac.as_ref()),
                or_dash(veth.bridge.as_ref()),
                veth.bridge_addresses.join(",")
            );
        }
        if let Some(r) = &net.reservation {
            let _ = writeln!(
                out,
                "  host-local reservation: {} held by {}",
                r.path, r.holder
            );
        }
        if let Some(cache) = &net.cni_cache {
            let _ = writeln!(out, "  CNI result cached in {cache}:");
            let result = net
                .cni_result
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            let _ = writeln!(out, "    {result}");
        }
        for m in &net.port_mappings {
            let _ = writeln!(
                out,
                "  port mapping: host {}:{} -> pod {} {}",
                m["hostIP"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("0.0.0.0"),
                m["hostPort"],
                m["containerPort"],
                m["protocol"].as_str().unwrap_or("tcp")
            );
        }
        for rule in &net.port_rules {
            let _ = writeln!(out, "  nat: {rule}");
        }
    }
    out.push_str("\nContainers:\n");
    let mut rows = vec![cells(["NAME", "ID", "ATTEMPT", "STATE", "PID", "IMAGE"])];
    for c in &view.containers {
        rows.push(vec![
            c.name.clone(),
            short(&c.id).to_owned(),
            c.attempt.to_string(),
            c.state.clone(),
            or_dash(c.pid),
            c.image.clone(),
        ]);
    }
    out.push_str(&columns(&rows, "  "));
    for c in &view.containers {
        let _ = writeln!(out, "  {} ({}):", c.name, short(&c.id));
        let _ = writeln!(out, "    image id: {}", c.image_id);
        let _ = writeln!(out, "    log: {}", c.log_path);
        let _ = writeln!(out, "    cgroup: {}", or_dash(c.cgroup.as_ref()));
        let _ = writeln!(
            out,
            "    namespaces shared with pause: {}; its own: {}",
            c.shared_namespaces.join(","),
            c.own_namespaces.join(",")
        );
        for m in &c.mounts {
            let _ = writeln!(
                out,
                "    mount {} -> {}{}",
                m.source,
                m.destination,
                if m.read_only { " (ro)" } else { "" }
            );
        }
    }
    notes(&mut out, &view.notes);
    out
}

/// `rkubelet inspect node`'s table.
#[must_use]
pub fn node(view: &NodeView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Node {}", or_dash(view.node_name.as_ref()));
    let _ = writeln!(out, "  pod CIDR: {}", or_dash(view.pod_cidr.as_ref()));
    let _ = writeln!(out, "  CNI plugins run by: {}", view.network_owner);
    match &view.bridge {
        Some(b) => {
            let _ = writeln!(
                out,
                "  bridge {} (ifindex {}, MAC {}, MTU {}): {}",
                b.name,
                b.index,
                or_dash(b.mac.as_ref()),
                b.mtu,
                b.addresses.join(",")
            );
            let _ = writeln!(out, "    ports: {}", b.ports.join(" "));
        }
        None => out.push_str("  bridge: none found\n"),
    }
    out.push_str("\nPods:\n");
    let mut rows = vec![cells([
        "POD",
        "SANDBOX",
        "PAUSE PID",
        "IP",
        "HOST VETH",
        "BRIDGE",
        "NETNS",
    ])];
    for p in &view.pods {
        rows.push(vec![
            format!("{}/{}", p.namespace, p.name),
            short(&p.sandbox_id).to_owned(),
            or_dash(p.pause_pid),
            or_dash(p.ip.as_ref()),
            match (&p.host_veth, p.host_veth_index) {
                (Some(name), Some(index)) => format!("{name} ({index})"),
                _ => "-".into(),
            },
            or_dash(p.bridge.as_ref()),
            or_dash(p.netns.as_ref()),
        ]);
    }
    out.push_str(&columns(&rows, "  "));
    if let Some(routes) = &view.pod_network_routes {
        pod_network_routes(&mut out, routes);
    }
    out.push_str("\nHost routes:\n");
    for r in &view.routes {
        let _ = writeln!(out, "  {r}");
    }
    notes(&mut out, &view.notes);
    out
}

fn pod_network_routes(out: &mut String, routes: &RoutesView) {
    let s = &routes.state;
    let _ = write!(
        out,
        "\nRoutes to other nodes' pods ({} over {}",
        s.mode, s.underlay
    );
    if let Some(device) = &s.device {
        let _ = write!(
            out,
            ", device {device} VTEP {}",
            or_dash(s.vtep_mac.as_ref())
        );
    }
    if let Some(mtu) = s.pod_mtu {
        let _ = write!(out, ", pod MTU {mtu}");
    }
    out.push_str("):\n");
    let mut rows = vec![cells(["NODE", "POD CIDR", "VIA", "DEVICE", "MAC", "LIVE"])];
    for (i, r) in s.remotes.iter().enumerate() {
        let live = match routes.missing.as_ref().and_then(|m| m.get(i)) {
            None => "unknown".to_owned(),
            Some(missing) if missing.is_empty() => "programmed".to_owned(),
            Some(missing) => format!("missing {}", missing.join(",")),
        };
        rows.push(vec![
            r.node.clone(),
            r.pod_cidr.to_string(),
            r.via.to_string(),
            r.device.clone(),
            or_dash(r.mac.as_ref()),
            live,
        ]);
    }
    out.push_str(&columns(&rows, "  "));
}

/// `rkubelet inspect timeline`'s table.
#[must_use]
pub fn timeline(t: &PodTimeline) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Start-up of pod {}/{} (uid {}), seen {}",
        t.namespace, t.name, t.uid, t.seen
    );
    let _ = match t.ready_ms {
        Some(ready) => writeln!(out, "Ready acknowledged by the API at {ready:.1} ms"),
        None => writeln!(out, "Not reported Ready yet"),
    };
    let mut rows = vec![cells(["START ms", "DURATION ms", "STEP"])];
    for step in &t.steps {
        rows.push(vec![
            format!("{:>9.1}", step.start_ms),
            format!("{:>11.1}", step.duration_ms),
            format!("{}{}", "  ".repeat(usize::from(step.depth)), step.label()),
        ]);
    }
    out.push_str(&columns(&rows, "  "));
    if t.dropped_steps > 0 {
        let _ = writeln!(out, "  ({} later steps not kept)", t.dropped_steps);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Step;

    #[test]
    fn columns_align_and_the_timeline_indents_by_depth() {
        let t = PodTimeline {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "web".into(),
            seen: "2026-11-23T12:00:00Z".into(),
            steps: vec![
                Step {
                    name: "sync_pod".into(),
                    fields: [("operation".to_owned(), "create".to_owned())].into(),
                    start_ms: 0.5,
                    duration_ms: 812.25,
                    depth: 0,
                },
                Step {
                    name: "run_pod_sandbox".into(),
                    fields: Default::default(),
                    start_ms: 10.0,
                    duration_ms: 300.0,
                    depth: 1,
                },
            ],
            ready_ms: Some(1500.0),
            dropped_steps: 0,
        };
        let text = timeline(&t);
        assert!(
            text.contains("Ready acknowledged by the API at 1500.0 ms"),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[3].ends_with("sync_pod create"), "{text}");
        assert!(lines[4].ends_with("  run_pod_sandbox"), "{text}");
        let step_col = |l: &str| l.find("sync_pod").or_else(|| l.find("  run_pod")).unwrap();
        assert_eq!(step_col(lines[3]), step_col(lines[4]), "aligned:\n{text}");
    }

    #[test]
    fn the_routes_to_other_nodes_show_what_is_live() {
        use crate::cni::routes::{Mode, RemoteRoute, RoutesState};
        let remote = |node: &str, n: u8| RemoteRoute {
            node: node.into(),
            node_ip: std::net::Ipv4Addr::new(198, 18, 0, 10 + n),
            pod_cidr: format!("10.244.{n}.0/24").parse().unwrap(),
            via: std::net::Ipv4Addr::new(10, 244, n, 0),
            device: "rkvx.1".into(),
            mac: Some(format!("0a:00:00:00:00:0{n}")),
        };
        let view = NodeView {
            pod_network_routes: Some(RoutesView {
                state: RoutesState {
                    mode: Mode::Vxlan,
                    underlay: "eth0".into(),
                    device: Some("rkvx.1".into()),
                    vtep_mac: Some("0a:00:00:00:00:01".into()),
                    pod_mtu: Some(1450),
                    remotes: vec![remote("b", 2), remote("c", 3)],
                },
                missing: Some(vec![vec![], vec!["fdb".into()]]),
            }),
            ..NodeView::default()
        };
        let text = node(&view);
        assert!(
            text.contains("Routes to other nodes' pods (vxlan over eth0, device rkvx.1 VTEP 0a:00:00:00:00:01, pod MTU 1450):"),
            "{text}"
        );
        let row = |name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            row("b "),
            [
                "b",
                "10.244.2.0/24",
                "10.244.2.0",
                "rkvx.1",
                "0a:00:00:00:00:02",
                "programmed"
            ]
        );
        assert_eq!(row("c ")[5..], ["missing", "fdb"]);
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["podNetworkRoutes"]["mode"], "vxlan");
        assert_eq!(
            json["podNetworkRoutes"]["remotes"][1]["podCidr"],
            "10.244.3.0/24"
        );
        let back: NodeView = serde_json::from_value(json).unwrap();
        assert_eq!(back, view);
    }
}
