//! Finding each sample's document starts where its tokens are read (see
//! [`dquant_plan::boundaries`] for the rule): from the EOD token in the tokens themselves, or
//! from the sources' document indices.

use dquant_codec::Width;
use dquant_plan::{Boundaries, DocStarts, Plan, SampleRef};

use crate::batch_reads::source_error;
use crate::EngineError;
use dquant_storage::source::{SourceError, TokenSource};

/// A plan's boundary rule, and the starts it found in the last batch.
pub(crate) struct DocFinder {
    rule: Finder,
    docs: DocStarts,
}

/// How a plan's boundaries are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Finder {
    /// Input positions holding this token end a document.
    Eod(u32),
    /// The sources' document indices.
    Documents,
}

/// A batch's tokens as the pipeline holds them.
pub(crate) enum BatchTokens<'a> {
    U32(&'a [u32]),
    /// Little-endian tokens of a byte-aligned width.
    Stored {
        width: Width,
        bytes: &'a [u8],
    },
}

impl DocFinder {
    /// The plan's finder, or `None` when it has no boundaries.
    pub fn of(plan: &Plan) -> Option<Self> {
        let rule = match (plan.boundaries?, plan.eod) {
            (Boundaries::Eod, Some(eod)) => Finder::Eod(eod),
            // A validated plan has `eod` with "eod".
            (Boundaries::Eod, None) | (Boundaries::Documents, _) => Finder::Documents,
        };
        Some(DocFinder {
            rule,
            docs: DocStarts::new(plan.seq_len),
        })
    }

    /// The starts of the last batch [`fill`](DocFinder::fill) was given.
    pub fn docs(&self) -> &DocStarts {
        &self.docs
    }

    /// Checks at open that every source can answer: with `"documents"`, each must carry its
    /// document index, and it must read (it is read now, once, not in the first batch).
    pub fn check(
        &self,
        sources: &[Box<dyn TokenSource>],
        uris: &[String],
    ) -> Result<(), EngineError> {
        if self.rule != Finder::Documents {
            return Ok(());
        }
        for (d, s) in sources.iter().enumerate() {
            match s.document_index() {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(source_error(uris, d, e)),
                None => {
                    let m = "boundaries = \"documents\" needs each source's document index, and \
                             this source does not carry one (a dataset on another agent); use \
                             boundaries = \"eod\" with eod = ID";
                    return Err(source_error(uris, d, SourceError::Usage(m.into())));
                }
            }
        }
        Ok(())
    }

    /// Finds the starts of `samples`, whose tokens (`seq_len + 1` each, row-major) are
    /// `tokens`, in place of the last batch's.
    pub fn fill(
        &mut self,
        samples: &[SampleRef],
        tokens: BatchTokens<'_>,
        sources: &[Box<dyn TokenSource>],
        uris: &[String],
    ) -> Result<(), EngineError> {
        let out = &mut self.docs;
        let seq_len = out.seq_len();
        out.clear(seq_len);
        let (l, n) = (seq_len as usize + 1, seq_len as usize);
        match (self.rule, tokens) {
            (Finder::Eod(eod), BatchTokens::U32(t)) => {
                for row in t.chunks_exact(l).take(samples.len()) {
                    eod_positions(&row[..n], eod, |i| out.push_start(i + 1));
                    out.end_sample();
                }
            }
            (Finder::Eod(eod), BatchTokens::Stored { width, bytes }) => {
                let bw = width.byte_width().unwrap_or(4);
                for row in bytes.chunks_exact(l * bw).take(samples.len()) {
                    eod_positions_le(&row[..n * bw], bw, eod, |i| out.push_start(i + 1));
                    out.end_sample();
                }
            }
            (Finder::Documents, _) => {
                for s in samples {
                    let ix = match sources[s.source].document_index() {
                        Some(Ok(ix)) => ix,
                        Some(Err(e)) => return Err(source_error(uris, s.source, e)),
                        None => {
                            let m = "the source's document index went away";
                            let e = SourceError::Usage(m.into());
                            return Err(source_error(uris, s.source, e));
                        }
                    };
                    let at = s.tokens.start;
                    out.push_sample(ix.starts_in(s.tokens.clone()).map(|t| (t - at) as u32));
                }
            }
        }
        Ok(())
    }
}

/// Tokens scanned at once: a block with no EOD (most of them: documents are hundreds of
/// tokens long) costs one vectorized compare-and-or, not a branch per token.
const BLOCK: usize = 64;

/// Calls `f` with the position of every token of `inputs` equal to `eod`, in order.
fn eod_positions(inputs: &[u32], eod: u32, mut f: impl FnMut(u32)) {
    for (b, block) in inputs.chunks(BLOCK).enumerate() {
        if !block.iter().fold(false, |hit, &t| hit | (t == eod)) {
            continue;
        }
        for (i, _) in block.iter().enumerate().filter(|(_, &t)| t == eod) {
            f((b * BLOCK + i) as u32);
        }
    }
}

/// [`eod_positions`] over little-endian tokens of `bw` bytes each (a stored width).
fn eod_positions_le(bytes: &[u8], bw: usize, eod: u32, mut f: impl FnMut(u32)) {
    match bw {
        2 => eod_positions_of::<2>(bytes, eod, f),
        3 => eod_positions_of::<3>(bytes, eod, f),
        4 => eod_positions_of::<4>(bytes, eod, f),
        8 => eod_positions_of::<8>(bytes, eod, f),
        _ => {
            for (i, w) in bytes.chunks_exact(bw).enumerate() {
                if value_le(w) == u64::from(eod) {
                    f(i as u32);
                }
            }
        }
    }
}

/// [`eod_positions`] over little-endian tokens of `BW` bytes, a block at a time as there: a
/// width known when compiled makes each token's load one fixed-size read, and a block with
/// no EOD one vectorized compare-and-or (a token scanned byte by byte cost the boundary
/// outputs half their rate on i64 rows, `bench/python`). A token too narrow to hold `eod`
/// never equals it.
fn eod_positions_of<const BW: usize>(bytes: &[u8], eod: u32, mut f: impl FnMut(u32)) {
    let eod = u64::from(eod);
    for (b, block) in bytes.chunks(BW * BLOCK).enumerate() {
        let is = |w: &[u8]| value_le(w) == eod;
        if !block.chunks_exact(BW).fold(false, |hit, w| hit | is(w)) {
            continue;
        }
        for (i, _) in block.chunks_exact(BW).enumerate().filter(|(_, w)| is(w)) {
            f((b * BLOCK + i) as u32);
        }
    }
}

/// The value of little-endian bytes (the first 8 of more).
#[inline(always)]
fn value_le(w: &[u8]) -> u64 {
    let n = w.len().min(8);
    let mut x = [0u8; 8];
    x[..n].copy_from_slice(&w[..n]);
    u64::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_find_every_eod_across_blocks() {
        let mut t: Vec<u32> = (0..300).map(|i| i % 7).collect();
        for i in [0, 63, 64, 65, 127, 200, 299] {
            t[i] = 9;
        }
        let want: Vec<u32> = vec![0, 63, 64, 65, 127, 200, 299];
        let mut got = Vec::new();
        eod_positions(&t, 9, |i| got.push(i));
        assert_eq!(got, want);
        let le: Vec<u8> = t.iter().flat_map(|&x| (x as u16).to_le_bytes()).collect();
        let mut got16 = Vec::new();
        eod_positions_le(&le, 2, 9, |i| got16.push(i));
        assert_eq!(got16, want);
        let le4: Vec<u8> = t.iter().flat_map(|&x| x.to_le_bytes()).collect();
        let mut got32 = Vec::new();
        eod_positions_le(&le4, 4, 9, |i| got32.push(i));
        assert_eq!(got32, want);
        for bw in [3, 8] {
            let wide: Vec<u8> = t
                .iter()
                .flat_map(|&x| u64::from(x).to_le_bytes()[..bw].to_vec())
                .collect();
            let mut got = Vec::new();
            eod_positions_le(&wide, bw, 9, |i| got.push(i));
            assert_eq!(got, want, "{bw} bytes a token");
        }
        let mut none = Vec::new();
        eod_positions_le(&le, 2, 70_000, |i| none.push(i));
        assert!(none.is_empty());
        let big: Vec<u8> = [70_000u64, 5, 70_000]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut found = Vec::new();
        eod_positions_le(&big, 8, 70_000, |i| found.push(i));
        assert_eq!(found, [0, 2]);
    }
}
