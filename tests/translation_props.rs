//! Property test of the translation from a Pod to CRI configs: generated PodSpecs (odd
//! names, images, commands with `$(VAR)` references, env from every source, ports, volume
//! mounts with subPaths, security contexts, resources with odd quantities, probes,
//! lifecycle hooks, DNS config, sysctls) go through admission's pure checks,
//! `sandbox_config`, `environment` and `container_config`, and probes' and hooks' HTTP
//! targets. None of it may panic, and
//! what the kubelet always writes holds: the sandbox and container labels carry the pod's
//! identity and the container's name, the log path is `<name>/<attempt>.log`, each
//! hostPort is one port mapping, the OOM score stays in the kernel's range. Hermetic: no
//! root, no cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapEnvSource, ConfigMapKeySelector, Container, ContainerPort,
    EnvFromSource, EnvVar, EnvVarSource, ExecAction, HTTPGetAction, Lifecycle, LifecycleHandler,
    Node, NodeStatus, ObjectFieldSelector, Pod, PodDNSConfig, PodDNSConfigOption,
    PodSecurityContext, PodSpec, Probe, ResourceFieldSelector, ResourceRequirements,
    SeccompProfile, SecretKeySelector, SecurityContext, Sysctl, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use rkubelet::cm::{QosContainers, cgroup_parent, resource_config_for_pod};
use rkubelet::dns::{Configurer, HostDns};
use rkubelet::kuberuntime::container::{container_config, container_hash};
use rkubelet::kuberuntime::context::{ContainerContext, EnvSources};
use rkubelet::kuberuntime::env::environment;
use rkubelet::kuberuntime::labels;
use rkubelet::kuberuntime::sandbox::{SandboxSettings, sandbox_config};
use rkubelet::kuberuntime::security_context::{ImageUser, verify_run_as_non_root};
use rkubelet::lifecycle::admission::{SysctlWhitelist, admit_pod};
use rkubelet::node::Pressure;
use rkubelet::pod::PodId;
use rkubelet::probe::http::Target;
use rkubelet::probe::resolve_port;
use rkubelet::resources::qos_class;

/// Names as the API allows them and beyond: DNS labels, long ones, odd characters.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,14}",
        "[a-z]{63}",
        "[a-zA-Z0-9._/$(){}: -]{0,20}",
        "\\PC{0,12}",
    ]
}

/// Image references, valid and not: tags, digests, registries with ports, garbage.
fn image() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("busybox".to_owned()),
        "[a-z0-9]{1,8}(/[a-z0-9]{1,8}){0,2}(:[a-zA-Z0-9_.-]{1,8})?",
        "localhost:[0-9]{1,6}/[a-z]{1,6}@sha256:[0-9a-f]{0,64}",
        "[A-Z:@/ ]{0,10}",
        "\\PC{0,16}",
    ]
}

/// Strings that may hold `$(VAR)`, `$$`, unclosed and nested references.
fn expandable() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,8}",
        "\\$\\([A-Z_]{0,6}\\)[a-z]{0,3}",
        "[$()A-Z]{0,12}",
        "\\$\\(\\$\\([A-Z]{1,3}\\)\\)",
        "\\PC{0,10}",
    ]
}

/// Quantities as the API accepts them and odd ones it would not.
fn quantity() -> impl Strategy<Value = Quantity> {
    prop_oneof![
        "[0-9]{1,4}(m|Ki|Mi|Gi|k|M|G|T|P|E|Ei)?",
        "[0-9]{1,3}\\.[0-9]{1,9}",
        "[0-9]{1,2}[eE][0-9]{1,2}",
        "-[0-9]{1,3}",
        "[0-9]{19,25}(Ei|E)?",
        "\\PC{0,6}",
    ]
    .prop_map(Quantity)
}

fn resource_list() -> impl Strategy<Value = BTreeMap<String, Quantity>> {
    prop::collection::btree_map(
        prop_oneof![
            Just("cpu".to_owned()),
            Just("memory".to_owned()),
            Just("ephemeral-storage".to_owned()),
            Just("hugepages-2Mi".to_owned()),
        ],
        quantity(),
        0..3,
    )
}

fn resources() -> impl Strategy<Value = Option<ResourceRequirements>> {
    prop::option::of(
        (resource_list(), resource_list()).prop_map(|(limits, requests)| ResourceRequirements {
            limits: Some(limits),
            requests: Some(requests),
            ..Default::default()
        }),
    )
}

fn env_var() -> impl Strategy<Value = EnvVar> {
    let source = prop_oneof![
        Just(None),
        prop_oneof![
            Just("metadata.name"),
            Just("metadata.namespace"),
            Just("metadata.uid"),
            Just("metadata.labels['a']"),
            Just("metadata.annotations['b']"),
            Just("status.podIP"),
            Just("status.podIPs"),
            Just("status.hostIP"),
            Just("spec.nodeName"),
            Just("spec.serviceAccountName"),
            Just("nonsense"),
        ]
        .prop_map(|path| Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }),
            ..Default::default()
        })),
        (
            prop_oneof![
                Just("limits.cpu"),
                Just("requests.memory"),
                Just("limits.ephemeral-storage"),
                Just("bogus")
            ],
            prop::option::of(quantity()),
            prop::option::of(name()),
        )
            .prop_map(|(resource, divisor, container)| Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    container_name: container,
                    divisor,
                    resource: resource.into(),
                }),
                ..Default::default()
            })),
        (name(), name(), any::<Option<bool>>()).prop_map(|(n, key, optional)| {
            Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: n,
                    key,
                    optional,
                }),
                ..Default::default()
            })
        }),
        (name(), name(), any::<Option<bool>>()).prop_map(|(n, key, optional)| {
            Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: n,
                    key,
                    optional,
                }),
                ..Default::default()
            })
        }),
    ];
    (
        "[A-Z_]{1,4}|\\PC{0,5}",
        prop::option::of(expandable()),
        source,
    )
        .prop_map(|(name, value, value_from)| EnvVar {
            name,
            value,
            value_from,
        })
}

fn handler() -> impl Strategy<Value = LifecycleHandler> {
    prop_oneof![
        prop::collection::vec(expandable(), 0..3).prop_map(|command| LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(command)
            }),
            ..Default::default()
        }),
        (
            prop_oneof![
                any::<i32>().prop_map(IntOrString::Int),
                "[a-z0-9-]{0,6}|\\PC{0,4}".prop_map(IntOrString::String)
            ],
            "\\PC{0,8}",
            prop::option::of("[a-z0-9.:\\[\\]]{0,12}|\\PC{0,4}"),
        )
            .prop_map(|(port, path, host)| LifecycleHandler {
                http_get: Some(HTTPGetAction {
                    port,
                    path: Some(path),
                    host,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        Just(LifecycleHandler::default()),
    ]
}

fn probe() -> impl Strategy<Value = Option<Probe>> {
    prop::option::of(
        (handler(), any::<Option<i32>>(), any::<Option<i32>>()).prop_map(|(h, period, timeout)| {
            Probe {
                exec: h.exec,
                http_get: h.http_get,
                period_seconds: period,
                timeout_seconds: timeout,
                ..Default::default()
            }
        }),
    )
}

fn security_context() -> impl Strategy<Value = Option<SecurityContext>> {
    prop::option::of(
        (
            any::<Option<i64>>(),
            any::<Option<i64>>(),
            any::<Option<bool>>(),
            any::<(Option<bool>, Option<bool>, Option<bool>)>(),
            prop::option::of(prop::collection::vec("[A-Z_]{0,12}|\\PC{0,5}", 0..3)),
            prop::option::of(prop_oneof![
                Just("RuntimeDefault"),
                Just("Unconfined"),
                Just("Localhost"),
                Just("Bogus")
            ]),
            prop::option::of(prop_oneof![
                Just("Default".to_owned()),
                Just("Unmasked".to_owned()),
                "\\PC{0,4}"
            ]),
        )
            .prop_map(
                |(
                    user,
                    group,
                    non_root,
                    (privileged, read_only, escalation),
                    add,
                    seccomp,
                    proc_mount,
                )| {
                    SecurityContext {
                        run_as_user: user,
                        run_as_group: group,
                        run_as_non_root: non_root,
                        privileged,
                        read_only_root_filesystem: read_only,
                        allow_privilege_escalation: escalation,
                        capabilities: add.map(|add| Capabilities {
                            add: Some(add.clone()),
                            drop: Some(add),
                        }),
                        seccomp_profile: seccomp.map(|t| SeccompProfile {
                            type_: t.into(),
                            localhost_profile: Some("../../etc/passwd".into()),
                        }),
                        proc_mount,
                        ..Default::default()
                    }
                },
            ),
    )
}

fn container() -> impl Strategy<Value = Container> {
    let ports = prop::collection::vec(
        (
            any::<i32>(),
            prop::option::of(any::<i32>()),
            prop::option::of(prop_oneof![
                Just("TCP"),
                Just("UDP"),
                Just("SCTP"),
                Just("x")
            ]),
            prop::option::of("[0-9.:a-f]{0,15}"),
        )
            .prop_map(
                |(container_port, host_port, protocol, host_ip)| ContainerPort {
                    container_port,
                    host_port,
                    protocol: protocol.map(str::to_owned),
                    host_ip,
                    ..Default::default()
                },
            ),
        0..3,
    );
    let mounts = prop::collection::vec(
        (
            name(),
            "/[a-z/.]{0,10}|\\PC{0,6}",
            prop::option::of("(\\.\\./)?[a-z/.]{0,10}|\\PC{0,6}"),
            prop::option::of(expandable()),
            any::<Option<bool>>(),
        )
            .prop_map(
                |(name, path, sub_path, sub_path_expr, read_only)| VolumeMount {
                    name,
                    mount_path: path,
                    sub_path,
                    sub_path_expr,
                    read_only,
                    ..Default::default()
                },
            ),
        0..3,
    );
    let env_from = prop::collection::vec(
        (
            name(),
            prop::option::of("[A-Z_]{0,3}|\\PC{0,3}"),
            any::<Option<bool>>(),
        )
            .prop_map(|(n, prefix, optional)| EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource { name: n, optional }),
                prefix,
                ..Default::default()
            }),
        0..2,
    );
    (
        (
            name(),
            image(),
            prop::option::of(prop::collection::vec(expandable(), 0..4)),
        ),
        (
            prop::option::of(prop::collection::vec(expandable(), 0..4)),
            prop::collection::vec(env_var(), 0..5),
            env_from,
        ),
        (ports, mounts, security_context(), resources()),
        (probe(), probe(), prop::option::of((handler(), handler()))),
        (
            prop::option::of("\\PC{0,8}"),
            prop::option::of("\\PC{0,8}"),
            prop::option::of(prop_oneof![Just("Always"), Just("Never"), Just("?")]),
        ),
    )
        .prop_map(
            |(
                (name, image, command),
                (args, env, env_from),
                (ports, mounts, security_context, resources),
                (liveness, readiness, hooks),
                (working_dir, termination_path, pull),
            )| Container {
                name,
                image: Some(image),
                command,
                args,
                env: Some(env),
                env_from: Some(env_from),
                ports: Some(ports),
                volume_mounts: Some(mounts),
                security_context,
                resources,
                liveness_probe: liveness,
                readiness_probe: readiness,
                lifecycle: hooks.map(|(post_start, pre_stop)| Lifecycle {
                    post_start: Some(post_start),
                    pre_stop: Some(pre_stop),
                    ..Default::default()
                }),
                working_dir,
                termination_message_path: termination_path,
                image_pull_policy: pull.map(str::to_owned),
                ..Default::default()
            },
        )
}

fn dns_config() -> impl Strategy<Value = Option<PodDNSConfig>> {
    prop::option::of(
        (
            prop::collection::vec("[0-9.:a-f]{0,16}|\\PC{0,5}", 0..4),
            prop::collection::vec("[a-z.]{0,30}|\\PC{0,8}", 0..8),
            prop::collection::vec(("[a-z:]{0,8}", prop::option::of("\\PC{0,4}")), 0..3),
        )
            .prop_map(|(nameservers, searches, options)| PodDNSConfig {
                nameservers: Some(nameservers),
                searches: Some(searches),
                options: Some(
                    options
                        .into_iter()
                        .map(|(name, value)| PodDNSConfigOption {
                            name: Some(name),
                            value,
                        })
                        .collect(),
                ),
            }),
    )
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        (
            name(),
            "[a-f0-9-]{1,36}",
            prop::option::of("[a-z]{1,8}"),
            prop::collection::btree_map("[a-z./]{1,10}", "\\PC{0,10}", 0..3),
        ),
        (
            prop::collection::vec(container(), 1..3),
            prop::collection::vec(container(), 0..2),
        ),
        (
            prop::option::of(prop_oneof![
                Just("ClusterFirst"),
                Just("Default"),
                Just("None"),
                Just("ClusterFirstWithHostNet"),
                Just("x")
            ]),
            dns_config(),
            prop::option::of(name()),
            prop::option::of(name()),
            any::<(Option<bool>, Option<bool>, Option<bool>, Option<bool>)>(),
        ),
        (
            prop::collection::vec(("[a-z._/*]{0,16}|\\PC{0,5}", "\\PC{0,5}"), 0..3),
            any::<(Option<i64>, Option<i64>, Option<bool>)>(),
            any::<Option<i64>>(),
        ),
    )
        .prop_map(
            |(
                (name, uid, namespace, annotations),
                (containers, init_containers),
                (dns_policy, dns_config, hostname, subdomain, (host_net, host_pid, host_ipc, fqdn)),
                (sysctls, (user, group, non_root), grace),
            )| Pod {
                metadata: ObjectMeta {
                    name: Some(name),
                    uid: Some(uid),
                    namespace,
                    labels: Some(BTreeMap::from([("app".into(), "x".into())])),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers,
                    init_containers: Some(init_containers),
                    dns_policy: dns_policy.map(str::to_owned),
                    dns_config,
                    hostname,
                    subdomain,
                    host_network: host_net,
                    host_pid,
                    host_ipc,
                    set_hostname_as_fqdn: fqdn,
                    termination_grace_period_seconds: grace,
                    security_context: Some(PodSecurityContext {
                        sysctls: Some(
                            sysctls
                                .into_iter()
                                .map(|(name, value)| Sysctl { name, value })
                                .collect(),
                        ),
                        run_as_user: user,
                        run_as_group: group,
                        run_as_non_root: non_root,
                        ..Default::default()
                    }),
                    node_name: Some("rk-node1".into()),
                    ..Default::default()
                }),
                status: None,
            },
        )
}

fn settings() -> SandboxSettings {
    SandboxSettings {
        dns: Configurer {
            cluster_dns: vec!["10.96.0.10".parse().expect("an IP")],
            cluster_domain: "cluster.local".into(),
            host: Some(HostDns::parse(
                "nameserver 127.0.0.53\nsearch a.test b.test\n",
            )),
            node_ips: vec!["198.18.0.1".parse().expect("an IP")],
        },
        pod_logs_dir: "/var/log/pods".into(),
        qos_containers: Some(QosContainers::under("/")),
    }
}

/// A node with some capacity, for the admission predicates.
fn node() -> Node {
    let quantities = BTreeMap::from([
        ("cpu".to_owned(), Quantity("2".into())),
        ("memory".to_owned(), Quantity("4Gi".into())),
        ("pods".to_owned(), Quantity("110".into())),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some("rk-node1".into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            allocatable: Some(quantities.clone()),
            capacity: Some(quantities),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Env sources where one ConfigMap exists (`cm`), one is missing and one failed to read.
fn sources() -> Arc<EnvSources> {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "cm" },
        "data": { "A": "1", "1bad": "x", "$(A)": "y", "": "z" }
    }))
    .expect("a ConfigMap");
    let mut sources = EnvSources::default();
    sources
        .config_maps
        .insert("cm".into(), Ok(Some(Arc::new(cm))));
    sources.config_maps.insert("gone".into(), Ok(None));
    sources.config_maps.insert("err".into(), Err("boom".into()));
    sources.secrets.insert("gone".into(), Ok(None));
    sources.allocatable = node()
        .status
        .and_then(|s| s.allocatable)
        .unwrap_or_default();
    sources.services = Ok(BTreeMap::from([("SVC_HOST".into(), "10.0.0.1".into())]));
    Arc::new(sources)
}

fn check(pod: &Pod, restart_count: u32, image_user: ImageUser) -> Result<(), TestCaseError> {
    let id = PodId::of(pod).expect("uid and name");
    let spec = pod.spec.as_ref().expect("a spec");
    let whitelist = SysctlWhitelist::new(&["kernel.msg*".into()]).expect("a whitelist");
    let _ = admit_pod(pod, &[pod], &node(), &whitelist, Pressure::default());
    let _ = resource_config_for_pod(spec);
    let _ = qos_class(spec);
    let _ = cgroup_parent(Some(&QosContainers::under("/")), pod);
    if let Ok(config) = sandbox_config(pod, &id, restart_count, &settings()) {
        prop_assert_eq!(&config.labels[labels::POD_UID], &id.uid);
        prop_assert_eq!(&config.labels[labels::POD_NAME], &id.name);
        prop_assert_eq!(&config.labels[labels::POD_NAMESPACE], &id.namespace);
        prop_assert_eq!(config.labels.get("app").map(String::as_str), Some("x"));
        let meta = config.metadata.expect("metadata");
        prop_assert_eq!((meta.uid, meta.attempt), (id.uid.clone(), restart_count));
        let host_ports = spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.unwrap_or(0) != 0)
            .count();
        prop_assert_eq!(config.port_mappings.len(), host_ports);
        let suffix = format!("_{}", id.uid);
        prop_assert!(config.log_directory.ends_with(&suffix));
        if spec.host_network == Some(true) {
            prop_assert_eq!(config.hostname, "");
        }
    }
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for container in all {
        let _ = container_hash(container);
        let _ = rkubelet::image_reference::validate(container.image.as_deref().unwrap_or_default());
        let hooks = container
            .lifecycle
            .iter()
            .flat_map(|l| [&l.post_start, &l.pre_stop]);
        let gets = [&container.liveness_probe, &container.readiness_probe]
            .into_iter()
            .flatten()
            .filter_map(|p| p.http_get.as_ref())
            .chain(hooks.flatten().filter_map(|h| h.http_get.as_ref()));
        for get in gets {
            if let Ok(port) = resolve_port(&get.port, container) {
                prop_assert!(port > 0);
                let url = Target::of_action(get, port, "10.244.0.9").url();
                prop_assert!(url.starts_with("http"), "{}", url);
            }
        }
        let _ = verify_run_as_non_root(pod, container, &image_user);
        let ctx = ContainerContext {
            pod_ips: vec!["10.244.0.9".parse().expect("an IP")],
            host_ip: Some("198.18.0.1".parse().expect("an IP")),
            node_name: "rk-node1".into(),
            restart_count,
            image_ref: container.image.clone().unwrap_or_default(),
            sources: sources(),
            image_user: image_user.clone(),
            seccomp_profile_root: "/var/lib/rkubelet/seccomp".into(),
            memory_capacity: 4 << 30,
            ..Default::default()
        };
        let Ok(env) = environment(pod, container, &ctx) else {
            continue;
        };
        let Ok(config) = container_config(pod, &id, container, &ctx, env.vars) else {
            continue;
        };
        prop_assert_eq!(&config.labels[labels::POD_UID], &id.uid);
        prop_assert_eq!(&config.labels[labels::CONTAINER_NAME], &container.name);
        let meta = config.metadata.expect("metadata");
        prop_assert_eq!(&meta.name, &container.name);
        prop_assert_eq!(meta.attempt, restart_count);
        // For names the API accepts (DNS labels): `<name>/<attempt>.log`.
        if !container.name.is_empty()
            && container
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            prop_assert_eq!(
                config.log_path,
                format!("{}/{restart_count}.log", container.name)
            );
        }
        prop_assert_eq!(
            &config.annotations[labels::CONTAINER_RESTART_COUNT],
            &restart_count.to_string()
        );
        let resources = config.linux.and_then(|l| l.resources).expect("resources");
        prop_assert!((-1000..=1000).contains(&resources.oom_score_adj));
        prop_assert!(resources.cpu_shares >= 2, "{}", resources.cpu_shares);
        prop_assert!(resources.memory_limit_in_bytes >= 0);
        // Without a reference, the command reaches the runtime as written.
        let plain = |list: &Option<Vec<String>>| list.iter().flatten().all(|s| !s.contains('$'));
        if plain(&container.command) {
            prop_assert_eq!(
                &config.command,
                &container.command.clone().unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn image_user() -> impl Strategy<Value = ImageUser> {
    prop_oneof![
        Just(ImageUser::default()),
        any::<i64>().prop_map(|uid| ImageUser {
            uid: Some(uid),
            username: String::new(),
        }),
        "\\PC{0,8}".prop_map(|username| ImageUser {
            uid: None,
            username,
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_pods_translate_to_cri_configs_without_panicking(
        pod in pod(),
        restart_count in 0_u32..5,
        user in image_user(),
    ) {
        check(&pod, restart_count, user)?;
    }
}
