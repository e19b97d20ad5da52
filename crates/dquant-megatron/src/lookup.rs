//! The inverse of a built split's order: every sample that holds a given sequence (Megatron's
//! document), for provenance questions asked of Megatron-order datasets.
//!
//! Forward, a sample is its shuffle-index entry, a pair of sample-index rows and the
//! document-index positions between them ([`crate::datasets`]). Megatron's arrays are not
//! arithmetic like a dquant plan's, so the inverse is tables built once: where each sequence
//! sits in the document index (every epoch), the shuffle index inverted, and each blended
//! dataset's samples placed in the blend. Then a sequence's samples are a binary search of the
//! sample index per position, in time proportional to the answer.

use crate::datasets::{GptDataset, TopLevel};

/// Lookup tables of one split, built once from it.
pub struct Lookup {
    parts: Vec<GptLookup>,
    /// For a blend: per dataset, the blend's index of its `j`-th sample (`u64::MAX`: unused).
    blend: Option<Vec<Vec<u64>>>,
}

/// One GPT dataset's inverse tables.
struct GptLookup {
    source: usize,
    /// Document-index positions by sequence: those of sequence `s` are
    /// `positions[starts[s]..starts[s + 1]]`, ascending.
    starts: Vec<u64>,
    positions: Vec<u64>,
    /// `shuffled[r]`: the sample whose shuffle-index entry is `r`.
    shuffled: Vec<u64>,
}

impl Lookup {
    /// The tables of `split` (memory: a few words per sample and per document-index entry).
    pub fn new(split: &TopLevel) -> Self {
        match split {
            TopLevel::Gpt(d) => Lookup {
                parts: vec![GptLookup::new(d)],
                blend: None,
            },
            TopLevel::Blended(b) => {
                let mut blend: Vec<Vec<u64>> = b
                    .datasets
                    .iter()
                    .map(|d| vec![u64::MAX; d.len() as usize])
                    .collect();
                for (i, (&d, &j)) in b.indices.dataset.iter().zip(&b.indices.sample).enumerate() {
                    blend[d as usize][j as usize] = i as u64;
                }
                Lookup {
                    parts: b.datasets.iter().map(GptLookup::new).collect(),
                    blend: Some(blend),
                }
            }
        }
    }

    /// Every sample of the split that holds a token of sequence `sequence` of source
    /// `source`, ascending.
    pub fn samples_of(&self, split: &TopLevel, source: usize, sequence: u64) -> Vec<u64> {
        let datasets: Vec<&GptDataset> = match split {
            TopLevel::Gpt(d) => vec![d],
            TopLevel::Blended(b) => b.datasets.iter().collect(),
        };
        let mut out = Vec::new();
        for (k, (part, d)) in self.parts.iter().zip(datasets).enumerate() {
            if part.source != source {
                continue;
            }
            for local in part.samples_of(d, sequence) {
                match &self.blend {
                    Some(b) => out.extend(b[k].get(local as usize).filter(|&&i| i != u64::MAX)),
                    None => out.push(local),
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl GptLookup {
    fn new(d: &GptDataset) -> Self {
        let sequences = d.lengths.len();
        let mut starts = vec![0u64; sequences + 1];
        for &s in &d.index.document_index {
            starts[s as usize + 1] += 1;
        }
        for s in 0..sequences {
            starts[s + 1] += starts[s];
        }
        let mut fill = starts.clone();
        let mut positions = vec![0u64; d.index.document_index.len()];
        for (p, &s) in d.index.document_index.iter().enumerate() {
            positions[fill[s as usize] as usize] = p as u64;
            fill[s as usize] += 1;
        }
        let mut shuffled = vec![0u64; d.len() as usize];
        for i in 0..d.len() as usize {
            shuffled[d.index.shuffle_index.get(i) as usize] = i as u64;
        }
        GptLookup {
            source: d.source,
            starts,
            positions,
            shuffled,
        }
    }

    /// The dataset's samples holding a token of `sequence`.
    fn samples_of(&self, d: &GptDataset, sequence: u64) -> Vec<u64> {
        let Some(range) = self
            .starts
            .get(sequence as usize..sequence as usize + 2)
            .map(|w| w[0] as usize..w[1] as usize)
        else {
            return Vec::new();
        };
        let rows = &d.index.sample_index;
        let n = d.len() as usize;
        let mut out = Vec::new();
        for &p in &self.positions[range] {
            let p = p as i64;
            // Sample r spans rows r and r + 1: positions row(r).0 ..= row(r + 1).0.
            let lo = partition(n, |r| rows.row(r + 1).0 < p);
            let hi = partition(n, |r| rows.row(r).0 <= p);
            for r in lo..hi {
                if held(d, r, p) {
                    out.push(self.shuffled[r]);
                }
            }
        }
        out
    }
}

/// The first `r` in `0..n` where `below(r)` is false (`below` true then false).
fn partition(n: usize, below: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match below(mid) {
            true => lo = mid + 1,
            false => hi = mid,
        }
    }
    lo
}

/// Whether sample-index row pair `r` holds a token at document-index position `p` (which
/// lies between them): the piece there is not empty, as [`GptDataset::sample_into`] cuts it.
fn held(d: &GptDataset, r: usize, p: i64) -> bool {
    let extra = i64::from(d.params.add_extra_token_to_sequence);
    let (beg, beg_off) = d.index.sample_index.row(r);
    let (end, end_off) = d.index.sample_index.row(r + 1);
    let seq_len = || i64::from(d.lengths[d.index.document_index[p as usize] as usize]);
    let length = match (p == beg, p == end) {
        (true, true) => end_off - beg_off + extra,
        (true, false) => seq_len() - beg_off,
        (false, true) => end_off + extra,
        (false, false) => seq_len(),
    };
    length > 0
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::builder::{build, Blend, BuildConfig};

    /// Every sample's sequences, from the forward path, against the lookup, for a lone GPT
    /// dataset and a blend (several epochs, a split, short and long sequences).
    #[test]
    fn samples_of_every_sequence_equal_the_forward_pieces() {
        let lengths: BTreeMap<&str, Arc<[i32]>> = [
            ("a", (0..40).map(|i| 3 + (i * 37 % 90)).collect()),
            ("b", (0..25).map(|i| 1 + (i * 53 % 200)).collect()),
        ]
        .into_iter()
        .collect();
        let blend = |prefixes: &[&str], weights: Option<Vec<f64>>| Blend {
            prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            weights,
        };
        let mut one = BuildConfig::new(5, 16);
        one.blend = Some(blend(&["a"], None));
        one.split = Some("80,10,10".into());
        one.num_samples = [Some(900), Some(40), Some(20)];
        let mut two = BuildConfig::new(9, 32);
        two.blend = Some(blend(&["a", "b"], Some(vec![0.3, 0.7])));
        two.split = Some("80,10,10".into());
        two.num_samples = [Some(600), Some(30), Some(20)];
        for config in [one, two] {
            let built = build(&config, &mut |p| Ok(lengths[p].clone())).unwrap();
            for split in built.splits.iter().flatten() {
                let lookup = Lookup::new(split);
                let mut want: BTreeMap<(usize, u64), Vec<u64>> = BTreeMap::new();
                for i in 0..split.len() {
                    for p in split
                        .sample(i)
                        .unwrap()
                        .pieces
                        .iter()
                        .filter(|p| p.length > 0)
                    {
                        let v = want.entry((p.source, p.sequence)).or_default();
                        if v.last() != Some(&i) {
                            v.push(i);
                        }
                    }
                }
                assert!(!want.is_empty());
                for source in 0..built.sources.len() {
                    for seq in 0..lengths[built.sources[source].as_str()].len() as u64 + 1 {
                        let got = lookup.samples_of(split, source, seq);
                        let w = want.get(&(source, seq)).cloned().unwrap_or_default();
                        assert_eq!(got, w, "{:?} source {source} sequence {seq}", split.split());
                    }
                }
            }
        }
    }
}
