//! The file source of static pods (the kubelet's `config/file.go`): pod manifests (YAML or
//! JSON) in `--pod-manifest-path`, a directory (its files not starting with a dot, not
//! recursing) or one file, read at start, at each change inotify reports and every
//! `--file-check-frequency`. Each manifest is defaulted as the kubelet does: the name gets
//! `-<node name>`, the namespace defaults to `default`, `spec.nodeName` is this node, the
//! UID is a hash of the node, the file's path and its content (so a changed file is a new
//! pod, and the same file after a restart is the same pod), the annotations
//! `kubernetes.io/config.hash`, `config.source=file` and `config.seen` are set, and a
//! toleration of every `NoExecute` taint is added. A file that cannot be parsed or is not a
//! valid pod is logged and skipped. Static pods are admitted and run by the same pod workers
//! as the API's; a pod whose file is gone or changed is terminated.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use md5::Digest as _;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;

use super::store::{PodAdmission, StaticPods};
use super::workers::{PodSyncer, PodWork, PodWorkers};
use crate::kubetypes::{CONFIG_HASH, CONFIG_SEEN, FILE_SOURCE, stamp_source};

/// The largest manifest read (the kubelet's `maxConfigLength`).
const MAX_MANIFEST_BYTES: u64 = 10 << 20;
/// After a change is reported, further changes (an editor's several writes) are waited
/// for this long before the files are read.
const SETTLE: Duration = Duration::from_millis(100);

/// Where static pods come from.
#[derive(Debug, Clone)]
pub struct FileConfig {
    /// `--pod-manifest-path`: a directory or one file.
    pub path: PathBuf,
    /// `--file-check-frequency`.
    pub check_frequency: Duration,
    /// The node's name.
    pub node_name: String,
}

/// Why a manifest gives no pod.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file or directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is larger than the kubelet reads.
    #[error("{path}: larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is no pod manifest.
    #[error("{path}: couldn't parse as pod({reason}), please check config file")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The pod it describes is not valid.
    #[error("invalid pod: {reason}")]
    Invalid {
        /// Why.
        reason: String,
    },
    /// The path is neither a directory nor a file.
    #[error("path {path} is not a directory or file")]
    NotDirOrFile {
        /// The path.
        path: PathBuf,
    },
}

/// The pod of one manifest, defaulted and validated (the kubelet's `tryDecodeSinglePod`).
///
/// # Errors
/// [`FileError::Parse`] when it is no `v1` Pod in YAML or JSON, [`FileError::Invalid`] when
/// the pod is not valid.
pub fn decode(data: &[u8], path: &Path, node_name: &str) -> Result<Pod, FileError> {
    let parse_error = |reason: String| FileError::Parse {
        path: path.to_owned(),
        reason,
    };
    // JSON is YAML.
    let value: serde_json::Value =
        serde_yaml_ng::from_slice(data).map_err(|e| parse_error(e.to_string()))?;
    let kind = value.get("kind").and_then(serde_json::Value::as_str);
    let version = value.get("apiVersion").and_then(serde_json::Value::as_str);
    if kind != Some("Pod") || version != Some("v1") {
        return Err(parse_error(format!(
            "not a v1 Pod: apiVersion {version:?}, kind {kind:?}"
        )));
    }
    let mut pod: Pod = serde_json::from_value(value).map_err(|e| parse_error(e.to_string()))?;
    super::defaults::set_defaults(&mut pod);
    apply_defaults(&mut pod, path, node_name);
    super::defaults::round_resource_lists(&mut pod);
    validate(&pod).map_err(|reason| FileError::Invalid { reason })?;
    Ok(pod)
}

/// The UID the kubelet gives a static pod: MD5 of go-spew's `%#v` of the manifest's pod,
/// decoded, defaulted and converted to the internal `core.Pod`. (The kubelet's
/// `applyDefaults` writes the node's name and the file's path into the hasher first, but
/// `DeepHashObject` resets it: the same manifest is the same UID on every node and path.)
/// Both agents then run a static pod under the same UID, and a swap of the two keeps it.
/// A manifest whose Go form is not modelled (a set time, managed fields) gets a UID of
/// this agent's own over the same three.
fn static_uid(pod: &Pod, path: &Path, node_name: &str) -> String {
    let uid = serde_json::to_value(pod)
        .map_err(|e| crate::goapi::GoApiError::Unsupported(e.to_string()))
        .and_then(|mut v| {
            internal_form(&mut v);
            crate::goapi::spew::render(&v, "*core.Pod")
        })
        .map(|text| hex(md5::Md5::digest(text.as_bytes()).as_slice()));
    uid.unwrap_or_else(|e| {
        tracing::warn!(path = %path.display(), error = %e, "static pod UID not the kubelet's");
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(format!("host:{node_name}").as_bytes());
        ctx.update(format!("file:{}", path.display()).as_bytes());
        ctx.update(&serde_json::to_vec(pod).unwrap_or_default());
        hex(&ctx.finish().as_ref()[..16])
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `Convert_v1_Pod_To_core_Pod` changes beyond renaming: the host namespace flags
/// move into the pod's security context, `serviceAccount` stands in for an empty
/// `serviceAccountName`, the old init container annotations are dropped, a status `podIP`
/// is the first of `podIPs`; and a decoded internal object has no `kind` or `apiVersion`.
fn internal_form(pod: &mut serde_json::Value) {
    use serde_json::Value;
    let Some(object) = pod.as_object_mut() else {
        return;
    };
    object.remove("kind");
    object.remove("apiVersion");
    if let Some(Value::Object(annotations)) = object
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
    {
        for old in [
            "pod.beta.kubernetes.io/init-containers",
            "pod.alpha.kubernetes.io/init-containers",
            "pod.beta.kubernetes.io/init-container-statuses",
            "pod.alpha.kubernetes.io/init-container-statuses",
        ] {
            annotations.remove(old);
        }
    }
    let empty = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().is_empty();
    if let Some(Value::Object(status)) = object.get_mut("status")
        && !empty(status.get("podIP"))
    {
        let ip = status["podIP"].clone();
        let first = status
            .get("podIPs")
            .and_then(|ips| ips.get(0))
            .and_then(|first| first.get("ip"));
        if first != Some(&ip) {
            status.insert("podIPs".into(), serde_json::json!([{ "ip": ip }]));
        }
    }
    let Some(Value::Object(spec)) = object.get_mut("spec") else {
        return;
    };
    if empty(spec.get("serviceAccountName")) && !empty(spec.get("serviceAccount")) {
        let alias = spec["serviceAccount"].clone();
        spec.insert("serviceAccountName".into(), alias);
    }
    let moved: Vec<(String, Value)> =
        ["hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"]
            .iter()
            .filter_map(|k| Some(((*k).to_owned(), spec.get(*k)?.clone())))
            .collect();
    let security = spec
        .entry("securityContext")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Value::Object(security) = security {
        security.extend(moved);
    }
}

/// The kubelet's `applyDefaults` for a pod from a file.
fn apply_defaults(pod: &mut Pod, path: &Path, node_name: &str) {
    let uid = match &pod.metadata.uid {
        Some(uid) if !uid.is_empty() => uid.clone(),
        _ => static_uid(pod, path, node_name),
    };
    let meta = &mut pod.metadata;
    meta.uid = Some(uid.clone());
    meta.name = Some(format!(
        "{}-{}",
        meta.name.as_deref().unwrap_or_default(),
        node_name.to_lowercase()
    ));
    let namespace = meta
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    meta.self_link = Some(format!(
        "/api/v1/namespaces/{namespace}/pods/{}",
        meta.name.as_deref().unwrap_or_default()
    ));
    meta.namespace = Some(namespace);
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH.into(), uid);
    annotations.insert(CONFIG_SEEN.into(), Timestamp::now().to_string());
    stamp_source(pod, FILE_SOURCE);
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_owned());
    // Static pods are not evicted for node problems.
    let tolerate = Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Default::default()
    };
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations.contains(&tolerate) {
        tolerations.push(tolerate);
    }
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        ..Default::default()
    });
}

/// A DNS-1123 label: lower-case alphanumerics and `-`, alphanumeric at both ends.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 subdomain: labels joined by dots, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// What of the API's pod validation a static pod can fail on its own: its name and
/// namespace, and its containers (at least one, named, unique, with an image).
fn validate(pod: &Pod) -> Result<(), String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if !is_dns_subdomain(name) {
        return Err(format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ));
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if !is_dns_label(namespace) {
        return Err(format!(
            "metadata.namespace: Invalid value: {namespace:?}: a lowercase RFC 1123 label"
        ));
    }
    let spec = pod.spec.as_ref().ok_or("spec: Required value")?;
    if spec.containers.is_empty() {
        return Err("spec.containers: Required value".into());
    }
    let mut seen = HashSet::new();
    for (field, c) in spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("initContainers", c))
        .chain(spec.containers.iter().map(|c| ("containers", c)))
    {
        if !is_dns_label(&c.name) {
            return Err(format!(
                "spec.{field}.name: Invalid value: {:?}: a lowercase RFC 1123 label",
                c.name
            ));
        }
        if !seen.insert(c.name.as_str()) {
            return Err(format!("spec.{field}.name: Duplicate value: {:?}", c.name));
        }
        if c.image.as_deref().is_none_or(str::is_empty) {
            return Err(format!("spec.{field}.image: Required value"));
        }
    }
    Ok(())
}

fn read_error(path: &Path, source: std::io::Error) -> FileError {
    FileError::Read {
        path: path.to_owned(),
        source,
    }
}

/// The pod of one manifest file (the kubelet's `extractFromFile`).
fn read_file(path: &Path, node_name: &str) -> Result<Pod, FileError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| read_error(path, e))?;
    let mut data = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| read_error(path, e))?;
    if data.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(FileError::TooLarge {
            path: path.to_owned(),
        });
    }
    decode(&data, path, node_name)
}

/// The pods of the manifest path (the kubelet's `listConfig`), blocking. A missing path
/// has no pods; in a directory, a file that gives no pod is logged and skipped; a single
/// file that gives no pod is an error (the pods stay as they were).
///
/// # Errors
/// The path cannot be read, or (a single file) gives no pod.
pub fn list(path: &Path, node_name: &str) -> Result<Vec<Pod>, FileError> {
    let meta = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::error!(path = %path.display(), "Unable to read config path: path does not exist, ignoring");
            return Ok(Vec::new());
        }
        other => other.map_err(|e| read_error(path, e))?,
    };
    if meta.is_file() {
        return read_file(path, node_name).map(|p| vec![p]);
    }
    if !meta.is_dir() {
        return Err(FileError::NotDirOrFile {
            path: path.to_owned(),
        });
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| read_error(path, e))?
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    entries.sort();
    let mut pods = Vec::new();
    for entry in entries {
        match std::fs::metadata(&entry) {
            Err(e) => tracing::error!(path = %entry.display(), error = %e, "Can't get metadata"),
            Ok(m) if m.is_dir() => {
                tracing::error!(path = %entry.display(), "Not recursing into manifest path");
            }
            Ok(m) if m.is_file() => match read_file(&entry, node_name) {
                Ok(pod) => pods.push(pod),
                Err(FileError::Read { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::error!(path = %entry.display(), error = %e, "Can't process manifest file");
                }
            },
            Ok(_) => {
                tracing::error!(path = %entry.display(), "Manifest path is not a directory or file");
            }
        }
    }
    Ok(pods)
}

/// Reads the manifests off the runtime; `None` when they cannot be read (logged).
async fn list_async(config: &FileConfig) -> Option<Vec<Pod>> {
    let (path, node) = (config.path.clone(), config.node_name.clone());
    match tokio::task::spawn_blocking(move || list(&path, &node)).await {
        Ok(Ok(pods)) => Some(pods),
        Ok(Err(e)) => {
            tracing::error!(path = %config.path.display(), error = %e, "Unable to read config path");
            None
        }
        Err(e) => {
            tracing::error!(error = %e, "reading the pod manifests panicked");
            None
        }
    }
}

/// The inotify descriptor, for [`AsyncFd`].
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Reports changes in the manifest directory (or, for one file, of that file in its
/// directory, so that a file replaced by a rename is seen).
struct Watcher {
    fd: AsyncFd<InotifyFd>,
    /// The one file of interest in the watched directory.
    only: Option<std::ffi::OsString>,
}

impl Watcher {
    fn new(path: &Path) -> std::io::Result<Self> {
        let (dir, only) = if path.is_dir() {
            (path.to_owned(), None)
        } else {
            let dir = path.parent().unwrap_or(Path::new("/")).to_owned();
            (dir, path.file_name().map(ToOwned::to_owned))
        };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(
            &dir,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_ATTRIB
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        )?;
        // SAFETY: the `Inotify` owns its descriptor, is moved into the `AsyncFd` and stays
        // there until it is dropped, and `as_raw_fd` always returns that descriptor.
        #[allow(unsafe_code)]
        let fd = unsafe { AsyncFd::register(InotifyFd(inotify))? };
        Ok(Self { fd, only })
    }

    /// Returns at the next change of interest; an error when the watch is gone.
    async fn changed(&self) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.get_inner().0.read_events() {
                Ok(events) => {
                    if events
                        .iter()
                        .any(|e| e.mask.contains(AddWatchFlags::IN_IGNORED))
                    {
                        return Err(std::io::Error::other("the watched directory is gone"));
                    }
                    let relevant = events.iter().any(|e| match &e.name {
                        None => true,
                        Some(name) => {
                            !name.to_string_lossy().starts_with('.')
                                && self.only.as_ref().is_none_or(|only| only == name)
                        }
                    });
                    if relevant {
                        return Ok(());
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A copy of a static pod whose file is gone, asking its worker to terminate it within its
/// grace period (the kubelet kills a removed static pod as a deleted API pod).
fn removed(pod: &Pod) -> Pod {
    let mut gone = pod.clone();
    gone.metadata.deletion_grace_period_seconds = Some(super::termination_grace_period(pod));
    gone.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    gone
}

/// Hands the static pods' changes to admission and the workers.
struct Feeder<S, A> {
    workers: PodWorkers<S>,
    admission: Arc<A>,
    statics: StaticPods,
}

impl<S: PodSyncer, A: PodAdmission> Feeder<S, A> {
    /// The manifests now give `listed`: new pods are admitted and started, pods no longer
    /// listed are terminated. A pod listed again (same UID) is kept as first seen.
    fn set(&self, listed: Vec<Pod>) {
        // Two files with one pod name: the later one counts, as in the kubelet's store.
        let mut by_name: HashMap<(Option<String>, Option<String>), Pod> = HashMap::new();
        for pod in listed {
            by_name.insert(
                (pod.metadata.namespace.clone(), pod.metadata.name.clone()),
                pod,
            );
        }
        let listed: BTreeMap<String, Pod> = by_name
            .into_values()
            .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
            .collect();
        let (added, gone) = {
            let mut pods = crate::lock::write(&self.statics.pods);
            let gone: Vec<Arc<Pod>> = pods
                .iter()
                .filter(|(uid, _)| !listed.contains_key(*uid))
                .map(|(_, p)| p.clone())
                .collect();
            pods.retain(|uid, _| listed.contains_key(uid));
            let mut added = Vec::new();
            for (uid, pod) in listed {
                if let std::collections::btree_map::Entry::Vacant(slot) = pods.entry(uid) {
                    let pod = Arc::new(pod);
                    slot.insert(pod.clone());
                    added.push(pod);
                }
            }
            (added, gone)
        };
        let changed = !gone.is_empty() || !added.is_empty();
        for pod in &gone {
            let Some(id) = super::PodId::of(pod) else {
                continue;
            };
            tracing::info!(pod = %id, "static pod removed from its manifest");
            self.admission.forget(&id.uid);
            self.workers
                .update(&id.uid, PodWork::Sync(Arc::new(removed(pod))));
        }
        for pod in added {
            let Some(id) = super::PodId::of(&pod) else {
                continue;
            };
            tracing::info!(pod = %id, "static pod added from its manifest");
            self.admission.admit(&pod);
            self.workers.update(&id.uid, PodWork::Sync(pod));
        }
        if changed {
            self.statics.notify();
        }
        self.statics.listed.send_replace(true);
    }
}

/// Reads the manifests once and hands their pods to admission and the workers; returns
/// the task that follows the manifests' changes until the process ends.
pub async fn start<S: PodSyncer, A: PodAdmission>(
    config: FileConfig,
    workers: PodWorkers<S>,
    admission: Arc<A>,
    statics: StaticPods,
) -> impl Future<Output = ()> + Send + use<S, A> {
    tracing::info!(path = %config.path.display(), "Watching path for static pods");
    let feeder = Feeder {
        workers,
        admission,
        statics,
    };
    if let Some(pods) = list_async(&config).await {
        feeder.set(pods);
    }
    async move {
        let mut watcher: Option<Watcher> = None;
        let mut ticker = tokio::time::interval(config.check_frequency.max(Duration::from_secs(1)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            if watcher.is_none() {
                watcher = Watcher::new(&config.path)
                    .inspect_err(|e| {
                        tracing::debug!(path = %config.path.display(), error = %e, "cannot watch the manifest path; reading it every check period");
                    })
                    .ok();
            }
            let change = async {
                match &watcher {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = ticker.tick() => {}
                changed = change => match changed {
                    Ok(()) => tokio::time::sleep(SETTLE).await,
                    Err(e) => {
                        tracing::warn!(path = %config.path.display(), error = %e, "watch of the manifest path ended");
                        watcher = None;
                    }
                },
            }
            if let Some(pods) = list_async(&config).await {
                feeder.set(pods);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubetypes::CONFIG_SOURCE;
    use crate::pod::state::PodStates;

    const YAML: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: c
    image: busybox
    command: [sleep, '3600']
";

    fn annotations(pod: &Pod) -> &BTreeMap<String, String> {
        pod.metadata.annotations.as_ref().unwrap()
    }

    #[test]
    fn a_manifest_is_defaulted_as_the_kubelet_does() {
        let pod = decode(YAML.as_bytes(), Path::new("/etc/m/web.yaml"), "Node-1").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        assert!(uid.chars().all(|c| c.is_ascii_hexdigit()));
        let a = annotations(&pod);
        assert_eq!(a[CONFIG_HASH], uid);
        assert_eq!(a[CONFIG_SOURCE], "file");
        assert!(a.contains_key(CONFIG_SEEN));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        assert_eq!(
            spec.tolerations.as_deref().unwrap(),
            [Toleration {
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                ..Default::default()
            }]
        );
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Pending")
        );
        assert!(crate::kubetypes::is_static_pod(&pod));
    }

    #[test]
    fn the_uid_follows_the_content_and_nothing_else() {
        let uid = |data: &str, path: &str, node: &str| {
            decode(data.as_bytes(), Path::new(path), node)
                .unwrap()
                .metadata
                .uid
                .unwrap()
        };
        let base = uid(YAML, "/m/a.yaml", "n1");
        assert_eq!(base, uid(YAML, "/m/a.yaml", "n1"), "stable across reads");
        // As the kubelet's: its hasher is reset before the pod is written into it.
        assert_eq!(base, uid(YAML, "/m/b.yaml", "n1"));
        assert_eq!(base, uid(YAML, "/m/a.yaml", "n2"));
        assert_ne!(base, uid(&YAML.replace("3600", "3601"), "/m/a.yaml", "n1"));
        // The same pod in JSON is the same pod.
        let value: serde_json::Value = serde_yaml_ng::from_str(YAML).unwrap();
        assert_eq!(base, uid(&value.to_string(), "/m/a.yaml", "n1"));
        // A UID written in the manifest is kept.
        let given = YAML.replace("  name: web\n", "  name: web\n  uid: my-uid\n");
        assert_eq!(uid(&given, "/m/a.yaml", "n1"), "my-uid");
    }

    /// The UIDs the kubelet v1.20.2's own file source gives the manifests of
    /// tests/data/kubelet-v1.20.2/static-pods (kubeadm's control plane pods, every volume
    /// type and pod field, host network ports, quantities to round; see the README there).
    #[test]
    fn static_pods_get_the_kubelets_uids() {
        let (pods, expected) = testing::kubelet_static_pods();
        assert_eq!(pods.len(), expected.len());
        for pod in pods {
            let name = pod.metadata.name.as_deref().unwrap();
            assert_eq!(
                pod.metadata.uid.as_deref(),
                expected[name]["uid"].as_str(),
                "{name}"
            );
        }
    }

    #[test]
    fn bad_manifests_are_refused_with_the_reason() {
        let p = Path::new("/m/x");
        let err = |data: &str| decode(data.as_bytes(), p, "n1").unwrap_err().to_string();
        assert!(err("{{{").contains("couldn't parse as pod"));
        assert!(err("apiVersion: v1\nkind: Service\n").contains("not a v1 Pod"));
        assert!(err(&YAML.replace("name: web", "name: Web_1")).contains("metadata.name"));
        assert_eq!(
            err(&YAML.replace("    image: busybox\n", "")),
            "invalid pod: spec.containers.image: Required value"
        );
        assert!(
            err("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n")
                .contains("spec.containers: Required value")
        );
        let twice = YAML.replace(
            "    command: [sleep, '3600']\n",
            "  - name: c\n    image: busybox\n",
        );
        assert!(err(&twice).contains("Duplicate value"));
    }

    #[test]
    fn a_directory_lists_its_manifests_but_not_dot_files_or_subdirectories() {
        let dir = std::env::temp_dir().join(format!("rk-static-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.yaml"), YAML).unwrap();
        std::fs::write(dir.join("b.json"), YAML.replace("name: web", "name: api")).unwrap();
        std::fs::write(
            dir.join(".c.yaml"),
            YAML.replace("name: web", "name: hidden"),
        )
        .unwrap();
        std::fs::write(dir.join("d.yaml"), "not: a pod").unwrap();
        std::fs::write(dir.join("sub/e.yaml"), YAML).unwrap();
        let names: Vec<String> = list(&dir, "n1")
            .unwrap()
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["web-n1", "api-n1"]);
        // One file: its pod; a bad one is an error (the pods stay as they were).
        assert_eq!(list(&dir.join("a.yaml"), "n1").unwrap().len(), 1);
        assert!(list(&dir.join("d.yaml"), "n1").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(list(&dir, "n1").unwrap().is_empty(), "a missing path: none");
    }

    /// inotify reports a manifest written into the directory, not a dot file; watching one
    /// file, a change of another file in its directory is not reported.
    #[tokio::test]
    async fn the_watcher_reports_manifest_changes_but_not_dot_files() {
        let dir = std::env::temp_dir().join(format!("rk-static-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let watcher = Watcher::new(&dir).unwrap();
        std::fs::write(dir.join(".tmp.yaml"), YAML).unwrap();
        assert!(!soon(&watcher).await, "a dot file is not reported");
        std::fs::rename(dir.join(".tmp.yaml"), dir.join("a.yaml")).unwrap();
        assert!(soon(&watcher).await, "a renamed-in manifest is reported");
        let one = Watcher::new(&dir.join("a.yaml")).unwrap();
        std::fs::write(dir.join("b.yaml"), YAML).unwrap();
        assert!(!soon(&one).await, "another file is not reported");
        std::fs::write(dir.join("a.yaml"), YAML).unwrap();
        assert!(soon(&one).await, "the file itself is");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Whether the watcher reports a change within 300 ms.
    async fn soon(w: &Watcher) -> bool {
        tokio::time::timeout(Duration::from_millis(300), w.changed())
            .await
            .is_ok()
    }

    /// Records the work each pod's worker got.
    #[derive(Default)]
    struct Seen(std::sync::Mutex<Vec<String>>);

    impl PodSyncer for Seen {
        async fn sync(&self, work: &PodWork) -> super::super::workers::Next {
            if let PodWork::Sync(pod) = work {
                let what = if super::super::is_terminating(pod) {
                    "stop"
                } else {
                    "run"
                };
                self.0.lock().unwrap().push(format!(
                    "{what} {} {:?}",
                    pod.metadata.name.clone().unwrap(),
                    pod.metadata.deletion_grace_period_seconds
                ));
            }
            super::super::workers::Next::ResyncAfter(Duration::from_secs(3600))
        }
    }

    #[derive(Default)]
    struct Admitted(std::sync::Mutex<Vec<String>>);

    impl PodAdmission for Admitted {
        fn admit(&self, pod: &Arc<Pod>) {
            self.0
                .lock()
                .unwrap()
                .push(format!("admit {}", pod.metadata.name.clone().unwrap()));
        }
        fn forget(&self, _uid: &str) {
            self.0.lock().unwrap().push("forget".into());
        }
        fn retain(&self, _listed: &HashSet<String>) {}
    }

    #[tokio::test]
    async fn a_changed_manifest_replaces_the_pod_and_a_removed_one_stops_it() {
        let syncer = Arc::new(Seen::default());
        let admission = Arc::new(Admitted::default());
        let feeder = Feeder {
            workers: PodWorkers::new(syncer.clone(), PodStates::default()),
            admission: admission.clone(),
            statics: StaticPods::default(),
        };
        let p = Path::new("/m/a.yaml");
        // Each worker gets to run before the next change.
        let settle = || tokio::time::sleep(Duration::from_millis(20));
        let v1 = decode(YAML.as_bytes(), p, "n1").unwrap();
        feeder.set(vec![v1.clone()]);
        settle().await;
        // Read again (config.seen differs): the same pod, nothing to do.
        feeder.set(vec![decode(YAML.as_bytes(), p, "n1").unwrap()]);
        assert_eq!(
            feeder.statics.get("default", "web-n1").unwrap().metadata,
            v1.metadata,
            "kept as first seen"
        );
        let v2 = decode(YAML.replace("3600", "60").as_bytes(), p, "n1").unwrap();
        feeder.set(vec![v2.clone()]);
        settle().await;
        assert_eq!(
            feeder.statics.uids(),
            [v2.metadata.uid.clone().unwrap()].into()
        );
        feeder.set(Vec::new());
        assert!(feeder.statics.pods().is_empty());
        settle().await;
        assert_eq!(
            *admission.0.lock().unwrap(),
            ["admit web-n1", "forget", "admit web-n1", "forget"]
        );
        let mut seen = syncer.0.lock().unwrap().clone();
        seen.sort();
        assert_eq!(
            seen,
            [
                "run web-n1 None",
                "run web-n1 None",
                "stop web-n1 Some(3)",
                "stop web-n1 Some(3)"
            ]
        );
    }
    #[tokio::test]
    async fn orphans_wait_until_the_manifests_were_read_once() {
        let listed = |statics: &StaticPods| {
            let statics = statics.clone();
            async move {
                tokio::time::timeout(Duration::from_millis(50), statics.listed())
                    .await
                    .is_ok()
            }
        };
        assert!(listed(&StaticPods::default()).await, "no manifest path");
        let feeder = Feeder {
            workers: PodWorkers::new(Arc::new(Seen::default()), PodStates::default()),
            admission: Arc::new(Admitted::default()),
            statics: StaticPods::unlisted(),
        };
        assert!(!listed(&feeder.statics).await, "a path not read yet");
        // A read that found no pod is a read: from now on, mirror pods may be orphans.
        feeder.set(Vec::new());
        assert!(listed(&feeder.statics).await);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! The kubelet's own view of the reference manifests.
    use std::collections::HashMap;
    use std::path::Path;

    use k8s_openapi::api::core::v1::Pod;

    /// The pods of tests/data/kubelet-v1.20.2/static-pods as this agent reads them (node
    /// `n1`), and the kubelet v1.20.2's file source's line of each, by pod name: its
    /// `uid`, its containers' `hashes` and the defaulted `pod`.
    pub fn kubelet_static_pods() -> (Vec<Pod>, HashMap<String, serde_json::Value>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubelet-v1.20.2");
        let expected = std::fs::read_to_string(dir.join("static-pods.jsonl"))
            .unwrap()
            .lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                (v["pod"]["metadata"]["name"].as_str().unwrap().to_owned(), v)
            })
            .collect();
        (
            super::list(&dir.join("static-pods"), "n1").unwrap(),
            expected,
        )
    }
}
