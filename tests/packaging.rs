//! rkubelet's image and its systemd unit, as a node gets them: the image built by
//! `scripts/image.sh` with buildah (from the local Debian base, no registry) around the
//! binary under test runs `rkubelet --version` as the kubelet prints it; the unit and
//! kubeadm-style drop-in installed in that image pass `systemd-analyze verify`, and the
//! command line systemd would run, with the flags kubeadm writes for a kind worker, is one
//! the image's rkubelet accepts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What `kubeadm join` writes to /var/lib/kubelet/kubeadm-flags.env on a kind worker
/// (kind v0.10, node image v1.20.2, containerd): the flags in kubeadm's order (sorted).
const KIND_WORKER_KUBEADM_FLAGS: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime=remote \
--container-runtime-endpoint=unix:///run/containerd/containerd.sock --fail-swap-on=false \
--node-ip=172.18.0.3 --provider-id=kind://docker/kind/kind-worker\"\n";

fn output(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn buildah(args: &[&str]) -> String {
    let out = output(
        Command::new("buildah")
            .args(args)
            .env("BUILDAH_ISOLATION", "chroot")
            .env("CONTAINERS_CONF", containers_conf()),
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The CNI configuration directory `scripts/image.sh` gives buildah: `buildah from` and
/// `buildah run` set up their network library even with no network and would otherwise
/// make `/etc/cni/net.d` on a machine that has none.
fn buildah_cni_dir() -> String {
    let cache = std::env::var("RKUBELET_CACHE").unwrap_or_else(|_| "/var/cache/rkubelet".into());
    format!("{cache}/images/buildah-cni")
}

/// The containers.conf `scripts/image.sh` writes for buildah: `buildah inspect` takes no
/// `--cni-config-dir` and would make `/etc/cni/net.d` too.
fn containers_conf() -> String {
    let cache = std::env::var("RKUBELET_CACHE").unwrap_or_else(|_| "/var/cache/rkubelet".into());
    format!("{cache}/images/containers.conf")
}

/// The image of the binary under test, built by the project's script under a name of its
/// own, and a working container of it; both removed on drop.
struct Image {
    name: String,
    container: String,
}

impl Image {
    fn build() -> Self {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let name = format!(
            "localhost/rkubelet-test:{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("a clock after 1970")
                .subsec_nanos()
        );
        output(
            Command::new("bash")
                .arg(repo.join("scripts/image.sh"))
                .arg("build")
                .env("RKUBELET_BINARY", env!("CARGO_BIN_EXE_rkubelet"))
                .env("RKUBELET_IMAGE", &name),
        );
        let container = buildah(&[
            "from",
            "--cni-config-dir",
            &buildah_cni_dir(),
            "--pull=never",
            &name,
        ]);
        Self { name, container }
    }

    /// Runs ARGS in the working container and returns what it did.
    fn run(&self, args: &[String]) -> Output {
        Command::new("buildah")
            .args([
                "run",
                "--cni-config-dir",
                &buildah_cni_dir(),
                "--network",
                "none",
            ])
            .args([&self.container, "--"])
            .args(args)
            .env("BUILDAH_ISOLATION", "chroot")
            .output()
            .expect("buildah run")
    }

    fn mount(&self) -> PathBuf {
        buildah(&["mount", &self.container]).into()
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        for args in [
            ["umount", &self.container],
            ["rm", &self.container],
            ["rmi", &self.name],
        ] {
            let _ = Command::new("buildah").args(args).output();
        }
    }
}

#[test]
#[ignore = "needs root, buildah and debootstrap: run scripts/test.sh"]
fn the_image_builds_with_buildah_and_runs_rkubelet_version() {
    let image = Image::build();
    let out = image.run(&["rkubelet".into(), "--version".into()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "Kubernetes v1.20.2+rkubelet-{}\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    let entrypoint = buildah(&[
        "inspect",
        "--format",
        "{{.OCIv1.Config.Entrypoint}}",
        &image.name,
    ]);
    assert_eq!(entrypoint, "[/usr/bin/rkubelet]");
}

#[test]
#[ignore = "needs root, buildah and debootstrap: run scripts/test.sh"]
fn the_kubelet_unit_verifies_and_its_command_line_is_accepted() {
    let image = Image::build();
    let root = image.mount();

    // systemd's own check of the unit and its drop-ins, against the image's files (its
    // systemd, its /usr/bin/rkubelet): no error and no warning.
    let out = output(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.display()))
            .args(["--man=no", "kubelet.service"]),
    );
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(warnings.trim().is_empty(), "{warnings}");
    assert!(
        root.join("etc/systemd/system/multi-user.target.wants/kubelet.service")
            .is_symlink(),
        "kubelet.service is enabled"
    );

    // The node as kubeadm leaves a kind worker; the container is thrown away afterwards.
    // The administrator's file overrides one of kubeadm's flags.
    for (path, text) in [
        (
            "var/lib/kubelet/kubeadm-flags.env",
            KIND_WORKER_KUBEADM_FLAGS,
        ),
        (
            "etc/default/kubelet",
            "KUBELET_EXTRA_ARGS=--node-ip=172.18.0.4\n",
        ),
    ] {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }

    let unit = read_unit(&root, "lib/systemd/system/kubelet.service");
    let drop_in = read_unit(
        &root,
        "etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
    );
    let command = exec_start(&root, &[unit, drop_in]);
    assert_eq!(command[..2], ["/usr/bin/rkubelet", "run"], "{command:?}");
    for flag in [
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
        "--kubeconfig=/etc/kubernetes/kubelet.conf",
        "--config=/var/lib/kubelet/config.yaml",
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
        "--node-ip=172.18.0.4",
    ] {
        assert!(command.iter().any(|a| a == flag), "{flag} in {command:?}");
    }
    // `--help` last: rkubelet parses (and so validates) every flag before it, then prints
    // its help instead of starting.
    let mut args = command;
    args.push("--help".into());
    let out = image.run(&args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_unit(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The command line systemd runs for a service made of UNIT_FILES (the unit, then its
/// drop-ins in order), with ROOT as `/`: `Environment=` and `EnvironmentFile=` assignments
/// in order (a later one wins, a missing `-` file is skipped), the last `ExecStart=` after
/// the last empty one, and `$NAME` replaced by the words of its value, as systemd does.
fn exec_start(root: &Path, unit_files: &[String]) -> Vec<String> {
    let mut env = HashMap::new();
    let mut exec = None;
    for line in unit_files.iter().flat_map(|f| f.lines()).map(str::trim) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "Environment" => {
                let (name, value) = value
                    .trim_matches('"')
                    .split_once('=')
                    .unwrap_or_else(|| panic!("Environment={value} is no NAME=VALUE"));
                env.insert(name.to_owned(), value.to_owned());
            }
            "EnvironmentFile" => {
                let (optional, path) = match value.strip_prefix('-') {
                    Some(path) => (true, path),
                    None => (false, value),
                };
                match std::fs::read_to_string(root.join(path.trim_start_matches('/'))) {
                    Ok(text) => env.extend(text.lines().filter_map(|l| {
                        let (name, value) = l.trim().split_once('=')?;
                        (!name.starts_with('#'))
                            .then(|| (name.to_owned(), value.trim_matches('"').to_owned()))
                    })),
                    Err(e) => assert!(optional, "EnvironmentFile {path}: {e}"),
                }
            }
            "ExecStart" if value.is_empty() => exec = None,
            "ExecStart" => exec = Some(value.to_owned()),
            _ => {}
        }
    }
    let exec = exec.expect("an ExecStart");
    exec.split_whitespace()
        .flat_map(|word| match word.strip_prefix('$') {
            Some(name) => env
                .get(name)
                .map(|v| v.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            None => vec![word.to_owned()],
        })
        .collect()
}
