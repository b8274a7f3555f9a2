//! CNI results (spec 0.3.x/0.4.0 and 1.0.0): the interfaces and addresses a chain made,
//! typed for the agent, and the raw JSON kept for `prevResult`, the cache and the shim.

use std::net::IpAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::POD_IFNAME;

/// One interface a plugin reported.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Interface {
    /// Its name, e.g. `eth0`.
    pub name: String,
    /// Its MAC address, if reported.
    #[serde(default)]
    pub mac: String,
    /// The network namespace path it lives in; empty for host-side interfaces.
    #[serde(default)]
    pub sandbox: String,
}

/// One address a plugin assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address.
    pub address: IpAddr,
    /// Its prefix length (`24` of `10.244.1.5/24`).
    pub prefix_len: u8,
    /// The gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Index into [`CniResult::interfaces`] of the interface holding it, if reported.
    pub interface: Option<usize>,
}

/// The result of a successful `ADD` of a whole chain.
#[derive(Debug, Clone, PartialEq)]
pub struct CniResult {
    /// The CNI version of the result.
    pub cni_version: String,
    /// The interfaces made, host side and sandbox side.
    pub interfaces: Vec<Interface>,
    /// The addresses assigned.
    pub ips: Vec<IpConfig>,
    raw: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    cni_version: String,
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<WireIp>,
}

#[derive(Deserialize)]
struct WireIp {
    address: String,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    interface: Option<usize>,
}

/// Versions whose results have the 0.3.0 shape (`ips[].version` required).
const VERSIONS_WITH_IP_VERSION: [&str; 3] = ["0.3.0", "0.3.1", "0.4.0"];

impl CniResult {
    /// Reads a result from its JSON.
    ///
    /// # Errors
    /// A description of what does not parse (not an object, an address that is not
    /// `address/prefix`, ...).
    pub fn from_json(raw: Value) -> Result<Self, String> {
        // An array would pass for the struct's fields in order (serde's sequence form),
        // and then not take `cniVersion` (a panic before: found by fuzzing).
        if !raw.is_object() {
            return Err(format!("a CNI result is a JSON object, not {raw}"));
        }
        let wire = Wire::deserialize(&raw).map_err(|e| e.to_string())?;
        let ips = wire
            .ips
            .into_iter()
            .map(|ip| {
                let (address, prefix_len) = parse_cidr(&ip.address)
                    .ok_or_else(|| format!("address {:?} is not address/prefix", ip.address))?;
                let gateway = match ip.gateway.as_deref() {
                    None | Some("") => None,
                    Some(g) => Some(
                        g.parse()
                            .map_err(|_| format!("gateway {g:?} is not an address"))?,
                    ),
                };
                Ok(IpConfig {
                    address,
                    prefix_len,
                    gateway,
                    interface: ip.interface,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self {
            cni_version: wire.cni_version,
            interfaces: wire.interfaces,
            ips,
            raw,
        })
    }

    /// The pod's addresses: those on the sandbox's `eth0` first, then those on other
    /// sandbox interfaces, then those with no interface named; addresses of host-side
    /// interfaces are left out. No duplicates; plugin order kept within each group.
    #[must_use]
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        let rank = |ip: &IpConfig| match ip.interface.and_then(|i| self.interfaces.get(i)) {
            Some(i) if !i.sandbox.is_empty() && i.name == POD_IFNAME => Some(0),
            Some(i) if !i.sandbox.is_empty() => Some(1),
            Some(_) => None,
            None => Some(2),
        };
        let mut ranked: Vec<(u8, IpAddr)> = self
            .ips
            .iter()
            .filter_map(|ip| rank(ip).map(|r| (r, ip.address)))
            .collect();
        ranked.sort_by_key(|(r, _)| *r);
        let mut out: Vec<IpAddr> = Vec::with_capacity(ranked.len());
        for (_, ip) in ranked {
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        out
    }

    /// The result as the plugins wrote it.
    #[must_use]
    pub fn to_json(&self) -> &Value {
        &self.raw
    }

    /// The result in CNI version `version`, for a caller that asked in another version
    /// than the chain speaks: 0.3.0, 0.3.1 and 0.4.0 results carry `ips[].version`, 1.0.0
    /// ones do not; the rest of the shape is the same.
    ///
    /// # Errors
    /// When `version` is not one of those.
    pub fn to_version(&self, version: &str) -> Result<Value, String> {
        let with_ip_version = if VERSIONS_WITH_IP_VERSION.contains(&version) {
            true
        } else if version == "1.0.0" {
            false
        } else {
            return Err(format!(
                "cannot convert a CNI result to version {version:?}"
            ));
        };
        let mut out = self.raw.clone();
        out["cniVersion"] = Value::String(version.to_owned());
        if let Some(ips) = out.get_mut("ips").and_then(Value::as_array_mut) {
            for (ip, typed) in ips.iter_mut().zip(&self.ips) {
                let Some(ip) = ip.as_object_mut() else {
                    continue;
                };
                if with_ip_version {
                    let family = if typed.address.is_ipv4() { "4" } else { "6" };
                    ip.insert("version".into(), Value::String(family.into()));
                } else {
                    ip.remove("version");
                }
            }
        }
        Ok(out)
    }
}

fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    (prefix <= if addr.is_ipv4() { 32 } else { 128 }).then_some((addr, prefix))
}

impl Serialize for CniResult {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for CniResult {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::from_json(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What Debian's bridge plugin 1.1.1 answers at 0.4.0, dual-stack.
    fn bridge_result() -> Value {
        json!({
            "cniVersion": "0.4.0",
            "interfaces": [
                {"name": "rk0", "mac": "6a:3b:aa:00:00:01"},
                {"name": "veth1234", "mac": "6a:3b:aa:00:00:02"},
                {"name": "eth0", "mac": "6a:3b:aa:00:00:03", "sandbox": "/run/netns/cni-1"}
            ],
            "ips": [
                {"version": "6", "interface": 2, "address": "fd00:10::5/64", "gateway": "fd00:10::1"},
                {"version": "4", "interface": 2, "address": "10.244.1.5/24", "gateway": "10.244.1.1"}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
            "dns": {}
        })
    }

    #[test]
    fn parses_a_0_4_0_result() {
        let r = CniResult::from_json(bridge_result()).unwrap();
        assert_eq!(r.cni_version, "0.4.0");
        assert_eq!(r.interfaces[2].sandbox, "/run/netns/cni-1");
        assert_eq!(
            r.ips[1],
            IpConfig {
                address: "10.244.1.5".parse().unwrap(),
                prefix_len: 24,
                gateway: Some("10.244.1.1".parse().unwrap()),
                interface: Some(2),
            }
        );
        assert_eq!(
            r.pod_ips(),
            [
                "fd00:10::5".parse::<IpAddr>().unwrap(),
                "10.244.1.5".parse().unwrap()
            ]
        );
    }

    #[test]
    fn parses_a_1_0_0_result_without_ip_versions_or_interfaces() {
        let r = CniResult::from_json(json!({
            "cniVersion": "1.0.0",
            "ips": [{"address": "10.244.1.9/24"}]
        }))
        .unwrap();
        assert_eq!(r.pod_ips(), ["10.244.1.9".parse::<IpAddr>().unwrap()]);
        assert_eq!(r.ips[0].gateway, None);
    }

    #[test]
    fn eth0_comes_first_and_host_side_addresses_are_left_out() {
        let r = CniResult::from_json(json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "net1", "sandbox": "/run/netns/x"},
                {"name": "host0"},
                {"name": "eth0", "sandbox": "/run/netns/x"}
            ],
            "ips": [
                {"address": "10.9.0.2/16"},
                {"address": "192.168.0.2/24", "interface": 0},
                {"address": "198.18.0.1/32", "interface": 1},
                {"address": "10.244.1.7/24", "interface": 2},
                {"address": "10.244.1.7/24", "interface": 2}
            ]
        }))
        .unwrap();
        let ips: Vec<String> = r.pod_ips().iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.244.1.7", "192.168.0.2", "10.9.0.2"]);
    }

    #[test]
    fn malformed_addresses_are_refused() {
        for bad in [
            json!({"ips": [{"address": "10.0.0.1"}]}),
            json!({"ips": [{"address": "10.0.0.1/40"}]}),
            json!({"ips": [{"address": "10.0.0.1/24", "gateway": "x"}]}),
            json!([1]),
        ] {
            assert!(CniResult::from_json(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn converts_between_0_4_0_and_1_0_0() {
        let r = CniResult::from_json(bridge_result()).unwrap();
        let v1 = r.to_version("1.0.0").unwrap();
        assert_eq!(v1["cniVersion"], "1.0.0");
        assert!(v1["ips"][0].get("version").is_none());
        assert_eq!(v1["routes"], bridge_result()["routes"]);
        let back = CniResult::from_json(v1)
            .unwrap()
            .to_version("0.4.0")
            .unwrap();
        assert_eq!(back, bridge_result());
        assert!(r.to_version("0.2.0").is_err());
    }

    #[test]
    fn serde_keeps_the_raw_result() {
        let r: CniResult = serde_json::from_value(bridge_result()).unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap(), bridge_result());
        assert_eq!(r.to_json(), &bridge_result());
    }
}
