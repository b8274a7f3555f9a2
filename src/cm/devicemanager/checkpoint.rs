//! The device manager's checkpoint, `<root-dir>/device-plugins/kubelet_internal_checkpoint`,
//! in the kubelet's form (`devicemanager/checkpoint` under `checkpointmanager`): JSON
//! `{"Data":{"PodDeviceEntries":[...],"RegisteredDevices":{...}},"Checksum":N}` where the
//! checksum is FNV-32a over go-spew's `%#v` rendering of `Data`, so a kubelet and this
//! agent read each other's file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::DeviceError;
use crate::goapi::spew;

/// The checkpoint's file name in the device plugin directory.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

/// Device IDs by NUMA node (the kubelet's `DevicesPerNUMA`).
pub type DevicesPerNuma = BTreeMap<i64, Vec<String>>;

/// One container's devices of one resource, with the plugin's `Allocate` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodDevicesEntry {
    /// The pod.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// The container.
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    /// The extended resource.
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    /// The devices given to the container.
    #[serde(rename = "DeviceIDs")]
    pub device_ids: DevicesPerNuma,
    /// The protobuf `ContainerAllocateResponse` (base64 in the JSON, as Go's `[]byte`).
    #[serde(rename = "AllocResp", with = "base64_bytes")]
    pub alloc_resp: Vec<u8>,
}

/// What the checkpoint holds. `None` lists are Go's nil ones (JSON `null`): the checksum
/// tells them from empty ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointData {
    /// Every container's devices.
    #[serde(rename = "PodDeviceEntries")]
    pub pod_device_entries: Option<Vec<PodDevicesEntry>>,
    /// The healthy devices of each registered resource.
    #[serde(rename = "RegisteredDevices")]
    pub registered_devices: Option<BTreeMap<String, Vec<String>>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: CheckpointData,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// go-spew's `%#v` rendering of the kubelet's `checkpointData` (sorted keys, no methods),
/// the text its checksum hashes.
fn render(data: &CheckpointData) -> String {
    let mut out =
        String::from("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)");
    match &data.pod_device_entries {
        None => out.push_str("<nil>"),
        Some(entries) => {
            out.push('[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(
                    out,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)map[",
                    e.pod_uid, e.container_name, e.resource_name
                );
                for (j, (numa, ids)) in e.device_ids.iter().enumerate() {
                    if j > 0 {
                        out.push(' ');
                    }
                    let _ = write!(out, "{numa}:");
                    spew::list(&mut out, ids);
                }
                out.push_str("] AllocResp:");
                spew::bytes(&mut out, &e.alloc_resp);
                out.push('}');
            }
            out.push(']');
        }
    }
    out.push_str(" RegisteredDevices:(map[string][]string)");
    match &data.registered_devices {
        None => out.push_str("<nil>"),
        Some(registered) => {
            out.push_str("map[");
            for (i, (resource, ids)) in registered.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(resource);
                out.push(':');
                spew::list(&mut out, ids);
            }
            out.push(']');
        }
    }
    out.push('}');
    out
}

/// The kubelet's checkpoint checksum: FNV-32a of the spew rendering.
fn checksum(data: &CheckpointData) -> u64 {
    u64::from(crate::goapi::fnv32a(render(data).as_bytes()))
}

/// The file's bytes for `data`.
///
/// # Errors
/// Serialization fails (it does not for these types).
pub fn encode(data: &CheckpointData) -> Result<Vec<u8>, DeviceError> {
    let file = File {
        data: data.clone(),
        checksum: checksum(data),
    };
    serde_json::to_vec(&file).map_err(|e| DeviceError::Checkpoint(e.to_string()))
}

/// The data in a checkpoint file's bytes.
///
/// # Errors
/// Not the kubelet's JSON, or the checksum does not match (`checkpoint is corrupted`).
pub fn decode(bytes: &[u8]) -> Result<CheckpointData, DeviceError> {
    let file: File =
        serde_json::from_slice(bytes).map_err(|e| DeviceError::Checkpoint(e.to_string()))?;
    if checksum(&file.data) != file.checksum {
        return Err(DeviceError::Checkpoint("checkpoint is corrupted".into()));
    }
    Ok(file.data)
}

/// Writes the checkpoint into `dir`, replacing the file whole.
///
/// # Errors
/// The file cannot be written.
pub async fn write(dir: &Path, data: &CheckpointData) -> Result<(), DeviceError> {
    let bytes = encode(data)?;
    crate::atomic_file::write_async(&dir.join(CHECKPOINT_FILE), bytes, 0o600)
        .await
        .map_err(|e| DeviceError::Checkpoint(e.to_string()))
}

/// Reads the checkpoint in `dir`; `None` when there is none.
///
/// # Errors
/// The file cannot be read or is not a valid checkpoint.
pub fn read(dir: &Path) -> Result<Option<CheckpointData>, DeviceError> {
    match std::fs::read(dir.join(CHECKPOINT_FILE)) {
        Ok(bytes) => decode(&bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DeviceError::Checkpoint(e.to_string())),
    }
}

/// `bytes` as the base64 text the JSON holds (for logs and tests).
#[must_use]
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> PodDevicesEntry {
        PodDevicesEntry {
            pod_uid: "uid-1".into(),
            container_name: "app".into(),
            resource_name: "example.com/dev".into(),
            device_ids: BTreeMap::from([(0, vec!["dev-1".into(), "dev-0".into()])]),
            alloc_resp: vec![10, 3, 1, 2, 255],
        }
    }

    /// The checksums the kubelet's own code (go-spew over `checkpointData`, FNV-32a)
    /// gives for the same data, computed with the vendored go-spew of Kubernetes v1.20.2.
    #[test]
    fn checksums_are_the_kubelets() {
        let empty = CheckpointData {
            pod_device_entries: None,
            registered_devices: Some(BTreeMap::new()),
        };
        assert_eq!(checksum(&empty), 3_467_439_661);
        let full = CheckpointData {
            pod_device_entries: Some(vec![entry()]),
            registered_devices: Some(BTreeMap::from([
                (
                    "example.com/dev".into(),
                    vec!["dev-3".into(), "dev-0".into()],
                ),
                ("a.b/c".into(), vec![]),
            ])),
        };
        assert_eq!(
            render(&full),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)uid-1 ContainerName:(string)app ResourceName:(string)example.com/dev DeviceIDs:(checkpoint.DevicesPerNUMA)map[0:[dev-1 dev-0]] AllocResp:([]uint8)[10 3 1 2 255]}] RegisteredDevices:(map[string][]string)map[a.b/c:[] example.com/dev:[dev-3 dev-0]]}"
        );
        assert_eq!(checksum(&full), 1_596_205_433);
    }

    #[test]
    fn round_trip_in_the_kubelets_json_and_corruption_is_refused() {
        let data = CheckpointData {
            pod_device_entries: Some(vec![entry()]),
            registered_devices: Some(BTreeMap::from([(
                "example.com/dev".into(),
                vec!["dev-0".into()],
            )])),
        };
        let bytes = encode(&data).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["Data"]["PodDeviceEntries"][0]["PodUID"], "uid-1");
        assert_eq!(
            json["Data"]["PodDeviceEntries"][0]["DeviceIDs"]["0"][1],
            "dev-0"
        );
        assert_eq!(
            json["Data"]["PodDeviceEntries"][0]["AllocResp"],
            base64(&[10, 3, 1, 2, 255])
        );
        assert_eq!(decode(&bytes).unwrap(), data);
        let tampered = String::from_utf8(bytes).unwrap().replace("dev-1", "dev-9");
        let err = decode(tampered.as_bytes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device manager checkpoint: checkpoint is corrupted"
        );
    }

    #[tokio::test]
    async fn written_then_read_from_a_directory() {
        let dir = std::env::temp_dir().join(format!("rkubelet-dp-cp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read(&dir).unwrap(), None);
        let data = CheckpointData {
            pod_device_entries: None,
            registered_devices: Some(BTreeMap::new()),
        };
        write(&dir, &data).await.unwrap();
        assert_eq!(read(&dir).unwrap(), Some(data));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
