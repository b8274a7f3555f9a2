//! Image pull secrets end to end, against the local cluster's private registry
//! (`PRIVATE_REGISTRY` in scripts/common.sh: htpasswd, one user): without a secret, or with
//! a wrong password, the pull fails with the kubelet's `ErrImagePull`, then
//! `ImagePullBackOff`, and its events; a `kubernetes.io/dockerconfigjson` secret, a legacy
//! `kubernetes.io/dockercfg` one, and a ServiceAccount's `imagePullSecrets` (copied into
//! the pod by the API server's ServiceAccount admission) all pull the image.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::case::{Case, get, running};
use common::pods::{events_of, pods_api};
use common::{cleanup_blocking, eventually, kube_client, node_name};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rkubelet::cri::{Cri, api};
use serde_json::json;

const REGISTRY: &str = "127.0.0.1:5001";
const IMAGE: &str = "127.0.0.1:5001/private/busybox:1.35";
const USER: &str = "rkubelet-pull";
const PASSWORD: &str = "pull-secret-test";

/// A pod running the private image, pulled every time (another test may have brought it).
fn pod(extra: serde_json::Value) -> serde_json::Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": IMAGE,
                "imagePullPolicy": "Always",
                "command": ["sleep", "3600"],
            }],
        }
    });
    if let (Some(spec), Some(extra)) = (pod["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    pod
}

/// The secrets and service accounts a test made, labelled with its pods' label, removed
/// when dropped, with the private image the runtime pulled.
struct ApiObjects {
    label: String,
}

impl ApiObjects {
    async fn secrets() -> Api<Secret> {
        Api::namespaced(kube_client("admin.kubeconfig").await, "default")
    }

    async fn service_accounts() -> Api<ServiceAccount> {
        Api::namespaced(kube_client("admin.kubeconfig").await, "default")
    }

    /// A pull secret of `type_` holding `config` (JSON) under `key`.
    async fn secret(&self, name: &str, type_: &str, key: &str, config: &serde_json::Value) {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([("rk-test".into(), self.label.clone())])),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some(BTreeMap::from([(
                key.to_owned(),
                ByteString(config.to_string().into_bytes()),
            )])),
            ..Default::default()
        };
        Self::secrets()
            .await
            .create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
    }
}

impl Drop for ApiObjects {
    fn drop(&mut self) {
        let selector = ListParams::default().labels(&format!("rk-test={}", self.label));
        cleanup_blocking(move || async move {
            let dp = DeleteParams::default();
            let _ = Self::secrets()
                .await
                .delete_collection(&dp, &selector)
                .await;
            let _ = Self::service_accounts()
                .await
                .delete_collection(&dp, &selector)
                .await;
            let image = api::ImageSpec {
                image: IMAGE.into(),
                ..Default::default()
            };
            let _ = common::cri()
                .remove_image(api::RemoveImageRequest { image: Some(image) })
                .await;
        });
    }
}

/// `{"auths": {REGISTRY: {"auth": base64(user:password)}}}` or, `legacy`, the entries
/// alone (`.dockercfg`).
fn docker_config(password: &str, legacy: bool) -> serde_json::Value {
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"));
    let entries =
        json!({ format!("http://{REGISTRY}"): { "auth": auth, "email": "test@rkubelet" } });
    if legacy {
        entries
    } else {
        json!({ "auths": entries })
    }
}

/// The waiting reason of the pod's container, once it is `reason`.
async fn waits_with(name: &str, reason: &str) -> String {
    eventually(
        &format!("{name} waiting with {reason}"),
        Duration::from_secs(60),
        || async {
            let p = get(name).await?;
            let status = p.status?.container_statuses?.into_iter().next()?;
            let waiting = status.state?.waiting?;
            (waiting.reason.as_deref() == Some(reason)).then(|| waiting.message.unwrap_or_default())
        },
    )
    .await
}

/// The (reason, message) of the pod's events, once they hold each of `reasons`.
async fn events_with(name: &str, reasons: &[&str]) -> Vec<(String, String)> {
    eventually(
        &format!("{name} events {reasons:?}"),
        Duration::from_secs(30),
        || async {
            let events: Vec<(String, String)> = events_of(name)
                .await
                .into_iter()
                .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
                .collect();
            reasons
                .iter()
                .all(|r| events.iter().any(|(reason, _)| reason == r))
                .then_some(events)
        },
    )
    .await
}

async fn assert_fails_like_the_kubelet(name: &str) {
    let message = waits_with(name, "ErrImagePull").await;
    assert!(
        message.starts_with("rpc error: code = Unknown desc = failed to pull and unpack image")
            && message.contains("401 Unauthorized"),
        "{message}"
    );
    let back_off = waits_with(name, "ImagePullBackOff").await;
    assert_eq!(back_off, format!("Back-off pulling image {IMAGE:?}"));
    let events = events_with(name, &["Pulling", "Failed", "BackOff"]).await;
    let has = |reason: &str, message: &str| {
        events
            .iter()
            .any(|(r, m)| r == reason && m.starts_with(message))
    };
    assert!(
        has("Pulling", &format!("Pulling image {IMAGE:?}")),
        "{events:?}"
    );
    assert!(
        has(
            "Failed",
            &format!(
                "Failed to pull image {IMAGE:?}: rpc error: code = Unknown desc = failed to pull and unpack image"
            )
        ),
        "{events:?}"
    );
    assert!(has("Failed", "Error: ErrImagePull"), "{events:?}");
    assert!(
        has("BackOff", &format!("Back-off pulling image {IMAGE:?}")),
        "{events:?}"
    );
    assert!(has("Failed", "Error: ImagePullBackOff"), "{events:?}");
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn private_images_need_the_right_pull_secret() {
    let case = Case::with_agent("pull-denied", &[]).await;
    let objects = ApiObjects {
        label: case.pods.label.clone(),
    };
    let wrong = format!("{}-wrong", case.pods.label);
    objects
        .secret(
            &wrong,
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            &docker_config("not-the-password", false),
        )
        .await;
    let missing = format!("{}-missing", case.pods.label);
    let anonymous = case.create("anon", pod(json!({}))).await;
    let denied = case
        .create(
            "wrong",
            pod(json!({ "imagePullSecrets": [{ "name": missing }, { "name": wrong }] })),
        )
        .await;
    assert_fails_like_the_kubelet(&anonymous).await;
    assert_fails_like_the_kubelet(&denied).await;
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn dockerconfigjson_dockercfg_and_service_account_secrets_pull_private_images() {
    let case = Case::with_agent("pull-secret", &[]).await;
    let label = case.pods.label.clone();
    let objects = ApiObjects {
        label: label.clone(),
    };
    let (json_secret, cfg_secret) = (format!("{label}-json"), format!("{label}-cfg"));
    objects
        .secret(
            &json_secret,
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            &docker_config(PASSWORD, false),
        )
        .await;
    objects
        .secret(
            &cfg_secret,
            "kubernetes.io/dockercfg",
            ".dockercfg",
            &docker_config(PASSWORD, true),
        )
        .await;
    let account: ServiceAccount = serde_json::from_value(json!({
        "metadata": { "name": label, "labels": { "rk-test": label } },
        "imagePullSecrets": [{ "name": json_secret }],
    }))
    .expect("a ServiceAccount");
    ApiObjects::service_accounts()
        .await
        .create(&PostParams::default(), &account)
        .await
        .expect("create service account");

    let by_json = case
        .create(
            "json",
            pod(json!({ "imagePullSecrets": [{ "name": json_secret }] })),
        )
        .await;
    let by_cfg = case
        .create(
            "cfg",
            pod(json!({ "imagePullSecrets": [{ "name": cfg_secret }] })),
        )
        .await;
    // The admission plugin needs the account's token secret, made by the controller
    // manager moments after the account.
    let by_account = format!("{label}-sa");
    let mut manifest = pod(json!({ "serviceAccountName": label, "nodeName": node_name() }));
    manifest["metadata"] = json!({ "name": by_account, "labels": { "rk-test": label } });
    let account_pod: Pod = serde_json::from_value(manifest).expect("a Pod");
    eventually(
        "pod of the service account admitted",
        Duration::from_secs(30),
        || async {
            pods_api()
                .await
                .create(&PostParams::default(), &account_pod)
                .await
                .ok()
        },
    )
    .await;
    let admitted = get(&by_account).await.expect("pod");
    let secrets: Vec<String> = admitted
        .spec
        .and_then(|s| s.image_pull_secrets)
        .into_iter()
        .flatten()
        .map(|r| r.name)
        .collect();
    assert_eq!(
        secrets,
        [json_secret],
        "the ServiceAccount admission copied them"
    );

    for name in [&by_json, &by_cfg, &by_account] {
        running(name).await;
        let events = events_with(name, &["Pulled"]).await;
        assert!(
            events.iter().any(|(r, m)| r == "Pulled"
                && m.starts_with(&format!("Successfully pulled image {IMAGE:?} in "))),
            "{name}: {events:?}"
        );
    }
}
