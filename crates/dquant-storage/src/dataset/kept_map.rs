//! Narrowing an int32 dataset's tokens (or copying a uint16 one's) straight out of a map kept
//! as long as the dataset is open: no copy out of the page cache first.
//!
//! Why: a `pread` copies every token out of the page cache before it is narrowed, so an agent
//! that reads by `pread` pays the page-cache copy in full and then narrows (`bench/RESULTS.md`,
//! profile: the copy is about half the agent's CPU on the shared-memory path). Narrowing from
//! a map reads the page cache once. Each page's table entry is set up when first touched and
//! torn down when the map goes, so the map is kept with the dataset: an agent's dataset cache
//! keeps it over sessions and passes, and from the second pass on its pages are already in
//! the agent's page tables. How much the first pass costs against `pread` depends on the
//! machine (the read paths table in the profile area: 0.55–0.86× pread and narrow over seven
//! recordings on one VM, 1.24–1.53× on another of the same kernel); every pass after it was 0.37–0.55×. The price
//! is memory: the page tables of every page touched (8 bytes a 4 KiB page, 2 MiB a GiB) for
//! as long as the dataset stays open, and the pages counted in the agent's `VmRSS`. So maps
//! are kept within a [`MapBudget`] (an agent's: half its host's memory by default, see
//! [`crate::map_budget`]), and a dataset whose file does not fit in what is left is read the
//! usual way.
//!
//! A kept map of a file within half of the host's memory asks for 2 MiB folios
//! ([`GuardedMap::advise_large_folios`]): a shuffled plan that faults the file in at random
//! then leaves it cached as a read in order would, and every later pass, by anyone, reads it
//! 2-3x faster than from 4 KiB folios.
//!
//! A uint16 file (Megatron-Core's dtype for vocabularies under 65,500, GPT-2's among them) is
//! kept mapped too: into `u16` a sample is a copy out of the map, into wider widths it is
//! widened. By `pread` a shuffled plan made a syscall for each 8 KiB sample: an agent's
//! shuffled shared-memory delivery of such a file went from 5.4-5.7 to 11.8-12.0 GB/s with
//! the map, and in order from 16.2-17.2 to 19.2-21.2 (`dquant-offload-bench throughput
//! zipf256m_u16 --cases memcpy,agent-shm,agent-shm-shuffled`, the two builds alternated, 2
//! vCPU AMD EPYC).
//!
//! A file truncated under the map is an error, not a crash ([`crate::GuardedMap`]); anything
//! that does not narrow cleanly (a token over the width, a file that shrank, a map refused)
//! leaves the caller to read the ranges the usual way, which says exactly what is wrong.

use std::ops::Range;
use std::sync::Arc;

use dquant_codec::kernels::max_token;
use dquant_codec::{encode_width, Width};
use dquant_format::DType;

use super::{Dataset, Source};
use crate::{GuardedMap, MapBudget};

impl Dataset {
    /// The dtype of a plain int32 or uint16 file (the dtypes a kept map serves); `None` for
    /// other dtypes and other formats.
    fn kept_dtype(&self) -> Option<DType> {
        match self.source {
            Source::Plain { dtype, .. } if matches!(dtype, DType::I32 | DType::U16) => Some(dtype),
            _ => None,
        }
    }

    /// The map of a plain little-endian int32 or uint16 file kept with the dataset, made on
    /// first use with bytes leased from `budget`; `None` for other dtypes and formats, files
    /// with chunk sums (every read is checked against them), objects in other stores, where
    /// no more maps can be guarded, and where the budget had no room for the file at first
    /// use.
    fn kept_map(&self, budget: &Arc<MapBudget>) -> Option<&GuardedMap> {
        self.kept
            .get_or_init(|| {
                let dtype = self.kept_dtype()?;
                let file = self.plain_local_file()?;
                // The file is its tokens.
                let bytes = self.tokens().saturating_mul(dtype.itemsize() as u64);
                let Some(lease) = budget.lease(bytes) else {
                    tracing::info!(
                        path = %self.data_path.display(),
                        bytes,
                        budget = budget.limit(),
                        leased = budget.used(),
                        "read by pread: the map budget has no room for this file"
                    );
                    return None;
                };
                match GuardedMap::map(file, &self.data_path) {
                    Ok(map) => map.map(|m| {
                        // A file that fits in half of memory stays resident: cache it in 2 MiB
                        // folios however the plan reads it (see the method's doc). Not past
                        // that (a budget raised by hand, `keep_maps`): evicted folios would
                        // make each 16 KiB sample read 2 MiB.
                        if bytes <= MapBudget::half_of_memory() {
                            if let Err(e) = m.advise_large_folios() {
                                tracing::debug!(path = %self.data_path.display(), error = %e,
                                    "no large folios for the kept map");
                            }
                        }
                        (m, lease)
                    }),
                    Err(e) => {
                        tracing::info!(path = %self.data_path.display(), error = %e, "not kept mapped");
                        None
                    }
                }
            })
            .as_ref()
            .map(|(map, _)| map)
    }

    /// Narrows the tokens of `ranges`, back to back, into `out` (`width`'s little-endian bytes
    /// a token, exactly the ranges' total) straight from the kept map, every token checked to
    /// fit (and, as every int32 read is, to be no negative value): `true` when done. `false`
    /// when there is no kept map (see above), `width` is not byte-aligned, or a range did not
    /// narrow cleanly: nothing is promised about `out` then, and the caller reads the ranges
    /// as usual, which names what was wrong. A uint16 file into `u16` is a copy.
    /// The map is made at the first call, if `budget` has room for the whole file then.
    pub fn narrow_kept(
        &self,
        ranges: &[Range<u64>],
        width: Width,
        out: &mut [u8],
        budget: &Arc<MapBudget>,
    ) -> bool {
        let (Some(bw), Some(dtype)) = (width.byte_width(), self.kept_dtype()) else {
            return false;
        };
        let Some(map) = self.kept_map(budget) else {
            return false;
        };
        let item = dtype.itemsize();
        let tokens = self.tokens();
        let mut ahead = Ahead::new(map, ranges, item);
        let mut rest = out;
        for r in ranges {
            let n = r.end.saturating_sub(r.start) as usize;
            if r.start > r.end || r.end > tokens || rest.len() < n * bw {
                return false;
            }
            let (row, tail) = std::mem::take(&mut rest).split_at_mut(n * bw);
            let bytes = r.start as usize * item..r.end as usize * item;
            let narrowed = map.read(bytes, |b| match dtype {
                DType::U16 => from_u16(b, width, bw, row, &mut ahead),
                _ => from_i32(b, width, bw, row, &mut ahead),
            });
            if narrowed.ok() != Some(true) {
                return false;
            }
            rest = tail;
        }
        rest.is_empty()
    }
}

/// Narrows the int32 tokens of `b` into `row` (`width`'s `bw` bytes a token), [`STEP`] tokens at
/// a time behind `ahead`: `false` when one does not fit (or is negative).
fn from_i32(b: &[u8], width: Width, bw: usize, row: &mut [u8], ahead: &mut Ahead<'_>) -> bool {
    let Ok(t) = bytemuck::try_cast_slice::<u8, u32>(b) else {
        return false;
    };
    // A width that holds every u32 (`u32`, `i64`) would take a negative int32 as a large id:
    // those tokens are checked on their own.
    let unsigned = width.max_token() > i32::MAX as u32;
    let fits = |t: &[u32]| !unsigned || max_token(t) <= i32::MAX as u32;
    t.chunks(STEP)
        .zip(row.chunks_mut(STEP * bw))
        .all(|(t, row)| {
            ahead.advance(t.len() as u64);
            fits(t) && encode_width(width, t, row).is_ok()
        })
}

/// The uint16 tokens of `b` into `row` (`width`'s `bw` bytes a token), [`STEP`] tokens at a time
/// behind `ahead`: copied into `u16`, widened into wider widths (a stored value always fits
/// them); `false` for a width narrower than 16 bits.
fn from_u16(b: &[u8], width: Width, bw: usize, row: &mut [u8], ahead: &mut Ahead<'_>) -> bool {
    if width == Width::U16 {
        for (b, row) in b.chunks(STEP * 2).zip(row.chunks_mut(STEP * 2)) {
            ahead.advance((b.len() / 2) as u64);
            row.copy_from_slice(b);
        }
        return true;
    }
    let Ok(t) = bytemuck::try_cast_slice::<u8, u16>(b) else {
        return false;
    };
    let mut wide = [0u32; STEP];
    t.chunks(STEP)
        .zip(row.chunks_mut(STEP * bw))
        .all(|(t, row)| {
            ahead.advance(t.len() as u64);
            let wide = &mut wide[..t.len()];
            for (w, &t) in wide.iter_mut().zip(t) {
                *w = u32::from(t);
            }
            encode_width(width, wide, row).is_ok()
        })
}

/// Tokens narrowed at a time, between two moves of the [`Ahead`] cursor.
const STEP: usize = 256;
/// How far the [`Ahead`] cursor runs ahead of the narrowing, in bytes of the file (2,048
/// int32 tokens). Measured with `cargo bench -p dquant-storage --bench read_paths --
/// kept_map` on a 2 vCPU AMD EPYC VM, shuffled int32 samples in G tokens/s: 3.2 without a
/// cursor; 256-token steps 5.0, 5.4 and 5.2 at 4, 8 and 16 KiB ahead; 512-token steps 4.7
/// and 5.3 at 8 and 16 KiB. In order, 7.0-8.2 with each (7.1-7.4 for the kernel alone over
/// the map).
const AHEAD: usize = 8 << 10;

/// A cursor [`AHEAD`] bytes ahead of the narrowing over the ranges' tokens, back to back,
/// that prefetches what it passes over ([`crate::prefetch`]): the next sample's first lines
/// are on their way while this one's last are narrowed.
struct Ahead<'a> {
    map: &'a GuardedMap,
    ranges: &'a [Range<u64>],
    /// Bytes a token.
    item: usize,
    /// The range the cursor is in, and how far into it.
    next: usize,
    at: u64,
}

impl<'a> Ahead<'a> {
    fn new(map: &'a GuardedMap, ranges: &'a [Range<u64>], item: usize) -> Self {
        let mut a = Ahead {
            map,
            ranges,
            item,
            next: 0,
            at: 0,
        };
        a.advance((AHEAD / item) as u64);
        a
    }

    /// Moves the cursor `n` tokens on, prefetching them. Ranges past the map, or backwards,
    /// prefetch nothing: the narrowing refuses them.
    fn advance(&mut self, mut n: u64) {
        let item = self.item as u64;
        while n > 0 {
            let Some(r) = self.ranges.get(self.next) else {
                return;
            };
            let from = r.start.saturating_add(self.at);
            let take = r.end.saturating_sub(from).min(n);
            let byte = |t: u64| usize::try_from(t.saturating_mul(item)).unwrap_or(usize::MAX);
            self.map.prefetch(byte(from)..byte(from + take));
            n -= take;
            self.at += take;
            if from + take >= r.end {
                self.next += 1;
                self.at = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::ops::Range;

    use dquant_codec::Width;

    use crate::{Dataset, MapBudget, OpenOptions};

    /// [`Dataset::narrow_kept`] of one range.
    fn one(ds: &Dataset, r: std::ops::Range<u64>, width: Width, out: &mut [u8]) -> bool {
        ds.narrow_kept(
            std::slice::from_ref(&r),
            width,
            out,
            &MapBudget::unlimited(),
        )
    }

    fn raw_i32(dir: &std::path::Path, tokens: &[i32]) -> Dataset {
        let path = dir.join("toks.bin");
        let mut f = std::fs::File::create(&path).unwrap();
        for t in tokens {
            f.write_all(&t.to_le_bytes()).unwrap();
        }
        drop(f);
        let opts = OpenOptions {
            raw_dtype: Some(dquant_format::DType::I32),
            eod: None,
        };
        Dataset::open(&path, &opts).unwrap()
    }

    #[test]
    fn ranges_past_the_end_or_backwards_are_refused_whatever_the_cursor_ahead_met() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<i32> = (0..10_000).map(|i| i % 1000).collect();
        let ds = raw_i32(dir.path(), &tokens);
        let all = MapBudget::unlimited();
        // The cursor runs over these before the narrowing reaches them.
        for ranges in [
            vec![0..10, 9_000..20_000],
            vec![
                0..10,
                Range {
                    start: 500,
                    end: 400,
                },
                0..10,
            ],
            vec![0..10, u64::MAX - 1..u64::MAX],
        ] {
            let mut out = vec![0u8; 1 << 16];
            assert!(
                !ds.narrow_kept(&ranges, Width::U16, &mut out, &all),
                "{ranges:?}"
            );
        }
    }

    #[test]
    fn narrows_ranges_back_to_back_as_a_read_and_narrow_would() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<i32> = (0..10_000).map(|i| (i * 7919) % 50_000).collect();
        let ds = raw_i32(dir.path(), &tokens);
        let ranges = [100..4197, 4196..8293, 7..9];
        let total: usize = ranges.iter().map(|r| (r.end - r.start) as usize).sum();
        let mut out = vec![0u8; total * 2];
        let all = MapBudget::unlimited();
        assert!(ds.narrow_kept(&ranges, Width::U16, &mut out, &all));
        let want: Vec<u8> = ranges
            .iter()
            .flat_map(|r| tokens[r.start as usize..r.end as usize].iter())
            .flat_map(|&t| (t as u16).to_le_bytes())
            .collect();
        assert_eq!(out, want);
        let mut wide = vec![0u8; total * 3];
        assert!(ds.narrow_kept(&ranges, Width::U24, &mut wide, &all));
        assert_eq!(wide[3..6], (tokens[101] as u32).to_le_bytes()[..3]);
        let mut long = vec![0u8; total * 8];
        assert!(ds.narrow_kept(&ranges, Width::I64, &mut long, &all));
        let want: Vec<u8> = ranges
            .iter()
            .flat_map(|r| tokens[r.start as usize..r.end as usize].iter())
            .flat_map(|&t| i64::from(t).to_le_bytes())
            .collect();
        assert_eq!(long, want);
    }

    fn raw_u16(dir: &std::path::Path, tokens: &[u16]) -> Dataset {
        let path = dir.join("toks16.bin");
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(&path, bytes).unwrap();
        let opts = OpenOptions {
            raw_dtype: Some(dquant_format::DType::U16),
            eod: None,
        };
        Dataset::open(&path, &opts).unwrap()
    }

    #[test]
    fn a_uint16_file_is_copied_or_widened_as_a_read_would() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u16> = (0..20_000u32).map(|i| (i * 7919 % 65_536) as u16).collect();
        let ds = raw_u16(dir.path(), &tokens);
        // Overlapping, out of order, long enough to cross the cursor's steps.
        let ranges = [100..4197, 4196..8293, 7..9, 15_000..20_000];
        let all = MapBudget::unlimited();
        let want: Vec<u32> = ranges
            .iter()
            .flat_map(|r| tokens[r.start as usize..r.end as usize].iter())
            .map(|&t| u32::from(t))
            .collect();
        for width in [Width::U16, Width::U24, Width::I32, Width::I64] {
            let bw = width.byte_width().unwrap();
            let mut out = vec![0u8; want.len() * bw];
            assert!(ds.narrow_kept(&ranges, width, &mut out, &all), "{width:?}");
            let mut expect = vec![0u8; want.len() * bw];
            dquant_codec::encode_width(width, &want, &mut expect).unwrap();
            assert!(out == expect, "{width:?}: the bytes differ");
        }
        assert_eq!(
            all.used(),
            2 * 20_000,
            "the map is the file's 2 bytes a token"
        );
        // Past the end, or too little room: refused, for the usual read to name.
        let mut out = vec![0u8; 2 * 200];
        assert!(!one(&ds, 19_900..20_100, Width::U16, &mut out));
        assert!(!one(&ds, 0..201, Width::U16, &mut out));
        assert!(!one(&ds, 0..100, Width::Bits(17), &mut out));
    }

    #[test]
    fn maps_are_kept_only_within_the_budget_and_give_it_back_when_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let tokens: Vec<i32> = (0..1_000).collect();
        let (da, db) = (raw_i32(&a, &tokens), raw_i32(&b, &tokens));
        // Room for one file of 4,000 bytes, not two.
        let budget = MapBudget::new(6_000);
        let mut out = vec![0u8; 200];
        let first = 0..100;
        let r = std::slice::from_ref(&first);
        assert!(da.narrow_kept(r, Width::U16, &mut out, &budget));
        assert_eq!(budget.used(), 4_000);
        assert!(!db.narrow_kept(r, Width::U16, &mut out, &budget));
        // Decided at first use: b stays unmapped while open, even once a's bytes are back.
        drop(da);
        assert_eq!(budget.used(), 0);
        assert!(!db.narrow_kept(r, Width::U16, &mut out, &budget));
        let db = raw_i32(&b, &tokens);
        assert!(db.narrow_kept(r, Width::U16, &mut out, &budget));
        assert_eq!(out[..4], [0, 0, 1, 0]);
        assert_eq!(budget.used(), 4_000);
        // A budget of 0 maps nothing.
        assert!(!raw_i32(&a, &tokens).narrow_kept(r, Width::U16, &mut out, &MapBudget::new(0)));
    }

    #[test]
    fn what_does_not_narrow_cleanly_is_left_to_the_usual_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut tokens: Vec<i32> = (0..1_000).collect();
        tokens[500] = 70_000;
        tokens[900] = -1;
        let ds = raw_i32(dir.path(), &tokens);
        let mut out = vec![0u8; 2 * 100];
        // A token over the width, a negative one (even into i32), past the end, the wrong
        // room, widths it does not take.
        assert!(!one(&ds, 450..550, Width::U16, &mut out));
        assert!(one(&ds, 450..550, Width::U24, &mut vec![0u8; 300]));
        assert!(!one(&ds, 850..950, Width::I32, &mut vec![0u8; 400]));
        assert!(!one(&ds, 950..1_050, Width::U16, &mut out));
        assert!(!one(&ds, 0..99, Width::U16, &mut out));
        assert!(!one(&ds, 850..950, Width::I64, &mut vec![0u8; 800]));
        assert!(one(&ds, 0..100, Width::I64, &mut vec![0u8; 800]));
        assert!(!one(&ds, 0..100, Width::Bits(17), &mut out));
        assert!(one(&ds, 0..100, Width::U16, &mut out));
    }

    #[test]
    fn a_file_truncated_under_the_map_is_refused_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<i32> = (0..100_000).map(|i| i % 1000).collect();
        let ds = raw_i32(dir.path(), &tokens);
        let mut out = vec![0u8; 2 * 4096];
        assert!(one(&ds, 0..4096, Width::U16, &mut out));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("toks.bin"))
            .unwrap();
        f.set_len(4 * 10_000).unwrap();
        assert!(!one(&ds, 90_000..94_096, Width::U16, &mut out));
        // The usual read says what happened.
        let mut got = Vec::new();
        let e = ds
            .read(90_000..94_096, &mut got, &mut crate::ReadBuffers::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("shorter than when it was opened"), "{e}");
    }
}
