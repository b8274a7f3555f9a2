//! Pods on this node: where they come from (the API watch, the static pods' manifest
//! files), their mirror pods, the worker that owns each one, and the small facts about a
//! Pod object that every other module asks for.
//!
//! Knows no runtime, volume, prober or kubelet sync: a worker calls the `PodSyncer` it is
//! given.

pub mod defaults;
pub mod file;
pub mod mirror;
pub mod source;
pub mod state;
pub mod store;
pub mod workers;

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, PodStatus};

/// The identity of one pod: the UID is the key; namespace and name are for humans, API
/// paths and CRI metadata.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl PodId {
    /// The identity of a Pod object; `None` if the API gave it no uid or name.
    #[must_use]
    pub fn of(pod: &Pod) -> Option<Self> {
        Some(Self {
            uid: pod.metadata.uid.clone()?,
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone()?,
        })
    }
}

impl std::fmt::Display for PodId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// Deletes a pod from the API now: grace period 0 and its UID as precondition, so a new
/// pod of the same name is never deleted. `Ok(false)` when it was gone already (or
/// replaced by another of its name).
///
/// A pod being deleted with a longer grace period is not removed by the first such
/// delete: the API server only shortens its grace period to 0 (`rest.BeforeDelete`), and
/// removes it on the next delete. The kubelet sends that one from its next status sync,
/// after the watch brought the shortened pod back; here it follows at once
/// (two deletes), so that the pod's worker is not woken to terminate it again.
///
/// # Errors
/// The API refused or could not be reached.
pub async fn delete_now(client: &kube::Client, id: &PodId) -> Result<bool, kube::Error> {
    use kube::api::{Api, DeleteParams, Preconditions};
    let api: Api<Pod> = Api::namespaced(client.clone(), &id.namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(id.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let mut deleted = false;
    for _ in 0..DELETES_TO_REMOVE {
        match api.delete(&id.name, &params).await {
            Ok(_) => deleted = true,
            // Gone: by this delete's predecessor, or by someone else.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(deleted),
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// The grace-0 deletes that remove a pod whatever its deletion grace period was: the first
/// shortens a pending one to 0, the second removes it (and finds it gone when the first
/// already did).
const DELETES_TO_REMOVE: usize = 2;

/// The pod's init containers, then its app containers.
pub fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// An ephemeral container as the container it runs: every field of its
/// `EphemeralContainerCommon` (the kubelet casts it to a `Container`); its target is the
/// caller's to read.
#[must_use]
pub fn ephemeral_container(ec: &EphemeralContainer) -> Container {
    // Every field named once: a field added to either type fails to compile here.
    macro_rules! common {
        ($($field:ident),*) => {{
            let EphemeralContainer { $($field,)* target_container_name: _ } = ec.clone();
            Container { $($field),* }
        }};
    }
    common!(
        args,
        command,
        env,
        env_from,
        image,
        image_pull_policy,
        lifecycle,
        liveness_probe,
        name,
        ports,
        readiness_probe,
        resize_policy,
        resources,
        restart_policy,
        security_context,
        startup_probe,
        stdin,
        stdin_once,
        termination_message_path,
        termination_message_policy,
        tty,
        volume_devices,
        volume_mounts,
        working_dir
    )
}

/// The pod's ephemeral containers (`spec.ephemeralContainers`), in spec order.
pub fn ephemeral_containers(pod: &Pod) -> impl Iterator<Item = &EphemeralContainer> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
}

/// The pod's container (init or app) named `name`.
#[must_use]
pub fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    containers(pod).find(|c| c.name == name)
}

/// The pod runs in the node's network namespace.
#[must_use]
pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Grace period for pods that are gone from the API or were never in it (orphans).
pub const ORPHAN_GRACE_SECONDS: i64 = 2;

/// The grace period to use when stopping the pod: the one the API deletion carries, else
/// the spec's, else the default 30 s.
#[must_use]
pub fn termination_grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref()?.termination_grace_period_seconds)
        .unwrap_or(30)
        .max(0)
}

/// The pod has been asked to go away (`metadata.deletionTimestamp` is set).
#[must_use]
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Whether the pod's worker is done with it (the kubelet's `podIsTerminated`): its phase is
/// `Succeeded` or `Failed`, or it is being deleted and none of its containers runs any
/// more (by `status`, the status this agent last generated, else the API's). A pod being
/// deleted whose containers still run holds its resources: it stays active, for admission
/// and as an eviction candidate.
#[must_use]
pub fn is_worker_terminal(pod: &Pod, status: Option<&PodStatus>) -> bool {
    let status = status.or(pod.status.as_ref());
    let phase_terminal = matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    // `notRunning`: every container waiting or terminated (or none reported).
    let not_running = || {
        status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default()
            .iter()
            .all(|c| {
                c.state
                    .as_ref()
                    .is_some_and(|st| st.waiting.is_some() || st.terminated.is_some())
            })
    };
    phase_terminal || (is_terminating(pod) && not_running())
}

/// Whether an update of a pod asks for a sync: its spec, labels, annotations or deletion
/// changed (the kubelet's `podsDifferSemantically`), or the condition of one of its
/// readiness gates did (the kubelet syncs a pod whose Ready condition no longer matches
/// its gates, `NeedToReconcilePodReadiness`). Another change of status alone — mostly this
/// agent's own writes coming back through the watch — does not.
#[must_use]
pub fn differs_semantically(a: &Pod, b: &Pod) -> bool {
    let (m, n) = (&a.metadata, &b.metadata);
    a.spec != b.spec
        || m.labels != n.labels
        || m.annotations != n.annotations
        || m.deletion_timestamp != n.deletion_timestamp
        || m.deletion_grace_period_seconds != n.deletion_grace_period_seconds
        || readiness_gate_conditions(a) != readiness_gate_conditions(b)
}

/// The status of each of the pod's readiness gates' conditions, in gate order (`None`
/// where the condition does not exist).
fn readiness_gate_conditions(pod: &Pod) -> Vec<Option<&str>> {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|gate| {
            conditions
                .iter()
                .find(|c| c.type_ == gate.condition_type)
                .map(|c| c.status.as_str())
        })
        .collect()
}

/// The pod's restart policy: `Always` (default), `OnFailure` or `Never`.
#[must_use]
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

#[cfg(test)]
pub(crate) mod testing {
    //! Pods for unit tests.
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, Pod, PodCondition, PodReadinessGate, PodSpec, PodStatus,
    };
    use kube::api::ObjectMeta;

    /// Pod conditions, each (type, status).
    pub fn conditions(list: &[(&str, &str)]) -> Vec<PodCondition> {
        list.iter()
            .map(|(kind, status)| PodCondition {
                type_: (*kind).into(),
                status: (*status).into(),
                ..Default::default()
            })
            .collect()
    }

    /// A pod `web` (container `a`, nginx) with a readiness gate for each condition type.
    pub fn gated(gates: &[&str]) -> Pod {
        let mut p = pod("web", &[("a", "nginx")]);
        p.spec.as_mut().expect("spec").readiness_gates = Some(
            gates
                .iter()
                .map(|kind| PodReadinessGate {
                    condition_type: (*kind).into(),
                })
                .collect(),
        );
        p
    }

    /// The pod with a status that holds only these conditions, each (type, status).
    pub fn with_conditions(pod: &Pod, list: &[(&str, &str)]) -> Pod {
        let mut p = pod.clone();
        p.status = Some(PodStatus {
            conditions: Some(conditions(list)),
            ..Default::default()
        });
        p
    }

    /// A pod with an app container `app` (nginx) and busybox init containers `names`.
    pub fn with_init(names: &[&str]) -> Pod {
        let mut p = pod("web", &[("app", "nginx")]);
        p.spec.as_mut().expect("spec").init_containers = Some(
            names
                .iter()
                .map(|n| Container {
                    name: (*n).into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                })
                .collect(),
        );
        p
    }

    /// A pod with one container per (name, image), bound to node `n1`.
    pub fn pod(name: &str, containers: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: containers
                    .iter()
                    .map(|(n, image)| Container {
                        name: (*n).into(),
                        image: Some((*image).into()),
                        ports: Some(vec![ContainerPort {
                            container_port: 80,
                            ..Default::default()
                        }]),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An API server holding one pod deleted with a grace period, as `rest.BeforeDelete`
    /// treats it: the first grace-0 delete shortens the grace period, the next removes the
    /// pod, any later one finds it gone. Answers every request on one connection; returns
    /// the methods and paths it was asked.
    async fn graceful_pod_server(
        pending_grace: bool,
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            let mut grace_left = pending_grace;
            let mut exists = true;
            while let Ok((conn, _)) = listener.accept().await {
                let mut conn = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                        break;
                    }
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        conn.read_line(&mut header).await.unwrap();
                        if header.trim().is_empty() {
                            break;
                        }
                        if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:")
                        {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    conn.read_exact(&mut body).await.unwrap();
                    log.lock().unwrap().push(line.trim().to_owned());
                    let pod = json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "web", "namespace": "default", "uid": "uid-web",
                                     "deletionGracePeriodSeconds": 0}});
                    let (status, answer) = if !exists {
                        (
                            "404 Not Found",
                            json!({"apiVersion": "v1", "kind": "Status",
                            "status": "Failure", "reason": "NotFound", "code": 404}),
                        )
                    } else {
                        // Shortened only, or removed: the pod comes back either way.
                        exists = std::mem::take(&mut grace_left);
                        ("200 OK", pod)
                    };
                    let answer = answer.to_string();
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    let out = conn.get_mut();
                    out.write_all(head.as_bytes()).await.unwrap();
                    out.write_all(answer.as_bytes()).await.unwrap();
                }
            }
        });
        (url, seen)
    }

    async fn delete_from(pending_grace: bool) -> (bool, Vec<String>) {
        let (url, seen) = graceful_pod_server(pending_grace).await;
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let pod = testing::pod("web", &[("c", "nginx")]);
        let deleted = delete_now(&client, &PodId::of(&pod).unwrap())
            .await
            .unwrap();
        let seen = seen.lock().unwrap().clone();
        (deleted, seen)
    }

    #[tokio::test]
    async fn a_pod_with_a_pending_grace_period_is_removed_by_a_second_delete_at_once() {
        let (deleted, seen) = delete_from(true).await;
        assert!(deleted);
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(
            seen.iter()
                .all(|r| r.starts_with("DELETE /api/v1/namespaces/default/pods/web"))
        );
    }

    #[tokio::test]
    async fn a_pod_removed_by_the_first_delete_is_found_gone_by_the_second() {
        let (deleted, seen) = delete_from(false).await;
        assert!(deleted);
        assert_eq!(seen.len(), 2, "{seen:?}");
    }

    #[test]
    fn identity_and_defaults() {
        let mut pod = testing::pod("web", &[("c", "nginx")]);
        let id = PodId::of(&pod).unwrap();
        assert_eq!(id.to_string(), "default/web (uid-web)");
        assert_eq!(termination_grace_period(&pod), 30);
        assert_eq!(restart_policy(&pod), "Always");
        assert!(!host_network(&pod));
        assert!(!is_terminating(&pod));
        pod.metadata.deletion_grace_period_seconds = Some(5);
        assert_eq!(termination_grace_period(&pod), 5);
    }

    #[test]
    fn a_deleted_pod_stays_active_while_a_container_runs() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let status = |phase: &str, running: bool| PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "c".into(),
                state: Some(if running {
                    ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    }
                } else {
                    ContainerState {
                        terminated: Some(ContainerStateTerminated::default()),
                        ..Default::default()
                    }
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let mut pod = testing::pod("web", &[("c", "nginx")]);
        assert!(!is_worker_terminal(&pod, None));
        assert!(!is_worker_terminal(&pod, Some(&status("Running", true))));
        assert!(is_worker_terminal(&pod, Some(&status("Failed", false))));
        pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        // Deleted, its container still running: still active.
        assert!(!is_worker_terminal(&pod, Some(&status("Running", true))));
        // The API's status stands in for a missing one of our own.
        pod.status = Some(status("Running", true));
        assert!(!is_worker_terminal(&pod, None));
        // Deleted and stopped, or no container reported: done.
        assert!(is_worker_terminal(&pod, Some(&status("Running", false))));
        pod.status = Some(PodStatus::default());
        assert!(is_worker_terminal(&pod, None));
    }

    #[test]
    fn only_spec_labels_annotations_and_deletion_ask_for_a_sync() {
        let pod = testing::pod("web", &[("c", "nginx")]);
        let mut status_only = pod.clone();
        status_only.metadata.resource_version = Some("42".into());
        status_only.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        assert!(!differs_semantically(&pod, &status_only));
        let mut labelled = pod.clone();
        labelled.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        assert!(differs_semantically(&pod, &labelled));
        let mut deleted = pod.clone();
        deleted.metadata.deletion_grace_period_seconds = Some(30);
        assert!(differs_semantically(&pod, &deleted));
        let mut respecced = pod.clone();
        respecced.spec.as_mut().unwrap().containers[0].image = Some("nginx:2".into());
        assert!(differs_semantically(&pod, &respecced));
    }

    /// A pod with a readiness gate is synced when the gate's condition appears or changes,
    /// not when another condition does.
    #[test]
    fn a_readiness_gates_condition_asks_for_a_sync() {
        let pod = testing::gated(&["example.com/lb"]);
        let with = |conditions: &[(&str, &str)]| testing::with_conditions(&pod, conditions);
        let none = with(&[("Ready", "False")]);
        assert!(!differs_semantically(&none, &with(&[("Ready", "True")])));
        let closed = with(&[("example.com/lb", "False")]);
        assert!(differs_semantically(&none, &closed));
        assert!(differs_semantically(
            &closed,
            &with(&[("example.com/lb", "True")])
        ));
        assert!(!differs_semantically(
            &closed,
            &with(&[("Ready", "False"), ("example.com/lb", "False")])
        ));
    }
}
