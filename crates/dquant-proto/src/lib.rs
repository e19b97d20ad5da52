//! The agent's control plane (gRPC): `List`, `Stat`, `Open`, `OpenSource`, `Close`.
//!
//! Bulk data never travels in these messages. `Open` returns a session id, a one-time ticket
//! and the data port; the client then connects to the data port, presents the ticket in a
//! hello frame, and receives the stream as `dquant-transport` frames. Keeping the two planes
//! apart mirrors a DPU: control over a slow channel (DOCA Comch), data over DMA/RDMA.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

pub mod v1 {
    tonic::include_proto!("dquant.v1");
}
