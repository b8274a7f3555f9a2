//! The `/debug` paths rkubelet adds to the kubelet API — the pods' start-up timelines —
//! and the node-local debug socket that serves them to root on the node (what
//! `rkubelet inspect timeline` reads, so it needs no credentials).
//!
//! | path | what |
//! |---|---|
//! | `/debug/timeline` | every timeline kept (JSON list of [`PodTimeline`](crate::timeline::PodTimeline)) |
//! | `/debug/timeline/{ns}/{pod}` | the newest timeline of that pod |
//!
//! On :10250 they are authorized like the kubelet's other `/debug` paths (`nodes/proxy`).

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::{Body, HEADER_READ_TIMEOUT, json, text};
use crate::timeline::Timelines;
use crate::unix_socket::{self, BindError, OwnerSocket};

/// The debug socket's file name under the agent's root dir.
pub const SOCKET_NAME: &str = "rkubelet.sock";

/// The debug socket of an agent whose root dir is `root_dir`.
#[must_use]
pub fn socket_path(root_dir: &Path) -> std::path::PathBuf {
    root_dir.join(SOCKET_NAME)
}

/// Answers a `/debug/...` path split in segments (without `debug`), or `None` when it is
/// not one of ours.
pub(super) fn route(timelines: &Timelines, segments: &[&str]) -> Option<Response<Body>> {
    match segments {
        ["timeline"] | ["timeline", ""] => Some(json(&timelines.all())),
        ["timeline", namespace, name] => Some(match timelines.get(namespace, name) {
            Some(timeline) => json(&timeline),
            None => text(
                StatusCode::NOT_FOUND,
                format!("no timeline kept for pod {namespace}/{name}"),
            ),
        }),
        _ => None,
    }
}

/// Binds the debug socket under `root_dir` (mode 0600).
///
/// # Errors
/// As [`unix_socket::bind`].
pub fn bind(root_dir: &Path) -> Result<OwnerSocket, BindError> {
    unix_socket::bind(&socket_path(root_dir))
}

/// Serves `GET /debug/...` on the bound debug socket to root (and the agent's user) until
/// the task is dropped.
pub async fn serve(socket: OwnerSocket, timelines: Arc<Timelines>) {
    tracing::info!(socket = %socket.path.display(), "debug socket serving");
    loop {
        let stream = match socket.listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(socket = %socket.path.display(), "accepting a debug connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        if !unix_socket::peer_allowed(&stream, "debug socket") {
            continue;
        }
        let timelines = timelines.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let timelines = timelines.clone();
                async move { Ok::<_, Infallible>(answer(&timelines, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer<B>(timelines: &Timelines, req: &Request<B>) -> Response<Body> {
    let segments: Vec<&str> = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .collect();
    let found = match (req.method(), segments.split_first()) {
        (&hyper::Method::GET, Some((&"debug", rest))) => route(timelines, rest),
        _ => None,
    };
    found.unwrap_or_else(|| text(StatusCode::NOT_FOUND, "404 page not found"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn get(timelines: &Timelines, path: &str) -> (StatusCode, String) {
        let req = Request::get(path).body(()).expect("request");
        let response = answer(timelines, &req);
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn timelines_and_nothing_else() {
        let timelines = Timelines::default();
        assert_eq!(
            get(&timelines, "/debug/timeline").await,
            (StatusCode::OK, "[]".to_owned())
        );
        let (status, body) = get(&timelines, "/debug/timeline/ns/web").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body, "no timeline kept for pod ns/web\n");
        for path in ["/pods", "/debug/pprof", "/debug/timeline/ns", "/"] {
            assert_eq!(
                get(&timelines, path).await.0,
                StatusCode::NOT_FOUND,
                "{path}"
            );
        }
    }
}
