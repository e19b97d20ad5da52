//! Sizes as people write them (`8GiB`, `512 MiB`, `65536`): one parser for every budget that
//! a flag, a config value or an environment variable sets, so each takes the same units.

/// `s`'s bytes: a whole number with an optional `GiB`, `MiB`, `KiB` or `B`; `None` when it
/// is not one, or does not fit in 64 bits.
pub fn bytes_of(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n.trim(), *m)))
    .unwrap_or((s, 1));
    num.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_whole_numbers_with_binary_units() {
        assert_eq!(bytes_of("8GiB"), Some(8 << 30));
        assert_eq!(bytes_of(" 512 MiB "), Some(512 << 20));
        assert_eq!(bytes_of("4KiB"), Some(4096));
        assert_eq!(bytes_of("7B"), Some(7));
        assert_eq!(bytes_of("65536"), Some(65536));
        assert_eq!(bytes_of("0"), Some(0));
        for bad in [
            "",
            "GiB",
            "1.5GiB",
            "-1",
            "8GB",
            "8 gib",
            "lots",
            "17179869184GiB",
        ] {
            assert_eq!(bytes_of(bad), None, "{bad:?}");
        }
    }
}
