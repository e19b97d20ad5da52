//! Object-store roots pass the storage layer's conformance suite: over `object_store`'s
//! in-memory store, over a real S3 server (s3s-fs on loopback), and over a local directory
//! named by a `file://` URI (the backend registry's second backend).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dquant_objstore::{locate, ObjectRoot, Place, ReadSettings, S3Location, S3Settings};
use dquant_storage::{conformance, Root};
use dquant_testkit::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStoreExt as _, PutPayload};

/// Small parts, so that the suite's objects span several GETs and the readahead.
const READ: ReadSettings = ReadSettings {
    part_bytes: 1024,
    readahead_bytes: 4096,
};

fn put(store: &InMemory, key: &str, bytes: &[u8]) {
    futures::executor::block_on(store.put(&Path::from(key), PutPayload::from(bytes.to_vec())))
        .expect("put");
}

/// A root at `data/set` of an in-memory store, with objects beside the prefix that must not
/// show through it.
fn memory(objects: &[(&str, &[u8])]) -> Box<dyn Root> {
    let store = InMemory::new();
    for (name, bytes) in objects {
        put(&store, &format!("data/set/{name}"), bytes);
    }
    put(&store, "data/other", b"outside");
    put(&store, "data/setx/y", b"a sibling prefix");
    Box::new(ObjectRoot::new(
        Arc::new(store),
        "memory:///data/set",
        "data/set",
        READ,
    ))
}

#[test]
fn in_memory_object_root_conforms() {
    conformance::run(&memory);
}

/// Settings for `server` with the test credentials.
pub fn settings(endpoint: String) -> S3Settings {
    S3Settings {
        endpoint: Some(endpoint),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        part_bytes: 64 << 10,
        readahead_bytes: 256 << 10,
        ..S3Settings::default()
    }
}

#[test]
fn s3_root_conforms() {
    let server = S3Server::start();
    let n = AtomicUsize::new(0);
    let make = |objects: &[(&str, &[u8])]| -> Box<dyn Root> {
        // A bucket per root: each check starts from exactly its objects.
        let bucket = format!("bucket-{}", n.fetch_add(1, Ordering::SeqCst));
        server.bucket(&bucket);
        for (name, bytes) in objects {
            server.put(&bucket, &format!("pre/{name}"), bytes);
        }
        server.put(&bucket, "outside", b"not under the prefix");
        let at = S3Location::parse(&format!("s3://{bucket}/pre")).unwrap();
        Box::new(ObjectRoot::s3(&at, &settings(server.endpoint())).unwrap())
    };
    conformance::run(&make);
}

#[test]
fn file_uri_root_conforms() {
    let dirs = Mutex::new(Vec::new());
    let make = |objects: &[(&str, &[u8])]| -> Box<dyn Root> {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in objects {
            let path = dir.path().join("set").join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("set")).unwrap();
        std::fs::write(dir.path().join("outside"), b"not under the path").unwrap();
        let uri = format!("file://{}/set", dir.path().display());
        let Place::Store(place) =
            locate(std::path::Path::new(&uri), &S3Settings::default()).unwrap()
        else {
            panic!("{uri} is a file:// location");
        };
        assert_eq!(place.root().location(), uri);
        dirs.lock().unwrap().push(dir);
        Box::new(place.root())
    };
    conformance::run(&make);
}

#[test]
fn file_uris_must_be_absolute_and_plain() {
    let err = |uri: &str| match locate(std::path::Path::new(uri), &S3Settings::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("{uri} opened"),
    };
    assert_eq!(
        err("file://data/x"),
        "\"file://data/x\": not an object-store location: expected file:///ABSOLUTE/PATH"
    );
    assert_eq!(
        err("file:///data/../etc"),
        "\"file:///data/../etc\": not an object-store location: the path may not hold empty, '.' or '..' segments"
    );
    assert!(matches!(
        locate(std::path::Path::new("/data/x"), &S3Settings::default()),
        Ok(Place::Local(p)) if p == std::path::Path::new("/data/x")
    ));
}
