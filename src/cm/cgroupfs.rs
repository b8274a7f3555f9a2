//! Cgroups as directories and control files ([`FsCgroups`]): made, set, listed, emptied
//! (processes killed) and removed at a [`CgroupPath`] in every mounted cgroup v1
//! hierarchy, or in the unified v2 tree with its controllers enabled down the path. Both
//! drivers write their settings here, so the kernel gets the same values from either.
//! The cgroupfs driver ([`CgroupfsManager`], the kubelet's `cgroupManagerImpl` with
//! `libcontainerCgroupfs`) is this and nothing else: a cgroup's path is its name. The
//! file system sits behind [`CgroupFs`]; [`LinuxCgroupFs`] is the real one. The work is
//! blocking: the drivers run it on tokio's blocking threads ([`blocking`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::cgroup_manager::{CgroupDriver, CgroupManager, CgroupName, CgroupPath, CmError};
use super::resource_config::{ResourceConfig, hugepage_unit};

/// The cgroup file system: directories and their control files.
pub trait CgroupFs: Send + Sync + 'static {
    /// Creates a directory and its missing parents.
    ///
    /// # Errors
    /// As `mkdir`.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty directory (a cgroup without processes or children).
    ///
    /// # Errors
    /// As `rmdir`.
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// Whether the path exists.
    fn exists(&self, path: &Path) -> bool;
    /// Reads a control file.
    ///
    /// # Errors
    /// As `read`.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Writes a control file.
    ///
    /// # Errors
    /// As `write`; the kernel refuses bad values with `EINVAL`.
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// The names of the subdirectories (child cgroups).
    ///
    /// # Errors
    /// As `readdir`.
    fn subdirs(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Sends SIGKILL to a process.
    ///
    /// # Errors
    /// As `kill(2)`; a process already gone is not an error.
    fn kill(&self, pid: i32) -> io::Result<()>;
}

/// [`CgroupFs`] on the host's `/sys/fs/cgroup`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxCgroupFs;

impl CgroupFs for LinuxCgroupFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn read(&self, path: &Path) -> io::Result<String> {
        crate::procfs::read_pseudo_file(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        std::fs::write(path, value)
    }

    fn subdirs(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                out.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(out)
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        use nix::sys::signal::{Signal, kill};
        match kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(io::Error::from(e)),
        }
    }
}

/// One mounted cgroup v1 hierarchy, or the v2 tree of a hybrid host (no controllers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted (`/sys/fs/cgroup/cpu`).
    pub mount: PathBuf,
    /// Its controllers (`cpu`, `memory`, `name=systemd`).
    pub controllers: Vec<String>,
}

impl Hierarchy {
    fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// How cgroups are mounted on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup v1 (legacy or hybrid): one hierarchy per controller set.
    V1(Vec<Hierarchy>),
    /// cgroup v2 only: the unified tree mounted here.
    V2(PathBuf),
}

/// Super options of a v1 cgroup mount that are not controllers.
const NOT_CONTROLLERS: &[&str] = &["rw", "ro", "clone_children", "noprefix", "xattr"];

impl CgroupLayout {
    /// The layout from `/proc/self/mountinfo`: the mounts of whole hierarchies (root `/`).
    #[must_use]
    pub fn from_mountinfo(text: &str) -> Option<Self> {
        let mut v1: Vec<Hierarchy> = Vec::new();
        let mut v2: Option<PathBuf> = None;
        for line in text.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (Some(root), Some(mount), Some(fstype)) = (left.get(3), left.get(4), right.first())
            else {
                continue;
            };
            if *root != "/" {
                continue;
            }
            match *fstype {
                "cgroup" => {
                    let mut controllers: Vec<String> = right
                        .get(2)
                        .unwrap_or(&"")
                        .split(',')
                        .filter(|o| !NOT_CONTROLLERS.contains(o) && !o.contains("release_agent"))
                        .map(str::to_owned)
                        .collect();
                    controllers.sort();
                    if !v1.iter().any(|h| h.controllers == controllers) {
                        v1.push(Hierarchy {
                            mount: PathBuf::from(mount),
                            controllers,
                        });
                    }
                }
                "cgroup2" if v2.is_none() => v2 = Some(PathBuf::from(mount)),
                _ => {}
            }
        }
        match (v1.is_empty(), v2) {
            (true, Some(unified)) => Some(Self::V2(unified)),
            (true, None) => None,
            (false, unified) => {
                v1.extend(unified.map(|mount| Hierarchy {
                    mount,
                    controllers: Vec::new(),
                }));
                Some(Self::V1(v1))
            }
        }
    }

    /// Where the files of `controller` are: its v1 hierarchy's mount, or the unified tree.
    #[must_use]
    pub fn mount_of(&self, controller: &str) -> Option<&Path> {
        match self {
            Self::V1(hierarchies) => hierarchies
                .iter()
                .find(|h| h.has(controller))
                .map(|h| h.mount.as_path()),
            Self::V2(unified) => Some(unified),
        }
    }
}

/// Controllers the kubelet checks for a cgroup to exist (v1), and those it needs in a
/// cgroup and enables down its path (v2, `getSupportedUnifiedControllers`: of these, the
/// ones the root has).
const V1_CHECKED: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "pids",
    "hugetlb",
    "name=systemd",
];
const V2_ENABLED: &[&str] = &["cpu", "cpuset", "memory", "hugetlb", "pids"];

/// How long to wait between attempts to remove a cgroup whose processes were killed.
const REMOVE_RETRY: Duration = Duration::from_millis(20);
const REMOVE_ATTEMPTS: u32 = 5;

/// Cgroups as directories and control files in the host's hierarchies.
#[derive(Debug, Clone)]
pub struct FsCgroups<F> {
    fs: F,
    layout: CgroupLayout,
    /// The machine's huge page sizes, in bytes: each gets a hugetlb limit.
    hugepage_sizes: Vec<u64>,
}

impl<F: CgroupFs> FsCgroups<F> {
    /// The cgroups of `fs` mounted as `layout`.
    pub fn new(fs: F, layout: CgroupLayout) -> Self {
        Self {
            fs,
            layout,
            hugepage_sizes: Vec::new(),
        }
    }

    /// The same, limiting huge pages of these sizes.
    #[must_use]
    pub fn with_hugepage_sizes(mut self, sizes: Vec<u64>) -> Self {
        self.hugepage_sizes = sizes;
        self
    }

    /// Each huge page size's limit file (`hugetlb.2MB.<suffix>`) and its value: the
    /// configured limit, else 0.
    fn hugetlb(&self, config: &ResourceConfig, suffix: &str) -> Vec<(String, String)> {
        self.hugepage_sizes
            .iter()
            .map(|size| {
                let limit = config.hugepage_limits.get(size).copied().unwrap_or(0);
                (
                    format!("hugetlb.{}.{suffix}", hugepage_unit(*size)),
                    limit.to_string(),
                )
            })
            .collect()
    }

    fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CmError + 'a {
        move |source| CmError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    }

    /// Whether cgroups are mounted as the unified v2 tree alone.
    #[must_use]
    pub fn is_unified(&self) -> bool {
        matches!(self.layout, CgroupLayout::V2(_))
    }

    /// The cgroup's directory in each hierarchy, with the hierarchy (none in v2).
    fn paths(&self, path: &CgroupPath) -> Vec<(PathBuf, Option<&Hierarchy>)> {
        match &self.layout {
            CgroupLayout::V1(hierarchies) => hierarchies
                .iter()
                .map(|h| (h.mount.join(path.relative()), Some(h)))
                .collect(),
            CgroupLayout::V2(mount) => vec![(mount.join(path.relative()), None)],
        }
    }

    /// Whether the cgroup exists: in every v1 hierarchy the kubelet checks; in v2, with
    /// every controller the kubelet uses that the root has available in it (the kubelet's
    /// `Exists` reads the cgroup's `cgroup.controllers`: a directory whose parent does not
    /// pass those controllers down is made again).
    pub fn exists(&self, path: &CgroupPath) -> bool {
        if let CgroupLayout::V2(mount) = &self.layout {
            let (Ok(root), Ok(own)) = (
                self.fs.read(&mount.join("cgroup.controllers")),
                self.fs
                    .read(&mount.join(path.relative()).join("cgroup.controllers")),
            ) else {
                return false;
            };
            let own: Vec<&str> = own.split_whitespace().collect();
            return root
                .split_whitespace()
                .filter(|c| V2_ENABLED.contains(c))
                .all(|c| own.contains(&c));
        }
        self.paths(path)
            .iter()
            .filter(|(_, h)| h.is_none_or(|h| V1_CHECKED.iter().any(|c| h.has(c))))
            .all(|(path, _)| self.fs.exists(path))
    }

    /// Creates the cgroup (and its parents) in every hierarchy and applies `config`. In
    /// v2, every controller the root has is enabled from the root down to the cgroup's
    /// parent first, as runc's `Apply` does for the kubelet's `Create` (so `io` too, and
    /// pods get `io.stat`), before `update` enables the kubelet's own.
    ///
    /// # Errors
    /// A directory or control file that cannot be written.
    pub fn create(&self, path: &CgroupPath, config: &ResourceConfig) -> Result<(), CmError> {
        for (dir, hierarchy) in self.paths(path) {
            self.fs
                .create_dir_all(&dir)
                .map_err(Self::io("creating cgroup", &dir))?;
            match hierarchy {
                Some(h) if h.has("cpuset") => self.fill_cpuset(&h.mount, path)?,
                None => self.enable_all_down(path),
                Some(_) => {}
            }
        }
        self.update(path, config)
    }

    /// v2: every controller of the root enabled in each `cgroup.subtree_control` from the
    /// root down to the cgroup's parent; where the set is refused, each controller alone,
    /// and what is still refused is left to the settings' writes to report (runc's
    /// `CreateCgroupPath`).
    fn enable_all_down(&self, path: &CgroupPath) {
        let CgroupLayout::V2(mount) = &self.layout else {
            return;
        };
        let Ok(available) = self.fs.read(&mount.join("cgroup.controllers")) else {
            return;
        };
        let enable: Vec<String> = available
            .split_whitespace()
            .map(|c| format!("+{c}"))
            .collect();
        let mut dir = mount.clone();
        for part in &path.0 {
            let file = dir.join("cgroup.subtree_control");
            if self.fs.write(&file, &enable.join(" ")).is_err() {
                for one in &enable {
                    if let Err(e) = self.fs.write(&file, one) {
                        tracing::debug!(file = %file.display(), controller = %one, error = %e, "controller not enabled");
                    }
                }
            }
            dir = dir.join(part);
        }
    }

    /// A new v1 cpuset cgroup has no CPUs or memory nodes: each level gets its parent's.
    fn fill_cpuset(&self, mount: &Path, path: &CgroupPath) -> Result<(), CmError> {
        let mut parent = mount.to_owned();
        for part in &path.0 {
            let dir = parent.join(part);
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let own = dir.join(file);
                let current = self.fs.read(&own).map_err(Self::io("reading", &own))?;
                if current.trim().is_empty() {
                    let from = parent.join(file);
                    let value = self.fs.read(&from).map_err(Self::io("reading", &from))?;
                    self.fs
                        .write(&own, value.trim())
                        .map_err(Self::io("writing", &own))?;
                }
            }
            parent = dir;
        }
        Ok(())
    }

    fn set(&self, dir: &Path, file: &str, value: &str) -> Result<(), CmError> {
        let path = dir.join(file);
        tracing::debug!(path = %path.display(), value, "cgroup setting");
        self.fs
            .write(&path, value)
            .map_err(Self::io("writing", &path))
    }

    /// Applies `config` to an existing cgroup (the kubelet's `Update`).
    ///
    /// # Errors
    /// A control file that cannot be written.
    pub fn update(&self, path: &CgroupPath, config: &ResourceConfig) -> Result<(), CmError> {
        match &self.layout {
            CgroupLayout::V1(_) => {
                for (dir, hierarchy) in self.paths(path) {
                    let Some(h) = hierarchy else { continue };
                    if h.has("cpu") {
                        if let Some(shares) = config.cpu_shares {
                            self.set(&dir, "cpu.shares", &shares.to_string())?;
                        }
                        if let Some(period) = config.cpu_period {
                            self.set(&dir, "cpu.cfs_period_us", &period.to_string())?;
                        }
                        if let Some(quota) = config.cpu_quota {
                            self.set(&dir, "cpu.cfs_quota_us", &quota.to_string())?;
                        }
                    }
                    if h.has("memory")
                        && let Some(memory) = config.memory
                    {
                        self.set(&dir, "memory.limit_in_bytes", &memory.to_string())?;
                    }
                    if h.has("pids")
                        && let Some(pids) = config.pids_limit
                    {
                        self.set(&dir, "pids.max", &pids.to_string())?;
                    }
                    if h.has("hugetlb") {
                        for (file, limit) in self.hugetlb(config, "limit_in_bytes") {
                            self.set(&dir, &file, &limit)?;
                        }
                    }
                }
                Ok(())
            }
            CgroupLayout::V2(mount) => self.update_unified(mount, path, config),
        }
    }

    /// v2: the controllers enabled from the root down to the cgroup's parent, then the
    /// settings in their v2 files (`cpu.weight` from the shares, as runc converts them).
    fn update_unified(
        &self,
        mount: &Path,
        path: &CgroupPath,
        config: &ResourceConfig,
    ) -> Result<(), CmError> {
        let root_controllers = mount.join("cgroup.controllers");
        let available = self
            .fs
            .read(&root_controllers)
            .map_err(Self::io("reading", &root_controllers))?;
        let enable: Vec<String> = available
            .split_whitespace()
            .filter(|c| V2_ENABLED.contains(c))
            .map(|c| format!("+{c}"))
            .collect();
        let mut dir = mount.to_owned();
        for part in &path.0 {
            self.set(&dir, "cgroup.subtree_control", &enable.join(" "))?;
            dir = dir.join(part);
        }
        if let Some(shares) = config.cpu_shares {
            self.set(&dir, "cpu.weight", &cpu_weight(shares).to_string())?;
        }
        if let Some(quota) = config.cpu_quota {
            let quota = if quota > 0 {
                quota.to_string()
            } else {
                "max".to_owned()
            };
            let period = config
                .cpu_period
                .unwrap_or(super::resource_config::QUOTA_PERIOD);
            self.set(&dir, "cpu.max", &format!("{quota} {period}"))?;
        }
        if let Some(memory) = config.memory {
            self.set(&dir, "memory.max", &memory.to_string())?;
        }
        if let Some(pids) = config.pids_limit {
            self.set(&dir, "pids.max", &pids.to_string())?;
        }
        if enable.iter().any(|c| c == "+hugetlb") {
            for (file, limit) in self.hugetlb(config, "max") {
                self.set(&dir, &file, &limit)?;
            }
        }
        Ok(())
    }

    /// The child cgroups of `path`, by directory name, in any hierarchy.
    ///
    /// # Errors
    /// A directory that exists but cannot be read.
    pub fn children(&self, path: &CgroupPath) -> Result<Vec<String>, CmError> {
        let mut all: Vec<String> = Vec::new();
        for (dir, _) in self.paths(path) {
            if !self.fs.exists(&dir) {
                continue;
            }
            for child in self.fs.subdirs(&dir).map_err(Self::io("listing", &dir))? {
                if !all.contains(&child) {
                    all.push(child);
                }
            }
        }
        Ok(all)
    }

    /// The processes in the cgroup and its descendants, in every hierarchy.
    fn pids(&self, dir: &Path, out: &mut Vec<i32>) {
        if let Ok(procs) = self.fs.read(&dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse().ok()) {
                if !out.contains(&pid) {
                    out.push(pid);
                }
            }
        }
        for child in self.fs.subdirs(dir).unwrap_or_default() {
            self.pids(&dir.join(child), out);
        }
    }

    /// Removes a directory tree of cgroups, children first (`rmdir` only).
    fn remove_tree(&self, dir: &Path) -> io::Result<()> {
        for child in self.fs.subdirs(dir)? {
            self.remove_tree(&dir.join(child))?;
        }
        match self.fs.remove_dir(dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The directories of the cgroup that exist.
    fn existing(&self, path: &CgroupPath) -> Vec<PathBuf> {
        self.paths(path)
            .into_iter()
            .map(|(dir, _)| dir)
            .filter(|dir| self.fs.exists(dir))
            .collect()
    }

    /// Kills the processes in the cgroup and its descendants, in every hierarchy (the
    /// kubelet's `tryKillingCgroupProcesses`); answers how many there were. Never in the
    /// root: its processes are the whole host's.
    pub fn kill_processes(&self, path: &CgroupPath) -> usize {
        if path.is_root() {
            return 0;
        }
        self.kill_in(path, &self.existing(path))
    }

    fn kill_in(&self, path: &CgroupPath, dirs: &[PathBuf]) -> usize {
        let mut pids = Vec::new();
        for dir in dirs {
            self.pids(dir, &mut pids);
        }
        for pid in &pids {
            tracing::info!(pid, cgroup = %path, "killing a process left in the pod cgroup");
            if let Err(e) = self.fs.kill(*pid) {
                tracing::warn!(pid, error = %e, "could not kill a process of the pod cgroup");
            }
        }
        pids.len()
    }

    /// Kills the processes left in the cgroup, then removes it from every hierarchy (the
    /// kubelet's pod `Destroy`), trying again while it is busy.
    ///
    /// # Errors
    /// A cgroup that still holds processes or cannot be removed.
    pub fn destroy(&self, path: &CgroupPath) -> Result<(), CmError> {
        // Never the root: its processes are the whole host's.
        if path.is_root() {
            return Ok(());
        }
        let dirs = self.existing(path);
        let mut last = None;
        for attempt in 0..REMOVE_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(REMOVE_RETRY * attempt);
            }
            self.kill_in(path, &dirs);
            last = dirs
                .iter()
                .find_map(|dir| self.remove_tree(dir).err().map(|e| (dir.clone(), e)));
            if last.is_none() {
                return Ok(());
            }
        }
        match last {
            Some((path, source)) => Err(CmError::Io {
                what: "removing cgroup",
                path,
                source,
            }),
            None => Ok(()),
        }
    }
}

/// Runs cgroup file work on one of tokio's blocking threads, so the runtime never waits
/// on the cgroup file system.
///
/// # Errors
/// The work's error, or [`CmError::Task`] when the blocking task failed.
pub async fn blocking<F, T>(
    files: &Arc<FsCgroups<F>>,
    work: impl FnOnce(&FsCgroups<F>) -> Result<T, CmError> + Send + 'static,
) -> Result<T, CmError>
where
    F: CgroupFs,
    T: Send + 'static,
{
    let files = files.clone();
    tokio::task::spawn_blocking(move || work(&files))
        .await
        .map_err(|e| CmError::Task(e.to_string()))?
}

/// The cgroupfs driver: a cgroup's directory is its name (`/kubepods/burstable/pod<uid>`).
#[derive(Debug)]
pub struct CgroupfsManager<F> {
    files: Arc<FsCgroups<F>>,
}

impl<F: CgroupFs> CgroupfsManager<F> {
    /// The driver over these cgroup files.
    pub fn new(files: FsCgroups<F>) -> Self {
        Self {
            files: Arc::new(files),
        }
    }
}

impl<F: CgroupFs> CgroupManager for CgroupfsManager<F> {
    fn driver(&self) -> CgroupDriver {
        CgroupDriver::Cgroupfs
    }

    fn exists<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<bool, CmError>> {
        let path = name.cgroupfs_path();
        Box::pin(blocking(&self.files, move |files| Ok(files.exists(&path))))
    }

    fn create<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>> {
        let (path, config) = (name.cgroupfs_path(), config.clone());
        Box::pin(blocking(&self.files, move |files| {
            files.create(&path, &config)
        }))
    }

    fn update<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>> {
        let (path, config) = (name.cgroupfs_path(), config.clone());
        Box::pin(blocking(&self.files, move |files| {
            files.update(&path, &config)
        }))
    }

    fn destroy<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<(), CmError>> {
        let path = name.cgroupfs_path();
        Box::pin(blocking(&self.files, move |files| files.destroy(&path)))
    }

    fn children<'a>(
        &'a self,
        name: &'a CgroupName,
    ) -> BoxFuture<'a, Result<Vec<CgroupName>, CmError>> {
        let path = name.cgroupfs_path();
        Box::pin(async move {
            let dirs = blocking(&self.files, move |files| files.children(&path)).await?;
            Ok(dirs.iter().map(|dir| name.child(dir)).collect())
        })
    }
}

/// cgroup v2 `cpu.weight` for v1 shares, as runc converts them.
#[must_use]
pub fn cpu_weight(shares: u64) -> u64 {
    if shares >= 262_144 {
        10_000
    } else {
        1 + (shares.saturating_sub(2) * 9999) / 262_142
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! An in-memory cgroup file system.

    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Arc, Mutex};

    use super::{CgroupFs, Path, PathBuf, io};

    /// A cgroup v1 layout under `/cg` with one hierarchy per controller, each made, over
    /// a fresh fake file system (2 MiB huge pages known).
    pub fn v1_files(controllers: &[&str]) -> (FakeCgroupFs, super::FsCgroups<FakeCgroupFs>) {
        let fs = FakeCgroupFs::default();
        let hierarchies = controllers
            .iter()
            .map(|c| super::Hierarchy {
                mount: Path::new("/cg").join(c),
                controllers: vec![(*c).to_owned()],
            })
            .collect::<Vec<_>>();
        for h in &hierarchies {
            fs.create_dir_all(&h.mount).unwrap();
        }
        let files = super::FsCgroups::new(fs.clone(), super::CgroupLayout::V1(hierarchies))
            .with_hugepage_sizes(vec![2 << 20]);
        (fs, files)
    }

    /// Directories, files and killed PIDs; removing a cgroup with processes fails.
    #[derive(Debug, Default, Clone)]
    pub struct FakeCgroupFs(pub Arc<Mutex<State>>);

    #[derive(Debug, Default)]
    pub struct State {
        pub dirs: BTreeSet<PathBuf>,
        pub files: BTreeMap<PathBuf, String>,
        pub killed: Vec<i32>,
    }

    impl FakeCgroupFs {
        pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.0.lock().unwrap()
        }

        pub fn file(&self, path: &str) -> Option<String> {
            self.state().files.get(Path::new(path)).cloned()
        }

        pub fn put(&self, path: &str, value: &str) {
            let mut s = self.state();
            let path = PathBuf::from(path);
            if let Some(parent) = path.parent() {
                s.dirs.insert(parent.to_owned());
            }
            s.files.insert(path, value.to_owned());
        }
    }

    impl CgroupFs for FakeCgroupFs {
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            let mut s = self.state();
            for p in path.ancestors() {
                if s.dirs.insert(p.to_owned()) {
                    // A new cgroup: empty cpuset and process list, as the kernel makes it.
                    for f in ["cpuset.cpus", "cpuset.mems", "cgroup.procs"] {
                        s.files.insert(p.join(f), String::new());
                    }
                }
            }
            Ok(())
        }

        fn remove_dir(&self, path: &Path) -> io::Result<()> {
            let mut s = self.state();
            let busy = s.files.get(&path.join("cgroup.procs")).is_some_and(|p| {
                p.lines()
                    .any(|l| !s.killed.contains(&l.parse().unwrap_or(0)))
            });
            if busy || s.dirs.iter().any(|d| d.parent() == Some(path)) {
                return Err(io::Error::from_raw_os_error(16));
            }
            if !s.dirs.remove(path) {
                return Err(io::ErrorKind::NotFound.into());
            }
            s.files.retain(|f, _| f.parent() != Some(path));
            Ok(())
        }

        fn exists(&self, path: &Path) -> bool {
            let s = self.state();
            s.dirs.contains(path) || s.files.contains_key(path)
        }

        /// As the kernel's v2 tree, a cgroup's `cgroup.controllers` not laid out by the
        /// test are those its parent enables in `cgroup.subtree_control`.
        fn read(&self, path: &Path) -> io::Result<String> {
            let s = self.state();
            if let Some(text) = s.files.get(path) {
                return Ok(text.clone());
            }
            let dir = path.parent().filter(|d| s.dirs.contains(*d));
            match (dir.and_then(Path::parent), path.file_name()) {
                (Some(parent), Some(name)) if name == "cgroup.controllers" => Ok(s
                    .files
                    .get(&parent.join("cgroup.subtree_control"))
                    .cloned()
                    .unwrap_or_default()),
                _ => Err(io::ErrorKind::NotFound.into()),
            }
        }

        /// `cgroup.subtree_control` takes `+c`/`-c` words as the kernel does: all or
        /// none, each one a controller of the cgroup's own `cgroup.controllers`
        /// (`EINVAL` otherwise); it reads back as the enabled names.
        fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            if !path.parent().is_some_and(|p| self.state().dirs.contains(p)) {
                return Err(io::ErrorKind::NotFound.into());
            }
            let value = if path.ends_with("cgroup.subtree_control") {
                let dir = path.parent().unwrap_or(path);
                let available = self.read(&dir.join("cgroup.controllers"))?;
                let mut enabled: Vec<String> = self
                    .read(path)
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
                for word in value.split_whitespace() {
                    let (on, name) = match word.split_at(1) {
                        ("+", name) => (true, name),
                        ("-", name) => (false, name),
                        _ => return Err(io::Error::from_raw_os_error(22)),
                    };
                    if !available.split_whitespace().any(|c| c == name) {
                        return Err(io::Error::from_raw_os_error(22));
                    }
                    enabled.retain(|c| c != name);
                    if on {
                        enabled.push(name.to_owned());
                    }
                }
                // In the order the kernel lists controllers (its `cgroup.controllers`').
                let rank = |c: &String| available.split_whitespace().position(|a| a == c);
                enabled.sort_by_key(rank);
                enabled.join(" ")
            } else {
                value.to_owned()
            };
            self.state().files.insert(path.to_owned(), value);
            Ok(())
        }

        fn subdirs(&self, path: &Path) -> io::Result<Vec<String>> {
            let s = self.state();
            if !s.dirs.contains(path) {
                return Err(io::ErrorKind::NotFound.into());
            }
            Ok(s.dirs
                .iter()
                .filter(|d| d.parent() == Some(path))
                .filter_map(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect())
        }

        /// The process dies: it leaves every `cgroup.procs`.
        fn kill(&self, pid: i32) -> io::Result<()> {
            let mut s = self.state();
            s.killed.push(pid);
            for (path, procs) in &mut s.files {
                if path.ends_with("cgroup.procs") {
                    *procs = procs
                        .lines()
                        .filter(|l| l.trim().parse() != Ok(pid))
                        .map(|l| format!("{l}\n"))
                        .collect();
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::FakeCgroupFs;
    use super::*;

    const HYBRID: &str = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
34 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
39 30 0:34 / /sys/fs/cgroup/hugetlb rw - cgroup cgroup rw,hugetlb
36 30 0:32 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
37 30 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
38 30 0:30 /sub /mnt/memory rw - cgroup cgroup rw,memory
";

    fn name(path: &str) -> CgroupPath {
        CgroupName::from_cgroupfs(path).cgroupfs_path()
    }

    #[test]
    fn mountinfo_gives_v1_hierarchies_with_the_hybrid_tree_or_v2_alone() {
        let CgroupLayout::V1(h) = CgroupLayout::from_mountinfo(HYBRID).unwrap() else {
            panic!("v1 expected")
        };
        let found: Vec<(&str, Vec<&str>)> = h
            .iter()
            .map(|h| {
                (
                    h.mount.to_str().unwrap(),
                    h.controllers.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            found,
            vec![
                ("/sys/fs/cgroup/cpu", vec!["cpu"]),
                ("/sys/fs/cgroup/cpuacct", vec!["cpuacct"]),
                ("/sys/fs/cgroup/cpuset", vec!["cpuset"]),
                ("/sys/fs/cgroup/memory", vec!["memory"]),
                ("/sys/fs/cgroup/pids", vec!["pids"]),
                ("/sys/fs/cgroup/hugetlb", vec!["hugetlb"]),
                ("/sys/fs/cgroup/systemd", vec!["name=systemd"]),
                ("/sys/fs/cgroup/unified", vec![]),
            ]
        );
        let v2 = "40 1 0:40 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            CgroupLayout::from_mountinfo(v2),
            Some(CgroupLayout::V2("/sys/fs/cgroup".into()))
        );
        assert_eq!(CgroupLayout::from_mountinfo(""), None);
    }

    fn v1() -> (FakeCgroupFs, FsCgroups<FakeCgroupFs>) {
        let fs = FakeCgroupFs::default();
        for h in ["cpu", "cpuset", "memory", "pids", "hugetlb", "unified"] {
            fs.create_dir_all(&Path::new("/cg").join(h)).unwrap();
        }
        fs.put("/cg/cpuset/cpuset.cpus", "0-1\n");
        fs.put("/cg/cpuset/cpuset.mems", "0\n");
        let CgroupLayout::V1(h) =
            CgroupLayout::from_mountinfo(&HYBRID.replace("/sys/fs/cgroup", "/cg")).unwrap()
        else {
            unreachable!()
        };
        let h = h.into_iter().filter(|h| fs.exists(&h.mount)).collect();
        let m = FsCgroups::new(fs.clone(), CgroupLayout::V1(h));
        (fs, m.with_hugepage_sizes(vec![2 << 20, 1 << 30]))
    }

    #[test]
    fn v1_create_makes_every_hierarchy_fills_cpuset_and_writes_settings() {
        let (fs, m) = v1();
        let pod = name("/kubepods/burstable/podX");
        assert!(!m.exists(&pod));
        let config = ResourceConfig {
            cpu_shares: Some(256),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            pids_limit: None,
            hugepage_limits: [(2 << 20, 4 << 20)].into(),
        };
        m.create(&pod, &config).unwrap();
        assert!(m.exists(&pod));
        assert!(fs.exists(Path::new("/cg/unified/kubepods/burstable/podX")));
        let dir = "/cg/cpu/kubepods/burstable/podX";
        assert_eq!(
            fs.file(&format!("{dir}/cpu.shares")).as_deref(),
            Some("256")
        );
        assert_eq!(
            fs.file(&format!("{dir}/cpu.cfs_quota_us")).as_deref(),
            Some("50000")
        );
        assert_eq!(
            fs.file("/cg/memory/kubepods/burstable/podX/memory.limit_in_bytes")
                .as_deref(),
            Some("67108864")
        );
        assert_eq!(fs.file("/cg/pids/kubepods/burstable/podX/pids.max"), None);
        // Huge pages: what the pod asks for, 0 for the sizes it does not.
        let hugetlb = |size: &str| {
            fs.file(&format!(
                "/cg/hugetlb/kubepods/burstable/podX/hugetlb.{size}.limit_in_bytes"
            ))
        };
        assert_eq!(hugetlb("2MB").as_deref(), Some("4194304"));
        assert_eq!(hugetlb("1GB").as_deref(), Some("0"));
        for level in ["kubepods", "kubepods/burstable", "kubepods/burstable/podX"] {
            assert_eq!(
                fs.file(&format!("/cg/cpuset/{level}/cpuset.cpus"))
                    .as_deref(),
                Some("0-1")
            );
            assert_eq!(
                fs.file(&format!("/cg/cpuset/{level}/cpuset.mems"))
                    .as_deref(),
                Some("0")
            );
        }
        assert_eq!(m.children(&name("/kubepods/burstable")).unwrap(), ["podX"]);
    }

    #[test]
    fn destroy_kills_what_is_left_then_removes_the_tree_everywhere() {
        let (fs, m) = v1();
        let pod = name("/kubepods/podG");
        m.create(&pod, &ResourceConfig::default()).unwrap();
        // A container cgroup runc left behind, with a process in it.
        fs.create_dir_all(Path::new("/cg/memory/kubepods/podG/c1"))
            .unwrap();
        fs.put("/cg/memory/kubepods/podG/c1/cgroup.procs", "42\n");
        fs.put("/cg/cpu/kubepods/podG/cgroup.procs", "42\n43\n");
        m.destroy(&pod).unwrap();
        assert_eq!(fs.state().killed, [42, 43]);
        assert!(!fs.exists(Path::new("/cg/memory/kubepods/podG")));
        assert!(!fs.exists(Path::new("/cg/cpu/kubepods/podG")));
        assert!(fs.exists(Path::new("/cg/cpu/kubepods")));
        // Gone already: nothing to do.
        m.destroy(&pod).unwrap();
    }

    #[test]
    fn v2_enables_controllers_down_the_path_and_writes_v2_files() {
        let fs = FakeCgroupFs::default();
        fs.create_dir_all(Path::new("/cg")).unwrap();
        fs.put(
            "/cg/cgroup.controllers",
            "cpuset cpu io memory hugetlb pids rdma\n",
        );
        let m = FsCgroups::new(fs.clone(), CgroupLayout::V2("/cg".into()))
            .with_hugepage_sizes(vec![2 << 20]);
        let config = ResourceConfig {
            cpu_shares: Some(2),
            cpu_quota: Some(150_000),
            cpu_period: Some(100_000),
            memory: Some(1 << 30),
            pids_limit: Some(1024),
            hugepage_limits: [(2 << 20, 2 << 20)].into(),
        };
        let pod = name("/kubepods/podG");
        assert!(!m.exists(&pod));
        m.create(&pod, &config).unwrap();
        // Every controller of the root down the path (runc's Apply), the kubelet's among
        // them; the pod has them all, so it exists for the kubelet.
        let every = "cpuset cpu io memory hugetlb pids rdma";
        assert_eq!(
            fs.file("/cg/cgroup.subtree_control").as_deref(),
            Some(every)
        );
        assert_eq!(
            fs.file("/cg/kubepods/cgroup.subtree_control").as_deref(),
            Some(every)
        );
        assert!(m.exists(&pod));
        // A parent that stops passing memory down: the pod cgroup is not there any more
        // for the kubelet, and an update enables it again.
        fs.put("/cg/kubepods/cgroup.subtree_control", "cpuset cpu pids");
        assert!(!m.exists(&pod));
        m.update(&pod, &config).unwrap();
        assert!(m.exists(&pod));
        assert_eq!(
            fs.file("/cg/kubepods/podG/cpu.weight").as_deref(),
            Some("1")
        );
        assert_eq!(
            fs.file("/cg/kubepods/podG/cpu.max").as_deref(),
            Some("150000 100000")
        );
        assert_eq!(
            fs.file("/cg/kubepods/podG/memory.max").as_deref(),
            Some("1073741824")
        );
        assert_eq!(
            fs.file("/cg/kubepods/podG/pids.max").as_deref(),
            Some("1024")
        );
        assert_eq!(
            fs.file("/cg/kubepods/podG/hugetlb.2MB.max").as_deref(),
            Some("2097152")
        );
    }

    #[test]
    fn cpu_weight_follows_runc() {
        assert_eq!(cpu_weight(2), 1);
        assert_eq!(cpu_weight(1024), 39);
        assert_eq!(cpu_weight(262_144), 10_000);
    }
}
