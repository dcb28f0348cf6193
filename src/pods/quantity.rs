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
    // Trailing zeros of the fraction say nothing.
    let frac_part = frac_part.trim_end_matches('0');
    // The number as digits × 10^-scale. Fraction digits past what an i128 holds only matter
    // for rounding up: they are kept as `sticky` (whether any of them is not zero).
    let mut mantissa: i128 = 0;
    let mut scale: i32 = 0;
    let mut sticky = false;
    for d in int_part.bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
            .ok_or_else(|| err("too large"))?;
    }
    for d in frac_part.bytes() {
        match mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
        {
            Some(m) if !sticky => {
                mantissa = m;
                scale += 1;
            }
            _ => sticky |= d != b'0',
        }
    }
    // value × 1000 = mantissa × 10^(3 + ten - scale) × 2^two, rounded up.
    let (ten, two): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| err("bad exponent"))?;
            if !(-18..=18).contains(&e) {
                return Err(err("exponent out of range"));
            }
            (e, 0)
        }
        _ => return Err(err("unknown suffix")),
    };
    let mut m = mantissa
        .checked_mul(1i128 << two)
        .ok_or_else(|| err("too large"))?;
    if two > 0 && sticky {
        // Dropped digits times a binary multiplier could change the rounding: too precise to
        // be exact, as no real quantity is.
        return Err(err("too many digits"));
    }
    let p = 3 + ten - scale;
    let value = if p >= 0 {
        if sticky {
            // Only reachable with p >= 0 when dropped digits are below a milli-unit anyway.
            return Err(err("too many digits"));
        }
        10i128
            .checked_pow(p as u32)
            .and_then(|f| m.checked_mul(f))
            .ok_or_else(|| err("too large"))?
    } else {
        let mut q = -p;
        // 10^38 is the largest power of ten an i128 holds.
        while q > 38 {
            sticky |= m % 10 != 0;
            m /= 10;
            q -= 1;
        }
        let d = 10i128.pow(q as u32);
        m / d + i128::from(m % d != 0 || sticky)
    };
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
    fn forty_decimal_places_round_up_instead_of_overflowing() {
        // 10^39 does not fit an i128: these panicked (debug) or wrapped (release).
        let tiny = format!("0.{}1", "0".repeat(40));
        assert_eq!(parse(&tiny), Ok(1));
        let one = format!("1.{}", "0".repeat(45));
        assert_eq!(parse(&one), Ok(1_000));
        let just_over = format!("1.{}1", "0".repeat(45));
        assert_eq!(parse(&just_over), Ok(1_001));
        assert_eq!(parse(&format!("{tiny}n")), Ok(1));
        assert_eq!(parse(&format!("0.{}", "9".repeat(60))), Ok(1_000));
        assert_eq!(
            parse(&format!("2.{}Gi", "0".repeat(50))),
            Ok((2_i128 << 30) * 1000)
        );
        assert!(parse(&format!("1.{}1Ki", "0".repeat(50))).is_err());
    }

    #[test]
    fn malformed_quantities_are_errors_that_name_the_text() {
        for text in ["", "m", "1.2.3", "1Xi", "abc", "1e99", "."] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.text, text);
            assert!(e.to_string().contains("invalid quantity"));
        }
    }

    proptest::proptest! {
        #[test]
        fn any_digits_and_suffix_parse_or_fail_without_a_panic(
            int in "[0-9]{0,45}",
            frac in proptest::option::of("[0-9]{0,80}"),
            suffix in "(|n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e-18|e18|E3)",
        ) {
            let text = match frac {
                Some(f) => format!("{int}.{f}{suffix}"),
                None => format!("{int}{suffix}"),
            };
            let _ = parse(&text);
        }
    }
}
