//! `/metrics/probes`: `prober_probe_total{container,namespace,pod,pod_uid,probe_type,result}`
//! (a counter per container probe and result: `successful`, `failed`, `unknown`; counted by
//! [`crate::prober::metrics`]), written as the kubelet's registry writes it (label names
//! sorted, series sorted). As on the kubelet v1.20.2, nothing else is served there: its
//! `server.go` also registers `process_start_time_seconds` on that registry, but its
//! answer holds no such sample (seen in `bench scrape`: an empty body with no probes).

use crate::metrics::{header, sample_at};

/// The text exposition: empty while no probe has run.
#[must_use]
pub fn render() -> String {
    let mut samples: Vec<(Vec<(String, String)>, u64)> = Vec::new();
    crate::prober::metrics::samples(|labels, value| {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        samples.push((labels, value));
    });
    if samples.is_empty() {
        return String::new();
    }
    samples.sort();
    let mut out = String::with_capacity(256 + 200 * samples.len());
    let name = "prober_probe_total";
    header(
        &mut out,
        name,
        "counter",
        "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
    );
    for (labels, value) in &samples {
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        sample_at(&mut out, name, &labels, value, None);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodId;
    use crate::probe::ProbeResult;
    use crate::probe::results::ProbeKind;

    #[test]
    fn probe_counts_with_sorted_labels() {
        let pod = PodId {
            uid: "probe-metrics-u1".into(),
            namespace: "default".into(),
            name: "web".into(),
        };
        let liveness = crate::prober::metrics::register(&pod, "c", ProbeKind::Liveness);
        liveness.count(ProbeResult::Success);
        liveness.count(ProbeResult::Success);
        liveness.count(ProbeResult::Failure);
        let text = render();
        crate::prober::metrics::forget_pod(&pod.uid);
        assert!(
            text.starts_with(
                "# HELP prober_probe_total [ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n\
                 # TYPE prober_probe_total counter\n"
            ),
            "{text}"
        );
        for line in [
            "prober_probe_total{container=\"c\",namespace=\"default\",pod=\"web\",pod_uid=\"probe-metrics-u1\",probe_type=\"Liveness\",result=\"failed\"} 1\n",
            "prober_probe_total{container=\"c\",namespace=\"default\",pod=\"web\",pod_uid=\"probe-metrics-u1\",probe_type=\"Liveness\",result=\"successful\"} 2\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("process_start_time_seconds"), "{text}");
    }
}
