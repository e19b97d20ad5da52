//! A subscriber's delivery: the stream's records, from its position on, into its own
//! transport (TCP frames in the wire codec, or its shared-memory ring in the output dtype).
//!
//! The relay is the produce loop's counterpart for a subscriber: the same [`BatchSink`]
//! calls, with records copied from the window instead of made. It ends as the stream ends
//! (every record, then the end or the stream's error), or when its consumer goes away or is
//! closed; either way its [`Subscription`] drops and the producer no longer waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dquant_transport::tcp::MAX_FRAME_AGE;
use dquant_transport::{BatchSink, SinkError};

use super::{End, Next, Subscription, RECHECK};
use crate::metrics::Meter;
use crate::produce::{Outcome, Stats};

/// Which form of the records a subscriber's transport carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// The plan's wire codec (TCP).
    Wire,
    /// The output dtype, read in place (a shared-memory ring).
    Plain,
}

/// Relays `sub`'s records into `sink` until the stream's end, a consumer that goes away, or
/// `cancel`; each record counted in `meter`.
pub(crate) fn relay(
    sub: &Subscription,
    sink: &mut dyn BatchSink,
    form: Form,
    cancel: &AtomicBool,
    meter: &Meter,
) -> (Outcome, Stats) {
    let mut stats = Stats::default();
    let stream = sub.stream();
    if let Some(max) = sink.max_record_len() {
        let room = stream.info.plain_room;
        if form == Form::Plain && room > max {
            let m = format!(
                "the transport's records hold {max} bytes; this plan's batches need {room} ({})",
                stream.output
            );
            sink.fail(&m);
            return (Outcome::Failed(m), stats);
        }
    }
    // The first wait is short: a transport holding a partial frame hands it on once it is
    // MAX_FRAME_AGE old.
    let mut wait = MAX_FRAME_AGE;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return (Outcome::Stopped("closed by the client".into()), stats);
        }
        let next = stream.next(sub.session, wait);
        let step = match next {
            Some(Next::Record(slot, _)) => slot
                .bytes(form, stream.output)
                .map_err(SinkError::Failed)
                .and_then(|bytes| deliver(sink, &bytes).map(|()| (slot.tokens, bytes.len()))),
            Some(Next::Wait) => {
                wait = RECHECK;
                match sink.flush_if_idle(Instant::now()) {
                    Ok(()) => continue,
                    Err(e) => Err(e),
                }
            }
            Some(Next::End(end)) => return (ended(sink, end), stats),
            None => Err(SinkError::Gone("left the stream".into())),
        };
        match step {
            Ok((tokens, bytes)) => {
                stream.advance(sub.session);
                meter.add(1, tokens, bytes as u64);
                stats.records += 1;
                stats.tokens += tokens;
                stats.wire_bytes += bytes as u64;
                wait = MAX_FRAME_AGE;
            }
            Err(SinkError::Gone(m)) => return (Outcome::Stopped(m), stats),
            Err(e) => {
                let m = e.to_string();
                sink.fail(&m);
                return (Outcome::Failed(m), stats);
            }
        }
    }
}

fn deliver(sink: &mut dyn BatchSink, record: &[u8]) -> Result<(), SinkError> {
    sink.reserve(record.len())?.copy_from_slice(record);
    sink.commit(record.len())
}

/// Ends the subscriber's transport as the stream ended.
fn ended(sink: &mut dyn BatchSink, end: End) -> Outcome {
    match end {
        End::Finished => match sink.finish() {
            Ok(()) => Outcome::Finished,
            Err(e) => Outcome::Stopped(e.to_string()),
        },
        End::Failed(m) | End::Stopped(m) => {
            sink.fail(&m);
            Outcome::Failed(m)
        }
        End::Drained(m) => {
            sink.fail(&m);
            Outcome::Drained(m)
        }
    }
}
