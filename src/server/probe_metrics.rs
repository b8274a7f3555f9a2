//! `/metrics/probes`: `prober_probe_total{container,namespace,pod,pod_uid,probe_type,result}`
//! (a counter per container probe and result: `successful`, `failed`, `unknown`; counted by
//! [`crate::prober::metrics`]), written with the registry's [`Page`]. As on the kubelet v1.20.2, nothing else is served there: its
//! `server.go` also registers `process_start_time_seconds` on that registry, but its
//! answer holds no such sample (seen in `bench scrape`: an empty body with no probes).

use crate::metrics::{Labels, Page, PlainConstCounter, Samples, Value};

/// The page: no family while no probe has run.
#[must_use]
pub fn render() -> String {
    let mut samples = Samples::default();
    crate::prober::metrics::samples(|labels, value| {
        // Label names sorted, as the kubelet's registry writes them.
        let mut labels: Labels = labels.iter().map(|(k, v)| (*k, Value::from(*v))).collect();
        labels.sort_by_key(|(k, _)| *k);
        samples.push(labels, PlainConstCounter(value));
    });
    let mut page = Page::default();
    page.add_samples(
        "prober_probe_total",
        "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
        samples,
    );
    page.render()
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
        for (result, n) in [("failed", 1), ("successful", 2)] {
            let line = text
                .lines()
                .find(|l| {
                    l.contains("probe-metrics-u1") && l.contains(&format!("result=\"{result}\""))
                })
                .unwrap_or_else(|| panic!("{result} in {text}"));
            assert!(line.starts_with("prober_probe_total{"), "{line}");
            assert!(line.ends_with(&format!("}} {n}")), "{line}");
            for label in [
                "container=\"c\"",
                "namespace=\"default\"",
                "pod=\"web\"",
                "probe_type=\"Liveness\"",
            ] {
                assert!(line.contains(label), "{label} in {line}");
            }
        }
        assert!(!text.contains("process_start_time_seconds"), "{text}");
    }
}
