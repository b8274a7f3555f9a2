//! A fake CSI driver's node service and a fake API for the plugin's tests.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::CSIDriver;
use tonic::Status;

use super::CsiObjects;
use super::api;
use super::client::{Connector, NodeClient, Reply};
use crate::lock::lock;
use crate::volume::Mounter;
use crate::volume::testing::FakeMounter;
use api::node_service_capability::rpc::Type as Capability;

/// One call the fake driver got.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    Stage(api::NodeStageVolumeRequest),
    Unstage(api::NodeUnstageVolumeRequest),
    Publish(api::NodePublishVolumeRequest),
    Unpublish(api::NodeUnpublishVolumeRequest),
    Stats(api::NodeGetVolumeStatsRequest),
}

/// A driver that "mounts" in a [`FakeMounter`]'s table, with the given capabilities.
#[derive(Clone, Default)]
pub(crate) struct FakeDriver {
    pub(crate) capabilities: Vec<Capability>,
    pub(crate) mounter: FakeMounter,
    pub(crate) calls: Arc<Mutex<Vec<Call>>>,
    /// Endpoints connected to.
    pub(crate) connected: Arc<Mutex<Vec<String>>>,
    /// An error every publish answers with.
    pub(crate) fail_publish: Option<Status>,
    /// How long an unstage takes before it unmounts.
    pub(crate) slow_unstage: std::time::Duration,
}

impl FakeDriver {
    pub(crate) fn calls(&self) -> Vec<Call> {
        std::mem::take(&mut *lock(&self.calls))
    }

    fn record(&self, call: Call) {
        lock(&self.calls).push(call);
    }

    fn mount(&self, path: &str) {
        std::fs::create_dir_all(path).unwrap();
        self.mounter
            .add_existing(&std::fs::canonicalize(path).unwrap());
    }

    fn unmount(&self, path: &str) {
        if let Ok(canonical) = std::fs::canonicalize(path) {
            let _ = self.mounter.unmount(&canonical);
        }
        let _ = std::fs::remove_dir(path);
    }
}

impl Connector for FakeDriver {
    fn connect(&self, endpoint: &str) -> Arc<dyn NodeClient> {
        lock(&self.connected).push(endpoint.to_owned());
        Arc::new(self.clone())
    }
}

fn done<'a, T: Send + 'a>(value: Result<T, Status>) -> Reply<'a, T> {
    Box::pin(async move { value })
}

impl NodeClient for FakeDriver {
    fn node_get_info(&self) -> Reply<'_, api::NodeGetInfoResponse> {
        done(Ok(api::NodeGetInfoResponse {
            node_id: "node-1".into(),
            max_volumes_per_node: 0,
            accessible_topology: Some(api::Topology {
                segments: [("topology.hostpath.csi/node".to_owned(), "node-1".to_owned())].into(),
            }),
        }))
    }

    fn node_get_capabilities(&self) -> Reply<'_, Vec<Capability>> {
        done(Ok(self.capabilities.clone()))
    }

    fn node_stage_volume(&self, request: api::NodeStageVolumeRequest) -> Reply<'_, ()> {
        self.mount(&request.staging_target_path);
        self.record(Call::Stage(request));
        done(Ok(()))
    }

    fn node_unstage_volume(&self, request: api::NodeUnstageVolumeRequest) -> Reply<'_, ()> {
        Box::pin(async move {
            tokio::time::sleep(self.slow_unstage).await;
            self.unmount(&request.staging_target_path);
            self.record(Call::Unstage(request));
            Ok(())
        })
    }

    fn node_publish_volume(&self, request: api::NodePublishVolumeRequest) -> Reply<'_, ()> {
        if let Some(status) = self.fail_publish.clone() {
            self.record(Call::Publish(request));
            return done(Err(status));
        }
        self.mount(&request.target_path);
        self.record(Call::Publish(request));
        done(Ok(()))
    }

    fn node_unpublish_volume(&self, request: api::NodeUnpublishVolumeRequest) -> Reply<'_, ()> {
        self.unmount(&request.target_path);
        self.record(Call::Unpublish(request));
        done(Ok(()))
    }

    fn node_get_volume_stats(
        &self,
        request: api::NodeGetVolumeStatsRequest,
    ) -> Reply<'_, api::NodeGetVolumeStatsResponse> {
        self.record(Call::Stats(request));
        let usage = |unit: api::volume_usage::Unit, total, used| api::VolumeUsage {
            available: total - used,
            total,
            used,
            unit: unit.into(),
        };
        done(Ok(api::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(api::volume_usage::Unit::Bytes, 1000, 250),
                usage(api::volume_usage::Unit::Inodes, 100, 7),
            ],
        }))
    }
}

/// CSIDriver objects and secrets by name.
#[derive(Default)]
pub(crate) struct FakeObjects {
    pub(crate) drivers: BTreeMap<String, CSIDriver>,
    pub(crate) secrets: HashMap<(String, String), Secret>,
    /// CSIDriver reads made.
    pub(crate) driver_reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl CsiObjects for FakeObjects {
    fn csi_driver<'a>(&'a self, name: &'a str) -> BoxFuture<'a, kube::Result<Option<CSIDriver>>> {
        self.driver_reads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let found = self.drivers.get(name).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, kube::Result<Option<Secret>>> {
        let found = self
            .secrets
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned();
        Box::pin(async move { Ok(found) })
    }
}

/// The canonical form of `path` (the fake table holds canonical paths, as mountinfo).
pub(crate) fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}
