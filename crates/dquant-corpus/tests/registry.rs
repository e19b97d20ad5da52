//! Real run over a few files of the local Cargo registry. An empty registry fails under
//! `CI=true` (a build there has just filled it) and is skipped loudly elsewhere.

use dquant_corpus::{CorpusError, Encoding, RealCorpus};

#[test]
fn real_sources_tokenize_within_encoding_bits_and_round_trip() -> Result<(), CorpusError> {
    let probe = RealCorpus::new(Encoding::R50k);
    let files = match probe.files() {
        Ok(files) => files,
        Err(e @ (CorpusError::RootMissing { .. } | CorpusError::NoFiles { .. })) => {
            dquant_testkit::require("the Cargo registry's sources", false, &e.to_string());
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for encoding in Encoding::ALL {
        let mut corpus = RealCorpus::new(encoding);
        corpus.max_bytes = Some(96 * 1024);
        let mut docs: Vec<Vec<u32>> = Vec::new();
        let stats = corpus.generate(
            |d: &[u32]| -> Result<(), CorpusError> {
                docs.push(d.to_vec());
                Ok(())
            },
            |_, _| {},
        )?;
        assert!(stats.files >= 1);
        assert_eq!(stats.documents, docs.len() as u64);
        assert_eq!(stats.documents + stats.skipped_non_utf8, stats.files);
        assert_eq!(
            stats.tokens,
            docs.iter().map(|d| d.len() as u64).sum::<u64>()
        );
        assert!(stats.tokens > stats.documents, "{encoding}: {stats:?}");
        let max = docs.iter().flatten().copied().max().unwrap_or(0);
        assert_eq!(stats.max_token, max);
        assert!(
            u64::from(max) < 1u64 << encoding.bits(),
            "{encoding}: {max}"
        );
        assert!(max < encoding.vocab_size(), "{encoding}: {max}");
        // The first file (if it is UTF-8) decodes back to its exact bytes.
        let first = std::fs::read(&files[0]).map_err(|source| CorpusError::Read {
            path: files[0].clone(),
            source,
        })?;
        if std::str::from_utf8(&first).is_ok() {
            let doc = &docs[0];
            assert_eq!(doc.last(), Some(&encoding.eod_token()));
            let decoded = encoding
                .tokenizer()?
                .decode_bytes(&doc[..doc.len() - 1])
                .map_err(|e| CorpusError::TokenizerLoad {
                    encoding: encoding.name(),
                    message: e.to_string(),
                })?;
            assert!(
                decoded == first,
                "{encoding}: first document does not round-trip"
            );
        }
        eprintln!("{encoding}: {stats:?}");
    }
    Ok(())
}
