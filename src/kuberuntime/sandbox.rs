//! `PodSandboxConfig` from a Pod, as the kubelet's `generatePodSandboxConfig` builds it:
//! metadata, hostname, log directory, DNS, port mappings, labels and annotations, and the
//! Linux namespace options.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::labels;
use crate::cri::api;
use crate::pod::PodId;

/// Node-wide settings the sandbox config depends on (the kubelet's DNS and log flags).
#[derive(Debug, Clone, Default)]
pub struct SandboxSettings {
    /// `--cluster-dns`: the cluster's DNS servers. Empty means ClusterFirst pods fall back
    /// to the host's resolver settings, as with the kubelet.
    pub cluster_dns: Vec<IpAddr>,
    /// `--cluster-domain`, e.g. `cluster.local`.
    pub cluster_domain: String,
    /// The host's resolver settings (`--resolv-conf`), given to `dnsPolicy: Default` pods.
    pub host_dns: HostDns,
    /// Where pod log directories live (`/var/log/pods` for the kubelet).
    pub pod_logs_dir: PathBuf,
    /// The QoS cgroups pods go under (`--cgroups-per-qos`); none: no cgroup parent.
    pub qos_containers: Option<crate::cm::QosContainers>,
}

/// Resolver settings read from a resolv.conf file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostDns {
    /// `nameserver` lines.
    pub servers: Vec<String>,
    /// The `search` line.
    pub searches: Vec<String>,
    /// The `options` line.
    pub options: Vec<String>,
}

impl HostDns {
    /// Parses resolv.conf text.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut dns = Self::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let rest = |w: std::str::SplitWhitespace<'_>| w.map(str::to_owned).collect::<Vec<_>>();
            match words.next() {
                Some("nameserver") => dns.servers.extend(rest(words)),
                Some("search" | "domain") => dns.searches = rest(words),
                Some("options") => dns.options.extend(rest(words)),
                _ => {}
            }
        }
        dns
    }
}

/// The directory holding the pod's container logs: `<logs>/<namespace>_<name>_<uid>`.
#[must_use]
pub fn pod_log_dir(logs: &Path, pod: &PodId) -> PathBuf {
    logs.join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
}

/// The pod's hostname: `spec.hostname` or the pod name, cut to 63 characters and without
/// trailing `-`/`.` (the kubelet's `GeneratePodHostNameAndDomain`).
#[must_use]
pub fn hostname(pod: &Pod, id: &PodId) -> String {
    let name = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| id.name.clone());
    let mut cut: String = name.chars().take(63).collect();
    while cut.ends_with(['-', '.']) {
        cut.pop();
    }
    cut
}

/// The pod's DNS configuration for the runtime (the kubelet's `GetPodDNS`).
#[must_use]
pub fn dns_config(spec: &PodSpec, namespace: &str, settings: &SandboxSettings) -> api::DnsConfig {
    let host_network = spec.host_network.unwrap_or(false);
    let mut policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    if policy == "ClusterFirstWithHostNet" {
        policy = "ClusterFirst";
    } else if policy == "ClusterFirst" && host_network {
        policy = "Default";
    }
    if policy == "ClusterFirst" && settings.cluster_dns.is_empty() {
        // The kubelet falls back to the host's settings (with a MissingClusterDNS event).
        policy = "Default";
    }
    let mut dns = match policy {
        "ClusterFirst" => {
            let domain = &settings.cluster_domain;
            let mut searches = vec![
                format!("{namespace}.svc.{domain}"),
                format!("svc.{domain}"),
                domain.clone(),
            ];
            searches.extend(settings.host_dns.searches.iter().cloned());
            api::DnsConfig {
                servers: settings
                    .cluster_dns
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
        "None" => api::DnsConfig::default(),
        _ => api::DnsConfig {
            servers: settings.host_dns.servers.clone(),
            searches: settings.host_dns.searches.clone(),
            options: settings.host_dns.options.clone(),
        },
    };
    if let Some(extra) = &spec.dns_config {
        dns.servers
            .extend(extra.nameservers.iter().flatten().cloned());
        dns.searches
            .extend(extra.searches.iter().flatten().cloned());
        for option in extra.options.iter().flatten() {
            let name = &option.name;
            let rendered = match &option.value {
                Some(v) => format!("{}:{v}", name.as_deref().unwrap_or_default()),
                None => name.clone().unwrap_or_default(),
            };
            let key = rendered.split(':').next().unwrap_or_default().to_owned();
            dns.options
                .retain(|o| o.split(':').next() != Some(key.as_str()));
            dns.options.push(rendered);
        }
    }
    // resolv.conf allows at most 6 search domains.
    dns.searches.dedup();
    dns.searches.truncate(6);
    dns
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

/// The pod's namespaces: the sandbox's, and every container's too (the kubelet's
/// `namespacesForPod`): a container left without them would share the pod's PID namespace.
pub(super) fn namespace_options(spec: &PodSpec) -> api::NamespaceOption {
    let mode = |host: Option<bool>, otherwise: api::NamespaceMode| {
        if host.unwrap_or(false) {
            api::NamespaceMode::Node
        } else {
            otherwise
        }
    };
    let pid_default = if spec.share_process_namespace.unwrap_or(false) {
        api::NamespaceMode::Pod
    } else {
        api::NamespaceMode::Container
    };
    api::NamespaceOption {
        network: mode(spec.host_network, api::NamespaceMode::Pod).into(),
        pid: mode(spec.host_pid, pid_default).into(),
        ipc: mode(spec.host_ipc, api::NamespaceMode::Pod).into(),
        target_id: String::new(),
    }
}

fn privileged(spec: &PodSpec) -> bool {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    containers
        .filter_map(|c| c.security_context.as_ref()?.privileged)
        .any(|p| p)
}

/// The full sandbox config of a pod; `attempt` counts the sandboxes made for it before.
#[must_use]
pub fn sandbox_config(
    pod: &Pod,
    id: &PodId,
    attempt: u32,
    settings: &SandboxSettings,
) -> api::PodSandboxConfig {
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
    let pod_security = spec.security_context.as_ref();
    let sysctls = pod_security
        .and_then(|s| s.sysctls.as_ref())
        .map(|all| {
            all.iter()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: id.name.clone(),
            uid: id.uid.clone(),
            namespace: id.namespace.clone(),
            attempt,
        }),
        // A pod on the host's network shares the host's UTS namespace: the runtime may not
        // set its hostname.
        hostname: if host_network {
            String::new()
        } else {
            hostname(pod, id)
        },
        log_directory: pod_log_dir(&settings.pod_logs_dir, id)
            .to_string_lossy()
            .into_owned(),
        dns_config: Some(dns_config(spec, &id.namespace, settings)),
        port_mappings: port_mappings(spec),
        labels: pod_labels,
        annotations,
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: crate::cm::cgroup_parent(settings.qos_containers.as_ref(), pod),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec)),
                privileged: privileged(spec),
                run_as_user: pod_security
                    .and_then(|s| s.run_as_user)
                    .map(|value| api::Int64Value { value }),
                run_as_group: pod_security
                    .and_then(|s| s.run_as_group)
                    .map(|value| api::Int64Value { value }),
                supplemental_groups: pod_security
                    .and_then(|s| s.supplemental_groups.clone())
                    .unwrap_or_default(),
                ..Default::default()
            }),
            sysctls,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;
    use k8s_openapi::api::core::v1::{ContainerPort, PodDNSConfig, PodDNSConfigOption};

    fn settings() -> SandboxSettings {
        SandboxSettings {
            cluster_dns: vec!["10.96.0.10".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            host_dns: HostDns::parse("nameserver 127.0.0.53\nsearch example.test\noptions edns0\n"),
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
    fn resolv_conf_is_parsed() {
        let dns = HostDns::parse(
            "# c\nnameserver 1.1.1.1\nnameserver 2.2.2.2\nsearch a b\noptions ndots:2 rotate\n",
        );
        assert_eq!(dns.servers, ["1.1.1.1", "2.2.2.2"]);
        assert_eq!(dns.searches, ["a", "b"]);
        assert_eq!(dns.options, ["ndots:2", "rotate"]);
    }

    #[test]
    fn cluster_first_uses_cluster_dns_and_search_path() {
        let p = pod("web", &[("c", "nginx")]);
        let dns = dns_config(p.spec.as_ref().unwrap(), "default", &settings());
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(
            dns.searches,
            [
                "default.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "example.test"
            ]
        );
        assert_eq!(dns.options, ["ndots:5"]);
    }

    #[test]
    fn cluster_first_without_cluster_dns_falls_back_to_host_settings() {
        let p = pod("web", &[("c", "nginx")]);
        let mut s = settings();
        s.cluster_dns.clear();
        s.host_dns = HostDns::default();
        let dns = dns_config(p.spec.as_ref().unwrap(), "default", &s);
        assert!(dns.servers.is_empty(), "no resolver is invented: {dns:?}");
    }

    #[test]
    fn dns_policy_none_takes_only_the_pod_dns_config() {
        let mut p = pod("web", &[("c", "nginx")]);
        let spec = p.spec.as_mut().unwrap();
        spec.dns_policy = Some("None".into());
        spec.dns_config = Some(PodDNSConfig {
            nameservers: Some(vec!["10.0.0.1".into()]),
            searches: Some(vec!["x.test".into()]),
            options: Some(vec![PodDNSConfigOption {
                name: Some("ndots".into()),
                value: Some("2".into()),
            }]),
        });
        let dns = dns_config(spec, "default", &settings());
        assert_eq!(dns.servers, ["10.0.0.1"]);
        assert_eq!(dns.searches, ["x.test"]);
        assert_eq!(dns.options, ["ndots:2"]);
    }

    #[test]
    fn sandbox_config_carries_kubelet_labels_ports_and_namespaces() {
        let mut p = pod("web-7d4b9c-abcde", &[("nginx", "nginx")]);
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(8080),
            ..Default::default()
        }]);
        let id = PodId::of(&p).unwrap();
        let config = sandbox_config(&p, &id, 2, &settings());
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
        let config = sandbox_config(&p, &id, 0, &settings());
        assert_eq!(config.hostname, "");
        let ns = namespaces(config);
        assert_eq!(ns.network(), api::NamespaceMode::Node);
    }

    #[test]
    fn long_hostnames_are_cut_to_63_without_trailing_dash() {
        let name = format!("{}-{}", "a".repeat(62), "b");
        let p = pod(&name, &[("c", "x")]);
        let id = PodId::of(&p).unwrap();
        assert_eq!(hostname(&p, &id), "a".repeat(62));
    }
}
