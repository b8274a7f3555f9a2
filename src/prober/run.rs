//! Turning a container's probe spec into one check (the kubelet's `prober.runProbe`):
//! which handler, which host and port (named ports resolved from the container's ports),
//! which timeout. Built once per worker, so each period only runs the check.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};

use crate::cri::Cri;
use crate::probe::{self, Outcome, ProbeResult, http, resolve_port};

/// The check a probe runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Check {
    /// Run a command in the container.
    Exec(Vec<String>),
    /// GET a URL.
    Http(http::Target),
    /// Connect to a port.
    Tcp(String, u16),
    /// The spec cannot be probed; the message says why (reported as "probe errored").
    Invalid(String),
}

impl Check {
    /// The check of `probe` against `container`, whose pod has `pod_ip`.
    pub(super) fn of(probe: &Probe, container: &Container, pod_ip: &str) -> Self {
        let outcome = if let Some(exec) = &probe.exec {
            Ok(Self::Exec(exec.command.clone().unwrap_or_default()))
        } else if let Some(get) = &probe.http_get {
            resolve_port(&get.port, container)
                .map(|port| Self::Http(http::Target::of_action(get, port, pod_ip)))
        } else if let Some(tcp) = &probe.tcp_socket {
            resolve_port(&tcp.port, container)
                .map(|port| Self::Tcp(probe::host_or(tcp.host.as_deref(), pod_ip), port))
        } else {
            Err(format!("missing probe handler for {}", container.name))
        };
        outcome.unwrap_or_else(Self::Invalid)
    }

    /// Runs the check once.
    pub(super) async fn run<C: Cri>(
        &self,
        cri: &C,
        container_id: &str,
        timeout: Duration,
    ) -> Outcome {
        match self {
            Self::Exec(cmd) => probe::exec::run(cri, container_id, cmd, timeout).await,
            Self::Http(target) => http::get(target, timeout).await,
            Self::Tcp(host, port) => probe::tcp::connect(host, *port, timeout).await,
            Self::Invalid(message) => Outcome::new(ProbeResult::Unknown, message.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn container() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn named_ports_resolve_from_the_container_and_hosts_default_to_the_pod_ip() {
        let probe = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("http".into()),
                path: Some("/healthz".into()),
                scheme: Some("HTTPS".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let Check::Http(target) = Check::of(&probe, &container(), "10.244.0.9") else {
            panic!("an HTTP check");
        };
        assert_eq!(target.url(), "https://10.244.0.9:8080/healthz");
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("metrics".into()),
                host: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            Check::of(&tcp, &container(), "10.244.0.9"),
            Check::Invalid("couldn't find port: metrics in web".into())
        );
        assert_eq!(
            Check::of(&Probe::default(), &container(), "10.244.0.9"),
            Check::Invalid("missing probe handler for web".into())
        );
    }
}
