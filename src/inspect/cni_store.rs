//! What CNI leaves on disk for a sandbox, read back: the result cache (the agent's, under
//! its root dir, or libcni's, under `/var/lib/cni/results`, when the runtime runs the
//! plugins), the host-local plugin's reservation files, and the NAT rules the portmap
//! plugin wrote.

use std::net::IpAddr;
use std::path::PathBuf;

use base64::Engine;
use serde_json::Value;

use super::Locations;
use super::view::Reservation;

/// host-local's default data dir.
const HOST_LOCAL_DATA_DIR: &str = "/var/lib/cni/networks";
/// How long `iptables-save` may take.
const IPTABLES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A sandbox's cached CNI attachment.
#[derive(Debug, Clone, PartialEq)]
pub struct Cached {
    /// The cache file.
    pub path: PathBuf,
    /// Who wrote it: `agent` or `runtime`.
    pub owner: &'static str,
    /// The network's name.
    pub network_name: String,
    /// The config list the plugins ran with.
    pub config: Value,
    /// The chain's result.
    pub result: Value,
    /// The `portMappings` runtime config.
    pub port_mappings: Vec<Value>,
}

impl Cached {
    /// Reads a cache entry in either format: the agent's (`config` is the config list as
    /// JSON, `portMappings` at the top) or libcni's (`config` is the list's bytes in
    /// base64, `capabilityArgs.portMappings`).
    fn parse(path: PathBuf, owner: &'static str, text: &str) -> Option<Self> {
        let entry: Value = serde_json::from_str(text).ok()?;
        let config = match &entry["config"] {
            Value::String(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or(Value::Null),
            other => other.clone(),
        };
        let port_mappings = entry["portMappings"]
            .as_array()
            .or_else(|| entry["capabilityArgs"]["portMappings"].as_array())
            .cloned()
            .unwrap_or_default();
        Some(Self {
            path,
            owner,
            network_name: entry["networkName"].as_str()?.to_owned(),
            config,
            result: entry["result"].clone(),
            port_mappings,
        })
    }

    /// The host-local plugin's data dir in the config list.
    fn host_local_dir(&self) -> Option<PathBuf> {
        self.config["plugins"]
            .as_array()?
            .iter()
            .map(|p| &p["ipam"])
            .find(|ipam| ipam["type"] == "host-local")
            .map(|ipam| {
                PathBuf::from(ipam["dataDir"].as_str().unwrap_or(HOST_LOCAL_DATA_DIR))
                    .join(&self.network_name)
            })
    }

    /// The subnets host-local allocates from (`ranges`, or the older `subnet`).
    #[must_use]
    pub fn subnets(&self) -> Vec<String> {
        let Some(plugins) = self.config["plugins"].as_array() else {
            return Vec::new();
        };
        let ipam = plugins.iter().map(|p| &p["ipam"]);
        let ranges = ipam.clone().flat_map(|i| {
            i["ranges"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|set| set.as_array())
                .flatten()
                .filter_map(|r| r["subnet"].as_str())
        });
        let single = ipam.filter_map(|i| i["subnet"].as_str());
        ranges.chain(single).map(str::to_owned).collect()
    }
}

/// The cache entry of `sandbox_id`'s `ifname`, the agent's first.
pub async fn cached(at: &Locations, sandbox_id: &str, ifname: &str) -> Option<Cached> {
    let suffix = format!("-{sandbox_id}-{ifname}");
    for (dir, owner) in [
        (at.agent_cni_cache(), "agent"),
        (at.runtime_cni_cache(), "runtime"),
    ] {
        let suffix = suffix.clone();
        let found = super::blocking(move || {
            std::fs::read_dir(&dir)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.ends_with(&suffix))
                })
                .and_then(|p| {
                    let text = std::fs::read_to_string(&p).ok()?;
                    Cached::parse(p, owner, &text)
                })
        })
        .await;
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Every cache entry of both caches.
pub async fn all_cached(at: &Locations) -> Vec<Cached> {
    let dirs = [
        (at.agent_cni_cache(), "agent"),
        (at.runtime_cni_cache(), "runtime"),
    ];
    super::blocking(move || {
        dirs.iter()
            .flat_map(|(dir, owner)| {
                std::fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| {
                        let text = std::fs::read_to_string(e.path()).ok()?;
                        Cached::parse(e.path(), owner, &text)
                    })
            })
            .collect()
    })
    .await
}

/// host-local's reservation of `ip`: the file named after it in the network's data dir.
pub async fn reservation(cached: &Cached, ip: IpAddr) -> Option<Reservation> {
    let path = cached.host_local_dir()?.join(ip.to_string());
    super::blocking(move || {
        let holder = std::fs::read_to_string(&path).ok()?;
        Some(Reservation {
            path: path.display().to_string(),
            holder: holder.split_whitespace().collect::<Vec<_>>().join(" "),
        })
    })
    .await
}

/// The NAT rules of a sandbox: `iptables-save -t nat` lines that name its id (portmap's
/// and bridge's comments), and the rules of the chains those lines jump to or add to.
///
/// # Errors
/// `iptables-save` cannot be run or fails.
pub async fn nat_rules(sandbox_id: &str) -> Result<Vec<String>, String> {
    let run = tokio::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(IPTABLES_TIMEOUT, run)
        .await
        .map_err(|_| "iptables-save timed out".to_owned())?
        .map_err(|e| format!("running iptables-save: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "iptables-save: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(rules_of(&String::from_utf8_lossy(&out.stdout), sandbox_id))
}

/// The rules of `iptables-save` output that concern `sandbox_id`.
fn rules_of(save: &str, sandbox_id: &str) -> Vec<String> {
    let rules: Vec<&str> = save.lines().filter(|l| l.starts_with("-A ")).collect();
    let direct: Vec<&str> = rules
        .iter()
        .copied()
        .filter(|l| l.contains(sandbox_id))
        .collect();
    // The sandbox's own chains: those its rules jump to or are in, but not the shared
    // top chains every sandbox's rules are added to.
    let own_chains: Vec<&str> = direct
        .iter()
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words
                .windows(2)
                .filter(|w| w[0] == "-j" || w[0] == "-A")
                .map(|w| w[1])
                .collect::<Vec<_>>()
        })
        .filter(|c| {
            c.starts_with("CNI-")
                && !matches!(
                    *c,
                    "CNI-HOSTPORT-DNAT" | "CNI-HOSTPORT-SNAT" | "CNI-HOSTPORT-MASQ"
                )
        })
        .collect();
    rules
        .into_iter()
        .filter(|l| {
            l.contains(sandbox_id)
                || l.split_whitespace()
                    .nth(1)
                    .is_some_and(|chain| own_chains.contains(&chain))
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_cache_formats_are_read() {
        let conflist = serde_json::json!({"cniVersion": "0.4.0", "name": "rkubelet", "plugins": [
            {"type": "bridge", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]});
        let agent = serde_json::json!({"kind": "rkubeletCniCacheV1", "networkName": "rkubelet",
            "config": conflist, "result": {"ips": [{"address": "10.244.0.5/24"}]},
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]});
        let a = Cached::parse("/a".into(), "agent", &agent.to_string()).expect("agent format");
        assert_eq!(a.port_mappings.len(), 1);
        assert_eq!(a.subnets(), ["10.244.0.0/24"]);
        assert_eq!(
            a.host_local_dir(),
            Some(PathBuf::from("/var/lib/cni/networks/rkubelet"))
        );
        let mut runtime_conf = conflist.clone();
        runtime_conf["plugins"][0]["ipam"] =
            serde_json::json!({"type": "host-local", "subnet": "10.88.0.0/16", "dataDir": "/d"});
        let libcni = serde_json::json!({"kind": "cniCacheV1", "networkName": "containerd-net",
            "config": base64::engine::general_purpose::STANDARD.encode(runtime_conf.to_string()),
            "capabilityArgs": {"portMappings": [{"hostPort": 1}, {"hostPort": 2}]},
            "result": {"ips": []}});
        let r = Cached::parse("/r".into(), "runtime", &libcni.to_string()).expect("libcni");
        assert_eq!(r.port_mappings.len(), 2);
        assert_eq!(r.subnets(), ["10.88.0.0/16"]);
        assert_eq!(r.host_local_dir(), Some(PathBuf::from("/d/containerd-net")));
        assert_eq!(Cached::parse("/x".into(), "agent", "not json"), None);
    }

    #[test]
    fn nat_rules_are_the_sandboxes_own() {
        let id = "abc123";
        let save = r#"*nat
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-DN-1 - [0:0]
:CNI-DN-2 - [0:0]
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"rkubelet\" id: \"abc123\"" -m multiport --dports 8080 -j CNI-DN-1
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"rkubelet\" id: \"other\"" -m multiport --dports 9090 -j CNI-DN-2
-A CNI-DN-1 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.244.0.5:80
-A CNI-DN-2 -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.244.0.6:80
-A POSTROUTING -s 10.244.0.5/32 -m comment --comment "name: \"rkubelet\" id: \"abc123\"" -j CNI-77
-A CNI-77 -d 10.244.0.0/24 -j ACCEPT
COMMIT
"#;
        let rules = rules_of(save, id);
        assert_eq!(rules.len(), 4, "{rules:#?}");
        assert!(
            rules
                .iter()
                .any(|r| r.contains("--to-destination 10.244.0.5:80"))
        );
        assert!(rules.iter().any(|r| r.starts_with("-A CNI-77")));
        assert!(
            !rules
                .iter()
                .any(|r| r.contains("other") || r.contains("CNI-DN-2"))
        );
    }
}
