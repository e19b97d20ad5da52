use std::ffi::OsStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use tiktoken_rs::CoreBPE;
use walkdir::WalkDir;

use crate::encoding::LoadFailure;
use crate::ordered::ordered_parallel;
use crate::{CorpusError, CorpusStats, Encoding};

/// Where Cargo unpacks the sources of downloaded crates: `$CARGO_HOME/registry/src`, or
/// `$HOME/.cargo/registry/src` when `CARGO_HOME` is unset or empty (`.cargo/registry/src`
/// relative to the working directory if `HOME` is unset too).
///
/// The directory may not exist (e.g. a fresh machine); [`RealCorpus::files`] then reports it.
pub fn default_source_root() -> PathBuf {
    let cargo_home = match std::env::var_os("CARGO_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home).join(".cargo"),
            _ => PathBuf::from(".cargo"),
        },
    };
    cargo_home.join("registry").join("src")
}

/// Real text tokenized with a tiktoken encoding: every source file with one of `extensions`
/// under `root` becomes one document.
///
/// The output is a pure function of the files' contents and relative paths: files are taken in
/// byte order of their path relative to `root`, and tokenization runs on several threads but
/// documents are always delivered in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealCorpus {
    /// Directory searched recursively (symbolic links below it are not followed).
    pub root: PathBuf,
    /// Tokenizer.
    pub encoding: Encoding,
    /// Stop before the file that would take the source bytes read over this many (the first file
    /// is always read). `None`: read every file.
    pub max_bytes: Option<u64>,
    /// File name extensions to take, without the dot (a leading dot is ignored); compared
    /// exactly (case-sensitive). Default `["rs"]`.
    pub extensions: Vec<String>,
}

/// One listed source file.
struct SourceFile {
    path: PathBuf,
    /// Size from the directory listing (used for planning `max_bytes` and progress).
    size: u64,
}

/// What a worker produced for one file.
struct FileOut {
    /// Bytes actually read.
    bytes_read: u64,
    /// Tokens followed by the end-of-document token; `None` if the file is not UTF-8.
    doc: Option<Vec<u32>>,
    /// Largest id in `doc`.
    max_token: u32,
}

/// Most worker threads used; tokenization is CPU-bound and the consumer is single-threaded.
/// Each worker past the first holds its own tokenizer (tens of MB for o200k).
const MAX_THREADS: usize = 8;

/// Files per worker thread that may be in flight (claimed, not yet consumed). Source files vary
/// in size by 1000x; a window of only ~2 per thread left workers idle behind one large file
/// (measured 17 MB/s vs 23 MB/s with 8 per thread, r50k, 2 cores). Memory stays bounded by
/// `8 * threads` files' text and tokens.
const WINDOW_PER_THREAD: usize = 8;

impl RealCorpus {
    /// Sources under [`default_source_root`], extension `rs`, no byte limit.
    pub fn new(encoding: Encoding) -> Self {
        RealCorpus {
            root: default_source_root(),
            encoding,
            max_bytes: None,
            extensions: vec!["rs".to_string()],
        }
    }

    /// All regular files under `root` with one of the extensions, sorted by their path relative
    /// to `root` (byte order). Symbolic links are not followed (nor listed).
    ///
    /// Errors: `root` missing or not a directory, a directory that cannot be read, or no
    /// matching file at all; each message names the root.
    pub fn files(&self) -> Result<Vec<PathBuf>, CorpusError> {
        Ok(self.list()?.into_iter().map(|f| f.path).collect())
    }

    fn list(&self) -> Result<Vec<SourceFile>, CorpusError> {
        if !self.root.is_dir() {
            return Err(CorpusError::RootMissing {
                root: self.root.clone(),
            });
        }
        let extensions: Vec<&OsStr> = self
            .extensions
            .iter()
            .map(|e| OsStr::new(e.strip_prefix('.').unwrap_or(e)))
            .collect();
        let mut found: Vec<(Vec<u8>, SourceFile)> = Vec::new();
        for entry in WalkDir::new(&self.root).follow_links(false) {
            let entry = entry.map_err(|source| CorpusError::Walk {
                root: self.root.clone(),
                source,
            })?;
            // Without following links a symlink reports its own type, so it is skipped here.
            if !entry.file_type().is_file() {
                continue;
            }
            let wanted = entry
                .path()
                .extension()
                .is_some_and(|ext| extensions.contains(&ext));
            if !wanted {
                continue;
            }
            let size = entry
                .metadata()
                .map_err(|source| CorpusError::Walk {
                    root: self.root.clone(),
                    source,
                })?
                .len();
            let path = entry.into_path();
            let key = path
                .strip_prefix(&self.root)
                .unwrap_or(&path)
                .as_os_str()
                .as_encoded_bytes()
                .to_vec();
            found.push((key, SourceFile { path, size }));
        }
        if found.is_empty() {
            return Err(CorpusError::NoFiles {
                root: self.root.clone(),
                extensions: self.extensions.clone(),
            });
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found.into_iter().map(|(_, f)| f).collect())
    }

    /// The files to read under `max_bytes`, and their total listed size.
    fn plan(&self) -> Result<(Vec<SourceFile>, u64), CorpusError> {
        let mut files = self.list()?;
        let mut total = 0u64;
        let mut take = 0;
        for file in &files {
            let next = total.saturating_add(file.size);
            if take > 0 && self.max_bytes.is_some_and(|max| next > max) {
                break;
            }
            total = next;
            take += 1;
        }
        files.truncate(take);
        Ok((files, total))
    }

    /// Tokenizes the files in [`files`](Self::files) order, one document per file, and hands
    /// each document to `on_doc`: the tokens of the file's text (tiktoken `encode_ordinary`, so
    /// text such as `<|endoftext|>` inside a file is ordinary text, never a special token)
    /// followed by [`Encoding::eod_token`].
    ///
    /// * Files that are not valid UTF-8 are skipped and counted in
    ///   [`CorpusStats::skipped_non_utf8`].
    /// * With `max_bytes`, stops before the first file that would take the listed size of the
    ///   files read over the limit; the first file is always read.
    /// * `on_progress(done, total)` is called once before the first file and after each file:
    ///   `done` = source bytes read so far, `total` = planned bytes (listed sizes).
    ///
    /// Tokenization runs on up to [`std::thread::available_parallelism`] threads (at most 8),
    /// with at most 8 files in flight per thread; documents still arrive in file order, so the
    /// output is identical from run to run. Memory is bounded by those files (the corpus is
    /// never loaded whole) plus one tokenizer instance per extra thread.
    ///
    /// The error type is the caller's: anything that converts from [`CorpusError`] (use
    /// `CorpusError` itself when the callback cannot fail). The first error from `on_doc`, or
    /// the first corpus error in file order, stops the run and is returned.
    pub fn generate<E, D, P>(&self, on_doc: D, on_progress: P) -> Result<CorpusStats, E>
    where
        E: From<CorpusError>,
        D: FnMut(&[u32]) -> Result<(), E>,
        P: FnMut(u64, u64),
    {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, MAX_THREADS);
        self.generate_with_threads(threads, on_doc, on_progress)
    }

    /// [`generate`](Self::generate) with a given number of tokenizer threads (0 or 1: tokenize
    /// on the calling thread).
    pub(crate) fn generate_with_threads<E, D, P>(
        &self,
        threads: usize,
        mut on_doc: D,
        mut on_progress: P,
    ) -> Result<CorpusStats, E>
    where
        E: From<CorpusError>,
        D: FnMut(&[u32]) -> Result<(), E>,
        P: FnMut(u64, u64),
    {
        let bpe = self.encoding.tokenizer()?;
        let (files, total) = self.plan()?;
        let eod = self.encoding.eod_token();
        let encoding = self.encoding.name();
        let tokenize = |bpe: &CoreBPE, i: usize| tokenize_file(bpe, encoding, eod, &files[i].path);

        let mut stats = CorpusStats::default();
        on_progress(0, total);
        let mut emit = |out: Result<FileOut, CorpusError>| -> Result<(), E> {
            let out = out?;
            stats.files += 1;
            stats.source_bytes += out.bytes_read;
            match out.doc {
                None => stats.skipped_non_utf8 += 1,
                Some(doc) => {
                    stats.documents += 1;
                    stats.tokens += doc.len() as u64;
                    stats.max_token = stats.max_token.max(out.max_token);
                    on_doc(&doc)?;
                }
            }
            on_progress(stats.source_bytes, total);
            Ok(())
        };

        let threads = threads.min(files.len());
        if threads <= 1 {
            for i in 0..files.len() {
                emit(tokenize(bpe, i))?;
            }
        } else {
            // Worker 0 uses the shared tokenizer, the others load their own (see
            // `Encoding::load_private`: sharing one instance serialises the regex scratch pool).
            let init = |worker: usize| match worker {
                0 => Ok(Tokenizer::Shared(bpe)),
                _ => self.encoding.load_private().map(Tokenizer::Private),
            };
            let work = |tok: &mut Result<Tokenizer, LoadFailure>, i: usize| match tok {
                Ok(tok) => tokenize(tok.get(), i),
                Err(failure) => Err(failure.error(encoding)),
            };
            ordered_parallel(
                files.len(),
                threads,
                WINDOW_PER_THREAD * threads,
                init,
                work,
                emit,
            )?;
        }
        Ok(stats)
    }
}

/// A worker's tokenizer: the process-wide instance or one of its own.
enum Tokenizer {
    Shared(&'static CoreBPE),
    Private(CoreBPE),
}

impl Tokenizer {
    fn get(&self) -> &CoreBPE {
        match self {
            Tokenizer::Shared(bpe) => bpe,
            Tokenizer::Private(bpe) => bpe,
        }
    }
}

/// Reads and tokenizes one file. Never panics: a panic inside the tokenizer becomes an error.
fn tokenize_file(
    bpe: &CoreBPE,
    encoding: &'static str,
    eod: u32,
    path: &Path,
) -> Result<FileOut, CorpusError> {
    let bytes = std::fs::read(path).map_err(|source| CorpusError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes_read = bytes.len() as u64;
    let Ok(text) = String::from_utf8(bytes) else {
        return Ok(FileOut {
            bytes_read,
            doc: None,
            max_token: 0,
        });
    };
    // tiktoken-rs unwraps fancy-regex results internally (e.g. backtrack limit on pathological
    // input); contain that to this file instead of tearing down the caller.
    let mut doc = catch_unwind(AssertUnwindSafe(|| bpe.encode_ordinary(&text))).map_err(|_| {
        CorpusError::Tokenize {
            encoding,
            path: path.to_path_buf(),
        }
    })?;
    doc.push(eod);
    let max_token = doc.iter().copied().max().unwrap_or(eod);
    Ok(FileOut {
        bytes_read,
        doc: Some(doc),
        max_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::Hasher;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn write(dir: &Path, rel: &str, bytes: &[u8]) -> std::io::Result<()> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)
    }

    fn corpus(root: &Path) -> RealCorpus {
        RealCorpus {
            root: root.to_path_buf(),
            ..RealCorpus::new(Encoding::R50k)
        }
    }

    /// Runs the corpus and returns (documents, progress calls, stats).
    #[allow(clippy::type_complexity)]
    fn collect(
        c: &RealCorpus,
        threads: usize,
    ) -> Result<(Vec<Vec<u32>>, Vec<(u64, u64)>, CorpusStats), CorpusError> {
        let mut docs = Vec::new();
        let mut progress = Vec::new();
        let stats = c.generate_with_threads(
            threads,
            |d: &[u32]| -> Result<(), CorpusError> {
                docs.push(d.to_vec());
                Ok(())
            },
            |done, total| progress.push((done, total)),
        )?;
        Ok((docs, progress, stats))
    }

    #[test]
    fn one_doc_per_file_in_sorted_order_non_utf8_skipped() -> TestResult {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        let texts: [(&str, &str); 6] = [
            ("a-z.rs", "fn a_z() -> u8 { 1 }\n"),
            (
                "a.rs",
                "pub struct A;\n// <|endoftext|> is plain text here\n",
            ),
            ("b.rs", "fn b() { println!(\"héllo wörld\"); }\n"),
            ("e.rs", ""),
            ("sub-x.rs", "mod x;\n"),
            ("sub/c.rs", "const C: [u8; 3] = [1, 2, 3];\n"),
        ];
        for (rel, text) in texts {
            write(root, rel, text.as_bytes())?;
        }
        write(root, "bad.rs", b"fn bad() {}\n\xff\xfe not utf-8\n")?;
        write(root, "notes.txt", b"not a source file")?;
        write(root, "sub/deeper/readme.md", b"# no")?;
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.join("a.rs"), root.join("link.rs"))?;

        let c = corpus(root);
        let rel: Vec<String> = c
            .files()?
            .iter()
            .map(|p| {
                p.strip_prefix(root)
                    .map(|r| r.to_string_lossy().into_owned())
            })
            .collect::<Result<_, _>>()?;
        // Byte order of the relative path: '-' (0x2d) < '.' (0x2e) < '/' (0x2f) < letters.
        assert_eq!(
            rel,
            ["a-z.rs", "a.rs", "b.rs", "bad.rs", "e.rs", "sub-x.rs", "sub/c.rs"]
        );

        let (docs, progress, stats) = collect(&c, 2)?;
        let bpe = Encoding::R50k.tokenizer()?;
        let eod = Encoding::R50k.eod_token();
        let expected: Vec<Vec<u32>> = texts
            .iter()
            .map(|(_, t)| {
                let mut d = bpe.encode_ordinary(t);
                d.push(eod);
                d
            })
            .collect();
        assert_eq!(docs, expected);
        for doc in &docs {
            assert_eq!(doc.last(), Some(&eod));
            assert_eq!(doc.iter().filter(|&&t| t == eod).count(), 1, "{doc:?}");
        }
        assert_eq!(
            docs[3],
            vec![eod],
            "empty file is a document of just <|endoftext|>"
        );
        // The non-UTF-8 file is counted, read, and produced no document.
        let all_bytes: u64 = texts.iter().map(|(_, t)| t.len() as u64).sum::<u64>()
            + b"fn bad() {}\n\xff\xfe not utf-8\n".len() as u64;
        let tokens: u64 = expected.iter().map(|d| d.len() as u64).sum();
        let max_token = expected.iter().flatten().copied().max().unwrap_or(0);
        assert_eq!(
            stats,
            CorpusStats {
                files: 7,
                skipped_non_utf8: 1,
                source_bytes: all_bytes,
                documents: 6,
                tokens,
                max_token,
            }
        );
        assert_eq!(max_token, eod);
        // Progress: starts at 0, monotonic, one call per file, ends at the planned total.
        assert_eq!(progress.len(), 1 + 7);
        assert_eq!(progress[0], (0, all_bytes));
        assert!(progress.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(progress.last(), Some(&(all_bytes, all_bytes)));
        Ok(())
    }

    fn hash_docs(docs: &[Vec<u32>]) -> u64 {
        let mut h = DefaultHasher::new();
        for doc in docs {
            h.write_usize(doc.len());
            for &t in doc {
                h.write_u32(t);
            }
        }
        h.finish()
    }

    #[test]
    fn output_is_identical_across_runs_and_thread_counts() -> TestResult {
        let dir = tempfile::tempdir()?;
        // Files of very different sizes, so that threads finish out of order.
        for i in 0..40u32 {
            let reps = [1usize, 400, 3, 90, 20][i as usize % 5];
            let body: String = (0..reps)
                .map(|k| format!("fn f{i}_{k}(x: u32) -> u32 {{ x.wrapping_mul({k}) ^ {i} }}\n"))
                .collect();
            write(
                dir.path(),
                &format!("d{}/f{i:02}.rs", i % 3),
                body.as_bytes(),
            )?;
        }
        let c = corpus(dir.path());
        let (reference, _, ref_stats) = collect(&c, 1)?;
        assert_eq!(reference.len(), 40);
        let reference_hash = hash_docs(&reference);
        for threads in [1, 2, 3, 8] {
            for _ in 0..2 {
                let (docs, _, stats) = collect(&c, threads)?;
                assert_eq!(hash_docs(&docs), reference_hash, "threads = {threads}");
                assert_eq!(stats, ref_stats);
            }
        }
        // The public entry point gives the same stream.
        let mut h = Vec::new();
        let stats = c.generate(
            |d: &[u32]| -> Result<(), CorpusError> {
                h.push(d.to_vec());
                Ok(())
            },
            |_, _| {},
        )?;
        assert_eq!(hash_docs(&h), reference_hash);
        assert_eq!(stats, ref_stats);
        Ok(())
    }

    #[test]
    fn max_bytes_stops_before_the_file_that_would_exceed() -> TestResult {
        let dir = tempfile::tempdir()?;
        let sizes = [100usize, 1000, 10, 50];
        for (i, &n) in sizes.iter().enumerate() {
            write(dir.path(), &format!("f{i}.rs"), "x".repeat(n).as_bytes())?;
        }
        let run = |max: Option<u64>| -> Result<(usize, CorpusStats, u64), CorpusError> {
            let mut c = corpus(dir.path());
            c.max_bytes = max;
            let (docs, progress, stats) = collect(&c, 2)?;
            let planned = progress.first().map_or(0, |p| p.1);
            Ok((docs.len(), stats, planned))
        };
        // (limit, documents, bytes)
        let cases = [
            (Some(0), 1, 100), // the first file is always read, even over the limit
            (Some(99), 1, 100),
            (Some(100), 1, 100),
            (Some(1099), 1, 100), // stops before f1; does not skip ahead to the small f2
            (Some(1100), 2, 1100),
            (Some(1110), 3, 1110),
            (Some(1159), 3, 1110),
            (Some(1160), 4, 1160),
            (None, 4, 1160),
        ];
        for (max, want_docs, want_bytes) in cases {
            let (docs, stats, planned) = run(max)?;
            assert_eq!(docs, want_docs, "max_bytes {max:?}");
            assert_eq!(stats.files, want_docs as u64, "max_bytes {max:?}");
            assert_eq!(stats.source_bytes, want_bytes, "max_bytes {max:?}");
            assert_eq!(planned, want_bytes, "max_bytes {max:?}");
        }
        Ok(())
    }

    #[test]
    fn extensions_and_missing_root_and_empty_root() -> TestResult {
        let dir = tempfile::tempdir()?;
        write(dir.path(), "a.txt", b"alpha")?;
        write(dir.path(), "b.md", b"beta")?;
        write(dir.path(), "c.RS", b"gamma")?;
        let mut c = corpus(dir.path());
        let err = match c.files() {
            Ok(f) => panic!("expected no files, got {f:?}"),
            Err(e) => e,
        };
        assert!(matches!(err, CorpusError::NoFiles { .. }), "{err}");
        assert!(
            err.to_string().contains(&dir.path().display().to_string()),
            "{err}"
        );

        c.extensions = vec![".md".into(), "txt".into()];
        let names: Vec<_> = c
            .files()?
            .iter()
            .map(|p| p.file_name().map(|n| n.to_owned()))
            .collect();
        assert_eq!(names, [Some("a.txt".into()), Some("b.md".into())]);

        let missing = dir.path().join("does-not-exist");
        let err = match corpus(&missing).files() {
            Ok(f) => panic!("expected an error, got {f:?}"),
            Err(e) => e,
        };
        assert!(matches!(err, CorpusError::RootMissing { .. }), "{err}");
        assert!(err.to_string().contains("does-not-exist"), "{err}");
        // generate reports the same error through the caller's error type.
        let r =
            corpus(&missing).generate(|_: &[u32]| -> Result<(), CorpusError> { Ok(()) }, |_, _| {});
        assert!(matches!(r, Err(CorpusError::RootMissing { .. })));
        Ok(())
    }

    #[derive(Debug)]
    enum StopErr {
        Corpus(#[allow(dead_code)] CorpusError),
        Stop(usize),
    }
    impl From<CorpusError> for StopErr {
        fn from(e: CorpusError) -> Self {
            StopErr::Corpus(e)
        }
    }

    #[test]
    fn callback_error_stops_the_run_and_is_returned() -> TestResult {
        let dir = tempfile::tempdir()?;
        for i in 0..30 {
            write(
                dir.path(),
                &format!("f{i:02}.rs"),
                format!("fn f{i}() {{}}\n").as_bytes(),
            )?;
        }
        let c = corpus(dir.path());
        for threads in [1, 2, 4] {
            let mut seen = 0usize;
            let r = c.generate_with_threads(
                threads,
                |_: &[u32]| {
                    seen += 1;
                    if seen == 5 {
                        Err(StopErr::Stop(seen))
                    } else {
                        Ok(())
                    }
                },
                |_, _| {},
            );
            assert!(matches!(r, Err(StopErr::Stop(5))), "{r:?}");
            assert_eq!(seen, 5);
        }
        Ok(())
    }

    #[test]
    fn panicking_callback_does_not_deadlock_the_workers() -> TestResult {
        let dir = tempfile::tempdir()?;
        for i in 0..20 {
            write(dir.path(), &format!("f{i:02}.rs"), b"fn f() {}\n")?;
        }
        let c = corpus(dir.path());
        let r = std::panic::catch_unwind(|| {
            c.generate_with_threads(
                2,
                |_: &[u32]| -> Result<(), CorpusError> { panic!("callback panics on purpose") },
                |_, _| {},
            )
        });
        assert!(r.is_err());
        Ok(())
    }
}
