//! Reaching an agent from another process: its address ([`AgentUri`]), its control plane
//! ([`Control`], gRPC) and its datasets as token sources ([`RemoteSource`], token ranges over
//! the data plane with readahead).
//!
//! Both ends of a chain use this crate: the host API opens plans and sources on agents with
//! it, and an agent near the host pulls ranges from an agent near the storage with it.

mod control;
mod open;
mod range_stream;
mod readahead;
mod replicas;
mod shutdown;
mod source;
mod uri;

pub use control::{
    connect_error, Control, Credentials, Watch, DEFAULT_RPC_TIMEOUT, TLS_CA_ENV, TLS_NAME_ENV,
    TOKEN_ENV,
};
pub use open::{dataset_uri, open_on_agent, open_source};
pub use range_stream::check_payload_len;
pub use readahead::ReadaheadConfig;
pub use replicas::{OnFailover, ReplicatedSource};
pub use shutdown::{resume_point, shutdown_message};
pub use source::{range_slot_size, RemoteSource};
pub use uri::{is_host_port, is_unix_authority, AgentUri, Transport, UriError};
