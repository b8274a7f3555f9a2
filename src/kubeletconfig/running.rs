//! The running configuration as a v1beta1 `KubeletConfiguration`, in the JSON form the
//! kubelet v1.20.2 serves on `/configz`: the kubelet's defaults, under the value each
//! implemented field's flag ended with (the flag's default, the `--config` file's value,
//! or the command line's: [`super::flags`] merged them), and the value rkubelet behaves as
//! for the fields it fixes ([`fields::FIXED`]).
//!
//! Fields rkubelet does not implement show the kubelet's default — what rkubelet behaves
//! as — not a value a file asked for (start-up logged that one as ignored). As in the
//! kubelet v1.20.2, whose `/configz` is the internal configuration converted back to
//! v1beta1 without its type meta, there is no `kind` and no `apiVersion`; zero values of
//! the kubelet's `omitempty` fields are left out, durations are Go durations (`2m0s`).
//!
//! Knows the field table and clap's matches; nothing of the server that serves it.

use std::time::Duration;

use clap::{ArgMatches, Command};
use serde_json::{Map, Value};

use super::fields::{FIXED, Field, FixedValue, Form, IMPLEMENTED};

/// The v1beta1 defaults of the kubelet v1.20.2 (`SetDefaults_KubeletConfiguration`, Linux),
/// as its `/configz` writes them.
const DEFAULTS: &str = r#"{
    "enableServer": true,
    "syncFrequency": "1m0s",
    "fileCheckFrequency": "20s",
    "httpCheckFrequency": "20s",
    "address": "0.0.0.0",
    "port": 10250,
    "authentication": {
        "x509": {},
        "webhook": {"enabled": true, "cacheTTL": "2m0s"},
        "anonymous": {"enabled": false}
    },
    "authorization": {
        "mode": "Webhook",
        "webhook": {"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"}
    },
    "registryPullQPS": 5,
    "registryBurst": 10,
    "eventRecordQPS": 5,
    "eventBurst": 10,
    "enableDebuggingHandlers": true,
    "healthzPort": 10248,
    "healthzBindAddress": "127.0.0.1",
    "oomScoreAdj": -999,
    "streamingConnectionIdleTimeout": "4h0m0s",
    "nodeStatusUpdateFrequency": "10s",
    "nodeStatusReportFrequency": "5m0s",
    "nodeLeaseDurationSeconds": 40,
    "imageMinimumGCAge": "2m0s",
    "imageGCHighThresholdPercent": 85,
    "imageGCLowThresholdPercent": 80,
    "volumeStatsAggPeriod": "1m0s",
    "cgroupsPerQOS": true,
    "cgroupDriver": "cgroupfs",
    "cpuManagerPolicy": "none",
    "cpuManagerReconcilePeriod": "10s",
    "topologyManagerPolicy": "none",
    "topologyManagerScope": "container",
    "runtimeRequestTimeout": "2m0s",
    "hairpinMode": "promiscuous-bridge",
    "maxPods": 110,
    "podPidsLimit": -1,
    "resolvConf": "/etc/resolv.conf",
    "cpuCFSQuota": true,
    "cpuCFSQuotaPeriod": "100ms",
    "nodeStatusMaxImages": 50,
    "maxOpenFiles": 1000000,
    "contentType": "application/vnd.kubernetes.protobuf",
    "kubeAPIQPS": 5,
    "kubeAPIBurst": 10,
    "serializeImagePulls": true,
    "evictionHard": {
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "15%"
    },
    "evictionPressureTransitionPeriod": "5m0s",
    "enableControllerAttachDetach": true,
    "makeIPTablesUtilChains": true,
    "iptablesMasqueradeBit": 14,
    "iptablesDropBit": 15,
    "failSwapOn": true,
    "containerLogMaxSize": "10Mi",
    "containerLogMaxFiles": 5,
    "configMapAndSecretChangeDetectionStrategy": "Watch",
    "enforceNodeAllocatable": ["pods"],
    "volumePluginDir": "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/",
    "logging": {"format": "text"},
    "enableSystemLogHandler": true,
    "shutdownGracePeriod": "0s",
    "shutdownGracePeriodCriticalPods": "0s"
}"#;

fn defaults() -> Value {
    // A unit test parses DEFAULTS.
    serde_json::from_str(DEFAULTS).unwrap_or_else(|_| Value::Object(Map::new()))
}

/// Booleans the kubelet's v1beta1 type holds by value with `omitempty`: `false` is left
/// out (the other booleans are pointers, written either way).
const OMITTED_WHEN_FALSE: &[&str] = &["rotateCertificates", "serverTLSBootstrap"];

/// The running configuration of `run` (the final matches of the `run` command `cmd`).
#[must_use]
pub fn configuration(cmd: &Command, run: &ArgMatches) -> Value {
    let mut config = defaults();
    for field in IMPLEMENTED {
        let Some(id) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(field.flag))
            .map(|a| a.get_id().clone())
        else {
            continue;
        };
        if run.value_source(id.as_str()).is_none() {
            // Neither given nor defaulted by the flag: the kubelet's default stands.
            continue;
        }
        let raw: Vec<String> = run
            .try_get_raw(id.as_str())
            .ok()
            .flatten()
            .map(|values| values.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        set(&mut config, field.path, json_value(field, &raw));
    }
    for fixed in FIXED {
        set(&mut config, fixed.path, fixed_json(fixed.value));
    }
    config
}

/// Sets (or, for `None`, removes) the field at a dotted `path`.
fn set(config: &mut Value, path: &str, value: Option<Value>) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut object = config;
    for part in parts {
        let Value::Object(map) = object else { return };
        object = map.entry(part).or_insert_with(|| Value::Object(Map::new()));
    }
    if let Value::Object(map) = object {
        match value {
            Some(v) => map.insert(last.to_owned(), v),
            None => map.remove(last),
        };
    }
}

/// A field's JSON value from its flag's raw values; `None` is the kubelet's zero value,
/// left out.
fn json_value(field: &Field, raw: &[String]) -> Option<Value> {
    let joined = raw.join(",");
    let pairs = |separator: char| -> Map<String, Value> {
        joined
            .split(',')
            .filter_map(|entry| entry.split_once(separator))
            .map(|(k, v)| (k.trim().to_owned(), Value::String(v.trim().to_owned())))
            .collect()
    };
    let value = match field.form {
        Form::Text | Form::Path => Value::String(joined.clone()),
        Form::Count | Form::Int => joined.parse::<i64>().map(Value::from).ok()?,
        Form::Bool => Value::Bool(joined == "true"),
        Form::Duration => Value::String(go_duration(
            crate::node::parse_go_duration(&joined)
                .ok()
                .or_else(|| joined.parse::<u64>().ok().map(Duration::from_secs))?,
        )),
        Form::List => Value::Array(
            raw.iter()
                .filter(|v| !v.is_empty())
                .cloned()
                .map(Value::String)
                .collect(),
        ),
        Form::Map => Value::Object(pairs('=')),
        // No thresholds (`--eviction-hard=`) is an empty map, left out as the kubelet's.
        Form::Thresholds => Value::Object(pairs('<')),
    };
    let zero = match &value {
        Value::String(s) => s.is_empty(),
        Value::Number(n) => field.form == Form::Count && n.as_i64() == Some(0),
        Value::Bool(b) => !b && OMITTED_WHEN_FALSE.contains(&field.path),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Null => true,
    };
    (!zero).then_some(value)
}

/// A fixed field's JSON value; `None` for a zero integer (`readOnlyPort: 0`), left out.
/// The fixed booleans are pointers in the kubelet's type: written either way.
fn fixed_json(value: FixedValue) -> Option<Value> {
    Some(match value {
        FixedValue::Bool(b) => Value::Bool(b),
        FixedValue::Text(t) => Value::String(t.to_owned()),
        FixedValue::Int(0) => return None,
        FixedValue::Int(i) => Value::from(i),
        FixedValue::Duration(d) => Value::String(
            crate::node::parse_go_duration(d).map_or_else(|_| d.to_owned(), go_duration),
        ),
    })
}

/// A duration as Go's `time.Duration.String` writes it: `2m0s`, `4h0m0s`, `1.5s`,
/// `100ms`, `0s`.
#[must_use]
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let fraction = |value: u128, unit: u128| {
        let whole = value / unit;
        let rest = value % unit;
        if rest == 0 {
            whole.to_string()
        } else {
            let digits = unit.to_string().len() - 1;
            let frac = format!("{rest:0digits$}");
            format!("{whole}.{}", frac.trim_end_matches('0'))
        }
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", fraction(nanos, 1_000_000));
    }
    let seconds = d.as_secs();
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let s = fraction(
        u128::from(s) * 1_000_000_000 + u128::from(d.subsec_nanos()),
        1_000_000_000,
    );
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_parse_and_have_no_type_meta() {
        let d = defaults();
        assert_eq!(d["maxPods"], 110);
        assert_eq!(d["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert!(d.get("kind").is_none() && d.get("apiVersion").is_none());
    }

    #[test]
    fn durations_as_go_writes_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(20), "20s"),
            (Duration::from_secs(120), "2m0s"),
            (Duration::from_secs(4 * 3600), "4h0m0s"),
            (Duration::from_secs(3725), "1h2m5s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_nanos(1500), "1.5µs"),
            (Duration::from_nanos(7), "7ns"),
        ];
        for (d, text) in cases {
            assert_eq!(go_duration(d), text, "{d:?}");
        }
    }

    #[test]
    fn flag_values_take_the_kubelets_json_forms() {
        let field = |form| Field {
            path: "x",
            flag: "x",
            form,
        };
        let raw = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            json_value(&field(Form::Thresholds), &raw(&["memory.available<1Gi"])),
            Some(serde_json::json!({"memory.available": "1Gi"}))
        );
        assert_eq!(
            json_value(&field(Form::Thresholds), &raw(&[""])),
            None,
            "--eviction-hard= is left out, as the kubelet leaves an empty map"
        );
        assert_eq!(
            json_value(&field(Form::Map), &raw(&["cpu=100m,memory=1Gi"])),
            Some(serde_json::json!({"cpu": "100m", "memory": "1Gi"}))
        );
        assert_eq!(
            json_value(&field(Form::Duration), &raw(&["2m"])),
            Some(Value::from("2m0s"))
        );
        assert_eq!(
            json_value(&field(Form::List), &raw(&["10.0.0.1", "10.0.0.2"])),
            Some(serde_json::json!(["10.0.0.1", "10.0.0.2"]))
        );
        assert_eq!(json_value(&field(Form::Count), &raw(&["0"])), None);
        assert_eq!(
            json_value(&field(Form::Int), &raw(&["0"])),
            Some(Value::from(0))
        );
        assert_eq!(json_value(&field(Form::Text), &raw(&[""])), None);
    }

    #[test]
    fn fixed_fields_show_what_rkubelet_does() {
        let config = configuration(
            &Command::new("run"),
            &Command::new("run").get_matches_from(["run"]),
        );
        assert_eq!(config["failSwapOn"], false);
        assert_eq!(config["serializeImagePulls"], false);
        assert_eq!(config["authorization"]["mode"], "Webhook");
        assert_eq!(config["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert!(config.get("readOnlyPort").is_none(), "0 is left out");
    }
}
