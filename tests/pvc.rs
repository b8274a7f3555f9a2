//! PersistentVolumeClaims for real, against the local v1.20 cluster (scheduler, PV and
//! StatefulSet controllers in kube-controller-manager): a StatefulSet on `local` PVs of a
//! WaitForFirstConsumer StorageClass keeps each replica's data across pod deletion, an agent
//! restart with its pod deleted meanwhile, and scaling to 0 and back, and leaves the data and
//! no mount once everything is deleted; a raw block claim on a loop device; a claim that is
//! not bound, a volume whose node affinity excludes the node, and a read-only hostPath claim.
//! Everything a test creates (API objects, directories, the loop device) is removed also
//! when it fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::case::{Case, delete_and_wait, get, root_dir, running};
use common::leaks::mounts_under;
use common::pods::{event_messages, exec_in, is_ready, pods_api, pods_of_app, sleeper};
use common::{eventually, kube_client, kubectl, node_name, state_dir, unique};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

async fn admin() -> kube::Client {
    kube_client("admin.kubeconfig").await
}

/// The cluster objects a test made, deleted (with `kubectl`) when it ends, in reverse order.
#[derive(Default)]
struct Objects(Vec<(&'static str, String)>);

impl Objects {
    async fn create(&mut self, manifest: serde_json::Value) {
        let kind = match manifest["kind"].as_str().expect("kind") {
            "StorageClass" => "storageclass",
            "PersistentVolume" => "pv",
            "PersistentVolumeClaim" => "pvc",
            "StatefulSet" => "statefulset",
            other => panic!("no clean-up for {other}"),
        };
        let name = manifest["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_owned();
        let path = std::env::temp_dir().join(unique("rk-pvc-manifest"));
        std::fs::write(&path, manifest.to_string()).expect("write manifest");
        self.0.push((kind, name));
        let out = kubectl(&["apply", "-f", path.to_str().expect("utf-8")]).await;
        let _ = std::fs::remove_file(&path);
        eprintln!("{}", out.trim());
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        let objects = std::mem::take(&mut self.0);
        common::cleanup_blocking(move || async move {
            for (kind, name) in objects.iter().rev() {
                let _ = common::kubectl_command(&[
                    "delete",
                    kind,
                    name,
                    "-n",
                    "default",
                    "--ignore-not-found",
                    "--wait=false",
                ])
                .output()
                .await;
            }
        });
    }
}

/// A scratch directory for the volumes' data under the cluster's state dir (so that
/// `cluster.sh down` removes it too), removed when the test ends.
struct DataDir(PathBuf);

impl DataDir {
    fn new(prefix: &str) -> Self {
        let path = state_dir().join("test-volumes").join(unique(prefix));
        std::fs::create_dir_all(&path).expect("data dir");
        Self(path)
    }

    fn make(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        std::fs::create_dir_all(&dir).expect("volume dir");
        dir
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The node's `kubernetes.io/hostname` label, which local PVs' node affinity names, once
/// the agent registered the node.
async fn hostname_label() -> String {
    let nodes = Api::<Node>::all(admin().await);
    eventually("the node registered", Duration::from_secs(60), || async {
        let node = nodes.get_opt(&node_name()).await.ok().flatten()?;
        node.metadata.labels?.get("kubernetes.io/hostname").cloned()
    })
    .await
}

fn affinity(host: &str) -> serde_json::Value {
    json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}
    ]}]}})
}

/// A `local` PersistentVolume at `path` on the host `host`.
fn local_pv(name: &str, path: &Path, host: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "64Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "local": {"path": path},
            "nodeAffinity": affinity(host)
        }
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        pv["spec"][k] = v.clone();
    }
    pv
}

/// A claim pre-bound to the volume `pv` (no storage class).
fn claim(name: &str, pv: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut pvc = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv,
            "resources": {"requests": {"storage": "16Mi"}}
        }
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        pvc["spec"][k] = v.clone();
    }
    pvc
}

/// A volume pre-bound to `claim` in `default` (its claimRef; the PV controller completes
/// the binding).
fn claim_ref(claim: &str) -> serde_json::Value {
    json!({"claimRef": {"namespace": "default", "name": claim}, "storageClassName": ""})
}

async fn wait_bound(name: &str) {
    let api = Api::<PersistentVolumeClaim>::namespaced(admin().await, "default");
    eventually(
        &format!("claim {name} Bound"),
        Duration::from_secs(60),
        || async {
            let c = api.get_opt(name).await.ok().flatten()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        },
    )
    .await;
}

/// The mounts left under the agent's pod directories (all pods, or one pod's).
fn mounts_in_pods(uid: Option<&str>) -> Vec<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let pods = root_dir().join("pods");
    let dir = uid.map_or(pods.clone(), |u| pods.join(u));
    mounts_under(&mountinfo, &dir)
}

async fn sh(uid: &str, script: &str) -> (i32, String, String) {
    let out = exec_in(uid, "main", vec!["sh".into(), "-c".into(), script.into()]).await;
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The StatefulSet's `n` pods once all are ready, by name.
async fn all_ready(case: &Case, app: &str, n: usize) -> std::collections::BTreeMap<String, Pod> {
    eventually(
        &format!("{n} ready pods of {app}"),
        Duration::from_secs(90),
        || async {
            let pods = pods_of_app(app).await;
            pods.iter().for_each(|p| case.pods.track(p));
            (pods.len() == n
                && pods.iter().all(is_ready)
                && pods.iter().all(|p| p.metadata.deletion_timestamp.is_none()))
            .then(|| {
                pods.into_iter()
                    .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
                    .collect()
            })
        },
    )
    .await
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().expect("uid")
}

/// What each replica's volume holds: the names of the runs that started on it.
async fn names_in(pod: &Pod) -> String {
    let (code, out, err) = sh(&uid(pod), "cat /data/names").await;
    assert_eq!(code, 0, "reading /data/names: {err}");
    out
}

/// Waits until the pod `name` with UID `old` has left the API (the StatefulSet controller
/// makes a new one of the same name at once).
async fn replaced(name: &str, old: &str) {
    eventually(
        &format!("{name} ({old}) gone from the API"),
        Duration::from_secs(30),
        || async { get(name).await.is_none_or(|p| uid(&p) != old).then_some(()) },
    )
    .await;
}

async fn scale(name: &str, replicas: i32) {
    Api::<StatefulSet>::namespaced(admin().await, "default")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_stateful_set_on_local_volumes_keeps_its_data() {
    let started = Instant::now();
    let mut case = Case::with_agent("pvc-sts", &[]).await;
    let data = DataDir::new("rk-sts");
    let mut objects = Objects::default();
    let host = hostname_label().await;
    let app = case.pods.label.clone();
    let class = format!("{app}-local");
    objects
        .create(json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": class},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer"
        }))
        .await;
    let mut pv_dirs = std::collections::BTreeMap::new();
    for n in 0..2 {
        let pv = format!("{app}-pv{n}");
        let dir = data.make(&pv);
        objects
            .create(local_pv(
                &pv,
                &dir,
                &host,
                json!({"storageClassName": class}),
            ))
            .await;
        pv_dirs.insert(pv, dir);
    }
    objects
        .create(json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": app, "namespace": "default"},
            "spec": {
                "serviceName": app,
                "replicas": 2,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": app}},
                "template": {
                    "metadata": {"labels": {"app": app, "rk-test": app}},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": host},
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{
                            "name": "main",
                            "image": "busybox",
                            "command": ["sh", "-c", "hostname >> /data/names; exec sleep 3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                        }]
                    }
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": class,
                        "resources": {"requests": {"storage": "16Mi"}}
                    }
                }]
            }
        }))
        .await;
    for n in 0..2 {
        objects.0.push(("pvc", format!("data-{app}-{n}")));
    }

    // Each replica writes its name to its own volume, bind-mounted at the kubelet's path.
    let pods = all_ready(&case, &app, 2).await;
    let first_start = started.elapsed();
    let claims = Api::<PersistentVolumeClaim>::namespaced(admin().await, "default");
    let mut dir_of = std::collections::BTreeMap::new();
    for (name, pod) in &pods {
        assert_eq!(names_in(pod).await, format!("{name}\n"));
        let claim = claims.get(&format!("data-{name}")).await.expect("claim");
        let pv = claim.spec.and_then(|s| s.volume_name).expect("bound");
        let mount = root_dir()
            .join("pods")
            .join(uid(pod))
            .join("volumes/kubernetes.io~local-volume")
            .join(&pv);
        let local: Vec<String> = mounts_in_pods(Some(&uid(pod)))
            .into_iter()
            .filter(|m| m.contains("kubernetes.io~local-volume"))
            .collect();
        assert_eq!(
            local,
            [mount.display().to_string()],
            "the local volume is bind-mounted at the kubelet's path"
        );
        dir_of.insert(name.clone(), pv_dirs[&pv].clone());
    }
    let host_names =
        |name: &str| std::fs::read_to_string(dir_of[name].join("names")).expect("names");

    // A deleted pod comes back with the same data; its old mount is gone.
    let zero = format!("{app}-0");
    let old = uid(&pods[&zero]);
    pods_api()
        .await
        .delete(&zero, &DeleteParams::default())
        .await
        .expect("delete");
    replaced(&zero, &old).await;
    assert_eq!(mounts_in_pods(Some(&old)), Vec::<String>::new());
    let pods = all_ready(&case, &app, 2).await;
    assert_ne!(uid(&pods[&zero]), old);
    assert_eq!(names_in(&pods[&zero]).await, format!("{zero}\n{zero}\n"));

    // A pod deleted while the agent is down: after the restart its volume is unmounted
    // (reconstructed from the pod directories), and its successor mounts the same data.
    let one = format!("{app}-1");
    let old = uid(&pods[&one]);
    case.stop_agent();
    pods_api()
        .await
        .delete(
            &one,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .expect("force delete");
    replaced(&one, &old).await;
    assert!(
        mounts_in_pods(Some(&old))
            .iter()
            .any(|m| m.contains("kubernetes.io~local-volume")),
        "still mounted while the agent is down"
    );
    let restart = Instant::now();
    case.start_agent(&[]);
    let pods = all_ready(&case, &app, 2).await;
    eventually(
        "the deleted pod's mount gone",
        Duration::from_secs(30),
        || async { mounts_in_pods(Some(&old)).is_empty().then_some(()) },
    )
    .await;
    let after_restart = restart.elapsed();
    assert_eq!(names_in(&pods[&one]).await, format!("{one}\n{one}\n"));

    // Scaling to 0 unmounts everything and keeps the data; back to 2, each replica finds
    // its own.
    scale(&app, 0).await;
    eventually("no pods", Duration::from_secs(60), || async {
        pods_of_app(&app).await.is_empty().then_some(())
    })
    .await;
    eventually("no mounts", Duration::from_secs(30), || async {
        mounts_in_pods(None).is_empty().then_some(())
    })
    .await;
    assert_eq!(host_names(&zero), format!("{zero}\n{zero}\n"));
    scale(&app, 2).await;
    let pods = all_ready(&case, &app, 2).await;
    for name in [&zero, &one] {
        assert_eq!(
            names_in(&pods[name]).await,
            format!("{name}\n{name}\n{name}\n")
        );
    }

    // Everything deleted: the volumes' directories still hold the files, nothing mounted.
    kubectl(&[
        "delete",
        "statefulset",
        &app,
        "-n",
        "default",
        "--wait=true",
    ])
    .await;
    eventually("the set's pods gone", Duration::from_secs(60), || async {
        pods_of_app(&app).await.is_empty().then_some(())
    })
    .await;
    drop(objects);
    eventually("no mounts left", Duration::from_secs(30), || async {
        mounts_in_pods(None).is_empty().then_some(())
    })
    .await;
    for name in [&zero, &one] {
        assert_eq!(host_names(name), format!("{name}\n{name}\n{name}\n"));
    }
    eprintln!(
        "figures: first start of 2 replicas {first_start:?}, restart to reconstructed teardown {after_restart:?}, whole test {:?}",
        started.elapsed()
    );
}

/// A loop device on a file, detached when dropped.
struct LoopDevice(String);

impl LoopDevice {
    async fn attach(file: &Path) -> Self {
        let out = tokio::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .await
            .expect("losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_raw_block_claim_reaches_the_container_as_a_device() {
    let started = Instant::now();
    let case = Case::with_agent("pvc-block", &[]).await;
    let data = DataDir::new("rk-block");
    let backing = data.0.join("disk.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(16 << 20))
        .expect("backing file");
    let device = LoopDevice::attach(&backing).await;
    let mut objects = Objects::default();
    let host = hostname_label().await;
    let (pv, pvc) = (
        format!("{}-pv", case.pods.label),
        format!("{}-raw", case.pods.label),
    );
    let mut spec = claim_ref(&pvc);
    spec["volumeMode"] = json!("Block");
    objects
        .create(local_pv(&pv, Path::new(&device.0), &host, spec))
        .await;
    objects
        .create(claim(&pvc, &pv, json!({"volumeMode": "Block"})))
        .await;
    wait_bound(&pvc).await;
    let name = case
        .create(
            "raw",
            sleeper(json!({
                "volumes": [{"name": "raw", "persistentVolumeClaim": {"claimName": pvc}}],
                "containers": [{
                    "name": "main", "image": "busybox", "command": ["sleep", "3600"],
                    "volumeDevices": [{"name": "raw", "devicePath": "/dev/xvda"}]
                }]
            })),
        )
        .await;
    let pod = running(&name).await;
    let link = root_dir()
        .join("pods")
        .join(uid(&pod))
        .join("volumeDevices/kubernetes.io~local-volume")
        .join(&pv);
    assert_eq!(
        std::fs::read_link(&link).expect("the device link"),
        Path::new(&device.0)
    );
    let (code, out, err) = sh(
        &uid(&pod),
        "dd if=/dev/urandom of=/tmp/a bs=1048576 count=1 2>/dev/null \
         && dd if=/tmp/a of=/dev/xvda bs=1048576 count=1 conv=fsync 2>/dev/null \
         && dd if=/dev/xvda of=/tmp/b bs=1048576 count=1 2>/dev/null \
         && cmp /tmp/a /tmp/b && md5sum /tmp/a",
    )
    .await;
    assert_eq!(
        code, 0,
        "writing and reading 1 MiB through /dev/xvda: {err}"
    );
    let in_pod = out.split_whitespace().next().expect("md5").to_owned();
    let on_host = host_md5(&device.0).await;
    assert_eq!(in_pod, on_host, "the device holds what the container wrote");
    delete_and_wait(&name).await;
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "the device link is removed"
    );
    assert_eq!(
        host_md5(&device.0).await,
        on_host,
        "the data stays on the device"
    );
    eprintln!("figures: block test {:?}", started.elapsed());
    drop(objects);
}

/// The MD5 of the first MiB of `device`, read on the host.
async fn host_md5(device: &str) -> String {
    let out = tokio::process::Command::new("sh")
        .args(["-c", &format!("head -c 1048576 {device} | md5sum")])
        .output()
        .await
        .expect("md5sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("md5")
        .to_owned()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn pending_claims_foreign_volumes_and_read_only_claims() {
    let started = Instant::now();
    let case = Case::with_agent("pvc-wait", &[]).await;
    let data = DataDir::new("rk-wait");
    let mut objects = Objects::default();
    let label = case.pods.label.clone();
    let mounting = |claim: &str, read_only: bool| {
        sleeper(json!({
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}],
            "containers": [{
                "name": "main", "image": "busybox", "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }]
        }))
    };

    // A claim that never binds (its class does not exist): the kubelet's event.
    let pending = format!("{label}-pending");
    objects
        .create(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": pending, "namespace": "default"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": format!("{label}-none"),
                "resources": {"requests": {"storage": "16Mi"}}
            }
        }))
        .await;
    let waiting = case.create("pending", mounting(&pending, false)).await;

    // A volume bound to its claim whose node affinity names another node.
    let (far_pv, far) = (format!("{label}-far"), format!("{label}-far"));
    objects
        .create(local_pv(
            &far_pv,
            &data.make("far"),
            "elsewhere",
            claim_ref(&far),
        ))
        .await;
    objects.create(claim(&far, &far_pv, json!({}))).await;

    // A hostPath volume mounted read-only through the claim source.
    let (ro_pv, ro) = (format!("{label}-ro"), format!("{label}-ro"));
    let ro_dir = data.make("ro");
    std::fs::write(ro_dir.join("seed"), "seeded\n").expect("seed");
    let mut spec = claim_ref(&ro);
    spec["hostPath"] = json!({"path": ro_dir, "type": "Directory"});
    let mut host_pv = local_pv(&ro_pv, &ro_dir, "", spec);
    let host_spec = host_pv["spec"].as_object_mut().expect("spec");
    host_spec.remove("local");
    host_spec.remove("nodeAffinity");
    objects.create(host_pv).await;
    objects.create(claim(&ro, &ro_pv, json!({}))).await;
    wait_bound(&far).await;
    wait_bound(&ro).await;
    let foreign = case.create("far", mounting(&far, false)).await;
    let read_only = case.create("ro", mounting(&ro, true)).await;

    let prefix = "Unable to attach or mount volumes: unmounted volumes=[data";
    let not_bound = format!("error processing PVC default/{pending}: PVC is not bound");
    let message = eventually(
        "the pending claim's FailedMount",
        Duration::from_secs(30),
        || async {
            event_messages(&waiting, "FailedMount")
                .await
                .into_iter()
                .find(|m| m.starts_with(prefix) && m.ends_with(&not_bound))
        },
    )
    .await;
    assert!(message.contains("unattached volumes=[data"), "{message}");
    let affinity = format!(
        "MountVolume.NodeAffinity check failed for volume \"{far_pv}\" : no matching NodeSelectorTerms"
    );
    eventually(
        "the node affinity's FailedMount",
        Duration::from_secs(30),
        || async {
            event_messages(&foreign, "FailedMount")
                .await
                .contains(&affinity)
                .then_some(())
        },
    )
    .await;
    for name in [&waiting, &foreign] {
        let pod = get(name).await.expect("pod");
        assert_eq!(
            pod.status.and_then(|s| s.phase).as_deref(),
            Some("Pending"),
            "{name} waits"
        );
    }

    let pod = running(&read_only).await;
    let ran = k8s_openapi::jiff::Timestamp::now();
    // A hostPath PV has no volume stats, as the kubelet's (`MetricsNil`): the pod's entry
    // in a summary read after it started lists its other volumes (the service account's),
    // not the claim, and no gauge names the claim.
    let summary_path = format!("/api/v1/nodes/{}/proxy/stats/summary", node_name());
    let pod_uid = uid(&pod);
    let volumes = eventually(
        "a summary read after the read-only pod started",
        Duration::from_secs(30),
        || async {
            let text = kubectl(&["get", "--raw", &summary_path]).await;
            let summary: serde_json::Value = serde_json::from_str(&text).ok()?;
            let entry = summary["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["uid"] == pod_uid.as_str())?;
            let volumes = entry["volume"].as_array()?.clone();
            let read: k8s_openapi::jiff::Timestamp =
                volumes.first()?["time"].as_str()?.parse().ok()?;
            (read > ran).then_some(volumes)
        },
    )
    .await;
    assert!(
        volumes.iter().all(|v| v["name"] != "data"),
        "a hostPath claim with stats: {volumes:?}"
    );
    let metrics_path = format!("/api/v1/nodes/{}/proxy/metrics", node_name());
    let metrics = kubectl(&["get", "--raw", &metrics_path]).await;
    assert!(
        !metrics.contains(&format!("persistentvolumeclaim=\"{ro}\"")),
        "a gauge of the hostPath claim"
    );
    let (code, out, _) = sh(&uid(&pod), "cat /data/seed").await;
    assert_eq!((code, out.as_str()), (0, "seeded\n"));
    let (code, _, err) = sh(&uid(&pod), "touch /data/x").await;
    assert_ne!(code, 0, "a read-only claim is not writable");
    assert!(err.contains("Read-only file system"), "{err}");
    for name in [&waiting, &foreign, &read_only] {
        delete_and_wait(name).await;
    }
    assert_eq!(
        std::fs::read_to_string(ro_dir.join("seed")).expect("kept"),
        "seeded\n"
    );
    eprintln!(
        "figures: pending/affinity/read-only test {:?}",
        started.elapsed()
    );
    drop(objects);
}

/// A tmpfs mounted on a directory for a test (a filesystem of the size asked), lazily
/// unmounted when the test ends.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Self {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(status.success(), "mount tmpfs on {}", dir.display());
        Self(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// `df`'s used bytes and size of the filesystem holding `dir` (statvfs).
fn df(dir: &Path) -> (u64, u64) {
    let st = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    let fragment = st.fragment_size();
    (
        (st.blocks() - st.blocks_free()) * fragment,
        st.blocks() * fragment,
    )
}

/// A claim's figures in `/stats/summary` (with its `pvcRef`) and the
/// `kubelet_volume_stats_*` gauges on `/metrics` (by namespace and claim): its local PV is
/// a 64 MiB filesystem of its own, and after the pod wrote 10 MiB its used bytes are within
/// 5 % of `df`'s, its capacity `df`'s size.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_claims_usage_in_the_summary_and_the_volume_gauges_is_dfs() {
    const MIB: u64 = 1 << 20;
    let case = Case::with_agent("pvc-stats", &[]).await;
    let data = DataDir::new("rk-pvc-stats");
    let dir = data.make("fs");
    let _fs = Tmpfs::mount(&dir, "64m");
    let mut objects = Objects::default();
    let host = hostname_label().await;
    let (pv, claim_name) = (unique("pvc-stats-pv"), unique("pvc-stats"));
    objects
        .create(local_pv(&pv, &dir, &host, claim_ref(&claim_name)))
        .await;
    objects.create(claim(&claim_name, &pv, json!({}))).await;
    wait_bound(&claim_name).await;
    let name = case
        .create(
            "writer",
            sleeper(json!({
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c",
                        "head -c 10485760 /dev/urandom > /data/blob && touch /data/done && exec sleep 3600"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }],
            })),
        )
        .await;
    let uid = uid(&running(&name).await);
    eventually("10 MiB written", Duration::from_secs(60), || async {
        (sh(&uid, "ls /data/done").await.0 == 0).then_some(())
    })
    .await;
    let written = chrono::Utc::now();
    let (used, size) = df(&dir);
    assert!(used >= 10 * MIB && size == 64 * MIB, "df: {used} of {size}");
    let within = |what: &str, got: u64| {
        #[allow(clippy::cast_precision_loss)]
        let (g, w) = (got as f64, used as f64);
        assert!((g - w).abs() <= w * 0.05, "{what}: {got}, df {used}");
    };

    // The summary: the housekeeping's first reading after the writes.
    let summary = format!("/api/v1/nodes/{}/proxy/stats/summary", node_name());
    let volume = eventually(
        "the claim read after the writes",
        Duration::from_secs(30),
        || async {
            let text = kubectl(&["get", "--raw", &summary]).await;
            let summary: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            let pod = summary["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["uid"] == uid.as_str())?
                .clone();
            let volume = pod["volume"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == "data")?
                .clone();
            let read = chrono::DateTime::parse_from_rfc3339(volume["time"].as_str()?).ok()?;
            (read > written).then_some(volume)
        },
    )
    .await;
    assert_eq!(
        volume["pvcRef"],
        json!({"name": claim_name, "namespace": "default"})
    );
    within(
        "usedBytes",
        volume["usedBytes"].as_u64().expect("usedBytes"),
    );
    assert_eq!(volume["capacityBytes"].as_u64(), Some(size), "{volume}");

    // The gauges, from the same readings.
    let metrics = format!("/api/v1/nodes/{}/proxy/metrics", node_name());
    let text = kubectl(&["get", "--raw", &metrics]).await;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("the page parses");
    let gauge = |metric: &str| -> u64 {
        let found: Vec<f64> = scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == metric
                    && s.labels.get("namespace") == Some("default")
                    && s.labels.get("persistentvolumeclaim") == Some(claim_name.as_str())
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) => v,
                ref other => panic!("{metric} is {other:?}"),
            })
            .collect();
        assert_eq!(found.len(), 1, "{metric} of {claim_name}: {found:?}");
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let v = found[0] as u64;
        v
    };
    within(
        "kubelet_volume_stats_used_bytes",
        gauge("kubelet_volume_stats_used_bytes"),
    );
    assert_eq!(gauge("kubelet_volume_stats_capacity_bytes"), size);
    assert!(gauge("kubelet_volume_stats_inodes") >= gauge("kubelet_volume_stats_inodes_used"));
    eprintln!("claim {claim_name}: df {used} of {size}; summary {volume}");
}
