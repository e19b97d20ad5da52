//! Each sample's origins ([`dquant_plan::Origins`]) from the sources' document indexes, for a
//! plan's `provenance = true`: where the pipeline reads a batch, so every transport carries
//! the same pieces `dquant locate` computes from the plan.

use dquant_plan::{Origins, SampleRef};

use crate::batch_reads::source_error;
use crate::EngineError;
use dquant_storage::source::{SourceError, TokenSource};

/// Checks at open that every source carries a document index that reads (`why`: the plan
/// field that needs it, for the message).
pub(crate) fn check_indexes(
    sources: &[Box<dyn TokenSource>],
    uris: &[String],
    why: &str,
) -> Result<(), EngineError> {
    for d in 0..sources.len() {
        index_of(sources, uris, d, why)?;
    }
    Ok(())
}

fn index_of<'s>(
    sources: &'s [Box<dyn TokenSource>],
    uris: &[String],
    d: usize,
    why: &str,
) -> Result<&'s dquant_format::DocIndex, EngineError> {
    match sources[d].document_index() {
        Some(Ok(ix)) => Ok(ix),
        Some(Err(e)) => Err(source_error(uris, d, e)),
        None => {
            let m = format!(
                "{why} needs each source's document index, and this source does not carry one \
                 (a dataset on another agent)"
            );
            Err(source_error(uris, d, SourceError::Usage(m)))
        }
    }
}

/// Fills `out` with the pieces of `samples`, in place of the last batch's.
pub(crate) fn fill(
    out: &mut Origins,
    samples: &[SampleRef],
    sources: &[Box<dyn TokenSource>],
    uris: &[String],
) -> Result<(), EngineError> {
    out.clear();
    let mut pieces = Vec::new();
    for s in samples {
        let ix = index_of(sources, uris, s.source, "provenance = true")?;
        pieces.clear();
        let (mut first, mut t) = (None, s.tokens.start);
        for (doc, offset, length) in ix.pieces(s.tokens.clone()) {
            first.get_or_insert(offset);
            pieces.push((doc as u64, length as u32));
            t += length;
        }
        if t < s.tokens.end {
            let e = SourceError::Usage(format!("token {t} is past the document index's end"));
            return Err(source_error(uris, s.source, e));
        }
        out.push_sample(s.source as u32, first.unwrap_or(0), pieces.iter().copied());
    }
    Ok(())
}
