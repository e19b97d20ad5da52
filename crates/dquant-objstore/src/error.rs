//! Errors of setting up an object-store root. Once a root exists, its errors are the storage
//! layer's [`RootError`](dquant_storage::RootError), like every root's.

/// Why an object-store root could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectRootError {
    /// The location string itself is wrong.
    #[error("{location:?}: not an object-store location: {problem}")]
    Location { location: String, problem: String },
    /// A setting (from the config or an `AWS_*` variable) cannot work.
    #[error("{location}: {problem}")]
    Settings { location: String, problem: String },
    /// The object_store client refused the settings.
    #[error("{location}: {source}")]
    Client {
        location: String,
        #[source]
        source: object_store::Error,
    },
}

/// A setting that parses but cannot work: which one, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct InvalidSetting {
    pub setting: String,
    pub problem: String,
}
