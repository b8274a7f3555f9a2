//! One test's turn on the node: the agent for `rk-node1`, started once per test with the
//! flags it needs, the test's bare pods, and the small waits most pod tests share.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

use super::agent::{AgentProcess, Owner};
use super::pods::{TestPods, pods_api};
use super::{API_RETRY, eventually, node_name, retrying, unique};

/// The tests share one node: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The agent's root dir: one per node across test files, as on a real node.
pub fn root_dir() -> PathBuf {
    super::state_dir().join("test-agents").join(node_name())
}

/// One test's turn on the node: its pods (removed first when dropped, while the agent
/// still runs), then the agent, then the test's clean-ups of the node, then the turn.
pub struct Case {
    /// The test's pods.
    pub pods: TestPods,
    agent: Option<AgentProcess>,
    after_agent: Vec<Box<dyn Send>>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Case {
    /// Waits for the node, then prepares pods named `<prefix>-…`; no agent yet.
    pub async fn new(prefix: &str) -> Self {
        let turn = ONE_AT_A_TIME.lock().await;
        Self {
            pods: TestPods::new(&unique(prefix), root_dir()),
            agent: None,
            after_agent: Vec::new(),
            _turn: turn,
        }
    }

    /// Waits for the node and starts the agent with `extra` flags.
    pub async fn with_agent(prefix: &str, extra: &[&str]) -> Self {
        let mut case = Self::new(prefix).await;
        case.start_agent(extra);
        case
    }

    /// Keeps `cleanup` until the agent has stopped, and drops it before the turn ends: what
    /// it takes away from the node (files the agent left, fields of the Node) is gone
    /// before the next test's agent starts, never under it.
    pub fn clean_up_after_agent(&mut self, cleanup: impl Send + 'static) {
        self.after_agent.push(Box::new(cleanup));
    }

    /// (Re)starts the agent: the one running stops first.
    pub fn start_agent(&mut self, extra: &[&str]) {
        self.start_agent_with(None, extra, &[]);
    }

    /// (Re)starts the agent with its CNI config from `cni_conf_dir` (the repository's if
    /// `None`), `extra` flags and `env` added to its environment.
    pub fn start_agent_with(
        &mut self,
        cni_conf_dir: Option<&std::path::Path>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) {
        drop(self.agent.take());
        let repo_conf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cni-config");
        self.agent = Some(AgentProcess::start_with(
            Owner::Agent,
            &node_name(),
            root_dir(),
            cni_conf_dir.unwrap_or(&repo_conf),
            extra,
            env,
        ));
    }

    /// The running agent, to wait for its end.
    pub fn agent_mut(&mut self) -> &mut AgentProcess {
        self.agent.as_mut().expect("the agent runs")
    }

    /// Stops the agent (SIGTERM); its pods keep running.
    pub fn stop_agent(&mut self) {
        if let Some(agent) = self.agent.take() {
            agent.stop();
        }
    }

    /// Kills the agent (SIGKILL), as a crash would; its pods keep running.
    pub fn crash_agent(&mut self) {
        if let Some(agent) = self.agent.take() {
            agent.crash();
        }
    }

    /// The running agent.
    pub fn agent(&self) -> &AgentProcess {
        self.agent.as_ref().expect("the agent runs")
    }

    /// The log file of the first run of `container` of the pod `name` (UID `uid`), under
    /// the agent's pod logs dir.
    pub fn log_of(&self, name: &str, uid: &str, container: &str) -> PathBuf {
        self.agent()
            .root_dir
            .join("logs")
            .join(format!("default_{name}_{uid}"))
            .join(container)
            .join("0.log")
    }

    /// Creates the pod `<label>-<suffix>` from `manifest`, bound to the node; its name.
    pub async fn create(&self, suffix: &str, mut manifest: serde_json::Value) -> String {
        let name = format!("{}-{suffix}", self.pods.label);
        manifest["metadata"]["name"] = name.clone().into();
        self.pods.create(&node_name(), manifest).await;
        name
    }
}

/// The pod named `name` in `default`; `None` only when the API answers 404. Other errors
/// are retried for [`API_RETRY`], then fail the test.
pub async fn get(name: &str) -> Option<Pod> {
    get_in(&pods_api().await, name, API_RETRY).await
}

/// The pod named `name` from `api`; `None` only when the API answers 404. Other errors are
/// retried for `within`, then fail the test.
pub async fn get_in(api: &Api<Pod>, name: &str, within: Duration) -> Option<Pod> {
    retrying(&format!("reading pod {name}"), within, || api.get_opt(name)).await
}

/// Deletes a pod gracefully and waits until the agent has finished its deletion.
pub async fn delete_and_wait(name: &str) {
    pods_api()
        .await
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        &format!("{name} deleted"),
        Duration::from_secs(30),
        || async { get(name).await.is_none().then_some(()) },
    )
    .await;
}

/// The pod's phase.
pub fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

/// The pod's status reason and message.
pub fn reason_and_message(pod: &Pod) -> (Option<&str>, Option<&str>) {
    let status = pod.status.as_ref();
    (
        status.and_then(|s| s.reason.as_deref()),
        status.and_then(|s| s.message.as_deref()),
    )
}

/// Waits (60 s at most) until the pod runs.
pub async fn running(name: &str) -> Pod {
    eventually(
        &format!("{name} Running"),
        Duration::from_secs(60),
        || async { get(name).await.filter(|p| phase(p) == Some("Running")) },
    )
    .await
}

/// Waits until the pod failed.
pub async fn failed(name: &str, timeout: Duration) -> Pod {
    eventually(&format!("{name} Failed"), timeout, || async {
        get(name).await.filter(|p| phase(p) == Some("Failed"))
    })
    .await
}
