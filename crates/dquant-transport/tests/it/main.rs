//! dquant-transport's integration tests, one module per concern, linked into one test binary:
//! each binary links the whole dependency stack, so one per crate keeps a clean test
//! build's link time and disk down (`testkit/tests/it/structure.rs` holds the rule).

mod common;
mod fuzz_regressions;
mod ring;
mod shared_ring;
mod tcp;
mod tls;
