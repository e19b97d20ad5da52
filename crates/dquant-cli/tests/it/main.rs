//! dquant-cli's integration tests, one module per concern, linked into one test binary:
//! each binary links the whole dependency stack, so one per crate keeps a clean test
//! build's link time and disk down (`testkit/tests/it/structure.rs` holds the rule).

mod agent;
mod cli;
mod deploy;
mod locate;
mod mount;
mod read;
mod replicas;
mod s3;
mod security;
mod shutdown;
mod tls;
