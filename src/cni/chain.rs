//! Attaching a pod sandbox to the node's network: loopback first, then the plugin chain,
//! with results threaded, port mappings injected, failed `ADD`s rolled back and results
//! cached, as libcni's `AddNetworkList`/`DelNetworkList`/`CheckNetworkList` do.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::cache::{CacheEntry, ResultCache};
use super::exec::{find_plugin, plugin_answer};
use super::{CniError, CniResult, Command, NetworkConfigList, PluginExec, ProcessExec};

/// The pod a sandbox belongs to, as plugins see it in `CNI_ARGS` (`K8S_POD_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodNetworkRef {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
}

/// A port protocol, written lowercase to plugins as containerd does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    #[serde(alias = "TCP")]
    Tcp,
    /// UDP.
    #[serde(alias = "UDP")]
    Udp,
    /// SCTP.
    #[serde(alias = "SCTP")]
    Sctp,
}

impl FromStr for Protocol {
    type Err = String;

    /// Case-insensitive: `TCP` (Kubernetes' spelling) and `tcp` (CNI's) both parse.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Self::Tcp),
            "udp" => Ok(Self::Udp),
            "sctp" => Ok(Self::Sctp),
            _ => Err(format!("unknown port protocol {s:?}")),
        }
    }
}

/// A host port forwarded to the pod, as the `portMappings` capability carries it. Read
/// also as containerd writes it (go-cni's untagged struct: `HostPort`, `ContainerPort`,
/// `Protocol`, `HostIP`; Go decodes field names case-insensitively).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    /// The port on the node; mappings with 0 are not passed to plugins.
    #[serde(rename = "hostPort", alias = "HostPort")]
    pub host_port: u16,
    /// The port in the pod.
    #[serde(rename = "containerPort", alias = "ContainerPort")]
    pub container_port: u16,
    /// The protocol.
    #[serde(alias = "Protocol")]
    pub protocol: Protocol,
    /// The node address to listen on; empty for all.
    #[serde(
        rename = "hostIP",
        alias = "HostIP",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub host_ip: String,
}

/// One sandbox's attachment to the network: what `ADD`, `CHECK` and `DEL` act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The sandbox id (`CNI_CONTAINERID`).
    pub container_id: String,
    /// The sandbox's network namespace path (`CNI_NETNS`). For `DEL` it may be empty (the
    /// cached one is used) or gone (plugins then get an empty `CNI_NETNS`).
    pub netns: PathBuf,
    /// The interface to make in it, normally [`POD_IFNAME`](super::POD_IFNAME).
    pub ifname: String,
    /// The pod, for `CNI_ARGS`.
    pub pod: PodNetworkRef,
    /// Host ports to forward; only used by `ADD` and by a `DEL` with no cached entry.
    pub port_mappings: Vec<PortMapping>,
}

impl Attachment {
    /// `CNI_ARGS`, as containerd and the kubelet's dockershim pass them.
    fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.pod.namespace, self.pod.name, self.container_id, self.pod.uid
        )
    }

    /// The mappings plugins get: those with a host port.
    fn host_port_mappings(&self) -> Vec<PortMapping> {
        self.port_mappings
            .iter()
            .filter(|m| m.host_port != 0)
            .cloned()
            .collect()
    }

    /// Refuses ids and names the CNI spec does not allow, which also keeps them safe in
    /// cache file names.
    fn validate(&self) -> Result<(), CniError> {
        let invalid = |reason: String| CniError::InvalidAttachment {
            container_id: self.container_id.clone(),
            reason,
        };
        let id_ok = !self.container_id.is_empty()
            && self
                .container_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !id_ok {
            return Err(invalid(
                "the container id must be non-empty and made of [a-zA-Z0-9_.-]".into(),
            ));
        }
        let name = self.ifname.as_str();
        let name_ok = !name.is_empty()
            && name.len() <= 15
            && name != "."
            && name != ".."
            && !name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace());
        if !name_ok {
            return Err(invalid(format!("invalid interface name {name:?}")));
        }
        Ok(())
    }
}

/// Everything one run of a config list for one attachment is built from.
struct Run<'a> {
    list: &'a NetworkConfigList,
    container_id: &'a str,
    netns: &'a str,
    ifname: &'a str,
    cni_args: &'a str,
    port_mappings: &'a [PortMapping],
}

impl<'a> Run<'a> {
    /// The same attachment, on `lo` with the loopback config.
    fn loopback(&self, list: &'a NetworkConfigList) -> Self {
        Run {
            list,
            ifname: "lo",
            port_mappings: &[],
            ..*self
        }
    }
}

/// The node's CNI network and the means to attach sandboxes to it.
///
/// `add`, `check` and `del` of one container id are serialised; different containers run
/// concurrently. Do not cancel a running `add` (run it in its own task): a chain dropped
/// half-way cannot roll itself back.
pub struct Cni<E = ProcessExec> {
    pub(super) network: NetworkConfigList,
    loopback: NetworkConfigList,
    bin_dirs: Vec<PathBuf>,
    cni_path: String,
    pub(super) cache: ResultCache,
    /// Visible to the module's tests, which inspect their fake.
    pub(super) exec: E,
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    pub(super) deleted: Deleted,
    /// The garbage collector's record of attachments with no sandbox in the runtime.
    pub(super) unlisted: super::gc::Unlisted,
}

/// How long a finished `DEL` is remembered.
const DELETED_MEMORY: Duration = Duration::from_secs(600);

/// Attachments (container id, interface) this process deleted in full, every plugin's
/// `DEL` having succeeded, and has not added again since. containerd tears a sandbox's
/// network down twice, in `StopPodSandbox` and again when `RemovePodSandbox` stops the
/// sandbox once more: the second `DEL` has nothing left to undo and returns at once instead
/// of running every plugin again. After a restart nothing is remembered and a `DEL` runs
/// the plugins as usual, so nothing can be skipped that was not released.
#[derive(Default)]
pub(super) struct Deleted(Mutex<HashMap<(String, String), Instant>>);

impl Deleted {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Instant>> {
        let mut map = crate::lock::lock(&self.0);
        map.retain(|_, at| at.elapsed() < DELETED_MEMORY);
        map
    }

    fn key(container_id: &str, ifname: &str) -> (String, String) {
        (container_id.to_owned(), ifname.to_owned())
    }

    fn contains(&self, container_id: &str, ifname: &str) -> bool {
        self.lock().contains_key(&Self::key(container_id, ifname))
    }

    fn record(&self, container_id: &str, ifname: &str) {
        self.lock()
            .insert(Self::key(container_id, ifname), Instant::now());
    }

    pub(super) fn forget(&self, container_id: &str, ifname: &str) {
        self.lock().remove(&Self::key(container_id, ifname));
    }
}

impl<E> Cni<E> {
    /// Whether an operation on this container is under way.
    pub(super) fn in_flight(&self, container_id: &str) -> bool {
        let locks = crate::lock::lock(&self.locks);
        locks
            .get(container_id)
            .is_some_and(|m| m.strong_count() > 0)
    }
}

impl<E: PluginExec> Cni<E> {
    /// Attaches sandboxes to `network`, running plugins found in `bin_dirs` (searched in
    /// order, e.g. [`DEFAULT_BIN_DIRS`](super::DEFAULT_BIN_DIRS)) through `exec`, and
    /// caching results under `cache_dir/results`.
    pub fn new(
        network: NetworkConfigList,
        bin_dirs: Vec<PathBuf>,
        cache_dir: PathBuf,
        exec: E,
    ) -> Self {
        let cni_path = bin_dirs
            .iter()
            .map(|d| d.to_string_lossy())
            .collect::<Vec<_>>()
            .join(":");
        Self {
            network,
            loopback: NetworkConfigList::loopback(),
            bin_dirs,
            cni_path,
            cache: ResultCache::new(&cache_dir),
            exec,
            locks: Mutex::default(),
            deleted: Deleted::default(),
            unlisted: super::gc::Unlisted::default(),
        }
    }

    /// Removes the result cache's temporaries that a crash of the agent left (it was
    /// killed while caching a result): for start-up, before any `ADD` runs. Returns how
    /// many there were.
    ///
    /// # Errors
    /// [`CniError::Io`]: the cache dir cannot be listed or a temporary removed.
    pub async fn sweep_cache(&self) -> Result<usize, CniError> {
        self.cache.sweep().await
    }

    /// The network sandboxes are attached to.
    #[must_use]
    pub fn network(&self) -> &NetworkConfigList {
        &self.network
    }

    /// Asks every plugin (loopback and the chain) for its `VERSION`: each must exist and
    /// support the CNI version of its config. For start-up, before reporting the network
    /// ready.
    ///
    /// # Errors
    /// [`CniError::PluginNotFound`], [`CniError::IncompatibleVersion`], or the plugin's
    /// failure.
    pub async fn verify_plugins(&self) -> Result<(), CniError> {
        for list in [&self.loopback, &self.network] {
            for plugin in list.plugin_types() {
                let env = [
                    ("CNI_COMMAND".to_owned(), Command::Version.to_string()),
                    ("CNI_PATH".to_owned(), self.cni_path.clone()),
                ];
                let stdin = json!({"cniVersion": list.cni_version()}).to_string();
                let out = self
                    .run_binary(plugin, Command::Version, &env, &stdin, "")
                    .await?;
                let bad = |reason: String| CniError::BadResult {
                    plugin: plugin.to_owned(),
                    command: Command::Version,
                    reason,
                };
                let answer: Value = serde_json::from_slice(&out).map_err(|e| bad(e.to_string()))?;
                let supported: Vec<String> = answer
                    .get("supportedVersions")
                    .cloned()
                    .map(serde_json::from_value)
                    .transpose()
                    .map_err(|e| bad(e.to_string()))?
                    .ok_or_else(|| bad("no supportedVersions".into()))?;
                if !supported.iter().any(|v| v == list.cni_version()) {
                    return Err(CniError::IncompatibleVersion {
                        plugin: plugin.to_owned(),
                        wanted: list.cni_version().to_owned(),
                        supported,
                    });
                }
            }
        }
        Ok(())
    }

    /// `ADD`: brings up `lo`, then runs the chain in order, each plugin getting the
    /// previous one's result as `prevResult`, and caches the final result. On failure
    /// every plugin that ran (the failed one included) gets a `DEL`, in reverse order, and
    /// nothing is cached.
    ///
    /// # Errors
    /// The first failure: [`CniError::Plugin`], [`CniError::PluginNotFound`],
    /// [`CniError::Exec`], [`CniError::BadResult`], or the cache write's error.
    #[tracing::instrument(name = "cni_add", skip_all, fields(pod_uid = %att.pod.uid, container_id = %att.container_id))]
    pub async fn add(&self, att: &Attachment) -> Result<CniResult, CniError> {
        att.validate()?;
        let _serial = self.lock(&att.container_id).await;
        self.deleted.forget(&att.container_id, &att.ifname);
        let netns = att.netns.to_string_lossy();
        let cni_args = att.cni_args();
        let port_mappings = att.host_port_mappings();
        let run = Run {
            list: &self.network,
            container_id: &att.container_id,
            netns: &netns,
            ifname: &att.ifname,
            cni_args: &cni_args,
            port_mappings: &port_mappings,
        };
        let lo = run.loopback(&self.loopback);
        self.add_list(&lo).await?;
        let attached = async {
            let raw = self.add_list(&run).await?;
            crate::fault::point(crate::fault::CNI_ADD);
            let recorded = self.record(&run, raw.clone()).await;
            if recorded.is_err() {
                self.rollback(&run, run.list.plugins(), Some(&raw)).await;
            }
            recorded
        };
        match attached.await {
            Ok(result) => {
                tracing::info!(
                    container_id = %att.container_id,
                    pod = %format_args!("{}/{}", att.pod.namespace, att.pod.name),
                    network = self.network.name(),
                    ips = ?result.pod_ips(),
                    "CNI ADD done"
                );
                Ok(result)
            }
            Err(e) => {
                self.rollback(&lo, self.loopback.plugins(), None).await;
                Err(e)
            }
        }
    }

    /// `CHECK`: asks `lo` and every plugin, in order, whether the attachment is still as
    /// `ADD` left it, with the cached config, arguments and result. A no-op for lists with
    /// `disableCheck`.
    ///
    /// # Errors
    /// [`CniError::NotAttached`] with no cached `ADD`; else the first plugin failure.
    pub async fn check(&self, att: &Attachment) -> Result<(), CniError> {
        att.validate()?;
        let _serial = self.lock(&att.container_id).await;
        let Some((_, cached)) = self
            .cache
            .find(self.network.name(), &att.container_id, &att.ifname)
            .await?
        else {
            return Err(CniError::NotAttached {
                container_id: att.container_id.clone(),
                network: self.network.name().to_owned(),
                ifname: att.ifname.clone(),
            });
        };
        if cached.config.disable_check() {
            return Ok(());
        }
        let netns = if att.netns.as_os_str().is_empty() {
            cached.netns.clone()
        } else {
            att.netns.to_string_lossy().into_owned()
        };
        let run = Run {
            list: &cached.config,
            container_id: &att.container_id,
            netns: &netns,
            ifname: &att.ifname,
            cni_args: &cached.cni_args,
            port_mappings: &cached.port_mappings,
        };
        let lo = run.loopback(&self.loopback);
        for plugin in self.loopback.plugins() {
            self.invoke(&lo, plugin, Command::Check, None).await?;
        }
        let prev = cached.result.to_json();
        for plugin in cached.config.plugins() {
            self.invoke(&run, plugin, Command::Check, Some(prev))
                .await?;
        }
        Ok(())
    }

    /// `DEL`: runs the chain in reverse with the config, arguments and result cached by
    /// `ADD` (or, with no cache entry, the current config and no `prevResult`), then the
    /// loopback `DEL`, and removes the cache entry. Best-effort and idempotent: every
    /// plugin runs even if one fails, a netns that is gone is passed as an empty
    /// `CNI_NETNS`, and a loopback failure is only logged. A repeated `DEL` of an
    /// attachment this process already deleted in full, and has not added since, runs no
    /// plugin.
    ///
    /// # Errors
    /// The first plugin failure; the cache entry is then kept, for a retry.
    #[tracing::instrument(name = "cni_del", skip_all, fields(container_id = %att.container_id))]
    pub async fn del(&self, att: &Attachment) -> Result<(), CniError> {
        att.validate()?;
        let _serial = self.lock(&att.container_id).await;
        if self.deleted.contains(&att.container_id, &att.ifname) {
            tracing::debug!(container_id = %att.container_id, "CNI DEL: already deleted");
            return Ok(());
        }
        let found = match self
            .cache
            .find(self.network.name(), &att.container_id, &att.ifname)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(container_id = %att.container_id, "{e}; deleting with the current config");
                None
            }
        };
        let cached = found.as_ref().map(|(_, entry)| entry);
        let netns = match (att.netns.as_os_str().is_empty(), cached) {
            (false, _) => att.netns.to_string_lossy().into_owned(),
            (true, Some(entry)) => entry.netns.clone(),
            (true, None) => String::new(),
        };
        let netns = if !netns.is_empty() && tokio::fs::try_exists(&netns).await.unwrap_or(false) {
            netns
        } else {
            String::new()
        };
        let current_args = att.cni_args();
        let current_mappings = att.host_port_mappings();
        let run = match cached {
            Some(entry) => Run {
                list: &entry.config,
                container_id: &att.container_id,
                netns: &netns,
                ifname: &att.ifname,
                cni_args: &entry.cni_args,
                port_mappings: &entry.port_mappings,
            },
            None => Run {
                list: &self.network,
                container_id: &att.container_id,
                netns: &netns,
                ifname: &att.ifname,
                cni_args: &current_args,
                port_mappings: &current_mappings,
            },
        };
        let prev = cached.map(|entry| entry.result.to_json());
        let outcome = self.del_plugins(&run, run.list.plugins(), prev).await;
        let lo = run.loopback(&self.loopback);
        if let Err(e) = self.del_plugins(&lo, self.loopback.plugins(), None).await {
            tracing::warn!(container_id = %att.container_id, "ignoring loopback DEL failure: {e}");
        }
        outcome?;
        if let Some((path, _)) = &found {
            self.cache.remove(path).await?;
        }
        // A corrupt entry under the current name was not found above: remove it too.
        let current = self
            .cache
            .path(self.network.name(), &att.container_id, &att.ifname);
        self.cache.remove(&current).await?;
        self.deleted.record(&att.container_id, &att.ifname);
        tracing::info!(container_id = %att.container_id, network = run.list.name(), "CNI DEL done");
        Ok(())
    }

    /// Reads the chain's final result and caches it with what the run was made of.
    async fn record(&self, run: &Run<'_>, raw: Value) -> Result<CniResult, CniError> {
        let result = CniResult::from_json(raw).map_err(|reason| CniError::BadResult {
            plugin: run
                .list
                .plugin_types()
                .last()
                .unwrap_or_default()
                .to_owned(),
            command: Command::Add,
            reason,
        })?;
        let entry = CacheEntry::new(
            run.container_id,
            run.ifname,
            run.netns,
            run.list.clone(),
            run.cni_args.to_owned(),
            run.port_mappings.to_vec(),
            result.clone(),
        );
        self.cache.store(&entry).await?;
        Ok(result)
    }

    /// Runs `ADD` of every plugin of the list in order; on a failure, rolls back the
    /// plugins that ran. The last plugin's result on success.
    async fn add_list(&self, run: &Run<'_>) -> Result<Value, CniError> {
        let plugins = run.list.plugins();
        let mut prev: Option<Value> = None;
        for (i, plugin) in plugins.iter().enumerate() {
            let added = self
                .invoke(run, plugin, Command::Add, prev.as_ref())
                .await
                .and_then(|out| {
                    let value: Value =
                        serde_json::from_slice(&out).map_err(|e| CniError::BadResult {
                            plugin: plugin_type(plugin).to_owned(),
                            command: Command::Add,
                            reason: format!("stdout is not a JSON result: {e}"),
                        })?;
                    Ok(value)
                });
            match added {
                Ok(result) => prev = Some(result),
                Err(err) => {
                    // The failed plugin may have done part of its work: undo it too,
                    // unless it never ran.
                    let ran = if matches!(err, CniError::PluginNotFound { .. }) {
                        i
                    } else {
                        i + 1
                    };
                    self.rollback(run, &plugins[..ran], prev.as_ref()).await;
                    return Err(err);
                }
            }
        }
        prev.ok_or_else(|| CniError::InvalidConfig {
            config: run.list.name().to_owned(),
            reason: "no plugins".into(),
        })
    }

    /// `DEL` of `plugins` in reverse order after a failed `ADD`: failures are only logged,
    /// the `ADD`'s error is what the caller reports.
    async fn rollback(&self, run: &Run<'_>, plugins: &[Map<String, Value>], prev: Option<&Value>) {
        if let Err(e) = self.del_plugins(run, plugins, prev).await {
            tracing::warn!(
                container_id = run.container_id,
                "rolling back a failed CNI ADD: {e}"
            );
        }
    }

    /// `DEL` of every plugin of `plugins`, in reverse order, all of them even if one
    /// fails. The first failure.
    async fn del_plugins(
        &self,
        run: &Run<'_>,
        plugins: &[Map<String, Value>],
        prev: Option<&Value>,
    ) -> Result<(), CniError> {
        let mut first_err = None;
        for plugin in plugins.iter().rev() {
            if let Err(e) = self.invoke(run, plugin, Command::Del, prev).await {
                tracing::warn!(container_id = run.container_id, "{e}");
                first_err.get_or_insert(e);
            }
            crate::fault::point(crate::fault::CNI_DEL);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Runs one plugin: its stdout on success.
    async fn invoke(
        &self,
        run: &Run<'_>,
        plugin: &Map<String, Value>,
        command: Command,
        prev: Option<&Value>,
    ) -> Result<Vec<u8>, CniError> {
        let ty = plugin_type(plugin);
        let stdin = plugin_config(run, plugin, prev).to_string();
        let env = self.env(run, command);
        tracing::debug!(plugin = ty, %command, container_id = run.container_id, ifname = run.ifname, "running CNI plugin");
        self.run_binary(ty, command, &env, &stdin, run.container_id)
            .await
    }

    /// Finds the plugin binary of type `ty`, runs it with `env` and `stdin`, and returns
    /// its successful answer (a CNI error result or a failed exit becomes an error).
    async fn run_binary(
        &self,
        ty: &str,
        command: Command,
        env: &[(String, String)],
        stdin: &str,
        container_id: &str,
    ) -> Result<Vec<u8>, CniError> {
        let path = find_plugin(ty, &self.bin_dirs).await?;
        let output = self
            .exec
            .exec(&path, env, stdin.as_bytes())
            .instrument(tracing::info_span!("cni_plugin", plugin = ty, %command))
            .await
            .map_err(|source| CniError::Exec {
                plugin: path.clone(),
                command,
                source,
            })?;
        plugin_answer(output, ty, command, container_id)
    }

    /// The CNI environment of one plugin run.
    fn env(&self, run: &Run<'_>, command: Command) -> Vec<(String, String)> {
        [
            ("CNI_COMMAND", command.as_str()),
            ("CNI_CONTAINERID", run.container_id),
            ("CNI_NETNS", run.netns),
            ("CNI_IFNAME", run.ifname),
            ("CNI_ARGS", run.cni_args),
            ("CNI_PATH", &self.cni_path),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Serialises operations on one container id.
    async fn lock(&self, container_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let mutex = {
            let mut locks = crate::lock::lock(&self.locks);
            locks.retain(|_, m| m.strong_count() > 0);
            if let Some(m) = locks.get(container_id).and_then(Weak::upgrade) {
                m
            } else {
                let m = Arc::new(tokio::sync::Mutex::new(()));
                locks.insert(container_id.to_owned(), Arc::downgrade(&m));
                m
            }
        };
        mutex.lock_owned().await
    }
}

/// A validated plugin config's `type`.
fn plugin_type(plugin: &Map<String, Value>) -> &str {
    plugin
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// What a plugin reads on stdin, built as libcni does: its own config, with the list's
/// `name` and `cniVersion`, the `prevResult` if any, and `runtimeConfig.portMappings` if
/// it declares the `portMappings` capability and there are mappings.
fn plugin_config(run: &Run<'_>, plugin: &Map<String, Value>, prev: Option<&Value>) -> Value {
    let mut conf = plugin.clone();
    conf.insert("name".into(), json!(run.list.name()));
    conf.insert("cniVersion".into(), json!(run.list.cni_version()));
    if let Some(prev) = prev {
        conf.insert("prevResult".into(), prev.clone());
    }
    let wants_ports = plugin
        .get("capabilities")
        .and_then(|c| c.get("portMappings"))
        .and_then(Value::as_bool)
        == Some(true);
    if wants_ports && !run.port_mappings.is_empty() {
        conf.insert(
            "runtimeConfig".into(),
            json!({"portMappings": run.port_mappings}),
        );
    }
    Value::Object(conf)
}

impl ResultCache {
    /// The cached entry of an attachment and its file: under `network` if there is one,
    /// else under any other network name (the config's name changed since the `ADD`).
    async fn find(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<(PathBuf, CacheEntry)>, CniError> {
        let path = self.path(network, container_id, ifname);
        if let Some(entry) = self.load(&path).await? {
            return Ok(Some((path, entry)));
        }
        let suffix = format!("-{container_id}-{ifname}");
        for path in self.files().await? {
            let matches = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(&suffix));
            if !matches {
                continue;
            }
            match self.load(&path).await {
                Ok(Some(entry))
                    if entry.container_id == container_id && entry.if_name == ifname =>
                {
                    return Ok(Some((path, entry)));
                }
                Ok(_) => {}
                Err(e) => tracing::debug!("skipping {}: {e}", path.display()),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::cni::PluginOutput;
    use crate::cni::testutil::{FakeExec, TempDir, bin_dir};

    const BRIDGE_PORTMAP_TUNING: &str = r#"{
        "cniVersion": "0.4.0", "name": "testnet",
        "plugins": [
            {"type": "bridge", "bridge": "rk0", "ipam": {"type": "host-local"}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            {"type": "tuning", "runtimeConfig": {"keep": "me"}}
        ]}"#;

    struct Setup {
        bin: TempDir,
        cache: TempDir,
        netns: TempDir,
    }

    impl Setup {
        fn new() -> Self {
            Self {
                bin: bin_dir(&["loopback", "bridge", "portmap", "tuning", "ptp"]),
                cache: TempDir::new("cache"),
                netns: TempDir::new("netns"),
            }
        }

        fn cni(&self, conflist: &str, exec: FakeExec) -> Cni<FakeExec> {
            let list = NetworkConfigList::parse("test", conflist.as_bytes()).unwrap();
            Cni::new(
                list,
                vec!["/nonexistent".into(), self.bin.path().to_owned()],
                self.cache.path().to_owned(),
                exec,
            )
        }

        /// An attachment whose netns path exists (a plain file stands in for it).
        fn attachment(&self, id: &str) -> Attachment {
            let netns = self.netns.path().join(id);
            std::fs::write(&netns, b"").unwrap();
            Attachment {
                container_id: id.into(),
                netns,
                ifname: "eth0".into(),
                pod: PodNetworkRef {
                    namespace: "default".into(),
                    name: "web".into(),
                    uid: "u-1".into(),
                },
                port_mappings: vec![
                    PortMapping {
                        host_port: 8080,
                        container_port: 80,
                        protocol: Protocol::Tcp,
                        host_ip: String::new(),
                    },
                    PortMapping {
                        host_port: 0,
                        container_port: 9090,
                        protocol: Protocol::Udp,
                        host_ip: String::new(),
                    },
                ],
            }
        }

        fn cache_file(&self, network: &str, id: &str) -> PathBuf {
            self.cache
                .path()
                .join(format!("results/{network}-{id}-eth0"))
        }
    }

    #[tokio::test]
    async fn add_threads_results_and_injects_names_and_port_mappings() {
        let s = Setup::new();
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, FakeExec::default());
        let att = s.attachment("c1");
        let result = cni.add(&att).await.unwrap();
        assert_eq!(
            result.pod_ips(),
            ["10.244.1.2".parse::<std::net::IpAddr>().unwrap()]
        );

        let calls = cni.exec.calls();
        let order: Vec<_> = calls.iter().map(|c| c.short()).collect();
        assert_eq!(
            order,
            ["loopback ADD", "bridge ADD", "portmap ADD", "tuning ADD"]
        );

        let lo = &calls[0];
        assert_eq!(lo.env["CNI_IFNAME"], "lo");
        assert_eq!(
            lo.stdin,
            json!({"type": "loopback", "name": "cni-loopback", "cniVersion": "0.4.0"})
        );
        let bridge = &calls[1];
        let netns = att.netns.to_string_lossy();
        let want_env: HashMap<String, String> = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", &*netns),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u-1",
            ),
            ("CNI_PATH", &format!("/nonexistent:{}", s.bin.path().display())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(bridge.env, want_env);
        assert_eq!(bridge.stdin["name"], "testnet");
        assert_eq!(bridge.stdin["cniVersion"], "0.4.0");
        assert_eq!(bridge.stdin["bridge"], "rk0");
        assert!(bridge.stdin.get("prevResult").is_none());
        assert!(bridge.stdin.get("runtimeConfig").is_none());

        let portmap = &calls[2];
        let bridge_result = result.to_json();
        assert_eq!(&portmap.stdin["prevResult"], bridge_result);
        assert_eq!(
            portmap.stdin["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        );
        let tuning = &calls[3];
        assert_eq!(&tuning.stdin["prevResult"], bridge_result);
        assert_eq!(tuning.stdin["runtimeConfig"], json!({"keep": "me"}));

        let cached: Value =
            serde_json::from_slice(&std::fs::read(s.cache_file("testnet", "c1")).unwrap()).unwrap();
        assert_eq!(&cached["result"], bridge_result);
        assert_eq!(cached["config"]["plugins"][1]["type"], "portmap");
        assert_eq!(cached["cniArgs"], want_env["CNI_ARGS"]);
        assert_eq!(cached["netns"], *netns);
        assert_eq!(cached["portMappings"][0]["hostPort"], 8080);
    }

    #[tokio::test]
    async fn del_uses_the_cached_config_and_result_after_the_config_changed() {
        let s = Setup::new();
        let old = s.cni(BRIDGE_PORTMAP_TUNING, FakeExec::default());
        let att = s.attachment("c1");
        let result = old.add(&att).await.unwrap();
        drop(old);

        // A restart with another config, even another network name.
        let new = s.cni(
            r#"{"cniVersion":"1.0.0","name":"othernet","plugins":[{"type":"ptp"}]}"#,
            FakeExec::default(),
        );
        let mut del = att.clone();
        del.port_mappings.clear();
        del.netns = PathBuf::new();
        new.del(&del).await.unwrap();
        let calls = new.exec.calls();
        let order: Vec<_> = calls.iter().map(|c| c.short()).collect();
        assert_eq!(
            order,
            ["tuning DEL", "portmap DEL", "bridge DEL", "loopback DEL"]
        );
        for c in &calls[..3] {
            assert_eq!(&c.stdin["prevResult"], result.to_json(), "{}", c.short());
            assert_eq!(c.stdin["name"], "testnet");
            assert_eq!(c.stdin["cniVersion"], "0.4.0");
            assert_eq!(
                c.env["CNI_NETNS"],
                att.netns.to_string_lossy(),
                "cached netns"
            );
        }
        assert_eq!(
            calls[1].stdin["runtimeConfig"]["portMappings"][0]["hostPort"], 8080,
            "cached port mappings"
        );
        assert!(calls[3].stdin.get("prevResult").is_none());
        assert!(!Path::exists(&s.cache_file("testnet", "c1")));

        // DEL again: no cache, the current config, nothing fails.
        new.del(&del).await.unwrap();
        let again: Vec<_> = new.exec.short_calls()[4..].to_vec();
        assert!(again.is_empty(), "already deleted: {again:?}");

        // After another restart: no cache, nothing remembered, so the current config's
        // plugins run, and nothing fails.
        let restarted = s.cni(
            r#"{"cniVersion":"1.0.0","name":"othernet","plugins":[{"type":"ptp"}]}"#,
            FakeExec::default(),
        );
        restarted.del(&del).await.unwrap();
        assert_eq!(restarted.exec.short_calls(), ["ptp DEL", "loopback DEL"]);
    }

    #[tokio::test]
    async fn a_repeated_del_runs_plugins_only_after_a_failure_or_a_new_add() {
        let s = Setup::new();
        let exec = FakeExec::default();
        exec.fail("portmap DEL", 11, "iptables locked");
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, exec);
        let att = s.attachment("c7");
        cni.add(&att).await.unwrap();
        let added = cni.exec.calls().len();
        let dels = |cni: &Cni<FakeExec>, from: usize| cni.exec.short_calls()[from..].to_vec();

        // A failed DEL keeps its cache entry and is not remembered: the retry runs again.
        cni.del(&att).await.unwrap_err();
        let first = dels(&cni, added);
        assert_eq!(first.len(), 4, "{first:?}");
        cni.exec.heal("portmap DEL");
        cni.del(&att).await.unwrap();
        assert_eq!(dels(&cni, added + 4), first);
        // containerd's second teardown of the same sandbox: nothing left to run.
        let done = cni.exec.calls().len();
        cni.del(&att).await.unwrap();
        assert_eq!(cni.exec.calls().len(), done);
        // Added again (the same id), so deleted again in full.
        cni.add(&att).await.unwrap();
        let readded = cni.exec.calls().len();
        cni.del(&att).await.unwrap();
        assert_eq!(dels(&cni, readded), first);
    }

    #[tokio::test]
    async fn del_without_cache_passes_no_prev_result_and_an_empty_netns_when_gone() {
        let s = Setup::new();
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, FakeExec::default());
        let mut att = s.attachment("c2");
        std::fs::remove_file(&att.netns).unwrap();
        att.port_mappings.truncate(1);
        cni.del(&att).await.unwrap();
        let calls = cni.exec.calls();
        assert_eq!(calls.len(), 4);
        for c in &calls {
            assert_eq!(c.env["CNI_NETNS"], "", "{}", c.short());
            assert!(c.stdin.get("prevResult").is_none());
        }
        assert_eq!(
            calls[1].stdin["runtimeConfig"]["portMappings"][0]["containerPort"],
            80
        );
    }

    #[tokio::test]
    async fn a_failed_add_is_rolled_back_in_reverse_and_not_cached() {
        let s = Setup::new();
        let exec = FakeExec::default();
        exec.fail("portmap ADD", 11, "iptables locked");
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, exec);
        let err = cni.add(&s.attachment("c3")).await.unwrap_err();
        let CniError::Plugin {
            plugin,
            command,
            container_id,
            code,
            msg,
            ..
        } = &err
        else {
            panic!("{err}");
        };
        assert_eq!(
            (
                plugin.as_str(),
                *command,
                container_id.as_str(),
                *code,
                msg.as_str()
            ),
            ("portmap", Command::Add, "c3", 11, "iptables locked")
        );
        let calls = cni.exec.calls();
        let order: Vec<_> = calls.iter().map(|c| c.short()).collect();
        assert_eq!(
            order,
            [
                "loopback ADD",
                "bridge ADD",
                "portmap ADD",
                "portmap DEL",
                "bridge DEL",
                "loopback DEL"
            ]
        );
        // The rollback hands the bridge's result on, as a DEL after the ADD would.
        assert_eq!(calls[3].stdin["prevResult"], calls[2].stdin["prevResult"]);
        assert_eq!(calls[4].stdin["prevResult"], calls[2].stdin["prevResult"]);
        assert!(!Path::exists(&s.cache_file("testnet", "c3")));
        assert!(
            !Path::exists(&s.cache.path().join("results"))
                || std::fs::read_dir(s.cache.path().join("results"))
                    .unwrap()
                    .next()
                    .is_none()
        );
    }

    #[tokio::test]
    async fn a_missing_plugin_fails_with_not_found_and_rolls_back_the_others() {
        let s = Setup::new();
        let cni = s.cni(
            r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"bridge"},{"type":"nosuch"}]}"#,
            FakeExec::default(),
        );
        let err = cni.add(&s.attachment("c4")).await.unwrap_err();
        let CniError::PluginNotFound { plugin, searched } = &err else {
            panic!("{err}");
        };
        assert_eq!(plugin, "nosuch");
        assert_eq!(searched.len(), 2);
        assert_eq!(
            cni.exec.short_calls(),
            ["loopback ADD", "bridge ADD", "bridge DEL", "loopback DEL"]
        );
    }

    #[tokio::test]
    async fn a_final_result_without_a_usable_shape_is_rolled_back() {
        let s = Setup::new();
        let exec = FakeExec::default();
        exec.fail_with(
            "tuning ADD",
            PluginOutput {
                exit_code: Some(0),
                stdout: br#"{"cniVersion":"0.4.0","ips":[{"address":"garbage"}]}"#.to_vec(),
                stderr: Vec::new(),
            },
        );
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, exec);
        let err = cni.add(&s.attachment("c5")).await.unwrap_err();
        assert!(
            matches!(&err, CniError::BadResult { plugin, .. } if plugin == "tuning"),
            "{err}"
        );
        let calls = cni.exec.short_calls();
        assert_eq!(
            calls[4..],
            ["tuning DEL", "portmap DEL", "bridge DEL", "loopback DEL"]
        );
    }

    #[tokio::test]
    async fn check_runs_in_order_with_the_cached_result_and_needs_an_add() {
        let s = Setup::new();
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, FakeExec::default());
        let att = s.attachment("c6");
        let err = cni.check(&att).await.unwrap_err();
        assert!(matches!(err, CniError::NotAttached { .. }), "{err}");
        assert_eq!(err.code(), 3);
        let result = cni.add(&att).await.unwrap();
        cni.check(&att).await.unwrap();
        let calls = cni.exec.calls();
        let order: Vec<_> = calls[4..].iter().map(|c| c.short()).collect();
        assert_eq!(
            order,
            [
                "loopback CHECK",
                "bridge CHECK",
                "portmap CHECK",
                "tuning CHECK"
            ]
        );
        for c in &calls[5..] {
            assert_eq!(&c.stdin["prevResult"], result.to_json());
        }

        let exec = FakeExec::default();
        exec.fail("portmap CHECK", 999, "chain missing");
        let failing = s.cni(BRIDGE_PORTMAP_TUNING, exec);
        let err = failing.check(&att).await.unwrap_err();
        assert!(
            err.to_string().contains("portmap CHECK for container c6"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn disable_check_skips_the_plugins() {
        let s = Setup::new();
        let cni = s.cni(
            r#"{"cniVersion":"1.0.0","name":"n","disableCheck":true,"plugins":[{"type":"bridge"}]}"#,
            FakeExec::default(),
        );
        let att = s.attachment("c7");
        cni.add(&att).await.unwrap();
        cni.check(&att).await.unwrap();
        assert_eq!(cni.exec.short_calls(), ["loopback ADD", "bridge ADD"]);
    }

    #[tokio::test]
    async fn a_failed_del_runs_every_plugin_and_keeps_the_cache_for_a_retry() {
        let s = Setup::new();
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, FakeExec::default());
        let att = s.attachment("c8");
        cni.add(&att).await.unwrap();
        cni.exec.fail("portmap DEL", 5, "iptables: resource busy");
        let err = cni.del(&att).await.unwrap_err();
        assert!(err.to_string().contains("portmap DEL"), "{err}");
        assert_eq!(
            cni.exec.short_calls()[4..],
            ["tuning DEL", "portmap DEL", "bridge DEL", "loopback DEL"]
        );
        assert!(Path::exists(&s.cache_file("testnet", "c8")));
    }

    #[tokio::test]
    async fn loopback_del_failures_are_ignored() {
        let s = Setup::new();
        let exec = FakeExec::default();
        exec.fail("loopback DEL", 5, "netns busy");
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, exec);
        cni.del(&s.attachment("c9")).await.unwrap();
    }

    #[tokio::test]
    async fn bad_ids_and_interface_names_are_refused_before_any_plugin_runs() {
        let s = Setup::new();
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, FakeExec::default());
        let mut att = s.attachment("ok");
        att.container_id = "../../etc".into();
        assert!(matches!(
            cni.add(&att).await,
            Err(CniError::InvalidAttachment { .. })
        ));
        let mut att = s.attachment("ok");
        att.ifname = "a-very-long-ifname0".into();
        assert!(matches!(
            cni.del(&att).await,
            Err(CniError::InvalidAttachment { .. })
        ));
        assert!(cni.exec.calls().is_empty());
    }

    #[tokio::test]
    async fn operations_on_one_container_are_serialised() {
        let s = Setup::new();
        let cni = Arc::new(s.cni(
            BRIDGE_PORTMAP_TUNING,
            FakeExec::with_delay(Duration::from_millis(20)),
        ));
        let att = s.attachment("same");
        let tasks: Vec<_> = (0..3)
            .map(|_| {
                let (cni, att) = (cni.clone(), att.clone());
                tokio::spawn(async move { cni.add(&att).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(
            cni.exec
                .max_in_flight
                .load(std::sync::atomic::Ordering::SeqCst),
            1
        );

        let other = Arc::new(s.cni(
            BRIDGE_PORTMAP_TUNING,
            FakeExec::with_delay(Duration::from_millis(50)),
        ));
        let tasks: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|id| {
                let (cni, att) = (other.clone(), s.attachment(id));
                tokio::spawn(async move { cni.add(&att).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(
            other
                .exec
                .max_in_flight
                .load(std::sync::atomic::Ordering::SeqCst),
            2
        );
    }

    #[tokio::test]
    async fn verify_plugins_checks_presence_and_versions() {
        let s = Setup::new();
        let cni = s.cni(BRIDGE_PORTMAP_TUNING, FakeExec::default());
        cni.verify_plugins().await.unwrap();
        let versions: Vec<_> = cni.exec.calls().iter().map(|c| c.short()).collect();
        assert_eq!(
            versions,
            [
                "loopback VERSION",
                "bridge VERSION",
                "portmap VERSION",
                "tuning VERSION"
            ]
        );
        assert_eq!(cni.exec.calls()[1].stdin, json!({"cniVersion": "0.4.0"}));

        let exec = FakeExec::default();
        exec.fail_with(
            "portmap VERSION",
            PluginOutput {
                exit_code: Some(0),
                stdout: br#"{"cniVersion":"0.3.1","supportedVersions":["0.1.0","0.3.1"]}"#.to_vec(),
                stderr: Vec::new(),
            },
        );
        let old = s.cni(BRIDGE_PORTMAP_TUNING, exec);
        let err = old.verify_plugins().await.unwrap_err();
        assert!(
            matches!(&err, CniError::IncompatibleVersion { plugin, wanted, .. } if plugin == "portmap" && wanted == "0.4.0"),
            "{err}"
        );
        let missing = s.cni(
            r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"macvlan"}]}"#,
            FakeExec::default(),
        );
        assert!(matches!(
            missing.verify_plugins().await,
            Err(CniError::PluginNotFound { .. })
        ));
    }

    #[test]
    fn protocols_parse_in_either_case_and_serialise_lowercase() {
        assert_eq!("TCP".parse::<Protocol>().unwrap(), Protocol::Tcp);
        assert_eq!("sctp".parse::<Protocol>().unwrap(), Protocol::Sctp);
        assert!("icmp".parse::<Protocol>().is_err());
        let m: PortMapping = serde_json::from_value(
            json!({"hostPort": 53, "containerPort": 53, "protocol": "UDP", "hostIP": "127.0.0.1"}),
        )
        .unwrap();
        assert_eq!(m.protocol, Protocol::Udp);
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"hostPort": 53, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"})
        );
        // containerd's spelling (go-cni's untagged struct) reads the same.
        let containerd: PortMapping = serde_json::from_value(
            json!({"HostPort": 53, "ContainerPort": 53, "Protocol": "udp", "HostIP": "127.0.0.1"}),
        )
        .unwrap();
        assert_eq!(containerd, m);
    }
}
