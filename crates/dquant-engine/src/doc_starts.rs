//! Finding each sample's document starts where its tokens are read (see
//! [`dquant_plan::boundaries`] for the rule): from the EOD token in the tokens themselves, or
//! from the sources' document indices.

use dquant_codec::Width;
use dquant_plan::{Boundaries, DocStarts, Plan, SampleRef};

use crate::batch_reads::source_error;
use crate::source::{SourceError, TokenSource};
use crate::EngineError;

/// How a plan's boundaries are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finder {
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

impl Finder {
    /// The plan's finder, or `None` when it has no boundaries.
    pub fn of(plan: &Plan) -> Option<Self> {
        match (plan.boundaries?, plan.eod) {
            (Boundaries::Eod, Some(eod)) => Some(Finder::Eod(eod)),
            // A validated plan has `eod` with "eod".
            (Boundaries::Eod, None) | (Boundaries::Documents, _) => Some(Finder::Documents),
        }
    }

    /// Checks at open that every source can answer: with `"documents"`, each must carry its
    /// document index, and it must read (it is read now, once, not in the first batch).
    pub fn check(
        self,
        sources: &[Box<dyn TokenSource>],
        uris: &[String],
    ) -> Result<(), EngineError> {
        if self != Finder::Documents {
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

    /// Fills `out` with the starts of `samples`, whose tokens (`seq_len + 1` each, row-major)
    /// are `tokens`.
    pub fn fill(
        self,
        out: &mut DocStarts,
        seq_len: u32,
        samples: &[SampleRef],
        tokens: BatchTokens<'_>,
        sources: &[Box<dyn TokenSource>],
        uris: &[String],
    ) -> Result<(), EngineError> {
        out.clear(seq_len);
        let (l, n) = (seq_len as usize + 1, seq_len as usize);
        match (self, tokens) {
            (Finder::Eod(eod), BatchTokens::U32(t)) => {
                for row in t.chunks_exact(l).take(samples.len()) {
                    out.push_sample(eod_starts(row[..n].iter().map(|&t| u64::from(t)), eod));
                }
            }
            (Finder::Eod(eod), BatchTokens::Stored { width, bytes }) => {
                let bw = width.byte_width().unwrap_or(4);
                for row in bytes.chunks_exact(l * bw).take(samples.len()) {
                    let ids = row[..n * bw].chunks_exact(bw).map(|b| {
                        let mut w = [0u8; 8];
                        w[..bw].copy_from_slice(b);
                        u64::from_le_bytes(w)
                    });
                    out.push_sample(eod_starts(ids, eod));
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

/// The starts after each input position holding `eod`.
fn eod_starts(inputs: impl Iterator<Item = u64>, eod: u32) -> impl Iterator<Item = u32> {
    inputs
        .enumerate()
        .filter(move |&(_, t)| t == u64::from(eod))
        .map(|(i, _)| i as u32 + 1)
}
