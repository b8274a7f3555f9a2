//! Reads the live system for `rkubelet inspect`: the runtime over CRI, /proc, netlink,
//! the CNI cache and the host-local store — not the agent's memory, so it also works
//! while the agent is stopped — and shows how pods are wired, in tables, JSON and SVG.
//! Only the start-up timelines come from the agent (its debug socket).
//!
//! Knows no agent internals beyond the debug socket: never the pod workers, the kubelet or
//! the status manager.

pub mod cni_store;
pub mod netlink;
pub mod node;
pub mod pod;
pub mod svg;
pub mod table;
pub mod view;

use std::path::PathBuf;

use crate::procfs::ProcFs;

/// Where the node keeps what `inspect` reads: the agent's flags where they matter.
#[derive(Debug, Clone)]
pub struct Locations {
    /// The agent's `--root-dir` (its CNI cache is under `cni/results`).
    pub root_dir: PathBuf,
    /// The runtime's CNI conf dir (`--runtime-cni-conf-dir`): whether the agent's thin
    /// plugin is installed there tells who runs the plugins.
    pub runtime_cni_conf_dir: PathBuf,
    /// libcni's dir, where the runtime caches its CNI results (`/var/lib/cni`).
    pub libcni_dir: PathBuf,
    /// `/proc`.
    pub proc: ProcFs,
}

impl Locations {
    /// The agent's CNI result cache.
    #[must_use]
    pub fn agent_cni_cache(&self) -> PathBuf {
        self.root_dir.join("cni").join("results")
    }

    /// The runtime's (libcni's) CNI result cache.
    #[must_use]
    pub fn runtime_cni_cache(&self) -> PathBuf {
        self.libcni_dir.join("results")
    }
}

/// Why a pod or the node cannot be inspected at all (what is only partly visible is
/// reported in the view's notes instead).
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The runtime cannot be asked.
    #[error("asking the runtime ({what}): {source}")]
    Cri {
        /// The CRI call.
        what: &'static str,
        /// Its error.
        source: crate::cri::CriError,
    },
    /// The agent's debug socket cannot be asked.
    #[error("asking the agent at {}: {reason} (is rkubelet running with this --root-dir?)", socket.display())]
    Agent {
        /// The debug socket.
        socket: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The agent answered with an error.
    #[error("the agent answered {status}: {message}")]
    AgentStatus {
        /// The HTTP status.
        status: u16,
        /// Its message.
        message: String,
    },
    /// The runtime has no sandbox of the pod.
    #[error("the runtime has no sandbox of pod {pod}")]
    NoSandbox {
        /// `namespace/name`.
        pod: String,
    },
}

/// `GET <path>` on the debug socket of the agent whose root dir is `root_dir`: its JSON
/// answer.
///
/// # Errors
/// The agent cannot be reached, or answers with an error.
pub async fn ask_agent<T: serde::de::DeserializeOwned>(
    root_dir: &std::path::Path,
    path: &str,
) -> Result<T, InspectError> {
    let socket = crate::server::debug::socket_path(root_dir);
    tokio::time::timeout(AGENT_TIMEOUT, ask(&socket, path))
        .await
        .unwrap_or_else(|_| {
            Err(InspectError::Agent {
                socket,
                reason: format!("no answer within {AGENT_TIMEOUT:?}"),
            })
        })
}

/// How long the agent may take to answer.
const AGENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn ask<T: serde::de::DeserializeOwned>(
    socket: &std::path::Path,
    path: &str,
) -> Result<T, InspectError> {
    use http_body_util::BodyExt;
    let agent = |reason: String| InspectError::Agent {
        socket: socket.to_owned(),
        reason,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| agent(e.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| agent(e.to_string()))?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, "localhost")
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .map_err(|e| agent(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| agent(e.to_string()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| agent(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(InspectError::AgentStatus {
            status: status.as_u16(),
            message: String::from_utf8_lossy(&body).trim().to_owned(),
        });
    }
    serde_json::from_slice(&body).map_err(|e| agent(format!("its answer: {e}")))
}

/// Runs blocking file-system or netlink work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
