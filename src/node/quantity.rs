//! Quantities in the canonical form the API server gives them back in.
//!
//! The API server re-serialises every quantity it stores: a suffix-less number is decimal
//! (`2000` comes back as `2k`), a binary suffix stays binary and is reduced (`2048Ki` comes
//! back as `2Mi`). Node status compares what it computes with what the server holds, so
//! it must produce these forms itself or see a change at every heartbeat.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const DECIMAL_SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// A whole count (pods, CPUs) in canonical decimal form: `110`, `2`, `1k`.
pub(crate) fn count(value: u64) -> Quantity {
    Quantity(decimal(value))
}

/// An amount of bytes: binary suffixes when it is a multiple of 1 Ki (`24684092Ki`,
/// `100Mi`), canonical decimal otherwise (`0`, `512`, `2k`), as the server would write it.
pub(crate) fn bytes(value: u64) -> Quantity {
    if value == 0 || !value.is_multiple_of(1024) {
        return Quantity(decimal(value));
    }
    let (mut mantissa, mut exponent) = (value, 0);
    while mantissa.is_multiple_of(1024) && exponent < BINARY_SUFFIXES.len() - 1 {
        mantissa /= 1024;
        exponent += 1;
    }
    Quantity(format!("{mantissa}{}", BINARY_SUFFIXES[exponent]))
}

/// CPU in millicores: whole cores as a count (`2`), otherwise millis (`1900m`).
pub(crate) fn millis(value: u64) -> Quantity {
    if value.is_multiple_of(1000) {
        count(value / 1000)
    } else {
        Quantity(format!("{value}m"))
    }
}

fn decimal(value: u64) -> String {
    if value == 0 {
        return "0".into();
    }
    let (mut mantissa, mut exponent) = (value, 0);
    while mantissa.is_multiple_of(1000) && exponent < DECIMAL_SUFFIXES.len() - 1 {
        mantissa /= 1000;
        exponent += 1;
    }
    format!("{mantissa}{}", DECIMAL_SUFFIXES[exponent])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_the_api_server_writes_back() {
        assert_eq!(count(110).0, "110");
        assert_eq!(count(2).0, "2");
        assert_eq!(count(2000).0, "2k");
        assert_eq!(bytes(0).0, "0");
        assert_eq!(bytes(512).0, "512");
        assert_eq!(bytes(1536).0, "1536");
        assert_eq!(bytes(2000).0, "2k");
        assert_eq!(bytes(1_000_000).0, "1M");
        assert_eq!(bytes(1024).0, "1Ki");
        assert_eq!(bytes(100 << 20).0, "100Mi");
        assert_eq!(bytes(2048 * 1024).0, "2Mi");
        assert_eq!(bytes(1 << 30).0, "1Gi");
        assert_eq!(bytes(24_684_092 * 1024).0, "24684092Ki");
        assert_eq!(millis(2000).0, "2");
        assert_eq!(millis(1900).0, "1900m");
        assert_eq!(millis(0).0, "0");
    }
}
