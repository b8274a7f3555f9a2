//! The kubelet's `CgroupManager` interface, driver-neutral: cgroups named by the
//! kubelet's internal names ([`CgroupName`], `["kubepods", "burstable", "pod<uid>"]`),
//! which the driver turns into its own form ([`CgroupDriver`]: a cgroupfs path, or nested
//! systemd `.slice` units) and makes, sets, lists and removes. The drivers are
//! [`super::cgroupfs::CgroupfsManager`] and [`super::systemd::SystemdManager`]; nothing
//! outside `cm` knows which one runs.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use futures::future::BoxFuture;

use super::resource_config::ResourceConfig;

/// What went wrong with cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// A cgroup file or directory could not be read, written or removed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// No cgroup file system is mounted.
    #[error("no cgroup hierarchy is mounted (/proc/self/mountinfo)")]
    NoCgroups,
    /// A `--cgroup-driver` that is neither cgroupfs nor systemd.
    #[error("--cgroup-driver={0} is not supported: use cgroupfs or systemd")]
    UnknownDriver(String),
    /// The container runtime makes cgroups with the other driver.
    #[error("--cgroup-driver={ours} but the container runtime uses {runtime} ({setting})")]
    DriverMismatch {
        /// `--cgroup-driver`.
        ours: CgroupDriver,
        /// The runtime's.
        runtime: CgroupDriver,
        /// The runtime's setting that says so.
        setting: String,
    },
    /// systemd could not be reached, refused a call, or its job failed.
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    /// The blocking task doing the cgroup work failed.
    #[error("cgroup work did not finish: {0}")]
    Task(String),
}

/// What went wrong talking to systemd.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The host was not booted with systemd.
    #[error(
        "--cgroup-driver=systemd but systemd is not running on this host (no /run/systemd/system): use --cgroup-driver=cgroupfs here"
    )]
    NotRunning,
    /// No connection to systemd could be made.
    #[error("cannot connect to systemd ({tried}): {message}")]
    Connect {
        /// The addresses tried.
        tried: String,
        /// The last failure.
        message: String,
    },
    /// systemd answered a call with an error.
    #[error("systemd refused {method}({unit}): {name}: {message}")]
    Refused {
        /// The method.
        method: &'static str,
        /// The unit.
        unit: String,
        /// The D-Bus error name (`org.freedesktop.systemd1.UnitExists`).
        name: String,
        /// systemd's message.
        message: String,
    },
    /// The call did not complete (connection, timeout, unexpected reply).
    #[error("systemd {method}({unit}) failed: {message}")]
    Bus {
        /// The method.
        method: &'static str,
        /// The unit.
        unit: String,
        /// What happened.
        message: String,
    },
    /// The job of a call ended other than `done`.
    #[error("systemd job {method}({unit}) ended {result}")]
    Job {
        /// The method.
        method: &'static str,
        /// The unit.
        unit: String,
        /// `JobRemoved`'s result.
        result: String,
    },
}

impl SystemdError {
    /// Whether systemd refused the call with this D-Bus error name.
    #[must_use]
    pub fn is(&self, error_name: &str) -> bool {
        matches!(self, Self::Refused { name, .. } if name == error_name)
    }
}

/// A cgroup's directory below the root of every hierarchy, by its components: the
/// cgroupfs driver's `kubepods/burstable/pod<uid>`, the systemd driver's
/// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CgroupPath(pub Vec<String>);

impl CgroupPath {
    /// The directory below a hierarchy's mount point.
    pub(super) fn relative(&self) -> PathBuf {
        self.0.iter().collect()
    }

    /// Whether this is the hierarchy's root.
    #[must_use]
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.0.join("/"))
    }
}

/// The suffix of systemd slice units.
const SLICE: &str = ".slice";

/// A cgroup by the kubelet's internal name: its path components below the root
/// (`["kubepods", "burstable", "pod<uid>"]`), whatever the driver.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CgroupName(pub Vec<String>);

impl CgroupName {
    /// The cgroup `parent/child`.
    #[must_use]
    pub fn child(&self, name: &str) -> Self {
        let mut parts = self.0.clone();
        parts.push(name.to_owned());
        Self(parts)
    }

    /// Parses a cgroupfs path (`/kubepods/burstable`; `/` is the root)
    /// (`ParseCgroupfsToCgroupName`). `--cgroup-root` is read this way with either driver.
    #[must_use]
    pub fn from_cgroupfs(path: &str) -> Self {
        Self(
            path.split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// The cgroupfs form: `/kubepods/burstable/pod<uid>` (`ToCgroupfs`).
    #[must_use]
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The cgroupfs driver's directory: the name itself.
    #[must_use]
    pub fn cgroupfs_path(&self) -> CgroupPath {
        CgroupPath(self.0.clone())
    }

    /// The components escaped for systemd: a dash separates slice levels, so the
    /// dashes of a component (a pod UID's) become underscores (`escapeSystemdCgroupName`).
    fn escaped(&self) -> impl Iterator<Item = String> + '_ {
        self.0
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| p.replace('-', "_"))
    }

    /// The systemd driver's directory: one slice per level, each named by the levels
    /// down to it (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`),
    /// as systemd's `ExpandSlice` lays out `kubepods-burstable-pod<uid>.slice`.
    #[must_use]
    pub fn systemd_path(&self) -> CgroupPath {
        let mut prefix = String::new();
        let mut dirs = Vec::new();
        for part in self.escaped() {
            if !prefix.is_empty() {
                prefix.push('-');
            }
            prefix.push_str(&part);
            dirs.push(format!("{prefix}{SLICE}"));
        }
        CgroupPath(dirs)
    }

    /// The systemd form in cgroupfs layout, as the kubelet's `ToSystemd` gives it:
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`; `/`
    /// for the root.
    #[must_use]
    pub fn to_systemd(&self) -> String {
        self.systemd_path().to_string()
    }

    /// The slice unit of this cgroup (`kubepods-burstable-pod<uid>.slice`); none for the
    /// root.
    #[must_use]
    pub fn systemd_unit(&self) -> Option<String> {
        self.systemd_path().0.pop()
    }

    /// The slice unit this cgroup's slice goes under: its parent's, `-.slice` (the root
    /// slice) at the top (`updateSystemdCgroupInfo`).
    #[must_use]
    pub fn systemd_parent(&self) -> String {
        let mut dirs = self.systemd_path().0;
        dirs.pop();
        dirs.pop().unwrap_or_else(|| format!("-{SLICE}"))
    }

    /// Parses a systemd cgroup (`/kubepods.slice/kubepods-burstable.slice`, or only its
    /// last slice) back to the internal name: the last slice's name split at its dashes,
    /// underscores back to dashes (`ParseSystemdToCgroupName`).
    #[must_use]
    pub fn from_systemd(name: &str) -> Self {
        let base = name.rsplit('/').next().unwrap_or_default();
        let base = base.strip_suffix(SLICE).unwrap_or(base);
        Self(
            base.split('-')
                .filter(|p| !p.is_empty())
                .map(|p| p.replace('_', "-"))
                .collect(),
        )
    }
}

/// How cgroups are made: `--cgroup-driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    /// Directories written directly in the cgroup file system.
    #[default]
    Cgroupfs,
    /// Slice units made through systemd's D-Bus API.
    Systemd,
}

impl CgroupDriver {
    /// The flag's value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        }
    }

    /// The driver's literal form of a cgroup, as the kubelet's `CgroupManager.Name` gives
    /// it and sends as a sandbox's `CgroupParent`: `/kubepods/burstable/pod<uid>`, or
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`.
    #[must_use]
    pub fn name(self, name: &CgroupName) -> String {
        match self {
            Self::Cgroupfs => name.to_cgroupfs(),
            Self::Systemd => name.to_systemd(),
        }
    }

    /// The cgroup's directory below each hierarchy's root.
    #[must_use]
    pub fn path(self, name: &CgroupName) -> CgroupPath {
        match self {
            Self::Cgroupfs => name.cgroupfs_path(),
            Self::Systemd => name.systemd_path(),
        }
    }

    /// The internal name of a literal one (`CgroupManager.CgroupName`).
    #[must_use]
    pub fn parse(self, literal: &str) -> CgroupName {
        match self {
            Self::Cgroupfs => CgroupName::from_cgroupfs(literal),
            Self::Systemd => CgroupName::from_systemd(literal),
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CgroupDriver {
    type Err = CmError;

    fn from_str(s: &str) -> Result<Self, CmError> {
        match s {
            "cgroupfs" => Ok(Self::Cgroupfs),
            "systemd" => Ok(Self::Systemd),
            other => Err(CmError::UnknownDriver(other.to_owned())),
        }
    }
}

/// A cgroup driver (the kubelet's `CgroupManager`). Object safe: the container manager
/// holds an `Arc<dyn CgroupManager>`. Every method takes the internal name; the driver
/// finds its own form.
pub trait CgroupManager: Send + Sync + 'static {
    /// Which driver this is.
    fn driver(&self) -> CgroupDriver;

    /// Whether the cgroup exists in every hierarchy the kubelet checks (`Exists`).
    fn exists<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<bool, CmError>>;

    /// Makes the cgroup with `config` (`Create`); its parents must exist (systemd) or are
    /// made (cgroupfs).
    fn create<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>>;

    /// Applies `config` to an existing cgroup (`Update`).
    fn update<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>>;

    /// Kills the processes left in the cgroup and removes it (the pod container manager's
    /// `Destroy`). A cgroup already gone is not an error.
    fn destroy<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<(), CmError>>;

    /// The child cgroups of `name` found in any hierarchy, by internal name.
    fn children<'a>(
        &'a self,
        name: &'a CgroupName,
    ) -> BoxFuture<'a, Result<Vec<CgroupName>, CmError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(parts: &[&str]) -> CgroupName {
        CgroupName(parts.iter().map(|p| (*p).to_owned()).collect())
    }

    const UID: &str = "2b3c4d5e-6f70-4182-93a4-b5c6d7e8f901";

    #[test]
    fn names_convert_to_cgroupfs_paths() {
        let n = CgroupName::from_cgroupfs("/")
            .child("kubepods")
            .child("pod1");
        assert_eq!(n.to_cgroupfs(), "/kubepods/pod1");
        assert_eq!(CgroupName::default().to_cgroupfs(), "/");
        assert_eq!(
            CgroupDriver::Cgroupfs.name(&name(&["kubepods", "burstable", &format!("pod{UID}")])),
            format!("/kubepods/burstable/pod{UID}")
        );
        assert_eq!(
            CgroupDriver::Cgroupfs.parse("/kubelet/kubepods/besteffort"),
            name(&["kubelet", "kubepods", "besteffort"])
        );
    }

    #[test]
    fn names_convert_to_nested_slices_with_dashes_escaped() {
        let pod = name(&["kubepods", "burstable", &format!("pod{UID}")]);
        let escaped = UID.replace('-', "_");
        assert_eq!(
            pod.to_systemd(),
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice"
            )
        );
        assert_eq!(
            pod.systemd_unit().as_deref(),
            Some(format!("kubepods-burstable-pod{escaped}.slice").as_str())
        );
        assert_eq!(pod.systemd_parent(), "kubepods-burstable.slice");
        assert_eq!(
            pod.systemd_path().0,
            [
                "kubepods.slice".to_owned(),
                "kubepods-burstable.slice".to_owned(),
                format!("kubepods-burstable-pod{escaped}.slice"),
            ]
        );
        // Guaranteed pods sit in kubepods.slice itself, which sits in the root slice.
        let guaranteed = name(&["kubepods", "pod1234-abcd"]);
        assert_eq!(
            guaranteed.to_systemd(),
            "/kubepods.slice/kubepods-pod1234_abcd.slice"
        );
        let kubepods = name(&["kubepods"]);
        assert_eq!(kubepods.systemd_parent(), "-.slice");
        assert_eq!(kubepods.systemd_unit().as_deref(), Some("kubepods.slice"));
        // The root is no unit.
        assert_eq!(CgroupName::default().to_systemd(), "/");
        assert_eq!(CgroupName::default().systemd_unit(), None);
        assert_eq!(CgroupDriver::Systemd.name(&pod), pod.to_systemd());
    }

    #[test]
    fn a_cgroup_root_nests_as_kind_lays_it_out() {
        // kind: cgroupRoot /kubelet, cgroupDriver systemd.
        let root = CgroupName::from_cgroupfs("/kubelet").child("kubepods");
        let pod = root.child("besteffort").child(&format!("pod{UID}"));
        let escaped = UID.replace('-', "_");
        assert_eq!(
            pod.to_systemd(),
            format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{escaped}.slice"
            )
        );
        assert_eq!(root.systemd_parent(), "kubelet.slice");
        assert_eq!(
            pod.to_cgroupfs(),
            format!("/kubelet/kubepods/besteffort/pod{UID}")
        );
    }

    #[test]
    fn systemd_names_parse_back() {
        let escaped = UID.replace('-', "_");
        let full = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice"
        );
        let want = name(&["kubepods", "burstable", &format!("pod{UID}")]);
        assert_eq!(CgroupDriver::Systemd.parse(&full), want);
        assert_eq!(
            CgroupName::from_systemd(&format!("kubepods-burstable-pod{escaped}.slice")),
            want
        );
        assert_eq!(CgroupName::from_systemd(&want.to_systemd()), want);
    }

    #[test]
    fn drivers_parse_from_the_flag() {
        assert_eq!(
            "cgroupfs".parse::<CgroupDriver>().unwrap(),
            CgroupDriver::Cgroupfs
        );
        assert_eq!(
            "systemd".parse::<CgroupDriver>().unwrap(),
            CgroupDriver::Systemd
        );
        let err = "openrc".parse::<CgroupDriver>().unwrap_err();
        assert!(err.to_string().contains("--cgroup-driver=openrc"), "{err}");
        assert_eq!(CgroupDriver::Systemd.to_string(), "systemd");
    }
}
