//! The `probes` scenario: N pods each with a readiness and a liveness probe every second
//! (exec, httpGet and tcpSocket, evenly spread), timed until all are Ready, then the
//! agent's footprint while the probes run, then deletion. It uses the shared pod, `/proc`
//! and result helpers and knows no other scenario.

use serde_json::{Value, json};

use crate::pods::{ApiArgs, bound_pods, container, exec_probe, timings_json};
use crate::procfs::{AgentWindow, footprint_over};
use crate::results::merge_into;

#[derive(Debug, clap::Args)]
pub struct ProbesArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The agent, measured while the probes run.
    #[command(flatten)]
    window: AgentWindow,
}

/// The port the probed pods' HTTP server listens on; the tcp probes connect to it too.
const PROBED_PORT: u16 = 8080;

/// A probe every second, of kind `kind % 3`: exec, httpGet or tcpSocket. The kinds
/// rotate so that pods with consecutive indices use each kind once.
fn probe(kind: usize) -> Value {
    let mut probe = match kind % 3 {
        0 => exec_probe(),
        1 => json!({ "httpGet": { "path": "/hostname", "port": PROBED_PORT } }),
        _ => json!({ "tcpSocket": { "port": PROBED_PORT } }),
    };
    probe["periodSeconds"] = json!(1);
    probe
}

/// The probes scenario's container: an HTTP server (serving `/etc`, so `/hostname`
/// answers 200), with pod `i`'s readiness probe of kind `i` and liveness probe of kind
/// `i + 1`. Like [`container`], it exits at once on SIGTERM.
fn probed_container(image: &str, i: usize) -> Value {
    let mut c = container(image);
    c["command"] = json!([
        "sh",
        "-c",
        format!("trap 'exit 0' TERM; httpd -f -p {PROBED_PORT} -h /etc & wait")
    ]);
    c["ports"] = json!([{ "containerPort": PROBED_PORT }]);
    c["readinessProbe"] = probe(i);
    c["livenessProbe"] = probe(i + 1);
    c
}

/// The probes scenario: the start-up and deletion timings of the pods with probes, and
/// the agent's footprint while their probes run.
pub async fn probes(args: ProbesArgs) -> anyhow::Result<Value> {
    let ProbesArgs {
        api,
        window: AgentWindow { pid, seconds },
    } = args;
    let hold = footprint_over(pid, seconds);
    let spec = |i| json!({ "containers": [probed_container(&api.image, i)] });
    let t = bound_pods(&api, spec, hold).await?;
    let mut result = timings_json("probes", &api, &t);
    result["period_seconds"] = json!(1);
    merge_into(&mut result, &t.held);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn probes_use_each_kind_evenly_with_different_readiness_and_liveness() {
        let kind = |p: &Value| {
            ["exec", "httpGet", "tcpSocket"]
                .into_iter()
                .find(|k| p.get(*k).is_some())
                .unwrap()
        };
        let mut count: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for i in 0..6 {
            let c = probed_container("busybox", i);
            let (readiness, liveness) = (&c["readinessProbe"], &c["livenessProbe"]);
            assert_eq!(readiness["periodSeconds"], 1);
            assert_eq!(liveness["periodSeconds"], 1);
            assert_ne!(kind(readiness), kind(liveness));
            *count.entry(("readiness", kind(readiness))).or_default() += 1;
            *count.entry(("liveness", kind(liveness))).or_default() += 1;
        }
        // Six pods: each kind twice as readiness and twice as liveness probe.
        assert_eq!(count.len(), 6);
        assert!(count.values().all(|n| *n == 2));
    }
}
