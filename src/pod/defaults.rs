//! The API's defaulting of a v1 Pod as Kubernetes v1.20.2 does it
//! (`pkg/apis/core/v1/defaults.go`, `SetObjectDefaults_Pod`), for pods read from manifest
//! files: the API server defaults every other pod before this agent sees it. The kubelet
//! decodes a manifest through the same defaulting, and hashes the result (its static pod's
//! UID, its containers' hashes), so a static pod only keeps its UID across a swap of node
//! agents if both default alike. The rounding of every `ResourceList`'s quantities up to
//! milli units is a step of its own ([`round_resource_lists`]): the UID is taken from the
//! pod as Go holds it, where the rounding changes the representation, not the text.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, ObjectFieldSelector, Pod, Probe, ResourceRequirements, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::goapi::quantity::GoQuantity;

/// `SetObjectDefaults_Pod`.
pub fn set_defaults(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    // SetDefaults_Pod: requests default to limits (app and init containers only).
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        requests_from_limits(c.resources.as_mut());
    }
    spec.enable_service_links.get_or_insert(true);
    // SetDefaults_PodSpec.
    default_str(&mut spec.dns_policy, "ClusterFirst");
    default_str(&mut spec.restart_policy, "Always");
    if spec.host_network == Some(true) {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            for port in c.ports.iter_mut().flatten() {
                if port.host_port.unwrap_or(0) == 0 {
                    port.host_port = Some(port.container_port);
                }
            }
        }
    }
    spec.security_context.get_or_insert_with(Default::default);
    spec.termination_grace_period_seconds.get_or_insert(30);
    default_str(&mut spec.scheduler_name, "default-scheduler");
    for volume in spec.volumes.iter_mut().flatten() {
        volume_defaults(volume);
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        container_defaults(c);
    }
    for ec in spec.ephemeral_containers.iter_mut().flatten() {
        // The same defaults through the same fields (`SetDefaults_EphemeralContainer`).
        let Ok(mut value) = serde_json::to_value(&*ec) else {
            continue;
        };
        let Ok(mut c) = serde_json::from_value::<Container>(value.clone()) else {
            continue;
        };
        container_defaults(&mut c);
        if let (Some(object), Ok(serde_json::Value::Object(defaulted))) =
            (value.as_object_mut(), serde_json::to_value(&c))
        {
            object.extend(defaulted);
        }
        if let Ok(defaulted) = serde_json::from_value(value) {
            *ec = defaulted;
        }
    }
}

/// `SetDefaults_ResourceList` of every list of the pod: each quantity rounded up to milli
/// units, written in its Go form (`0.1m` becomes `1m`, `0.5` stays `0.5`... as `500m`).
pub fn round_resource_lists(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let round = |list: Option<&mut BTreeMap<String, Quantity>>| {
        for q in list.into_iter().flat_map(BTreeMap::values_mut) {
            if let Ok(go) = GoQuantity::parse(q.0.trim()) {
                q.0 = go.rounded_up_to_milli().marshal();
            }
        }
    };
    let resources = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .filter_map(|c| c.resources.as_mut())
        .chain(
            spec.ephemeral_containers
                .iter_mut()
                .flatten()
                .filter_map(|c| c.resources.as_mut()),
        );
    for r in resources {
        round(r.limits.as_mut());
        round(r.requests.as_mut());
    }
    round(spec.overhead.as_mut());
    let claims = spec.volumes.iter_mut().flatten().filter_map(|v| {
        v.ephemeral
            .as_mut()?
            .volume_claim_template
            .as_mut()?
            .spec
            .resources
            .as_mut()
    });
    for r in claims {
        round(r.limits.as_mut());
        round(r.requests.as_mut());
    }
}

fn default_str(field: &mut Option<String>, value: &str) {
    if field.as_deref().unwrap_or_default().is_empty() {
        *field = Some(value.to_owned());
    }
}

fn requests_from_limits(resources: Option<&mut ResourceRequirements>) {
    let Some(r) = resources else { return };
    let Some(limits) = &r.limits else { return };
    let requests = r.requests.get_or_insert_with(Default::default);
    for (name, value) in limits {
        requests
            .entry(name.clone())
            .or_insert_with(|| value.clone());
    }
}

fn volume_defaults(volume: &mut Volume) {
    let has_source = [
        volume.aws_elastic_block_store.is_some(),
        volume.azure_disk.is_some(),
        volume.azure_file.is_some(),
        volume.cephfs.is_some(),
        volume.cinder.is_some(),
        volume.config_map.is_some(),
        volume.csi.is_some(),
        volume.downward_api.is_some(),
        volume.empty_dir.is_some(),
        volume.ephemeral.is_some(),
        volume.fc.is_some(),
        volume.flex_volume.is_some(),
        volume.flocker.is_some(),
        volume.gce_persistent_disk.is_some(),
        volume.git_repo.is_some(),
        volume.glusterfs.is_some(),
        volume.host_path.is_some(),
        volume.iscsi.is_some(),
        volume.nfs.is_some(),
        volume.persistent_volume_claim.is_some(),
        volume.photon_persistent_disk.is_some(),
        volume.portworx_volume.is_some(),
        volume.projected.is_some(),
        volume.quobyte.is_some(),
        volume.rbd.is_some(),
        volume.scale_io.is_some(),
        volume.secret.is_some(),
        volume.storageos.is_some(),
        volume.vsphere_volume.is_some(),
    ];
    if !has_source.contains(&true) {
        volume.empty_dir = Some(Default::default());
    }
    if let Some(h) = &mut volume.host_path {
        h.type_.get_or_insert_with(String::new);
    }
    if let Some(s) = &mut volume.secret {
        s.default_mode.get_or_insert(0o644);
    }
    if let Some(s) = &mut volume.iscsi {
        default_str(&mut s.iscsi_interface, "default");
    }
    if let Some(s) = &mut volume.rbd {
        default_str(&mut s.pool, "rbd");
        default_str(&mut s.user, "admin");
        default_str(&mut s.keyring, "/etc/ceph/keyring");
    }
    if let Some(s) = &mut volume.downward_api {
        s.default_mode.get_or_insert(0o644);
        for item in s.items.iter_mut().flatten() {
            field_selector(item.field_ref.as_mut());
        }
    }
    if let Some(s) = &mut volume.config_map {
        s.default_mode.get_or_insert(0o644);
    }
    if let Some(s) = &mut volume.azure_disk {
        s.caching_mode.get_or_insert_with(|| "ReadWrite".into());
        s.kind.get_or_insert_with(|| "Shared".into());
        s.fs_type.get_or_insert_with(|| "ext4".into());
        s.read_only.get_or_insert(false);
    }
    if let Some(s) = &mut volume.projected {
        s.default_mode.get_or_insert(0o644);
        for source in s.sources.iter_mut().flatten() {
            if let Some(d) = &mut source.downward_api {
                for item in d.items.iter_mut().flatten() {
                    field_selector(item.field_ref.as_mut());
                }
            }
            if let Some(t) = &mut source.service_account_token {
                t.expiration_seconds.get_or_insert(3600);
            }
        }
    }
    if let Some(s) = &mut volume.scale_io {
        default_str(&mut s.storage_mode, "ThinProvisioned");
        default_str(&mut s.fs_type, "xfs");
    }
    if let Some(claim) = volume
        .ephemeral
        .as_mut()
        .and_then(|e| e.volume_claim_template.as_mut())
    {
        claim
            .spec
            .volume_mode
            .get_or_insert_with(|| "Filesystem".into());
    }
}

fn field_selector(selector: Option<&mut ObjectFieldSelector>) {
    if let Some(s) = selector {
        default_str(&mut s.api_version, "v1");
    }
}

fn http_get(action: Option<&mut HTTPGetAction>) {
    if let Some(a) = action {
        default_str(&mut a.path, "/");
        default_str(&mut a.scheme, "HTTP");
    }
}

fn probe(probe: Option<&mut Probe>) {
    let Some(p) = probe else { return };
    for (field, value) in [
        (&mut p.timeout_seconds, 1),
        (&mut p.period_seconds, 10),
        (&mut p.success_threshold, 1),
        (&mut p.failure_threshold, 3),
    ] {
        if field.unwrap_or(0) == 0 {
            *field = Some(value);
        }
    }
    http_get(p.http_get.as_mut());
}

/// `SetDefaults_Container` and the defaults of the container's parts.
fn container_defaults(c: &mut Container) {
    if c.image_pull_policy
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        let image = c.image.as_deref().unwrap_or_default();
        c.image_pull_policy = Some(crate::image_reference::default_pull_policy(image).into());
    }
    default_str(&mut c.termination_message_path, "/dev/termination-log");
    default_str(&mut c.termination_message_policy, "File");
    for port in c.ports.iter_mut().flatten() {
        default_str(&mut port.protocol, "TCP");
    }
    for env in c.env.iter_mut().flatten() {
        field_selector(env.value_from.as_mut().and_then(|v| v.field_ref.as_mut()));
    }
    probe(c.liveness_probe.as_mut());
    probe(c.readiness_probe.as_mut());
    probe(c.startup_probe.as_mut());
    if let Some(l) = &mut c.lifecycle {
        http_get(l.post_start.as_mut().and_then(|h| h.http_get.as_mut()));
        http_get(l.pre_stop.as_mut().and_then(|h| h.http_get.as_mut()));
    }
}
