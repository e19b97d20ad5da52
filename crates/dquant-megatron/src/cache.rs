//! Built GPT indices kept on disk, so a config opened again (a restarted job, another rank,
//! an agent that restarted) reads its indices instead of shuffling again.
//!
//! Megatron-Core keeps its indices in `path_to_cache`, one `.npy` per array, named by a hash
//! of the dataset's description. This does the same with its own files: one `.dqmi` file a
//! GPT dataset, named by a hash of its [`key`](IndexStore) (the source's name, size and
//! tokens, its documents, the sample count and every parameter), the whole key stored inside
//! and compared on load, the file checked by a crc32c. Writers write a temporary file and
//! rename it, so ranks that build at once leave one whole file and a reader never sees half
//! of one. A file that is missing, damaged or of another key is built again.
//!
//! The arrays are stored as little-endian values (the byte order of every machine dquant
//! builds for); sizes read from a file are checked against its length before anything is
//! allocated.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::gpt_index::{GptIndex, SampleIndex, ShuffleIndex};

/// Where built GPT indices are kept, by key.
pub trait IndexStore: Sync {
    /// The index stored under `key`, if there is a whole one.
    fn load(&self, key: &str) -> Option<GptIndex>;
    /// Keeps `index` under `key`; failing to is not an error of the build.
    fn store(&self, key: &str, index: &GptIndex);
}

/// An [`IndexStore`] in a directory.
#[derive(Clone, Debug)]
pub struct DirStore {
    dir: PathBuf,
}

const MAGIC: &[u8; 8] = b"DQMEGIX1";

impl DirStore {
    /// The store in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DirStore { dir: dir.into() }
    }

    fn path(&self, key: &str) -> PathBuf {
        let h = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
        self.dir.join(format!("{h:016x}-gpt-index.dqmi"))
    }
}

impl IndexStore for DirStore {
    fn load(&self, key: &str) -> Option<GptIndex> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        decode(&bytes, key)
    }

    fn store(&self, key: &str, index: &GptIndex) {
        let _ = write_atomically(&self.dir, &self.path(key), &encode(key, index));
    }
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    // Readable by every rank, as Megatron's own cache files are (a temporary file is 0600).
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.as_file().sync_data()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn put(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_array<T: bytemuck::Pod>(out: &mut Vec<u8>, kind: u8, v: &[T]) {
    out.push(kind);
    put(out, v.len() as u64);
    out.extend_from_slice(bytemuck::cast_slice(v));
}

/// The file's bytes for `index` under `key`.
pub(crate) fn encode(key: &str, index: &GptIndex) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    put(&mut out, key.len() as u64);
    out.extend_from_slice(key.as_bytes());
    put(&mut out, index.num_epochs);
    out.push(u8::from(index.separate_final_epoch));
    put_array(&mut out, 0, &index.document_index);
    match &index.sample_index {
        SampleIndex::I32(v) => put_array(&mut out, 0, v.as_flattened()),
        SampleIndex::I64(v) => put_array(&mut out, 1, v.as_flattened()),
    }
    match &index.shuffle_index {
        ShuffleIndex::U32(v) => put_array(&mut out, 0, v),
        ShuffleIndex::I64(v) => put_array(&mut out, 1, v),
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads what [`encode`] wrote, bounds checked.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    /// An array's kind and its values' bytes (length checked against what is left).
    fn array(&mut self, width: [usize; 2]) -> Option<(u8, &'a [u8])> {
        let kind = self.u8()?;
        let n = usize::try_from(self.u64()?).ok()?;
        let w = *width.get(usize::from(kind))?;
        Some((kind, self.take(n.checked_mul(w)?)?))
    }
}

/// The index in `bytes` when they are a whole file of `key`.
pub(crate) fn decode(bytes: &[u8], key: &str) -> Option<GptIndex> {
    let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return None;
    }
    let mut c = Cursor(body);
    if c.take(8)? != MAGIC {
        return None;
    }
    let key_len = usize::try_from(c.u64()?).ok()?;
    if c.take(key_len)? != key.as_bytes() {
        return None;
    }
    let num_epochs = c.u64()?;
    let separate_final_epoch = c.u8()? == 1;
    let (_, doc) = c.array([4, 4])?;
    let sample_index = match c.array([4, 8])? {
        (0, b) => SampleIndex::I32(pairs(bytemuck::pod_collect_to_vec(b))?),
        (_, b) => SampleIndex::I64(pairs(bytemuck::pod_collect_to_vec(b))?),
    };
    let shuffle_index = match c.array([4, 8])? {
        (0, b) => ShuffleIndex::U32(bytemuck::pod_collect_to_vec(b)),
        (_, b) => ShuffleIndex::I64(bytemuck::pod_collect_to_vec(b)),
    };
    if !c.0.is_empty() {
        return None;
    }
    Some(GptIndex {
        document_index: bytemuck::pod_collect_to_vec(doc),
        sample_index,
        shuffle_index,
        num_epochs,
        separate_final_epoch,
    })
}

fn pairs<T: bytemuck::Pod>(flat: Vec<T>) -> Option<Vec<[T; 2]>> {
    flat.len()
        .is_multiple_of(2)
        .then(|| flat.chunks_exact(2).map(|p| [p[0], p[1]]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(wide: bool) -> GptIndex {
        GptIndex {
            document_index: vec![3, 1, 2, 0],
            sample_index: match wide {
                false => SampleIndex::I32(vec![[0, 0], [1, 5], [3, 2]]),
                true => SampleIndex::I64(vec![[0, 0], [1, 1 << 40]]),
            },
            shuffle_index: match wide {
                false => ShuffleIndex::U32(vec![1, 0]),
                true => ShuffleIndex::I64(vec![0]),
            },
            num_epochs: 2,
            separate_final_epoch: wide,
        }
    }

    #[test]
    fn indices_round_trip_and_anything_else_is_built_again() {
        for wide in [false, true] {
            let ix = index(wide);
            let bytes = encode("k", &ix);
            assert_eq!(decode(&bytes, "k"), Some(ix));
            assert_eq!(decode(&bytes, "other key"), None);
            for cut in [0, 1, 8, bytes.len() / 2, bytes.len() - 1] {
                assert_eq!(decode(&bytes[..cut], "k"), None, "cut at {cut}");
            }
            for flip in [0, 9, 20, bytes.len() - 10, bytes.len() - 1] {
                let mut bad = bytes.clone();
                bad[flip] ^= 0x40;
                assert_eq!(decode(&bad, "k"), None, "byte {flip} flipped");
            }
        }
    }

    #[test]
    fn a_dir_store_keeps_whole_files_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::new(dir.path().join("cache"));
        assert_eq!(store.load("a"), None);
        store.store("a", &index(false));
        store.store("b", &index(true));
        assert_eq!(store.load("a"), Some(index(false)));
        assert_eq!(store.load("b"), Some(index(true)));
        let files = std::fs::read_dir(dir.path().join("cache")).unwrap().count();
        assert_eq!(files, 2, "no temporary file is left behind");
    }

    /// A store in memory that counts what it was asked.
    #[derive(Default)]
    struct Counting {
        map: std::sync::Mutex<std::collections::HashMap<String, GptIndex>>,
        hits: std::sync::atomic::AtomicUsize,
    }

    impl IndexStore for Counting {
        fn load(&self, key: &str) -> Option<GptIndex> {
            let ix = self.map.lock().unwrap().get(key).cloned();
            if ix.is_some() {
                self.hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            ix
        }
        fn store(&self, key: &str, index: &GptIndex) {
            self.map.lock().unwrap().insert(key.into(), index.clone());
        }
    }

    #[test]
    fn a_build_reads_what_an_earlier_one_kept_and_a_changed_config_builds_again() {
        use crate::{build_cached, Blend, BuildConfig};
        let mut config = BuildConfig::new(42, 16);
        config.blend = Some(Blend {
            prefixes: vec!["a".into(), "b".into()],
            weights: Some(vec![0.3, 0.7]),
        });
        config.split = Some("90,5,5".into());
        config.num_samples = [Some(500), Some(20), Some(10)];
        let lengths = |p: &str| {
            let n = if p == "a" { 7 } else { 5 };
            Ok(std::sync::Arc::from(vec![n; 400]))
        };
        let store = Counting::default();
        let first = build_cached(&config, &mut { lengths }, Some(&store)).unwrap();
        assert_eq!(store.hits.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(
            store.map.lock().unwrap().len(),
            6,
            "two sources x three splits"
        );
        let again = build_cached(&config, &mut { lengths }, Some(&store)).unwrap();
        assert_eq!(store.hits.load(std::sync::atomic::Ordering::SeqCst), 6);
        for (a, b) in first.splits.iter().zip(&again.splits) {
            let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
            assert_eq!(a.len(), b.len());
            for i in 0..a.len() {
                assert_eq!(a.sample(i).unwrap(), b.sample(i).unwrap());
            }
        }
        config.random_seed = 43;
        build_cached(&config, &mut { lengths }, Some(&store)).unwrap();
        assert_eq!(store.hits.load(std::sync::atomic::Ordering::SeqCst), 6);
        assert_eq!(store.map.lock().unwrap().len(), 12);
    }
}
