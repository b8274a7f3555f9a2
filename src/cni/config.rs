//! Network config lists (`*.conflist`): loading the node's one from the CNI config dir with
//! its pod CIDR filled in, and validating it before any plugin sees it.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

use super::{CniError, SUPPORTED_VERSIONS, shim};

/// Replaced by the node's `spec.podCIDR` (e.g. `10.244.1.0/24`) wherever it appears in the
/// config file. The spelling is that of containerd's `conf_template`.
pub const POD_CIDR_PLACEHOLDER: &str = "{{.PodCIDR}}";

/// A validated CNI network configuration list: a named network, the CNI version its
/// plugins speak, and the plugins to chain, each config kept exactly as written.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    name: String,
    cni_version: String,
    disable_check: bool,
    plugins: Vec<Map<String, Value>>,
    raw: Value,
}

impl NetworkConfigList {
    /// Parses and validates a config list. `origin` names it in errors (usually a path).
    ///
    /// # Errors
    /// [`CniError::InvalidConfig`] when it is not JSON, lacks a valid `name`, declares a
    /// `cniVersion` other than 0.4.0 or 1.0.0, has no plugins, or a plugin without `type`.
    pub fn parse(origin: &str, bytes: &[u8]) -> Result<Self, CniError> {
        let invalid = |reason: String| CniError::InvalidConfig {
            config: origin.to_owned(),
            reason,
        };
        let raw: Value = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        Self::from_value(raw).map_err(invalid)
    }

    fn from_value(raw: Value) -> Result<Self, String> {
        let obj = raw.as_object().ok_or("not a JSON object")?;
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .ok_or("no \"name\"")?;
        let mut chars = name.chars();
        let valid_name = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !valid_name {
            return Err(format!(
                "network name {name:?} must match [a-zA-Z0-9][a-zA-Z0-9_.-]*"
            ));
        }
        let cni_version = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .ok_or("no \"cniVersion\"")?;
        if !SUPPORTED_VERSIONS.contains(&cni_version) {
            return Err(format!(
                "cniVersion {cni_version:?} is not one of {SUPPORTED_VERSIONS:?}"
            ));
        }
        let disable_check = match obj.get("disableCheck") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(format!("\"disableCheck\" is not a boolean: {other}")),
        };
        let plugins = obj
            .get("plugins")
            .and_then(Value::as_array)
            .ok_or("no \"plugins\" list")?;
        if plugins.is_empty() {
            return Err("the \"plugins\" list is empty".into());
        }
        let plugins = plugins
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let p = p
                    .as_object()
                    .ok_or_else(|| format!("plugin {i} is not an object"))?;
                let ty = p
                    .get("type")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("plugin {i} has no \"type\""))?;
                if ty.is_empty() || ty.contains('/') || ty == "." || ty == ".." {
                    return Err(format!("plugin {i} has an invalid type {ty:?}"));
                }
                Ok(p.clone())
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            name: name.to_owned(),
            cni_version: cni_version.to_owned(),
            disable_check,
            plugins,
            raw,
        })
    }

    /// The built-in list that brings up `lo`: `{"cniVersion":"0.4.0","name":"cni-loopback",
    /// "type":"loopback"}`, the config containerd uses too.
    pub(crate) fn loopback() -> Self {
        Self {
            name: "cni-loopback".into(),
            cni_version: "0.4.0".into(),
            disable_check: false,
            plugins: vec![Map::from_iter([("type".to_owned(), json!("loopback"))])],
            raw: json!({"cniVersion": "0.4.0", "name": "cni-loopback",
                        "plugins": [{"type": "loopback"}]}),
        }
    }

    /// The network name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The CNI spec version the plugins are spoken to in.
    #[must_use]
    pub fn cni_version(&self) -> &str {
        &self.cni_version
    }

    /// The host bridges the `bridge` plugins of the chain attach pods to (`cni0` when a
    /// bridge plugin names none, the plugin's default).
    pub fn bridges(&self) -> impl Iterator<Item = &str> {
        self.plugins
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("bridge"))
            .map(|p| p.get("bridge").and_then(Value::as_str).unwrap_or("cni0"))
    }

    /// The list with `"mtu": mtu` given to each `bridge` plugin that sets no MTU of its
    /// own: the pods' MTU when the pod network is encapsulated (vxlan routes).
    #[must_use]
    pub fn with_bridge_mtu(mut self, mtu: u32) -> Self {
        let plugins = self.raw.get_mut("plugins").and_then(Value::as_array_mut);
        for (i, plugin) in plugins.into_iter().flatten().enumerate() {
            let Some(obj) = plugin.as_object_mut() else {
                continue;
            };
            if obj.get("type").and_then(Value::as_str) == Some("bridge") && !obj.contains_key("mtu")
            {
                obj.insert("mtu".into(), json!(mtu));
                self.plugins[i] = obj.clone();
            }
        }
        self
    }

    /// The directories where the chain's host-local IPAM keeps this network's
    /// reservations (`<dataDir>/<network name>`, dataDir defaulting to
    /// `/var/lib/cni/networks`).
    pub fn host_local_dirs(&self) -> Vec<PathBuf> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("ipam"))
            .filter(|ipam| ipam.get("type").and_then(Value::as_str) == Some("host-local"))
            .map(|ipam| {
                let data = ipam
                    .get("dataDir")
                    .and_then(Value::as_str)
                    .unwrap_or("/var/lib/cni/networks");
                Path::new(data).join(&self.name)
            })
            .collect()
    }

    /// The plugin types, in chain order.
    pub fn plugin_types(&self) -> impl Iterator<Item = &str> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str))
    }

    /// The plugin configs, in chain order (each has a string `type`).
    pub(crate) fn plugins(&self) -> &[Map<String, Value>] {
        &self.plugins
    }

    /// Whether the list opts out of `CHECK` (`disableCheck`).
    pub(crate) fn disable_check(&self) -> bool {
        self.disable_check
    }
}

impl Serialize for NetworkConfigList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for NetworkConfigList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::from_value(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// The node's network: the first `*.conflist` file (in lexical order, as libcni and
/// containerd pick) in `dir`, with every [`POD_CIDR_PLACEHOLDER`] replaced by `pod_cidr`.
///
/// A list that chains to the `rkubelet-cni` shim is refused: the agent would call itself.
///
/// # Errors
/// [`CniError::NoConfig`] when there is no such file; [`CniError::InvalidConfig`] when it
/// is not valid, still holds a template placeholder, or needs a pod CIDR that is empty or
/// malformed; [`CniError::Io`] when the dir or the file cannot be read.
pub async fn load_conflist(dir: &Path, pod_cidr: &str) -> Result<NetworkConfigList, CniError> {
    let io = |op, path: &Path| {
        let path = path.to_owned();
        move |source| CniError::Io { op, path, source }
    };
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(io("reading CNI config dir", dir))?;
    let mut files: Vec<PathBuf> = Vec::new();
    while let Some(entry) = entries
        .next_entry()
        .await
        .map_err(io("reading CNI config dir", dir))?
    {
        let path = entry.path();
        let is_conflist = path.extension().is_some_and(|e| e == "conflist");
        if is_conflist && tokio::fs::metadata(&path).await.is_ok_and(|m| m.is_file()) {
            files.push(path);
        }
    }
    files.sort();
    let path = files.into_iter().next().ok_or_else(|| CniError::NoConfig {
        dir: dir.to_owned(),
    })?;
    let text = tokio::fs::read_to_string(&path)
        .await
        .map_err(io("reading CNI config", &path))?;
    let origin = path.display().to_string();
    let invalid = |reason: String| CniError::InvalidConfig {
        config: origin.clone(),
        reason,
    };
    let text = if text.contains(POD_CIDR_PLACEHOLDER) {
        check_cidr(pod_cidr).map_err(invalid)?;
        text.replace(POD_CIDR_PLACEHOLDER, pod_cidr)
    } else {
        text
    };
    if let Some(at) = text.find("{{") {
        let snippet: String = text[at..].chars().take(40).collect();
        return Err(invalid(format!(
            "unknown template placeholder at {snippet:?}"
        )));
    }
    let list = NetworkConfigList::parse(&origin, text.as_bytes())?;
    if list.plugin_types().any(|t| t == shim::PLUGIN_NAME) {
        return Err(invalid(format!(
            "the agent's own network cannot use the {} shim plugin (it would call the agent back); \
             point the agent's CNI config dir elsewhere than the runtime's",
            shim::PLUGIN_NAME
        )));
    }
    Ok(list)
}

/// Checks that `cidr` looks like `10.244.1.0/24` or `fd00::/64`.
fn check_cidr(cidr: &str) -> Result<(), String> {
    if cidr.is_empty() {
        return Err(format!(
            "it needs the node's pod CIDR for {POD_CIDR_PLACEHOLDER}, and the node has none (yet)"
        ));
    }
    let bad = || format!("pod CIDR {cidr:?} is not an address/prefix");
    let (addr, prefix) = cidr.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::testutil::TempDir;

    fn write(dir: &TempDir, name: &str, text: &str) {
        std::fs::write(dir.path().join(name), text).unwrap();
    }

    #[tokio::test]
    async fn the_shipped_conflist_loads_with_the_pod_cidr_filled_in() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cni-config");
        let list = load_conflist(&dir, "10.244.1.0/24").await.unwrap();
        assert_eq!(list.name(), "rkubelet");
        assert_eq!(list.cni_version(), "0.4.0");
        assert_eq!(
            list.plugin_types().collect::<Vec<_>>(),
            ["bridge", "portmap"]
        );
        let bridge = &list.plugins()[0];
        assert_eq!(bridge["bridge"], "rk0");
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["isDefaultGateway"], true);
        assert_eq!(
            bridge["ipam"]["ranges"],
            json!([[{"subnet": "10.244.1.0/24"}]])
        );
        let portmap = &list.plugins()[1];
        assert_eq!(portmap["capabilities"], json!({"portMappings": true}));
        assert_eq!(portmap["snat"], true);
    }

    #[tokio::test]
    async fn vxlan_gives_the_bridge_its_mtu_unless_the_list_sets_one() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cni-config");
        let list = load_conflist(&dir, "10.244.1.0/24")
            .await
            .unwrap()
            .with_bridge_mtu(1450);
        assert_eq!(list.plugins()[0]["mtu"], 1450);
        assert!(list.plugins()[1].get("mtu").is_none(), "portmap has no MTU");
        let rendered = serde_json::to_value(&list).unwrap();
        assert_eq!(
            rendered["plugins"][0]["mtu"], 1450,
            "the config plugins get"
        );
        let own = NetworkConfigList::parse(
            "t",
            br#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"bridge","mtu":1400}]}"#,
        )
        .unwrap()
        .with_bridge_mtu(1450);
        assert_eq!(own.plugins()[0]["mtu"], 1400);
        assert_eq!(
            serde_json::to_value(&own).unwrap()["plugins"][0]["mtu"],
            1400
        );
    }

    #[tokio::test]
    async fn the_first_conflist_in_lexical_order_wins() {
        let dir = TempDir::new("conf");
        let list = |name: &str| {
            format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"bridge"}}]}}"#)
        };
        write(&dir, "20-b.conflist", &list("b"));
        write(&dir, "10-a.conflist", &list("a"));
        write(&dir, "05-x.conf", &list("x"));
        write(&dir, "01-y.conflist.template", &list("y"));
        std::fs::create_dir(dir.path().join("00-dir.conflist")).unwrap();
        let loaded = load_conflist(dir.path(), "").await.unwrap();
        assert_eq!(loaded.name(), "a");
        assert_eq!(loaded.cni_version(), "1.0.0");
    }

    #[tokio::test]
    async fn an_empty_dir_has_no_config() {
        let dir = TempDir::new("empty");
        let err = load_conflist(dir.path(), "10.0.0.0/24").await.unwrap_err();
        assert!(matches!(err, CniError::NoConfig { .. }), "{err}");
    }

    #[tokio::test]
    async fn the_placeholder_needs_a_valid_pod_cidr() {
        let dir = TempDir::new("cidr");
        write(
            &dir,
            "10.conflist",
            r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"bridge","ipam":{"subnet":"{{.PodCIDR}}"}}]}"#,
        );
        let none = load_conflist(dir.path(), "").await.unwrap_err();
        assert!(none.to_string().contains("has none (yet)"), "{none}");
        let bad = load_conflist(dir.path(), "10.0.0.0/33").await.unwrap_err();
        assert!(bad.to_string().contains("not an address/prefix"), "{bad}");
        let v6 = load_conflist(dir.path(), "fd00:10::/64").await.unwrap();
        assert_eq!(v6.plugins()[0]["ipam"]["subnet"], "fd00:10::/64");
    }

    #[tokio::test]
    async fn other_template_syntax_and_the_shim_are_refused() {
        let dir = TempDir::new("tmpl");
        write(
            &dir,
            "10.conflist",
            r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"bridge","x":"{{.Routes}}"}]}"#,
        );
        let err = load_conflist(dir.path(), "10.0.0.0/24").await.unwrap_err();
        assert!(
            err.to_string().contains("unknown template placeholder"),
            "{err}"
        );
        write(
            &dir,
            "10.conflist",
            r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"rkubelet-cni"}]}"#,
        );
        let err = load_conflist(dir.path(), "").await.unwrap_err();
        assert!(err.to_string().contains("call the agent back"), "{err}");
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let cases = [
            ("[]", "not a JSON object"),
            (
                r#"{"cniVersion":"0.4.0","plugins":[{"type":"b"}]}"#,
                "no \"name\"",
            ),
            (
                r#"{"name":"-x","cniVersion":"0.4.0","plugins":[{"type":"b"}]}"#,
                "must match",
            ),
            (
                r#"{"name":"n","plugins":[{"type":"b"}]}"#,
                "no \"cniVersion\"",
            ),
            (
                r#"{"name":"n","cniVersion":"0.3.1","plugins":[{"type":"b"}]}"#,
                "is not one of",
            ),
            (
                r#"{"name":"n","cniVersion":"0.4.0"}"#,
                "no \"plugins\" list",
            ),
            (
                r#"{"name":"n","cniVersion":"0.4.0","plugins":[]}"#,
                "is empty",
            ),
            (
                r#"{"name":"n","cniVersion":"0.4.0","plugins":[{"ipam":{}}]}"#,
                "plugin 0 has no \"type\"",
            ),
            (
                r#"{"name":"n","cniVersion":"0.4.0","plugins":[{"type":"../../bin/sh"}]}"#,
                "invalid type",
            ),
            (
                r#"{"name":"n","cniVersion":"0.4.0","disableCheck":"yes","plugins":[{"type":"b"}]}"#,
                "not a boolean",
            ),
        ];
        for (text, want) in cases {
            let err = NetworkConfigList::parse("test", text.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(want), "{text}: {err}");
            assert!(
                err.to_string()
                    .starts_with("invalid CNI network config test: ")
            );
        }
    }

    #[test]
    fn a_list_round_trips_through_serde_unchanged() {
        let text = r#"{"cniVersion":"0.4.0","name":"n","disableCheck":true,"extra":{"k":1},"plugins":[{"type":"b","z":[1,2]}]}"#;
        let list = NetworkConfigList::parse("t", text.as_bytes()).unwrap();
        assert!(list.disable_check());
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(json, serde_json::from_str::<Value>(text).unwrap());
        let back: NetworkConfigList = serde_json::from_value(json).unwrap();
        assert_eq!(back, list);
    }
}
