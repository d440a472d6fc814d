//! Exact Kubernetes quantity arithmetic.
//!
//! A [`Quantity`] is an `i128` count of nano-units (10^-9) plus the [`Format`] it was written
//! in, so arithmetic is exact and serialisation is canonical: the same value and format always
//! print the same bytes (SPEC §3.2.4). Parsing and printing follow
//! `k8s.io/apimachinery/pkg/api/resource` (`ParseQuantity`, `CanonicalizeBytes`).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

/// Nano-units per unit.
const NANOS_PER_UNIT: u128 = 1_000_000_000;

/// Binary suffixes by power of 1024.
const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// Longest input echoed back in an error message (inputs can be hostile).
const MAX_ECHOED_INPUT: usize = 64;

/// An exact Kubernetes resource quantity.
///
/// Equality, ordering and hashing look at the value only: `"1" == "1000m" == "1e3m"`.
/// `Display` prints the canonical Kubernetes form.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// How a quantity was written, and so how it is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `n u m "" k M G T P E` (powers of 1000).
    DecimalSI,
    /// `Ki Mi Gi Ti Pi Ei` (powers of 1024).
    BinarySI,
    /// `<mantissa>e<exponent>`, e.g. `129e6`.
    DecimalExponent,
}

/// Why a quantity could not be read or computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "invalid quantity {0:?}: expected a signed decimal number and a suffix \
         (n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or e<exponent>), e.g. 500m, 1.5Gi, 129e6"
    )]
    Invalid(String),
    #[error("quantity overflow")]
    Overflow,
    #[error("negative quantity {0:?}: a request, overhead or minResources must not be negative")]
    Negative(String),
}

impl Quantity {
    /// Zero, printed as `"0"`.
    pub fn zero() -> Self {
        Self {
            nanos: 0,
            format: Format::DecimalSI,
        }
    }

    /// Whether the value is zero (whatever the format).
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// A quantity of exactly `nanos` × 10^-9, printed in `format`.
    pub fn from_nanos(nanos: i128, format: Format) -> Self {
        Self { nanos, format }
    }

    /// The value as a count of nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The format the quantity prints in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Reads a quantity as it appears in a Kubernetes object.
    ///
    /// Surrounding whitespace is ignored, as the API server's JSON decoding does
    /// (`Quantity.UnmarshalJSON` trims it); whitespace inside is an error.
    pub fn parse_k8s(q: &K8sQuantity) -> Result<Self, QuantityError> {
        q.0.trim().parse()
    }

    /// [`Quantity::parse_k8s`] for a request, limit, overhead or minResources: a negative
    /// value is an error (the API server refuses one on a pod; a job template is not checked).
    pub fn parse_non_negative(q: &K8sQuantity) -> Result<Self, QuantityError> {
        let parsed = Self::parse_k8s(q)?;
        if parsed.nanos < 0 {
            return Err(QuantityError::Negative(q.0.clone()));
        }
        Ok(parsed)
    }

    /// [`Quantity::parse_non_negative`], rounded up to milli-units as the API server stores a
    /// pod's quantities (core/v1 defaulting rounds every resource list up to milli scale), so
    /// what is summed is what the scheduler will see: three containers of `0.1m` CPU are 3m.
    pub fn parse_admitted(q: &K8sQuantity) -> Result<Self, QuantityError> {
        Self::parse_non_negative(q)?.round_up_to_milli()
    }

    /// The smallest multiple of 1m at or above the value (away from zero); the format is kept.
    pub fn round_up_to_milli(self) -> Result<Self, QuantityError> {
        const MILLI: i128 = 1_000_000;
        let rest = self.nanos.abs() % MILLI;
        if rest == 0 {
            return Ok(self);
        }
        let away = (MILLI - rest) * self.nanos.signum();
        let nanos = self
            .nanos
            .checked_add(away)
            .ok_or(QuantityError::Overflow)?;
        Ok(Self {
            nanos,
            format: self.format,
        })
    }

    /// The exact sum. The format of `self` wins unless `self` is zero, as in `Quantity.Add`.
    pub fn checked_add(self, other: Self) -> Result<Self, QuantityError> {
        let nanos = self
            .nanos
            .checked_add(other.nanos)
            .ok_or(QuantityError::Overflow)?;
        let format = if self.is_zero() {
            other.format
        } else {
            self.format
        };
        Ok(Self { nanos, format })
    }

    /// The exact product with a count; the format is kept.
    pub fn checked_mul(self, n: u64) -> Result<Self, QuantityError> {
        let nanos = self
            .nanos
            .checked_mul(i128::from(n))
            .ok_or(QuantityError::Overflow)?;
        Ok(Self {
            nanos,
            format: self.format,
        })
    }

    /// The larger value; on a tie `self` is kept (so its format), like kube's `maxResourceList`.
    pub fn max(self, other: Self) -> Self {
        if other.nanos > self.nanos {
            other
        } else {
            self
        }
    }

    /// The canonical string as a Kubernetes `Quantity`.
    pub fn to_k8s(&self) -> K8sQuantity {
        K8sQuantity(self.to_string())
    }
}

impl Default for Quantity {
    fn default() -> Self {
        Self::zero()
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    /// Parses `<sign>? <digits> (. <digits>?)? <suffix>` (also `.<digits>`), the grammar
    /// documented on apimachinery's `Quantity`. Values finer than 1n round away from zero
    /// to the next nano-unit, as `ParseQuantity` does.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || QuantityError::Invalid(echo(s));
        let bytes = s.as_bytes();

        let (negative, rest) = match bytes.first() {
            Some(b'-') => (true, &bytes[1..]),
            Some(b'+') => (false, &bytes[1..]),
            _ => (false, bytes),
        };
        let int_len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let (int_digits, rest) = rest.split_at(int_len);
        let (frac_digits, suffix) = match rest.split_first() {
            Some((b'.', after_point)) => {
                let frac_len = after_point
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                after_point.split_at(frac_len)
            }
            _ => (&rest[..0], rest),
        };
        // The documented grammar needs a digit; Go's scanner also takes ".", "-" and "Ki" as 0.
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(invalid());
        }
        // `suffix` is ASCII-prefixed only if valid; from_utf8 on a slice of a str at an ASCII
        // boundary cannot fail, but stay panic-free regardless.
        let suffix = std::str::from_utf8(suffix).map_err(|_| invalid())?;
        let (decimal_exponent, binary_exponent, format) =
            interpret_suffix(suffix).ok_or_else(invalid)?;

        // value = digits × 10^(decimal_exponent − |frac|) × 2^binary_exponent, in nanos.
        let mut digits: Vec<u8> = int_digits
            .iter()
            .chain(frac_digits)
            .map(|b| b - b'0')
            .skip_while(|&d| d == 0)
            .collect();
        if digits.is_empty() {
            return Ok(Self { nanos: 0, format });
        }
        for _ in 0..binary_exponent / 10 {
            multiply_digits(&mut digits, 1024);
        }
        let power_of_ten = i128::from(decimal_exponent) - frac_digits.len() as i128 + 9;
        let magnitude = scale_rounding_up(&digits, power_of_ten)?;

        let nanos = if negative {
            0i128.checked_sub_unsigned(magnitude)
        } else {
            i128::try_from(magnitude).ok()
        }
        .ok_or(QuantityError::Overflow)?;

        // ParseQuantity: a BinarySI value strictly between 0 and 1 becomes DecimalSI.
        let format = if format == Format::BinarySI && magnitude < NANOS_PER_UNIT {
            Format::DecimalSI
        } else {
            format
        };
        Ok(Self { nanos, format })
    }
}

impl fmt::Display for Quantity {
    /// The canonical form of `CanonicalizeBytes`: no fractional digits, the largest suffix that
    /// keeps the mantissa an integer, BinarySI only for whole numbers of at least 1024.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let magnitude = self.nanos.unsigned_abs();

        if self.format == Format::BinarySI
            && magnitude >= 1024 * NANOS_PER_UNIT
            && magnitude.is_multiple_of(NANOS_PER_UNIT)
        {
            let mut units = magnitude / NANOS_PER_UNIT;
            let mut power = 0;
            // Kubernetes has no suffix past Ei; bigger multiples stay in Ei.
            while power < BINARY_SUFFIXES.len() - 1 && units.is_multiple_of(1024) {
                units /= 1024;
                power += 1;
            }
            // With no binary suffix, Kubernetes prints the bare number, which it re-reads as
            // DecimalSI and then prints differently when it is a multiple of 1000 ("2000" →
            // "2k"). Printing those as DecimalSI gives the string the API server keeps.
            if power > 0 {
                return write!(f, "{sign}{units}{}", BINARY_SUFFIXES[power]);
            }
        }

        let (mantissa, exponent) = decimal_mantissa_exponent(magnitude);
        match (self.format, decimal_si_suffix(exponent)) {
            (Format::DecimalExponent, _) if exponent == 0 => write!(f, "{sign}{mantissa}"),
            // DecimalSI has no suffix beyond E (10^18): apimachinery falls back to exponents.
            (Format::DecimalExponent, _) | (_, None) => {
                write!(f, "{sign}{mantissa}e{exponent}")
            }
            (_, Some(suffix)) => write!(f, "{sign}{mantissa}{suffix}"),
        }
    }
}

/// The input, shortened for an error message.
fn echo(s: &str) -> String {
    match s.char_indices().nth(MAX_ECHOED_INPUT) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

/// (power of ten, power of two, format) of a suffix, or `None` if it is not one.
fn interpret_suffix(suffix: &str) -> Option<(i64, u32, Format)> {
    let decimal = |e| Some((e, 0, Format::DecimalSI));
    let binary = |e| Some((0, e, Format::BinarySI));
    match suffix {
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
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
        _ => {
            let exponent = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let unsigned = exponent
                .strip_prefix('+')
                .or_else(|| exponent.strip_prefix('-'))
                .unwrap_or(exponent);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // An exponent beyond i64 is rejected, as Go's strconv.ParseInt does.
            let exponent: i64 = exponent.parse().ok()?;
            Some((exponent, 0, Format::DecimalExponent))
        }
    }
}

/// Multiplies a big-endian decimal digit string by a small factor, in place.
fn multiply_digits(digits: &mut Vec<u8>, factor: u32) {
    let mut carry = 0u32;
    for digit in digits.iter_mut().rev() {
        let product = u32::from(*digit) * factor + carry;
        *digit = (product % 10) as u8;
        carry = product / 10;
    }
    while carry > 0 {
        digits.insert(0, (carry % 10) as u8);
        carry /= 10;
    }
}

/// `digits × 10^power_of_ten`, rounded up to an integer, or `Overflow` past `u128`.
fn scale_rounding_up(digits: &[u8], power_of_ten: i128) -> Result<u128, QuantityError> {
    let (integer, fraction) = if power_of_ten >= 0 {
        (digits, &digits[..0])
    } else {
        let cut = usize::try_from(-power_of_ten)
            .map_or(0, |dropped| digits.len().saturating_sub(dropped));
        digits.split_at(cut)
    };
    let mut value: u128 = 0;
    for &digit in integer {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(digit)))
            .ok_or(QuantityError::Overflow)?;
    }
    if power_of_ten > 0 {
        let scale = u32::try_from(power_of_ten)
            .ok()
            .and_then(|p| 10u128.checked_pow(p))
            .ok_or(QuantityError::Overflow)?;
        value = value.checked_mul(scale).ok_or(QuantityError::Overflow)?;
    }
    if fraction.iter().any(|&d| d != 0) {
        value = value.checked_add(1).ok_or(QuantityError::Overflow)?;
    }
    Ok(value)
}

/// `magnitude` nanos as `mantissa × 10^exponent` with `exponent` a multiple of 3 and as large
/// as possible while `mantissa` stays an integer (`AsCanonicalBytes`).
fn decimal_mantissa_exponent(magnitude: u128) -> (u128, i32) {
    let mut mantissa = magnitude;
    let mut exponent: i32 = -9;
    while mantissa != 0 && mantissa.is_multiple_of(10) {
        mantissa /= 10;
        exponent += 1;
    }
    // Only factors just removed are put back, so this cannot overflow.
    let excess = exponent.rem_euclid(3);
    mantissa *= 10u128.pow(excess as u32);
    (mantissa, exponent - excess)
}

/// The DecimalSI suffix for a power of ten that is a multiple of 3.
fn decimal_si_suffix(exponent: i32) -> Option<&'static str> {
    Some(match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn canonical(s: &str) -> String {
        q(s).to_string()
    }

    #[test]
    fn equal_values_are_equal_whatever_the_spelling() {
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1"), q("1000000u"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q(".5"), q("0.5"));
        assert_eq!(q("1."), q("1"));
        assert_eq!(q("+1"), q("1"));
        assert_eq!(q("-0"), Quantity::zero());
        assert!(q("100m") < q("1"));
        assert!(q("10000T") > q("100Gi"));
        assert!(q("-1") < q("0"));
    }

    #[test]
    fn suffixes_have_their_kubernetes_values() {
        let cases: &[(&str, i128)] = &[
            ("5n", 5),
            ("4u", 4_000),
            ("3m", 3_000_000),
            ("9", 9_000_000_000),
            ("8k", 8_000_000_000_000),
            ("7M", 7 * 10i128.pow(15)),
            ("6G", 6 * 10i128.pow(18)),
            ("5T", 5 * 10i128.pow(21)),
            ("2P", 2 * 10i128.pow(24)),
            ("1E", 10i128.pow(27)),
            ("1Ki", 1024 * 10i128.pow(9)),
            ("7Mi", 7 * (1 << 20) * 10i128.pow(9)),
            ("6Gi", 6 * (1 << 30) * 10i128.pow(9)),
            ("5Ti", 5 * (1 << 40) * 10i128.pow(9)),
            ("4Pi", 4 * (1 << 50) * 10i128.pow(9)),
            ("3Ei", 3 * (1 << 60) * 10i128.pow(9)),
            ("1e3", 10i128.pow(12)),
            ("1E6", 10i128.pow(15)),
            ("1E-3", 10i128.pow(6)),
            ("1.3E+6", 13 * 10i128.pow(14)),
            ("0.5e-2", 5 * 10i128.pow(6)),
            ("100.035k", 100_035 * 10i128.pow(9)),
            ("0.0005k", 5 * 10i128.pow(8)),
            ("100.035Ki", 10_243_584 * 10i128.pow(7)),
            ("0.05Gi", 536_870_912 * 10i128.pow(8)),
        ];
        for &(input, nanos) in cases {
            assert_eq!(q(input).nanos(), nanos, "{input}");
        }
    }

    #[test]
    fn formats_follow_the_suffix() {
        assert_eq!(q("0").format(), Format::DecimalSI);
        assert_eq!(q("0Ki").format(), Format::BinarySI);
        assert_eq!(q("1Gi").format(), Format::BinarySI);
        assert_eq!(q("1G").format(), Format::DecimalSI);
        assert_eq!(q("1e9").format(), Format::DecimalExponent);
        assert_eq!(q("1E").format(), Format::DecimalSI);
        // A BinarySI value below one becomes DecimalSI, as in ParseQuantity.
        assert_eq!(q("0.000000000001Ki").format(), Format::DecimalSI);
        assert_eq!(q("0.5Ki").format(), Format::BinarySI);
    }

    #[test]
    fn round_up_to_milli_goes_away_from_zero_and_keeps_the_format() {
        let r = |s: &str| {
            let q: Quantity = s.parse().unwrap();
            q.round_up_to_milli().unwrap().to_k8s().0
        };
        assert_eq!(r("1n"), "1m");
        assert_eq!(r("0.0001"), "1m");
        assert_eq!(r("1500m"), "1500m");
        assert_eq!(r("1Gi"), "1Gi");
        assert_eq!(r("-1n"), "-1m");
        assert_eq!(r("0"), "0");
    }

    #[test]
    fn values_finer_than_a_nano_round_up() {
        assert_eq!(q("3.001n").nanos(), 4);
        assert_eq!(q("1.1E-9").nanos(), 2);
        assert_eq!(q("0.0000000001").nanos(), 1);
        assert_eq!(q("0.0000000005").nanos(), 1);
        assert_eq!(q("0.5e-9").nanos(), 1);
        assert_eq!(q("0.9n").nanos(), 1);
        assert_eq!(q("0.00000012345").nanos(), 124);
        assert_eq!(q("0.000000000001Ki").nanos(), 2);
        assert_eq!(q("1e-999999999999").nanos(), 1);
        // Away from zero, like Kubernetes (it rounds the magnitude).
        assert_eq!(q("-0.9n").nanos(), -1);
        assert_eq!(q("0.000000000000e-5").nanos(), 0);
    }

    #[test]
    fn malformed_quantities_are_invalid() {
        for input in [
            "",
            " ",
            "three",
            "1.2.3",
            "1KB",
            "1 Gi",
            " 1",
            "1 ",
            "1.1.M",
            "1+1.0M",
            "0.1mi",
            "0.1am",
            "aoeu",
            ".5i",
            "1i",
            "-3.01i",
            "-3.01e-",
            "1e",
            "1e+",
            "1e3.5",
            "1ki",
            "1K",
            "1Gx",
            "1Mi3",
            "--1",
            "+-1",
            ".",
            "-",
            "+",
            "Ki",
            "e3",
            "1e3m",
            "1m3",
            "1e99999999999999999999",
            "١",
            "1\u{00A0}",
            "1Gi\n",
        ] {
            assert!(
                matches!(input.parse::<Quantity>(), Err(QuantityError::Invalid(_))),
                "{input:?} should be invalid"
            );
        }
    }

    #[test]
    fn invalid_error_names_the_input_but_not_all_of_a_huge_one() {
        let err = "1KB".parse::<Quantity>().unwrap_err();
        assert!(err.to_string().contains("\"1KB\""), "{err}");
        let huge = "x".repeat(10_000);
        let err = huge.parse::<Quantity>().unwrap_err();
        assert!(err.to_string().len() < 400, "{err}");
    }

    #[test]
    fn values_beyond_i128_overflow_instead_of_panicking() {
        for input in [
            "99999999999999999999999999999999999E",
            "1e40",
            "1e9223372036854775807",
            "340282366920938463463374607431768211456n",
            "170141183460469231731687303715884105728n",
            "999999999999999999999999999999999999999999999999999",
            "1000000000000000000000Ei",
        ] {
            assert_eq!(
                input.parse::<Quantity>(),
                Err(QuantityError::Overflow),
                "{input}"
            );
        }
        // The most negative i128 still fits.
        assert_eq!(
            q("-170141183460469231731687303715884105728n").nanos(),
            i128::MIN
        );
        assert_eq!(q("0e9223372036854775807"), Quantity::zero());
    }

    #[test]
    fn parse_k8s_trims_surrounding_whitespace_like_the_api_server() {
        let k = K8sQuantity(" 1500m\n".to_owned());
        assert_eq!(Quantity::parse_k8s(&k).unwrap(), q("1.5"));
        assert!(Quantity::parse_k8s(&K8sQuantity("1 Gi".to_owned())).is_err());
    }

    #[test]
    fn canonical_form_matches_apimachinery() {
        // Examples from apimachinery's quantity_test.go (TestQuantityString, TestQuantityParseEmit).
        let cases = [
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("300Mi", "300Mi"),
            ("307200Ki", "300Mi"),
            ("6Ki", "6Ki"),
            ("1025024Mi", "1001Gi"),
            ("1024Gi", "1Ti"),
            ("1.5Gi", "1536Mi"),
            ("2048Mi", "2Gi"),
            ("0.5Ki", "512"),
            ("1000M", "1G"),
            ("0.001T", "1G"),
            ("1000u", "1m"),
            ("1.08", "1080m"),
            ("1080000000n", "1080m"),
            ("1500m", "1500m"),
            ("1000m", "1"),
            ("2000000", "2M"),
            ("0.1", "100m"),
            ("1n", "1n"),
            ("1E", "1E"),
            ("12E", "12E"),
            ("1000E", "1e21"),
            ("5000E", "5e21"),
            ("1000000E", "1e24"),
            ("1234567M", "1234567M"),
            (".001Ki", "1024m"),
            (".000001Ki", "1024u"),
            (".000000001Ki", "1024n"),
            (".000000000001Ki", "2n"),
            ("129e6", "129e6"),
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            (".001e12", "1e9"),
            ("0.001e0", "1e-3"),
            ("1000e-12", "1e-9"),
            ("80e-3", "80e-3"),
            ("12e4", "120e3"),
            ("5e0", "5"),
            ("00", "0"),
            ("0Ki", "0"),
            ("0e5", "0"),
            ("-0.0", "0"),
            ("1025", "1025"),
            ("1536", "1536"),
            ("-1024", "-1024"),
            ("-1024Mi", "-1Gi"),
            ("-1.5Gi", "-1536Mi"),
            ("-1Ki", "-1Ki"),
            ("-9.01", "-9010m"),
            ("1024Ei", "1024Ei"),
            ("2048Ei", "2048Ei"),
        ];
        for (input, expected) in cases {
            assert_eq!(canonical(input), expected, "canonical form of {input:?}");
        }
    }

    #[test]
    fn binary_si_without_a_binary_suffix_prints_as_decimal_si() {
        // CanonicalizeBytes switches BinarySI with |v| < 1024 to DecimalSI, so 1000 bytes
        // written in binary units print with a decimal suffix.
        let thousand_bytes = q("1Ki").checked_add(q("-24")).unwrap();
        assert_eq!(thousand_bytes.format(), Format::BinarySI);
        assert_eq!(thousand_bytes.to_string(), "1k");
        let fraction = Quantity::from_nanos(100_000_000, Format::BinarySI);
        assert_eq!(fraction.to_string(), "100m");
        let not_whole = Quantity::from_nanos(1536 * 1_000_000_000 + 1, Format::BinarySI);
        assert_eq!(not_whole.to_string(), "1536000000001n");
        // Whole but not a multiple of 1024: Kubernetes would print "2000" and, re-reading
        // that as DecimalSI, "2k" the next time; print the stable form at once.
        let two_thousand = q("1Ki").checked_add(q("976")).unwrap();
        assert_eq!(two_thousand.format(), Format::BinarySI);
        assert_eq!(two_thousand.to_string(), "2k");
        let odd = q("1Ki").checked_add(q("1")).unwrap();
        assert_eq!(odd.to_string(), "1025");
    }

    #[test]
    fn checked_add_keeps_the_format_of_self_unless_self_is_zero() {
        assert_eq!(
            q("1Gi").checked_add(q("1")).unwrap().format(),
            Format::BinarySI
        );
        assert_eq!(
            q("1").checked_add(q("1Gi")).unwrap().format(),
            Format::DecimalSI
        );
        let from_zero = Quantity::zero().checked_add(q("1Gi")).unwrap();
        assert_eq!(from_zero.to_string(), "1Gi");
        assert_eq!(
            q("100m").checked_add(Quantity::zero()).unwrap().to_string(),
            "100m"
        );
        assert_eq!(q("1.5").checked_add(q("500m")).unwrap().to_string(), "2");
    }

    #[test]
    fn arithmetic_overflow_is_an_error() {
        let big = Quantity::from_nanos(i128::MAX, Format::DecimalSI);
        assert_eq!(big.checked_add(q("1n")), Err(QuantityError::Overflow));
        assert_eq!(big.checked_mul(2), Err(QuantityError::Overflow));
        assert_eq!(
            q("1").checked_mul(u64::MAX).unwrap().nanos(),
            u64::MAX as i128 * 1_000_000_000
        );
        assert_eq!(q("1Gi").checked_mul(3).unwrap().to_string(), "3Gi");
        assert_eq!(q("1Gi").checked_mul(0).unwrap().to_string(), "0");
    }

    #[test]
    fn max_is_semantic_and_keeps_self_on_a_tie() {
        assert_eq!(q("1").max(q("999m")).to_string(), "1");
        assert_eq!(q("999m").max(q("1")).to_string(), "1");
        assert_eq!(q("1Ki").max(q("1024")).to_string(), "1Ki");
        assert_eq!(q("1024").max(q("1Ki")).to_string(), "1024");
    }

    #[test]
    fn to_k8s_is_the_canonical_string() {
        assert_eq!(q("1.5Gi").to_k8s(), K8sQuantity("1536Mi".to_owned()));
        assert_eq!(Quantity::zero().to_k8s(), K8sQuantity("0".to_owned()));
    }

    fn any_format() -> impl Strategy<Value = Format> {
        prop_oneof![
            Just(Format::DecimalSI),
            Just(Format::BinarySI),
            Just(Format::DecimalExponent),
        ]
    }

    /// Values that stress every suffix: small multiples of powers of 10 and of 1024.
    fn any_quantity() -> impl Strategy<Value = Quantity> {
        let nanos = prop_oneof![
            any::<i128>(),
            any::<i64>().prop_map(i128::from),
            (-999_999i128..=999_999, 0u32..30).prop_map(|(m, e)| m * 10i128.pow(e)),
            (-4096i128..=4096, 0u32..7).prop_map(|(m, e)| m * 1024i128.pow(e) * 1_000_000_000),
        ];
        (nanos, any_format()).prop_map(|(n, f)| Quantity::from_nanos(n, f))
    }

    /// Strings drawn from the quantity grammar (some of them overflow).
    fn grammatical_string() -> impl Strategy<Value = String> {
        let suffix = prop_oneof![
            prop::sample::select(vec![
                "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi",
                "Ei",
            ])
            .prop_map(str::to_owned),
            ("[eE]", "[+-]?", -30i32..40).prop_map(|(e, s, n)| format!("{e}{s}{}", n.abs())),
        ];
        (
            "[+-]?",
            "[0-9]{0,25}",
            prop::option::of("[0-9]{0,25}"),
            suffix,
        )
            .prop_filter("needs a digit", |(_, i, f, _)| {
                !i.is_empty() || f.as_ref().is_some_and(|f| !f.is_empty())
            })
            .prop_map(|(sign, int, frac, suffix)| match frac {
                Some(frac) => format!("{sign}{int}.{frac}{suffix}"),
                None => format!("{sign}{int}{suffix}"),
            })
    }

    proptest! {
        #[test]
        fn printing_then_parsing_gives_the_same_value(x in any_quantity()) {
            let printed = x.to_string();
            let parsed: Quantity = printed.parse().unwrap();
            prop_assert_eq!(parsed, x, "{}", printed);
        }

        #[test]
        fn canonical_form_is_idempotent(x in any_quantity()) {
            let once = x.to_string();
            let twice = once.parse::<Quantity>().unwrap().to_string();
            prop_assert_eq!(once, twice);
        }

        #[test]
        fn grammatical_strings_round_trip(s in grammatical_string()) {
            match s.parse::<Quantity>() {
                Ok(x) => {
                    let once = x.to_string();
                    let reparsed = once.parse::<Quantity>().unwrap();
                    prop_assert_eq!(reparsed, x);
                    prop_assert_eq!(reparsed.to_string(), once);
                }
                Err(e) => prop_assert_eq!(e, QuantityError::Overflow, "{}", s),
            }
        }

        #[test]
        fn addition_commutes_in_value(a in any_quantity(), b in any_quantity()) {
            prop_assert_eq!(a.checked_add(b), b.checked_add(a));
        }

        #[test]
        fn parsing_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<Quantity>();
        }

        #[test]
        fn ordering_agrees_with_subtraction(a in any::<i64>(), b in any::<i64>()) {
            let (qa, qb) = (Quantity::from_nanos(a.into(), Format::DecimalSI),
                            Quantity::from_nanos(b.into(), Format::BinarySI));
            prop_assert_eq!(qa.cmp(&qb), a.cmp(&b));
            prop_assert_eq!(qa.max(qb).nanos(), i128::from(a.max(b)));
        }
    }
}
