//! Pod networking through the standard CNI plugins (bridge, host-local, portmap, loopback,
//! ...), driven by the agent itself: this module speaks the CNI protocol (spec 0.4.0 and
//! 1.0.0) to the plugin binaries, as libcni does for containerd and the kubelet's dockershim.
//!
//! - [`load_conflist`] reads the node's network config list and fills in its pod CIDR.
//! - [`Cni`] attaches a pod sandbox's network namespace to that network: it brings up `lo`
//!   with the loopback plugin, then runs the plugin chain (`ADD` in order with each result
//!   threaded on as `prevResult`, `DEL` in reverse, `CHECK` in order), injects the
//!   `portMappings` runtime config into the plugins that declare the capability, rolls a
//!   failed `ADD` back, and caches every result on disk so that `DEL` works after a
//!   restart and after the config on disk changed.
//! - [`shim`] is the thin `rkubelet-cni` plugin that containerd runs instead of a real
//!   chain, and the socket server that answers it, so that the agent is the one owner of
//!   pod networking even though containerd 1.6 always runs CNI itself.
//! - [`routes`] keeps the routes to the other nodes' pods (host-gw or vxlan), from a watch
//!   on every Node.
//!
//! The process boundary is the [`PluginExec`] trait: [`ProcessExec`] runs the binaries,
//! and the unit tests use a fake, so all chain logic is tested without root.
//!
//! Knows no pod worker, runtime manager or kubelet API: it is handed a sandbox's network
//! namespace and returns its network.

mod bridge;
pub(crate) mod cache;
mod chain;
mod config;
mod error;
mod exec;
mod gc;
mod result;
pub mod routes;
pub mod shim;

pub use bridge::{BridgeOps, IpBridgeOps, reconcile_bridge};
pub use chain::{Attachment, Cni, PodNetworkRef, PortMapping, Protocol};
pub use config::{NetworkConfigList, POD_CIDR_PLACEHOLDER, load_conflist};
pub use error::CniError;
pub use exec::{Command, PluginExec, PluginOutput, ProcessExec};
pub use result::{CniResult, Interface, IpConfig};

/// Where CNI plugin binaries are searched, in this order, when no bin dir is configured:
/// the upstream default, then the directory of Debian's containernetworking-plugins.
pub const DEFAULT_BIN_DIRS: [&str; 2] = ["/opt/cni/bin", "/usr/lib/cni"];

/// The name of a pod's interface in its network namespace, as everywhere in Kubernetes.
pub const POD_IFNAME: &str = "eth0";

/// The CNI spec versions a network config list may declare.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["0.4.0", "1.0.0"];

#[cfg(test)]
pub(crate) mod testutil {
    //! Temporary directories and a scriptable fake [`PluginExec`] for the unit tests.

    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::{Value, json};

    use super::{PluginExec, PluginOutput};

    /// A directory under the system temp dir, removed when dropped.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(label: &str) -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("rkubelet-cni-{label}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("create temp dir");
            Self(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A bin dir holding empty executable files with the given plugin names.
    pub fn bin_dir(plugins: &[&str]) -> TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new("bin");
        for p in plugins {
            let path = dir.path().join(p);
            std::fs::write(&path, b"").expect("write fake plugin");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .expect("chmod fake plugin");
        }
        dir
    }

    /// One plugin run seen by [`FakeExec`].
    #[derive(Debug, Clone)]
    pub struct Call {
        /// The plugin's file name.
        pub plugin: String,
        pub env: HashMap<String, String>,
        pub stdin: Value,
    }

    impl Call {
        pub fn command(&self) -> &str {
            &self.env["CNI_COMMAND"]
        }
        /// `bridge ADD`, for compact assertions on the order of calls.
        pub fn short(&self) -> String {
            format!("{} {}", self.plugin, self.command())
        }
    }

    /// Behaves like well-mannered plugins: `bridge` and `ptp` ADD answer a result with one
    /// address on eth0 (10.244.1.<n>/24, n counting up), every other ADD passes its
    /// `prevResult` through (like portmap) or answers an empty result, and DEL/CHECK
    /// succeed. `fail` makes a given `plugin COMMAND` answer a CNI error instead.
    #[derive(Default)]
    pub struct FakeExec {
        pub calls: Mutex<Vec<Call>>,
        failures: Mutex<HashMap<String, PluginOutput>>,
        next_ip: AtomicUsize,
        delay: Option<std::time::Duration>,
        in_flight: AtomicUsize,
        pub max_in_flight: AtomicUsize,
    }

    impl FakeExec {
        pub fn with_delay(delay: std::time::Duration) -> Self {
            Self {
                delay: Some(delay),
                ..Self::default()
            }
        }

        /// Makes `plugin command` (e.g. `portmap ADD`) fail with a CNI error result.
        pub fn fail(&self, what: &str, code: u32, msg: &str) {
            self.fail_with(
                what,
                PluginOutput {
                    exit_code: Some(1),
                    stdout: json!({"cniVersion": "0.4.0", "code": code, "msg": msg})
                        .to_string()
                        .into_bytes(),
                    stderr: Vec::new(),
                },
            );
        }

        pub fn fail_with(&self, what: &str, output: PluginOutput) {
            self.failures
                .lock()
                .expect("lock")
                .insert(what.to_owned(), output);
        }

        /// Undoes `fail`: the plugin and command succeed again.
        pub fn heal(&self, what: &str) {
            self.failures.lock().expect("lock").remove(what);
        }

        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().expect("lock").clone()
        }

        pub fn short_calls(&self) -> Vec<String> {
            self.calls().iter().map(Call::short).collect()
        }

        fn answer(&self, call: &Call) -> PluginOutput {
            if let Some(out) = self.failures.lock().expect("lock").get(&call.short()) {
                return out.clone();
            }
            let ok = |stdout: Vec<u8>| PluginOutput {
                exit_code: Some(0),
                stdout,
                stderr: Vec::new(),
            };
            match (call.command(), call.plugin.as_str()) {
                ("ADD", "bridge" | "ptp") => {
                    let n = self.next_ip.fetch_add(1, Ordering::Relaxed) + 2;
                    let netns = &call.env["CNI_NETNS"];
                    ok(json!({
                        "cniVersion": call.stdin["cniVersion"],
                        "interfaces": [
                            {"name": "rk0", "mac": "aa:aa:aa:aa:aa:01"},
                            {"name": "veth1", "mac": "aa:aa:aa:aa:aa:02"},
                            {"name": "eth0", "mac": "aa:aa:aa:aa:aa:03", "sandbox": netns}
                        ],
                        "ips": [{"version": "4", "interface": 2,
                                 "address": format!("10.244.1.{n}/24"), "gateway": "10.244.1.1"}],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dns": {}
                    })
                    .to_string()
                    .into_bytes())
                }
                ("ADD", _) => ok(call
                    .stdin
                    .get("prevResult")
                    .cloned()
                    .unwrap_or_else(|| json!({"cniVersion": call.stdin["cniVersion"]}))
                    .to_string()
                    .into_bytes()),
                ("VERSION", _) => ok(json!({"cniVersion": "1.0.0",
                    "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]})
                .to_string()
                .into_bytes()),
                _ => ok(Vec::new()),
            }
        }
    }

    impl PluginExec for FakeExec {
        async fn exec(
            &self,
            plugin: &Path,
            env: &[(String, String)],
            stdin: &[u8],
        ) -> std::io::Result<PluginOutput> {
            let call = Call {
                plugin: plugin
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                env: env.iter().cloned().collect(),
                stdin: serde_json::from_slice(stdin).expect("stdin is JSON"),
            };
            self.calls.lock().expect("lock").push(call.clone());
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            if let Some(d) = self.delay {
                tokio::time::sleep(d).await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(self.answer(&call))
        }
    }
}
