//! How a batch's samples are read from its sources: in which pieces, and on which threads.
//!
//! Two paths fill a batch. The *stored* path copies a dataset's stored bytes straight into
//! the batch (a uint16 dataset into a `u16` batch): consecutive samples of one source are one
//! contiguous range of the file, and one vectored read fills all their rows. The *token* path
//! reads `u32` tokens, which the pipeline then converts or encodes. Either runs its reads one
//! after another on the session's thread, or, with a [`WorkerPool`] and sources whose reads
//! need no exclusive state ([`SharedReads`]), on several threads at once when the batch's
//! reads are slow enough to be worth it ([`ReadPace`]). Both write every byte to the same
//! place, so a batch is identical either way (the pipeline tests check it).

use std::io::IoSliceMut;
use std::ops::Range;
use std::time::Instant;

use dquant_plan::SampleRef;

use crate::read_pace::ReadPace;
use crate::worker_pool::{OwnShare, WorkerPool};
use crate::EngineError;
use dquant_storage::source::{SharedReads, SourceError, TokenSource};

/// The error of source `d`, named as the plan names it.
pub(crate) fn source_error(uris: &[String], d: usize, source: SourceError) -> EngineError {
    EngineError::Source {
        index: d,
        uri: uris[d].clone(),
        source,
    }
}

/// The pool and its shares, when a batch of `jobs` reads of `bytes` bytes in all is worth
/// splitting at the pipeline's `pace` and every source can be read from several threads.
fn concurrent<'s>(
    pool: Option<&'s WorkerPool>,
    pace: &ReadPace,
    sources: &'s [Box<dyn TokenSource>],
    jobs: usize,
    bytes: usize,
) -> Option<(&'s WorkerPool, usize, Vec<&'s dyn SharedReads>)> {
    let pool = pool?;
    let shares = pace.shares(pool, jobs, bytes);
    if shares < 2 {
        return None;
    }
    let shared = sources
        .iter()
        .map(|s| s.shared_reads())
        .collect::<Option<Vec<_>>>()?;
    Some((pool, shares, shared))
}

/// Tells each source the token ranges a batch is about to read from it, `by_source[d]`
/// for source `d` (see [`TokenSource::will_read`]), before any read starts. A source with
/// a single range is not told: its one read is all there is to start.
pub(crate) fn announce(sources: &[Box<dyn TokenSource>], by_source: &[Vec<Range<u64>>]) {
    for (s, ranges) in sources.iter().zip(by_source) {
        if ranges.len() > 1 {
            s.will_read(ranges);
        }
    }
}

/// [`announce`] for a batch's `samples`, grouped by source in one pass.
fn announce_samples(sources: &[Box<dyn TokenSource>], samples: &[SampleRef]) {
    if samples.len() < 2 {
        return;
    }
    let mut by_source: Vec<Vec<Range<u64>>> = vec![Vec::new(); sources.len()];
    for x in samples {
        if let Some(v) = by_source.get_mut(x.source) {
            v.push(x.tokens.clone());
        }
    }
    announce(sources, &by_source);
}

/// Rows `rows` of a batch that one read of source `src` fills, from token `start`: each
/// sample starts on the last token of the one before (packing), so their tokens are one
/// contiguous range of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    src: usize,
    start: u64,
    rows: Range<usize>,
}

/// A batch's samples cut into [`Run`]s of at most `cap` rows each (so that a pool has pieces
/// to share out even when a batch is one contiguous range).
fn runs(samples: &[SampleRef], cap: usize) -> Vec<Run> {
    let cap = cap.max(1);
    let mut out = Vec::new();
    let mut k = 0;
    while k < samples.len() {
        let src = samples[k].source;
        let mut end = k + 1;
        while end < samples.len()
            && end - k < cap
            && samples[end].source == src
            && samples[end].tokens.start + 1 == samples[end - 1].tokens.end
        {
            end += 1;
        }
        out.push(Run {
            src,
            start: samples[k].tokens.start,
            rows: k..end,
        });
        k = end;
    }
    out
}

/// One read of the stored path: a run's rows, each but the last one token short (the next
/// row's first token is that token; it is copied after the read).
struct StoredRead<'a> {
    src: usize,
    start: u64,
    bufs: Vec<IoSliceMut<'a>>,
}

impl StoredRead<'_> {
    /// The bytes it fills.
    fn len(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }
}

/// Fills `out`, rows of `row` bytes holding tokens of `bw` bytes, with the stored bytes of
/// `samples`. Consecutive samples of one source that continue each other are one run, one
/// vectored read; when the batch is read concurrently, runs are capped at about two per
/// reading thread so that every thread gets its share. With a pool, the reads on this thread
/// are timed into `pace`.
#[allow(clippy::too_many_arguments)] // the batch's place (out, row, bw) and its reading
pub(crate) fn read_stored(
    sources: &mut [Box<dyn TokenSource>],
    uris: &[String],
    pool: Option<&WorkerPool>,
    pace: &mut ReadPace,
    samples: &[SampleRef],
    out: &mut [u8],
    row: usize,
    bw: usize,
) -> Result<(), EngineError> {
    announce_samples(sources, samples);
    let conc = concurrent(pool, pace, sources, samples.len(), out.len());
    let cap = conc.as_ref().map_or(usize::MAX, |(pool, ..)| {
        samples.len().div_ceil(2 * pool.readers())
    });
    let runs = runs(samples, cap);
    let mut rows = out.chunks_exact_mut(row);
    let mut reads: Vec<StoredRead<'_>> = runs
        .iter()
        .map(|r| {
            let last = r.rows.end - 1;
            let bufs = r
                .rows
                .clone()
                .zip(rows.by_ref())
                .map(|(i, x)| {
                    let n = if i == last { row } else { row - bw };
                    IoSliceMut::new(&mut x[..n])
                })
                .collect();
            StoredRead {
                src: r.src,
                start: r.start,
                bufs,
            }
        })
        .collect();
    // Fewer runs than shares are read by fewer threads; a single run, by this one.
    let conc = conc
        .map(|(pool, shares, shared)| (pool, shares.min(reads.len()), shared))
        .filter(|(_, shares, _)| *shares >= 2);
    match conc {
        Some((pool, shares, shared)) => {
            let own = pool.run(&mut reads, shares, &|r, _| {
                shared[r.src]
                    .read_stored_at(r.start, &mut r.bufs)
                    .map_err(|e| source_error(uris, r.src, e))
            })?;
            record_own(pace, own, &reads, StoredRead::len);
        }
        None => {
            let started = pool.map(|_| Instant::now());
            for r in &mut reads {
                sources[r.src]
                    .read_stored(r.start, &mut r.bufs)
                    .map_err(|e| source_error(uris, r.src, e))?;
            }
            if let Some(t) = started {
                pace.read_alone(reads.iter().map(StoredRead::len).sum(), t.elapsed());
            }
        }
    }
    drop(reads);
    for r in runs {
        for i in r.rows.start..r.rows.end - 1 {
            let next = (i + 1) * row;
            out.copy_within(next..next + bw, next - bw);
        }
    }
    Ok(())
}

/// Records the calling thread's share of a pooled batch (its first `own.jobs` of `jobs`,
/// of `bytes` bytes each) into `pace`.
fn record_own<J>(pace: &mut ReadPace, own: OwnShare, jobs: &[J], bytes: impl Fn(&J) -> usize) {
    let read: usize = jobs.iter().take(own.jobs).map(bytes).sum();
    pace.read_spread(read, own.took);
}

/// One read of the token path: a run's samples' tokens into their rows.
struct TokenRead<'a> {
    src: usize,
    ranges: Vec<Range<u64>>,
    rows: &'a mut [u32],
}

/// Reads `samples` (each `sample_len` tokens) into `tokens` with a pool when there is one,
/// every source allows it, and the batch is slow enough at `pace` to be worth it; `false`
/// when it read nothing (the caller then reads one source at a time, and times that).
/// Consecutive samples of one source that continue each other are one read (one vectored
/// read from a plain int32 file), runs capped at about two per reading thread, as on the
/// stored path.
pub(crate) fn read_tokens_concurrently(
    sources: &[Box<dyn TokenSource>],
    uris: &[String],
    pool: Option<&WorkerPool>,
    pace: &mut ReadPace,
    samples: &[SampleRef],
    tokens: &mut [u32],
    sample_len: usize,
) -> Result<bool, EngineError> {
    let Some((pool, shares, shared)) =
        concurrent(pool, pace, sources, samples.len(), tokens.len() * 4)
    else {
        return Ok(false);
    };
    let cap = samples.len().div_ceil(2 * pool.readers());
    let mut rest: &mut [u32] = tokens;
    let mut reads: Vec<TokenRead<'_>> = Vec::new();
    for r in runs(samples, cap) {
        let (rows, tail) = std::mem::take(&mut rest).split_at_mut(r.rows.len() * sample_len);
        let ranges = samples[r.rows].iter().map(|s| s.tokens.clone()).collect();
        reads.push(TokenRead {
            src: r.src,
            ranges,
            rows,
        });
        rest = tail;
    }
    // Source by source, each in batch order: the order the sequential path reads them in,
    // so the first failing read (the error reported) is the same either way.
    reads.sort_by_key(|r| r.src);
    let shares = shares.min(reads.len()).max(1);
    let own = pool.run(&mut reads, shares, &|r, bufs| {
        shared[r.src]
            .read_ranges_at(&r.ranges, r.rows, bufs)
            .map_err(|e| source_error(uris, r.src, e))
    })?;
    record_own(pace, own, &reads, |r| r.rows.len() * 4);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(source: usize, start: u64, len: u64) -> SampleRef {
        SampleRef {
            global: 0,
            source,
            epoch: 0,
            index: 0,
            tokens: start..start + len,
        }
    }

    #[test]
    fn runs_join_continuing_samples_of_one_source_up_to_the_cap() {
        let s = [
            sample(0, 0, 5),
            sample(0, 4, 5),
            sample(0, 8, 5),
            sample(1, 12, 5),
            sample(1, 40, 5),
        ];
        let r = |src, start, rows| Run { src, start, rows };
        assert_eq!(
            runs(&s, usize::MAX),
            [r(0, 0, 0..3), r(1, 12, 3..4), r(1, 40, 4..5)]
        );
        assert_eq!(
            runs(&s, 2),
            [r(0, 0, 0..2), r(0, 8, 2..3), r(1, 12, 3..4), r(1, 40, 4..5)]
        );
    }
}
