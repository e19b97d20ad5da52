//! `dquant._dquant`: the Rust half of the Python package. It wraps the host API's reader
//! ([`dquant_client::Reader`]) and hands batches to Python as numpy arrays over the memory
//! the batch was made in: a shared-memory ring slot the agent wrote, or the buffer the batch
//! was assembled or decoded into. Nothing is copied for the hand-over.
//!
//! Each array's base is a [`Batch`] object that owns an [`OwnedBatch`]; the memory lives as
//! long as the array (or anything viewing it, such as a `torch.from_numpy` tensor) does, and
//! goes back to the ring or the reader's buffer pool when the last of them dies. Kept arrays
//! never stall a ring: the ring copies out a batch kept for long (see
//! `dquant_transport::ring::RingConsumer`).
//!
//! The interpreter lock is released while a batch is being produced or waited for, so other
//! Python threads (a DataLoader's pin-memory thread, a training step) run meanwhile.
//! Argument handling that is easier in Python (plan dicts and files, agent URIs, transports)
//! lives in `dquant/__init__.py`; this module takes a plan as JSON.

mod locate;
mod megatron;

use std::sync::{Mutex, MutexGuard};

use dquant_client::{
    open_at, open_shared, subscribe, ClientError, EngineError, Offload, OwnedBatch, Share, Tokens,
    Transport,
};
use dquant_plan::{Cursor, DocStarts, OutputDType};
use numpy::ndarray::ArrayView2;
use numpy::{Element, IntoPyArray, PyArray1, PyArray2};
use pyo3::exceptions::{
    PyConnectionError, PyFileNotFoundError, PyIndexError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pyo3::create_exception!(
    dquant._dquant,
    AgentError,
    PyRuntimeError,
    "The agent refused or failed a session, went away, or sent something malformed; the message is the agent's or says what was delivered."
);

pyo3::create_exception!(
    dquant._dquant,
    AgentShutdown,
    AgentError,
    "The agent shut down gracefully after the last batch this reader delivered; the reader's `cursor()` is where to open the plan again (on another agent, or this one once back): nothing is skipped or repeated. `consumed_samples` is its position (the whole cursor when the stream started at a plain one)."
);

/// Maps a host API error to the Python exception a user expects, with the Rust message.
fn to_py(e: ClientError) -> PyErr {
    let msg = e.to_string();
    if e.is_not_found() {
        return PyFileNotFoundError::new_err(msg);
    }
    if let Some(n) = e.resume_cursor() {
        return Python::attach(|py| {
            let err = AgentShutdown::new_err(msg);
            // Setting an attribute on a fresh exception object cannot fail but for memory.
            let _ = err.value(py).setattr("consumed_samples", n);
            err
        });
    }
    match e {
        ClientError::Engine(EngineError::Source { .. }) => PyOSError::new_err(msg),
        ClientError::Engine(_) | ClientError::Usage(_) => PyValueError::new_err(msg),
        ClientError::Connect(_) => PyConnectionError::new_err(msg),
        ClientError::IndexOutOfRange(_) => PyIndexError::new_err(msg),
        // Agent, NotFound (an agent's), Wire, and whatever later versions add.
        _ => AgentError::new_err(msg),
    }
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on a closed dquant reader")
}

/// How long a wait on the agent runs without the GIL before signals are checked: Ctrl-C
/// during a stalled `next()` raises KeyboardInterrupt within about this long.
const SIGNAL_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// A reader's batches as numpy arrays (see the module docs).
#[pyclass(module = "dquant._dquant")]
struct Reader {
    // A mutex because Python may call in from any thread; `None` once closed.
    inner: Mutex<Option<dquant_client::Reader>>,
    output: OutputDType,
    sample_len: usize,
}

impl Reader {
    fn wrap(reader: dquant_client::Reader) -> Self {
        Reader {
            output: reader.output(),
            sample_len: reader.sample_len(),
            inner: Mutex::new(Some(reader)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<dquant_client::Reader>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with<T>(&self, f: impl FnOnce(&mut dquant_client::Reader) -> T) -> PyResult<T> {
        match self.lock().as_mut() {
            Some(r) => Ok(f(r)),
            None => Err(closed()),
        }
    }

    /// Runs `op` without the GIL once the next batch is at hand, waiting in slices of
    /// [`SIGNAL_CHECK_EVERY`] and checking signals between them: Ctrl-C raises
    /// KeyboardInterrupt before `op` runs, so nothing is consumed. Batches kept for long are
    /// copied out first, while no Python thread runs, so that no write to a kept array can
    /// race the copy.
    fn when_ready<T: Send>(
        &self,
        py: Python<'_>,
        op: impl Fn(&mut dquant_client::Reader) -> Result<T, ClientError> + Sync,
    ) -> PyResult<T> {
        loop {
            self.with(|r| r.make_room())?.map_err(to_py)?;
            let got = py
                .detach(|| {
                    self.with(|r| match r.wait_ready(SIGNAL_CHECK_EVERY)? {
                        true => op(r).map(Some),
                        false => Ok(None),
                    })
                })?
                .map_err(to_py)?;
            match got {
                Some(v) => return Ok(v),
                None => py.check_signals()?,
            }
        }
    }
}

/// Opens `plan_json` (a plan as JSON) at the cursor `cursor_json` (a cursor as JSON, as
/// `Reader.cursor()` gives it; empty for the start): on the agent at `agent` when `offload`,
/// else in this process (`agent` may then name the agent that serves the plan's relative
/// sources, or be empty). With `share` (offloaded only), as the shared stream of that name,
/// waiting for `share_group` readers before its first batch.
#[pyfunction]
#[pyo3(signature = (plan_json, agent, offload, cursor_json="", share="", share_group=0))]
fn open_reader(
    py: Python<'_>,
    plan_json: &str,
    agent: &str,
    offload: bool,
    cursor_json: &str,
    share: &str,
    share_group: u32,
) -> PyResult<Reader> {
    let plan = plan_from_json(plan_json)?;
    let cursor = cursor_from(cursor_json)?.unwrap_or(Cursor::START);
    let offload = if offload { Offload::Yes } else { Offload::No };
    let reader = py
        .detach(|| match share {
            "" => open_at(agent, &plan, cursor, offload),
            name => {
                let share = Share {
                    name: name.to_string(),
                    group: share_group,
                };
                open_shared(agent, &plan, cursor, &share)
            }
        })
        .map_err(to_py)?;
    Ok(Reader::wrap(reader))
}

/// Joins the shared stream `share` on the agent at `agent`, at the cursor `cursor_json` (a
/// batch boundary still in the stream's window) or, empty, at the stream's current cursor.
#[pyfunction]
#[pyo3(signature = (agent, share, cursor_json=""))]
fn subscribe_reader(
    py: Python<'_>,
    agent: &str,
    share: &str,
    cursor_json: &str,
) -> PyResult<Reader> {
    let at = cursor_from(cursor_json)?;
    let reader = py
        .detach(|| subscribe(agent, share, at.as_ref()))
        .map_err(to_py)?;
    Ok(Reader::wrap(reader))
}

/// The cursor in `text` (JSON), or `None` when empty.
fn cursor_from(text: &str) -> PyResult<Option<Cursor>> {
    if text.is_empty() {
        return Ok(None);
    }
    Cursor::from_json(text)
        .map(Some)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A cursor as a dict: `epoch` and `consumed_samples`, and `blend` / `delivered` when set.
fn cursor_dict<'py>(py: Python<'py>, c: &Cursor) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("epoch", c.epoch)?;
    d.set_item("consumed_samples", c.consumed_samples)?;
    if !c.blend.is_empty() {
        d.set_item("blend", c.blend.clone())?;
    }
    if !c.delivered.is_empty() {
        d.set_item("delivered", c.delivered.clone())?;
    }
    Ok(d)
}

/// Merges the cursors (as JSON) of all sub-ranks of one run, `cursors_json[r]` being sub-rank
/// `r`'s, into one cursor (as JSON) that any number of ranks resumes from: nothing lost,
/// nothing repeated (dquant-plan's `merge_cursors`).
#[pyfunction]
fn merge_cursors_json(cursors_json: Vec<String>) -> PyResult<String> {
    let cursors = cursors_from_json(&cursors_json)?;
    dquant_plan::merge_cursors(&cursors)
        .map(|c| c.to_json())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A plan from JSON; a bad one is a ValueError with the plan's message.
fn plan_from_json(text: &str) -> PyResult<dquant_plan::Plan> {
    dquant_plan::Plan::from_json(text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Cursors from JSON, `texts[r]` being `cursors[r]` in the message of a bad one.
fn cursors_from_json(texts: &[String]) -> PyResult<Vec<Cursor>> {
    texts
        .iter()
        .enumerate()
        .map(|(r, t)| {
            Cursor::from_json(t).map_err(|e| PyValueError::new_err(format!("cursors[{r}]: {e}")))
        })
        .collect()
}

/// Whether the cursors (as JSON) saved while running `saved_json` may continue under
/// `new_json`, nothing lost or repeated: returns what changes, or raises ValueError saying why
/// not (dquant-client's `check_plan_change`; `agent` serves relative source names, or is
/// empty).
#[pyfunction]
fn check_plan_change(
    py: Python<'_>,
    saved_json: &str,
    new_json: &str,
    cursors_json: Vec<String>,
    agent: &str,
) -> PyResult<String> {
    let (saved, new) = (plan_from_json(saved_json)?, plan_from_json(new_json)?);
    let cursors = cursors_from_json(&cursors_json)?;
    py.detach(|| dquant_client::check_plan_change(agent, &saved, &new, &cursors))
        .map_err(to_py)
}

#[pymethods]
impl Reader {
    /// The next batch as a numpy array of shape `(samples, seq_len + 1)` in the plan's output
    /// dtype, viewing the batch's memory in place; `None` at the end of the stream.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let batch = self.when_ready(py, |r| r.next_owned())?;
        let Some(batch) = batch else {
            return Ok(None);
        };
        let owner = Bound::new(py, Batch { batch })?;
        Ok(Some(array_of(&owner)?))
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.next_batch(py)
    }

    /// Fills the writable buffer `buf` (bytearray, memoryview, numpy array, ...) with the next
    /// bytes of the stream, batches back to back in the output dtype, as the original design's
    /// `read(fd, buf)`. Returns the number of bytes written; 0 at the end.
    fn read(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        let view = pyo3::types::PyMemoryView::from(buf)?;
        if view.getattr("readonly")?.is_truthy()? {
            return Err(PyValueError::new_err("read: the buffer is read-only"));
        }
        if !view.getattr("c_contiguous")?.is_truthy()? {
            return Err(PyValueError::new_err("read: the buffer must be contiguous"));
        }
        let np = py.import("numpy")?;
        let bytes = np.call_method1(
            "frombuffer",
            (view.call_method1("cast", ("B",))?, np.getattr("uint8")?),
        )?;
        self.readinto(py, bytes.extract()?)
    }

    /// As [`read`](Reader::read), into a writable uint8 numpy array.
    fn readinto(
        &self,
        py: Python<'_>,
        mut buf: numpy::PyReadwriteArray1<'_, u8>,
    ) -> PyResult<usize> {
        let out = buf
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("read: the buffer must be contiguous"))?;
        // The buffer is a plain byte slice; nothing Python runs meanwhile may resize it (numpy
        // arrays over a buffer pin it).
        let (ptr, len) = (out.as_mut_ptr() as usize, out.len());
        // Signals are checked only before the first byte: once bytes are written, the read
        // finishes, so a KeyboardInterrupt never drops delivered bytes.
        self.when_ready(py, |r| {
            // SAFETY: `ptr`/`len` come from the live, borrowed, contiguous array above, whose
            // borrow outlives this call; `op` runs once, so the slice is never aliased.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            r.read(out)
        })
    }

    /// Where a resumed reader would continue: `{"epoch": ..., "consumed_samples": ...}`, with
    /// `"blend"` (the blend's per-source counts, when known) and `"delivered"` (samples a
    /// merged cursor listed past its watermark) when set.
    fn cursor<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.with(|r| r.cursor())?;
        cursor_dict(py, &c)
    }

    /// How much of each source the stream consumed so far, in plan order: a list of
    /// `{"samples": N, "epochs": E}` (E = N / the source's samples per epoch), or `None` when
    /// unknown.
    fn source_use<'py>(&self, py: Python<'py>) -> PyResult<Option<Vec<Bound<'py, PyDict>>>> {
        let Some(used) = self.with(|r| r.source_use())? else {
            return Ok(None);
        };
        let dicts = used
            .iter()
            .map(|u| {
                let d = PyDict::new(py);
                d.set_item("samples", u.samples)?;
                d.set_item("epochs", u.epochs)?;
                Ok(d)
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Some(dicts))
    }

    /// Tokens per sample: `seq_len + 1`.
    #[getter]
    fn sample_len(&self) -> usize {
        self.sample_len
    }

    /// The numpy dtype name of the batches: `uint16`, `int32` or `int64`.
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.output)
    }

    /// Batches in this rank's whole stream (from the start, not from the cursor).
    #[getter]
    fn rank_batches(&self) -> PyResult<u64> {
        self.with(|r| r.rank_batches())
    }

    /// Samples in this rank's whole stream.
    #[getter]
    fn rank_samples(&self) -> PyResult<u64> {
        self.with(|r| r.rank_samples())
    }

    /// How batches arrive: `"local"` (in this process), `"tcp"` or `"shm"` (from an agent).
    #[getter]
    fn transport(&self) -> PyResult<&'static str> {
        self.with(|r| transport_name(r.transport()))
    }

    /// Whether the reader is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// Ends the session (an agent's is closed at once). Arrays already handed out stay valid.
    fn close(&self, py: Python<'_>) {
        let r = self.lock().take();
        py.detach(move || drop(r));
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        match self.lock().as_ref() {
            None => "<dquant.Reader closed>".to_string(),
            Some(r) => {
                let c = r.cursor();
                format!(
                    "<dquant.Reader {} {} x{} at epoch {} consumed_samples {}>",
                    transport_name(r.transport()),
                    dtype_name(self.output),
                    self.sample_len,
                    c.epoch,
                    c.consumed_samples
                )
            }
        }
    }
}

/// The transports an offloaded reader may use, by name (`tcp`, `shm`, ...): the transport
/// registry's own list, so Python checks what the library accepts.
#[pyfunction]
fn transports() -> Vec<&'static str> {
    Transport::all().map(Transport::as_str).collect()
}

fn transport_name(t: Option<Transport>) -> &'static str {
    t.map_or("local", Transport::as_str)
}

fn dtype_name(o: OutputDType) -> &'static str {
    match o {
        OutputDType::U16 => "uint16",
        OutputDType::I32 => "int32",
        OutputDType::I64 => "int64",
    }
}

/// The memory of one batch: the base object of the batch's numpy array. It keeps the ring
/// slot or buffer alive while any array or tensor views it.
#[pyclass(module = "dquant._dquant", frozen)]
struct Batch {
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

/// The Rust half of the `dquant` package; use `dquant.open` and `dquant.torch`.
#[pymodule]
fn _dquant(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open_reader, m)?)?;
    m.add_function(wrap_pyfunction!(subscribe_reader, m)?)?;
    m.add_function(wrap_pyfunction!(merge_cursors_json, m)?)?;
    m.add_function(wrap_pyfunction!(check_plan_change, m)?)?;
    m.add_function(wrap_pyfunction!(transports, m)?)?;
    m.add_class::<Reader>()?;
    m.add_class::<Batch>()?;
    m.add_class::<locate::Provenance>()?;
    m.add_function(wrap_pyfunction!(megatron::megatron_config, m)?)?;
    m.add_function(wrap_pyfunction!(megatron::megatron_order, m)?)?;
    m.add_function(wrap_pyfunction!(megatron::megatron_agent_order, m)?)?;
    m.add_class::<megatron::MegatronOrder>()?;
    m.add_class::<megatron::AgentMegatronOrder>()?;
    m.add_class::<megatron::MegatronFields>()?;
    m.add("AgentError", m.py().get_type::<AgentError>())?;
    m.add("AgentShutdown", m.py().get_type::<AgentShutdown>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
