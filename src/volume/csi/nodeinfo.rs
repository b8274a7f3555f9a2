//! The node's record of its CSI drivers (the kubelet's `nodeinfomanager`): the CSINode
//! object named after the node (owned by the Node) with each driver's node ID, topology
//! keys and volume limit, the Node's `csi.volume.kubernetes.io/nodeid` annotation (a JSON
//! map driver → node ID) and its topology labels. [`NodeInfoUpdater`] is the API boundary.

use std::collections::{BTreeMap, HashMap};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};

/// The Node annotation with the drivers' node IDs.
pub const ANNOTATION_NODE_ID: &str = "csi.volume.kubernetes.io/nodeid";
/// How often an update that met a newer object is tried again.
const UPDATE_ATTEMPTS: usize = 5;

/// A failed update of the node's driver records.
#[derive(Debug, thiserror::Error)]
pub enum NodeInfoError {
    /// The API refused or failed a request.
    #[error("{what}: {source}")]
    Api {
        /// The request.
        what: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The node's annotation or labels do not allow the update.
    #[error("{0}")]
    Conflict(String),
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> NodeInfoError {
    let what = what.into();
    move |source| NodeInfoError::Api {
        what,
        source: Box::new(source),
    }
}

/// Records drivers on the node.
pub trait NodeInfoUpdater: Send + Sync + 'static {
    /// Records `driver` with its node ID, volume limit (0: none) and topology.
    fn install_driver<'a>(
        &'a self,
        driver: &'a str,
        node_id: &'a str,
        max_volumes: i64,
        topology: HashMap<String, String>,
    ) -> BoxFuture<'a, Result<(), NodeInfoError>>;

    /// Removes `driver`'s records.
    fn uninstall_driver<'a>(&'a self, driver: &'a str) -> BoxFuture<'a, Result<(), NodeInfoError>>;
}

/// The annotation's new value with `driver`'s node ID set (`Some`) or removed (`None`);
/// `None` when no driver is left.
///
/// # Errors
/// [`NodeInfoError::Conflict`] when the current value is not a JSON map.
pub fn node_id_annotation(
    current: Option<&str>,
    driver: &str,
    node_id: Option<&str>,
) -> Result<Option<String>, NodeInfoError> {
    let mut ids: BTreeMap<String, String> = match current.filter(|v| !v.is_empty()) {
        Some(text) => serde_json::from_str(text).map_err(|e| {
            NodeInfoError::Conflict(format!(
                "failed to parse node's {ANNOTATION_NODE_ID:?} annotation value ({text:?}) err={e}"
            ))
        })?,
        None => BTreeMap::new(),
    };
    match node_id {
        Some(id) => ids.insert(driver.to_owned(), id.to_owned()),
        None => ids.remove(driver),
    };
    if ids.is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::to_string(&ids).unwrap_or_default()))
}

/// The topology labels the node lacks; a label with another value is a collision.
///
/// # Errors
/// [`NodeInfoError::Conflict`] with the kubelet's message.
pub fn missing_topology_labels(
    labels: &BTreeMap<String, String>,
    topology: &HashMap<String, String>,
) -> Result<BTreeMap<String, String>, NodeInfoError> {
    let mut missing = BTreeMap::new();
    for (key, value) in topology {
        match labels.get(key) {
            Some(existing) if existing != value => {
                return Err(NodeInfoError::Conflict(format!(
                    "detected topology value collision: driver reported {key:?}:{value:?} but existing label is {key:?}:{existing:?}"
                )));
            }
            Some(_) => {}
            None => {
                missing.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(missing)
}

/// Sets `driver`'s entry in the CSINode spec (topology keys sorted, the volume limit when
/// above 0); whether anything changed.
pub fn install_into(
    spec: &mut CSINodeSpec,
    driver: &str,
    node_id: &str,
    max_volumes: i64,
    topology: &HashMap<String, String>,
) -> bool {
    let mut keys: Vec<String> = topology.keys().cloned().collect();
    keys.sort();
    let entry = CSINodeDriver {
        name: driver.to_owned(),
        node_id: node_id.to_owned(),
        topology_keys: Some(keys),
        allocatable: (max_volumes > 0).then(|| VolumeNodeResources {
            count: i32::try_from(max_volumes).ok(),
        }),
    };
    if spec.drivers.contains(&entry) {
        return false;
    }
    spec.drivers.retain(|d| d.name != driver);
    spec.drivers.push(entry);
    true
}

/// [`NodeInfoUpdater`] on the API server.
pub struct KubeNodeInfo {
    client: kube::Client,
    node_name: String,
}

impl KubeNodeInfo {
    /// The records of node `node_name`.
    #[must_use]
    pub fn new(client: kube::Client, node_name: String) -> Self {
        Self { client, node_name }
    }

    /// Creates the node's CSINode when missing, as the kubelet does at start
    /// (`InitializeCSINodeWithAnnotation`).
    ///
    /// # Errors
    /// The API's.
    pub async fn initialize(&self) -> Result<(), NodeInfoError> {
        self.csi_node().await.map(drop)
    }

    async fn node(&self) -> Result<Node, NodeInfoError> {
        Api::<Node>::all(self.client.clone())
            .get(&self.node_name)
            .await
            .map_err(api_error(format!("getting node {:?}", self.node_name)))
    }

    /// The node's CSINode, created (owned by the Node) when missing.
    async fn csi_node(&self) -> Result<CSINode, NodeInfoError> {
        let api = Api::<CSINode>::all(self.client.clone());
        let what = format!("getting CSINode {:?}", self.node_name);
        if let Some(found) = api
            .get_opt(&self.node_name)
            .await
            .map_err(api_error(what))?
        {
            return Ok(found);
        }
        let node = self.node().await?;
        let fresh = CSINode {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node_name.clone(),
                    uid: node.metadata.uid.unwrap_or_default(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: CSINodeSpec {
                drivers: Vec::new(),
            },
        };
        match api.create(&PostParams::default(), &fresh).await {
            Ok(created) => Ok(created),
            // Made in the meantime.
            Err(kube::Error::Api(s)) if s.code == 409 => api
                .get(&self.node_name)
                .await
                .map_err(api_error(format!("getting CSINode {:?}", self.node_name))),
            Err(e) => Err(api_error(format!("creating CSINode {:?}", self.node_name))(
                e,
            )),
        }
    }

    /// Applies `change` to the CSINode's spec and replaces it when it changed, again on a
    /// conflict.
    async fn update_csi_node(
        &self,
        change: impl Fn(&mut CSINodeSpec) -> bool,
    ) -> Result<(), NodeInfoError> {
        let api = Api::<CSINode>::all(self.client.clone());
        for attempt in 1..=UPDATE_ATTEMPTS {
            let mut csi_node = self.csi_node().await?;
            if !change(&mut csi_node.spec) {
                return Ok(());
            }
            match api
                .replace(&self.node_name, &PostParams::default(), &csi_node)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < UPDATE_ATTEMPTS => {}
                Err(e) => {
                    return Err(api_error(format!("updating CSINode {:?}", self.node_name))(
                        e,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Merge-patches the Node's metadata with `annotation` (`None`: removed) and `labels`.
    async fn patch_node(
        &self,
        annotation: Option<String>,
        labels: BTreeMap<String, String>,
    ) -> Result<(), NodeInfoError> {
        let mut metadata = serde_json::json!({ "annotations": { ANNOTATION_NODE_ID: annotation } });
        if !labels.is_empty() {
            metadata["labels"] = serde_json::json!(labels);
        }
        Api::<Node>::all(self.client.clone())
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "metadata": metadata })),
            )
            .await
            .map(drop)
            .map_err(api_error(format!("patching node {:?}", self.node_name)))
    }
}

fn node_annotation(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_NODE_ID))
        .map(String::as_str)
}

impl NodeInfoUpdater for KubeNodeInfo {
    fn install_driver<'a>(
        &'a self,
        driver: &'a str,
        node_id: &'a str,
        max_volumes: i64,
        topology: HashMap<String, String>,
    ) -> BoxFuture<'a, Result<(), NodeInfoError>> {
        Box::pin(async move {
            let node = self.node().await?;
            let annotation = node_id_annotation(node_annotation(&node), driver, Some(node_id))?;
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let missing = missing_topology_labels(&labels, &topology)?;
            if annotation.as_deref() != node_annotation(&node) || !missing.is_empty() {
                self.patch_node(annotation, missing).await?;
            }
            self.update_csi_node(|spec| install_into(spec, driver, node_id, max_volumes, &topology))
                .await
        })
    }

    fn uninstall_driver<'a>(&'a self, driver: &'a str) -> BoxFuture<'a, Result<(), NodeInfoError>> {
        Box::pin(async move {
            self.update_csi_node(|spec| {
                let before = spec.drivers.len();
                spec.drivers.retain(|d| d.name != driver);
                spec.drivers.len() != before
            })
            .await?;
            let node = self.node().await?;
            let annotation = node_id_annotation(node_annotation(&node), driver, None)?;
            if annotation.as_deref() != node_annotation(&node) {
                self.patch_node(annotation, BTreeMap::new()).await?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_id_annotation_is_a_json_map_of_drivers() {
        let one = node_id_annotation(None, "b.csi", Some("n1")).unwrap();
        assert_eq!(one.as_deref(), Some(r#"{"b.csi":"n1"}"#));
        let two = node_id_annotation(one.as_deref(), "a.csi", Some("n2")).unwrap();
        assert_eq!(two.as_deref(), Some(r#"{"a.csi":"n2","b.csi":"n1"}"#));
        let back = node_id_annotation(two.as_deref(), "a.csi", None).unwrap();
        assert_eq!(back, one);
        assert_eq!(
            node_id_annotation(one.as_deref(), "b.csi", None).unwrap(),
            None
        );
        assert!(matches!(
            node_id_annotation(Some("not json"), "b.csi", Some("n")),
            Err(NodeInfoError::Conflict(_))
        ));
    }

    #[test]
    fn topology_labels_are_added_but_never_overwritten() {
        let labels: BTreeMap<String, String> = [("zone".into(), "a".into())].into();
        let same: HashMap<String, String> = [
            ("zone".into(), "a".into()),
            ("hostpath/node".into(), "n1".into()),
        ]
        .into();
        assert_eq!(
            missing_topology_labels(&labels, &same).unwrap(),
            [("hostpath/node".to_owned(), "n1".to_owned())].into()
        );
        let other: HashMap<String, String> = [("zone".into(), "b".into())].into();
        let e = missing_topology_labels(&labels, &other).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"detected topology value collision: driver reported "zone":"b" but existing label is "zone":"a""#
        );
    }

    #[test]
    fn a_driver_entry_is_replaced_only_when_it_changed() {
        let mut spec = CSINodeSpec::default();
        let topology: HashMap<String, String> =
            [("z".into(), "1".into()), ("a".into(), "2".into())].into();
        assert!(install_into(&mut spec, "d", "n1", 0, &topology));
        assert_eq!(
            spec.drivers[0].topology_keys,
            Some(vec!["a".into(), "z".into()])
        );
        assert_eq!(spec.drivers[0].allocatable, None);
        assert!(!install_into(&mut spec, "d", "n1", 0, &topology));
        assert!(install_into(&mut spec, "d", "n2", 16, &topology));
        assert_eq!(spec.drivers.len(), 1);
        assert_eq!(spec.drivers[0].node_id, "n2");
        assert_eq!(
            spec.drivers[0].allocatable.as_ref().and_then(|a| a.count),
            Some(16)
        );
    }
}
