//! The text format (0.0.4, [`crate::metrics::CONTENT_TYPE`]) with sample timestamps, for
//! the two pages whose samples carry the time of their reading, as the kubelet's do:
//! `/metrics/cadvisor` ([`super::cadvisor`]) and `/metrics/resource`
//! ([`super::resource_metrics`]). The other pages are written by `prometheus-client`
//! ([`crate::metrics::Page`]), which has no way to give a sample its own timestamp: there
//! Prometheus would stamp cAdvisor's figures with its scrape's time, and metrics-server
//! would compute CPU rates over the wrong interval. Kept by hand for that reason only.

use std::fmt::Write as _;

/// Go's `%g`-like formatting Prometheus parses: integers without a fraction.
pub fn format_float(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// Escapes a label value: backslash, double quote and line feed.
fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Writes one sample line.
pub fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: impl std::fmt::Display,
) {
    sample_at(out, name, labels, value, None);
}

/// Writes one sample line, with an explicit timestamp (milliseconds since the epoch) if
/// given, as the kubelet's collectors with timestamps write theirs.
pub fn sample_at(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: impl std::fmt::Display,
    timestamp_ms: Option<i64>,
) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
        }
        out.push('}');
    }
    let _ = match timestamp_ms {
        Some(ms) => writeln!(out, " {value} {ms}"),
        None => writeln!(out, " {value}"),
    };
}

/// Writes a family's `# HELP` and `# TYPE` lines.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_timestamps_written() {
        let mut out = String::new();
        sample_at(&mut out, "x", &[("a", "q\"b\\c\nd")], 1.5, Some(42));
        assert_eq!(out, "x{a=\"q\\\"b\\\\c\\nd\"} 1.5 42\n");
        assert_eq!(format_float(f64::INFINITY), "+Inf");
        assert_eq!(format_float(2.0), "2");
    }
}
