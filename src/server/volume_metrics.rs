//! The kubelet's volume gauges on `/metrics` (its
//! `metrics/collectors/volume_stats.go`): `kubelet_volume_stats_capacity_bytes`,
//! `_available_bytes`, `_used_bytes`, `_inodes`, `_inodes_free` and `_inodes_used`, by
//! `namespace` and `persistentvolumeclaim`, for the volumes that come from a
//! PersistentVolumeClaim (those with a `pvcRef` in the summary), one sample per claim
//! however many pods mount it. The figures are the summary's, as the housekeeping last
//! read them; before the first reading, or with no claim, there is no family at all.

use std::collections::BTreeSet;

use prometheus_client::metrics::gauge::ConstGauge;

use crate::metrics::{Page, Samples, labels};
use crate::stats::{FsStats, Summary};

/// A gauge: its name, its help, and the figure of a volume's stats it gives.
type Gauge = (&'static str, &'static str, fn(&FsStats) -> Option<u64>);

/// The gauges.
const GAUGES: [Gauge; 6] = [
    (
        "kubelet_volume_stats_available_bytes",
        "[ALPHA] Number of available bytes in the volume",
        |f| f.available_bytes,
    ),
    (
        "kubelet_volume_stats_capacity_bytes",
        "[ALPHA] Capacity in bytes of the volume",
        |f| f.capacity_bytes,
    ),
    (
        "kubelet_volume_stats_inodes",
        "[ALPHA] Maximum number of inodes in the volume",
        |f| f.inodes,
    ),
    (
        "kubelet_volume_stats_inodes_free",
        "[ALPHA] Number of free inodes in the volume",
        |f| f.inodes_free,
    ),
    (
        "kubelet_volume_stats_inodes_used",
        "[ALPHA] Number of used inodes in the volume",
        |f| f.inodes_used,
    ),
    (
        "kubelet_volume_stats_used_bytes",
        "[ALPHA] Number of used bytes in the volume",
        |f| f.used_bytes,
    ),
];

/// The gauges of `summary`'s claims, added to `page` (none without any).
pub fn add(page: &mut Page, summary: Option<&Summary>) {
    let mut seen = BTreeSet::new();
    let claims: Vec<(&str, &str, &FsStats)> = summary
        .iter()
        .flat_map(|s| &s.pods)
        .flat_map(|p| &p.volume_stats)
        .filter_map(|v| {
            let r = v.pvc_ref.as_ref()?;
            seen.insert((r.namespace.as_str(), r.name.as_str()))
                .then_some((r.namespace.as_str(), r.name.as_str(), &v.fs))
        })
        .collect();
    for (name, help, figure) in GAUGES {
        let mut samples = Samples::default();
        for (namespace, claim, fs) in &claims {
            #[allow(clippy::cast_possible_wrap)] // bytes and inodes of a volume
            let value = figure(fs).unwrap_or(0) as i64;
            samples.push(
                labels([("namespace", namespace), ("persistentvolumeclaim", claim)]),
                ConstGauge::new(value),
            );
        }
        page.add_samples(name, help, samples);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{PodReference, PodStats, PvcReference, VolumeStats};

    fn render(summary: Option<&Summary>) -> String {
        let mut page = Page::default();
        add(&mut page, summary);
        page.render()
    }

    fn volume(name: &str, claim: Option<&str>, used: u64) -> VolumeStats {
        VolumeStats {
            fs: FsStats {
                time: "2026-11-26T15:00:00Z".into(),
                available_bytes: Some(900),
                capacity_bytes: Some(1000),
                used_bytes: Some(used),
                inodes_free: Some(90),
                inodes: Some(100),
                inodes_used: Some(10),
            },
            name: name.into(),
            pvc_ref: claim.map(|c| PvcReference {
                name: c.into(),
                namespace: "db".into(),
            }),
        }
    }

    fn pod(name: &str, volumes: Vec<VolumeStats>) -> PodStats {
        PodStats {
            pod_ref: PodReference {
                name: name.into(),
                namespace: "db".into(),
                uid: name.into(),
            },
            volume_stats: volumes,
            ..PodStats::default()
        }
    }

    #[test]
    fn one_sample_per_claim_and_none_for_other_volumes() {
        let summary = Summary {
            node: crate::stats::NodeStats::default(),
            pods: vec![
                pod(
                    "a",
                    vec![
                        volume("scratch", None, 5),
                        volume("data", Some("data-a"), 100),
                    ],
                ),
                // Two pods sharing a claim: one sample, the first pod's.
                pod("b", vec![volume("shared", Some("data-a"), 200)]),
                pod("c", vec![volume("data", Some("data-c"), 300)]),
            ],
        };
        let text = render(Some(&summary));
        let scrape =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        let used: Vec<(String, String, f64)> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == "kubelet_volume_stats_used_bytes")
            .map(|s| {
                let prometheus_parse::Value::Gauge(v) = s.value else {
                    panic!("{s:?} is no gauge");
                };
                (
                    s.labels["namespace"].to_owned(),
                    s.labels["persistentvolumeclaim"].to_owned(),
                    v,
                )
            })
            .collect();
        assert_eq!(
            used,
            [
                ("db".into(), "data-a".into(), 100.0),
                ("db".into(), "data-c".into(), 300.0)
            ]
        );
        assert_eq!(scrape.samples.len(), 12, "six gauges of two claims");
        for (name, help, _) in GAUGES {
            assert_eq!(scrape.docs[name], help);
        }
        assert!(text.contains(
            "kubelet_volume_stats_capacity_bytes{namespace=\"db\",persistentvolumeclaim=\"data-a\"} 1000"
        ));
        // No claim, or no reading yet: no family.
        assert_eq!(
            render(Some(&Summary {
                pods: vec![pod("x", vec![volume("s", None, 1)])],
                node: crate::stats::NodeStats::default()
            })),
            ""
        );
        assert_eq!(render(None), "");
    }
}
