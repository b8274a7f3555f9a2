//! One registered device plugin (the kubelet's `endpoint.go`): the connection to its
//! socket, made within 10 s as the kubelet's blocking dial, and its calls.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};

use super::DeviceError;
use super::api::{self, device_plugin_client::DevicePluginClient};

/// The kubelet's dial timeout.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The kubelet's `KubeletPreStartContainerRPCTimeoutInSecs`.
const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// A connected plugin.
#[derive(Debug, Clone)]
pub(super) struct PluginClient(DevicePluginClient<Channel>);

impl PluginClient {
    /// Connects to the plugin serving `socket`.
    pub async fn dial(socket: &Path) -> Result<Self, DeviceError> {
        let path = socket.to_path_buf();
        // The URI is required by tonic but unused: the connector dials the socket.
        let endpoint = tonic::transport::Endpoint::from_static("http://device-plugin.local")
            .connect_timeout(DIAL_TIMEOUT);
        let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }));
        let channel = tokio::time::timeout(DIAL_TIMEOUT, connect)
            .await
            .map_err(|_| DeviceError::Dial(format!("{}: timed out", socket.display())))?
            .map_err(|e| DeviceError::Dial(format!("{}: {e}", socket.display())))?;
        Ok(Self(DevicePluginClient::new(channel)))
    }

    /// The `ListAndWatch` stream.
    pub async fn list_and_watch(
        &self,
    ) -> Result<tonic::Streaming<api::ListAndWatchResponse>, DeviceError> {
        let answer = self.0.clone().list_and_watch(api::Empty {}).await;
        answer
            .map(tonic::Response::into_inner)
            .map_err(|status| DeviceError::Rpc {
                rpc: "ListAndWatch",
                status: Box::new(status),
            })
    }

    /// `Allocate` for one container's devices: its answer.
    pub async fn allocate(
        &self,
        devices: Vec<String>,
    ) -> Result<api::ContainerAllocateResponse, DeviceError> {
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_i_ds: devices,
            }],
        };
        let answer = self.0.clone().allocate(request).await;
        let answer = answer.map_err(|status| DeviceError::Rpc {
            rpc: "Allocate",
            status: Box::new(status),
        })?;
        let answer = answer.into_inner();
        answer
            .container_responses
            .into_iter()
            .next()
            .ok_or_else(|| {
                DeviceError::Allocation("no containers return in allocation response".into())
            })
    }

    /// `PreStartContainer` for one container's devices, within 30 s.
    pub async fn pre_start(&self, devices: Vec<String>) -> Result<(), DeviceError> {
        let mut request = tonic::Request::new(api::PreStartContainerRequest {
            devices_i_ds: devices,
        });
        request.set_timeout(PRE_START_TIMEOUT);
        let answer = self.0.clone().pre_start_container(request).await;
        answer.map(drop).map_err(|status| DeviceError::Rpc {
            rpc: "PreStartContainer",
            status: Box::new(status),
        })
    }
}
