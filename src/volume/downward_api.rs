//! The downward API volume: pod metadata and container resources rendered as files, with
//! the kubelet's formats (`key="value"` lines for labels and annotations, rounded-up
//! integers for resources).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, ObjectFieldSelector, Pod, ResourceFieldSelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::payload::{FileProjection, Payload, file_mode, validate_path};
use crate::resources::container_resource_value;

/// Renders the items of a downwardAPI volume or projection of `pod`. Container limits that
/// are not set fall back to `allocatable` (the node's), as in the kubelet.
pub(super) fn render(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<Payload, String> {
    let mut payload = Payload::new();
    for item in items {
        validate_path(&item.path)?;
        let data = match (&item.field_ref, &item.resource_field_ref) {
            (Some(field), None) => field_value(pod, field),
            (None, Some(resource)) => resource_value(pod, resource, allocatable),
            _ => Err("needs exactly one of fieldRef and resourceFieldRef".to_owned()),
        }
        .map_err(|why| format!("downward API file {:?}: {why}", item.path))?;
        let mode = item.mode.map_or(Ok(default_mode), file_mode)?;
        payload.insert(
            item.path.clone(),
            FileProjection {
                data: data.into_bytes(),
                mode,
            },
        );
    }
    Ok(payload)
}

/// The value of a `fieldRef`: the metadata fields the kubelet allows in volumes.
fn field_value(pod: &Pod, field: &ObjectFieldSelector) -> Result<String, String> {
    let meta = &pod.metadata;
    let path = field.field_path.as_str();
    if let Some(key) = subscript(path, "metadata.labels") {
        return Ok(lookup(meta.labels.as_ref(), key));
    }
    if let Some(key) = subscript(path, "metadata.annotations") {
        return Ok(lookup(meta.annotations.as_ref(), key));
    }
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    match path {
        "metadata.name" => Ok(text(&meta.name)),
        "metadata.namespace" => Ok(text(&meta.namespace)),
        "metadata.uid" => Ok(text(&meta.uid)),
        "metadata.labels" => Ok(format_map(meta.labels.as_ref())),
        "metadata.annotations" => Ok(format_map(meta.annotations.as_ref())),
        other => Err(format!("unsupported fieldPath {other:?}")),
    }
}

/// `key` of `metadata.labels['key']` when `path` is such a subscript of `prefix`.
fn subscript<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

fn lookup(map: Option<&BTreeMap<String, String>>, key: &str) -> String {
    map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
}

/// The kubelet's `fieldpath.FormatMap`: sorted `key="value"` lines, values quoted like Go's
/// `%q`, no trailing newline.
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A double-quoted string with Go's `strconv.Quote` escapes for the characters that need
/// them; printable Unicode stays as it is.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if c.is_control() && u32::from(c) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The value of a `resourceFieldRef` of a container of `pod` (named: volumes have no
/// container of their own).
fn resource_value(
    pod: &Pod,
    selector: &ResourceFieldSelector,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<String, String> {
    let container_name = selector
        .container_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or("resourceFieldRef needs a containerName in a volume")?;
    let container = crate::pod::container(pod, container_name)
        .ok_or_else(|| format!("no container {container_name:?} in the pod"))?;
    container_resource_value(container, selector, allocatable)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod() -> Pod {
        let quantities = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), ApiQuantity((*v).to_owned())))
                .collect::<BTreeMap<_, _>>()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("0b1c-uid".into()),
                labels: Some(
                    [("app", "web"), ("tier", "front \"end\"\n")]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(quantities(&[("cpu", "500m"), ("memory", "64Mi")])),
                        requests: Some(quantities(&[("cpu", "250m")])),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                init_containers: Some(vec![Container {
                    name: "init".into(),
                    ..Container::default()
                }]),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn field(path: &str, field_path: &str) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: Some("v1".into()),
            }),
            ..DownwardAPIVolumeFile::default()
        }
    }

    fn resource(
        path: &str,
        container: &str,
        res: &str,
        divisor: Option<&str>,
    ) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.into(),
            resource_field_ref: Some(ResourceFieldSelector {
                container_name: Some(container.into()),
                resource: res.into(),
                divisor: divisor.map(|d| ApiQuantity(d.into())),
            }),
            ..DownwardAPIVolumeFile::default()
        }
    }

    fn text(payload: &Payload, path: &str) -> String {
        String::from_utf8(payload[path].data.clone()).expect("utf-8")
    }

    #[test]
    fn renders_metadata_fields_like_the_kubelet() {
        let mut items = vec![
            field("name", "metadata.name"),
            field("ns", "metadata.namespace"),
            field("uid", "metadata.uid"),
            field("labels", "metadata.labels"),
            field("annotations", "metadata.annotations"),
            field("app", "metadata.labels['app']"),
        ];
        items[0].mode = Some(0o400);
        let payload = render(&pod(), &items, 0o644, &BTreeMap::new()).expect("render");
        assert_eq!(text(&payload, "name"), "web");
        assert_eq!(payload["name"].mode, 0o400);
        assert_eq!(text(&payload, "ns"), "shop");
        assert_eq!(payload["ns"].mode, 0o644);
        assert_eq!(text(&payload, "uid"), "0b1c-uid");
        assert_eq!(
            text(&payload, "labels"),
            "app=\"web\"\ntier=\"front \\\"end\\\"\\n\""
        );
        assert_eq!(text(&payload, "annotations"), "");
        assert_eq!(text(&payload, "app"), "web");
    }

    #[test]
    fn renders_resources_with_divisors_and_allocatable_fallback() {
        let allocatable = [("memory", "2Gi"), ("cpu", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ApiQuantity(v.to_owned())))
            .collect();
        let items = [
            resource("cpu_limit", "app", "limits.cpu", None),
            resource("cpu_limit_m", "app", "limits.cpu", Some("1m")),
            resource("cpu_request_m", "app", "requests.cpu", Some("1m")),
            resource("mem_limit_mi", "app", "limits.memory", Some("1Mi")),
            resource("mem_request", "app", "requests.memory", None),
            resource("init_mem_limit_mi", "init", "limits.memory", Some("1Mi")),
            resource("init_cpu_limit", "init", "limits.cpu", None),
        ];
        let payload = render(&pod(), &items, 0o644, &allocatable).expect("render");
        assert_eq!(text(&payload, "cpu_limit"), "1");
        assert_eq!(text(&payload, "cpu_limit_m"), "500");
        assert_eq!(text(&payload, "cpu_request_m"), "250");
        assert_eq!(text(&payload, "mem_limit_mi"), "64");
        assert_eq!(text(&payload, "mem_request"), "0");
        assert_eq!(text(&payload, "init_mem_limit_mi"), "2048");
        assert_eq!(text(&payload, "init_cpu_limit"), "2");
        // The API server sends an unset divisor as "0": it means 1, as in the kubelet.
        let zero = [resource("cpu", "app", "limits.cpu", Some("0"))];
        let payload = render(&pod(), &zero, 0o644, &allocatable).expect("render");
        assert_eq!(text(&payload, "cpu"), "1");
    }

    #[test]
    fn rejects_what_the_kubelet_rejects() {
        let none = BTreeMap::new();
        for (item, why) in [
            (field("ip", "status.podIP"), "unsupported fieldPath"),
            (resource("x", "nope", "limits.cpu", None), "no container"),
            (
                resource("x", "app", "limits.gpu", None),
                "unsupported container resource",
            ),
            (resource("x", "init", "limits.memory", None), "allocatable"),
            (field("../x", "metadata.name"), ".."),
        ] {
            let err = render(&pod(), &[item], 0o644, &none).expect_err(why);
            assert!(err.contains(why), "{err:?} lacks {why:?}");
        }
    }

    #[test]
    fn go_quote_escapes_controls_and_keeps_unicode() {
        assert_eq!(go_quote("a\u{1}b\u{7f}é\u{85}"), "\"a\\x01b\\x7fé\\u0085\"");
    }
}
