use super::testing::{Call, FakeDriver, FakeObjects, canonical};
use super::*;
use crate::volume::testing::TempDir;

const DRIVER: &str = "hostpath.csi.k8s.io";

fn csi_driver(spec: serde_json::Value) -> CSIDriver {
    serde_json::from_value(serde_json::json!({"metadata": {"name": DRIVER}, "spec": spec})).unwrap()
}

fn pod(uid: &str, volume: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid},
        "spec": {"serviceAccountName": "sa", "containers": [], "volumes": [volume]},
    }))
    .unwrap()
}

fn inline(uid: &str) -> (Pod, CSIVolumeSource) {
    let volume = serde_json::json!({"name": "data", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1Mi"}}});
    let pod = pod(uid, volume);
    let source = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0]
        .csi
        .clone()
        .unwrap();
    (pod, source)
}

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "mountOptions": ["noatime"],
            "csi": {"driver": DRIVER, "volumeHandle": "vol-1", "fsType": "ext4",
                    "volumeAttributes": {"a": "b"},
                    "nodeStageSecretRef": {"name": "stage", "namespace": "ns"}},
        },
    }))
    .unwrap()
}

struct Setup {
    dir: TempDir,
    driver: FakeDriver,
    plugin: CsiPlugin,
}

/// A plugin (a run of the agent) on `dir`, with `driver` as the driver's node service and
/// mount table.
fn plugin_on(dir: &Path, drivers: Drivers, driver: &FakeDriver, objects: FakeObjects) -> CsiPlugin {
    CsiPlugin::new(
        dir.to_path_buf(),
        "node-1".into(),
        drivers,
        Arc::new(driver.clone()),
        Arc::new(objects),
        Arc::new(driver.mounter.clone()),
    )
}

fn registered() -> Drivers {
    let drivers = Drivers::default();
    drivers.insert_for_test(DRIVER, "/run/csi/hostpath.sock");
    drivers
}

fn setup(test: &str, capabilities: Vec<Capability>, objects: FakeObjects) -> Setup {
    let dir = TempDir::new(test);
    let driver = FakeDriver {
        capabilities,
        ..FakeDriver::default()
    };
    let plugin = plugin_on(dir.path(), registered(), &driver, objects);
    Setup {
        dir,
        driver,
        plugin,
    }
}

fn ephemeral_objects(pod_info: bool) -> FakeObjects {
    let mut objects = FakeObjects::default();
    objects.drivers.insert(
        DRIVER.into(),
        csi_driver(
            serde_json::json!({"volumeLifecycleModes": ["Ephemeral"], "podInfoOnMount": pod_info}),
        ),
    );
    objects
}

fn published(calls: &[Call]) -> Vec<&api::NodePublishVolumeRequest> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Publish(r) => Some(r),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn an_inline_volume_is_published_at_the_kubelets_path_with_its_volume_data() {
    let s = setup(
        "csi-inline",
        vec![Capability::StageUnstageVolume],
        ephemeral_objects(true),
    );
    let (pod, source) = inline("uid-1");
    let target = s
        .plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap();
    let volume_dir = s
        .dir
        .path()
        .join("pods/uid-1/volumes/kubernetes.io~csi/data");
    assert_eq!(target, volume_dir.join("mount"));
    let calls = s.driver.calls();
    // Inline volumes are never staged.
    assert_eq!(calls.len(), 1, "{calls:?}");
    let request = published(&calls)[0];
    assert_eq!(
        request.volume_id,
        paths::ephemeral_volume_handle("uid-1", "data")
    );
    assert_eq!(request.target_path, target.to_string_lossy());
    assert_eq!(request.staging_target_path, "");
    assert!(!request.readonly);
    let context: BTreeMap<_, _> = request.volume_context.clone().into_iter().collect();
    assert_eq!(
        context,
        [
            ("csi.storage.k8s.io/ephemeral", "true"),
            ("csi.storage.k8s.io/pod.name", "p-uid-1"),
            ("csi.storage.k8s.io/pod.namespace", "ns"),
            ("csi.storage.k8s.io/pod.uid", "uid-1"),
            ("csi.storage.k8s.io/serviceAccount.name", "sa"),
            ("size", "1Mi"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    );
    let capability = request.volume_capability.clone().unwrap();
    assert_eq!(
        capability.access_mode.unwrap().mode(),
        Mode::SingleNodeWriter
    );
    let data = paths::load(&volume_dir).unwrap().unwrap();
    assert_eq!(data.driver_name, DRIVER);
    assert_eq!(data.volume_lifecycle_mode, EPHEMERAL);
    assert_eq!(data.spec_vol_id, "data");
    assert_eq!(data.node_name, "node-1");
    assert_eq!(lock(&s.driver.connected)[0], "/run/csi/hostpath.sock");
}

use crate::lock::lock;

#[tokio::test]
async fn a_published_target_is_not_published_again_after_a_restart() {
    let s = setup("csi-again", vec![], ephemeral_objects(false));
    let (pod, source) = inline("uid-2");
    let first = s
        .plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap();
    assert_eq!(published(&s.driver.calls()).len(), 1);
    // A new plugin (a restarted agent) with the same mount table and pod directory.
    let restarted = plugin_on(
        s.dir.path(),
        registered(),
        &s.driver,
        ephemeral_objects(false),
    );
    let again = restarted
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap();
    assert_eq!(first, again);
    assert!(s.driver.calls().is_empty(), "published twice");
    restarted.tear_down_pod("uid-2").await.unwrap();
    let calls = s.driver.calls();
    assert_eq!(
        calls,
        vec![Call::Unpublish(api::NodeUnpublishVolumeRequest {
            volume_id: paths::ephemeral_volume_handle("uid-2", "data"),
            target_path: first.to_string_lossy().into_owned(),
        })]
    );
    assert!(
        !first.parent().unwrap().exists(),
        "the volume dir is removed"
    );
    assert!(s.driver.mounter.mount_points().unwrap().is_empty());
}

#[tokio::test]
async fn inline_volumes_need_a_csidriver_listing_the_ephemeral_mode() {
    let s = setup("csi-modes", vec![], FakeObjects::default());
    let (pod, source) = inline("uid-3");
    let e = s
        .plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"volume mode "Ephemeral" not supported by driver hostpath.csi.k8s.io (no CSIDriver object)"#
    );
    let mut objects = FakeObjects::default();
    objects
        .drivers
        .insert(DRIVER.into(), csi_driver(serde_json::json!({})));
    let s = setup("csi-modes-2", vec![], objects);
    let e = s
        .plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"volume mode "Ephemeral" not supported by driver hostpath.csi.k8s.io (only supports ["Persistent"])"#
    );
    assert!(s.driver.calls().is_empty());
}

#[tokio::test]
async fn without_its_driver_a_volume_is_neither_published_nor_torn_down() {
    let s = setup("csi-nodriver", vec![], ephemeral_objects(false));
    let (pod, mut source) = inline("uid-4");
    let target = s
        .plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap();
    source.driver = "other.csi".into();
    let e = s
        .plugin
        .set_up_inline(&pod, "other", &source, None)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "kubernetes.io/csi: driver name other.csi not found in the list of registered CSI drivers"
    );
    // The driver goes: the teardown fails and leaves the mount and its data alone.
    let gone = plugin_on(
        s.dir.path(),
        Drivers::default(),
        &s.driver,
        FakeObjects::default(),
    );
    s.driver.calls();
    assert!(matches!(
        gone.tear_down_pod("uid-4").await,
        Err(CsiError::DriverNotFound(_))
    ));
    assert!(s.driver.calls().is_empty());
    assert!(target.parent().unwrap().join(paths::VOL_DATA_FILE).exists());
    assert_eq!(
        s.driver.mounter.mount_points().unwrap(),
        vec![canonical(&target)]
    );
}

#[tokio::test]
async fn a_failed_publish_leaves_no_directory() {
    let mut s = setup("csi-failpub", vec![], ephemeral_objects(false));
    s.driver.fail_publish = Some(tonic::Status::internal("disk on fire"));
    let plugin = plugin_on(
        s.dir.path(),
        s.plugin.drivers.clone(),
        &s.driver,
        ephemeral_objects(false),
    );
    let (pod, source) = inline("uid-5");
    let e = plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("NodePublishVolume"), "{e}");
    assert!(e.to_string().contains("disk on fire"), "{e}");
    assert!(
        !s.dir
            .path()
            .join("pods/uid-5/volumes/kubernetes.io~csi/data")
            .exists()
    );
}

#[tokio::test]
async fn a_persistent_volume_is_staged_once_and_unstaged_after_its_last_pod() {
    let mut objects = FakeObjects::default();
    objects.drivers.insert(
        DRIVER.into(),
        csi_driver(serde_json::json!({"attachRequired": false})),
    );
    let secret: Secret =
        serde_json::from_value(serde_json::json!({"data": {"key": "c2VjcmV0"}})).unwrap();
    objects
        .secrets
        .insert(("ns".into(), "stage".into()), secret);
    let s = setup("csi-pv", vec![Capability::StageUnstageVolume], objects);
    let volume = pv("pv-1");
    let pod_a = pod("uid-a", serde_json::json!({"name": "v", "emptyDir": {}}));
    let pod_b = pod("uid-b", serde_json::json!({"name": "v", "emptyDir": {}}));
    let target_a = s
        .plugin
        .set_up_persistent(&pod_a, &volume, true, None)
        .await
        .unwrap();
    assert_eq!(
        target_a,
        s.dir
            .path()
            .join("pods/uid-a/volumes/kubernetes.io~csi/pv-1/mount")
    );
    let calls = s.driver.calls();
    let device = s
        .dir
        .path()
        .join("plugins/kubernetes.io/csi/pv/pv-1/globalmount");
    let Call::Stage(stage) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(stage.staging_target_path, device.to_string_lossy());
    assert_eq!(stage.volume_id, "vol-1");
    assert_eq!(
        stage.secrets,
        [("key".to_owned(), "secret".to_owned())].into()
    );
    let mount = match stage
        .volume_capability
        .clone()
        .unwrap()
        .access_type
        .unwrap()
    {
        AccessType::Mount(m) => m,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (mount.fs_type.as_str(), mount.mount_flags),
        ("ext4", vec!["noatime".to_owned()])
    );
    let Call::Publish(publish) = &calls[1] else {
        panic!("{calls:?}")
    };
    assert_eq!(publish.staging_target_path, device.to_string_lossy());
    assert!(publish.readonly);
    assert_eq!(
        publish
            .volume_capability
            .clone()
            .unwrap()
            .access_mode
            .unwrap()
            .mode(),
        Mode::MultiNodeReaderOnly
    );
    assert_eq!(
        paths::load(device.parent().unwrap())
            .unwrap()
            .unwrap()
            .volume_handle,
        "vol-1"
    );
    // A second pod: published, not staged again.
    s.plugin
        .set_up_persistent(&pod_b, &volume, false, None)
        .await
        .unwrap();
    let calls = s.driver.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(matches!(calls[0], Call::Publish(_)));
    s.plugin.tear_down_pod("uid-a").await.unwrap();
    let calls = s.driver.calls();
    assert_eq!(calls.len(), 1, "still staged for the other pod: {calls:?}");
    s.plugin.tear_down_pod("uid-b").await.unwrap();
    let calls = s.driver.calls();
    assert!(
        matches!(calls.as_slice(), [Call::Unpublish(_), Call::Unstage(u)] if u.staging_target_path == device.to_string_lossy()),
        "{calls:?}"
    );
    assert!(!device.parent().unwrap().exists());
    assert!(s.driver.mounter.mount_points().unwrap().is_empty());
}

#[tokio::test]
async fn drivers_that_need_an_attach_are_refused() {
    let mut objects = FakeObjects::default();
    objects
        .drivers
        .insert(DRIVER.into(), csi_driver(serde_json::json!({})));
    let s = setup("csi-attach", vec![], objects);
    let p = pod("uid-c", serde_json::json!({"name": "v", "emptyDir": {}}));
    let e = s
        .plugin
        .set_up_persistent(&p, &pv("pv-2"), false, None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("requires attaching"), "{e}");
    assert!(s.driver.calls().is_empty());
}

#[tokio::test]
async fn volume_stats_come_from_the_driver_when_it_has_the_capability() {
    let s = setup(
        "csi-stats",
        vec![Capability::GetVolumeStats],
        ephemeral_objects(false),
    );
    let (pod, source) = inline("uid-6");
    let target = s
        .plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap();
    s.driver.calls();
    let stats = s.plugin.volume_stats("uid-6", "data").await.unwrap();
    assert_eq!(
        stats,
        Some(VolumeStats {
            capacity_bytes: 1000,
            available_bytes: 750,
            used_bytes: 250,
            inodes: 100,
            inodes_free: 93,
            inodes_used: 7,
        })
    );
    let calls = s.driver.calls();
    let [Call::Stats(request)] = calls.as_slice() else {
        panic!("{calls:?}")
    };
    assert_eq!(request.volume_path, target.to_string_lossy());
    assert_eq!(request.staging_target_path, "");
    assert_eq!(
        s.plugin.volume_stats("uid-6", "nothing").await.unwrap(),
        None
    );
    let without = setup("csi-nostats", vec![], ephemeral_objects(false));
    without
        .plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap();
    assert_eq!(
        without.plugin.volume_stats("uid-6", "data").await.unwrap(),
        None
    );
}

#[test]
fn fs_group_follows_the_drivers_policy() {
    let publish = |mode: &'static str, fs_type: &str, read_only: bool| Publish {
        spec_name: "v".into(),
        driver: DRIVER.into(),
        handle: "h".into(),
        mode,
        read_only,
        fs_type: fs_type.into(),
        attributes: HashMap::new(),
        publish_secret: None,
        stage_secret: None,
        access_mode: Mode::SingleNodeWriter,
        mount_flags: Vec::new(),
        access_modes: vec!["ReadWriteOnce".into()],
    };
    let file = csi_driver(serde_json::json!({"fsGroupPolicy": "File"}));
    let none = csi_driver(serde_json::json!({"fsGroupPolicy": "None"}));
    assert!(applies_fs_group(
        Some(&file),
        &publish(EPHEMERAL, "", false)
    ));
    assert!(!applies_fs_group(
        Some(&file),
        &publish(EPHEMERAL, "", true)
    ));
    assert!(!applies_fs_group(
        Some(&none),
        &publish(PERSISTENT, "ext4", false)
    ));
    assert!(applies_fs_group(None, &publish(PERSISTENT, "ext4", false)));
    assert!(!applies_fs_group(None, &publish(PERSISTENT, "", false)));
    // Inline volumes are mounted ReadWriteOnce: with an fsType, the default policy
    // applies the fsGroup (kubernetes#108662; the kubelet v1.20 panicked there).
    assert!(applies_fs_group(None, &publish(EPHEMERAL, "ext4", false)));
    assert!(!applies_fs_group(None, &publish(EPHEMERAL, "", false)));
    assert!(!applies_fs_group(None, &publish(EPHEMERAL, "ext4", true)));
}

/// A pod sync sets its volumes up again: a published volume is seen as such before
/// anything is read from the API or written to disk.
#[tokio::test]
async fn a_published_volume_is_set_up_again_without_api_reads_or_writes() {
    let objects = ephemeral_objects(false);
    let reads = objects.driver_reads.clone();
    let s = setup("csi-again", vec![], objects);
    let (pod, source) = inline("uid-1");
    s.plugin
        .set_up_inline(&pod, "data", &source, None)
        .await
        .unwrap();
    let data_file = s
        .dir
        .path()
        .join("pods/uid-1/volumes/kubernetes.io~csi/data/vol_data.json");
    let written = std::fs::metadata(&data_file).unwrap().modified().unwrap();
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
    s.driver.calls();
    for _ in 0..3 {
        s.plugin
            .set_up_inline(&pod, "data", &source, None)
            .await
            .unwrap();
    }
    assert_eq!(
        reads.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "CSIDriver read again"
    );
    assert_eq!(
        std::fs::metadata(&data_file).unwrap().modified().unwrap(),
        written,
        "vol_data.json written again"
    );
    assert!(s.driver.calls().is_empty());
}

/// One pod's tear-down unstages the shared PV (slowly) while another pod sets the same PV
/// up: the set-up waits, then stages again, so the second pod is never left published
/// from an unstaged volume.
#[tokio::test]
async fn a_set_up_waits_for_the_tear_down_of_the_same_volume() {
    let mut objects = FakeObjects::default();
    objects.drivers.insert(
        DRIVER.into(),
        csi_driver(serde_json::json!({"attachRequired": false})),
    );
    objects
        .secrets
        .insert(("ns".into(), "stage".into()), Secret::default());
    let dir = TempDir::new("csi-serial");
    let driver = FakeDriver {
        capabilities: vec![Capability::StageUnstageVolume],
        slow_unstage: std::time::Duration::from_millis(200),
        ..FakeDriver::default()
    };
    let plugin = Arc::new(plugin_on(dir.path(), registered(), &driver, objects));
    let volume = pv("pv-1");
    let claim = serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": "c"}});
    let (pod_a, pod_b) = (pod("uid-a", claim.clone()), pod("uid-b", claim));
    plugin
        .set_up_persistent(&pod_a, &volume, false, None)
        .await
        .unwrap();
    driver.calls();
    let tear_down = tokio::spawn({
        let plugin = plugin.clone();
        async move { plugin.tear_down_pod("uid-a").await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    plugin
        .set_up_persistent(&pod_b, &volume, false, None)
        .await
        .unwrap();
    tear_down.await.unwrap().unwrap();
    let calls: Vec<&str> = driver
        .calls()
        .iter()
        .map(|c| match c {
            Call::Stage(_) => "stage",
            Call::Unstage(_) => "unstage",
            Call::Publish(_) => "publish",
            Call::Unpublish(_) => "unpublish",
            Call::Stats(_) => "stats",
        })
        .collect();
    assert_eq!(calls, ["unpublish", "unstage", "stage", "publish"]);
    let device = paths::device_mount_path(dir.path(), "pv-1");
    assert!(
        driver
            .mounter
            .mount_points()
            .unwrap()
            .contains(&canonical(&device)),
        "the second pod's volume is staged"
    );
}
