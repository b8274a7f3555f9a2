//! Test doubles of the module's boundaries (a fake API server and a mounter that records
//! calls) and a self-removing temporary directory. Compiled for tests only; the pod
//! worker's unit tests may use them too.

use crate::lock::lock;
use crate::watch_manager::CacheError;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::api::VolumeApi;
use super::mounter::Mounter;

/// A group the test process may give its files: any as root (one it is not in, so that
/// the change shows), else its own.
pub(crate) fn fs_group_for_tests() -> u32 {
    if nix::unistd::geteuid().is_root() {
        4321
    } else {
        nix::unistd::getegid().as_raw()
    }
}

/// A directory under the system temp dir, removed with its contents on drop.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(prefix: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "rkubelet-{prefix}-{}-{nanos:x}-{n}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An API server holding a few secrets and config maps; some names answer 403. Clones
/// share their state.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeApi {
    inner: Arc<FakeApiState>,
}

#[derive(Debug, Default)]
struct FakeApiState {
    secrets: Mutex<HashMap<(String, String), Secret>>,
    config_maps: Mutex<HashMap<(String, String), ConfigMap>>,
    forbidden: Mutex<HashSet<String>>,
    token_requests: Mutex<Vec<(String, String, TokenRequest)>>,
}

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// What the cache answers for an object whose watch is refused: it never syncs.
fn forbidden(resource: &'static str) -> CacheError {
    CacheError::NotSynced { resource }
}

impl FakeApi {
    pub(crate) fn with_secret(self, namespace: &str, name: &str, data: &[(&str, &str)]) -> Self {
        let data: BTreeMap<_, _> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect();
        lock(&self.inner.secrets).insert(
            (namespace.into(), name.into()),
            Secret {
                metadata: meta(namespace, name),
                data: Some(data),
                ..Secret::default()
            },
        );
        self
    }

    pub(crate) fn with_config_map(
        self,
        namespace: &str,
        name: &str,
        data: &[(&str, &str)],
        binary_data: &[(&str, &[u8])],
    ) -> Self {
        let data = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let binary_data = binary_data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
            .collect();
        lock(&self.inner.config_maps).insert(
            (namespace.into(), name.into()),
            ConfigMap {
                metadata: meta(namespace, name),
                data: Some(data),
                binary_data: Some(binary_data),
                ..ConfigMap::default()
            },
        );
        self
    }

    /// Every read of an object of this name fails as for a watch the API server refuses.
    pub(crate) fn forbid(self, name: &str) -> Self {
        lock(&self.inner.forbidden).insert(name.into());
        self
    }

    /// The token requests made so far: namespace, service account, request.
    pub(crate) fn token_requests(&self) -> Vec<(String, String, TokenRequest)> {
        lock(&self.inner.token_requests).clone()
    }

    fn check(&self, name: &str, resource: &'static str) -> Result<(), CacheError> {
        if lock(&self.inner.forbidden).contains(name) {
            Err(forbidden(resource))
        } else {
            Ok(())
        }
    }
}

impl VolumeApi for FakeApi {
    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, CacheError> {
        self.check(name, "secret")?;
        Ok(lock(&self.inner.secrets)
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, CacheError> {
        self.check(name, "configmap")?;
        Ok(lock(&self.inner.config_maps)
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> kube::Result<TokenRequest> {
        let mut requests = lock(&self.inner.token_requests);
        requests.push((namespace.into(), service_account.into(), request.clone()));
        let seconds = request.spec.expiration_seconds.unwrap_or(3600);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let expires = i64::try_from(now).unwrap_or(0).saturating_add(seconds);
        let mut response = request.clone();
        response.status = Some(TokenRequestStatus {
            token: format!("token-{}-{service_account}", requests.len()),
            expiration_timestamp: Time(Timestamp::from_second(expires).expect("in range")),
        });
        Ok(response)
    }
}

/// A call made to the [`FakeMounter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MountCall {
    Tmpfs {
        target: PathBuf,
        size: Option<u64>,
    },
    /// `source` as resolved at the call (a `/proc/self/fd` link names the opened file).
    Bind {
        source: PathBuf,
        target: PathBuf,
    },
    Unmount {
        target: PathBuf,
    },
}

/// A mounter that mounts nothing but records calls and keeps a mount table. Clones share
/// their state.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeMounter {
    inner: Arc<FakeMounterState>,
}

#[derive(Debug, Default)]
struct FakeMounterState {
    calls: Mutex<Vec<MountCall>>,
    table: Mutex<Vec<PathBuf>>,
}

impl FakeMounter {
    pub(crate) fn calls(&self) -> Vec<MountCall> {
        lock(&self.inner.calls).clone()
    }

    /// A mount that exists without a call (another program's, or an earlier agent's).
    pub(crate) fn add_existing(&self, target: &Path) {
        lock(&self.inner.table).push(target.to_owned());
    }
}

impl Mounter for FakeMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<u64>) -> io::Result<()> {
        if !target.is_dir() {
            return Err(io::ErrorKind::NotFound.into());
        }
        lock(&self.inner.calls).push(MountCall::Tmpfs {
            target: target.to_owned(),
            size: size_bytes,
        });
        lock(&self.inner.table).push(target.to_owned());
        Ok(())
    }

    fn bind_mount(&self, source: &Path, target: &Path) -> io::Result<()> {
        let source = std::fs::read_link(source).unwrap_or_else(|_| source.to_owned());
        std::fs::symlink_metadata(target)?;
        lock(&self.inner.calls).push(MountCall::Bind {
            source,
            target: target.to_owned(),
        });
        lock(&self.inner.table).push(target.to_owned());
        Ok(())
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        lock(&self.inner.calls).push(MountCall::Unmount {
            target: target.to_owned(),
        });
        let mut table = lock(&self.inner.table);
        match table.iter().rposition(|p| p == target) {
            Some(i) => {
                table.remove(i);
                Ok(())
            }
            None => Err(nix::errno::Errno::EINVAL.into()),
        }
    }

    fn mount_points(&self) -> io::Result<Vec<PathBuf>> {
        Ok(lock(&self.inner.table).clone())
    }
}
