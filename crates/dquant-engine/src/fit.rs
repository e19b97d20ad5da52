//! Whether tokens fit where a plan puts them: the output dtype, or a fixed wire codec.
//!
//! A token that does not fit is an error naming the source and the token's offset in it,
//! never a truncation. The in-process reader and the agent report it with the same words,
//! because both call [`check_fits`].

use dquant_codec::kernels::first_over;
use dquant_codec::Width;

use crate::batch::TokenBatch;
use crate::EngineError;

/// The first token of `batch` that does not fit `width`, as the error the plan's users see:
/// it names the source and the token's offset in it.
pub fn check_fits(
    batch: &TokenBatch<'_>,
    sample_len: usize,
    width: Width,
    context: &str,
) -> Result<(), EngineError> {
    let max = width.max_token();
    if max == u32::MAX {
        return Ok(());
    }
    for (k, sample) in batch.tokens.chunks_exact(sample_len).enumerate() {
        if let Some(i) = first_over(sample, max) {
            let (d, start) = batch.provenance[k];
            let source = dquant_codec::CodecError::OutOfRange {
                value: sample[i],
                offset: start + i as u64,
                width,
            };
            return Err(EngineError::Output {
                index: d,
                uri: batch.uris[d].clone(),
                context: context.to_string(),
                source,
            });
        }
    }
    Ok(())
}
