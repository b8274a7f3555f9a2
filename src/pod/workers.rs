//! Pod workers: one task per pod UID, the kubelet's `podWorkers`. A worker never runs two
//! syncs of its pod at once; pods sync in parallel. Updates that arrive during a sync are
//! coalesced: the worker then syncs once more with the newest spec. A wake-up says why
//! ([`WakeFor`]): one that only changes what the pod's status shows refreshes the status
//! between syncs, with no sync, and one for a runtime change that the pod's last sync
//! already read is let go.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, watch};
use tracing::Instrument;

use super::PodId;
use super::state::{PodStates, WakeFor};

/// A pod's wish as the worker sees it.
#[derive(Debug, Clone)]
pub enum PodWork {
    /// Run the pod (or, when it has a deletionTimestamp, terminate it gracefully).
    Sync(Arc<Pod>),
    /// The pod is gone from the API (or never was: an orphan found in the runtime): stop
    /// and remove everything of it.
    Remove(PodId),
}

/// What a sync asks of its worker next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Sync again after this long unless something happens first.
    ResyncAfter(Duration),
    /// The pod is gone: the worker ends.
    Done,
}

/// The pod-level work a worker does: implemented by the kubelet, faked in tests.
pub trait PodSyncer: Send + Sync + 'static {
    /// One sync of the pod towards its wish.
    fn sync(&self, work: &PodWork) -> impl Future<Output = Next> + Send;

    /// Generates the pod's status anew from what its last sync read (a probe result
    /// changed), with no sync; `false` when it cannot, and the worker then syncs.
    fn refresh(&self, _work: &PodWork) -> bool {
        false
    }

    /// Whether the pod's last sync acted on all of the runtime state the runtime now
    /// reports (it read it, or left it so by its own doing): a wake-up for a change of it
    /// then needs no sync.
    fn saw_runtime(&self, _work: &PodWork) -> bool {
        false
    }

    /// Whether the termination of the pod under way still stops what runs of it: a
    /// shorter grace period (a second delete, the pod gone from the API) restarts it only
    /// then.
    fn stopping(&self, _uid: &str) -> bool {
        true
    }
}

/// A worker's wake-up: the reasons asked since it last looked ([`WakeFor`] bits), and the
/// notification.
#[derive(Default)]
struct Wakeup {
    asked: AtomicU8,
    notify: Notify,
}

const fn bit(why: WakeFor) -> u8 {
    match why {
        WakeFor::Sync => 1,
        WakeFor::Status => 2,
        WakeFor::Runtime => 4,
    }
}

impl Wakeup {
    fn ask(&self, why: WakeFor) {
        self.asked.fetch_or(bit(why), Ordering::AcqRel);
        self.notify.notify_one();
    }

    /// Waits for a wake-up; returns the reasons asked meanwhile.
    async fn asked(&self) -> u8 {
        self.notify.notified().await;
        self.asked.swap(0, Ordering::AcqRel)
    }
}

struct Worker {
    work: watch::Sender<PodWork>,
    wake: Arc<Wakeup>,
}

/// All pod workers of the node. Cheap to clone.
pub struct PodWorkers<S> {
    syncer: Arc<S>,
    workers: Arc<Mutex<HashMap<String, Worker>>>,
    /// The node's per-pod state: a pod is forgotten in it as its worker ends.
    states: PodStates,
}

impl<S> Clone for PodWorkers<S> {
    fn clone(&self) -> Self {
        Self {
            syncer: self.syncer.clone(),
            workers: self.workers.clone(),
            states: self.states.clone(),
        }
    }
}

/// The grace period of a termination: the pod is being deleted.
fn terminating_grace(work: &PodWork) -> Option<i64> {
    match work {
        PodWork::Sync(pod) if super::is_terminating(pod) => {
            Some(super::termination_grace_period(pod))
        }
        _ => None,
    }
}

/// Returns once newer work asks the pod to end sooner than within `grace` seconds while
/// `stopping` says the termination still stops what runs of the pod (after that, the
/// termination's steps take no grace period: the agent's own final delete, and the pod
/// leaving the API, let it finish); never if the channel closes first.
async fn shorter_grace(rx: &mut watch::Receiver<PodWork>, grace: i64, stopping: impl Fn() -> bool) {
    loop {
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
        let shorter = match &*rx.borrow() {
            PodWork::Sync(pod) => {
                terminating_grace(&PodWork::Sync(pod.clone())).is_some_and(|g| g < grace)
            }
            // Gone from the API (a forced delete): what is left goes within the orphans'
            // grace period.
            PodWork::Remove(_) => super::ORPHAN_GRACE_SECONDS < grace,
        };
        if shorter && stopping() {
            // Seen again by the worker's next turn.
            rx.mark_changed();
            return;
        }
    }
}

impl<S: PodSyncer> PodWorkers<S> {
    /// Workers that sync pods with `syncer`, forgetting a pod in `states` once its
    /// worker ends.
    pub fn new(syncer: Arc<S>, states: PodStates) -> Self {
        Self {
            syncer,
            workers: Arc::default(),
            states,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Worker>> {
        crate::lock::lock(&self.workers)
    }

    /// Hands new work to a pod's worker, starting the worker if it has none.
    pub fn update(&self, uid: &str, work: PodWork) {
        let mut workers = self.lock();
        if let Some(w) = workers.get(uid) {
            w.work.send_if_modified(|current| match (&*current, &work) {
                // A removal is final: a late update must not bring the pod back.
                (PodWork::Remove(_), _) => false,
                // The next sync sees the newest pod; a new status alone wakes no one.
                (PodWork::Sync(old), PodWork::Sync(new))
                    if !super::differs_semantically(old, new) =>
                {
                    *current = work;
                    false
                }
                _ => {
                    *current = work;
                    true
                }
            });
            return;
        }
        if let PodWork::Sync(pod) = &work {
            // The kubelet's `kubelet_containers_per_pod_count`, as it handles a new pod.
            let containers = pod.spec.as_ref().map_or(0, |s| s.containers.len());
            crate::metrics::observe_containers_per_pod(containers);
        }
        let (tx, rx) = watch::channel(work);
        let wake = Arc::new(Wakeup::default());
        workers.insert(
            uid.to_owned(),
            Worker {
                work: tx,
                wake: wake.clone(),
            },
        );
        let this = self.clone();
        let uid = uid.to_owned();
        let seen = std::time::Instant::now();
        tokio::spawn(async move {
            // The kubelet's `kubelet_pod_worker_start_duration_seconds`: from seeing the pod
            // to its worker starting.
            crate::metrics::observe_pod_worker_start(seen.elapsed());
            this.run_worker(uid, rx, wake).await;
        });
    }

    /// Wakes a pod's worker: for a sync, or to refresh its status only.
    pub fn wake(&self, uid: &str, why: WakeFor) {
        if let Some(w) = self.lock().get(uid) {
            w.wake.ask(why);
        }
    }

    /// The UIDs that have a worker.
    #[must_use]
    pub fn uids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Removes every pod whose UID is not in `listed`: after a full list of the API's
    /// pods (a watch that was down), those were deleted while nobody watched.
    pub fn remove_unlisted(&self, listed: &std::collections::HashSet<String>) {
        let gone: Vec<(String, PodId)> = self
            .lock()
            .iter()
            .filter(|(uid, _)| !listed.contains(*uid))
            .filter_map(|(uid, w)| match &*w.work.borrow() {
                PodWork::Sync(pod) => PodId::of(pod).map(|id| (uid.clone(), id)),
                PodWork::Remove(_) => None,
            })
            .collect();
        for (uid, id) in gone {
            tracing::info!(pod = %id, "pod gone from the API while the watch was down");
            self.update(&uid, PodWork::Remove(id));
        }
    }

    async fn run_worker(self, uid: String, mut rx: watch::Receiver<PodWork>, wake: Arc<Wakeup>) {
        let mut first = true;
        // The root of the pod's span tree, from the moment its worker saw it until the
        // worker ends: every sync is a child (the pod's start-up timeline).
        let pod_span = {
            let work = rx.borrow();
            let key = match &*work {
                PodWork::Sync(p) => format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
                PodWork::Remove(id) => format!("{}/{}", id.namespace, id.name),
            };
            tracing::info_span!(crate::timeline::POD_SPAN, pod_uid = %uid, pod = %key)
        };
        loop {
            let work = rx.borrow_and_update().clone();
            let operation = match &work {
                PodWork::Sync(p) if !super::is_terminating(p) => {
                    if std::mem::take(&mut first) {
                        "create"
                    } else {
                        "sync"
                    }
                }
                _ => "kill",
            };
            let started = std::time::Instant::now();
            let (namespace, name) = match &work {
                PodWork::Sync(p) => (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                ),
                PodWork::Remove(id) => (id.namespace.clone(), id.name.clone()),
            };
            let span = tracing::info_span!(parent: &pod_span, "sync_pod", pod_uid = %uid, pod = %format!("{namespace}/{name}"), operation);
            // Boxed: the deep state of a sync lives on the heap only while it runs, and an
            // idle worker stays small.
            let sync = Box::pin(self.syncer.sync(&work)).instrument(span);
            let next = match terminating_grace(&work) {
                // A termination under way gives way to a shorter grace period (a second
                // delete): every step of it is idempotent, so it starts again with the new
                // one, and the runtime gets the shorter stop timeout.
                Some(grace) => tokio::select! {
                    next = sync => next,
                    () = shorter_grace(&mut rx, grace, || self.syncer.stopping(&uid)) => {
                        tracing::info!(pod_uid = %uid, "a shorter grace period shortens the termination under way");
                        Next::ResyncAfter(Duration::ZERO)
                    }
                },
                None => sync.await,
            };
            crate::metrics::observe_pod_worker(operation, started.elapsed());
            match next {
                Next::Done => break,
                Next::ResyncAfter(after) => {
                    // Waiting for the next sync is a step of the pod's timeline too: what
                    // ended it says what the pod waited for.
                    let waiting = tracing::info_span!(parent: &pod_span, crate::timeline::WAIT_SPAN, until = tracing::field::Empty);
                    let Some(until) = self.wait(&mut rx, &wake, after).await else {
                        break;
                    };
                    waiting.record("until", until);
                }
            }
        }
        // The worker ends only after its pod is gone: what the node remembers of the pod
        // goes with it, in every module at once. New work that raced in starts anew (and
        // its worker forgets the pod again when it ends).
        self.states.forget(&uid);
        let raced = {
            let mut workers = self.lock();
            workers.remove(&uid);
            rx.has_changed()
                .unwrap_or(false)
                .then(|| rx.borrow().clone())
        };
        if let Some(work @ PodWork::Sync(_)) = raced {
            self.update(&uid, work);
        }
    }

    /// Waits for the pod's next sync: newer work, a wake-up for a sync, or `after`.
    /// Wake-ups that only refresh the status are handled meanwhile. Returns what ended
    /// the wait, `None` once the pod's work channel closed.
    async fn wait(
        &self,
        rx: &mut watch::Receiver<PodWork>,
        wake: &Wakeup,
        after: Duration,
    ) -> Option<&'static str> {
        let resync = tokio::time::sleep(after);
        tokio::pin!(resync);
        loop {
            tokio::select! {
                changed = rx.changed() => return changed.is_ok().then_some("pod update"),
                asked = wake.asked() => {
                    if asked & bit(WakeFor::Sync) != 0 {
                        return Some("probe or source");
                    }
                    let work = rx.borrow().clone();
                    if asked & bit(WakeFor::Runtime) != 0 && !self.syncer.saw_runtime(&work) {
                        return Some("runtime event");
                    }
                    if asked & bit(WakeFor::Status) != 0 && !self.syncer.refresh(&work) {
                        return Some("probe");
                    }
                }
                () = &mut resync => return Some("resync"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Recorder {
        running: AtomicUsize,
        max_running: AtomicUsize,
        syncs: Mutex<Vec<String>>,
        /// Whether a status refresh can be done without a sync; those done.
        refreshes: (std::sync::atomic::AtomicBool, AtomicUsize),
        /// Whether the last sync saw the runtime's state.
        saw: std::sync::atomic::AtomicBool,
    }

    impl Recorder {
        fn saw(&self, sync: &str) -> bool {
            self.syncs.lock().unwrap().iter().any(|s| s == sync)
        }
    }

    impl PodSyncer for Recorder {
        async fn sync(&self, work: &PodWork) -> Next {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            let label = match work {
                PodWork::Sync(p) => format!("sync {}", p.metadata.name.clone().unwrap_or_default()),
                PodWork::Remove(id) => format!("remove {}", id.name),
            };
            self.syncs.lock().unwrap().push(label);
            match work {
                PodWork::Remove(_) => Next::Done,
                PodWork::Sync(_) => Next::ResyncAfter(Duration::from_secs(3600)),
            }
        }

        fn refresh(&self, _work: &PodWork) -> bool {
            let (can, done) = &self.refreshes;
            done.fetch_add(1, Ordering::SeqCst);
            can.load(Ordering::SeqCst)
        }

        fn saw_runtime(&self, _work: &PodWork) -> bool {
            self.saw.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn a_runtime_change_the_last_sync_saw_syncs_nothing() {
        let syncer = Arc::new(Recorder::default());
        syncer.saw.store(true, Ordering::SeqCst);
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        workers.update("u", PodWork::Sync(Arc::new(pod("v1", &[("c", "x")]))));
        tokio::time::sleep(Duration::from_millis(50)).await;
        workers.wake("u", WakeFor::Runtime);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*syncer.syncs.lock().unwrap(), ["sync v1"], "seen already");
        syncer.saw.store(false, Ordering::SeqCst);
        workers.wake("u", WakeFor::Runtime);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*syncer.syncs.lock().unwrap(), ["sync v1", "sync v1"]);
    }

    /// Waits (5 s at most) until `done`; whether it came.
    async fn until(done: impl Fn() -> bool) -> bool {
        let polled = async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), polled)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_status_wake_refreshes_between_syncs_and_a_sync_wake_syncs() {
        let syncer = Arc::new(Recorder::default());
        syncer.refreshes.0.store(true, Ordering::SeqCst);
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        workers.update("u", PodWork::Sync(Arc::new(pod("v1", &[("c", "x")]))));
        let refreshes = || syncer.refreshes.1.load(Ordering::SeqCst);
        assert!(until(|| syncer.syncs.lock().unwrap().len() == 1).await);
        // Each wake-up waited for: on a loaded machine, wake-ups close together merge.
        for n in 1..=3 {
            workers.wake("u", WakeFor::Status);
            assert!(until(|| refreshes() == n).await, "refresh {n}");
        }
        assert_eq!(*syncer.syncs.lock().unwrap(), ["sync v1"], "no sync");
        // Both asked at once: the sync (which generates the status too) is enough.
        workers.wake("u", WakeFor::Status);
        workers.wake("u", WakeFor::Sync);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*syncer.syncs.lock().unwrap(), ["sync v1", "sync v1"]);
        assert_eq!(syncer.refreshes.1.load(Ordering::SeqCst), 3);
        // A refresh the syncer cannot do becomes a sync.
        syncer.refreshes.0.store(false, Ordering::SeqCst);
        workers.wake("u", WakeFor::Status);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(syncer.syncs.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn one_sync_at_a_time_per_pod_with_updates_coalesced() {
        let syncer = Arc::new(Recorder::default());
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        workers.update("u", PodWork::Sync(Arc::new(pod("v1", &[("c", "v1")]))));
        // While v1 syncs, two more updates arrive: only the newest is synced after it.
        tokio::time::sleep(Duration::from_millis(5)).await;
        for v in ["v2", "v3"] {
            workers.update("u", PodWork::Sync(Arc::new(pod(v, &[("c", v)]))));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(syncer.max_running.load(Ordering::SeqCst), 1);
        assert_eq!(*syncer.syncs.lock().unwrap(), ["sync v1", "sync v3"]);
    }

    /// The pod's state is forgotten when its worker ends, not while it runs.
    #[tokio::test]
    async fn a_pods_state_is_forgotten_when_its_worker_ends() {
        let states = PodStates::default();
        let held = states.map::<u32>("test state");
        let workers = PodWorkers::new(Arc::new(Recorder::default()), states.clone());
        for uid in ["u", "v"] {
            held.lock().insert(uid.into(), 1);
            workers.update(uid, PodWork::Sync(Arc::new(pod(uid, &[("c", "x")]))));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(states.holding("u"), ["test state"], "kept while it runs");
        let id = PodId {
            uid: "u".into(),
            namespace: "default".into(),
            name: "u".into(),
        };
        workers.update("u", PodWork::Remove(id));
        for _ in 0..100 {
            if workers.uids() == ["v"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(workers.uids(), ["v"]);
        assert!(
            states.holding("u").is_empty(),
            "forgotten as its worker ended"
        );
        assert_eq!(states.holding("v"), ["test state"]);
    }

    #[tokio::test]
    async fn a_status_only_update_syncs_nothing_but_the_next_sync_sees_it() {
        let syncer = Arc::new(Recorder::default());
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        workers.update("u", PodWork::Sync(Arc::new(pod("v1", &[("c", "x")]))));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Same spec, labels, annotations and deletion: the name stands in for the newer
        // object (a status written by the agent itself).
        workers.update("u", PodWork::Sync(Arc::new(pod("v2", &[("c", "x")]))));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*syncer.syncs.lock().unwrap(), ["sync v1"]);
        workers.wake("u", WakeFor::Sync);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*syncer.syncs.lock().unwrap(), ["sync v1", "sync v2"]);
    }

    #[tokio::test]
    async fn pods_sync_in_parallel_and_removed_workers_end() {
        let syncer = Arc::new(Recorder::default());
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        for uid in ["a", "b", "c"] {
            workers.update(uid, PodWork::Sync(Arc::new(pod(uid, &[("c", "x")]))));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(syncer.max_running.load(Ordering::SeqCst), 3);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let id = PodId::of(&pod("a", &[])).unwrap();
        workers.update("a", PodWork::Remove(id));
        workers.update("a", PodWork::Sync(Arc::new(pod("a", &[("c", "x")]))));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut uids = workers.uids();
        uids.sort();
        assert_eq!(uids, ["b", "c"]);
        assert!(syncer.saw("remove a"));
    }

    #[tokio::test]
    async fn a_relist_removes_the_pods_it_no_longer_has() {
        let syncer = Arc::new(Recorder::default());
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        for uid in ["a", "b"] {
            workers.update(uid, PodWork::Sync(Arc::new(pod(uid, &[("c", "x")]))));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        workers.remove_unlisted(&["b".to_owned()].into());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(workers.uids(), ["b"]);
        assert!(syncer.saw("remove a"));
    }

    /// Records the grace period of each termination; one with a long grace never ends.
    #[derive(Default)]
    struct Terminator(Mutex<Vec<i64>>);

    impl PodSyncer for Terminator {
        async fn sync(&self, work: &PodWork) -> Next {
            let PodWork::Sync(p) = work else {
                return Next::Done;
            };
            let grace = crate::pod::termination_grace_period(p);
            self.0.lock().unwrap().push(grace);
            if grace > 10 {
                std::future::pending::<()>().await;
            }
            Next::Done
        }
    }

    fn deleted(grace: i64) -> Arc<Pod> {
        let mut p = pod("web", &[("c", "x")]);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        p.metadata.deletion_grace_period_seconds = Some(grace);
        Arc::new(p)
    }

    #[tokio::test]
    async fn a_shorter_grace_period_shortens_a_termination_under_way() {
        let syncer = Arc::new(Terminator::default());
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        workers.update("u", PodWork::Sync(deleted(30)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A longer one changes nothing; a shorter one restarts the termination with it.
        workers.update("u", PodWork::Sync(deleted(60)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*syncer.0.lock().unwrap(), [30]);
        workers.update("u", PodWork::Sync(deleted(1)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*syncer.0.lock().unwrap(), [30, 1]);
        assert!(workers.uids().is_empty(), "the pod is done");
    }

    /// A termination that has stopped the pod's containers and sandboxes, and finishes
    /// (status, delete, removal) when released; it records what it was started with.
    #[derive(Default)]
    struct PastKill {
        started: Mutex<Vec<String>>,
        release: Notify,
    }

    impl PodSyncer for PastKill {
        async fn sync(&self, work: &PodWork) -> Next {
            let what = match work {
                PodWork::Sync(p) => format!("grace {}", crate::pod::termination_grace_period(p)),
                PodWork::Remove(_) => "remove".into(),
            };
            self.started.lock().unwrap().push(what);
            self.release.notified().await;
            Next::Done
        }

        fn stopping(&self, _uid: &str) -> bool {
            false
        }
    }

    #[tokio::test]
    async fn a_termination_past_its_kill_is_not_started_again_when_the_pod_goes() {
        let syncer = Arc::new(PastKill::default());
        let workers = PodWorkers::new(syncer.clone(), PodStates::default());
        workers.update("u", PodWork::Sync(deleted(30)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The agent's own final delete: the pod leaves the API.
        workers.update("u", PodWork::Remove(PodId::of(&deleted(30)).unwrap()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*syncer.started.lock().unwrap(), ["grace 30"]);
        syncer.release.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(workers.uids().is_empty(), "the pod is done");
        assert_eq!(*syncer.started.lock().unwrap(), ["grace 30"], "once");
    }
}
