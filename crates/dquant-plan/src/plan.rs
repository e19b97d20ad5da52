//! The plan: what a consumer asks for, as data (JSON or TOML).

use std::str::FromStr;

use dquant_format::DType;
use serde::{Deserialize, Serialize};

use crate::boundaries::{doc_section_bound, Boundaries};
use crate::cursor::cursor_trailer_len;
use crate::error::PlanError;
use crate::origins::origin_section_bound;
use crate::output::{OutputDType, WireCodec};

/// A declarative description of the batches a consumer wants: which sources, blended how,
/// packed into samples of which length, shuffled with which seed, for how long, for which
/// data-parallel rank, delivered in which dtype.
///
/// The same plan, serialized, runs in-process, in a local agent or in a remote one, and gives
/// the same bytes everywhere: it holds no paths to local state and no defaults that depend on
/// the machine. Unknown fields are rejected, so a misspelled option is an error rather than a
/// silently ignored setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The token datasets to blend; at least one.
    pub sources: Vec<Source>,
    /// Tokens per sample, not counting the extra label token: a sample is `seq_len + 1`
    /// tokens (inputs are its first `seq_len`, labels its last `seq_len`). At least 1.
    pub seq_len: u32,
    /// Samples per batch on each rank (Megatron's micro-batch size). At least 1.
    pub batch_size: u32,
    /// Seed of the shuffle. Default 0.
    #[serde(default)]
    pub seed: u64,
    /// Whether each source's samples are shuffled within each of its epochs. Default `true`,
    /// as Megatron's GPTDataset always shuffles; `false` reads every source in stored order.
    #[serde(default = "default_shuffle")]
    pub shuffle: bool,
    /// How many times the blend goes over the sum of all sources' samples: the plan has
    /// `epochs * Σ_d samples_per_epoch(d)` samples. At most one of `epochs` and `samples` may
    /// be given; neither means one epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u32>,
    /// Exactly how many (global) samples the plan has, instead of `epochs` (Megatron's
    /// `train_samples`). Sources wrap into further epochs as needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// The dtype of the token ids in delivered batches. Default `i32`.
    #[serde(default)]
    pub output: OutputDType,
    /// Codec of batches on a network link (TCP, TLS; a shared-memory ring carries the output
    /// dtype): `transport` (default: the narrowest width, ids in a byte code, in a zstd
    /// stream the session's batches share, level 5), `auto` (the narrowest lossless width,
    /// uncompressed), `auto+zstd:L`, `auto+lz4`, `auto+stream:L`, or any codec (`u16`,
    /// `bits:17+zstd:3`, ...).
    #[serde(default = "default_wire_codec")]
    pub wire_codec: String,
    /// This consumer's data-parallel rank, below `world`. Default 0.
    #[serde(default)]
    pub rank: u32,
    /// Number of data-parallel ranks sharing the stream. Default 1.
    #[serde(default = "default_world")]
    pub world: u32,
    /// Whether to drop the incomplete end of the stream. `true`: every rank stops after the
    /// last batch that all ranks can fill, so all ranks get the same number of full batches.
    /// `false` (default): every sample is delivered, a rank's last batch may be short, and
    /// ranks may differ by one sample.
    #[serde(default)]
    pub drop_last: bool,
    /// How document boundaries inside samples are found, for the boundary outputs:
    /// `"eod"` (a document ends with the `eod` token, as Megatron finds them) or
    /// `"documents"` (the sources' document indices). Unset (default): batches carry no
    /// boundaries. See [`crate::boundaries`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundaries: Option<Boundaries>,
    /// The end-of-document token for `boundaries = "eod"` (Megatron's `eod` id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eod: Option<u32>,
    /// Deliver `position_ids` that restart at each document (Megatron's
    /// `reset_position_ids`). Needs `boundaries`. Default `false`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub position_ids: bool,
    /// Deliver a `loss_mask` that is 0 where the target is another document's first token
    /// (Megatron's `eod_mask_loss`). Needs `boundaries`. Default `false`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub loss_mask: bool,
    /// Deliver `cu_seqlens` and `max_seqlen` for variable-length attention, so packed
    /// documents do not attend to each other (Megatron's `reset_attention_mask`, as
    /// `PackedSeqParams`). Needs `boundaries`. Default `false`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cu_seqlens: bool,
    /// Ship each sample's origins (its source documents, the offset into the first, and the
    /// run of tokens in each) in the batch record, through every transport. Needs each
    /// source's document index. Default `false`. See [`crate::origins`].
    #[serde(default, skip_serializing_if = "is_false")]
    pub provenance: bool,
    /// Later blend weights: each stage's `weights` hold from its start on (the sources'
    /// `weight`s hold from sample 0). See [`crate::mixture`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Stage>,
    /// How weights go from one stage to the next: `"step"` (default) or `"linear"`.
    #[serde(default, skip_serializing_if = "Interpolate::is_step")]
    pub interpolate: Interpolate,
    /// What happens when a source reaches its `max_epochs`/`max_samples`: `"stop"` (default)
    /// ends the run there, `"renormalize"` goes on with the other sources' weights scaled up
    /// (Megatron's exhaustive blending). See [`crate::limits`].
    #[serde(default, skip_serializing_if = "WhenExhausted::is_stop")]
    pub when_exhausted: WhenExhausted,
}

/// What a run does when a source reaches its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenExhausted {
    /// The run ends before any source would be drawn past its limit.
    #[default]
    Stop,
    /// The exhausted source leaves the blend; the others share its weight in proportion to
    /// theirs, and the run goes on (until every limited source is exhausted, if all are).
    Renormalize,
}

impl WhenExhausted {
    fn is_stop(&self) -> bool {
        *self == WhenExhausted::Stop
    }
}

/// A change of blend weights during a run (a `[[stages]]` entry).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// The global sample the stage starts at (above 0). Give this or `start_fraction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_sample: Option<u64>,
    /// Where the stage starts as a fraction of the run's samples, in `(0, 1)`: sample
    /// `floor(start_fraction × total)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_fraction: Option<f64>,
    /// One weight per source, in the order of `sources`: finite, at least 0 (a source may
    /// sit a stage out), not all 0. Normalized as the sources' weights are.
    pub weights: Vec<f64>,
}

/// How blend weights move between stages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpolate {
    /// Each stage's weights hold from its start to the next stage's.
    #[default]
    Step,
    /// Weights move linearly from each stage's start to the next's, and hold after the last.
    Linear,
}

impl Interpolate {
    fn is_step(&self) -> bool {
        *self == Interpolate::Step
    }
}

/// One token dataset of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Where the dataset is: a local path (Megatron prefix, `.dqb` block file, or raw token
    /// file with `dtype`), or `dquant://host:port/dataset` on an agent.
    pub uri: String,
    /// Blend weight, relative to the other sources' (weights are normalized). Finite and
    /// positive; default 1.
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Element type of a raw token file (`u16`, `i32`, ... or numpy names like `uint16`);
    /// only for raw files, which do not describe themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// End-of-document token of a raw token file: each occurrence ends a document. Only with
    /// `dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eod: Option<u32>,
    /// At most this many epochs of the source in the run (the plan's `when_exhausted` says
    /// what happens then). At most one of `max_epochs` and `max_samples`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_epochs: Option<u64>,
    /// At most this many samples of the source in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_samples: Option<u64>,
}

impl Source {
    /// Checks the fields of `sources[d]`, and names the first that is wrong.
    fn validate(&self, d: usize) -> Result<(), PlanError> {
        if self.uri.trim().is_empty() {
            return Err(PlanError::invalid(
                format!("sources[{d}].uri"),
                "must not be empty",
            ));
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Err(PlanError::invalid(
                format!("sources[{d}].weight"),
                format!("must be a finite number > 0 (got {})", self.weight),
            ));
        }
        if let Some(dt) = &self.dtype {
            DType::from_str(dt)
                .map_err(|e| PlanError::invalid(format!("sources[{d}].dtype"), e.to_string()))?;
        }
        if self.eod.is_some() && self.dtype.is_none() {
            return Err(PlanError::invalid(
                format!("sources[{d}].eod"),
                "only applies to raw token files, which need a dtype",
            ));
        }
        match (self.max_epochs, self.max_samples) {
            (Some(_), Some(_)) => {
                return Err(PlanError::invalid(
                    format!("sources[{d}]"),
                    "give at most one of max_epochs and max_samples",
                ))
            }
            (Some(0), _) => {
                return Err(PlanError::invalid(
                    format!("sources[{d}].max_epochs"),
                    "must be at least 1",
                ))
            }
            (_, Some(0)) => {
                return Err(PlanError::invalid(
                    format!("sources[{d}].max_samples"),
                    "must be at least 1",
                ))
            }
            _ => {}
        }
        Ok(())
    }

    /// A source at `uri` with weight 1 and no raw-file options.
    pub fn new(uri: impl Into<String>) -> Self {
        Source {
            uri: uri.into(),
            weight: 1.0,
            dtype: None,
            eod: None,
            max_epochs: None,
            max_samples: None,
        }
    }

    /// The same source with another weight.
    pub fn weight(self, weight: f64) -> Self {
        Source { weight, ..self }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_shuffle() -> bool {
    true
}

fn default_weight() -> f64 {
    1.0
}

fn default_world() -> u32 {
    1
}

fn default_wire_codec() -> String {
    "transport".into()
}

impl Plan {
    /// A plan over `sources` with every optional field at its default: seed 0, shuffled, one
    /// epoch, `i32` output, `auto` wire codec, rank 0 of 1, last batch kept.
    pub fn new(sources: Vec<Source>, seq_len: u32, batch_size: u32) -> Self {
        Plan {
            sources,
            seq_len,
            batch_size,
            seed: 0,
            shuffle: default_shuffle(),
            epochs: None,
            samples: None,
            output: OutputDType::default(),
            wire_codec: default_wire_codec(),
            rank: 0,
            world: default_world(),
            drop_last: false,
            boundaries: None,
            eod: None,
            position_ids: false,
            loss_mask: false,
            cu_seqlens: false,
            provenance: false,
            stages: Vec::new(),
            interpolate: Interpolate::Step,
            when_exhausted: WhenExhausted::Stop,
        }
    }

    /// Tokens per sample: `seq_len + 1` (the last token is the next sample's first, the
    /// label of the sample's last position).
    pub fn sample_len(&self) -> usize {
        self.seq_len as usize + 1
    }

    /// Tokens in a full batch: `batch_size × sample_len` (at most about 2^64, so exact).
    pub fn batch_tokens(&self) -> u64 {
        u64::from(self.batch_size) * (u64::from(self.seq_len) + 1)
    }

    /// Bytes of a full batch in the plan's output dtype, saturating at `u64::MAX` (a plan
    /// can ask for more than 2^64 bytes; no buffer can be that large, so every size check
    /// refuses it rather than see a wrapped small number).
    pub fn batch_bytes(&self) -> u64 {
        self.batch_tokens()
            .saturating_mul(self.output.itemsize() as u64)
    }

    /// Bytes at the end of each batch record's payload that carry the blend's counts of the
    /// cursor after the batch ([`cursor_trailer_len`]), so an offloaded reader's cursor
    /// resumes in O(#sources).
    pub fn cursor_trailer_len(&self) -> usize {
        cursor_trailer_len(self.sources.len())
    }

    /// Bytes of a batch record's trailer at most: the document-start section when the plan
    /// has `boundaries` ([`crate::boundaries::doc_section_bound`]), the provenance section
    /// with `provenance` ([`crate::origins::origin_section_bound`]), then the cursor trailer.
    /// What a producer reserves, and a receiver accepts, past the tokens.
    pub fn trailer_bound(&self) -> u64 {
        let docs = match self.boundaries {
            Some(_) => doc_section_bound(self.batch_size, self.seq_len),
            None => 0,
        };
        let origins = match self.provenance {
            true => origin_section_bound(self.batch_size, self.seq_len),
            false => 0,
        };
        docs + origins + self.cursor_trailer_len() as u64
    }

    /// Parses and validates a plan written in JSON.
    pub fn from_json(text: &str) -> Result<Self, PlanError> {
        let plan: Plan =
            serde_json::from_str(text).map_err(|e| PlanError::Syntax(e.to_string()))?;
        plan.validate()?;
        Ok(plan)
    }

    /// Parses and validates a plan written in TOML.
    pub fn from_toml(text: &str) -> Result<Self, PlanError> {
        let plan: Plan = toml::from_str(text).map_err(|e| PlanError::Syntax(e.to_string()))?;
        plan.validate()?;
        Ok(plan)
    }

    /// The plan as pretty-printed JSON (every field, defaults included, so the text is a
    /// complete record of what ran).
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and bools always serializes; a non-finite weight would
        // become `null`, which `from_json` then rejects by name.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| unreachable!("plan to JSON: {e}"))
    }

    /// The plan as TOML. Fails only where TOML cannot say a value: an integer above
    /// `i64::MAX` (`seed`, `samples`), which JSON can.
    pub fn to_toml(&self) -> Result<String, PlanError> {
        for (field, v) in [("seed", Some(self.seed)), ("samples", self.samples)] {
            if let Some(v) = v.filter(|&v| v > i64::MAX as u64) {
                return Err(PlanError::invalid(
                    field,
                    format!("{v} does not fit in a TOML integer (at most {})", i64::MAX),
                ));
            }
        }
        toml::to_string(self).map_err(|e| PlanError::Syntax(e.to_string()))
    }

    /// The `wire_codec` field, parsed; the error names the field.
    pub fn parsed_wire_codec(&self) -> Result<WireCodec, PlanError> {
        self.wire_codec
            .parse()
            .map_err(|e: dquant_codec::CodecError| PlanError::invalid("wire_codec", e.to_string()))
    }

    /// Checks every field, and names the first that is wrong.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.sources.is_empty() {
            return Err(PlanError::invalid(
                "sources",
                "at least one source is required",
            ));
        }
        for (d, s) in self.sources.iter().enumerate() {
            s.validate(d)?;
        }
        if self.seq_len == 0 {
            return Err(PlanError::invalid("seq_len", "must be at least 1"));
        }
        if self.batch_size == 0 {
            return Err(PlanError::invalid("batch_size", "must be at least 1"));
        }
        match (self.epochs, self.samples) {
            (Some(_), Some(_)) => {
                return Err(PlanError::invalid("epochs and samples", "give at most one"))
            }
            (Some(0), None) => return Err(PlanError::invalid("epochs", "must be at least 1")),
            (None, Some(0)) => return Err(PlanError::invalid("samples", "must be at least 1")),
            _ => {}
        }
        self.parsed_wire_codec()?;
        self.validate_boundaries()?;
        self.validate_stages()?;
        if self.world == 0 {
            return Err(PlanError::invalid("world", "must be at least 1"));
        }
        if self.rank >= self.world {
            return Err(PlanError::invalid(
                "rank",
                format!("{} is not below world {}", self.rank, self.world),
            ));
        }
        // The blend's weights must also survive normalization.
        let weights: Vec<f64> = self.sources.iter().map(|s| s.weight).collect();
        crate::weights::checked_weights(&weights)?;
        Ok(())
    }

    /// Each stage has one start, in range, increasing among starts of its kind, and one
    /// usable weight per source. (Starts of both kinds are ordered once the run's length is
    /// known: [`crate::mixture::Mixture::resolve`].)
    fn validate_stages(&self) -> Result<(), PlanError> {
        let n = self.sources.len();
        let (mut last_sample, mut last_fraction) = (0u64, 0f64);
        for (k, s) in self.stages.iter().enumerate() {
            let at = |f: &str| format!("stages[{k}].{f}");
            match (s.start_sample, s.start_fraction) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(PlanError::invalid(
                        format!("stages[{k}]"),
                        "give one of start_sample and start_fraction",
                    ))
                }
                (Some(v), None) => {
                    if v <= last_sample {
                        let why = match last_sample {
                            0 => "must be above 0 (the sources' weights hold from 0)".into(),
                            p => format!("{v} is not after the previous stage's {p}"),
                        };
                        return Err(PlanError::invalid(at("start_sample"), why));
                    }
                    last_sample = v;
                }
                (None, Some(f)) => {
                    if !(f > last_fraction && f < 1.0) {
                        let why = if last_fraction == 0.0 {
                            format!("must be in (0, 1) (got {f})")
                        } else {
                            format!(
                                "{f} is not in ({last_fraction}, 1), after the previous stage's"
                            )
                        };
                        return Err(PlanError::invalid(at("start_fraction"), why));
                    }
                    last_fraction = f;
                }
            }
            if s.weights.len() != n {
                return Err(PlanError::invalid(
                    at("weights"),
                    format!("has {} weights for {n} sources", s.weights.len()),
                ));
            }
            if let Some((d, w)) = s
                .weights
                .iter()
                .enumerate()
                .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
            {
                return Err(PlanError::invalid(
                    format!("stages[{k}].weights[{d}]"),
                    format!("must be a finite number >= 0 (got {w})"),
                ));
            }
            if s.weights.iter().all(|&w| w == 0.0) {
                return Err(PlanError::invalid(at("weights"), "are all 0"));
            }
        }
        Ok(())
    }

    /// The boundary fields agree: outputs need `boundaries`, `"eod"` needs `eod`, and `eod`
    /// means nothing without it.
    fn validate_boundaries(&self) -> Result<(), PlanError> {
        let outputs = [
            ("position_ids", self.position_ids),
            ("loss_mask", self.loss_mask),
            ("cu_seqlens", self.cu_seqlens),
        ];
        match (self.boundaries, self.eod) {
            (None, _) => {
                if let Some((name, _)) = outputs.iter().find(|(_, on)| *on) {
                    return Err(PlanError::invalid(
                        *name,
                        "needs boundaries = \"eod\" (with eod = ID) or boundaries = \"documents\"",
                    ));
                }
                if self.eod.is_some() {
                    return Err(PlanError::invalid(
                        "eod",
                        "only applies with boundaries = \"eod\"",
                    ));
                }
            }
            (Some(Boundaries::Eod), None) => {
                return Err(PlanError::invalid(
                    "boundaries",
                    "\"eod\" needs the end-of-document token: eod = ID",
                ))
            }
            (Some(Boundaries::Documents), Some(_)) => {
                return Err(PlanError::invalid(
                    "eod",
                    "only applies with boundaries = \"eod\" (\"documents\" takes the starts from the index)",
                ))
            }
            _ => {}
        }
        Ok(())
    }
}
