//! Megatron-Core's sample order built next to the data, once per config, and served by
//! sample index.
//!
//! Megatron builds its indices on every rank's host (minutes at scale) and keeps them in
//! host memory. Here the agent builds them beside the data ([`dquant_megatron::build`]) and
//! keeps them in [`MegatronIndexes`], keyed by the config as Megatron's `path_to_cache` is:
//! every rank that opens the same config gets the same build, and ranks that ask at once wait
//! for one build rather than each making its own. The trainer's process holds no index.
//!
//! A session then reads samples as a range source ([`MegatronRecords`]): sample `i` of a
//! split is one record of a virtual token stream (`dquant_megatron::records`), so the data
//! plane, its codecs and its checks are those of every range session.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use dquant_engine::{check_ranges, SourceError, TokenSource};
use dquant_megatron::{
    build_within, BuildConfig, BuildLimits, Built, DirStore, IndexStore, ReadScratch, RecordLayout,
    Sources,
};
use dquant_plan::WireCodec;
use dquant_proto::v1::{MegatronSplit, OpenMegatronReply, OpenMegatronRequest, OpenReply};
use dquant_storage::OpenOptions;
use tonic::Status;

use crate::auth::Caller;
use crate::requests::{over_limit, range_wire_codec};
use crate::sessions::{Reservation, Work};
use crate::Shared;

/// `OpenMegatron`: parses and checks the request (before any work is queued), then, on an
/// open worker, builds or finds the config's indices and adds the session `place` holds.
pub(crate) fn check_request(
    shared: &Shared,
    caller: &Caller,
    req: &OpenMegatronRequest,
) -> Result<(BuildConfig, WireCodec), Status> {
    let config: BuildConfig = serde_json::from_str(&req.config_json)
        .map_err(|e| Status::invalid_argument(format!("config_json: {e}")))?;
    let wire = range_wire_codec(shared, &req.wire_codec)?;
    let prefixes = config.prefixes();
    shared
        .config
        .limits
        .check_megatron(&config.num_samples, prefixes.len())
        .map_err(over_limit)?;
    for p in prefixes {
        caller.check_dataset(&p)?;
    }
    Ok((config, wire))
}

/// Opens `config`'s sources under the agent's roots (shared with its other sessions).
fn open_sources(shared: &Shared, config: &BuildConfig) -> Result<Sources, Status> {
    let prefixes = config.prefixes();
    let opts = OpenOptions::default();
    let mut datasets = Vec::with_capacity(prefixes.len());
    for p in &prefixes {
        let f = shared
            .catalog
            .resolve(p)
            .map_err(|e| Status::not_found(e.0))?;
        let ds = shared
            .datasets
            .open_in(&f.root_name, &*f.root, &f.name, &opts)
            .map_err(|e| Status::failed_precondition(format!("dataset {p:?}: {e}")))?;
        datasets.push(ds);
    }
    Sources::from_opened(&prefixes, datasets)
        .map_err(|e| Status::failed_precondition(e.to_string()))
}

/// The work of `OpenMegatron` on an open worker: the build (or the cached one), and the
/// session reading it.
pub(crate) fn open(
    shared: &Shared,
    caller: &Caller,
    place: Reservation,
    config: BuildConfig,
    wire: WireCodec,
) -> Result<OpenMegatronReply, Status> {
    let sources = open_sources(shared, &config)?;
    let key = key_of(&config, &sources).map_err(|e| Status::internal(e.to_string()))?;
    let started = std::time::Instant::now();
    let (served, cached) = shared
        .megatron
        .get_or_build(key, || {
            let store = shared.config.megatron_cache.as_ref().map(DirStore::new);
            let limits = BuildLimits {
                max_index_entries: shared.config.limits.max_megatron_index_entries,
            };
            Served::build(&config, sources, store.as_ref(), limits)
        })
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let name = format!("megatron:{}", served.built.sources.join(","));
    tracing::info!(
        tenant = caller.name(),
        sources = %served.built.sources.join(","),
        cached,
        seconds = started.elapsed().as_secs_f64(),
        "megatron order ready"
    );
    let splits = served.splits();
    let sources = served.built.sources.clone();
    let tokens = served.layout.tokens;
    let work = Work::Source {
        source: Box::new(MegatronRecords::new(served)),
        name: name.clone(),
        wire,
    };
    let (id, ticket) = place.add(work, caller.name());
    shared
        .events
        .opened(id, caller.name(), "megatron", name.clone());
    Ok(OpenMegatronReply {
        open: Some(OpenReply {
            session: id,
            ticket: ticket.to_vec(),
            data_port: u32::from(shared.data_port),
            socket_path: shared.socket_path(),
            stat: Some(dquant_proto::v1::DatasetStat {
                dataset: name,
                format: "megatron-records".into(),
                tokens,
                ..Default::default()
            }),
            ..Default::default()
        }),
        splits,
        sources,
        cached,
    })
}

/// A built config: its indices, its opened sources and the record layout it is served in.
pub(crate) struct Served {
    pub built: Built,
    pub sources: Sources,
    pub layout: RecordLayout,
}

/// Why a Megatron-order build failed: Megatron-Core's own refusal, with the agent's limit
/// named when it was that limit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BuildError {
    #[error("{0} (limits.max_megatron_index_entries)")]
    OverLimit(dquant_megatron::MegatronError),
    #[error("{0}")]
    Megatron(dquant_megatron::MegatronError),
}

impl Served {
    /// Builds `config` over `sources` (opened by the caller, named as the config names them),
    /// its GPT indices read from and kept in `store` when there is one.
    pub fn build(
        config: &BuildConfig,
        sources: Sources,
        store: Option<&DirStore>,
        limits: BuildLimits,
    ) -> Result<Self, BuildError> {
        let store = store.map(|s| s as &dyn IndexStore);
        let built = build_within(config, &mut |p| sources.lengths_of(p), store, limits).map_err(
            |e| match e.is_over_limit() {
                true => BuildError::OverLimit(e),
                false => BuildError::Megatron(e),
            },
        )?;
        let layout = RecordLayout::of(&built).map_err(BuildError::Megatron)?;
        Ok(Served {
            built,
            sources,
            layout,
        })
    }

    /// The splits as the reply says them.
    pub fn splits(&self) -> Vec<MegatronSplit> {
        self.layout
            .splits
            .iter()
            .map(|s| match s {
                Some(s) => MegatronSplit {
                    present: true,
                    samples: s.samples,
                    sample_tokens: s.sample_tokens,
                    blended: s.blended,
                },
                None => MegatronSplit::default(),
            })
            .collect()
    }
}

type Slot = Arc<Mutex<Option<Arc<Served>>>>;

/// The agent's built configs, most recently opened first, at most `keep` of them (a session
/// keeps its own alive after it is evicted).
pub(crate) struct MegatronIndexes {
    slots: Mutex<VecDeque<(String, Slot)>>,
    keep: usize,
}

impl MegatronIndexes {
    pub fn new(keep: usize) -> Self {
        MegatronIndexes {
            slots: Mutex::new(VecDeque::new()),
            keep: keep.max(1),
        }
    }

    /// The build for `key`, made by `make` if no one has made it; whether it was already
    /// made. Callers with the same key wait for one `make`; a failed one leaves the next
    /// caller to try again.
    pub fn get_or_build<E>(
        &self,
        key: String,
        make: impl FnOnce() -> Result<Served, E>,
    ) -> Result<(Arc<Served>, bool), E> {
        let slot = self.slot(key);
        let mut built = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = &*built {
            return Ok((s.clone(), true));
        }
        let s = Arc::new(make()?);
        *built = Some(s.clone());
        Ok((s, false))
    }

    /// `key`'s slot, moved to the front (made if new); the oldest past `keep` are dropped.
    fn slot(&self, key: String) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match slots.iter().position(|(k, _)| *k == key) {
            Some(i) => slots.remove(i).map(|(_, s)| s).unwrap_or_default(),
            None => Slot::default(),
        };
        slots.push_front((key, slot.clone()));
        slots.truncate(self.keep);
        slot
    }
}

/// The key of a config over its opened sources: the config's JSON (every field, so two
/// configs that differ in any way that changes samples differ here) and each source's size,
/// so a dataset rewritten under the same name is built again.
pub(crate) fn key_of(config: &BuildConfig, sources: &Sources) -> Result<String, serde_json::Error> {
    let json = serde_json::to_string(config)?;
    let sizes: Vec<String> = (0..sources.names().len())
        .map(|i| format!("{}:{}", sources.names()[i], sources.tokens(i)))
        .collect();
    Ok(format!("{json} {}", sizes.join(",")))
}

/// One session's reads of a served build: its record stream as a [`TokenSource`].
pub(crate) struct MegatronRecords {
    served: Arc<Served>,
    scratch: ReadScratch,
    /// One record, for a range that starts or ends inside one.
    record: Vec<u32>,
}

impl MegatronRecords {
    pub fn new(served: Arc<Served>) -> Self {
        MegatronRecords {
            served,
            scratch: ReadScratch::default(),
            record: Vec::new(),
        }
    }

    /// Fills `out` with the stream's tokens of `r`: whole records in place, a record cut by
    /// the range through `self.record`.
    fn read_range(&mut self, r: Range<u64>, out: &mut [u32]) -> Result<(), SourceError> {
        let s = &*self.served;
        let mut at = r.start;
        let mut done = 0usize;
        while at < r.end {
            let (split, idx, off) = s.layout.locate(at).ok_or_else(|| {
                SourceError::Usage(format!(
                    "token {at} is past the end of the sample stream ({} tokens)",
                    s.layout.tokens
                ))
            })?;
            let top = s.built.splits[split]
                .as_ref()
                .ok_or_else(|| SourceError::Usage(format!("split {split} has no dataset")))?;
            let rec = s.layout.split(split).map_err(agent_error)?.record_tokens() as usize;
            let n = (rec - off as usize).min((r.end - at) as usize);
            let dst = &mut out[done..done + n];
            if n == rec {
                s.sources
                    .read_record(top, idx, dst, &mut self.scratch)
                    .map_err(agent_error)?;
            } else {
                self.record.resize(rec, 0);
                s.sources
                    .read_record(top, idx, &mut self.record, &mut self.scratch)
                    .map_err(agent_error)?;
                dst.copy_from_slice(&self.record[off as usize..off as usize + n]);
            }
            at += n as u64;
            done += n;
        }
        Ok(())
    }
}

fn agent_error(e: dquant_megatron::MegatronError) -> SourceError {
    SourceError::Agent(e.to_string())
}

impl TokenSource for MegatronRecords {
    fn tokens(&self) -> u64 {
        self.served.layout.tokens
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        check_ranges(ranges, out)?;
        let mut done = 0usize;
        for r in ranges {
            let n = (r.end - r.start) as usize;
            self.read_range(r.clone(), &mut out[done..done + n])?;
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Served {
        Served {
            built: Built {
                sources: vec![],
                splits: [None, None, None],
            },
            sources: Sources::from_opened(&[], vec![]).unwrap(),
            layout: RecordLayout::new([None; 3]).unwrap(),
        }
    }

    #[test]
    fn one_build_per_key_and_a_failed_one_is_tried_again() {
        let ix = MegatronIndexes::new(2);
        assert_eq!(
            ix.get_or_build("a".into(), || Err("disk on fire".into()))
                .err(),
            Some("disk on fire".to_string())
        );
        let (first, cached) = ix
            .get_or_build("a".into(), || Ok::<_, String>(served()))
            .unwrap();
        assert!(!cached);
        let (again, cached) = ix
            .get_or_build("a".into(), || -> Result<Served, String> {
                panic!("built twice")
            })
            .unwrap();
        assert!(cached && Arc::ptr_eq(&first, &again));
    }

    #[test]
    fn ranks_asking_at_once_share_one_build() {
        let ix = Arc::new(MegatronIndexes::new(4));
        let builds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let got: Vec<Arc<Served>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    let (ix, builds) = (ix.clone(), builds.clone());
                    s.spawn(move || {
                        ix.get_or_build("k".into(), || {
                            builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            Ok::<_, String>(served())
                        })
                        .unwrap()
                        .0
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(got.iter().all(|g| Arc::ptr_eq(g, &got[0])));
    }

    #[test]
    fn the_oldest_config_past_keep_is_built_again() {
        let ix = MegatronIndexes::new(2);
        for k in ["a", "b", "c"] {
            ix.get_or_build(k.into(), || Ok::<_, String>(served()))
                .unwrap();
        }
        assert!(
            ix.get_or_build("c".into(), || Ok::<_, String>(served()))
                .unwrap()
                .1
        );
        assert!(
            ix.get_or_build("b".into(), || Ok::<_, String>(served()))
                .unwrap()
                .1
        );
        assert!(
            !ix.get_or_build("a".into(), || Ok::<_, String>(served()))
                .unwrap()
                .1
        );
    }
}
