//! A container's environment, as the kubelet's `makeEnvironmentVariables` makes it:
//! `envFrom` ConfigMaps and Secrets first (with `prefix`, `optional`, and invalid names
//! skipped with an `InvalidEnvironmentVariableNames` event), then `env` in order (values
//! with `$(VAR)` expanded against what came before and the service variables; `fieldRef`,
//! `resourceFieldRef`, `configMapKeyRef`, `secretKeyRef`), then the service variables of
//! [`crate::envvars`] that no declared variable overrides.
//!
//! The Secrets, ConfigMaps and Services come prefetched in [`EnvSources`] (from the
//! watch-based caches), so making the environment is a pure function.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::context::{ConfigError, ContainerContext, EnvSources, Lookup};
use crate::cri::api;
use crate::envvars::ServiceLister;
use crate::expansion::expand;
use crate::resources::container_resource_value;
use crate::watch_manager::{ObjectCache, Referenced, SourceCaches};

/// Reads the environment sources of pods: the Secret and ConfigMap caches, the Services.
#[derive(Debug, Clone)]
pub struct EnvSourceReader {
    caches: SourceCaches,
    services: ServiceLister,
    allocatable: BTreeMap<String, ApiQuantity>,
}

impl EnvSourceReader {
    /// A reader over the node's caches; `allocatable` is the node's.
    #[must_use]
    pub fn new(
        caches: SourceCaches,
        services: ServiceLister,
        allocatable: BTreeMap<String, ApiQuantity>,
    ) -> Self {
        Self {
            caches,
            services,
            allocatable,
        }
    }

    /// The Secret and ConfigMap caches, where pods register what they reference.
    #[must_use]
    pub fn caches(&self) -> &SourceCaches {
        &self.caches
    }

    /// The sources of `pod`'s containers: every Secret and ConfigMap the pod references,
    /// and its service variables.
    pub async fn read(&self, pod: &Pod) -> EnvSources {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        EnvSources {
            secrets: read_all(&self.caches.secrets, namespace, pod).await,
            config_maps: read_all(&self.caches.config_maps, namespace, pod).await,
            services: self
                .services
                .env_for(namespace, links)
                .await
                .map_err(str::to_owned),
            allocatable: self.allocatable.clone(),
        }
    }
}

/// Every object of `K` the pod references, from its cache, all at once (a read waits for
/// an object's first list).
async fn read_all<K: Referenced + Send + Sync + 'static>(
    cache: &ObjectCache<K>,
    namespace: &str,
    pod: &Pod,
) -> HashMap<String, Lookup<K>> {
    let reads = K::names(pod).into_iter().map(|name| async move {
        let got = cache.get(namespace, &name).await.map_err(|e| e.to_string());
        (name, got)
    });
    futures::future::join_all(reads).await.into_iter().collect()
}

/// A `fieldRef` value (the kubelet's `podFieldSelectorRuntimeValue`).
fn field_ref(pod: &Pod, ctx: &ContainerContext, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let ips = || {
        ctx.pod_ips
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    Some(match path {
        "metadata.name" => meta.name.clone()?,
        "metadata.namespace" => meta.namespace.clone()?,
        "metadata.uid" => meta.uid.clone()?,
        "spec.nodeName" => ctx.node_name.clone(),
        "spec.serviceAccountName" => spec?.service_account_name.clone().unwrap_or_default(),
        "status.hostIP" => ctx.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
        "status.podIP" => ips().into_iter().next().unwrap_or_default(),
        "status.podIPs" => ips().join(","),
        other => {
            let key = |prefix: &str| {
                other
                    .strip_prefix(prefix)
                    .and_then(|k| k.strip_suffix("']"))
                    .map(str::to_owned)
            };
            // A missing label or annotation is empty, as in the kubelet.
            let entry = |map: &Option<BTreeMap<String, String>>, k: String| {
                map.as_ref()
                    .and_then(|m| m.get(&k))
                    .cloned()
                    .unwrap_or_default()
            };
            if let Some(k) = key("metadata.labels['") {
                entry(&meta.labels, k)
            } else if let Some(k) = key("metadata.annotations['") {
                entry(&meta.annotations, k)
            } else {
                return None;
            }
        }
    })
}

/// The kubelet's `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`, and not `.`, `..` or `..*`.
fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_'));
    first_ok
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        && name != "."
        && !name.starts_with("..")
}

/// The container's environment, and the warnings the kubelet reports as events.
#[derive(Debug, Default)]
pub struct Environment {
    /// The variables, in order, each name once.
    pub vars: Vec<api::KeyValue>,
    /// `InvalidEnvironmentVariableNames` event messages.
    pub skipped: Vec<String>,
}

/// Variables in the order they were first set, each name once.
#[derive(Default)]
struct Ordered {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl Ordered {
    fn set(&mut self, name: String, value: String) {
        match self.index.get(&name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }
}

/// What a `configMapKeyRef` / `secretKeyRef` / `envFrom` source resolved to.
enum Resolved<'a, K> {
    Found(&'a K),
    /// Not found and optional: skipped.
    Skip,
}

fn lookup<'a, K>(
    found: Option<&'a Lookup<K>>,
    resource: &str,
    name: &str,
    optional: bool,
) -> Result<Resolved<'a, K>, ConfigError> {
    match found {
        Some(Ok(Some(object))) => Ok(Resolved::Found(object)),
        Some(Ok(None)) if optional => Ok(Resolved::Skip),
        Some(Ok(None)) => Err(ConfigError::Source(format!(
            "{resource} {name:?} not found"
        ))),
        Some(Err(e)) => Err(ConfigError::Source(e.clone())),
        None => Err(ConfigError::Source(format!(
            "couldn't get {resource} {name}: not read"
        ))),
    }
}

fn secret_data(secret: &Secret) -> impl Iterator<Item = (&str, String)> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(&v.0).into_owned()))
}

/// The container's environment (see the module comment).
///
/// # Errors
/// A missing non-optional source or key, or a reference the agent cannot resolve.
pub fn environment(
    pod: &Pod,
    container: &Container,
    ctx: &ContainerContext,
) -> Result<Environment, ConfigError> {
    let sources = &ctx.sources;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut service_env = sources.services.clone().map_err(ConfigError::Source)?;
    let mut env = Ordered::default();
    let mut skipped = Vec::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, name, data): (&str, &str, Vec<(&str, String)>) =
            if let Some(r) = &from.config_map_ref {
                let optional = r.optional.unwrap_or(false);
                match lookup(
                    sources.config_maps.get(&r.name),
                    "configmap",
                    &r.name,
                    optional,
                )? {
                    Resolved::Skip => continue,
                    Resolved::Found(cm) => (
                        "configMap",
                        &r.name,
                        cm.data
                            .iter()
                            .flatten()
                            .map(|(k, v)| (k.as_str(), v.clone()))
                            .collect(),
                    ),
                }
            } else if let Some(r) = &from.secret_ref {
                let optional = r.optional.unwrap_or(false);
                match lookup(sources.secrets.get(&r.name), "secret", &r.name, optional)? {
                    Resolved::Skip => continue,
                    Resolved::Found(s) => ("secret", &r.name, secret_data(s).collect()),
                }
            } else {
                continue;
            };
        let mut invalid = Vec::new();
        for (key, value) in data {
            let key = format!("{prefix}{key}");
            if is_env_var_name(&key) {
                env.set(key, value);
            } else {
                invalid.push(key);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            skipped.push(format!(
                "Keys [{}] from the EnvFrom {kind} {namespace}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", ")
            ));
        }
    }
    for var in container.env.iter().flatten() {
        let Some(value) = env_value(pod, container, ctx, var, &env, &service_env)? else {
            continue;
        };
        service_env.remove(&var.name);
        env.set(var.name.clone(), value);
    }
    let mut vars: Vec<api::KeyValue> = env
        .vars
        .into_iter()
        .map(|(key, value)| api::KeyValue { key, value })
        .collect();
    vars.extend(
        service_env
            .into_iter()
            .filter(|(k, _)| !env.index.contains_key(k))
            .map(|(key, value)| api::KeyValue { key, value }),
    );
    Ok(Environment { vars, skipped })
}

/// One declared variable's value; `None` when an optional source skips it.
fn env_value(
    pod: &Pod,
    container: &Container,
    ctx: &ContainerContext,
    var: &EnvVar,
    env: &Ordered,
    service_env: &BTreeMap<String, String>,
) -> Result<Option<String>, ConfigError> {
    let value = var.value.as_deref().unwrap_or_default();
    let Some(from) = var.value_from.as_ref().filter(|_| value.is_empty()) else {
        let lookup = |name: &str| {
            env.get(name)
                .or_else(|| service_env.get(name).map(String::as_str))
                .map(str::to_owned)
        };
        return Ok(Some(expand(value, lookup)));
    };
    let sources = &ctx.sources;
    let bad = |reason: String| ConfigError::BadEnv {
        container: container.name.clone(),
        var: var.name.clone(),
        reason,
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(f) = &from.field_ref {
        return field_ref(pod, ctx, &f.field_path)
            .map(Some)
            .ok_or_else(|| bad(format!("unsupported fieldPath {:?}", f.field_path)));
    }
    if let Some(r) = &from.resource_field_ref {
        let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
            None => container,
            Some(name) => crate::pod::container(pod, name)
                .ok_or_else(|| bad(format!("container {name} not found")))?,
        };
        return container_resource_value(target, r, &sources.allocatable)
            .map(Some)
            .map_err(bad);
    }
    if let Some(r) = &from.config_map_key_ref {
        let optional = r.optional.unwrap_or(false);
        let Resolved::Found(cm) = lookup(
            sources.config_maps.get(&r.name),
            "configmap",
            &r.name,
            optional,
        )?
        else {
            return Ok(None);
        };
        return match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(ConfigError::Source(format!(
                "couldn't find key {} in ConfigMap {namespace}/{}",
                r.key, r.name
            ))),
        };
    }
    if let Some(r) = &from.secret_key_ref {
        let optional = r.optional.unwrap_or(false);
        let Resolved::Found(secret) =
            lookup(sources.secrets.get(&r.name), "secret", &r.name, optional)?
        else {
            return Ok(None);
        };
        return match secret.data.as_ref().and_then(|d| d.get(&r.key)) {
            Some(v) => Ok(Some(String::from_utf8_lossy(&v.0).into_owned())),
            None if optional => Ok(None),
            None => Err(ConfigError::Source(format!(
                "couldn't find key {} in Secret {namespace}/{}",
                r.key, r.name
            ))),
        };
    }
    Ok(Some(String::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::Arc;

    fn container(env: serde_json::Value, env_from: serde_json::Value) -> Container {
        serde_json::from_value(serde_json::json!({
            "name": "c",
            "env": env,
            "envFrom": env_from,
            "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}},
        }))
        .unwrap()
    }

    fn config_map(pairs: &[(&str, &str)]) -> Lookup<ConfigMap> {
        let data = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Ok(Some(Arc::new(ConfigMap {
            data: Some(data),
            ..ConfigMap::default()
        })))
    }

    fn secret(pairs: &[(&str, &str)]) -> Lookup<Secret> {
        let data = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect();
        Ok(Some(Arc::new(Secret {
            data: Some(data),
            ..Secret::default()
        })))
    }

    fn context() -> ContainerContext {
        let services = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("WEB_SERVICE_HOST", "10.96.0.9"),
        ];
        ContainerContext {
            sources: Arc::new(EnvSources {
                config_maps: HashMap::from([
                    ("cm".into(), config_map(&[("color", "blue"), ("1bad", "x")])),
                    ("gone".into(), Ok(None)),
                ]),
                secrets: HashMap::from([
                    ("s".into(), secret(&[("password", "hunter2")])),
                    (
                        "broken".into(),
                        Err(
                            "failed to sync secret cache: timed out waiting for the condition"
                                .into(),
                        ),
                    ),
                ]),
                services: Ok(services
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()),
                allocatable: BTreeMap::from([
                    ("cpu".into(), ApiQuantity("2".into())),
                    ("memory".into(), ApiQuantity("4Gi".into())),
                ]),
            }),
            ..ContainerContext::default()
        }
    }

    fn run(c: &Container) -> Result<Environment, ConfigError> {
        let mut p = pod("web", &[("c", "busybox")]);
        p.metadata.namespace = Some("shop".into());
        p.spec.as_mut().unwrap().containers[0] = c.clone();
        environment(&p, c, &context())
    }

    fn pairs(env: &Environment) -> Vec<(&str, &str)> {
        env.vars
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect()
    }

    #[test]
    fn env_from_then_env_then_services_with_expansion_in_order() {
        let c = container(
            serde_json::json!([
                {"name": "CFG_color", "value": "red"},
                {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "color"}}},
                {"name": "BOTH", "value": "$(COLOR)/$(PASS)/$(WEB_SERVICE_HOST)/$(LATER)"},
                {"name": "NOT_EXPANDED", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "color"}}},
                {"name": "LATER", "value": "l"},
                {"name": "WEB_SERVICE_HOST", "value": "mine"},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}}},
                {"name": "CPU_REQ_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            ]),
            serde_json::json!([{"configMapRef": {"name": "cm"}, "prefix": "CFG_"}]),
        );
        let env = run(&c).unwrap();
        assert_eq!(
            pairs(&env),
            [
                ("CFG_1bad", "x"),
                ("CFG_color", "red"),
                ("PASS", "hunter2"),
                ("COLOR", "blue"),
                ("BOTH", "blue/hunter2/10.96.0.9/$(LATER)"),
                ("NOT_EXPANDED", "blue"),
                ("LATER", "l"),
                ("WEB_SERVICE_HOST", "mine"),
                ("MEM", "64"),
                ("CPU", "2"),
                ("CPU_REQ_M", "250"),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ]
        );
        assert!(env.skipped.is_empty());
    }

    #[test]
    fn invalid_env_from_keys_are_skipped_with_the_kubelets_message() {
        let c = container(
            serde_json::json!([]),
            serde_json::json!([{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "s"}, "prefix": "S-"}]),
        );
        let env = run(&c).unwrap();
        assert_eq!(env.vars[0].key, "color");
        assert_eq!(env.vars[1].key, "S-password");
        assert_eq!(
            env.skipped,
            [
                "Keys [1bad] from the EnvFrom configMap shop/cm were skipped since they are considered invalid environment variable names."
            ]
        );
        assert!(is_env_var_name("my.env-name") && is_env_var_name("_A1"));
        assert!(!is_env_var_name("..x") && !is_env_var_name(".") && !is_env_var_name("a b"));
    }

    #[test]
    fn missing_sources_are_config_errors_unless_optional() {
        let cases = [
            (
                serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]),
                Some("configmap \"gone\" not found"),
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": true}}}]),
                None,
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope"}}}]),
                Some("couldn't find key nope in Secret shop/s"),
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope", "optional": true}}}]),
                None,
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "broken", "key": "k", "optional": true}}}]),
                Some("failed to sync secret cache: timed out waiting for the condition"),
            ),
        ];
        for (env, want) in cases {
            let got = run(&container(env.clone(), serde_json::json!([])));
            match want {
                Some(message) => assert_eq!(got.unwrap_err().to_string(), message, "{env}"),
                None => assert!(got.unwrap().vars.iter().all(|kv| kv.key != "X"), "{env}"),
            }
        }
        let from = serde_json::json!([{"configMapRef": {"name": "gone", "optional": true}}]);
        assert!(run(&container(serde_json::json!([]), from)).is_ok());
        let from = serde_json::json!([{"secretRef": {"name": "absent"}}]);
        assert!(run(&container(serde_json::json!([]), from)).is_err());
    }

    #[test]
    fn a_missing_label_or_annotation_is_empty() {
        let c = container(
            serde_json::json!([
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "NONE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['none']"}}},
                {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
            ]),
            serde_json::json!([]),
        );
        let mut p = pod("web", &[("c", "busybox")]);
        p.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        let env = environment(&p, &c, &context()).unwrap();
        let values: Vec<_> = env
            .vars
            .iter()
            .take(3)
            .map(|kv| kv.value.as_str())
            .collect();
        assert_eq!(values, ["web", "", ""]);
    }

    #[test]
    fn unknown_services_fail_like_the_kubelet() {
        let mut ctx = context();
        Arc::get_mut(&mut ctx.sources).unwrap().services = Err(crate::envvars::NOT_SYNCED.into());
        let p = pod("web", &[("c", "busybox")]);
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(
            environment(&p, &c, &ctx).unwrap_err().to_string(),
            crate::envvars::NOT_SYNCED
        );
    }
}
