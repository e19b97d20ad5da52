//! Blocks encoded on several threads (`BlockFileWriter::set_threads`): the file is byte for
//! byte the one a single thread writes, however the tokens are pushed, and a block that
//! fails leaves the same bytes and the same error.

use dquant_codec::{Codec, Compression, Width};
use dquant_format::block::BlockFileWriter;

use crate::common::{all_compressions, random_index, tokens_for, writer, Rng};

/// Pushes `tokens` in chunks of `chunks` (cycled) into a writer of `threads` threads; the
/// bytes written and the first push's error, if any (pushing stops there).
fn push_all(
    mut w: BlockFileWriter,
    mut file: Vec<u8>,
    tokens: &[u32],
    chunks: &[usize],
    threads: usize,
) -> (BlockFileWriter, Vec<u8>, Option<String>) {
    w.set_threads(threads).expect("threads");
    assert_eq!(w.threads(), threads);
    let mut rest = tokens;
    let mut sizes = chunks.iter().cycle();
    while !rest.is_empty() {
        let n = sizes.next().map_or(rest.len(), |&n| n.min(rest.len()));
        if let Err(e) = w.push(&rest[..n], &mut file) {
            return (w, file, Some(e.to_string()));
        }
        rest = &rest[n..];
    }
    (w, file, None)
}

#[test]
fn several_threads_write_the_bytes_one_thread_writes() {
    let mut rng = Rng::new(36);
    let bt = 1024u32;
    for compression in all_compressions() {
        let codec = Codec {
            width: Width::U16,
            compression,
        };
        let tokens = tokens_for(Width::U16, 23 * bt as usize + 417, 7);
        let index = random_index(&mut rng, tokens.len() as u64);
        for chunks in [&[][..], &[1], &[3 * bt as usize + 5], &[999, 7001, 64]] {
            let mut files = Vec::new();
            for threads in [1, 2, 3, 8] {
                let (w, file) = writer(codec, bt, &tokens, true);
                let (w, mut file, err) = push_all(w, file, &tokens, chunks, threads);
                assert_eq!(err, None, "{codec}");
                let summary = w.finish(&index, &mut file).expect("finish");
                assert_eq!(summary.blocks, 24);
                files.push((threads, file));
            }
            for (threads, f) in &files[1..] {
                assert!(
                    *f == files[0].1,
                    "{codec}, chunks {chunks:?}: {threads} threads wrote other bytes"
                );
            }
        }
    }
}

#[test]
fn a_failing_block_leaves_what_one_thread_leaves() {
    let bt = 512u32;
    let codec = Codec {
        width: Width::U16,
        compression: Compression::Zstd(3),
    };
    let mut tokens = tokens_for(Width::U16, 20 * bt as usize, 3);
    // Block 13 holds a token u16 cannot: blocks 0..13 are written, then the error.
    tokens[13 * bt as usize + 77] = 70_000;
    let mut results = Vec::new();
    for threads in [1, 4] {
        let (w, file) = writer(codec, bt, &tokens, false);
        let (w, file, err) = push_all(w, file, &tokens, &[], threads);
        results.push((file, err, w.tokens()));
    }
    let (file, err, _) = &results[0];
    let e = err.as_deref().expect("the token does not fit");
    assert!(e.contains("70000") && e.contains("6733"), "{e}");
    assert_eq!(results[1].0, *file, "the bytes before the failing block");
    assert_eq!(results[1].1, *err, "the error");
}
