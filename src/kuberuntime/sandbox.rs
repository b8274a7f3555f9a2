//! `PodSandboxConfig` from a Pod, as the kubelet's `generatePodSandboxConfig` builds it:
//! metadata, hostname, log directory, DNS (from [`crate::dns`]), port mappings, labels and
//! annotations, and the Linux namespace options.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::labels;
use super::names::{FqdnTooLong, hostname_and_domain, kernel_hostname};
use crate::cri::api;
use crate::dns::Configurer;
use crate::pod::PodId;

/// Node-wide settings the sandbox config depends on (the kubelet's DNS and log flags).
#[derive(Debug, Clone, Default)]
pub struct SandboxSettings {
    /// The DNS settings (`--cluster-dns`, `--cluster-domain`, `--resolv-conf`).
    pub dns: Configurer,
    /// Where pod log directories live (`/var/log/pods` for the kubelet).
    pub pod_logs_dir: PathBuf,
    /// The QoS cgroups pods go under (`--cgroups-per-qos`); none: no cgroup parent.
    pub qos_containers: Option<crate::cm::QosContainers>,
}

/// The directory holding the pod's container logs: `<logs>/<namespace>_<name>_<uid>`.
#[must_use]
pub fn pod_log_dir(logs: &Path, pod: &PodId) -> PathBuf {
    logs.join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
}

/// Host port mappings of every container port that asks for one.
#[must_use]
pub fn port_mappings(spec: &PodSpec) -> Vec<api::PortMapping> {
    let ports = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten());
    ports
        .filter(|p| p.host_port.unwrap_or(0) != 0)
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp,
                Some("SCTP") => api::Protocol::Sctp,
                _ => api::Protocol::Tcp,
            }
            .into(),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// The full sandbox config of a pod; `attempt` counts the sandboxes made for it before.
///
/// # Errors
/// `setHostnameAsFQDN` with an FQDN too long for the kernel.
pub fn sandbox_config(
    pod: &Pod,
    id: &PodId,
    attempt: u32,
    settings: &SandboxSettings,
) -> Result<api::PodSandboxConfig, FqdnTooLong> {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let mut pod_labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    pod_labels.extend(labels::pod_labels(id));
    let mut annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    annotations.insert(
        labels::POD_TERMINATION_GRACE_PERIOD.into(),
        crate::pod::termination_grace_period(pod).to_string(),
    );
    let host_network = spec.host_network.unwrap_or(false);
    // A pod on the host's network shares the host's UTS namespace: the runtime may not
    // set its hostname.
    let hostname = if host_network {
        String::new()
    } else {
        let (hostname, domain) = hostname_and_domain(pod, id, &settings.dns.cluster_domain);
        kernel_hostname(spec, &hostname, &domain)?
    };
    let pod_security = spec.security_context.as_ref();
    let sysctls = pod_security
        .and_then(|s| s.sysctls.as_ref())
        .map(|all| {
            all.iter()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    Ok(api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: id.name.clone(),
            uid: id.uid.clone(),
            namespace: id.namespace.clone(),
            attempt,
        }),
        hostname,
        log_directory: pod_log_dir(&settings.pod_logs_dir, id)
            .to_string_lossy()
            .into_owned(),
        dns_config: Some(settings.dns.pod_dns(pod, id).config),
        port_mappings: port_mappings(spec),
        labels: pod_labels,
        annotations,
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: crate::cm::cgroup_parent(settings.qos_containers.as_ref(), pod),
            security_context: Some(super::security_context::sandbox(spec)),
            sysctls,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::HostDns;
    use crate::pod::testing::pod;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn settings() -> SandboxSettings {
        SandboxSettings {
            dns: Configurer {
                cluster_dns: vec!["10.96.0.10".parse().unwrap()],
                cluster_domain: "cluster.local".into(),
                host: Some(HostDns::parse(
                    "nameserver 127.0.0.53\nsearch example.test\n",
                )),
                node_ips: vec![],
            },
            pod_logs_dir: "/var/log/pods".into(),
            qos_containers: Some(crate::cm::QosContainers::under("/")),
        }
    }

    fn namespaces(config: api::PodSandboxConfig) -> api::NamespaceOption {
        let security = config.linux.and_then(|l| l.security_context);
        security
            .and_then(|s| s.namespace_options)
            .expect("namespace options")
    }

    #[test]
    fn sandbox_config_carries_kubelet_labels_ports_dns_and_namespaces() {
        let mut p = pod("web-7d4b9c-abcde", &[("nginx", "nginx")]);
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(8080),
            ..Default::default()
        }]);
        let id = PodId::of(&p).unwrap();
        let config = sandbox_config(&p, &id, 2, &settings()).unwrap();
        let meta = config.metadata.as_ref().unwrap();
        assert_eq!((meta.name.as_str(), meta.attempt), ("web-7d4b9c-abcde", 2));
        assert_eq!(config.hostname, "web-7d4b9c-abcde");
        assert_eq!(config.labels[labels::POD_UID], "uid-web-7d4b9c-abcde");
        assert_eq!(config.labels[labels::POD_NAMESPACE], "default");
        assert_eq!(
            config.log_directory,
            "/var/log/pods/default_web-7d4b9c-abcde_uid-web-7d4b9c-abcde"
        );
        assert_eq!(config.port_mappings.len(), 1);
        assert_eq!(config.port_mappings[0].host_port, 8080);
        assert_eq!(config.dns_config.as_ref().unwrap().servers, ["10.96.0.10"]);
        // A BestEffort pod's cgroup, as the sandbox's cgroup parent.
        assert_eq!(
            config.linux.as_ref().unwrap().cgroup_parent,
            "/kubepods/besteffort/poduid-web-7d4b9c-abcde"
        );
        let ns = namespaces(config);
        assert_eq!(ns.network(), api::NamespaceMode::Pod);
        assert_eq!(ns.pid(), api::NamespaceMode::Container);
    }

    #[test]
    fn host_network_pods_share_the_node_namespaces_and_keep_its_hostname() {
        let mut p = pod("h", &[("c", "busybox")]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        let id = PodId::of(&p).unwrap();
        let config = sandbox_config(&p, &id, 0, &settings()).unwrap();
        assert_eq!(config.hostname, "");
        let ns = namespaces(config);
        assert_eq!(ns.network(), api::NamespaceMode::Node);
    }

    #[test]
    fn set_hostname_as_fqdn_names_the_sandbox_by_its_fqdn_if_it_fits() {
        let mut p = pod("web", &[("c", "busybox")]);
        let spec = p.spec.as_mut().unwrap();
        spec.subdomain = Some("backend".into());
        spec.set_hostname_as_fqdn = Some(true);
        let id = PodId::of(&p).unwrap();
        let config = sandbox_config(&p, &id, 0, &settings()).unwrap();
        assert_eq!(config.hostname, "web.backend.default.svc.cluster.local");
        p.spec.as_mut().unwrap().hostname = Some("h".repeat(40));
        assert!(sandbox_config(&p, &id, 0, &settings()).is_err());
    }
}
