//! Garbage collection on the real node, with the kubelet's defaults and flags:
//! - container GC keeps one dead container per container name
//!   (`--maximum-dead-containers-per-container=1`) of a pod in a crash loop, and its
//!   stopped sandboxes go, the removed instances' log files go with them, and
//!   `kubectl logs [--previous]` shows that dead container's
//!   log as the kubelet does (the status's last termination, not the runtime's second
//!   newest instance);
//! - image GC, with thresholds the disk always crosses, removes an image no container
//!   uses (nginx) and keeps the one a container uses (busybox) and the sandbox image;
//!   every image it removed is pulled back from the local registry afterwards;
//! - on a node whose runtime had no image when the agent started, an image pulled since
//!   is kept by a reclaim until `--minimum-image-ttl-duration` has passed.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::case::{Case, running};
use common::pods::{containers_of, sleeper};
use common::{cri, eventually};
use rkubelet::cri::{Cri, CriClient, api};

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
    // The removed instances' log files went with them (the kubelet's `removeContainerLog`):
    // the pod's log directory holds the logs of the containers the runtime still has.
    let log_dir = case.log_of(&name, &uid, "main");
    let log_dir = log_dir.parent().expect("container log dir");
    eventually(
        "only the kept containers' logs",
        Duration::from_secs(30),
        || async {
            let mut kept = BTreeSet::new();
            for c in containers_of(&uid, None).await {
                let status = cri()
                    .container_status(api::ContainerStatusRequest {
                        container_id: c.id,
                        verbose: false,
                    })
                    .await
                    .ok()?
                    .status?;
                kept.insert(status.log_path.rsplit('/').next()?.to_owned());
            }
            let files: BTreeSet<String> = std::fs::read_dir(log_dir)
                .ok()?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_, _>>()
                .ok()?;
            (files == kept).then_some(())
        },
    )
    .await;
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

/// The repo tags of every image in the cluster's runtime.
async fn image_tags() -> BTreeSet<String> {
    image_tags_of(&cri()).await
}

/// The repo tags of every image in the runtime behind `cri`.
async fn image_tags_of(cri: &CriClient) -> BTreeSet<String> {
    cri.list_images(api::ListImagesRequest { filter: None })
        .await
        .expect("ListImages")
        .images
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect()
}

async fn pull(image: &str) {
    pull_into(&cri(), image).await;
}

async fn pull_into(cri: &CriClient, image: &str) {
    cri.pull_image(api::PullImageRequest {
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
    // with the test agents' threshold (no image GC).
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

/// A containerd of its own with an empty image store (a fresh node's), configured as the
/// cluster's (`cluster.sh`: the local registry behind `docker.io`, no lowering of OOM
/// scores); killed and removed when dropped.
struct EmptyContainerd {
    child: std::process::Child,
    /// Its root and state, on the disk (an image filesystem with some of it used).
    dir: std::path::PathBuf,
    /// Its socket's directory, short enough for a Unix socket path.
    run: std::path::PathBuf,
}

impl EmptyContainerd {
    async fn start() -> Self {
        let id = std::process::id();
        let dir = common::state_dir().join(format!("empty-containerd-{id}"));
        let run = std::path::PathBuf::from(format!("/run/rk-empty-ctrd-{id}"));
        for d in [&dir, &run] {
            std::fs::create_dir_all(d).expect("containerd dirs");
        }
        let config = format!(
            r#"version = 2
root = "{dir}/root"
state = "{dir}/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{run}/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{certs}"
"#,
            dir = dir.display(),
            run = run.display(),
            certs = common::state_dir().join("containerd/certs.d").display(),
        );
        std::fs::write(dir.join("config.toml"), config).expect("containerd config");
        let log = std::fs::File::create(dir.join("containerd.log")).expect("containerd log");
        let child = std::process::Command::new("/usr/bin/containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let this = Self { child, dir, run };
        let cri = this.cri();
        eventually(
            "the empty containerd serves CRI",
            Duration::from_secs(30),
            || async { cri.version(rkubelet::cri::version_request()).await.ok() },
        )
        .await;
        this
    }

    fn endpoint(&self) -> String {
        format!("unix://{}/containerd.sock", self.run.display())
    }

    fn cri(&self) -> CriClient {
        CriClient::new(
            self.endpoint().parse().expect("endpoint"),
            Duration::from_secs(30),
            Some(Duration::from_secs(120)),
        )
    }
}

impl Drop for EmptyContainerd {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for d in [&self.dir, &self.run] {
            if let Err(e) = std::fs::remove_dir_all(d) {
                eprintln!("removing {}: {e}", d.display());
            }
        }
    }
}

/// The lines of the agent's log after byte `from` that report an image GC reclaim for the
/// image filesystem signal.
fn reclaims_since(log: &std::path::Path, from: u64) -> usize {
    let text = std::fs::read(log).expect("agent log");
    let start = usize::try_from(from).expect("size").min(text.len());
    String::from_utf8_lossy(&text[start..])
        .lines()
        .filter(|l| l.contains("image GC") && l.contains("imagefs.available"))
        .count()
}

fn log_len(log: &std::path::Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// The kubelet's first image detection takes the images there as seen long ago: one that
/// was there before the agent started goes at the first reclaims; one pulled afterwards is
/// seen now, and kept for `--minimum-image-ttl-duration` (2 minutes here, the default),
/// also on a node that had no other image when the agent started.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_image_pulled_on_a_fresh_node_is_kept_for_the_minimum_age() {
    const BUSYBOX: &str = "docker.io/library/busybox:latest";
    const NGINX: &str = "docker.io/library/nginx:latest";
    let containerd = EmptyContainerd::start().await;
    assert!(
        image_tags_of(&containerd.cri()).await.is_empty(),
        "the new containerd has images"
    );
    // Old by the time the agent first looks.
    pull_into(&containerd.cri(), NGINX).await;
    let mut case = Case::new("gc-fresh").await;
    let log = common::case::root_dir().with_extension("log");
    let from = log_len(&log);
    // The image filesystem is always more than 1% used: every eviction pass (10 s)
    // reclaims with image GC.
    let endpoint = containerd.endpoint();
    case.start_agent(&[
        "--container-runtime-endpoint",
        &endpoint,
        "--eviction-hard",
        "imagefs.available<99%",
        "--minimum-image-ttl-duration=2m",
    ]);
    eventually("a first reclaim", Duration::from_secs(60), || async {
        (reclaims_since(&log, from) > 0).then_some(())
    })
    .await;
    eventually("the old image removed", Duration::from_secs(60), || async {
        (!image_tags_of(&containerd.cri()).await.contains(NGINX)).then_some(())
    })
    .await;
    pull_into(&containerd.cri(), BUSYBOX).await;
    let pulled = log_len(&log);
    assert!(image_tags_of(&containerd.cri()).await.contains(BUSYBOX));
    eventually(
        "two reclaims after the pull",
        Duration::from_secs(60),
        || async { (reclaims_since(&log, pulled) >= 2).then_some(()) },
    )
    .await;
    let tags = image_tags_of(&containerd.cri()).await;
    assert!(
        tags.contains(BUSYBOX),
        "an image pulled seconds ago was removed: {tags:?}\n{}",
        case.agent().log_tail()
    );
    assert!(
        !case.agent().log_tail().contains("panicked"),
        "{}",
        case.agent().log_tail()
    );
    case.stop_agent();
}
