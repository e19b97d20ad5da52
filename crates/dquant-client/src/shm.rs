//! The shared-memory transport, host side: this process sizes and creates a ring
//! ([`dquant_transport::ring`]) and hands it to the agent over the agent's Unix socket; the
//! reader then takes each batch where the agent wrote it
//! ([`dquant_transport::shm::RingSource`]).
//!
//! The agent writes every batch record (a header and the tokens in the plan's output dtype)
//! into one slot, so a batch is viewed in place: no copy, no decode, and no syscall while the
//! agent keeps the ring non-empty.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use dquant_plan::Plan;
use dquant_proto::v1::OpenReply;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::ring::layout::PAGE;
use dquant_transport::ring::{RingConsumer, RingError};
use dquant_transport::shm::RingSource;

use dquant_remote::{hello_of, AgentUri};

use crate::ClientError;

/// Bytes of batches a ring holds by default: the TCP path's default prefetch (8 frames of
/// 1 MiB).
pub const DEFAULT_RING_BYTES: u64 = 8 << 20;

/// The slot size for `plan`: one whole batch record (header and tokens in the output
/// dtype), page aligned. Slots are sized to the batch rather than fixed at 1 MiB: a slot
/// holds exactly one batch, so a smaller one would not fit it and a larger one is memory
/// the batch never uses.
pub fn slot_size(plan: &Plan) -> u64 {
    let record = RECORD_HEADER_LEN as u64 + plan.batch_bytes();
    record.div_ceil(PAGE) * PAGE
}

/// Slots in a ring of `slot_size` slots unless the address says `slots=N`: enough for
/// [`DEFAULT_RING_BYTES`], at least 4 (so the agent can run ahead while the consumer holds
/// one and wakes are batched) and at most 1024.
pub fn default_slots(slot_size: u64) -> u32 {
    DEFAULT_RING_BYTES.div_ceil(slot_size).clamp(4, 1024) as u32
}

fn connect_err(path: &Path) -> impl Fn(std::io::Error) -> ClientError + '_ {
    move |source| {
        ClientError::Connect(dquant_engine::SourceError::Connect {
            addr: path.display().to_string(),
            source,
        })
    }
}

/// Creates a ring for `plan`'s batches and hands it to the agent for the session in
/// `reply`: the agent writes batch records into it, and the returned source reads them in
/// place.
pub(crate) fn connect(
    uri: &AgentUri,
    plan: &Plan,
    reply: &OpenReply,
) -> Result<RingSource, ClientError> {
    let path = if uri.is_unix() {
        PathBuf::from(&uri.authority)
    } else if !reply.socket_path.is_empty() {
        PathBuf::from(&reply.socket_path)
    } else {
        return Err(ClientError::Usage(format!(
            "transport=shm: the agent at {} has no Unix socket; start it on this host with `dquant serve --socket PATH` and use that path as its address",
            uri.authority
        )));
    };
    let hello = hello_of(reply).map_err(ClientError::from_agent)?;
    let size = slot_size(plan);
    let slots = uri.slots.unwrap_or_else(|| default_slots(size));
    let ring_err = |e: RingError| ClientError::Agent(format!("shared-memory ring: {e}"));
    let (mut ring, fds) = RingConsumer::create_with(slots, size, uri.verify).map_err(ring_err)?;
    let sock = UnixStream::connect(&path).map_err(connect_err(&path))?;
    fds.send_with(&sock, &hello.encode()).map_err(ring_err)?;
    // Our copies of the descriptors go now: the agent holds its own.
    drop(fds);
    let peer = sock.try_clone().map_err(connect_err(&path))?;
    ring.set_peer(OwnedFd::from(peer));
    Ok(RingSource::new(ring, sock))
}
