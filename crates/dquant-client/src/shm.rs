//! Where an offloaded session's batches come from: the agent's data plane, and for the
//! shared-memory transport the ring this process sizes for the plan, creates and hands to the
//! agent over its Unix socket ([`dquant_transport::connect`]); the reader then takes each
//! batch where the agent wrote it.
//!
//! The agent writes every batch record (a header and the tokens in the plan's output dtype)
//! into one slot, so a batch is viewed in place: no copy, no decode, and no syscall while the
//! agent keeps the ring non-empty.

use std::path::PathBuf;

use dquant_plan::Plan;
use dquant_proto::v1::OpenReply;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::ring::layout::PAGE;
use dquant_transport::{Endpoint, RingShape};

use dquant_remote::{AgentUri, Control};

use crate::ClientError;

/// Bytes of batches a ring holds by default: the TCP path's default prefetch (8 frames of
/// 1 MiB).
pub const DEFAULT_RING_BYTES: u64 = 8 << 20;

/// The slot size for `plan`: one whole batch record (header, tokens in the output dtype and
/// the trailer: document starts and cursor counts), page aligned. Slots are sized to the batch rather than fixed at 1 MiB: a slot
/// holds exactly one batch, so a smaller one would not fit it and a larger one is memory
/// the batch never uses.
pub fn slot_size(plan: &Plan) -> u64 {
    // Saturating: an absurd plan gets an absurd slot size, which creating the ring refuses,
    // rather than a wrapped small one.
    let record = (RECORD_HEADER_LEN as u64)
        .saturating_add(plan.batch_bytes())
        .saturating_add(plan.trailer_bound());
    record.div_ceil(PAGE).saturating_mul(PAGE)
}

/// Slots in a ring of `slot_size` slots unless the address says `slots=N`: enough for
/// [`DEFAULT_RING_BYTES`], at least 4 (so the agent can run ahead while the consumer holds
/// one and wakes are batched) and at most 1024.
pub fn default_slots(slot_size: u64) -> u32 {
    shared_slots(slot_size, 1)
}

/// Slots for each of `readers` rings that one consumer reads in turn (a DataLoader's
/// sessions, one per worker): [`DEFAULT_RING_BYTES`] shared among them, at least 4 slots
/// each. The consumer takes one batch from each ring in turn, so together they run as far
/// ahead as one default ring; and as each ring is made and first touched per pass (its pages
/// zeroed, its producer filling it while the others open), a ring per reader the size of a
/// lone one cost 4 workers a fifth of their rate on 2 vCPU.
pub fn shared_slots(slot_size: u64, readers: u32) -> u32 {
    (DEFAULT_RING_BYTES / u64::from(readers.max(1)))
        .div_ceil(slot_size.max(1))
        .clamp(4, 1024) as u32
}

/// The Unix socket on this host of the agent at `authority`, where rings are handed over:
/// the address itself when it is one, else the one the agent reported in `reply`, if any.
pub(crate) fn agent_socket(authority: &str, reply: &OpenReply) -> Option<PathBuf> {
    if dquant_remote::is_unix_authority(authority) {
        return Some(PathBuf::from(authority));
    }
    (!reply.socket_path.is_empty()).then(|| PathBuf::from(&reply.socket_path))
}

/// Where the data plane of the session in `reply` is, and the ring to create for `plan`
/// if the transport is shared memory: the agent's Unix socket is the address itself, or the
/// one the agent reported.
pub(crate) fn endpoint(
    uri: &AgentUri,
    control: &Control,
    plan: &Plan,
    reply: &OpenReply,
) -> Result<Endpoint, ClientError> {
    let socket = agent_socket(&uri.authority, reply);
    let slot_size = slot_size(plan);
    Ok(Endpoint {
        agent: uri.authority.clone(),
        data_addr: control.data_addr(reply),
        socket,
        hello: control.hello(reply).map_err(ClientError::from_agent)?,
        ring: RingShape {
            slots: uri.slots.unwrap_or_else(|| default_slots(slot_size)),
            slot_size,
            verify: uri.verify,
        },
        tls: control.tls().cloned(),
        shared: false,
    })
}

#[cfg(test)]
mod tests {
    use super::{default_slots, shared_slots, DEFAULT_RING_BYTES};

    /// Rings read in turn share one default ring's bytes, never below 4 slots or above 1024.
    #[test]
    fn readers_in_turn_share_one_default_ring() {
        let slot = 132 << 10; // a batch of 8 × 2,048 int64 ids and its header
        assert_eq!(default_slots(slot), 63);
        assert_eq!(shared_slots(slot, 1), 63);
        assert_eq!(shared_slots(slot, 2), 32);
        assert_eq!(shared_slots(slot, 4), 16);
        assert_eq!(shared_slots(slot, 64), 4);
        assert_eq!(shared_slots(slot, 0), 63);
        assert_eq!(shared_slots(4096, 1), 1024);
        assert_eq!(shared_slots(DEFAULT_RING_BYTES, 3), 4);
    }
}
