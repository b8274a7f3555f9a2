//! The volume manager against a fake API server and a recording mounter, in a temporary
//! root directory: no root, no cluster.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, symlink};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::json;

use super::testing::{self, FakeMounter, MountCall, TempDir};
use super::*;
use crate::watch_manager::testing::FakeApi;

const UID: &str = "5c1f-uid";

fn pod(volumes: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": UID, "labels": {"app": "web"}},
        "spec": {
            "serviceAccountName": "builder",
            "containers": [{
                "name": "app",
                "resources": {"limits": {"memory": "128Mi"}}
            }],
            "volumes": volumes,
        }
    }))
    .expect("a valid pod")
}

fn api() -> FakeApi {
    FakeApi::default()
        .with_secret("shop", "db", &[("user", "admin"), ("pass", "s3cret")])
        .with_secret(
            "shop",
            "default-token-x7k2p",
            &[
                ("token", "legacy-jwt"),
                ("ca.crt", "CA"),
                ("namespace", "shop"),
            ],
        )
        .with_config_map(
            "shop",
            "settings",
            &[("app.yaml", "x: 1")],
            &[("logo.png", b"\x89PNG")],
        )
        .with_config_map("shop", "kube-root-ca.crt", &[("ca.crt", "CA")], &[])
        .forbid("other-secret")
}

struct Fixture {
    _tmp: TempDir,
    /// The temporary root dir, resolved (as the mount table shows it).
    root: PathBuf,
    mounter: FakeMounter,
    api: FakeApi,
    manager: VolumeManager<FakeApi, FakeMounter>,
}

fn fixture() -> Fixture {
    let tmp = TempDir::new("volumes");
    let root = fs::canonicalize(tmp.path()).expect("canonical root");
    let mounter = FakeMounter::default();
    let api = api();
    let manager = VolumeManager::new(&root, api.clone(), mounter.clone());
    Fixture {
        _tmp: tmp,
        root,
        mounter,
        api,
        manager,
    }
}

impl Fixture {
    fn volume_dir(&self, plugin: &str, name: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(UID)
            .join("volumes")
            .join(plugin)
            .join(name)
    }

    fn tmpfs_mounts(&self) -> Vec<PathBuf> {
        self.mounter
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                MountCall::Tmpfs { target, .. } => Some(target),
                MountCall::Unmount { .. }
                | MountCall::Bind { .. }
                | MountCall::RemountReadOnly { .. } => None,
            })
            .collect()
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("stat").mode() & 0o7777
}

#[tokio::test]
async fn volumes_are_laid_out_like_the_kubelet() {
    let f = fixture();
    let host = TempDir::new("hostpath");
    let pod = pod(json!([
        {"name": "scratch", "emptyDir": {}},
        {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "creds", "secret": {"secretName": "db"}},
        {"name": "config", "configMap": {"name": "settings"}},
        {"name": "info", "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        {"name": "kube-api-access-abcde", "projected": {"sources": [
            {"configMap": {"name": "kube-root-ca.crt"}}]}},
        {"name": "host", "hostPath": {"path": host.path().to_str().expect("utf-8")}},
    ]));
    let volumes = f.manager.setup(&pod).await.expect("setup");

    for (name, plugin) in [
        ("scratch", "kubernetes.io~empty-dir"),
        ("cache", "kubernetes.io~empty-dir"),
        ("creds", "kubernetes.io~secret"),
        ("config", "kubernetes.io~configmap"),
        ("info", "kubernetes.io~downward-api"),
        ("kube-api-access-abcde", "kubernetes.io~projected"),
    ] {
        let dir = f.volume_dir(plugin, name);
        assert_eq!(volumes.host_path(name), Some(dir.as_path()), "{name}");
        assert!(dir.is_dir(), "{}", dir.display());
    }
    assert_eq!(volumes.host_path("host"), Some(host.path()));
    assert_eq!(volumes.host_path("nope"), None);
    assert_eq!(f.manager.pod_dir(UID), f.root.join("pods").join(UID));

    // Memory-backed: the Memory emptyDir (with its size), secret, downwardAPI, projected.
    assert_eq!(
        f.mounter.calls(),
        [
            MountCall::Tmpfs {
                target: f.volume_dir("kubernetes.io~empty-dir", "cache"),
                size: Some(64 << 20)
            },
            MountCall::Tmpfs {
                target: f.volume_dir("kubernetes.io~secret", "creds"),
                size: None
            },
            MountCall::Tmpfs {
                target: f.volume_dir("kubernetes.io~downward-api", "info"),
                size: None
            },
            MountCall::Tmpfs {
                target: f.volume_dir("kubernetes.io~projected", "kube-api-access-abcde"),
                size: None
            },
        ]
    );
    assert_eq!(
        mode(&f.volume_dir("kubernetes.io~empty-dir", "scratch")),
        0o777
    );
    assert_eq!(
        mode(&f.volume_dir("kubernetes.io~configmap", "config")),
        0o777
    );

    // Read-only by nature: everything the agent writes; not emptyDir or hostPath.
    let read_only = |name: &str| volumes.get(name).expect("volume").read_only;
    assert!(!read_only("scratch") && !read_only("host"));
    assert!(read_only("creds") && read_only("config") && read_only("info"));
    assert!(read_only("kube-api-access-abcde"));

    // Setting up again mounts nothing new and keeps the paths.
    let again = f.manager.setup(&pod).await.expect("setup again");
    assert_eq!(again.host_path("creds"), volumes.host_path("creds"));
    assert_eq!(f.tmpfs_mounts().len(), 4);
}

#[tokio::test]
async fn secret_items_modes_and_default_mode() {
    let f = fixture();
    let pod = pod(json!([
        {"name": "all", "secret": {"secretName": "db", "defaultMode": 0o400}},
        {"name": "some", "secret": {"secretName": "db", "items": [
            {"key": "user", "path": "conf/username", "mode": 0o600},
            {"key": "pass", "path": "password"}]}},
        {"name": "default-token-x7k2p", "secret": {"secretName": "default-token-x7k2p"}},
    ]));
    f.manager.setup(&pod).await.expect("setup");

    let all = f.volume_dir("kubernetes.io~secret", "all");
    assert_eq!(read(&all.join("user")), "admin");
    assert_eq!(read(&all.join("pass")), "s3cret");
    assert_eq!(mode(&all.join("user")), 0o400);
    assert_eq!(
        fs::read_link(all.join("user")).expect("symlink"),
        Path::new("..data/user")
    );

    let some = f.volume_dir("kubernetes.io~secret", "some");
    assert_eq!(read(&some.join("conf/username")), "admin");
    assert_eq!(mode(&some.join("conf/username")), 0o600);
    assert_eq!(read(&some.join("password")), "s3cret");
    assert_eq!(mode(&some.join("password")), 0o644);
    assert!(!some.join("user").exists());

    // The service account token volume of a v1.20 pod is a plain secret volume.
    let legacy = f.volume_dir("kubernetes.io~secret", "default-token-x7k2p");
    assert_eq!(read(&legacy.join("token")), "legacy-jwt");
    assert_eq!(read(&legacy.join("namespace")), "shop");
    assert_eq!(mode(&legacy.join("ca.crt")), 0o644);
}

#[tokio::test]
async fn config_maps_hold_data_and_binary_data() {
    let f = fixture();
    let pod = pod(json!([
        {"name": "all", "configMap": {"name": "settings"}},
        {"name": "logo", "configMap": {"name": "settings", "defaultMode": 0o440,
            "items": [{"key": "logo.png", "path": "img/logo.png"}]}},
    ]));
    f.manager.setup(&pod).await.expect("setup");
    let all = f.volume_dir("kubernetes.io~configmap", "all");
    assert_eq!(read(&all.join("app.yaml")), "x: 1");
    assert_eq!(fs::read(all.join("logo.png")).expect("read"), b"\x89PNG");
    let logo = f
        .volume_dir("kubernetes.io~configmap", "logo")
        .join("img/logo.png");
    assert_eq!(fs::read(&logo).expect("read"), b"\x89PNG");
    assert_eq!(mode(&logo), 0o440);
    assert!(f.tmpfs_mounts().is_empty(), "config maps live on disk");
}

#[tokio::test]
async fn optional_sources_may_be_missing_and_required_ones_may_not() {
    let f = fixture();
    let optional = pod(json!([
        {"name": "maybe", "secret": {"secretName": "absent", "optional": true}},
        {"name": "maybe-cm", "configMap": {"name": "absent", "optional": true}},
        {"name": "partial", "secret": {"secretName": "db", "optional": true,
            "items": [{"key": "user", "path": "u"}, {"key": "token", "path": "t"}]}},
    ]));
    let volumes = f.manager.setup(&optional).await.expect("setup");
    let maybe = volumes.host_path("maybe").expect("volume");
    assert!(maybe.join(atomic_writer::DATA_DIR).is_dir());
    assert_eq!(
        fs::read_dir(maybe).expect("read").count(),
        2,
        "..data and its target only"
    );
    let partial = volumes.host_path("partial").expect("volume");
    assert_eq!(read(&partial.join("u")), "admin");
    assert!(!partial.join("t").exists());

    let required = pod(json!([{"name": "creds", "secret": {"secretName": "absent"}}]));
    match f.manager.setup(&required).await {
        Err(VolumeError::NotFound {
            pod,
            volume,
            kind,
            name,
        }) => {
            assert_eq!((pod.as_str(), volume.as_str()), ("shop/web", "creds"));
            assert_eq!((kind, name.as_str()), ("secret", "absent"));
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let required_cm = pod(json!([{"name": "cfg", "configMap": {"name": "absent"}}]));
    assert!(matches!(
        f.manager.setup(&required_cm).await,
        Err(VolumeError::NotFound {
            kind: "configmap",
            ..
        })
    ));
    let missing_key = pod(json!([{"name": "creds", "secret": {"secretName": "db",
        "items": [{"key": "token", "path": "t"}]}}]));
    match f.manager.setup(&missing_key).await {
        Err(VolumeError::MissingKey { key, name, .. }) => {
            assert_eq!((key.as_str(), name.as_str()), ("token", "db"));
        }
        other => panic!("expected MissingKey, got {other:?}"),
    }
    // A secret that is missing mounts no tmpfs: it is looked up first.
    assert!(
        !f.tmpfs_mounts()
            .contains(&f.volume_dir("kubernetes.io~secret", "creds"))
    );
}

#[tokio::test]
async fn a_forbidden_secret_is_an_api_error() {
    let f = fixture();
    let pod = pod(json!([{"name": "x", "secret": {"secretName": "other-secret"}}]));
    match f.manager.setup(&pod).await {
        Err(VolumeError::Api {
            kind: "secret",
            name,
            source,
            ..
        }) => {
            assert_eq!(name, "other-secret");
            assert_eq!(
                source.to_string(),
                "failed to sync secret cache: timed out waiting for the condition"
            );
        }
        other => panic!("expected an unsynced cache, got {other:?}"),
    }
}

#[tokio::test]
async fn downward_api_volumes_render_metadata_and_resources() {
    let fixture = fixture();
    let f = VolumeManager::new(&fixture.root, fixture.api.clone(), FakeMounter::default())
        .with_node_allocatable([("cpu".to_owned(), ApiQuantity("4".into()))].into());
    let info = pod(
        json!([{"name": "info", "downwardAPI": {"defaultMode": 0o444, "items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}, "mode": 0o400},
            {"path": "mem", "resourceFieldRef": {"containerName": "app",
                "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}},
        ]}}]),
    );
    let volumes = f.setup(&info).await.expect("setup");
    let dir = volumes.host_path("info").expect("volume");
    assert_eq!(read(&dir.join("labels")), "app=\"web\"");
    assert_eq!(read(&dir.join("uid")), UID);
    assert_eq!(mode(&dir.join("uid")), 0o400);
    assert_eq!(read(&dir.join("mem")), "128");
    assert_eq!(mode(&dir.join("mem")), 0o444);
    assert_eq!(
        read(&dir.join("cpu")),
        "4",
        "no limit: the node's allocatable"
    );

    let bad = pod(json!([{"name": "info", "downwardAPI": {"items": [
        {"path": "ip", "fieldRef": {"fieldPath": "status.podIP"}}]}}]));
    match f.setup(&bad).await {
        Err(VolumeError::InvalidSpec { volume, reason, .. }) => {
            assert_eq!(volume, "info");
            assert!(reason.contains("status.podIP"), "{reason}");
        }
        other => panic!("expected InvalidSpec, got {other:?}"),
    }
}

#[tokio::test]
async fn projected_volumes_merge_all_sources_and_a_bound_token() {
    let f = fixture();
    let pod = pod(json!([{"name": "kube-api-access-abcde", "projected": {
    "defaultMode": 0o420,
    "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"serviceAccountToken": {"path": "vault-token", "audience": "vault"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        {"secret": {"name": "db", "items": [{"key": "user", "path": "db/user", "mode": 0o400}]}},
        {"secret": {"name": "absent", "optional": true}},
    ]}}]));
    let volumes = f.manager.setup(&pod).await.expect("setup");
    let dir = volumes.host_path("kube-api-access-abcde").expect("volume");
    assert_eq!(read(&dir.join("token")), "token-1-builder");
    assert_eq!(read(&dir.join("vault-token")), "token-2-builder");
    assert_eq!(read(&dir.join("ca.crt")), "CA");
    assert_eq!(read(&dir.join("namespace")), "shop");
    assert_eq!(read(&dir.join("db/user")), "admin");
    for file in ["token", "vault-token", "ca.crt", "namespace"] {
        assert_eq!(mode(&dir.join(file)), 0o420, "{file}");
    }
    assert_eq!(mode(&dir.join("db/user")), 0o400);

    let requests = f.api.token_requests();
    assert_eq!(requests.len(), 2);
    let (namespace, service_account, request) = &requests[0];
    assert_eq!(
        (namespace.as_str(), service_account.as_str()),
        ("shop", "builder")
    );
    assert!(
        request.spec.audiences.is_empty(),
        "the API server's audience"
    );
    assert_eq!(request.spec.expiration_seconds, Some(3607));
    let bound = request.spec.bound_object_ref.as_ref().expect("bound");
    assert_eq!(bound.kind.as_deref(), Some("Pod"));
    assert_eq!(bound.name.as_deref(), Some("web"));
    assert_eq!(bound.uid.as_deref(), Some(UID));
    let (_, _, vault) = &requests[1];
    assert_eq!(vault.spec.audiences, ["vault"]);
    assert_eq!(vault.spec.expiration_seconds, Some(3600));

    // A resync reuses the tokens; once the pod is gone its tokens are forgotten.
    f.manager.setup(&pod).await.expect("setup again");
    assert_eq!(f.api.token_requests().len(), 2);
    f.manager.teardown(UID).await.expect("teardown");
    assert!(
        f.manager.holds(UID),
        "teardown leaves the forgetting to the pod's owner"
    );
    f.manager.forget(UID);
    assert!(!f.manager.holds(UID));
    f.manager.setup(&pod).await.expect("setup after teardown");
    assert_eq!(f.api.token_requests().len(), 4);
}

#[tokio::test]
async fn unsupported_volume_types_are_named() {
    let f = fixture();
    for (source, kind) in [
        (json!({"csi": {"driver": "x"}}), "csi"),
        (json!({"nfs": {"server": "s", "path": "/"}}), "nfs"),
        (
            json!({"emptyDir": {"medium": "HugePages"}}),
            "emptyDir with medium \"HugePages\"",
        ),
        (
            json!({"projected": {"sources": [{"clusterTrustBundle": {"path": "b", "name": "x"}}]}}),
            "projected clusterTrustBundle",
        ),
        (json!({}), "unknown"),
    ] {
        let mut volume = source;
        volume["name"] = json!("data");
        match f.manager.setup(&pod(json!([volume]))).await {
            Err(VolumeError::Unsupported {
                pod,
                volume,
                kind: got,
            }) => {
                assert_eq!((pod.as_str(), volume.as_str()), ("shop/web", "data"));
                assert_eq!(got, kind);
            }
            other => panic!("expected Unsupported for {kind}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn host_path_types_are_enforced() {
    let f = fixture();
    let host = TempDir::new("hostpath");
    let made = host.path().join("made");
    let pod_with = |path: &Path, kind: &str| {
        pod(json!([{"name": "h", "hostPath": {"path": path, "type": kind}}]))
    };
    let volumes = f
        .manager
        .setup(&pod_with(&made, "DirectoryOrCreate"))
        .await
        .expect("setup");
    assert_eq!(volumes.host_path("h"), Some(made.as_path()));
    assert!(made.is_dir());
    match f.manager.setup(&pod_with(&made, "File")).await {
        Err(VolumeError::HostPathType { expected, .. }) => assert_eq!(expected, "File"),
        other => panic!("expected HostPathType, got {other:?}"),
    }
    assert!(matches!(
        f.manager.setup(&pod_with(Path::new("relative"), "")).await,
        Err(VolumeError::InvalidSpec { .. })
    ));
}

fn container(mounts: serde_json::Value) -> Container {
    serde_json::from_value(json!({"name": "app", "volumeMounts": mounts})).expect("container")
}

/// The mounts of `container`, or the error's text.
async fn mounts_of(
    volumes: &PodVolumes,
    mounts: serde_json::Value,
    env: &[(&str, &str)],
) -> Result<Vec<ContainerMount>, String> {
    let env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    volumes
        .container_mounts(&container(mounts), &env)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn sub_paths_are_made_inside_the_volume_and_bound() {
    let f = fixture();
    let pod = pod(json!([
        {"name": "scratch", "emptyDir": {}},
        {"name": "creds", "secret": {"secretName": "db"}},
    ]));
    let volumes = f.manager.setup(&pod).await.expect("setup");
    let scratch = volumes.host_path("scratch").expect("volume").to_owned();
    let subpaths = f.root.join("pods").join(UID).join("volume-subpaths");

    let mounts = mounts_of(
        &volumes,
        json!([
            {"name": "scratch", "mountPath": "/all"},
            {"name": "scratch", "mountPath": "/ro", "subPath": "", "readOnly": true},
            {"name": "scratch", "mountPath": "/logs", "subPath": "logs/app"},
            {"name": "creds", "mountPath": "/user", "subPath": "user"},
            {"name": "scratch", "mountPath": "/mine", "subPathExpr": "per-pod/$(POD_NAME)"},
        ]),
        &[("POD_NAME", "web")],
    )
    .await
    .expect("mounts");
    let at = |path: &str| {
        mounts
            .iter()
            .find(|m| m.container_path == path)
            .unwrap_or_else(|| panic!("no mount at {path}"))
    };
    assert_eq!(at("/all").host_path, scratch);
    assert!(!at("/all").read_only);
    assert_eq!(at("/ro").host_path, scratch);
    assert!(at("/ro").read_only);
    assert_eq!(at("/logs").host_path, subpaths.join("scratch/app/2"));
    assert!(!at("/logs").read_only);
    assert!(scratch.join("logs/app").is_dir(), "created");
    assert_eq!(mode(&scratch.join("logs/app")), 0o777, "the volume's mode");
    assert_eq!(at("/user").host_path, subpaths.join("creds/app/3"));
    assert!(at("/user").read_only, "secrets are always read-only");
    assert!(at("/user").host_path.is_file(), "a file target for a file");
    assert_eq!(at("/mine").host_path, subpaths.join("scratch/app/4"));
    assert!(scratch.join("per-pod/web").is_dir());
    let bound: Vec<_> = f
        .mounter
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            MountCall::Bind { source, target } => Some((source, target)),
            _ => None,
        })
        .collect();
    let real = |p: &Path| fs::canonicalize(p).expect("canon");
    assert_eq!(
        bound,
        [
            (
                real(&scratch.join("logs/app")),
                real(&at("/logs").host_path)
            ),
            (
                // The file of the current `..data`: as with the kubelet, a subPath mount of
                // a secret sees no later updates.
                real(&volumes.host_path("creds").expect("creds").join("user")),
                real(&at("/user").host_path)
            ),
            (
                real(&scratch.join("per-pod/web")),
                real(&at("/mine").host_path)
            ),
        ]
    );

    // Teardown unmounts the bind mounts and removes their targets.
    f.manager.teardown(UID).await.expect("teardown");
    assert!(!subpaths.exists());
    assert!(f.mounter.mount_points().expect("table").is_empty());
}

#[tokio::test]
async fn bad_sub_paths_fail_with_the_kubelets_messages() {
    let f = fixture();
    let outside = TempDir::new("outside");
    let pod = pod(json!([{"name": "scratch", "emptyDir": {}}]));
    let volumes = f.manager.setup(&pod).await.expect("setup");
    let scratch = volumes.host_path("scratch").expect("volume").to_owned();
    symlink(outside.path(), scratch.join("escape")).expect("symlink");
    let env = [("DOTS", ".."), ("ABS", "/tmp"), ("EMPTY", "")];
    for (mount, message) in [
        (
            json!({"subPath": "/etc"}),
            "error SubPath `/etc` must not be an absolute path",
        ),
        (
            json!({"subPath": "a/../../x"}),
            "unable to provision SubPath `a/../../x`: must not contain '..'",
        ),
        (
            json!({"subPathExpr": "$(DOTS)"}),
            "unable to provision SubPath `..`: must not contain '..'",
        ),
        (
            json!({"subPathExpr": "$(ABS)"}),
            "error SubPath `/tmp` must not be an absolute path",
        ),
        (
            json!({"subPathExpr": "x/$(EMPTY)$(UNSET)"}),
            "missing value for EMPTY, UNSET",
        ),
        (
            json!({"subPath": "escape/made"}),
            r#"failed to create subPath directory for volumeMount "scratch" of container "app""#,
        ),
        (
            json!({"subPath": "escape"}),
            r#"failed to prepare subPath for volumeMount "scratch" of container "app""#,
        ),
        (
            json!({"name": "nope"}),
            r#"cannot find volume "nope" to mount into container "app""#,
        ),
    ] {
        let mut m = json!({"name": "scratch", "mountPath": "/m"});
        m.as_object_mut()
            .expect("object")
            .extend(mount.as_object().expect("object").clone());
        assert_eq!(
            mounts_of(&volumes, json!([m]), &env).await,
            Err(message.to_owned())
        );
    }
    assert!(
        !outside.path().join("made").exists(),
        "nothing made outside the volume"
    );
}

#[tokio::test]
async fn teardown_unmounts_everything_under_the_pod_and_removes_its_dirs() {
    let f = fixture();
    let pod = pod(json!([
        {"name": "scratch", "emptyDir": {}},
        {"name": "cache", "emptyDir": {"medium": "Memory"}},
        {"name": "creds", "secret": {"secretName": "db"}},
    ]));
    let volumes = f.manager.setup(&pod).await.expect("setup");
    // A tmpfs an earlier agent run left, and a mount that is none of this pod's business.
    let pod_dir = fs::canonicalize(f.manager.pod_dir(UID)).expect("canon");
    let leftover = pod_dir.join("volumes/kubernetes.io~projected/old");
    fs::create_dir_all(&leftover).expect("mkdir");
    f.mounter.add_existing(&leftover);
    let elsewhere = f.root.join("pods/other-uid/volumes/x");
    f.mounter.add_existing(&elsewhere);
    fs::write(pod_dir.join("etc-hosts"), "127.0.0.1 localhost").expect("write");

    f.manager.teardown(UID).await.expect("teardown");
    let unmounted: HashSet<_> = f
        .mounter
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            MountCall::Unmount { target } => Some(target),
            MountCall::Tmpfs { .. }
            | MountCall::Bind { .. }
            | MountCall::RemountReadOnly { .. } => None,
        })
        .collect();
    let canon = |name: &str| {
        let dir = volumes.host_path(name).expect("volume");
        pod_dir.join(
            dir.strip_prefix(f.manager.pod_dir(UID))
                .expect("under pod dir"),
        )
    };
    assert_eq!(
        unmounted,
        HashSet::from([canon("cache"), canon("creds"), leftover])
    );
    assert_eq!(f.mounter.mount_points().expect("table"), [elsewhere]);
    assert!(!pod_dir.join("volumes").exists(), "volumes dir removed");
    assert!(
        pod_dir.join("etc-hosts").exists(),
        "other files of the pod are not ours"
    );

    fs::remove_file(pod_dir.join("etc-hosts")).expect("rm");
    f.manager.teardown(UID).await.expect("teardown again");
    assert!(!pod_dir.exists(), "an empty pod dir is removed");
    f.manager.teardown(UID).await.expect("teardown of nothing");
}

#[tokio::test]
async fn orphaned_pod_dirs_are_torn_down_and_known_ones_kept() {
    let f = fixture();
    let known = pod(json!([{"name": "creds", "secret": {"secretName": "db"}}]));
    f.manager.setup(&known).await.expect("setup");
    let orphan_dir = f.root.join("pods/dead-uid");
    let orphan_mount = orphan_dir.join("volumes/kubernetes.io~secret/creds");
    fs::create_dir_all(&orphan_mount).expect("mkdir");
    fs::write(orphan_dir.join("etc-hosts"), "").expect("write");
    f.mounter
        .add_existing(&fs::canonicalize(&orphan_mount).expect("canon"));
    fs::write(f.root.join("pods/not-a-dir"), "").expect("write");

    let removed = f
        .manager
        .cleanup_orphans(&HashSet::from([UID.to_owned()]))
        .await
        .expect("cleanup");
    assert_eq!(removed, ["dead-uid"]);
    assert!(!orphan_dir.exists(), "the whole orphan dir is removed");
    assert!(
        f.manager.pod_dir(UID).join("volumes").is_dir(),
        "known pod kept"
    );
    assert_eq!(f.mounter.mount_points().expect("table").len(), 1);
    assert!(f.root.join("pods/not-a-dir").exists());

    let empty = VolumeManager::new(
        f.root.join("nothing-here"),
        FakeApi::default(),
        FakeMounter::default(),
    );
    assert!(
        empty
            .cleanup_orphans(&HashSet::new())
            .await
            .expect("cleanup")
            .is_empty()
    );
}

#[tokio::test]
async fn pods_without_a_usable_uid_are_refused() {
    let f = fixture();
    for uid in [None, Some(""), Some(".."), Some("a/b")] {
        let mut p = pod(json!([]));
        p.metadata.uid = uid.map(Into::into);
        assert!(
            matches!(
                f.manager.setup(&p).await,
                Err(VolumeError::InvalidPod { .. })
            ),
            "{uid:?}"
        );
    }
    assert!(matches!(
        f.manager.teardown("../..").await,
        Err(VolumeError::InvalidPod { .. })
    ));
}

/// Where the `..data` link of a volume points.
fn data_dir(dir: &Path) -> PathBuf {
    fs::read_link(dir.join(atomic_writer::DATA_DIR)).expect("..data")
}

#[tokio::test]
async fn changed_sources_are_rewritten_in_place_and_unchanged_ones_left_alone() {
    let f = fixture();
    let start = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs(),
    )
    .expect("in range");
    let offset = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let now = Arc::clone(&offset);
    let manager = VolumeManager::new(&f.root, f.api.clone(), f.mounter.clone()).with_token_clock(
        Arc::new(move || start + now.load(std::sync::atomic::Ordering::Relaxed)),
    );
    let mut pod = pod(json!([
        {"name": "config", "configMap": {"name": "settings"}},
        {"name": "creds", "secret": {"secretName": "db"}},
        {"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"name": "token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}},
    ]));
    let volumes = manager.setup(&pod).await.expect("setup");
    let dir = |name: &str| volumes.host_path(name).expect("volume").to_owned();
    let links = |names: &[&str]| names.iter().map(|n| data_dir(&dir(n))).collect::<Vec<_>>();
    let all = ["config", "creds", "info", "token"];
    let before = links(&all);
    manager.setup(&pod).await.expect("setup again");
    assert_eq!(links(&all), before, "nothing changed: nothing rewritten");

    let _ = f
        .api
        .clone()
        .with_config_map("shop", "settings", &[("app.yaml", "x: 2")], &[]);
    manager.setup(&pod).await.expect("setup after the update");
    assert_eq!(read(&dir("config").join("app.yaml")), "x: 2");
    assert!(
        !dir("config").join("logo.png").exists(),
        "a key gone is gone"
    );
    let after = links(&all);
    assert_ne!(after[0], before[0]);
    assert_eq!(after[1..], before[1..], "the other volumes are left alone");

    pod.metadata.labels = Some([("app".to_owned(), "shop".to_owned())].into());
    manager
        .setup(&pod)
        .await
        .expect("setup after a label change");
    assert_eq!(read(&dir("info").join("labels")), "app=\"shop\"");

    let token = read(&dir("token").join("token"));
    offset.store(2881, std::sync::atomic::Ordering::Relaxed);
    manager.setup(&pod).await.expect("setup at 80 %");
    assert_ne!(read(&dir("token").join("token")), token, "refreshed");
    assert_eq!(f.api.token_requests().len(), 2);
}

#[tokio::test]
async fn fs_group_owns_the_volumes_and_their_updates() {
    let f = fixture();
    let gid = testing::fs_group_for_tests();
    let mut pod = pod(json!([
        {"name": "scratch", "emptyDir": {}},
        {"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o400}},
        {"name": "config", "configMap": {"name": "settings"}},
    ]));
    pod.spec.as_mut().expect("spec").security_context =
        // The policy applies to the emptyDir only, as in the kubelet: the files of an
        // update are owned although the root of their volume matches already.
        Some(serde_json::from_value(json!({"fsGroup": gid, "fsGroupChangePolicy": "OnRootMismatch"})).expect("context"));
    let volumes = f.manager.setup(&pod).await.expect("setup");
    let dir = |name: &str| volumes.host_path(name).expect("volume").to_owned();
    let gid_of = |p: &Path| fs::metadata(p).expect("stat").gid();

    assert_eq!(mode(&dir("scratch")), 0o2777);
    assert_eq!(gid_of(&dir("scratch")), gid);
    let user = dir("creds").join("user");
    assert_eq!(mode(&user), 0o440, "read-only volume: group read");
    assert_eq!(gid_of(&user), gid);
    assert_eq!(mode(&dir("creds").join(data_dir(&dir("creds")))), 0o2755);
    let data = data_dir(&dir("creds"));
    f.manager.setup(&pod).await.expect("setup again");
    assert_eq!(
        data_dir(&dir("creds")),
        data,
        "the group bits count as written"
    );

    let _ = f
        .api
        .clone()
        .with_config_map("shop", "settings", &[("new.yaml", "y")], &[])
        .with_secret("shop", "db", &[("token", "t")]);
    f.manager.setup(&pod).await.expect("setup after the update");
    let new = dir("config").join("new.yaml");
    assert_eq!(gid_of(&new), gid, "an update is owned too");
    assert_eq!(mode(&new), 0o644);
    let token = dir("creds").join("token");
    assert_eq!(gid_of(&token), gid, "an update is owned too");
    assert_eq!(mode(&token), 0o440);
}

/// A claim `name` in `shop`, Bound to the volume `pv` (UID `claim-<name>`).
fn bound_claim(name: &str, pv: &str) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "uid": format!("claim-{name}")},
        "spec": {"volumeName": pv},
        "status": {"phase": "Bound"}
    }))
    .expect("claim")
}

/// A PersistentVolume `name` bound to the claim `claim` of `shop`, with `source` and a node
/// affinity to the host `node-a`.
fn persistent_volume(
    name: &str,
    claim: &str,
    source: serde_json::Value,
) -> k8s_openapi::api::core::v1::PersistentVolume {
    let mut spec = json!({
        "claimRef": {"namespace": "shop", "name": claim, "uid": format!("claim-{claim}")},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}
        ]}]}}
    });
    for (k, v) in source.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pv")
}

fn claim_pod(
    volumes: serde_json::Value,
    mounts: serde_json::Value,
    devices: serde_json::Value,
) -> Pod {
    let mut pod = pod(volumes);
    let container = &mut pod.spec.as_mut().expect("spec").containers[0];
    container.volume_mounts = serde_json::from_value(mounts).expect("mounts");
    container.volume_devices = serde_json::from_value(devices).expect("devices");
    pod
}

#[tokio::test]
async fn claims_are_followed_to_local_volumes_and_torn_down_without_their_data() {
    let tmp = TempDir::new("pvc");
    let root = fs::canonicalize(tmp.path()).expect("root");
    let disk = root.join("disk");
    fs::create_dir(&disk).expect("mkdir");
    fs::write(disk.join("kept"), "data").expect("write");
    let api = FakeApi::default()
        .with_node_labels(&[("kubernetes.io/hostname", "node-a")])
        .with_claim(bound_claim("data", "local-1"))
        .with_persistent_volume(persistent_volume(
            "local-1",
            "data",
            json!({"local": {"path": disk.to_str().expect("utf-8")}}),
        ))
        .with_claim(bound_claim("raw", "block-1"))
        .with_persistent_volume(persistent_volume(
            "block-1",
            "raw",
            json!({"local": {"path": "/dev/null"}, "volumeMode": "Block"}),
        ))
        .with_claim(bound_claim("shared", "csi-1"))
        .with_persistent_volume(persistent_volume(
            "csi-1",
            "shared",
            json!({"csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "v"}}),
        ));
    let mounter = FakeMounter::default();
    let manager = VolumeManager::new(&root, api.clone(), mounter.clone());
    let data =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": true}}]);
    let pod_ = claim_pod(
        data.clone(),
        json!([{"name": "data", "mountPath": "/data"}]),
        json!([]),
    );
    let volumes = manager.setup(&pod_).await.expect("set up");
    let dir = root
        .join("pods")
        .join(UID)
        .join("volumes/kubernetes.io~local-volume/local-1");
    assert_eq!(
        volumes.get("data"),
        Some(&HostMount {
            host_path: dir.clone(),
            read_only: true
        })
    );
    assert_eq!(
        mounter.calls(),
        [
            MountCall::Bind {
                source: disk.clone(),
                target: dir.clone()
            },
            MountCall::RemountReadOnly {
                target: dir.clone()
            },
        ]
    );
    manager.setup(&pod_).await.expect("again");
    assert_eq!(mounter.calls().len(), 2, "a mounted volume is kept");

    // The mount point holds what the volume holds while mounted; teardown unmounts it and
    // removes the empty mount point only.
    manager.teardown(UID).await.expect("teardown");
    assert!(
        matches!(mounter.calls().last(), Some(MountCall::Unmount { target }) if *target == dir)
    );
    assert!(!root.join("pods").join(UID).exists());
    assert_eq!(
        read(&disk.join("kept")),
        "data",
        "the volume's data is kept"
    );

    // A writable claim gets the pod's fsGroup on its new mount, as other volumes do.
    let gid = testing::fs_group_for_tests();
    let writable = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]);
    let mut owned = claim_pod(
        writable,
        json!([{"name": "data", "mountPath": "/data"}]),
        json!([]),
    );
    owned.spec.as_mut().expect("spec").security_context =
        Some(serde_json::from_value(json!({"fsGroup": gid})).expect("context"));
    let volumes = manager.setup(&owned).await.expect("writable");
    let mount = volumes.get("data").expect("data");
    assert!(!mount.read_only);
    assert_eq!(fs::metadata(&mount.host_path).expect("stat").gid(), gid);
    assert_eq!(mode(&mount.host_path) & 0o2000, 0o2000, "setgid");
    manager.teardown(UID).await.expect("teardown");

    // Block: the device reaches the container through the pod's device link.
    let raw = json!([{"name": "raw", "persistentVolumeClaim": {"claimName": "raw"}}]);
    let block_pod = claim_pod(
        raw,
        json!([]),
        json!([{"name": "raw", "devicePath": "/dev/xvda"}]),
    );
    let err = manager
        .setup(&block_pod)
        .await
        .expect_err("/dev/null is no block device");
    assert!(
        err.failed_mount_message()
            .starts_with(r#"MountVolume.SetUp failed for volume "block-1" : a local volume of volumeMode Block must be a block device: /dev/null"#),
        "{err}"
    );

    // The node must match the volume's node affinity.
    let elsewhere = VolumeManager::new(
        &root,
        api.clone()
            .with_node_labels(&[("kubernetes.io/hostname", "node-b")]),
        mounter.clone(),
    );
    let err = elsewhere.setup(&pod_).await.expect_err("wrong node");
    assert_eq!(
        err.failed_mount_message(),
        r#"MountVolume.NodeAffinity check failed for volume "local-1" : no matching NodeSelectorTerms"#
    );

    // A CSI volume is refused until this node has a CSI mounter.
    let shared = json!([{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]);
    let csi_pod = claim_pod(
        shared,
        json!([{"name": "shared", "mountPath": "/s"}]),
        json!([]),
    );
    assert!(matches!(
        manager.setup(&csi_pod).await,
        Err(VolumeError::Unsupported { kind, .. }) if kind == "csi (PersistentVolume csi-1, driver hostpath.csi.k8s.io)"
    ));
}

#[tokio::test]
async fn a_pod_waits_for_its_claim_with_the_kubelets_event() {
    let tmp = TempDir::new("pending");
    let root = fs::canonicalize(tmp.path()).expect("root");
    let pending: k8s_openapi::api::core::v1::PersistentVolumeClaim =
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "shop", "uid": "c"},
            "spec": {},
            "status": {"phase": "Pending"}
        }))
        .expect("claim");
    let api = FakeApi::default().with_node_labels(&[]).with_claim(pending);
    let manager = VolumeManager::new(&root, api, FakeMounter::default());
    let pod_ = claim_pod(
        json!([
            {"name": "cache", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "unused", "emptyDir": {}},
            {"name": "tokens", "emptyDir": {}}
        ]),
        json!([
            {"name": "tokens", "mountPath": "/t"},
            {"name": "data", "mountPath": "/data"},
            {"name": "cache", "mountPath": "/c"}
        ]),
        json!([]),
    );
    let err = manager.setup(&pod_).await.expect_err("pending");
    assert_eq!(
        err.failed_mount_message(),
        "Unable to attach or mount volumes: unmounted volumes=[data tokens], unattached volumes=[cache data tokens]: error processing PVC shop/data: PVC is not bound"
    );
    let unused = claim_pod(
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]),
        json!([]),
        json!([]),
    );
    let volumes = manager
        .setup(&unused)
        .await
        .expect("an unused claim is not waited for");
    assert!(volumes.get("data").is_none());
}
