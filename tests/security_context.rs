//! Pod and container security contexts end to end, against the local cluster: what a
//! container sees of its user and groups (the pod's runAsUser/runAsGroup, fsGroup and
//! supplementalGroups, the container's own user winning, the image's user under a lone
//! group), its seccomp mode (RuntimeDefault, Unconfined, the pod annotation, a Localhost
//! profile under the agent's root dir), NoNewPrivs and capabilities, a read-only root
//! filesystem, a privileged container, the masked `/proc` paths, runAsNonRoot refused
//! with the kubelet's messages, the host and shared namespaces, and sysctls set in the
//! pod's namespaces.

mod common;

use std::time::Duration;

use common::case::{Case, get};
use common::eventually;
use common::pods::{containers_of, events_of, exec_sync, running_containers_of};
use k8s_openapi::api::core::v1::ContainerStateWaiting;
use serde_json::json;

/// A pod of busybox containers that sleep, each `(name, securityContext)`, with the pod's
/// `spec` fields merged in.
fn sleepers(
    containers: &[(&str, serde_json::Value)],
    spec: serde_json::Value,
) -> serde_json::Value {
    let containers: Vec<_> = containers
        .iter()
        .map(|(name, sc)| {
            json!({
                "name": name,
                "image": "busybox",
                "command": ["sleep", "3600"],
                "securityContext": sc,
            })
        })
        .collect();
    let mut manifest = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": { "terminationGracePeriodSeconds": 1, "containers": containers },
    });
    if let (Some(s), Some(extra)) = (manifest["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    manifest
}

/// The running containers of the pod named `name` (waits until `count` run), by name.
async fn containers(name: &str, count: usize) -> Vec<(String, String)> {
    eventually(
        &format!("{count} running containers of {name}"),
        Duration::from_secs(60),
        || async {
            let uid = get(name).await?.metadata.uid?;
            let found: Vec<_> = running_containers_of(&uid)
                .await
                .into_iter()
                .map(|c| (c.metadata.map(|m| m.name).unwrap_or_default(), c.id))
                .collect();
            (found.len() == count).then_some(found)
        },
    )
    .await
}

/// Runs `script` with `sh -c` in the container `container` of `all`; its stdout and exit
/// code.
async fn sh(all: &[(String, String)], container: &str, script: &str) -> (String, i32) {
    let id = &all
        .iter()
        .find(|(n, _)| n == container)
        .unwrap_or_else(|| panic!("container {container} runs"))
        .1;
    let out = exec_sync(id.clone(), vec!["sh".into(), "-c".into(), script.into()]).await;
    (
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        out.exit_code,
    )
}

/// The waiting state of the first container of the pod `name`, once it is
/// `CreateContainerConfigError`.
async fn config_error(name: &str) -> ContainerStateWaiting {
    eventually(
        "CreateContainerConfigError",
        Duration::from_secs(60),
        || async {
            let p = get(name).await?;
            let cs = p.status?.container_statuses?.into_iter().next()?;
            let waiting = cs.state?.waiting?;
            (waiting.reason.as_deref() == Some("CreateContainerConfigError")).then_some(waiting)
        },
    )
    .await
}

/// The command line of the container's PID 1, its words joined by spaces.
async fn init_cmdline(all: &[(String, String)]) -> String {
    sh(all, "c", "tr '\\0' ' ' < /proc/1/cmdline").await.0
}

/// The container's IPC namespace.
async fn ipc_namespace(all: &[(String, String)]) -> String {
    sh(all, "c", "readlink /proc/self/ns/ipc").await.0
}

/// The value of `field` in the container's `/proc/<pid>/status`.
async fn status(all: &[(String, String)], container: &str, pid: &str, field: &str) -> String {
    let (out, code) = sh(
        all,
        container,
        &format!("grep '^{field}:' /proc/{pid}/status"),
    )
    .await;
    assert_eq!(code, 0, "{field} in /proc/{pid}/status of {container}");
    out.split_once(':')
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_pods_user_and_groups_reach_containers_and_the_containers_own_user_wins() {
    let case = Case::with_agent("sc-ids", &[]).await;
    let spec = json!({ "securityContext": {
        "runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000],
    }});
    let manifest = sleepers(
        &[("pod", json!({})), ("own", json!({ "runAsUser": 1001 }))],
        spec,
    );
    let name = case.create("p", manifest).await;
    let all = containers(&name, 2).await;
    assert_eq!(sh(&all, "pod", "id -u; id -g").await.0, "1000\n3000");
    assert_eq!(sh(&all, "own", "id -u; id -g").await.0, "1001\n3000");
    for c in ["pod", "own"] {
        let groups = status(&all, c, "self", "Groups").await;
        // The primary group, fsGroup and supplementalGroups (the kernel sorts them).
        assert_eq!(groups, "2000 3000 4000", "groups of {c}");
    }
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn seccomp_no_new_privs_capabilities_and_masked_proc_paths() {
    let case = Case::with_agent("sc-seccomp", &[]).await;
    let strict = json!({
        "seccompProfile": { "type": "RuntimeDefault" },
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"], "add": ["NET_BIND_SERVICE"] },
    });
    let manifest = sleepers(&[("plain", json!({})), ("strict", strict)], json!({}));
    let name = case.create("p", manifest).await;
    let all = containers(&name, 2).await;
    // v1.20: no profile asked for is no filter.
    assert_eq!(status(&all, "plain", "1", "Seccomp").await, "0");
    assert_eq!(status(&all, "plain", "1", "NoNewPrivs").await, "0");
    assert_eq!(status(&all, "strict", "1", "Seccomp").await, "2");
    assert_eq!(status(&all, "strict", "1", "NoNewPrivs").await, "1");
    // CAP_NET_BIND_SERVICE is bit 10.
    for field in ["CapEff", "CapBnd"] {
        assert_eq!(status(&all, "strict", "1", field).await, "0000000000000400");
    }
    let plain_caps = status(&all, "plain", "1", "CapBnd").await;
    assert_ne!(
        plain_caps, "0000000000000400",
        "the runtime's default capabilities"
    );
    // procMount Default: the kubelet's masked and read-only /proc paths.
    let mounts = sh(&all, "plain", "cat /proc/self/mountinfo").await.0;
    // (This kernel has no /proc/kcore.)
    for masked in [
        " /proc/keys ",
        " /proc/timer_list ",
        " /proc/acpi ",
        " /sys/firmware ",
    ] {
        assert!(mounts.contains(masked), "{masked} is masked:\n{mounts}");
    }
    let (_, code) = sh(&all, "plain", "echo 1 > /proc/sys/kernel/domainname").await;
    assert_ne!(code, 0, "/proc/sys is read-only");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn the_seccomp_annotation_of_the_pod_applies_and_a_containers_field_wins() {
    let case = Case::with_agent("sc-annot", &[]).await;
    let unconfined = json!({ "seccompProfile": { "type": "Unconfined" } });
    let mut manifest = sleepers(&[("pod", json!({})), ("own", unconfined)], json!({}));
    manifest["metadata"]["annotations"] =
        json!({ "seccomp.security.alpha.kubernetes.io/pod": "runtime/default" });
    let name = case.create("p", manifest).await;
    let all = containers(&name, 2).await;
    assert_eq!(status(&all, "pod", "1", "Seccomp").await, "2");
    assert_eq!(status(&all, "own", "1", "Seccomp").await, "0");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_read_only_root_filesystem_keeps_volumes_writable() {
    let case = Case::with_agent("sc-rofs", &[]).await;
    let mut manifest = sleepers(
        &[("c", json!({ "readOnlyRootFilesystem": true }))],
        json!({ "volumes": [{ "name": "data", "emptyDir": {} }] }),
    );
    manifest["spec"]["containers"][0]["volumeMounts"] =
        json!([{ "name": "data", "mountPath": "/data" }]);
    let name = case.create("p", manifest).await;
    let all = containers(&name, 1).await;
    assert_ne!(sh(&all, "c", "touch /rootfs-write").await.1, 0);
    assert_eq!(
        sh(&all, "c", "touch /data/ok && ls /data").await,
        ("ok".into(), 0)
    );
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_privileged_container_has_every_capability_and_the_hosts_devices() {
    let case = Case::with_agent("sc-priv", &[]).await;
    let manifest = sleepers(
        &[
            ("priv", json!({ "privileged": true })),
            ("plain", json!({})),
        ],
        json!({}),
    );
    let name = case.create("p", manifest).await;
    let all = containers(&name, 2).await;
    let host_caps = std::fs::read_to_string("/proc/self/status").expect("own status");
    let host_bounding = host_caps
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(str::trim)
        .expect("CapBnd");
    assert_eq!(status(&all, "priv", "1", "CapBnd").await, host_bounding);
    assert_ne!(status(&all, "plain", "1", "CapBnd").await, host_bounding);
    let count = |out: String| out.parse::<usize>().expect("a count");
    let privileged = count(sh(&all, "priv", "ls /dev | wc -l").await.0);
    let plain = count(sh(&all, "plain", "ls /dev | wc -l").await.0);
    assert!(
        privileged > plain + 5,
        "{privileged} host devices, {plain} otherwise"
    );
    let mounts = sh(&all, "priv", "cat /proc/self/mountinfo").await.0;
    assert!(!mounts.contains(" /proc/keys "), "nothing is masked");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn run_as_non_root_refuses_a_root_image_and_accepts_a_user() {
    let case = Case::with_agent("sc-nonroot", &[]).await;
    let refused = case
        .create(
            "root",
            sleepers(&[("c", json!({ "runAsNonRoot": true }))], json!({})),
        )
        .await;
    let waiting = config_error(&refused).await;
    let uid = get(&refused)
        .await
        .and_then(|p| p.metadata.uid)
        .expect("uid");
    let message = format!(
        "container has runAsNonRoot and image will run as root (pod: \"{refused}_default({uid})\", container: c)"
    );
    assert_eq!(waiting.message.as_deref(), Some(message.as_str()));
    let event = eventually("the Failed event", Duration::from_secs(30), || async {
        events_of(&refused)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Failed"))
    })
    .await;
    assert_eq!(event.message, Some(format!("Error: {message}")));
    let made = containers_of(&uid, None).await;
    assert!(made.is_empty(), "no container was created: {made:?}");

    let accepted = case
        .create(
            "user",
            sleepers(
                &[("c", json!({ "runAsNonRoot": true, "runAsUser": 1000 }))],
                json!({}),
            ),
        )
        .await;
    let all = containers(&accepted, 1).await;
    assert_eq!(sh(&all, "c", "id -u").await.0, "1000");

    // runAsUser 0 cannot be non-root.
    let zero = json!({ "runAsNonRoot": true, "runAsUser": 0 });
    let broken = case
        .create("zero", sleepers(&[("c", zero)], json!({})))
        .await;
    let waiting = config_error(&broken).await;
    let uid = get(&broken)
        .await
        .and_then(|p| p.metadata.uid)
        .expect("uid");
    assert_eq!(
        waiting.message,
        Some(format!(
            "container's runAsUser breaks non-root policy (pod: \"{broken}_default({uid})\", container: c)"
        ))
    );
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn host_and_shared_namespaces_are_visible_in_the_container() {
    let case = Case::with_agent("sc-ns", &[]).await;
    let shared = json!({
        "shareProcessNamespace": true,
        "securityContext": { "runAsUser": 1000 },
    });
    let name = case
        .create("shared", sleepers(&[("c", json!({}))], shared))
        .await;
    let all = containers(&name, 1).await;
    // PID 1 is the sandbox's pause, run as the pod's user with the runtime's default
    // seccomp profile.
    assert!(init_cmdline(&all).await.contains("pause"));
    assert!(status(&all, "c", "1", "Uid").await.starts_with("1000"));
    assert_eq!(status(&all, "c", "1", "Seccomp").await, "2");

    let own = case
        .create("own", sleepers(&[("c", json!({}))], json!({})))
        .await;
    let all = containers(&own, 1).await;
    assert_eq!(init_cmdline(&all).await, "sleep 3600");
    let host_ipc = std::fs::read_link("/proc/self/ns/ipc").expect("own ipc namespace");
    let host_ipc = host_ipc.to_string_lossy();
    assert_ne!(ipc_namespace(&all).await, host_ipc);

    let host = json!({ "hostPID": true, "hostIPC": true });
    let name = case
        .create("host", sleepers(&[("c", json!({}))], host))
        .await;
    let all = containers(&name, 1).await;
    let host_init = std::fs::read("/proc/1/cmdline").expect("the host's init");
    let host_init = String::from_utf8_lossy(&host_init).replace('\0', " ");
    assert_eq!(init_cmdline(&all).await, host_init.trim());
    assert_eq!(ipc_namespace(&all).await, host_ipc);
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_localhost_seccomp_profile_from_the_agents_root_dir_applies() {
    let case = Case::with_agent("sc-localhost", &[]).await;
    // `<root-dir>/seccomp/<localhostProfile>`, as the kubelet finds profiles.
    let dir = common::case::root_dir()
        .join("seccomp")
        .join(&case.pods.label);
    std::fs::create_dir_all(&dir).expect("profile dir");
    let profile = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{ "names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO" }],
    });
    std::fs::write(dir.join("deny-mkdir.json"), profile.to_string()).expect("profile");
    let localhost = json!({ "seccompProfile": {
        "type": "Localhost",
        "localhostProfile": format!("{}/deny-mkdir.json", case.pods.label),
    }});
    let manifest = sleepers(&[("denied", localhost), ("plain", json!({}))], json!({}));
    let name = case.create("p", manifest).await;
    let all = containers(&name, 2).await;
    let result = async |c: &str| sh(&all, c, "mkdir /tmp/d").await.1;
    let (denied, plain) = (result("denied").await, result("plain").await);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status(&all, "denied", "1", "Seccomp").await, "2");
    assert_ne!(denied, 0, "mkdir is refused by the profile");
    assert_eq!(plain, 0);
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_group_without_a_user_runs_as_the_images_user() {
    let case = Case::with_agent("sc-group", &[]).await;
    let manifest = sleepers(&[("c", json!({ "runAsGroup": 5000 }))], json!({}));
    let name = case.create("p", manifest).await;
    let all = containers(&name, 1).await;
    // busybox names no user: root, with the container's group.
    assert_eq!(sh(&all, "c", "id -u; id -g").await.0, "0\n5000");
    drop(case);
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn pod_sysctls_take_effect_in_the_pods_namespaces_only() {
    let case = Case::with_agent("sc-sysctl", &["--allowed-unsafe-sysctls", "kernel.msgmax"]).await;
    // Two safe sysctls (IPC and network namespace) and an unsafe one the flag allows.
    let sysctls = [
        ("kernel.shm_rmid_forced", "1"),
        ("net.ipv4.ip_local_port_range", "1024\t65000"),
        ("kernel.msgmax", "65536"),
    ];
    let host_before: Vec<String> = sysctls.iter().map(|(k, _)| host_sysctl(k)).collect();
    for ((key, value), host) in sysctls.iter().zip(&host_before) {
        assert_ne!(
            host, value,
            "{key} must differ on the host for the test to tell"
        );
    }
    let spec = json!({ "securityContext": { "sysctls": sysctls
        .iter()
        .map(|(k, v)| json!({ "name": k, "value": v.replace('\t', " ") }))
        .collect::<Vec<_>>() } });
    let name = case.create("p", sleepers(&[("c", json!({}))], spec)).await;
    let all = containers(&name, 1).await;
    for (key, value) in sysctls {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        assert_eq!(
            sh(&all, "c", &format!("cat {path}")).await,
            (value.to_owned(), 0),
            "{key}"
        );
    }
    let host_after: Vec<String> = sysctls.iter().map(|(k, _)| host_sysctl(k)).collect();
    assert_eq!(host_after, host_before, "the host's values are left alone");
    drop(case);
}

/// A sysctl's value on the host.
fn host_sysctl(key: &str) -> String {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_owned()
}
