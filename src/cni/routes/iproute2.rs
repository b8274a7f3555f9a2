//! [`RouteOps`] through iproute2: `ip -json` and `bridge -json` to read, `ip` and `bridge`
//! to change, run as child processes (never blocking the runtime), optionally in a named
//! network namespace (`ip -n <netns>`).

use std::net::Ipv4Addr;

use serde_json::Value;

use super::program::{
    Change, Cidr, FdbEntry, LinkState, Neighbour, Programmed, Route, RouteOps, Underlay,
};
use super::{ROUTE_PROTOCOL, RoutesError};

/// iproute2 in the agent's network namespace, or in the named one.
#[derive(Debug, Clone, Default)]
pub struct IpRoute2 {
    netns: Option<String>,
}

impl IpRoute2 {
    /// iproute2 aimed at the network namespace `name` (as `ip netns add` made it).
    #[must_use]
    pub fn in_netns(name: &str) -> Self {
        Self {
            netns: Some(name.to_owned()),
        }
    }

    async fn run(&self, program: &str, args: &[String]) -> Result<String, RoutesError> {
        let mut all: Vec<&str> = Vec::new();
        if let Some(netns) = &self.netns {
            all.extend(["-n", netns]);
        }
        all.extend(args.iter().map(String::as_str));
        run(program, &all).await
    }

    async fn json(&self, program: &str, args: &[&str]) -> Result<Vec<Value>, RoutesError> {
        let args: Vec<String> = std::iter::once("-json")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect();
        let text = self.run(program, &args).await?;
        if text.trim().is_empty() {
            return Ok(Vec::new());
        }
        serde_json::from_str(&text).map_err(|e| RoutesError::Output {
            command: format!("{program} {}", args.join(" ")),
            reason: e.to_string(),
        })
    }
}

/// Runs `program args` and answers its standard output; a non-zero exit is an error with
/// its standard error.
///
/// # Errors
/// [`RoutesError::Spawn`] or [`RoutesError::Failed`].
pub async fn run(program: &str, args: &[&str]) -> Result<String, RoutesError> {
    let command = format!("{program} {}", args.join(" "));
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| RoutesError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(RoutesError::Failed {
            command,
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn flags_of(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_ascii_lowercase)
                .collect()
        })
        .unwrap_or_default()
}

/// The routes of `ip -json route show proto 211`.
fn parse_routes(entries: &[Value]) -> Vec<Route> {
    entries
        .iter()
        .filter_map(|r| {
            Some(Route {
                dst: str_of(r, "dst")?.parse().ok()?,
                via: str_of(r, "gateway")?.parse().ok()?,
                dev: str_of(r, "dev")?.to_owned(),
                onlink: flags_of(r, "flags").iter().any(|f| f == "onlink"),
            })
        })
        .collect()
}

/// The permanent neighbours of `ip -json neigh show dev <dev> nud permanent`.
fn parse_neighbours(entries: &[Value], dev: &str) -> Vec<Neighbour> {
    entries
        .iter()
        .filter_map(|n| {
            Some(Neighbour {
                ip: str_of(n, "dst")?.parse().ok()?,
                mac: str_of(n, "lladdr")?.to_ascii_lowercase(),
                dev: dev.to_owned(),
            })
        })
        .collect()
}

/// The entries with a remote of `bridge -json fdb show dev <dev>`.
fn parse_fdb(entries: &[Value], dev: &str) -> Vec<FdbEntry> {
    entries
        .iter()
        .filter_map(|e| {
            Some(FdbEntry {
                mac: str_of(e, "mac")?.to_ascii_lowercase(),
                dst: str_of(e, "dst")?.parse().ok()?,
                dev: dev.to_owned(),
            })
        })
        .collect()
}

fn ipv4_addresses(link: &Value) -> Vec<Cidr> {
    link.get("addr_info")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|a| str_of(a, "family") == Some("inet"))
        .filter_map(|a| {
            Some(Cidr {
                addr: str_of(a, "local")?.parse().ok()?,
                prefix: u8::try_from(a.get("prefixlen")?.as_u64()?).ok()?,
            })
        })
        .collect()
}

fn mtu_of(link: &Value) -> u32 {
    link.get("mtu")
        .and_then(Value::as_u64)
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(0)
}

/// A link of `ip -json -d addr show`.
fn parse_link(link: &Value) -> LinkState {
    let info = link.get("linkinfo");
    let data = info.and_then(|i| i.get("info_data"));
    let num = |key: &str| data.and_then(|d| d.get(key)).and_then(Value::as_u64);
    LinkState {
        kind: info.and_then(|i| str_of(i, "info_kind")).map(str::to_owned),
        vni: num("id").and_then(|v| u32::try_from(v).ok()),
        local: data
            .and_then(|d| str_of(d, "local"))
            .and_then(|l| l.parse().ok()),
        port: num("port").and_then(|v| u16::try_from(v).ok()),
        underlay: data.and_then(|d| str_of(d, "link")).map(str::to_owned),
        learning: data
            .and_then(|d| d.get("learning"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        mtu: mtu_of(link),
        mac: str_of(link, "address")
            .unwrap_or_default()
            .to_ascii_lowercase(),
        up: flags_of(link, "flags").iter().any(|f| f == "up"),
        addresses: ipv4_addresses(link),
    }
}

/// The command line that makes `change`.
fn command(change: &Change) -> (&'static str, Vec<String>) {
    let proto = ROUTE_PROTOCOL.to_string();
    let route = |verb: &str, r: &Route| {
        let mut args = vec![
            "route".to_owned(),
            verb.to_owned(),
            r.dst.to_string(),
            "via".into(),
            r.via.to_string(),
            "dev".into(),
            r.dev.clone(),
        ];
        if r.onlink && verb != "del" {
            args.push("onlink".into());
        }
        args.extend(["proto".into(), proto.clone()]);
        args
    };
    let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let fdb = |verb: &str, e: &FdbEntry| {
        let dst = e.dst.to_string();
        let mut args = words(&["fdb", verb, &e.mac, "dev", &e.dev, "dst", &dst, "self"]);
        if verb == "replace" {
            args.push("permanent".into());
        }
        args
    };
    match change {
        Change::AddRoute(r) => ("ip", route("add", r)),
        Change::ReplaceRoute(r) => ("ip", route("replace", r)),
        Change::DeleteRoute(r) => ("ip", route("del", r)),
        Change::SetNeighbour(n) => (
            "ip",
            words(&[
                "neigh",
                "replace",
                &n.ip.to_string(),
                "lladdr",
                &n.mac,
                "dev",
                &n.dev,
                "nud",
                "permanent",
            ]),
        ),
        Change::DeleteNeighbour(n) => (
            "ip",
            words(&["neigh", "del", &n.ip.to_string(), "dev", &n.dev]),
        ),
        Change::SetFdb(e) => ("bridge", fdb("replace", e)),
        Change::DeleteFdb(e) => ("bridge", fdb("del", e)),
        Change::CreateVxlan(s) => (
            "ip",
            words(&[
                "link",
                "add",
                &s.name,
                "type",
                "vxlan",
                "id",
                &s.vni.to_string(),
                "local",
                &s.local.to_string(),
                "dev",
                &s.underlay,
                "dstport",
                &s.port.to_string(),
                "nolearning",
            ]),
        ),
        Change::DeleteLink(name) => ("ip", words(&["link", "del", name])),
        Change::SetMtu { dev, mtu } => (
            "ip",
            words(&["link", "set", "dev", dev, "mtu", &mtu.to_string()]),
        ),
        Change::AddAddress { dev, address } => (
            "ip",
            words(&["addr", "add", &address.to_string(), "dev", dev]),
        ),
        Change::DeleteAddress { dev, address } => (
            "ip",
            words(&["addr", "del", &address.to_string(), "dev", dev]),
        ),
        Change::SetUp(dev) => ("ip", words(&["link", "set", "dev", dev, "up"])),
    }
}

impl RouteOps for IpRoute2 {
    async fn underlay(&self, ip: Ipv4Addr) -> Result<Underlay, RoutesError> {
        let links = self.json("ip", &["addr", "show"]).await?;
        links
            .iter()
            .find(|l| ipv4_addresses(l).iter().any(|a| a.addr == ip))
            .and_then(|l| {
                Some(Underlay {
                    name: str_of(l, "ifname")?.to_owned(),
                    mtu: mtu_of(l),
                    subnets: ipv4_addresses(l).into_iter().map(Cidr::network).collect(),
                })
            })
            .ok_or(RoutesError::NoUnderlay { ip })
    }

    async fn link(&self, name: &str) -> Result<Option<LinkState>, RoutesError> {
        let links = self.json("ip", &["-d", "addr", "show"]).await?;
        Ok(links
            .iter()
            .find(|l| str_of(l, "ifname") == Some(name))
            .map(parse_link))
    }

    async fn programmed(&self, device: Option<&str>) -> Result<Programmed, RoutesError> {
        let proto = ROUTE_PROTOCOL.to_string();
        let routes = self
            .json("ip", &["route", "show", "table", "main", "proto", &proto])
            .await?;
        let mut programmed = Programmed {
            routes: parse_routes(&routes).into_iter().collect(),
            ..Programmed::default()
        };
        if let Some(dev) = device {
            let neighbours = self
                .json("ip", &["neigh", "show", "dev", dev, "nud", "permanent"])
                .await?;
            programmed.neighbours = parse_neighbours(&neighbours, dev).into_iter().collect();
            let fdb = self.json("bridge", &["fdb", "show", "dev", dev]).await?;
            programmed.fdb = parse_fdb(&fdb, dev).into_iter().collect();
        }
        Ok(programmed)
    }

    async fn apply(&self, change: &Change) -> Result<(), RoutesError> {
        let (program, args) = command(change);
        self.run(program, &args).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_iproute2_prints() {
        let routes = json!([
            {"dst":"10.244.2.0/24","gateway":"10.244.2.0","dev":"rkvx.1","flags":["onlink"]},
            {"dst":"10.244.3.0/24","gateway":"198.18.1.13","dev":"eth0","flags":[]},
            {"dst":"10.244.9.9","gateway":"198.18.1.13","dev":"eth0","flags":[]},
            {"dst":"198.18.1.0/24","dev":"eth0","protocol":"kernel","scope":"link","flags":[]}
        ]);
        let parsed = parse_routes(routes.as_array().unwrap());
        assert_eq!(parsed.len(), 3, "{parsed:?}");
        assert!(parsed[0].onlink && !parsed[1].onlink);
        assert_eq!(parsed[2].dst.to_string(), "10.244.9.9/32");
        let neigh =
            json!([{"dst":"10.244.2.0","lladdr":"AA:bb:cc:dd:ee:ff","state":["PERMANENT"]}]);
        assert_eq!(
            parse_neighbours(neigh.as_array().unwrap(), "rkvx.1")[0].mac,
            "aa:bb:cc:dd:ee:ff"
        );
        let fdb = json!([
            {"mac":"aa:bb:cc:dd:ee:ff","dst":"198.18.1.12","flags":["self"],"state":"permanent"},
            {"mac":"33:33:00:00:00:01","flags":["self"],"state":"permanent"}
        ]);
        assert_eq!(parse_fdb(fdb.as_array().unwrap(), "rkvx.1").len(), 1);
        let link = json!({"ifname":"rkvx.1","flags":["BROADCAST","UP","LOWER_UP"],"mtu":1450,
            "address":"b6:13:5c:cf:4a:24","linkinfo":{"info_kind":"vxlan","info_data":{
            "id":1,"local":"198.18.1.11","link":"eth0","port":8472,"learning":false}},
            "addr_info":[{"family":"inet","local":"10.244.1.0","prefixlen":32},
                         {"family":"inet6","local":"fe80::1","prefixlen":64}]});
        let state = parse_link(&link);
        assert_eq!(state.kind.as_deref(), Some("vxlan"));
        assert_eq!(
            (state.vni, state.port, state.mtu),
            (Some(1), Some(8472), 1450)
        );
        assert_eq!(state.underlay.as_deref(), Some("eth0"));
        assert!(state.up && !state.learning);
        assert_eq!(state.addresses, ["10.244.1.0/32".parse().unwrap()]);
    }

    #[test]
    fn routes_are_added_with_the_agents_protocol_and_deleted_only_with_it() {
        let r = Route {
            dst: "10.244.2.0/24".parse().unwrap(),
            via: "10.244.2.0".parse().unwrap(),
            dev: "rkvx.1".into(),
            onlink: true,
        };
        let (program, args) = command(&Change::AddRoute(r.clone()));
        assert_eq!(program, "ip");
        assert_eq!(
            args.join(" "),
            "route add 10.244.2.0/24 via 10.244.2.0 dev rkvx.1 onlink proto 211"
        );
        let (_, args) = command(&Change::DeleteRoute(r));
        assert_eq!(
            args.join(" "),
            "route del 10.244.2.0/24 via 10.244.2.0 dev rkvx.1 proto 211"
        );
    }
}
