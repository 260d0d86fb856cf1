//! Parsers for the human-friendly values of the command line: sizes (`512M`, `4G`, `1.5GiB`,
//! plain bytes) and durations (`250ms`, `5s`, `10m`, `1h`, `1h30m`, a plain number of seconds).
//!
//! Size suffixes are binary, whatever their spelling: `K`, `KB` and `KiB` all mean 1024 bytes
//! (as systemd's `MemoryMax=` does). Letters are case-insensitive. A fractional part is allowed
//! (`1.5G`) and the result is rounded down to a whole byte (or millisecond).

/// Why a value could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Nothing was given.
    #[error("empty value")]
    Empty,
    /// The value does not start with a number, or the number is malformed.
    #[error("invalid number in {0:?}")]
    InvalidNumber(String),
    /// The suffix is not a known unit.
    #[error("unknown unit {unit:?} in {input:?} (expected {expected})")]
    UnknownUnit {
        /// The suffix found.
        unit: String,
        /// The whole input.
        input: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// The value does not fit in 64 bits.
    #[error("{0:?} is too large")]
    Overflow(String),
}

const SIZE_UNITS: &str =
    "a number of bytes, optionally followed by K, M, G or T (with optional B or iB)";
const DURATION_UNITS: &str = "ms, s, m, min, h or d, e.g. 250ms, 5s, 10m, 1h30m";

/// A number split into its integer part and its fractional digits.
struct Number<'a> {
    int: &'a str,
    frac: &'a str,
}

/// Split `s` into a leading decimal number and the rest.
fn split_number(s: &str) -> (Number<'_>, &str) {
    let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (int, rest) = s.split_at(int_end);
    if let Some(after_dot) = rest.strip_prefix('.') {
        let frac_end = after_dot
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after_dot.len());
        let (frac, rest) = after_dot.split_at(frac_end);
        (Number { int, frac }, rest)
    } else {
        (Number { int, frac: "" }, rest)
    }
}

/// `number × multiplier`, rounded down, with overflow checked.
fn scale(n: &Number<'_>, multiplier: u64, input: &str) -> Result<u64, ParseError> {
    if n.int.is_empty() && n.frac.is_empty() {
        return Err(ParseError::InvalidNumber(input.to_owned()));
    }
    let overflow = || ParseError::Overflow(input.to_owned());
    let int: u64 = if n.int.is_empty() {
        0
    } else {
        n.int.parse().map_err(|_| overflow())?
    };
    let mut total = int.checked_mul(multiplier).ok_or_else(overflow)?;
    if !n.frac.is_empty() {
        // Use at most 18 fractional digits so that 10^digits fits in a u64; u128 for the product.
        let digits = &n.frac[..n.frac.len().min(18)];
        let frac: u128 = digits.parse().map_err(|_| overflow())?;
        let denom = 10u128.pow(u32::try_from(digits.len()).map_err(|_| overflow())?);
        let part = frac * u128::from(multiplier) / denom;
        let part = u64::try_from(part).map_err(|_| overflow())?;
        total = total.checked_add(part).ok_or_else(overflow)?;
    }
    Ok(total)
}

/// Parse a size in bytes: `512M`, `4G`, `1.5GiB`, `100KB`, `1048576`, `2T`.
pub fn parse_size(input: &str) -> Result<u64, ParseError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(ParseError::Empty);
    }
    let (number, unit) = split_number(s);
    if number.int.is_empty() && number.frac.is_empty() {
        return Err(ParseError::InvalidNumber(input.to_owned()));
    }
    let lower = unit.to_ascii_lowercase();
    let (letter, tail) = match lower.char_indices().next() {
        Some((_, c)) if "kmgt".contains(c) => (Some(c), &lower[1..]),
        _ => (None, lower.as_str()),
    };
    let multiplier: u64 = match letter {
        None => 1,
        Some('k') => 1 << 10,
        Some('m') => 1 << 20,
        Some('g') => 1 << 30,
        Some(_) => 1 << 40,
    };
    let tail_ok = match letter {
        None => tail.is_empty() || tail == "b",
        Some(_) => tail.is_empty() || tail == "b" || tail == "ib",
    };
    if !tail_ok {
        return Err(ParseError::UnknownUnit {
            unit: unit.to_owned(),
            input: input.to_owned(),
            expected: SIZE_UNITS,
        });
    }
    scale(&number, multiplier, input)
}

/// Parse a duration into milliseconds: `250ms`, `5s`, `10m`, `1h`, `2d`, `1h30m`, `1.5s`; a
/// plain number is seconds (as timeout(1) reads it).
pub fn parse_duration_ms(input: &str) -> Result<u64, ParseError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut rest = s;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let (number, after) = split_number(rest);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let unit = unit.trim();
        let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
            "" if next.is_empty() && rest.len() == s.len() => 1000,
            "ms" => 1,
            "s" | "sec" => 1000,
            "m" | "min" => 60_000,
            "h" | "hr" => 3_600_000,
            "d" => 86_400_000,
            _ => {
                return Err(ParseError::UnknownUnit {
                    unit: unit.to_owned(),
                    input: input.to_owned(),
                    expected: DURATION_UNITS,
                })
            }
        };
        let part = scale(&number, multiplier, input)?;
        total = total
            .checked_add(part)
            .ok_or_else(|| ParseError::Overflow(input.to_owned()))?;
        rest = next.trim_start();
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("1048576", 1_048_576),
            ("100B", 100),
            ("100b", 100),
            ("1K", 1024),
            ("1k", 1024),
            ("1KB", 1024),
            ("1KiB", 1024),
            ("512M", 512 << 20),
            ("512MiB", 512 << 20),
            ("4G", 4 << 30),
            ("4g", 4 << 30),
            ("2T", 2 << 40),
            ("1.5G", 3 << 29),
            ("0.5K", 512),
            (".5K", 512),
            (" 8M ", 8 << 20),
            ("16777215T", 16_777_215 << 40),
        ];
        for (input, want) in cases {
            assert_eq!(parse_size(input), Ok(*want), "{input}");
        }
    }

    #[test]
    fn bad_sizes() {
        assert_eq!(parse_size(""), Err(ParseError::Empty));
        assert_eq!(parse_size("  "), Err(ParseError::Empty));
        assert!(matches!(parse_size("M"), Err(ParseError::InvalidNumber(_))));
        assert!(matches!(
            parse_size("-1"),
            Err(ParseError::InvalidNumber(_))
        ));
        assert!(matches!(parse_size("."), Err(ParseError::InvalidNumber(_))));
        for bad in ["12X", "12 M", "12MB5", "1e3", "12Mi", "12iB", "4GG", "1,5G"] {
            assert!(
                matches!(parse_size(bad), Err(ParseError::UnknownUnit { .. })),
                "{bad}: {:?}",
                parse_size(bad)
            );
        }
        assert!(matches!(
            parse_size("16777216T"),
            Err(ParseError::Overflow(_))
        ));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(ParseError::Overflow(_))
        ));
        let msg = parse_size("12X").map_err(|e| e.to_string());
        assert!(matches!(msg, Err(m) if m.contains("\"X\"") && m.contains("K, M, G or T")));
    }

    #[test]
    fn durations() {
        let cases: &[(&str, u64)] = &[
            ("250ms", 250),
            ("5s", 5000),
            ("5sec", 5000),
            ("10m", 600_000),
            ("10min", 600_000),
            ("1h", 3_600_000),
            ("2d", 172_800_000),
            ("1h30m", 5_400_000),
            ("1h 30m", 5_400_000),
            ("1m30s500ms", 90_500),
            ("1.5s", 1500),
            ("0.25s", 250),
            ("30", 30_000),
            ("0", 0),
            ("5S", 5000),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration_ms(input), Ok(*want), "{input}");
        }
    }

    #[test]
    fn bad_durations() {
        assert_eq!(parse_duration_ms(""), Err(ParseError::Empty));
        for bad in ["5x", "5 years", "1h30", "ms", "s5", "-5s", "5ss"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad} should fail");
        }
        assert!(matches!(
            parse_duration_ms("5x"),
            Err(ParseError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration_ms("99999999999999999d"),
            Err(ParseError::Overflow(_))
        ));
    }
}
