//! Plan sessions: a plan's batches streamed to the consumer that claimed the session, over
//! TCP frames or into the consumer's shared-memory ring. Both are a [`BatchSink`] for the
//! one produce loop ([`crate::produce`]); only the codec policy differs (a ring carries the
//! output dtype: memory is not a link). A subscriber of a shared stream gets the stream's
//! records relayed into the same sinks ([`crate::share::relay`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use dquant_engine::plain_codec;
use dquant_plan::WireCodec;
use dquant_transport::tcp::TcpBatchSink;
use dquant_transport::{BatchSink, DataStream, FrameWriter};

use crate::faults::Site;
use crate::metrics::Meter;
use crate::produce::{run, Producer, Stats};
use crate::sessions::Work;
use crate::share::{relay, FrameOutlet, RingOutlet};
use crate::stream_end::ended;
use crate::stream_error::StreamError;
use crate::Shared;

/// Streams a plan's batches over `conn` in the plan's wire codec until the end, an error, a
/// disconnect, `cancel` or the agent's drain, with `prefetch_frames` frames of 1 MiB ahead of the socket, each frame
/// sent when `pacer` (the tenant's share of the link) lets it.
pub(crate) fn stream_plan(
    work: Work,
    conn: DataStream,
    cancel: Arc<AtomicBool>,
    shared: &Shared,
    meter: Meter,
    pacer: Option<Box<dyn dquant_transport::Pacer>>,
) -> Result<Stats, StreamError> {
    let prefetch = shared.config.prefetch_frames;
    let (pipeline, output, wire) = match work {
        Work::Plan {
            pipeline,
            output,
            wire,
        } => (pipeline, output, wire),
        Work::Subscriber { sub } => {
            let mut out = FrameOutlet::new(FrameWriter::new(conn).with_pacer(pacer));
            let (outcome, stats) = relay(&sub, &mut out, &cancel, &meter);
            return ended(outcome, stats);
        }
        Work::Source { .. } => {
            let m = "a source session streams ranges, not batches".to_string();
            let _ = FrameWriter::new(conn).fail(&m);
            return Err(StreamError::Failed(m));
        }
    };
    let mut sink =
        TcpBatchSink::start(conn, prefetch, cancel.clone(), pacer).map_err(StreamError::Thread)?;
    let mut producer = Producer::new(pipeline, output, wire)
        .with_meter(meter)
        .with_faults(shared.faults.clone(), Site::Session)
        .encoding_ahead(prefetch.saturating_mul(dquant_transport::frame::MAX_PAYLOAD))
        .fitting_level();
    let drain = &shared.draining;
    let (outcome, stats) = run(&mut producer, &mut sink, &cancel, drain, Instant::now);
    let sent = sink.join();
    ended(outcome, stats).and_then(|stats| {
        sent.map(|()| stats)
            .map_err(|e| StreamError::Stopped(e.to_string()))
    })
}

/// Streams a plan's batches into `sink`, a transport in memory the consumer reads in place
/// (a shared-memory ring, the loopback queue), until the end, an error, a consumer that goes
/// away, or `cancel`. Each record carries the tokens already in the output dtype: memory is
/// not a link. A source session is refused with `not_ranges`.
pub(crate) fn stream_in_memory(
    work: Work,
    sink: &mut dyn BatchSink,
    cancel: &AtomicBool,
    shared: &Shared,
    meter: Meter,
    not_ranges: &str,
) -> Result<Stats, StreamError> {
    let (pipeline, output) = match work {
        Work::Plan {
            pipeline, output, ..
        } => (pipeline, output),
        Work::Subscriber { sub } => {
            let mut out = RingOutlet { sink };
            let (outcome, stats) = relay(&sub, &mut out, cancel, &meter);
            return ended(outcome, stats);
        }
        Work::Source { .. } => {
            sink.fail(not_ranges);
            return Err(StreamError::Failed(not_ranges.into()));
        }
    };
    let plain = WireCodec::Fixed(plain_codec(output));
    let mut producer = Producer::new(pipeline, output, plain)
        .with_meter(meter)
        .with_faults(shared.faults.clone(), Site::Session);
    let (outcome, stats) = run(&mut producer, sink, cancel, &shared.draining, Instant::now);
    ended(outcome, stats)
}
