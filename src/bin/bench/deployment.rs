//! The `deployment` scenario: a Deployment of N replicas through the scheduler and the
//! controllers, timed like a burst; with `--exec-probes`, each replica has an exec
//! readiness and an exec liveness probe every second (issue 47's Deployment of 100 such
//! pods). It uses the shared pod and result helpers and knows no other scenario.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::pods::{ApiArgs, client, container, exec_probe, time_pods, timings_json};
use crate::results::run_id;

#[derive(Debug, clap::Args)]
pub struct DeploymentArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// Each replica with an exec readiness and an exec liveness probe every second.
    #[arg(long)]
    exec_probes: bool,
}

/// The replicas' container: probed by exec when asked.
fn replica(image: &str, exec_probes: bool) -> Value {
    let mut c = container(image);
    if exec_probes {
        c["readinessProbe"] = exec_probe();
        c["livenessProbe"] = exec_probe();
    }
    c
}

pub async fn deployment(args: DeploymentArgs) -> anyhow::Result<Value> {
    let DeploymentArgs {
        api: args,
        exec_probes,
    } = args;
    let node = args.single_node()?;
    let client = client(&args.kubeconfig).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let run = run_id();
    let create = || async {
        let d: Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": run },
            "spec": {
                "replicas": args.count,
                "selector": { "matchLabels": { "bench": run } },
                "template": {
                    "metadata": { "labels": { "bench": run } },
                    "spec": {
                        "nodeSelector": { "kubernetes.io/hostname": node },
                        "containers": [replica(&args.image, exec_probes)]
                    }
                }
            }
        }))?;
        let started = Instant::now();
        deployments.create(&PostParams::default(), &d).await?;
        Ok(started)
    };
    let delete = async {
        deployments
            .delete(&run, &DeleteParams::foreground())
            .await?;
        Ok(())
    };
    let t = time_pods(
        pods,
        &run,
        args.count,
        Duration::from_secs(args.timeout),
        create,
        std::future::ready(Ok(Value::Null)),
        delete,
    )
    .await?;
    let kind = if exec_probes {
        "deployment with exec probes"
    } else {
        "deployment"
    };
    Ok(timings_json(kind, &args, &t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_probed_by_exec_every_second_when_asked() {
        let plain = replica("busybox", false);
        assert!(plain.get("readinessProbe").is_none());
        let probed = replica("busybox", true);
        for kind in ["readinessProbe", "livenessProbe"] {
            assert_eq!(probed[kind]["exec"]["command"], json!(["true"]));
            assert_eq!(probed[kind]["periodSeconds"], 1);
        }
    }
}
