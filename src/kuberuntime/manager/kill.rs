//! The runtime manager's stops: a container's (its preStop hook, then the stop signal
//! within the grace period), a pod's (its containers, then its sandboxes, a few at a time),
//! and the removal of what a killed pod left. The kubelet's `killContainer`,
//! `killPodWithSyncResult` and the removal its garbage collector makes.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tracing::Instrument;

use super::{MIN_GRACE_SECONDS, PodActions, RuntimeManager, Stop};
use crate::cri::{Cri, api, ok_if_not_found};
use crate::kuberuntime::runtime_status::{PodRuntimeStatus, RunState};
use crate::lifecycle::handlers::run_hook;
use crate::pod::PodId;

impl<C: Cri> RuntimeManager<C> {
    /// Removes every run of the pod's init containers (they are stopped: the pod was
    /// killed). Best effort: what is left goes with the old sandbox.
    pub(super) async fn purge_init_containers(&self, pod: &Pod, status: &PodRuntimeStatus) {
        let init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default();
        for c in &status.containers {
            if !init.iter().any(|i| i.name == c.name) {
                continue;
            }
            let req = api::RemoveContainerRequest {
                container_id: c.id.clone(),
            };
            if let Err(e) = ok_if_not_found(self.cri.remove_container(req).await) {
                tracing::debug!(container = %c.id, error = %e, "could not remove an old init container");
            }
        }
    }

    /// Stops one container within `grace` seconds (the kubelet's `killContainer`): its
    /// preStop hook first, if the pod spec gives it one, whose time counts against the
    /// grace period; then the stop signal, and SIGKILL once what is left of the grace period
    /// (at least the kubelet's minimum of 2 s) has passed.
    pub(super) async fn stop_container(&self, target: &Stop<'_>, grace: i64, why: String) {
        let Stop {
            pod: id,
            container_id,
            name,
            ..
        } = *target;
        self.events.normal(id, Some(name), "Killing", why);
        let mut grace = grace;
        let pre_stop = target
            .spec
            .and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref().map(|h| (c, h)));
        if let Some((spec, hook)) = pre_stop
            && grace > 0
        {
            let started = Instant::now();
            let limit = Duration::from_secs(grace.unsigned_abs());
            let ran = tokio::time::timeout(
                limit,
                run_hook(&self.cri, id, (spec, container_id), target.pod_ip, hook),
            )
            .instrument(tracing::info_span!("pre_stop_hook", container = name))
            .await;
            match ran {
                Ok(Ok(())) => {}
                Ok(Err(message)) => {
                    self.events
                        .warning(id, Some(name), "FailedPreStopHook", message);
                }
                Err(_) => {
                    tracing::info!(
                        container = name,
                        grace,
                        "preStop hook did not complete within the grace period"
                    );
                }
            }
            grace -= i64::try_from(started.elapsed().as_secs()).unwrap_or(grace);
        }
        let req = api::StopContainerRequest {
            container_id: container_id.into(),
            timeout: grace.max(MIN_GRACE_SECONDS),
        };
        if let Err(e) = ok_if_not_found(self.cri.stop_container(req).await) {
            tracing::warn!(container = name, error = %e, "could not stop container");
        }
    }

    pub(super) async fn kill_containers(
        &self,
        (id, pod): (&PodId, &Pod),
        status: &PodRuntimeStatus,
        actions: &PodActions,
        grace: i64,
    ) {
        let pod_ip = self.pod_ip(pod, status);
        let stops = actions.kill.iter().map(|(cid, name, why)| async {
            let target = Stop {
                pod: id,
                container_id: cid,
                name,
                spec: crate::pod::container(pod, name),
                pod_ip: &pod_ip,
            };
            self.stop_container(&target, grace, why.clone()).await;
        });
        futures::future::join_all(stops).await;
    }

    /// Stops every running container of the pod within `grace` seconds (running their
    /// preStop hooks where `pod` gives them one), then its sandboxes (which tears their
    /// networks down). Every failure is logged.
    ///
    /// # Errors
    /// The first sandbox that could not be stopped: its network may still be attached.
    pub async fn kill_pod(
        &self,
        (id, pod): (&PodId, Option<&Pod>),
        status: &PodRuntimeStatus,
        grace: i64,
    ) -> Result<(), crate::cri::CriError> {
        let pod_ip = pod.map(|p| self.pod_ip(p, status)).unwrap_or_default();
        let running = status
            .containers
            .iter()
            .filter(|c| c.state == RunState::Running);
        let stops = running.map(|c| async {
            let target = Stop {
                pod: id,
                container_id: &c.id,
                name: &c.name,
                spec: pod.and_then(|p| crate::pod::container(p, &c.name)),
                pod_ip: &pod_ip,
            };
            self.stop_container(&target, grace, format!("Stopping container {}", c.name))
                .await;
        });
        futures::future::join_all(stops).await;
        let mut first_error = None;
        let to_stop: Vec<&str> = {
            let stopped = crate::lock::lock(&self.stopped_sandboxes);
            let of_pod = stopped.get(&id.uid);
            status
                .sandboxes
                .iter()
                .map(|s| s.id.as_str())
                .filter(|s| !of_pod.is_some_and(|done| done.contains(*s)))
                .collect()
        };
        // The semaphore is never closed, so acquiring fails only in theory.
        let _turn = if to_stop.is_empty() {
            None
        } else {
            self.stop_slots
                .acquire()
                .instrument(tracing::info_span!("wait_stop_slot"))
                .await
                .ok()
        };
        for sandbox in to_stop {
            let req = api::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.to_owned(),
            };
            match ok_if_not_found(self.cri.stop_pod_sandbox(req).await) {
                Ok(()) => {
                    crate::lock::lock(&self.stopped_sandboxes)
                        .entry(id.uid.clone())
                        .or_default()
                        .insert(sandbox.to_owned());
                }
                Err(e) => {
                    tracing::warn!(sandbox, error = %e, "could not stop pod sandbox");
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Removes every sandbox of a pod that was killed. The runtime removes a sandbox's
    /// containers with it (CRI `RemovePodSandbox`); only a container whose sandbox is not
    /// listed is removed on its own.
    ///
    /// # Errors
    /// The first failed removal; the caller retries.
    pub async fn remove_pod(&self, status: &PodRuntimeStatus) -> Result<(), crate::cri::CriError> {
        let strays = status
            .containers
            .iter()
            .filter(|c| !status.sandboxes.iter().any(|s| s.id == c.sandbox_id));
        for c in strays {
            let req = api::RemoveContainerRequest {
                container_id: c.id.clone(),
            };
            ok_if_not_found(self.cri.remove_container(req).await)?;
        }
        for s in &status.sandboxes {
            let req = api::RemovePodSandboxRequest {
                pod_sandbox_id: s.id.clone(),
            };
            ok_if_not_found(self.cri.remove_pod_sandbox(req).await)?;
        }
        Ok(())
    }
}
