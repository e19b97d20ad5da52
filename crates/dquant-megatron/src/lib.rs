//! Megatron-Core's sample order, exactly: the samples `BlendedMegatronDatasetBuilder` +
//! `GPTDataset` + `BlendedDataset` give a Megatron-LM job, index for index.
//!
//! A Megatron job's data order is fixed by numpy's legacy `RandomState` shuffles and
//! Megatron's C++ helpers; a loader that wants to replace Megatron's, mid-run, must give the
//! same sample for every `consumed_samples`. So this crate rebuilds each piece bit for bit:
//! [`random_state`] (MT19937 and numpy's shuffle), [`numpy_float`] (numpy's pairwise sums),
//! [`split`] (the split string), [`gpt_index`] (document, sample and shuffle indices),
//! [`blending`] (the greedy and exhaustive blends) and [`builder`] (which datasets each split
//! gets, of what size). These are pure: the builder gets each source's sequence lengths from
//! a callback. [`datasets`] says what sample `i` is made of, and [`reader`] (with I/O,
//! through `dquant-storage`) reads it; [`records`] lays samples out as the token stream an
//! agent serves them in; [`fields`] makes `GPTDataset.__getitem__`'s tokens, labels and masks
//! from a sample's tokens. [`cache`], the other module with I/O, keeps built GPT indices in a
//! directory behind the [`IndexStore`] trait the builder takes.
//!
//! Matched against megatron-core 0.16.1 (`python/tests/test_megatron_order.py` compares with
//! Megatron's own builder over many configs).

mod alloc;
pub mod blending;
pub mod builder;
pub mod cache;
pub mod datasets;
mod error;
pub mod fields;
pub mod gpt_index;
pub mod lookup;
pub mod numpy_float;
pub mod random_state;
pub mod reader;
pub mod records;
pub mod split;

pub use builder::{build, build_cached, build_within, Blend, BuildConfig, BuildLimits, Built};
pub use cache::{DirStore, IndexStore};
pub use datasets::{BlendedDataset, GptDataset, Piece, Sample, TopLevel};
pub use error::MegatronError;
pub use lookup::Lookup;
pub use reader::{ReadScratch, Sources};
pub use records::RecordLayout;
pub use split::Split;
