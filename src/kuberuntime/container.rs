//! `ContainerConfig` from a Pod's container, as the kubelet's `generateContainerConfig`
//! builds it: command and args with `$(VAR)` expansion, environment (values and field
//! references), working dir, mounts, log path, labels, annotations, resources and the
//! Linux security context.

use std::collections::HashMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::context::{ConfigError, ContainerContext};
use super::labels;
use super::security_context;
use crate::cm::{QUOTA_PERIOD, milli_cpu_to_quota, milli_cpu_to_shares};
use crate::cri::api;
use crate::expansion::expand;
use crate::pod::PodId;
use crate::resources::Quantity;

/// The kubelet's `HashContainer`, as its `io.kubernetes.container.hash` annotation writes
/// it (lower-case hex): FNV-32a over go-spew's rendering of the bytes of Go's
/// `json.Marshal` of the v1.20.2 `v1.Container`. The kubelet and this agent then see each
/// other's containers as unchanged, and a container is restarted only when its spec
/// really changed.
#[must_use]
pub fn container_hash(container: &Container) -> String {
    format!("{:x}", kubelet_hash(container))
}

fn kubelet_hash(container: &Container) -> u32 {
    let value = serde_json::to_value(container).unwrap_or_default();
    let json = crate::goapi::json::marshal(&value, "v1.Container").unwrap_or_else(|e| {
        // Not a container the API server would have accepted: hashed as serde writes it,
        // stable for this agent, and no spec the kubelet runs.
        tracing::warn!(container = %container.name, error = %e, "container spec without a Go form");
        value.to_string()
    });
    crate::goapi::deep_hash_bytes(json.as_bytes())
}

/// The hash rkubelet wrote before it computed the kubelet's (FNV-1a, 64 bits, over serde's
/// JSON): a container an earlier rkubelet started is not restarted by an upgrade.
fn earlier_rkubelet_hash(container: &Container) -> String {
    let bytes = serde_json::to_vec(container).unwrap_or_default();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:x}")
}

/// Whether a running container with the hash annotation `hash` was made from
/// `container` (an absent annotation, as on the kubelet's oldest containers, says nothing).
#[must_use]
pub fn hash_matches(hash: &str, container: &Container) -> bool {
    if hash.is_empty() {
        return true;
    }
    // The kubelet reads the annotation as a hex number (`strconv.ParseUint(s, 16, 64)`).
    match u64::from_str_radix(hash, 16) {
        Ok(n) if n == u64::from(kubelet_hash(container)) => true,
        _ => hash == earlier_rkubelet_hash(container),
    }
}

/// The container's annotations, as the kubelet's `newContainerAnnotations` writes them:
/// its hash, restart count, termination message path and policy, the pod's deletion and
/// termination grace periods (when set), its preStop hook and ports (when it has them) as
/// Go's JSON. The kubelet reads each of them back from a container this agent made.
fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
) -> HashMap<String, String> {
    let mut annotations = HashMap::from([
        (labels::CONTAINER_HASH.to_owned(), container_hash(container)),
        (
            labels::CONTAINER_RESTART_COUNT.to_owned(),
            restart_count.to_string(),
        ),
        (
            labels::TERMINATION_MESSAGE_PATH.to_owned(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            labels::TERMINATION_MESSAGE_POLICY.to_owned(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        ),
    ]);
    let periods = [
        (
            labels::POD_DELETION_GRACE_PERIOD,
            pod.metadata.deletion_grace_period_seconds,
        ),
        (
            labels::POD_TERMINATION_GRACE_PERIOD,
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
        ),
    ];
    for (key, seconds) in periods {
        if let Some(seconds) = seconds {
            annotations.insert(key.to_owned(), seconds.to_string());
        }
    }
    let go_json = |value: Option<serde_json::Value>, type_name: &str| {
        crate::goapi::json::marshal(&value?, type_name)
            .inspect_err(|e| tracing::warn!(container = %container.name, error = %e, "no Go JSON of {type_name}"))
            .ok()
    };
    let pre_stop = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref());
    if let Some(hook) = go_json(
        pre_stop.and_then(|h| serde_json::to_value(h).ok()),
        "v1.Handler",
    ) {
        annotations.insert(labels::PRE_STOP_HANDLER.to_owned(), hook);
    }
    let ports = container.ports.as_ref().filter(|p| !p.is_empty());
    if let Some(ports) = go_json(
        ports.and_then(|p| serde_json::to_value(p).ok()),
        "[]v1.ContainerPort",
    ) {
        annotations.insert(labels::CONTAINER_PORTS.to_owned(), ports);
    }
    annotations
}

/// A quantity in thousandths, for cgroup arithmetic.
fn millis(q: Quantity) -> i64 {
    i64::try_from(q.milli_value()).unwrap_or(i64::MAX)
}

/// The container's cgroup settings as `generateLinuxContainerConfig` makes them: CPU
/// shares, the CFS period (always) and quota, the memory limit and the OOM score of the
/// pod's QoS class.
fn resources(
    pod: &Pod,
    container: &Container,
    memory_capacity: u64,
) -> Result<api::LinuxContainerResources, ConfigError> {
    let bad = |reason: String| ConfigError::BadResource {
        container: container.name.clone(),
        reason,
    };
    let get = |which: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
               name: &str| {
        which
            .and_then(|m| m.get(name))
            .map(|q| Quantity::parse(&q.0).map_err(|e| bad(format!("resources {name}: {e}"))))
            .transpose()
    };
    let req = container.resources.as_ref();
    let limits = req.and_then(|r| r.limits.as_ref());
    let requests = req.and_then(|r| r.requests.as_ref());
    let cpu_limit = get(limits, "cpu")?;
    // As in the API's defaulting, a request defaults to the limit.
    let cpu_request = get(requests, "cpu")?.or(cpu_limit);
    let memory_limit = get(limits, "memory")?;
    let period = QUOTA_PERIOD;
    let mut out = api::LinuxContainerResources {
        cpu_shares: i64::try_from(milli_cpu_to_shares(cpu_request.map_or(0, millis)))
            .unwrap_or(i64::MAX),
        cpu_period: i64::try_from(period).unwrap_or(i64::MAX),
        oom_score_adj: crate::cm::container_oom_score_adj(pod, container, memory_capacity),
        ..Default::default()
    };
    if let Some(limit) = cpu_limit {
        out.cpu_quota = milli_cpu_to_quota(millis(limit), period);
    }
    if let Some(limit) = memory_limit {
        out.memory_limit_in_bytes = i64::try_from(limit.value()).unwrap_or(i64::MAX);
    }
    Ok(out)
}

/// The container's log file, relative to the sandbox's log directory:
/// `<container>/<restart count>.log`, as the kubelet names it.
#[must_use]
pub fn log_path(container: &str, restart_count: u32) -> PathBuf {
    PathBuf::from(container).join(format!("{restart_count}.log"))
}

/// An ephemeral container with a target joins its target's PID namespace, unless it
/// shares the pod's or the node's already (the kubelet's `generateLinuxContainerConfig`):
/// CRI namespace mode `TARGET` with the target's id.
fn with_pid_target(
    mut sc: api::LinuxContainerSecurityContext,
    target: Option<&str>,
) -> api::LinuxContainerSecurityContext {
    if let (Some(target), Some(ns)) = (target, sc.namespace_options.as_mut())
        && ns.pid() == api::NamespaceMode::Container
    {
        ns.set_pid(api::NamespaceMode::Target);
        ns.target_id = target.to_owned();
    }
    sc
}

/// The full container config, with `envs`, the container's environment
/// ([`super::env::environment`]), made before its mounts as the kubelet does.
///
/// # Errors
/// A spec the agent cannot turn into a config (reported as `CreateContainerConfigError`).
pub fn container_config(
    pod: &Pod,
    id: &PodId,
    container: &Container,
    ctx: &ContainerContext,
    envs: Vec<api::KeyValue>,
) -> Result<api::ContainerConfig, ConfigError> {
    security_context::verify_run_as_non_root(pod, container, &ctx.image_user)?;
    let vars: HashMap<&str, &str> = envs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    let expand_all = |list: &Option<Vec<String>>| {
        list.iter()
            .flatten()
            .map(|s| expand(s, |name| vars.get(name).map(|v| (*v).to_owned())))
            .collect::<Vec<_>>()
    };
    let mut container_labels = labels::pod_labels(id);
    container_labels.insert(labels::CONTAINER_NAME.into(), container.name.clone());
    let annotations = container_annotations(pod, container, ctx.restart_count);
    let config = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: container.name.clone(),
            attempt: ctx.restart_count,
        }),
        image: Some(api::ImageSpec {
            image: ctx.image_ref.clone(),
            ..Default::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs,
        mounts: ctx.mounts.clone(),
        labels: container_labels,
        annotations,
        log_path: log_path(&container.name, ctx.restart_count)
            .to_string_lossy()
            .into_owned(),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(resources(pod, container, ctx.memory_capacity)?),
            security_context: Some(with_pid_target(
                security_context::container(
                    pod,
                    container,
                    &ctx.image_user,
                    &ctx.seccomp_profile_root,
                ),
                ctx.pid_target.as_deref(),
            )),
        }),
        ..Default::default()
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;
    use k8s_openapi::api::core::v1::{
        EnvVar, EnvVarSource, ObjectFieldSelector, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    /// The config of `container`, with its environment.
    fn made(
        p: &Pod,
        id: &PodId,
        container: &Container,
        ctx: &ContainerContext,
    ) -> api::ContainerConfig {
        let env = crate::kuberuntime::env::environment(p, container, ctx).unwrap();
        container_config(p, id, container, ctx, env.vars).unwrap()
    }

    fn env(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: path.into(),
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn env_values_field_refs_and_expansion_in_args() {
        let mut p = pod("web", &[("c", "busybox")]);
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.env = Some(vec![
            env("GREETING", "hi"),
            field("POD_NAME", "metadata.name"),
            field("POD_IP", "status.podIP"),
            env("BOTH", "$(GREETING) $(POD_NAME)"),
        ]);
        c.command = Some(vec!["sh".into(), "-c".into()]);
        c.args = Some(vec!["echo $(BOTH) $(NOPE)".into()]);
        let ctx = ContainerContext {
            pod_ips: vec!["10.244.1.7".parse().unwrap()],
            image_ref: "sha256:abc".into(),
            restart_count: 3,
            ..Default::default()
        };
        let id = PodId::of(&p).unwrap();
        let container = p.spec.as_ref().unwrap().containers[0].clone();
        let config = made(&p, &id, &container, &ctx);
        let envs: Vec<_> = config
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(
            envs,
            [
                ("GREETING", "hi"),
                ("POD_NAME", "web"),
                ("POD_IP", "10.244.1.7"),
                ("BOTH", "hi web")
            ]
        );
        assert_eq!(config.args, ["echo hi web $(NOPE)"]);
        assert_eq!(config.log_path, "c/3.log");
        assert_eq!(config.metadata.unwrap().attempt, 3);
        assert_eq!(config.labels[labels::CONTAINER_NAME], "c");
        assert_eq!(config.labels[labels::POD_UID], "uid-web");
        assert_eq!(config.annotations[labels::CONTAINER_RESTART_COUNT], "3");
        assert_eq!(config.image.unwrap().image, "sha256:abc");
    }

    #[test]
    fn resources_become_cgroup_settings() {
        let mut p = pod("web", &[("c", "busybox")]);
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some(
                [
                    ("cpu".to_owned(), Q("500m".into())),
                    ("memory".to_owned(), Q("64Mi".into())),
                ]
                .into(),
            ),
            ..Default::default()
        });
        let id = PodId::of(&p).unwrap();
        let container = p.spec.as_ref().unwrap().containers[0].clone();
        let ctx = ContainerContext {
            memory_capacity: 1 << 30,
            ..Default::default()
        };
        let config = made(&p, &id, &container, &ctx);
        let r = config.linux.unwrap().resources.unwrap();
        assert_eq!(r.cpu_shares, 512);
        assert_eq!((r.cpu_period, r.cpu_quota), (100_000, 50_000));
        assert_eq!(r.memory_limit_in_bytes, 64 * 1024 * 1024);
        // Guaranteed (requests default to the limits).
        assert_eq!(r.oom_score_adj, -997);
        // Burstable: a 256Mi request of a 1Gi node.
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: Some([("memory".to_owned(), Q("256Mi".into()))].into()),
            ..Default::default()
        });
        let container = p.spec.as_ref().unwrap().containers[0].clone();
        let config = made(&p, &id, &container, &ctx);
        let r = config.linux.unwrap().resources.unwrap();
        assert_eq!((r.cpu_shares, r.cpu_quota, r.cpu_period), (2, 0, 100_000));
        assert_eq!(r.oom_score_adj, 750);
    }

    /// An ephemeral container with a target sees the target's processes: CRI PID
    /// namespace `TARGET` with the target's id; in a pod sharing one PID namespace it stays
    /// in the pod's.
    #[test]
    fn an_ephemeral_container_joins_its_targets_pid_namespace() {
        let mut p = pod("web", &[("c", "busybox")]);
        let id = PodId::of(&p).unwrap();
        let container = p.spec.as_ref().unwrap().containers[0].clone();
        let ctx = ContainerContext {
            pid_target: Some("target-id".into()),
            ..Default::default()
        };
        let namespaces = |p: &Pod, ctx: &ContainerContext| {
            let config = made(p, &id, &container, ctx);
            let sc = config.linux.unwrap().security_context.unwrap();
            let ns = sc.namespace_options.unwrap();
            (ns.pid(), ns.target_id)
        };
        assert_eq!(
            namespaces(&p, &ctx),
            (api::NamespaceMode::Target, "target-id".to_owned())
        );
        assert_eq!(
            namespaces(&p, &ContainerContext::default()),
            (api::NamespaceMode::Container, String::new())
        );
        p.spec.as_mut().unwrap().share_process_namespace = Some(true);
        assert_eq!(
            namespaces(&p, &ctx),
            (api::NamespaceMode::Pod, String::new())
        );
    }

    #[test]
    fn the_hash_changes_with_the_spec() {
        let p = pod("web", &[("c", "busybox")]);
        let mut c = p.spec.unwrap().containers[0].clone();
        let before = container_hash(&c);
        assert_eq!(before, container_hash(&c));
        assert!(hash_matches(&before, &c));
        assert!(hash_matches("", &c), "no annotation: nothing to compare");
        c.image = Some("nginx".into());
        assert_ne!(before, container_hash(&c));
        assert!(!hash_matches(&before, &c));
        // The annotation is a hex number: leading zeros and case do not matter.
        let padded = format!("000{}", container_hash(&c).to_uppercase());
        assert!(hash_matches(&padded, &c));
    }

    /// Each reference container, and what the kubelet made of it: its `hash`, the JSON of
    /// its `preStop` hook and of its `ports` (tests/data/kubelet-v1.20.2).
    fn vectors_with_annotations() -> impl Iterator<Item = (serde_json::Value, serde_json::Value)> {
        let inputs = include_str!("../../tests/data/kubelet-v1.20.2/containers.jsonl");
        let outputs = include_str!("../../tests/data/kubelet-v1.20.2/container-hashes.jsonl");
        inputs.lines().zip(outputs.lines()).map(|(input, output)| {
            (
                serde_json::from_str(input).unwrap(),
                serde_json::from_str(output).unwrap(),
            )
        })
    }

    fn vectors() -> impl Iterator<Item = (serde_json::Value, String)> {
        vectors_with_annotations()
            .map(|(input, expected)| (input, expected["hash"].as_str().unwrap().to_owned()))
    }

    /// Every annotation the kubelet writes on a container, in its form: the preStop hook
    /// and the ports as its `json.Marshal` writes them (the reference vectors), the grace
    /// periods when the pod sets them.
    #[test]
    fn annotations_are_the_kubelets() {
        let mut p = pod("web", &[("c", "busybox")]);
        let mut hooks = 0;
        for (input, expected) in vectors_with_annotations() {
            let c: Container = serde_json::from_value(input.clone()).unwrap();
            let a = container_annotations(&p, &c, 2);
            assert_eq!(a[labels::CONTAINER_HASH], expected["hash"], "{input}");
            assert_eq!(a[labels::CONTAINER_RESTART_COUNT], "2");
            for (key, field) in [
                (labels::PRE_STOP_HANDLER, "preStop"),
                (labels::CONTAINER_PORTS, "ports"),
            ] {
                assert_eq!(
                    a.get(key).map(String::as_str),
                    expected[field].as_str(),
                    "{key} of {input}"
                );
            }
            hooks += usize::from(a.contains_key(labels::PRE_STOP_HANDLER));
        }
        assert!(hooks >= 10, "{hooks}");
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        let a = container_annotations(&p, &c, 0);
        assert_eq!(a[labels::TERMINATION_MESSAGE_PATH], "/dev/termination-log");
        assert_eq!(a[labels::TERMINATION_MESSAGE_POLICY], "File");
        assert!(!a.contains_key(labels::POD_TERMINATION_GRACE_PERIOD));
        assert!(!a.contains_key(labels::POD_DELETION_GRACE_PERIOD));
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(45);
        p.metadata.deletion_grace_period_seconds = Some(5);
        let a = container_annotations(&p, &c, 0);
        assert_eq!(a[labels::POD_TERMINATION_GRACE_PERIOD], "45");
        assert_eq!(a[labels::POD_DELETION_GRACE_PERIOD], "5");
    }

    /// The kubelet v1.20.2's own `HashContainer` of each reference container
    /// (tests/data/kubelet-v1.20.2/README.md), through this crate's `Container`.
    #[test]
    fn hashes_are_the_kubelets() {
        let mut n = 0;
        for (input, hash) in vectors() {
            let c: Container = serde_json::from_value(input.clone()).unwrap();
            assert_eq!(container_hash(&c), hash, "{input}");
            assert!(hash_matches(&hash, &c));
            n += 1;
        }
        assert!(n > 150, "{n}");
    }

    /// The hash depends on the spec only: not on the order in which a serializer writes
    /// the fields (k8s-openapi's is alphabetical, the vectors' Go's), not on absent fields
    /// written as `null`, not on fields a later API (or a later k8s-openapi) added.
    #[test]
    fn the_hash_depends_on_the_spec_only() {
        let hash_of = |v: &serde_json::Value| {
            let json = crate::goapi::json::marshal(v, "v1.Container").unwrap();
            format!("{:x}", crate::goapi::deep_hash_bytes(json.as_bytes()))
        };
        for (input, hash) in vectors() {
            let c: Container = serde_json::from_value(input.clone()).unwrap();
            let reserialized: serde_json::Value =
                serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            assert_eq!(hash_of(&reserialized), hash, "{input}");
            let mut extended = input.clone();
            let object = extended.as_object_mut().unwrap();
            for absent in ["workingDir", "lifecycle", "securityContext", "startupProbe"] {
                object.entry(absent).or_insert(serde_json::Value::Null);
            }
            object.insert("fieldOfAFutureApi".into(), serde_json::json!({"a": [1]}));
            for probe in ["livenessProbe", "readinessProbe"] {
                if let Some(p) = object.get_mut(probe).and_then(|p| p.as_object_mut()) {
                    p.insert("grpc".into(), serde_json::json!({"port": 1}));
                }
            }
            assert_eq!(hash_of(&extended), hash, "{extended}");
        }
    }

    /// The hashes the kubelet v1.20.2 gives the containers of static pods: their
    /// manifests decoded and defaulted as its file source does (tests/data/kubelet-v1.20.2).
    #[test]
    fn static_pods_containers_hash_as_the_kubelets() {
        let (pods, expected) = crate::pod::file::testing::kubelet_static_pods();
        let mut n = 0;
        for pod in pods {
            let hashes = &expected[pod.metadata.name.as_deref().unwrap()]["hashes"];
            for c in crate::pod::containers(&pod) {
                assert_eq!(container_hash(c), hashes[&c.name], "{}", c.name);
                n += 1;
            }
        }
        assert!(n >= 10, "{n}");
    }

    /// The annotations the kubelet v1.20.2 wrote on real containers it started (the
    /// Deployment and static pod of tests/takeover.rs, recorded from containerd with the
    /// container's spec as the API server holds it): rkubelet writes the same, every key
    /// and value (hash, restart count, termination message, grace period, ports and
    /// preStop hook as Go's JSON).
    #[test]
    fn annotations_of_the_kubelets_real_containers() {
        let recorded = include_str!("../../tests/data/kubelet-v1.20.2/real-containers.jsonl");
        let mut n = 0;
        for line in recorded.lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let c: Container = serde_json::from_value(record["container"].clone()).unwrap();
            let mut p = pod("web", &[]);
            p.spec.as_mut().unwrap().termination_grace_period_seconds =
                record["terminationGracePeriodSeconds"].as_i64();
            let kubelets: HashMap<String, String> =
                serde_json::from_value(record["annotations"].clone()).unwrap();
            let restarts = kubelets[labels::CONTAINER_RESTART_COUNT].parse().unwrap();
            assert_eq!(container_annotations(&p, &c, restarts), kubelets, "{line}");
            n += 1;
        }
        assert_eq!(n, 7);
    }

    /// A container an earlier rkubelet started carries that version's hash: not restarted.
    #[test]
    fn an_earlier_rkubelets_hash_still_matches() {
        let c = pod("web", &[("c", "busybox")]).spec.unwrap().containers[0].clone();
        let earlier = earlier_rkubelet_hash(&c);
        assert!(earlier.len() > 8, "64 bits: {earlier}");
        assert!(hash_matches(&earlier, &c));
        let mut changed = c.clone();
        changed.args = Some(vec!["x".into()]);
        assert!(!hash_matches(&earlier, &changed));
    }

    #[test]
    fn no_container_config_for_a_root_image_under_run_as_non_root() {
        use crate::kuberuntime::security_context::NonRootError;
        use crate::kuberuntime::security_context::testing::{first, web};
        use k8s_openapi::api::core::v1::PodSecurityContext;
        let p = web(
            PodSecurityContext {
                run_as_non_root: Some(true),
                ..Default::default()
            },
            None,
        );
        let id = PodId::of(&p).unwrap();
        let made = container_config(
            &p,
            &id,
            &first(&p),
            &ContainerContext::default(),
            Vec::new(),
        );
        assert!(matches!(
            made,
            Err(ConfigError::NonRoot(NonRootError::ImageRunsAsRoot { .. }))
        ));
    }
}
