use std::collections::HashMap;
use std::sync::Mutex;

use super::*;
use crate::volume::csi::nodeinfo::NodeInfoError;
use crate::volume::csi::testing::FakeDriver;

fn versions(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_highest_one_x_version_is_chosen() {
    assert_eq!(
        highest_supported_version(&versions(&["1.0.0", "v1.2.0", "0.3.0"]))
            .unwrap()
            .to_string(),
        "1.2.0"
    );
    assert_eq!(
        highest_supported_version(&versions(&["2.0.0", "1.1"]))
            .unwrap()
            .to_string(),
        "1.1"
    );
    assert_eq!(
        highest_supported_version(&versions(&["0.3.0"])).unwrap_err(),
        "highest supported version reported by driver is 0.3.0, must be v1.x"
    );
    assert!(highest_supported_version(&versions(&["abc"])).unwrap_err().starts_with(
        "could not find a highest supported version from versions ([abc]) reported by this driver"
    ));
}

#[derive(Default)]
struct FakeNodeInfo {
    calls: Mutex<Vec<String>>,
}

impl NodeInfoUpdater for FakeNodeInfo {
    fn install_driver<'a>(
        &'a self,
        driver: &'a str,
        node_id: &'a str,
        max_volumes: i64,
        topology: HashMap<String, String>,
    ) -> BoxFuture<'a, Result<(), NodeInfoError>> {
        let topology: BTreeMap<_, _> = topology.into_iter().collect();
        lock::lock(&self.calls).push(format!(
            "install {driver} {node_id} {max_volumes} {topology:?}"
        ));
        Box::pin(async { Ok(()) })
    }

    fn uninstall_driver<'a>(&'a self, driver: &'a str) -> BoxFuture<'a, Result<(), NodeInfoError>> {
        lock::lock(&self.calls).push(format!("uninstall {driver}"));
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_driver_is_asked_for_its_node_info_and_recorded_then_forgotten() {
    let drivers = Drivers::default();
    let driver = FakeDriver::default();
    let node_info = Arc::new(FakeNodeInfo::default());
    let handler =
        RegistrationHandler::new(drivers.clone(), Arc::new(driver.clone()), node_info.clone());
    let v = versions(&["1.2.0"]);
    handler.validate_plugin("d.csi", "/run/d.sock", &v).unwrap();
    handler
        .register_plugin("d.csi", "/run/d.sock", &v)
        .await
        .unwrap();
    assert_eq!(drivers.names(), vec!["d.csi".to_owned()]);
    assert_eq!(drivers.get("d.csi").unwrap().endpoint, "/run/d.sock");
    assert_eq!(
        lock::lock(&driver.connected).clone(),
        vec!["/run/d.sock".to_owned()]
    );
    assert_eq!(
        lock::lock(&node_info.calls).clone(),
        vec![r#"install d.csi node-1 0 {"topology.hostpath.csi/node": "node-1"}"#.to_owned()]
    );
    // The same driver again, not newer: refused, as by the kubelet.
    let e = handler
        .validate_plugin("d.csi", "/run/d.sock", &v)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"validation failed for CSI Driver d.csi at endpoint /run/d.sock: kubernetes.io/csi: ValidatePlugin for CSI driver "d.csi" failed. Another driver with the same name is already registered with a higher supported version: "1.2.0""#
    );
    handler.deregister_plugin("d.csi").await;
    assert!(drivers.names().is_empty());
    assert_eq!(
        lock::lock(&node_info.calls).last().unwrap(),
        "uninstall d.csi"
    );
}

#[test]
fn plugins_without_versions_are_refused() {
    let handler = RegistrationHandler::new(
        Drivers::default(),
        Arc::new(FakeDriver::default()),
        Arc::new(FakeNodeInfo::default()),
    );
    let e = handler
        .validate_plugin("d.csi", "/run/d.sock", &[])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"validation failed for CSI Driver d.csi at endpoint /run/d.sock: kubernetes.io/csi: ValidatePlugin for CSI driver "d.csi" failed. Plugin returned an empty list for supported versions"#
    );
}
