//! Reading Megatron-order samples: the sources opened through `dquant-storage`, and a
//! sample's pieces copied into one token row.
//!
//! Sources may be any format dquant opens (a Megatron `.bin`/`.idx`, a compressed `.dqb`
//! converted from one: the sequences are the same), from a directory or another root. Only
//! the tokens of a sample's pieces are read.
//!
//! A local plain file (Megatron's `.bin`, a raw file) is mapped, as Megatron-Core's own
//! `IndexedDataset` maps it: a sample of short documents is a hundred pieces or more, and a
//! `pread` each would cost more than the sample. The mapped pages are page cache, dropped by
//! the kernel under pressure. The map is a [`GuardedMap`]: a file truncated under it fails
//! the read that meets it (where Megatron-Core's own map ends the process with SIGBUS, and
//! with it an agent's every session). Block files are read through `dquant-storage` (each
//! block decoded once per run of reads inside it).

use std::sync::Arc;

use dquant_storage::{Dataset, Format, GuardedMap, ReadBuffers};

use crate::datasets::{Sample, TopLevel};
use crate::records::{self, RECORD_HEADER};
use crate::MegatronError;

/// What reading a sample reuses from one read to the next: its pieces, decoded tokens and
/// storage buffers.
#[derive(Default)]
pub struct ReadScratch {
    pub sample: Sample,
    pub tokens: Vec<u32>,
    pub bufs: ReadBuffers,
}

/// The opened sources of a build, by source index.
pub struct Sources {
    names: Vec<String>,
    datasets: Vec<Arc<Dataset>>,
    /// Each source's token file, mapped, where it is a local plain file.
    maps: Vec<Option<GuardedMap>>,
}

/// Maps a local plain token file (the one the dataset opened, under its root when it has
/// one); `None` for block files, objects in other stores, and where no more maps can be
/// guarded (those are read through the dataset).
fn map_plain(ds: &Dataset) -> Result<Option<GuardedMap>, MegatronError> {
    if !matches!(ds.format(), Format::Megatron { .. } | Format::Raw { .. }) {
        return Ok(None);
    }
    let Some(file) = ds.plain_local_file() else {
        return Ok(None);
    };
    Ok(GuardedMap::map(file, ds.data_path())?)
}

impl Sources {
    /// Opens every prefix with `open` (a local path, or a name under a root; an agent shares
    /// its open datasets).
    pub fn open(
        prefixes: &[String],
        open: impl Fn(&str) -> Result<Arc<Dataset>, dquant_storage::StorageError>,
    ) -> Result<Self, MegatronError> {
        let datasets: Vec<Arc<Dataset>> =
            prefixes.iter().map(|p| open(p)).collect::<Result<_, _>>()?;
        Self::from_opened(prefixes, datasets)
    }

    /// The sources `prefixes`, already opened (`datasets[i]` is `prefixes[i]`'s).
    pub fn from_opened(
        prefixes: &[String],
        datasets: Vec<Arc<Dataset>>,
    ) -> Result<Self, MegatronError> {
        if prefixes.len() != datasets.len() {
            return Err(MegatronError::Config(format!(
                "{} prefixes but {} opened datasets",
                prefixes.len(),
                datasets.len()
            )));
        }
        let maps = datasets
            .iter()
            .map(|d| map_plain(d))
            .collect::<Result<_, _>>()?;
        Ok(Sources {
            names: prefixes.to_vec(),
            datasets,
            maps,
        })
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Tokens in source `i`.
    pub fn tokens(&self, i: usize) -> u64 {
        self.datasets[i].tokens()
    }

    /// Source `i`'s sequence lengths, as Megatron's int32 `sequence_lengths`.
    pub fn lengths(&self, i: usize) -> Result<Arc<[i32]>, MegatronError> {
        let offsets = self.datasets[i].index()?.seq_offsets();
        offsets
            .windows(2)
            .map(|w| {
                i32::try_from(w[1] - w[0]).map_err(|_| {
                    MegatronError::Config(format!(
                        "{}: a sequence of {} tokens does not fit Megatron's int32 lengths",
                        self.names[i],
                        w[1] - w[0]
                    ))
                })
            })
            .collect()
    }

    /// The sequence lengths of the source named `prefix` (for [`build`](crate::build)).
    pub fn lengths_of(&self, prefix: &str) -> Result<Arc<[i32]>, MegatronError> {
        let i = self.names.iter().position(|n| n == prefix).ok_or_else(|| {
            MegatronError::Config(format!("{prefix} is not among the opened sources"))
        })?;
        self.lengths(i)
    }

    /// Sample `idx` of `top` as a served record (see [`records`]):
    /// its header, then its tokens, each pad 0. `out` is the record's length.
    pub fn read_record(
        &self,
        top: &TopLevel,
        idx: u64,
        out: &mut [u32],
        scratch: &mut ReadScratch,
    ) -> Result<(), MegatronError> {
        let (head, body) = out.split_at_mut((RECORD_HEADER as usize).min(out.len()));
        if body.len() as u64 != top.sample_tokens() {
            return Err(MegatronError::Config(format!(
                "a record of {} tokens cannot hold a sample of {}",
                out.len(),
                top.sample_tokens()
            )));
        }
        top.sample_into(idx, &mut scratch.sample)?;
        head.copy_from_slice(&records::header(&scratch.sample));
        let ReadScratch {
            sample,
            tokens,
            bufs,
        } = scratch;
        self.read_into(sample, body, 0, tokens, bufs)
    }

    /// Writes `sample`'s tokens into `out` (its pieces in order, then `pad` for padding).
    /// `out` must be exactly the sample's length.
    pub fn read_into<T: Copy + From<u32>>(
        &self,
        sample: &Sample,
        out: &mut [T],
        pad: T,
        tokens: &mut Vec<u32>,
        bufs: &mut ReadBuffers,
    ) -> Result<(), MegatronError> {
        let mut at = 0usize;
        for p in &sample.pieces {
            let ds = &self.datasets[p.source];
            let offsets = ds.index()?.seq_offsets();
            let seq = p.sequence as usize;
            let (start, end) = (offsets[seq], offsets[seq + 1]);
            let from = start + p.offset;
            if from + p.length > end {
                return Err(MegatronError::Config(format!(
                    "{}: sequence {seq} holds {} tokens, not {}..{}",
                    self.names[p.source],
                    end - start,
                    p.offset,
                    p.offset + p.length
                )));
            }
            match (&self.maps[p.source], ds.format()) {
                (Some(map), Format::Megatron { dtype } | Format::Raw { dtype }) => {
                    let item = dtype.itemsize();
                    let range = from as usize * item..(from + p.length) as usize * item;
                    tokens.resize(p.length as usize, 0);
                    map.read(range, |bytes| dtype.decode(bytes, tokens, from))?
                        .map_err(|source| dquant_storage::StorageError::Format {
                            path: ds.data_path().to_path_buf(),
                            source,
                        })?;
                }
                _ => ds.read(from..from + p.length, tokens, bufs)?,
            }
            let dst = out
                .get_mut(at..at + tokens.len())
                .ok_or_else(|| MegatronError::Config("a sample longer than its row".into()))?;
            for (d, &t) in dst.iter_mut().zip(tokens.iter()) {
                *d = T::from(t);
            }
            at += tokens.len();
        }
        out[at..].fill(pad);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dquant_format::chunk_sums::{ChunkSums, MIN_CHUNK};
    use dquant_storage::{Dataset, OpenOptions, ReadBuffers};

    use super::Sources;
    use crate::{Piece, Sample};

    /// A source with a chunk sums sidecar is read through its dataset, which checks it, not
    /// through a map of the `.bin`: a flipped bit fails the sample that meets it, and a
    /// sample elsewhere reads as before.
    #[test]
    fn a_source_with_chunk_sums_is_checked_not_mapped() {
        let dir = tempfile::tempdir().unwrap();
        let x = dir.path().join("x");
        dquant_testkit::copy_fixture("r50k_int32", &x);
        let bin = std::fs::read(x.with_extension("bin")).unwrap();
        let open = || {
            let ds = Dataset::open(&x, &OpenOptions::default()).unwrap();
            Sources::from_opened(&["x".into()], vec![Arc::new(ds)]).unwrap()
        };
        // A sequence of at least 2,100 tokens: samples at 0 and 2,000 of it are chunks apart.
        let ds = Dataset::open(&x, &OpenOptions::default()).unwrap();
        let offsets = ds.index().unwrap().seq_offsets().to_vec();
        let seq = (0..offsets.len() - 1)
            .find(|&i| offsets[i + 1] - offsets[i] >= 2_100)
            .unwrap();
        let sample = |offset| Sample {
            dataset_id: None,
            pieces: vec![Piece {
                source: 0,
                sequence: seq as u64,
                offset,
                length: 100,
            }],
            pad: 0,
        };
        let read = |s: &Sources, offset| {
            let mut out = vec![0u32; 100];
            s.read_into(
                &sample(offset),
                &mut out,
                0,
                &mut Vec::new(),
                &mut ReadBuffers::new(),
            )
            .map(|()| out)
            .map_err(|e| e.to_string())
        };
        let mapped = open();
        assert!(mapped.maps[0].is_some());
        let sums = ChunkSums::of(&bin, MIN_CHUNK).unwrap().encode();
        std::fs::write(x.with_extension("dqsum"), sums).unwrap();
        let checked = open();
        assert!(checked.maps[0].is_none());
        assert_eq!(read(&checked, 0), read(&mapped, 0));
        let at = (offsets[seq] + 2_050) as usize * 4;
        let mut flipped = bin.clone();
        flipped[at] ^= 0x10;
        std::fs::write(x.with_extension("bin"), flipped).unwrap();
        let checked = open();
        let e = read(&checked, 2_000).unwrap_err();
        let c = at / 4096;
        let want = format!(
            "x.bin: checksum mismatch in chunk {c} (bytes {}..{})",
            c * 4096,
            (c + 1) * 4096
        );
        assert!(e.contains(&want), "{e}");
        assert_eq!(read(&checked, 0), read(&mapped, 0));
    }
}
