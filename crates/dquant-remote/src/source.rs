//! A dataset on another agent as a [`TokenSource`]: token ranges asked for over the agent's
//! data plane, with readahead for sequential reads.

use std::ops::Range;

use dquant_proto::v1::{DatasetStat, OpenReply, OpenSourceRequest, StatRequest};
use dquant_storage::{check_ranges, SourceError, TokenSource};

use dquant_plan::WireCodec;
use dquant_transport::connect::connect_range_ring;
use dquant_transport::record::{MAX_RANGE_TOKENS, RECORD_HEADER_LEN};
use dquant_transport::ring::layout::PAGE;
use dquant_transport::{Endpoint, FrameWriter, RingShape};

use crate::control::{connect_error, Control};
use crate::range_stream::{RangeStream, Wire};
use crate::readahead::{read_ahead, ReadaheadConfig, Sequence, Served, Window};

/// A dataset served by another agent, read by token ranges over its data plane.
///
/// Reads that jump around (shuffled plans) are stop-and-wait: one request carries every range
/// of a read, so a batch costs one round trip per source. Reads that go on where the last one
/// ended (unshuffled plans: each sample starts on the last token of the one before) are
/// served from a readahead `Window` that keeps chunk requests in flight, so the link stays
/// busy; see [`ReadaheadConfig`].
pub struct RemoteSource {
    control: Control,
    session: u64,
    tokens: u64,
    max_token: u32,
    /// What the agent said of the dataset when the source opened.
    pub(crate) stat: DatasetStat,
    pub(crate) stream: RangeStream,
    readahead: ReadaheadConfig,
    seq: Sequence,
    /// Present while reading ahead.
    window: Option<Window>,
    /// Why the data stream is unusable: after any failed read, the answers still on it are
    /// unknown, so later reads refuse rather than return the wrong tokens.
    failed: Option<String>,
    pairs: Vec<(u64, u64)>,
}

impl RemoteSource {
    /// Opens `dataset` (`root/path`) on the agent `control` talks to.
    pub fn open(
        control: Control,
        dataset: StatRequest,
        wire_codec: &str,
    ) -> Result<Self, SourceError> {
        let reply = control.open_source(OpenSourceRequest {
            dataset: Some(dataset),
            wire_codec: wire_codec.into(),
        })?;
        Self::attach(control, &reply)
    }

    /// Connects to the range session `reply` opened (an `OpenSource`, or another open that
    /// serves a virtual dataset by ranges, as `OpenMegatron` does).
    pub fn attach(control: Control, reply: &OpenReply) -> Result<Self, SourceError> {
        let (writer, reader) = control.connect_data(reply)?;
        Ok(Self::with_wire(
            control,
            reply,
            Wire::Tcp { writer, reader },
        ))
    }

    /// As [`attach`](Self::attach), with the answers through a shared-memory ring of
    /// `shape` handed to the agent over its Unix socket `socket` (the agent must be on this
    /// host; `None`, an agent without one here, is an error). Every range asked for must fit one slot: its record header and its payload in
    /// the session's wire codec ([`range_slot_size`]); so such a source does not read ahead
    /// (its chunks would not fit), unless [`set_readahead`](Self::set_readahead) is given
    /// chunks that do.
    pub fn attach_ring(
        control: Control,
        reply: &OpenReply,
        socket: Option<std::path::PathBuf>,
        shape: RingShape,
    ) -> Result<Self, SourceError> {
        let endpoint = Endpoint {
            agent: control.authority().to_string(),
            data_addr: control.data_addr(reply),
            socket,
            hello: control.hello(reply)?,
            ring: shape,
            tls: None,
            shared: false,
        };
        let records = connect_range_ring(&endpoint).map_err(connect_error)?;
        let writer = records
            .requests()
            .try_clone()
            .map(FrameWriter::new)
            .map_err(|source| SourceError::Connect {
                addr: control.authority().to_string(),
                source,
            })?;
        let wire = Wire::Ring {
            writer,
            records,
            timeout: control.timeout(),
        };
        let mut source = Self::with_wire(control, reply, wire);
        source.readahead = ReadaheadConfig::OFF;
        Ok(source)
    }

    fn with_wire(control: Control, reply: &OpenReply, wire: Wire) -> Self {
        let tokens = reply.stat.as_ref().map_or(0, |s| s.tokens);
        let max_token = reply
            .stat
            .as_ref()
            .and_then(|s| s.stored_max_token)
            .unwrap_or(u32::MAX);
        RemoteSource {
            session: reply.session,
            control,
            tokens,
            max_token,
            stat: reply.stat.clone().unwrap_or_default(),
            stream: RangeStream::new(wire),
            readahead: ReadaheadConfig::DEFAULT,
            seq: Sequence::default(),
            window: None,
            failed: None,
            pairs: Vec::new(),
        }
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    pub fn control(&self) -> &Control {
        &self.control
    }

    /// Sets how this source reads ahead, from the next read on (`chunk_tokens` is clamped
    /// to 1..=[`MAX_RANGE_TOKENS`]). With `in_flight` 0, the next read drains what is in
    /// flight and every read after it is stop-and-wait.
    pub fn set_readahead(&mut self, mut config: ReadaheadConfig) {
        config.chunk_tokens = config.chunk_tokens.clamp(1, MAX_RANGE_TOKENS);
        self.readahead = config;
    }

    pub fn readahead(&self) -> ReadaheadConfig {
        self.readahead
    }

    /// Range requests sent to the agent so far (one per round trip when stop-and-wait; one
    /// per chunk when reading ahead).
    pub fn requests(&self) -> u64 {
        self.stream.requests()
    }

    /// Tokens asked of the agent so far, read ahead or not (chunks drained unused included).
    pub fn requested_tokens(&self) -> u64 {
        self.stream.requested_tokens()
    }

    fn read(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        let Served {
            ranges: done,
            tokens: mut at,
        } = read_ahead(
            &mut self.window,
            &mut self.seq,
            &mut self.stream,
            self.readahead,
            self.tokens,
            ranges,
            out,
        )?;
        if done < ranges.len() {
            if let Some(mut w) = self.window.take() {
                // The read left the sequence: what is in flight is of no use, but its
                // answers are on the stream ahead of any new one.
                w.drain(&mut self.stream)?;
            }
        }
        // Stop-and-wait for the rest.
        let mut ranges = &ranges[done..];
        while !ranges.is_empty() {
            let (chunk, rest) = ranges.split_at(
                ranges
                    .len()
                    .min(dquant_transport::record::MAX_REQUEST_RANGES),
            );
            self.pairs.clear();
            self.pairs
                .extend(chunk.iter().map(|r| (r.start, r.end - r.start)));
            self.stream.send(&self.pairs)?;
            for r in chunk {
                let n = (r.end - r.start) as usize;
                self.stream
                    .recv(r.start, r.end - r.start, Some(&mut out[at..at + n]))?;
                self.seq.note(r);
                at += n;
            }
            ranges = rest;
        }
        Ok(())
    }
}

impl TokenSource for RemoteSource {
    fn tokens(&self) -> u64 {
        self.tokens
    }

    fn max_token_bound(&self) -> u32 {
        self.max_token
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        check_ranges(ranges, out)?;
        if let Some(why) = &self.failed {
            return Err(SourceError::Agent(format!(
                "agent {}: the data stream of session {} failed earlier ({why}); reopen the source",
                self.control.authority(),
                self.session
            )));
        }
        let r = self.read(ranges, out);
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
            self.window = None;
        }
        r
    }
}

/// The slot size of a ring that carries answers of up to `tokens` tokens in `wire`: the
/// record header and the largest payload, page aligned.
pub fn range_slot_size(wire: WireCodec, tokens: u64) -> u64 {
    let tokens = usize::try_from(tokens).unwrap_or(usize::MAX);
    let payload = wire.max_encoded_len(tokens);
    let record = (RECORD_HEADER_LEN as u64).saturating_add(payload as u64);
    record.div_ceil(PAGE).saturating_mul(PAGE)
}

impl Drop for RemoteSource {
    fn drop(&mut self) {
        // Closing the socket ends the session on the agent; say so explicitly too, but do not
        // wait on an agent that may be gone.
        self.stream.shutdown();
    }
}
