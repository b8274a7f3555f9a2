//! A pod's names as its containers see them, as the kubelet gives them: the hostname
//! (`spec.hostname` or the pod name, cut to 63 characters) and domain
//! (`<subdomain>.<namespace>.svc.<cluster domain>`), the kernel hostname (the FQDN with
//! `setHostnameAsFQDN`), and the kubelet-managed `/etc/hosts` (`makeHostsMount`): the pod's
//! IPs with its names and the `hostAliases`, or, on the host's network, the node's hosts
//! file with the aliases.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, HostAlias, Pod, PodSpec};

use crate::pod::PodId;

/// The longest hostname (the kernel's 64-byte field with its terminating NUL).
const HOSTNAME_MAX: usize = 63;
/// The longest FQDN usable as the kernel hostname.
const FQDN_MAX: usize = 64;
/// Where containers find their hosts file.
pub const ETC_HOSTS: &str = "/etc/hosts";

/// The pod's hostname and domain (the kubelet's `GeneratePodHostNameAndDomain`); the
/// domain is empty without `spec.subdomain`.
#[must_use]
pub fn hostname_and_domain(pod: &Pod, id: &PodId, cluster_domain: &str) -> (String, String) {
    let spec = pod.spec.as_ref();
    let name = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| id.name.clone());
    let hostname = if name.len() > HOSTNAME_MAX {
        let cut = name.get(..HOSTNAME_MAX).unwrap_or(&name);
        tracing::warn!(pod = %id.name, "hostname longer than {HOSTNAME_MAX}, truncated");
        cut.trim_end_matches(['-', '.']).to_owned()
    } else {
        name
    };
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|sub| format!("{sub}.{}.svc.{cluster_domain}", id.namespace))
        .unwrap_or_default();
    (hostname, domain)
}

/// The kernel hostname the kubelet gives the sandbox could not be made.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long ({FQDN_MAX} characters is the max, {} characters requested)",
    fqdn.len()
)]
pub struct FqdnTooLong {
    /// The FQDN that does not fit.
    pub fqdn: String,
}

/// The sandbox's hostname (the kubelet's `GetNodenameForKernel`): the FQDN when
/// `setHostnameAsFQDN` and the pod has a domain, else the hostname.
///
/// # Errors
/// The FQDN is longer than 64 characters.
pub fn kernel_hostname(
    spec: &PodSpec,
    hostname: &str,
    domain: &str,
) -> Result<String, FqdnTooLong> {
    if domain.is_empty() || !spec.set_hostname_as_fqdn.unwrap_or(false) {
        return Ok(hostname.to_owned());
    }
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > FQDN_MAX {
        return Err(FqdnTooLong { fqdn });
    }
    Ok(fqdn)
}

/// Whether the kubelet manages the container's `/etc/hosts` (its `makeMounts`): only
/// once the pod has IPs (the node's for a pod on the host's network), and not when the
/// container mounts a volume there itself.
#[must_use]
pub fn manages_etc_hosts(container: &Container, ips: &[IpAddr]) -> bool {
    !ips.is_empty()
        && !container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == ETC_HOSTS)
}

/// `<pod dir>/etc-hosts`: the managed hosts file the containers mount.
#[must_use]
pub fn etc_hosts_path(pod_dir: &Path) -> PathBuf {
    pod_dir.join("etc-hosts")
}

/// The managed hosts file of a pod with its own network (the kubelet's
/// `managedHostsFileContent`).
#[must_use]
pub fn managed_hosts_file(
    ips: &[IpAddr],
    hostname: &str,
    domain: &str,
    aliases: &[HostAlias],
) -> String {
    let mut text = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    for ip in ips {
        if domain.is_empty() {
            let _ = writeln!(text, "{ip}\t{hostname}");
        } else {
            let _ = writeln!(text, "{ip}\t{hostname}.{domain}\t{hostname}");
        }
    }
    text.push_str(&host_aliases(aliases));
    text
}

/// The hosts file of a pod on the host's network: the node's, with the aliases (the
/// kubelet's `nodeHostsFileContent`).
#[must_use]
pub fn node_hosts_file(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!(
        "# Kubernetes-managed hosts file (host network).\n{node_hosts}{}",
        host_aliases(aliases)
    )
}

/// The `hostAliases` block: one line per IP with all its names.
fn host_aliases(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut text = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        let names = alias.hostnames.as_deref().unwrap_or_default().join("\t");
        let _ = writeln!(text, "{}\t{names}", alias.ip);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;
    use k8s_openapi::api::core::v1::VolumeMount;

    fn alias(ip: &str, names: &[&str]) -> HostAlias {
        HostAlias {
            ip: ip.into(),
            hostnames: Some(names.iter().map(|n| (*n).to_owned()).collect()),
        }
    }

    #[test]
    fn hostname_domain_and_fqdn() {
        let mut p = pod("web-1", &[("c", "busybox")]);
        let id = PodId::of(&p).unwrap();
        assert_eq!(
            hostname_and_domain(&p, &id, "cluster.local"),
            ("web-1".into(), String::new())
        );
        let spec = p.spec.as_mut().unwrap();
        spec.hostname = Some("db".into());
        spec.subdomain = Some("backend".into());
        let (host, domain) = hostname_and_domain(&p, &id, "cluster.local");
        assert_eq!(
            (host.as_str(), domain.as_str()),
            ("db", "backend.default.svc.cluster.local")
        );
        let spec = p.spec.as_mut().unwrap();
        assert_eq!(kernel_hostname(spec, &host, &domain).unwrap(), "db");
        spec.set_hostname_as_fqdn = Some(true);
        assert_eq!(
            kernel_hostname(spec, &host, &domain).unwrap(),
            "db.backend.default.svc.cluster.local"
        );
        let long = "h".repeat(40);
        let err = kernel_hostname(spec, &long, &domain).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "failed to construct FQDN from pod hostname and cluster domain, FQDN {long}.{domain} is too long (64 characters is the max, 74 characters requested)"
            )
        );
    }

    #[test]
    fn long_hostnames_are_cut_to_63_without_trailing_dash_or_dot() {
        let name = format!("{}-.{}", "a".repeat(61), "b");
        let p = pod(&name, &[("c", "x")]);
        let id = PodId::of(&p).unwrap();
        assert_eq!(
            hostname_and_domain(&p, &id, "cluster.local").0,
            "a".repeat(61)
        );
    }

    #[test]
    fn managed_hosts_file_names_the_pod_and_its_aliases() {
        let ips: Vec<IpAddr> = vec!["10.244.1.5".parse().unwrap()];
        let aliases = [
            alias("127.0.0.2", &["foo.local", "bar.local"]),
            alias("10.1.2.3", &["baz"]),
        ];
        assert_eq!(
            managed_hosts_file(&ips, "db", "backend.default.svc.cluster.local", &aliases),
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.244.1.5\tdb.backend.default.svc.cluster.local\tdb\n\
             \n# Entries added by HostAliases.\n127.0.0.2\tfoo.local\tbar.local\n10.1.2.3\tbaz\n"
        );
        assert!(
            managed_hosts_file(&ips, "web", "", &[])
                .ends_with("fe00::2\tip6-allrouters\n10.244.1.5\tweb\n")
        );
        assert_eq!(
            node_hosts_file("127.0.0.1 localhost\n", &aliases[1..]),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n10.1.2.3\tbaz\n"
        );
    }

    #[test]
    fn etc_hosts_is_not_managed_without_ips_or_over_the_containers_own() {
        let ips: Vec<IpAddr> = vec!["10.244.1.5".parse().unwrap()];
        let mut c = Container::default();
        assert!(manages_etc_hosts(&c, &ips));
        assert!(!manages_etc_hosts(&c, &[]), "no IPs yet");
        c.volume_mounts = Some(vec![VolumeMount {
            name: "hosts".into(),
            mount_path: "/etc/hosts".into(),
            ..Default::default()
        }]);
        assert!(!manages_etc_hosts(&c, &ips));
    }
}
