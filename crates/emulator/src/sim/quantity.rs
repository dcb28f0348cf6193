//! Kubernetes resource quantities (`500m`, `2`, `1.5Gi`, `1e3`), parsed here and not shared with
//! the planner's code: the simulation checks the planner, so it must not reuse its arithmetic.

use serde_json::Value;

/// A quantity in thousandths of its unit (millicores for cpu, millibytes for memory), rounded
/// up as the API server rounds; `None` when it does not parse.
pub(crate) fn parse_milli(text: &str) -> Option<i128> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "m" => 0.001,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        "Ei" => 1024.0f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let milli = (number * factor * 1000.0).ceil();
    if !milli.is_finite() || milli < 0.0 {
        return None;
    }
    Some(milli as i128)
}

/// A quantity from JSON (a string, or a bare number as some clients send).
pub(crate) fn milli_of(v: &Value) -> Option<i128> {
    match v {
        Value::String(s) => parse_milli(s),
        Value::Number(n) => parse_milli(&n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_in_thousandths_of_their_unit() {
        assert_eq!(parse_milli("500m"), Some(500));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("1Ki"), Some(1_024_000));
        assert_eq!(parse_milli("1Gi"), Some(1_073_741_824_000));
        assert_eq!(parse_milli("1G"), Some(1_000_000_000_000));
        assert_eq!(parse_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_milli("lots"), None);
        assert_eq!(parse_milli(""), None);
    }
}
