//! Kubernetes resource quantities (`100m`, `1.5`, `2Gi`, `500M`, `1e3`) as exact integers of
//! milli-units, the way the scheduler compares them (`resource.Quantity.MilliValue()`, rounded
//! up). CPU `250m` is 250; memory `1Ki` is 1,024,000.

/// A quantity in milli-units (value × 1000), rounded up as `MilliValue` does.
pub type Milli = i128;

/// Why a quantity did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {text:?}: {why}")]
pub struct QuantityError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Parses a quantity into milli-units. The grammar is Kubernetes': a signed decimal number, then
/// an optional binary suffix (`Ki`..`Ei`), decimal suffix (`n`, `u`, `m`, ``, `k`, `M`..`E`) or
/// exponent (`e3`, `E-2`).
pub fn parse(text: &str) -> Result<Milli, QuantityError> {
    let err = |why| QuantityError {
        text: text.to_string(),
        why,
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let (negative, s) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(err("no number"));
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    // The number as digits × 10^-scale.
    let mut mantissa: i128 = 0;
    for d in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
            .ok_or_else(|| err("too large"))?;
    }
    let scale = frac_part.len() as i32;
    // value = mantissa × 10^-scale × multiplier; result = ceil(value × 1000).
    let (num, den): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| err("bad exponent"))?;
            if !(-18..=18).contains(&e) {
                return Err(err("exponent out of range"));
            }
            if e >= 0 {
                (10i128.pow(e as u32), 1)
            } else {
                (1, 10i128.pow((-e) as u32))
            }
        }
        _ => return Err(err("unknown suffix")),
    };
    let num = mantissa
        .checked_mul(num)
        .and_then(|v| v.checked_mul(1000))
        .ok_or_else(|| err("too large"))?;
    let den = den * 10i128.pow(scale as u32);
    let value = num / den + i128::from(num % den != 0);
    Ok(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_to_milli_units_as_kubernetes_reads_them() {
        for (text, milli) in [
            ("1", 1_000),
            ("250m", 250),
            ("0.5", 500),
            ("1.5", 1_500),
            ("100", 100_000),
            ("1k", 1_000_000),
            ("1Ki", 1_024_000),
            ("128Mi", 128 * 1024 * 1024 * 1000),
            ("2Gi", 2 * 1024 * 1024 * 1024 * 1000),
            ("1G", 1_000_000_000_000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("+2", 2_000),
            ("-1", -1_000),
            ("0", 0),
        ] {
            assert_eq!(parse(text), Ok(milli), "{text}");
        }
    }

    #[test]
    fn fractions_below_a_milli_unit_round_up_as_milli_value_does() {
        assert_eq!(parse("1n"), Ok(1));
        assert_eq!(parse("1500u"), Ok(2));
        assert_eq!(parse("0.0001"), Ok(1));
    }

    #[test]
    fn malformed_quantities_are_errors_that_name_the_text() {
        for text in ["", "m", "1.2.3", "1Xi", "abc", "1e99", "."] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.text, text);
            assert!(e.to_string().contains("invalid quantity"));
        }
    }
}
