//! What the engine's integration tests share.

use dquant_codec::Width;
use dquant_engine::{BatchInfo, Pipeline};

/// Every batch `next_batch_into` writes at `width` (its bytes and where it sits), until the
/// end or the first error (its message).
pub fn narrow_all(
    pipe: &mut Pipeline,
    width: Width,
) -> (Vec<(Vec<u8>, BatchInfo)>, Option<String>) {
    let bw = width.byte_width().expect("a byte-aligned width");
    let mut out = vec![0u8; pipe.schedule().batch_tokens() as usize * bw];
    let mut all = Vec::new();
    loop {
        match pipe.next_batch_into(width, &mut out) {
            Ok(Some(info)) => {
                let n = info.samples * pipe.sample_len() * bw;
                all.push((out[..n].to_vec(), info));
            }
            Ok(None) => return (all, None),
            Err(e) => return (all, Some(e.to_string())),
        }
    }
}
