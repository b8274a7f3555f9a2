//! The node side of a CSI driver: `NodeGetInfo`, `NodeGetCapabilities`, stage, publish and
//! their reverse, `NodeGetVolumeStats` (the kubelet's `csi_client.go`). [`NodeClient`] is
//! the boundary; [`GrpcConnector`] dials the driver's endpoint, each call with the
//! kubelet's 2 min deadline.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::Status;
use tonic::transport::Channel;

use super::api::{self, node_client::NodeClient as GrpcNode, node_service_capability};
use crate::pluginmanager::unix_channel;

/// The deadline of each CSI call (the kubelet's `csiTimeout`).
const CSI_TIMEOUT: Duration = Duration::from_secs(120);
/// How long dialling the driver's socket may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A reply or the driver's gRPC status.
pub type Reply<'a, T> = BoxFuture<'a, Result<T, Status>>;

/// The CSI `Node` service of one driver.
pub trait NodeClient: Send + Sync {
    /// `NodeGetInfo`.
    fn node_get_info(&self) -> Reply<'_, api::NodeGetInfoResponse>;
    /// `NodeGetCapabilities`, as the RPC types the driver announces.
    fn node_get_capabilities(&self) -> Reply<'_, Vec<node_service_capability::rpc::Type>>;
    /// `NodeStageVolume`.
    fn node_stage_volume(&self, request: api::NodeStageVolumeRequest) -> Reply<'_, ()>;
    /// `NodeUnstageVolume`.
    fn node_unstage_volume(&self, request: api::NodeUnstageVolumeRequest) -> Reply<'_, ()>;
    /// `NodePublishVolume`.
    fn node_publish_volume(&self, request: api::NodePublishVolumeRequest) -> Reply<'_, ()>;
    /// `NodeUnpublishVolume`.
    fn node_unpublish_volume(&self, request: api::NodeUnpublishVolumeRequest) -> Reply<'_, ()>;
    /// `NodeGetVolumeStats`.
    fn node_get_volume_stats(
        &self,
        request: api::NodeGetVolumeStatsRequest,
    ) -> Reply<'_, api::NodeGetVolumeStatsResponse>;
}

/// Makes the client of the driver at an endpoint.
pub trait Connector: Send + Sync + 'static {
    /// The `Node` client of the driver listening at `endpoint`.
    fn connect(&self, endpoint: &str) -> Arc<dyn NodeClient>;
}

/// [`Connector`] over gRPC on the driver's Unix socket.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcConnector;

impl Connector for GrpcConnector {
    fn connect(&self, endpoint: &str) -> Arc<dyn NodeClient> {
        Arc::new(GrpcNodeClient(GrpcNode::new(unix_channel(
            endpoint,
            DIAL_TIMEOUT,
        ))))
    }
}

struct GrpcNodeClient(GrpcNode<Channel>);

/// The RPC capabilities of a `NodeGetCapabilities` answer (others are ignored).
pub(crate) fn capability_types(
    reply: &api::NodeGetCapabilitiesResponse,
) -> Vec<node_service_capability::rpc::Type> {
    reply
        .capabilities
        .iter()
        .filter_map(|c| match c.r#type.as_ref()? {
            node_service_capability::Type::Rpc(rpc) => Some(rpc.r#type()),
        })
        .collect()
}

fn deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CSI_TIMEOUT);
    request
}

impl NodeClient for GrpcNodeClient {
    fn node_get_info(&self) -> Reply<'_, api::NodeGetInfoResponse> {
        let mut client = self.0.clone();
        Box::pin(async move {
            let reply = client
                .node_get_info(deadline(api::NodeGetInfoRequest {}))
                .await?;
            Ok(reply.into_inner())
        })
    }

    fn node_get_capabilities(&self) -> Reply<'_, Vec<node_service_capability::rpc::Type>> {
        let mut client = self.0.clone();
        Box::pin(async move {
            let reply = client
                .node_get_capabilities(deadline(api::NodeGetCapabilitiesRequest {}))
                .await?;
            Ok(capability_types(&reply.into_inner()))
        })
    }

    fn node_stage_volume(&self, request: api::NodeStageVolumeRequest) -> Reply<'_, ()> {
        let mut client = self.0.clone();
        Box::pin(async move { client.node_stage_volume(deadline(request)).await.map(drop) })
    }

    fn node_unstage_volume(&self, request: api::NodeUnstageVolumeRequest) -> Reply<'_, ()> {
        let mut client = self.0.clone();
        Box::pin(async move {
            client
                .node_unstage_volume(deadline(request))
                .await
                .map(drop)
        })
    }

    fn node_publish_volume(&self, request: api::NodePublishVolumeRequest) -> Reply<'_, ()> {
        let mut client = self.0.clone();
        Box::pin(async move {
            client
                .node_publish_volume(deadline(request))
                .await
                .map(drop)
        })
    }

    fn node_unpublish_volume(&self, request: api::NodeUnpublishVolumeRequest) -> Reply<'_, ()> {
        let mut client = self.0.clone();
        Box::pin(async move {
            client
                .node_unpublish_volume(deadline(request))
                .await
                .map(drop)
        })
    }

    fn node_get_volume_stats(
        &self,
        request: api::NodeGetVolumeStatsRequest,
    ) -> Reply<'_, api::NodeGetVolumeStatsResponse> {
        let mut client = self.0.clone();
        Box::pin(async move {
            let reply = client.node_get_volume_stats(deadline(request)).await?;
            Ok(reply.into_inner())
        })
    }
}
