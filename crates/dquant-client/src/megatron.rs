//! Megatron-Core's samples from an agent, by index ([`AgentMegatron`]).
//!
//! The agent builds the config's indices next to the data (`OpenMegatron`) and serves its
//! samples as records of a range session (`dquant_megatron::records`): this process holds no
//! index, only the layout of three numbers per split. A batch of samples is one request,
//! narrowed and compressed on the wire.
//!
//! Megatron's samplers ask for predictable indices: a rank's batches step by the same stride
//! (micro-batch × data-parallel size, times the loader's workers). So once two batches of one
//! split show a stride, a reader thread asks for the next [`PREFETCH`] batches before they
//! are asked for, and a batch that was predicted is already here. A batch that was not is
//! asked for after the predicted ones still in flight are read past: a wrong guess costs
//! their transfer, never a wrong answer.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use dquant_engine::TokenSource;
use dquant_megatron::records::{parse_header, RECORD_HEADER};
use dquant_megatron::{BuildConfig, RecordLayout};
use dquant_plan::WireCodec;
use dquant_proto::v1::OpenMegatronRequest;
use dquant_remote::{range_slot_size, AgentUri, Control, RemoteSource, Transport};
use dquant_transport::RingShape;

use crate::ClientError;

/// Batches asked for ahead of the trainer, once their stride is known.
pub const PREFETCH: usize = 2;

/// Samples of one batch, as they came: records of `sample_tokens`, each pad 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleBatch {
    pub sample_tokens: usize,
    /// The records as read (each a header, then its tokens): kept, not copied out.
    records: Vec<u32>,
    /// Each sample's `dataset_id` (0 outside a blend).
    pub dataset_ids: Vec<u32>,
    /// Each sample's pad tokens (its last `pad` tokens are padding).
    pub pads: Vec<u64>,
}

impl SampleBatch {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.pads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pads.is_empty()
    }

    /// Sample `k`'s `sample_tokens` tokens (pads 0).
    pub fn tokens(&self, k: usize) -> &[u32] {
        let rec = RECORD_HEADER as usize + self.sample_tokens;
        &self.records[k * rec + RECORD_HEADER as usize..(k + 1) * rec]
    }

    /// Each sample's tokens, in order.
    pub fn rows(&self) -> impl Iterator<Item = &[u32]> {
        let rec = RECORD_HEADER as usize + self.sample_tokens;
        self.records
            .chunks_exact(rec)
            .map(|r| &r[RECORD_HEADER as usize..])
    }
}

/// The wire codec of a ring's samples when none is named: narrowed, not compressed. Memory
/// is not a link: compressing costs the agent and this process more than the bytes it saves
/// cost to copy.
pub const SHM_WIRE_CODEC: &str = "auto";

/// How the samples reach this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Over {
    /// Frames over the agent's TCP data plane (any host).
    Tcp,
    /// A shared-memory ring of `slots` slots (default: enough for 8 MiB), each holding one
    /// sample, handed to the agent over its Unix socket (same host only).
    Shm { slots: Option<u32> },
}

/// What the reader thread is asked: a batch of one split.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Job {
    split: usize,
    indices: Vec<u64>,
}

type Answer = Result<Vec<u32>, ClientError>;

/// A Megatron-order build on an agent, read by sample index.
pub struct AgentMegatron {
    layout: RecordLayout,
    sources: Vec<String>,
    cached: bool,
    jobs: Option<Sender<(Vec<Range<u64>>, usize)>>,
    answers: Receiver<Answer>,
    thread: Option<JoinHandle<()>>,
    /// Jobs sent and not yet answered, oldest first.
    in_flight: VecDeque<Job>,
    last: Option<Job>,
    /// The process that opened it: its reader thread exists only there (a forked child
    /// inherits this value, not the thread).
    owner: u32,
}

impl AgentMegatron {
    /// Connects to the agent at `agent` (`dquant://HOST:PORT` or its Unix socket path, with
    /// the environment's credentials) and [`open`](Self::open)s `config` there.
    pub fn connect(
        agent: &str,
        config: &BuildConfig,
        wire_codec: &str,
    ) -> Result<Self, ClientError> {
        let uri = AgentUri::parse(agent).map_err(|e| ClientError::Usage(e.to_string()))?;
        if !uri.dataset.is_empty() {
            return Err(ClientError::Usage(format!(
                "{agent:?}: name the agent only; the datasets are the blend's prefixes"
            )));
        }
        let control = Control::connect(&uri.authority).map_err(ClientError::from_agent)?;
        // Samples by index travel as a range session's records: over a ring of their own on
        // this host, else over TCP frames.
        let over = if uri.transport() == Transport::SHM {
            Over::Shm { slots: uri.slots }
        } else {
            Over::Tcp
        };
        Self::open_over(control, config, wire_codec, over)
    }

    /// Has the agent `control` talks to build (or find) `config` and opens its samples over
    /// its TCP data plane; `wire_codec` as for any range session ("" for the default,
    /// `auto+lz4`).
    pub fn open(
        control: Control,
        config: &BuildConfig,
        wire_codec: &str,
    ) -> Result<Self, ClientError> {
        Self::open_over(control, config, wire_codec, Over::Tcp)
    }

    /// As [`open`](Self::open), the samples coming `over` TCP or a shared-memory ring; over
    /// a ring, `wire_codec` "" is [`SHM_WIRE_CODEC`].
    pub fn open_over(
        control: Control,
        config: &BuildConfig,
        wire_codec: &str,
        over: Over,
    ) -> Result<Self, ClientError> {
        let config_json = serde_json::to_string(config)
            .map_err(|e| ClientError::Usage(format!("config: {e}")))?;
        let wire_codec = match (&over, wire_codec) {
            (Over::Shm { .. }, "") => SHM_WIRE_CODEC,
            (_, c) => c,
        };
        let reply = control
            .open_megatron(OpenMegatronRequest {
                config_json,
                wire_codec: wire_codec.into(),
            })
            .map_err(ClientError::from_agent)?;
        let layout = layout_of(&reply.splits)?;
        let open = reply
            .open
            .ok_or_else(|| ClientError::Agent("OpenMegatron: the reply has no session".into()))?;
        let source = match over {
            Over::Tcp => RemoteSource::attach(control, &open),
            Over::Shm { slots } => {
                let wire: WireCodec = wire_codec
                    .parse()
                    .map_err(|e| ClientError::Usage(format!("wire_codec {wire_codec:?}: {e}")))?;
                let socket = crate::shm::agent_socket(control.authority(), &open);
                let slot_size = range_slot_size(wire, layout.max_record_tokens());
                let shape = RingShape {
                    slots: slots.unwrap_or_else(|| crate::shm::default_slots(slot_size)),
                    slot_size,
                    verify: false,
                };
                RemoteSource::attach_ring(control, &open, socket, shape)
            }
        }
        .map_err(ClientError::from_agent)?;
        if source.tokens() != layout.tokens {
            return Err(ClientError::Agent(format!(
                "OpenMegatron: the session serves {} tokens, its splits add up to {}",
                source.tokens(),
                layout.tokens
            )));
        }
        let (jobs, job_rx) = channel();
        let (answer_tx, answers) = channel();
        let thread = std::thread::Builder::new()
            .name("dquant-megatron-read".into())
            .spawn(move || read_loop(source, job_rx, answer_tx))
            .map_err(|e| ClientError::Usage(format!("cannot start the reader thread: {e}")))?;
        Ok(AgentMegatron {
            layout,
            sources: reply.sources,
            cached: reply.cached,
            jobs: Some(jobs),
            answers,
            thread: Some(thread),
            in_flight: VecDeque::new(),
            last: None,
            owner: std::process::id(),
        })
    }

    pub fn layout(&self) -> &RecordLayout {
        &self.layout
    }

    /// The source datasets, by `dataset_id`.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// Whether the agent had built this config before this open.
    pub fn was_cached(&self) -> bool {
        self.cached
    }

    /// Samples `indices` of `split` (0 train, 1 valid, 2 test), in one round trip, or none
    /// when they were read ahead.
    pub fn batch(&mut self, split: usize, indices: &[u64]) -> Result<SampleBatch, ClientError> {
        if std::process::id() != self.owner {
            return Err(ClientError::Usage(
                "this Megatron order was opened in the parent of this forked process; open it \
                 again here (each process needs its own session)"
                    .into(),
            ));
        }
        let s = *self.layout.split(split).map_err(usage)?;
        let job = Job {
            split,
            indices: indices.to_vec(),
        };
        let records = match self.in_flight.iter().position(|j| *j == job) {
            Some(i) => {
                for _ in 0..i {
                    self.in_flight.pop_front();
                    // A guess that was not asked for; its answer (or error) is not needed,
                    // and an error would show again on the asked batch.
                    let _ = self.recv()?;
                }
                self.in_flight.pop_front();
                self.recv()?
            }
            None => {
                let ranges = self.ranges(&job)?;
                while self.in_flight.pop_front().is_some() {
                    let _ = self.recv()?;
                }
                self.send(ranges, s.record_tokens() as usize * indices.len())?;
                self.recv()?
            }
        }?;
        self.read_ahead(job);
        split_records(records, s.sample_tokens, indices.len())
    }

    fn ranges(&self, job: &Job) -> Result<Vec<Range<u64>>, ClientError> {
        job.indices
            .iter()
            .map(|&i| self.layout.record(job.split, i).map_err(usage))
            .collect()
    }

    fn send(&mut self, ranges: Vec<Range<u64>>, tokens: usize) -> Result<(), ClientError> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send((ranges, tokens)).ok())
            .ok_or_else(|| ClientError::Agent("the reader thread has stopped".into()))
    }

    fn recv(&mut self) -> Result<Answer, ClientError> {
        self.answers
            .recv()
            .map_err(|_| ClientError::Agent("the reader thread has stopped".into()))
    }

    /// After `job`, asks for the batches its stride predicts, up to [`PREFETCH`] in flight.
    fn read_ahead(&mut self, job: Job) {
        let prev = self.last.replace(job.clone());
        let Some(stride) = prev.and_then(|p| stride(&p, &job)) else {
            return;
        };
        let mut next = self.in_flight.back().cloned().unwrap_or(job);
        while self.in_flight.len() < PREFETCH {
            let indices: Option<Vec<u64>> =
                next.indices.iter().map(|i| i.checked_add(stride)).collect();
            let Some(indices) = indices else { return };
            next = Job {
                split: next.split,
                indices,
            };
            let Ok(ranges) = self.ranges(&next) else {
                return; // past the split's end
            };
            let tokens: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            if self.send(ranges, tokens as usize).is_err() {
                return;
            }
            self.in_flight.push_back(next.clone());
        }
    }
}

/// The step from batch `a` to batch `b` when every index moved by the same positive amount.
fn stride(a: &Job, b: &Job) -> Option<u64> {
    if a.split != b.split || a.indices.len() != b.indices.len() || b.indices.is_empty() {
        return None;
    }
    let d = b.indices[0].checked_sub(a.indices[0]).filter(|&d| d > 0)?;
    let same = a.indices.iter().zip(&b.indices).all(|(x, y)| x + d == *y);
    same.then_some(d)
}

fn usage(e: dquant_megatron::MegatronError) -> ClientError {
    match e {
        e @ dquant_megatron::MegatronError::IndexOutOfRange { .. } => {
            ClientError::IndexOutOfRange(e.to_string())
        }
        e => ClientError::Usage(e.to_string()),
    }
}

/// The reader thread: reads each job's ranges into a fresh buffer, in order, until the
/// sender is dropped.
fn read_loop(
    mut source: RemoteSource,
    jobs: Receiver<(Vec<Range<u64>>, usize)>,
    answers: Sender<Answer>,
) {
    for (ranges, tokens) in jobs {
        let mut out = Vec::new();
        let read = match out.try_reserve_exact(tokens) {
            Ok(()) => {
                out.resize(tokens, 0u32);
                source
                    .read_ranges(&ranges, &mut out)
                    .map(|()| out)
                    .map_err(ClientError::from_agent)
            }
            Err(_) => Err(ClientError::Usage(format!(
                "a batch of {tokens} tokens does not fit in memory"
            ))),
        };
        if answers.send(read).is_err() {
            return;
        }
    }
}

/// The splits of an `OpenMegatron` reply as a layout; an error for a reply that is not
/// three splits.
fn layout_of(splits: &[dquant_proto::v1::MegatronSplit]) -> Result<RecordLayout, ClientError> {
    let [a, b, c] = splits else {
        return Err(ClientError::Agent(format!(
            "OpenMegatron: the reply has {} splits, not 3",
            splits.len()
        )));
    };
    let shape = [a, b, c].map(|s| s.present.then_some((s.samples, s.sample_tokens, s.blended)));
    RecordLayout::new(shape).map_err(|e| ClientError::Agent(e.to_string()))
}

/// Records back to back as a batch: headers parsed and checked, the records kept.
fn split_records(
    records: Vec<u32>,
    sample_tokens: u64,
    n: usize,
) -> Result<SampleBatch, ClientError> {
    let rec = (RECORD_HEADER + sample_tokens) as usize;
    if records.len() != rec * n {
        return Err(ClientError::Agent(format!(
            "{} tokens came back for {n} samples of {rec}",
            records.len()
        )));
    }
    let mut b = SampleBatch {
        sample_tokens: sample_tokens as usize,
        records: Vec::new(),
        dataset_ids: Vec::with_capacity(n),
        pads: Vec::with_capacity(n),
    };
    for r in records.chunks_exact(rec) {
        let (id, pad) =
            parse_header(r, sample_tokens).map_err(|e| ClientError::Agent(e.to_string()))?;
        b.dataset_ids.push(id);
        b.pads.push(pad);
    }
    b.records = records;
    Ok(b)
}

impl Drop for AgentMegatron {
    fn drop(&mut self) {
        // The reader thread ends when its job channel closes; its source closes the session.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            if std::process::id() == self.owner {
                let _ = t.join();
            } else {
                // A forked child: the thread is its parent's, and joining it would wait
                // forever.
                std::mem::forget(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(split: usize, indices: &[u64]) -> Job {
        Job {
            split,
            indices: indices.to_vec(),
        }
    }

    #[test]
    fn a_stride_is_one_step_for_every_index_of_one_split() {
        assert_eq!(stride(&job(0, &[0, 1, 2]), &job(0, &[8, 9, 10])), Some(8));
        assert_eq!(stride(&job(0, &[0, 1, 2]), &job(0, &[8, 9, 11])), None);
        assert_eq!(stride(&job(0, &[4, 5]), &job(0, &[0, 1])), None);
        assert_eq!(stride(&job(0, &[4, 5]), &job(1, &[6, 7])), None);
        assert_eq!(stride(&job(0, &[4, 5]), &job(0, &[4, 5])), None);
        assert_eq!(stride(&job(0, &[4]), &job(0, &[6, 7])), None);
    }

    #[test]
    fn records_split_into_tokens_ids_and_pads() {
        let recs = vec![2, 0, 7, 8, 9, 0, 1, 5, 6, 0];
        let b = split_records(recs.clone(), 3, 2).unwrap();
        assert_eq!((b.tokens(0), b.tokens(1)), (&[7, 8, 9][..], &[5, 6, 0][..]));
        assert_eq!(b.rows().collect::<Vec<_>>(), [[7, 8, 9], [5, 6, 0]]);
        assert_eq!(b.dataset_ids, [2, 0]);
        assert_eq!(b.pads, [0, 1]);
        assert_eq!(
            split_records(recs[..9].to_vec(), 3, 2)
                .unwrap_err()
                .to_string(),
            "9 tokens came back for 2 samples of 5"
        );
    }
}
