//! A plan as a file (`MOUNTPOINT/plans/NAME.bin`): its batches back to back in the plan's
//! output dtype, the bytes `dquant read` writes, run on the agent.
//!
//! This is the original design's `read(fd, buf, action)`: the action is the plan. The file
//! is seekable because the schedule is: a read at byte `k × batch_bytes` opens the stream at
//! batch `k`'s cursor (no replay from the start), so a consumer that restarts at a byte
//! offset resumes exactly. Reads that go on where the last ended keep one open stream.

use std::sync::Mutex;

use dquant_client::{Offload, Reader};
use dquant_plan::{Cursor, Plan};

use crate::error::MountError;

pub struct PlanFile {
    pub name: String,
    plan: Plan,
    agent_uri: String,
    /// The stream's length in bytes.
    pub size: u64,
    state: Mutex<Stream>,
}

#[derive(Default)]
struct Stream {
    reader: Option<Reader>,
    /// The batch `reader` yields next.
    next: u64,
    /// The last batch read, for the kernel's reads inside it.
    held: Option<(u64, Vec<u8>)>,
}

impl PlanFile {
    /// Opens `plan` on the agent at `agent_uri` once, to check it and learn its length.
    pub fn new(name: &str, plan: Plan, agent_uri: &str) -> Result<Self, MountError> {
        let r = open(agent_uri, &plan, 0)
            .map_err(|e| MountError::Usage(format!("--plan {name}: {e}")))?;
        let sample_bytes = plan.sample_len() as u64 * plan.output.itemsize() as u64;
        let size = r.rank_samples() * sample_bytes;
        Ok(PlanFile {
            name: name.to_string(),
            plan,
            agent_uri: agent_uri.to_string(),
            size,
            state: Mutex::new(Stream::default()),
        })
    }

    /// Appends the bytes `offset..offset + size` (clamped to the stream) to `out`.
    pub fn read(&self, offset: u64, size: u64, out: &mut Vec<u8>) -> Result<(), MountError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let batch_bytes = self.plan.batch_bytes();
        let end = offset.saturating_add(size).min(self.size);
        let mut pos = offset;
        while pos < end {
            let k = pos / batch_bytes;
            if s.held.as_ref().is_none_or(|(i, _)| *i != k) {
                let bytes = self.batch(&mut s, k)?;
                s.held = Some((k, bytes));
            }
            let Some((_, bytes)) = &s.held else {
                unreachable!("held was just set")
            };
            let at = (pos - k * batch_bytes) as usize;
            let take = ((end - pos) as usize).min(bytes.len().saturating_sub(at));
            if take == 0 {
                return Err(MountError::Plan(format!(
                    "plan {}: batch {k} holds {} bytes, short of offset {pos}",
                    self.name,
                    bytes.len()
                )));
            }
            out.extend_from_slice(&bytes[at..at + take]);
            pos += take as u64;
        }
        Ok(())
    }

    /// Batch `k`'s bytes: the open stream's next batch, or a stream opened at `k`. A stream
    /// that was open a while (the agent may have ended it, or restarted) gets one fresh try.
    fn batch(&self, s: &mut Stream, k: u64) -> Result<Vec<u8>, MountError> {
        let reused = s.reader.is_some() && s.next == k;
        match self.next_of(s, k) {
            Err(e) if reused => {
                tracing::info!(plan = %self.name, batch = k, error = %e, "reopening the plan stream");
                self.next_of(s, k)
            }
            r => r,
        }
    }

    fn next_of(&self, s: &mut Stream, k: u64) -> Result<Vec<u8>, MountError> {
        if s.reader.is_none() || s.next != k {
            s.reader = None;
            let r = open(&self.agent_uri, &self.plan, k).map_err(|e| self.failed(k, e))?;
            s.reader = Some(r);
            s.next = k;
        }
        let Some(r) = s.reader.as_mut() else {
            unreachable!("a reader was just opened")
        };
        let got = match r.next_batch() {
            Ok(Some(b)) => Ok(b.tokens.as_bytes().to_vec()),
            Ok(None) => Err(MountError::Plan(format!(
                "plan {}: the stream ended before batch {k}",
                self.name
            ))),
            Err(e) => Err(self.failed(k, e)),
        };
        match &got {
            Ok(_) => s.next += 1,
            Err(_) => s.reader = None,
        }
        got
    }

    fn failed(&self, k: u64, e: impl std::fmt::Display) -> MountError {
        MountError::Plan(format!("plan {} at batch {k}: {e}", self.name))
    }
}

/// The plan's stream on the agent, from its rank's batch `k`: the cursor of the global
/// samples every rank consumed before it.
fn open(agent_uri: &str, plan: &Plan, k: u64) -> Result<Reader, dquant_client::ClientError> {
    let consumed = k * u64::from(plan.batch_size) * u64::from(plan.world);
    dquant_client::open_at(agent_uri, plan, Cursor::new(0, consumed), Offload::Yes)
}
