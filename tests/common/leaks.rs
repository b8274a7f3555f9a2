//! The leak check of a test's pods. While they exist, a [`Recorder`] notes what they have
//! on the node (UIDs and names, sandbox ids, each sandbox's netns, host veth and IPs, read
//! from the CNI result cache); once they are gone, [`check`] lists whatever of it is still
//! there: sandboxes and containers in containerd, netns, veths, host-local reservations,
//! CNI cache entries, NAT rules, mounts under the pod dirs, the pod and log dirs, pod
//! cgroups. The parsers are plain functions of text, unit-tested in `tests/leaks.rs`.
//! A check that cannot look (the runtime unreachable, `iptables-save` failing, a directory
//! that cannot be read) panics: it never reports "nothing left".

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use rkubelet::cri::{Cri, CriClient, Endpoint, api};
use rkubelet::inspect::{Locations, cni_store};
use rkubelet::procfs::ProcFs;

use super::pods::{containers_in, sandboxes_in};
use super::{cri, cri_at, runtime_endpoint};

/// host-local's data dir (both CNI configs of the repository use it).
const HOST_LOCAL_DIR: &str = "/var/lib/cni/networks";
/// libcni's dir: the runtime's CNI result cache is under `results`.
const LIBCNI_DIR: &str = "/var/lib/cni";
/// How often the recorder looks at the runtime.
const RECORD_EVERY: Duration = Duration::from_millis(250);
/// How long the check waits for what the agent removes just after the sandboxes.
const SETTLE: Duration = Duration::from_secs(3);

/// One sandbox of a test's pod, as recorded while it existed.
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    /// The pod's UID.
    pub uid: String,
    /// Its netns path, host veths and IPs, from its CNI result (none for host network).
    pub netns: Option<String>,
    pub veths: Vec<String>,
    pub ips: Vec<String>,
    /// Whether its CNI result was read.
    pub network_known: bool,
}

/// What a test's pods had on the node.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// Pod UID to name.
    pub pods: BTreeMap<String, String>,
    /// Sandbox id to what it had.
    pub sandboxes: BTreeMap<String, Sandbox>,
    /// Why the recorder's last look failed, if it did: the record may then miss sandboxes,
    /// and the check fails rather than pass on what it never saw.
    pub unrecorded: Option<String>,
}

impl Record {
    fn sandbox_ids(&self) -> BTreeSet<String> {
        self.sandboxes.keys().cloned().collect()
    }

    /// `pod <name> (<uid>)`.
    fn pod(&self, uid: &str) -> String {
        let name = self.pods.get(uid).map_or("?", String::as_str);
        format!("pod {name} ({uid})")
    }

    /// `sandbox <id> of pod <name> (<uid>), IP <ips>`.
    fn sandbox(&self, id: &str) -> String {
        let Some(s) = self.sandboxes.get(id) else {
            return format!("sandbox {id}");
        };
        let ips = if s.ips.is_empty() {
            String::new()
        } else {
            format!(", IP {}", s.ips.join(" "))
        };
        format!("sandbox {id} of {}{ips}", self.pod(&s.uid))
    }
}

/// Records the sandboxes labelled `rk-test=<label>` every 250 ms, on a thread of its own,
/// until stopped.
pub struct Recorder {
    /// What was recorded so far (the pods' creation adds their UIDs too).
    pub record: Arc<Mutex<Record>>,
    stop: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Recorder {
    /// Starts recording the pods labelled `rk-test=<label>` of the agent whose root dir is
    /// `root_dir`.
    pub fn start(label: &str, root_dir: &Path) -> Self {
        Self::start_in(runtime_endpoint(), label, root_dir)
    }

    /// Starts recording, through the runtime at `endpoint`, the pods labelled
    /// `rk-test=<label>` of the agent whose root dir is `root_dir`.
    pub fn start_in(endpoint: Endpoint, label: &str, root_dir: &Path) -> Self {
        let record = Arc::new(Mutex::new(Record::default()));
        let (tx, rx) = mpsc::channel();
        let (shared, label) = (Arc::clone(&record), label.to_owned());
        let at = locations(root_dir);
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            // The client on this thread's runtime, which drives its connection (one made
            // on the test's runtime stalls while the test's thread waits for this one).
            let cri = {
                let _on = rt.enter();
                cri_at(endpoint)
            };
            loop {
                rt.block_on(record_once(&cri, &label, &at, &shared));
                if rx.recv_timeout(RECORD_EVERY) != Err(mpsc::RecvTimeoutError::Timeout) {
                    break;
                }
            }
            rt.block_on(record_once(&cri, &label, &at, &shared));
        });
        Self {
            record,
            stop: Some((tx, handle)),
        }
    }

    /// Notes a pod the test created.
    pub fn pod(&self, uid: &str, name: &str) {
        lock(&self.record)
            .pods
            .insert(uid.to_owned(), name.to_owned());
    }

    /// Stops recording, after a last look.
    pub fn stop(&mut self) {
        if let Some((tx, handle)) = self.stop.take() {
            let _ = tx.send(());
            if handle.join().is_err() {
                lock(&self.record).unrecorded = Some("the recorder's thread panicked".into());
            }
        }
    }
}

impl Recorder {
    /// Stops recording and fails the test if the recorded pods, gone by now, left anything
    /// behind on the node of the agent whose root dir is `root_dir`.
    pub async fn assert_nothing_left(mut self, root_dir: &Path) {
        self.stop();
        let record = lock(&self.record).clone();
        assert!(!record.sandboxes.is_empty(), "no sandbox was recorded");
        let left = check_once_removed(&cri(), &record, root_dir, Duration::from_secs(30)).await;
        assert!(left.is_empty(), "left behind:\n  {}", left.join("\n  "));
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock(record: &Mutex<Record>) -> std::sync::MutexGuard<'_, Record> {
    rkubelet::lock::lock(record)
}

fn locations(root_dir: &Path) -> Locations {
    Locations {
        root_dir: root_dir.to_owned(),
        runtime_cni_conf_dir: PathBuf::new(),
        libcni_dir: LIBCNI_DIR.into(),
        proc: ProcFs::default(),
    }
}

/// One look: the test's sandboxes, and the network of those not known yet. A failed look
/// is noted in the record until one succeeds.
async fn record_once(cri: &CriClient, label: &str, at: &Locations, record: &Mutex<Record>) {
    let listed = cri
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: [("rk-test".to_owned(), label.to_owned())].into(),
                ..Default::default()
            }),
        })
        .await;
    let listed = match listed {
        Ok(listed) => {
            lock(record).unrecorded = None;
            listed
        }
        Err(e) => {
            lock(record).unrecorded = Some(format!("ListPodSandbox at {}: {e}", cri.endpoint()));
            return;
        }
    };
    for sandbox in listed.items {
        let Some(meta) = sandbox.metadata else {
            continue;
        };
        let known = {
            let mut record = lock(record);
            record.pods.insert(meta.uid.clone(), meta.name.clone());
            let entry = record.sandboxes.entry(sandbox.id.clone()).or_default();
            entry.uid.clone_from(&meta.uid);
            entry.network_known
        };
        if known {
            continue;
        }
        // Until its CNI result is there (never, with host network), look again next time.
        if let Some(cached) = cni_store::cached(at, &sandbox.id, "eth0").await {
            let network = network_of(&cached.config, &cached.result);
            let mut record = lock(record);
            let entry = record.sandboxes.entry(sandbox.id).or_default();
            entry.netns = network.netns;
            entry.veths = network.veths;
            entry.ips = network.ips;
            entry.network_known = true;
        }
    }
}

/// A sandbox's network as its CNI result tells it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Network {
    /// The netns path.
    pub netns: Option<String>,
    /// The host ends of its veths (interfaces outside the netns that are not a bridge of
    /// the config list).
    pub veths: Vec<String>,
    /// Its addresses, without prefix length.
    pub ips: Vec<String>,
}

/// The network of a CNI result (`result`) of a config list (`config`).
pub fn network_of(config: &serde_json::Value, result: &serde_json::Value) -> Network {
    let bridges: BTreeSet<&str> = config["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["bridge"].as_str())
        .collect();
    let interfaces = result["interfaces"].as_array().into_iter().flatten();
    let mut network = Network::default();
    for i in interfaces {
        let name = i["name"].as_str().unwrap_or_default();
        match i["sandbox"].as_str().filter(|s| !s.is_empty()) {
            Some(netns) => network.netns = Some(netns.to_owned()),
            None if !bridges.contains(name) && !name.is_empty() => {
                network.veths.push(name.to_owned());
            }
            None => {}
        }
    }
    network.ips = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .map(|a| a.split('/').next().unwrap_or(a).to_owned())
        .collect();
    network
}

/// Waits (for `within` at most) until the recorded pods' sandboxes are removed from `cri`,
/// the last step of a pod's teardown, then [`check`]s.
pub async fn check_once_removed(
    cri: &CriClient,
    record: &Record,
    root_dir: &Path,
    within: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    for uid in record.pods.keys() {
        while Instant::now() < deadline && !sandboxes_in(cri, uid).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    check(cri, record, root_dir).await
}

/// Waits (3 s at most) until nothing recorded of the test's pods is left on the node (in
/// `cri`, on disk, in the NAT table); answers what is left then, one line each. Panics if
/// the recorder could not look, or if the check itself still cannot at the end.
pub async fn check(cri: &CriClient, record: &Record, root_dir: &Path) -> Vec<String> {
    if let Some(why) = &record.unrecorded {
        panic!("the leak check cannot run: the pods' sandboxes were not recorded: {why}");
    }
    let deadline = Instant::now() + SETTLE;
    loop {
        match left_behind(cri, record, root_dir).await {
            Ok(left) if left.is_empty() || Instant::now() >= deadline => return left,
            Err(why) if Instant::now() >= deadline => panic!("the leak check cannot run: {why}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// What is left of the recorded pods, now; or why it cannot tell (`iptables-save` failed:
/// it does now and then while another process changes the rules).
async fn left_behind(
    cri: &CriClient,
    record: &Record,
    root_dir: &Path,
) -> Result<Vec<String>, String> {
    let mut left = Vec::new();
    let pod = |uid: &str| record.pod(uid);
    for uid in record.pods.keys() {
        for s in sandboxes_in(cri, uid).await {
            left.push(format!("containerd sandbox {} of {}", s.id, pod(uid)));
        }
        for c in containers_in(cri, uid, None).await {
            let name = c.metadata.map(|m| m.name).unwrap_or_default();
            left.push(format!(
                "containerd container {} ({name}) of {}",
                c.id,
                pod(uid)
            ));
        }
    }
    let (copy, root) = (record.clone(), root_dir.to_owned());
    let mut on_disk = tokio::task::spawn_blocking(move || on_disk(&root, &copy))
        .await
        .expect("leak check");
    left.append(&mut on_disk);
    let ids = record.sandbox_ids();
    if !ids.is_empty() {
        let save = tokio::process::Command::new("iptables-save")
            .args(["-t", "nat"])
            .kill_on_drop(true)
            .output()
            .await;
        left.extend(nat_rules_left(save, &ids)?);
    }
    Ok(left)
}

/// The NAT rules naming one of `ids`, from what `iptables-save -t nat` gave (`save`), one
/// line each; why not, if it did not run or failed.
pub fn nat_rules_left(
    save: std::io::Result<std::process::Output>,
    ids: &BTreeSet<String>,
) -> Result<Vec<String>, String> {
    let out = save.map_err(|e| format!("iptables-save -t nat: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "iptables-save -t nat ended with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ));
    }
    let save = String::from_utf8_lossy(&out.stdout);
    Ok(rules_naming(&save, ids)
        .into_iter()
        .map(|rule| format!("iptables nat rule {rule}"))
        .collect())
}

/// What is left on disk, in /proc and in /sys of the recorded pods and sandboxes.
fn on_disk(root: &Path, record: &Record) -> Vec<String> {
    let ids = record.sandbox_ids();
    let mut left = Vec::new();
    for (id, s) in &record.sandboxes {
        if let Some(netns) = s.netns.as_ref().filter(|n| Path::new(n).exists()) {
            left.push(format!("netns {netns} of {}", record.sandbox(id)));
        }
        for veth in &s.veths {
            // A result cached for a single plugin (an ADD cut short) may name the bridge
            // without its config saying it is one: the bridge stays, of course.
            let link = Path::new("/sys/class/net").join(veth);
            if link.exists() && !link.join("bridge").exists() {
                left.push(format!("host veth {veth} of {}", record.sandbox(id)));
            }
        }
    }
    left.extend(reservations_left(Path::new(HOST_LOCAL_DIR), record));
    for dir in [
        root.join("cni").join("results"),
        Path::new(LIBCNI_DIR).join("results"),
    ] {
        for name in file_names(&dir) {
            if cache_entry_sandbox(&name).is_some_and(|id| ids.contains(id)) {
                left.push(format!("CNI cache entry {}", dir.join(name).display()));
            }
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_else(|e| panic!("the leak check cannot read /proc/self/mountinfo: {e}"));
    for uid in record.pods.keys() {
        let pod_dir = root.join("pods").join(uid);
        for m in mounts_under(&mountinfo, &pod_dir) {
            left.push(format!("mount {m}"));
        }
        if pod_dir.exists() {
            left.push(format!("pod directory {}", pod_dir.display()));
        }
        for name in file_names(&root.join("logs")) {
            if name.ends_with(&format!("_{uid}")) {
                left.push(format!(
                    "pod log directory {}",
                    root.join("logs").join(name).display()
                ));
            }
        }
    }
    left.extend(pod_cgroups_left(Path::new("/sys/fs/cgroup"), &record.pods));
    left.extend(csi_left(root, &mountinfo));
    left
}

/// CSI volumes still staged under `<root>/plugins/kubernetes.io/csi` and registration
/// sockets under `<root>/plugins_registry` (the tests' drivers are stopped before their
/// pods are looked at).
fn csi_left(root: &Path, mountinfo: &str) -> Vec<String> {
    let staged = root.join("plugins").join("kubernetes.io").join("csi");
    let mut left: Vec<String> = mounts_under(mountinfo, &staged)
        .into_iter()
        .map(|m| format!("CSI staging mount {m}"))
        .collect();
    let registry = root.join("plugins_registry");
    for name in file_names(&registry) {
        left.push(format!(
            "plugin registration socket {}",
            registry.join(name).display()
        ));
    }
    left
}

/// The names in a directory: none if it does not exist (or no longer: a cgroup removed
/// meanwhile) or is a file (cgroup v2's files beside its hierarchy); panics if it cannot
/// be read.
fn file_names(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Vec::new()
        }
        Err(e) => cannot_read(dir, &e),
        Ok(entries) => entries
            .map(|e| e.unwrap_or_else(|e| cannot_read(dir, &e)))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
    }
}

fn cannot_read(path: &Path, e: &std::io::Error) -> ! {
    panic!("the leak check cannot read {}: {e}", path.display())
}

/// A file's text: empty if it does not exist (or no longer); panics if it cannot be read.
fn read_or_empty(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => cannot_read(path, &e),
        Ok(text) => text,
    }
}

/// host-local reservations (`<dir>/<network>/<ip>`) held by one of the recorded sandboxes.
fn reservations_left(dir: &Path, record: &Record) -> Vec<String> {
    let mut left = Vec::new();
    for network in file_names(dir) {
        for ip in file_names(&dir.join(&network)) {
            if ip.parse::<std::net::IpAddr>().is_err() {
                continue;
            }
            let path = dir.join(&network).join(&ip);
            let text = read_or_empty(&path);
            let holder = reservation_holder(&text).filter(|h| record.sandboxes.contains_key(*h));
            if let Some(holder) = holder {
                let by = record.sandbox(holder);
                left.push(format!(
                    "host-local reservation {} held by {by}",
                    path.display()
                ));
            }
        }
    }
    left
}

/// The sandbox id a host-local reservation file holds: its first line (newer host-local
/// writes the interface name on a second line).
pub fn reservation_holder(text: &str) -> Option<&str> {
    text.lines().next().map(str::trim).filter(|l| !l.is_empty())
}

/// The sandbox id in a CNI cache file name, `<network>-<sandbox id>-<ifname>` (the network
/// name may hold dashes, the id and the interface name do not), or in the name of its
/// temporary, `.<entry>.rkubelet-tmp` (`rkubelet::atomic_file`).
pub fn cache_entry_sandbox(name: &str) -> Option<&str> {
    let name = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(rkubelet::atomic_file::TEMP_SUFFIX))
        .unwrap_or(name);
    let (rest, _ifname) = name.rsplit_once('-')?;
    let (_network, id) = rest.rsplit_once('-')?;
    (!id.is_empty()).then_some(id)
}

/// The mount points of `/proc/self/mountinfo` text at or under `dir`, unescaped.
pub fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|m| Path::new(m).starts_with(dir))
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a blank, `\011`, `\012`, `\134`).
pub fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The pod UID a cgroup directory's name stands for: `pod<uid>` (cgroupfs driver) or
/// `kubepods[-<qos>]-pod<uid with _ for ->.slice` (systemd driver).
pub fn pod_uid_of_cgroup(name: &str) -> Option<String> {
    if let Some(uid) = name.strip_prefix("pod") {
        return (!uid.is_empty()).then(|| uid.to_owned());
    }
    let slice = name.strip_prefix("kubepods")?.strip_suffix(".slice")?;
    let (_, uid) = slice.split_once("pod")?;
    (!uid.is_empty()).then(|| uid.replace('_', "-"))
}

/// Pod cgroups of `uids` in any hierarchy under `cgroup_root` (`<h>/kubepods*/…/pod<uid>`,
/// down to the QoS level).
fn pod_cgroups_left(cgroup_root: &Path, uids: &BTreeMap<String, String>) -> Vec<String> {
    let mut left = Vec::new();
    for hierarchy in file_names(cgroup_root) {
        let h = cgroup_root.join(hierarchy);
        let tops = file_names(&h)
            .into_iter()
            .filter(|n| n.starts_with("kubepods"));
        let mut dirs: Vec<PathBuf> = tops.map(|n| h.join(n)).collect();
        let mut i = 0;
        while i < dirs.len() {
            let dir = dirs[i].clone();
            i += 1;
            for name in file_names(&dir) {
                let path = dir.join(&name);
                if !path.is_dir() {
                    continue;
                }
                match pod_uid_of_cgroup(&name) {
                    Some(uid) if uids.contains_key(&uid) => {
                        left.push(format!("pod cgroup {}", path.display()));
                    }
                    Some(_) => {}
                    None if name.starts_with("kubepods") || is_qos(&name) => dirs.push(path),
                    None => {}
                }
            }
        }
    }
    left
}

fn is_qos(name: &str) -> bool {
    name == "burstable" || name == "besteffort"
}

/// The rules (`-A` lines of `iptables-save` output) that name one of `ids` (portmap's and
/// bridge's comments carry the sandbox id).
pub fn rules_naming<'a>(save: &'a str, ids: &BTreeSet<String>) -> Vec<&'a str> {
    save.lines()
        .filter(|l| l.starts_with("-A "))
        .filter(|l| ids.iter().any(|id| l.contains(id.as_str())))
        .collect()
}

/// The node's pod network state as a whole: every host-local reservation (`<network>/<ip>`
/// and its holder), named netns and host interface. Compared before and after a test, it
/// finds leaks of sandboxes the [`Recorder`] never saw: one whose creation a crash or a
/// timeout cut short is never listed by the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeNetwork {
    /// `<network>/<ip> held by <sandbox id>`.
    pub reservations: BTreeSet<String>,
    /// Named netns (the cluster's containerd keeps its own under its state dir).
    pub netns: BTreeSet<String>,
    /// Host veths (names under /sys/class/net).
    pub interfaces: BTreeSet<String>,
}

impl NodeNetwork {
    /// The state now.
    pub fn now() -> Self {
        let dir = Path::new(HOST_LOCAL_DIR);
        let mut reservations = BTreeSet::new();
        for network in file_names(dir) {
            for ip in file_names(&dir.join(&network)) {
                if ip.parse::<std::net::IpAddr>().is_err() {
                    continue;
                }
                let text = read_or_empty(&dir.join(&network).join(&ip));
                let holder = reservation_holder(&text).unwrap_or("?");
                reservations.insert(format!("{network}/{ip} held by {holder}"));
            }
        }
        Self {
            reservations,
            netns: netns_dirs().iter().flat_map(|d| file_names(d)).collect(),
            interfaces: file_names(Path::new("/sys/class/net"))
                .into_iter()
                .filter(|name| name.starts_with("veth"))
                .collect(),
        }
    }

    /// What is in `self` and was not in `before`.
    pub fn since(&self, before: &Self) -> Self {
        let new = |now: &BTreeSet<String>, then: &BTreeSet<String>| {
            now.difference(then).cloned().collect::<BTreeSet<_>>()
        };
        Self {
            reservations: new(&self.reservations, &before.reservations),
            netns: new(&self.netns, &before.netns),
            interfaces: new(&self.interfaces, &before.interfaces),
        }
    }

    /// Nothing at all.
    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty() && self.netns.is_empty() && self.interfaces.is_empty()
    }
}

/// Where named netns are: the system's dir and the cluster's containerd's
/// (`netns_mounts_under_state_dir`).
fn netns_dirs() -> [PathBuf; 2] {
    [
        "/var/run/netns".into(),
        super::state_dir().join("containerd/state/io.containerd.grpc.v1.cri/netns"),
    ]
}
