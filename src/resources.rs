//! Compute resources: Kubernetes quantities (`500m`, `64Mi`, `1G`), their cgroup
//! settings (CPU shares and quota, as the kubelet's `MilliCPUToShares`/`MilliCPUToQuota`),
//! and the pod's QoS class.

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// A parsed quantity, exact to the milli-unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    millis: i128,
}

impl Quantity {
    /// The quantity in thousandths (millicores for CPU).
    #[must_use]
    pub fn millis(self) -> i64 {
        i64::try_from(self.millis).unwrap_or(i64::MAX)
    }

    /// The quantity rounded up to a whole unit (bytes for memory).
    #[must_use]
    pub fn value(self) -> i64 {
        i64::try_from((self.millis + 999).div_euclid(1000)).unwrap_or(i64::MAX)
    }
}

impl std::str::FromStr for Quantity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(split);
        // (numerator, denominator) of the suffix's multiplier, in milli-units.
        let (mul, div): (i128, i128) = match suffix {
            "" => (1000, 1),
            "m" => (1, 1),
            "k" => (1000 * 1000, 1),
            "M" => (1000 * 1000_i128.pow(2), 1),
            "G" => (1000 * 1000_i128.pow(3), 1),
            "T" => (1000 * 1000_i128.pow(4), 1),
            "P" => (1000 * 1000_i128.pow(5), 1),
            "E" => (1000 * 1000_i128.pow(6), 1),
            "Ki" => (1000 << 10, 1),
            "Mi" => (1000 << 20, 1),
            "Gi" => (1000 << 30, 1),
            "Ti" => (1000 << 40, 1),
            "Pi" => (1000 << 50, 1),
            "Ei" => (1000 << 60, 1),
            "n" => (1, 1_000_000),
            "u" => (1, 1000),
            _ if suffix.starts_with(['e', 'E']) => {
                let exp: u32 = suffix[1..]
                    .parse()
                    .map_err(|_| format!("bad quantity {s:?}"))?;
                (1000 * 10_i128.pow(exp), 1)
            }
            _ => return Err(format!("bad quantity {s:?}: unknown suffix {suffix:?}")),
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        let negative = whole.starts_with('-');
        let whole = whole.trim_start_matches(['+', '-']);
        if whole.is_empty() && frac.is_empty() {
            return Err(format!("bad quantity {s:?}"));
        }
        let parse = |d: &str| -> Result<i128, String> {
            if d.is_empty() {
                Ok(0)
            } else {
                d.parse::<i128>().map_err(|_| format!("bad quantity {s:?}"))
            }
        };
        let scale =
            10_i128.pow(u32::try_from(frac.len()).map_err(|_| format!("bad quantity {s:?}"))?);
        let scaled = parse(whole)? * scale + parse(frac)?;
        // Round up, as the API does for fractions of the smallest unit.
        let millis = (scaled * mul + scale * div - 1).div_euclid(scale * div);
        Ok(Self {
            millis: if negative { -millis } else { millis },
        })
    }
}

/// CPU shares for a CPU request in millicores: 1024 per core, at least 2.
#[must_use]
pub fn cpu_shares(request_millis: Option<i64>) -> i64 {
    match request_millis {
        None | Some(0) => 2,
        Some(m) => (m * 1024 / 1000).max(2),
    }
}

/// CFS quota for a CPU limit in millicores within `period` µs, at least 1 ms.
#[must_use]
pub fn cpu_quota(limit_millis: i64, period: i64) -> i64 {
    (limit_millis * period / 1000).max(1000)
}

/// The pod's QoS class: `Guaranteed`, `Burstable` or `BestEffort` (the API's `GetPodQOS`).
#[must_use]
pub fn qos_class(spec: &PodSpec) -> &'static str {
    let containers: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let r = c.resources.as_ref();
        let requests = r.and_then(|r| r.requests.clone()).unwrap_or_default();
        let limits = r.and_then(|r| r.limits.clone()).unwrap_or_default();
        for name in ["cpu", "memory"] {
            let request = requests.get(name).or_else(|| limits.get(name));
            let limit = limits.get(name);
            let parse = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                q.and_then(|q| q.0.parse::<Quantity>().ok())
                    .filter(|q| q.millis > 0)
            };
            let (request, limit) = (parse(request), parse(limit));
            any |= request.is_some() || limit.is_some();
            guaranteed &= limit.is_some() && request == limit;
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(q("500m").millis(), 500);
        assert_eq!(q("2").millis(), 2000);
        assert_eq!(q("0.5").millis(), 500);
        assert_eq!(q("64Mi").value(), 64 << 20);
        assert_eq!(q("1G").value(), 1_000_000_000);
        assert_eq!(q("1.5Gi").value(), 3 << 29);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("100k").value(), 100_000);
        assert!("12x".parse::<Quantity>().is_err());
        assert!("".parse::<Quantity>().is_err());
    }

    #[test]
    fn cpu_settings_match_the_kubelet() {
        assert_eq!(cpu_shares(None), 2);
        assert_eq!(cpu_shares(Some(1)), 2);
        assert_eq!(cpu_shares(Some(250)), 256);
        assert_eq!(cpu_quota(500, 100_000), 50_000);
        assert_eq!(cpu_quota(1, 100_000), 1000);
    }

    fn spec(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> PodSpec {
        let map = |l: &[(&str, &str)]| {
            (!l.is_empty()).then(|| {
                l.iter()
                    .map(|(k, v)| ((*k).to_owned(), Q((*v).to_owned())))
                    .collect()
            })
        };
        PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: map(requests),
                    limits: map(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn qos_classes() {
        assert_eq!(qos_class(&spec(&[], &[])), "BestEffort");
        assert_eq!(qos_class(&spec(&[("cpu", "100m")], &[])), "Burstable");
        assert_eq!(
            qos_class(&spec(&[], &[("cpu", "1"), ("memory", "1Gi")])),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&spec(
                &[("cpu", "500m"), ("memory", "1Gi")],
                &[("cpu", "1"), ("memory", "1Gi")]
            )),
            "Burstable"
        );
    }
}
