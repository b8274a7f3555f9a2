//! What containerd's verbose status (`ContainerStatus`/`PodSandboxStatus` with
//! `verbose: true`) adds in its `info` entry: the PID of the first process, the OCI spec
//! and the image. Other runtimes may give none of it; readers then get the defaults.

use std::collections::HashMap;

use serde_json::Value;

/// What the runtime's verbose status says of a sandbox or container (containerd's
/// `info`): its PID, and its OCI spec.
#[derive(Debug, Default)]
pub struct VerboseInfo {
    /// The PID of its first process on the host; none once it stopped.
    pub pid: Option<u32>,
    /// Its OCI runtime spec.
    pub spec: Value,
    /// The image (a sandbox's: the pause image).
    pub image: Option<String>,
}

impl VerboseInfo {
    /// Parses the `info` entry of a verbose status; empty when it is missing or not JSON.
    #[must_use]
    pub fn parse(info: &HashMap<String, String>) -> Self {
        let Some(v) = info
            .get("info")
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
        else {
            return Self::default();
        };
        Self {
            pid: v["pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .filter(|p| *p > 0),
            image: v["image"].as_str().map(str::to_owned),
            spec: v["runtimeSpec"].clone(),
        }
    }

    /// The path of the network namespace in the OCI spec.
    #[must_use]
    pub fn netns_path(&self) -> Option<String> {
        self.spec["linux"]["namespaces"]
            .as_array()?
            .iter()
            .find(|ns| ns["type"] == "network")?["path"]
            .as_str()
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_info_gives_the_pid_and_the_netns() {
        let info = serde_json::json!({
            "pid": 4242,
            "image": "registry.k8s.io/pause:3.6",
            "runtimeSpec": {"linux": {"namespaces": [
                {"type": "pid"},
                {"type": "network", "path": "/var/run/netns/cni-1234"}
            ]}}
        });
        let parsed = VerboseInfo::parse(&HashMap::from([("info".into(), info.to_string())]));
        assert_eq!(parsed.pid, Some(4242));
        assert_eq!(
            parsed.netns_path().as_deref(),
            Some("/var/run/netns/cni-1234")
        );
        let stopped = serde_json::json!({"pid": 0, "runtimeSpec": {}});
        let parsed = VerboseInfo::parse(&HashMap::from([("info".into(), stopped.to_string())]));
        assert_eq!((parsed.pid, parsed.netns_path()), (None, None));
        assert_eq!(VerboseInfo::parse(&HashMap::new()).pid, None);
    }
}
