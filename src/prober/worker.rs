//! One probe worker (the kubelet's `prober/worker.go`): probes one container instance
//! every `periodSeconds` after `initialDelaySeconds`, turns runs of results into the
//! cached result by the success and failure thresholds, and holds after a liveness or
//! startup failure until the container is replaced (a new worker then starts).
//! Two departures from the kubelet's timing, both to get pods Ready sooner: the first
//! readiness or startup probe of a container the agent has just started is also checked at
//! once ([`first_checks`]), and while pods wait for a start turn the exec probes of containers
//! that pass them give way, for ten seconds at most ([`gives_way`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container, Probe};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use super::metrics;
use super::run::Check;
use crate::cri::Cri;
use crate::events::EventRecorder;
use crate::kuberuntime::start_gate::StartGate;
use crate::pod::PodId;
use crate::pod::state::{Wake, WakeFor};
use crate::probe::results::{ProbeKind, Results};
use crate::probe::{Outcome, ProbeResult};

/// Errored probes are tried this many times before the period ends (the kubelet's
/// `maxProbeRetries`).
const MAX_RETRIES: usize = 3;
/// A container that started this recently (or within one period of its probe, when that
/// is longer) when its worker began was started by this agent just now, not found running
/// after the agent restarted: its readiness and startup probes run at once.
const FRESH: Duration = Duration::from_secs(5);
/// While pods wait for a start turn, a periodic exec probe of a container that passes it
/// waits too, but never longer than this since it last ran.
const MAX_YIELD: Duration = Duration::from_secs(10);

/// What every worker shares.
pub(super) struct Shared<C> {
    pub(super) cri: C,
    pub(super) events: EventRecorder,
    pub(super) wake: Wake,
    pub(super) results: Arc<Results>,
    /// Lent a turn by each exec probe in flight: the runtime runs it beside the starts.
    pub(super) start_gate: Arc<StartGate>,
}

impl<C> Shared<C> {
    fn set(&self, target: &Target, kind: ProbeKind, result: ProbeResult) {
        if self
            .results
            .record(&target.stopped, &target.container_id, kind, result)
        {
            tracing::debug!(pod = %target.pod, container = %target.container, kind = kind.as_str(), result = result.as_str(), "probe result changed");
            if let Some(why) = wake_for(kind, result) {
                (self.wake)(&target.pod.uid, why);
            }
        }
    }
}

/// What a changed result asks of the pod's worker (the kubelet's: a liveness or startup
/// failure syncs the pod, which restarts the container; readiness and startup results
/// go to the status manager with no pod sync): a sync for a failure that restarts the
/// container, a status refresh for what the status shows, nothing for a liveness result
/// that restarts nothing (the status does not show it).
fn wake_for(kind: ProbeKind, result: ProbeResult) -> Option<WakeFor> {
    match (kind, result) {
        (ProbeKind::Liveness | ProbeKind::Startup, ProbeResult::Failure) => Some(WakeFor::Sync),
        (ProbeKind::Liveness, _) => None,
        (ProbeKind::Readiness | ProbeKind::Startup, _) => Some(WakeFor::Status),
    }
}

/// The container instance a worker probes.
pub(super) struct Target {
    pub(super) pod: PodId,
    /// The container's name.
    pub(super) container: String,
    pub(super) container_id: String,
    /// When the container started, in ns since the epoch (0: unknown).
    pub(super) started_at_ns: i64,
    pub(super) has_startup: bool,
    /// The counts of `prober_probe_total`, registered by the manager before the worker
    /// starts (so that forgetting the pod's metrics comes after).
    pub(super) counters: Arc<metrics::Counters>,
    /// Set when the manager stops the worker: no result is recorded after.
    pub(super) stopped: Arc<AtomicBool>,
}

/// What a worker needs of its probe: the check and its timing. The probe and its
/// container are not kept: a worker lives as long as its container, one or more per
/// container, so it holds no more than it uses.
pub(super) struct Probing {
    timing: Timing,
    check: Check,
}

impl Probing {
    /// `container`'s `probe` (named ports resolved) against the pod at `pod_ip`.
    pub(super) fn of(probe: &Probe, container: &Container, pod_ip: &str) -> Self {
        Self {
            timing: Timing::of(probe),
            check: Check::of(probe, container, pod_ip),
        }
    }
}

/// The probe's timing, with the kubelet's defaults and minimums.
struct Timing {
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

fn seconds(v: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(u64::try_from(v.unwrap_or(default).max(1)).unwrap_or(1))
}

impl Timing {
    fn of(probe: &Probe) -> Self {
        let count =
            |v: Option<i32>, default: i32| u32::try_from(v.unwrap_or(default).max(1)).unwrap_or(1);
        Self {
            initial_delay: Duration::from_secs(
                u64::try_from(probe.initial_delay_seconds.unwrap_or(0)).unwrap_or(0),
            ),
            period: seconds(probe.period_seconds, 10),
            timeout: seconds(probe.timeout_seconds, 1),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }
}

/// The instant the container started, on tokio's clock.
fn start_instant(started_at_ns: i64) -> Instant {
    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let ago = u64::try_from(now_ns.saturating_sub(started_at_ns)).unwrap_or(0);
    let now = Instant::now();
    if started_at_ns <= 0 {
        return now;
    }
    now.checked_sub(Duration::from_nanos(ago)).unwrap_or(now)
}

/// A spread of the first probe over the period, stable per container and kind (the
/// kubelet's workers wait a random part of the period, so that many workers, or the
/// readiness and liveness probes of one container, do not probe at once).
fn jitter(container_id: &str, kind: ProbeKind, period: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same container's probe keeps its place across agent restarts.
    let mut hasher = std::hash::DefaultHasher::new();
    (container_id, kind.as_str()).hash(&mut hasher);
    let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(hasher.finish() % period_ms)
}

/// When a new worker checks first, its container having started `since_start` ago: an
/// extra check at once (after this long), if any, and the first of its periodic ticks.
/// The kubelet's workers wait a random part of the period (the [`jitter`]) and then probe
/// at their ticks, so a container's first probe comes up to a period after it runs. A
/// readiness or startup probe of a container this agent has just started holds the pod's
/// Ready back: it is also checked at once, or as soon as the initial delay is over, and
/// its ticks keep the kubelet's spread from then (a server not yet listening at once is
/// checked again within a period, not a whole period later). The others (liveness
/// probes, and every probe of containers that were running when the agent started) only
/// tick.
fn first_checks(
    kind: ProbeKind,
    timing: &Timing,
    since_start: Duration,
    container_id: &str,
) -> (Option<Duration>, Duration) {
    let spread = jitter(container_id, kind, timing.period);
    if kind != ProbeKind::Liveness && since_start < timing.period.max(FRESH) {
        let due = timing.initial_delay.saturating_sub(since_start);
        return (Some(due), due + spread);
    }
    (None, spread)
}

/// How many ticks in a row a passing exec probe may give way to queued starts: so that it
/// runs at least every [`MAX_YIELD`] (none for a period of that or longer).
fn yield_ticks(period: Duration) -> u32 {
    let ticks = MAX_YIELD.as_secs() / period.as_secs().max(1);
    u32::try_from(ticks).unwrap_or(u32::MAX).saturating_sub(1)
}

/// Whether this tick's check gives way to the pods waiting for a start turn. An exec
/// probe is a `runc exec` in the runtime that sets the pods up; with a hundred containers
/// probed every second, a third by exec, the probes of the containers already running took
/// most of a 2-core node while the others waited to start (docs/benchmarks.md). So while
/// pods are queued, the exec probe of a container that passes it (its last run passed and
/// its result is a success) waits for a later tick, [`yield_ticks`] at most in a row. A
/// probe that has not passed yet (the pod is not Ready, or a failure is being counted) is
/// never held back, nor are HTTP and TCP probes, which the runtime does not serve.
fn gives_way(check: &Check, passing: bool, yielded: u32, period: Duration, queued: bool) -> bool {
    matches!(check, Check::Exec(_)) && passing && queued && yielded < yield_ticks(period)
}

/// Runs the check, trying again on errors, and records the kubelet's events.
async fn probe_once<C: Cri>(
    shared: &Shared<C>,
    target: &Target,
    kind: ProbeKind,
    check: &Check,
    timeout: Duration,
) -> Outcome {
    // An exec probe is a `runc exec` in the runtime: the starts get a turn beside it.
    let _lent = matches!(check, Check::Exec(_)).then(|| shared.start_gate.lend());
    let mut outcome = check.run(&shared.cri, &target.container_id, timeout).await;
    for _ in 1..MAX_RETRIES {
        if outcome.result != ProbeResult::Unknown {
            break;
        }
        outcome = check.run(&shared.cri, &target.container_id, timeout).await;
    }
    let (reason, verb) = match outcome.result {
        ProbeResult::Success => return outcome,
        ProbeResult::Warning => ("ProbeWarning", "warning"),
        ProbeResult::Failure => ("Unhealthy", "failed"),
        ProbeResult::Unknown => ("Unhealthy", "errored"),
    };
    let message = format!("{} probe {verb}: {}", kind.as_str(), outcome.output);
    tracing::debug!(pod = %target.pod, container = %target.container, %message, "probe");
    let container = Some(target.container.as_str());
    shared
        .events
        .warning(&target.pod, container, reason, message);
    outcome
}

/// Probes `target` until aborted, or until a liveness or startup failure is recorded.
pub(super) async fn run<C: Cri>(
    shared: Arc<Shared<C>>,
    target: Target,
    kind: ProbeKind,
    probing: Probing,
) {
    let Probing { timing, check } = probing;
    let started = start_instant(target.started_at_ns);
    // From the worker's start until a readiness or startup probe first passes: the wait
    // and each run are steps of the pod's start-up timeline (a liveness probe does not
    // hold Ready back).
    let mut until_passed = (kind != ProbeKind::Liveness).then(|| {
        tracing::info_span!("probe", pod_uid = %target.pod.uid, container = %target.container, kind = kind.as_str())
    });
    // The result before the first probe shows nothing new: not ready, alive, not known to
    // have started, as with no result at all (the status and the pod's actions read it
    // alike), so it wakes no one.
    shared
        .results
        .record(&target.stopped, &target.container_id, kind, kind.initial());
    let (at_once, first_tick) =
        first_checks(kind, &timing, started.elapsed(), &target.container_id);
    let now = Instant::now();
    let mut ticker = tokio::time::interval_at(now + first_tick, timing.period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    if let Some(due) = at_once {
        tokio::time::sleep_until(now + due).await;
    }
    let mut check_now = at_once.is_some();
    let mut last = None;
    let mut run = 0u32;
    let mut yielded = 0u32;
    loop {
        let extra = std::mem::take(&mut check_now);
        if !extra {
            ticker.tick().await;
        }
        if started.elapsed() < timing.initial_delay {
            continue;
        }
        if target.has_startup {
            let has_started = shared.results.get(&target.container_id, ProbeKind::Startup)
                == Some(ProbeResult::Success);
            // A started container's startup probe is done; the others wait for it.
            if has_started == (kind == ProbeKind::Startup) {
                continue;
            }
        }
        let passing = last == Some(ProbeResult::Success)
            && shared.results.get(&target.container_id, kind) == Some(ProbeResult::Success);
        let queued = passing && shared.start_gate.queued();
        if gives_way(&check, passing, yielded, timing.period, queued) {
            yielded += 1;
            continue;
        }
        yielded = 0;
        // Until the probe first passes, each run is a step of the pod's start-up timeline.
        let span = until_passed.as_ref().map_or_else(tracing::Span::none, |parent| {
            tracing::info_span!(parent: parent, "probe_run", result = tracing::field::Empty)
        });
        // Boxed: the worker waits most of its life, and the check's state (an HTTP
        // request, an `ExecSync` call) is only needed while the check runs.
        let outcome = Box::pin(probe_once(&shared, &target, kind, &check, timing.timeout))
            .instrument(span.clone())
            .await;
        let result = match outcome.result {
            ProbeResult::Success | ProbeResult::Warning => ProbeResult::Success,
            ProbeResult::Failure => ProbeResult::Failure,
            // An errored probe changes nothing (the kubelet skips it).
            ProbeResult::Unknown => continue,
        };
        span.record("result", result.as_str());
        target.counters.count(result);
        // The extra check lets a container that passes at once in sooner, and counts
        // toward no threshold: the kubelet's first check is the first tick, so a failure
        // is not the first of `failureThreshold`, nor a success the first of several.
        if extra && (result == ProbeResult::Failure || timing.success_threshold > 1) {
            continue;
        }
        if last == Some(result) {
            run = run.saturating_add(1);
        } else {
            last = Some(result);
            run = 1;
        }
        let threshold = if result == ProbeResult::Failure {
            timing.failure_threshold
        } else {
            timing.success_threshold
        };
        if run < threshold {
            continue;
        }
        if result == ProbeResult::Success {
            until_passed = None;
        }
        shared.set(&target, kind, result);
        if kind != ProbeKind::Readiness && result == ProbeResult::Failure {
            // On hold: the container is restarted, and its new instance gets a new worker.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{Result, api};
    use crate::kuberuntime::start_gate::Priority;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn first_probes_spread_over_the_period() {
        let period = Duration::from_secs(1);
        // 100 containers (ids as the runtime makes them: 64 hex digits), two probes each.
        let ids: Vec<String> = (0..100u64)
            .map(|i| format!("{:064x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect();
        let mut buckets = [0u32; 10];
        let mut together = 0;
        for id in &ids {
            let ready = jitter(id, ProbeKind::Readiness, period);
            let live = jitter(id, ProbeKind::Liveness, period);
            assert!(ready < period && live < period);
            assert_eq!(ready, jitter(id, ProbeKind::Readiness, period), "stable");
            together += u32::from(ready.abs_diff(live) < Duration::from_millis(10));
            for d in [ready, live] {
                buckets[usize::try_from(d.as_millis() / 100).unwrap()] += 1;
            }
        }
        // 200 first probes in tenths of the period: 20 each on average.
        assert!(
            buckets.iter().all(|&n| (8..=40).contains(&n)),
            "spread over the period: {buckets:?}"
        );
        assert!(together <= 5, "{together} containers probe twice at once");
    }

    fn timing(period: u64, initial_delay: u64) -> Timing {
        Timing::of(&Probe {
            period_seconds: Some(i32::try_from(period).unwrap()),
            initial_delay_seconds: Some(i32::try_from(initial_delay).unwrap()),
            ..Default::default()
        })
    }

    #[test]
    fn the_first_readiness_or_startup_probe_of_a_container_just_started_runs_at_once() {
        let id = format!("{:064x}", 7);
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        for kind in [ProbeKind::Readiness, ProbeKind::Startup] {
            let spread = |period| jitter(&id, kind, secs(period));
            assert_eq!(
                first_checks(kind, &timing(10, 0), ms(30), &id),
                (Some(Duration::ZERO), spread(10)),
                "at once, then the ticks within a period, not a whole period later"
            );
            assert_eq!(
                first_checks(kind, &timing(10, 15), ms(500), &id),
                (Some(ms(14_500)), ms(14_500) + spread(10)),
                "as soon as the initial delay is over, not at the tick after it"
            );
            // Running long before the worker began (the agent restarted): spread only.
            assert_eq!(
                first_checks(kind, &timing(1, 0), secs(60), &id),
                (None, spread(1))
            );
            // A period longer than FRESH: a container started within it is new.
            assert_eq!(
                first_checks(kind, &timing(30, 0), secs(20), &id).0,
                Some(Duration::ZERO)
            );
        }
        // A liveness probe does not hold Ready back: it keeps the kubelet's spread.
        assert_eq!(
            first_checks(ProbeKind::Liveness, &timing(1, 0), ms(30), &id),
            (None, jitter(&id, ProbeKind::Liveness, secs(1)))
        );
    }

    #[test]
    fn only_passing_exec_probes_give_way_to_queued_starts_and_for_ten_seconds_at_most() {
        let exec = Check::Exec(vec!["true".into()]);
        let tcp = Check::Tcp("10.0.0.1".into(), 80);
        let second = Duration::from_secs(1);
        assert!(gives_way(&exec, true, 0, second, true));
        assert!(!gives_way(&exec, true, 0, second, false), "no start queued");
        assert!(!gives_way(&exec, false, 0, second, true), "not passing");
        assert!(
            !gives_way(&tcp, true, 0, second, true),
            "not the runtime's work"
        );
        // At 1 s, nine ticks in a row at most: a passing probe still runs every 10 s.
        assert!(gives_way(&exec, true, 8, second, true));
        assert!(!gives_way(&exec, true, 9, second, true));
        assert_eq!(yield_ticks(Duration::from_secs(2)), 4);
        assert_eq!(yield_ticks(Duration::from_secs(3)), 2);
        assert_eq!(yield_ticks(Duration::from_secs(10)), 0, "never held back");
        assert_eq!(yield_ticks(Duration::from_secs(60)), 0);
    }

    /// Answers exit codes from a script (the last one repeats), counting calls and the
    /// start gate's turns during each.
    struct Scripted {
        codes: Mutex<Vec<i32>>,
        calls: AtomicUsize,
        gate: Arc<StartGate>,
        turns_seen: Mutex<Vec<usize>>,
    }

    impl Cri for Arc<Scripted> {
        async fn exec_sync(&self, _req: api::ExecSyncRequest) -> Result<api::ExecSyncResponse> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.turns_seen
                .lock()
                .expect("lock")
                .push(self.gate.turns().0);
            let mut codes = self.codes.lock().expect("lock");
            let code = if codes.len() > 1 {
                codes.remove(0)
            } else {
                codes[0]
            };
            Ok(api::ExecSyncResponse {
                stdout: b"nope".to_vec(),
                stderr: vec![],
                exit_code: code,
            })
        }
    }

    fn probe(failure_threshold: i32) -> Probe {
        Probe {
            exec: Some(k8s_openapi::api::core::v1::ExecAction {
                command: Some(vec!["true".into()]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(failure_threshold),
            ..Default::default()
        }
    }

    /// The worker's part of [`probe`].
    fn probing(failure_threshold: i32) -> Probing {
        Probing::of(
            &probe(failure_threshold),
            &Container::default(),
            "127.0.0.1",
        )
    }

    fn pod_id() -> PodId {
        PodId {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web".into(),
        }
    }

    fn target(has_startup: bool) -> Target {
        Target {
            pod: pod_id(),
            container: "a".into(),
            container_id: "c1".into(),
            started_at_ns: 0,
            has_startup,
            counters: metrics::register(&pod_id(), "a", ProbeKind::Readiness),
            stopped: Arc::default(),
        }
    }

    /// The wake-ups asked, in order.
    type Wakes = Arc<Mutex<Vec<WakeFor>>>;

    fn shared(
        codes: Vec<i32>,
    ) -> (
        Arc<Shared<Arc<Scripted>>>,
        crate::events::EventReceiver,
        Wakes,
    ) {
        let (events, rx) = EventRecorder::channel();
        let wakes = Arc::new(Mutex::new(Vec::new()));
        let counted = wakes.clone();
        let gate = StartGate::new(4);
        let shared = Arc::new(Shared {
            cri: Arc::new(Scripted {
                codes: Mutex::new(codes),
                calls: AtomicUsize::new(0),
                gate: gate.clone(),
                turns_seen: Mutex::default(),
            }),
            events,
            wake: Arc::new(move |_: &str, why| {
                counted.lock().unwrap().push(why);
            }),
            results: Arc::default(),
            start_gate: gate,
        });
        (shared, rx, wakes)
    }

    /// A worker waits most of its life: its task holds what it keeps between checks, not
    /// a running check's state nor a copy of the pod's Container (a node of 100 pods
    /// probed for readiness and liveness has 200 workers).
    #[test]
    fn a_waiting_worker_is_small() {
        let (shared, _events, _) = shared(vec![0]);
        let worker = run(shared, target(false), ProbeKind::Readiness, probing(1));
        let size = size_of_val(&worker);
        assert!(size <= 2048, "a worker's task holds {size} bytes");
    }

    #[tokio::test]
    async fn an_exec_probe_lends_the_start_gate_a_turn_while_it_runs() {
        let (shared, _events, _) = shared(vec![0]);
        let (own, _) = shared.start_gate.turns();
        let exec = Check::Exec(vec!["true".into()]);
        let outcome = probe_once(
            &shared,
            &target(false),
            ProbeKind::Liveness,
            &exec,
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(outcome.result, ProbeResult::Success);
        assert_eq!(*shared.cri.turns_seen.lock().unwrap(), [own + 1]);
        assert_eq!(shared.start_gate.turns(), (own, 0), "the turn is back");
    }

    #[tokio::test]
    async fn liveness_fails_after_the_threshold_and_then_holds() {
        let (shared, mut events, wakes) = shared(vec![0, 1]);
        let task = tokio::spawn(run(
            shared.clone(),
            target(false),
            ProbeKind::Liveness,
            probing(3),
        ));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            shared.results.get("c1", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
        // One success, then failures: the third failure in a row is the result.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            shared.results.get("c1", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            shared.results.get("c1", ProbeKind::Liveness),
            Some(ProbeResult::Failure)
        );
        assert!(
            task.is_finished(),
            "the worker holds after a liveness failure"
        );
        assert_eq!(shared.cri.calls.load(Ordering::SeqCst), 4);
        assert_eq!(
            *wakes.lock().unwrap(),
            [WakeFor::Sync],
            "the failure syncs the pod; the initial success woke no one"
        );
        let event = events.recv().await.expect("an event");
        assert_eq!(event.reason, "Unhealthy");
        assert_eq!(event.message, "Liveness probe failed: nope");
    }

    #[tokio::test]
    async fn a_passing_exec_probe_waits_while_pods_are_queued_for_a_start_turn() {
        let (shared, _events, _) = shared(vec![0]);
        let calls = || shared.cri.calls.load(Ordering::SeqCst);
        let probing = Probing::of(&probe(3), &Container::default(), "127.0.0.1");
        // A container started just now: its readiness probe runs at once.
        let task = tokio::spawn(run(
            shared.clone(),
            target(false),
            ProbeKind::Readiness,
            probing,
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(calls() >= 1, "the first probe, at once");
        assert_eq!(
            shared.results.get("c1", ProbeKind::Readiness),
            Some(ProbeResult::Success)
        );
        // Every turn of the gate taken and a pod waiting: the passing probe gives way.
        let (own, _) = shared.start_gate.turns();
        let held: Vec<_> =
            futures::future::join_all((0..own).map(|_| shared.start_gate.enter(Priority::New)))
                .await;
        let waiter = {
            let gate = shared.start_gate.clone();
            tokio::spawn(async move { gate.enter(Priority::New).await })
        };
        let before = calls();
        tokio::time::sleep(Duration::from_millis(2000)).await;
        assert_eq!(calls(), before, "held back while a pod waits to start");
        drop(held);
        drop(waiter.await.unwrap());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(calls() > before, "probing again once no pod waits");
        task.abort();
    }

    /// A startup probe with `failureThreshold: 1` that fails the extra check of a container
    /// just started fails at its first tick, as the kubelet's, not at once.
    #[tokio::test]
    async fn the_extra_first_check_counts_toward_no_threshold() {
        let (shared, _events, wakes) = shared(vec![1]);
        let period = Duration::from_secs(5);
        // A container whose first tick comes seconds after the extra check.
        let id = (0..)
            .map(|i| format!("c{i}"))
            .find(|id| jitter(id, ProbeKind::Startup, period) >= Duration::from_secs(2))
            .expect("an id");
        let calls = || shared.cri.calls.load(Ordering::SeqCst);
        let startup = Probe {
            period_seconds: Some(5),
            ..probe(1)
        };
        let started = Instant::now();
        let task = tokio::spawn(run(
            shared.clone(),
            Target {
                container_id: id.clone(),
                ..target(true)
            },
            ProbeKind::Startup,
            Probing::of(&startup, &Container::default(), "127.0.0.1"),
        ));
        while calls() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let before_the_tick = shared.results.get(&id, ProbeKind::Startup);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "too slow to tell"
        );
        assert_eq!(
            before_the_tick,
            Some(ProbeKind::Startup.initial()),
            "the extra check failed, and counted for nothing"
        );
        assert!(wakes.lock().unwrap().is_empty(), "nothing to act on yet");
        tokio::time::timeout(period * 2, task)
            .await
            .expect("the worker holds after the failure at its first tick")
            .expect("the worker");
        assert_eq!(calls(), 2, "the extra check and the first tick");
        assert_eq!(
            shared.results.get(&id, ProbeKind::Startup),
            Some(ProbeResult::Failure)
        );
        assert_eq!(*wakes.lock().unwrap(), [WakeFor::Sync]);
    }

    #[test]
    fn only_failures_that_restart_a_container_sync_the_pod() {
        use ProbeKind::{Liveness, Readiness, Startup};
        use ProbeResult::{Failure, Success, Unknown};
        assert_eq!(wake_for(Liveness, Failure), Some(WakeFor::Sync));
        assert_eq!(wake_for(Startup, Failure), Some(WakeFor::Sync));
        assert_eq!(wake_for(Liveness, Success), None);
        for result in [Success, Failure, Unknown] {
            assert_eq!(wake_for(Readiness, result), Some(WakeFor::Status));
        }
        assert_eq!(wake_for(Startup, Success), Some(WakeFor::Status));
    }

    #[tokio::test]
    async fn readiness_waits_for_startup_and_then_follows_the_probe() {
        let (shared, _events, wakes) = shared(vec![0]);
        let readiness = tokio::spawn(run(
            shared.clone(),
            target(true),
            ProbeKind::Readiness,
            probing(3),
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            shared.results.get("c1", ProbeKind::Readiness),
            Some(ProbeResult::Failure)
        );
        assert_eq!(
            shared.cri.calls.load(Ordering::SeqCst),
            0,
            "held back by the startup probe"
        );
        let startup = tokio::spawn(run(
            shared.clone(),
            target(true),
            ProbeKind::Startup,
            probing(3),
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            shared.results.get("c1", ProbeKind::Startup),
            Some(ProbeResult::Success)
        );
        assert_eq!(
            shared.results.get("c1", ProbeKind::Readiness),
            Some(ProbeResult::Success)
        );
        assert_eq!(
            *wakes.lock().unwrap(),
            [WakeFor::Status, WakeFor::Status],
            "started, then ready: the status only"
        );
        readiness.abort();
        startup.abort();
    }
}
