//! `resource.Quantity` as the Go code of Kubernetes v1.20.2 holds it: which of its two
//! representations a parse gives (an `int64Amount`, or an `inf.Dec` rounded up to
//! nano units), the string it keeps when the text was already canonical, the rounding up
//! to milli units that the API's defaulting applies to every `ResourceList`, and the two
//! renderings the kubelet's hashes see: `MarshalJSON` (the canonical form, or the kept
//! string) and go-spew's `%#v` of the struct. [`crate::resources::Quantity`] is the value
//! the agent computes with; this is the form others hash.
//!
//! Values of 36 digits or more in nano units, or exponents beyond ±1000, are refused
//! rather than guessed: no pod spec has them.

use std::fmt::Write as _;

/// `resource.Format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `e3`, `E-2`.
    DecimalExponent,
    /// `Ki` .. `Ei`.
    BinarySi,
    /// `n` .. `E`, or no suffix.
    DecimalSi,
    /// A zero `Quantity{}` (no format).
    Unset,
}

impl Format {
    fn as_str(self) -> &'static str {
        match self {
            Self::DecimalExponent => "DecimalExponent",
            Self::BinarySi => "BinarySI",
            Self::DecimalSi => "DecimalSI",
            Self::Unset => "",
        }
    }
}

/// The value: `value × 10^scale` (`int64Amount`), or `±unscaled × 10^-scale` (`inf.Dec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Amount {
    Int {
        value: i64,
        scale: i32,
    },
    Dec {
        negative: bool,
        unscaled: u128,
        scale: i32,
    },
}

/// A quantity as Go holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoQuantity {
    amount: Amount,
    /// The text kept by the parse (`Quantity.s`).
    kept: Option<String>,
    format: Format,
}

/// Why a text is not a quantity this module renders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Go's parser refuses it too.
    #[error("quantity {0:?} does not parse")]
    Invalid(String),
    /// Go would take it, but its digits or exponent are beyond what is modelled here.
    #[error("quantity {0:?} is out of the modelled range")]
    OutOfRange(String),
}

const NANO: i32 = -9;
const MAX_EXPONENT: i64 = 1000;
/// The largest unscaled value modelled: its canonical form's digits fit 128 bits.
const LARGEST: u128 = 10u128.pow(36);

/// The parts `parseQuantityString` finds.
struct Parts<'a> {
    positive: bool,
    /// The number as written up to its suffix (sign, zeros and point included).
    value: &'a str,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

fn scan(s: &str) -> Option<Parts<'_>> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    match b.first() {
        Some(b'-') => {
            positive = false;
            pos = 1;
        }
        Some(b'+') => pos = 1,
        _ => {}
    }
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        return Some(Parts {
            positive,
            value: "0",
            num: "0",
            denom: "",
            suffix: "",
        });
    }
    let start = pos;
    while pos < end && is_digit(b[pos]) {
        pos += 1;
    }
    let num = if pos == start { "0" } else { &s[start..pos] };
    let mut denom = "";
    if pos < end && b[pos] == b'.' {
        pos += 1;
        let from = pos;
        while pos < end && is_digit(b[pos]) {
            pos += 1;
        }
        denom = &s[from..pos];
    }
    let value = &s[..pos];
    let suffix = &s[pos..];
    let mut i = pos;
    while i < end && b"eEinumkKMGTP".contains(&b[i]) {
        i += 1;
    }
    if i < end && (b[i] == b'-' || b[i] == b'+') {
        i += 1;
    }
    if !b[i..].iter().all(|c| is_digit(*c)) {
        return None;
    }
    Some(Parts {
        positive,
        value,
        num,
        denom,
        suffix,
    })
}

/// `quantitySuffixer.interpret`: (base, exponent, format).
fn interpret(suffix: &str) -> Option<(u32, i64, Format)> {
    let decimal = |e| Some((10, e, Format::DecimalSi));
    let binary = |e| Some((2, e, Format::BinarySi));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        s if s.len() > 1 && s.starts_with(['e', 'E']) => {
            let exponent: i64 = s[1..].parse().ok()?;
            Some((10, exponent, Format::DecimalExponent))
        }
        _ => None,
    }
}

fn pow10(e: u32) -> Option<u128> {
    10u128.checked_pow(e)
}

/// `x / 10^digits`, rounded away from zero.
fn drop_digits_up(x: u128, digits: u32) -> u128 {
    match pow10(digits) {
        Some(p) => x.div_ceil(p),
        None => u128::from(x != 0),
    }
}

/// `±unscaled × 10^-from` at scale `to`, rounded away from zero (`inf.Dec.Round` with
/// `RoundUp`).
fn rescale(unscaled: u128, from: i32, to: i32) -> Option<u128> {
    if to >= from {
        unscaled.checked_mul(pow10(u32::try_from(to - from).ok()?)?)
    } else {
        Some(drop_digits_up(unscaled, u32::try_from(from - to).ok()?))
    }
}

impl GoQuantity {
    /// A zero `Quantity{}`: what an absent quantity field holds.
    #[must_use]
    pub fn zero() -> Self {
        Self {
            amount: Amount::Int { value: 0, scale: 0 },
            kept: None,
            format: Format::Unset,
        }
    }

    /// `resource.ParseQuantity`.
    ///
    /// # Errors
    /// The text is not a quantity, or out of the modelled range.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let invalid = || QuantityError::Invalid(text.to_owned());
        let out_of_range = || QuantityError::OutOfRange(text.to_owned());
        if text.is_empty() {
            return Err(invalid());
        }
        if text == "0" {
            return Ok(Self {
                amount: Amount::Int { value: 0, scale: 0 },
                kept: Some(text.to_owned()),
                format: Format::DecimalSi,
            });
        }
        let p = scan(text).ok_or_else(invalid)?;
        let (base, exponent, format) = interpret(p.suffix).ok_or_else(invalid)?;
        if exponent.abs() > MAX_EXPONENT {
            return Err(out_of_range());
        }
        let exponent = i32::try_from(exponent).map_err(|_| out_of_range())?;
        let digits = i32::try_from(p.num.len() + p.denom.len()).map_err(|_| out_of_range())?;
        let denom_len = i32::try_from(p.denom.len()).map_err(|_| out_of_range())?;
        let (mut scale, mantissa, precision) = match format {
            Format::BinarySi if p.denom.is_empty() => {
                // As Go: 1Mi (2^20) has about 6 decimal digits.
                (0, 1i64 << exponent, 15 - digits - exponent * 3 / 10 - 1)
            }
            Format::BinarySi => (0, 1, -1),
            _ => (exponent, 1, 18 - digits),
        };
        if precision >= 0 {
            scale -= denom_len;
            if scale >= NANO {
                let shifted = format!("{}{}", p.num, p.denom);
                let value: i64 = shifted.parse().map_err(|_| invalid())?;
                if let Some(result) = value.checked_mul(mantissa) {
                    let result = if p.positive { result } else { -result };
                    let canonical = match format {
                        Format::BinarySi => exponent % 10 == 0 && value & 0x07 != 0,
                        _ => {
                            scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0')
                        }
                    };
                    return Ok(Self {
                        amount: Amount::Int {
                            value: result,
                            scale,
                        },
                        kept: canonical.then(|| text.to_owned()),
                        format,
                    });
                }
            }
        }
        Self::parse_decimal(&p, base, exponent, format).ok_or_else(out_of_range)
    }

    /// The `inf.Dec` path of `ParseQuantity`.
    fn parse_decimal(p: &Parts<'_>, base: u32, exponent: i32, format: Format) -> Option<Self> {
        let number = p.value.trim_start_matches(['+', '-']);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let digits = format!("{whole}{fraction}");
        if digits.is_empty() {
            return None;
        }
        let mut unscaled: u128 = digits.parse().ok()?;
        let mut scale = i32::try_from(fraction.len()).ok()?;
        if base == 10 {
            scale -= exponent;
        } else {
            unscaled = unscaled.checked_mul(1u128.checked_shl(u32::try_from(exponent).ok()?)?)?;
        }
        let max = u128::from(i64::MAX.unsigned_abs());
        // A binary quantity is capped at the largest int64 (Go caps after rounding to
        // nano units, which cannot carry a value past that whole number).
        let capped =
            format == Format::BinarySi && rescale(max, 0, scale).is_some_and(|m| unscaled > m);
        if capped {
            unscaled = max;
            scale = 0;
        } else if unscaled != 0 {
            unscaled = rescale(unscaled, scale, -NANO)?;
            scale = -NANO;
        }
        if unscaled >= LARGEST {
            return None;
        }
        let mut format = format;
        if format == Format::BinarySi {
            let one = rescale(1, 0, scale)?;
            if unscaled != 0 && unscaled < one {
                format = Format::DecimalSi;
            }
        }
        Some(Self {
            amount: Amount::Dec {
                negative: !p.positive && unscaled != 0,
                unscaled,
                scale,
            },
            kept: None,
            format,
        })
    }

    /// `RoundUp(resource.Milli)`, as `SetDefaults_ResourceList` applies it.
    #[must_use]
    pub fn rounded_up_to_milli(mut self) -> Self {
        const MILLI: i32 = -3;
        match self.amount {
            Amount::Dec {
                negative,
                unscaled,
                scale,
            } => {
                self.kept = None;
                if let Some(unscaled) = rescale(unscaled, scale, -MILLI) {
                    self.amount = Amount::Dec {
                        negative,
                        unscaled,
                        scale: -MILLI,
                    };
                }
            }
            Amount::Int { scale, .. } if scale >= MILLI => {}
            Amount::Int { value, scale } => {
                self.kept = None;
                let magnitude = drop_digits_up(
                    u128::from(value.unsigned_abs()),
                    (MILLI - scale).unsigned_abs(),
                );
                let magnitude = i64::try_from(magnitude).unwrap_or(i64::MAX);
                self.amount = Amount::Int {
                    value: if value < 0 { -magnitude } else { magnitude },
                    scale: MILLI,
                };
            }
        }
        self
    }

    /// The value as sign and magnitude `unscaled × 10^-scale`.
    fn signed(&self) -> (bool, u128, i32) {
        match self.amount {
            Amount::Int { value, scale } => (value < 0, u128::from(value.unsigned_abs()), -scale),
            Amount::Dec {
                negative,
                unscaled,
                scale,
            } => (negative, unscaled, scale),
        }
    }

    /// The text `MarshalJSON` writes (without its quotes), as `String()` also gives it.
    #[must_use]
    pub fn marshal(&self) -> String {
        if let Some(kept) = &self.kept {
            return kept.clone();
        }
        let (negative, unscaled, scale) = self.signed();
        if unscaled == 0 {
            return "0".into();
        }
        let sign = if negative { "-" } else { "" };
        let mut format = self.format;
        if format == Format::BinarySi {
            // Below 1024, or not a whole number: shown in decimal.
            let whole = if scale <= 0 {
                pow10(scale.unsigned_abs()).and_then(|p| unscaled.checked_mul(p))
            } else {
                pow10(scale.unsigned_abs())
                    .filter(|p| unscaled.is_multiple_of(*p))
                    .map(|p| unscaled / p)
            };
            match whole {
                Some(whole) if whole >= 1024 => {
                    let (mut m, mut k) = (whole, 0);
                    while m >= 1024 && m.is_multiple_of(1024) {
                        m /= 1024;
                        k += 1;
                    }
                    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].get(k).copied();
                    return format!("{sign}{m}{}", suffix.unwrap_or_default());
                }
                _ => format = Format::DecimalSi,
            }
        }
        if format == Format::Unset {
            format = Format::DecimalExponent;
        }
        let (mut m, mut e) = (unscaled, -i64::from(scale));
        while m >= 10 && m.is_multiple_of(10) {
            m /= 10;
            e += 1;
        }
        while e.rem_euclid(3) != 0 {
            m *= 10;
            e -= 1;
        }
        let suffix = match format {
            Format::DecimalExponent if e == 0 => String::new(),
            Format::DecimalExponent => format!("e{e}"),
            // Go finds no suffix beyond `n`..`E` and writes none.
            _ => match e {
                -9 => "n",
                -6 => "u",
                -3 => "m",
                3 => "k",
                6 => "M",
                9 => "G",
                12 => "T",
                15 => "P",
                18 => "E",
                _ => "",
            }
            .to_owned(),
        };
        format!("{sign}{m}{suffix}")
    }

    /// go-spew's `%#v` of the struct, without its leading `(resource.Quantity)`.
    pub fn spew(&self, out: &mut String) {
        let (value, scale, dec) = match self.amount {
            Amount::Int { value, scale } => (value, scale, None),
            Amount::Dec {
                negative,
                unscaled,
                scale,
            } => (0, 0, Some((negative, unscaled, scale))),
        };
        let _ = write!(
            out,
            "{{i:(resource.int64Amount){{value:(int64){value} scale:(resource.Scale){scale}}} d:(resource.infDecAmount){{Dec:(*inf.Dec)"
        );
        match dec {
            None => out.push_str("<nil>"),
            Some((negative, unscaled, scale)) => {
                let _ = write!(
                    out,
                    "{{unscaled:(big.Int){{neg:(bool){negative} abs:(big.nat)"
                );
                // Little-endian 64-bit words.
                let low = u64::try_from(unscaled & u128::from(u64::MAX)).unwrap_or_default();
                let high = u64::try_from(unscaled >> 64).unwrap_or_default();
                match (low, high) {
                    (0, 0) => out.push_str("<nil>"),
                    (low, 0) => {
                        let _ = write!(out, "[{low}]");
                    }
                    (low, high) => {
                        let _ = write!(out, "[{low} {high}]");
                    }
                }
                let _ = write!(out, "}} scale:(inf.Scale){scale}}}");
            }
        }
        let kept = self.kept.as_deref().unwrap_or_default();
        let _ = write!(
            out,
            "}} s:(string){kept} Format:(resource.Format){}}}",
            self.format.as_str()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every quantity of the reference vectors, rendered as the kubelet's own code renders
    /// it: `MarshalJSON`, go-spew's `%#v`, and both after `RoundUp(Milli)`
    /// (tests/data/kubelet-v1.20.2/quantities.jsonl, printed by the vendored
    /// `resource.Quantity` of Kubernetes v1.20.2).
    #[test]
    fn quantities_are_rendered_as_go_renders_them() {
        let vectors = include_str!("../../tests/data/kubelet-v1.20.2/quantities.jsonl");
        let (mut checked, mut out_of_range) = (0, Vec::new());
        for line in vectors.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let text = v["in"].as_str().unwrap();
            let parsed = GoQuantity::parse(text.trim());
            if v.get("error").is_some() {
                assert!(
                    matches!(parsed, Err(QuantityError::Invalid(_))),
                    "{text}: Go refuses it, here {parsed:?}"
                );
                continue;
            }
            let q = match parsed {
                Ok(q) => q,
                Err(QuantityError::OutOfRange(_)) => {
                    out_of_range.push(text.to_owned());
                    continue;
                }
                Err(e) => panic!("{text}: Go parses it, here {e}"),
            };
            let spew = |q: &GoQuantity| {
                let mut out = String::from("(resource.Quantity)");
                q.spew(&mut out);
                out
            };
            assert_eq!(format!("\"{}\"", q.marshal()), v["json"], "{text}");
            assert_eq!(spew(&q), v["spew"], "{text}");
            let milli = q.clone().rounded_up_to_milli();
            assert_eq!(
                format!("\"{}\"", milli.marshal()),
                v["milli_json"],
                "{text}"
            );
            assert_eq!(spew(&milli), v["milli_spew"], "{text}");
            // The Go form reads back as itself: the text carries the value.
            for form in [q.marshal(), milli.marshal()] {
                assert_eq!(GoQuantity::parse(&form).unwrap().marshal(), form, "{text}");
            }
            checked += 1;
        }
        assert!(checked > 700, "{checked} checked");
        // Only texts of 36 digits and more in nano units are refused.
        for text in &out_of_range {
            let digits = text.chars().filter(char::is_ascii_digit).count();
            assert!(digits >= 19, "{text} refused");
        }
        assert!(out_of_range.len() < 40, "{out_of_range:?}");
    }

    #[test]
    fn a_zero_quantity_is_zero() {
        let mut out = String::new();
        GoQuantity::zero().spew(&mut out);
        assert_eq!(
            out,
            "{i:(resource.int64Amount){value:(int64)0 scale:(resource.Scale)0} d:(resource.infDecAmount){Dec:(*inf.Dec)<nil>} s:(string) Format:(resource.Format)}"
        );
        assert_eq!(GoQuantity::zero().marshal(), "0");
    }
}
