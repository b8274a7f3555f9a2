//! A small host-path CSI driver for rkubelet's tests: the identity and node services of
//! the upstream csi-driver-host-path (one directory per volume under `--state-dir`,
//! published by bind mount, staged first with `--stage`, `NodeGetVolumeStats` from
//! statvfs), and the node-driver-registrar's part: a registration socket under
//! `<root-dir>/plugins_registry` answering `GetInfo` and `NotifyRegistrationStatus`.
//!
//! Every node call is appended to `<state-dir>/calls.log` (`<RPC> <volume id> <path>`),
//! so a test can count publishes. The CSI spec's order is checked as a driver of real
//! devices relies on it: a `NodeUnstageVolume` while a target of the volume is still
//! published, or a `NodePublishVolume` from a staging path that is not staged, is logged
//! as a `VIOLATION` line (the publish is refused). `--unstage-delay-ms` makes unstaging
//! slow (a real device's detach), `--stats` answers `NodeGetVolumeStats` with fixed
//! figures instead of statvfs's. On SIGTERM or SIGINT both sockets are removed (the agent
//! deregisters the driver); mounts stay, as with a real driver.
//!
//! An example, not a binary of the package: `cargo test` builds it, `cargo build` and the
//! release package do not.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clap::Parser;
use futures::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::mount::{MsFlags, mount};
use rkubelet::pluginmanager::api as registration;
use rkubelet::pluginmanager::api::registration_server::{Registration, RegistrationServer};
use rkubelet::volume::csi::api;
use rkubelet::volume::csi::api::identity_server::{Identity, IdentityServer};
use rkubelet::volume::csi::api::node_server::{Node, NodeServer};
use rkubelet::volume::{LinuxMounter, Mounter};
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};
use tower::ServiceExt;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// The driver's name.
    #[arg(long, default_value = "hostpath.csi.rkubelet.test")]
    name: String,
    /// The agent's root dir (`plugins_registry` and `plugins/<name>` go under it).
    #[arg(long)]
    root_dir: PathBuf,
    /// Where volumes and the call log are kept.
    #[arg(long)]
    state_dir: PathBuf,
    /// The node ID reported by `NodeGetInfo`.
    #[arg(long)]
    node_id: String,
    /// Announce `STAGE_UNSTAGE_VOLUME` and stage volumes before publishing them.
    #[arg(long)]
    stage: bool,
    /// How long `NodeUnstageVolume` takes before it unmounts.
    #[arg(long, default_value_t = 0)]
    unstage_delay_ms: u64,
    /// `NodeGetVolumeStats` figures, `capacity,available,used,inodes,inodes_free,inodes_used`
    /// (bytes and inodes), instead of the volume's statvfs.
    #[arg(long, value_delimiter = ',')]
    stats: Vec<i64>,
}

type Failed = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Driver {
    args: Args,
    csi_socket: PathBuf,
    log: Arc<Mutex<fs::File>>,
    /// Published targets by volume ID.
    published: Arc<Mutex<HashMap<String, Vec<String>>>>,
}

impl Driver {
    fn record(&self, line: &str) {
        let mut log = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = writeln!(log, "{line}");
    }

    fn published(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn volume_dir(&self, volume_id: &str) -> Result<PathBuf, Status> {
        if volume_id.is_empty() || volume_id.contains('/') || volume_id.starts_with('.') {
            return Err(Status::invalid_argument(format!(
                "bad volume id {volume_id:?}"
            )));
        }
        let dir = self.args.state_dir.join("volumes").join(volume_id);
        fs::create_dir_all(&dir).map_err(internal)?;
        Ok(dir)
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// Whether `path` is a mount point of this mount namespace.
fn is_mount_point(path: &Path) -> Result<bool, Status> {
    let Ok(canonical) = fs::canonicalize(path) else {
        return Ok(false);
    };
    Ok(LinuxMounter
        .mount_points()
        .map_err(internal)?
        .contains(&canonical))
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    fs::create_dir_all(target).map_err(internal)?;
    LinuxMounter.bind_mount(source, target).map_err(internal)?;
    if read_only {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(internal)?;
    }
    Ok(())
}

fn unmount(target: &Path) -> Result<(), Status> {
    if is_mount_point(target)? {
        LinuxMounter.unmount(target).map_err(internal)?;
    }
    match fs::remove_dir(target) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(internal(e)),
        _ => Ok(()),
    }
}

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _: Request<api::GetPluginInfoRequest>,
    ) -> Result<Response<api::GetPluginInfoResponse>, Status> {
        Ok(Response::new(api::GetPluginInfoResponse {
            name: self.args.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<api::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<api::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(api::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(
        &self,
        _: Request<api::ProbeRequest>,
    ) -> Result<Response<api::ProbeResponse>, Status> {
        Ok(Response::new(api::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        request: Request<api::NodeStageVolumeRequest>,
    ) -> Result<Response<api::NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(&format!(
            "NodeStageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        let staging = Path::new(&r.staging_target_path);
        if !is_mount_point(staging)? {
            bind(&self.volume_dir(&r.volume_id)?, staging, false)?;
        }
        Ok(Response::new(api::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<api::NodeUnstageVolumeRequest>,
    ) -> Result<Response<api::NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(&format!(
            "NodeUnstageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        tokio::time::sleep(std::time::Duration::from_millis(self.args.unstage_delay_ms)).await;
        let still = self
            .published()
            .get(&r.volume_id)
            .cloned()
            .unwrap_or_default();
        if !still.is_empty() {
            // Unstaged anyway, as a driver of real devices would (its device detached
            // from under the pod).
            self.record(&format!(
                "VIOLATION NodeUnstageVolume {} while published at {}",
                r.volume_id,
                still.join(" ")
            ));
        }
        unmount(Path::new(&r.staging_target_path))?;
        Ok(Response::new(api::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<api::NodePublishVolumeRequest>,
    ) -> Result<Response<api::NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(&format!(
            "NodePublishVolume {} {}",
            r.volume_id, r.target_path
        ));
        let target = Path::new(&r.target_path);
        if is_mount_point(target)? {
            return Ok(Response::new(api::NodePublishVolumeResponse {}));
        }
        let source = if self.args.stage && !r.staging_target_path.is_empty() {
            let staging = PathBuf::from(&r.staging_target_path);
            if !is_mount_point(&staging)? {
                self.record(&format!(
                    "VIOLATION NodePublishVolume {} from {}, which is not staged",
                    r.volume_id, r.staging_target_path
                ));
                return Err(Status::failed_precondition(format!(
                    "{} is not staged",
                    r.staging_target_path
                )));
            }
            staging
        } else {
            self.volume_dir(&r.volume_id)?
        };
        bind(&source, target, r.readonly)?;
        self.published()
            .entry(r.volume_id.clone())
            .or_default()
            .push(r.target_path.clone());
        let context: Vec<String> = r
            .volume_context
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        self.record(&format!("context {} {}", r.volume_id, context.join(",")));
        Ok(Response::new(api::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<api::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<api::NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(&format!(
            "NodeUnpublishVolume {} {}",
            r.volume_id, r.target_path
        ));
        unmount(Path::new(&r.target_path))?;
        if let Some(targets) = self.published().get_mut(&r.volume_id) {
            targets.retain(|t| t != &r.target_path);
        }
        Ok(Response::new(api::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<api::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<api::NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        self.record(&format!(
            "NodeGetVolumeStats {} {}",
            r.volume_id, r.volume_path
        ));
        let path = Path::new(&r.volume_path);
        if !is_mount_point(path)? {
            return Err(Status::not_found(format!(
                "{} is not published",
                r.volume_path
            )));
        }
        if let [capacity, available, used, inodes, inodes_free, inodes_used] = self.args.stats[..] {
            let usage = |unit: api::volume_usage::Unit, total, available, used| api::VolumeUsage {
                available,
                total,
                used,
                unit: unit.into(),
            };
            return Ok(Response::new(api::NodeGetVolumeStatsResponse {
                usage: vec![
                    usage(api::volume_usage::Unit::Bytes, capacity, available, used),
                    usage(
                        api::volume_usage::Unit::Inodes,
                        inodes,
                        inodes_free,
                        inodes_used,
                    ),
                ],
            }));
        }
        let fs = nix::sys::statvfs::statvfs(path).map_err(internal)?;
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let frsize = fs.fragment_size();
        let usage = |unit: api::volume_usage::Unit, total: u64, free: u64| api::VolumeUsage {
            available: n(free),
            total: n(total),
            used: n(total.saturating_sub(free)),
            unit: unit.into(),
        };
        Ok(Response::new(api::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(
                    api::volume_usage::Unit::Bytes,
                    fs.blocks() * frsize,
                    fs.blocks_available() * frsize,
                ),
                usage(api::volume_usage::Unit::Inodes, fs.files(), fs.files_free()),
            ],
        }))
    }

    async fn node_expand_volume(
        &self,
        _: Request<api::NodeExpandVolumeRequest>,
    ) -> Result<Response<api::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("NodeExpandVolume"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<api::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<api::NodeGetCapabilitiesResponse>, Status> {
        use api::node_service_capability::{Rpc, Type, rpc::Type as Kind};
        let mut kinds = vec![Kind::GetVolumeStats];
        if self.args.stage {
            kinds.push(Kind::StageUnstageVolume);
        }
        let capabilities = kinds
            .into_iter()
            .map(|k| api::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: k.into() })),
            })
            .collect();
        Ok(Response::new(api::NodeGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<api::NodeGetInfoRequest>,
    ) -> Result<Response<api::NodeGetInfoResponse>, Status> {
        Ok(Response::new(api::NodeGetInfoResponse {
            node_id: self.args.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(api::Topology {
                segments: [(
                    "topology.hostpath.csi/node".to_owned(),
                    self.args.node_id.clone(),
                )]
                .into(),
            }),
        }))
    }
}

#[tonic::async_trait]
impl Registration for Driver {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        self.record("GetInfo");
        Ok(Response::new(registration::PluginInfo {
            r#type: rkubelet::pluginmanager::CSI_PLUGIN.into(),
            name: self.args.name.clone(),
            endpoint: self.csi_socket.to_string_lossy().into_owned(),
            supported_versions: vec!["1.0.0".into(), "1.2.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let r = request.into_inner();
        self.record(&format!(
            "NotifyRegistrationStatus {} {}",
            r.plugin_registered, r.error
        ));
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

type Routed =
    BoxFuture<'static, Result<hyper::Response<tonic::body::Body>, std::convert::Infallible>>;

/// Serves gRPC over HTTP/2 on `listener`, each request handed to `route`.
async fn serve(
    listener: UnixListener,
    route: Arc<dyn Fn(hyper::Request<hyper::body::Incoming>) -> Routed + Send + Sync>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let route = Arc::clone(&route);
        let service = hyper::service::service_fn(move |request| route(request));
        tokio::spawn(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service),
        );
    }
}

fn bind_socket(path: &Path) -> Result<UnixListener, Failed> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let _ = fs::remove_file(path);
    Ok(UnixListener::bind(path)?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failed> {
    let args = Args::parse();
    if !matches!(args.stats.len(), 0 | 6) {
        return Err(format!("--stats takes 6 figures, not {}", args.stats.len()).into());
    }
    fs::create_dir_all(&args.state_dir)?;
    let csi_socket = args
        .root_dir
        .join("plugins")
        .join(&args.name)
        .join("csi.sock");
    let registration_socket = args
        .root_dir
        .join(rkubelet::pluginmanager::REGISTRY_DIR)
        .join(format!("{}-reg.sock", args.name));
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(args.state_dir.join("calls.log"))?;
    let driver = Driver {
        args,
        csi_socket: csi_socket.clone(),
        log: Arc::new(Mutex::new(log)),
        published: Arc::default(),
    };
    let identity = IdentityServer::new(driver.clone());
    let node = NodeServer::new(driver.clone());
    let csi = serve(
        bind_socket(&csi_socket)?,
        Arc::new(
            move |request: hyper::Request<hyper::body::Incoming>| -> Routed {
                if request.uri().path().starts_with("/csi.v1.Identity/") {
                    Box::pin(identity.clone().oneshot(request))
                } else {
                    Box::pin(node.clone().oneshot(request))
                }
            },
        ),
    );
    let registrar = RegistrationServer::new(driver);
    let registration = serve(
        bind_socket(&registration_socket)?,
        Arc::new(move |request| -> Routed { Box::pin(registrar.clone().oneshot(request)) }),
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        () = csi => {}
        () = registration => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let _ = fs::remove_file(&registration_socket);
    let _ = fs::remove_file(&csi_socket);
    Ok(())
}
