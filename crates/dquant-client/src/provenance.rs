//! Provenance of a plan's samples, in the terms of the datasets: which documents (and where in
//! them) a sample's tokens come from, and which samples read a given document.
//!
//! The plan layer answers in source token offsets ([`Schedule::locate`],
//! [`Schedule::samples_holding`]); this adds the sources' document indexes, opened as a local
//! run opens them ([`open_source`]), to turn offsets into `(document, offset)` and back. The
//! CLI's `dquant locate` and Python's `dquant.locate` / `dquant.samples_of` both go through it.

use std::ops::Range;

use dquant_engine::{EngineError, TokenSource};
use dquant_plan::{BlendIndex, Plan, Schedule, SourceInfo};
use dquant_remote::open_source;
use serde::Serialize;

use crate::audit::{self, SourceAudit};
use crate::error::ClientError;

/// One contiguous run of a sample's tokens inside one document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Piece {
    /// The source's index in the plan.
    pub source: usize,
    /// The source's URI, as the plan names it.
    pub uri: String,
    /// The document's index in the source dataset.
    pub document: u64,
    /// The first token's offset inside the document.
    pub offset: u64,
    /// Tokens in the run.
    pub length: u64,
}

/// Where a global sample goes and where its tokens come from: `dquant locate --json`'s line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Located {
    pub sample: u64,
    /// The epoch of its source the sample belongs to.
    pub epoch: u64,
    /// The batch of its rank that receives it.
    pub step: u64,
    pub rank: u64,
    /// Its `seq_len + 1` tokens, in order, as runs inside documents.
    pub pieces: Vec<Piece>,
}

/// A plan bound to its opened sources, answering provenance questions.
pub struct Provenance {
    plan: Plan,
    schedule: Schedule,
    index: BlendIndex,
    sources: Vec<Box<dyn TokenSource>>,
}

impl Provenance {
    /// Opens `plan`'s sources (local paths or `dquant://` dataset URIs, as a local run does)
    /// and binds the plan to their sizes.
    pub fn open(plan: &Plan) -> Result<Self, ClientError> {
        plan.validate().map_err(EngineError::from)?;
        let mut sources = Vec::with_capacity(plan.sources.len());
        for (index, s) in plan.sources.iter().enumerate() {
            let src = open_source(s, None, "").map_err(|source| EngineError::Source {
                index,
                uri: s.uri.clone(),
                source,
            })?;
            sources.push(src);
        }
        let infos: Vec<SourceInfo> = sources
            .iter()
            .map(|s| SourceInfo { tokens: s.tokens() })
            .collect();
        let schedule = Schedule::new(plan, &infos).map_err(EngineError::from)?;
        Ok(Provenance {
            plan: plan.clone(),
            index: schedule.blend_index(),
            schedule,
            sources,
        })
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Global sample `i`: its epoch, step and rank, and its tokens as runs inside documents.
    pub fn locate(&mut self, i: u64) -> Result<Located, ClientError> {
        let at = self
            .schedule
            .locate(&mut self.index, i)
            .map_err(EngineError::from)?;
        let s = at.sample;
        Ok(Located {
            sample: i,
            epoch: s.epoch,
            step: at.step,
            rank: at.rank,
            pieces: self.pieces(s.source, s.tokens)?,
        })
    }

    /// Every delivered global sample in `range` (default: the whole plan) that holds any token
    /// of document `document` of source `source`, ascending.
    pub fn samples_of(
        &mut self,
        source: usize,
        document: u64,
        range: Option<Range<u64>>,
    ) -> Result<Vec<u64>, ClientError> {
        let tokens = self.document(source, document)?;
        let range = range.unwrap_or(0..self.schedule.total_samples());
        Ok(self
            .schedule
            .samples_holding(&mut self.index, source, tokens, range))
    }

    /// How much of each source the global samples `0..until` consumed ([`SourceAudit`]).
    pub fn audit(&mut self, until: u64) -> Result<Vec<SourceAudit>, ClientError> {
        let total = self.schedule.total_samples();
        if until > total {
            return Err(ClientError::Usage(format!(
                "until: {until} is past the end of the plan ({total} samples)"
            )));
        }
        let counts = self.index.counts_at(until);
        let sample_len = self.schedule.sample_len() as u64;
        let mut out = Vec::with_capacity(counts.len());
        for (d, &samples) in counts.iter().enumerate() {
            let idx = self.index_of(d)?;
            let (touched, completed, exact) = audit::documents(&self.schedule, d, idx, samples);
            let documents = idx.documents() as u64;
            out.push(SourceAudit {
                source: d,
                uri: self.plan.sources[d].uri.clone(),
                samples,
                tokens: samples * sample_len,
                epochs: samples as f64 / self.schedule.samples_per_epoch(d) as f64,
                documents,
                documents_touched: touched,
                documents_completed: completed,
                touched_share: touched / documents.max(1) as f64,
                exact,
            });
        }
        Ok(out)
    }

    /// The token range of document `document` of source `source`.
    fn document(&self, source: usize, document: u64) -> Result<Range<u64>, ClientError> {
        let n = self.sources.len();
        if source >= n {
            return Err(ClientError::Usage(format!(
                "source {source}: the plan has {n} sources (0 to {})",
                n - 1
            )));
        }
        let idx = self.index_of(source)?;
        let docs = idx.documents() as u64;
        if document >= docs {
            return Err(ClientError::IndexOutOfRange(format!(
                "document {document} of source {source} ({}): it has {docs} documents",
                self.plan.sources[source].uri
            )));
        }
        Ok(idx.document(document as usize))
    }

    /// The runs of source `d`'s tokens `tokens` inside its documents.
    fn pieces(&self, d: usize, tokens: Range<u64>) -> Result<Vec<Piece>, ClientError> {
        let idx = self.index_of(d)?;
        let uri = &self.plan.sources[d].uri;
        let piece = |(document, offset, length): (usize, u64, u64)| Piece {
            source: d,
            uri: uri.clone(),
            document: document as u64,
            offset,
            length,
        };
        Ok(idx.pieces(tokens).map(piece).collect())
    }

    fn index_of(&self, d: usize) -> Result<&dquant_format::DocIndex, ClientError> {
        let uri = &self.plan.sources[d].uri;
        let engine = |source| EngineError::Source {
            index: d,
            uri: uri.clone(),
            source,
        };
        match self.sources[d].document_index() {
            Some(r) => r.map_err(|e| engine(e).into()),
            None => Err(ClientError::Usage(format!(
                "sources[{d}] ({uri}): its document index is not readable from here \
                 (a dataset on another agent); locate it where the dataset is local"
            ))),
        }
    }
}
