//! Fuzz entry points: for each parser of bytes that someone else wrote (the kubelet API's
//! clients, the operator's files and flags, CNI plugins, device plugins and CSI drivers,
//! the kernel's pseudo-files, the runtime), one function that hands the bytes to the very
//! functions the agent calls on them. The fuzz targets under `fuzz/` (cargo-fuzz, built
//! with `--cfg fuzzing`) call these; the unit test below replays every seed and every
//! input a fuzzer ever found ([`TARGETS`], `fuzz/corpus/<target>` and
//! `fuzz/regressions/<target>`) in the ordinary test run. Compiled only for those two.
//!
//! An entry point must never panic on any input: a panic, a hang or an allocation beyond
//! libFuzzer's limit (2 GiB) is a finding.

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message as _;

/// A fuzz entry point.
pub type Entry = fn(&[u8]);

/// The fuzz targets, by name (`fuzz/fuzz_targets/<name>.rs`), and their entry points.
pub const TARGETS: &[(&str, Entry)] = &[
    ("kubelet_api_request", kubelet_api_request),
    ("kubelet_api_auth", kubelet_api_auth),
    ("kubelet_config", kubelet_config),
    ("kubelet_flags", kubelet_flags),
    ("static_pod", static_pod),
    ("cni_result", cni_result),
    ("cni_files", cni_files),
    ("device_plugin", device_plugin),
    ("csi_messages", csi_messages),
    ("image_reference", image_reference),
    ("quantity", quantity),
    ("label_selector", label_selector),
    ("proc_files", proc_files),
    ("cgroup_files", cgroup_files),
    ("kubeconfig", kubeconfig),
    ("container_log", container_log),
];

/// The first byte chooses among `n` parsers; the rest is their input.
fn choose(data: &[u8], n: u8) -> (u8, &[u8]) {
    match data.split_first() {
        Some((first, rest)) => (first % n, rest),
        None => (0, data),
    }
}

fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a tokio runtime for the fuzz entry points: {e}"));
}

fn block_on<F: Future>(future: F) -> F::Output {
    RUNTIME.with(|rt| rt.block_on(future))
}

/// The kubelet API's request head (hyper's HTTP/1 parser as the server configures it),
/// then, for every request parsed, its path and query through the agent's own parsers:
/// route, authorization attributes, bearer token, log options, exec/attach/port-forward
/// options and command, `/logs/` targets, pod paths. Selector 1: a runtime streaming
/// server's response head and URL (what the exec proxy parses).
pub fn kubelet_api_request(data: &[u8]) {
    let (which, data) = choose(data, 4);
    if which == 1 {
        let _ = crate::server::streaming::parse_response_head(data);
        let _ = crate::server::streaming::backend(&text(data));
        return;
    }
    block_on(crate::server::serve_fuzzed_request_bytes(data.to_vec()));
}

/// A bearer token and a client certificate, up to authorization: the token out of its
/// header, a DER certificate read for its user (as after a verified handshake), and the
/// request's attributes and decision through a fake review API.
pub fn kubelet_api_auth(data: &[u8]) {
    block_on(crate::server::auth::fuzz_authentication(data));
}

/// A KubeletConfiguration file, YAML or JSON, decoded and planned into flag values.
pub fn kubelet_config(data: &[u8]) {
    let text = text(data);
    if let Ok(file) =
        crate::kubeletconfig::ConfigFile::decode(Path::new("/etc/kubernetes/kubelet.yaml"), &text)
    {
        let _ = crate::kubeletconfig::fields::plan(&file);
    }
}

/// A command line (arguments separated by NUL bytes) through the flag parsing the agent
/// uses (`--config` and the kubelet's flags added), and each flag value parser.
pub fn kubelet_flags(data: &[u8]) {
    let (which, data) = choose(data, 2);
    let text = text(data);
    if which == 1 {
        let _ = crate::kubeletconfig::values::parse_reservation(&text);
        let _ = crate::kubeletconfig::values::parse_taint(&text);
        let _ = crate::kubeletconfig::values::parse_timeout(&text);
        let _ = crate::node::parse_go_duration(&text);
        let _ = crate::eviction::parse_eviction_hard(&text);
        return;
    }
    let argv: Vec<std::ffi::OsString> = std::iter::once("rkubelet")
        .chain(text.split('\0'))
        .map(Into::into)
        .collect();
    let _ = crate::kubeletconfig::parse(crate::kubeletconfig::flags::command(), argv);
}

/// A static pod manifest, YAML or JSON, decoded, defaulted and validated.
pub fn static_pod(data: &[u8]) {
    let _ = crate::pod::file::decode(data, Path::new("/etc/kubernetes/manifests/p.yaml"), "n1");
}

/// A CNI plugin's result: read, its pod IPs, and converted to each version asked of it.
pub fn cni_result(data: &[u8]) {
    let Ok(raw) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(result) = crate::cni::CniResult::from_json(raw) {
        let _ = result.pod_ips();
        for version in ["0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
            let _ = result.to_version(version);
        }
    }
}

/// A CNI network configuration list and a CNI result cache file.
pub fn cni_files(data: &[u8]) {
    let (which, data) = choose(data, 2);
    if which == 0 {
        let _ = crate::cni::NetworkConfigList::parse("/etc/cni/net.d/10-fuzz.conflist", data);
    } else {
        let _ = crate::cni::cache::decode_entry(Path::new("/var/lib/cni/results/x"), data);
    }
}

/// A device plugin's registration, its device list (`ListAndWatch`), and the device
/// manager's checkpoint (the kubelet's, on a node taken over) with the plugins' `Allocate`
/// answers, through to a container's run options.
pub fn device_plugin(data: &[u8]) {
    use crate::cm::devicemanager::{api, check_registration, checkpoint};
    let (which, data) = choose(data, 4);
    match which {
        0 => {
            if let Ok(request) = api::RegisterRequest::decode(data) {
                let _ = check_registration(&request);
            }
        }
        1 => {
            if let Ok(list) = api::ListAndWatchResponse::decode(data) {
                crate::cm::devicemanager::fuzz_device_list(&list.devices);
            }
        }
        2 => {
            if let Ok(data) = checkpoint::decode(data) {
                crate::cm::devicemanager::fuzz_checkpoint(&data);
            }
        }
        _ => {
            // Past the checksum, which a fuzzer seldom gets right.
            if let Ok(data) = serde_json::from_slice::<checkpoint::CheckpointData>(data) {
                crate::cm::devicemanager::fuzz_checkpoint(&data);
            }
        }
    }
}

/// A CSI driver's answers: `NodeGetInfo` (node ID annotation, topology labels, CSINode
/// entry), `NodeGetCapabilities`, `NodeGetVolumeStats`, and the registration's versions.
pub fn csi_messages(data: &[u8]) {
    use crate::volume::csi::{api, nodeinfo};
    let (which, data) = choose(data, 4);
    match which {
        0 => {
            let Ok(info) = api::NodeGetInfoResponse::decode(data) else {
                return;
            };
            let topology = info
                .accessible_topology
                .map(|t| t.segments)
                .unwrap_or_default();
            let _ =
                nodeinfo::node_id_annotation(Some(r#"{"other":"x"}"#), "d", Some(&info.node_id));
            let labels =
                BTreeMap::from([("topology.kubernetes.io/zone".to_owned(), "a".to_owned())]);
            let _ = nodeinfo::missing_topology_labels(&labels, &topology);
            let mut spec = k8s_openapi::api::storage::v1::CSINodeSpec::default();
            nodeinfo::install_into(
                &mut spec,
                "d",
                &info.node_id,
                info.max_volumes_per_node,
                &topology,
            );
        }
        1 => {
            if let Ok(reply) = api::NodeGetCapabilitiesResponse::decode(data) {
                let _ = crate::volume::csi::capability_types(&reply);
            }
        }
        2 => {
            if let Ok(reply) = api::NodeGetVolumeStatsResponse::decode(data) {
                let _ = crate::volume::csi::usage_stats(&reply.usage);
            }
        }
        _ => {
            let versions: Vec<String> = text(data).split('\0').map(str::to_owned).collect();
            let _ = crate::volume::csi::registration::highest_supported_version(&versions);
            let _ = nodeinfo::node_id_annotation(Some(&text(data)), "d", None);
        }
    }
}

/// An image reference: validated, its registry and repository, the credentials' match.
pub fn image_reference(data: &[u8]) {
    let image = text(data);
    let _ = crate::image_reference::validate(&image);
    let _ = crate::image_reference::split_docker_domain(&image);
    let _ = crate::credentialprovider::repository(&image);
}

/// A resource quantity, read and turned into the values the agent uses.
pub fn quantity(data: &[u8]) {
    if let Ok(q) = crate::resources::Quantity::parse(&text(data)) {
        let _ = (q.value(), q.milli_value(), q.as_int64());
    }
}

/// A node selector (node affinity terms, JSON) matched against a node's labels and name.
pub fn label_selector(data: &[u8]) {
    use k8s_openapi::api::core::v1::{Node, NodeSelectorTerm};
    let Ok(terms) = serde_json::from_slice::<Vec<NodeSelectorTerm>>(data) else {
        return;
    };
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1", "labels": {"a": "1", "b": "x", "kubernetes.io/hostname": "n1"}},
    }))
    .unwrap_or_default();
    let _ = crate::lifecycle::admission::terms_match(&terms, &node);
}

/// The `/proc` files the agent reads: `meminfo`, CPU lists, `loadavg`, `os-release`,
/// hugepage directory names, `net/dev`, `stat`, `<pid>/cgroup`, `mountinfo` (mounts and
/// the cgroup layout), `resolv.conf`.
pub fn proc_files(data: &[u8]) {
    use crate::node::machine;
    let (which, data) = choose(data, 7);
    let text = text(data);
    match which {
        0 => {
            let _ = machine::parse_meminfo(&text);
            let _ = machine::parse_cpu_list(&text);
            let _ = machine::parse_loadavg_tasks(&text);
            let _ = machine::parse_os_release_pretty_name(&text);
            let _ = machine::parse_hugepage_dir(&text);
        }
        1 => {
            let _ = crate::stats::network::parse_net_dev(&text);
        }
        2 => {
            let _ = crate::stats::parse_proc_stat(&text, 100);
        }
        3 => {
            if let Some(paths) = crate::stats::cgroup::CgroupPaths::parse_proc(&text) {
                let _ = paths.name();
            }
        }
        4 => {
            let _ = crate::volume::mounter::parse_mountinfo(&text);
        }
        5 => {
            let _ = crate::cm::CgroupLayout::from_mountinfo(&text);
        }
        _ => {
            let _ = crate::dns::HostDns::parse(&text);
        }
    }
}

/// The cgroup files the stats read, v1 and v2: `cpuacct.usage` + `cpu.stat`, `cpu.stat`
/// (v2, and throttling), `memory.usage_in_bytes` + `memory.stat`, `memory.current` +
/// `memory.stat`, limits, `cpu.cfs_quota_us`, `cpu.max`, keyed files.
pub fn cgroup_files(data: &[u8]) {
    use crate::stats::cgroup;
    let (which, data) = choose(data, 8);
    let text = text(data);
    let (first, second) = text.split_once('\0').unwrap_or((&text, ""));
    match which {
        0 => {
            let _ = cgroup::parse_cpu_v1(first, second);
        }
        1 => {
            let _ = cgroup::parse_cpu_v2(&text);
            let _ = cgroup::parse_throttling(&text);
        }
        2 => {
            let _ = cgroup::parse_memory_v1(first, second);
        }
        3 => {
            let _ = cgroup::parse_memory_v2(first, second);
        }
        4 => {
            let _ = cgroup::parse_memory_limit_v1(&text);
            let _ = cgroup::parse_memory_limit_v2(&text);
        }
        5 => {
            let _ = cgroup::parse_quota_v1(&text);
            let _ = cgroup::parse_cpu_max(&text);
        }
        6 => {
            let _ = cgroup::keyed(first, second);
        }
        _ => {
            if let Ok(weight) = text.trim().parse() {
                let _ = cgroup::weight_to_shares(weight);
            }
        }
    }
}

/// A kubeconfig (the agent's, the bootstrap one) and the certificates in it: the
/// kubeconfig read as kube reads it, its user's client certificate and key (embedded
/// data; file names are not followed here) read as the agent reads them, the kubeconfig
/// the bootstrap writes made from it; DER certificates read for their identity and
/// validity.
pub fn kubeconfig(data: &[u8]) {
    let (which, data) = choose(data, 2);
    if which == 1 {
        let _ = crate::tls::x509::parse(data);
        return;
    }
    let Ok(mut config) = kube::config::Kubeconfig::from_yaml(&text(data)) else {
        return;
    };
    for user in config
        .auth_infos
        .iter_mut()
        .filter_map(|a| a.auth_info.as_mut())
    {
        user.client_certificate = None;
        user.client_key = None;
    }
    crate::certificate::bootstrap::fuzz_user_certificate(&config);
    let _ = crate::certificate::bootstrap::kubeconfig_from_bootstrap(
        &config,
        Path::new("/var/lib/kubelet/pki/kubelet-client-current.pem"),
    );
}

/// A container log file as the runtime writes it: lines in the CRI format.
pub fn container_log(data: &[u8]) {
    for line in data.split(|b| *b == b'\n') {
        let _ = crate::kuberuntime::logs::parse_cri_line(line);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Every seed and every input a fuzzer found, through its target's entry point:
    /// `fuzz/corpus/<target>/*` and `fuzz/regressions/<target>/*`.
    #[test]
    fn the_fuzz_corpora_and_findings_replay_without_a_panic() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut replayed = HashMap::new();
        for (name, entry) in TARGETS {
            for kind in ["corpus", "regressions"] {
                let dir = root.join(kind).join(name);
                let Ok(files) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for file in files {
                    let path = file.expect("a corpus entry").path();
                    let data = std::fs::read(&path).expect("a corpus file");
                    entry(&data);
                    *replayed.entry(*name).or_insert(0) += 1;
                }
            }
        }
        for (name, _) in TARGETS {
            assert!(
                replayed.get(name).copied().unwrap_or(0) > 0,
                "no seed for fuzz target {name} in fuzz/corpus/{name}"
            );
        }
    }
}
