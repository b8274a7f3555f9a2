//! Where the CSI plugin keeps its volumes, as the kubelet 1.20 does, and the
//! `vol_data.json` files that let a teardown (also after an agent restart) find a volume's
//! driver and handle:
//!
//! - published: `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv or volume name>/mount`,
//!   with `vol_data.json` beside `mount`;
//! - staged: `<root>/plugins/kubernetes.io/csi/pv/<pv name>/globalmount`, with
//!   `vol_data.json` beside `globalmount`.
//!
//! Blocking file work: call from a blocking thread.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The plugin's name.
pub const PLUGIN_NAME: &str = "kubernetes.io/csi";
/// The plugin's directory under a pod's `volumes/` (its name, escaped).
pub const POD_VOLUMES_DIR: &str = "kubernetes.io~csi";
/// The volume data file.
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// A volume's lifecycle mode, as `CSIDriver.spec.volumeLifecycleModes` names it.
pub const PERSISTENT: &str = "Persistent";
/// The lifecycle mode of inline volumes.
pub const EPHEMERAL: &str = "Ephemeral";

/// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<spec name>`: the volume's data dir.
#[must_use]
pub fn pod_volume_dir(root_dir: &Path, pod_uid: &str, spec_name: &str) -> PathBuf {
    root_dir
        .join("pods")
        .join(pod_uid)
        .join("volumes")
        .join(POD_VOLUMES_DIR)
        .join(spec_name)
}

/// The publish target in a volume's data dir.
#[must_use]
pub fn target_path(volume_dir: &Path) -> PathBuf {
    volume_dir.join("mount")
}

/// `<root>/plugins/kubernetes.io/csi/pv/<pv>/globalmount`: the staging path of a PV.
#[must_use]
pub fn device_mount_path(root_dir: &Path, pv_name: &str) -> PathBuf {
    root_dir
        .join("plugins")
        .join(PLUGIN_NAME)
        .join("pv")
        .join(pv_name)
        .join("globalmount")
}

fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The handle of an inline volume: `csi-<sha256(pod UID + volume name)>`.
#[must_use]
pub fn ephemeral_volume_handle(pod_uid: &str, volume_name: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{pod_uid}{volume_name}")))
}

/// The VolumeAttachment name of a volume on a node: `csi-<sha256(handle + driver + node)>`.
#[must_use]
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!(
        "csi-{}",
        sha256_hex(&format!("{volume_handle}{driver}{node}"))
    )
}

/// The kubelet's `vol_data.json`: a flat JSON map.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeData {
    /// The volume's name in the pod spec, or the PV's name.
    #[serde(
        rename = "specVolID",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub spec_vol_id: String,
    /// The driver's handle of the volume.
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    /// The driver.
    #[serde(rename = "driverName")]
    pub driver_name: String,
    /// The node.
    #[serde(rename = "nodeName", default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// The VolumeAttachment name (also for drivers that need none).
    #[serde(
        rename = "attachmentID",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub attachment_id: String,
    /// `Persistent` or `Ephemeral`.
    #[serde(
        rename = "volumeLifecycleMode",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub volume_lifecycle_mode: String,
}

/// Writes `dir/vol_data.json`, making `dir` (mode 0750).
///
/// # Errors
/// The OS error.
pub fn save(dir: &Path, data: &VolumeData) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)?;
    let json = serde_json::to_vec(data).map_err(io::Error::other)?;
    crate::atomic_file::write(&dir.join(VOL_DATA_FILE), &json, 0o640).map_err(io::Error::other)
}

/// Reads `dir/vol_data.json`; `None` when it is missing.
///
/// # Errors
/// The OS error, or `InvalidData` for a file that is not the map.
pub fn load(dir: &Path) -> io::Result<Option<VolumeData>> {
    match fs::read(dir.join(VOL_DATA_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes the target dir (not mounted), `vol_data.json` and the data dir, as the
/// kubelet's `removeMountDir`; missing ones are fine.
///
/// # Errors
/// The OS error (a non-empty target dir among them: nothing is removed recursively).
pub fn remove_volume_dir(volume_dir: &Path, target: &Path) -> io::Result<()> {
    for removal in [
        fs::remove_dir(target),
        fs::remove_file(volume_dir.join(VOL_DATA_FILE)),
        fs::remove_dir(volume_dir),
    ] {
        match removal {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_the_kubelets() {
        let root = Path::new("/var/lib/kubelet");
        let dir = pod_volume_dir(root, "uid-1", "data");
        assert_eq!(
            target_path(&dir),
            Path::new("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/data/mount")
        );
        assert_eq!(
            device_mount_path(root, "pv-1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv-1/globalmount")
        );
    }

    #[test]
    fn handles_are_sha256_of_their_parts() {
        // sha256("uid-1data")
        assert_eq!(
            ephemeral_volume_handle("uid-1", "data"),
            format!("csi-{}", sha256_hex("uid-1data"))
        );
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(
            attachment_name("h", "d", "n1"),
            attachment_name("h", "d", "n2")
        );
    }

    #[test]
    fn vol_data_json_has_the_kubelets_keys_and_survives_a_round_trip() {
        let dir = crate::volume::testing::TempDir::new("csi-voldata");
        let data = VolumeData {
            spec_vol_id: "data".into(),
            volume_handle: "csi-1".into(),
            driver_name: "hostpath.csi.k8s.io".into(),
            node_name: "n1".into(),
            attachment_id: "csi-2".into(),
            volume_lifecycle_mode: EPHEMERAL.into(),
        };
        save(&dir.path().join("v"), &data).unwrap();
        let text = fs::read_to_string(dir.path().join("v").join(VOL_DATA_FILE)).unwrap();
        let map: std::collections::BTreeMap<String, String> = serde_json::from_str(&text).unwrap();
        let keys: Vec<&str> = map.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "attachmentID",
                "driverName",
                "nodeName",
                "specVolID",
                "volumeHandle",
                "volumeLifecycleMode"
            ]
        );
        assert_eq!(load(&dir.path().join("v")).unwrap(), Some(data));
        assert_eq!(load(&dir.path().join("none")).unwrap(), None);
        // The staging record has the two keys the kubelet writes there.
        let staged = VolumeData {
            volume_handle: "h".into(),
            driver_name: "d".into(),
            ..VolumeData::default()
        };
        assert_eq!(
            serde_json::to_string(&staged).unwrap(),
            r#"{"volumeHandle":"h","driverName":"d"}"#
        );
    }
}
