//! What node status needs from the container runtime (its version, its health, its
//! images) and from the rest of the agent (readiness checks such as the PLEG's).

use std::fmt;
use std::path::PathBuf;

use futures::future::BoxFuture;

use crate::cri::{self, Cri, CriError, RuntimeHealth, api};

/// The runtime's name and version, as `nodeInfo.containerRuntimeVersion` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// The runtime's name, e.g. `containerd`.
    pub name: String,
    /// The runtime's version, e.g. `1.6.20~ds1`.
    pub version: String,
}

impl fmt::Display for RuntimeVersion {
    /// `containerd://1.6.20~ds1`, the kubelet's `<type>://<version>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.name, self.version)
    }
}

/// The container runtime as node status sees it. Implemented for every [`Cri`] (so for
/// [`cri::CriClient`]); object safe, so the agent holds an `Arc<dyn ContainerRuntime>`.
pub trait ContainerRuntime: Send + Sync {
    /// CRI `Version`.
    fn runtime_version(&self) -> BoxFuture<'_, Result<RuntimeVersion, CriError>>;
    /// CRI `Status`, read as RuntimeReady and NetworkReady.
    fn runtime_health(&self) -> BoxFuture<'_, Result<RuntimeHealth, CriError>>;
    /// CRI `ListImages`: every image in the runtime's store.
    fn image_list(&self) -> BoxFuture<'_, Result<Vec<api::Image>, CriError>>;
    /// CRI `ImageFsInfo`: the mount point of the filesystem holding the runtime's images
    /// (the imagefs of the eviction signals and image GC); `None` when it names none.
    fn image_fs_mountpoint(&self) -> BoxFuture<'_, Result<Option<PathBuf>, CriError>>;
}

impl<C: Cri> ContainerRuntime for C {
    fn runtime_version(&self) -> BoxFuture<'_, Result<RuntimeVersion, CriError>> {
        Box::pin(async move {
            let v = Cri::version(self, cri::version_request()).await?;
            Ok(RuntimeVersion {
                name: v.runtime_name,
                version: v.runtime_version,
            })
        })
    }

    fn runtime_health(&self) -> BoxFuture<'_, Result<RuntimeHealth, CriError>> {
        Box::pin(async move {
            let status = Cri::status(self, api::StatusRequest { verbose: false }).await?;
            Ok(RuntimeHealth::from(&status))
        })
    }

    fn image_list(&self) -> BoxFuture<'_, Result<Vec<api::Image>, CriError>> {
        Box::pin(async move {
            let resp = Cri::list_images(self, api::ListImagesRequest { filter: None }).await?;
            Ok(resp.images)
        })
    }

    fn image_fs_mountpoint(&self) -> BoxFuture<'_, Result<Option<PathBuf>, CriError>> {
        Box::pin(async move {
            let info = Cri::image_fs_info(self, api::ImageFsInfoRequest {}).await?;
            Ok(info
                .image_filesystems
                .into_iter()
                .find_map(|f| f.fs_id.map(|id| PathBuf::from(id.mountpoint))))
        })
    }
}

/// Where the runtime keeps its images, asked with a deadline (a hung runtime leaves the
/// imagefs signals unobserved, as an unreadable figure does).
pub async fn image_fs_mountpoint(runtime: &dyn ContainerRuntime) -> Option<PathBuf> {
    match tokio::time::timeout(IMAGE_FS_TIMEOUT, runtime.image_fs_mountpoint()).await {
        Ok(Ok(mountpoint)) => mountpoint,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "image filesystem unavailable");
            None
        }
        Err(_) => {
            tracing::warn!(timeout = ?IMAGE_FS_TIMEOUT, "image filesystem query timed out");
            None
        }
    }
}

/// The deadline of [`image_fs_mountpoint`].
const IMAGE_FS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A health check that the Ready condition depends on, like the kubelet's
/// `runtimeState.addHealthCheck("PLEG", ...)`. A failing check makes the node NotReady with
/// the message `<name> is not healthy: <error>`.
pub trait ReadinessCheck: Send + Sync {
    /// The checked component, e.g. `PLEG`.
    fn name(&self) -> &str;
    /// `Err` with a short explanation when the component is unhealthy. Must be cheap and
    /// must not block: it is called at every node status computation.
    ///
    /// # Errors
    /// The reason the component is unhealthy.
    fn check(&self) -> Result<(), String>;
}

#[cfg(test)]
pub(crate) mod fake {
    //! A [`Cri`] answering `Version`, `Status` and `ListImages` from figures the test sets.

    use std::sync::Mutex;

    use super::*;
    use crate::cri::{NETWORK_READY, RUNTIME_READY};

    /// The runtime's answers; `None` makes `Status` fail as if the runtime were down.
    #[derive(Debug)]
    pub struct FakeRuntime {
        pub conditions: Mutex<Option<Vec<api::RuntimeCondition>>>,
        pub images: Mutex<Vec<api::Image>>,
    }

    pub fn condition(
        kind: &str,
        ready: bool,
        reason: &str,
        message: &str,
    ) -> api::RuntimeCondition {
        api::RuntimeCondition {
            r#type: kind.into(),
            status: ready,
            reason: reason.into(),
            message: message.into(),
        }
    }

    impl Default for FakeRuntime {
        fn default() -> Self {
            Self {
                conditions: Mutex::new(Some(vec![
                    condition(RUNTIME_READY, true, "", ""),
                    condition(NETWORK_READY, true, "", ""),
                ])),
                images: Mutex::new(Vec::new()),
            }
        }
    }

    impl FakeRuntime {
        pub fn set_conditions(&self, conditions: Option<Vec<api::RuntimeCondition>>) {
            *self.conditions.lock().unwrap() = conditions;
        }
    }

    impl Cri for FakeRuntime {
        async fn version(&self, _req: api::VersionRequest) -> cri::Result<api::VersionResponse> {
            Ok(api::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "containerd".into(),
                runtime_version: "1.6.20~ds1".into(),
                runtime_api_version: "v1".into(),
            })
        }

        async fn status(&self, _req: api::StatusRequest) -> cri::Result<api::StatusResponse> {
            let conditions = self.conditions.lock().unwrap().clone();
            conditions
                .map(|conditions| api::StatusResponse {
                    status: Some(api::RuntimeStatus { conditions }),
                    info: Default::default(),
                })
                .ok_or(CriError::Rpc {
                    rpc: "Status",
                    code: tonic::Code::Unavailable,
                    message: "connection refused".into(),
                })
        }

        async fn list_images(
            &self,
            _req: api::ListImagesRequest,
        ) -> cri::Result<api::ListImagesResponse> {
            Ok(api::ListImagesResponse {
                images: self.images.lock().unwrap().clone(),
            })
        }
    }

    /// A readiness check that fails with the given message.
    pub struct Failing(pub &'static str, pub &'static str);

    impl ReadinessCheck for Failing {
        fn name(&self) -> &str {
            self.0
        }
        fn check(&self) -> Result<(), String> {
            Err(self.1.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeRuntime;
    use super::*;

    #[tokio::test]
    async fn every_cri_is_a_container_runtime() {
        let runtime: std::sync::Arc<dyn ContainerRuntime> =
            std::sync::Arc::new(FakeRuntime::default());
        let version = runtime.runtime_version().await.unwrap();
        assert_eq!(version.to_string(), "containerd://1.6.20~ds1");
        assert!(runtime.runtime_health().await.unwrap().ready());
        assert!(runtime.image_list().await.unwrap().is_empty());
    }
}
