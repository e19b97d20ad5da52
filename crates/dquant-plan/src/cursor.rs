//! Where a rank's stream stands: `(epoch, consumed_samples)` and the blend's counts there,
//! what a restart resumes from exactly.

use serde::{Deserialize, Serialize};

use crate::error::PlanError;

/// Where a consumer is in a plan's stream: what a checkpoint stores, and what resuming starts
/// from.
///
/// The plain cursor is Megatron's: `consumed_samples` global samples were consumed, all ranks
/// together, so the stream goes on at global sample `consumed_samples`. Two optional parts make
/// resuming exact and cheap at scale (see [`crate::resume`]):
/// - `blend`: how many of the global samples below the watermark came from each source, so a
///   resumed blend starts in O(#sources) instead of replaying from sample 0;
/// - `delivered`: global samples past the watermark that were already delivered (DataLoader
///   workers run ahead of each other), so a job that resumes on another number of ranks or
///   workers neither repeats nor skips one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    /// `consumed_samples / Σ_d samples_per_epoch(d)`: how many passes over all sources'
    /// samples have been consumed. For reporting; resuming uses only `consumed_samples`.
    #[serde(default)]
    pub epoch: u64,
    /// Samples consumed by all ranks together (Megatron's `consumed_samples`): every global
    /// sample below the watermark (`consumed_samples - delivered.len()`), and those in
    /// `delivered`. The stream goes on with the rest, in global order, and rank `r` of `world`
    /// takes the `k`-th of them when `(consumed_samples + k) % world == r`; without
    /// `delivered` that is global sample `i` for `i % world == r`, as from the start.
    pub consumed_samples: u64,
    /// Per source, how many of the global samples below the watermark were drawn from it (the
    /// blend's state there). Empty: unknown, and resuming replays the blend from sample 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blend: Vec<u64>,
    /// Global samples at or past the watermark that were already delivered, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivered: Vec<u64>,
}

impl Cursor {
    /// The start of the stream.
    pub const START: Cursor = Cursor {
        epoch: 0,
        consumed_samples: 0,
        blend: Vec::new(),
        delivered: Vec::new(),
    };

    /// The plain cursor after `consumed_samples` samples: no blend counts, nothing delivered
    /// past it.
    pub fn new(epoch: u64, consumed_samples: u64) -> Self {
        Cursor {
            epoch,
            consumed_samples,
            ..Cursor::START
        }
    }

    /// Parses a cursor from JSON (its serde form, as [`Cursor::to_json`] writes it).
    pub fn from_json(text: &str) -> Result<Self, PlanError> {
        serde_json::from_str(text).map_err(|e| PlanError::Cursor(e.to_string()))
    }

    /// The cursor as compact JSON: `{"epoch":E,"consumed_samples":N}`, with `blend` and
    /// `delivered` when they are set.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a cursor is plain data")
    }

    /// The global sample below which every sample was consumed: `consumed_samples` minus the
    /// samples delivered past it. `None` when `delivered` is longer than `consumed_samples`
    /// (not a cursor any stream produces).
    pub fn watermark(&self) -> Option<u64> {
        let n = u64::try_from(self.delivered.len()).ok()?;
        self.consumed_samples.checked_sub(n)
    }
}

/// Bytes of a batch record's cursor trailer for a plan of `sources` sources: one u64 count per
/// source when there are several, none for one source (its count is the position itself).
pub fn cursor_trailer_len(sources: usize) -> usize {
    if sources > 1 {
        8 * sources
    } else {
        0
    }
}
