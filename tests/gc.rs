//! Garbage collection on the real node, with the kubelet's defaults and flags:
//! - container GC keeps one dead container per container name
//!   (`--maximum-dead-containers-per-container=1`) of a pod in a crash loop, and its
//!   stopped sandboxes go, and `kubectl logs [--previous]` shows that dead container's
//!   log as the kubelet does (the status's last termination, not the runtime's second
//!   newest instance);
//! - image GC, with thresholds the disk always crosses, removes an image no container
//!   uses (nginx) and keeps the one a container uses (busybox) and the sandbox image;
//!   every image it removed is pulled back from the local registry afterwards.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::case::{Case, running};
use common::pods::{containers_of, sleeper};
use common::{cri, eventually};
use rkubelet::cri::{Cri, api};

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_looping_container_keeps_one_dead_instance() {
    let case = Case::with_agent("gc-containers", &[]).await;
    let name = case
        .create(
            "crash",
            sleeper(serde_json::json!({
                "containers": [{ "name": "main", "image": "busybox", "command": ["sh", "-c", "echo crashed; exit 1"] }]
            })),
        )
        .await;
    let uid = common::case::get(&name)
        .await
        .and_then(|p| p.metadata.uid)
        .expect("uid");
    // Three instances ran (the first, then restarts after 10 s and 20 s of back-off)...
    let restarts = || async {
        let pod = common::case::get(&name).await?;
        let status = pod.status?.container_statuses?.into_iter().next()?;
        Some(status.restart_count)
    };
    eventually("two restarts", Duration::from_secs(90), || async {
        restarts().await.filter(|r| *r >= 2)
    })
    .await;
    // ... and the next GC pass (every minute) leaves only the newest dead one.
    let exited = eventually(
        "one dead container left by GC",
        Duration::from_secs(90),
        || async {
            let exited = containers_of(&uid, Some(api::ContainerState::ContainerExited)).await;
            (exited.len() == 1).then_some(exited)
        },
    )
    .await;
    let pod = common::case::get(&name).await.expect("pod");
    let status = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|s| s.into_iter().next())
        .expect("container status");
    let last = status
        .last_state
        .and_then(|s| s.terminated)
        .and_then(|t| t.container_id)
        .expect("last terminated container");
    // The one kept is the one the status names as the last terminated one, unless a
    // newer instance died since.
    assert!(
        last.ends_with(&exited[0].id) || status.restart_count > 2,
        "kept {} but the status names {last}",
        exited[0].id
    );
    for args in [
        vec!["logs", name.as_str()],
        vec!["logs", name.as_str(), "--previous"],
    ] {
        eventually(
            &format!("kubectl {args:?} shows the dead container's log"),
            Duration::from_secs(20),
            || async {
                let out = common::kubectl_command(&args).output().await.ok()?;
                (out.status.success() && out.stdout == b"crashed\n").then_some(())
            },
        )
        .await;
    }
    assert!(
        !case.agent().log_tail().contains("panicked"),
        "{}",
        case.agent().log_tail()
    );
}

/// The repo tags of every image in the runtime.
async fn image_tags() -> BTreeSet<String> {
    cri()
        .list_images(api::ListImagesRequest { filter: None })
        .await
        .expect("ListImages")
        .images
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect()
}

async fn pull(image: &str) {
    cri()
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("PullImage {image}: {e}"));
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn image_gc_removes_an_unused_image_and_keeps_the_used_ones() {
    const NGINX: &str = "docker.io/library/nginx:latest";
    const BUSYBOX: &str = "docker.io/library/busybox:latest";
    pull(NGINX).await;
    let before = image_tags().await;
    assert!(before.contains(NGINX), "{before:?}");
    let mut case = Case::with_agent("gc-images", &[]).await;
    let name = case.create("user", sleeper(serde_json::json!({}))).await;
    running(&name).await;
    // The disk is always more than 1% used: collect down to 0%, images of any age.
    case.start_agent(&[
        "--image-gc-high-threshold=1",
        "--image-gc-low-threshold=0",
        "--minimum-image-ttl-duration=0s",
    ]);
    let after = eventually("nginx removed", Duration::from_secs(60), || async {
        let now = image_tags().await;
        (!now.contains(NGINX)).then_some(now)
    })
    .await;
    let log = case.agent().log_tail();
    // Whatever was removed comes back before the assertions can fail, under an agent
    // with the default thresholds.
    case.start_agent(&[]);
    let removed: Vec<&String> = before.difference(&after).collect();
    for image in &removed {
        if !image.contains("pause") {
            pull(image).await;
        }
    }
    assert!(
        after.contains(BUSYBOX),
        "busybox is in use: {after:?}\n{log}"
    );
    assert!(
        after.iter().any(|t| t.contains("pause")),
        "the sandbox image stays: {after:?}"
    );
    assert!(!removed.iter().any(|t| t.contains("pause")), "{removed:?}");
    eprintln!("image GC removed {removed:?}");
}
