//! The agent's control plane (gRPC): `List`, `Stat`, `Open`, `OpenSource`, `Close`, `Index`, `Watch`.
//!
//! Bulk data never travels in these messages. `Open` returns a session id, a one-time ticket
//! and the data port; the client then connects to the data port, presents the ticket in a
//! hello frame, and receives the stream as `dquant-transport` frames. Keeping the two planes
//! apart mirrors a DPU: control over a slow channel (DOCA Comch), data over DMA/RDMA.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

pub mod v1 {
    tonic::include_proto!("dquant.v1");
}

/// Most values one `Index` reply carries (2 MiB of u64s, under gRPC's 4 MiB message limit).
pub const MAX_INDEX_VALUES: u32 = 1 << 18;

/// The checksum an `IndexReply` carries: crc32c of its values as little-endian u64s. The
/// agent computes it and the client checks it, in this one place.
pub fn index_crc(values: &[u64]) -> u32 {
    values
        .iter()
        .fold(0, |c, v| crc32c::crc32c_append(c, &v.to_le_bytes()))
}
