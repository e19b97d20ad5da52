//! The two ends of a `dquant.torch.DataLoader` worker's ring (`dquant_client`'s loader
//! rings): the worker process makes its sub-rank's batches straight into a shared-memory ring,
//! and the loop's process reads them in place through an ordinary [`Reader`], so neither runs
//! Python per batch.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use dquant_client::shm;
use dquant_plan::Cursor;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::{cursor_from, plan_from_json, to_py, Reader};

/// The Unix socket `fd`, which the caller gives up (Python's `socket.detach()`).
fn socket(fd: i32) -> PyResult<UnixStream> {
    if fd < 0 {
        return Err(PyValueError::new_err(format!(
            "not a file descriptor: {fd}"
        )));
    }
    // SAFETY: the caller hands the descriptor over and keeps no other use of it (it detached
    // it from its socket object), so it is open and owned by nobody else.
    Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// In a DataLoader worker: runs `plan_json` from `cursor_json` (empty: the start) and makes
/// every batch into the ring the loop hands over on the Unix socket `fd` (taken over), until
/// the stream ends or the loop closes the ring. The loop gets any error too, after the last
/// complete batch.
#[pyfunction]
#[pyo3(signature = (plan_json, cursor_json, fd))]
pub(crate) fn serve_loader_ring(
    py: Python<'_>,
    plan_json: &str,
    cursor_json: &str,
    fd: i32,
) -> PyResult<()> {
    let sock = socket(fd)?;
    let plan = plan_from_json(plan_json)?;
    let cursor = cursor_from(cursor_json)?.unwrap_or(Cursor::START);
    py.detach(|| dquant_client::serve_loader_ring(&plan, cursor, sock))
        .map_err(to_py)
}

/// In the loop's process: a reader of the batches the DataLoader worker at the other end of
/// the Unix socket `fd` (taken over) makes from `plan_json`, through a ring of at most
/// `max_slots` slots (and at most an agent's ring of the plan by default: 8 MiB of batches; at
/// least 2). Waits until the worker has opened its plan; its error if it could not.
#[pyfunction]
pub(crate) fn open_loader_ring(
    py: Python<'_>,
    plan_json: &str,
    fd: i32,
    max_slots: u32,
) -> PyResult<Reader> {
    let sock = socket(fd)?;
    let plan = plan_from_json(plan_json)?;
    let slots = shm::default_slots(shm::slot_size(&plan)).min(max_slots.max(2));
    let reader = py
        .detach(|| dquant_client::Reader::from_loader_ring(&plan, sock, slots))
        .map_err(to_py)?;
    Ok(Reader::wrap(reader))
}
