//! Flag values in the kubelet's own syntax: resource reservations
//! (`--kube-reserved=cpu=100m,memory=1Gi`), taints (`--register-with-taints=key=value:Effect`)
//! and timeouts (`--runtime-request-timeout=2m0s`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

use crate::node::Reservation;
use crate::resources::Quantity;

/// Parses a reservation, `name=quantity` comma-separated, of `cpu`, `memory` and
/// `ephemeral-storage` (the kubelet's `--kube-reserved` and `--system-reserved`).
///
/// # Errors
/// A malformed entry, a bad quantity, or a resource rkubelet does not reserve.
pub fn parse_reservation(text: &str) -> Result<Reservation, String> {
    let mut reservation = Reservation::default();
    for entry in text.split(',').filter(|e| !e.is_empty()) {
        let (name, value) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not name=quantity"))?;
        let quantity = Quantity::parse(value)?;
        let whole = |q: u128| u64::try_from(q).map_err(|_| format!("{entry:?} is too large"));
        match name.trim() {
            "cpu" => reservation.cpu_millis = whole(quantity.milli_value())?,
            "memory" => reservation.memory_bytes = whole(quantity.value())?,
            "ephemeral-storage" => reservation.ephemeral_storage_bytes = whole(quantity.value())?,
            other => {
                return Err(format!(
                    "cannot reserve {other:?}: only cpu, memory and ephemeral-storage"
                ));
            }
        }
    }
    Ok(reservation)
}

/// Parses one taint, `key=value:Effect` or `key:Effect` (the kubelet's
/// `--register-with-taints`, comma-separated).
///
/// # Errors
/// No effect, an effect other than `NoSchedule`, `PreferNoSchedule` or `NoExecute`, or an
/// empty key.
pub fn parse_taint(text: &str) -> Result<Taint, String> {
    let (key_value, effect) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("invalid taint spec: {text}"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "invalid taint effect: {effect}, unsupported taint effect"
        ));
    }
    let (key, value) = match key_value.split_once('=') {
        Some((k, v)) => (k, Some(v.to_owned())),
        None => (key_value, None),
    };
    if key.is_empty() {
        return Err(format!("invalid taint spec: {text}"));
    }
    Ok(Taint {
        key: key.to_owned(),
        value,
        effect: effect.to_owned(),
        time_added: None,
    })
}

/// Parses a timeout as the kubelet's flags take it (a Go duration, `2m0s`), or a number
/// of seconds as rkubelet took it before.
///
/// # Errors
/// Neither.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => crate::node::parse_go_duration(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_in_the_kubelets_syntax() {
        assert_eq!(
            parse_reservation("cpu=100m,memory=1Gi,ephemeral-storage=2G").unwrap(),
            Reservation {
                cpu_millis: 100,
                memory_bytes: 1 << 30,
                ephemeral_storage_bytes: 2_000_000_000,
            }
        );
        assert_eq!(parse_reservation("").unwrap(), Reservation::default());
        assert!(
            parse_reservation("pid=100")
                .unwrap_err()
                .contains("cannot reserve \"pid\"")
        );
        assert!(
            parse_reservation("cpu")
                .unwrap_err()
                .contains("not name=quantity")
        );
        assert!(parse_reservation("memory=lots").is_err());
    }

    #[test]
    fn taints_in_the_kubelets_syntax() {
        let t = parse_taint("dedicated=infra:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("dedicated", Some("infra"), "NoSchedule")
        );
        let t = parse_taint("node.example.com/flaky:NoExecute").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value, t.effect.as_str()),
            ("node.example.com/flaky", None, "NoExecute")
        );
        assert_eq!(
            parse_taint("a=b:Sometimes").unwrap_err(),
            "invalid taint effect: Sometimes, unsupported taint effect"
        );
        assert_eq!(parse_taint("a=b").unwrap_err(), "invalid taint spec: a=b");
        assert!(parse_taint("=b:NoSchedule").is_err());
    }

    #[test]
    fn timeouts_as_durations_or_seconds() {
        assert_eq!(parse_timeout("2m0s").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_timeout("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_timeout("30").unwrap(), Duration::from_secs(30));
        assert!(parse_timeout("soon").is_err());
    }
}
