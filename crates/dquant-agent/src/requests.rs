//! What several handlers check of a request, answered as gRPC statuses: a limit it passes, the
//! wire codec a range session asks for.
//!
//! Apart from `grpc` so that the handlers' helpers elsewhere (`megatron`) use them without
//! importing the service.

use dquant_plan::WireCodec;
use tonic::Status;

use crate::limits::LimitError;
use crate::Shared;

pub(crate) fn over_limit(e: LimitError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The wire codec a range session asked for (`auto+lz4` when it asked for none), parsed and
/// checked against the agent's limits.
pub(crate) fn range_wire_codec(shared: &Shared, requested: &str) -> Result<WireCodec, Status> {
    let codec = match requested {
        "" => "auto+lz4",
        c => c,
    };
    let wire: WireCodec = codec
        .parse()
        .map_err(|e| Status::invalid_argument(format!("wire_codec: {e}")))?;
    shared
        .config
        .limits
        .check_wire("wire_codec", wire)
        .map_err(over_limit)?;
    // Ranges are read in any order and by several readers: each is compressed alone (a
    // plan's `transport` codec becomes zstd at a level fitted to the link, at most its own:
    // serve_ranges does that, knowing it was a stream).
    Ok(wire)
}
