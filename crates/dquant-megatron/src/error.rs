//! The one error type of Megatron-order building and serving.

use crate::split::Split;

#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum MegatronError {
    /// A `split` string Megatron-Core would not accept.
    #[error("split {split:?}: {why}")]
    Split { split: String, why: String },
    /// A configuration Megatron-Core rejects (or would hang on).
    #[error("{0}")]
    Config(String),
    /// One source's dataset of one split could not be built.
    #[error("{prefix} ({split} split): {source}")]
    Dataset {
        prefix: String,
        split: &'static str,
        #[source]
        source: Box<MegatronError>,
    },
    /// A blend asks a source for more samples than it was built with.
    #[error(
        "the {split} blend asks dataset {dataset} for {requested} samples but it has {available}; \
         raise mid_level_dataset_surplus (Megatron-Core raises IndexError here too)"
    )]
    Oversampled {
        split: &'static str,
        dataset: usize,
        requested: u64,
        available: u64,
    },
    /// An index array larger than the process can allocate (an absurd number of samples).
    #[error("{what} would hold {elements} entries: more than this process can allocate")]
    TooLarge { what: &'static str, elements: u64 },
    /// A document index over the limit its builder was given ([`crate::BuildLimits`]).
    #[error(
        "the document index would hold {entries} entries ({documents} documents x {epochs} \
         epochs), above the limit of {max}"
    )]
    OverLimit {
        documents: u64,
        epochs: u64,
        entries: u64,
        max: u64,
    },
    #[error("index {index} is out of range for the {split} dataset of {len} samples")]
    IndexOutOfRange {
        split: &'static str,
        index: u64,
        len: u64,
    },
    #[error(transparent)]
    Storage(#[from] dquant_storage::StorageError),
}

impl MegatronError {
    /// This error, said of `prefix`'s `split` dataset.
    pub fn in_dataset(self, prefix: &str, split: Split) -> Self {
        MegatronError::Dataset {
            prefix: prefix.to_string(),
            split: split.name(),
            source: Box::new(self),
        }
    }

    /// Whether a limit the builder was given refused the build (not the config itself).
    pub fn is_over_limit(&self) -> bool {
        match self {
            MegatronError::OverLimit { .. } => true,
            MegatronError::Dataset { source, .. } => source.is_over_limit(),
            _ => false,
        }
    }
}
