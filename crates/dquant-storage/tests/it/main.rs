//! dquant-storage's integration tests, one module per concern, linked into one test binary:
//! each binary links the whole dependency stack, so one per crate keeps a clean test
//! build's link time and disk down (`testkit/tests/it/structure.rs` holds the rule).

mod block_cache;
mod cache;
mod chunk_sums;
mod common;
mod confinement;
mod faults;
mod lazy_index;
mod ranges;
mod root_conformance;
mod stored_values;
