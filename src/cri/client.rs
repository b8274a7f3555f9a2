//! The CRI gRPC client over a Unix socket.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};
use tracing::Instrument;

use super::api::{
    self, image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use super::{CriError, Result};

/// Where the container runtime listens. Only Unix sockets are supported, as by the kubelet
/// on Linux: `unix:///run/containerd/containerd.sock` or a bare absolute path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// The socket path.
    #[must_use]
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl FromStr for Endpoint {
    type Err = CriError;

    fn from_str(s: &str) -> Result<Self> {
        let invalid = |reason| CriError::InvalidEndpoint {
            endpoint: s.to_owned(),
            reason,
        };
        let path = match s.split_once("://") {
            Some(("unix", path)) => path,
            Some(_) => return Err(invalid("only unix:// endpoints are supported")),
            None => s,
        };
        if !path.starts_with('/') {
            return Err(invalid("the socket path must be absolute"));
        }
        Ok(Self { path: path.into() })
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

/// A client for the CRI `RuntimeService` and `ImageService` of one runtime.
///
/// Cheap to clone: clones share one HTTP/2 connection, which reconnects by itself when the
/// runtime restarts.
#[derive(Clone, Debug)]
pub struct CriClient {
    endpoint: Endpoint,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    /// Deadline of every call but image pulls (the kubelet's `--runtime-request-timeout`).
    timeout: Duration,
    /// Deadline of `PullImage`: none for the agent, as the kubelet's CRI client pulls
    /// without one (a large image takes as long as it takes).
    pull_timeout: Option<Duration>,
    /// The `RunPodSandbox` calls under way (shared by clones).
    creations: Arc<Creations>,
}

/// When each `RunPodSandbox` call under way began, by call number.
#[derive(Debug, Default)]
struct Creations {
    next: AtomicU64,
    started: Mutex<BTreeMap<u64, Instant>>,
}

impl Creations {
    fn started(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Instant>> {
        crate::lock::lock(&self.started)
    }
}

/// One `RunPodSandbox` call under way; it ends when dropped.
struct Creating<'a>(&'a Creations, u64);

impl<'a> Creating<'a> {
    fn begin(creations: &'a Creations) -> Self {
        let n = creations.next.fetch_add(1, Ordering::Relaxed);
        creations.started().insert(n, Instant::now());
        Self(creations, n)
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.0.started().remove(&self.1);
    }
}

impl CriClient {
    /// A client for `endpoint` with a deadline of `timeout` on each call, `pull_timeout` on
    /// image pulls (`None`: no deadline). The connection is made at the first call, so an
    /// agent can start before its runtime does.
    #[must_use]
    pub fn new(endpoint: Endpoint, timeout: Duration, pull_timeout: Option<Duration>) -> Self {
        let path = endpoint.path.clone();
        // The URI is required by tonic but unused: the connector dials the socket.
        let channel = tonic::transport::Endpoint::from_static("http://cri.local")
            .connect_timeout(timeout)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            }));
        Self {
            endpoint,
            runtime: RuntimeServiceClient::new(channel.clone()),
            image: ImageServiceClient::new(channel),
            timeout,
            pull_timeout,
            creations: Arc::default(),
        }
    }

    /// When the oldest `RunPodSandbox` call of this client (or its clones) still under way
    /// began: the runtime lists a sandbox only once the call returns, after its network
    /// was set up.
    #[must_use]
    pub fn sandbox_creations_since(&self) -> Option<Instant> {
        self.creations.started().values().min().copied()
    }

    /// The endpoint this client talks to.
    #[must_use]
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Runs one RPC with a deadline (if any), sent to the runtime as `grpc-timeout` too,
    /// and maps its failure to a [`CriError`] naming the RPC.
    async fn call<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        deadline: Option<Duration>,
        req: Req,
        send: F,
    ) -> Result<Resp>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let _creating = (rpc == "RunPodSandbox").then(|| Creating::begin(&self.creations));
        let mut request = tonic::Request::new(req);
        if let Some(deadline) = deadline {
            request.set_timeout(deadline);
        }
        let started = Instant::now();
        let response = send(request).instrument(tracing::info_span!("cri", rpc));
        let outcome = match deadline {
            Some(deadline) => tokio::time::timeout(deadline, response)
                .await
                .map_err(|_| deadline),
            None => Ok(response.await),
        };
        let failed = !matches!(outcome, Ok(Ok(_)));
        crate::metrics::observe_runtime_operation(rpc, started.elapsed(), failed);
        match outcome {
            Err(after) => Err(CriError::Timeout { rpc, after }),
            Ok(Err(status)) => match deadline {
                // The runtime's DeadlineExceeded, or the channel's own enforcement of the
                // grpc-timeout (which cancels the call when it passes).
                Some(after)
                    if status.code() == tonic::Code::DeadlineExceeded
                        || (status.code() == tonic::Code::Cancelled
                            && started.elapsed() >= after) =>
                {
                    Err(CriError::Timeout { rpc, after })
                }
                _ => Err(CriError::Rpc {
                    rpc,
                    code: status.code(),
                    message: status.message().to_owned(),
                }),
            },
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }
}

/// A request's own timeout in seconds (negative: none).
fn seconds(timeout: i64) -> Duration {
    Duration::from_secs(u64::try_from(timeout).unwrap_or(0))
}

/// The deadlines of the calls (the kubelet's remote runtime service).
impl CriClient {
    /// Most calls: `--runtime-request-timeout`.
    fn request_deadline(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    /// `PullImage`: the pull timeout, if any.
    fn pull_deadline(&self) -> Option<Duration> {
        self.pull_timeout
    }

    /// `StopContainer`: the grace period it carries on top of the request timeout.
    fn stop_deadline(&self, grace: i64) -> Option<Duration> {
        Some(self.timeout + seconds(grace))
    }

    /// `ExecSync`: the command's own timeout on top of the request timeout, so the
    /// runtime has time to clean up; a command with no timeout of its own (0: a lifecycle
    /// hook) gets no deadline at all, its caller bounds it.
    fn exec_deadline(&self, timeout: i64) -> Option<Duration> {
        (timeout != 0).then(|| self.timeout + seconds(timeout))
    }
}

/// Generates the [`Cri`] trait, one method per unary RPC (named like the generated
/// client's method, request message in, response message out), and its implementation for
/// [`CriClient`], with the deadline from the named method of [`CriClient`], given the
/// named field of the request where there is one (`StopContainer`'s grace period,
/// `ExecSync`'s timeout).
///
/// Every trait method has a default body answering `Unimplemented`, so a test fake
/// implements only the calls its test needs.
macro_rules! unary_rpcs {
    ($($(#[$doc:meta])* $method:ident => $svc:ident . $rpc:literal ($req:ident) -> $resp:ident within $deadline:ident $(($field:ident))?;)*) => {
        /// The CRI `RuntimeService` and `ImageService` calls the agent makes. Implemented by
        /// [`CriClient`] for a real runtime, and by fakes in tests.
        pub trait Cri: Send + Sync + 'static {
            $(
                $(#[$doc])*
                fn $method(&self, req: api::$req) -> impl Future<Output = Result<api::$resp>> + Send {
                    let _ = req;
                    std::future::ready(Err(CriError::Rpc {
                        rpc: $rpc,
                        code: tonic::Code::Unimplemented,
                        message: "not implemented by this runtime".into(),
                    }))
                }
            )*
        }

        impl Cri for CriClient {
            $(
                async fn $method(&self, req: api::$req) -> Result<api::$resp> {
                    let mut c = self.$svc.clone();
                    let deadline = self.$deadline($(req.$field)?);
                    self.call($rpc, deadline, req, move |r| async move { c.$method(r).await })
                        .await
                }
            )*
        }
    };
}

unary_rpcs! {
    /// `Version`: the runtime's name and version, and the CRI version it serves.
    version => runtime."Version"(VersionRequest) -> VersionResponse within request_deadline;
    /// `Status`: the runtime's conditions (RuntimeReady, NetworkReady).
    status => runtime."Status"(StatusRequest) -> StatusResponse within request_deadline;
    /// `UpdateRuntimeConfig`: tells the runtime the node's pod CIDR.
    update_runtime_config => runtime."UpdateRuntimeConfig"(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse within request_deadline;
    /// `RunPodSandbox`: creates and starts the pod's sandbox (pause container, namespaces).
    run_pod_sandbox => runtime."RunPodSandbox"(RunPodSandboxRequest) -> RunPodSandboxResponse within request_deadline;
    /// `StopPodSandbox`: stops the sandbox's containers and tears down its network.
    stop_pod_sandbox => runtime."StopPodSandbox"(StopPodSandboxRequest) -> StopPodSandboxResponse within request_deadline;
    /// `RemovePodSandbox`: removes a stopped sandbox and its containers.
    remove_pod_sandbox => runtime."RemovePodSandbox"(RemovePodSandboxRequest) -> RemovePodSandboxResponse within request_deadline;
    /// `PodSandboxStatus`: state, IPs and metadata of one sandbox.
    pod_sandbox_status => runtime."PodSandboxStatus"(PodSandboxStatusRequest) -> PodSandboxStatusResponse within request_deadline;
    /// `ListPodSandbox`: sandboxes matching a filter.
    list_pod_sandbox => runtime."ListPodSandbox"(ListPodSandboxRequest) -> ListPodSandboxResponse within request_deadline;
    /// `CreateContainer`: creates a container inside a sandbox.
    create_container => runtime."CreateContainer"(CreateContainerRequest) -> CreateContainerResponse within request_deadline;
    /// `StartContainer`: starts a created container.
    start_container => runtime."StartContainer"(StartContainerRequest) -> StartContainerResponse within request_deadline;
    /// `StopContainer`: signals a container and kills it after its timeout.
    stop_container => runtime."StopContainer"(StopContainerRequest) -> StopContainerResponse within stop_deadline(timeout);
    /// `RemoveContainer`: removes a stopped container.
    remove_container => runtime."RemoveContainer"(RemoveContainerRequest) -> RemoveContainerResponse within request_deadline;
    /// `ListContainers`: containers matching a filter.
    list_containers => runtime."ListContainers"(ListContainersRequest) -> ListContainersResponse within request_deadline;
    /// `ContainerStatus`: state, exit code, timestamps of one container.
    container_status => runtime."ContainerStatus"(ContainerStatusRequest) -> ContainerStatusResponse within request_deadline;
    /// `ReopenContainerLog`: asks the runtime to reopen a running container's log file (after
    /// the log manager renamed it).
    reopen_container_log => runtime."ReopenContainerLog"(ReopenContainerLogRequest) -> ReopenContainerLogResponse within request_deadline;
    /// `ExecSync`: runs a command in a container and answers its output and exit code.
    exec_sync => runtime."ExecSync"(ExecSyncRequest) -> ExecSyncResponse within exec_deadline(timeout);
    /// `Exec`: prepares a streaming exec session; answers the runtime's URL for it.
    exec => runtime."Exec"(ExecRequest) -> ExecResponse within request_deadline;
    /// `Attach`: prepares a streaming attach session; answers the runtime's URL for it.
    attach => runtime."Attach"(AttachRequest) -> AttachResponse within request_deadline;
    /// `PortForward`: prepares a port-forward session to a sandbox; answers its URL.
    port_forward => runtime."PortForward"(PortForwardRequest) -> PortForwardResponse within request_deadline;
    /// `ContainerStats`: CPU, memory and writable layer usage of one container.
    container_stats => runtime."ContainerStats"(ContainerStatsRequest) -> ContainerStatsResponse within request_deadline;
    /// `ListContainerStats`: the usage of the containers matching a filter.
    list_container_stats => runtime."ListContainerStats"(ListContainerStatsRequest) -> ListContainerStatsResponse within request_deadline;
    /// `PullImage`: pulls an image into the runtime's store.
    pull_image => image."PullImage"(PullImageRequest) -> PullImageResponse within pull_deadline;
    /// `ImageStatus`: whether an image is present, and its id.
    image_status => image."ImageStatus"(ImageStatusRequest) -> ImageStatusResponse within request_deadline;
    /// `ListImages`: the images in the runtime's store.
    list_images => image."ListImages"(ListImagesRequest) -> ListImagesResponse within request_deadline;
    /// `RemoveImage`: removes an image from the runtime's store.
    remove_image => image."RemoveImage"(RemoveImageRequest) -> RemoveImageResponse within request_deadline;
    /// `ImageFsInfo`: the filesystems holding images, and the bytes images use there.
    image_fs_info => image."ImageFsInfo"(ImageFsInfoRequest) -> ImageFsInfoResponse within request_deadline;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_endpoints() {
        let e: Endpoint = "unix:///run/containerd/containerd.sock".parse().unwrap();
        assert_eq!(
            e.path(),
            std::path::Path::new("/run/containerd/containerd.sock")
        );
        assert_eq!(e.to_string(), "unix:///run/containerd/containerd.sock");
        let bare: Endpoint = "/run/crio/crio.sock".parse().unwrap();
        assert_eq!(bare.path(), std::path::Path::new("/run/crio/crio.sock"));
    }

    #[test]
    fn refuses_tcp_and_relative_endpoints() {
        let tcp = "tcp://127.0.0.1:1234".parse::<Endpoint>().unwrap_err();
        assert!(tcp.to_string().contains("only unix://"), "{tcp}");
        let relative = "unix://run/x.sock".parse::<Endpoint>().unwrap_err();
        assert!(relative.to_string().contains("absolute"), "{relative}");
    }

    #[tokio::test]
    async fn an_absent_runtime_is_reported_as_unavailable_with_the_rpc_name() {
        let dir = std::env::temp_dir().join(format!("rkubelet-cri-test-{}", std::process::id()));
        let endpoint: Endpoint = dir.join("missing.sock").to_str().unwrap().parse().unwrap();
        let client = CriClient::new(endpoint, Duration::from_secs(2), None);
        let err = client
            .version(crate::cri::version_request())
            .await
            .unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        assert!(err.to_string().starts_with("CRI Version"), "{err}");
    }

    /// An empty directory of this test process named `name`.
    fn fresh_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Each call the fake runtime received: its path and `grpc-timeout` header.
    type Calls = Arc<Mutex<Vec<(String, Option<String>)>>>;

    /// A runtime on a Unix socket in `dir` that answers every call after `delay`:
    /// `PullImage` with an image reference, other calls with an empty message.
    fn slow_runtime(dir: &std::path::Path, delay: Duration) -> (Endpoint, Calls) {
        use http_body_util::StreamBody;
        use hyper::body::{Bytes, Frame};
        use prost::Message;

        let socket = dir.join("runtime.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let calls = Calls::default();
        let seen = calls.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let timeout = req
                        .headers()
                        .get("grpc-timeout")
                        .map(|v| v.to_str().unwrap_or_default().to_owned());
                    let path = req.uri().path().to_owned();
                    seen.lock().unwrap().push((path.clone(), timeout));
                    async move {
                        tokio::time::sleep(delay).await;
                        let message = if path.ends_with("/PullImage") {
                            api::PullImageResponse {
                                image_ref: "sha256:big".into(),
                            }
                            .encode_to_vec()
                        } else {
                            Vec::new()
                        };
                        let mut frame = vec![0u8];
                        frame.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
                        frame.extend(message);
                        let mut trailers = hyper::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        let frames = vec![
                            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(frame))),
                            Ok(Frame::trailers(trailers)),
                        ];
                        hyper::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(StreamBody::new(futures::stream::iter(frames)))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        let endpoint = socket.to_str().unwrap().parse().unwrap();
        (endpoint, calls)
    }

    /// A `RunPodSandbox` under way is known (for the network garbage collector) until it
    /// returns.
    #[tokio::test]
    async fn sandbox_creations_under_way_are_known_until_they_return() {
        let dir = fresh_dir("rkubelet-cri-run");
        let (endpoint, _) = slow_runtime(&dir, Duration::from_millis(300));
        let client = CriClient::new(endpoint, Duration::from_secs(5), None);
        assert!(client.sandbox_creations_since().is_none());
        let before = Instant::now();
        let run = tokio::spawn({
            let client = client.clone();
            async move {
                client
                    .run_pod_sandbox(api::RunPodSandboxRequest::default())
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let since = client.sandbox_creations_since().expect("under way");
        assert!(since >= before);
        run.await.unwrap().expect("the fake answers");
        assert!(client.sandbox_creations_since().is_none(), "returned");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An `ExecSync` with no timeout of its own (a lifecycle hook's) runs past the runtime
    /// request timeout, with no deadline sent to the runtime, as the kubelet's remote
    /// runtime; one with a timeout gets it on top of the request timeout.
    #[tokio::test]
    async fn exec_sync_without_a_timeout_of_its_own_has_no_deadline() {
        let dir = fresh_dir("rkubelet-cri-exec");
        let (endpoint, calls) = slow_runtime(&dir, Duration::from_millis(600));
        let client = CriClient::new(endpoint, Duration::from_millis(200), None);
        let hook = api::ExecSyncRequest {
            container_id: "c1".into(),
            cmd: vec!["drain".into()],
            timeout: 0,
        };
        client
            .exec_sync(hook)
            .await
            .expect("the hook outlasts the runtime request timeout");
        let probe = api::ExecSyncRequest {
            timeout: 1,
            ..Default::default()
        };
        client
            .exec_sync(probe)
            .await
            .expect("within the probe's 1 s plus the request timeout");
        let timeouts: Vec<Option<String>> = calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(path, _)| path.ends_with("/ExecSync"))
            .map(|(_, t)| t.clone())
            .collect();
        // tonic sends the deadline in microseconds: 1 s + 200 ms.
        assert_eq!(timeouts, [None, Some("1200000u".to_owned())]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A pull longer than the runtime request timeout finishes, as with the kubelet (no
    /// deadline, none sent to the runtime), while other calls keep theirs.
    #[tokio::test]
    async fn image_pulls_are_not_cut_by_the_runtime_request_timeout() {
        let dir = fresh_dir("rkubelet-cri-pull");
        let (endpoint, calls) = slow_runtime(&dir, Duration::from_millis(600));
        let client = CriClient::new(endpoint, Duration::from_millis(200), None);
        let pulled = client
            .pull_image(api::PullImageRequest {
                image: Some(api::ImageSpec {
                    image: "registry.local/big:1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("the pull outlasts the runtime request timeout");
        assert_eq!(pulled.image_ref, "sha256:big");
        let status = client
            .image_status(api::ImageStatusRequest::default())
            .await
            .unwrap_err();
        assert!(
            matches!(
                status,
                CriError::Timeout {
                    rpc: "ImageStatus",
                    ..
                }
            ),
            "{status}"
        );
        let calls = calls.lock().unwrap().clone();
        let timeout_of = |rpc: &str| {
            calls
                .iter()
                .find(|(path, _)| path.ends_with(rpc))
                .map(|(_, t)| t.clone())
        };
        assert_eq!(timeout_of("/PullImage"), Some(None), "{calls:?}");
        assert!(
            matches!(timeout_of("/ImageStatus"), Some(Some(_))),
            "{calls:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
