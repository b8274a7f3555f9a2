//! A pod's `persistentVolumeClaim` volume followed to its PersistentVolume, as the kubelet's
//! desired-state populator does (`createVolumeSpec`, `getPVCExtractPV`, `getPVSpec`): the
//! claim must be Bound and not being deleted, the volume it names must point back at it, and
//! the volume's mode must fit how the containers use it (`volumeMounts` or `volumeDevices`).
//! Then which plugin serves the volume ([`PvSource`]: local, hostPath, CSI, or one this node
//! lacks), and whether the node satisfies the volume's node affinity.
//!
//! The errors carry the kubelet's texts; the volume manager turns them into its events.
//! Knows no mount: it only reads the API (through [`PodObjects`]) and decides.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource,
};

use crate::watch_manager::PodObjects;

/// Why a claim cannot be followed to its volume yet, in the kubelet's words (its
/// `Display` is the populator's error, the tail of the `FailedMount` event).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Reading the claim failed (not found, forbidden, the API away).
    #[error(
        "error processing PVC {namespace}/{claim}: failed to fetch PVC from API server: {reason}"
    )]
    FetchClaim {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
        /// The API's answer.
        reason: String,
    },
    /// The claim is being deleted: pods using it must not start.
    #[error("error processing PVC {namespace}/{claim}: PVC is being deleted")]
    Deleting {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
    },
    /// The claim's phase is not `Bound` (v1.20's text; later kubelets name the phase).
    #[error("error processing PVC {namespace}/{claim}: PVC is not bound")]
    NotBound {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
    },
    /// Bound, but naming no volume.
    #[error("error processing PVC {namespace}/{claim}: PVC has empty pvc.Spec.VolumeName")]
    NoVolumeName {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
    },
    /// Reading the claim's volume failed.
    #[error(
        "error processing PVC {namespace}/{claim}: failed to fetch PV {pv} from API server: {reason}"
    )]
    FetchVolume {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
        /// The volume's name.
        pv: String,
        /// The API's answer.
        reason: String,
    },
    /// The volume does not point back at the claim (yet).
    #[error("error processing PVC {namespace}/{claim}: {reason}")]
    NotBoundToClaim {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
        /// The kubelet's sentence naming the volume and its claimRef.
        reason: String,
    },
    /// The volume's mode does not fit how the containers use it.
    #[error("volume {volume} has volumeMode {mode}, but is specified in {used_as}")]
    ModeMismatch {
        /// The volume's name in the pod spec.
        volume: String,
        /// `Block` or `Filesystem`.
        mode: String,
        /// `volumeMounts` or `volumeDevices`.
        used_as: &'static str,
    },
}

/// How a pod's containers use a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Usage {
    /// In `volumeMounts` (or not at all: it is then mounted anyway).
    Mounts,
    /// In `volumeDevices`.
    Devices,
}

/// A claim followed to its PersistentVolume.
#[derive(Debug, Clone)]
pub(super) struct BoundVolume {
    pub(super) pv: PersistentVolume,
    /// `readOnly` of the pod's claim source (the kubelet's `spec.ReadOnly`).
    pub(super) read_only: bool,
    /// `volumeMode: Block`.
    pub(super) block: bool,
}

impl BoundVolume {
    /// The volume's name (the kubelet's `spec.Name()`, which its events and directories use).
    pub(super) fn name(&self) -> &str {
        self.pv.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The text of an API error: the server's message when it answered, else the client's.
fn api_reason(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// Follows the pod's claim `source` (in `namespace`) to its PersistentVolume.
///
/// # Errors
/// [`ClaimError`] with the kubelet's text; the pod waits and the set-up is retried.
pub(super) async fn resolve(
    api: &impl PodObjects,
    namespace: &str,
    volume: &str,
    source: &PersistentVolumeClaimVolumeSource,
    usage: Usage,
) -> Result<BoundVolume, ClaimError> {
    let claim_name = source.claim_name.as_str();
    let claim = api
        .get_persistent_volume_claim(namespace, claim_name)
        .await
        .map_err(|e| ClaimError::FetchClaim {
            namespace: namespace.to_owned(),
            claim: claim_name.to_owned(),
            reason: api_reason(&e),
        })?;
    let pv_name = bound_volume_name(&claim, namespace, claim_name)?;
    let pv = api
        .get_persistent_volume(&pv_name)
        .await
        .map_err(|e| ClaimError::FetchVolume {
            namespace: namespace.to_owned(),
            claim: claim_name.to_owned(),
            pv: pv_name.clone(),
            reason: api_reason(&e),
        })?;
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
    check_claim_ref(&pv, &pv_name, &claim_uid).map_err(|reason| ClaimError::NotBoundToClaim {
        namespace: namespace.to_owned(),
        claim: claim_name.to_owned(),
        reason,
    })?;
    let block = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let mismatch = |mode: &str, used_as| ClaimError::ModeMismatch {
        volume: volume.to_owned(),
        mode: mode.to_owned(),
        used_as,
    };
    match (usage, block) {
        (Usage::Mounts, true) => return Err(mismatch("Block", "volumeMounts")),
        (Usage::Devices, false) => return Err(mismatch("Filesystem", "volumeDevices")),
        _ => {}
    }
    Ok(BoundVolume {
        pv,
        read_only: source.read_only.unwrap_or(false),
        block,
    })
}

/// The name of the volume a claim is bound to (the kubelet's `getPVCExtractPV`).
fn bound_volume_name(
    claim: &PersistentVolumeClaim,
    namespace: &str,
    claim_name: &str,
) -> Result<String, ClaimError> {
    let (namespace, claim_name) = (namespace.to_owned(), claim_name.to_owned());
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(ClaimError::Deleting {
            namespace,
            claim: claim_name,
        });
    }
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(ClaimError::NotBound {
            namespace,
            claim: claim_name,
        });
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty())
        .ok_or(ClaimError::NoVolumeName {
            namespace,
            claim: claim_name,
        })
}

/// The volume's `claimRef` must name the claim by UID (the kubelet's `getPVSpec`).
fn check_claim_ref(pv: &PersistentVolume, pv_name: &str, claim_uid: &str) -> Result<(), String> {
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(format!(
            "found PV object {pv_name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    let uid = claim_ref.uid.as_deref().unwrap_or_default();
    if uid == claim_uid {
        Ok(())
    } else {
        Err(format!(
            "found PV object {pv_name} but its pv.Spec.ClaimRef.UID {uid} does not point to claim.UID {claim_uid}"
        ))
    }
}

/// Which plugin serves a PersistentVolume: the dispatch point of PV mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PvSource {
    /// `local`: a directory (bind-mounted into the pod) or a block device (mapped).
    Local {
        /// The path on the node.
        path: String,
    },
    /// `hostPath`: the host path itself, as for a pod's own hostPath volume.
    HostPath {
        /// The path on the node.
        path: String,
        /// The hostPath `type`.
        type_: Option<String>,
    },
    /// `csi`: the CSI node plugin of its driver.
    Csi {
        /// The driver's name.
        driver: String,
    },
    /// A source no plugin of this node serves; the API's name of it.
    Other(String),
}

impl PvSource {
    /// The plugin's name in the kubelet's metrics.
    pub(super) fn metrics_name(&self) -> &'static str {
        match self {
            Self::Local { .. } => "kubernetes.io/local-volume",
            Self::HostPath { .. } => "kubernetes.io/host-path",
            Self::Csi { .. } => "kubernetes.io/csi",
            Self::Other(_) => "N/A",
        }
    }
}

impl PvSource {
    pub(super) fn of(pv: &PersistentVolume) -> Self {
        let spec = pv.spec.clone().unwrap_or_default();
        if let Some(local) = spec.local {
            Self::Local { path: local.path }
        } else if let Some(host_path) = spec.host_path {
            Self::HostPath {
                path: host_path.path,
                type_: host_path.type_,
            }
        } else if let Some(csi) = spec.csi {
            Self::Csi { driver: csi.driver }
        } else {
            Self::Other(source_kind(&spec))
        }
    }

    /// The kubelet's plugin name (`kubernetes.io/local-volume`, ...).
    fn plugin_name(&self) -> &str {
        match self {
            Self::Local { .. } => "kubernetes.io/local-volume",
            Self::HostPath { .. } => "kubernetes.io/host-path",
            Self::Csi { .. } => "kubernetes.io/csi",
            Self::Other(kind) => kind,
        }
    }
}

/// The API's name of a PV spec's source: its first key that is not a common field.
fn source_kind(spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec) -> String {
    const COMMON: &[&str] = &[
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeAttributesClassName",
        "volumeMode",
    ];
    serde_json::to_value(spec)
        .ok()
        .and_then(|v| {
            v.as_object()?
                .keys()
                .find(|k| !COMMON.contains(&k.as_str()))
                .cloned()
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The kubelet's unique volume name (`GetUniqueVolumeName...`) of a local or hostPath PV:
/// `<plugin>/<pv name>` for the device-mountable local plugin, `<plugin>/<pod uid>-<pv name>`
/// for hostPath. Node status `volumesInUse` would carry it, but the kubelet reports only
/// attachable volumes there, and neither plugin attaches: the agent logs it. (CSI names its
/// volumes `kubernetes.io/csi/<driver>^<handle>`, with its own mounter.)
pub(super) fn unique_volume_name(source: &PvSource, pv_name: &str, pod_uid: &str) -> String {
    match source {
        PvSource::Local { .. } => format!("{}/{pv_name}", source.plugin_name()),
        _ => format!("{}/{pod_uid}-{pv_name}", source.plugin_name()),
    }
}

/// Whether the node (its `labels`) satisfies the volume's required node affinity (the
/// kubelet's `CheckNodeAffinity`): `Err` with the kubelet's reason when not.
pub(super) fn check_node_affinity(
    pv: &PersistentVolume,
    labels: &BTreeMap<String, String>,
) -> Result<(), &'static str> {
    let required = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref());
    let Some(required) = required else {
        return Ok(());
    };
    let node = Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            labels: Some(labels.clone()),
            ..Default::default()
        },
        ..Node::default()
    };
    if crate::lifecycle::admission::terms_match(&required.node_selector_terms, &node) {
        Ok(())
    } else {
        Err("no matching NodeSelectorTerms")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::watch_manager::testing::FakeApi;

    fn claim(phase: &str, volume_name: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "db", "uid": "claim-uid"},
            "spec": {"volumeName": volume_name},
            "status": {"phase": phase}
        }))
        .expect("claim")
    }

    fn pv(claim_uid: Option<&str>, mode: &str) -> PersistentVolume {
        let mut pv = json!({
            "metadata": {"name": "pv-1"},
            "spec": {
                "local": {"path": "/mnt/disks/1"},
                "volumeMode": mode,
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}
                ]}]}}
            }
        });
        if let Some(uid) = claim_uid {
            pv["spec"]["claimRef"] = json!({"name": "data", "namespace": "db", "uid": uid});
        }
        serde_json::from_value(pv).expect("pv")
    }

    fn source(read_only: Option<bool>) -> PersistentVolumeClaimVolumeSource {
        PersistentVolumeClaimVolumeSource {
            claim_name: "data".into(),
            read_only,
        }
    }

    async fn resolved(api: &FakeApi, usage: Usage) -> Result<BoundVolume, ClaimError> {
        resolve(api, "db", "vol", &source(Some(true)), usage).await
    }

    #[tokio::test]
    async fn a_claim_is_followed_only_once_bound_both_ways() {
        let missing = resolved(&FakeApi::default(), Usage::Mounts).await;
        assert_eq!(
            missing.expect_err("no claim").to_string(),
            r#"error processing PVC db/data: failed to fetch PVC from API server: persistentvolumeclaims "data" not found"#
        );
        let pending = FakeApi::default().with_claim(claim("Pending", ""));
        assert_eq!(
            resolved(&pending, Usage::Mounts)
                .await
                .expect_err("pending")
                .to_string(),
            "error processing PVC db/data: PVC is not bound"
        );
        let mut deleting = claim("Bound", "pv-1");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let api = FakeApi::default().with_claim(deleting);
        assert!(matches!(
            resolved(&api, Usage::Mounts).await,
            Err(ClaimError::Deleting { .. })
        ));
        let api = FakeApi::default().with_claim(claim("Bound", ""));
        assert!(matches!(
            resolved(&api, Usage::Mounts).await,
            Err(ClaimError::NoVolumeName { .. })
        ));
        let api = FakeApi::default().with_claim(claim("Bound", "pv-1"));
        assert!(matches!(
            resolved(&api, Usage::Mounts).await,
            Err(ClaimError::FetchVolume { .. })
        ));
        let api = api.with_persistent_volume(pv(None, "Filesystem"));
        assert_eq!(
            resolved(&api, Usage::Mounts)
                .await
                .expect_err("no claimRef")
                .to_string(),
            "error processing PVC db/data: found PV object pv-1 but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        );
        let api = api.with_persistent_volume(pv(Some("other"), "Filesystem"));
        assert_eq!(
            resolved(&api, Usage::Mounts)
                .await
                .expect_err("other claim")
                .to_string(),
            "error processing PVC db/data: found PV object pv-1 but its pv.Spec.ClaimRef.UID other does not point to claim.UID claim-uid"
        );
        let api = api.with_persistent_volume(pv(Some("claim-uid"), "Filesystem"));
        let bound = resolved(&api, Usage::Mounts).await.expect("bound");
        assert_eq!(bound.name(), "pv-1");
        assert!(
            bound.read_only,
            "readOnly comes from the pod's claim source"
        );
        assert!(!bound.block);
        let writable = resolve(&api, "db", "vol", &source(None), Usage::Mounts)
            .await
            .expect("bound");
        assert!(!writable.read_only);
    }

    #[tokio::test]
    async fn the_volume_mode_must_fit_how_containers_use_the_volume() {
        let api = FakeApi::default()
            .with_claim(claim("Bound", "pv-1"))
            .with_persistent_volume(pv(Some("claim-uid"), "Filesystem"));
        assert_eq!(
            resolved(&api, Usage::Devices)
                .await
                .expect_err("devices")
                .to_string(),
            "volume vol has volumeMode Filesystem, but is specified in volumeDevices"
        );
        let api = api.with_persistent_volume(pv(Some("claim-uid"), "Block"));
        assert_eq!(
            resolved(&api, Usage::Mounts)
                .await
                .expect_err("mounts")
                .to_string(),
            "volume vol has volumeMode Block, but is specified in volumeMounts"
        );
        assert!(resolved(&api, Usage::Devices).await.expect("block").block);
    }

    #[test]
    fn node_affinity_is_matched_against_the_node_labels() {
        let volume = pv(Some("u"), "Filesystem");
        let labels = |host: &str| BTreeMap::from([("kubernetes.io/hostname".into(), host.into())]);
        assert_eq!(check_node_affinity(&volume, &labels("node-a")), Ok(()));
        assert_eq!(
            check_node_affinity(&volume, &labels("node-b")),
            Err("no matching NodeSelectorTerms")
        );
        let mut anywhere = volume.clone();
        anywhere.spec.as_mut().expect("spec").node_affinity = None;
        assert_eq!(check_node_affinity(&anywhere, &BTreeMap::new()), Ok(()));
    }

    #[test]
    fn sources_and_unique_names_are_the_kubelets() {
        let local = PvSource::of(&pv(None, "Filesystem"));
        assert_eq!(
            local,
            PvSource::Local {
                path: "/mnt/disks/1".into()
            }
        );
        assert_eq!(
            unique_volume_name(&local, "pv-1", "uid-1"),
            "kubernetes.io/local-volume/pv-1"
        );
        let host: PersistentVolume = serde_json::from_value(
            json!({"metadata": {"name": "h"}, "spec": {"hostPath": {"path": "/srv"}, "capacity": {"storage": "1Gi"}}}),
        )
        .expect("pv");
        let host = PvSource::of(&host);
        assert_eq!(
            unique_volume_name(&host, "h", "uid-1"),
            "kubernetes.io/host-path/uid-1-h"
        );
        let csi: PersistentVolume = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "v"}}}),
        )
        .expect("pv");
        assert_eq!(
            PvSource::of(&csi),
            PvSource::Csi {
                driver: "hostpath.csi.k8s.io".into()
            }
        );
        let nfs: PersistentVolume = serde_json::from_value(
            json!({"metadata": {"name": "n"}, "spec": {"accessModes": ["ReadWriteMany"], "nfs": {"server": "s", "path": "/"}}}),
        )
        .expect("pv");
        assert_eq!(PvSource::of(&nfs), PvSource::Other("nfs".into()));
    }
}
