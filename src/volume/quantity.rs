//! Just enough of the Kubernetes `resource.Quantity` for the downward API: parse a quantity
//! string exactly (as a fraction) and round it up to whole units or thousandths, like
//! `Quantity.Value()` and `Quantity.MilliValue()`.

/// An exact, non-negative quantity `numerator / denominator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Quantity {
    numerator: u128,
    denominator: u128,
}

/// Largest decimal exponent accepted; beyond it the value does not fit a node's resources.
const MAX_EXPONENT: u32 = 30;

impl Quantity {
    /// Parses `<number><suffix>`: a decimal number, then a binary (`Ki`..`Ei`), decimal
    /// (`n`, `u`, `m`, `k`, `M`..`E`) or exponent (`e3`, `E-2`) suffix.
    pub(super) fn parse(text: &str) -> Result<Self, String> {
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
    pub(super) fn value(self) -> u128 {
        self.numerator.div_ceil(self.denominator)
    }

    /// The value in thousandths, rounded up (`Quantity.MilliValue()`).
    pub(super) fn milli_value(self) -> u128 {
        self.numerator
            .saturating_mul(1000)
            .div_ceil(self.denominator)
    }
}

fn pow10(exp: u32) -> Option<u128> {
    10u128.checked_pow(exp)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
