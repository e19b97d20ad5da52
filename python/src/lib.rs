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

mod batch;
mod loader_ring;
mod locate;
mod megatron;

use std::sync::{Mutex, MutexGuard};

use dquant_client::{
    open_at, open_shared, subscribe, ClientError, EngineError, Offload, Share, Transport,
};
use dquant_plan::{Cursor, OutputDType};
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
pub(crate) fn to_py(e: ClientError) -> PyErr {
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
pub(crate) struct Reader {
    // A mutex because Python may call in from any thread; `None` once closed.
    inner: Mutex<Option<dquant_client::Reader>>,
    output: OutputDType,
    sample_len: usize,
}

impl Reader {
    pub(crate) fn wrap(reader: dquant_client::Reader) -> Self {
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
pub(crate) fn cursor_from(text: &str) -> PyResult<Option<Cursor>> {
    if text.is_empty() {
        return Ok(None);
    }
    Cursor::from_json(text)
        .map(Some)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A cursor as a dict: `epoch` and `consumed_samples`, and `blend` / `delivered` when set.
pub(crate) fn cursor_dict<'py>(py: Python<'py>, c: &Cursor) -> PyResult<Bound<'py, PyDict>> {
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
pub(crate) fn plan_from_json(text: &str) -> PyResult<dquant_plan::Plan> {
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
        Ok(Some(batch::array(py, batch)?))
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.next_batch(py)
    }

    /// Waits at most `timeout` seconds for the next batch to be at hand (a batch, the end or
    /// an error): `True` once it is, `False` when the time ran out. Nothing is consumed.
    /// Ctrl-C interrupts the wait.
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let until = std::time::Instant::now()
            + std::time::Duration::try_from_secs_f64(timeout.max(0.0))
                .map_err(|e| PyValueError::new_err(format!("timeout {timeout}: {e}")))?;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            let slice = left.min(SIGNAL_CHECK_EVERY);
            let ready = py
                .detach(|| self.with(|r| r.wait_ready(slice)))?
                .map_err(to_py)?;
            if ready || left <= slice {
                return Ok(ready);
            }
            py.check_signals()?;
        }
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

/// Slots for each of `readers` shared-memory rings of `plan_json`'s batches that one loop
/// reads in turn (`dquant_client::shm::shared_slots`): what a DataLoader's sessions of an
/// agent ask for, one ring each.
#[pyfunction]
fn ring_slots(plan_json: &str, readers: u32) -> PyResult<u32> {
    let plan = plan_from_json(plan_json)?;
    Ok(dquant_client::shm::shared_slots(
        dquant_client::shm::slot_size(&plan),
        readers,
    ))
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

pub(crate) fn dtype_name(o: OutputDType) -> &'static str {
    match o {
        OutputDType::U16 => "uint16",
        OutputDType::I32 => "int32",
        OutputDType::I64 => "int64",
    }
}

/// The Rust half of the `dquant` package; use `dquant.open` and `dquant.torch`.
#[pymodule]
fn _dquant(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open_reader, m)?)?;
    m.add_function(wrap_pyfunction!(subscribe_reader, m)?)?;
    m.add_function(wrap_pyfunction!(merge_cursors_json, m)?)?;
    m.add_function(wrap_pyfunction!(check_plan_change, m)?)?;
    m.add_function(wrap_pyfunction!(transports, m)?)?;
    m.add_function(wrap_pyfunction!(ring_slots, m)?)?;
    m.add_function(wrap_pyfunction!(loader_ring::serve_loader_ring, m)?)?;
    m.add_function(wrap_pyfunction!(loader_ring::open_loader_ring, m)?)?;
    m.add_class::<Reader>()?;
    m.add_class::<batch::Batch>()?;
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
