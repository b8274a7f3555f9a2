//! The thin plugin ("shim") that makes the agent the one owner of pod networking.
//!
//! containerd 1.6 runs CNI itself for every sandbox that is not hostNetwork (the first
//! conflist of its CRI `conf_dir`, plus its own loopback), and cannot be told not to. So,
//! as Multus' thick plugin does, the agent [`install`]s into containerd's `conf_dir` a
//! conflist ([`CONFLIST_NAME`], sorted first) whose only plugin is `rkubelet-cni`, a
//! symlink in containerd's `bin_dir` to the rkubelet binary. Run under that name
//! (`main` dispatches on `argv[0]`, see [`invoked_as_plugin`]), [`run_plugin`] forwards
//! its CNI environment and stdin over the Unix socket named in its config to the agent,
//! which [`bind`]s and serves it, runs its own [`Cni`] (loopback + the node's chain) and
//! answers with the chain's result, which the plugin prints for containerd. containerd
//! then takes eth0's address from it as the sandbox IP.
//!
//! Socket protocol: one request per connection, one JSON object per line each way.
//! Request: `{"command":"ADD","containerId":..,"netns":..,"ifname":..,"args":<CNI_ARGS>,
//! "config":<the plugin's stdin>}`. Answer: `{"result":<CNI result>}` for `ADD`, `{}` for
//! `DEL`/`CHECK`, or `{"error":{"code":N,"msg":..,"details":..}}`. Only peers running as
//! root or as the agent's user are served; the socket is mode 0600.

use std::ffi::OsStr;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::error::{
    CODE_DECODE, CODE_INVALID_CONFIG, CODE_INVALID_ENV, CODE_RKUBELET, ErrorResult,
};
use super::{Attachment, Cni, CniError, Command, PluginExec, PodNetworkRef, PortMapping};
use crate::atomic_file;
use crate::unix_socket::{self, OwnerSocket};

/// The plugin type and executable name of the thin plugin.
pub const PLUGIN_NAME: &str = "rkubelet-cni";

/// The file name of the shim's conflist in the runtime's CNI config dir. The `00-` prefix
/// makes it the first in lexical order, the one containerd uses.
pub const CONFLIST_NAME: &str = "00-rkubelet-shim.conflist";

/// The network name of the shim's conflist.
pub const NETWORK_NAME: &str = "rkubelet-shim";

/// The CNI version the shim's conflist declares (what containerd speaks to the plugin).
const SHIM_CNI_VERSION: &str = "0.4.0";

/// The versions the thin plugin answers `VERSION` with: those a result can be converted to.
const PLUGIN_VERSIONS: [&str; 4] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// The largest request or answer line accepted.
const MAX_MESSAGE: u64 = 1 << 20;

/// A forwarded plugin invocation.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    command: String,
    container_id: String,
    netns: String,
    ifname: String,
    args: String,
    config: Value,
}

/// The agent's answer.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Response {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorResult>,
}

/// Whether the process was started as the thin plugin: `argv[0]`'s file name is
/// [`PLUGIN_NAME`].
#[must_use]
pub fn invoked_as_plugin(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(PLUGIN_NAME))
}

/// The thin plugin's `main`: reads `CNI_*` from the environment and the network config
/// from stdin, forwards them to the agent and prints its answer on stdout (a result and
/// exit 0, or a CNI error result and exit 1). `VERSION` is answered locally. Synchronous:
/// needs no runtime, and writes nothing but its protocol to stdout.
#[must_use]
pub fn run_plugin() -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let code = thin_plugin(
        &env,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
    );
    ExitCode::from(code)
}

/// [`run_plugin`] with its inputs and output passed in. The exit code.
fn thin_plugin(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> u8 {
    let command = env("CNI_COMMAND").unwrap_or_default();
    if command == Command::Version.as_str() {
        let answer = json!({"cniVersion": "1.0.0", "supportedVersions": PLUGIN_VERSIONS});
        return print(stdout, &answer, 0);
    }
    let mut input = Vec::new();
    let config: Result<Value, ErrorResult> = stdin
        .read_to_end(&mut input)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_slice(&input).map_err(|e| e.to_string()))
        .map_err(|e| ErrorResult {
            code: CODE_DECODE,
            msg: format!("reading the network config on stdin: {e}"),
            details: String::new(),
        });
    let cni_version = config
        .as_ref()
        .ok()
        .and_then(|c| c.get("cniVersion"))
        .and_then(Value::as_str)
        .unwrap_or(SHIM_CNI_VERSION)
        .to_owned();
    let answer = config.and_then(|config| forward(&command, env, config));
    match answer {
        Ok(Some(result)) => print(stdout, &result, 0),
        Ok(None) => 0,
        Err(e) => {
            let mut error = serde_json::to_value(&e).unwrap_or_default();
            error["cniVersion"] = Value::String(cni_version);
            print(stdout, &error, 1)
        }
    }
}

fn print(stdout: &mut dyn Write, value: &Value, code: u8) -> u8 {
    match writeln!(stdout, "{value}").and_then(|()| stdout.flush()) {
        Ok(()) => code,
        Err(_) => 1,
    }
}

/// Sends one invocation to the agent at the config's `socket`; its result, if any.
fn forward(
    command: &str,
    env: &dyn Fn(&str) -> Option<String>,
    config: Value,
) -> Result<Option<Value>, ErrorResult> {
    let rkubelet_error = |msg: String| ErrorResult {
        code: CODE_RKUBELET,
        msg,
        details: String::new(),
    };
    let Some(socket) = config
        .get("socket")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return Err(ErrorResult {
            code: CODE_INVALID_CONFIG,
            msg: format!("the {PLUGIN_NAME} network config has no \"socket\""),
            details: String::new(),
        });
    };
    let request = Request {
        command: command.to_owned(),
        container_id: env("CNI_CONTAINERID").unwrap_or_default(),
        netns: env("CNI_NETNS").unwrap_or_default(),
        ifname: env("CNI_IFNAME").unwrap_or_default(),
        args: env("CNI_ARGS").unwrap_or_default(),
        config,
    };
    let mut line = serde_json::to_vec(&request).map_err(|e| rkubelet_error(e.to_string()))?;
    line.push(b'\n');
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|e| rkubelet_error(format!("rkubelet agent not reachable at {socket}: {e}")))?;
    stream
        .write_all(&line)
        .map_err(|e| rkubelet_error(format!("sending to the rkubelet agent at {socket}: {e}")))?;
    let mut answer = String::new();
    std::io::BufReader::new(stream)
        .take(MAX_MESSAGE)
        .read_line(&mut answer)
        .map_err(|e| {
            rkubelet_error(format!(
                "reading the rkubelet agent's answer at {socket}: {e}"
            ))
        })?;
    if answer.is_empty() {
        return Err(rkubelet_error(format!(
            "the rkubelet agent at {socket} closed the connection without an answer"
        )));
    }
    let response: Response = serde_json::from_str(&answer).map_err(|e| {
        rkubelet_error(format!(
            "undecodable answer from the rkubelet agent at {socket}: {e}"
        ))
    })?;
    if let Some(error) = response.error {
        return Err(error);
    }
    if command == Command::Add.as_str() && response.result.is_none() {
        return Err(rkubelet_error(format!(
            "the rkubelet agent at {socket} answered ADD without a result"
        )));
    }
    Ok(response.result)
}

/// The agent's end of the shim socket, bound and ready to [`serve`](Self::serve). The
/// socket file is removed when it is dropped.
#[derive(Debug)]
pub struct ShimListener(OwnerSocket);

/// Binds the shim socket at `socket` as [`unix_socket::bind`] does.
///
/// # Errors
/// [`CniError::Socket`] when the path holds something else than a socket, another
/// process still serves it (`AddrInUse`), or binding fails.
pub fn bind(socket: &Path) -> Result<ShimListener, CniError> {
    unix_socket::bind(socket)
        .map(ShimListener)
        .map_err(CniError::Socket)
}

impl ShimListener {
    /// Serves thin-plugin requests with `cni` until dropped (abort the task to stop).
    /// Each connection is handled in its own task, so requests run concurrently, and a
    /// request whose plugin went away still runs to completion (no half-done chain).
    pub async fn serve<E: PluginExec>(self, cni: Arc<Cni<E>>) {
        let OwnerSocket { listener, path } = &self.0;
        tracing::info!(socket = %path.display(), network = cni.network().name(), "serving the rkubelet-cni shim");
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let cni = cni.clone();
                    tokio::spawn(async move { handle_connection(stream, &cni).await });
                }
                Err(e) => {
                    // Out of file descriptors and the like: keep serving.
                    tracing::warn!(socket = %path.display(), "accepting a shim connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn handle_connection<E: PluginExec>(stream: UnixStream, cni: &Cni<E>) {
    if !unix_socket::peer_allowed(&stream, "shim") {
        return;
    }
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    match tokio::io::BufReader::new(read)
        .take(MAX_MESSAGE)
        .read_until(b'\n', &mut line)
        .await
    {
        Ok(0) => return,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!("reading a shim request: {e}");
            return;
        }
    }
    let response = match serve_request(&line, cni).await {
        Ok(result) => Response {
            result,
            error: None,
        },
        Err(e) => {
            tracing::warn!("rkubelet-cni request failed: {e}");
            Response {
                result: None,
                error: Some(ErrorResult::from(&e)),
            }
        }
    };
    let mut bytes = serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    if let Err(e) = write.write_all(&bytes).await {
        tracing::warn!("answering the rkubelet-cni plugin (gone?): {e}");
    }
}

/// Runs one forwarded invocation; the result to hand back for `ADD`.
async fn serve_request<E: PluginExec>(
    line: &[u8],
    cni: &Cni<E>,
) -> Result<Option<Value>, CniError> {
    let bad = |code, reason: String| CniError::ShimRequest { code, reason };
    let request: Request =
        serde_json::from_slice(line).map_err(|e| bad(CODE_DECODE, e.to_string()))?;
    let command: Command = request
        .command
        .parse()
        .map_err(|reason| bad(CODE_INVALID_ENV, reason))?;
    let port_mappings: Vec<PortMapping> =
        match request.config.pointer("/runtimeConfig/portMappings") {
            Some(m) => serde_json::from_value(m.clone())
                .map_err(|e| bad(CODE_DECODE, format!("runtimeConfig.portMappings: {e}")))?,
            None => Vec::new(),
        };
    let attachment = Attachment {
        container_id: request.container_id,
        netns: request.netns.into(),
        ifname: request.ifname,
        pod: pod_from_args(&request.args),
        port_mappings,
    };
    tracing::debug!(%command, container_id = %attachment.container_id, pod = ?attachment.pod, "rkubelet-cni request");
    match command {
        Command::Add => {
            let version = request
                .config
                .get("cniVersion")
                .and_then(Value::as_str)
                .unwrap_or(SHIM_CNI_VERSION);
            if !PLUGIN_VERSIONS.contains(&version) {
                return Err(CniError::IncompatibleVersion {
                    plugin: PLUGIN_NAME.to_owned(),
                    wanted: version.to_owned(),
                    supported: PLUGIN_VERSIONS.map(str::to_owned).to_vec(),
                });
            }
            let result = cni.add(&attachment).await?;
            let converted = result
                .to_version(version)
                .map_err(|reason| CniError::BadResult {
                    plugin: PLUGIN_NAME.to_owned(),
                    command,
                    reason,
                })?;
            Ok(Some(converted))
        }
        Command::Del => cni.del(&attachment).await.map(|()| None),
        Command::Check => cni.check(&attachment).await.map(|()| None),
        Command::Version => Err(bad(
            CODE_INVALID_ENV,
            "VERSION is answered by the plugin itself".into(),
        )),
    }
}

/// The pod named by `K8S_POD_NAMESPACE`, `K8S_POD_NAME` and `K8S_POD_UID` in `CNI_ARGS`.
fn pod_from_args(args: &str) -> PodNetworkRef {
    let mut pod = PodNetworkRef::default();
    for (key, value) in args.split(';').filter_map(|kv| kv.split_once('=')) {
        match key {
            "K8S_POD_NAMESPACE" => value.clone_into(&mut pod.namespace),
            "K8S_POD_NAME" => value.clone_into(&mut pod.name),
            "K8S_POD_UID" => value.clone_into(&mut pod.uid),
            _ => {}
        }
    }
    pod
}

/// The shim's conflist, pointing the plugin at `socket`.
fn shim_conflist(socket: &Path) -> Value {
    json!({
        "cniVersion": SHIM_CNI_VERSION,
        "name": NETWORK_NAME,
        "plugins": [{
            "type": PLUGIN_NAME,
            "socket": socket.to_string_lossy(),
            "capabilities": {"portMappings": true}
        }]
    })
}

/// Installs the shim for the runtime: writes [`CONFLIST_NAME`] into `runtime_conf_dir`
/// (atomically: temp file + rename, as containerd watches the dir) and makes
/// `runtime_bin_dir/rkubelet-cni` a symlink to `self_exe` (also replaced atomically).
/// Missing dirs are created. Idempotent.
///
/// # Errors
/// [`CniError::InvalidConfig`] if `self_exe` or `socket` is not absolute;
/// [`CniError::Io`] if a file cannot be written.
pub async fn install(
    runtime_conf_dir: &Path,
    runtime_bin_dir: &Path,
    self_exe: &Path,
    socket: &Path,
) -> Result<(), CniError> {
    if !self_exe.is_absolute() || !socket.is_absolute() {
        return Err(CniError::InvalidConfig {
            config: CONFLIST_NAME.to_owned(),
            reason: format!(
                "the agent binary ({}) and the socket ({}) must be absolute paths",
                self_exe.display(),
                socket.display()
            ),
        });
    }
    let io = |op, path: &Path| {
        let path = path.to_owned();
        move |source| CniError::Io { op, path, source }
    };
    for dir in [runtime_conf_dir, runtime_bin_dir] {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(io("creating the runtime's CNI dir", dir))?;
    }
    let conflist = runtime_conf_dir.join(CONFLIST_NAME);
    let mut text = serde_json::to_string_pretty(&shim_conflist(socket)).unwrap_or_default();
    text.push('\n');
    atomic_file::write_async(&conflist, text.into_bytes(), 0o644).await?;
    let link = runtime_bin_dir.join(PLUGIN_NAME);
    let (target, at) = (self_exe.to_owned(), link.clone());
    tokio::task::spawn_blocking(move || atomic_file::symlink(&target, &at))
        .await
        .map_err(|e| io("linking the shim plugin", &link)(std::io::Error::other(e)))??;
    tracing::info!(conflist = %conflist.display(), plugin = %link.display(), "installed the rkubelet-cni shim");
    Ok(())
}

/// Removes what [`install`] made, if present: the shim conflist, and the `rkubelet-cni`
/// entry of the bin dir if it is a symlink.
///
/// # Errors
/// [`CniError::Io`] if an existing file cannot be removed.
pub async fn uninstall(runtime_conf_dir: &Path, runtime_bin_dir: &Path) -> Result<(), CniError> {
    let remove = |path: PathBuf| async move {
        match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CniError::Io {
                op: "removing the rkubelet-cni shim",
                path,
                source: e,
            }),
            _ => Ok(()),
        }
    };
    let conflist = runtime_conf_dir.join(CONFLIST_NAME);
    let link = runtime_bin_dir.join(PLUGIN_NAME);
    // What a crash in the middle of an install left, too.
    for temp in [&conflist, &link].map(|p| atomic_file::temp_path(p)) {
        remove(temp).await?;
    }
    remove(conflist).await?;
    if tokio::fs::symlink_metadata(&link)
        .await
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        remove(link).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::cni::NetworkConfigList;
    use crate::cni::testutil::{FakeExec, TempDir, bin_dir};

    const CHAIN: &str = r#"{"cniVersion":"0.4.0","name":"rkubelet","plugins":[
        {"type":"bridge","bridge":"rk0"},
        {"type":"portmap","capabilities":{"portMappings":true},"snat":true}]}"#;

    struct Agent {
        _bin: TempDir,
        _cache: TempDir,
        dir: TempDir,
        socket: PathBuf,
        cni: Arc<Cni<FakeExec>>,
        server: tokio::task::JoinHandle<()>,
    }

    impl Agent {
        fn start(exec: FakeExec) -> Self {
            let bin = bin_dir(&["loopback", "bridge", "portmap"]);
            let cache = TempDir::new("shim-cache");
            let dir = TempDir::new("shim");
            let socket = dir.path().join("run/cni.sock");
            let list = NetworkConfigList::parse("test", CHAIN.as_bytes()).unwrap();
            let cni = Arc::new(Cni::new(
                list,
                vec![bin.path().to_owned()],
                cache.path().to_owned(),
                exec,
            ));
            let listener = bind(&socket).unwrap();
            let server = tokio::spawn(listener.serve(cni.clone()));
            Self {
                _bin: bin,
                _cache: cache,
                dir,
                socket,
                cni,
                server,
            }
        }

        /// Runs the thin plugin as containerd would (off the runtime's threads: it
        /// blocks), with the shim conflist's config plus `extra` on stdin.
        async fn plugin(&self, command: &str, id: &str, extra: Value) -> (u8, String) {
            let mut config = shim_conflist(&self.socket)["plugins"][0].clone();
            config["name"] = json!(NETWORK_NAME);
            config["cniVersion"] = json!(SHIM_CNI_VERSION);
            for (k, v) in extra.as_object().into_iter().flatten() {
                config[k] = v.clone();
            }
            run_thin_plugin(env(command, id, &self.dir), config.to_string()).await
        }
    }

    impl Drop for Agent {
        fn drop(&mut self) {
            self.server.abort();
        }
    }

    fn env(command: &str, id: &str, dir: &TempDir) -> HashMap<String, String> {
        let netns = dir.path().join(format!("netns-{}", id.replace('/', "_")));
        std::fs::write(&netns, b"").unwrap();
        [
            ("CNI_COMMAND", command.to_owned()),
            ("CNI_CONTAINERID", id.to_owned()),
            ("CNI_NETNS", netns.to_string_lossy().into_owned()),
            ("CNI_IFNAME", "eth0".to_owned()),
            (
                "CNI_ARGS",
                format!("K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID=uid-9;IgnoreUnknown=1;K8S_POD_NAME=web;K8S_POD_NAMESPACE=prod"),
            ),
            ("CNI_PATH", "/opt/cni/bin".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    async fn run_thin_plugin(env: HashMap<String, String>, stdin: String) -> (u8, String) {
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let code = thin_plugin(&|k| env.get(k).cloned(), &mut stdin.as_bytes(), &mut out);
            (code, String::from_utf8(out).unwrap())
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn add_check_del_through_the_socket() {
        let agent = Agent::start(FakeExec::default());
        let mode = std::fs::metadata(&agent.socket)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let mappings = json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}]}});
        let (code, out) = agent.plugin("ADD", "sb1", mappings).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.ends_with('\n'));
        let result: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(result["cniVersion"], "0.4.0");
        assert_eq!(result["ips"][0]["address"], "10.244.1.2/24");
        assert_eq!(result["ips"][0]["version"], "4");

        let calls = agent.cni.exec.calls();
        let order: Vec<_> = calls.iter().map(|c| c.short()).collect();
        assert_eq!(order, ["loopback ADD", "bridge ADD", "portmap ADD"]);
        assert_eq!(
            calls[1].env["CNI_ARGS"],
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sb1;K8S_POD_UID=uid-9"
        );
        assert_eq!(
            calls[1].stdin["name"], "rkubelet",
            "the agent's chain, not the shim's"
        );
        assert_eq!(
            calls[2].stdin["runtimeConfig"]["portMappings"][0]["hostPort"],
            8080
        );

        let (code, out) = agent.plugin("CHECK", "sb1", json!({})).await;
        assert_eq!((code, out.as_str()), (0, ""));
        let (code, out) = agent
            .plugin("DEL", "sb1", json!({"prevResult": result}))
            .await;
        assert_eq!((code, out.as_str()), (0, ""));
        let order: Vec<_> = agent.cni.exec.short_calls()[3..].to_vec();
        assert_eq!(
            order,
            [
                "loopback CHECK",
                "bridge CHECK",
                "portmap CHECK",
                "portmap DEL",
                "bridge DEL",
                "loopback DEL"
            ]
        );
    }

    #[tokio::test]
    async fn results_come_back_in_the_callers_cni_version() {
        let agent = Agent::start(FakeExec::default());
        let (code, out) = agent
            .plugin("ADD", "sb2", json!({"cniVersion": "1.0.0"}))
            .await;
        assert_eq!(code, 0, "{out}");
        let result: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(result["cniVersion"], "1.0.0");
        assert!(result["ips"][0].get("version").is_none());
        let (code, out) = agent
            .plugin("ADD", "sb3", json!({"cniVersion": "0.2.0"}))
            .await;
        assert_eq!(code, 1);
        let error: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(error["code"], 1);
        assert_eq!(agent.cni.exec.calls().len(), 3, "no ADD for sb3");
    }

    #[tokio::test]
    async fn plugin_errors_reach_containerd_as_cni_errors() {
        let exec = FakeExec::default();
        exec.fail("bridge ADD", 7, "no bridge name");
        let agent = Agent::start(exec);
        let (code, out) = agent.plugin("ADD", "sb4", json!({})).await;
        assert_eq!(code, 1);
        let error: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(error["cniVersion"], "0.4.0");
        assert_eq!(error["code"], 7);
        assert_eq!(
            error["msg"],
            "CNI plugin bridge ADD for container sb4 failed (code 7): no bridge name"
        );
        assert_eq!(
            agent.cni.exec.short_calls(),
            ["loopback ADD", "bridge ADD", "bridge DEL", "loopback DEL"]
        );
    }

    #[tokio::test]
    async fn bad_requests_are_refused_with_cni_codes() {
        let agent = Agent::start(FakeExec::default());
        let (code, out) = agent.plugin("GC", "sb5", json!({})).await;
        assert_eq!(code, 1);
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["code"], 4);
        let (code, out) = agent.plugin("ADD", "bad/id", json!({})).await;
        assert_eq!(code, 1);
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["code"], 4);
        let ports = json!({"runtimeConfig": {"portMappings": [{"hostPort": -1}]}});
        let (code, out) = agent.plugin("ADD", "sb6", ports).await;
        assert_eq!(code, 1);
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["code"], 6);
        assert!(agent.cni.exec.calls().is_empty());
    }

    #[tokio::test]
    async fn requests_run_concurrently() {
        let agent = Agent::start(FakeExec::with_delay(Duration::from_millis(100)));
        let (a, b) = tokio::join!(
            agent.plugin("ADD", "c-a", json!({})),
            agent.plugin("ADD", "c-b", json!({}))
        );
        assert_eq!((a.0, b.0), (0, 0), "{a:?} {b:?}");
        assert_eq!(agent.cni.exec.max_in_flight.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_absent_agent_is_a_clear_error() {
        let dir = TempDir::new("noagent");
        let socket = dir.path().join("none.sock");
        let stdin = json!({"cniVersion": "0.4.0", "name": NETWORK_NAME, "type": PLUGIN_NAME,
                           "socket": socket});
        let (code, out) = run_thin_plugin(env("ADD", "x", &dir), stdin.to_string()).await;
        assert_eq!(code, 1);
        let error: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(error["code"], 999);
        let msg = error["msg"].as_str().unwrap();
        assert!(
            msg.starts_with(&format!(
                "rkubelet agent not reachable at {}: ",
                socket.display()
            )),
            "{msg}"
        );

        let (code, out) =
            run_thin_plugin(env("DEL", "x", &dir), r#"{"cniVersion":"1.0.0"}"#.into()).await;
        assert_eq!(code, 1);
        let error: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (error["code"].as_u64(), error["cniVersion"].as_str()),
            (Some(7), Some("1.0.0"))
        );

        let (code, out) = run_thin_plugin(env("ADD", "x", &dir), "not json".into()).await;
        assert_eq!(code, 1);
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["code"], 6);
    }

    #[tokio::test]
    async fn version_is_answered_without_the_agent_or_stdin() {
        let dir = TempDir::new("version");
        let (code, out) = run_thin_plugin(env("VERSION", "", &dir), String::new()).await;
        assert_eq!(code, 0);
        let answer: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(answer["supportedVersions"], json!(PLUGIN_VERSIONS));
    }

    #[tokio::test]
    async fn bind_replaces_a_stale_socket_but_not_a_live_one_or_a_file() {
        let dir = TempDir::new("bind");
        let socket = dir.path().join("a.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(socket.exists(), "a stale socket file");
        let live = bind(&socket).unwrap();
        let err = bind(&socket).unwrap_err();
        assert!(err.to_string().contains("another process serves"), "{err}");
        drop(live);
        assert!(!socket.exists(), "removed on drop");
        std::fs::write(&socket, b"data").unwrap();
        let err = bind(&socket).unwrap_err();
        assert!(err.to_string().contains("non-socket"), "{err}");
    }

    #[tokio::test]
    async fn install_writes_the_conflist_and_link_and_uninstall_removes_them() {
        let dir = TempDir::new("install");
        let conf = dir.path().join("net.d");
        let bin = dir.path().join("bin");
        let exe = Path::new("/usr/local/bin/rkubelet");
        let socket = Path::new("/run/rkubelet/cni.sock");
        install(&conf, &bin, exe, socket).await.unwrap();
        install(&conf, &bin, exe, socket).await.unwrap();
        let written: Value =
            serde_json::from_slice(&std::fs::read(conf.join(CONFLIST_NAME)).unwrap()).unwrap();
        assert_eq!(
            written,
            json!({"cniVersion": "0.4.0", "name": "rkubelet-shim", "plugins": [
                {"type": "rkubelet-cni", "socket": "/run/rkubelet/cni.sock",
                 "capabilities": {"portMappings": true}}]})
        );
        let parsed =
            NetworkConfigList::parse("shim", &std::fs::read(conf.join(CONFLIST_NAME)).unwrap())
                .unwrap();
        assert_eq!(parsed.name(), NETWORK_NAME);
        assert_eq!(std::fs::read_link(bin.join(PLUGIN_NAME)).unwrap(), exe);
        let mut names: Vec<_> = std::fs::read_dir(&conf)
            .unwrap()
            .chain(std::fs::read_dir(&bin).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [CONFLIST_NAME, PLUGIN_NAME], "no temp files left");

        let err = install(&conf, &bin, Path::new("rkubelet"), socket)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");

        uninstall(&conf, &bin).await.unwrap();
        uninstall(&conf, &bin).await.unwrap();
        assert_eq!(std::fs::read_dir(&conf).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(&bin).unwrap().count(), 0);
    }

    #[test]
    fn argv0_selects_the_plugin() {
        assert!(invoked_as_plugin(OsStr::new("/opt/cni/bin/rkubelet-cni")));
        assert!(invoked_as_plugin(OsStr::new("rkubelet-cni")));
        assert!(!invoked_as_plugin(OsStr::new("/usr/bin/rkubelet")));
    }

    #[test]
    fn the_pod_comes_from_cni_args_in_any_order() {
        assert_eq!(
            pod_from_args("IgnoreUnknown=1;K8S_POD_UID=u;K8S_POD_NAME=n;K8S_POD_NAMESPACE=ns;X"),
            PodNetworkRef {
                namespace: "ns".into(),
                name: "n".into(),
                uid: "u".into()
            }
        );
        assert_eq!(pod_from_args(""), PodNetworkRef::default());
    }
}
