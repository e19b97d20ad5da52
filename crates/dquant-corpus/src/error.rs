use std::path::PathBuf;

/// Errors of the corpus generators. Every variant names what it is about (path, value).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorpusError {
    /// An encoding name that [`Encoding::from_str`](std::str::FromStr) does not know.
    #[error("unknown encoding {name:?}; valid names: r50k, r50k_base, cl100k, cl100k_base, o200k, o200k_base")]
    UnknownEncoding {
        /// The name as given.
        name: String,
    },
    /// The bundled tiktoken tables failed to load (should not happen; reported, not unwrapped).
    #[error("failed to load the {encoding} tokenizer from tiktoken-rs: {message}")]
    TokenizerLoad {
        /// Encoding name.
        encoding: &'static str,
        /// The loader's error, as text.
        message: String,
    },
    /// The source root does not exist or is not a directory.
    #[error("corpus source root {root} does not exist or is not a directory (set CARGO_HOME, or pick another root)")]
    RootMissing {
        /// The root that was searched.
        root: PathBuf,
    },
    /// The source root holds no regular file with one of the wanted extensions.
    #[error("no files with extension(s) {extensions:?} under corpus source root {root}")]
    NoFiles {
        /// The root that was searched.
        root: PathBuf,
        /// The extensions looked for.
        extensions: Vec<String>,
    },
    /// Walking the source tree failed (e.g. a directory that cannot be read).
    #[error("cannot list corpus sources under {root}: {source}")]
    Walk {
        /// The root being walked.
        root: PathBuf,
        /// The underlying error (it names the failing path).
        #[source]
        source: walkdir::Error,
    },
    /// Reading one source file failed.
    #[error("cannot read corpus source file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The tokenizer failed on one file (tiktoken-rs panics on pathological regex input; the
    /// panic is caught and reported here instead of taking the process down).
    #[error("tokenizer {encoding} failed on {path}")]
    Tokenize {
        /// Encoding name.
        encoding: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A [`Zipf`](crate::Zipf) parameter is out of range.
    #[error("invalid Zipf parameter {field} = {value}: {reason}")]
    InvalidZipf {
        /// The field name.
        field: &'static str,
        /// Its value, as text.
        value: String,
        /// What is required.
        reason: &'static str,
    },
}
