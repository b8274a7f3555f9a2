//! The vocabulary every scenario's JSON result shares: durations as seconds rounded to the
//! millisecond, run ids that label one run's objects, and merging one result object into
//! another. It knows no scenario, no API server, no CRI and no `/proc`.

use std::time::Duration;

use serde_json::Value;

pub fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("b{:x}", nanos % 0xffff_ffff)
}

/// Copies the fields of the object `from` into the object `into`.
pub fn merge_into(into: &mut Value, from: &Value) {
    if let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) {
        into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}
