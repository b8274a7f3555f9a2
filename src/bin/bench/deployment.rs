//! The `deployment` scenario: a Deployment of N replicas through the scheduler and the
//! controllers, timed like a burst. It uses the shared pod and result helpers and knows no
//! other scenario.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::pods::{ApiArgs, client, container, time_pods, timings_json};
use crate::results::run_id;

pub async fn deployment(args: ApiArgs) -> anyhow::Result<Value> {
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
                        "containers": [container(&args.image)]
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
    Ok(timings_json("deployment", &args, &t))
}
