//! The mount's one connection to its agent: dialed when first needed, dialed again after a
//! failure, so an agent that restarts is found again without remounting.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use dquant_engine::SourceError;
use dquant_format::idx_layout::IdxPart;
use dquant_proto::v1::{DatasetStat, IndexPart, IndexRequest, ListEntry, StatRequest};
use dquant_proto::MAX_INDEX_VALUES;
use dquant_remote::{Control, Credentials, RemoteSource};

use crate::error::MountError;

pub struct Agent {
    authority: String,
    timeout: Duration,
    creds: Credentials,
    /// `None` until dialed, and again after a call failed for any reason but a refusal.
    control: Mutex<Option<Control>>,
}

impl Agent {
    pub fn new(authority: &str, timeout: Duration, creds: Credentials) -> Self {
        Agent {
            authority: authority.to_string(),
            timeout,
            creds,
            control: Mutex::new(None),
        }
    }

    pub fn authority(&self) -> &str {
        &self.authority
    }

    fn control(&self) -> Result<Control, SourceError> {
        let mut slot = self.control.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let c = Control::connect_with(&self.authority, self.timeout, &self.creds)?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` on the control connection; a failure other than "no such dataset" or a
    /// refusal forgets the connection, so the next call dials again.
    fn call<T>(&self, f: impl FnOnce(&Control) -> Result<T, SourceError>) -> Result<T, MountError> {
        let r = self.control().and_then(|c| f(&c));
        if let Err(e) = &r {
            if !e.is_not_found() && !matches!(e, SourceError::Usage(_)) {
                *self.control.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
        r.map_err(MountError::from)
    }

    pub fn list(&self, root: &str) -> Result<Vec<ListEntry>, MountError> {
        self.call(|c| c.list(root))
    }

    /// The dataset's counts, and its largest token when `max_token` (a scan, on the agent,
    /// for formats that do not store it).
    pub fn stat(&self, dataset: &str, max_token: bool) -> Result<DatasetStat, MountError> {
        self.call(|c| {
            c.stat(StatRequest {
                dataset: dataset.to_string(),
                max_token,
                ..Default::default()
            })
        })
    }

    /// The values `range` of one part of the dataset's index: exactly that many, or an
    /// error. Asked in replies of at most [`MAX_INDEX_VALUES`] each.
    pub fn index(
        &self,
        dataset: &str,
        part: IdxPart,
        range: Range<u64>,
    ) -> Result<Vec<u64>, MountError> {
        let part = match part {
            IdxPart::SequenceOffsets => IndexPart::SequenceOffsets,
            IdxPart::DocumentSequences => IndexPart::DocumentSequences,
        };
        let mut values = Vec::with_capacity((range.end - range.start) as usize);
        let mut start = range.start;
        while start < range.end {
            let count = (range.end - start).min(u64::from(MAX_INDEX_VALUES)) as u32;
            let got = self.call(|c| {
                c.index(IndexRequest {
                    dataset: Some(StatRequest {
                        dataset: dataset.to_string(),
                        ..Default::default()
                    }),
                    part: part as i32,
                    start,
                    count,
                })
            })?;
            if got.len() != count as usize {
                return Err(MountError::Changed(format!(
                    "dataset {dataset}: the agent has {} index values from {start}, {count} were \
                     expected; the dataset changed since it was listed",
                    got.len()
                )));
            }
            values.extend(got);
            start += u64::from(count);
        }
        Ok(values)
    }

    /// Opens the dataset for token-range reads in `wire_codec`.
    pub fn open_source(&self, dataset: &str, wire_codec: &str) -> Result<RemoteSource, MountError> {
        let req = StatRequest {
            dataset: dataset.to_string(),
            ..Default::default()
        };
        self.call(|c| RemoteSource::open(c.clone(), req, wire_codec))
    }
}
