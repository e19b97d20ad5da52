//! `dquant.Batch`: the memory of one batch, as the base object of the numpy arrays that view
//! it (the batch, its inputs and labels), and the per-batch outputs made from its document
//! starts and origins (position ids, loss mask, cu_seqlens, provenance rows).

use dquant_client::{OwnedBatch, Tokens};
use dquant_plan::DocStarts;
use numpy::ndarray::ArrayView2;
use numpy::{Element, IntoPyArray, PyArray1, PyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{cursor_dict, dtype_name};

/// `batch` as a `(samples, sample_len)` numpy array over its memory, whose base owns it.
pub(crate) fn array(py: Python<'_>, batch: OwnedBatch) -> PyResult<Bound<'_, PyAny>> {
    let owner = Bound::new(py, Batch { batch })?;
    array_of(&owner)
}

/// The memory of one batch: the base object of the batch's numpy array. It keeps the ring
/// slot or buffer alive while any array or tensor views it.
#[pyclass(module = "dquant._dquant", frozen)]
pub(crate) struct Batch {
    batch: OwnedBatch,
}

#[pymethods]
impl Batch {
    /// Index of the batch in the rank's stream.
    #[getter]
    fn index(&self) -> u64 {
        self.batch.index
    }

    /// Samples in the batch (the last batch of a stream may be short).
    #[getter]
    fn samples(&self) -> usize {
        self.batch.samples
    }

    /// The cursor after this batch: `(epoch, consumed_samples)`.
    #[getter]
    fn cursor(&self) -> (u64, u64) {
        (self.batch.cursor.epoch, self.batch.cursor.consumed_samples)
    }

    /// The whole cursor after this batch, as `Reader.cursor()` gives it.
    #[getter]
    fn full_cursor<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cursor_dict(py, &self.batch.cursor)
    }

    /// Whether the memory is a shared-memory ring slot the agent wrote (else a heap buffer).
    #[getter]
    fn in_ring(&self) -> bool {
        self.batch.in_ring()
    }

    /// Address of the first token (what the array's `ctypes.data` is).
    #[getter]
    fn address(&self) -> usize {
        self.batch.bytes().as_ptr() as usize
    }

    /// Bytes of tokens.
    #[getter]
    fn nbytes(&self) -> usize {
        self.batch.bytes().len()
    }

    /// `(inputs, labels)`: views of the batch's first and last `seq_len` tokens of each
    /// sample, shape `(samples, seq_len)`, over the same memory (what a training step takes;
    /// no copy).
    fn inputs_and_labels<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let b = &slf.get().batch;
        let (rows, l) = (b.samples, b.sample_len);
        Ok(match b.tokens() {
            Tokens::U16(t) => shifted_pair(t, rows, l, slf)?,
            Tokens::I32(t) => shifted_pair(t, rows, l, slf)?,
            Tokens::I64(t) => shifted_pair(t, rows, l, slf)?,
        })
    }

    /// Where documents start inside each sample, when the plan has `boundaries`:
    /// `(offsets, starts)`, uint32 arrays; sample `k`'s starts (input positions in
    /// `1..=seq_len`) are `starts[offsets[k]:offsets[k + 1]]`. `None` without boundaries.
    #[getter]
    fn doc_starts<'py>(&self, py: Python<'py>) -> Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let d = self.batch.docs.as_ref()?;
        Some((
            PyArray1::from_slice(py, d.offsets()).into_any(),
            PyArray1::from_slice(py, d.starts()).into_any(),
        ))
    }

    /// Each sample's origins, when the plan has `provenance`: int64 of shape `(pieces, 5)`,
    /// one row a piece, `(sample, source, document, offset, length)`; a sample's rows in order
    /// are its `seq_len + 1` tokens. `None` without provenance.
    #[getter]
    fn provenance<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(o) = self.batch.origins.as_ref() else {
            return Ok(None);
        };
        let rows = (0..o.samples()).flat_map(|k| {
            o.sample(k).map(move |p| {
                let n = |x: u64| x as i64;
                [
                    k as i64,
                    i64::from(p.source),
                    n(p.document),
                    n(p.offset),
                    i64::from(p.length),
                ]
            })
        });
        let flat: Vec<i64> = rows.flatten().collect();
        let a = numpy::PyArrayMethods::reshape(&PyArray1::from_vec(py, flat), [o.pieces(), 5])?;
        Ok(Some(a.into_any()))
    }

    /// `position_ids`, int64 of shape `(samples, seq_len)`, restarting at each document
    /// (Megatron's `reset_position_ids`).
    fn position_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let d = self.docs("position_ids")?;
        grid(py, d.position_ids::<i64>(), d)
    }

    /// `loss_mask`, float32 of shape `(samples, seq_len)`: 0 where the target is another
    /// document's first token (Megatron's `eod_mask_loss`), else 1.
    fn loss_mask<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let d = self.docs("loss_mask")?;
        grid(py, d.loss_mask(1.0f32, 0.0), d)
    }

    /// `(loss_mask, position_ids)` in one call, each `None` unless `which` asks for it (bit 0:
    /// loss_mask, bit 1: position_ids): what `TokenDataset` takes for every batch.
    fn masks<'py>(&self, py: Python<'py>, which: u8) -> PyResult<Masks<'py>> {
        let d = self.docs("masks")?;
        let mask = match which & 1 {
            0 => None,
            _ => Some(grid(py, d.loss_mask(1.0f32, 0.0), d)?),
        };
        let pos = match which & 2 {
            0 => None,
            _ => Some(grid(py, d.position_ids::<i64>(), d)?),
        };
        Ok((mask, pos))
    }

    /// `(cu_seqlens, max_seqlen)`: int32 offsets of each document segment of the batch's
    /// inputs laid end to end (`samples × seq_len` tokens; a segment never spans two
    /// samples), and the longest segment, for variable-length attention kernels.
    fn cu_seqlens<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, i32)> {
        let d = self.docs("cu_seqlens")?;
        let mut v = Vec::new();
        let max = d.cu_seqlens(&mut v);
        Ok((PyArray1::from_vec(py, v).into_any(), max))
    }

    fn __repr__(&self) -> String {
        format!(
            "<dquant.Batch {} of {} samples x {} {} in {}>",
            self.batch.index,
            self.batch.samples,
            self.batch.sample_len,
            dtype_name(self.batch.output),
            if self.batch.in_ring() {
                "a ring slot"
            } else {
                "a heap buffer"
            }
        )
    }
}

/// `(loss_mask, position_ids)`, each when asked for.
type Masks<'py> = (Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>);

impl Batch {
    fn docs(&self, what: &str) -> PyResult<&DocStarts> {
        self.batch.docs.as_ref().ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what}: the plan has no boundaries (set boundaries = \"eod\" with eod = ID, or \"documents\")"
            ))
        })
    }
}

/// `v` (one value per input position of `d`'s batch) as a `(samples, seq_len)` array.
fn grid<'py, T: Element>(py: Python<'py>, v: Vec<T>, d: &DocStarts) -> PyResult<Bound<'py, PyAny>> {
    let shape = (d.samples(), d.seq_len() as usize);
    let a = numpy::ndarray::Array2::from_shape_vec(shape, v)
        .map_err(|e| PyRuntimeError::new_err(format!("outputs of shape {shape:?}: {e}")))?;
    Ok(a.into_pyarray(py).into_any())
}

/// A `(samples, sample_len)` array over `owner`'s memory, with `owner` as its base.
fn array_of<'py>(owner: &Bound<'py, Batch>) -> PyResult<Bound<'py, PyAny>> {
    let b = &owner.get().batch;
    let (rows, l) = (b.samples, b.sample_len);
    Ok(match b.tokens() {
        Tokens::U16(t) => view(t, rows, l, l, 0, owner)?,
        Tokens::I32(t) => view(t, rows, l, l, 0, owner)?,
        Tokens::I64(t) => view(t, rows, l, l, 0, owner)?,
    })
}

/// The inputs and the labels of `rows` samples of `l` tokens: their first and last `l - 1`
/// tokens, as views with `owner` as their base.
fn shifted_pair<'py, T: Element>(
    tokens: &[T],
    rows: usize,
    l: usize,
    owner: &Bound<'py, Batch>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let cols = l.saturating_sub(1);
    Ok((
        view(tokens, rows, l, cols, 0, owner)?,
        view(tokens, rows, l, cols, 1, owner)?,
    ))
}

/// The `(rows, cols)` view of `tokens`, rows of `row_len` back to back, that starts `skip`
/// tokens into each row, with `owner` as its base: the whole batch (`cols = row_len`), or its
/// inputs or labels (`cols = row_len - 1`, `skip` 0 or 1).
fn view<'py, T: Element>(
    tokens: &[T],
    rows: usize,
    row_len: usize,
    cols: usize,
    skip: usize,
    owner: &Bound<'py, Batch>,
) -> PyResult<Bound<'py, PyAny>> {
    use numpy::ndarray::ShapeBuilder;
    let shape = (rows, cols).strides((row_len, 1));
    let v = ArrayView2::from_shape(shape, tokens.get(skip..).unwrap_or(&[])).map_err(|e| {
        PyRuntimeError::new_err(format!(
            "batch view ({rows}, {cols}) of rows of {row_len}: {e}"
        ))
    })?;
    // SAFETY: `owner` becomes the array's base and owns the memory `v` views: an
    // `OwnedBatch`, whose tokens neither move nor change while it lives (a ring slot pinned
    // or detached in place, or a heap buffer that is only given back on drop).
    let arr = unsafe { PyArray2::<T>::borrow_from_array(&v, owner.clone().into_any()) };
    Ok(arr.into_any())
}
