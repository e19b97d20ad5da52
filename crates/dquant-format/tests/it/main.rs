//! dquant-format's integration tests, one module per concern, linked into one test binary:
//! each binary links the whole dependency stack, so one per crate keeps a clean test
//! build's link time and disk down (`testkit/tests/it/structure.rs` holds the rule).

mod block_corruption;
mod block_file;
mod common;
mod megatron;
mod proptests;
mod ranked;
mod threads;
