//! `dquant._dquant.MegatronOrder`: Megatron-Core's sample order ([`dquant_megatron`]) over
//! local sources, and `AgentMegatronOrder`, the same built by an agent and read from it by
//! index, for `dquant.megatron`.
//!
//! Rust builds the indices (without the GIL) and reads each sample's tokens into an int64
//! numpy row, pads included; `dquant/megatron.py` turns rows into Megatron's dicts of torch
//! tensors, where torch's own ops make the masks exactly as Megatron's do.

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use dquant_client::{AgentMegatron, SampleBatch};
use dquant_megatron::fields::{FieldRules, Fields};
use dquant_megatron::records::SplitRecords;
use dquant_megatron::{
    build_cached, Blend, BuildConfig, Built, DirStore, IndexStore, Lookup, MegatronError,
    RecordLayout, Sample, Sources, TopLevel,
};
use dquant_storage::{Dataset, OpenOptions, ReadBuffers};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::exceptions::{PyFileNotFoundError, PyIndexError, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;

fn to_py(e: MegatronError) -> PyErr {
    let msg = e.to_string();
    match &e {
        MegatronError::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        MegatronError::Storage(s) if s.is_not_found() => PyFileNotFoundError::new_err(msg),
        MegatronError::Storage(_) => PyOSError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

type PyBlend = (Vec<String>, Option<Vec<f64>>);

fn blend_of(b: PyBlend) -> Blend {
    Blend {
        prefixes: b.0,
        weights: b.1,
    }
}

/// The three splits of a Megatron-order build and the sources they read.
#[pyclass(module = "dquant._dquant", frozen)]
pub struct MegatronOrder {
    built: Built,
    sources: Sources,
    /// Read buffers (decoded tokens, I/O) reused by every read of this object.
    bufs: Mutex<(ReadBuffers, Vec<u32>, Sample)>,
    /// Each split's inverse tables, built on the first `samples_of` asked of it.
    lookups: [OnceLock<Lookup>; 3],
}

impl MegatronOrder {
    /// Samples `indices` of `split` as int64 rows (pads as `pad`), read without the GIL.
    fn rows(
        &self,
        py: Python<'_>,
        split: usize,
        indices: &[u64],
        pad: i64,
    ) -> PyResult<(Array2<i64>, Option<Vec<i16>>)> {
        let top = self.split(split)?;
        let width = top.sample_tokens() as usize;
        let mut rows = zeroed(width, indices.len())?;
        let ids = py
            .detach(|| self.read(top, indices, &mut rows, pad))
            .map_err(to_py)?;
        let arr = Array2::from_shape_vec((indices.len(), width), rows)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let ids = matches!(top, TopLevel::Blended(_)).then(|| ids.into_iter().flatten().collect());
        Ok((arr, ids))
    }

    fn split(&self, split: usize) -> PyResult<&TopLevel> {
        self.built
            .splits
            .get(split)
            .and_then(Option::as_ref)
            .ok_or_else(|| PyValueError::new_err(format!("split {split} has no dataset")))
    }

    /// Reads samples `indices` of `top` into consecutive rows of `rows` (one sample's
    /// tokens each); returns their `dataset_id`s.
    fn read(
        &self,
        top: &TopLevel,
        indices: &[u64],
        rows: &mut [i64],
        pad: i64,
    ) -> Result<Vec<Option<i16>>, MegatronError> {
        let width = (top.sample_tokens() as usize).max(1);
        let mut guard = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        let threads = read_threads(indices.len());
        if threads < 2 {
            return self.read_part(top, indices, rows, pad, &mut guard);
        }
        // A batch's samples are read side by side: on documents of tens of tokens a sample is
        // a hundred scattered pieces, and one thread waits on memory for most of them.
        let per = indices.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let mut parts = indices.chunks(per).zip(rows.chunks_mut(per * width));
            let first = parts.next();
            let others: Vec<_> = parts
                .map(|(idx, rows)| {
                    scope.spawn(move || {
                        let mut bufs = Default::default();
                        self.read_part(top, idx, rows, pad, &mut bufs)
                    })
                })
                .collect();
            let mut ids = match first {
                Some((idx, rows)) => self.read_part(top, idx, rows, pad, &mut guard)?,
                None => Vec::new(),
            };
            for h in others {
                ids.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
            }
            Ok(ids)
        })
    }

    /// [`read`](Self::read) of some of a batch's samples, with `bufs`.
    fn read_part(
        &self,
        top: &TopLevel,
        indices: &[u64],
        rows: &mut [i64],
        pad: i64,
        (bufs, tokens, sample): &mut (ReadBuffers, Vec<u32>, Sample),
    ) -> Result<Vec<Option<i16>>, MegatronError> {
        let width = (top.sample_tokens() as usize).max(1);
        let mut ids = Vec::with_capacity(indices.len());
        for (&idx, row) in indices.iter().zip(rows.chunks_mut(width)) {
            top.sample_into(idx, sample)?;
            self.sources.read_into(sample, row, pad, tokens, bufs)?;
            ids.push(sample.dataset_id);
        }
        Ok(ids)
    }
}

/// The config `dquant.megatron` was given, as dquant-megatron's `BuildConfig` JSON (what
/// [`megatron_order`] builds here and [`megatron_agent_order`] sends an agent).
#[pyfunction]
#[pyo3(signature = (*, random_seed, sequence_length, blend=None, blend_per_split=None, split=None,
    num_samples=[None, None, None], mid_level_dataset_surplus=0.005,
    add_extra_token_to_sequence=true, drop_last_partial_validation_sequence=true))]
#[allow(clippy::too_many_arguments)]
pub fn megatron_config(
    random_seed: u32,
    sequence_length: u32,
    blend: Option<PyBlend>,
    blend_per_split: Option<[Option<PyBlend>; 3]>,
    split: Option<String>,
    num_samples: [Option<u64>; 3],
    mid_level_dataset_surplus: f64,
    add_extra_token_to_sequence: bool,
    drop_last_partial_validation_sequence: bool,
) -> PyResult<String> {
    let config = BuildConfig {
        blend: blend.map(blend_of),
        blend_per_split: blend_per_split.map(|b| b.map(|x| x.map(blend_of))),
        split,
        num_samples,
        mid_level_dataset_surplus,
        add_extra_token_to_sequence,
        drop_last_partial_validation_sequence,
        ..BuildConfig::new(random_seed, sequence_length)
    };
    serde_json::to_string(&config).map_err(|e| PyValueError::new_err(e.to_string()))
}

fn config_from(json: &str) -> PyResult<BuildConfig> {
    serde_json::from_str(json).map_err(|e| PyValueError::new_err(format!("config: {e}")))
}

/// Builds Megatron-Core's three splits of `config` (from [`megatron_config`]) over local
/// sources (prefixes of `.bin`/`.idx`, or any dataset dquant opens). With `cache_dir`, GPT
/// indices built before are read from there, and the ones built are kept there.
#[pyfunction]
#[pyo3(signature = (config, cache_dir=None))]
pub fn megatron_order(
    py: Python<'_>,
    config: &str,
    cache_dir: Option<std::path::PathBuf>,
) -> PyResult<MegatronOrder> {
    let config = config_from(config)?;
    py.detach(|| {
        let open = |p: &str| Dataset::open(Path::new(p), &OpenOptions::default()).map(Arc::new);
        let sources = Sources::open(&config.prefixes(), open)?;
        let store = cache_dir.map(DirStore::new);
        let store = store.as_ref().map(|s| s as &dyn IndexStore);
        let built = build_cached(&config, &mut |p| sources.lengths_of(p), store)?;
        Ok(MegatronOrder {
            built,
            sources,
            bufs: Mutex::new(Default::default()),
            lookups: Default::default(),
        })
    })
    .map_err(to_py)
}

#[pymethods]
impl MegatronOrder {
    /// Samples of split `split` (0 train, 1 valid, 2 test), or None where Megatron gives None.
    fn len(&self, split: usize) -> Option<u64> {
        self.built.splits.get(split)?.as_ref().map(TopLevel::len)
    }

    /// Whether the split is a `BlendedDataset` (its samples carry a `dataset_id`).
    fn is_blended(&self, split: usize) -> PyResult<bool> {
        Ok(matches!(self.split(split)?, TopLevel::Blended(_)))
    }

    /// Tokens of one sample: `sequence_length` (+1 with the extra token).
    fn sample_tokens(&self, split: usize) -> PyResult<u64> {
        Ok(self.split(split)?.sample_tokens())
    }

    /// Samples `indices`, stacked: see [`Batch`].
    fn batch<'py>(
        &self,
        py: Python<'py>,
        split: usize,
        indices: Vec<u64>,
        fields: &MegatronFields,
    ) -> PyResult<Batch<'py>> {
        let (rows, ids) = self.rows(py, split, &indices, fields.0.pad)?;
        fields.of(py, rows, ids)
    }

    /// What sample `idx` is made of: (dataset_id, [(source, sequence, offset, length)], pad).
    #[allow(clippy::type_complexity)]
    fn pieces(
        &self,
        split: usize,
        idx: u64,
    ) -> PyResult<(Option<i16>, Vec<(String, u64, u64, u64)>, u64)> {
        let s = self.split(split)?.sample(idx).map_err(to_py)?;
        let names = self.sources.names();
        let pieces = s
            .pieces
            .iter()
            .map(|p| (names[p.source].clone(), p.sequence, p.offset, p.length))
            .collect();
        Ok((s.dataset_id, pieces, s.pad))
    }

    /// Every sample of `split` that holds a token of sequence (document) `sequence` of
    /// source `source` (its index in `sources()`), ascending. The split's inverse tables are
    /// built once, on the first call.
    fn samples_of(
        &self,
        py: Python<'_>,
        split: usize,
        source: usize,
        sequence: u64,
    ) -> PyResult<Vec<u64>> {
        let top = self.split(split)?;
        let n = self.built.sources.len();
        if source >= n {
            return Err(PyValueError::new_err(format!(
                "source {source}: the build has {n} sources"
            )));
        }
        Ok(py.detach(|| {
            self.lookups[split]
                .get_or_init(|| Lookup::new(top))
                .samples_of(top, source, sequence)
        }))
    }

    /// The source prefixes, by source index.
    fn sources(&self) -> Vec<String> {
        self.built.sources.clone()
    }
}

/// The three splits of a config built by an agent next to the data; samples are read from
/// it by index (`dquant_client::AgentMegatron`), and this process holds no index.
#[pyclass(module = "dquant._dquant", frozen)]
pub struct AgentMegatronOrder {
    inner: Mutex<AgentMegatron>,
    layout: RecordLayout,
}

/// Has the agent at `agent` (`dquant://HOST:PORT` or its Unix socket path) build `config`
/// (from [`megatron_config`], prefixes naming its datasets `ROOT/PATH`), or find it built.
#[pyfunction]
#[pyo3(signature = (agent, config, wire_codec=""))]
pub fn megatron_agent_order(
    py: Python<'_>,
    agent: &str,
    config: &str,
    wire_codec: &str,
) -> PyResult<AgentMegatronOrder> {
    let config = config_from(config)?;
    let inner = py
        .detach(|| AgentMegatron::connect(agent, &config, wire_codec))
        .map_err(crate::to_py)?;
    Ok(AgentMegatronOrder {
        layout: inner.layout().clone(),
        inner: Mutex::new(inner),
    })
}

#[pymethods]
impl AgentMegatronOrder {
    /// Samples of split `split` (0 train, 1 valid, 2 test), or None where Megatron gives None.
    fn len(&self, split: usize) -> Option<u64> {
        self.layout.splits.get(split)?.map(|s| s.samples)
    }

    fn is_blended(&self, split: usize) -> PyResult<bool> {
        Ok(self.split(split)?.blended)
    }

    fn sample_tokens(&self, split: usize) -> PyResult<u64> {
        Ok(self.split(split)?.sample_tokens)
    }

    /// Samples `indices`, stacked: see [`Batch`].
    fn batch<'py>(
        &self,
        py: Python<'py>,
        split: usize,
        indices: Vec<u64>,
        fields: &MegatronFields,
    ) -> PyResult<Batch<'py>> {
        let (rows, ids) = self.rows(py, split, &indices, fields.0.pad)?;
        fields.of(py, rows, ids)
    }

    fn samples_of(&self, _split: usize, _source: usize, _sequence: u64) -> PyResult<()> {
        Err(pyo3::exceptions::PyNotImplementedError::new_err(
            "samples_of: an agent's build keeps its indices on the agent; open the config \
             without agent= to find a document's samples",
        ))
    }

    fn pieces(&self, _split: usize, _idx: u64) -> PyResult<()> {
        Err(pyo3::exceptions::PyNotImplementedError::new_err(
            "pieces: an agent's build keeps its indices on the agent; open the config \
             without agent= to see what a sample is made of",
        ))
    }

    /// The source datasets (`ROOT/PATH` on the agent), by dataset id.
    fn sources(&self) -> Vec<String> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.sources().to_vec()
    }

    /// Whether the agent had built this config before this open.
    fn was_cached(&self) -> bool {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.was_cached()
    }
}

impl AgentMegatronOrder {
    /// Samples `indices` of `split` from the agent as int64 rows (pads as `pad`).
    fn rows(
        &self,
        py: Python<'_>,
        split: usize,
        indices: &[u64],
        pad: i64,
    ) -> PyResult<(Array2<i64>, Option<Vec<i16>>)> {
        let blended = self.split(split)?.blended;
        let b = py
            .detach(|| {
                let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                m.batch(split, indices)
            })
            .map_err(crate::to_py)?;
        let rows = rows_of(&b, pad)?;
        let ids = blended.then(|| b.dataset_ids.iter().map(|&d| d as i16).collect());
        Ok((rows, ids))
    }

    fn split(&self, split: usize) -> PyResult<&SplitRecords> {
        self.layout.split(split).map_err(to_py)
    }
}

/// A batch as int64 rows, each sample's last `pad` tokens set to `pad`.
fn rows_of(b: &SampleBatch, pad: i64) -> PyResult<numpy::ndarray::Array2<i64>> {
    let n = b.pads.len();
    let w = b.sample_tokens;
    let mut rows = zeroed::<i64>(w, n)?;
    for (out, &t) in rows.iter_mut().zip(b.rows().flatten()) {
        *out = i64::from(t);
    }
    for (row, &p) in rows.chunks_mut(w.max(1)).zip(&b.pads) {
        let keep = w - (p as usize).min(w);
        row[keep..].fill(pad);
    }
    numpy::ndarray::Array2::from_shape_vec((n, w), rows)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A batch of samples: the int64 rows as read (pads as the pad id), then
/// `GPTDataset.__getitem__`'s fields stacked (tokens, labels, loss_mask, position_ids), then
/// the dataset ids of a blend's samples (None otherwise).
type Batch<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray2<f32>>,
    Bound<'py, PyArray2<i64>>,
    Option<Vec<i16>>,
);

/// Fills the fields of `rows` (each `w` tokens) into rows of `s` of each field.
fn fill_rows(
    rules: FieldRules,
    (rows, w): (&[i64], usize),
    (t, l, m, p): (&mut [i64], &mut [i64], &mut [f32], &mut [i64]),
    s: usize,
) {
    let each = rows
        .chunks_exact(w)
        .zip(t.chunks_exact_mut(s))
        .zip(l.chunks_exact_mut(s))
        .zip(m.chunks_exact_mut(s))
        .zip(p.chunks_exact_mut(s));
    for ((((row, tokens), labels), loss_mask), position_ids) in each {
        let out = Fields {
            tokens,
            labels,
            loss_mask,
            position_ids,
        };
        rules.fill(row, out);
    }
}

/// Threads for a batch of `n` samples: one per core (at most 4), none for fewer than 16.
fn read_threads(n: usize) -> usize {
    if n < 16 {
        return 1;
    }
    // Asked once: it reads the affinity mask and cgroup quota, which is no work for every batch.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |c| c.get().min(4)))
}

/// Types whose all-zero bytes are a value (0, 0.0).
///
/// # Safety
/// Only for types where every zero bit pattern is valid.
unsafe trait ZeroBits: Copy {}
// SAFETY: zero bits are 0 and 0.0.
unsafe impl ZeroBits for i64 {}
unsafe impl ZeroBits for f32 {}

/// A row buffer of `n` samples of `width` tokens, zeroed, or a MemoryError.
///
/// Zeroed by the allocator (`alloc_zeroed`: a batch's buffers are large, so they are fresh
/// pages the kernel hands over zeroed) rather than written with zeros here and then again
/// with the fields: a batch of 256 x 4,096 makes 28 MB of fields, and the second pass was a
/// tenth of `get_batch`.
fn zeroed<T: ZeroBits>(width: usize, n: usize) -> PyResult<Vec<T>> {
    let refuse = || {
        PyMemoryError::new_err(format!(
            "{n} samples of {width} tokens do not fit in memory"
        ))
    };
    let len = width.checked_mul(n).ok_or_else(refuse)?;
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| refuse())?;
    // SAFETY: the layout's size is not zero; the memory is zeroed, which is a value of T
    // (ZeroBits); the Vec owns it with the global allocator's layout for `len` T's.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<T>();
        if p.is_null() {
            return Err(refuse());
        }
        huge_pages(p.cast(), layout.size());
        Ok(Vec::from_raw_parts(p, len, len))
    }
}

/// Asks the kernel for huge pages under the whole 2 MiB pages of `len` bytes at `p`, before
/// they are first touched: a batch's fields are tens of MiB written once, and faulting them
/// in 4 KiB pages was most of `get_batch`'s time. Advice only: where the kernel has no huge
/// page to give, or transparent huge pages are off, nothing changes.
fn huge_pages(p: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = (p as usize).next_multiple_of(HUGE);
    let end = (p as usize + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: the range lies inside the allocation just made at `p`; MADV_HUGEPAGE
        // changes how it is backed, never its contents.
        let _ = unsafe {
            rustix::mm::madvise(
                start as *mut std::ffi::c_void,
                end - start,
                rustix::mm::Advice::LinuxHugepage,
            )
        };
    }
}

/// How a config makes `GPTDataset.__getitem__`'s fields from sample rows
/// ([`dquant_megatron::fields`]), given to either order's `batch`.
#[pyclass(module = "dquant._dquant", frozen)]
pub struct MegatronFields(FieldRules);

#[pymethods]
impl MegatronFields {
    #[new]
    #[pyo3(signature = (*, eod, pad, reset_position_ids, eod_mask_loss, add_extra_token_to_sequence))]
    fn new(
        eod: i64,
        pad: i64,
        reset_position_ids: bool,
        eod_mask_loss: bool,
        add_extra_token_to_sequence: bool,
    ) -> Self {
        MegatronFields(FieldRules {
            eod,
            pad,
            reset_position_ids,
            eod_mask_loss,
            add_extra_token_to_sequence,
        })
    }
}

impl MegatronFields {
    /// `rows`, each row's fields, and `ids`, as a [`Batch`].
    fn of<'py>(
        &self,
        py: Python<'py>,
        rows: Array2<i64>,
        ids: Option<Vec<i16>>,
    ) -> PyResult<Batch<'py>> {
        let rules = self.0;
        let (n, w) = rows.dim();
        let flat = rows
            .as_slice()
            .ok_or_else(|| PyValueError::new_err("rows are not contiguous"))?;
        let s = rules.sequence_length(w);
        let (mut t, mut l) = (zeroed::<i64>(s, n)?, zeroed::<i64>(s, n)?);
        let (mut m, mut p) = (zeroed::<f32>(s, n)?, zeroed::<i64>(s, n)?);
        py.detach(|| {
            let (w, s) = (w.max(1), s.max(1));
            let threads = read_threads(n);
            if threads < 2 {
                return fill_rows(rules, (flat, w), (&mut t, &mut l, &mut m, &mut p), s);
            }
            // Rows side by side, as they were read.
            let per = n.div_ceil(threads);
            std::thread::scope(|scope| {
                let parts = flat
                    .chunks(per * w)
                    .zip(t.chunks_mut(per * s))
                    .zip(l.chunks_mut(per * s))
                    .zip(m.chunks_mut(per * s))
                    .zip(p.chunks_mut(per * s));
                for ((((rows, t), l), m), p) in parts {
                    scope.spawn(move || fill_rows(rules, (rows, w), (t, l, m, p), s));
                }
            });
        });
        let shaped = |v: Vec<i64>| {
            Array2::from_shape_vec((n, s), v).map_err(|e| PyValueError::new_err(e.to_string()))
        };
        let mask =
            Array2::from_shape_vec((n, s), m).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            rows.into_pyarray(py),
            shaped(t)?.into_pyarray(py),
            shaped(l)?.into_pyarray(py),
            mask.into_pyarray(py),
            shaped(p)?.into_pyarray(py),
            ids,
        ))
    }
}
