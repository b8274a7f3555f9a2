//! The `sources` scenario: N pods that all use one Secret and one ConfigMap (env and
//! volumes), timed like a burst, and the agent's reads of them counted from the API
//! server's audit log. It uses the shared pod and result helpers and knows no other
//! scenario.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::pods::{ApiArgs, bound_pods, client, container, timings_json};
use crate::results::run_id;

#[derive(Debug, clap::Args)]
pub struct SourcesArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The API server's audit log.
    #[arg(long)]
    audit_log: PathBuf,
}

/// The sources scenario: N pods that all use one Secret and one ConfigMap, in their
/// environment (`secretKeyRef`, `configMapKeyRef`, `envFrom`) and as volumes; timed like a
/// burst, and the agent's reads of Secrets and ConfigMaps counted from the API server's
/// audit log, from the first create until all pods are gone.
pub async fn sources(args: SourcesArgs) -> anyhow::Result<Value> {
    let SourcesArgs { api, audit_log } = args;
    let client = client(&api.kubeconfig).await?;
    let name = format!("{}-src", run_id());
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client, "default");
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": name }, "stringData": { "password": "p", "user": "u" }
            }))?,
        )
        .await?;
    config_maps
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": name }, "data": { "color": "blue", "size": "L" }
            }))?,
        )
        .await?;
    let spec = |_| {
        let mut c = container(&api.image);
        c["env"] = json!([
            { "name": "PASSWORD", "valueFrom": { "secretKeyRef": { "name": name, "key": "password" } } },
            { "name": "COLOR", "valueFrom": { "configMapKeyRef": { "name": name, "key": "color" } } },
        ]);
        c["envFrom"] = json!([{ "configMapRef": { "name": name } }]);
        c["volumeMounts"] = json!([
            { "name": "secret", "mountPath": "/secret" },
            { "name": "config", "mountPath": "/config" },
        ]);
        json!({
            "containers": [c],
            "volumes": [
                { "name": "secret", "secret": { "secretName": name } },
                { "name": "config", "configMap": { "name": name } },
            ],
        })
    };
    let from = Timestamp::now();
    let hold = std::future::ready(Ok(Value::Null));
    let t = bound_pods(&api, spec, hold).await?;
    let reads = audited_reads(
        &audit_log,
        &format!("system:node:{}", api.single_node()?),
        from,
    )?;
    secrets.delete(&name, &DeleteParams::default()).await?;
    config_maps.delete(&name, &DeleteParams::default()).await?;
    let mut result = timings_json("sources", &api, &t);
    #[allow(clippy::cast_precision_loss)]
    let per_pod = reads.values().sum::<u64>() as f64 / api.count.max(1) as f64;
    result["reads"] = json!(reads);
    result["reads_per_pod"] = json!((per_pod * 100.0).round() / 100.0);
    Ok(result)
}

/// The reads of Secrets and ConfigMaps by `user` since `from` in the API server's audit
/// log (one line per request, see scripts/cluster.sh), by `<verb> <resource>`.
fn audited_reads(log: &Path, user: &str, from: Timestamp) -> anyhow::Result<BTreeMap<String, u64>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut reads = BTreeMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let at = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok());
        if event["user"]["username"] != user || at.is_none_or(|at| at < from) {
            continue;
        }
        let key = format!(
            "{} {}",
            event["verb"].as_str().unwrap_or_default(),
            event["objectRef"]["resource"].as_str().unwrap_or_default()
        );
        *reads.entry(key).or_default() += 1;
    }
    Ok(reads)
}
