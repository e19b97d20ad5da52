//! Megatron-Core's `split` string ("969,30,1") and the document range it gives each split.
//!
//! The string is normalized to fractions, the fractions are stacked into book-ends
//! (`[0, a, a+b, a+b+c]`), and each split takes the documents from
//! `round(begin * n)` to `round(end * n)` (Python's `round`: ties to even). A split whose
//! fraction is zero is absent (`None`), which is how Megatron gives `None` for a dataset.

use std::ops::Range;

use crate::numpy_float::normalize;
use crate::MegatronError;

/// The three splits, in Megatron's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    Train = 0,
    Valid = 1,
    Test = 2,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Train, Split::Valid, Split::Test];

    /// Megatron's name (`Split.train.name`).
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        }
    }
}

/// Each split's fraction of the documents, as book-ends `(begin, end)`, or `None`.
pub type SplitMatrix = [Option<(f64, f64)>; 3];

/// `parse_and_normalize_split` then `convert_split_vector_to_split_matrix`.
pub fn split_matrix(split: &str) -> Result<SplitMatrix, MegatronError> {
    let bad = |why: &str| MegatronError::Split {
        split: split.to_string(),
        why: why.to_string(),
    };
    // re.findall(r"[.0-9]+", split), each through float().
    let mut parts = Vec::new();
    for run in split
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|r| !r.is_empty())
    {
        let v: f64 = run
            .parse()
            .map_err(|_| bad(&format!("{run:?} is not a number")))?;
        parts.push(v);
    }
    if parts.len() > 3 {
        return Err(bad("more than three parts (train, valid, test)"));
    }
    parts.resize(3, 0.0);
    let fractions = normalize(&parts);
    if fractions.iter().any(|f| !f.is_finite()) {
        return Err(bad("the parts sum to zero"));
    }
    let mut ends = [0.0f64; 4];
    for i in 0..3 {
        ends[i + 1] = ends[i] + fractions[i];
    }
    Ok(std::array::from_fn(|i| {
        (ends[i + 1] > ends[i]).then_some((ends[i], ends[i + 1]))
    }))
}

/// The documents (Megatron's "elements": sequences of the indexed dataset) a split takes.
pub fn document_range(bookends: (f64, f64), elements: u64) -> Range<u64> {
    let at = |f: f64| (f * elements as f64).round_ties_even() as u64;
    at(bookends.0)..at(bookends.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_split_strings() {
        let m = split_matrix("969,30,1").unwrap();
        assert_eq!(m[0], Some((0.0, 0.969)));
        assert!(m[1].is_some() && m[2].is_some());
        let m = split_matrix("100,0,0").unwrap();
        assert_eq!(m, [Some((0.0, 1.0)), None, None]);
        // Fewer parts are padded with zeros; any separator will do, as with Megatron's regex.
        assert_eq!(split_matrix("98 2").unwrap()[2], None);
    }

    #[test]
    fn bad_split_strings_say_why() {
        let e = split_matrix("1,1,1,1").unwrap_err().to_string();
        assert_eq!(
            e,
            "split \"1,1,1,1\": more than three parts (train, valid, test)"
        );
        let e = split_matrix("0,0,0").unwrap_err().to_string();
        assert_eq!(e, "split \"0,0,0\": the parts sum to zero");
        let e = split_matrix("1.2.3,1").unwrap_err().to_string();
        assert_eq!(e, "split \"1.2.3,1\": \"1.2.3\" is not a number");
    }

    #[test]
    fn document_ranges_round_half_to_even() {
        // 0.5 * 5 = 2.5 rounds to 2 (Python's round), not 3.
        assert_eq!(document_range((0.0, 0.5), 5), 0..2);
        assert_eq!(document_range((0.5, 1.0), 5), 2..5);
    }
}
