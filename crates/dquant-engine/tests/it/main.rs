//! The engine's integration tests, one binary (see `testkit/tests/it/structure.rs`).

mod kept_maps;
mod parallel_reads;
