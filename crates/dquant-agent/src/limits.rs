//! What one request may ask of the agent.
//!
//! An agent serves many clients from one process, so a plan's numbers are never trusted as
//! sizes: a `batch_size` of 2^32 − 1 would make the session allocate terabytes, and a failed
//! allocation aborts the process and every other session with it. Each limit here is checked
//! when a request arrives, before any dataset is opened or any buffer sized from it, and a
//! request over a limit gets an error naming the field, the value, the limit and the config
//! key that raises it. Defaults are generous for training (a 64-sample batch of 32 k tokens
//! in int32 is 8 MiB, a quarter of a percent of the batch limit) and small against a node's
//! memory.

use dquant_plan::{Plan, WireCodec};
use serde::Deserialize;

use crate::config_error::ConfigError;

pub use dquant_transport::record::MAX_RANGE_TOKENS;

/// The `[limits]` table of the agent config.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Bytes of one batch in the plan's output dtype (`batch_size × (seq_len + 1) ×
    /// itemsize`). A streaming session holds a few batches' worth at most: its working
    /// tokens (4 bytes each), one record, and the transport's frames.
    pub max_batch_bytes: u64,
    /// Samples in one batch (`batch_size`): the schedule holds a small record per sample.
    pub max_batch_samples: u32,
    /// Sources in one plan: each is opened and its document index loaded.
    pub max_sources: usize,
    /// Ranks in one plan (`world`): producing a sample steps the blend once per rank.
    pub max_world: u32,
    /// Tokens one range request of a chained agent may ask for (at most
    /// [`MAX_RANGE_TOKENS`], what the data plane's records can carry).
    pub max_range_tokens: u64,
    /// The highest zstd level a wire codec may ask for: high levels cost a core per stream
    /// and tens of MiB of encoder state.
    pub max_zstd_level: i32,
    /// Connections, on the data port and the Unix socket together, that may be waiting to
    /// say hello at once. The next is refused without a thread or a buffer.
    pub max_handshakes: usize,
    /// Threads that open datasets (`Open`, `OpenSource`, `Stat`, `List`): opening reads
    /// indexes and may replay a blend, so it is bounded work on a bounded pool.
    pub open_workers: usize,
    /// Requests that may wait for an open worker; the next is refused as busy.
    pub max_queued_opens: usize,
    /// Seconds one request may spend in an open worker (waiting included) before it is
    /// stopped: a cursor far into a multi-source blend replays the blend to it.
    pub open_timeout_secs: u64,
    /// Samples one Megatron-order build (`OpenMegatron`) may ask for, all splits together:
    /// its indices take some 20 bytes a sample, held for as long as the build is kept.
    pub max_megatron_samples: u64,
    /// Entries of one GPT dataset's document index in a Megatron-order build (its documents
    /// x epochs, 4 bytes each): many epochs of tiny documents grow it far past the samples.
    pub max_megatron_index_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_batch_bytes: 256 << 20,
            max_batch_samples: 1 << 16,
            max_sources: 1024,
            max_world: 1 << 16,
            max_range_tokens: MAX_RANGE_TOKENS,
            max_zstd_level: 9,
            max_handshakes: 64,
            open_workers: 4,
            max_queued_opens: 64,
            open_timeout_secs: 60,
            max_megatron_samples: 1 << 31,
            max_megatron_index_entries: 1 << 31,
        }
    }
}

/// A request over one of the agent's limits. The message names the field, the value, the
/// limit and the config key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    #[error(
        "batch_size {batch_size} × (seq_len {seq_len} + 1) × {itemsize} bytes ({output}) = \
         {bytes} bytes per batch, above this agent's limit of {max} (limits.max_batch_bytes)"
    )]
    BatchBytes {
        batch_size: u32,
        seq_len: u32,
        itemsize: usize,
        output: &'static str,
        bytes: u64,
        max: u64,
    },
    #[error(
        "batch_size {got} is above this agent's limit of {max} samples per batch \
         (limits.max_batch_samples)"
    )]
    BatchSamples { got: u32, max: u32 },
    #[error("sources: {got} sources, above this agent's limit of {max} (limits.max_sources)")]
    Sources { got: usize, max: usize },
    #[error("world {got} is above this agent's limit of {max} ranks (limits.max_world)")]
    World { got: u32, max: u32 },
    #[error(
        "num_samples: {got} samples in all, above this agent's limit of {max} for one \
         Megatron-order build (limits.max_megatron_samples)"
    )]
    MegatronSamples { got: u64, max: u64 },
    #[error(
        "{field}: zstd level {got} is above this agent's limit of {max} (limits.max_zstd_level)"
    )]
    ZstdLevel {
        field: &'static str,
        got: i32,
        max: i32,
    },
}

impl Limits {
    /// Checks values that parse but cannot work (a pool without workers, say).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let at_least_one = [
            ("max_batch_bytes", self.max_batch_bytes == 0),
            ("max_batch_samples", self.max_batch_samples == 0),
            ("max_sources", self.max_sources == 0),
            ("max_world", self.max_world == 0),
            ("max_range_tokens", self.max_range_tokens == 0),
            ("max_handshakes", self.max_handshakes == 0),
            ("open_workers", self.open_workers == 0),
            ("open_timeout_secs", self.open_timeout_secs == 0),
            ("max_megatron_samples", self.max_megatron_samples == 0),
            (
                "max_megatron_index_entries",
                self.max_megatron_index_entries == 0,
            ),
        ];
        if let Some((key, _)) = at_least_one.iter().find(|(_, zero)| *zero) {
            return Err(ConfigError::invalid(
                format!("limits.{key}"),
                "must be at least 1",
            ));
        }
        if self.max_range_tokens > MAX_RANGE_TOKENS {
            return Err(ConfigError::invalid(
                "limits.max_range_tokens",
                format!(
                    "{} is above {MAX_RANGE_TOKENS}, the most one range record carries",
                    self.max_range_tokens
                ),
            ));
        }
        Ok(())
    }

    /// Checks a Megatron-order build's size (`num_samples` of every split, and its sources),
    /// before anything is opened for it.
    pub(crate) fn check_megatron(
        &self,
        num_samples: &[Option<u64>],
        sources: usize,
    ) -> Result<(), LimitError> {
        if sources > self.max_sources {
            return Err(LimitError::Sources {
                got: sources,
                max: self.max_sources,
            });
        }
        let got = num_samples
            .iter()
            .flatten()
            .fold(0u64, |a, &n| a.saturating_add(n));
        if got > self.max_megatron_samples {
            return Err(LimitError::MegatronSamples {
                got,
                max: self.max_megatron_samples,
            });
        }
        Ok(())
    }

    /// Checks a validated plan's sizes, before anything is opened for it.
    pub fn check_plan(&self, plan: &Plan) -> Result<(), LimitError> {
        if plan.sources.len() > self.max_sources {
            return Err(LimitError::Sources {
                got: plan.sources.len(),
                max: self.max_sources,
            });
        }
        if plan.world > self.max_world {
            return Err(LimitError::World {
                got: plan.world,
                max: self.max_world,
            });
        }
        if plan.batch_size > self.max_batch_samples {
            return Err(LimitError::BatchSamples {
                got: plan.batch_size,
                max: self.max_batch_samples,
            });
        }
        let bytes = plan.batch_bytes();
        if bytes > self.max_batch_bytes {
            return Err(LimitError::BatchBytes {
                batch_size: plan.batch_size,
                seq_len: plan.seq_len,
                itemsize: plan.output.itemsize(),
                output: plan.output.as_str(),
                bytes,
                max: self.max_batch_bytes,
            });
        }
        Ok(())
    }

    /// Checks a wire codec (`field` names where it came from).
    pub fn check_wire(&self, field: &'static str, wire: WireCodec) -> Result<(), LimitError> {
        // Every compression that is zstd underneath (a rank+zstd wire codec is refused
        // earlier, when the plan is parsed).
        match wire.compression().zstd_level() {
            Some(level) if level > self.max_zstd_level => Err(LimitError::ZstdLevel {
                field,
                got: level,
                max: self.max_zstd_level,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dquant_plan::{OutputDType, Source};

    fn plan(seq_len: u32, batch_size: u32) -> Plan {
        Plan::new(vec![Source::new("c/a")], seq_len, batch_size)
    }

    #[test]
    fn the_hostile_plan_is_refused_by_its_batch_size_and_bytes() {
        let l = Limits::default();
        let mut p = plan(1, u32::MAX);
        p.samples = Some(u64::MAX);
        assert_eq!(
            l.check_plan(&p).unwrap_err().to_string(),
            "batch_size 4294967295 is above this agent's limit of 65536 samples per batch \
             (limits.max_batch_samples)"
        );
        let p = plan(u32::MAX, 64);
        assert_eq!(
            l.check_plan(&p).unwrap_err().to_string(),
            "batch_size 64 × (seq_len 4294967295 + 1) × 4 bytes (i32) = 1099511627776 bytes \
             per batch, above this agent's limit of 268435456 (limits.max_batch_bytes)"
        );
        // The largest batch that fits, exactly at the limit.
        let mut p = plan(65535, 1024);
        p.output = OutputDType::U16;
        assert_eq!(p.batch_bytes(), 128 << 20);
        l.check_plan(&p).unwrap();
        p.output = OutputDType::I64;
        assert_eq!(
            l.check_plan(&p).unwrap_err(),
            LimitError::BatchBytes {
                batch_size: 1024,
                seq_len: 65535,
                itemsize: 8,
                output: "i64",
                bytes: 512 << 20,
                max: 256 << 20
            }
        );
    }

    #[test]
    fn world_sources_and_zstd_level_are_refused_with_their_keys() {
        let l = Limits::default();
        let mut p = plan(7, 2);
        p.world = u32::MAX;
        assert_eq!(
            l.check_plan(&p).unwrap_err().to_string(),
            "world 4294967295 is above this agent's limit of 65536 ranks (limits.max_world)"
        );
        let mut p = plan(7, 2);
        p.sources = (0..1025).map(|i| Source::new(format!("c/{i}"))).collect();
        assert_eq!(
            l.check_plan(&p).unwrap_err().to_string(),
            "sources: 1025 sources, above this agent's limit of 1024 (limits.max_sources)"
        );
        for (codec, ok) in [
            ("auto+zstd:9", true),
            ("auto+zstd:10", false),
            ("u16+zstd:22", false),
            ("auto+zstd:-5", true),
            ("auto+lz4", true),
        ] {
            let got = l.check_wire("wire_codec", codec.parse().unwrap());
            assert_eq!(got.is_ok(), ok, "{codec}: {got:?}");
        }
        assert_eq!(
            l.check_wire("wire_codec", "u16+zstd:22".parse().unwrap())
                .unwrap_err()
                .to_string(),
            "wire_codec: zstd level 22 is above this agent's limit of 9 (limits.max_zstd_level)"
        );
    }

    #[test]
    fn zero_limits_and_oversized_range_limits_are_config_errors() {
        let l = Limits {
            open_workers: 0,
            ..Limits::default()
        };
        assert_eq!(
            l.validate().unwrap_err().to_string(),
            "limits.open_workers: must be at least 1"
        );
        let l = Limits {
            max_range_tokens: MAX_RANGE_TOKENS + 1,
            ..Limits::default()
        };
        assert_eq!(
            l.validate().unwrap_err().to_string(),
            "limits.max_range_tokens: 16777217 is above 16777216, the most one range record \
             carries"
        );
        Limits::default().validate().unwrap();
    }
}
