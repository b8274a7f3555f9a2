//! The on-disk cache of attachments, laid out like libcni's:
//! `<cache_dir>/results/<network>-<container id>-<ifname>`, one JSON file per attachment
//! holding the result AND everything needed to undo it (the exact config list, `CNI_ARGS`,
//! port mappings, netns), so `DEL` works after an agent restart and after the config on
//! disk changed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{CniError, CniResult, NetworkConfigList, PortMapping};
use crate::atomic_file;

/// The `kind` of entries this version writes.
const KIND: &str = "rkubeletCniCacheV1";

/// What an `ADD` left, as cached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CacheEntry {
    pub kind: String,
    pub container_id: String,
    pub if_name: String,
    pub network_name: String,
    /// The netns path given to `ADD`.
    pub netns: String,
    /// The config list the chain ran with.
    pub config: NetworkConfigList,
    /// The `CNI_ARGS` given to every plugin.
    pub cni_args: String,
    /// The `portMappings` runtime config given to plugins with that capability.
    pub port_mappings: Vec<PortMapping>,
    /// The chain's result.
    pub result: CniResult,
}

impl CacheEntry {
    pub fn new(
        container_id: &str,
        if_name: &str,
        netns: &str,
        config: NetworkConfigList,
        cni_args: String,
        port_mappings: Vec<PortMapping>,
        result: CniResult,
    ) -> Self {
        Self {
            kind: KIND.into(),
            container_id: container_id.into(),
            if_name: if_name.into(),
            network_name: config.name().into(),
            netns: netns.into(),
            config,
            cni_args,
            port_mappings,
            result,
        }
    }
}

/// The cache directory.
#[derive(Debug, Clone)]
pub(crate) struct ResultCache {
    results: PathBuf,
}

impl ResultCache {
    pub fn new(cache_dir: &Path) -> Self {
        Self {
            results: cache_dir.join("results"),
        }
    }

    /// The file of one attachment. Container id and ifname are validated by the caller
    /// (no `/`), the network name by the config list.
    pub fn path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.results
            .join(format!("{network}-{container_id}-{ifname}"))
    }

    /// The entry in `path`, or `None` if there is none.
    pub async fn load(&self, path: &Path) -> Result<Option<CacheEntry>, CniError> {
        let bytes = match tokio::fs::read(path).await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CniError::Io {
                    op: "reading CNI result cache",
                    path: path.to_owned(),
                    source,
                });
            }
        };
        decode_entry(path, &bytes).map(Some)
    }

    /// The entries in the results dir (none if it does not exist); temporaries are not
    /// entries.
    pub async fn files(&self) -> Result<Vec<PathBuf>, CniError> {
        let io = |source| CniError::Io {
            op: "listing CNI result cache",
            path: self.results.clone(),
            source,
        };
        let mut entries = match tokio::fs::read_dir(&self.results).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(e)),
        };
        let mut files = Vec::new();
        while let Some(entry) = entries.next_entry().await.map_err(io)? {
            if !atomic_file::is_temp_name(&entry.file_name().to_string_lossy()) {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }

    /// Writes the entry atomically (temporary file, fsync, rename).
    pub async fn store(&self, entry: &CacheEntry) -> Result<(), CniError> {
        let path = self.path(&entry.network_name, &entry.container_id, &entry.if_name);
        tokio::fs::create_dir_all(&self.results)
            .await
            .map_err(|source| CniError::Io {
                op: "creating CNI result cache dir",
                path: self.results.clone(),
                source,
            })?;
        let bytes = serde_json::to_vec(entry).map_err(|e| CniError::InvalidCache {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let write = tokio::task::spawn_blocking(move || {
            let staged = atomic_file::stage(&path, &bytes, 0o600)?;
            crate::fault::point(crate::fault::CNI_CACHE_WRITE);
            staged.commit()
        });
        match write.await {
            Ok(written) => Ok(written?),
            Err(e) => Err(CniError::Io {
                op: "writing CNI result cache",
                path: self.results.clone(),
                source: std::io::Error::other(e),
            }),
        }
    }

    /// Removes the temporaries a crash left in the results dir: at start-up, before any
    /// `ADD` of this agent runs. Returns how many there were.
    pub async fn sweep(&self) -> Result<usize, CniError> {
        Ok(atomic_file::sweep_async(&self.results, "").await?.len())
    }

    /// Removes the entry in `path`; an absent one is fine.
    pub async fn remove(&self, path: &Path) -> Result<(), CniError> {
        match tokio::fs::remove_file(path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CniError::Io {
                op: "removing CNI result cache entry",
                path: path.to_owned(),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

/// A cache file's entry (`path` names it in errors).
///
/// # Errors
/// [`CniError::InvalidCache`]: not JSON of an entry, or of another kind.
pub(crate) fn decode_entry(path: &Path, bytes: &[u8]) -> Result<CacheEntry, CniError> {
    let invalid = |reason: String| CniError::InvalidCache {
        path: path.to_owned(),
        reason,
    };
    let entry: CacheEntry = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    if entry.kind != KIND {
        return Err(invalid(format!("unknown kind {:?}", entry.kind)));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Protocol;
    use crate::cni::testutil::TempDir;
    use serde_json::json;

    fn entry() -> CacheEntry {
        let config = NetworkConfigList::parse(
            "t",
            br#"{"cniVersion":"0.4.0","name":"net","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let result = CniResult::from_json(
            json!({"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/24"}]}),
        )
        .unwrap();
        CacheEntry::new(
            "c1",
            "eth0",
            "/run/netns/x",
            config,
            "IgnoreUnknown=1".into(),
            vec![PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: Protocol::Tcp,
                host_ip: String::new(),
            }],
            result,
        )
    }

    #[tokio::test]
    async fn entries_round_trip_under_the_libcni_layout() {
        let dir = TempDir::new("cache");
        let cache = ResultCache::new(dir.path());
        let file = dir.path().join("results/net-c1-eth0");
        assert_eq!(cache.path("net", "c1", "eth0"), file);
        assert_eq!(cache.load(&file).await.unwrap(), None);
        assert!(cache.files().await.unwrap().is_empty());
        cache.store(&entry()).await.unwrap();
        let on_disk: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(on_disk["kind"], KIND);
        assert_eq!(on_disk["config"]["name"], "net");
        assert_eq!(on_disk["portMappings"][0]["hostPort"], 8080);
        assert_eq!(cache.load(&file).await.unwrap(), Some(entry()));
        assert_eq!(
            cache.files().await.unwrap(),
            std::slice::from_ref(&file),
            "no temp file left"
        );
        cache.remove(&file).await.unwrap();
        cache.remove(&file).await.unwrap();
        assert!(!file.exists());
    }

    #[tokio::test]
    async fn a_corrupt_entry_is_reported_with_its_path() {
        let dir = TempDir::new("corrupt");
        let cache = ResultCache::new(dir.path());
        std::fs::create_dir_all(dir.path().join("results")).unwrap();
        let file = dir.path().join("results/net-c1-eth0");
        std::fs::write(&file, b"{").unwrap();
        let err = cache.load(&file).await.unwrap_err();
        assert!(
            matches!(&err, CniError::InvalidCache { path, .. } if path.ends_with("net-c1-eth0")),
            "{err}"
        );
    }
}
