//! Garbage collection of attachments whose sandbox is gone. When the agent dies in the
//! middle of an `ADD`, containerd rolls the sandbox back with a `DEL` through the thin
//! plugin — which then reaches nobody — so IP reservations (and cache entries) stay behind.
//! Like containerd's and CRI-O's network GC, the agent later runs `DEL` for every
//! attachment (a cache entry or a host-local reservation of its network) whose container
//! is no sandbox of the runtime and is not being worked on.
//!
//! A sandbox the runtime is still creating is listed only once `RunPodSandbox` returns,
//! after its `ADD`: so an attachment is released only once the agent has seen it unlisted
//! for the grace period, measured on the monotonic clock (files' times and the wall clock
//! may jump), and never when it was first seen after a `RunPodSandbox` still under way
//! began (it may be that sandbox's, however slow the runtime is).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Attachment, Cni, POD_IFNAME, PluginExec};

/// When the collector first found each attachment (container id, interface) without a
/// sandbox in the runtime.
#[derive(Debug, Default)]
pub(super) struct Unlisted(Mutex<HashMap<(String, String), Instant>>);

impl Unlisted {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Instant>> {
        crate::lock::lock(&self.0)
    }
}

/// host-local's reservations in `dir`: files named by IP holding
/// `<container id>\r\n<ifname>` (the ifname line is missing in old versions).
async fn reservations(dir: &Path) -> Vec<(String, String)> {
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
        let Ok(text) = tokio::fs::read_to_string(&path).await else {
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
            out.push((id, ifname));
        }
    }
    out
}

impl<E: PluginExec> Cni<E> {
    /// Runs `DEL` for every attachment of this network whose container id has not been in
    /// `live` (the runtime's sandbox ids, listed before this call) since this collector
    /// first found it at least `grace` ago, that has no operation under way, and that was
    /// first found before `creating_since` (when the oldest `RunPodSandbox` still under way
    /// began, if any). Returns the container ids released; failures are logged and retried
    /// at the next collection.
    pub async fn garbage_collect(
        &self,
        live: &HashSet<String>,
        grace: Duration,
        creating_since: Option<Instant>,
    ) -> Vec<String> {
        let mut found: HashSet<(String, String)> = HashSet::new();
        let files: Vec<PathBuf> = self.cache.files().await.unwrap_or_default();
        for path in files {
            let Ok(Some(entry)) = self.cache.load(&path).await else {
                continue;
            };
            found.insert((entry.container_id, entry.if_name));
        }
        for dir in self.network.host_local_dirs() {
            found.extend(reservations(&dir).await);
        }
        let now = Instant::now();
        let candidates: BTreeMap<(String, String), Instant> = {
            let mut unlisted = self.unlisted.lock();
            unlisted.retain(|key, _| found.contains(key) && !live.contains(&key.0));
            found
                .into_iter()
                .filter(|key| !live.contains(&key.0))
                .map(|key| {
                    let since = *unlisted.entry(key.clone()).or_insert(now);
                    (key, since)
                })
                .collect()
        };
        tracing::debug!(
            candidates = candidates.len(),
            live = live.len(),
            "network garbage collection"
        );
        let mut released = Vec::new();
        for ((container_id, ifname), since) in candidates {
            let young = now.duration_since(since) < grace;
            let maybe_creating = creating_since.is_some_and(|c| since >= c);
            if young || maybe_creating || self.in_flight(&container_id) {
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
                    self.unlisted
                        .lock()
                        .remove(&(container_id.clone(), att.ifname.clone()));
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

    /// A network of the bridge plugin with host-local IPAM in temporary dirs, run by the
    /// fake executor.
    struct Net {
        cni: Cni<FakeExec>,
        ipam: TempDir,
        _dirs: (TempDir, TempDir),
    }

    fn network() -> Net {
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
        Net {
            cni,
            ipam,
            _dirs: (bin, cache),
        }
    }

    fn dels(cni: &Cni<FakeExec>) -> Vec<String> {
        cni.exec
            .calls()
            .into_iter()
            .filter(|c| c.command() == "DEL" && c.plugin == "bridge")
            .map(|c| c.env["CNI_CONTAINERID"].clone())
            .collect()
    }

    #[tokio::test]
    async fn releases_attachments_of_gone_sandboxes_only() {
        let net = network();
        let (cni, ipam) = (&net.cni, &net.ipam);
        cni.add(&attachment("live")).await.unwrap();
        cni.add(&attachment("dead")).await.unwrap();
        // A reservation an interrupted ADD left without a cache entry.
        let reservations = ipam.path().join("gcnet");
        std::fs::create_dir_all(&reservations).unwrap();
        std::fs::write(reservations.join("10.244.1.77"), "orphan\r\neth0").unwrap();
        std::fs::write(reservations.join("last_reserved_ip.0"), "10.244.1.77").unwrap();

        let live: HashSet<String> = ["live".to_owned()].into();
        let grace = Duration::from_millis(200);
        assert!(
            cni.garbage_collect(&live, grace, None).await.is_empty(),
            "just found: within the grace period"
        );
        tokio::time::sleep(grace).await;
        let released = cni.garbage_collect(&live, grace, None).await;
        assert_eq!(released, ["dead", "orphan"]);
        assert_eq!(dels(cni), ["dead", "orphan"]);
        // DEL removed dead's cache entry; the fake host-local leaves its file, so only the
        // reservation is found again: as new, after the grace period again.
        assert!(cni.garbage_collect(&live, grace, None).await.is_empty());
        tokio::time::sleep(grace).await;
        assert_eq!(cni.garbage_collect(&live, grace, None).await, ["orphan"]);
        // Its earlier DEL is remembered, but the leftover shows it released nothing: the
        // plugins run again.
        let orphan_dels = dels(cni).iter().filter(|id| *id == "orphan").count();
        assert_eq!(orphan_dels, 2);
    }

    /// A sandbox whose RunPodSandbox is slow: its attachment exists (ADD done) but the
    /// runtime does not list it yet. It is kept however long the call takes; a leak
    /// found before the call began is still released.
    #[tokio::test]
    async fn attachments_of_a_sandbox_being_created_are_kept() {
        let net = network();
        let cni = &net.cni;
        cni.add(&attachment("leaked")).await.unwrap();
        let none = HashSet::new();
        let grace = Duration::from_millis(100);
        assert!(cni.garbage_collect(&none, grace, None).await.is_empty());
        let creation_began = Instant::now();
        cni.add(&attachment("creating")).await.unwrap();
        for _ in 0..3 {
            tokio::time::sleep(grace).await;
            let released = cni
                .garbage_collect(&none, grace, Some(creation_began))
                .await;
            assert!(!released.contains(&"creating".to_owned()), "{released:?}");
        }
        assert_eq!(dels(cni), ["leaked"]);
        // The call returned and the runtime lists the sandbox: it stays.
        let live: HashSet<String> = ["creating".to_owned()].into();
        tokio::time::sleep(grace).await;
        assert!(cni.garbage_collect(&live, grace, None).await.is_empty());
    }

    /// The wall clock (or a file's time) jumping says nothing about how long the agent has
    /// seen an attachment unlisted: a cache entry dated an hour back is not collected at
    /// once.
    #[tokio::test]
    async fn file_times_and_clock_jumps_do_not_age_attachments() {
        let net = network();
        let cni = &net.cni;
        cni.add(&attachment("new")).await.unwrap();
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        for path in cni.cache.files().await.unwrap() {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(hour_ago).unwrap();
        }
        let none = HashSet::new();
        let grace = Duration::from_secs(30);
        assert!(cni.garbage_collect(&none, grace, None).await.is_empty());
        assert!(dels(cni).is_empty());
    }
}
