//! `/metrics/probes`: the registry the kubelet v1.20.2 serves there (its `server.go`):
//! `prober_probe_total{container,namespace,pod,pod_uid,probe_type,result}` (a counter per
//! container probe and result: `successful`, `failed`, `unknown`; counted by
//! [`crate::prober::metrics`]) and `process_start_time_seconds`. Written as the
//! kubelet's registry writes them: families sorted by name, label names sorted.

use super::metrics::{format_float, header, sample_at};
use super::stats::parse_proc_stat;

/// `/proc/stat` times are in `USER_HZ`, 100 on every Linux architecture.
const USER_HZ: f64 = 100.0;

/// The process's start, in seconds since the epoch, from `/proc/self/stat` (its 22nd
/// field, clock ticks after boot) and the boot time of `/proc/stat`, as the Prometheus
/// process collector computes it.
#[must_use]
pub fn process_start_time(self_stat: &str, proc_stat: &str) -> Option<f64> {
    // The command name, in parentheses, may hold spaces: count from after it.
    let after_name = &self_stat[self_stat.rfind(')')? + 1..];
    let ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let (_, boot) = parse_proc_stat(proc_stat, 100);
    #[allow(clippy::cast_precision_loss)] // seconds since the epoch fit an f64's mantissa
    Some(boot? as f64 + ticks as f64 / USER_HZ)
}

/// The text exposition, with the process's start time if it could be read.
#[must_use]
pub fn render(start_time: Option<f64>) -> String {
    let mut samples: Vec<(Vec<(String, String)>, u64)> = Vec::new();
    crate::prober::metrics::samples(|labels, value| {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        samples.push((labels, value));
    });
    samples.sort();
    let mut out = String::with_capacity(256 + 200 * samples.len());
    if !samples.is_empty() {
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
    }
    if let Some(start) = start_time {
        let name = "process_start_time_seconds";
        header(
            &mut out,
            name,
            "gauge",
            "[ALPHA] Start time of the process since unix epoch in seconds.",
        );
        sample_at(&mut out, name, &[], format_float(start), None);
    }
    out
}

/// The exposition now (reads `/proc`).
pub async fn scrape() -> String {
    let self_stat = tokio::fs::read_to_string("/proc/self/stat").await;
    let proc_stat = tokio::fs::read_to_string("/proc/stat").await;
    let start = match (self_stat, proc_stat) {
        (Ok(s), Ok(p)) => process_start_time(&s, &p),
        _ => None,
    };
    if start.is_none() {
        tracing::debug!("process start time unreadable from /proc");
    }
    render(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodId;
    use crate::probe::ProbeResult;
    use crate::prober::ProbeKind;

    #[test]
    fn the_start_time_counts_from_boot() {
        let self_stat = "4242 (rk let) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 12 0 \
                         12345 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        let proc_stat = "cpu  1 2 3 4 5 6 7 8 0 0\nbtime 1700000000\n";
        assert_eq!(
            process_start_time(self_stat, proc_stat),
            Some(1_700_000_123.45)
        );
        assert_eq!(process_start_time("garbage", proc_stat), None);
        assert_eq!(process_start_time(self_stat, ""), None);
    }

    #[test]
    fn probe_counts_with_sorted_labels_then_the_start_time() {
        let pod = PodId {
            uid: "probe-metrics-u1".into(),
            namespace: "default".into(),
            name: "web".into(),
        };
        let liveness = crate::prober::metrics::register(&pod, "c", ProbeKind::Liveness);
        liveness.count(ProbeResult::Success);
        liveness.count(ProbeResult::Success);
        liveness.count(ProbeResult::Failure);
        let text = render(Some(1_700_000_123.5));
        crate::prober::metrics::forget_pod(&pod.uid);
        assert!(text.starts_with(
            "# HELP prober_probe_total [ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n\
             # TYPE prober_probe_total counter\n"
        ), "{text}");
        for line in [
            "prober_probe_total{container=\"c\",namespace=\"default\",pod=\"web\",pod_uid=\"probe-metrics-u1\",probe_type=\"Liveness\",result=\"failed\"} 1\n",
            "prober_probe_total{container=\"c\",namespace=\"default\",pod=\"web\",pod_uid=\"probe-metrics-u1\",probe_type=\"Liveness\",result=\"successful\"} 2\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(text.ends_with(
            "# HELP process_start_time_seconds [ALPHA] Start time of the process since unix epoch in seconds.\n\
             # TYPE process_start_time_seconds gauge\n\
             process_start_time_seconds 1700000123.5\n"
        ), "{text}");
    }
}
