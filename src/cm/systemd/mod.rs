//! The systemd cgroup driver (the kubelet's `cgroupManagerImpl` with
//! `libcontainerSystemd`, over runc's systemd cgroup manager): each cgroup is a transient
//! slice unit named after its whole path (`kubepods-burstable-pod<uid>.slice` in
//! `kubepods-burstable.slice` in `kubepods.slice`), started with the properties runc gives
//! a slice (description, parent, no default dependencies, accounting on, the resources as
//! systemd settings: `CPUShares`/`CPUWeight`, `CPUQuotaPerSecUSec`,
//! `MemoryLimit`/`MemoryMax`, `TasksMax`), set again with `SetUnitProperties` on an
//! update that changes them, stopped on destroy once the processes left inside are
//! killed. The same settings are
//! then written to the cgroup files at the slice's directory, as the kubelet's `Update`
//! writes them, so the kernel holds exactly what the cgroupfs driver would write (systemd
//! keeps CPU quotas at 1 % steps); existence, listing and the processes inside are read
//! from the cgroup file system too.
//!
//! systemd's D-Bus API sits behind [`SystemdBus`]; [`dbus::ZbusSystemd`] is the real one.

pub mod dbus;

use std::sync::Arc;

use futures::future::BoxFuture;

use super::cgroup_manager::{CgroupDriver, CgroupManager, CgroupName, CmError};
use super::cgroupfs::{CgroupFs, FsCgroups, blocking, cpu_weight};
use super::resource_config::{QUOTA_PERIOD, ResourceConfig};

pub use super::cgroup_manager::SystemdError;
pub use dbus::ZbusSystemd;

/// systemd's error when a unit to start already exists.
pub const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
/// systemd's error for a unit it does not know.
pub const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// The first systemd with `CPUQuotaPeriodUSec`.
const QUOTA_PERIOD_SINCE: u32 = 242;
/// systemd's `USEC_INFINITY` and `CGROUP_LIMIT_MAX`: no limit.
const INFINITY: u64 = u64::MAX;
/// Slices asked of systemd at once. PID 1 reads every call waiting on the bus before it
/// runs the jobs they queued, so thirty pods asking at once all wait for the thirtieth
/// slice; a few at a time, in the order the pods came, the first pods' slices are ready
/// first (the start gate lets pods in in that order too).
pub const SLICE_STARTS: usize = 4;

/// A unit property's value, in the D-Bus type systemd takes for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropertyValue {
    /// `s`.
    Str(String),
    /// `b`.
    Bool(bool),
    /// `t`.
    U64(u64),
    /// `as`.
    Strs(Vec<String>),
    /// `a(ss)`: `DeviceAllow`'s (device, permissions) pairs.
    Pairs(Vec<(String, String)>),
}

/// A unit property, as `StartTransientUnit` and `SetUnitProperties` take it (`(sv)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Property {
    /// Its name (`CPUShares`).
    pub name: &'static str,
    /// Its value.
    pub value: PropertyValue,
}

fn prop(name: &'static str, value: PropertyValue) -> Property {
    Property { name, value }
}

/// How a systemd job ended, as its `JobRemoved` signal says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobResult {
    /// `done`.
    Done,
    /// Any other result: `canceled`, `timeout`, `failed`, `dependency`, `skipped`.
    Failed(String),
    /// No `JobRemoved` within the wait: the job may still finish.
    TimedOut,
}

impl JobResult {
    /// The result named by `JobRemoved`.
    #[must_use]
    pub fn from_signal(result: &str) -> Self {
        if result == "done" {
            Self::Done
        } else {
            Self::Failed(result.to_owned())
        }
    }
}

/// The calls of systemd's `org.freedesktop.systemd1.Manager` the driver makes.
/// Object safe; [`dbus::ZbusSystemd`] is the real one.
pub trait SystemdBus: Send + Sync + 'static {
    /// systemd's version (the manager's `Version`), when known.
    fn version(&self) -> Option<u32>;

    /// `StartTransientUnit(unit, "replace", properties, [])`, then the job's end: its
    /// `JobRemoved` signal, or [`JobResult::TimedOut`] after the bus's wait.
    fn start_transient_unit<'a>(
        &'a self,
        unit: &'a str,
        properties: &'a [Property],
    ) -> BoxFuture<'a, Result<JobResult, SystemdError>>;

    /// `SetUnitProperties(unit, true, properties)`: runtime settings of a running unit.
    fn set_unit_properties<'a>(
        &'a self,
        unit: &'a str,
        properties: &'a [Property],
    ) -> BoxFuture<'a, Result<(), SystemdError>>;

    /// `StopUnit(unit, "replace")`, then the job's end as for a start.
    fn stop_unit<'a>(&'a self, unit: &'a str) -> BoxFuture<'a, Result<JobResult, SystemdError>>;

    /// `ResetFailedUnit(unit)`: forgets a failed unit, so its name can be used again.
    fn reset_failed_unit<'a>(&'a self, unit: &'a str) -> BoxFuture<'a, Result<(), SystemdError>>;
}

/// The properties runc gives a new unit of its own (`Apply` without a process): a
/// description, its parent slice (`Wants=` for a slice, `Slice=` for a scope), `Delegate`
/// for a scope (systemd refuses it on slices), accounting for memory, CPU, I/O
/// (`BlockIOAccounting` on v1, `IOAccounting` on v2), and no default dependencies.
#[must_use]
pub fn unit_properties(unit: &str, parent: &str, unified: bool) -> Vec<Property> {
    use PropertyValue::{Bool, Str, Strs};
    let slice = unit.ends_with(".slice");
    let mut props = vec![prop(
        "Description",
        Str(format!("libcontainer container {unit}")),
    )];
    if slice {
        props.push(prop("Wants", Strs(vec![parent.to_owned()])));
    } else {
        props.push(prop("Slice", Str(parent.to_owned())));
        props.push(prop("Delegate", Bool(true)));
    }
    props.extend([
        prop("MemoryAccounting", Bool(true)),
        prop("CPUAccounting", Bool(true)),
        prop(
            if unified {
                "IOAccounting"
            } else {
                "BlockIOAccounting"
            },
            Bool(true),
        ),
        prop("DefaultDependencies", Bool(false)),
    ]);
    props
}

/// A non-negative setting as systemd's unsigned value; a negative one (the kernel's -1,
/// "max") as no limit.
fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(INFINITY)
}

/// `CPUQuotaPerSecUSec` for a CFS quota and period, as runc computes it: µs of CPU per
/// second, rounded up to whole percents (systemd stores a percentage), no limit for a
/// quota of -1. `None` when neither is set.
#[must_use]
pub fn cpu_quota_per_sec(quota: i64, period: u64) -> Option<u64> {
    if quota == 0 && period == 0 {
        return None;
    }
    if quota <= 0 {
        return Some(INFINITY);
    }
    let period = if period == 0 { QUOTA_PERIOD } else { period };
    let per_sec = unsigned(quota).saturating_mul(1_000_000) / period;
    Some(per_sec.div_ceil(10_000).saturating_mul(10_000))
}

/// The resource properties of a `ResourceConfig`, as runc's `genV1ResourcesProperties`
/// and `genV2ResourcesProperties` make them from the kubelet's resources: all devices
/// allowed (`DevicePolicy=auto` and an empty `DeviceAllow`, the kubelet's `a *:* rwm`),
/// the memory limit (`MemoryLimit`, v2 `MemoryMax`), CPU shares (`CPUShares`, v2
/// `CPUWeight` converted as the kubelet does), the CFS period (systemd 242 and later) and
/// quota, and the PID limit with task accounting. What the config leaves unset is not
/// sent.
#[must_use]
pub fn resource_properties(
    config: &ResourceConfig,
    unified: bool,
    version: Option<u32>,
) -> Vec<Property> {
    use PropertyValue::{Bool, Pairs, Str, U64};
    let mut props = vec![
        prop("DevicePolicy", Str("auto".to_owned())),
        prop("DeviceAllow", Pairs(Vec::new())),
    ];
    if let Some(memory) = config.memory.filter(|m| *m != 0) {
        let name = if unified { "MemoryMax" } else { "MemoryLimit" };
        props.push(prop(name, U64(unsigned(memory))));
    }
    if let Some(shares) = config.cpu_shares.filter(|s| *s != 0) {
        if unified {
            props.push(prop("CPUWeight", U64(cpu_weight(shares))));
        } else {
            props.push(prop("CPUShares", U64(shares)));
        }
    }
    let quota = config.cpu_quota.unwrap_or(0);
    let period = config.cpu_period.unwrap_or(0);
    if period != 0 && version.is_some_and(|v| v >= QUOTA_PERIOD_SINCE) {
        props.push(prop("CPUQuotaPeriodUSec", U64(period)));
    }
    if let Some(per_sec) = cpu_quota_per_sec(quota, period) {
        props.push(prop("CPUQuotaPerSecUSec", U64(per_sec)));
    }
    if let Some(pids) = config.pids_limit.filter(|p| *p > 0 || *p == -1) {
        props.push(prop("TasksAccounting", Bool(true)));
        props.push(prop("TasksMax", U64(unsigned(pids))));
    }
    props
}

/// The systemd driver over these cgroup files and this connection to systemd.
pub struct SystemdManager<F, B: ?Sized> {
    files: Arc<FsCgroups<F>>,
    bus: Arc<B>,
    /// [`SLICE_STARTS`] turns to start a slice, first come first served.
    starts: tokio::sync::Semaphore,
    /// The resource settings systemd last took for each unit of ours: an update that
    /// would send the same again writes the files only (the QoS slices are updated for
    /// every new pod, mostly with what they have; each call waits on PID 1).
    settings: std::sync::Mutex<std::collections::HashMap<String, Vec<Property>>>,
}

impl<F, B: ?Sized> std::fmt::Debug for SystemdManager<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemdManager").finish_non_exhaustive()
    }
}

impl<F: CgroupFs, B: SystemdBus + ?Sized> SystemdManager<F, B> {
    /// The driver.
    pub fn new(files: FsCgroups<F>, bus: Arc<B>) -> Self {
        Self {
            files: Arc::new(files),
            bus,
            starts: tokio::sync::Semaphore::new(SLICE_STARTS),
            settings: std::sync::Mutex::default(),
        }
    }

    fn resources(&self, config: &ResourceConfig) -> Vec<Property> {
        resource_properties(config, self.files.is_unified(), self.bus.version())
    }

    /// What systemd last took for `unit`: `Some(settings)` records them, `None` forgets.
    fn remember(&self, unit: &str, settings: Option<Vec<Property>>) {
        let mut known = crate::lock::lock(&self.settings);
        match settings {
            Some(settings) => known.insert(unit.to_owned(), settings),
            None => known.remove(unit),
        };
    }

    /// Whether systemd last took exactly `settings` for `unit`.
    fn holds(&self, unit: &str, settings: &[Property]) -> bool {
        crate::lock::lock(&self.settings)
            .get(unit)
            .is_some_and(|known| known == settings)
    }

    /// Starts the cgroup's slice (runc's `Apply(-1)`): waits for its job; a job that
    /// fails is reset and an error; a job still running after the wait is logged and the
    /// work goes on, as runc does. A slice that exists already gets the settings.
    async fn start(
        &self,
        name: &CgroupName,
        unit: &str,
        config: &ResourceConfig,
    ) -> Result<(), CmError> {
        let mut props = unit_properties(unit, &name.systemd_parent(), self.files.is_unified());
        let resources = self.resources(config);
        props.extend(resources.iter().cloned());
        tracing::debug!(unit, ?props, "starting the slice");
        let started = {
            // The semaphore is never closed, so acquiring fails only in theory.
            let _turn = self.starts.acquire().await.ok();
            self.bus.start_transient_unit(unit, &props).await
        };
        match started {
            Ok(JobResult::Done) => {
                self.remember(unit, Some(resources));
                Ok(())
            }
            Ok(JobResult::TimedOut) => {
                tracing::warn!(
                    unit,
                    "systemd did not finish starting the slice in time; going on"
                );
                Ok(())
            }
            Ok(JobResult::Failed(result)) => {
                if let Err(e) = self.bus.reset_failed_unit(unit).await {
                    tracing::warn!(unit, error = %e, "could not reset the failed slice");
                }
                Err(SystemdError::Job {
                    method: "StartTransientUnit",
                    unit: unit.to_owned(),
                    result,
                }
                .into())
            }
            Err(e) if e.is(UNIT_EXISTS) => {
                tracing::debug!(unit, "the slice exists already; setting it");
                self.bus.set_unit_properties(unit, &resources).await?;
                self.remember(unit, Some(resources));
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl<F: CgroupFs, B: SystemdBus + ?Sized> CgroupManager for SystemdManager<F, B> {
    fn driver(&self) -> CgroupDriver {
        CgroupDriver::Systemd
    }

    fn exists<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<bool, CmError>> {
        let path = name.systemd_path();
        Box::pin(blocking(&self.files, move |files| Ok(files.exists(&path))))
    }

    fn create<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>> {
        Box::pin(async move {
            let Some(unit) = name.systemd_unit() else {
                return Ok(());
            };
            self.start(name, &unit, config).await?;
            // systemd made the directories of the hierarchies it manages; the others
            // (cpuset, hugetlb) are made here, and every setting is written, as the
            // kubelet's `Create` (runc's `joinCgroups`) and `Update` do.
            let (path, config) = (name.systemd_path(), config.clone());
            blocking(&self.files, move |files| files.create(&path, &config)).await
        })
    }

    fn update<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>> {
        Box::pin(async move {
            let Some(unit) = name.systemd_unit() else {
                return Ok(());
            };
            let props = self.resources(config);
            if !self.holds(&unit, &props) {
                tracing::debug!(unit, ?props, "setting the slice");
                match self.bus.set_unit_properties(&unit, &props).await {
                    Ok(()) => self.remember(&unit, Some(props)),
                    // The directory is there but systemd has no unit for it (made by an
                    // agent that crashed before its slice was started): start it now.
                    Err(e) if e.is(NO_SUCH_UNIT) => self.start(name, &unit, config).await?,
                    Err(e) => return Err(e.into()),
                }
            }
            let (path, config) = (name.systemd_path(), config.clone());
            blocking(&self.files, move |files| files.update(&path, &config)).await
        })
    }

    fn destroy<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<(), CmError>> {
        Box::pin(async move {
            let Some(unit) = name.systemd_unit() else {
                return Ok(());
            };
            let path = name.systemd_path();
            // Killed first, as the kubelet does: stopping a slice with processes inside
            // would wait out their stop timeouts.
            let kill = path.clone();
            blocking(&self.files, move |files| Ok(files.kill_processes(&kill))).await?;
            self.remember(&unit, None);
            match self.bus.stop_unit(&unit).await {
                Ok(JobResult::Done) => {}
                Ok(JobResult::TimedOut) => {
                    tracing::warn!(
                        unit,
                        "systemd did not finish stopping the slice in time; going on"
                    );
                }
                Ok(JobResult::Failed(result)) => {
                    tracing::warn!(unit, result, "stopping the slice did not finish; going on");
                }
                Err(e) if e.is(NO_SUCH_UNIT) => {
                    tracing::debug!(unit, "systemd has no such slice");
                }
                Err(e) => tracing::warn!(unit, error = %e, "could not stop the slice; going on"),
            }
            // What systemd does not manage (cpuset, hugetlb on v1), and anything systemd
            // left, is removed here.
            blocking(&self.files, move |files| files.destroy(&path)).await
        })
    }

    fn children<'a>(
        &'a self,
        name: &'a CgroupName,
    ) -> BoxFuture<'a, Result<Vec<CgroupName>, CmError>> {
        let path = name.systemd_path();
        Box::pin(async move {
            let dirs = blocking(&self.files, move |files| files.children(&path)).await?;
            // Only this slice's own child slices: a slice's name carries its whole path.
            Ok(dirs
                .iter()
                .filter(|dir| dir.ends_with(".slice"))
                .map(|dir| CgroupName::from_systemd(dir))
                .filter(|child| child.0.len() == name.0.len() + 1 && child.0.starts_with(&name.0))
                .collect())
        })
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A systemd that records the calls it gets.

    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use super::*;
    use crate::cm::cgroupfs::testing::FakeCgroupFs;

    /// A call the driver made.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        /// `StartTransientUnit`.
        Start(String, Vec<Property>),
        /// `SetUnitProperties`.
        Set(String, Vec<Property>),
        /// `StopUnit`, with how many processes had been killed by then.
        Stop(String, usize),
        /// `ResetFailedUnit`.
        ResetFailed(String),
    }

    /// Units by name; starting a unit that exists and setting or stopping one that does
    /// not are refused as systemd refuses them.
    #[derive(Debug, Default)]
    pub struct FakeSystemd {
        pub version: Option<u32>,
        pub calls: Mutex<Vec<Call>>,
        pub units: Mutex<BTreeSet<String>>,
        /// What the next start's job ends with (`Done` when none).
        pub next_start: Mutex<Option<JobResult>>,
        /// The cgroup files, to see what was killed before a stop.
        pub fs: Option<FakeCgroupFs>,
        /// When set, each start's job ends only with a permit of it.
        pub hold: Option<Arc<tokio::sync::Semaphore>>,
        /// Starts asked and not yet ended, and the most at once.
        pub starting: Mutex<(usize, usize)>,
    }

    impl FakeSystemd {
        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }

        pub fn take_calls(&self) -> Vec<Call> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }

        fn refused(method: &'static str, unit: &str, name: &str) -> SystemdError {
            SystemdError::Refused {
                method,
                unit: unit.to_owned(),
                name: name.to_owned(),
                message: format!("unit {unit}"),
            }
        }
    }

    impl SystemdBus for FakeSystemd {
        fn version(&self) -> Option<u32> {
            self.version
        }

        fn start_transient_unit<'a>(
            &'a self,
            unit: &'a str,
            properties: &'a [Property],
        ) -> BoxFuture<'a, Result<JobResult, SystemdError>> {
            self.calls
                .lock()
                .unwrap()
                .push(Call::Start(unit.to_owned(), properties.to_vec()));
            let result = if self.units.lock().unwrap().insert(unit.to_owned()) {
                Ok(self
                    .next_start
                    .lock()
                    .unwrap()
                    .take()
                    .unwrap_or(JobResult::Done))
            } else {
                Err(Self::refused("StartTransientUnit", unit, UNIT_EXISTS))
            };
            Box::pin(async move {
                {
                    let mut starting = self.starting.lock().unwrap();
                    starting.0 += 1;
                    starting.1 = starting.1.max(starting.0);
                }
                if let Some(hold) = &self.hold {
                    hold.acquire().await.expect("open").forget();
                }
                self.starting.lock().unwrap().0 -= 1;
                result
            })
        }

        fn set_unit_properties<'a>(
            &'a self,
            unit: &'a str,
            properties: &'a [Property],
        ) -> BoxFuture<'a, Result<(), SystemdError>> {
            self.calls
                .lock()
                .unwrap()
                .push(Call::Set(unit.to_owned(), properties.to_vec()));
            let result = if self.units.lock().unwrap().contains(unit) {
                Ok(())
            } else {
                Err(Self::refused("SetUnitProperties", unit, NO_SUCH_UNIT))
            };
            Box::pin(std::future::ready(result))
        }

        fn stop_unit<'a>(
            &'a self,
            unit: &'a str,
        ) -> BoxFuture<'a, Result<JobResult, SystemdError>> {
            let killed = self.fs.as_ref().map_or(0, |fs| fs.state().killed.len());
            self.calls
                .lock()
                .unwrap()
                .push(Call::Stop(unit.to_owned(), killed));
            let result = if self.units.lock().unwrap().remove(unit) {
                Ok(JobResult::Done)
            } else {
                Err(Self::refused("StopUnit", unit, NO_SUCH_UNIT))
            };
            Box::pin(std::future::ready(result))
        }

        fn reset_failed_unit<'a>(
            &'a self,
            unit: &'a str,
        ) -> BoxFuture<'a, Result<(), SystemdError>> {
            self.calls
                .lock()
                .unwrap()
                .push(Call::ResetFailed(unit.to_owned()));
            self.units.lock().unwrap().remove(unit);
            Box::pin(std::future::ready(Ok(())))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::testing::{Call, FakeSystemd};
    use super::*;
    use crate::cm::cgroupfs::testing::FakeCgroupFs;
    use crate::cm::cgroupfs::{CgroupLayout, CgroupfsManager};
    use PropertyValue::{Bool, Pairs, Str, Strs, U64};

    const CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "memory", "pids", "hugetlb"];

    fn v1_files() -> (FakeCgroupFs, FsCgroups<FakeCgroupFs>) {
        let (fs, files) = crate::cm::cgroupfs::testing::v1_files(&CONTROLLERS);
        fs.put("/cg/cpuset/cpuset.cpus", "0-1\n");
        fs.put("/cg/cpuset/cpuset.mems", "0\n");
        (fs, files)
    }

    fn v2_files() -> (FakeCgroupFs, FsCgroups<FakeCgroupFs>) {
        let fs = FakeCgroupFs::default();
        fs.create_dir_all(Path::new("/cg")).unwrap();
        fs.put(
            "/cg/cgroup.controllers",
            "cpuset cpu io memory hugetlb pids\n",
        );
        let files = FsCgroups::new(fs.clone(), CgroupLayout::V2("/cg".into()));
        (fs, files)
    }

    fn systemd(
        files: (FakeCgroupFs, FsCgroups<FakeCgroupFs>),
        version: Option<u32>,
    ) -> (
        FakeCgroupFs,
        Arc<FakeSystemd>,
        SystemdManager<FakeCgroupFs, FakeSystemd>,
    ) {
        let (fs, files) = files;
        let bus = Arc::new(FakeSystemd {
            version,
            fs: Some(fs.clone()),
            ..Default::default()
        });
        (fs, bus.clone(), SystemdManager::new(files, bus))
    }

    fn name(path: &str) -> CgroupName {
        CgroupName::from_cgroupfs(path)
    }

    fn get<'a>(props: &'a [Property], name: &str) -> Option<&'a PropertyValue> {
        props.iter().find(|p| p.name == name).map(|p| &p.value)
    }

    fn guaranteed() -> ResourceConfig {
        ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            ..Default::default()
        }
    }

    #[test]
    fn quota_per_second_is_rounded_up_to_whole_percents() {
        assert_eq!(cpu_quota_per_sec(0, 0), None);
        assert_eq!(cpu_quota_per_sec(50_000, 100_000), Some(500_000));
        // 333m: 33300 µs per 100 ms is 33.3 %, kept as 34 %.
        assert_eq!(cpu_quota_per_sec(33_300, 100_000), Some(340_000));
        // The kubelet's smallest quota, 1 ms: 1 %.
        assert_eq!(cpu_quota_per_sec(1000, 100_000), Some(10_000));
        // No period: the kernel's 100 ms.
        assert_eq!(cpu_quota_per_sec(20_000, 0), Some(200_000));
        // A period without a quota, or -1: no limit.
        assert_eq!(cpu_quota_per_sec(0, 100_000), Some(u64::MAX));
        assert_eq!(cpu_quota_per_sec(-1, 100_000), Some(u64::MAX));
    }

    #[test]
    fn slices_get_runcs_unit_properties_and_scopes_are_delegated() {
        assert_eq!(
            unit_properties("kubepods-burstable.slice", "kubepods.slice", false),
            vec![
                prop(
                    "Description",
                    Str("libcontainer container kubepods-burstable.slice".into())
                ),
                prop("Wants", Strs(vec!["kubepods.slice".into()])),
                prop("MemoryAccounting", Bool(true)),
                prop("CPUAccounting", Bool(true)),
                prop("BlockIOAccounting", Bool(true)),
                prop("DefaultDependencies", Bool(false)),
            ]
        );
        let v2 = unit_properties("kubepods.slice", "-.slice", true);
        assert_eq!(get(&v2, "IOAccounting"), Some(&Bool(true)));
        assert_eq!(get(&v2, "BlockIOAccounting"), None);
        assert_eq!(get(&v2, "Delegate"), None);
        let scope = unit_properties("cri-containerd-abc.scope", "kubepods.slice", true);
        assert_eq!(get(&scope, "Slice"), Some(&Str("kubepods.slice".into())));
        assert_eq!(get(&scope, "Delegate"), Some(&Bool(true)));
        assert_eq!(get(&scope, "Wants"), None);
    }

    #[tokio::test]
    async fn slices_are_started_a_few_at_a_time_in_the_order_pods_came() {
        let (fs, files) = v1_files();
        let hold = Arc::new(tokio::sync::Semaphore::new(0));
        let bus = Arc::new(FakeSystemd {
            version: Some(252),
            hold: Some(hold.clone()),
            fs: Some(fs),
            ..Default::default()
        });
        let m = Arc::new(SystemdManager::new(files, bus.clone()));
        let units: Vec<String> = (0..10)
            .map(|i| format!("kubepods-besteffort-pod{i}.slice"))
            .collect();
        let mut creates = Vec::new();
        for i in 0..10 {
            let m = m.clone();
            creates.push(tokio::spawn(async move {
                let pod = name(&format!("/kubepods/besteffort/pod{i}"));
                m.create(&pod, &ResourceConfig::default()).await
            }));
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        let asked = |bus: &FakeSystemd| -> Vec<String> {
            bus.calls()
                .into_iter()
                .filter_map(|c| match c {
                    Call::Start(unit, _) => Some(unit),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            asked(&bus),
            units[..SLICE_STARTS],
            "the first pods' slices only"
        );
        hold.add_permits(units.len());
        for create in creates {
            create.await.unwrap().unwrap();
        }
        assert_eq!(asked(&bus), units, "in the order the pods came");
        assert_eq!(*bus.starting.lock().unwrap(), (0, SLICE_STARTS));
    }

    #[tokio::test]
    async fn a_guaranteed_pod_slice_on_v1() {
        let (fs, bus, m) = systemd(v1_files(), Some(252));
        let pod = name("/kubepods/pod1234-abcd");
        m.create(&pod, &guaranteed()).await.unwrap();
        let [Call::Start(unit, props)] = &bus.calls()[..] else {
            panic!("{:?}", bus.calls())
        };
        assert_eq!(unit, "kubepods-pod1234_abcd.slice");
        assert_eq!(
            props,
            &vec![
                prop(
                    "Description",
                    Str("libcontainer container kubepods-pod1234_abcd.slice".into())
                ),
                prop("Wants", Strs(vec!["kubepods.slice".into()])),
                prop("MemoryAccounting", Bool(true)),
                prop("CPUAccounting", Bool(true)),
                prop("BlockIOAccounting", Bool(true)),
                prop("DefaultDependencies", Bool(false)),
                prop("DevicePolicy", Str("auto".into())),
                prop("DeviceAllow", Pairs(vec![])),
                prop("MemoryLimit", U64(64 << 20)),
                prop("CPUShares", U64(512)),
                prop("CPUQuotaPeriodUSec", U64(100_000)),
                prop("CPUQuotaPerSecUSec", U64(500_000)),
            ]
        );
        // The files at the slice's directory, in every hierarchy.
        let dir = "kubepods.slice/kubepods-pod1234_abcd.slice";
        assert!(m.exists(&pod).await.unwrap());
        assert_eq!(
            fs.file(&format!("/cg/cpu/{dir}/cpu.shares")).as_deref(),
            Some("512")
        );
        assert_eq!(
            fs.file(&format!("/cg/cpu/{dir}/cpu.cfs_quota_us"))
                .as_deref(),
            Some("50000")
        );
        assert_eq!(
            fs.file(&format!("/cg/memory/{dir}/memory.limit_in_bytes"))
                .as_deref(),
            Some("67108864")
        );
        assert_eq!(
            fs.file(&format!("/cg/cpuset/{dir}/cpuset.cpus")).as_deref(),
            Some("0-1")
        );
        assert_eq!(
            fs.file(&format!("/cg/hugetlb/{dir}/hugetlb.2MB.limit_in_bytes"))
                .as_deref(),
            Some("0")
        );
    }

    #[tokio::test]
    async fn burstable_and_best_effort_slices_and_no_period_before_systemd_242() {
        let (_, bus, m) = systemd(v1_files(), Some(237));
        // Burstable without limits: shares only.
        let burstable = ResourceConfig {
            cpu_shares: Some(102),
            ..Default::default()
        };
        m.create(&name("/kubepods/burstable/podb"), &burstable)
            .await
            .unwrap();
        // BestEffort: the fewest shares.
        let best_effort = ResourceConfig {
            cpu_shares: Some(2),
            ..Default::default()
        };
        m.create(&name("/kubepods/besteffort/pode"), &best_effort)
            .await
            .unwrap();
        // Burstable with a CPU limit on systemd 237: a quota, no period property.
        let limited = ResourceConfig {
            cpu_shares: Some(102),
            cpu_quota: Some(20_000),
            cpu_period: Some(100_000),
            memory: Some(32 << 20),
            ..Default::default()
        };
        m.create(&name("/kubepods/burstable/podl"), &limited)
            .await
            .unwrap();
        let calls = bus.calls();
        let starts: Vec<(&str, &[Property])> = calls
            .iter()
            .map(|c| match c {
                Call::Start(u, p) => (u.as_str(), &p[6..]),
                other => panic!("{other:?}"),
            })
            .collect();
        let devices = [
            prop("DevicePolicy", Str("auto".into())),
            prop("DeviceAllow", Pairs(vec![])),
        ];
        assert_eq!(starts[0].0, "kubepods-burstable-podb.slice");
        assert_eq!(
            starts[0].1,
            [&devices[..], &[prop("CPUShares", U64(102))]].concat()
        );
        assert_eq!(starts[1].0, "kubepods-besteffort-pode.slice");
        assert_eq!(
            starts[1].1,
            [&devices[..], &[prop("CPUShares", U64(2))]].concat()
        );
        assert_eq!(starts[2].0, "kubepods-burstable-podl.slice");
        assert_eq!(
            starts[2].1,
            [
                &devices[..],
                &[
                    prop("MemoryLimit", U64(32 << 20)),
                    prop("CPUShares", U64(102)),
                    prop("CPUQuotaPerSecUSec", U64(200_000)),
                ]
            ]
            .concat()
        );
        let Call::Start(_, first) = &calls[0] else {
            unreachable!()
        };
        assert_eq!(
            get(first, "Wants"),
            Some(&Strs(vec!["kubepods-burstable.slice".into()]))
        );
    }

    #[tokio::test]
    async fn v2_sends_weight_and_memory_max_and_writes_v2_files() {
        let (fs, bus, m) = systemd(v2_files(), Some(252));
        let node = ResourceConfig {
            cpu_shares: Some(2048),
            memory: Some(4 << 30),
            pids_limit: Some(32768),
            ..Default::default()
        };
        m.create(&name("/kubepods"), &node).await.unwrap();
        m.create(&name("/kubepods/podg"), &guaranteed())
            .await
            .unwrap();
        let calls = bus.calls();
        let Call::Start(unit, props) = &calls[0] else {
            unreachable!()
        };
        assert_eq!(unit, "kubepods.slice");
        assert_eq!(get(props, "Wants"), Some(&Strs(vec!["-.slice".into()])));
        assert_eq!(get(props, "IOAccounting"), Some(&Bool(true)));
        assert_eq!(get(props, "MemoryMax"), Some(&U64(4 << 30)));
        assert_eq!(get(props, "MemoryLimit"), None);
        assert_eq!(get(props, "CPUWeight"), Some(&U64(cpu_weight(2048))));
        assert_eq!(get(props, "CPUShares"), None);
        assert_eq!(get(props, "TasksAccounting"), Some(&Bool(true)));
        assert_eq!(get(props, "TasksMax"), Some(&U64(32768)));
        let Call::Start(_, pod) = &calls[1] else {
            unreachable!()
        };
        assert_eq!(get(pod, "CPUWeight"), Some(&U64(cpu_weight(512))));
        assert_eq!(get(pod, "MemoryMax"), Some(&U64(64 << 20)));
        assert_eq!(get(pod, "CPUQuotaPerSecUSec"), Some(&U64(500_000)));
        let dir = "/cg/kubepods.slice/kubepods-podg.slice";
        assert_eq!(
            fs.file(&format!("{dir}/cpu.max")).as_deref(),
            Some("50000 100000")
        );
        assert_eq!(
            fs.file(&format!("{dir}/memory.max")).as_deref(),
            Some("67108864")
        );
        assert_eq!(
            fs.file("/cg/kubepods.slice/pids.max").as_deref(),
            Some("32768")
        );
    }

    /// The same settings through either driver leave the same values in the kernel's
    /// files, each at its own directory.
    #[tokio::test]
    async fn both_drivers_write_the_same_values() {
        for unified in [false, true] {
            let files = || if unified { v2_files() } else { v1_files() };
            let (cfs, cfiles) = files();
            let cgroupfs = CgroupfsManager::new(cfiles);
            let (sfs, _, systemd) = systemd(files(), Some(252));
            let configs = [
                (
                    "/kubepods",
                    ResourceConfig {
                        cpu_shares: Some(2048),
                        memory: Some(4 << 30),
                        pids_limit: Some(4096),
                        ..Default::default()
                    },
                ),
                (
                    "/kubepods/burstable",
                    ResourceConfig {
                        cpu_shares: Some(768),
                        ..Default::default()
                    },
                ),
                (
                    "/kubepods/burstable/podx",
                    ResourceConfig {
                        cpu_shares: Some(341),
                        cpu_quota: Some(33_300),
                        cpu_period: Some(100_000),
                        memory: Some(100 << 20),
                        ..Default::default()
                    },
                ),
            ];
            for (path, config) in &configs {
                cgroupfs.create(&name(path), config).await.unwrap();
                systemd.create(&name(path), config).await.unwrap();
            }
            let cstate = cfs.state();
            let sstate = sfs.state();
            let written = |files: &std::collections::BTreeMap<std::path::PathBuf, String>| {
                files
                    .iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(p, v)| {
                        (
                            p.file_name().unwrap().to_owned(),
                            p.components().count(),
                            v.clone(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            let mut c = written(&cstate.files);
            let mut s = written(&sstate.files);
            c.sort();
            s.sort();
            assert_eq!(c, s, "unified: {unified}");
            let quota = if unified {
                "/cg/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/cpu.max"
            } else {
                "/cg/cpu/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/cpu.cfs_quota_us"
            };
            let want = if unified { "33300 100000" } else { "33300" };
            assert_eq!(
                sstate.files.get(Path::new(quota)).map(String::as_str),
                Some(want)
            );
        }
    }

    #[tokio::test]
    async fn update_sets_the_unit_and_the_files() {
        let (fs, bus, m) = systemd(v1_files(), Some(252));
        let burstable = name("/kubepods/burstable");
        m.create(&name("/kubepods"), &ResourceConfig::default())
            .await
            .unwrap();
        m.create(
            &burstable,
            &ResourceConfig {
                cpu_shares: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        bus.take_calls();
        m.update(
            &burstable,
            &ResourceConfig {
                cpu_shares: Some(768),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(
            bus.calls(),
            [Call::Set(
                "kubepods-burstable.slice".into(),
                vec![
                    prop("DevicePolicy", Str("auto".into())),
                    prop("DeviceAllow", Pairs(vec![])),
                    prop("CPUShares", U64(768)),
                ]
            )]
        );
        assert_eq!(
            fs.file("/cg/cpu/kubepods.slice/kubepods-burstable.slice/cpu.shares")
                .as_deref(),
            Some("768")
        );
        // The same settings again: systemd holds them, only the files are written.
        fs.put(
            "/cg/cpu/kubepods.slice/kubepods-burstable.slice/cpu.shares",
            "2",
        );
        bus.take_calls();
        m.update(
            &burstable,
            &ResourceConfig {
                cpu_shares: Some(768),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert!(bus.calls().is_empty(), "{:?}", bus.calls());
        assert_eq!(
            fs.file("/cg/cpu/kubepods.slice/kubepods-burstable.slice/cpu.shares")
                .as_deref(),
            Some("768")
        );
    }

    #[tokio::test]
    async fn a_directory_without_its_unit_is_started_on_update() {
        let (fs, bus, m) = systemd(v1_files(), Some(252));
        // Left by an agent that died between its mkdir and its unit.
        for h in CONTROLLERS {
            fs.create_dir_all(&Path::new("/cg").join(h).join("kubepods.slice"))
                .unwrap();
        }
        let kubepods = name("/kubepods");
        assert!(m.exists(&kubepods).await.unwrap());
        m.update(
            &kubepods,
            &ResourceConfig {
                cpu_shares: Some(1024),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let calls = bus.calls();
        assert!(
            matches!(&calls[..], [Call::Set(..), Call::Start(unit, _)] if unit == "kubepods.slice"),
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn an_existing_unit_is_set_and_a_failed_start_is_reset() {
        let (_, bus, m) = systemd(v1_files(), Some(252));
        bus.units.lock().unwrap().insert("kubepods.slice".into());
        let config = ResourceConfig {
            cpu_shares: Some(2048),
            ..Default::default()
        };
        m.create(&name("/kubepods"), &config).await.unwrap();
        let calls = bus.take_calls();
        assert!(
            matches!(&calls[..], [Call::Start(..), Call::Set(unit, props)]
            if unit == "kubepods.slice" && get(props, "CPUShares") == Some(&U64(2048))),
            "{calls:?}"
        );

        *bus.next_start.lock().unwrap() = Some(JobResult::Failed("failed".into()));
        let err = m
            .create(&name("/kubepods/podf"), &config)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("StartTransientUnit(kubepods-podf.slice) ended failed"),
            "{err}"
        );
        assert_eq!(
            bus.take_calls()[1],
            Call::ResetFailed("kubepods-podf.slice".into())
        );

        // A job still running after the wait: the work goes on.
        *bus.next_start.lock().unwrap() = Some(JobResult::TimedOut);
        m.create(&name("/kubepods/podt"), &config).await.unwrap();
        assert!(m.exists(&name("/kubepods/podt")).await.unwrap());
    }

    #[tokio::test]
    async fn destroy_kills_then_stops_then_removes() {
        let (fs, bus, m) = systemd(v1_files(), Some(252));
        let pod = name("/kubepods/besteffort/pod5-6");
        for level in ["/kubepods", "/kubepods/besteffort"] {
            m.create(&name(level), &ResourceConfig::default())
                .await
                .unwrap();
        }
        m.create(&pod, &ResourceConfig::default()).await.unwrap();
        let dir = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5_6.slice";
        // A container scope with a process left in it.
        fs.create_dir_all(
            &Path::new("/cg/memory")
                .join(dir)
                .join("cri-containerd-c1.scope"),
        )
        .unwrap();
        fs.put(
            &format!("/cg/memory/{dir}/cri-containerd-c1.scope/cgroup.procs"),
            "42\n",
        );
        bus.take_calls();
        m.destroy(&pod).await.unwrap();
        // Killed before the stop.
        assert_eq!(
            bus.calls(),
            [Call::Stop("kubepods-besteffort-pod5_6.slice".into(), 1)]
        );
        assert_eq!(fs.state().killed, [42]);
        for h in CONTROLLERS {
            assert!(!fs.exists(&Path::new("/cg").join(h).join(dir)), "{h}");
        }
        assert!(fs.exists(Path::new(
            "/cg/cpu/kubepods.slice/kubepods-besteffort.slice"
        )));
        // Gone already, unit and all: nothing to do.
        m.destroy(&pod).await.unwrap();
    }

    #[tokio::test]
    async fn children_are_the_slices_own_child_slices() {
        let (fs, _, m) = systemd(v1_files(), Some(252));
        let kubepods = name("/kubepods");
        for path in [
            "/kubepods",
            "/kubepods/burstable",
            "/kubepods/pod1-2",
            "/kubepods/burstable/pod3",
        ] {
            m.create(&name(path), &ResourceConfig::default())
                .await
                .unwrap();
        }
        fs.create_dir_all(Path::new("/cg/cpu/kubepods.slice/cri-containerd-x.scope"))
            .unwrap();
        let mut children = m.children(&kubepods).await.unwrap();
        children.sort_by_key(|c| c.0.clone());
        assert_eq!(
            children,
            [name("/kubepods/burstable"), name("/kubepods/pod1-2")]
        );
    }
}
