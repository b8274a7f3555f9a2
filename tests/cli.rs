//! The `rkubelet` command as a kubelet user meets it, without a cluster: `--version` as the
//! kubelet prints it, a `--node-ip` that is not this host's refused with the kubelet's
//! message, plain log lines (no colour escapes) when stderr is not a terminal, and
//! `--eviction-hard` as the kubelet takes it (disk thresholds as amounts too).

use std::process::Command;

fn rkubelet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rkubelet"))
        .args(args)
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("rkubelet")
}

#[test]
fn version_is_printed_as_the_kubelet_prints_it() {
    let out = rkubelet(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Kubernetes v1.20.2+rkubelet-"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}

#[test]
fn a_node_ip_of_another_host_is_refused_and_logs_carry_no_colour() {
    // 203.0.113.0/24 is documentation space (TEST-NET-3): not this host's.
    assert_node_ip_refused(&["--node-ip", "203.0.113.77"], "203.0.113.77");
    let out = run_without_cluster(&["--hostname-override", "192.0.2.1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node IP"), "a log line: {stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "no escape sequences: {stderr:?}"
    );
}

#[test]
fn a_flag_given_twice_takes_the_later_value_as_on_the_kubelet() {
    // The systemd drop-in appends the administrator's KUBELET_EXTRA_ARGS to kubeadm's
    // flags: the later one must win, not be refused.
    assert_node_ip_refused(
        &["--node-ip", "203.0.113.1", "--node-ip", "203.0.113.78"],
        "203.0.113.78",
    );
}

#[test]
fn eviction_thresholds_are_taken_as_the_kubelet_takes_them() {
    // What conformance.sh gives both agents: past the flags, rkubelet stops only at the
    // node IP (not this host's), as the kubelet would.
    let given =
        "memory.available<100Mi,nodefs.available<1Gi,imagefs.available<2%,nodefs.inodesFree<10k";
    assert_node_ip_refused(
        &["--eviction-hard", given, "--node-ip", "203.0.113.79"],
        "203.0.113.79",
    );
    // A percentage of memory is not something rkubelet can honour: refused, named.
    let out = run_without_cluster(&["--eviction-hard", "memory.available<10%"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("memory.available<10%"), "{stderr}");
}

/// `rkubelet run` with a kubeconfig that does not exist and ARGS: it fails before it
/// needs a cluster.
fn run_without_cluster(args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "--kubeconfig", "/nonexistent"];
    all.extend_from_slice(args);
    rkubelet(&all)
}

/// Runs `rkubelet run ARGS` and expects the kubelet's refusal of node IP `ip`.
fn assert_node_ip_refused(args: &[&str], ip: &str) {
    let out = run_without_cluster(args);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refusal = format!("node IP: {ip} not found in the host's network interfaces");
    assert!(stderr.contains(&refusal), "{stderr}");
}
