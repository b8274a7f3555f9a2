//! Probe workers, as the kubelet's `pkg/kubelet/prober`: one task per running container
//! and probe kind (liveness, readiness, startup) that probes it periodically and keeps the
//! latest result in a [`Results`] cache keyed by container id. The status generator reads
//! readiness and startup from it, the runtime manager reads liveness and startup failures
//! from it to restart containers; the prober itself never writes status nor kills.
//! Knows no pod worker (it wakes one through `pod::state::Wake`) and no status manager.

pub mod metrics;
mod run;
mod worker;

use crate::lock::lock;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use crate::cri::Cri;
use crate::events::EventRecorder;
use crate::kuberuntime::runtime_status::primary_ip;
use crate::kuberuntime::start_gate::StartGate;
use crate::kuberuntime::{PodRuntimeStatus, RunState};
use crate::pod::PodId;
use crate::pod::state::{ForgetPod, Wake};
use crate::probe::results::{ProbeKind, Results};

/// One probe worker: which container instance it probes, and its task.
struct WorkerHandle {
    container: String,
    kind: ProbeKind,
    container_id: String,
    task: tokio::task::AbortHandle,
    stopped: Arc<AtomicBool>,
}

/// Starts and stops the probe workers of the pods (the kubelet's prober manager).
pub struct ProberManager<C> {
    shared: Arc<worker::Shared<C>>,
    workers: Mutex<HashMap<String, Vec<WorkerHandle>>>,
    /// The node's IP: a pod on the host's network is probed there.
    host_ip: Option<IpAddr>,
}

/// The container's probe of a kind, if it has one.
fn probe_of(container: &Container, kind: ProbeKind) -> Option<&Probe> {
    match kind {
        ProbeKind::Liveness => container.liveness_probe.as_ref(),
        ProbeKind::Readiness => container.readiness_probe.as_ref(),
        ProbeKind::Startup => container.startup_probe.as_ref(),
    }
}

impl<C: Cri + Clone> ProberManager<C> {
    /// A manager probing through `cri`, recording events to `events` and waking pod
    /// workers through `wake` when a result changes (for a sync when a failure restarts a
    /// container, for a status refresh when the status shows it), on a node whose IP is
    /// `host_ip`; each
    /// exec probe in flight lends `start_gate` a turn.
    pub fn new(
        cri: C,
        events: EventRecorder,
        wake: Wake,
        host_ip: Option<IpAddr>,
        start_gate: Arc<StartGate>,
    ) -> Self {
        Self {
            shared: Arc::new(worker::Shared {
                cri,
                events,
                wake,
                results: Arc::default(),
                start_gate,
            }),
            workers: Mutex::default(),
            host_ip,
        }
    }

    /// The results cache.
    pub fn results(&self) -> &Arc<Results> {
        &self.shared.results
    }

    /// Brings the pod's workers in line with its running containers: a worker per probe of
    /// each running container instance, none for the others.
    pub fn update_pod(&self, pod: &Pod, id: &PodId, runtime: &PodRuntimeStatus) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let sandbox_ready = runtime.ready_sandbox().is_some();
        // The pod's IP as its status has it (the kubelet probes `status.podIP`).
        let pod_ip = primary_ip(&runtime.pod_ips(pod, self.host_ip));
        let mut wanted = Vec::new();
        for c in &spec.containers {
            let running = runtime
                .latest(&c.name)
                .filter(|s| sandbox_ready && s.state == RunState::Running);
            let Some(s) = running else {
                continue;
            };
            for kind in ProbeKind::ALL {
                if let Some(probe) = probe_of(c, kind) {
                    wanted.push((c, kind, probe, s));
                }
            }
        }
        let mut all = lock(&self.workers);
        let handles = all.entry(id.uid.clone()).or_default();
        handles.retain(|h| {
            let keep = wanted.iter().any(|(c, k, _, s)| {
                c.name == h.container && *k == h.kind && s.id == h.container_id
            });
            if !keep {
                self.stop(h, &id.uid);
            }
            keep
        });
        for (c, kind, probe, s) in wanted {
            let running = handles
                .iter()
                .any(|h| h.container == c.name && h.kind == kind && h.container_id == s.id);
            if running {
                continue;
            }
            let stopped = Arc::new(AtomicBool::new(false));
            let target = worker::Target {
                pod: id.clone(),
                container: c.name.clone(),
                container_id: s.id.clone(),
                started_at_ns: s.started_at,
                has_startup: c.startup_probe.is_some(),
                counters: metrics::register(id, &c.name, kind),
                stopped: stopped.clone(),
            };
            let task = tokio::spawn(worker::run(
                self.shared.clone(),
                target,
                kind,
                worker::Probing::of(probe, c, &pod_ip),
            ))
            .abort_handle();
            handles.push(WorkerHandle {
                container: c.name.clone(),
                kind,
                container_id: s.id.clone(),
                task,
                stopped,
            });
        }
        if handles.is_empty() {
            all.remove(&id.uid);
        }
    }

    fn stop(&self, h: &WorkerHandle, uid: &str) {
        h.stopped.store(true, Ordering::Release);
        h.task.abort();
        self.shared.results.remove(&h.container_id, h.kind);
        tracing::debug!(pod_uid = uid, container = %h.container, kind = h.kind.as_str(), "probe worker stopped");
    }
}

/// A pod's probe workers, their results and their metrics.
impl<C: Cri + Clone> ForgetPod for ProberManager<C> {
    fn name(&self) -> &'static str {
        "prober"
    }

    fn holds(&self, uid: &str) -> bool {
        lock(&self.workers).contains_key(uid) || metrics::holds(uid)
    }

    /// Stops every worker of the pod, and forgets its results and metrics.
    fn forget(&self, uid: &str) {
        if let Some(handles) = lock(&self.workers).remove(uid) {
            for h in &handles {
                self.stop(h, uid);
            }
        }
        metrics::forget_pod(uid);
    }
}
