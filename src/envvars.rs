//! Service environment variables (the kubelet's `envvars` package and its service
//! lister): a watch on every Service of the cluster, reflected into a store, from which a
//! pod's containers get `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT[_<PORT>]` and the
//! docker-link style `<SVC>_PORT...` variables for the Services of their namespace (when
//! `enableServiceLinks` is not false) and for the `kubernetes` Service of `default`.
//! Knows no pod, container or API client set-up: only Services and their variables.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

/// The namespace of the master services, whose variables every pod gets.
const MASTER_NAMESPACE: &str = "default";
/// The master services.
const MASTER_SERVICES: [&str; 1] = ["kubernetes"];
/// How long a container start waits for the first list of Services.
const SYNC_WAIT: Duration = Duration::from_secs(1);

/// The kubelet's message when the Services were never listed.
pub const NOT_SYNCED: &str =
    "services have not yet been read at least once, cannot construct envvars";

/// The Services of the cluster, as last seen.
#[derive(Clone)]
pub struct ServiceLister {
    store: Store<Service>,
    synced: watch::Receiver<bool>,
}

impl std::fmt::Debug for ServiceLister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceLister")
            .field("synced", &*self.synced.borrow())
            .finish_non_exhaustive()
    }
}

impl ServiceLister {
    /// Starts the watch; returns the lister and the task that keeps it current until the
    /// process ends. Watch errors are retried as the kubelet's reflector does
    /// ([`crate::backoff::WatchRetry`]).
    pub fn start(client: kube::Client) -> (Self, impl Future<Output = ()> + Send + use<>) {
        let api: kube::Api<Service> = kube::Api::all(client);
        let (store, writer) = reflector::store();
        let (synced_tx, synced) = watch::channel(false);
        let stream = watcher::watcher(api, watcher::Config::default())
            .modify(|s| {
                s.managed_fields_mut().clear();
                s.metadata.annotations = None;
            })
            .reflect(writer);
        let feed = async move {
            let mut stream = std::pin::pin!(stream);
            let mut retry = crate::backoff::WatchRetry::default();
            loop {
                match stream.try_next().await {
                    Ok(Some(Event::InitDone)) => {
                        synced_tx.send_replace(true);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "service watch failed; retrying");
                        retry.pause(&e).await;
                    }
                }
            }
            tracing::error!("service watch ended");
        };
        (Self { store, synced }, feed)
    }

    /// The service variables of a pod in `namespace`.
    ///
    /// # Errors
    /// [`NOT_SYNCED`] when the Services were not listed within a second.
    pub async fn env_for(
        &self,
        namespace: &str,
        enable_service_links: bool,
    ) -> Result<BTreeMap<String, String>, &'static str> {
        let mut synced = self.synced.clone();
        match tokio::time::timeout(SYNC_WAIT, synced.wait_for(|s| *s)).await {
            Ok(Ok(_)) => {}
            _ => return Err(NOT_SYNCED),
        }
        let services = self.store.state();
        Ok(service_env(
            services.iter().map(AsRef::as_ref),
            namespace,
            enable_service_links,
        ))
    }
}

/// The variables of the services a pod in `namespace` sees (the kubelet's
/// `getServiceEnvVarMap` and `envvars.FromServices`).
#[must_use]
pub fn service_env<'a>(
    services: impl Iterator<Item = &'a Service>,
    namespace: &str,
    enable_service_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for service in services {
        if cluster_ip(service).is_none() {
            continue;
        }
        let name = service.name_any();
        let ns = service.namespace().unwrap_or_default();
        if ns == MASTER_NAMESPACE && MASTER_SERVICES.contains(&name.as_str()) {
            chosen.entry(name).or_insert(service);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, service);
        }
    }
    let mut env = BTreeMap::new();
    for service in chosen.values() {
        variables_of(service, &mut env);
    }
    env
}

/// The service's cluster IP, unless it is headless or not yet allocated.
fn cluster_ip(service: &Service) -> Option<&str> {
    let ip = service.spec.as_ref()?.cluster_ip.as_deref()?;
    (!ip.is_empty() && ip != "None").then_some(ip)
}

/// A service or port name as a variable name: upper case, `-` as `_`.
fn variable_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

fn variables_of(service: &Service, env: &mut BTreeMap<String, String>) {
    let (Some(ip), Some(spec)) = (cluster_ip(service), service.spec.as_ref()) else {
        return;
    };
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = ports.first() else {
        return;
    };
    let prefix = variable_name(&service.name_any());
    env.insert(format!("{prefix}_SERVICE_HOST"), ip.to_owned());
    env.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for port in ports {
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            env.insert(
                format!("{prefix}_SERVICE_PORT_{}", variable_name(name)),
                port.port.to_string(),
            );
        }
    }
    let host_port = |port: i32| match ip.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{ip}]:{port}"),
        Err(_) => format!("{ip}:{port}"),
    };
    for (i, port) in ports.iter().enumerate() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        let lower = protocol.to_lowercase();
        let url = format!("{lower}://{}", host_port(port.port));
        if i == 0 {
            env.insert(format!("{prefix}_PORT"), url.clone());
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
        env.insert(format!("{port_prefix}_PROTO"), lower);
        env.insert(format!("{port_prefix}_PORT"), port.port.to_string());
        env.insert(format!("{port_prefix}_ADDR"), ip.to_owned());
        env.insert(port_prefix, url);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(namespace: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .unwrap()
    }

    fn all() -> Vec<Service> {
        vec![
            service(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443, "protocol": "TCP"}]),
            ),
            service(
                "shop",
                "web-front",
                "10.96.0.20",
                serde_json::json!([{"port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
            ),
            service(
                "shop",
                "headless",
                "None",
                serde_json::json!([{"port": 80}]),
            ),
            service(
                "other",
                "db",
                "10.96.0.30",
                serde_json::json!([{"port": 5432}]),
            ),
        ]
    }

    #[test]
    fn variables_follow_the_kubelet_names() {
        let services = all();
        let env = service_env(services.iter(), "shop", true);
        let expected: BTreeMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("WEB_FRONT_SERVICE_HOST", "10.96.0.20"),
            ("WEB_FRONT_SERVICE_PORT", "80"),
            ("WEB_FRONT_SERVICE_PORT_DNS", "53"),
            ("WEB_FRONT_PORT", "tcp://10.96.0.20:80"),
            ("WEB_FRONT_PORT_80_TCP", "tcp://10.96.0.20:80"),
            ("WEB_FRONT_PORT_80_TCP_PROTO", "tcp"),
            ("WEB_FRONT_PORT_80_TCP_PORT", "80"),
            ("WEB_FRONT_PORT_80_TCP_ADDR", "10.96.0.20"),
            ("WEB_FRONT_PORT_53_UDP", "udp://10.96.0.20:53"),
            ("WEB_FRONT_PORT_53_UDP_PROTO", "udp"),
            ("WEB_FRONT_PORT_53_UDP_PORT", "53"),
            ("WEB_FRONT_PORT_53_UDP_ADDR", "10.96.0.20"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env, expected);
    }

    #[test]
    fn without_service_links_only_the_master_service_is_seen() {
        let services = all();
        let env = service_env(services.iter(), "shop", false);
        assert!(env.keys().all(|k| k.starts_with("KUBERNETES_")));
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        // A pod in `default` with links sees its own services; `kubernetes` once.
        let env = service_env(services.iter(), "other", true);
        assert_eq!(env["DB_SERVICE_PORT"], "5432");
        assert!(!env.contains_key("WEB_FRONT_SERVICE_HOST"));
    }
}
