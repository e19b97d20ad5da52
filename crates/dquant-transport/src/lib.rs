//! The data plane: how encoded token batches move from an agent to a consumer.
//!
//! Bulk data never travels inside control-plane (gRPC) messages. It streams as a sequence of
//! [frames](frame): a fixed 32-byte header with a sequence number and a crc32c, then at most
//! [`frame::MAX_PAYLOAD`] bytes (1 MiB, the DPU buffer size of the original design). The
//! receiver checks magic, header crc, sequence (no gap, no repeat) and payload crc before it
//! hands a byte to anyone, so garbage on the data port is an error, never data.
//!
//! Buffers come from a [`BufferPool`] allocated once, like the registered-memory pools of an
//! RDMA NIC: a steady stream allocates nothing per frame, and a consumer that stops returning
//! buffers stalls the producer (back-pressure) instead of growing memory.
//!
//! The frame layer is transport-neutral: [`FrameWriter`]/[`FrameReader`] work over any
//! `std::io::Write`/`Read` (a [`DataStream`] today: TCP, or TLS over TCP). The shared-memory ring and RDMA transports
//! carry the same frames in slots instead of a byte stream.

mod conn;
mod error;
// The byte formats this crate carries, where every caller has always found them.
pub use dquant_wire::{frame, record};
pub mod connect;
mod io;
pub mod loopback;
pub mod memory;
mod pool;
pub mod receive;
pub mod ring;
pub mod shm;
pub mod sink;
mod stream;
pub mod tcp;
pub mod tls;

pub use conn::DataStream;
pub use connect::{connect, ConnectError, Endpoint, Kind, RingShape, Transport, TRANSPORTS};
pub use dquant_wire::{
    BatchHeader, FrameHeader, FrameKind, Hello, RangeHeader, RecordError, WireError,
};
pub use io::{FrameReader, FrameWriter, Pacer, MAX_FRAMES_AT_ONCE};
pub use pool::{BufferPool, PooledBuf};
pub use receive::{BatchSource, ReceiveError, RecordView};
pub use sink::{BatchSink, SinkError};
pub use stream::RecordReader;
pub use tls::{ClientTls, ServerTls, TlsError};
