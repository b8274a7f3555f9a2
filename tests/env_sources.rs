//! Environment sources end to end, against the local cluster, as the kubelet makes a
//! container's environment: configMapKeyRef and secretKeyRef (with `optional`),
//! resourceFieldRef (divisors, unset limits as the node's allocatable), envFrom with a
//! prefix and invalid keys skipped (`InvalidEnvironmentVariableNames`), `$(VAR)`
//! expansion, the service variables (`enableServiceLinks`), and a missing source as
//! `CreateContainerConfigError` until it appears. Also: a changed ConfigMap reaches a
//! running pod's volume without a restart, while immutable ConfigMaps and Secrets keep
//! the values the pod started with; and `workingDir` is the processes' directory. What
//! the container sees is read with `kubectl exec`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::case::{Case, get, running};
use common::pods::events_of;
use common::{eventually, kube_client, kubectl, unique};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, PostParams};
use serde_json::json;

/// The objects a test made in `default`, deleted when dropped.
struct Objects {
    names: Vec<(&'static str, String)>,
}

impl Objects {
    async fn create(&mut self, kind: &'static str, manifest: serde_json::Value) {
        let client = kube_client("admin.kubeconfig").await;
        let name = manifest["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_owned();
        let pp = PostParams::default();
        match kind {
            "configmap" => {
                let api: Api<ConfigMap> = Api::namespaced(client, "default");
                api.create(&pp, &serde_json::from_value(manifest).expect("cm"))
                    .await
                    .expect("create configmap");
            }
            "secret" => {
                let api: Api<Secret> = Api::namespaced(client, "default");
                api.create(&pp, &serde_json::from_value(manifest).expect("secret"))
                    .await
                    .expect("create secret");
            }
            _ => {
                let api: Api<Service> = Api::namespaced(client, "default");
                api.create(&pp, &serde_json::from_value(manifest).expect("svc"))
                    .await
                    .expect("create service");
            }
        }
        self.names.push((kind, name));
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.names);
        common::cleanup_blocking(move || async move {
            for (kind, name) in names {
                kubectl(&["delete", kind, &name, "--ignore-not-found", "--wait=false"]).await;
            }
        });
    }
}

/// The environment of the pod's container `c`, as `env` prints it there.
async fn env_of(name: &str) -> BTreeMap<String, String> {
    let out = kubectl(&["exec", name, "-c", "c", "--", "env"]).await;
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

async fn cluster_ip(name: &str) -> String {
    kubectl(&["get", "service", name, "-o", "jsonpath={.spec.clusterIP}"]).await
}

fn sleeper(container: serde_json::Value) -> serde_json::Value {
    let mut c = json!({"name": "c", "image": "busybox", "command": ["sleep", "3600"]});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), container.as_object()) {
        c.extend(extra.clone());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [c]},
    })
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn env_comes_from_config_maps_secrets_resources_and_services() {
    let case = Case::with_agent("env", &[]).await;
    let base = unique("env-src");
    let mut objects = Objects { names: Vec::new() };
    objects
        .create(
            "configmap",
            json!({"metadata": {"name": base}, "data": {"color": "blue", "1st": "x", "size": "L"}}),
        )
        .await;
    objects
        .create(
            "secret",
            json!({"metadata": {"name": base}, "stringData": {"password": "hunter2", "user": "admin"}}),
        )
        .await;
    let service = format!("{base}-web");
    objects
        .create(
            "service",
            json!({"metadata": {"name": service}, "spec": {"ports": [
                {"name": "http", "port": 80, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"}
            ]}}),
        )
        .await;
    let container = json!({
        "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m", "memory": "32Mi"}},
        "envFrom": [
            {"configMapRef": {"name": base}},
            {"secretRef": {"name": base}, "prefix": "S_"},
            {"configMapRef": {"name": "nowhere", "optional": true}}
        ],
        "env": [
            {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": base, "key": "color"}}},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": base, "key": "password"}}},
            {"name": "OPTIONAL", "valueFrom": {"secretKeyRef": {"name": base, "key": "nope", "optional": true}}},
            {"name": "GREETING", "value": "$(COLOR)-$(S_user)-$(size)-$(UNDEFINED)"},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "MEM_REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
            {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "size", "value": "overridden"}
        ]
    });
    let linked = case.create("linked", sleeper(container.clone())).await;
    let mut unlinked_pod = sleeper(container);
    unlinked_pod["spec"]["enableServiceLinks"] = json!(false);
    let unlinked = case.create("unlinked", unlinked_pod).await;
    running(&linked).await;
    running(&unlinked).await;

    let env = env_of(&linked).await;
    let want = |k: &str| env.get(k).map(String::as_str);
    assert_eq!(want("COLOR"), Some("blue"));
    assert_eq!(want("PASSWORD"), Some("hunter2"));
    assert_eq!(want("S_password"), Some("hunter2"));
    assert_eq!(want("OPTIONAL"), None);
    assert_eq!(want("color"), Some("blue"), "envFrom without prefix");
    assert_eq!(want("1st"), None, "an invalid name is skipped");
    assert_eq!(want("size"), Some("overridden"), "env overrides envFrom");
    assert_eq!(
        want("GREETING"),
        Some("blue-admin-L-$(UNDEFINED)"),
        "expansion sees what came before"
    );
    assert_eq!(want("MEM_MI"), Some("64"));
    assert_eq!(want("MEM_REQ"), Some("33554432"));
    assert_eq!(want("CPU_M"), Some("250"));
    // No cpu limit: the node's allocatable, in whole cores rounded up.
    let allocatable = kubectl(&[
        "get",
        "node",
        &common::node_name(),
        "-o",
        "jsonpath={.status.allocatable.cpu}",
    ])
    .await;
    assert_eq!(want("CPU_LIMIT"), Some(allocatable.as_str()));

    let kubernetes_ip = cluster_ip("kubernetes").await;
    let web_ip = cluster_ip(&service).await;
    let prefix = service.to_uppercase().replace('-', "_");
    assert_eq!(
        want("KUBERNETES_SERVICE_HOST"),
        Some(kubernetes_ip.as_str())
    );
    assert_eq!(want("KUBERNETES_SERVICE_PORT"), Some("443"));
    assert_eq!(env.get(&format!("{prefix}_SERVICE_HOST")), Some(&web_ip));
    assert_eq!(
        env.get(&format!("{prefix}_SERVICE_PORT_DNS"))
            .map(String::as_str),
        Some("53")
    );
    assert_eq!(
        env.get(&format!("{prefix}_PORT_53_UDP")),
        Some(&format!("udp://{web_ip}:53"))
    );
    assert_eq!(
        env.get(&format!("{prefix}_PORT")),
        Some(&format!("tcp://{web_ip}:80"))
    );

    // Without service links only the master service is seen.
    let env = env_of(&unlinked).await;
    assert_eq!(env.get("KUBERNETES_SERVICE_HOST"), Some(&kubernetes_ip));
    assert!(!env.contains_key(&format!("{prefix}_SERVICE_HOST")));

    let events = events_of(&linked).await;
    let skipped = format!(
        "Keys [1st] from the EnvFrom configMap default/{base} were skipped since they are considered invalid environment variable names."
    );
    assert!(
        events.iter().any(
            |e| e.reason.as_deref() == Some("InvalidEnvironmentVariableNames")
                && e.message.as_deref() == Some(skipped.as_str())
        ),
        "{events:?}"
    );
}

/// The message of the pod's container `c` once it waits with
/// `CreateContainerConfigError` and a message that `accept` takes.
async fn config_error(name: &str, accept: impl Fn(&str) -> bool) -> String {
    eventually(
        &format!("{name} in CreateContainerConfigError"),
        Duration::from_secs(60),
        || async {
            let pod = get(name).await?;
            let state = pod.status?.container_statuses?.into_iter().next()?.state?;
            let waiting = state.waiting?;
            let message = waiting.message.unwrap_or_default();
            (waiting.reason.as_deref() == Some("CreateContainerConfigError") && accept(&message))
                .then_some(message)
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_missing_source_is_a_config_error_until_it_appears() {
    let case = Case::with_agent("env-missing", &[]).await;
    let base = unique("env-missing");
    let mut objects = Objects { names: Vec::new() };
    let from_secret = case
        .create(
            "secret",
            sleeper(json!({"env": [
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": base, "key": "k"}}}
            ]})),
        )
        .await;
    let from_key = case
        .create(
            "key",
            sleeper(json!({"envFrom": [{"configMapRef": {"name": base}}], "env": [
                {"name": "Y", "valueFrom": {"configMapKeyRef": {"name": base, "key": "missing"}}}
            ]})),
        )
        .await;
    assert_eq!(
        config_error(&from_secret, |_| true).await,
        format!("secret {base:?} not found")
    );
    assert_eq!(
        config_error(&from_key, |_| true).await,
        format!("configmap {base:?} not found")
    );
    let events = events_of(&from_secret).await;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("Failed")
            && e.message.as_deref() == Some(&format!("Error: secret {base:?} not found"))),
        "{events:?}"
    );

    // The ConfigMap appears without the key: the kubelet's message for a missing key.
    objects
        .create(
            "configmap",
            json!({"metadata": {"name": base}, "data": {"other": "v"}}),
        )
        .await;
    let message = format!("couldn't find key missing in ConfigMap default/{base}");
    config_error(&from_key, |m| m == message).await;

    // The Secret appears: the container starts on a later try, with the value.
    objects
        .create(
            "secret",
            json!({"metadata": {"name": base}, "stringData": {"k": "found"}}),
        )
        .await;
    running(&from_secret).await;
    assert_eq!(
        env_of(&from_secret).await.get("X").map(String::as_str),
        Some("found")
    );
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_changed_config_map_reaches_the_volume_without_a_restart() {
    let case = Case::with_agent("env-cm-update", &[]).await;
    let base = unique("cm-update");
    let mut objects = Objects { names: Vec::new() };
    objects
        .create(
            "configmap",
            json!({"metadata": {"name": base}, "data": {"greeting": "one"}}),
        )
        .await;
    let mut pod = sleeper(json!({"volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}));
    pod["spec"]["volumes"] = json!([{"name": "cfg", "configMap": {"name": base}}]);
    let name = case.create("pod", pod).await;
    running(&name).await;
    let read =
        || async { kubectl(&["exec", &name, "-c", "c", "--", "cat", "/cfg/greeting"]).await };
    assert_eq!(read().await, "one");

    let cms: Api<ConfigMap> = Api::namespaced(kube_client("admin.kubeconfig").await, "default");
    let patch = json!({"data": {"greeting": "two"}});
    cms.patch(
        &base,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .expect("patch");
    // The watch wakes the pod: well within the kubelet's sync period (60 s).
    let started = std::time::Instant::now();
    eventually(
        "the new value in the file",
        Duration::from_secs(20),
        || async { (read().await == "two").then_some(()) },
    )
    .await;
    let took = started.elapsed();
    let pod = get(&name).await.expect("pod");
    let restarts = pod
        .status
        .and_then(|s| s.container_statuses)
        .map(|s| s[0].restart_count);
    assert_eq!(restarts, Some(0), "updated in place, no restart");
    eprintln!("configMap update reached the file in {took:?}");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_working_dir_the_image_lacks_is_made_and_is_the_processes_cwd() {
    let case = Case::with_agent("env-workdir", &[]).await;
    let name = case
        .create("pod", sleeper(json!({"workingDir": "/srv/rk/app"})))
        .await;
    running(&name).await;
    // The container's own process (PID 1), and one started in it by exec.
    let init = kubectl(&["exec", &name, "-c", "c", "--", "readlink", "/proc/1/cwd"]).await;
    assert_eq!(init.trim_end(), "/srv/rk/app");
    let exec = kubectl(&["exec", &name, "-c", "c", "--", "pwd"]).await;
    assert_eq!(exec.trim_end(), "/srv/rk/app");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn immutable_config_maps_and_secrets_keep_the_values_the_pod_started_with() {
    let case = Case::with_agent("env-immutable", &[]).await;
    let base = unique("immutable");
    let (frozen_cm, frozen_secret, live_cm) = (
        format!("{base}-cm"),
        format!("{base}-secret"),
        format!("{base}-live"),
    );
    let mut objects = Objects { names: Vec::new() };
    let config_map = |name: &str, value: &str, immutable: bool| json!({"metadata": {"name": name}, "data": {"v": value}, "immutable": immutable});
    let secret = |value: &str| json!({"metadata": {"name": frozen_secret}, "stringData": {"v": value}, "immutable": true});
    objects
        .create("configmap", config_map(&frozen_cm, "one", true))
        .await;
    objects.create("secret", secret("one")).await;
    objects
        .create("configmap", config_map(&live_cm, "one", false))
        .await;
    let mounts = json!([
        {"name": "frozen-cm", "mountPath": "/frozen-cm"},
        {"name": "frozen-secret", "mountPath": "/frozen-secret"},
        {"name": "live", "mountPath": "/live"},
    ]);
    let mut pod = sleeper(json!({"volumeMounts": mounts}));
    pod["spec"]["volumes"] = json!([
        {"name": "frozen-cm", "configMap": {"name": frozen_cm}},
        {"name": "frozen-secret", "secret": {"secretName": frozen_secret}},
        {"name": "live", "configMap": {"name": live_cm}},
    ]);
    let name = case.create("pod", pod).await;
    running(&name).await;
    let read = |path: &'static str| {
        let name = name.clone();
        async move { kubectl(&["exec", &name, "-c", "c", "--", "cat", path]).await }
    };
    for path in ["/frozen-cm/v", "/frozen-secret/v", "/live/v"] {
        assert_eq!(read(path).await, "one", "{path}");
    }

    // An immutable object cannot change: it can only be replaced, by delete and create.
    // The kubelet stops watching it once read, so the pod keeps what it started with.
    let client = kube_client("admin.kubeconfig").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let dp = kube::api::DeleteParams::default();
    let pp = PostParams::default();
    cms.delete(&frozen_cm, &dp).await.expect("delete configmap");
    secrets
        .delete(&frozen_secret, &dp)
        .await
        .expect("delete secret");
    let replaced: ConfigMap =
        serde_json::from_value(config_map(&frozen_cm, "two", true)).expect("cm");
    cms.create(&pp, &replaced).await.expect("create configmap");
    let replaced: Secret = serde_json::from_value(secret("two")).expect("secret");
    secrets.create(&pp, &replaced).await.expect("create secret");
    // Then a change to the watched object: once it reaches the pod, its volumes were
    // rewritten after the replacements, from what the agent knows of each object.
    cms.patch(
        &live_cm,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&json!({"data": {"v": "two"}})),
    )
    .await
    .expect("patch");
    eventually(
        "the watched object's change in its volume",
        Duration::from_secs(20),
        || async { (read("/live/v").await == "two").then_some(()) },
    )
    .await;
    // And a while after (a change reaches a watched object's volume in about 0.25 s).
    for _ in 0..4 {
        for path in ["/frozen-cm/v", "/frozen-secret/v"] {
            assert_eq!(read(path).await, "one", "{path} after its replacement");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
