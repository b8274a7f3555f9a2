//! Bad input, table-driven: Pod specs the v1.20 API server accepts but a kubelet must
//! refuse or handle (admission rejections, images that are absent or do not parse,
//! missing env and volume sources, hostPath types that do not match, subPath escapes,
//! impossible resources, very long names, huge env and annotations, conflicting host
//! ports, runtime classes, commands that cannot run, failing processes (exit codes), bad
//! probes and hooks, root images under runAsNonRoot, read-only root file systems). Each
//! row states the kubelet v1.20's outcome: the pod's phase, the container's waiting or
//! terminated reason and message (or the pod's reason and message when admission rejects
//! it) and the event. The rows run in one batch on one agent, with a healthy control pod
//! created after them that must be Ready in normal time; after them the agent is still
//! alive with no panic in its log, every pod is deleted, and the leak check finds nothing
//! left.
//!
//! A container that keeps failing backs off as the kubelet's does: the wait counted from
//! each exit, its length named in the waiting message, and started over for a new image.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::case::{Case, get, running};
use common::pods::{event_with_reason, events_of, pods_api};
use common::{TestRuntimeClass, eventually, kube_client, node_name};
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStatus, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rkubelet::resources::Quantity;
use serde_json::{Value, json};

/// What runc says of a command that does not exist (`/rk-no-such-binary`).
const NO_BINARY: &str =
    "exec: \"/rk-no-such-binary\": stat /rk-no-such-binary: no such file or directory";
/// How long a row may take to reach its outcome.
const ROW_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the control pod, created after the batch, may take to be Ready.
const CONTROL_READY: Duration = Duration::from_secs(45);
/// Where the dangling-symlink row points: nothing may ever be created there.
const ESCAPE_TARGET: &str = "/rk-bad-input-escape";

/// A message as the kubelet writes it; `{name}`, `{uid}` and `{ip}` stand for the pod's.
#[derive(Debug, Clone)]
enum Text {
    /// Exactly this.
    Is(String),
    /// Starts with the first and holds the second: the kubelet's frame around a text the
    /// runtime (containerd, runc) writes.
    Frames(String, String),
}

impl Text {
    fn matches(&self, pod: &Pod, got: &str) -> bool {
        match self {
            Self::Is(want) => got == fill(want, pod),
            Self::Frames(start, inner) => {
                got.starts_with(&fill(start, pod)) && got.contains(&fill(inner, pod))
            }
        }
    }
}

fn is(text: impl Into<String>) -> Text {
    Text::Is(text.into())
}

fn frames(start: impl Into<String>, inner: impl Into<String>) -> Text {
    Text::Frames(start.into(), inner.into())
}

/// `text` with the pod's name, UID and IP in place of `{name}`, `{uid}` and `{ip}`.
fn fill(text: &str, pod: &Pod) -> String {
    let status = pod.status.as_ref();
    text.replace("{name}", pod.metadata.name.as_deref().unwrap_or_default())
        .replace("{uid}", pod.metadata.uid.as_deref().unwrap_or_default())
        .replace(
            "{ip}",
            status.and_then(|s| s.pod_ip.as_deref()).unwrap_or("?"),
        )
}

/// The outcome the kubelet v1.20 gives a row's pod.
#[derive(Debug, Clone)]
enum Want {
    /// Admission refuses it: Failed, the reason, `Pod <message>`, and a Warning event of
    /// that reason and message.
    Rejected(&'static str, String),
    /// The pod is in `phase` (Pending, or Running once a container ran); the container
    /// waits with this reason and message.
    Waiting {
        phase: &'static str,
        container: &'static str,
        reason: &'static str,
        message: Text,
    },
    /// Pending; its containers wait in `ContainerCreating` (volumes or sandbox failed).
    Creating,
    /// Failed (restartPolicy Never): the container ended with this reason, exit code and
    /// message.
    Terminated {
        container: &'static str,
        reason: &'static str,
        exit_code: i32,
        message: Text,
    },
    /// Running, Ready or not.
    Running { ready: bool },
}

/// One row: a pod, its outcome and the event the kubelet records about it.
struct Row {
    suffix: &'static str,
    pod: Value,
    want: Want,
    event: Option<(&'static str, Text)>,
}

fn row(suffix: &'static str, pod: Value, want: Want) -> Row {
    Row {
        suffix,
        pod,
        want,
        event: None,
    }
}

impl Row {
    fn event(mut self, reason: &'static str, message: Text) -> Self {
        self.event = Some((reason, message));
        self
    }
}

/// A pod whose container `c` sleeps, with `container` merged into the container and
/// `spec` into the spec.
fn pod(container: Value, spec: Value) -> Value {
    let mut c = json!({ "name": "c", "image": "busybox", "command": ["sleep", "3600"] });
    merge(&mut c, container);
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": { "terminationGracePeriodSeconds": 1, "containers": [c] }
    });
    merge(&mut pod["spec"], spec);
    pod
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

/// A pod that runs `script` once (restartPolicy Never), with `container` merged in.
fn once(script: &str, container: Value) -> Value {
    let mut c = json!({ "command": ["sh", "-c", script] });
    merge(&mut c, container);
    pod(c, json!({ "restartPolicy": "Never" }))
}

/// A sleeping pod with one volume `v` (`volume`) mounted at /v, with `mount` merged into
/// the mount.
fn with_volume(volume: Value, mount: Value) -> Value {
    let mut m = json!({ "name": "v", "mountPath": "/v" });
    merge(&mut m, mount);
    let mut v = json!({ "name": "v" });
    merge(&mut v, volume);
    pod(json!({ "volumeMounts": [m] }), json!({ "volumes": [v] }))
}

fn host_path(path: &str, kind: &str) -> Value {
    with_volume(
        json!({ "hostPath": { "path": path, "type": kind } }),
        json!({}),
    )
}

/// A sleeping pod whose container has `env`.
fn env(env: Value) -> Value {
    pod(json!({ "env": env }), json!({}))
}

/// A sleeping pod whose container has `envFrom`.
fn env_from(from: Value) -> Value {
    pod(json!({ "envFrom": [from] }), json!({}))
}

/// A pod where an init container plants `ln -s <target> /v/<link>` in an emptyDir, then
/// the container mounts the volume's `link` as its subPath.
fn planted_symlink(target: &str, link: &str) -> Value {
    let plant = json!({
        "name": "plant", "image": "busybox",
        "command": ["ln", "-s", target, format!("/v/{link}")],
        "volumeMounts": [{ "name": "v", "mountPath": "/v" }]
    });
    let mut p = with_volume(json!({ "emptyDir": {} }), json!({ "subPath": link }));
    p["spec"]["initContainers"] = json!([plant]);
    p
}

/// A sleeping pod whose subPathExpr is `$(X)/x` with `X` set to `value`.
fn sub_path_expr(value: &str) -> Value {
    let mut p = with_volume(
        json!({ "emptyDir": {} }),
        json!({ "subPathExpr": "$(X)/x" }),
    );
    p["spec"]["containers"][0]["env"] = json!([{ "name": "X", "value": value }]);
    p
}

fn requesting(requests: Value) -> Value {
    pod(
        json!({ "resources": { "requests": requests.clone(), "limits": requests } }),
        json!({}),
    )
}

fn waiting(container: &'static str, reason: &'static str, message: Text) -> Want {
    Want::Waiting {
        phase: "Pending",
        container,
        reason,
        message,
    }
}

fn config_error(message: &str) -> Want {
    waiting("c", "CreateContainerConfigError", is(message))
}

/// The Failed event the kubelet records with a container's waiting message.
fn error_event(message: &str) -> (&'static str, Text) {
    ("Failed", is(format!("Error: {message}")))
}

/// A row whose container cannot get its config: waits `CreateContainerConfigError` with
/// `message`, and a Failed event `Error: <message>`.
fn config_row(suffix: &'static str, pod: Value, message: &str) -> Row {
    let (reason, text) = error_event(message);
    row(suffix, pod, config_error(message)).event(reason, text)
}

/// A row whose volume `v` cannot be set up: ContainerCreating, and a FailedMount event.
fn mount_row(suffix: &'static str, pod: Value, error: &str) -> Row {
    let message = format!("MountVolume.SetUp failed for volume \"v\" : {error}");
    row(suffix, pod, Want::Creating).event("FailedMount", is(message))
}

/// A row admission rejects.
fn rejected(suffix: &'static str, pod: Value, reason: &'static str, message: String) -> Row {
    row(suffix, pod, Want::Rejected(reason, message))
}

/// A row whose image does not parse: InvalidImageName, the kubelet's message and its
/// InspectFailed event.
fn invalid_image(suffix: &'static str, image: &str, error: &str) -> Row {
    let message = format!(
        "Failed to apply default image tag {image:?}: couldn't parse image reference {image:?}: {error}"
    );
    let want = waiting("c", "InvalidImageName", is(message.clone()));
    row(suffix, pod(json!({ "image": image }), json!({})), want).event("InspectFailed", is(message))
}

/// A row whose image pull fails with the runtime's `inner` text.
fn pull_fails(suffix: &'static str, image: &str, inner: &str) -> Row {
    let want = waiting("c", "ErrImagePull", frames("rpc error: code = ", inner));
    let event = frames(
        format!("Failed to pull image {image:?}: rpc error: code = "),
        inner,
    );
    let p = pod(
        json!({ "image": image, "imagePullPolicy": "IfNotPresent" }),
        json!({}),
    );
    row(suffix, p, want).event("Failed", event)
}

/// A row whose container cannot start (restartPolicy Never): terminated `StartError`
/// with exit code 128 and the runtime's message holding `inner`; the kubelet's Failed
/// event carries the runtime's message.
fn start_error(suffix: &'static str, pod: Value, inner: &str) -> Row {
    let want = Want::Terminated {
        container: "c",
        reason: "StartError",
        exit_code: 128,
        message: frames("", inner),
    };
    row(suffix, pod, want).event("Failed", frames("Error: ", inner))
}

/// The node's allocatable `name` (cpu in millicores), once the test's agent has
/// registered the node (on a fresh cluster it does not exist before).
async fn allocatable(name: &str) -> u128 {
    let nodes = Api::<Node>::all(kube_client("admin.kubeconfig").await);
    let node = eventually("the node registered", Duration::from_secs(30), || async {
        nodes.get_opt(&node_name()).await.ok().flatten()
    })
    .await;
    let q = node
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get(name).cloned())
        .expect("allocatable");
    let q = Quantity::parse(&q.0).expect("a quantity");
    if name == "cpu" {
        q.milli_value()
    } else {
        q.value()
    }
}

/// The rows, given the names of an existing ConfigMap and Secret (each with key `k`).
async fn rows(cm: &str, secret: &str) -> Vec<Row> {
    let cpu = allocatable("cpu").await;
    let memory = allocatable("memory").await;
    let absent = "rk-bad-absent";
    let sha = "0".repeat(64);
    let unsafe_sysctl = |name: &str, value: &str, spec: Value| {
        let mut p = pod(json!({}), spec);
        p["spec"]["securityContext"] = json!({ "sysctls": [{ "name": name, "value": value }] });
        p
    };
    let c63 = "c".repeat(63);
    let big_env: Vec<Value> = (0..1000)
        .map(|i| json!({ "name": format!("V{i}"), "value": "x".repeat(200) }))
        .collect();
    let mut huge_annotations = pod(json!({}), json!({}));
    huge_annotations["metadata"]["annotations"] = json!({ "rk/big": "a".repeat(250 * 1024) });
    let liveness = json!({
        "exec": { "command": ["/rk-no-such-probe"] },
        "periodSeconds": 1, "failureThreshold": 1
    });
    let readiness = json!({
        "httpGet": { "port": 9999, "path": "/" }, "periodSeconds": 1
    });
    let post_start = json!({ "postStart": { "exec": { "command": ["/rk-no-such-hook"] } } });
    let non_root = "container has runAsNonRoot and image will run as root (pod: \"{name}_default({uid})\", container: c)";
    vec![
        // Admission (the kubelet's canAdmitPod): Failed with the handler's reason.
        rejected(
            "sysctl-unsafe",
            unsafe_sysctl("kernel.msgmax", "65536", json!({})),
            "SysctlForbidden",
            "forbidden sysctl: \"kernel.msgmax\" not whitelisted".into(),
        ),
        rejected(
            "sysctl-node",
            unsafe_sysctl("vm.swappiness", "10", json!({})),
            "SysctlForbidden",
            "forbidden sysctl: \"vm.swappiness\" not whitelisted".into(),
        ),
        rejected(
            "sysctl-hostnet",
            unsafe_sysctl("net.ipv4.tcp_syncookies", "1", json!({ "hostNetwork": true })),
            "SysctlForbidden",
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"
                .into(),
        ),
        rejected(
            "sysctl-hostipc",
            unsafe_sysctl("kernel.shm_rmid_forced", "1", json!({ "hostIPC": true })),
            "SysctlForbidden",
            "forbidden sysctl: \"kernel.shm_rmid_forced\" not allowed with host ipc enabled"
                .into(),
        ),
        rejected(
            "cpu",
            requesting(json!({ "cpu": format!("{}m", cpu + 1000) })),
            "OutOfcpu",
            format!(
                "Node didn't have enough resource: cpu, requested: {}, used: 0, capacity: {cpu}",
                cpu + 1000
            ),
        ),
        rejected(
            "memory",
            requesting(json!({ "memory": format!("{}", memory * 2) })),
            "OutOfmemory",
            format!(
                "Node didn't have enough resource: memory, requested: {}, used: 0, capacity: {memory}",
                memory * 2
            ),
        ),
        rejected(
            "hugepages",
            requesting(json!({ "hugepages-2Mi": "4Mi", "memory": "8Mi", "cpu": "10m" })),
            "OutOfhugepages-2Mi",
            "Node didn't have enough resource: hugepages-2Mi, requested: 4194304, used: 0, capacity: 0"
                .into(),
        ),
        rejected(
            "selector",
            pod(json!({}), json!({ "nodeSelector": { "rkubelet.test/absent": "yes" } })),
            "NodeAffinity",
            "Predicate NodeAffinity failed".into(),
        ),
        rejected(
            "affinity",
            pod(
                json!({}),
                json!({ "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{ "matchExpressions": [
                        { "key": "kubernetes.io/hostname", "operator": "In", "values": ["rk-elsewhere"] }
                    ] }]
                } } } }),
            ),
            "NodeAffinity",
            "Predicate NodeAffinity failed".into(),
        ),
        // Extended resources the node does not have are dropped before the predicates.
        row(
            "extended",
            requesting(json!({ "example.com/widget": "1" })),
            Want::Running { ready: true },
        ),
        // Images.
        invalid_image(
            "img-upper",
            "Busybox:1",
            "invalid reference format: repository name must be lowercase",
        ),
        invalid_image("img-colons", "busybox::1", "invalid reference format"),
        invalid_image(
            "img-digest-len",
            &format!("busybox@sha256:{}", "a".repeat(40)),
            "invalid checksum digest length",
        ),
        invalid_image(
            "img-digest-alg",
            &format!("busybox@md5:{}", "a".repeat(32)),
            "unsupported digest algorithm",
        ),
        invalid_image(
            "img-hex",
            &"0123456789abcdef".repeat(4),
            &format!(
                "invalid repository name ({}), cannot specify 64-byte hexadecimal strings",
                "0123456789abcdef".repeat(4)
            ),
        ),
        pull_fails(
            "img-unknown",
            "127.0.0.1:5000/rkubelet/no-such-image:1",
            "127.0.0.1:5000/rkubelet/no-such-image:1: not found",
        ),
        pull_fails(
            "img-tag",
            "127.0.0.1:5000/library/busybox:no-such-tag",
            "127.0.0.1:5000/library/busybox:no-such-tag: not found",
        ),
        pull_fails(
            "img-digest",
            &format!("127.0.0.1:5000/library/busybox@sha256:{sha}"),
            "not found",
        ),
        pull_fails(
            "img-closed",
            "127.0.0.1:1/rkubelet/busybox:1",
            "connect: connection refused",
        ),
        row(
            "img-never",
            pod(
                json!({ "image": "127.0.0.1:5000/rkubelet/absent:1", "imagePullPolicy": "Never" }),
                json!({}),
            ),
            waiting(
                "c",
                "ErrImageNeverPull",
                is("Container image \"127.0.0.1:5000/rkubelet/absent:1\" is not present with pull policy of Never"),
            ),
        )
        .event(
            "ErrImageNeverPull",
            is("Container image \"127.0.0.1:5000/rkubelet/absent:1\" is not present with pull policy of Never"),
        ),
        // Environment sources.
        config_row(
            "env-cm",
            env(json!([{ "name": "A", "valueFrom": { "configMapKeyRef": { "name": absent, "key": "k" } } }])),
            &format!("configmap \"{absent}\" not found"),
        ),
        config_row(
            "env-cm-key",
            env(json!([{ "name": "A", "valueFrom": { "configMapKeyRef": { "name": cm, "key": "nope" } } }])),
            &format!("couldn't find key nope in ConfigMap default/{cm}"),
        ),
        config_row(
            "env-secret",
            env(json!([{ "name": "A", "valueFrom": { "secretKeyRef": { "name": absent, "key": "k" } } }])),
            &format!("secret \"{absent}\" not found"),
        ),
        config_row(
            "env-secret-key",
            env(json!([{ "name": "A", "valueFrom": { "secretKeyRef": { "name": secret, "key": "nope" } } }])),
            &format!("couldn't find key nope in Secret default/{secret}"),
        ),
        config_row(
            "envfrom-cm",
            env_from(json!({ "configMapRef": { "name": absent } })),
            &format!("configmap \"{absent}\" not found"),
        ),
        config_row(
            "envfrom-secret",
            env_from(json!({ "secretRef": { "name": absent } })),
            &format!("secret \"{absent}\" not found"),
        ),
        row(
            "env-optional",
            env(json!([{ "name": "A", "valueFrom": { "configMapKeyRef": { "name": absent, "key": "k", "optional": true } } }])),
            Want::Running { ready: true },
        ),
        // Volume sources.
        mount_row(
            "vol-secret",
            with_volume(json!({ "secret": { "secretName": absent } }), json!({})),
            &format!("secret \"{absent}\" not found"),
        ),
        mount_row(
            "vol-cm",
            with_volume(json!({ "configMap": { "name": absent } }), json!({})),
            &format!("configmap \"{absent}\" not found"),
        ),
        mount_row(
            "vol-cm-key",
            with_volume(
                json!({ "configMap": { "name": cm, "items": [{ "key": "nope", "path": "p" }] } }),
                json!({}),
            ),
            "configmap references non-existent config key: nope",
        ),
        mount_row(
            "vol-secret-key",
            with_volume(
                json!({ "secret": { "secretName": secret, "items": [{ "key": "nope", "path": "p" }] } }),
                json!({}),
            ),
            "references non-existent secret key: nope",
        ),
        mount_row(
            "vol-projected",
            with_volume(
                json!({ "projected": { "sources": [{ "configMap": { "name": absent } }] } }),
                json!({}),
            ),
            &format!("configmap \"{absent}\" not found"),
        ),
        row(
            "vol-optional",
            with_volume(json!({ "secret": { "secretName": absent, "optional": true } }), json!({})),
            Want::Running { ready: true },
        ),
        // hostPath types.
        mount_row(
            "hp-dir",
            host_path("/etc/passwd", "Directory"),
            "hostPath type check failed: /etc/passwd is not a directory",
        ),
        mount_row(
            "hp-dir-absent",
            host_path("/rk-bad-input-absent", "Directory"),
            "hostPath type check failed: /rk-bad-input-absent is not a directory",
        ),
        mount_row(
            "hp-file",
            host_path("/etc", "File"),
            "hostPath type check failed: /etc is not a file",
        ),
        mount_row(
            "hp-file-or-create",
            host_path("/etc", "FileOrCreate"),
            "hostPath type check failed: /etc is not a file",
        ),
        mount_row(
            "hp-socket",
            host_path("/etc/passwd", "Socket"),
            "hostPath type check failed: /etc/passwd is not a socket file",
        ),
        mount_row(
            "hp-char",
            host_path("/etc/passwd", "CharDevice"),
            "hostPath type check failed: /etc/passwd is not a character device",
        ),
        mount_row(
            "hp-block",
            host_path("/dev/null", "BlockDevice"),
            "hostPath type check failed: /dev/null is not a block device",
        ),
        // subPaths.
        config_row(
            "subpath-dotdot",
            sub_path_expr(".."),
            "unable to provision SubPath `../x`: must not contain '..'",
        ),
        config_row(
            "subpath-abs",
            sub_path_expr("/etc"),
            "error SubPath `/etc/x` must not be an absolute path",
        ),
        config_row(
            "subpath-unset",
            sub_path_expr(""),
            "missing value for X",
        ),
        config_row(
            "subpath-symlink",
            planted_symlink("/etc", "esc"),
            "failed to prepare subPath for volumeMount \"v\" of container \"c\"",
        ),
        config_row(
            "subpath-dangling",
            planted_symlink(&format!("{ESCAPE_TARGET}/x"), "dang"),
            "failed to create subPath directory for volumeMount \"v\" of container \"c\"",
        ),
        // Security.
        config_row(
            "non-root",
            pod(json!({ "securityContext": { "runAsNonRoot": true } }), json!({})),
            non_root,
        ),
        row(
            "read-only-root",
            once(
                "touch /x",
                json!({
                    "securityContext": { "readOnlyRootFilesystem": true },
                    "terminationMessagePolicy": "FallbackToLogsOnError"
                }),
            ),
            Want::Terminated {
                container: "c",
                reason: "Error",
                exit_code: 1,
                message: is("touch: /x: Read-only file system\n"),
            },
        ),
        // Commands and processes.
        start_error(
            "cmd-missing",
            once("", json!({ "command": ["/rk-no-such-binary"] })),
            NO_BINARY,
        ),
        start_error(
            "cmd-not-exec",
            once("", json!({ "command": ["/etc/passwd"] })),
            "permission denied",
        ),
        // Under Always the failed start is retried after a back-off.
        row(
            "cmd-missing-always",
            pod(json!({ "command": ["/rk-no-such-binary"] }), json!({})),
            Want::Waiting {
                phase: "Running",
                container: "c",
                reason: "CrashLoopBackOff",
                message: frames(
                    "back-off ",
                    " restarting failed container=c pod={name}_default({uid})",
                ),
            },
        )
        .event("Failed", frames("Error: ", NO_BINARY)),
        row(
            "exit-3",
            once("echo bye > /dev/termination-log; exit 3", json!({})),
            Want::Terminated {
                container: "c",
                reason: "Error",
                exit_code: 3,
                message: is("bye\n"),
            },
        ),
        // Names and sizes near the API's limits.
        row(
            "longest",
            {
                let mut p = pod(json!({ "name": c63 }), json!({}));
                p["metadata"]["name"] = "l".repeat(210 - 13).into();
                p
            },
            Want::Running { ready: true },
        ),
        row("many-env", env(Value::Array(big_env)), Want::Running { ready: true }),
        row("annotations", huge_annotations, Want::Running { ready: true }),
        // Probes and hooks.
        // containerd answers an error (not an exit code) for exec of a missing binary: the
        // kubelet v1.20 reports "probe errored" and skips the result, so the container is
        // never restarted (kubernetes/kubernetes#106682).
        row(
            "liveness-missing",
            pod(json!({ "livenessProbe": liveness }), json!({})),
            Want::Running { ready: true },
        )
        .event(
            "Unhealthy",
            frames(
                "Liveness probe errored: rpc error: code = Unknown desc = failed to exec in container: failed to start exec ",
                "exec: \"/rk-no-such-probe\": stat /rk-no-such-probe: no such file or directory",
            ),
        ),
        row(
            "readiness",
            pod(json!({ "readinessProbe": readiness }), json!({})),
            Want::Running { ready: false },
        )
        .event(
            "Unhealthy",
            is("Readiness probe failed: Get \"http://{ip}:9999/\": dial tcp {ip}:9999: connect: connection refused"),
        ),
        row(
            "post-start",
            pod(json!({ "lifecycle": post_start }), json!({})),
            // The hook's failure kills the container: it restarts after a back-off.
            Want::Waiting {
                phase: "Running",
                container: "c",
                reason: "CrashLoopBackOff",
                message: frames(
                    "back-off ",
                    " restarting failed container=c pod={name}_default({uid})",
                ),
            },
        )
        .event(
            "FailedPostStartHook",
            frames(
                "Exec lifecycle hook ([/rk-no-such-hook]) for Container \"c\" in Pod \"{name}_default({uid})\" failed - error: ",
                "",
            ),
        ),
    ]
}

/// Where a row's pod stands against its outcome: `Ok` once reached, else what differs.
fn compare(row: &Row, pod: &Pod) -> Result<(), String> {
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.as_deref().unwrap_or_default();
    let statuses: Vec<ContainerStatus> = status
        .init_container_statuses
        .clone()
        .into_iter()
        .flatten()
        .chain(status.container_statuses.clone().into_iter().flatten())
        .collect();
    let of = |name: &str| statuses.iter().find(|s| s.name == name).cloned();
    match &row.want {
        Want::Rejected(reason, message) => {
            let got = (phase, status.reason.as_deref(), status.message.as_deref());
            let want = ("Failed", Some(*reason), Some(format!("Pod {message}")));
            if (got.0, got.1, got.2.map(str::to_owned)) != want {
                return Err(format!("{got:?}, want {want:?}"));
            }
        }
        Want::Waiting {
            phase: want_phase,
            container,
            reason,
            message,
        } => {
            let w = of(container)
                .and_then(|s| s.state?.waiting)
                .unwrap_or_default();
            let got_message = w.message.clone().unwrap_or_default();
            if phase != *want_phase
                || w.reason.as_deref() != Some(*reason)
                || !message.matches(pod, &got_message)
            {
                return Err(format!(
                    "{phase}, waiting {:?} {got_message:?}, want {want_phase}, {reason} {message:?}",
                    w.reason
                ));
            }
        }
        Want::Creating => {
            let reasons: Vec<_> = status
                .container_statuses
                .iter()
                .flatten()
                .map(|s| {
                    s.state
                        .clone()
                        .and_then(|s| s.waiting)
                        .and_then(|w| w.reason)
                })
                .collect();
            if phase != "Pending"
                || reasons.is_empty()
                || reasons
                    .iter()
                    .any(|r| r.as_deref() != Some("ContainerCreating"))
            {
                return Err(format!(
                    "{phase} {reasons:?}, want Pending, ContainerCreating"
                ));
            }
        }
        Want::Terminated {
            container,
            reason,
            exit_code,
            message,
        } => {
            let t = of(container)
                .and_then(|s| s.state?.terminated)
                .unwrap_or_default();
            let got_message = t.message.clone().unwrap_or_default();
            if phase != "Failed"
                || t.reason.as_deref() != Some(*reason)
                || t.exit_code != *exit_code
                || !message.matches(pod, &got_message)
            {
                return Err(format!(
                    "{phase}, terminated {:?} {} {got_message:?}, want Failed, {reason} {exit_code} {message:?}",
                    t.reason, t.exit_code
                ));
            }
        }
        Want::Running { ready } => {
            let is_ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if phase != "Running" || is_ready != *ready {
                return Err(format!(
                    "{phase}, ready {is_ready}, want Running, ready {ready}"
                ));
            }
        }
    }
    Ok(())
}

/// Waits for a row's outcome and event; what differs at the deadline.
async fn settle(row: &Row, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + ROW_TIMEOUT;
    loop {
        let Some(pod) = get(name).await else {
            return Err("the pod is gone".into());
        };
        let mut outcome = compare(row, &pod);
        if let (Ok(()), Some((reason, message))) = (&outcome, &row.event) {
            let events = events_of(name).await;
            let seen: Vec<_> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some(*reason))
                .filter_map(|e| e.message.clone())
                .collect();
            if !seen.iter().any(|m| message.matches(&pod, m)) {
                outcome = Err(format!("events {reason}: {seen:?}, want {message:?}"));
            }
        }
        if let (Ok(()), Want::Rejected(reason, message)) = (&outcome, &row.want) {
            let events = events_of(name).await;
            let found = events.iter().any(|e| {
                e.reason.as_deref() == Some(*reason)
                    && e.message.as_deref() == Some(message.as_str())
                    && e.type_.as_deref() == Some("Warning")
            });
            if !found {
                outcome = Err(format!("no Warning event {reason} {message:?}"));
            }
        }
        if outcome.is_ok() || Instant::now() >= deadline {
            return outcome;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The ConfigMap and Secret the rows refer to, deleted when dropped.
struct Sources(String);

impl Sources {
    async fn create(name: &str) -> Self {
        let client = kube_client("admin.kubeconfig").await;
        let meta = json!({ "name": name });
        let cm: ConfigMap =
            serde_json::from_value(json!({ "metadata": meta, "data": { "k": "v" } })).expect("cm");
        let secret: Secret =
            serde_json::from_value(json!({ "metadata": meta, "stringData": { "k": "v" } }))
                .expect("secret");
        let pp = PostParams::default();
        Api::<ConfigMap>::namespaced(client.clone(), "default")
            .create(&pp, &cm)
            .await
            .expect("create the ConfigMap");
        Api::<Secret>::namespaced(client, "default")
            .create(&pp, &secret)
            .await
            .expect("create the Secret");
        Self(name.to_owned())
    }
}

impl Drop for Sources {
    fn drop(&mut self) {
        let name = self.0.clone();
        common::cleanup_blocking(move || async move {
            let client = kube_client("admin.kubeconfig").await;
            let dp = DeleteParams::default();
            let _ = Api::<ConfigMap>::namespaced(client.clone(), "default")
                .delete(&name, &dp)
                .await;
            let _ = Api::<Secret>::namespaced(client, "default")
                .delete(&name, &dp)
                .await;
        });
    }
}

/// The agent's log written since `from` bytes.
fn log_since(path: &Path, from: u64) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(0).min(text.len());
    String::from_utf8_lossy(&text[from..]).into_owned()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn bad_pod_specs_end_as_in_the_kubelet_and_the_agent_keeps_serving() {
    let started = Instant::now();
    let mut case = Case::new("bad").await;
    let label = case.pods.label.clone();
    let sources = Sources::create(&format!("{label}-src")).await;
    // A RuntimeClass deleted after its pod was created (the API refuses pods of unknown
    // classes), before the agent sees the pod; and one whose handler the runtime lacks.
    let gone_class = format!("{label}-gone");
    let gone = TestRuntimeClass::create(&gone_class, "runc").await;
    let rc_gone = case
        .create(
            "rc-gone",
            pod(json!({}), json!({ "runtimeClassName": gone_class })),
        )
        .await;
    drop(gone);
    let bogus_class = format!("{label}-bogus");
    let _bogus = TestRuntimeClass::create(&bogus_class, "rkubelet-bogus").await;
    let log = common::case::root_dir().with_extension("log");
    let log_start = std::fs::metadata(&log).map_or(0, |m| m.len());
    case.start_agent(&[]);
    let mut table = rows(&sources.0, &sources.0).await;
    table.push(row("rc-gone", Value::Null, Want::Creating).event(
        "FailedCreatePodSandBox",
        is(format!(
            "Failed to create pod sandbox: runtimeclass.node.k8s.io \"{gone_class}\" not found"
        )),
    ));
    table.push(
        row(
            "rc-bogus",
            pod(json!({}), json!({ "runtimeClassName": bogus_class })),
            Want::Creating,
        )
        .event(
            "FailedCreatePodSandBox",
            frames(
                "Failed to create pod sandbox: rpc error: code = ",
                "\"rkubelet-bogus\"",
            ),
        ),
    );
    // Host ports: the second pod asking for the first's port is refused.
    let with_port = || {
        pod(
            json!({ "ports": [{ "containerPort": 80, "hostPort": 31081 }] }),
            json!({}),
        )
    };
    table.push(row("port-a", with_port(), Want::Running { ready: true }));
    let mut names = Vec::new();
    for r in &table {
        let name = if r.suffix == "rc-gone" {
            rc_gone.clone()
        } else {
            let mut manifest = r.pod.clone();
            let fixed = manifest["metadata"]["name"].as_str().map(str::to_owned);
            match fixed {
                // Rows of a given name length: the label makes the first 13 characters.
                Some(rest) => {
                    manifest["metadata"]["name"] = format!("{}-{rest}", short(&label)).into();
                    case.pods.create(&node_name(), manifest).await;
                    format!("{}-{rest}", short(&label))
                }
                None => case.create(r.suffix, manifest).await,
            }
        };
        names.push(name);
    }
    let created_all = started.elapsed();
    // The control pod, created after the batch, is served in normal time.
    let control = case.create("control", pod(json!({}), json!({}))).await;
    let control_started = Instant::now();
    eventually("the control pod Ready", CONTROL_READY, || async {
        let p = get(&control).await?;
        let ready = p
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(())
    })
    .await;
    let control_ready = control_started.elapsed();
    let port_a = names[table.len() - 1].clone();
    running(&port_a).await;
    let port_b = case.create("port-b", with_port()).await;
    table.push(rejected(
        "port-b",
        Value::Null,
        "NodePorts",
        "Predicate NodePorts failed".into(),
    ));
    names.push(port_b);
    let outcomes = futures::future::join_all(
        table
            .iter()
            .zip(&names)
            .map(|(r, name)| async move { (r.suffix, settle(r, name).await) }),
    )
    .await;
    let settled = started.elapsed();
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(suffix, o)| o.as_ref().err().map(|e| format!("{suffix}: {e}")))
        .collect();
    // Nothing escaped the volume, the agent lives and nothing in it panicked.
    let escaped = Path::new(ESCAPE_TARGET).exists();
    let alive = nix::sys::signal::kill(case.agent().pid(), None).is_ok();
    let panics: Vec<String> = log_since(&log, log_start)
        .lines()
        .filter(|l| l.contains("panicked"))
        .map(str::to_owned)
        .collect();
    // Every pod is deleted: the agent finishes each deletion.
    let selector = ListParams::default().labels(&format!("rk-test={label}"));
    let api = pods_api().await;
    api.delete_collection(&DeleteParams::default(), &selector)
        .await
        .expect("delete the pods");
    eventually("every pod deleted", Duration::from_secs(90), || async {
        let left = api.list(&selector).await.ok()?.items;
        left.is_empty().then_some(())
    })
    .await;
    eprintln!(
        "{} rows: created in {created_all:?}, control pod Ready in {control_ready:?}, settled in {settled:?}, all deleted in {:?}",
        table.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "rows that differ from the kubelet:\n  {}",
        failures.join("\n  ")
    );
    assert!(!escaped, "{ESCAPE_TARGET} was created on the host");
    assert!(alive, "the agent died: {}", case.agent().log_tail());
    assert!(
        panics.is_empty(),
        "the agent panicked:\n{}",
        panics.join("\n")
    );
    assert!(table.len() >= 40, "{} rows", table.len());
}

/// The label's first 12 characters (pods of a fixed name length start with them).
fn short(label: &str) -> &str {
    &label[..12.min(label.len())]
}

/// A pod name of 251 characters, valid for the API, makes a log directory name
/// (`<namespace>_<name>_<uid>`) longer than the filesystem allows. As in the kubelet
/// v1.20 (`createPodSandbox`), the sandbox fails with a Warning `FailedCreatePodSandBox`
/// event carrying Go's `mkdir` error, and nothing reaches the runtime; the pod is
/// retried with back-off, never in a loop; once deleted, its deletion finishes and its
/// worker ends at once (no retry of removing a directory that cannot exist), leaving
/// nothing behind.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_pod_name_too_long_for_its_log_directory_fails_the_sandbox_and_deletes_cleanly() {
    let mut case = Case::new("longname").await;
    let log = common::case::root_dir().with_extension("log");
    let log_start = std::fs::metadata(&log).map_or(0, |m| m.len());
    case.start_agent(&[]);
    let name = format!("{}-{}", short(&case.pods.label), "x".repeat(251 - 13));
    assert_eq!(name.len(), 251);
    let mut manifest = pod(json!({}), json!({}));
    manifest["metadata"]["name"] = name.clone().into();
    let created = case.pods.create(&node_name(), manifest).await;
    let uid = created.metadata.uid.clone().expect("uid");
    let dir = case
        .agent()
        .root_dir
        .join("logs")
        .join(format!("default_{name}_{uid}"));
    let want = format!(
        "Failed to create pod sandbox: mkdir {}: file name too long",
        dir.display()
    );
    let event = event_with_reason(&name, "FailedCreatePodSandBox", Duration::from_secs(60)).await;
    assert_eq!(
        event.message.as_deref(),
        Some(want.as_str()),
        "{}",
        case.agent().log_tail()
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let pending = get(&name).await.expect("the pod");
    let waiting = pending
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.first()?.state.clone()?.waiting?.reason);
    assert_eq!(waiting.as_deref(), Some("ContainerCreating"));
    assert!(common::pods::sandboxes_of(&uid).await.is_empty());
    // Retried with back-off (1 s doubling), not in a loop: a few attempts in 10 s more.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let attempts = events_of(&name)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedCreatePodSandBox"))
        .map(|e| e.count.unwrap_or(1))
        .sum::<i32>();
    assert!(
        (1..=8).contains(&attempts),
        "{attempts} sandbox attempts in about 10 s"
    );

    // Deleting it finishes, and its worker ends with it: no retries after.
    let deleting = Instant::now();
    pods_api()
        .await
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the pod deleted", Duration::from_secs(30), || async {
        get(&name).await.is_none().then_some(())
    })
    .await;
    let deleted_in = deleting.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let text = log_since(&log, log_start);
    let ours: Vec<&str> = text.lines().filter(|l| l.contains(&uid)).collect();
    let retries = ours
        .iter()
        .filter(|l| l.contains("could not remove pod directory"))
        .count();
    assert_eq!(retries, 0, "{}", ours.join("\n"));
    let cleaned = ours
        .iter()
        .position(|l| l.contains("pod terminated and cleaned up"));
    assert!(cleaned.is_some(), "the worker never finished");
    let after: Vec<&&str> = ours
        .iter()
        .skip(cleaned.map_or(0, |i| i + 1))
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(
        after.is_empty(),
        "complaints after the pod's end: {after:?}"
    );
    assert!(!dir.exists());
    assert!(
        !case.agent().root_dir.join("pods").join(&uid).exists(),
        "the pod directory is removed"
    );
    assert!(
        !text.contains("panicked"),
        "the agent panicked: {}",
        case.agent().log_tail()
    );
    eprintln!("{attempts} sandbox attempts before the delete; deleted in {deleted_in:?}");
}

/// The container `c` of the pod `name`, once it has a status.
async fn status_of_c(name: &str) -> Option<ContainerStatus> {
    let statuses = get(name).await?.status?.container_statuses?;
    statuses.into_iter().find(|c| c.name == "c")
}

/// Whole seconds from `earlier` to `later` (the API's times are RFC 3339 seconds).
fn seconds(earlier: &Time, later: &Time) -> i64 {
    later.0.as_second() - earlier.0.as_second()
}

/// The crash-loop back-off as the kubelet v1.20's `doBackOff` keeps it (the upstream e2e
/// "should have their auto-restart back-off timer reset on image update" and the wait
/// that "should cap back-off at MaxContainerBackOff" measures, in well under a minute): a
/// container that runs 5 s and fails is restarted at once the first time, then 10 s after
/// its exit; its waiting message names the back-off in Go's form ("back-off 10s", then
/// "back-off 20s"), with the kubelet's `BackOff` event; an image changed during the 20 s
/// wait (a new spec hash, a new back-off key) starts the container at once, in the new
/// image.
#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_crash_loop_waits_from_each_exit_and_a_new_image_starts_its_back_off_over() {
    let started = Instant::now();
    let case = Case::with_agent("backoff", &[]).await;
    let manifest = pod(
        json!({ "command": ["sh", "-c", "sleep 5; exit 1"], "imagePullPolicy": "IfNotPresent" }),
        json!({}),
    );
    let name = case.create("crash", manifest).await;
    let uid = get(&name)
        .await
        .and_then(|p| p.metadata.uid)
        .expect("the pod's UID");
    let message = |backoff: &str| {
        format!("back-off {backoff} restarting failed container=c pod={name}_default({uid})")
    };

    // Instance 1 exits: restarted at once (no back-off yet). Instance 2 exits: 10 s from
    // that exit, instance 3 starts. The agent before fd5c575 counted the 10 s from
    // instance 2's start (its restart), so instance 3 came 10 - 5 = 5 s after instance 2's
    // exit: startedAt - finishedAt 4 to 6 s in whole seconds, under the 9 asserted here.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first_wait = None;
    let (finished_2, started_3) = loop {
        let cs = status_of_c(&name).await;
        let state = cs
            .as_ref()
            .and_then(|c| c.state.clone())
            .unwrap_or_default();
        match cs.as_ref().map_or(0, |c| c.restart_count) {
            1 => {
                if let Some(w) = state.waiting
                    && w.reason.as_deref() == Some("CrashLoopBackOff")
                {
                    first_wait.get_or_insert(w.message.unwrap_or_default());
                }
            }
            2 => {
                if let Some(running) = state.running {
                    let finished = cs
                        .and_then(|c| c.last_state?.terminated?.finished_at)
                        .expect("instance 2's finishedAt in lastState");
                    break (finished, running.started_at.expect("startedAt"));
                }
            }
            0 => {}
            n => panic!("restarted {n} times before instance 3 was seen running"),
        }
        assert!(
            Instant::now() < deadline,
            "instance 3 not running after 60 s: {cs:?}\n{}",
            case.agent().log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let gap = seconds(&finished_2, &started_3);
    assert!(
        (9..=15).contains(&gap),
        "instance 3 started {gap} s after instance 2 exited, want the 10 s back-off"
    );
    assert_eq!(
        first_wait,
        Some(message("10s")),
        "the first back-off's message"
    );

    // Instance 3 exits: its back-off is 20 s, counted from that exit.
    let waiting = eventually(
        "instance 3 exited, in CrashLoopBackOff",
        Duration::from_secs(20),
        || async {
            let cs = status_of_c(&name).await?;
            let w = cs.state.clone()?.waiting?;
            (cs.restart_count == 2 && w.reason.as_deref() == Some("CrashLoopBackOff")).then_some(cs)
        },
    )
    .await;
    let wait = waiting.state.and_then(|s| s.waiting?.message);
    assert_eq!(wait, Some(message("20s")), "the second back-off's message");
    let finished_3 = waiting
        .last_state
        .and_then(|s| s.terminated?.finished_at)
        .expect("instance 3's finishedAt in lastState");
    let busybox_id = waiting.image_id;

    // A new image during that wait: the spec's hash changes, and with it the back-off's
    // key, so instance 4 starts at once in nginx (same shell and sleep). Instance 4 within
    // 10 s of instance 3's exit is what discriminates: the agent before fd5c575 (one key per
    // container name, counted from the start) restarted it 20 - 5 = 15 s after that exit,
    // and a back-off counted from the exit but keyed without the hash, 20 s after.
    let patched_at = Time(Timestamp::now());
    assert!(
        seconds(&finished_3, &patched_at) <= 5,
        "the patch comes {} s into the 20 s back-off: too late to tell",
        seconds(&finished_3, &patched_at)
    );
    let patch = json!({ "spec": { "containers": [{ "name": "c", "image": "nginx" }] } });
    pods_api()
        .await
        .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("patch the container's image");
    let (image, image_id, started_4) = eventually(
        "instance 4 started in the new image",
        Duration::from_secs(30),
        || async {
            let cs = status_of_c(&name).await?;
            let state = cs.state?;
            let started = match (state.running, state.terminated) {
                (Some(r), _) => r.started_at,
                (None, Some(t)) => t.started_at,
                (None, None) => None,
            }?;
            (cs.restart_count == 3).then_some((cs.image, cs.image_id, started))
        },
    )
    .await;
    assert!(
        image.contains("nginx") && image_id.contains("nginx") && image_id != busybox_id,
        "instance 4 runs {image} ({image_id}), was {busybox_id}"
    );
    let after_exit = seconds(&finished_3, &started_4);
    assert!(
        started_4.0.as_second() >= patched_at.0.as_second() && after_exit < 10,
        "instance 4 started {after_exit} s after instance 3 exited ({} s after the patch), \
         want at once for the new image\n{}",
        seconds(&patched_at, &started_4),
        case.agent().log_tail()
    );
    // The kubelet's event for each wait (its message names no length).
    let backoff = event_with_reason(&name, "BackOff", Duration::from_secs(10)).await;
    assert_eq!(
        (backoff.type_.as_deref(), backoff.message.as_deref()),
        (
            Some("Warning"),
            Some("Back-off restarting failed container")
        )
    );
    eprintln!(
        "instance 3 started {gap} s after instance 2's exit; instance 4 in the new image {after_exit} s after instance 3's exit ({} s after the patch); {:?} in all",
        seconds(&patched_at, &started_4),
        started.elapsed()
    );
}
