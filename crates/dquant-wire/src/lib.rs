//! The data plane's byte formats, and nothing that moves them.
//!
//! Bulk data streams as a sequence of [frames](frame): a fixed 32-byte header with a sequence
//! number and a crc32c, then at most [`frame::MAX_PAYLOAD`] bytes (1 MiB, the DPU buffer size
//! of the original design). Frames carry [records](record): batches, token ranges, the hello
//! and range requests.
//!
//! Why a crate of its own: the engine encodes batch records and the transports carry them, so
//! both need these types; here, below both, neither depends on the other. Like the codec and
//! the plan, it is sans I/O: parsers and encoders over byte slices, testable without a socket.

mod error;
pub mod frame;
pub mod record;
pub mod sizes;

pub use frame::{payload_crc, payload_crc_append, FrameHeader, FrameKind, WireError};
pub use record::{BatchHeader, Hello, RangeHeader, RecordError};
