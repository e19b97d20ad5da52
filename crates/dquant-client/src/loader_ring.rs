//! DataLoader workers that make their batches straight into a shared-memory ring the training
//! loop's process reads in place.
//!
//! A PyTorch DataLoader worker is a process of its own, and moving each batch from it to the
//! loop through Python (pickling, a queue, even a shared slot filled and described from
//! Python) costs more per batch than making the batch does. So a worker here is a small
//! agent: the loop's process creates a ring for it, as it does for an agent's session over
//! shared memory, and hands it over on a Unix socket pair; the worker runs its sub-rank's plan
//! in-process and makes each batch record straight into a slot
//! ([`dquant_engine::plain_record`]), and the loop's [`Reader`] takes the records as it takes
//! an agent's (checked against the plan, viewed in place). Neither side runs any Python per
//! batch.
//!
//! Besides the ring's descriptors, the socket carries one frame from the worker once its plan
//! is open: the stream's facts ([`Facts`]), or the error that kept the plan from opening. An
//! error while producing goes the way an agent's does (a frame on the socket, then the ring
//! marked aborted, after the last complete batch); a worker that dies closes the socket,
//! which the ring's wait watches.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use dquant_engine::{plain_record, plain_record_len, Pipeline};
use dquant_plan::{Cursor, Plan};
use dquant_remote::open_source;
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::ring::RingConsumer;
use dquant_transport::shm::{RingOffer, RingSink, RingSource};
use dquant_transport::{
    BatchSink, BufferPool, FrameKind, FrameReader, FrameWriter, Hello, SinkError, WireError,
};

use crate::reader::Origin;
use crate::{shm, ClientError, Reader};

/// What a worker tells the loop once its plan is open: where the stream starts and how long
/// it is, which the loop's reader reports as an agent's session reply would. JSON: it is sent
/// once a pass, and the cursor's fields are already JSON's everywhere else.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Facts {
    /// The cursor the pipeline starts at (with the blend's counts there).
    pub start: Cursor,
    pub rank_batches: u64,
    pub rank_samples: u64,
    /// Samples in one epoch of each source, in plan order.
    pub per_epoch: Vec<u64>,
}

impl Facts {
    fn of(p: &Pipeline) -> Self {
        let s = p.schedule();
        Facts {
            start: p.cursor(),
            rank_batches: s.rank_batches(),
            rank_samples: s.rank_samples(),
            per_epoch: (0..s.sources()).map(|d| s.samples_per_epoch(d)).collect(),
        }
    }
}

/// The worker's side: runs `plan` from `cursor` in this process and makes every batch into
/// the ring the loop hands over on `sock`, until the stream ends or the loop closes the
/// ring. The loop gets every error too, after the last complete batch; one returned here
/// was already sent (or there was nobody to send it to).
pub fn serve_loader_ring(plan: &Plan, cursor: Cursor, sock: UnixStream) -> Result<(), ClientError> {
    // The plan first, while the loop creates the ring: workers open theirs at once.
    let opened = Pipeline::open(plan, cursor, |_, s| open_source(s, None, ""));
    let mut pipeline = match opened {
        Ok(p) => p,
        Err(e) => {
            let _ = FrameWriter::new(&sock).fail(&e.to_string());
            return Err(e.into());
        }
    };
    let offer = RingOffer::receive(&sock).map_err(|e| ring_usage(e.to_string()))?;
    let facts = serde_json::to_vec(&Facts::of(&pipeline))
        .map_err(|e| ClientError::Usage(format!("DataLoader worker: {e}")))?;
    FrameWriter::new(&sock).send(FrameKind::Data, &facts)?;
    let mut sink = offer
        .accept(sock, Arc::new(AtomicBool::new(false)))
        .map_err(|e| ring_usage(e.to_string()))?;
    let room = plain_record_len(&pipeline, plan.output);
    loop {
        let made = match sink.reserve(room) {
            Ok(r) => plain_record(&mut pipeline, plan.output, r),
            Err(SinkError::Gone(_)) => return Ok(()), // the loop closed its ring
            Err(e) => return fail(&mut sink, ClientError::Usage(e.to_string())),
        };
        let len = match made {
            Ok(Some((h, _))) => RECORD_HEADER_LEN + h.payload_len as usize,
            Ok(None) => return sink.finish().map_err(|e| ClientError::Usage(e.to_string())),
            Err(e) => return fail(&mut sink, e.into()),
        };
        match sink.commit(len) {
            Ok(()) => {}
            Err(SinkError::Gone(_)) => return Ok(()),
            Err(e) => return fail(&mut sink, ClientError::Usage(e.to_string())),
        }
    }
}

/// Sends `e` to the loop (which raises it after the last complete batch) and returns it.
fn fail(sink: &mut RingSink, e: ClientError) -> Result<(), ClientError> {
    sink.fail(&e.to_string());
    Err(e)
}

fn ring_usage(m: String) -> ClientError {
    ClientError::Usage(format!("DataLoader worker ring: {m}"))
}

impl Reader {
    /// The loop's side: a reader of `plan`'s batches as the DataLoader worker at the other end
    /// of `sock` makes them ([`serve_loader_ring`], which has the cursor to start from), in a
    /// ring of `slots` slots this process creates and hands over. Waits until the worker has
    /// opened the plan, and fails with the worker's error if it could not.
    pub fn from_loader_ring(
        plan: &Plan,
        sock: UnixStream,
        slots: u32,
    ) -> Result<Self, ClientError> {
        plan.validate()?;
        let (mut ring, fds) = RingConsumer::create_with(slots, shm::slot_size(plan), false)
            .map_err(|e| ring_usage(e.to_string()))?;
        let hello = Hello {
            session: 0,
            ticket: [0; 16],
            token: None,
        };
        fds.send_with(&sock, &hello.encode())
            .map_err(|e| ring_usage(e.to_string()))?;
        drop(fds); // the worker holds its own copies now
        let facts = read_facts(&sock)?;
        let peer = sock
            .try_clone()
            .map_err(|e| ring_usage(format!("dup: {e}")))?;
        ring.set_peer(OwnedFd::from(peer));
        let origin = Origin {
            source: Box::new(RingSource::new(ring, sock)),
            session: None,
            schedule: None,
            transport: None,
            start: facts.start,
            rank_batches: facts.rank_batches,
            rank_samples: facts.rank_samples,
            per_epoch: facts.per_epoch,
        };
        Ok(Reader::from_origin(origin, plan))
    }
}

/// The worker's first frame: its stream's facts, or why its plan did not open.
fn read_facts(sock: &UnixStream) -> Result<Facts, ClientError> {
    let pool = BufferPool::new(1, MAX_PAYLOAD);
    let mut buf = pool.get();
    let gone = || ClientError::Agent("DataLoader worker went away before opening its plan".into());
    match FrameReader::new(sock).next_into(&mut buf) {
        Ok(true) => serde_json::from_slice(&buf).map_err(|e| {
            ClientError::Agent(format!(
                "DataLoader worker sent its stream's facts unreadable: {e}"
            ))
        }),
        Ok(false) | Err(WireError::Truncated { .. }) => Err(gone()),
        Err(WireError::Remote(m)) => Err(ClientError::Agent(m)),
        Err(e) => Err(ClientError::Agent(format!("DataLoader worker: {e}"))),
    }
}
