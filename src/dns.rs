//! A pod's resolver configuration, which the runtime writes into its sandbox's
//! `/etc/resolv.conf`, as the kubelet's `network/dns` Configurer builds it: by `dnsPolicy`
//! (ClusterFirst, ClusterFirstWithHostNet, Default, None) from `--cluster-dns`,
//! `--cluster-domain` and `--resolv-conf`, with the pod's `dnsConfig` on top, cut to the
//! resolver's limits (3 nameservers, 6 search domains of 256 characters in all) with a
//! `DNSConfigForming` event.
//! Knows no runtime call or pod worker: it only builds the sandbox's DNS config.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Pod, PodDNSConfig, PodSpec};

use crate::cri::api;
use crate::pod::PodId;

/// The most nameservers a resolv.conf may hold (glibc's `MAXNS`).
const MAX_NAMESERVERS: usize = 3;
/// The most search domains (the kubelet's validation limits).
const MAX_SEARCH_PATHS: usize = 6;
/// The longest search line, in characters.
const MAX_SEARCH_CHARS: usize = 256;

/// Resolver settings read from a resolv.conf file (the kubelet's `parseResolvConf`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostDns {
    /// `nameserver` lines (the first address of each).
    pub servers: Vec<String>,
    /// The last `search` line, without trailing dots.
    pub searches: Vec<String>,
    /// The last `options` line.
    pub options: Vec<String>,
}

impl HostDns {
    /// Parses resolv.conf text.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut dns = Self::default();
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("nameserver") => dns.servers.extend(fields.next().map(str::to_owned)),
                Some("search") => {
                    dns.searches = fields.map(|s| s.trim_end_matches('.').to_owned()).collect();
                }
                Some("options") => dns.options = fields.map(str::to_owned).collect(),
                _ => {}
            }
        }
        dns
    }
}

/// The node's DNS settings (the kubelet's `Configurer`).
#[derive(Debug, Clone, Default)]
pub struct Configurer {
    /// `--cluster-dns`: the cluster's DNS servers. Empty: ClusterFirst pods fall back to
    /// Default, with a `MissingClusterDNS` event.
    pub cluster_dns: Vec<IpAddr>,
    /// `--cluster-domain`, e.g. `cluster.local`.
    pub cluster_domain: String,
    /// The settings of `--resolv-conf`; `None` when it is empty: Default pods then get
    /// the node's own loopback resolver (`127.0.0.1`, or `::1` on an IPv6 node).
    pub host: Option<HostDns>,
    /// The node's IPs.
    pub node_ips: Vec<IpAddr>,
}

/// An event about a pod's DNS configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsEvent {
    /// `MissingClusterDNS` or `DNSConfigForming`.
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
}

/// A pod's DNS configuration and what was wrong with it.
#[derive(Debug, Clone, Default)]
pub struct PodDns {
    /// What the runtime writes into the pod's resolv.conf.
    pub config: api::DnsConfig,
    /// Warnings to record on the pod.
    pub events: Vec<DnsEvent>,
}

/// Where a pod's resolver configuration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DnsType {
    Cluster,
    Host,
    None,
}

fn dns_type(spec: &PodSpec) -> DnsType {
    match spec.dns_policy.as_deref() {
        Some("None") => DnsType::None,
        Some("Default") => DnsType::Host,
        Some("ClusterFirst") if spec.host_network.unwrap_or(false) => DnsType::Host,
        // ClusterFirstWithHostNet, ClusterFirst, and (logged) anything else.
        Some(policy) => {
            if !matches!(policy, "ClusterFirst" | "ClusterFirstWithHostNet") {
                tracing::error!(policy, "invalid DNSPolicy, falling back to ClusterFirst");
            }
            DnsType::Cluster
        }
        None => DnsType::Cluster,
    }
}

/// `strs` without repeats, in first-seen order.
fn omit_duplicates(strs: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    strs.into_iter()
        .filter(|s| seen.insert(s.clone()))
        .collect()
}

impl Configurer {
    /// The pod's DNS configuration (the kubelet's `GetPodDNS`).
    #[must_use]
    pub fn pod_dns(&self, pod: &Pod, id: &PodId) -> PodDns {
        let default_spec = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&default_spec);
        let host = self.host.clone().unwrap_or_default();
        let mut config = api::DnsConfig {
            servers: host.servers,
            searches: host.searches,
            options: host.options,
        };
        let mut events = Vec::new();
        let mut kind = dns_type(spec);
        if kind == DnsType::Cluster && self.cluster_dns.is_empty() {
            events.push(DnsEvent {
                reason: "MissingClusterDNS",
                message: format!(
                    "pod: \"{}_{}({})\". kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
                    id.name, id.namespace, id.uid
                ),
            });
            kind = DnsType::Host;
        }
        match kind {
            DnsType::None => config = api::DnsConfig::default(),
            DnsType::Cluster => {
                config.servers = self.cluster_dns.iter().map(ToString::to_string).collect();
                config.searches = self.cluster_searches(&id.namespace, config.searches);
                config.options = vec!["ndots:5".into()];
            }
            DnsType::Host if self.host.is_none() => {
                config.servers = self
                    .node_ips
                    .iter()
                    .map(|ip| if ip.is_ipv6() { "::1" } else { "127.0.0.1" }.to_owned())
                    .collect();
                if config.servers.is_empty() {
                    config.servers.push("127.0.0.1".into());
                }
                config.searches = vec![".".into()];
            }
            DnsType::Host => {}
        }
        if let Some(extra) = &spec.dns_config {
            append_dns_config(&mut config, extra);
        }
        fit_limits(&mut config, &mut events);
        PodDns { config, events }
    }

    /// `<namespace>.svc.<domain>`, `svc.<domain>`, `<domain>`, then the host's.
    fn cluster_searches(&self, namespace: &str, host: Vec<String>) -> Vec<String> {
        let domain = &self.cluster_domain;
        if domain.is_empty() {
            return host;
        }
        let mut searches = vec![
            format!("{namespace}.svc.{domain}"),
            format!("svc.{domain}"),
            domain.clone(),
        ];
        searches.extend(host);
        omit_duplicates(searches)
    }
}

/// The pod's `dnsConfig` added: nameservers and searches after the policy's (no
/// repeats); an option of the same name replaces the policy's.
fn append_dns_config(config: &mut api::DnsConfig, extra: &PodDNSConfig) {
    let append = |to: &mut Vec<String>, more: &Option<Vec<String>>| {
        to.extend(more.iter().flatten().cloned());
        *to = omit_duplicates(std::mem::take(to));
    };
    append(&mut config.servers, &extra.nameservers);
    append(&mut config.searches, &extra.searches);
    let option_name = |o: &str| o.split(':').next().unwrap_or_default().to_owned();
    for option in extra.options.iter().flatten() {
        let name = option.name.clone().unwrap_or_default();
        let rendered = match option.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{name}:{v}"),
            _ => name.clone(),
        };
        match config.options.iter_mut().find(|o| option_name(o) == name) {
            Some(existing) => *existing = rendered,
            None => config.options.push(rendered),
        }
    }
}

/// Cuts the configuration to what a resolver reads, recording what was left out (the
/// kubelet's `formDNSConfigFitsLimits`).
fn fit_limits(config: &mut api::DnsConfig, events: &mut Vec<DnsEvent>) {
    if config.servers.len() > MAX_NAMESERVERS {
        config.servers.truncate(MAX_NAMESERVERS);
        events.push(DnsEvent {
            reason: "DNSConfigForming",
            message: format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                config.servers.join(" ")
            ),
        });
    }
    let mut exceeded = false;
    if config.searches.len() > MAX_SEARCH_PATHS {
        config.searches.truncate(MAX_SEARCH_PATHS);
        exceeded = true;
    }
    let line_len =
        |s: &[String]| s.iter().map(String::len).sum::<usize>() + s.len().saturating_sub(1);
    if line_len(&config.searches) > MAX_SEARCH_CHARS {
        while line_len(&config.searches) > MAX_SEARCH_CHARS {
            config.searches.pop();
        }
        exceeded = true;
    }
    if exceeded {
        events.push(DnsEvent {
            reason: "DNSConfigForming",
            message: format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                config.searches.join(" ")
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;
    use k8s_openapi::api::core::v1::PodDNSConfigOption;

    fn configurer() -> Configurer {
        Configurer {
            cluster_dns: vec!["10.96.0.10".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            host: Some(HostDns::parse(
                "nameserver 127.0.0.53\nsearch example.test\noptions edns0\n",
            )),
            node_ips: vec!["198.18.0.1".parse().unwrap()],
        }
    }

    fn dns_of(
        c: &Configurer,
        policy: Option<&str>,
        host_network: bool,
        extra: Option<PodDNSConfig>,
    ) -> PodDns {
        let mut p = pod("web", &[("c", "busybox")]);
        let spec = p.spec.as_mut().unwrap();
        spec.dns_policy = policy.map(Into::into);
        spec.host_network = Some(host_network);
        spec.dns_config = extra;
        let id = PodId::of(&p).unwrap();
        c.pod_dns(&p, &id)
    }

    fn strings(all: &[&str]) -> Vec<String> {
        all.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn resolv_conf_is_parsed_as_the_kubelet_does() {
        let dns = HostDns::parse(
            "# c\nnameserver 1.1.1.1 9.9.9.9\n  nameserver 2.2.2.2\nsearch a. b\ndomain x\noptions ndots:2 rotate\noptions edns0\n",
        );
        assert_eq!(dns.servers, ["1.1.1.1", "2.2.2.2"]);
        assert_eq!(dns.searches, ["a", "b"]);
        assert_eq!(dns.options, ["edns0"], "the last options line");
    }

    #[test]
    fn cluster_first_uses_cluster_dns_and_search_path() {
        let dns = dns_of(&configurer(), Some("ClusterFirst"), false, None);
        assert_eq!(dns.config.servers, ["10.96.0.10"]);
        assert_eq!(
            dns.config.searches,
            [
                "default.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "example.test"
            ]
        );
        assert_eq!(dns.config.options, ["ndots:5"]);
        assert!(dns.events.is_empty());
        let host_net = dns_of(&configurer(), Some("ClusterFirstWithHostNet"), true, None);
        assert_eq!(host_net.config.servers, ["10.96.0.10"]);
    }

    #[test]
    fn host_network_cluster_first_and_default_use_the_host_settings() {
        for (policy, host_network) in [(Some("ClusterFirst"), true), (Some("Default"), false)] {
            let dns = dns_of(&configurer(), policy, host_network, None);
            assert_eq!(dns.config.servers, ["127.0.0.53"]);
            assert_eq!(dns.config.searches, ["example.test"]);
            assert_eq!(dns.config.options, ["edns0"]);
        }
    }

    #[test]
    fn without_resolv_conf_default_pods_get_the_loopback_resolver() {
        let mut c = configurer();
        c.host = None;
        let dns = dns_of(&c, Some("Default"), false, None);
        assert_eq!(dns.config.servers, ["127.0.0.1"]);
        assert_eq!(dns.config.searches, ["."]);
        c.node_ips = vec!["fd00::1".parse().unwrap()];
        assert_eq!(
            dns_of(&c, Some("Default"), false, None).config.servers,
            ["::1"]
        );
    }

    #[test]
    fn cluster_first_without_cluster_dns_falls_back_to_default_with_an_event() {
        let mut c = configurer();
        c.cluster_dns.clear();
        c.host = None;
        let dns = dns_of(&c, Some("ClusterFirst"), false, None);
        assert_eq!(
            dns.config.servers,
            ["127.0.0.1"],
            "never a resolver off the node"
        );
        assert_eq!(dns.events.len(), 1);
        assert_eq!(dns.events[0].reason, "MissingClusterDNS");
        assert_eq!(
            dns.events[0].message,
            "pod: \"web_default(uid-web)\". kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy."
        );
    }

    #[test]
    fn dns_policy_none_takes_only_the_pod_dns_config_and_options_merge() {
        let extra = PodDNSConfig {
            nameservers: Some(strings(&["10.0.0.1"])),
            searches: Some(strings(&["x.test"])),
            options: Some(vec![PodDNSConfigOption {
                name: Some("ndots".into()),
                value: Some("2".into()),
            }]),
        };
        let none = dns_of(&configurer(), Some("None"), false, Some(extra.clone()));
        assert_eq!(none.config.servers, ["10.0.0.1"]);
        assert_eq!(none.config.searches, ["x.test"]);
        assert_eq!(none.config.options, ["ndots:2"]);
        let mut more = extra;
        more.searches = Some(strings(&["svc.cluster.local", "y.test"]));
        more.options.as_mut().unwrap().push(PodDNSConfigOption {
            name: Some("single-request".into()),
            value: None,
        });
        let cluster = dns_of(&configurer(), None, false, Some(more));
        assert_eq!(cluster.config.servers, ["10.96.0.10", "10.0.0.1"]);
        assert_eq!(
            cluster.config.searches,
            [
                "default.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "example.test",
                "y.test"
            ]
        );
        assert_eq!(cluster.config.options, ["ndots:2", "single-request"]);
    }

    #[test]
    fn limits_cut_nameservers_and_search_paths_with_events() {
        let extra = PodDNSConfig {
            nameservers: Some(strings(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])),
            searches: Some(strings(&["a.test", "b.test", "c.test"])),
            options: None,
        };
        let dns = dns_of(&configurer(), None, false, Some(extra));
        assert_eq!(dns.config.servers, ["10.96.0.10", "10.0.0.1", "10.0.0.2"]);
        assert_eq!(dns.config.searches.len(), 6);
        let messages: Vec<_> = dns
            .events
            .iter()
            .map(|e| (e.reason, e.message.as_str()))
            .collect();
        assert_eq!(
            messages,
            [
                (
                    "DNSConfigForming",
                    "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 10.96.0.10 10.0.0.1 10.0.0.2"
                ),
                (
                    "DNSConfigForming",
                    "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: default.svc.cluster.local svc.cluster.local cluster.local example.test a.test b.test"
                ),
            ]
        );
        let long = PodDNSConfig {
            searches: Some(vec!["a".repeat(100), "b".repeat(100), "c".repeat(100)]),
            ..Default::default()
        };
        let dns = dns_of(&configurer(), Some("None"), false, Some(long));
        assert_eq!(
            dns.config.searches,
            ["a".repeat(100), "b".repeat(100)],
            "201 characters fit, 302 do not"
        );
        assert_eq!(dns.events.len(), 1);
    }
}
