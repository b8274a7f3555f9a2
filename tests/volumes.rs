//! The volume manager for real: tmpfs mounts as root in a scratch root dir, and secret,
//! configMap and projected token volumes read with only the node's identity from the local
//! v1.20 cluster; then pods run by the agent, checked from inside their containers (exec):
//! subPath safety and subPathExpr, fsGroup ownership, in-place updates of configMap and
//! downwardAPI files, memory emptyDirs, read-only mounts and hostPath types. Everything a
//! test creates (mounts, dirs, API objects) is removed also when it fails.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::case::{Case, delete_and_wait, get, running};
use common::pods::{events_of, exec_in};
use common::{eventually, kube_client, node_name, unique};
use futures::FutureExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rkubelet::pod::state::Wake;
use rkubelet::volume::{LinuxMounter, VolumeError, VolumeManager};
use rkubelet::watch_manager::{CacheError, KubePodObjects, PodObjects, SourceCaches};
use serde_json::json;

/// A scratch `--root-dir` under the temp dir. On drop, whatever is still mounted under it
/// is detached and the directory removed, so a failing test leaves nothing behind.
struct ScratchRoot(PathBuf);

impl ScratchRoot {
    fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&path).expect("create scratch root");
        Self(std::fs::canonicalize(&path).expect("canonical scratch root"))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let mut left = mounts_under(&self.0);
        left.sort_by_key(|m| std::cmp::Reverse(m.mount_point.components().count()));
        for m in left {
            let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One line of /proc/self/mountinfo, the parts the tests look at.
#[derive(Debug)]
struct MountEntry {
    mount_point: PathBuf,
    options: String,
    fs_type: String,
    super_options: String,
}

fn mounts_under(dir: &Path) -> Vec<MountEntry> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<_> = left.split(' ').collect();
            let right: Vec<_> = right.split(' ').collect();
            Some(MountEntry {
                mount_point: PathBuf::from(left.get(4)?),
                options: (*left.get(5)?).to_owned(),
                fs_type: (*right.first()?).to_owned(),
                super_options: right.get(2).copied().unwrap_or_default().to_owned(),
            })
        })
        .filter(|m| m.mount_point.starts_with(dir))
        .collect()
}

fn tmpfs_at<'a>(mounts: &'a [MountEntry], dir: &Path) -> &'a MountEntry {
    mounts
        .iter()
        .find(|m| m.mount_point == dir)
        .unwrap_or_else(|| panic!("no mount at {}: {mounts:?}", dir.display()))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").mode() & 0o7777
}

/// An API server with one secret, for the root-only test.
struct OneSecret;

impl PodObjects for OneSecret {
    async fn get_secret(&self, _namespace: &str, name: &str) -> Result<Option<Secret>, CacheError> {
        Ok((name == "db").then(|| Secret {
            data: Some(BTreeMap::from([
                ("user".to_owned(), ByteString(b"admin".to_vec())),
                ("pass".to_owned(), ByteString(b"s3cret".to_vec())),
            ])),
            ..Secret::default()
        }))
    }

    async fn get_config_map(&self, _: &str, _: &str) -> Result<Option<ConfigMap>, CacheError> {
        Ok(None)
    }

    async fn create_token(&self, _: &str, _: &str, _: &TokenRequest) -> kube::Result<TokenRequest> {
        unreachable!("no token volumes in this test")
    }

    async fn get_persistent_volume_claim(
        &self,
        _: &str,
        _: &str,
    ) -> kube::Result<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
        unreachable!("no claims in this test")
    }

    async fn get_persistent_volume(
        &self,
        _: &str,
    ) -> kube::Result<k8s_openapi::api::core::v1::PersistentVolume> {
        unreachable!("no claims in this test")
    }

    fn node_labels(&self) -> Option<BTreeMap<String, String>> {
        unreachable!("no claims in this test")
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn secret_and_memory_volumes_are_tmpfs_and_teardown_leaves_nothing() {
    let root = ScratchRoot::new("rk-volumes");
    let manager = VolumeManager::new(root.path(), OneSecret, LinuxMounter);
    let uid = "6b3c0d4e-0000-4000-8000-000000000001";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": uid},
        "spec": {
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [
                {"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o440,
                    "items": [{"key": "user", "path": "username", "mode": 0o400},
                              {"key": "pass", "path": "conf/password"}]}},
                {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "scratch", "emptyDir": {}},
            ]
        }
    }))
    .expect("pod");

    let volumes = manager.setup(&pod).await.expect("setup");
    let creds = volumes.host_path("creds").expect("creds").to_owned();
    let cache = volumes.host_path("cache").expect("cache").to_owned();
    let pod_dir = root.path().join("pods").join(uid);
    assert_eq!(
        creds,
        pod_dir.join("volumes/kubernetes.io~secret/creds"),
        "kubelet layout"
    );
    let mounts = mounts_under(root.path());
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    let secret_mount = tmpfs_at(&mounts, &creds);
    assert_eq!(secret_mount.fs_type, "tmpfs");
    assert!(secret_mount.options.contains("nosuid") && secret_mount.options.contains("nodev"));
    let cache_mount = tmpfs_at(&mounts, &cache);
    assert_eq!(cache_mount.fs_type, "tmpfs");
    assert!(
        cache_mount.super_options.contains("size=65536k"),
        "{cache_mount:?}"
    );

    assert_eq!(read(&creds.join("username")), "admin");
    assert_eq!(mode(&creds.join("username")), 0o400);
    assert_eq!(read(&creds.join("conf/password")), "s3cret");
    assert_eq!(mode(&creds.join("conf/password")), 0o440);
    let data = std::fs::read_link(creds.join("..data")).expect("..data symlink");
    assert!(data.to_string_lossy().starts_with("..20"), "{data:?}");
    assert_eq!(
        std::fs::metadata(creds.join("username"))
            .expect("stat")
            .dev(),
        std::fs::metadata(&creds).expect("stat").dev(),
        "the files live on the tmpfs"
    );

    // Setting up again (a resync, or a restarted agent) mounts nothing twice.
    manager.setup(&pod).await.expect("setup again");
    assert_eq!(mounts_under(root.path()).len(), 2);

    manager.teardown(uid).await.expect("teardown");
    assert!(
        mounts_under(root.path()).is_empty(),
        "{:?}",
        mounts_under(root.path())
    );
    assert!(!pod_dir.exists(), "pod dir removed");

    // A tmpfs left by a crashed agent is found through the mount table.
    manager.setup(&pod).await.expect("setup");
    let restarted = VolumeManager::new(root.path(), OneSecret, LinuxMounter);
    let removed = restarted
        .cleanup_orphans(&Default::default())
        .await
        .expect("cleanup orphans");
    assert_eq!(removed, [uid]);
    assert!(mounts_under(root.path()).is_empty());
    assert!(!pod_dir.exists());
}

/// The objects the cluster test creates, deleted again whatever happens.
struct Objects {
    admin: kube::Client,
    name: String,
}

impl Objects {
    fn unreferenced(&self) -> String {
        format!("{}-unref", self.name)
    }

    async fn delete_all(&self) {
        let ns = "default";
        let pods = Api::<Pod>::namespaced(self.admin.clone(), ns);
        let _ = pods
            .delete(&self.name, &DeleteParams::default().grace_period(0))
            .await;
        let secrets = Api::<Secret>::namespaced(self.admin.clone(), ns);
        for name in [self.name.clone(), self.unreferenced()] {
            let _ = secrets.delete(&name, &DeleteParams::default()).await;
        }
        let config_maps = Api::<ConfigMap>::namespaced(self.admin.clone(), ns);
        let _ = config_maps
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn node_identity_sets_up_the_volumes_of_a_pod_bound_to_it() {
    let objects = Objects {
        admin: kube_client("admin.kubeconfig").await,
        name: unique("rk-vol"),
    };
    let root = ScratchRoot::new("rk-volumes-node");
    let outcome = AssertUnwindSafe(node_scenario(&objects, root.path()))
        .catch_unwind()
        .await;
    objects.delete_all().await;
    drop(root);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn node_scenario(objects: &Objects, root: &Path) {
    let ns = "default";
    let name = objects.name.as_str();
    let admin = objects.admin.clone();
    let node = kube_client(&format!("node-{}.kubeconfig", node_name())).await;
    let pp = PostParams::default();

    let secrets = Api::<Secret>::namespaced(admin.clone(), ns);
    for secret_name in [name.to_owned(), objects.unreferenced()] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": secret_name},
            "stringData": {"user": "admin", "pass": "s3cret"}
        }))
        .expect("secret");
        secrets.create(&pp, &secret).await.expect("create secret");
    }
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name},
        "data": {"app.yaml": "x: 1"}
    }))
    .expect("config map");
    Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .create(&pp, &config_map)
        .await
        .expect("create config map");

    // Bound to the node from the start: nothing schedules it, and no agent needs to run it.
    // The Node authorizer keys its graph on spec.nodeName alone, so no Node object is needed.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "rk-volume-test"}},
        "spec": {
            "nodeName": node_name(),
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app",
                "image": "docker.io/library/busybox:latest",
                "command": ["sleep", "3600"],
            }],
            "volumes": [
                {"name": "creds", "secret": {"secretName": name,
                    "items": [{"key": "user", "path": "username", "mode": 0o400}]}},
                {"name": "config", "configMap": {"name": name}},
                {"name": "bound-token", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                    {"configMap": {"name": name, "items": [{"key": "app.yaml", "path": "app.yaml"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                ]}},
            ]
        }
    }))
    .expect("pod");
    let pod = create_pod(&Api::namespaced(admin.clone(), ns), &pod).await;
    let uid = pod.metadata.uid.clone().expect("uid");

    // Secrets and ConfigMaps come from the node's watch-based caches, where the pod
    // registers what it references (as the agent's pod sync does).
    let wake: Wake = std::sync::Arc::new(|_: &str, _| {});
    let caches = SourceCaches::new(&node, &wake);
    caches.register(&uid, &pod);
    let api = KubePodObjects::new(node.clone(), caches.clone());
    let manager = VolumeManager::new(root, api, LinuxMounter);
    let volumes = setup_with_retry(&manager, &pod).await;

    let creds = volumes.host_path("creds").expect("creds");
    assert_eq!(read(&creds.join("username")), "admin");
    assert_eq!(mode(&creds.join("username")), 0o400);
    let config = volumes.host_path("config").expect("config");
    assert_eq!(read(&config.join("app.yaml")), "x: 1");
    let projected = volumes.host_path("bound-token").expect("projected");
    assert_eq!(read(&projected.join("app.yaml")), "x: 1");
    assert_eq!(read(&projected.join("namespace")), ns);
    let token = read(&projected.join("token"));
    assert_eq!(token.split('.').count(), 3, "a JWT");
    assert_eq!(mode(&projected.join("token")), 0o644);

    // The token is bound to this pod.
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    let review = Api::<TokenReview>::all(admin.clone())
        .create(&pp, &review)
        .await
        .expect("token review");
    let status = review.status.expect("review status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.expect("user");
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:default")
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-uid"),
        Some(&vec![uid.clone()]),
        "{extra:?}"
    );

    // The service account volume the API server added: a `default-token-*` secret on
    // v1.20, a `kube-api-access-*` projection on newer servers.
    let sa_volume = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name.starts_with("default-token-") || v.name.starts_with("kube-api-access-"))
        .expect("a service account token volume");
    let sa_dir = volumes.host_path(&sa_volume.name).expect("sa volume");
    assert!(!read(&sa_dir.join("token")).is_empty());
    assert_eq!(read(&sa_dir.join("namespace")), ns);

    let mounts = mounts_under(root);
    for dir in [creds, projected, sa_dir] {
        assert_eq!(tmpfs_at(&mounts, dir).fs_type, "tmpfs");
    }

    // A secret no pod of this node references is forbidden to the node.
    match Api::<Secret>::namespaced(node.clone(), ns)
        .get_opt(&objects.unreferenced())
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("the node read an unreferenced secret: {other:?}"),
    }
    let mut stranger = pod.clone();
    stranger.metadata.uid = Some(format!("{uid}-stranger"));
    stranger.spec.as_mut().expect("spec").volumes = Some(vec![
        serde_json::from_value(
            json!({"name": "x", "secret": {"secretName": objects.unreferenced()}}),
        )
        .expect("volume"),
    ]);
    // Through the cache, its watch is refused, so it never syncs: the kubelet's error.
    caches.register(&format!("{uid}-stranger"), &stranger);
    match manager.setup(&stranger).await {
        Err(VolumeError::Api { source, .. }) => {
            let text = source.to_string();
            assert!(
                text.contains("failed to sync secret cache: timed out waiting for the condition"),
                "{text}"
            );
        }
        other => panic!("expected an unsynced cache, got {other:?}"),
    }
    rkubelet::pod::state::ForgetPod::forget(&caches, &format!("{uid}-stranger"));

    manager.teardown(&uid).await.expect("teardown");
    assert!(mounts_under(root).is_empty(), "{:?}", mounts_under(root));
    assert!(!root.join("pods").join(&uid).exists());
}

/// Creates the pod, retrying while the service account or (on v1.20) its token secret is
/// not made yet by the controller manager.
async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Pod {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match pods.create(&PostParams::default(), pod).await {
            Ok(created) => return created,
            Err(kube::Error::Api(status))
                if Instant::now() < deadline && status.message.contains("service account") =>
            {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("create pod: {e}"),
        }
    }
}

/// Sets the pod's volumes up, retrying while the Node authorizer's graph (fed by an
/// informer) has not seen the new pod yet.
async fn setup_with_retry(
    manager: &VolumeManager<KubePodObjects, LinuxMounter>,
    pod: &Pod,
) -> rkubelet::volume::PodVolumes {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match manager.setup(pod).await {
            Ok(volumes) => return volumes,
            Err(e) if Instant::now() < deadline && is_forbidden(&e) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("setup with the node identity: {e}"),
        }
    }
}

/// Not yet allowed to the node: a watch not listed yet (the Node authorizer does not see
/// the pod yet), or a refused TokenRequest.
fn is_forbidden(e: &VolumeError) -> bool {
    match e {
        VolumeError::Api { source, .. } => matches!(**source, CacheError::NotSynced { .. }),
        VolumeError::TokenRequest { source, .. } => {
            matches!(&**source, kube::Error::Api(s) if s.code == 403)
        }
        _ => false,
    }
}

/// Runs `script` with `sh -c` in the running container `container` of the pod with this
/// UID: its exit code and its output (stdout, then stderr).
async fn exec(uid: &str, container: &str, script: &str) -> (i32, String) {
    let cmd = vec!["sh".into(), "-c".into(), script.into()];
    let response = exec_in(uid, container, cmd).await;
    let mut output = String::from_utf8_lossy(&response.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&response.stderr));
    (response.exit_code, output)
}

/// The output of `script`, which must succeed.
async fn exec_ok(uid: &str, container: &str, script: &str) -> String {
    let (code, output) = exec(uid, container, script).await;
    assert_eq!(code, 0, "{script}: {output}");
    output.trim().to_owned()
}

/// A busybox pod with one sleeping container `app` (`extra` merged into it) and `volumes`.
fn sleeper(volumes: serde_json::Value, app: serde_json::Value) -> serde_json::Value {
    let mut container = json!({
        "name": "app",
        "image": "busybox",
        "command": ["sleep", "3600"],
    });
    container
        .as_object_mut()
        .expect("object")
        .extend(app.as_object().expect("object").clone());
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "volumes": volumes,
            "containers": [container],
        }
    })
}

/// Waits until the container `app` of the pod waits with `reason`; its message.
async fn waits_with(name: &str, reason: &str) -> String {
    eventually(
        &format!("{name} waiting with {reason}"),
        Duration::from_secs(60),
        || async {
            let pod = get(name).await?;
            let status = pod.status?.container_statuses?.into_iter().next()?;
            let waiting = status.state?.waiting?;
            (waiting.reason.as_deref() == Some(reason)).then(|| waiting.message.unwrap_or_default())
        },
    )
    .await
}

/// A host directory of this test under the cluster's state dir, removed when dropped.
struct HostDir(PathBuf);

impl HostDir {
    fn new(name: &str) -> Self {
        let dir = common::state_dir().join("test-volumes").join(unique(name));
        std::fs::create_dir_all(&dir).expect("host dir");
        Self(dir)
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_symlink_planted_in_the_volume_cannot_lead_a_sub_path_out() {
    let case = Case::with_agent("vol-escape", &[]).await;
    let outside = HostDir::new("outside");
    // An init container plants `escape -> <host dir>`: a path of the host, not of the
    // container, that the agent would follow.
    let mut manifest = sleeper(
        json!([{ "name": "vol", "emptyDir": {} }]),
        json!({ "volumeMounts": [{ "name": "vol", "mountPath": "/made", "subPath": "escape/made" }] }),
    );
    manifest["spec"]["initContainers"] = json!([{
        "name": "plant",
        "image": "busybox",
        "command": ["ln", "-s", outside.0, "/vol/escape"],
        "volumeMounts": [{ "name": "vol", "mountPath": "/vol" }],
    }]);
    let name = case.create("mkdir", manifest.clone()).await;
    let message = waits_with(&name, "CreateContainerConfigError").await;
    assert_eq!(
        message,
        r#"failed to create subPath directory for volumeMount "vol" of container "app""#
    );
    assert!(
        !outside.0.join("made").exists(),
        "a directory was made outside the volume"
    );
    let events = events_of(&name).await;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("Failed")
            && e.message.as_deref() == Some(&format!("Error: {message}"))),
        "{events:?}"
    );

    // The symlink's target exists: nothing to make, but it is not bound either.
    manifest["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("escape");
    let name = case.create("bind", manifest).await;
    assert_eq!(
        waits_with(&name, "CreateContainerConfigError").await,
        r#"failed to prepare subPath for volumeMount "vol" of container "app""#
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn sub_path_expr_expands_a_downward_api_env_var() {
    let case = Case::with_agent("vol-expr", &[]).await;
    let env = json!([{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }]);
    let manifest = sleeper(
        json!([{ "name": "vol", "emptyDir": {} }]),
        json!({
            "env": env,
            "volumeMounts": [
                { "name": "vol", "mountPath": "/vol" },
                { "name": "vol", "mountPath": "/mine", "subPathExpr": "logs/$(POD_NAME)" },
            ],
        }),
    );
    let name = case.create("ok", manifest).await;
    let pod = running(&name).await;
    let uid = pod.metadata.uid.expect("uid");
    exec_ok(&uid, "app", "echo hi > /mine/x").await;
    assert_eq!(
        exec_ok(&uid, "app", &format!("cat /vol/logs/{name}/x")).await,
        "hi"
    );
    let pod_dir = common::case::root_dir().join("pods").join(&uid);
    let subpaths = pod_dir.join("volume-subpaths");
    assert!(
        mounts_under(&subpaths)
            .iter()
            .any(|m| m.mount_point == subpaths.join("vol/app/1")),
        "the subPath is a bind mount under volume-subpaths"
    );
    // Grace 0: the API forgets the pod at once, the agent tears it down after.
    delete_and_wait(&name).await;
    eventually("the pod's mounts gone", Duration::from_secs(30), || async {
        mounts_under(&pod_dir).is_empty().then_some(())
    })
    .await;
    eventually("the pod dir removed", Duration::from_secs(10), || async {
        (!pod_dir.exists()).then_some(())
    })
    .await;

    for (suffix, value, message) in [
        (
            "dots",
            "..",
            "unable to provision SubPath `..`: must not contain '..'",
        ),
        (
            "abs",
            "/tmp",
            "error SubPath `/tmp` must not be an absolute path",
        ),
    ] {
        let manifest = sleeper(
            json!([{ "name": "vol", "emptyDir": {} }]),
            json!({
                "env": [{ "name": "P", "value": value }],
                "volumeMounts": [{ "name": "vol", "mountPath": "/m", "subPathExpr": "$(P)" }],
            }),
        );
        let name = case.create(suffix, manifest).await;
        assert_eq!(
            waits_with(&name, "CreateContainerConfigError").await,
            message
        );
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn fs_group_owns_the_volumes() {
    let case = Case::with_agent("vol-fsgroup", &[]).await;
    for (suffix, policy) in [("always", "Always"), ("onroot", "OnRootMismatch")] {
        let mut manifest = sleeper(
            json!([
                { "name": "scratch", "emptyDir": {} },
                { "name": "info", "downwardAPI": { "items": [
                    { "path": "name", "fieldRef": { "fieldPath": "metadata.name" } }] } },
            ]),
            json!({ "volumeMounts": [
                { "name": "scratch", "mountPath": "/scratch" },
                { "name": "info", "mountPath": "/info" },
            ] }),
        );
        manifest["spec"]["securityContext"] =
            json!({ "fsGroup": 2345, "fsGroupChangePolicy": policy });
        let name = case.create(suffix, manifest).await;
        let uid = running(&name).await.metadata.uid.expect("uid");
        assert_eq!(
            exec_ok(&uid, "app", "stat -c '%g %a' /scratch").await,
            "2345 2777",
            "{policy}"
        );
        assert_eq!(
            exec_ok(&uid, "app", "stat -L -c '%g %a' /info/name").await,
            "2345 644",
            "{policy}"
        );
        let listing = exec_ok(&uid, "app", "ls -lnd /info/..data/").await;
        assert!(listing.starts_with("drwxr-sr-x"), "{listing}");
        assert!(listing.contains(" 2345 "), "{listing}");
        exec_ok(&uid, "app", "touch /scratch/new").await;
        assert_eq!(
            exec_ok(&uid, "app", "stat -c '%g' /scratch/new").await,
            "2345",
            "setgid: new files get the group"
        );
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn config_map_and_label_changes_reach_the_files_without_a_restart() {
    let case = Case::with_agent("vol-update", &[]).await;
    let admin = kube_client("admin.kubeconfig").await;
    let config_maps = Api::<ConfigMap>::namespaced(admin.clone(), "default");
    let cm_name = unique("rk-vol-cm");
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": cm_name },
        "data": { "greeting": "v1" }
    }))
    .expect("config map");
    config_maps
        .create(&PostParams::default(), &config_map)
        .await
        .expect("create config map");
    let outcome = AssertUnwindSafe(async {
        let manifest = sleeper(
            json!([
                { "name": "config", "configMap": { "name": cm_name } },
                { "name": "info", "downwardAPI": { "items": [
                    { "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } }] } },
            ]),
            json!({ "volumeMounts": [
                { "name": "config", "mountPath": "/config" },
                { "name": "info", "mountPath": "/info" },
            ] }),
        );
        let name = case.create("pod", manifest).await;
        let uid = running(&name).await.metadata.uid.expect("uid");
        assert_eq!(exec_ok(&uid, "app", "cat /config/greeting").await, "v1");

        let patch = json!({ "metadata": { "labels": { "color": "blue" } } });
        Api::<Pod>::namespaced(admin.clone(), "default")
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("label the pod");
        let labelled = Instant::now();
        eventually(
            "the new label in /info/labels",
            Duration::from_secs(10),
            || async {
                let (_, labels) = exec(&uid, "app", "cat /info/labels").await;
                labels.contains("color=\"blue\"").then_some(())
            },
        )
        .await;
        eprintln!(
            "label change reached the file after {:?}",
            labelled.elapsed()
        );

        let patch = json!({ "data": { "greeting": "v2" } });
        config_maps
            .patch(&cm_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("update the config map");
        let updated = Instant::now();
        eventually(
            "v2 in /config/greeting",
            Duration::from_secs(75),
            || async {
                let (_, greeting) = exec(&uid, "app", "cat /config/greeting").await;
                (greeting.trim() == "v2").then_some(())
            },
        )
        .await;
        eprintln!(
            "configMap change reached the file after {:?}",
            updated.elapsed()
        );
        let pod = get(&name).await.expect("pod");
        let status = pod
            .status
            .and_then(|s| s.container_statuses)
            .expect("statuses");
        assert_eq!(status[0].restart_count, 0, "no restart");
    })
    .catch_unwind()
    .await;
    let _ = config_maps.delete(&cm_name, &DeleteParams::default()).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn memory_empty_dirs_read_only_mounts_and_host_path_types() {
    let case = Case::with_agent("vol-kinds", &[]).await;
    let manifest = sleeper(
        json!([
            { "name": "mem", "emptyDir": { "medium": "Memory", "sizeLimit": "64Mi" } },
            { "name": "scratch", "emptyDir": {} },
        ]),
        json!({ "volumeMounts": [
            { "name": "mem", "mountPath": "/mem" },
            { "name": "scratch", "mountPath": "/ro", "readOnly": true },
        ] }),
    );
    let name = case.create("mem", manifest).await;
    let uid = running(&name).await.metadata.uid.expect("uid");
    let df = exec_ok(&uid, "app", "df -k /mem | tail -1").await;
    let fields: Vec<_> = df.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"tmpfs"), "{df}");
    assert_eq!(fields.get(1), Some(&"65536"), "64Mi: {df}");
    let (code, output) = exec(&uid, "app", "touch /ro/x").await;
    assert_ne!(code, 0, "a write to a read-only mount succeeded");
    assert!(output.contains("Read-only file system"), "{output}");

    let host = HostDir::new("hostpath");
    let file = host.0.join("a-file");
    std::fs::write(&file, "x").expect("write");
    let manifest = sleeper(
        json!([{ "name": "h", "hostPath": { "path": file, "type": "Directory" } }]),
        json!({ "volumeMounts": [{ "name": "h", "mountPath": "/h" }] }),
    );
    let name = case.create("hostpath", manifest).await;
    let expected = format!(
        r#"MountVolume.SetUp failed for volume "h" : hostPath type check failed: {} is not a directory"#,
        file.display()
    );
    eventually("a FailedMount event", Duration::from_secs(30), || async {
        events_of(&name).await.into_iter().find(|e| {
            e.reason.as_deref() == Some("FailedMount") && e.message.as_deref() == Some(&expected)
        })
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_failing_sub_path_expr_recovers_once_the_annotation_is_set() {
    // The e2e test "should verify that a failing subpath expansion can be modified during
    // the lifecycle of a container".
    let case = Case::with_agent("vol-expr-fix", &[]).await;
    let manifest = sleeper(
        json!([{ "name": "workdir1", "emptyDir": {} }]),
        json!({
            "env": [
                { "name": "POD_NAME", "value": "foo" },
                { "name": "ANNOTATION", "valueFrom": { "fieldRef":
                    { "apiVersion": "v1", "fieldPath": "metadata.annotations['mysubpath']" } } },
            ],
            "volumeMounts": [
                { "name": "workdir1", "mountPath": "/subpath_mount",
                  "subPathExpr": "$(ANNOTATION)/$(POD_NAME)" },
                { "name": "workdir1", "mountPath": "/volume_mount" },
            ],
        }),
    );
    let name = case.create("pod", manifest).await;
    assert_eq!(
        waits_with(&name, "CreateContainerConfigError").await,
        "missing value for ANNOTATION"
    );
    let admin = kube_client("admin.kubeconfig").await;
    let patch = json!({ "metadata": { "annotations": { "mysubpath": "mypath" } } });
    Api::<Pod>::namespaced(admin, "default")
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate the pod");
    let uid = running(&name).await.metadata.uid.expect("uid");
    exec_ok(&uid, "app", "touch /volume_mount/mypath/foo/test.log").await;
    exec_ok(&uid, "app", "test -f /subpath_mount/test.log").await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_restarted_container_gets_its_sub_path_bind_mount_again() {
    let case = Case::with_agent("vol-restart", &[]).await;
    let mut manifest = sleeper(
        json!([{ "name": "vol", "emptyDir": {} }]),
        json!({
            "command": ["sh", "-c", "echo run >> /sub/runs; sleep 1; exit 1"],
            "volumeMounts": [{ "name": "vol", "mountPath": "/sub", "subPath": "a/b" }],
        }),
    );
    manifest["spec"]["restartPolicy"] = json!("Always");
    let name = case.create("pod", manifest).await;
    let restarted = eventually("a restart", Duration::from_secs(40), || async {
        let pod = get(&name).await?;
        let status = pod
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        (status.restart_count >= 1).then_some(pod)
    })
    .await;
    let uid = restarted.metadata.uid.expect("uid");
    let pod_dir = common::case::root_dir().join("pods").join(&uid);
    let runs = pod_dir.join("volumes/kubernetes.io~empty-dir/vol/a/b/runs");
    eventually("two runs written", Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&runs).ok()?;
        (text.lines().count() >= 2).then_some(())
    })
    .await;
    let target = pod_dir.join("volume-subpaths/vol/app/0");
    let bound = mounts_under(&pod_dir.join("volume-subpaths"));
    assert_eq!(
        bound.iter().filter(|m| m.mount_point == target).count(),
        1,
        "one bind mount, reused: {bound:?}"
    );
}
