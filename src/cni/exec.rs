//! The process boundary: finding a plugin binary, running it with a per-command
//! environment and the network config on stdin, and reading its answer the way libcni does.

use std::ffi::OsString;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;

use super::CniError;
use super::error::ErrorResult;

/// A CNI command, the value of `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach a container to the network.
    Add,
    /// Detach it; idempotent, best-effort.
    Del,
    /// Verify an attachment is still as `ADD` left it.
    Check,
    /// Report the CNI versions the plugin supports.
    Version,
}

impl Command {
    /// The `CNI_COMMAND` value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Command {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ADD" => Ok(Self::Add),
            "DEL" => Ok(Self::Del),
            "CHECK" => Ok(Self::Check),
            "VERSION" => Ok(Self::Version),
            other => Err(format!("unsupported CNI_COMMAND {other:?}")),
        }
    }
}

/// What a plugin process left: its exit code and both output streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOutput {
    /// The exit code; `None` when killed by a signal.
    pub exit_code: Option<i32>,
    /// Standard output: the result, or a CNI error result.
    pub stdout: Vec<u8>,
    /// Standard error: diagnostics, if any.
    pub stderr: Vec<u8>,
}

/// Runs one plugin binary. [`ProcessExec`] is the real one; tests use a fake.
///
/// `env` is the plugin's whole CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`, ...);
/// `stdin` its network config. Only a failure to run the plugin at all is an `Err`: a
/// plugin that ran and failed is an `Ok` with a non-zero exit code.
pub trait PluginExec: Send + Sync + 'static {
    /// Runs `plugin` to completion.
    fn exec(
        &self,
        plugin: &Path,
        env: &[(String, String)],
        stdin: &[u8],
    ) -> impl Future<Output = std::io::Result<PluginOutput>> + Send;
}

/// Runs plugins as child processes (`tokio::process`), each with a cleared environment
/// holding only its CNI variables and `PATH` (portmap runs `iptables`), in a process group
/// of its own that is killed whole if it does not finish within the timeout: a plugin that
/// hangs in a child of its own (a script waiting on a command) leaves no orphan behind.
#[derive(Debug, Clone)]
pub struct ProcessExec {
    timeout: Duration,
    path: OsString,
}

/// `PATH` for plugins when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl ProcessExec {
    /// A runner that gives each plugin run `timeout` to finish. Plugins get the agent's
    /// own `PATH` (read once, here).
    #[must_use]
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            path: std::env::var_os("PATH")
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| DEFAULT_PATH.into()),
        }
    }
}

impl PluginExec for ProcessExec {
    async fn exec(
        &self,
        plugin: &Path,
        env: &[(String, String)],
        stdin: &[u8],
    ) -> std::io::Result<PluginOutput> {
        let mut child = tokio::process::Command::new(plugin)
            .env_clear()
            .env("PATH", &self.path)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()?;
        let group = child.id().and_then(|id| i32::try_from(id).ok());
        let mut pipe = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the child has no stdin pipe"))?;
        let feed = async move {
            // A plugin may exit without reading all of stdin: its exit status tells.
            let _ = pipe.write_all(stdin).await;
        };
        let mut run = std::pin::pin!(async {
            let ((), output) = tokio::join!(feed, child.wait_with_output());
            output
        });
        let Ok(output) = tokio::time::timeout(self.timeout, &mut run).await else {
            // The plugin's whole group goes while its leader is still there (not reaped,
            // so the group id cannot have been reused); the child itself is reaped once
            // `run` is dropped.
            if let Some(group) = group {
                let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.timeout),
            ));
        };
        let output = output?;
        Ok(PluginOutput {
            exit_code: output.status.code(),
            stdout: output.stdout,
            stderr: output.stderr,
        })
    }
}

/// The first executable file named `plugin` in `bin_dirs`.
pub(crate) async fn find_plugin(plugin: &str, bin_dirs: &[PathBuf]) -> Result<PathBuf, CniError> {
    for dir in bin_dirs {
        let path = dir.join(plugin);
        if let Ok(meta) = tokio::fs::metadata(&path).await
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Ok(path);
        }
    }
    Err(CniError::PluginNotFound {
        plugin: plugin.to_owned(),
        searched: bin_dirs.to_vec(),
    })
}

/// A plugin's stdout when it succeeded, else its failure as [`CniError::Plugin`], read as
/// libcni does: a CNI error result on stdout if there is one, else stdout or stderr text.
pub(crate) fn plugin_answer(
    output: PluginOutput,
    plugin: &str,
    command: Command,
    container_id: &str,
) -> Result<Vec<u8>, CniError> {
    if output.exit_code == Some(0) {
        return Ok(output.stdout);
    }
    let status = match output.exit_code {
        Some(code) => format!("exit status {code}"),
        None => "killed by a signal".to_owned(),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (code, msg, details) = match serde_json::from_slice::<ErrorResult>(&output.stdout) {
        Ok(e) if e.code != 0 || !e.msg.is_empty() => (e.code, e.msg, e.details),
        _ if !stdout.trim().is_empty() => {
            (0, format!("{status}: {}", stdout.trim()), String::new())
        }
        _ if !stderr.trim().is_empty() => {
            (0, format!("{status}: {}", stderr.trim()), String::new())
        }
        _ => (0, format!("{status}, no error message"), String::new()),
    };
    if !stderr.trim().is_empty() {
        tracing::debug!(plugin, %command, container_id, stderr = %stderr.trim(), "CNI plugin stderr");
    }
    Err(CniError::Plugin {
        plugin: plugin.to_owned(),
        command,
        container_id: container_id.to_owned(),
        code,
        msg,
        details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::testutil::{TempDir, bin_dir};

    fn failed(exit_code: Option<i32>, stdout: &str, stderr: &str) -> CniError {
        let output = PluginOutput {
            exit_code,
            stdout: stdout.into(),
            stderr: stderr.into(),
        };
        plugin_answer(output, "bridge", Command::Add, "c1").unwrap_err()
    }

    #[test]
    fn a_cni_error_result_becomes_a_plugin_error() {
        let err = failed(
            Some(1),
            r#"{"cniVersion":"0.4.0","code":7,"msg":"bad","details":"why"}"#,
            "",
        );
        let CniError::Plugin {
            plugin,
            command,
            container_id,
            code,
            msg,
            details,
        } = err
        else {
            panic!("not a plugin error: {err}");
        };
        assert_eq!(
            (plugin.as_str(), command, container_id.as_str()),
            ("bridge", Command::Add, "c1")
        );
        assert_eq!((code, msg.as_str(), details.as_str()), (7, "bad", "why"));
    }

    #[test]
    fn non_json_failures_keep_what_the_plugin_said() {
        let from_stderr = failed(Some(2), "", "panic: oops\n");
        assert!(
            from_stderr
                .to_string()
                .ends_with("(code 0): exit status 2: panic: oops"),
            "{from_stderr}"
        );
        let from_stdout = failed(Some(1), "plain text", "");
        assert!(
            from_stdout
                .to_string()
                .ends_with("exit status 1: plain text"),
            "{from_stdout}"
        );
        let silent = failed(None, "", "");
        assert!(
            silent
                .to_string()
                .ends_with("killed by a signal, no error message"),
            "{silent}"
        );
    }

    #[test]
    fn success_hands_back_stdout() {
        let output = PluginOutput {
            exit_code: Some(0),
            stdout: b"{}".to_vec(),
            stderr: b"noise".to_vec(),
        };
        assert_eq!(
            plugin_answer(output, "loopback", Command::Del, "c").unwrap(),
            b"{}"
        );
    }

    #[test]
    fn commands_round_trip_through_their_env_value() {
        for c in [Command::Add, Command::Del, Command::Check, Command::Version] {
            assert_eq!(c.as_str().parse::<Command>().unwrap(), c);
        }
        assert!("GC".parse::<Command>().is_err());
    }

    #[tokio::test]
    async fn plugins_are_searched_in_bin_dir_order_and_must_be_executable() {
        let first = bin_dir(&["bridge"]);
        let second = bin_dir(&["bridge", "portmap"]);
        let dirs = vec![first.path().to_owned(), second.path().to_owned()];
        assert_eq!(
            find_plugin("bridge", &dirs).await.unwrap(),
            first.path().join("bridge")
        );
        assert_eq!(
            find_plugin("portmap", &dirs).await.unwrap(),
            second.path().join("portmap")
        );
        let plain = TempDir::new("noexec");
        std::fs::write(plain.path().join("tuning"), b"").unwrap();
        let err = find_plugin("tuning", &[plain.path().to_owned()])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CniError::PluginNotFound { plugin, searched } if plugin == "tuning" && searched.len() == 1),
            "{err}"
        );
    }

    /// Runs a script written just now. A test thread forking at the moment the script was
    /// open for writing makes exec fail with ETXTBSY for a short while: retry then.
    async fn run_fresh_script(
        exec: &ProcessExec,
        script: &Path,
        env: &[(String, String)],
        stdin: &[u8],
    ) -> std::io::Result<PluginOutput> {
        const ETXTBSY: i32 = 26;
        let mut tries = 0;
        loop {
            match exec.exec(script, env, stdin).await {
                Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    }

    #[tokio::test]
    async fn process_exec_passes_only_the_given_env_and_stdin() {
        let dir = TempDir::new("exec");
        let script = dir.path().join("echo-plugin");
        std::fs::write(
            &script,
            "#!/bin/sh\nenv | sort | grep -v '^PWD=' | grep -v '^SHLVL=' | grep -v '^_='\necho --\ncat\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exec = ProcessExec::new(Duration::from_secs(10));
        let env = vec![("CNI_COMMAND".to_owned(), "ADD".to_owned())];
        let out = run_fresh_script(&exec, &script, &env, b"{\"a\":1}")
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(3));
        let stdout = String::from_utf8(out.stdout).unwrap();
        let (env_part, stdin_part) = stdout.split_once("--\n").unwrap();
        let names: Vec<_> = env_part
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        assert_eq!(names, ["CNI_COMMAND", "PATH"], "{env_part}");
        assert_eq!(stdin_part, "{\"a\":1}");
    }

    #[tokio::test]
    async fn process_exec_kills_a_plugin_that_hangs_with_its_children() {
        let dir = TempDir::new("hang");
        let script = dir.path().join("hang");
        let pids = dir.path().join("pids");
        // The shell waits on a child of its own: killing the shell alone would orphan it.
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nsleep 30 &\necho $$ $! > {}.tmp\nmv {0}.tmp {0}\nwait\n",
                pids.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exec = ProcessExec::new(Duration::from_millis(500));
        let err = run_fresh_script(&exec, &script, &[], b"")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let pids = std::fs::read_to_string(&pids).expect("the plugin ran");
        let pids: Vec<u32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        assert_eq!(pids.len(), 2, "{pids:?}");
        let proc = crate::procfs::ProcFs::default();
        for _ in 0..100 {
            if !pids.iter().any(|p| proc.running(*p)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the plugin or its child outlived the timeout: {pids:?}");
    }
}
