//! The container runtime's cgroup driver, from its verbose CRI `Status`, checked against
//! `--cgroup-driver` at start (as the kubelet's dockershim checked Docker's): a runtime
//! making its containers' cgroups with the other driver would put them outside the pod
//! cgroups the agent made. containerd reports its CRI configuration as JSON in the `info`
//! map's `config`: the default runtime (`containerd.defaultRuntimeName`, `runc` when
//! unset) in `containerd.runtimes` (or `runtimes`), whose runc `options.SystemdCgroup`
//! picks the driver (runc's default, cgroupfs, when unset); the legacy
//! `io.containerd.runtime.v1.linux` shim reads the top-level `systemdCgroup`. A runtime
//! that does not say is let be, with a warning.

use std::collections::HashMap;

use serde_json::Value;

use super::cgroup_manager::{CgroupDriver, CmError};
use crate::cri::{Cri, api};

/// What the runtime's status says of its cgroup driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeDriver {
    /// The driver, and the setting that says so (`SystemdCgroup = false`).
    Known {
        /// The driver.
        driver: CgroupDriver,
        /// The runtime's setting, as its configuration spells it.
        setting: String,
    },
    /// The status does not tell; why.
    Unknown(String),
}

/// The shims that run runc and read `SystemdCgroup` from their options.
const RUNC_SHIMS: &[&str] = &["io.containerd.runc.v2", "io.containerd.runc.v1"];
/// The legacy shim, configured by the plugin's `systemd_cgroup`.
const LEGACY_SHIM: &str = "io.containerd.runtime.v1.linux";

fn known(systemd: bool, setting: String) -> RuntimeDriver {
    RuntimeDriver::Known {
        driver: if systemd {
            CgroupDriver::Systemd
        } else {
            CgroupDriver::Cgroupfs
        },
        setting,
    }
}

/// The runtime's cgroup driver from a verbose `Status`'s `info`.
#[must_use]
pub fn runtime_cgroup_driver(info: &HashMap<String, String>) -> RuntimeDriver {
    let Some(config) = info.get("config") else {
        return RuntimeDriver::Unknown("its status has no configuration".into());
    };
    let config: Value = match serde_json::from_str(config) {
        Ok(config) => config,
        Err(e) => return RuntimeDriver::Unknown(format!("its configuration is not JSON: {e}")),
    };
    let containerd = config.get("containerd");
    let field = |name: &str| {
        containerd
            .and_then(|c| c.get(name))
            .or_else(|| config.get(name))
    };
    let name = field("defaultRuntimeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or("runc");
    let runtime = field("runtimes").and_then(|r| r.get(name)).or_else(|| {
        // containerd before 1.4: the deprecated `default_runtime` table.
        containerd
            .and_then(|c| c.get("defaultRuntime"))
            .filter(|r| {
                r.get("runtimeType")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty())
            })
    });
    let Some(runtime) = runtime else {
        return RuntimeDriver::Unknown(format!("its configuration has no runtime {name:?}"));
    };
    let kind = runtime
        .get("runtimeType")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let options = runtime.get("options").filter(|o| o.is_object());
    if let Some((key, value)) = options.and_then(Value::as_object).and_then(|o| {
        o.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("SystemdCgroup"))
    }) {
        return match value.as_bool() {
            Some(systemd) => known(systemd, format!("{key} = {systemd}")),
            None => RuntimeDriver::Unknown(format!("runtime {name:?} has {key} = {value}")),
        };
    }
    if RUNC_SHIMS.contains(&kind) {
        return known(false, "SystemdCgroup unset: runc's default".into());
    }
    if kind == LEGACY_SHIM
        && let Some(systemd) = config.get("systemdCgroup").and_then(Value::as_bool)
    {
        return known(systemd, format!("systemd_cgroup = {systemd}"));
    }
    RuntimeDriver::Unknown(format!(
        "runtime {name:?} ({kind}) does not say which cgroup driver it uses"
    ))
}

/// Refuses a runtime whose cgroup driver is not `ours`.
///
/// # Errors
/// [`CmError::DriverMismatch`], naming both.
pub fn compare(ours: CgroupDriver, runtime: &RuntimeDriver) -> Result<(), CmError> {
    match runtime {
        RuntimeDriver::Known { driver, setting } if *driver != ours => {
            Err(CmError::DriverMismatch {
                ours,
                runtime: *driver,
                setting: setting.clone(),
            })
        }
        RuntimeDriver::Known { setting, .. } => {
            tracing::info!(driver = %ours, setting, "the container runtime uses the same cgroup driver");
            Ok(())
        }
        RuntimeDriver::Unknown(why) => {
            tracing::warn!(
                driver = %ours,
                why,
                "cannot tell the container runtime's cgroup driver; going on with --cgroup-driver"
            );
            Ok(())
        }
    }
}

/// Asks the runtime for its verbose status and refuses a different cgroup driver; a
/// status that cannot be read is warned about.
///
/// # Errors
/// [`CmError::DriverMismatch`].
pub async fn check_runtime_driver<C: Cri>(ours: CgroupDriver, cri: &C) -> Result<(), CmError> {
    match cri.status(api::StatusRequest { verbose: true }).await {
        Ok(status) => compare(ours, &runtime_cgroup_driver(&status.info)),
        Err(e) => compare(
            ours,
            &RuntimeDriver::Unknown(format!("its status cannot be read: {e}")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// containerd 1.6.20's `config` for `crictl info`, as `/etc/containerd/config.toml`
    /// with `SystemdCgroup = {systemd}` in the runc runtime's options gives it.
    fn containerd_config(options: &str) -> String {
        format!(
            r#"{{
  "containerd": {{
    "snapshotter": "overlayfs",
    "defaultRuntimeName": "runc",
    "defaultRuntime": {{
      "runtimeType": "", "runtimePath": "", "runtimeEngine": "", "PodAnnotations": null,
      "ContainerAnnotations": null, "runtimeRoot": "", "options": null,
      "privileged_without_host_devices": false, "baseRuntimeSpec": "", "cniConfDir": "", "cniMaxConfNum": 0
    }},
    "untrustedWorkloadRuntime": {{
      "runtimeType": "", "runtimePath": "", "runtimeEngine": "", "PodAnnotations": null,
      "ContainerAnnotations": null, "runtimeRoot": "", "options": null,
      "privileged_without_host_devices": false, "baseRuntimeSpec": "", "cniConfDir": "", "cniMaxConfNum": 0
    }},
    "runtimes": {{
      "runc": {{
        "runtimeType": "io.containerd.runc.v2",
        "runtimePath": "",
        "runtimeEngine": "",
        "PodAnnotations": null,
        "ContainerAnnotations": null,
        "runtimeRoot": "",
        "options": {options},
        "privileged_without_host_devices": false,
        "baseRuntimeSpec": "",
        "cniConfDir": "",
        "cniMaxConfNum": 0
      }}
    }},
    "noPivot": false,
    "disableSnapshotAnnotations": true,
    "discardUnpackedLayers": false,
    "ignoreRdtNotEnabledErrors": false
  }},
  "cni": {{
    "binDir": "/opt/cni/bin", "confDir": "/etc/cni/net.d", "maxConfNum": 1,
    "confTemplate": "", "ipPref": ""
  }},
  "registry": {{
    "configPath": "", "mirrors": null, "configs": null, "auths": null, "headers": null
  }},
  "imageDecryption": {{ "keyModel": "node" }},
  "disableTCPService": true,
  "streamServerAddress": "127.0.0.1",
  "streamServerPort": "0",
  "streamIdleTimeout": "4h0m0s",
  "enableSelinux": false,
  "selinuxCategoryRange": 1024,
  "sandboxImage": "registry.k8s.io/pause:3.6",
  "statsCollectPeriod": 10,
  "systemdCgroup": false,
  "enableTLSStreaming": false,
  "x509KeyPairStreaming": {{ "tlsCertFile": "", "tlsKeyFile": "" }},
  "maxContainerLogSize": 16384,
  "disableCgroup": false,
  "disableApparmor": false,
  "restrictOOMScoreAdj": false,
  "maxConcurrentDownloads": 3,
  "disableProcMount": false,
  "unsetSeccompProfile": "",
  "tolerateMissingHugetlbController": true,
  "disableHugetlbController": true,
  "device_ownership_from_security_context": false,
  "ignoreImageDefinedVolumes": false,
  "netnsMountsUnderStateDir": false,
  "enableUnprivilegedPorts": false,
  "enableUnprivilegedICMP": false,
  "containerdRootDir": "/var/lib/containerd",
  "containerdEndpoint": "/run/containerd/containerd.sock",
  "rootDir": "/var/lib/containerd/io.containerd.grpc.v1.cri",
  "stateDir": "/run/containerd/io.containerd.grpc.v1.cri"
}}"#
        )
    }

    /// A verbose status's `info`, with the other keys containerd puts there.
    fn info(config: String) -> HashMap<String, String> {
        HashMap::from([
            ("config".to_owned(), config),
            ("golang".to_owned(), "\"go1.19.8\"".to_owned()),
            ("lastCNILoadStatus".to_owned(), "\"OK\"".to_owned()),
            ("lastCNILoadStatus.default".to_owned(), "\"OK\"".to_owned()),
        ])
    }

    const RUNC_OPTIONS: &str = r#"{
          "BinaryName": "", "CriuImagePath": "", "CriuPath": "", "CriuWorkPath": "",
          "IoGid": 0, "IoUid": 0, "NoNewKeyring": false, "NoPivotRoot": false,
          "Root": "", "ShimCgroup": "", "SystemdCgroup": SYSTEMD
        }"#;

    fn with_systemd(systemd: bool) -> HashMap<String, String> {
        info(containerd_config(
            &RUNC_OPTIONS.replace("SYSTEMD", &systemd.to_string()),
        ))
    }

    #[test]
    fn containerd_says_its_driver_in_the_runc_options() {
        assert_eq!(
            runtime_cgroup_driver(&with_systemd(true)),
            RuntimeDriver::Known {
                driver: CgroupDriver::Systemd,
                setting: "SystemdCgroup = true".into()
            }
        );
        assert_eq!(
            runtime_cgroup_driver(&with_systemd(false)),
            RuntimeDriver::Known {
                driver: CgroupDriver::Cgroupfs,
                setting: "SystemdCgroup = false".into()
            }
        );
        // No options at all: runc's own default.
        let unset = runtime_cgroup_driver(&info(containerd_config("null")));
        assert!(
            matches!(
                &unset,
                RuntimeDriver::Known {
                    driver: CgroupDriver::Cgroupfs,
                    ..
                }
            ),
            "{unset:?}"
        );
    }

    #[test]
    fn a_mismatch_stops_the_start_naming_both() {
        let err = compare(
            CgroupDriver::Systemd,
            &runtime_cgroup_driver(&with_systemd(false)),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--cgroup-driver=systemd but the container runtime uses cgroupfs (SystemdCgroup = false)"
        );
        let err = compare(
            CgroupDriver::Cgroupfs,
            &runtime_cgroup_driver(&with_systemd(true)),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--cgroup-driver=cgroupfs but the container runtime uses systemd (SystemdCgroup = true)"
        );
        compare(
            CgroupDriver::Systemd,
            &runtime_cgroup_driver(&with_systemd(true)),
        )
        .unwrap();
        compare(
            CgroupDriver::Cgroupfs,
            &runtime_cgroup_driver(&with_systemd(false)),
        )
        .unwrap();
    }

    #[test]
    fn the_default_runtime_is_the_one_read() {
        // A kata default, runc with systemd beside it: kata's options say nothing.
        let config = containerd_config(&RUNC_OPTIONS.replace("SYSTEMD", "true")).replace(
            r#""defaultRuntimeName": "runc""#,
            r#""defaultRuntimeName": "kata""#,
        );
        let mut json: Value = serde_json::from_str(&config).unwrap();
        json["containerd"]["runtimes"]["kata"] = serde_json::json!({
            "runtimeType": "io.containerd.kata.v2",
            "options": { "ConfigPath": "/etc/kata/configuration.toml" }
        });
        let found = runtime_cgroup_driver(&info(json.to_string()));
        assert!(matches!(found, RuntimeDriver::Unknown(_)), "{found:?}");
        // Unknown: going on.
        compare(CgroupDriver::Systemd, &found).unwrap();
    }

    #[test]
    fn runtimes_that_do_not_say_are_unknown() {
        assert!(matches!(
            runtime_cgroup_driver(&HashMap::new()),
            RuntimeDriver::Unknown(_)
        ));
        assert!(matches!(
            runtime_cgroup_driver(&info("not json".into())),
            RuntimeDriver::Unknown(_)
        ));
        // The runtimes at the top level, as a newer layout has them.
        let flat = serde_json::json!({
            "defaultRuntimeName": "runc",
            "runtimes": { "runc": { "runtimeType": "io.containerd.runc.v2", "options": { "SystemdCgroup": true } } }
        });
        assert!(matches!(
            runtime_cgroup_driver(&info(flat.to_string())),
            RuntimeDriver::Known {
                driver: CgroupDriver::Systemd,
                ..
            }
        ));
        // The legacy shim reads the plugin's systemd_cgroup.
        let legacy = serde_json::json!({
            "containerd": { "defaultRuntimeName": "runc", "runtimes": { "runc": { "runtimeType": "io.containerd.runtime.v1.linux", "options": null } } },
            "systemdCgroup": true
        });
        assert_eq!(
            runtime_cgroup_driver(&info(legacy.to_string())),
            RuntimeDriver::Known {
                driver: CgroupDriver::Systemd,
                setting: "systemd_cgroup = true".into()
            }
        );
    }

    /// A runtime answering `Status` with this `info` when asked verbosely.
    struct Runtime(HashMap<String, String>);

    impl Cri for Runtime {
        async fn status(&self, req: api::StatusRequest) -> crate::cri::Result<api::StatusResponse> {
            Ok(api::StatusResponse {
                status: None,
                info: if req.verbose {
                    self.0.clone()
                } else {
                    HashMap::new()
                },
            })
        }
    }

    #[tokio::test]
    async fn the_start_asks_the_runtime_verbosely() {
        let cgroupfs = Runtime(with_systemd(false));
        check_runtime_driver(CgroupDriver::Cgroupfs, &cgroupfs)
            .await
            .unwrap();
        let err = check_runtime_driver(CgroupDriver::Systemd, &cgroupfs)
            .await
            .unwrap_err();
        assert!(matches!(err, CmError::DriverMismatch { .. }), "{err}");
        // A runtime without a status to tell goes on.
        check_runtime_driver(CgroupDriver::Systemd, &Runtime(HashMap::new()))
            .await
            .unwrap();
    }
}
