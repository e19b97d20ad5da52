//! Provenance for Python: `dquant.locate` and `dquant.samples_of` (see `dquant/__init__.py`)
//! over the host API's [`dquant_client::Provenance`], which opens a plan's sources once and
//! answers from their document indexes.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::{plan_from_json, to_py};

/// A plan bound to its opened sources; the Python side keeps one per plan it was asked about.
#[pyclass(module = "dquant._dquant")]
pub struct Provenance {
    inner: Mutex<dquant_client::Provenance>,
}

#[pymethods]
impl Provenance {
    #[new]
    fn new(py: Python<'_>, plan_json: &str) -> PyResult<Self> {
        let plan = plan_from_json(plan_json)?;
        let p = py
            .detach(|| dquant_client::Provenance::open(&plan))
            .map_err(to_py)?;
        Ok(Provenance {
            inner: Mutex::new(p),
        })
    }

    /// Global sample `sample` as `dquant locate --json` prints it.
    fn locate_json(&self, py: Python<'_>, sample: u64) -> PyResult<String> {
        let at = py.detach(|| self.lock().locate(sample)).map_err(to_py)?;
        serde_json::to_string(&at).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The global samples holding any token of document `document` of source `source`, in
    /// samples `start..end` (`None`: the plan's start or end).
    #[pyo3(signature = (source, document, start=None, end=None))]
    fn samples_of(
        &self,
        py: Python<'_>,
        source: usize,
        document: u64,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<Vec<u64>> {
        py.detach(|| {
            let mut p = self.lock();
            let range = match (start, end) {
                (None, None) => None,
                (s, e) => Some(s.unwrap_or(0)..e.unwrap_or(p.schedule().total_samples())),
            };
            p.samples_of(source, document, range)
        })
        .map_err(to_py)
    }
}

impl Provenance {
    fn lock(&self) -> std::sync::MutexGuard<'_, dquant_client::Provenance> {
        // A panic inside a call leaves nothing half-updated that a later call relies on: the
        // blend index only ever gains checkpoints.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}
