//! Every `Root` passes the one conformance suite; `LocalRoot` also keeps names inside its
//! directory whatever the links and file types in it.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use dquant_format::{DType, DocIndex};
use dquant_storage::conformance;
use dquant_storage::{
    Dataset, DatasetWriter, InMemoryRoot, LocalRoot, OpenOptions, OutputFormat, Root, RootError,
    StorageError,
};
use tempfile::TempDir;

use crate::common;
use common::{mkfifo, Owned};

/// A `LocalRoot` made by `new` holding `objects`.
fn local_with(
    new: fn(&Path) -> std::io::Result<LocalRoot>,
    objects: &[(&str, &[u8])],
) -> Box<dyn Root> {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in objects {
        let p = dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
    let root = new(dir.path()).unwrap();
    Box::new(Owned { root, _keep: dir })
}

fn local(objects: &[(&str, &[u8])]) -> Box<dyn Root> {
    local_with(LocalRoot::new, objects)
}

fn memory(objects: &[(&str, &[u8])]) -> Box<dyn Root> {
    Box::new(InMemoryRoot::from_objects(objects).unwrap())
}

#[test]
fn local_root_conforms() {
    conformance::run(&local);
}

/// The fallback for kernels without `openat2` (a component-by-component walk) behaves the
/// same.
#[test]
fn local_root_without_openat2_conforms() {
    conformance::run(&|objects| local_with(LocalRoot::new_without_openat2, objects));
}

#[test]
fn in_memory_root_conforms() {
    conformance::run(&memory);
}

/// A root at `T/root` holding a Megatron `m.idx` (of 4 int32 tokens, without its `.bin`) and
/// `secret`, a valid `.bin` for it, beside the root, outside it.
fn escape_setup() -> (TempDir, LocalRoot) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("root");
    std::fs::create_dir(&dir).unwrap();
    let mut w = DatasetWriter::create(&dir.join("m"), OutputFormat::Megatron { dtype: DType::I32 })
        .unwrap();
    w.push(&[1, 2, 3, 4]).unwrap();
    w.finish(&DocIndex::single(4)).unwrap();
    std::fs::rename(dir.join("m.bin"), t.path().join("secret")).unwrap();
    let root = LocalRoot::new(&dir).unwrap();
    (t, root)
}

#[test]
fn a_bin_linked_outside_beside_an_inside_idx_is_refused() {
    let (t, root) = escape_setup();
    let dir = root.dir().to_path_buf();
    std::os::unix::fs::symlink(t.path().join("secret"), dir.join("m.bin")).unwrap();
    let err = Dataset::open_in(&root, "m", &OpenOptions::default()).err();
    assert!(
        matches!(&err, Some(StorageError::Root(RootError::Escape { name })) if name == "m.bin"),
        "{err:?}"
    );
    assert_eq!(
        err.unwrap().to_string(),
        "m.bin: leads outside the root (symlink escape)"
    );
    assert!(matches!(root.stat("m.bin"), Err(RootError::Escape { .. })));
    // Not listed either: the `.idx` alone is a raw object.
    let names: Vec<String> = root.list().unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["m.idx"]);
    // The same bytes inside the root open.
    std::fs::remove_file(dir.join("m.bin")).unwrap();
    std::fs::copy(t.path().join("secret"), dir.join("m.bin")).unwrap();
    let ds = Dataset::open_in(&root, "m", &OpenOptions::default()).unwrap();
    let mut tokens = Vec::new();
    ds.reader().read(0..4, &mut tokens).unwrap();
    assert_eq!(tokens, [1, 2, 3, 4]);
}

#[test]
fn dot_dot_and_absolute_names_are_refused_even_when_the_file_exists() {
    let (t, root) = escape_setup();
    let secret = t.path().join("secret");
    for name in ["../secret", "m.idx/../../secret", secret.to_str().unwrap()] {
        let r = root.open(name).map(|_| ());
        assert!(
            matches!(r, Err(RootError::InvalidName { .. })),
            "{name}: {r:?}"
        );
    }
    let r = Dataset::open_in(&root, "../secret", &OpenOptions::default());
    assert_eq!(
        r.err().unwrap().to_string(),
        "../secret: '..' is not allowed; names are relative to the root"
    );
}

#[test]
fn links_inside_the_root_are_followed() {
    let (_t, root) = escape_setup();
    let dir = root.dir().to_path_buf();
    std::fs::create_dir(dir.join("d")).unwrap();
    std::os::unix::fs::symlink(dir.join("m.idx"), dir.join("d/alias")).unwrap();
    // A directory link back up the tree must not make listing loop.
    std::os::unix::fs::symlink(&dir, dir.join("d/loop")).unwrap();
    let idx_len = root.stat("m.idx").unwrap().len;
    assert_eq!(root.stat("d/alias").unwrap().len, idx_len);
    assert_eq!(root.open("d/alias").unwrap().len(), idx_len);
    let names: Vec<String> = root.list().unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["d/alias", "m.idx"]);
}

/// Runs `f` on a thread and fails if it takes more than five seconds (a blocking open).
fn quickly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(5))
        .expect("blocked on a FIFO")
}

#[test]
fn a_fifo_is_refused_at_once() {
    let (_t, root) = escape_setup();
    let dir = root.dir().to_path_buf();
    mkfifo(&dir.join("x.idx"));
    std::fs::write(dir.join("x.bin"), [0u8; 8]).unwrap();
    mkfifo(&dir.join("pipe"));
    let r = root.clone();
    let err = quickly(move || Dataset::open_in(&r, "x", &OpenOptions::default()).err());
    assert_eq!(err.unwrap().to_string(), "x.idx: not a regular file");
    let r = root.clone();
    let err = quickly(move || r.open("pipe").err());
    assert!(matches!(err, Some(RootError::NotAFile { .. })), "{err:?}");
    assert!(matches!(root.stat("pipe"), Err(RootError::NotAFile { .. })));
    // Nor is it listed; and opened by path it is refused as quickly.
    let names: Vec<String> = root.list().unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["m.idx", "x.bin"]);
    let p = dir.join("pipe");
    let err = quickly(move || Dataset::open(&p, &OpenOptions::default()).err());
    assert_eq!(
        err.unwrap().to_string(),
        format!("{}: not a regular file", dir.join("pipe").display())
    );
}

#[test]
fn a_root_must_be_a_directory() {
    let (t, _root) = escape_setup();
    let e = LocalRoot::new(&t.path().join("secret")).unwrap_err();
    assert_eq!(e.to_string(), "not a directory");
    let e = LocalRoot::new(&t.path().join("missing")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
}
