use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, SeedableRng};

use crate::{CorpusError, CorpusStats};

/// Synthetic token stream with Zipf-distributed ids, for volume.
///
/// The id of frequency rank `r` (1-based) is drawn with probability proportional to
/// `r^-exponent`; rank 1 is id 0, rank 2 id 1, and so on (skipping `eod_token` if it lies in
/// `[0, vocab)`, so that the end-of-document id only ever marks document ends). Document lengths
/// are geometric on `1, 2, 3, ...` with mean `mean_doc_len` (a memoryless stand-in for the
/// long-tailed lengths of real documents), then `eod_token` is appended if set. Generation stops
/// at exactly `tokens` tokens (end-of-document tokens included): the last document is cut short
/// there, so it may lack its end-of-document token.
///
/// Deterministic: the same parameters give the same stream. The random source is rand's
/// `Xoshiro256PlusPlus` seeded with `seed_from_u64(seed)` (an explicitly named, portable
/// algorithm); uniform floats are built from its top 53 bits here, not by rand's distributions,
/// so rand upgrades cannot change the stream. (The rank table uses `f64::powf`, so a platform
/// whose libm rounds `pow` differently could in principle move a draw sitting exactly on a table
/// boundary.)
#[derive(Debug, Clone, PartialEq)]
pub struct Zipf {
    /// Ids are drawn from `[0, vocab)`; at most [`Zipf::MAX_VOCAB`] (the rank table is held in
    /// memory, 12 bytes per id).
    pub vocab: u32,
    /// Zipf exponent `s` (finite, `>= 0`; 0 is uniform). Default 1.1, close to natural text.
    pub exponent: f64,
    /// Random seed.
    pub seed: u64,
    /// Total tokens to generate, end-of-document tokens included.
    pub tokens: u64,
    /// Mean number of drawn tokens per document, end-of-document token excluded (`>= 1`).
    /// Default 2048. Memory holds one document at a time.
    pub mean_doc_len: u32,
    /// Appended to every document when set. Any `u32`; it need not be below `vocab` (e.g.
    /// `Some(vocab)` keeps every drawn id distinct from it without shrinking the ranks).
    pub eod_token: Option<u32>,
}

impl Zipf {
    /// Largest supported `vocab` (2^24): the inverse-CDF table then takes 192 MiB.
    pub const MAX_VOCAB: u32 = 1 << 24;

    /// `tokens` tokens over `vocab` ids with `seed`; exponent 1.1, mean document length 2048,
    /// no end-of-document token.
    pub fn new(vocab: u32, seed: u64, tokens: u64) -> Self {
        Zipf {
            vocab,
            exponent: 1.1,
            seed,
            tokens,
            mean_doc_len: 2048,
            eod_token: None,
        }
    }

    /// Generates the stream, handing each document to `on_doc` in order.
    ///
    /// The error type is the caller's, as for [`RealCorpus::generate`](crate::RealCorpus):
    /// anything that converts from [`CorpusError`] (parameter errors are reported through it).
    /// The first error from `on_doc` stops the run and is returned.
    pub fn generate<E, D>(&self, mut on_doc: D) -> Result<CorpusStats, E>
    where
        E: From<CorpusError>,
        D: FnMut(&[u32]) -> Result<(), E>,
    {
        self.validate()?;
        let eod_in_vocab = self.eod_token.filter(|&e| e < self.vocab);
        let sampler = RankSampler::new(
            self.vocab - u32::from(eod_in_vocab.is_some()),
            self.exponent,
        );
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(self.seed);
        let eod_len = u64::from(self.eod_token.is_some());

        let mut stats = CorpusStats::default();
        let mut doc: Vec<u32> = Vec::new();
        while stats.tokens < self.tokens {
            let remaining = self.tokens - stats.tokens;
            let len = geometric(&mut rng, self.mean_doc_len);
            // Draw only what fits; ids of the cut-off part are never drawn.
            let drawn = len.min(remaining);
            doc.clear();
            doc.reserve(usize::try_from(drawn).unwrap_or(usize::MAX));
            for _ in 0..drawn {
                let rank = sampler.sample(unit_f64(&mut rng));
                let id = match eod_in_vocab {
                    Some(e) if rank >= e => rank + 1,
                    _ => rank,
                };
                doc.push(id);
            }
            if let Some(eod) = self.eod_token {
                if drawn + eod_len <= remaining {
                    doc.push(eod);
                }
            }
            stats.documents += 1;
            stats.tokens += doc.len() as u64;
            if let Some(&max) = doc.iter().max() {
                stats.max_token = stats.max_token.max(max);
            }
            on_doc(&doc)?;
        }
        Ok(stats)
    }

    fn validate(&self) -> Result<(), CorpusError> {
        let bad = |field, value: String, reason| {
            Err(CorpusError::InvalidZipf {
                field,
                value,
                reason,
            })
        };
        if self.vocab == 0 || self.vocab > Self::MAX_VOCAB {
            return bad("vocab", self.vocab.to_string(), "must be in 1..=2^24");
        }
        if !self.exponent.is_finite() || self.exponent < 0.0 {
            return bad(
                "exponent",
                self.exponent.to_string(),
                "must be finite and >= 0",
            );
        }
        if self.mean_doc_len == 0 {
            return bad("mean_doc_len", "0".to_string(), "must be >= 1");
        }
        if self.vocab == 1 && self.eod_token == Some(0) {
            return bad(
                "eod_token",
                "0".to_string(),
                "is the only id of a vocab of 1: no id left to draw",
            );
        }
        Ok(())
    }
}

/// Uniform in `[0, 1)` from the top 53 bits of one `u64` (exactly representable, portable).
fn unit_f64(rng: &mut Xoshiro256PlusPlus) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Geometric length on `1, 2, ...` with the given mean, by inversion (one draw per document).
fn geometric(rng: &mut Xoshiro256PlusPlus, mean: u32) -> u64 {
    let u = unit_f64(rng);
    if mean <= 1 {
        return 1;
    }
    // Failures before the first success, success probability p = 1/mean:
    // floor(ln(1-u) / ln(1-p)); mean (1-p)/p = mean - 1, plus the 1 below.
    let p = 1.0 / f64::from(mean);
    let failures = ((1.0 - u).ln() / (-p).ln_1p()).floor();
    // `as` saturates; 1 - u is in (0, 1] so `failures` is finite and >= 0.
    1 + failures as u64
}

/// Inverse-CDF sampling of Zipf ranks over a precomputed table.
///
/// Why a table and not rejection sampling (e.g. Hörmann-Derflinger rejection-inversion): the
/// vocabularies here are small (<= a few hundred thousand ids), the table is exact for the
/// truncated distribution (no approximation of the normalising sum), and each draw costs exactly
/// one random number, which keeps the stream simple to reason about. A guide table
/// (Chen & Asau's indexed search) makes the lookup O(1) on average: bucket `j` of `[0, 1)` knows
/// the first rank whose cumulative probability exceeds `j / n`, so only a short range is searched.
struct RankSampler {
    /// `cdf[r]` = P(rank <= r), 0-based ranks; the last entry is exactly 1.0.
    cdf: Vec<f64>,
    /// `guide[j]` = first `r` with `cdf[r] > j / n`, for `j in 0..=n` (`guide[n] = n - 1`).
    guide: Vec<u32>,
}

impl RankSampler {
    /// `n >= 1` ranks with weights `(r + 1)^-exponent`.
    fn new(n: u32, exponent: f64) -> Self {
        let len = n as usize;
        let mut cdf = Vec::with_capacity(len);
        let mut sum = 0.0f64;
        for r in 0..n {
            sum += f64::from(r + 1).powf(-exponent);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        let mut guide = Vec::with_capacity(len + 1);
        let mut r = 0usize;
        for j in 0..len {
            let threshold = j as f64 / len as f64;
            while cdf[r] <= threshold {
                r += 1; // stops at the last entry at the latest: cdf[len-1] = 1.0 > threshold
            }
            guide.push(r as u32);
        }
        guide.push(n - 1);
        RankSampler { cdf, guide }
    }

    /// Rank (0-based) for a uniform `u` in `[0, 1)`: the first `r` with `cdf[r] > u`.
    fn sample(&self, u: f64) -> u32 {
        let n = self.cdf.len();
        let bucket = ((u * n as f64) as usize).min(n - 1);
        // In exact arithmetic every rank before guide[bucket] has cdf <= bucket/n <= u and
        // cdf[guide[bucket + 1]] > (bucket+1)/n > u, so the answer lies in [lo, hi].
        let lo = self.guide[bucket] as usize;
        let hi = self.guide[bucket + 1] as usize;
        let mut r = lo + self.cdf[lo..=hi].partition_point(|&c| c <= u);
        // Floating-point rounding of u * n and j / n can move a draw sitting on a bucket edge
        // across it; these loops (almost never entered) make the result exact regardless.
        // Termination: cdf[n - 1] = 1.0 > u.
        while r > 0 && self.cdf[r - 1] > u {
            r -= 1;
        }
        while self.cdf[r] <= u {
            r += 1;
        }
        r as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::Hasher;

    fn run(z: &Zipf) -> Result<(Vec<Vec<u32>>, CorpusStats), CorpusError> {
        let mut docs = Vec::new();
        let stats = z.generate(|d: &[u32]| -> Result<(), CorpusError> {
            docs.push(d.to_vec());
            Ok(())
        })?;
        Ok((docs, stats))
    }

    fn hash(docs: &[Vec<u32>]) -> u64 {
        let mut h = DefaultHasher::new();
        for d in docs {
            h.write_usize(d.len());
            d.iter().for_each(|&t| h.write_u32(t));
        }
        h.finish()
    }

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() -> Result<(), CorpusError> {
        let mut z = Zipf::new(50_257, 7, 200_000);
        z.mean_doc_len = 500;
        z.eod_token = Some(50_256);
        let (a, sa) = run(&z)?;
        let (b, sb) = run(&z)?;
        assert_eq!(hash(&a), hash(&b));
        assert_eq!(a, b);
        assert_eq!(sa, sb);
        z.seed = 8;
        let (c, _) = run(&z)?;
        assert_ne!(hash(&a), hash(&c));
        // Not just a shifted copy: the streams differ in most positions.
        let (fa, fc): (Vec<u32>, Vec<u32>) = (a.concat(), c.concat());
        let same = fa.iter().zip(&fc).filter(|(x, y)| x == y).count();
        assert!(same < fa.len() / 2, "{same} of {}", fa.len());
        Ok(())
    }

    #[test]
    fn pinned_stream_prefix() -> Result<(), CorpusError> {
        // Guards against silent changes of the generator (RNG, table, length draw).
        let mut z = Zipf::new(1000, 1, 12);
        z.mean_doc_len = 3;
        z.eod_token = Some(1000);
        let (docs, _) = run(&z)?;
        let flat: Vec<u32> = docs.concat();
        assert_eq!(flat.len(), 12);
        // Recompute independently from the documented recipe.
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let sampler = RankSampler::new(1000, 1.1);
        let mut want = Vec::new();
        while want.len() < 12 {
            let len = geometric(&mut rng, 3);
            for _ in 0..len {
                if want.len() < 12 {
                    want.push(sampler.sample(unit_f64(&mut rng)));
                }
            }
            if want.len() < 12 {
                want.push(1000);
            }
        }
        assert_eq!(flat, want);
        // And the literal values, so that a change in rand's Xoshiro256++ or seeding is caught
        // (docs: 5 drawn + eod, then 6 drawn, cut at 12 tokens).
        assert_eq!(flat, [83, 0, 82, 1, 22, 1000, 13, 0, 0, 427, 3, 0]);
        Ok(())
    }

    #[test]
    fn exact_token_count_ids_in_range_and_eod_placement() -> Result<(), CorpusError> {
        for (tokens, eod) in [
            (0u64, None),
            (1, Some(100)),
            (1, None),
            (999, Some(100)),
            (10_007, Some(37)), // eod inside the vocabulary
            (10_007, None),
            (54_321, Some(100)),
        ] {
            let mut z = Zipf::new(100, 3, tokens);
            z.mean_doc_len = 50;
            z.eod_token = eod;
            let (docs, stats) = run(&z)?;
            let total: u64 = docs.iter().map(|d| d.len() as u64).sum();
            assert_eq!(total, tokens);
            assert_eq!(stats.tokens, tokens);
            assert_eq!(stats.documents, docs.len() as u64);
            assert!(docs.iter().all(|d| !d.is_empty()));
            let max = docs.iter().flatten().copied().max().unwrap_or(0);
            assert_eq!(stats.max_token, max);
            let (last, body) = match docs.split_last() {
                Some(x) => x,
                None => {
                    assert_eq!(tokens, 0);
                    continue;
                }
            };
            for doc in body {
                let content = match eod {
                    Some(e) => {
                        assert_eq!(doc.last(), Some(&e));
                        &doc[..doc.len() - 1]
                    }
                    None => &doc[..],
                };
                assert!(!content.is_empty());
                assert!(
                    content.iter().all(|&t| t < 100 && Some(t) != eod),
                    "{content:?}"
                );
            }
            // The last document is only cut short, never padded.
            let eods_in_last = last.iter().filter(|&&t| Some(t) == eod).count();
            assert!(eods_in_last <= 1);
            if eods_in_last == 1 {
                assert_eq!(last.last().copied(), eod);
            }
        }
        Ok(())
    }

    #[test]
    fn rank_frequencies_follow_the_exponent() -> Result<(), CorpusError> {
        let z = Zipf::new(50_000, 11, 1_000_000);
        let mut counts = vec![0u64; 50_000];
        let stats = z.generate(|d: &[u32]| -> Result<(), CorpusError> {
            for &t in d {
                counts[t as usize] += 1;
            }
            Ok(())
        })?;
        assert_eq!(stats.tokens, 1_000_000);
        assert!(stats.max_token < 50_000);
        assert!(counts[0] > counts[9]);
        // Expected ratio rank1/rank10 = 10^1.1 = 12.59; P(rank 1) ~ 0.09, so ~90k vs ~7k draws.
        let ratio = counts[0] as f64 / counts[9] as f64;
        assert!((11.5..13.8).contains(&ratio), "ratio {ratio}");
        // Expected P(rank 1) = 1 / sum_{r<=50000} r^-1.1.
        let norm: f64 = (1..=50_000).map(|r| f64::from(r).powf(-1.1)).sum();
        let p1 = counts[0] as f64 / 1e6;
        assert!(
            (p1 * norm - 1.0).abs() < 0.02,
            "p1 {p1} expected {}",
            1.0 / norm
        );
        Ok(())
    }

    #[test]
    fn document_lengths_average_mean_doc_len() -> Result<(), CorpusError> {
        for mean in [1u32, 2, 100, 2048] {
            let mut z = Zipf::new(1000, 5, 2_000_000);
            z.mean_doc_len = mean;
            z.eod_token = Some(1000);
            let mut lens = Vec::new();
            z.generate(|d: &[u32]| -> Result<(), CorpusError> {
                lens.push(d.len() as f64 - 1.0);
                Ok(())
            })?;
            lens.pop(); // the cut-off last document
            let avg = lens.iter().sum::<f64>() / lens.len() as f64;
            assert!(lens.iter().all(|&l| l >= 1.0));
            if mean == 1 {
                assert!(lens.iter().all(|&l| l == 1.0));
            }
            let rel = (avg - f64::from(mean)).abs() / f64::from(mean);
            assert!(
                rel < 0.06,
                "mean {mean}: average {avg} over {} docs",
                lens.len()
            );
        }
        Ok(())
    }

    #[test]
    fn sampler_matches_linear_inverse_cdf_search() {
        for (n, s) in [
            (1u32, 1.1),
            (2, 0.0),
            (10, 1.1),
            (1000, 1.1),
            (777, 2.5),
            (5000, 0.3),
        ] {
            let sampler = RankSampler::new(n, s);
            let linear = |u: f64| sampler.cdf.iter().position(|&c| c > u).map(|r| r as u32);
            let mut probes: Vec<f64> = vec![0.0, 1.0 - f64::EPSILON / 2.0];
            for &c in &sampler.cdf {
                // Exactly on, and one ulp either side of, every table entry.
                for u in [
                    c,
                    f64::from_bits(c.to_bits().saturating_sub(1)),
                    f64::from_bits(c.to_bits() + 1),
                ] {
                    if (0.0..1.0).contains(&u) {
                        probes.push(u);
                    }
                }
            }
            for j in 0..=n {
                probes.push(f64::from(j) / f64::from(n));
            }
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(u64::from(n));
            probes.extend((0..2000).map(|_| unit_f64(&mut rng)));
            for u in probes.into_iter().filter(|u| (0.0..1.0).contains(u)) {
                assert_eq!(Some(sampler.sample(u)), linear(u), "n {n} s {s} u {u}");
            }
        }
    }

    #[test]
    fn invalid_parameters_are_errors_naming_the_field() {
        let base = Zipf::new(100, 0, 10);
        let cases: [(Zipf, &str); 6] = [
            (
                Zipf {
                    vocab: 0,
                    ..base.clone()
                },
                "vocab",
            ),
            (
                Zipf {
                    vocab: Zipf::MAX_VOCAB + 1,
                    ..base.clone()
                },
                "vocab",
            ),
            (
                Zipf {
                    exponent: -0.5,
                    ..base.clone()
                },
                "exponent",
            ),
            (
                Zipf {
                    exponent: f64::NAN,
                    ..base.clone()
                },
                "exponent",
            ),
            (
                Zipf {
                    mean_doc_len: 0,
                    ..base.clone()
                },
                "mean_doc_len",
            ),
            (
                Zipf {
                    vocab: 1,
                    eod_token: Some(0),
                    ..base.clone()
                },
                "eod_token",
            ),
        ];
        for (z, field) in cases {
            match run(&z) {
                Err(CorpusError::InvalidZipf { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{z:?}: expected InvalidZipf({field}), got {other:?}"),
            }
        }
        // vocab 1 without eod: every token is id 0.
        let (docs, stats) = run(&Zipf { vocab: 1, ..base }).unwrap_or_default();
        assert_eq!(stats.tokens, 10);
        assert!(docs.iter().flatten().all(|&t| t == 0));
    }
}
