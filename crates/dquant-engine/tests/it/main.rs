//! The engine's integration tests, one binary (see `testkit/tests/it/structure.rs`).

mod common;
mod int32_sign;
mod kept_maps;
mod parallel_reads;
