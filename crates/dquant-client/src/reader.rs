//! [`Reader`]: one rank's batches of a plan, from any transport, through one path.
//!
//! Every batch arrives from a [`BatchSource`] as a record: checked against the plan's shape,
//! then either taken whole where it is (a ring slot the agent wrote, a heap record this
//! process made) or copied and decoded from the stream into a heap record (TCP frames in the
//! wire codec). The reader then hands it out borrowed ([`Reader::next_batch`]), owned
//! ([`Reader::next_owned`]) or as bytes ([`Reader::read`]), and keeps the cursor.

use std::time::Duration;

use dquant_codec::kernels::store_plain;
use dquant_codec::{Compression, Decoder};
use dquant_engine::{doc_section, origin_section, plain_codec, Pipeline, SourceError, TokenSource};
use dquant_plan::{Cursor, DocStarts, Origins, OutputDType, Plan, Schedule, Source, SourceUse};
use dquant_proto::v1::{OpenReply, OpenRequest, StreamPosition, SubscribeRequest};
use dquant_remote::{open_source, AgentUri, Control, Credentials, Transport, DEFAULT_RPC_TIMEOUT};
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::{BatchHeader, BatchSource, RecordView};

use crate::batch::{tokens_of, Batch, OwnedBatch, RecordPool};
use crate::inproc::InProcess;
use crate::{shm, ClientError};

/// A plan opened as a shared stream: every consumer that opens the same plan with the same
/// name (or subscribes to it by name) gets the same batches, made once on the agent. The
/// tensor-parallel and pipeline ranks of one data-parallel rank share one stream this way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    /// The stream's name, unique per tenant on the agent (e.g. `"job42/dp3"`).
    pub name: String,
    /// Consumers the stream waits for before its first batch (this one included), at most
    /// the agent's ticket lifetime; 0 or 1 starts at once.
    pub group: u32,
}

/// An agent session a reader streams, closed on the agent if the reader stops early.
pub(crate) struct AgentSession {
    control: Control,
    id: u64,
    /// The session's ticket: `Close` must show it.
    ticket: Vec<u8>,
}

/// Streams one rank's batches of a plan.
pub struct Reader {
    source: Box<dyn BatchSource>,
    session: Option<AgentSession>,
    /// The plan's resolved schedule, when it runs in this process.
    schedule: Option<Schedule>,
    transport: Option<Transport>,
    output: OutputDType,
    sample_len: usize,
    batch_size: usize,
    /// Ranks of the plan.
    world: u32,
    rank_batches: u64,
    rank_samples: u64,
    /// Samples in one epoch of each source (empty when an agent did not say).
    per_epoch: Vec<u64>,
    /// Whether the source said the stream ended.
    ended: bool,
    /// The batch at hand: its record (header, then `batch_len` payload bytes).
    record: Option<RecordView>,
    batch_len: usize,
    batch_index: u64,
    samples_in_batch: usize,
    /// The cursor once the batch at hand is consumed.
    batch_cursor: Cursor,
    /// Where the stream started: batch headers carry only `consumed_samples`, the rest of a
    /// cursor (what it lists as delivered) follows from this one.
    start: Cursor,
    /// Bytes of the cursor trailer an agent's batch records carry (0 or the plan's).
    cursor_len: usize,
    /// Whether batch records carry document starts (the plan has boundaries).
    boundaries: bool,
    /// Bytes a batch record's trailer may take ([`Plan::trailer_bound`]).
    trailer_bound: u64,
    /// The document starts of the batch at hand, when the plan has boundaries.
    docs: Option<DocStarts>,
    /// Whether batch records carry origins (the plan has provenance), and the batch at
    /// hand's.
    provenance: bool,
    origins: Option<Origins>,
    /// Bytes of the batch at hand already handed out by `read`.
    read_pos: usize,
    /// Position after the last batch fully handed out.
    cursor: Cursor,
    /// Heap records for batches decoded here, and given back when their batches drop.
    pool: RecordPool,
    decoder: Decoder,
    payload: Vec<u8>,
    decoded: Vec<u32>,
}

/// A batch's trailer, split: its document starts, its origins, and the cursor trailer.
type Trailer<'t> = (Option<DocStarts>, Option<Origins>, &'t [u8]);

/// Where the reader's stream comes from, for [`Reader::new`].
pub(crate) struct Origin {
    pub(crate) source: Box<dyn BatchSource>,
    pub(crate) session: Option<AgentSession>,
    pub(crate) schedule: Option<Schedule>,
    pub(crate) transport: Option<Transport>,
    pub(crate) start: Cursor,
    pub(crate) rank_batches: u64,
    pub(crate) rank_samples: u64,
    pub(crate) per_epoch: Vec<u64>,
}

impl Reader {
    /// Runs `plan` in this process, starting at `cursor` ([`Cursor::START`] for the beginning).
    /// Sources are local paths (Megatron prefixes, `.dqb` files, or raw files with a `dtype`)
    /// or `dquant://` URIs of datasets on agents.
    pub fn local(plan: &Plan, cursor: Cursor) -> Result<Self, ClientError> {
        Self::local_with(plan, cursor, |_, s| open_source(s, None, ""))
    }

    /// Runs `plan` in this process over sources opened by `open`.
    pub fn local_with(
        plan: &Plan,
        cursor: Cursor,
        open: impl FnMut(usize, &Source) -> Result<Box<dyn TokenSource>, SourceError>,
    ) -> Result<Self, ClientError> {
        let pipeline = Pipeline::open(plan, cursor, open)?;
        let schedule = pipeline.schedule().clone();
        let pool = RecordPool::default();
        let origin = Origin {
            start: pipeline.cursor(),
            rank_batches: schedule.rank_batches(),
            rank_samples: schedule.rank_samples(),
            per_epoch: (0..schedule.sources())
                .map(|d| schedule.samples_per_epoch(d))
                .collect(),
            source: Box::new(InProcess::new(
                Box::new(pipeline),
                plan.output,
                pool.clone(),
            )),
            session: None,
            schedule: Some(schedule),
            transport: None,
        };
        Ok(Self::new(origin, plan, pool))
    }

    /// Opens `plan` on the agent at `agent` and connects its data plane: TCP frames or a
    /// shared-memory ring, as [`AgentUri::transport`] says. The tenant token and TLS come
    /// from the environment (`DQUANT_TOKEN`, `DQUANT_TLS_CA`, [`Credentials::from_env`]).
    pub fn remote(agent: &AgentUri, plan: &Plan, cursor: Cursor) -> Result<Self, ClientError> {
        let creds = Credentials::from_env().map_err(ClientError::Connect)?;
        Self::remote_with(agent, plan, cursor, &creds)
    }

    /// [`Reader::remote`] with `creds` instead of the environment's.
    pub fn remote_with(
        agent: &AgentUri,
        plan: &Plan,
        cursor: Cursor,
        creds: &Credentials,
    ) -> Result<Self, ClientError> {
        Self::remote_opened(agent, plan, cursor, creds, None)
    }

    /// Opens `plan` on `agent` as the shared stream `share` (or joins the tenant's stream of
    /// that name, which must run the same plan and hold `cursor` in its window): every
    /// consumer of the stream gets the same batches, made once ([`Share`]).
    pub fn remote_shared(
        agent: &AgentUri,
        plan: &Plan,
        cursor: Cursor,
        share: &Share,
        creds: &Credentials,
    ) -> Result<Self, ClientError> {
        Self::remote_opened(agent, plan, cursor, creds, Some(share))
    }

    /// Joins the shared stream `share` another consumer of this tenant opened on `agent`, at
    /// `at` (a batch boundary still in the stream's window) or, with `None`, at its current
    /// cursor. The plan comes from the agent.
    pub fn subscribe_with(
        agent: &AgentUri,
        share: &str,
        at: Option<&Cursor>,
        creds: &Credentials,
    ) -> Result<Self, ClientError> {
        let control = Control::connect_with(&agent.authority, DEFAULT_RPC_TIMEOUT, creds)
            .map_err(ClientError::Connect)?;
        let reply = control
            .subscribe(SubscribeRequest {
                share: share.to_string(),
                at: at.map(|c| StreamPosition {
                    epoch: c.epoch,
                    consumed_samples: c.consumed_samples,
                }),
            })
            .map_err(ClientError::from_agent)?;
        let plan = match Plan::from_json(&reply.plan_json) {
            Ok(p) => p,
            Err(e) => {
                let _ = control.close(reply.session, &reply.ticket);
                let m = format!("agent sent share {share:?}'s plan unreadable: {e}");
                return Err(ClientError::Agent(m));
            }
        };
        let start = at.cloned().unwrap_or(Cursor::START);
        Self::attach(agent, control, reply, &plan, start, true)
    }

    fn remote_opened(
        agent: &AgentUri,
        plan: &Plan,
        cursor: Cursor,
        creds: &Credentials,
        share: Option<&Share>,
    ) -> Result<Self, ClientError> {
        plan.validate()?;
        let control = Control::connect_with(&agent.authority, DEFAULT_RPC_TIMEOUT, creds)
            .map_err(ClientError::Connect)?;
        let reply = control
            .open(OpenRequest {
                plan_json: plan.to_json(),
                epoch: cursor.epoch,
                consumed_samples: cursor.consumed_samples,
                blend: cursor.blend.clone(),
                delivered: cursor.delivered.clone(),
                share: share.map(|s| s.name.clone()).unwrap_or_default(),
                share_group: share.map_or(0, |s| s.group),
            })
            .map_err(ClientError::from_agent)?;
        Self::attach(agent, control, reply, plan, cursor, share.is_some())
    }

    /// Connects the data plane of the session `reply` opened, starting from `cursor` (moved
    /// to where the agent says the stream starts); `shared`: a shared stream's subscriber.
    fn attach(
        agent: &AgentUri,
        control: Control,
        reply: OpenReply,
        plan: &Plan,
        cursor: Cursor,
        shared: bool,
    ) -> Result<Self, ClientError> {
        let transport = agent.transport();
        let mut endpoint = shm::endpoint(agent, &control, plan, &reply)?;
        endpoint.shared = shared;
        let source = match dquant_transport::connect(transport, &endpoint) {
            Ok(s) => s,
            Err(e) => {
                let _ = control.close(reply.session, &reply.ticket);
                return Err(ClientError::from_connect(e));
            }
        };
        let origin = Origin {
            source,
            session: Some(AgentSession {
                control,
                id: reply.session,
                ticket: reply.ticket.clone(),
            }),
            schedule: None,
            transport: Some(transport),
            start: cursor.moved_to(reply.start_epoch, reply.start_consumed_samples),
            rank_batches: reply.rank_batches,
            rank_samples: reply.rank_samples,
            per_epoch: reply.samples_per_epoch.clone(),
        };
        Ok(Self::from_origin(origin, plan))
    }

    /// A reader of the stream `o` describes (records arriving in place, as from a ring).
    pub(crate) fn from_origin(o: Origin, plan: &Plan) -> Self {
        Self::new(o, plan, RecordPool::default())
    }

    fn new(o: Origin, plan: &Plan, pool: RecordPool) -> Self {
        Reader {
            source: o.source,
            session: o.session,
            schedule: o.schedule,
            transport: o.transport,
            output: plan.output,
            sample_len: plan.sample_len(),
            batch_size: plan.batch_size as usize,
            world: plan.world,
            rank_batches: o.rank_batches,
            rank_samples: o.rank_samples,
            per_epoch: o.per_epoch,
            ended: false,
            record: None,
            batch_len: 0,
            batch_index: 0,
            samples_in_batch: 0,
            batch_cursor: o.start.clone(),
            read_pos: 0,
            cursor: o.start.clone(),
            start: o.start,
            cursor_len: plan.cursor_trailer_len(),
            boundaries: plan.boundaries.is_some(),
            trailer_bound: plan.trailer_bound(),
            docs: None,
            provenance: plan.provenance,
            origins: None,
            pool,
            decoder: Decoder::new(),
            payload: Vec::new(),
            decoded: Vec::new(),
        }
    }

    /// The dtype batches land in.
    pub fn output(&self) -> OutputDType {
        self.output
    }

    /// Tokens per sample: `seq_len + 1`.
    pub fn sample_len(&self) -> usize {
        self.sample_len
    }

    /// Ranks of the plan (`world`): a cursor's `consumed_samples` counts all of them.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Batches in this rank's whole stream (from the start, not from the cursor).
    pub fn rank_batches(&self) -> u64 {
        self.rank_batches
    }

    /// Samples in this rank's whole stream.
    pub fn rank_samples(&self) -> u64 {
        self.rank_samples
    }

    /// How much of each source the stream consumed up to [`cursor`](Reader::cursor): samples
    /// and epochs, by source in plan order. `None` when unknown (an agent too old to say its
    /// sources' epoch sizes).
    pub fn source_use(&self) -> Option<Vec<SourceUse>> {
        if self.per_epoch.is_empty() {
            return None;
        }
        dquant_plan::source_use(&self.per_epoch, &self.cursor)
    }

    /// The plan's resolved schedule, when it runs in this process.
    pub fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// Whether the plan runs on an agent.
    pub fn is_offloaded(&self) -> bool {
        self.session.is_some()
    }

    /// Whether batches come from a shared stream's ring the agent writes once for every
    /// subscriber on this host (a shared-memory subscriber that could join it).
    pub fn reads_shared_ring(&self) -> bool {
        self.source.shared_ring()
    }

    /// How batches arrive: `None` in-process, else the transport from the agent.
    pub fn transport(&self) -> Option<Transport> {
        self.transport
    }

    /// Where a resumed reader would continue: after the last batch handed out whole.
    pub fn cursor(&self) -> Cursor {
        self.cursor.clone()
    }

    /// Waits at most `timeout` for the next batch to be at hand: true once the next
    /// [`next_owned`](Reader::next_owned), [`next_batch`](Reader::next_batch) or first batch
    /// of a [`read`](Reader::read) will not wait on the agent (a batch, the end or an error
    /// has arrived), false when `timeout` ran out first. Nothing is consumed: the cursor
    /// stays, and a false answer can simply be followed by another call.
    ///
    /// This is how a caller that must stay responsive while an agent is slow waits in
    /// slices: an interpreter checks for Ctrl-C between calls. In-process plans are always
    /// ready (making a batch is work, not waiting). Over TCP a batch whose first bytes have
    /// arrived counts as ready, though its last bytes may still be on the way.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ClientError> {
        if self.read_pos < self.batch_len || self.ended {
            return Ok(true);
        }
        Ok(self.source.wait_ready(timeout)?)
    }

    /// Takes the next batch record from the source; false at the end.
    fn fill(&mut self) -> Result<bool, ClientError> {
        self.record = None;
        self.batch_len = 0;
        self.read_pos = 0;
        if self.ended {
            return Ok(false);
        }
        let Some(h) = self.source.next_header()? else {
            self.ended = true;
            return Ok(false);
        };
        self.check_shape(&h)?;
        let bytes = h.tokens() * self.output.itemsize();
        let record = match self.source.take_record() {
            Some(r) => self.check_in_place(&h, r, bytes)?,
            None => self.receive(&h, bytes)?,
        };
        let trailer = &record[RECORD_HEADER_LEN + bytes..][..h.trailer_len as usize];
        let (docs, origins, blend) = self.parse_trailer(&h, trailer)?;
        let mut cursor = self.start.moved_to(h.cursor_epoch, h.cursor_consumed);
        if !blend.is_empty() {
            cursor.blend = blend
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect();
        }
        self.docs = docs;
        self.origins = origins;
        self.batch_cursor = cursor;
        self.record = Some(record);
        self.batch_len = bytes;
        self.batch_index = h.index;
        self.samples_in_batch = h.samples as usize;
        Ok(true)
    }

    /// Refuses a batch record whose shape the plan cannot produce (a corrupt or hostile agent).
    fn check_shape(&self, h: &BatchHeader) -> Result<(), ClientError> {
        let (sample_len, batch_size) = (self.sample_len, self.batch_size);
        if h.sample_len as usize != sample_len || h.samples == 0 || h.samples as usize > batch_size
        {
            return Err(ClientError::Agent(format!(
                "agent sent a batch of {} samples of {} tokens; the plan has batches of up to {batch_size} samples of {sample_len}",
                h.samples, h.sample_len
            )));
        }
        if u64::from(h.trailer_len) > self.trailer_bound {
            return Err(ClientError::Agent(format!(
                "agent sent batch {} with a {}-byte trailer; the plan's is at most {} bytes",
                h.index, h.trailer_len, self.trailer_bound
            )));
        }
        Ok(())
    }

    /// Splits a batch's trailer into its document starts (when the plan has boundaries), its
    /// origins (when it has provenance) and the cursor trailer (none, or the plan's length).
    fn parse_trailer<'t>(
        &self,
        h: &BatchHeader,
        trailer: &'t [u8],
    ) -> Result<Trailer<'t>, ClientError> {
        let bad = |e: String| ClientError::Agent(format!("agent sent batch {}: {e}", h.index));
        let (docs, rest) = if self.boundaries {
            let seq_len = (self.sample_len - 1) as u32;
            let (d, used) = doc_section::decode(trailer, h.samples as usize, seq_len)
                .map_err(|e| bad(e.to_string()))?;
            (Some(d), &trailer[used..])
        } else {
            (None, trailer)
        };
        let (origins, rest) = if self.provenance {
            let (o, used) = origin_section::decode(rest, h.samples as usize, h.sample_len)
                .map_err(|e| bad(e.to_string()))?;
            (Some(o), &rest[used..])
        } else {
            (None, rest)
        };
        if !rest.is_empty() && rest.len() != self.cursor_len {
            return Err(bad(format!(
                "a {}-byte cursor trailer; the plan's is {} bytes",
                rest.len(),
                self.cursor_len
            )));
        }
        Ok((docs, origins, rest))
    }

    /// A record taken where it lies must already be the tokens in the output dtype.
    fn check_in_place(
        &self,
        h: &BatchHeader,
        record: RecordView,
        bytes: usize,
    ) -> Result<RecordView, ClientError> {
        let want = plain_codec(self.output);
        if h.codec != want
            || h.data_len() as usize != bytes
            || record.len() < RECORD_HEADER_LEN + h.payload_len as usize
        {
            return Err(ClientError::Agent(format!(
                "shared-memory ring: batch {} holds {} bytes of {} in a {}-byte record; expected {bytes} bytes of {want}",
                h.index,
                h.payload_len,
                h.codec,
                record.len()
            )));
        }
        Ok(record)
    }

    /// Copies the payload of `h` out of the stream into a heap record, decoding the wire
    /// codec into the output dtype when it is not that already.
    fn receive(&mut self, h: &BatchHeader, bytes: usize) -> Result<RecordView, ClientError> {
        let n = h.tokens();
        let (data, trailer) = (h.data_len() as usize, h.trailer_len as usize);
        dquant_remote::check_payload_len(h.codec, n, h.data_len())
            .map_err(ClientError::from_agent)?;
        // The batch's tokens in the output dtype, then the cursor trailer, as in place.
        let mut rec = self.pool.get(RECORD_HEADER_LEN + bytes + trailer);
        let out = &mut rec.bytes_mut()[RECORD_HEADER_LEN..];
        let width = self.output.width();
        let direct = h.codec.compression == Compression::None && h.codec.width == width;
        if direct && data == bytes {
            // The wire already holds the output dtype: frames copy straight into the batch.
            self.source.read_payload(&mut out[..bytes + trailer])?;
        } else {
            self.payload.resize(h.payload_len as usize, 0);
            self.source.read_payload(&mut self.payload)?;
            self.decoded.resize(n, 0);
            let bad = |e| ClientError::Agent(format!("batch {}: {e}", h.index));
            self.decoder
                .decode(h.codec, &self.payload[..data], &mut self.decoded)
                .map_err(bad)?;
            let (tokens, rest) = out.split_at_mut(bytes);
            store_plain(width, &self.decoded, tokens).map_err(bad)?;
            rest[..trailer].copy_from_slice(&self.payload[data..]);
        }
        Ok(Box::new(rec))
    }

    /// The batch at hand's payload bytes.
    fn batch_bytes(&self) -> &[u8] {
        match &self.record {
            Some(r) => &r[RECORD_HEADER_LEN..][..self.batch_len],
            None => &[],
        }
    }

    fn view(&self) -> Batch<'_> {
        Batch {
            index: self.batch_index,
            samples: self.samples_in_batch,
            sample_len: self.sample_len,
            tokens: tokens_of(self.output, self.batch_bytes()),
            docs: self.docs.as_ref(),
            origins: self.origins.as_ref(),
        }
    }

    /// The next batch, borrowed from the reader (valid until the next call); `None` at the end.
    /// The cursor moves past it. Over shared memory the view is the ring slot the agent wrote;
    /// the slot goes back to the agent at the next call (or when the reader is dropped).
    ///
    /// A batch that [`Reader::read`] has only partly delivered must be finished with `read`
    /// first: `next_batch` then fails rather than skip the rest of it.
    pub fn next_batch(&mut self) -> Result<Option<Batch<'_>>, ClientError> {
        self.check_whole("next_batch")?;
        if !self.fill()? {
            return Ok(None);
        }
        self.read_pos = self.batch_len;
        self.cursor = self.batch_cursor.clone();
        Ok(Some(self.view()))
    }

    /// The next batch as an [`OwnedBatch`], which may outlive later batches and the reader;
    /// `None` at the end. The cursor moves past it. Nothing is copied to hand it over: over
    /// shared memory it is a view of the ring slot, else the buffer the batch was made in
    /// (the reader takes a fresh or recycled one for the next batch).
    pub fn next_owned(&mut self) -> Result<Option<OwnedBatch>, ClientError> {
        self.check_whole("next_owned")?;
        if !self.fill()? {
            return Ok(None);
        }
        self.cursor = self.batch_cursor.clone();
        // The batch leaves the reader: the next `read` or `next_batch` fills anew.
        let len = std::mem::take(&mut self.batch_len);
        let Some(record) = self.record.take() else {
            return Err(ClientError::Usage("next_owned: no batch at hand".into()));
        };
        Ok(Some(OwnedBatch {
            index: self.batch_index,
            samples: self.samples_in_batch,
            sample_len: self.sample_len,
            output: self.output,
            cursor: self.cursor.clone(),
            docs: self.docs.take(),
            origins: self.origins.take(),
            record,
            len,
            in_ring: self.source.shared_memory(),
        }))
    }

    /// Over shared memory, copies out the batches that [`OwnedBatch`]es have kept for long
    /// now, rather than in the next [`next_owned`](Reader::next_owned) (see
    /// [`dquant_transport::ring::RingConsumer::make_room`]); a no-op otherwise. A caller
    /// whose batches other threads may write (an interpreter) calls this while they cannot.
    pub fn make_room(&mut self) -> Result<(), ClientError> {
        Ok(self.source.make_room()?)
    }

    /// Refuses `op` (a call that takes a whole batch) while `read` has delivered only part
    /// of the current one: it would skip the rest.
    fn check_whole(&self, op: &str) -> Result<(), ClientError> {
        if self.read_pos < self.batch_len {
            return Err(ClientError::Usage(format!(
                "{op}: batch {} is partly read ({} of {} bytes); finish it with read() first",
                self.batch_index, self.read_pos, self.batch_len
            )));
        }
        Ok(())
    }

    /// Copies the next bytes of the stream (batches back to back, in the output dtype) into
    /// `buf`, as the original `read(fd, buf)`. Returns the bytes written; 0 at the end.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut n = 0;
        while n < buf.len() {
            if self.read_pos == self.batch_len && !self.fill()? {
                break;
            }
            let src = &self.batch_bytes()[self.read_pos..];
            let k = src.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&src[..k]);
            n += k;
            self.read_pos += k;
            if self.read_pos == self.batch_len {
                self.cursor = self.batch_cursor.clone();
            }
        }
        Ok(n)
    }

    /// Ends an offloaded session now (dropping the reader does too).
    pub fn close(self) {}
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.source.shutdown();
        if let (Some(s), false) = (&self.session, self.ended) {
            let _ = s.control.close(s.id, &s.ticket);
        }
    }
}

#[cfg(test)]
mod tests;
