//! Termination messages end to end, against the local cluster, as the kubelet reports
//! them in `terminated.message`: a message written by a non-root user to a non-default
//! `terminationMessagePath`; with `FallbackToLogsOnError`, the tail of the log of a
//! container that failed without writing one; with `File`, nothing in that case.

mod common;

use std::time::Duration;

use common::case::{Case, get};
use common::eventually;
use k8s_openapi::api::core::v1::ContainerStateTerminated;
use serde_json::json;

/// A pod whose one container runs `script` once as user 1000, with these termination
/// message settings.
fn pod(script: &str, path: &str, policy: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c", script],
                "terminationMessagePath": path,
                "terminationMessagePolicy": policy,
                "securityContext": { "runAsUser": 1000 },
            }],
        }
    })
}

async fn terminated(name: &str) -> ContainerStateTerminated {
    eventually(
        &format!("{name} terminated"),
        Duration::from_secs(60),
        || async {
            let p = get(name).await?;
            let statuses = p.status?.container_statuses?;
            statuses.into_iter().next()?.state?.terminated
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn messages_come_from_any_path_any_user_or_the_log_by_policy() {
    let case = Case::with_agent("term-msg", &[]).await;
    let written = case
        .create(
            "file",
            pod(
                "echo -n 'written by uid' $(id -u) > /tmp/done; exit 0",
                "/tmp/done",
                "File",
            ),
        )
        .await;
    let fallback = case
        .create(
            "logs",
            pod(
                "echo first; echo last words; exit 4",
                "/dev/termination-log",
                "FallbackToLogsOnError",
            ),
        )
        .await;
    let file_only = case
        .create(
            "none",
            pod("echo not a message; exit 4", "/dev/termination-log", "File"),
        )
        .await;

    let t = terminated(&written).await;
    assert_eq!(t.exit_code, 0);
    assert_eq!(t.message.as_deref(), Some("written by uid 1000"));

    let t = terminated(&fallback).await;
    assert_eq!(t.exit_code, 4);
    assert_eq!(t.message.as_deref(), Some("first\nlast words\n"));

    let t = terminated(&file_only).await;
    assert_eq!(t.exit_code, 4);
    assert_eq!(t.message, None, "File policy: no message from the log");
    drop(case);
}
