//! Garbage collection of attachments whose sandbox is gone. When the agent dies in the
//! middle of an `ADD`, containerd rolls the sandbox back with a `DEL` through the thin
//! plugin — which then reaches nobody — so IP reservations (and cache entries) stay behind.
//! Like containerd's and CRI-O's network GC, the agent later runs `DEL` for every
//! attachment (a cache entry or a host-local reservation of its network) whose container
//! is no sandbox of the runtime, is not being worked on, and is old enough not to belong to
//! a sandbox the runtime is still creating.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{Attachment, Cni, POD_IFNAME, PluginExec};

fn age(modified: std::io::Result<SystemTime>) -> Duration {
    modified
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .unwrap_or_default()
}

/// host-local's reservations in `dir`: files named by IP holding
/// `<container id>\r\n<ifname>` (the ifname line is missing in old versions).
async fn reservations(dir: &Path) -> Vec<(String, String, Duration)> {
    let mut out = Vec::new();
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return out;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let path = entry.path();
        let is_ip = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok());
        if !is_ip {
            continue;
        }
        let (Ok(text), Ok(meta)) = (
            tokio::fs::read_to_string(&path).await,
            entry.metadata().await,
        ) else {
            continue;
        };
        let mut lines = text.lines().map(str::trim);
        let id = lines.next().unwrap_or_default().to_owned();
        let ifname = lines
            .next()
            .filter(|l| !l.is_empty())
            .unwrap_or(POD_IFNAME)
            .to_owned();
        if !id.is_empty() {
            out.push((id, ifname, age(meta.modified())));
        }
    }
    out
}

impl<E: PluginExec> Cni<E> {
    /// Runs `DEL` for every attachment of this network whose container id is not in
    /// `live` (the runtime's sandbox ids), that is older than `min_age` and has no
    /// operation under way. Returns the container ids released; failures are logged and
    /// retried at the next collection.
    pub async fn garbage_collect(&self, live: &HashSet<String>, min_age: Duration) -> Vec<String> {
        let mut candidates: BTreeMap<(String, String), Duration> = BTreeMap::new();
        let files: Vec<PathBuf> = self.cache.files().await.unwrap_or_default();
        for path in files {
            let Ok(Some(entry)) = self.cache.load(&path).await else {
                continue;
            };
            let modified = tokio::fs::metadata(&path).await.and_then(|m| m.modified());
            candidates.insert((entry.container_id, entry.if_name), age(modified));
        }
        for dir in self.network.host_local_dirs() {
            for (id, ifname, age) in reservations(&dir).await {
                candidates.entry((id, ifname)).or_insert(age);
            }
        }
        tracing::debug!(
            candidates = candidates.len(),
            live = live.len(),
            "network garbage collection"
        );
        let mut released = Vec::new();
        for ((container_id, ifname), age) in candidates {
            if live.contains(&container_id) || age < min_age || self.in_flight(&container_id) {
                continue;
            }
            // A leftover shows that an earlier DEL did not release everything.
            self.deleted.forget(&container_id, &ifname);
            let att = Attachment {
                container_id: container_id.clone(),
                netns: PathBuf::new(),
                ifname,
                pod: Default::default(),
                port_mappings: Vec::new(),
            };
            match self.del(&att).await {
                Ok(()) => {
                    tracing::info!(
                        container_id,
                        "released the network of a sandbox that no longer exists"
                    );
                    released.push(container_id);
                }
                Err(e) => {
                    tracing::warn!(container_id, error = %e, "could not release a leaked attachment")
                }
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::testutil::{FakeExec, TempDir, bin_dir};
    use crate::cni::{NetworkConfigList, PodNetworkRef};

    fn attachment(id: &str) -> Attachment {
        Attachment {
            container_id: id.into(),
            netns: PathBuf::new(),
            ifname: "eth0".into(),
            pod: PodNetworkRef::default(),
            port_mappings: Vec::new(),
        }
    }

    #[tokio::test]
    async fn releases_attachments_of_gone_sandboxes_only() {
        let bin = bin_dir(&["loopback", "bridge"]);
        let cache = TempDir::new("gc-cache");
        let ipam = TempDir::new("gc-ipam");
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0", "name": "gcnet",
            "plugins": [{"type": "bridge", "bridge": "rk0",
                         "ipam": {"type": "host-local", "dataDir": ipam.path()}}]
        });
        let list = NetworkConfigList::parse("test", conflist.to_string().as_bytes()).unwrap();
        let cni = Cni::new(
            list,
            vec![bin.path().to_owned()],
            cache.path().to_owned(),
            FakeExec::default(),
        );
        cni.add(&attachment("live")).await.unwrap();
        cni.add(&attachment("dead")).await.unwrap();
        // A reservation an interrupted ADD left without a cache entry.
        let reservations = ipam.path().join("gcnet");
        std::fs::create_dir_all(&reservations).unwrap();
        std::fs::write(reservations.join("10.244.1.77"), "orphan\r\neth0").unwrap();
        std::fs::write(reservations.join("last_reserved_ip.0"), "10.244.1.77").unwrap();

        let live: HashSet<String> = ["live".to_owned()].into();
        assert!(
            cni.garbage_collect(&live, Duration::from_secs(3600))
                .await
                .is_empty(),
            "too young to collect"
        );
        let released = cni.garbage_collect(&live, Duration::ZERO).await;
        assert_eq!(released, ["dead", "orphan"]);
        let deleted: Vec<String> = cni
            .exec
            .calls()
            .into_iter()
            .filter(|c| c.command() == "DEL" && c.plugin == "bridge")
            .map(|c| c.env["CNI_CONTAINERID"].clone())
            .collect();
        assert_eq!(deleted, ["dead", "orphan"]);
        // DEL removed dead's cache entry; the fake host-local leaves its file, so only the
        // reservation is found again.
        assert_eq!(cni.garbage_collect(&live, Duration::ZERO).await, ["orphan"]);
        // Its earlier DEL is remembered, but the leftover shows it released nothing: the
        // plugins run again.
        let orphan_dels = cni
            .exec
            .calls()
            .iter()
            .filter(|c| c.command() == "DEL" && c.plugin == "bridge")
            .filter(|c| c.env["CNI_CONTAINERID"] == "orphan")
            .count();
        assert_eq!(orphan_dels, 2);
    }
}
