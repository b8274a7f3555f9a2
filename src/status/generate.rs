//! The Pod's API status from its runtime state: container statuses, phase, conditions,
//! IPs, start time and QoS class — the kubelet's `generateAPIPodStatus`, `getPhase` and
//! `convertToAPIContainerStatuses`. The conditions others own (readiness gates') are kept
//! as the pod's status holds them, and the Ready condition waits for its readiness gates
//! (the kubelet's `GeneratePodReadyCondition`).

use std::collections::HashMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::kuberuntime::actions::should_restart;
use crate::kuberuntime::runtime_status::{ContainerState as RuntimeContainer, pod_ips};
use crate::kuberuntime::{PodRuntimeStatus, RunState, Waiting};
use crate::kubetypes::pod_condition_by_kubelet;
use crate::probe::ProbeResult;
use crate::probe::results::{ProbeKind, Results};

/// Whether the running container `id` passes its probe of `kind` (`has` says whether the
/// container has that probe; without one, a running container passes).
fn passes(inputs: &StatusInputs<'_>, id: &str, kind: ProbeKind, has: bool) -> bool {
    !has || inputs.probes.and_then(|p| p.get(id, kind)) == Some(ProbeResult::Success)
}

/// What the status is generated from besides the Pod.
#[derive(Debug, Clone, Default)]
pub struct StatusInputs<'a> {
    /// The pod's sandboxes and containers in the runtime.
    pub runtime: Option<&'a PodRuntimeStatus>,
    /// Why containers wait, from the last sync.
    pub waiting: Option<&'a HashMap<String, Waiting>>,
    /// The node's IP.
    pub host_ip: Option<IpAddr>,
    /// The runtime's name for container ids, e.g. `containerd`.
    pub runtime_name: &'a str,
    /// The time of this status.
    pub now: Timestamp,
    /// The prober's readiness and startup results.
    pub probes: Option<&'a Results>,
}

fn time(ns: i64) -> Option<Time> {
    (ns > 0)
        .then(|| Time(Timestamp::from_nanosecond(i128::from(ns)).unwrap_or(Timestamp::UNIX_EPOCH)))
}

fn terminated(c: &RuntimeContainer, runtime_name: &str) -> ContainerState {
    let reason = if c.reason.is_empty() {
        if c.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
        .to_owned()
    } else {
        c.reason.clone()
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: Some(reason),
            message: (!c.message.is_empty()).then(|| c.message.clone()),
            started_at: time(c.started_at),
            finished_at: time(c.finished_at),
            container_id: Some(format!("{runtime_name}://{}", c.id)),
            signal: None,
        }),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message: message.filter(|m| !m.is_empty()).map(str::to_owned),
        }),
        ..Default::default()
    }
}

/// Whether the next sync starts the container (again), the kubelet's
/// `ShouldContainerBeRestarted`: only then does the reason it waits for from the last sync
/// stand in for its state. A container that ended for good, e.g. one whose start failed
/// under `restartPolicy: Never`, shows the runtime's terminated state instead.
fn will_restart(pod: &Pod, latest: Option<&RuntimeContainer>) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    latest.is_none_or(|c| match c.state {
        RunState::Running => false,
        RunState::Created | RunState::Unknown => true,
        RunState::Exited => should_restart(crate::pod::restart_policy(pod), c.exit_code),
    })
}

/// Which of a pod's container lists a status is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `spec.initContainers`: ready once it exited with 0, never restarted after that.
    Init,
    /// `spec.containers`: ready while it runs.
    App,
    /// `spec.ephemeralContainers`: never ready (no probe may say so), never restarted.
    Ephemeral,
}

/// The status of each container of one list of the spec, in spec order (the kubelet's
/// `convertToAPIContainerStatuses`).
fn statuses_of(
    pod: &Pod,
    containers: &[Container],
    kind: Kind,
    inputs: &StatusInputs<'_>,
) -> Vec<ContainerStatus> {
    let empty = PodRuntimeStatus::default();
    let runtime = inputs.runtime.unwrap_or(&empty);
    let no_waiting = HashMap::new();
    let reasons = inputs.waiting.unwrap_or(&no_waiting);
    let initializing = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|i| !i.is_empty());
    // Before anything ran, a pod with init containers is initializing.
    let default_reason = if initializing {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    containers
        .iter()
        .map(|spec| {
            let (latest, previous) = runtime.latest_two(&spec.name);
            // An init container that succeeded is done: no reason to wait applies to it.
            let succeeded = kind == Kind::Init
                && latest.is_some_and(|c| c.state == RunState::Exited && c.exit_code == 0);
            let restarts = match kind {
                Kind::Ephemeral => latest.is_none(),
                Kind::Init | Kind::App => !succeeded && will_restart(pod, latest),
            };
            let cached = reasons.get(&spec.name).filter(|_| restarts);
            let state = match (latest, cached) {
                (Some(c), _) if c.state == RunState::Running => ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: time(c.started_at),
                    }),
                    ..Default::default()
                },
                (Some(c), None) if c.state == RunState::Exited => {
                    terminated(c, inputs.runtime_name)
                }
                (_, Some(w)) => waiting(&w.reason, Some(&w.message)),
                _ => waiting(default_reason, None),
            };
            // The last termination: the previous container, or the latest one while a new
            // one is waiting to replace it.
            let last = match latest {
                Some(c) if c.state == RunState::Exited && state.terminated.is_none() => Some(c),
                _ => previous.filter(|p| p.state == RunState::Exited),
            };
            let running = state.running.is_some();
            let id = latest.map_or("", |c| c.id.as_str());
            let started =
                running && passes(inputs, id, ProbeKind::Startup, spec.startup_probe.is_some());
            let ready = match kind {
                Kind::App => {
                    started
                        && passes(
                            inputs,
                            id,
                            ProbeKind::Readiness,
                            spec.readiness_probe.is_some(),
                        )
                }
                Kind::Init => state.terminated.as_ref().is_some_and(|t| t.exit_code == 0),
                Kind::Ephemeral => false,
            };
            ContainerStatus {
                name: spec.name.clone(),
                state: Some(state),
                last_state: Some(last.map_or_else(ContainerState::default, |c| {
                    terminated(c, inputs.runtime_name)
                })),
                ready,
                started: (kind == Kind::App).then_some(started),
                restart_count: latest.map_or(0, |c| i32::try_from(c.attempt).unwrap_or(i32::MAX)),
                image: latest
                    .map(|c| c.image.clone())
                    .filter(|i| !i.is_empty())
                    .or_else(|| spec.image.clone())
                    .unwrap_or_default(),
                image_id: latest.map(|c| c.image_ref.clone()).unwrap_or_default(),
                container_id: latest.map(|c| format!("{}://{}", inputs.runtime_name, c.id)),
                ..Default::default()
            }
        })
        .collect()
}

/// The status of each app container of the spec, in spec order.
#[must_use]
pub fn container_statuses(pod: &Pod, inputs: &StatusInputs<'_>) -> Vec<ContainerStatus> {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    statuses_of(pod, containers, Kind::App, inputs)
}

/// The status of each ephemeral container of the spec, in spec order (the kubelet's
/// `convertToAPIContainerStatuses` over them, with the `EphemeralContainers` gate on).
#[must_use]
pub fn ephemeral_container_statuses(pod: &Pod, inputs: &StatusInputs<'_>) -> Vec<ContainerStatus> {
    let containers: Vec<Container> = crate::pod::ephemeral_containers(pod)
        .map(crate::pod::ephemeral_container)
        .collect();
    statuses_of(pod, &containers, Kind::Ephemeral, inputs)
}

/// The status of each init container of the spec, in spec order.
#[must_use]
pub fn init_container_statuses(pod: &Pod, inputs: &StatusInputs<'_>) -> Vec<ContainerStatus> {
    let containers = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    statuses_of(pod, containers, Kind::Init, inputs)
}

fn exit_code(state: Option<&ContainerState>) -> Option<i32> {
    state?.terminated.as_ref().map(|t| t.exit_code)
}

/// The pod phase from its init and app container statuses (the kubelet's `getPhase`).
#[must_use]
pub fn phase(
    restart_policy: &str,
    init: &[ContainerStatus],
    statuses: &[ContainerStatus],
) -> &'static str {
    let (mut pending_init, mut failed_init) = (0, 0);
    for s in init {
        let state = s.state.as_ref();
        let failed = if state.is_some_and(|st| st.waiting.is_some()) {
            exit_code(s.last_state.as_ref()).map(|code| code != 0)
        } else {
            exit_code(state).map(|code| code != 0)
        };
        match failed {
            Some(true) => failed_init += 1,
            Some(false) => {}
            None => pending_init += 1,
        }
    }
    if failed_init > 0 && restart_policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 {
        return "Pending";
    }
    let (mut waiting, mut running, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in statuses {
        let state = s.state.as_ref();
        if state.is_some_and(|st| st.running.is_some()) {
            running += 1;
        } else if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s
            .last_state
            .as_ref()
            .is_some_and(|l| l.terminated.is_some())
        {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    let failed = stopped - succeeded;
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped > 0 {
        match restart_policy {
            "Always" => "Running",
            "OnFailure" if stopped == succeeded => "Succeeded",
            "OnFailure" => "Running",
            _ if failed > 0 => "Failed",
            _ => "Succeeded",
        }
    } else {
        "Pending"
    }
}

fn condition(
    old: &[PodCondition],
    kind: &str,
    ok: bool,
    reason: Option<String>,
    message: Option<String>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let previous = old.iter().find(|c| c.type_ == kind);
    let since = previous
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    PodCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: if ok { None } else { reason },
        message: if ok { None } else { message },
        last_transition_time: since.or(Some(Time(now))),
        last_probe_time: None,
        ..Default::default()
    }
}

/// The reason of a Ready condition that is False because of readiness gates.
pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";

/// Why the pod's readiness gates hold it not Ready, given the pod's conditions: each gate
/// whose condition is missing or not True, in the kubelet's words
/// (`GeneratePodReadyCondition`); `None` when every gate is open.
#[must_use]
pub fn readiness_gates_unready(pod: &Pod, conditions: &[PodCondition]) -> Option<String> {
    let gates = pod.spec.as_ref()?.readiness_gates.as_deref()?;
    let unready: Vec<String> = gates
        .iter()
        .filter_map(|gate| {
            let kind = &gate.condition_type;
            match conditions.iter().find(|c| &c.type_ == kind) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{kind}\" does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{kind}\" is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    (!unready.is_empty()).then(|| unready.join(", "))
}

/// The full status of a pod that should be running.
#[must_use]
pub fn generate_pod_status(pod: &Pod, inputs: &StatusInputs<'_>) -> PodStatus {
    let old = pod.status.clone().unwrap_or_default();
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let init_statuses = init_container_statuses(pod, inputs);
    let statuses = container_statuses(pod, inputs);
    let ephemeral_statuses = ephemeral_container_statuses(pod, inputs);
    let mut phase = phase(crate::pod::restart_policy(pod), &init_statuses, &statuses).to_owned();
    // A terminal phase never changes again, nor why it was reached (`Evicted`,
    // `DeadlineExceeded`).
    let terminal = matches!(old.phase.as_deref(), Some("Succeeded" | "Failed"));
    if terminal {
        phase = old.phase.clone().unwrap_or_default();
    }
    let unready: Vec<&str> = statuses
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let ready = unready.is_empty();
    let not_ready = || {
        (
            Some("ContainersNotReady".to_owned()),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let now = inputs.now;
    let scheduled = old_conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .cloned()
        .unwrap_or_else(|| condition(&[], "PodScheduled", true, None, None, now));
    let (reason, message) = if ready { (None, None) } else { not_ready() };
    // The conditions others own stay as they are, first, as the kubelet keeps them.
    let others: Vec<PodCondition> = old_conditions
        .iter()
        .filter(|c| !pod_condition_by_kubelet(&c.type_))
        .cloned()
        .collect();
    let gates = if ready {
        readiness_gates_unready(pod, &others)
    } else {
        None
    };
    let (pod_ready, ready_reason, ready_message) = match gates {
        Some(why) => (false, Some(READINESS_GATES_NOT_READY.to_owned()), Some(why)),
        None => (ready, reason.clone(), message.clone()),
    };
    let uninitialized: Vec<&str> = init_statuses
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let mut conditions = others;
    conditions.extend([
        condition(
            &old_conditions,
            "Initialized",
            uninitialized.is_empty(),
            Some("ContainersNotInitialized".to_owned()),
            Some(format!(
                "containers with incomplete status: [{}]",
                uninitialized.join(" ")
            )),
            now,
        ),
        condition(
            &old_conditions,
            "Ready",
            pod_ready,
            ready_reason,
            ready_message,
            now,
        ),
        condition(
            &old_conditions,
            "ContainersReady",
            ready,
            reason,
            message,
            now,
        ),
        scheduled,
    ]);
    let sandbox_ips = inputs.runtime.and_then(|r| r.ready_sandbox());
    let sandbox_ips = sandbox_ips.map(|s| s.ips.as_slice()).unwrap_or_default();
    let pod_ips: Vec<String> = pod_ips(pod, sandbox_ips, inputs.host_ip)
        .iter()
        .map(ToString::to_string)
        .collect();
    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        host_ip: inputs.host_ip.map(|ip| ip.to_string()),
        pod_ip: pod_ips.first().cloned().or(old.pod_ip.clone()),
        pod_ips: if pod_ips.is_empty() {
            old.pod_ips.clone()
        } else {
            Some(pod_ips.into_iter().map(|ip| PodIP { ip }).collect())
        },
        start_time: old.start_time.clone().or(Some(Time(now))),
        qos_class: pod
            .spec
            .as_ref()
            .map(|s| crate::resources::qos_class(s).as_str().to_owned()),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty())
            .then_some(ephemeral_statuses),
        reason: old.reason.clone().filter(|_| terminal),
        message: old.message.clone().filter(|_| terminal),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::runtime_status::SandboxState;
    use crate::kuberuntime::runtime_status::testing::container;
    use crate::pod::testing::{gated, pod, with_conditions, with_init};

    fn rc(name: &str, attempt: u32, state: RunState, exit_code: i32) -> RuntimeContainer {
        RuntimeContainer {
            created_at: 1,
            started_at: 1_700_000_000_000_000_000,
            finished_at: if state == RunState::Exited {
                1_700_000_001_000_000_000
            } else {
                0
            },
            exit_code,
            image: "docker.io/library/nginx:latest".into(),
            image_ref: "docker.io/library/nginx@sha256:ab".into(),
            ..container(&format!("{name}{attempt}"), name, "s", attempt, state)
        }
    }

    /// A ready sandbox `s` with `ips`, and container `a` running in it.
    fn running_a(ips: Vec<IpAddr>) -> PodRuntimeStatus {
        PodRuntimeStatus {
            sandboxes: vec![SandboxState {
                id: "s".into(),
                attempt: 0,
                ready: true,
                created_at: 1,
                ips,
            }],
            containers: vec![rc("a", 0, RunState::Running, 0)],
        }
    }

    fn waiting_reason(cs: &ContainerStatus) -> Option<&str> {
        cs.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
    }

    fn inputs<'a>(
        runtime: &'a PodRuntimeStatus,
        waiting: &'a HashMap<String, Waiting>,
    ) -> StatusInputs<'a> {
        StatusInputs {
            runtime: Some(runtime),
            waiting: Some(waiting),
            host_ip: Some("198.18.0.1".parse().unwrap()),
            runtime_name: "containerd",
            now: Timestamp::from_second(1_700_000_100).unwrap(),
            probes: None,
        }
    }

    #[test]
    fn readiness_and_startup_probes_gate_ready_and_started() {
        let mut p = pod("web", &[("a", "nginx")]);
        let spec = &mut p.spec.as_mut().unwrap().containers[0];
        spec.readiness_probe = Some(Default::default());
        spec.startup_probe = Some(Default::default());
        let rt = running_a(vec![]);
        let w = HashMap::new();
        let results = Results::default();
        let check = |results: &Results| {
            let status = generate_pod_status(
                &p,
                &StatusInputs {
                    probes: Some(results),
                    ..inputs(&rt, &w)
                },
            );
            let cs = &status.container_statuses.unwrap()[0];
            let ready = status
                .conditions
                .unwrap()
                .into_iter()
                .find(|c| c.type_ == "ContainersReady");
            (cs.started, cs.ready, ready.unwrap().status)
        };
        results.set("a0", ProbeKind::Startup, ProbeResult::Unknown);
        results.set("a0", ProbeKind::Readiness, ProbeResult::Success);
        assert_eq!(check(&results), (Some(false), false, "False".to_owned()));
        results.set("a0", ProbeKind::Startup, ProbeResult::Success);
        assert_eq!(check(&results), (Some(true), true, "True".to_owned()));
        results.set("a0", ProbeKind::Readiness, ProbeResult::Failure);
        assert_eq!(check(&results), (Some(true), false, "False".to_owned()));
    }

    /// A pod with readiness gates is Ready only once its containers are and every gate's
    /// condition is True, with the kubelet's reason and message meanwhile; the gates'
    /// conditions, set by others, stay in the status.
    #[test]
    fn readiness_gates_hold_ready_until_their_conditions_are_true() {
        let p = gated(&["example.com/lb", "example.com/dns"]);
        let w = HashMap::new();
        let with = |gates: &[(&str, &str)], rt: &PodRuntimeStatus| {
            generate_pod_status(&with_conditions(&p, gates), &inputs(rt, &w))
        };
        let running = running_a(vec![]);
        let status = with(&[("example.com/lb", "False")], &running);
        assert_eq!(condition_of(&status, "ContainersReady").status, "True");
        let ready = condition_of(&status, "Ready");
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_deref(),
                ready.message.as_deref()
            ),
            (
                "False",
                Some("ReadinessGatesNotReady"),
                Some(
                    "the status of pod readiness gate \"example.com/lb\" is not \"True\", but False, \
                     corresponding condition of pod readiness gate \"example.com/dns\" does not exist."
                )
            )
        );
        assert_eq!(condition_of(&status, "example.com/lb").status, "False");
        let open = [("example.com/lb", "True"), ("example.com/dns", "True")];
        let status = with(&open, &running);
        assert_eq!(condition_of(&status, "Ready").status, "True");
        assert_eq!(condition_of(&status, "Ready").reason, None);
        assert_eq!(condition_of(&status, "example.com/dns").status, "True");
        // Containers not ready: the containers' reason, whatever the gates say.
        let status = with(&open, &PodRuntimeStatus::default());
        let ready = condition_of(&status, "Ready");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        let status = with(&[], &PodRuntimeStatus::default());
        assert_eq!(
            condition_of(&status, "Ready").message.as_deref(),
            Some("containers with unready status: [a]")
        );
    }

    /// Ephemeral containers have statuses of their own, never ready or started, that show
    /// a run that ended as terminated (it is not restarted), and count for neither the
    /// phase nor readiness.
    #[test]
    fn ephemeral_containers_have_their_own_statuses() {
        let mut p = pod("web", &[("a", "nginx")]);
        p.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
                name: "debugger".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }]);
        let w = HashMap::new();
        let mut rt = running_a(vec![]);
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        let debugger = &status.ephemeral_container_statuses.as_ref().unwrap()[0];
        assert_eq!(debugger.name, "debugger");
        assert_eq!(waiting_reason(debugger), Some("ContainerCreating"));
        assert_eq!((debugger.ready, debugger.started), (false, None));
        assert_eq!(condition_of(&status, "Ready").status, "True");
        rt.containers.push(rc("debugger", 0, RunState::Running, 0));
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        let debugger = &status.ephemeral_container_statuses.as_ref().unwrap()[0];
        assert!(debugger.state.as_ref().unwrap().running.is_some());
        assert!(!debugger.ready);
        assert_eq!(status.container_statuses.as_ref().unwrap().len(), 1);
        rt.containers[1] = rc("debugger", 0, RunState::Exited, 0);
        // A stale reason to wait does not apply: it is never started again.
        let w = HashMap::from([(
            "debugger".to_owned(),
            Waiting {
                reason: "ErrImagePull".into(),
                message: "old".into(),
            },
        )]);
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        let debugger = &status.ephemeral_container_statuses.as_ref().unwrap()[0];
        let done = debugger
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(done.reason.as_deref(), Some("Completed"));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let plain = generate_pod_status(&pod("web", &[("a", "nginx")]), &inputs(&rt, &w));
        assert_eq!(plain.ephemeral_container_statuses, None);
    }

    #[test]
    fn a_new_pod_is_pending_with_containers_creating() {
        let p = pod("web", &[("a", "nginx")]);
        let rt = PodRuntimeStatus::default();
        let w = HashMap::new();
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let cs = &status.container_statuses.unwrap()[0];
        assert_eq!(waiting_reason(cs), Some("ContainerCreating"));
        assert!(!cs.ready);
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [a]")
        );
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    }

    /// An evicted pod whose containers still run until killed stays Failed, and keeps
    /// why (`Evicted` and the eviction manager's message); a running pod has neither.
    #[test]
    fn a_terminal_pod_keeps_its_phase_reason_and_message() {
        let mut p = pod("web", &[("a", "nginx")]);
        let rt = running_a(vec![]);
        let w = HashMap::new();
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        assert_eq!((status.reason, status.message), (None, None));
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            message: Some("The node was low on resource: memory. ".into()),
            ..Default::default()
        });
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        assert_eq!(
            (
                status.phase.as_deref(),
                status.reason.as_deref(),
                status.message.as_deref()
            ),
            (
                Some("Failed"),
                Some("Evicted"),
                Some("The node was low on resource: memory. ")
            )
        );
    }

    #[test]
    fn a_running_pod_is_ready_with_ips_and_ids() {
        let p = pod("web", &[("a", "nginx")]);
        let rt = running_a(vec!["10.244.1.9".parse().unwrap()]);
        let w = HashMap::new();
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.244.1.9"));
        assert_eq!(status.host_ip.as_deref(), Some("198.18.0.1"));
        let cs = &status.container_statuses.unwrap()[0];
        assert!(cs.ready);
        assert_eq!(cs.container_id.as_deref(), Some("containerd://a0"));
        assert_eq!(cs.image_id, "docker.io/library/nginx@sha256:ab");
        let conditions = status.conditions.unwrap();
        assert!(
            conditions.iter().all(|c| c.status == "True"),
            "{conditions:?}"
        );
    }

    #[test]
    fn image_pull_errors_show_as_waiting_reasons() {
        let p = pod("web", &[("a", "nope:1")]);
        let rt = PodRuntimeStatus::default();
        let w = HashMap::from([(
            "a".to_owned(),
            Waiting {
                reason: "ImagePullBackOff".into(),
                message: "Back-off pulling image".into(),
            },
        )]);
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        let cs = &status.container_statuses.unwrap()[0];
        assert_eq!(waiting_reason(cs), Some("ImagePullBackOff"));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn crash_loops_keep_the_last_termination_and_count_restarts() {
        let p = pod("web", &[("a", "busybox")]);
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![
                rc("a", 3, RunState::Exited, 1),
                rc("a", 2, RunState::Exited, 1),
            ],
        };
        let w = HashMap::from([(
            "a".to_owned(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 40s".into(),
            },
        )]);
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        let cs = &status.container_statuses.unwrap()[0];
        assert_eq!(cs.restart_count, 3);
        assert_eq!(waiting_reason(cs), Some("CrashLoopBackOff"));
        let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
        assert_eq!(last.container_id.as_deref(), Some("containerd://a3"));
        assert_eq!(status.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn phases_follow_the_restart_policy() {
        let p = pod("job", &[("a", "busybox")]);
        let rt = |code| PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![rc("a", 0, RunState::Exited, code)],
        };
        let w = HashMap::new();
        let statuses = |code| container_statuses(&p, &inputs(&rt(code), &w));
        assert_eq!(phase("Never", &[], &statuses(0)), "Succeeded");
        assert_eq!(phase("Never", &[], &statuses(2)), "Failed");
        assert_eq!(phase("OnFailure", &[], &statuses(0)), "Succeeded");
        assert_eq!(phase("OnFailure", &[], &statuses(2)), "Running");
        assert_eq!(phase("Always", &[], &statuses(0)), "Running");
    }

    #[test]
    fn transition_times_are_kept_while_a_condition_holds() {
        let old = vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(Time(Timestamp::from_second(5).unwrap())),
            ..Default::default()
        }];
        let now = Timestamp::from_second(100).unwrap();
        let kept = condition(&old, "Ready", true, None, None, now);
        assert_eq!(
            kept.last_transition_time,
            Some(Time(Timestamp::from_second(5).unwrap()))
        );
        let flipped = condition(&old, "Ready", false, Some("R".into()), None, now);
        assert_eq!(flipped.last_transition_time, Some(Time(now)));
        assert_eq!(flipped.reason.as_deref(), Some("R"));
    }

    fn condition_of<'a>(status: &'a PodStatus, kind: &str) -> &'a PodCondition {
        status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == kind)
            .unwrap()
    }

    #[test]
    fn an_initializing_pod_is_pending_with_its_containers_initializing() {
        let p = with_init(&["one", "two"]);
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![rc("one", 0, RunState::Running, 0)],
        };
        let w = HashMap::new();
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let init = status.init_container_statuses.as_ref().unwrap();
        assert!(init[0].state.as_ref().unwrap().running.is_some());
        assert_eq!(waiting_reason(&init[1]), Some("PodInitializing"));
        assert!(!init[0].ready && init[0].started.is_none());
        let app = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(waiting_reason(app), Some("PodInitializing"));
        let initialized = condition_of(&status, "Initialized");
        assert_eq!(initialized.status, "False");
        assert_eq!(
            initialized.reason.as_deref(),
            Some("ContainersNotInitialized")
        );
        assert_eq!(
            initialized.message.as_deref(),
            Some("containers with incomplete status: [one two]")
        );
    }

    #[test]
    fn succeeded_init_containers_are_ready_and_initialize_the_pod() {
        let p = with_init(&["one"]);
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![
                rc("app", 0, RunState::Running, 0),
                rc("one", 0, RunState::Exited, 0),
            ],
        };
        // A stale reason never turns a finished init container back to waiting.
        let w = HashMap::from([(
            "one".to_owned(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "old".into(),
            },
        )]);
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        let init = &status.init_container_statuses.as_ref().unwrap()[0];
        assert!(init.ready);
        let done = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(done.reason.as_deref(), Some("Completed"));
        assert_eq!(condition_of(&status, "Initialized").status, "True");
        assert_eq!(status.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn a_failed_init_container_fails_a_pod_that_must_not_restart() {
        let mut p = with_init(&["one"]);
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![rc("one", 0, RunState::Exited, 1)],
        };
        let w = HashMap::new();
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        // Restarted by default: Pending while it backs off.
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let init = &status.init_container_statuses.as_ref().unwrap()[0];
        let failed = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (failed.exit_code, failed.reason.as_deref()),
            (1, Some("Error"))
        );
        let app = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(waiting_reason(app), Some("PodInitializing"));
    }

    #[test]
    fn a_crash_looping_init_container_waits_with_its_last_failure() {
        let p = with_init(&["one"]);
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![rc("one", 2, RunState::Exited, 1)],
        };
        let w = HashMap::from([(
            "one".to_owned(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 20s".into(),
            },
        )]);
        let status = generate_pod_status(&p, &inputs(&rt, &w));
        let init = &status.init_container_statuses.as_ref().unwrap()[0];
        assert_eq!(waiting_reason(init), Some("CrashLoopBackOff"));
        assert_eq!(init.restart_count, 2);
        let last = init
            .last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(last.exit_code, 1);
        assert_eq!(status.phase.as_deref(), Some("Pending"));
    }

    /// The runtime's record of a container whose start failed, as containerd reports it.
    fn start_error(attempt: u32) -> RuntimeContainer {
        RuntimeContainer {
            exit_code: 128,
            reason: "StartError".into(),
            message: "failed to create containerd task: exec: \"/nope\": no such file".into(),
            started_at: 0,
            ..rc("a", attempt, RunState::Exited, 128)
        }
    }

    fn run_container_error() -> HashMap<String, Waiting> {
        HashMap::from([(
            "a".to_owned(),
            Waiting {
                reason: "RunContainerError".into(),
                message: "failed to create containerd task".into(),
            },
        )])
    }

    #[test]
    fn a_failed_start_under_never_ends_with_the_runtimes_start_error() {
        let mut p = pod("web", &[("a", "busybox")]);
        p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![start_error(0)],
        };
        // The reason the last sync gave does not apply: the container never runs again.
        let status = generate_pod_status(&p, &inputs(&rt, &run_container_error()));
        let a = &status.container_statuses.as_ref().unwrap()[0];
        let t = a.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (t.exit_code, t.reason.as_deref(), t.message.as_deref()),
            (
                128,
                Some("StartError"),
                Some(start_error(0).message.as_str())
            )
        );
        assert_eq!(t.started_at, None);
        assert_eq!(status.phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn a_failed_start_under_always_waits_with_the_start_error_as_last_state() {
        let p = pod("web", &[("a", "busybox")]);
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![start_error(1), start_error(0)],
        };
        let status = generate_pod_status(&p, &inputs(&rt, &run_container_error()));
        let a = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(waiting_reason(a), Some("RunContainerError"));
        let last = a.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (last.exit_code, last.reason.as_deref()),
            (128, Some("StartError"))
        );
        assert_eq!(a.restart_count, 1);
        assert_eq!(status.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn a_pod_being_deleted_shows_no_reason_to_wait() {
        let mut p = pod("web", &[("a", "busybox")]);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let rt = PodRuntimeStatus {
            sandboxes: vec![],
            containers: vec![start_error(0)],
        };
        let status = generate_pod_status(&p, &inputs(&rt, &run_container_error()));
        let a = &status.container_statuses.as_ref().unwrap()[0];
        let t = a.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(t.reason.as_deref(), Some("StartError"));
    }
}
