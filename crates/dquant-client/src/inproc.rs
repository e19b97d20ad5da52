//! The in-process transport: a plan's pipeline run in this process, each batch made straight
//! into a pooled heap record in the output dtype, so the reader takes it as it takes a ring
//! slot from an agent (one reader path for every transport).

use std::time::Duration;

use dquant_engine::{plain_record, plain_record_len, EngineError, Pipeline};
use dquant_plan::OutputDType;
use dquant_transport::receive::copy_payload;
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::{BatchHeader, BatchSource, ReceiveError, RecordView};

use crate::batch::{HeapRecord, RecordPool};

/// A pipeline as a [`BatchSource`].
pub(crate) struct InProcess {
    pipeline: Box<Pipeline>,
    output: OutputDType,
    /// Room for a full batch record, its cursor trailer included.
    full: usize,
    pool: RecordPool,
    /// The record [`next_header`](BatchSource::next_header) made, until it is taken.
    held: Option<HeapRecord>,
}

impl InProcess {
    pub fn new(pipeline: Box<Pipeline>, output: OutputDType, pool: RecordPool) -> Self {
        // Saturated for an absurd plan: the record pool's allocation then fails.
        let full = plain_record_len(&pipeline, output);
        InProcess {
            pipeline,
            output,
            full,
            pool,
            held: None,
        }
    }

    fn make(&mut self) -> Result<Option<BatchHeader>, EngineError> {
        let mut rec = self.pool.get(self.full);
        let Some((h, _)) = plain_record(&mut self.pipeline, self.output, rec.bytes_mut())? else {
            return Ok(None);
        };
        rec.truncate(RECORD_HEADER_LEN + h.payload_len as usize);
        self.held = Some(rec);
        Ok(Some(h))
    }
}

impl BatchSource for InProcess {
    fn next_header(&mut self) -> Result<Option<BatchHeader>, ReceiveError> {
        self.held = None;
        self.make().map_err(|e| ReceiveError::Source(Box::new(e)))
    }

    fn take_record(&mut self) -> Option<RecordView> {
        self.held.take().map(|r| Box::new(r) as RecordView)
    }

    fn read_payload(&mut self, out: &mut [u8]) -> Result<(), ReceiveError> {
        copy_payload(self.held.as_deref(), out, "in-process")
    }

    /// Making a batch is work, not waiting: always ready.
    fn wait_ready(&mut self, _timeout: Duration) -> Result<bool, ReceiveError> {
        Ok(true)
    }

    fn shutdown(&mut self) {}
}
