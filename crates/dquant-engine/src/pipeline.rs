//! The plan pipeline: a plan's schedule driven over its sources, one batch of tokens at a time.
//!
//! This is the work an agent offloads, and the very same code runs it in-process: the local
//! reader (`dquant_client::Reader`) and the agent's sessions both pull batches from a [`Pipeline`], then
//! differ only in what they do with the tokens (store them in the output dtype here, encode
//! them with the wire codec there). That is why offloaded and local runs are byte-identical.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use dquant_codec::Width;
use dquant_plan::{
    Batch, Cursor, Origins, Plan, RankIter, SampleRef, Schedule, Source, SourceInfo,
};

use crate::batch::{BatchInfo, TokenBatch};
use crate::batch_reads::{self, source_error};
use crate::doc_starts::{BatchTokens, DocFinder};
use crate::fit::check_fits;
use crate::origins;
use crate::read_pace::{BatchReads, ReadPace};
use crate::worker_pool::WorkerPool;
use crate::EngineError;
use dquant_storage::source::{SourceError, TokenSource};
use dquant_storage::SignCheck;

/// A plan bound to opened sources, positioned at a cursor.
pub struct Pipeline {
    schedule: Schedule,
    iter: RankIter,
    uris: Vec<String>,
    sources: Vec<Box<dyn TokenSource>>,
    sample_len: usize,
    tokens: Vec<u32>,
    provenance: Vec<(usize, u64)>,
    /// Per source: the ranges of this batch's samples from it, and where each lands.
    ranges: Vec<Vec<Range<u64>>>,
    slots: Vec<Vec<usize>>,
    read: Vec<u32>,
    /// The width every source stores its tokens in, when they all store the same one
    /// ([`TokenSource::stored_width`]): batches in that width are then copied, not converted.
    stored: Option<Width>,
    /// Reads a batch on several threads, when set ([`Pipeline::set_worker_pool`]).
    pool: Option<Arc<WorkerPool>>,
    /// How long this stream's reads take a byte: whether a batch is worth the pool.
    pace: ReadPace,
    /// How the plan's document boundaries are found, and the last batch's, when it has them.
    docs: Option<DocFinder>,
    /// Bytes a batch record's trailer may take ([`Plan::trailer_bound`]).
    trailer_bound: usize,
    /// Samples this stream has taken from each source since it opened.
    drawn: Vec<u64>,
    /// The last batch's origins, when the plan has `provenance`.
    origins: Option<Origins>,
    /// Whether batches are narrowed from maps their sources keep, until one declines
    /// ([`Pipeline::narrow_kept`]).
    try_kept: bool,
    /// The token ranges of a run of samples [`Pipeline::narrow_kept`] hands a source at once
    /// (kept between batches: no allocation a batch).
    kept_ranges: Vec<Range<u64>>,
}

impl Pipeline {
    /// Validates `plan`, opens each source with `open_source` and positions the stream at
    /// `cursor`.
    pub fn open(
        plan: &Plan,
        cursor: Cursor,
        open_source: impl FnMut(usize, &Source) -> Result<Box<dyn TokenSource>, SourceError>,
    ) -> Result<Self, EngineError> {
        Self::open_until(plan, cursor, open_source, &mut || false)
    }

    /// [`Pipeline::open`] that a server can stop: `stop` is asked before each source is
    /// opened and while the schedule replays the blend to `cursor`, and the open fails with
    /// [`dquant_plan::PlanError::Stopped`] (sources) or the plan's own `Stopped` once it says
    /// so.
    pub fn open_until(
        plan: &Plan,
        cursor: Cursor,
        mut open_source: impl FnMut(usize, &Source) -> Result<Box<dyn TokenSource>, SourceError>,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Self, EngineError> {
        plan.validate()?;
        let mut sources = Vec::with_capacity(plan.sources.len());
        for (index, s) in plan.sources.iter().enumerate() {
            if stop() {
                return Err(EngineError::Stopped);
            }
            sources.push(open_source(index, s).map_err(|source| EngineError::Source {
                index,
                uri: s.uri.clone(),
                source,
            })?);
        }
        let infos: Vec<SourceInfo> = sources
            .iter()
            .map(|d| SourceInfo { tokens: d.tokens() })
            .collect();
        let schedule = Schedule::new(plan, &infos)?;
        let iter = schedule.iter_rank_until(cursor, stop)?;
        let n = sources.len();
        let stored = sources[0].stored_width();
        let stored = stored.filter(|&w| sources.iter().all(|s| s.stored_width() == Some(w)));
        let uris: Vec<String> = plan.sources.iter().map(|s| s.uri.clone()).collect();
        let docs = DocFinder::of(plan);
        if let Some(f) = &docs {
            f.check(&sources, &uris)?;
        }
        if plan.provenance {
            origins::check_indexes(&sources, &uris, "provenance = true")?;
        }
        Ok(Pipeline {
            schedule,
            iter,
            uris,
            sources,
            sample_len: plan.sample_len(),
            tokens: Vec::new(),
            provenance: Vec::new(),
            ranges: vec![Vec::new(); n],
            slots: vec![Vec::new(); n],
            read: Vec::new(),
            stored,
            pool: None,
            pace: ReadPace::default(),
            docs,
            trailer_bound: usize::try_from(plan.trailer_bound()).unwrap_or(usize::MAX),
            drawn: vec![0; n],
            origins: plan.provenance.then(Origins::new),
            try_kept: true,
            kept_ranges: Vec::new(),
        })
    }

    /// Reads each batch's samples on `pool`'s threads (when its sources allow it, as local
    /// datasets do, and its reads are slow enough to pay for the hand-offs: see
    /// [`WorkerPool::min_share_of`]), or one after another on the caller's thread (`None`,
    /// the default). The batches are the same either way.
    pub fn set_worker_pool(&mut self, pool: Option<Arc<WorkerPool>>) {
        self.pool = pool;
    }

    /// How the batches so far were read with a pool: on this stream's thread alone (fast
    /// reads), or spread over the pool (reads slow enough to pay for it). Both 0 without a
    /// pool, and for batches narrowed from kept maps.
    pub fn batch_reads(&self) -> BatchReads {
        self.pace.counts()
    }

    /// The pool set by [`set_worker_pool`](Pipeline::set_worker_pool), if any.
    pub fn worker_pool(&self) -> Option<&Arc<WorkerPool>> {
        self.pool.as_ref()
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Where the stream stands: after the last batch returned.
    pub fn cursor(&self) -> Cursor {
        self.iter.cursor()
    }

    pub fn sample_len(&self) -> usize {
        self.sample_len
    }

    /// Bytes a batch record's trailer may take after its tokens: the document starts, when
    /// the plan has boundaries, and the cursor trailer ([`Plan::trailer_bound`]).
    pub fn trailer_bound(&self) -> usize {
        self.trailer_bound
    }

    /// No token of any source exceeds this: checks against a width that holds it can be
    /// skipped.
    pub fn max_token_bound(&self) -> u32 {
        self.sources
            .iter()
            .map(|s| s.max_token_bound())
            .max()
            .unwrap_or(0)
    }

    /// Samples this stream has taken from each source since it opened (batches made, in
    /// plan order): what an agent's per-source metrics count.
    pub fn drawn(&self) -> &[u64] {
        &self.drawn
    }

    /// The plan's source URIs, as the plan spelled them.
    pub fn uris(&self) -> &[String] {
        &self.uris
    }

    /// The plan's source URI `d`, as the plan spelled it (for error messages).
    pub fn uri(&self, d: usize) -> &str {
        &self.uris[d]
    }

    /// The next batch written into `out` in `width` (byte-aligned), every token checked to
    /// fit it exactly as [`check_fits`] reports; returns where the batch sits, or `None` at
    /// the end. `out` must hold a full batch (`batch_size × sample_len` tokens); the batch
    /// fills its first `samples × sample_len × width` bytes.
    ///
    /// When every source stores `width` itself (a uint16 dataset into a `u16` batch), each
    /// sample is one copy into `out` from the map its source keeps, or else one read
    /// straight into it: no conversion, and no check, since a stored value cannot exceed its
    /// own width. Otherwise tokens are narrowed from the kept maps, or read as u32 and
    /// encoded.
    pub fn next_batch_into(
        &mut self,
        width: Width,
        out: &mut [u8],
    ) -> Result<Option<BatchInfo>, EngineError> {
        let bw = width
            .byte_width()
            .expect("next_batch_into takes byte-aligned widths");
        let l = self.sample_len;
        if self.stored == Some(width) {
            let Some(b) = self.iter.next_batch() else {
                return Ok(None);
            };
            count_drawn(&mut self.drawn, &b.samples);
            let need = b.samples.len() * l * bw;
            if out.len() < need {
                return Err(EngineError::Usage(format!(
                    "next_batch_into: {} bytes for a batch of {need}",
                    out.len()
                )));
            }
            // From the maps the sources keep, a copy a sample and no syscall.
            if self.narrow_kept(&b.samples, width, &mut out[..need]) {
                return self.written(&b, width, &out[..need]).map(Some);
            }
            // Consecutive samples of one source that continue each other (packing makes a
            // sample start on the last token of the one before) are one contiguous range of
            // the file: one vectored read fills all their rows.
            batch_reads::read_stored(
                &mut self.sources,
                &self.uris,
                self.pool.as_deref(),
                &mut self.pace,
                &b.samples,
                &mut out[..need],
                l * bw,
                bw,
            )?;
            return self.written(&b, width, &out[..need]).map(Some);
        }
        let Some(b) = self.iter.next_batch() else {
            return Ok(None);
        };
        count_drawn(&mut self.drawn, &b.samples);
        let need = b.samples.len() * l * bw;
        if out.len() < need {
            return Err(EngineError::Usage(format!(
                "next_batch_into: {} bytes for a batch of {need}",
                out.len()
            )));
        }
        if self.narrow_kept(&b.samples, width, &mut out[..need]) {
            return self.written(&b, width, &out[..need]).map(Some);
        }
        // Unchecked: narrowing checks every token itself, so a separate pass over the batch
        // first (`next_batch_checked`) would check it twice (5% of the agent's CPU on the
        // shared-memory path, bench/profile). Into at most 31 bits it checks int32's sign
        // too, so the reads leave that to it ([`SignCheck`]).
        let sign = if width.max_token() <= i32::MAX as u32 {
            SignCheck::ByNarrowing
        } else {
            SignCheck::Here
        };
        self.fill_batch(&b, sign)?;
        if let Err(source) = dquant_codec::encode_width(width, &self.tokens, &mut out[..need]) {
            if sign == SignCheck::ByNarrowing {
                // A negative int32 is named as every read names it: read again, checked.
                self.read_by_source(l, SignCheck::Here)?;
            }
            // A token over `width`: named as the check names it (the first in batch order,
            // with its source and offset).
            check_fits(&self.filled(&b), l, width, "")?;
            return Err(EngineError::Encode {
                index: b.index,
                source,
            });
        }
        Ok(Some(self.filled(&b).info()))
    }

    /// [`next_batch`](Pipeline::next_batch), every token checked to fit `width` as
    /// [`check_fits`] reports (so an agent fails exactly where, and as, the in-process reader
    /// would). The check is skipped when the sources' bound proves it cannot fail.
    pub fn next_batch_checked(
        &mut self,
        width: Width,
    ) -> Result<Option<TokenBatch<'_>>, EngineError> {
        let bound = self.max_token_bound();
        let l = self.sample_len;
        let Some(b) = self.next_batch()? else {
            return Ok(None);
        };
        if bound > width.max_token() {
            check_fits(&b, l, width, "")?;
        }
        Ok(Some(b))
    }

    /// The next batch's tokens; `None` at the end of the rank's stream.
    pub fn next_batch(&mut self) -> Result<Option<TokenBatch<'_>>, EngineError> {
        let Some(b) = self.iter.next_batch() else {
            return Ok(None);
        };
        count_drawn(&mut self.drawn, &b.samples);
        self.read_batch(b).map(Some)
    }

    /// Batch `b` of the schedule read from its sources.
    fn read_batch(&mut self, b: Batch) -> Result<TokenBatch<'_>, EngineError> {
        self.fill_batch(&b, SignCheck::Here)?;
        Ok(self.filled(&b))
    }

    /// Reads batch `b` of the schedule from its sources into `self.tokens` (int32's sign
    /// checked where `sign` says), with its documents and origins where the plan asks.
    fn fill_batch(&mut self, b: &Batch, sign: SignCheck) -> Result<(), EngineError> {
        let l = self.sample_len;
        self.provenance.clear();
        for d in 0..self.sources.len() {
            self.ranges[d].clear();
            self.slots[d].clear();
        }
        for (k, s) in b.samples.iter().enumerate() {
            self.provenance.push((s.source, s.tokens.start));
            self.ranges[s.source].push(s.tokens.clone());
            self.slots[s.source].push(k);
        }
        resize_checked(&mut self.tokens, b.samples.len() * l)?;
        batch_reads::announce(&self.sources, &self.ranges);
        let concurrently = batch_reads::read_tokens_concurrently(
            &self.sources,
            &self.uris,
            self.pool.as_deref(),
            &mut self.pace,
            &b.samples,
            &mut self.tokens,
            l,
        )?;
        if !concurrently {
            // Timed when a pool could take the next batches: the pace decides whether to.
            let started = self.pool.is_some().then(Instant::now);
            self.read_by_source(l, sign)?;
            if let Some(t) = started {
                self.pace.read_alone(self.tokens.len() * 4, t.elapsed());
            }
        }
        if let Some(f) = &mut self.docs {
            let tokens = BatchTokens::U32(&self.tokens);
            f.fill(&b.samples, tokens, &self.sources, &self.uris)?;
        }
        if let Some(o) = &mut self.origins {
            origins::fill(o, &b.samples, &self.sources, &self.uris)?;
        }
        Ok(())
    }

    /// Batch `b` as [`Pipeline::fill_batch`] read it.
    fn filled(&self, b: &Batch) -> TokenBatch<'_> {
        TokenBatch {
            index: b.index,
            tokens: &self.tokens,
            samples: b.samples.len(),
            cursor: self.iter.cursor(),
            provenance: &self.provenance,
            uris: &self.uris,
            docs: self.docs.as_ref().map(DocFinder::docs),
            origins: self.origins.as_ref(),
        }
    }

    /// Narrows `samples` into `out` (rows of `width`) from the maps their sources keep
    /// ([`TokenSource::narrow_kept`]): `true` when every sample was. Once a source declines,
    /// the pipeline reads as usual from then on (it keeps no map, or its tokens did not
    /// narrow cleanly, and the usual read names what was wrong).
    ///
    /// Each run of samples from one source goes in one call, its rows being next to each
    /// other in `out`: the source then prefetches a sample's first lines while it narrows
    /// the one before. Shuffled samples lie far apart, and one call a sample left each
    /// sample's first lines to a cache miss (`cargo bench -p dquant-storage --bench
    /// read_paths -- kept_map`: 3.2 G tokens/s without the prefetch, 5.4 with it).
    fn narrow_kept(&mut self, samples: &[SampleRef], width: Width, out: &mut [u8]) -> bool {
        if !self.try_kept {
            return false;
        }
        let row = out.len() / samples.len().max(1);
        let mut ranges = std::mem::take(&mut self.kept_ranges);
        let mut rest = out;
        let all = samples.chunk_by(|a, b| a.source == b.source).all(|run| {
            let n = (run.len() * row).min(rest.len());
            let (rows, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            ranges.clear();
            ranges.extend(run.iter().map(|s| s.tokens.clone()));
            self.sources[run[0].source].narrow_kept(&ranges, width, rows)
        });
        self.kept_ranges = ranges;
        self.try_kept = all;
        all
    }

    /// What a batch written as `bytes` (rows of `width`) tells: its document starts and
    /// origins, when the plan has them, and where it sits in the stream.
    fn written(&mut self, b: &Batch, width: Width, bytes: &[u8]) -> Result<BatchInfo, EngineError> {
        if let Some(f) = &mut self.docs {
            let tokens = BatchTokens::Stored { width, bytes };
            f.fill(&b.samples, tokens, &self.sources, &self.uris)?;
        }
        if let Some(o) = &mut self.origins {
            origins::fill(o, &b.samples, &self.sources, &self.uris)?;
        }
        Ok(BatchInfo {
            index: b.index,
            samples: b.samples.len(),
            cursor: self.iter.cursor(),
            docs: self.docs.as_ref().map(|f| f.docs().clone()),
            origins: self.origins.clone(),
        })
    }

    /// Reads the batch laid out in `ranges` and `slots` one source at a time, one request
    /// per source: a remote source answers all its samples in one round trip.
    fn read_by_source(&mut self, l: usize, sign: SignCheck) -> Result<(), EngineError> {
        for d in 0..self.sources.len() {
            if self.ranges[d].is_empty() {
                continue;
            }
            let slots = &self.slots[d];
            let err = |e| source_error(&self.uris, d, e);
            let first = slots[0];
            if slots.iter().enumerate().all(|(i, &k)| k == first + i) {
                // The source's samples are adjacent in the batch (always so for one source):
                // read them straight into place.
                let dst = &mut self.tokens[first * l..(first + slots.len()) * l];
                read_ranges(&mut *self.sources[d], &self.ranges[d], dst, sign).map_err(err)?;
            } else {
                resize_checked(&mut self.read, slots.len() * l)?;
                let dst = &mut self.read;
                read_ranges(&mut *self.sources[d], &self.ranges[d], dst, sign).map_err(err)?;
                for (i, &k) in slots.iter().enumerate() {
                    self.tokens[k * l..(k + 1) * l].copy_from_slice(&self.read[i * l..(i + 1) * l]);
                }
            }
        }
        Ok(())
    }
}

/// `source`'s tokens of `ranges` into `out`, int32's sign checked where `sign` says.
fn read_ranges(
    source: &mut dyn TokenSource,
    ranges: &[Range<u64>],
    out: &mut [u32],
    sign: SignCheck,
) -> Result<(), SourceError> {
    match sign {
        SignCheck::ByNarrowing => source.read_ranges_to_narrow(ranges, out),
        _ => source.read_ranges(ranges, out),
    }
}

fn count_drawn(drawn: &mut [u64], samples: &[SampleRef]) {
    for s in samples {
        drawn[s.source] += 1;
    }
}

/// Resizes a token buffer whose size comes from the plan, failing (not aborting) when the
/// memory is not there: a process that hosts other work outlives one absurd plan.
fn resize_checked(v: &mut Vec<u32>, len: usize) -> Result<(), EngineError> {
    let more = len.saturating_sub(v.len());
    v.try_reserve_exact(more).map_err(|_| {
        EngineError::Usage(format!(
            "cannot allocate {len} tokens for one batch ({} bytes)",
            len.saturating_mul(4)
        ))
    })?;
    v.resize(len, 0);
    Ok(())
}
