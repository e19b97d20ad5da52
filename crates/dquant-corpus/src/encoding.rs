use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

use crate::CorpusError;

/// A tokenizer bundled (offline, no download) in `tiktoken-rs`.
///
/// The ids below are those of tiktoken-rs 0.12's `r50k_base()`, `cl100k_base()` and
/// `o200k_base()` special-token tables; the tests check them against the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Encoding {
    /// `r50k_base` (GPT-2 / GPT-3): 50,257 ids, fits 16 bits.
    R50k,
    /// `cl100k_base` (GPT-3.5 / GPT-4): ids up to 100,276, needs 17 bits.
    Cl100k,
    /// `o200k_base` (GPT-4o and later): ids up to 200,018, needs 18 bits.
    O200k,
}

impl Encoding {
    /// All encodings, smallest vocabulary first.
    pub const ALL: [Encoding; 3] = [Encoding::R50k, Encoding::Cl100k, Encoding::O200k];

    /// Short name: `"r50k"`, `"cl100k"` or `"o200k"`.
    pub fn name(&self) -> &'static str {
        match self {
            Encoding::R50k => "r50k",
            Encoding::Cl100k => "cl100k",
            Encoding::O200k => "o200k",
        }
    }

    /// Id of `<|endoftext|>`, used as the end-of-document token.
    pub fn eod_token(&self) -> u32 {
        match self {
            Encoding::R50k => 50_256,
            Encoding::Cl100k => 100_257,
            Encoding::O200k => 199_999,
        }
    }

    /// Number of ids including special tokens, i.e. largest id + 1 (tiktoken's `n_vocab`).
    ///
    /// cl100k and o200k have holes below the top special token (ids nothing decodes to);
    /// they still count, because this is the range a reader must accept.
    pub fn vocab_size(&self) -> u32 {
        match self {
            Encoding::R50k => 50_257,    // 0..=50255 ordinary, 50256 <|endoftext|>
            Encoding::Cl100k => 100_277, // top special: <|endofprompt|> = 100276
            Encoding::O200k => 200_019,  // top special: <|endofprompt|> = 200018
        }
    }

    /// Bits needed to store the largest id (`vocab_size() - 1`): 16, 17 or 18.
    pub fn bits(&self) -> u8 {
        // vocab_size() >= 2, so the subtraction cannot underflow; the result is <= 32.
        (u32::BITS - (self.vocab_size() - 1).leading_zeros()) as u8
    }

    /// The tiktoken-rs tokenizer, loaded on first use and shared by all threads afterwards.
    ///
    /// Loading parses the bundled tables (a fraction of a second in optimised builds).
    pub fn tokenizer(&self) -> Result<&'static CoreBPE, CorpusError> {
        // tiktoken-rs's own `*_singleton()` functions unwrap the load result; we keep the error.
        static R50K: OnceLock<Result<CoreBPE, LoadFailure>> = OnceLock::new();
        static CL100K: OnceLock<Result<CoreBPE, LoadFailure>> = OnceLock::new();
        static O200K: OnceLock<Result<CoreBPE, LoadFailure>> = OnceLock::new();
        let cell = match self {
            Encoding::R50k => &R50K,
            Encoding::Cl100k => &CL100K,
            Encoding::O200k => &O200K,
        };
        cell.get_or_init(|| self.load())
            .as_ref()
            .map_err(|f| f.error(self.name()))
    }

    /// A private tokenizer instance, for one worker thread.
    ///
    /// Clones of a tiktoken-rs `CoreBPE` share fancy-regex's scratch pool (`Arc<Prog>`), which
    /// threads then fight over (measured: two threads sharing one instance were slower than
    /// one). A separately loaded instance has its own pool.
    /// A failure is kept, for the worker to report with each file it would handle.
    pub(crate) fn load_private(&self) -> Result<CoreBPE, LoadFailure> {
        self.load()
    }

    fn load(&self) -> Result<CoreBPE, LoadFailure> {
        let loaded = match self {
            Encoding::R50k => tiktoken_rs::r50k_base(),
            Encoding::Cl100k => tiktoken_rs::cl100k_base(),
            Encoding::O200k => tiktoken_rs::o200k_base(),
        };
        loaded.map_err(|e| LoadFailure(format!("{e:#}")))
    }
}

/// A tokenizer that did not load: tiktoken-rs's message. Kept as text because its error (an
/// `anyhow::Error`) cannot be cloned, and a failed load is reported to every caller after it.
#[derive(Debug, Clone)]
pub(crate) struct LoadFailure(String);

impl LoadFailure {
    /// The failure as the corpus error for `encoding`.
    pub(crate) fn error(&self, encoding: &'static str) -> CorpusError {
        CorpusError::TokenizerLoad {
            encoding,
            message: self.0.clone(),
        }
    }
}

impl fmt::Display for Encoding {
    /// Writes [`Encoding::name`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Encoding {
    type Err = CorpusError;

    /// Accepts `r50k`, `r50k_base`, `cl100k`, `cl100k_base`, `o200k`, `o200k_base`
    /// (ASCII case-insensitive, surrounding whitespace ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "r50k" | "r50k_base" => Ok(Encoding::R50k),
            "cl100k" | "cl100k_base" => Ok(Encoding::Cl100k),
            "o200k" | "o200k_base" => Ok(Encoding::O200k),
            _ => Err(CorpusError::UnknownEncoding {
                name: s.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn eod_matches_tiktoken_special_token() -> Result<(), CorpusError> {
        for enc in Encoding::ALL {
            let bpe = enc.tokenizer()?;
            let allowed: HashSet<&str> = [tiktoken_rs::ENDOFTEXT].into_iter().collect();
            let (ids, _) = bpe.encode(tiktoken_rs::ENDOFTEXT, &allowed).map_err(|e| {
                CorpusError::TokenizerLoad {
                    encoding: enc.name(),
                    message: format!("{e:?}"),
                }
            })?;
            assert_eq!(ids, vec![enc.eod_token()], "{enc}");
            // Ordinary encoding must NOT produce the special id for the same text.
            let ordinary = bpe.encode_ordinary(tiktoken_rs::ENDOFTEXT);
            assert!(ordinary.len() > 1, "{enc}: {ordinary:?}");
            assert!(!ordinary.contains(&enc.eod_token()), "{enc}");
        }
        Ok(())
    }

    #[test]
    fn vocab_size_is_largest_decodable_id_plus_one() -> Result<(), CorpusError> {
        for enc in Encoding::ALL {
            let bpe = enc.tokenizer()?;
            let top = enc.vocab_size() - 1;
            assert!(
                bpe.decode_bytes(&[top]).is_ok(),
                "{enc}: id {top} should decode"
            );
            assert!(
                bpe.decode_bytes(&[enc.vocab_size()]).is_err(),
                "{enc}: id {} should not exist",
                enc.vocab_size()
            );
            // Every special token id is below vocab_size.
            for special in bpe.special_tokens() {
                let allowed: HashSet<&str> = [special].into_iter().collect();
                let ids = bpe
                    .encode(special, &allowed)
                    .map(|r| r.0)
                    .unwrap_or_default();
                assert_eq!(ids.len(), 1, "{enc} {special}");
                assert!(ids[0] < enc.vocab_size(), "{enc} {special} {}", ids[0]);
            }
        }
        Ok(())
    }

    #[test]
    fn bits_cover_vocab() {
        let got: Vec<u8> = Encoding::ALL.iter().map(|e| e.bits()).collect();
        assert_eq!(got, vec![16, 17, 18]);
        for enc in Encoding::ALL {
            let max = u64::from(enc.vocab_size() - 1);
            assert!(max < 1u64 << enc.bits());
            assert!(max >= 1u64 << (enc.bits() - 1));
        }
    }

    #[test]
    fn names_round_trip_and_errors_list_valid_names() {
        for enc in Encoding::ALL {
            assert_eq!(enc.name().parse::<Encoding>().ok(), Some(enc));
            assert_eq!(
                format!("{}_base", enc.name()).parse::<Encoding>().ok(),
                Some(enc)
            );
            assert_eq!(enc.to_string(), enc.name());
        }
        assert_eq!(
            "CL100K_BASE".parse::<Encoding>().ok(),
            Some(Encoding::Cl100k)
        );
        let msg = match "p50k".parse::<Encoding>() {
            Ok(e) => panic!("p50k parsed as {e}"),
            Err(e) => e.to_string(),
        };
        assert!(msg.contains("\"p50k\""), "{msg}");
        for name in ["r50k_base", "cl100k_base", "o200k_base"] {
            assert!(msg.contains(name), "{msg}");
        }
    }
}
