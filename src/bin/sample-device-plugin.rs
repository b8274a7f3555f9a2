//! A device plugin for the tests (`deviceplugin/v1beta1`), after Kubernetes' sample device
//! plugin (`test/images/sample-device-plugin`): its devices are files in a directory.
//!
//! ```text
//! sample-device-plugin <device-plugin-dir> <devices-dir> <resource> <count> [--pre-start]
//! ```
//!
//! - Makes `<devices-dir>/dev-<i>` (holding its ID) for `i` in `0..count`, serves the
//!   `DevicePlugin` service on `<device-plugin-dir>/sample-<pid>.sock` and registers
//!   `<resource>` with the agent's `kubelet.sock` (retrying for 30 s).
//! - A device is unhealthy while `<devices-dir>/dev-<i>.unhealthy` exists: the change is
//!   sent on `ListAndWatch` within 200 ms.
//! - `Allocate` answers, for each container: each device file mounted read-only at
//!   `/sample/<id>`, `/dev/null` as the device `/dev/sample-<id>`, the env
//!   `SAMPLE_DEVICES=<ids joined by ,>` and the annotation `example.com/devices`; each
//!   call is appended to `<devices-dir>/allocate.log` (`PreStartContainer` calls, when
//!   `--pre-start` asks for them, to `prestart.log`).
//! - When its socket is removed (the agent removes the files of the directory at start),
//!   it serves a new one and registers again, as plugins do.
//! - SIGTERM or SIGINT: removes its socket and exits 0.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use rkubelet::cm::devicemanager::api::{
    self, device_plugin_server, registration_client::RegistrationClient,
};
use rkubelet::cm::devicemanager::{HEALTHY, KUBELET_SOCKET, UNHEALTHY, VERSION};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tonic::transport::Uri;
use tonic::{Request, Response, Status};

/// How often device health and the socket's presence are looked at.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
struct Plugin {
    devices_dir: PathBuf,
    health: watch::Receiver<Vec<api::Device>>,
    pre_start: bool,
}

fn append(path: &Path, line: &str) -> Result<(), Status> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Status::internal(format!("{}: {e}", path.display())))?;
    writeln!(file, "{line}").map_err(|e| Status::internal(e.to_string()))
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl device_plugin_server::DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(self.options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let stream =
            futures::stream::unfold((self.health.clone(), true), |(mut rx, first)| async move {
                if !first {
                    rx.changed().await.ok()?;
                }
                let devices = rx.borrow_and_update().clone();
                Some((Ok(api::ListAndWatchResponse { devices }), (rx, false)))
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut answer = api::AllocateResponse::default();
        for container in request.into_inner().container_requests {
            let ids = container.devices_i_ds;
            append(&self.devices_dir.join("allocate.log"), &ids.join(","))?;
            let joined = ids.join(",");
            answer
                .container_responses
                .push(api::ContainerAllocateResponse {
                    envs: BTreeMap::from([("SAMPLE_DEVICES".to_owned(), joined.clone())]),
                    mounts: ids
                        .iter()
                        .map(|id| api::Mount {
                            container_path: format!("/sample/{id}"),
                            host_path: self.devices_dir.join(id).to_string_lossy().into_owned(),
                            read_only: true,
                        })
                        .collect(),
                    devices: ids
                        .iter()
                        .map(|id| api::DeviceSpec {
                            container_path: format!("/dev/sample-{id}"),
                            host_path: "/dev/null".into(),
                            permissions: "rw".into(),
                        })
                        .collect(),
                    annotations: BTreeMap::from([("example.com/devices".to_owned(), joined)]),
                });
        }
        Ok(Response::new(answer))
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_i_ds;
        append(&self.devices_dir.join("prestart.log"), &ids.join(","))?;
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

impl Plugin {
    fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions {
            pre_start_required: self.pre_start,
            get_preferred_allocation_available: false,
        }
    }
}

/// The devices as the marker files say.
fn devices(dir: &Path, count: usize) -> Vec<api::Device> {
    (0..count)
        .map(|i| {
            let id = format!("dev-{i}");
            let unhealthy = dir.join(format!("{id}.unhealthy")).exists();
            api::Device {
                id,
                health: if unhealthy { UNHEALTHY } else { HEALTHY }.into(),
                topology: None,
            }
        })
        .collect()
}

/// Registers `resource` served on `endpoint` (a name in `plugin_dir`), retrying for 30 s.
async fn register(
    plugin_dir: &Path,
    endpoint: &str,
    resource: &str,
    options: api::DevicePluginOptions,
) -> Result<(), String> {
    let socket = plugin_dir.join(KUBELET_SOCKET);
    let mut last = String::new();
    for _ in 0..150 {
        let path = socket.clone();
        let channel = tonic::transport::Endpoint::from_static("http://kubelet.local")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            }))
            .await;
        match channel {
            Ok(channel) => {
                let request = api::RegisterRequest {
                    version: VERSION.into(),
                    endpoint: endpoint.into(),
                    resource_name: resource.into(),
                    options: Some(options),
                };
                return RegistrationClient::new(channel)
                    .register(request)
                    .await
                    .map(drop)
                    .map_err(|e| format!("register: {e}"));
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(POLL).await;
    }
    Err(format!("{}: {last}", socket.display()))
}

/// Serves on a new socket and registers, until the socket file goes (then `Ok(true)`:
/// serve again) or a signal comes (`Ok(false)`).
async fn serve_once(
    plugin: &Plugin,
    plugin_dir: &Path,
    resource: &str,
    signals: &mut (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
) -> Result<bool, String> {
    let name = format!("sample-{}.sock", std::process::id());
    let socket = plugin_dir.join(&name);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let (gone_tx, gone_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder().serve_with_incoming_shutdown(
        device_plugin_server::DevicePluginServer::new(plugin.clone()),
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        async {
            let _ = gone_rx.await;
        },
    );
    let server = tokio::spawn(server);
    register(plugin_dir, &name, resource, plugin.options()).await?;
    eprintln!(
        "sample-device-plugin: registered {resource} on {}",
        socket.display()
    );
    let again = loop {
        tokio::select! {
            _ = signals.0.recv() => break false,
            _ = signals.1.recv() => break false,
            () = tokio::time::sleep(POLL) => if !socket.exists() { break true },
        }
    };
    let _ = gone_tx.send(());
    // Open ListAndWatch streams do not end by themselves: the server is dropped.
    server.abort();
    let _ = std::fs::remove_file(&socket);
    Ok(again)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [plugin_dir, devices_dir, resource, count, rest @ ..] = args.as_slice() else {
        eprintln!(
            "usage: sample-device-plugin <device-plugin-dir> <devices-dir> <resource> <count> [--pre-start]"
        );
        return std::process::ExitCode::from(2);
    };
    let Ok(count) = count.parse::<usize>() else {
        eprintln!("sample-device-plugin: bad count {count}");
        return std::process::ExitCode::from(2);
    };
    let devices_dir = PathBuf::from(devices_dir);
    for i in 0..count {
        let id = format!("dev-{i}");
        if let Err(e) = std::fs::write(devices_dir.join(&id), &id) {
            eprintln!("sample-device-plugin: {}: {e}", devices_dir.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    let (health_tx, health) = watch::channel(devices(&devices_dir, count));
    let dir = devices_dir.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(POLL).await;
            let now = devices(&dir, count);
            health_tx.send_if_modified(|old| (*old != now).then(|| *old = now).is_some());
        }
    });
    let plugin = Plugin {
        devices_dir,
        health,
        pre_start: rest.iter().any(|a| a == "--pre-start"),
    };
    let signal = |kind| tokio::signal::unix::signal(kind).expect("signal handler");
    let mut signals = (
        signal(tokio::signal::unix::SignalKind::terminate()),
        signal(tokio::signal::unix::SignalKind::interrupt()),
    );
    loop {
        match serve_once(&plugin, Path::new(plugin_dir), resource, &mut signals).await {
            Ok(true) => eprintln!("sample-device-plugin: socket removed, registering again"),
            Ok(false) => return std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sample-device-plugin: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
}
