//! A real `rkubelet run` process for integration tests, with only the node's identity.
//! Stopped with SIGTERM when dropped (so it removes its thin-plugin conflist), or killed
//! with SIGKILL by a test that wants a crash. A stop checks how the agent ended: exit
//! status 0 within 10 s of SIGTERM (it cancels its work and returns from `main`), no
//! panic in its log since it started, and no exit before it was asked to; anything else
//! fails the test. The SIGTERM waits (up to 10 s) until the agent has its handler
//! installed: an agent stopped right after its start is not killed half loaded.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::state_dir;

/// How the agent wires pod networks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `--network-owner=agent`.
    Agent,
    /// `--network-owner=runtime`.
    Runtime,
}

/// A running agent.
pub struct AgentProcess {
    child: Option<Child>,
    /// Its root dir.
    pub root_dir: PathBuf,
    /// Its log file.
    pub log: PathBuf,
    /// Where this run's lines start in the log (earlier runs append to the same file).
    log_start: u64,
}

/// How long the agent may take to exit after SIGTERM.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// The node IP the cluster put on the host (scripts/common.sh `NODE_IP`).
pub const NODE_IP: &str = "198.18.0.1";

/// A high TCP port free on the node IP now (the kernel's pick), for a host-network pod to
/// listen on.
pub fn free_port_on_node_ip() -> u16 {
    let listener = std::net::TcpListener::bind((NODE_IP, 0)).expect("a port on the node IP");
    listener.local_addr().expect("its address").port()
}

/// The eviction thresholds test agents run with. The shared build machine's disk is often
/// more than 85% full: with the kubelet's `nodefs.available<10%` and
/// `imagefs.available<15%` every test's pods would be evicted. A full disk still is
/// pressure; a test may give its own thresholds (the last `--eviction-hard` wins).
pub const TEST_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<1%,nodefs.inodesFree<1%,imagefs.available<1%";

/// The image GC high threshold test agents run with: 100 disables image GC, as kind
/// configures its nodes (on a disk more than 85% full, the kubelet's default would remove
/// every unused image of the shared containerd at each agent's start, under the other
/// tests). A test may give its own (the last `--image-gc-high-threshold` wins).
pub const TEST_IMAGE_GC_HIGH_THRESHOLD: &str = "100";

impl AgentProcess {
    /// Starts `rkubelet run` as node `node` with the cluster's dirs and the repository's
    /// CNI config.
    pub fn start(owner: Owner, node: &str, root_dir: PathBuf) -> Self {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        Self::start_with_cni_conf(owner, node, root_dir, &repo.join("cni-config"))
    }

    /// Starts `rkubelet run` with the agent's CNI config from `cni_conf_dir`.
    pub fn start_with_cni_conf(
        owner: Owner,
        node: &str,
        root_dir: PathBuf,
        cni_conf_dir: &std::path::Path,
    ) -> Self {
        Self::spawn(
            owner,
            node,
            root_dir,
            cni_conf_dir,
            &serving_args(node, true),
        )
    }

    /// Starts `rkubelet run` as [`Self::start`] does, with `extra` flags after the others.
    pub fn start_with_args(owner: Owner, node: &str, root_dir: PathBuf, extra: &[&str]) -> Self {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        Self::start_with(owner, node, root_dir, &repo.join("cni-config"), extra, &[])
    }

    /// Starts `rkubelet run` with the agent's CNI config from `cni_conf_dir`, `extra` flags
    /// after the others, and `env` added to its environment.
    pub fn start_with(
        owner: Owner,
        node: &str,
        root_dir: PathBuf,
        cni_conf_dir: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut args = serving_args(node, true);
        args.extend(extra.iter().map(std::ffi::OsString::from));
        let kubeconfig = minted_kubeconfig(node);
        Self::spawn_with_env(owner, node, root_dir, cni_conf_dir, &kubeconfig, &args, env)
    }

    /// Starts `rkubelet run` with `--kubeconfig kubeconfig` (which need not exist yet)
    /// instead of the node's minted one, without the kubelet API (`--port 0`), and `extra`
    /// flags after the others.
    pub fn start_with_kubeconfig(
        node: &str,
        root_dir: PathBuf,
        kubeconfig: &std::path::Path,
        extra: &[&str],
    ) -> Self {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let args: Vec<std::ffi::OsString> = ["--port", "0", "--healthz-port", "0"]
            .iter()
            .chain(extra)
            .map(std::ffi::OsString::from)
            .collect();
        let cni = repo.join("cni-config");
        Self::spawn_with_env(Owner::Agent, node, root_dir, &cni, kubeconfig, &args, &[])
    }

    /// Starts `rkubelet run` whose kubelet API has the cluster CA for client certificates
    /// and, instead of the node's minted serving certificate, `server_args`.
    pub fn start_with_server_args(
        owner: Owner,
        node: &str,
        root_dir: PathBuf,
        server_args: &[std::ffi::OsString],
    ) -> Self {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut args = serving_args(node, false);
        args.extend_from_slice(server_args);
        Self::spawn(owner, node, root_dir, &repo.join("cni-config"), &args)
    }

    fn spawn(
        owner: Owner,
        node: &str,
        root_dir: PathBuf,
        cni_conf_dir: &std::path::Path,
        server_args: &[std::ffi::OsString],
    ) -> Self {
        let kubeconfig = minted_kubeconfig(node);
        Self::spawn_with_env(
            owner,
            node,
            root_dir,
            cni_conf_dir,
            &kubeconfig,
            server_args,
            &[],
        )
    }

    fn spawn_with_env(
        owner: Owner,
        node: &str,
        root_dir: PathBuf,
        cni_conf_dir: &std::path::Path,
        kubeconfig: &std::path::Path,
        server_args: &[std::ffi::OsString],
        env: &[(&str, &str)],
    ) -> Self {
        let state = state_dir();
        std::fs::create_dir_all(&root_dir).expect("root dir");
        let log = root_dir.with_extension("log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let log_start = out.metadata().expect("log file").len();
        let child = Command::new(env!("CARGO_BIN_EXE_rkubelet"))
            .args(["--log-level", "info,rkubelet=debug", "run"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--hostname-override", node, "--node-ip", NODE_IP])
            .arg("--root-dir")
            .arg(&root_dir)
            .arg("--pod-logs-dir")
            .arg(root_dir.join("logs"))
            .args([
                "--network-owner",
                if owner == Owner::Agent {
                    "agent"
                } else {
                    "runtime"
                },
            ])
            .arg("--cni-conf-dir")
            .arg(cni_conf_dir)
            .arg("--cni-bin-dir")
            .arg("/usr/lib/cni")
            .arg("--runtime-cni-conf-dir")
            .arg(state.join("cni/net.d"))
            .arg("--runtime-cni-bin-dir")
            .arg(state.join("cni/bin"))
            .args(["--resolv-conf", ""])
            .args(["--eviction-hard", TEST_EVICTION_HARD])
            .args(["--image-gc-high-threshold", TEST_IMAGE_GC_HIGH_THRESHOLD])
            .args(server_args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log fd"))
            .stderr(out)
            .spawn()
            .expect("start rkubelet");
        Self {
            child: Some(child),
            root_dir,
            log,
            log_start,
        }
    }

    /// Its PID.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.as_ref().expect("running").id()).expect("pid"))
    }

    /// Its user and system CPU time so far, in seconds (`/proc/<pid>/stat`, at `USER_HZ`).
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("stat");
        let after_name = stat.rsplit_once(')').expect("comm").1;
        let fields: Vec<f64> = after_name
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|f| f.parse().expect("ticks"))
            .collect();
        (fields[0] + fields[1]) / 100.0
    }

    /// Waits up to `timeout` for the agent to exit by itself: how it ended, or `None` if it
    /// still runs.
    pub async fn exited(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: a crash, leaving whatever it was doing half done.
    pub fn crash(mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
        }
    }

    /// SIGTERM, then wait up to 10 s for a clean exit; fails the test if the agent did not
    /// end cleanly (see the module comment).
    pub fn stop(mut self) {
        if let Err(why) = self.terminate() {
            panic!("{why}\n{}", self.log_tail());
        }
    }

    /// SIGTERM, then wait up to 10 s for the exit; why the agent's end was not clean, if
    /// it was not. Nothing to say of an agent a test killed or waited for itself.
    fn terminate(&mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the agent exited by itself, before it was stopped, with {status}"
            ));
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        // A process dies of a SIGTERM that comes before its handler is installed (while it
        // is exec'd, loaded and parses its flags), whatever it does afterwards.
        let handler_by = Instant::now() + STOP_WITHIN;
        while !catches_sigterm(pid) {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "the agent exited by itself, before it was stopped, with {status}"
                ));
            }
            if Instant::now() >= handler_by {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the agent did not catch SIGTERM within {STOP_WITHIN:?} of being asked to stop (killed)"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        kill(pid, Signal::SIGTERM).map_err(|e| format!("SIGTERM to the agent: {e}"))?;
        let deadline = Instant::now() + STOP_WITHIN;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "the agent did not exit within {STOP_WITHIN:?} of SIGTERM (killed)"
                    ));
                }
                Err(e) => return Err(format!("waiting for the agent: {e}")),
            }
        };
        if status.code() != Some(0) {
            return Err(format!(
                "the agent ended with {status} on SIGTERM, not exit status 0"
            ));
        }
        let panics = panics_in(&self.this_runs_log()?).join("\n");
        if !panics.is_empty() {
            return Err(format!("the agent panicked while it ran:\n{panics}"));
        }
        Ok(())
    }

    /// The lines this run of the agent logged.
    pub fn this_runs_log(&self) -> Result<String, String> {
        let text = std::fs::read(&self.log)
            .map_err(|e| format!("reading the agent's log {}: {e}", self.log.display()))?;
        let start = usize::try_from(self.log_start).map_or(text.len(), |s| s.min(text.len()));
        Ok(String::from_utf8_lossy(&text[start..]).into_owned())
    }

    /// Whether this run's eviction manager holds the node condition `condition` (e.g.
    /// `DiskPressure`), by the last change it logged: what admission reads. The line is
    /// logged once admission can read the change.
    pub fn eviction_manager_holds(&self, condition: &str) -> bool {
        let log = self.this_runs_log().expect("the agent's log");
        let last = log
            .lines()
            .rfind(|l| l.contains("eviction manager: node conditions changed"));
        last.is_some_and(|l| l.contains(&format!("\"{condition}\"")))
    }

    /// The agent's log so far, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// The kubeconfig `cluster.sh node-credentials` made for `node`.
fn minted_kubeconfig(node: &str) -> PathBuf {
    state_dir()
        .join("pki")
        .join(format!("node-{node}.kubeconfig"))
}

/// The kubelet API's flags: on the node IP, client certificates checked against the
/// cluster CA, and (with `minted`) the serving certificate `cluster.sh node-credentials`
/// made for the node.
fn serving_args(node: &str, minted: bool) -> Vec<std::ffi::OsString> {
    let pki = state_dir().join("pki");
    let mut args: Vec<std::ffi::OsString> = vec![
        "--address".into(),
        NODE_IP.into(),
        "--client-ca-file".into(),
        pki.join("ca.crt").into(),
    ];
    if minted {
        args.push("--tls-cert-file".into());
        args.push(pki.join(format!("node-{node}-serving.crt")).into());
        args.push("--tls-private-key-file".into());
        args.push(pki.join(format!("node-{node}-serving.key")).into());
    }
    args
}

/// Whether process `pid` has a SIGTERM handler installed (`SigCgt` of
/// `/proc/<pid>/status`, a mask of signal numbers minus one).
fn catches_sigterm(pid: Pid) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1_u64 << (Signal::SIGTERM as i32 - 1)) != 0)
}

/// The lines of an agent's log that tell of a panic (Rust's panic hook writes
/// `thread '<name>' panicked at <file>:<line>` to stderr, which goes to the log).
pub fn panics_in(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.starts_with("thread '") && l.contains("' panicked at "))
        .collect()
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let ended = self.terminate();
        if let Err(why) = &ended
            && !std::thread::panicking()
        {
            panic!("{why}\n{}", self.log_tail());
        }
        // A failed test shows what the agent complained of (its log goes with the cluster).
        if std::thread::panicking() {
            if let Err(why) = ended {
                eprintln!("---- {why}");
            }
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let complaints: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect();
            eprintln!(
                "---- the agent's last warnings and errors ({}):\n{}",
                self.log.display(),
                complaints[complaints.len().saturating_sub(60)..].join("\n")
            );
        }
    }
}
