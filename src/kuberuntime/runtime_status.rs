//! A pod's state in the runtime: its sandboxes and containers as CRI reports them (the
//! kubelet's `kubecontainer.PodStatus`), read by label `io.kubernetes.pod.uid`.

use std::collections::HashMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use super::labels;
use super::termination::termination_message;
use crate::cri::{Cri, CriError, api};

/// One sandbox of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxState {
    /// The runtime's id.
    pub id: String,
    /// How many sandboxes were made for the pod before this one.
    pub attempt: u32,
    /// Ready (running) or not.
    pub ready: bool,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// Its IPs, primary first (empty for a host-network or not-ready sandbox).
    pub ips: Vec<IpAddr>,
}

/// The state of a container, as CRI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Created, never started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// One container of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    /// The runtime's id.
    pub id: String,
    /// The container's name in the pod spec.
    pub name: String,
    /// The sandbox it belongs to.
    pub sandbox_id: String,
    /// The restart count it was created with (its `restartCount` annotation, else its
    /// attempt).
    pub attempt: u32,
    /// Its state.
    pub state: RunState,
    /// Creation, start and finish times, ns since the epoch (0 = not yet).
    pub created_at: i64,
    /// See `created_at`.
    pub started_at: i64,
    /// See `created_at`.
    pub finished_at: i64,
    /// Exit code when exited.
    pub exit_code: i32,
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// The termination message.
    pub message: String,
    /// The image as asked for.
    pub image: String,
    /// The image's resolved reference (digest).
    pub image_ref: String,
    /// The spec hash it was created from.
    pub hash: String,
}

/// A pod's sandboxes and containers, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRuntimeStatus {
    /// Sandboxes, newest first.
    pub sandboxes: Vec<SandboxState>,
    /// Containers, newest first.
    pub containers: Vec<ContainerState>,
}

impl PodRuntimeStatus {
    /// The newest container with this name.
    #[must_use]
    pub fn latest(&self, name: &str) -> Option<&ContainerState> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The newest container with this name that exited, even under a newer one that did not
    /// run (created, or unknown to the runtime).
    #[must_use]
    pub fn latest_exited(&self, name: &str) -> Option<&ContainerState> {
        self.containers
            .iter()
            .find(|c| c.name == name && c.state == RunState::Exited)
    }

    /// The two newest containers with this name: the current and the one before.
    #[must_use]
    pub fn latest_two(&self, name: &str) -> (Option<&ContainerState>, Option<&ContainerState>) {
        let mut it = self.containers.iter().filter(|c| c.name == name);
        (it.next(), it.next())
    }

    /// The newest sandbox if it is ready.
    #[must_use]
    pub fn ready_sandbox(&self) -> Option<&SandboxState> {
        self.sandboxes.first().filter(|s| s.ready)
    }

    /// The pod's IPs, primary first, as the kubelet reports them in `status.podIPs` and
    /// probes and hooks dial them: see [`pod_ips`], with the ready sandbox's IPs.
    #[must_use]
    pub fn pod_ips(&self, pod: &Pod, host_ip: Option<IpAddr>) -> Vec<IpAddr> {
        let sandbox = self.ready_sandbox().map(|s| s.ips.as_slice());
        pod_ips(pod, sandbox.unwrap_or_default(), host_ip)
    }

    /// Nothing of the pod is left in the runtime.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }
}

/// The IPs of a pod whose sandbox has `sandbox_ips`, primary first (the kubelet's
/// `generateAPIPodStatus`): the node's (`host_ip`) for a pod on the host's network, whose
/// sandbox has none in the runtime, else the sandbox's. Status, probes and lifecycle hooks
/// all take the pod's IP from here.
#[must_use]
pub fn pod_ips(pod: &Pod, sandbox_ips: &[IpAddr], host_ip: Option<IpAddr>) -> Vec<IpAddr> {
    if crate::pod::host_network(pod) {
        host_ip.into_iter().collect()
    } else {
        sandbox_ips.to_vec()
    }
}

/// The primary of `ips` as text, empty if there is none (the default host of a probe or
/// hook then fails to dial, as the kubelet's does).
#[must_use]
pub fn primary_ip(ips: &[IpAddr]) -> String {
    ips.first().map(ToString::to_string).unwrap_or_default()
}

fn uid_filter(uid: &str) -> HashMap<String, String> {
    HashMap::from([(labels::POD_UID.to_owned(), uid.to_owned())])
}

fn run_state(state: i32) -> RunState {
    match api::ContainerState::try_from(state) {
        Ok(api::ContainerState::ContainerCreated) => RunState::Created,
        Ok(api::ContainerState::ContainerRunning) => RunState::Running,
        Ok(api::ContainerState::ContainerExited) => RunState::Exited,
        _ => RunState::Unknown,
    }
}

/// Reads the pod's sandboxes (with the IPs of the newest) and containers from the runtime.
///
/// # Errors
/// A failed CRI call; a container or sandbox removed meanwhile is skipped.
pub async fn get_pod_status<C: Cri>(cri: &C, uid: &str) -> Result<PodRuntimeStatus, CriError> {
    let sandboxes = cri
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: uid_filter(uid),
                ..Default::default()
            }),
        })
        .await?
        .items;
    let mut sandboxes: Vec<SandboxState> = sandboxes
        .into_iter()
        .map(|s| SandboxState {
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            ready: s.state() == api::PodSandboxState::SandboxReady,
            created_at: s.created_at,
            ips: Vec::new(),
            id: s.id,
        })
        .collect();
    sandboxes.sort_by_key(|s| std::cmp::Reverse((s.attempt, s.created_at)));
    if let Some(newest) = sandboxes.first_mut().filter(|s| s.ready) {
        match cri
            .pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: newest.id.clone(),
                verbose: false,
            })
            .await
        {
            Ok(resp) => {
                let network = resp.status.and_then(|s| s.network);
                if let Some(net) = network {
                    let additional = net.additional_ips.into_iter().map(|ip| ip.ip);
                    newest.ips = std::iter::once(net.ip)
                        .chain(additional)
                        .filter_map(|ip| ip.parse().ok())
                        .collect();
                }
            }
            Err(e) if e.is_not_found() => newest.ready = false,
            Err(e) => return Err(e),
        }
    }
    let listed = cri
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: uid_filter(uid),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    let mut containers = Vec::with_capacity(listed.len());
    for c in listed {
        let status = match cri
            .container_status(api::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await
        {
            Ok(resp) => resp.status,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let Some(s) = status else { continue };
        let state = run_state(s.state);
        let annotation = |key: &str| c.annotations.get(key).map_or("", String::as_str);
        let message = if state == RunState::Exited && s.message.is_empty() {
            termination_message(
                &s,
                annotation(labels::TERMINATION_MESSAGE_PATH),
                annotation(labels::TERMINATION_MESSAGE_POLICY),
            )
            .await
        } else {
            s.message.clone()
        };
        containers.push(ContainerState {
            name: c
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .unwrap_or_default(),
            sandbox_id: c.pod_sandbox_id,
            // The kubelet's restart count is its annotation (the same as the attempt on
            // the containers either agent makes).
            attempt: annotation(labels::CONTAINER_RESTART_COUNT)
                .parse()
                .unwrap_or_else(|_| s.metadata.as_ref().map_or(0, |m| m.attempt)),
            state,
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            reason: s.reason,
            message,
            image: s.image.map(|i| i.image).unwrap_or_default(),
            image_ref: s.image_ref,
            hash: c
                .annotations
                .get(labels::CONTAINER_HASH)
                .cloned()
                .unwrap_or_default(),
            id: c.id,
        });
    }
    containers.sort_by_key(|c| std::cmp::Reverse((c.attempt, c.created_at)));
    Ok(PodRuntimeStatus {
        sandboxes,
        containers,
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Runtime states for unit tests.
    use super::{ContainerState, RunState, SandboxState};

    /// A sandbox with no IPs, created at its attempt (a newer attempt is newer).
    pub fn sandbox(id: &str, attempt: u32, ready: bool) -> SandboxState {
        SandboxState {
            id: id.into(),
            attempt,
            ready,
            created_at: i64::from(attempt),
            ips: Vec::new(),
        }
    }

    /// A container created at its attempt, with no run times, exit code, image or hash:
    /// a test sets what it needs with `..container(...)`.
    pub fn container(
        id: &str,
        name: &str,
        sandbox_id: &str,
        attempt: u32,
        state: RunState,
    ) -> ContainerState {
        ContainerState {
            id: id.into(),
            name: name.into(),
            sandbox_id: sandbox_id.into(),
            attempt,
            state,
            created_at: i64::from(attempt),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            hash: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::Result;

    /// A pod on the host's network has the node's IP, which its sandbox does not report;
    /// any other pod its ready sandbox's.
    #[test]
    fn a_host_network_pod_has_the_nodes_ip() {
        let node: IpAddr = "198.18.0.1".parse().unwrap();
        let mut sandbox = testing::sandbox("s1", 0, true);
        sandbox.ips = vec!["10.244.0.7".parse().unwrap()];
        let status = PodRuntimeStatus {
            sandboxes: vec![sandbox],
            containers: Vec::new(),
        };
        let mut pod = crate::pod::testing::pod("web", &[("web", "nginx")]);
        assert_eq!(
            status.pod_ips(&pod, Some(node)),
            ["10.244.0.7".parse::<IpAddr>().unwrap()]
        );
        pod.spec.as_mut().unwrap().host_network = Some(true);
        let host_sandbox = PodRuntimeStatus {
            sandboxes: vec![testing::sandbox("s2", 0, true)],
            containers: Vec::new(),
        };
        assert_eq!(host_sandbox.pod_ips(&pod, Some(node)), [node]);
        assert_eq!(
            primary_ip(&host_sandbox.pod_ips(&pod, Some(node))),
            "198.18.0.1"
        );
        assert_eq!(primary_ip(&host_sandbox.pod_ips(&pod, None)), "");
    }

    /// A runtime holding one container of pod `u1` whose start failed, as containerd 1.6
    /// reports it: exited, exit code 128, reason `StartError` and runc's message.
    struct StartFailed;

    const RUNC: &str = "failed to create containerd task: failed to create shim task: OCI \
                        runtime create failed: runc create failed: unable to start container \
                        process: exec: \"/does-not-exist\": stat /does-not-exist: no such \
                        file or directory: unknown";

    impl Cri for StartFailed {
        async fn list_pod_sandbox(
            &self,
            _: api::ListPodSandboxRequest,
        ) -> Result<api::ListPodSandboxResponse> {
            Ok(api::ListPodSandboxResponse::default())
        }
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> Result<api::ListContainersResponse> {
            Ok(api::ListContainersResponse {
                containers: vec![api::Container {
                    id: "c1".into(),
                    pod_sandbox_id: "s1".into(),
                    labels: HashMap::from([(labels::CONTAINER_NAME.to_owned(), "c".to_owned())]),
                    annotations: HashMap::from([(
                        labels::TERMINATION_MESSAGE_POLICY.to_owned(),
                        "FallbackToLogsOnError".to_owned(),
                    )]),
                    ..Default::default()
                }],
            })
        }
        async fn container_status(
            &self,
            _: api::ContainerStatusRequest,
        ) -> Result<api::ContainerStatusResponse> {
            Ok(api::ContainerStatusResponse {
                status: Some(api::ContainerStatus {
                    id: "c1".into(),
                    state: api::ContainerState::ContainerExited.into(),
                    created_at: 1,
                    finished_at: 2,
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: RUNC.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        }
    }

    /// The crash-loop back-off counts from the newest exit even when a newer instance never
    /// ran (the kubelet's `doBackOff` looks for the newest exited one).
    #[test]
    fn the_latest_exit_is_found_under_a_container_that_never_ran() {
        let container = |id: &str, state, finished_at| ContainerState {
            finished_at,
            ..testing::container(id, "c", "s1", 0, state)
        };
        let status = PodRuntimeStatus {
            sandboxes: Vec::new(),
            containers: vec![
                container("new", RunState::Created, 0),
                container("old", RunState::Exited, 7),
            ],
        };
        assert_eq!(status.latest("c").map(|c| c.id.as_str()), Some("new"));
        assert_eq!(
            status
                .latest_exited("c")
                .map(|c| (c.id.as_str(), c.finished_at)),
            Some(("old", 7))
        );
        assert!(status.latest_exited("other").is_none());
    }

    #[tokio::test]
    async fn a_failed_start_keeps_the_runtimes_reason_exit_code_and_message() {
        let status = get_pod_status(&StartFailed, "u1").await.unwrap();
        let c = status.latest("c").unwrap();
        assert_eq!(
            (c.state, c.exit_code, c.reason.as_str(), c.message.as_str()),
            (RunState::Exited, 128, "StartError", RUNC)
        );
        assert_eq!(c.started_at, 0);
    }
}
