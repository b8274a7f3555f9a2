//! What to do to bring a pod's runtime state to its spec: the kubelet's
//! `computePodActions`. Pure, so every rule is unit-tested.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::container::hash_matches;
use super::runtime_status::{ContainerState, PodRuntimeStatus, RunState};
use crate::probe::results::{ProbeKind, Results};

/// The actions of one sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and sandbox of the pod first (a new sandbox is needed).
    pub kill_pod: bool,
    /// Make a new sandbox, with this attempt number.
    pub create_sandbox: Option<u32>,
    /// The ready sandbox to start containers in, when no new one is made.
    pub sandbox_id: Option<String>,
    /// The init container to start next: index into `spec.initContainers`, with its
    /// restart count. While one is set, no app container starts.
    pub next_init: Option<(usize, u32)>,
    /// Indexes into `spec.containers` of the containers to start, with their restart count.
    pub start: Vec<(usize, u32)>,
    /// Indexes into `spec.ephemeralContainers` of the ephemeral containers to start: those
    /// the runtime never ran (they are never restarted), in the pod's ready sandbox, also
    /// while it initializes.
    pub ephemeral: Vec<usize>,
    /// Running containers to stop: (container id, name, why).
    pub kill: Vec<(String, String, String)>,
}

/// Should a container that ended with `exit_code` run again under the pod's policy?
#[must_use]
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// An init container that failed: it exited with a non-zero code, or its state is unknown
/// (the kubelet's `isInitContainerFailed`).
fn init_failed(c: &ContainerState) -> bool {
    (c.state == RunState::Exited && c.exit_code != 0) || c.state == RunState::Unknown
}

/// Where a pod's init containers stand in its current sandbox.
#[derive(Debug, PartialEq, Eq)]
enum InitProgress<'a> {
    /// All of them succeeded (or there are none): the app containers may run.
    Done,
    /// One of them is running.
    Running,
    /// This one (an index into `spec.initContainers`) runs next; `failed` is its last
    /// run when that failed.
    Next {
        index: usize,
        failed: Option<&'a ContainerState>,
    },
}

/// The kubelet's `findNextInitContainerToRun`, over the containers of the current sandbox
/// only: a new sandbox runs every init container again. An app container running means
/// initialization is done, whatever is left of the init containers (the runtime's
/// garbage collection, or another agent's, may have removed them).
fn init_progress<'a>(
    (init, apps): (&[Container], &[Container]),
    status: &'a PodRuntimeStatus,
    sandbox_id: &str,
) -> InitProgress<'a> {
    let current = |name: &str| {
        status
            .containers
            .iter()
            .find(|c| c.name == name && c.sandbox_id == sandbox_id)
    };
    if apps
        .iter()
        .any(|c| current(&c.name).is_some_and(|s| s.state == RunState::Running))
    {
        return InitProgress::Done;
    }
    // The last failed one is retried first.
    for (index, c) in init.iter().enumerate().rev() {
        if let Some(failed) = current(&c.name).filter(|s| init_failed(s)) {
            return InitProgress::Next {
                index,
                failed: Some(failed),
            };
        }
    }
    for (index, c) in init.iter().enumerate().rev() {
        match current(&c.name).map(|s| s.state) {
            Some(RunState::Running) => return InitProgress::Running,
            Some(RunState::Exited) if index + 1 == init.len() => return InitProgress::Done,
            Some(RunState::Exited) => {
                return InitProgress::Next {
                    index: index + 1,
                    failed: None,
                };
            }
            _ => {}
        }
    }
    if init.is_empty() {
        InitProgress::Done
    } else {
        InitProgress::Next {
            index: 0,
            failed: None,
        }
    }
}

/// Computes the actions for a pod that should be running; `probes` tells which running
/// containers failed a liveness or startup probe.
#[must_use]
pub fn compute_pod_actions(
    pod: &Pod,
    status: &PodRuntimeStatus,
    probes: Option<&Results>,
) -> PodActions {
    let Some(spec) = pod.spec.as_ref() else {
        return PodActions::default();
    };
    let policy = crate::pod::restart_policy(pod);
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let restarts = |name: &str| status.latest(name).map_or(0, |s| s.attempt + 1);
    let mut actions = PodActions::default();
    // More than one ready sandbox (a RunPodSandbox that the runtime finished although its
    // caller saw it fail, then was retried): the kubelet's `podSandboxChanged` kills them
    // all and makes a new one, so the pod ends with one sandbox and one IP.
    let ready = status.sandboxes.iter().filter(|s| s.ready).count();
    let Some(sandbox) = status.ready_sandbox().filter(|_| ready == 1) else {
        let attempt = status.sandboxes.first().map_or(0, |s| s.attempt + 1);
        // A pod that must not restart, whose containers already ran, gets no new sandbox.
        if policy == "Never" && !status.sandboxes.is_empty() && !status.containers.is_empty() {
            actions.kill_pod = status
                .containers
                .iter()
                .any(|c| c.state == RunState::Running);
            return actions;
        }
        actions.kill_pod = !status.is_empty();
        actions.create_sandbox = Some(attempt);
        // A new sandbox starts with the first init container, and only with it.
        if let Some(first) = init.first() {
            actions.next_init = Some((0, restarts(&first.name)));
            return actions;
        }
        for (i, c) in spec.containers.iter().enumerate() {
            let restarts = restarts(&c.name);
            // A container of an OnFailure pod that completed does not run again.
            let done = status.latest(&c.name).is_some_and(|s| {
                s.state == RunState::Exited && !should_restart(policy, s.exit_code)
            });
            if !done {
                actions.start.push((i, restarts));
            }
        }
        return actions;
    };
    actions.sandbox_id = Some(sandbox.id.clone());
    actions.ephemeral = crate::pod::ephemeral_containers(pod)
        .enumerate()
        .filter(|(_, ec)| status.latest(&ec.name).is_none())
        .map(|(i, _)| i)
        .collect();
    match init_progress((init, &spec.containers), status, &sandbox.id) {
        InitProgress::Done => {}
        // Initialization is under way: the app containers wait.
        InitProgress::Running => return actions,
        InitProgress::Next { index, failed } => {
            if failed.is_some() && policy == "Never" {
                // A failed init container of a pod that must not restart fails the pod.
                actions.kill_pod = true;
                return actions;
            }
            if let Some(unknown) = failed.filter(|f| f.state == RunState::Unknown) {
                actions.kill.push((
                    unknown.id.clone(),
                    unknown.name.clone(),
                    format!(
                        "Init container {} is in an unknown state, try killing it before restart",
                        unknown.name
                    ),
                ));
            }
            actions.next_init = Some((index, restarts(&init[index].name)));
            return actions;
        }
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let current = status
            .latest(&c.name)
            .filter(|s| s.sandbox_id == sandbox.id);
        match current {
            None => actions
                .start
                .push((i, status.latest(&c.name).map_or(0, |s| s.attempt + 1))),
            Some(s) if s.state == RunState::Running => {
                if !hash_matches(&s.hash, c) {
                    actions.kill.push((
                        s.id.clone(),
                        c.name.clone(),
                        format!("Container {} definition changed, will be restarted", c.name),
                    ));
                    actions.start.push((i, s.attempt + 1));
                } else if let Some(kind) = probes.and_then(|p| p.failed_probe(&s.id)) {
                    let probe = if kind == ProbeKind::Liveness {
                        "liveness"
                    } else {
                        "startup"
                    };
                    let mut why = format!("Container {} failed {probe} probe", c.name);
                    if policy != "Never" {
                        why.push_str(", will be restarted");
                    }
                    actions.kill.push((s.id.clone(), c.name.clone(), why));
                }
            }
            Some(s) if s.state == RunState::Created || should_restart(policy, s.exit_code) => {
                actions.start.push((i, s.attempt + 1));
            }
            Some(_) => {}
        }
    }
    // Running containers that are no longer in the spec (ephemeral containers stay).
    for s in &status.containers {
        let wanted = spec.containers.iter().chain(init).any(|c| c.name == s.name)
            || crate::pod::ephemeral_containers(pod).any(|c| c.name == s.name);
        if s.state == RunState::Running && !wanted {
            actions.kill.push((
                s.id.clone(),
                s.name.clone(),
                format!("Container {} is not in the pod's spec", s.name),
            ));
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::super::container::container_hash;
    use super::super::runtime_status::testing::{self, sandbox};
    use super::*;
    use crate::pod::testing::{pod, with_init};

    fn container(
        p: &Pod,
        name: &str,
        sandbox: &str,
        attempt: u32,
        state: RunState,
        exit_code: i32,
    ) -> ContainerState {
        let spec = p
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .find(|c| c.name == name);
        ContainerState {
            exit_code,
            hash: spec.map(container_hash).unwrap_or_default(),
            ..testing::container(&format!("{name}-{attempt}"), name, sandbox, attempt, state)
        }
    }

    #[test]
    fn a_failed_liveness_probe_kills_the_container_with_the_kubelet_message() {
        let p = pod("web", &[("a", "nginx")]);
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(&p, "a", "s1", 0, RunState::Running, 0)],
        };
        let results = Results::default();
        results.set(
            "a-0",
            ProbeKind::Liveness,
            crate::probe::ProbeResult::Success,
        );
        assert!(
            compute_pod_actions(&p, &status, Some(&results))
                .kill
                .is_empty()
        );
        results.set(
            "a-0",
            ProbeKind::Liveness,
            crate::probe::ProbeResult::Failure,
        );
        let actions = compute_pod_actions(&p, &status, Some(&results));
        assert_eq!(
            actions.kill,
            [(
                "a-0".to_owned(),
                "a".to_owned(),
                "Container a failed liveness probe, will be restarted".to_owned()
            )]
        );
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_containers() {
        let p = pod("web", &[("a", "nginx"), ("b", "busybox")]);
        let actions = compute_pod_actions(&p, &PodRuntimeStatus::default(), None);
        assert_eq!(actions.create_sandbox, Some(0));
        assert!(!actions.kill_pod);
        assert_eq!(actions.start, [(0, 0), (1, 0)]);
    }

    #[test]
    fn a_running_pod_needs_nothing() {
        let p = pod("web", &[("a", "nginx")]);
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(&p, "a", "s1", 0, RunState::Running, 0)],
        };
        let actions = compute_pod_actions(&p, &status, None);
        assert_eq!(actions.sandbox_id.as_deref(), Some("s1"));
        assert_eq!(actions.create_sandbox, None);
        assert!(actions.start.is_empty() && actions.kill.is_empty());
    }

    #[test]
    fn exited_containers_restart_by_policy() {
        let mut p = pod("web", &[("a", "nginx")]);
        let template = p.clone();
        let exited = |code| PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(&template, "a", "s1", 2, RunState::Exited, code)],
        };
        assert_eq!(compute_pod_actions(&p, &exited(0), None).start, [(0, 3)]);
        p.spec.as_mut().unwrap().restart_policy = Some("OnFailure".into());
        assert!(compute_pod_actions(&p, &exited(0), None).start.is_empty());
        assert_eq!(compute_pod_actions(&p, &exited(1), None).start, [(0, 3)]);
        p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        assert!(compute_pod_actions(&p, &exited(1), None).start.is_empty());
    }

    #[test]
    fn a_dead_sandbox_is_replaced_with_the_next_attempt() {
        let p = pod("web", &[("a", "nginx")]);
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec![container(&p, "a", "s1", 0, RunState::Exited, 137)],
        };
        let actions = compute_pod_actions(&p, &status, None);
        assert!(actions.kill_pod);
        assert_eq!(actions.create_sandbox, Some(1));
        assert_eq!(actions.start, [(0, 1)]);
    }

    #[test]
    fn two_ready_sandboxes_are_both_killed_and_replaced_by_a_new_one() {
        let p = pod("web", &[("a", "nginx")]);
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s2", 1, true), sandbox("s1", 0, true)],
            containers: vec![container(&p, "a", "s2", 0, RunState::Running, 0)],
        };
        let actions = compute_pod_actions(&p, &status, None);
        assert!(actions.kill_pod);
        assert_eq!(actions.create_sandbox, Some(2));
        assert_eq!(actions.sandbox_id, None);
        assert_eq!(actions.start, [(0, 1)]);
        // One ready sandbox next to dead ones is used as it is.
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s2", 1, true), sandbox("s1", 0, false)],
            ..status
        };
        let actions = compute_pod_actions(&p, &status, None);
        assert!(!actions.kill_pod);
        assert_eq!(actions.sandbox_id.as_deref(), Some("s2"));
    }

    #[test]
    fn never_restart_pods_get_no_new_sandbox() {
        let mut p = pod("job", &[("a", "busybox")]);
        p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec![container(&p, "a", "s1", 0, RunState::Exited, 0)],
        };
        assert_eq!(
            compute_pod_actions(&p, &status, None),
            PodActions::default()
        );
    }

    #[test]
    fn a_changed_spec_restarts_the_container_and_strays_are_killed() {
        let p = pod("web", &[("a", "nginx")]);
        let mut changed = container(&p, "a", "s1", 0, RunState::Running, 0);
        changed.hash = "old".into();
        let stray = container(&p, "gone", "s1", 0, RunState::Running, 0);
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![changed, stray],
        };
        let actions = compute_pod_actions(&p, &status, None);
        assert_eq!(actions.start, [(0, 1)]);
        let killed: Vec<_> = actions.kill.iter().map(|(id, ..)| id.as_str()).collect();
        assert_eq!(killed, ["a-0", "gone-0"]);
    }

    fn ran(name: &str, sandbox: &str, attempt: u32, state: RunState, code: i32) -> ContainerState {
        ContainerState {
            exit_code: code,
            ..testing::container(&format!("{name}-{attempt}"), name, sandbox, attempt, state)
        }
    }

    fn in_sandbox(containers: Vec<ContainerState>) -> PodRuntimeStatus {
        PodRuntimeStatus {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers,
        }
    }

    fn with_debugger(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
                name: "debugger".into(),
                image: Some("busybox".into()),
                target_container_name: Some("a".into()),
                ..Default::default()
            }]);
        p
    }

    /// An ephemeral container starts once in the ready sandbox (also while the pod
    /// initializes), is never restarted once it ran, is no stray, and a new sandbox does
    /// not start it.
    #[test]
    fn ephemeral_containers_start_once_and_are_never_restarted() {
        let p = with_debugger(pod("web", &[("a", "nginx")]));
        let app = container(&p, "a", "s1", 0, RunState::Running, 0);
        let actions = compute_pod_actions(&p, &in_sandbox(vec![app.clone()]), None);
        assert_eq!(actions.ephemeral, [0]);
        assert!(actions.start.is_empty());
        for state in [RunState::Running, RunState::Exited] {
            let debugger = ran("debugger", "s1", 0, state, 1);
            let status = in_sandbox(vec![app.clone(), debugger]);
            let actions = compute_pod_actions(&p, &status, None);
            assert!(actions.ephemeral.is_empty(), "{state:?}");
            assert!(actions.kill.is_empty() && actions.start.is_empty());
        }
        let new_sandbox = compute_pod_actions(&p, &PodRuntimeStatus::default(), None);
        assert!(new_sandbox.ephemeral.is_empty());
        let initializing = with_debugger(with_init(&["one"]));
        let status = in_sandbox(vec![ran("one", "s1", 0, RunState::Running, 0)]);
        assert_eq!(
            compute_pod_actions(&initializing, &status, None).ephemeral,
            [0]
        );
    }

    #[test]
    fn a_new_sandbox_starts_with_the_first_init_container_only() {
        let p = with_init(&["one", "two"]);
        let actions = compute_pod_actions(&p, &PodRuntimeStatus::default(), None);
        assert_eq!(actions.create_sandbox, Some(0));
        assert_eq!(actions.next_init, Some((0, 0)));
        assert!(actions.start.is_empty());
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order_before_the_app() {
        let p = with_init(&["one", "two"]);
        let running = in_sandbox(vec![ran("one", "s1", 0, RunState::Running, 0)]);
        let actions = compute_pod_actions(&p, &running, None);
        assert_eq!((actions.next_init, actions.start.len()), (None, 0));
        assert!(
            actions.kill.is_empty(),
            "a running init container is no stray"
        );

        let first_done = in_sandbox(vec![ran("one", "s1", 0, RunState::Exited, 0)]);
        let actions = compute_pod_actions(&p, &first_done, None);
        assert_eq!(actions.next_init, Some((1, 0)));
        assert!(actions.start.is_empty());

        let all_done = in_sandbox(vec![
            ran("two", "s1", 0, RunState::Exited, 0),
            ran("one", "s1", 0, RunState::Exited, 0),
        ]);
        let actions = compute_pod_actions(&p, &all_done, None);
        assert_eq!(actions.next_init, None);
        assert_eq!(actions.start, [(0, 0)]);
    }

    /// The init containers of a running pod may be gone (garbage collected, by this agent
    /// or by the kubelet before a take-over): the running app is not initialized again.
    #[test]
    fn a_running_app_container_means_initialization_is_done() {
        let p = with_init(&["one", "two"]);
        let app = p.spec.as_ref().unwrap().containers[0].name.clone();
        let running = in_sandbox(vec![ran(&app, "s1", 0, RunState::Running, 0)]);
        let actions = compute_pod_actions(&p, &running, None);
        assert_eq!(actions.next_init, None);
        assert!(
            actions.start.is_empty() && actions.kill.is_empty(),
            "{actions:?}"
        );
    }

    #[test]
    fn a_failed_init_container_is_retried_unless_the_pod_must_not_restart() {
        let mut p = with_init(&["one", "two"]);
        let failed = in_sandbox(vec![
            ran("two", "s1", 1, RunState::Exited, 3),
            ran("one", "s1", 0, RunState::Exited, 0),
        ]);
        let actions = compute_pod_actions(&p, &failed, None);
        assert_eq!(actions.next_init, Some((1, 2)));
        assert!(!actions.kill_pod && actions.start.is_empty());

        p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let actions = compute_pod_actions(&p, &failed, None);
        assert!(actions.kill_pod);
        assert_eq!((actions.next_init, actions.start.len()), (None, 0));
    }

    #[test]
    fn an_init_container_in_an_unknown_state_is_killed_before_its_restart() {
        let p = with_init(&["one"]);
        let unknown = in_sandbox(vec![ran("one", "s1", 0, RunState::Unknown, 0)]);
        let actions = compute_pod_actions(&p, &unknown, None);
        assert_eq!(actions.next_init, Some((0, 1)));
        assert_eq!(actions.kill.len(), 1);
        assert_eq!(actions.kill[0].0, "one-0");
    }

    #[test]
    fn a_new_sandbox_runs_the_init_containers_again() {
        let p = with_init(&["one"]);
        // The init container succeeded in the old sandbox, which died; the new one is up.
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox("s2", 1, true), sandbox("s1", 0, false)],
            containers: vec![
                ran("app", "s1", 0, RunState::Exited, 137),
                ran("one", "s1", 0, RunState::Exited, 0),
            ],
        };
        let actions = compute_pod_actions(&p, &status, None);
        assert_eq!(actions.next_init, Some((0, 1)));
        assert!(actions.start.is_empty());
    }
}
