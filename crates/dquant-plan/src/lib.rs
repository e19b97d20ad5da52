//! Plans: which tokens go in which sample of which batch for which rank.
//!
//! A [`Plan`] is the original design's *action*: what a consumer wants (sources and weights,
//! sequence length, batch size, seed, length, rank/world, output dtype, wire codec), as data
//! that serializes to JSON and TOML. The same plan runs in-process, in a local agent or in a
//! remote one, and must give the same stream everywhere. So this crate is pure and
//! deterministic: no I/O, no clocks, no threads, no platform-dependent arithmetic. It never
//! reads a token; the caller opens the sources, passes their token counts ([`SourceInfo`]), and
//! gets back a [`Schedule`] that says, for any sample, which source and which token range to
//! read ([`SampleRef`]).
//!
//! # Why nothing is materialized
//! Megatron-Core builds its blend, document, sample and shuffle indices as arrays with an entry
//! per sample or per document, and caches them on disk: start-up time and memory grow with the
//! corpus. Here every answer is computed from O(#sources) numbers: a 10^12-token plan gives its
//! first batch in microseconds, any agent can answer for any sample, and a resumed job starts
//! at its cursor without rebuilding anything. Shuffling uses a keyed bijection
//! ([`Permutation`]) instead of a stored permutation; blending replays Megatron's rule
//! ([`Blender`]) instead of storing its result.
//!
//! # The contract
//! These rules define the stream; every agent and client relies on them, and tests pin them.
//!
//! 1. **Packing (Megatron GPTDataset).** Source `d` has `T_d` tokens: its documents
//!    concatenated in stored order. Sample `k` of an epoch of `d` is tokens
//!    `[k * seq_len, k * seq_len + seq_len + 1)`, across document boundaries. Consecutive
//!    samples overlap by one token, so every token but the first is a label exactly once per
//!    epoch. An epoch has `S_d = (T_d - 1) / seq_len` samples (Megatron's count with
//!    `add_extra_token_to_sequence` and a dropped partial last sample); a source with
//!    `T_d <= seq_len` is rejected by name.
//! 2. **Shuffle.** With `shuffle` (the default), epoch `e` of source `d` visits its samples in
//!    the order of the [`Permutation`] of `[0, S_d)` keyed by `(seed, d, e)`: every epoch of
//!    every source is shuffled differently, and the same seed gives the same order everywhere.
//!    Without, samples come in stored order. (Megatron shuffles with numpy's generator over
//!    stored indices; dquant's orders differ from Megatron's, by design, to avoid them.)
//! 3. **Blend.** Weights are normalized to sum to 1. Global sample `i` comes from source
//!    `argmax_d (w_d * max(i, 1) - count_d(i))`, ties to the lowest `d`, where `count_d(i)` is
//!    the number of samples `0..i` drawn from `d`: Megatron-Core's `build_blending_indices`,
//!    in the same `f64` arithmetic. The `j`-th sample drawn from `d` is its per-source sample
//!    `j`: epoch `j / S_d`, position `j % S_d`. A heavily weighted source wraps into more
//!    epochs; a lightly weighted one may not finish its first.
//! 4. **Length.** `samples = N` gives `N` global samples. Otherwise `epochs = E` (default 1)
//!    gives `E * Σ_d S_d`; with one source that is exactly `E` epochs of it. A cursor's `epoch`
//!    is `consumed_samples / Σ_d S_d`.
//! 5. **Sharding.** Global sample `i` goes to rank `i % world`: rank `r`'s local stream is
//!    global samples `r, r + world, r + 2 * world, ...`, and its batch `b` is local samples
//!    `[b * batch_size, (b + 1) * batch_size)`. Every sample goes to exactly one rank. With
//!    `drop_last`, every rank stops after `floor(N / (world * batch_size))` full batches, so
//!    ranks stay in lockstep; without, every sample is delivered, the last batch may be short
//!    and ranks may differ by one sample.
//! 6. **Cursor.** [`Cursor::consumed_samples`] counts global samples consumed by all ranks
//!    together (Megatron's `consumed_samples`). From a cursor, the rest of the stream is the
//!    global samples from its watermark on that it does not list as `delivered`, and rank `r`
//!    takes the `k`-th of them when `(consumed_samples + k) % world == r`: for a cursor saved
//!    between steps (a multiple of `world`, nothing delivered past it) that is exactly the rest
//!    of the uninterrupted stream, and for any cursor every remaining sample goes to exactly
//!    one rank. [`merge_cursors`] makes one cursor of the cursors of all the sub-ranks of a run
//!    (ranks × DataLoader workers, each at its own position), so a job resumes on another
//!    topology with nothing lost and nothing repeated ([`resume`]).
//!
//! # Cost
//! [`Schedule::new`] is O(#sources). Iterating a rank costs `world` draws of the blend per
//! sample (it advances through the other ranks' samples) plus an O(1) permutation lookup, and
//! O(#sources) memory. A draw scans the sources (O(#sources)); from 24 sources on it asks a
//! kinetic tournament (O(log #sources) nodes and those whose order changed); with one source
//! the walk is a jump. Starting at a cursor costs one climb to the blend's counts at it
//! ([`Blender::seek`]: microseconds for tens of sources, also the exact check of a cursor's
//! own counts); with renormalizing limits, a cursor without counts replays the blend from 0.
//! `cargo bench -p dquant-plan` measures each of these.
//!
//! # Example
//! ```
//! use dquant_plan::{Cursor, Plan, Schedule, SourceInfo};
//!
//! let plan = Plan::from_toml(r#"
//!     seq_len = 4
//!     batch_size = 2
//!     seed = 7
//!     world = 2
//!     rank = 1
//!     [[sources]]
//!     uri = "data/web"
//!     weight = 0.7
//!     [[sources]]
//!     uri = "data/code"
//!     weight = 0.3
//! "#).unwrap();
//! // The caller opened the sources and counted their tokens.
//! let schedule = Schedule::new(&plan, &[SourceInfo { tokens: 41 }, SourceInfo { tokens: 21 }])
//!     .unwrap();
//! assert_eq!(schedule.total_samples(), 10 + 5);
//! assert_eq!(schedule.rank_samples(), 7); // global samples 1, 3, 5, ..., 13
//! let mut it = schedule.iter_rank(Cursor::START).unwrap();
//! let first = it.next_batch().unwrap();
//! assert_eq!(first.samples.len(), 2);
//! assert_eq!(first.samples[0].global, 1);
//! assert_eq!(first.samples[0].tokens.end - first.samples[0].tokens.start, 5);
//! // Checkpoint, and resume: the same stream goes on.
//! let cursor = it.cursor();
//! assert_eq!(cursor.consumed_samples, 4);
//! let resumed: Vec<_> = schedule.iter_rank(cursor).unwrap().collect();
//! assert_eq!(resumed, it.collect::<Vec<_>>());
//! ```

#![warn(missing_docs)]

mod blend;
pub mod boundaries;
mod change;
pub mod climb;
mod cursor;
mod error;
mod kinetic;
pub mod limits;
mod locate;
pub mod mixture;
pub mod origins;
mod output;
pub mod permute;
mod plan;
pub mod resume;
mod schedule;
mod weights;

pub use blend::{Blender, JUMP_FROM};
pub use boundaries::{Boundaries, DocStarts, DocStartsError};
pub use change::check_plan_change;
pub use cursor::{cursor_trailer_len, Cursor};
pub use error::PlanError;
pub use locate::{BlendIndex, Location, BLEND_CHECKPOINT_EVERY};
pub use mixture::Mixture;
pub use origins::{OriginParts, OriginPiece, Origins, OriginsError};
pub use output::{OutputDType, WireCodec};
pub use permute::Permutation;
pub use plan::{Interpolate, Plan, Source, Stage, WhenExhausted};
pub use resume::{merge_cursors, MAX_DELIVERED};
pub use schedule::{source_use, Batch, RankIter, SampleRef, Schedule, SourceInfo, SourceUse};
pub use weights::{checked_weights, normalize_weights};
