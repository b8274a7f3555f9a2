//! The stats housekeeping: cAdvisor's housekeeping as the kubelet runs it
//! (`--housekeeping-interval`, 10 s). One background task reads the node every
//! [`HOUSEKEEPING_INTERVAL`] and publishes the reading ([`Figures`]) behind an `Arc`,
//! swapped whole; `/metrics/cadvisor`, `/metrics/resource`, `/stats/summary`, the volume
//! gauges of `/metrics` and the eviction manager read the last one and never read the
//! node themselves. CPU rates come from two consecutive readings (cAdvisor's two
//! samples); a second reading follows the first after [`FIRST_RATES_AFTER`], so that the
//! first scrape has rates, as the kubelet's first answer has (cAdvisor has housekept each
//! container since it started). The volume figures are read in the same pass (the
//! kubelet's volume stats calculator runs in the background too).
//!
//! A caller that needs figures no older than some age (the eviction manager, the
//! kubelet's `Get(updateStats=true)`) asks [`Housekeeping::updated`]: a reading younger
//! than that is shared, else a pass is made now, once for all who wait for it, and the
//! next periodic pass counts from it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::provider::{Figures, StatsProvider};
use super::volume::{PersistentVolumeMetrics, SpecVolume};
use super::{StatsConfig, StatsError};
use crate::cri::Cri;
use crate::node::MachineInfo;
use crate::pod::store::PodStore;

/// How often the node is read (cAdvisor's housekeeping interval as the kubelet sets it).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);
/// When the second reading follows the first, for the first CPU rates.
pub const FIRST_RATES_AFTER: Duration = Duration::from_secs(1);
/// How long a request waits for the very first reading.
const FIRST_READING_WAIT: Duration = Duration::from_secs(10);

/// One published reading: the figures, or why they could not be read.
pub type Reading = Arc<Result<Figures, StatsError>>;

/// The housekeeping of this node: the runtime through CRI, the machine through Linux.
pub type LinuxHousekeeping = Housekeeping<crate::cri::CriClient, crate::node::LinuxMachine>;

/// The pods whose volumes are measured: the pod specs of the node.
pub trait PodSpecs: Send + Sync {
    /// Every pod known to run here.
    fn pods(&self) -> Vec<Arc<Pod>>;
}

impl PodSpecs for PodStore {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.store
            .state()
            .into_iter()
            .chain(self.statics.pods())
            .collect()
    }
}

#[derive(Clone)]
struct Published {
    at: Instant,
    reading: Reading,
}

/// The housekeeping and its last reading.
pub struct Housekeeping<C, M> {
    provider: StatsProvider,
    node_name: String,
    cri: C,
    machine: M,
    pods: Box<dyn PodSpecs>,
    persistent: Box<dyn PersistentVolumeMetrics>,
    latest: watch::Sender<Option<Published>>,
    pass: tokio::sync::Mutex<()>,
    /// [`FIRST_RATES_AFTER`] and [`HOUSEKEEPING_INTERVAL`].
    periods: (Duration, Duration),
}

impl<C, M> std::fmt::Debug for Housekeeping<C, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Housekeeping")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl<C: Cri, M: MachineInfo + Clone + 'static> Housekeeping<C, M> {
    /// The housekeeping of node `node_name`, reading where `config` says, through `cri`
    /// and `machine`, the volumes of the specs `pods` has; claims and CSI volumes through
    /// `persistent`. Nothing is read until [`Self::run`] or [`Self::updated`].
    pub fn new(
        config: StatsConfig,
        node_name: String,
        (cri, machine): (C, M),
        pods: Box<dyn PodSpecs>,
        persistent: Box<dyn PersistentVolumeMetrics>,
    ) -> Self {
        Self {
            provider: StatsProvider::new(config),
            node_name,
            cri,
            machine,
            pods,
            persistent,
            latest: watch::Sender::new(None),
            pass: tokio::sync::Mutex::default(),
            periods: (FIRST_RATES_AFTER, HOUSEKEEPING_INTERVAL),
        }
    }

    /// The last reading; waits for the first one (at most 10 s, else `None`).
    pub async fn latest(&self) -> Option<Reading> {
        let mut rx = self.latest.subscribe();
        let first = tokio::time::timeout(FIRST_READING_WAIT, rx.wait_for(Option::is_some)).await;
        let published = first.ok()?.ok()?.clone()?;
        Some(published.reading)
    }

    /// The last reading, if there is one yet.
    #[must_use]
    pub fn current(&self) -> Option<Reading> {
        self.latest
            .borrow()
            .as_ref()
            .map(|p| Arc::clone(&p.reading))
    }

    /// A reading at most `max_age` old: the last one if it is, else a new one (made once
    /// for every caller waiting at the same time).
    pub async fn updated(&self, max_age: Duration) -> Reading {
        let asked = Instant::now();
        let fresh = |p: &Option<Published>| {
            p.as_ref()
                .filter(|p| p.at + max_age >= asked)
                .map(|p| Arc::clone(&p.reading))
        };
        if let Some(reading) = fresh(&self.latest.borrow()) {
            return reading;
        }
        let _pass = self.pass.lock().await;
        // A pass made while this one waited for the lock is fresh enough.
        if let Some(reading) = fresh(&self.latest.borrow()).filter(|_| max_age > Duration::ZERO) {
            return reading;
        }
        let at = Instant::now();
        let reading = Arc::new(self.read().await);
        if let Err(e) = reading.as_ref() {
            tracing::warn!(error = %e, "stats housekeeping could not read the node");
        }
        self.latest.send_replace(Some(Published {
            at,
            reading: Arc::clone(&reading),
        }));
        reading
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn read(&self) -> Result<Figures, StatsError> {
        let volumes: HashMap<String, Vec<SpecVolume>> = self
            .pods
            .pods()
            .iter()
            .filter_map(|p| Some((p.metadata.uid.clone()?, SpecVolume::all_of(p))))
            .collect();
        self.provider
            .read(
                &self.node_name,
                &self.cri,
                &self.machine,
                volumes,
                self.persistent.as_ref(),
            )
            .await
    }

    /// Reads the node every [`HOUSEKEEPING_INTERVAL`] (counted from the last reading,
    /// whoever made it) until `stop` fires; the second reading after
    /// [`FIRST_RATES_AFTER`].
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut passes = 0u32;
        loop {
            let (first, every) = self.periods;
            let period = if passes < 2 { first } else { every };
            let last = self.latest.borrow().as_ref().map(|p| p.at);
            if let Some(at) = last.filter(|at| at.elapsed() < period) {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep_until(at + period) => {}
                }
                continue;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                _ = self.updated(period) => passes += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::api;
    use crate::stats::testing::Machine;
    use crate::stats::volume::NoPersistentVolumes;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A runtime with one pod and no containers, counting how often it is listed.
    struct Runtime {
        lists: Arc<AtomicUsize>,
    }

    impl Cri for Runtime {
        async fn list_pod_sandbox(
            &self,
            _: api::ListPodSandboxRequest,
        ) -> crate::cri::Result<api::ListPodSandboxResponse> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            Ok(api::ListPodSandboxResponse::default())
        }
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> crate::cri::Result<api::ListContainersResponse> {
            Ok(api::ListContainersResponse::default())
        }
        async fn list_container_stats(
            &self,
            _: api::ListContainerStatsRequest,
        ) -> crate::cri::Result<api::ListContainerStatsResponse> {
            Ok(api::ListContainerStatsResponse::default())
        }
    }

    struct NoPods;
    impl PodSpecs for NoPods {
        fn pods(&self) -> Vec<Arc<Pod>> {
            Vec::new()
        }
    }

    /// The housekeeping of a node with nothing on it, its second reading after 200 ms and
    /// the next ones every 2 s (the real ones are 1 s and 10 s).
    fn housekeeping(lists: Arc<AtomicUsize>) -> Arc<Housekeeping<Runtime, Machine>> {
        let mut h = Housekeeping::new(
            StatsConfig {
                proc: "/nonexistent-proc".into(),
                root_dir: "/nonexistent-root".into(),
                pods_cgroup: None,
            },
            "n1".into(),
            (Runtime { lists }, Machine),
            Box::new(NoPods),
            Box::new(NoPersistentVolumes),
        );
        h.periods = (Duration::from_millis(200), Duration::from_secs(2));
        Arc::new(h)
    }

    #[tokio::test]
    async fn one_reading_every_interval_shared_by_every_reader() {
        let counter = Arc::new(AtomicUsize::new(0));
        let h = housekeeping(Arc::clone(&counter));
        let lists = || counter.load(Ordering::SeqCst);
        let sleep = |ms| tokio::time::sleep(Duration::from_millis(ms));
        let stop = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&h).run(stop.clone()));
        let first = h.latest().await.expect("a first reading");
        assert_eq!(
            first.as_ref().as_ref().unwrap().summary.node.node_name,
            "n1"
        );
        // t = 0.5 s: the second reading came at 0.2 s, for rates.
        sleep(500).await;
        assert_eq!(lists(), 2);
        // t = 1.5 s: every reader shares the last reading; none reads the node.
        sleep(1000).await;
        for _ in 0..100 {
            assert!(h.latest().await.unwrap().as_ref().is_ok());
        }
        assert_eq!(lists(), 2, "a scrape never reads the node");
        // t = 3 s: the third reading came at 2.2 s.
        sleep(1500).await;
        assert_eq!(lists(), 3);
        // A reading young enough is shared; an older one is read anew (t = 3.5 s), and
        // the next periodic pass counts from it (5.5 s, not 4.2 s).
        h.updated(Duration::from_secs(5)).await;
        assert_eq!(lists(), 3);
        sleep(500).await;
        h.updated(Duration::from_secs(1)).await;
        assert_eq!(lists(), 4);
        sleep(1500).await;
        assert_eq!(
            lists(),
            4,
            "the next pass is an interval after the forced one"
        );
        sleep(1000).await;
        assert_eq!(lists(), 5);
        stop.cancel();
        task.await.unwrap();
    }
}
