//! Compute resources: Kubernetes quantities (`500m`, `64Mi`, `1G`), parsed exactly as
//! `resource.Quantity` does (their cgroup settings are [`crate::cm`]'s), the pod's QoS
//! class, and the values the downward API exposes (`resourceFieldRef`).
//! Knows no other module of the agent: vocabulary only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

/// An exact, non-negative quantity `numerator / denominator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    numerator: u128,
    denominator: u128,
}

/// Largest decimal exponent accepted; beyond it the value does not fit a node's resources.
const MAX_EXPONENT: u32 = 30;

impl Quantity {
    /// Parses `<number><suffix>`: a decimal number, then a binary (`Ki`..`Ei`), decimal
    /// (`n`, `u`, `m`, `k`, `M`..`E`) or exponent (`e3`, `E-2`) suffix.
    ///
    /// # Errors
    /// What is wrong with the text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("invalid quantity {text:?}: {why}");
        let s = text.trim();
        let s = s.strip_prefix('+').unwrap_or(s);
        if s.starts_with('-') {
            return Err(bad("negative"));
        }
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(split);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return Err(bad("no digits"));
        }
        let digits = format!("{whole}{fraction}");
        let mut numerator: u128 = digits.parse().map_err(|_| bad("too many digits"))?;
        let fraction_len = u32::try_from(fraction.len()).map_err(|_| bad("too many digits"))?;
        let mut denominator = pow10(fraction_len).ok_or_else(|| bad("too many digits"))?;
        let (binary_shift, decimal_exp): (u32, i64) = match suffix {
            "" => (0, 0),
            "Ki" => (10, 0),
            "Mi" => (20, 0),
            "Gi" => (30, 0),
            "Ti" => (40, 0),
            "Pi" => (50, 0),
            "Ei" => (60, 0),
            "n" => (0, -9),
            "u" => (0, -6),
            "m" => (0, -3),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            exp if exp.starts_with(['e', 'E']) => {
                (0, exp[1..].parse().map_err(|_| bad("bad exponent"))?)
            }
            _ => return Err(bad("unknown suffix")),
        };
        numerator = numerator
            .checked_mul(1u128 << binary_shift)
            .ok_or_else(|| bad("too large"))?;
        let scale = u32::try_from(decimal_exp.unsigned_abs())
            .ok()
            .filter(|e| *e <= MAX_EXPONENT)
            .and_then(pow10)
            .ok_or_else(|| bad("exponent out of range"))?;
        if decimal_exp >= 0 {
            numerator = numerator
                .checked_mul(scale)
                .ok_or_else(|| bad("too large"))?;
        } else {
            denominator = denominator
                .checked_mul(scale)
                .ok_or_else(|| bad("too many digits"))?;
        }
        Ok(Self {
            numerator,
            denominator,
        })
    }

    /// The value in whole units, rounded up (`Quantity.Value()`).
    #[must_use]
    pub fn value(self) -> u128 {
        self.numerator.div_ceil(self.denominator)
    }

    /// The value in whole units if it is a whole number that fits an `i64`
    /// (`Quantity.AsInt64()`).
    #[must_use]
    pub fn as_int64(self) -> Option<i64> {
        self.numerator
            .is_multiple_of(self.denominator)
            .then(|| i64::try_from(self.numerator / self.denominator).ok())
            .flatten()
    }

    /// The value in thousandths, rounded up (`Quantity.MilliValue()`).
    #[must_use]
    pub fn milli_value(self) -> u128 {
        self.numerator
            .saturating_mul(1000)
            .div_ceil(self.denominator)
    }
}

fn pow10(exp: u32) -> Option<u128> {
    10u128.checked_pow(exp)
}

/// The value of a `resourceFieldRef` (`limits.cpu`, `requests.memory`, ...) of
/// `container`, divided by the divisor and rounded up, as the kubelet's
/// `ExtractContainerResourceValue`. An unset limit is the node's `allocatable`
/// (`MergeContainerResourceLimits`); an unset or zero divisor means 1 (the API server sends
/// an unset divisor as `"0"`).
///
/// # Errors
/// An unsupported resource, a quantity that does not parse, or an unset limit whose
/// allocatable the node does not know.
pub fn container_resource_value(
    container: &Container,
    selector: &ResourceFieldSelector,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<String, String> {
    let (kind, resource) = selector
        .resource
        .split_once('.')
        .filter(|(kind, _)| matches!(*kind, "limits" | "requests"))
        .ok_or_else(|| format!("unsupported container resource : {}", selector.resource))?;
    let hugepages = resource.starts_with("hugepages-");
    if !(matches!(resource, "cpu" | "memory" | "ephemeral-storage") || hugepages) {
        return Err(format!(
            "unsupported container resource : {}",
            selector.resource
        ));
    }
    let resources = container.resources.as_ref();
    let set = if kind == "limits" {
        resources.and_then(|r| r.limits.as_ref())
    } else {
        resources.and_then(|r| r.requests.as_ref())
    };
    let amount = match set.and_then(|m| m.get(resource)) {
        Some(q) => Some(q),
        None if kind == "limits" && !hugepages => {
            Some(allocatable.get(resource).ok_or_else(|| {
                format!(
                    "container {:?} sets no {} and the node's allocatable {resource} is not known",
                    container.name, selector.resource
                )
            })?)
        }
        None => None,
    };
    let amount = amount.map(|q| Quantity::parse(&q.0)).transpose()?;
    let divisor = selector
        .divisor
        .as_ref()
        .map(|d| Quantity::parse(&d.0))
        .transpose()?;
    let value = |q: Quantity| {
        if resource == "cpu" {
            q.milli_value()
        } else {
            q.value()
        }
    };
    let divisor = divisor
        .map(value)
        .filter(|d| *d != 0)
        .unwrap_or(if resource == "cpu" { 1000 } else { 1 });
    Ok(amount.map_or(0, |q| value(q).div_ceil(divisor)).to_string())
}

/// A pod's QoS class (`v1.PodQOSClass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container has equal CPU and memory requests and limits.
    Guaranteed,
    /// Some request or limit, but not guaranteed.
    Burstable,
    /// No request or limit at all.
    BestEffort,
}

impl QosClass {
    /// The name in `status.qosClass`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

/// The pod's QoS class (the API's `GetPodQOS`).
#[must_use]
pub fn qos_class(spec: &PodSpec) -> QosClass {
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
                q.and_then(|q| Quantity::parse(&q.0).ok())
                    .map(Quantity::milli_value)
                    .filter(|m| *m > 0)
            };
            let (request, limit) = (parse(request), parse(limit));
            any |= request.is_some() || limit.is_some();
            guaranteed &= limit.is_some() && request == limit;
        }
    }
    if !any {
        QosClass::BestEffort
    } else if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn values_round_up_like_the_go_quantity() {
        assert_eq!(q("1").milli_value(), 1000);
        assert_eq!(q("250m").milli_value(), 250);
        assert_eq!(q("250m").value(), 1);
        assert_eq!(q("1.5").milli_value(), 1500);
        assert_eq!(q("0.0001").milli_value(), 1);
        assert_eq!(q("64Mi").value(), 64 << 20);
        assert_eq!(q("1Gi").value(), 1 << 30);
        assert_eq!(q("2k").value(), 2000);
        assert_eq!(q("1M").value(), 1_000_000);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("5E-1").milli_value(), 500);
        assert_eq!(q("100n").value(), 1);
        assert_eq!(q(".5").milli_value(), 500);
        assert_eq!(q("1Ei").value(), 1 << 60);
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for bad in ["", "-1", "1Xi", "abc", "1e", "1e99", "."] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} parsed");
        }
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
        assert_eq!(qos_class(&spec(&[], &[])), QosClass::BestEffort);
        assert_eq!(
            qos_class(&spec(&[("cpu", "100m")], &[])),
            QosClass::Burstable
        );
        assert_eq!(
            qos_class(&spec(&[], &[("cpu", "1"), ("memory", "1Gi")])),
            QosClass::Guaranteed
        );
        assert_eq!(
            qos_class(&spec(
                &[("cpu", "500m"), ("memory", "1Gi")],
                &[("cpu", "1"), ("memory", "1Gi")]
            )),
            QosClass::Burstable
        );
    }
}
