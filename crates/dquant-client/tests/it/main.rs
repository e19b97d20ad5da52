//! dquant-client's integration tests, one module per concern, linked into one test binary:
//! each binary links the whole dependency stack, so one per crate keeps a clean test
//! build's link time and disk down (`testkit/tests/it/structure.rs` holds the rule).

mod bad_input;
mod bandwidth;
mod boundaries;
mod hostile;
mod index_rpc;
mod loader_ring;
mod local;
mod loopback;
mod megatron_agent;
mod observability;
mod offload;
mod panics;
mod provenance;
mod readahead;
mod replica_faults;
mod s3_root;
mod share;
mod shared_datasets;
mod shm;
mod storage_faults;
mod watch;
