//! Lifecycle hooks, as the kubelet's `handlers.go` runs them: a container's postStart and
//! preStop handler, either a command in the container (CRI `ExecSync`) or an HTTP GET from
//! the agent to the pod (host defaulting to the pod IP, port by number or by the
//! container's port name). A failure comes back as the message the kubelet puts in its
//! `FailedPostStartHook` / `FailedPreStopHook` events. The callers decide what a failure
//! means (a killed container, a shorter grace period).

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};

use crate::cri::{Cri, api};
use crate::pod::PodId;
use crate::probe::{self, ProbeResult, http};

/// The pod as the kubelet names it in messages: `name_namespace(uid)`.
fn pod_name(id: &PodId) -> String {
    format!("{}_{}({})", id.name, id.namespace, id.uid)
}

async fn run_exec<C: Cri>(cri: &C, container_id: &str, cmd: &[String]) -> Result<(), String> {
    // No timeout of its own (so no deadline on the call either), as in the kubelet: the
    // caller bounds it.
    let request = api::ExecSyncRequest {
        container_id: container_id.to_owned(),
        cmd: cmd.to_vec(),
        timeout: 0,
    };
    match cri.exec_sync(request).await {
        Ok(r) if r.exit_code == 0 => Ok(()),
        Ok(r) => {
            let mut output = r.stdout;
            output.extend_from_slice(&r.stderr);
            Err(format!(
                "command '{}' exited with {}: {}, message: {:?}",
                cmd.join(" "),
                r.exit_code,
                String::from_utf8_lossy(&r.stderr),
                String::from_utf8_lossy(&output)
            ))
        }
        Err(e) => Err(format!("{e}, message: \"\"")),
    }
}

/// Runs one hook of `container` (id `container_id`) of the pod `id` whose IP is `pod_ip`.
///
/// # Errors
/// The kubelet's message for a failed hook.
pub async fn run_hook<C: Cri>(
    cri: &C,
    id: &PodId,
    (container, container_id): (&Container, &str),
    pod_ip: &str,
    handler: &LifecycleHandler,
) -> Result<(), String> {
    if let Some(exec) = &handler.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return run_exec(cri, container_id, &cmd).await.map_err(|e| {
            format!(
                "Exec lifecycle hook ([{}]) for Container {:?} in Pod {:?} failed - error: {e}",
                cmd.join(" "),
                container.name,
                pod_name(id)
            )
        });
    }
    if let Some(get) = &handler.http_get {
        let path = get.path.as_deref().unwrap_or_default();
        let failed = |e: String| {
            format!(
                "Http lifecycle hook ({path}) for Container {:?} in Pod {:?} failed - error: {e}",
                container.name,
                pod_name(id)
            )
        };
        let port = probe::resolve_port(&get.port, container).map_err(failed)?;
        let target = http::Target::of_action(get, port, pod_ip);
        // No timeout of its own, as the exec hook's: a postStart hook runs as long as it
        // takes, a preStop hook as long as the grace period lets it.
        let outcome = http::get_unbounded(&target).await;
        return match outcome.result {
            ProbeResult::Success | ProbeResult::Warning => Ok(()),
            ProbeResult::Failure | ProbeResult::Unknown => Err(failed(outcome.output)),
        };
    }
    Err(format!(
        "Cannot run handler: invalid handler for Container {:?} in Pod {:?}",
        container.name,
        pod_name(id)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Exits(i32);

    impl Cri for Exits {
        async fn exec_sync(
            &self,
            req: api::ExecSyncRequest,
        ) -> crate::cri::Result<api::ExecSyncResponse> {
            assert_eq!(req.container_id, "c1");
            Ok(api::ExecSyncResponse {
                stdout: b"out ".to_vec(),
                stderr: b"err".to_vec(),
                exit_code: self.0,
            })
        }
    }

    fn pod_id() -> PodId {
        PodId {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web".into(),
        }
    }

    fn exec(cmd: &[&str]) -> LifecycleHandler {
        LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(cmd.iter().map(|s| (*s).to_owned()).collect()),
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn exec_hooks_pass_on_exit_zero_and_fail_with_the_kubelets_message() {
        let c = Container {
            name: "app".into(),
            ..Default::default()
        };
        let hook = exec(&["sh", "-c", "exit 3"]);
        assert_eq!(
            run_hook(&Exits(0), &pod_id(), (&c, "c1"), "10.0.0.1", &hook).await,
            Ok(())
        );
        let err = run_hook(&Exits(3), &pod_id(), (&c, "c1"), "10.0.0.1", &hook)
            .await
            .unwrap_err();
        assert_eq!(
            err,
            "Exec lifecycle hook ([sh -c exit 3]) for Container \"app\" in Pod \"web_default(u1)\" \
             failed - error: command 'sh -c exit 3' exited with 3: err, message: \"out err\""
        );
    }

    #[tokio::test]
    async fn http_hooks_reach_the_named_port_of_the_pod() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 1024];
            let n = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let c = Container {
            name: "app".into(),
            ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                name: Some("hooks".into()),
                container_port: i32::from(port),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let hook = LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some("/started".into()),
                port: IntOrString::String("hooks".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ran = run_hook(&Exits(0), &pod_id(), (&c, "c1"), "127.0.0.1", &hook).await;
        assert_eq!(ran, Ok(()));
        assert!(server.await.unwrap().starts_with("GET /started HTTP/1.1"));
        // Nothing listens on the port any more: the kubelet's message says so.
        let err = run_hook(&Exits(0), &pod_id(), (&c, "c1"), "127.0.0.1", &hook)
            .await
            .unwrap_err();
        assert!(
            err.starts_with("Http lifecycle hook (/started) for Container \"app\" in Pod \"web_default(u1)\" failed - error: "),
            "{err}"
        );
    }
}
