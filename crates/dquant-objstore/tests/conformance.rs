//! Object-store roots pass the storage layer's conformance suite: over `object_store`'s
//! in-memory store, and over a real S3 server (s3s-fs on loopback).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dquant_objstore::{ObjectRoot, ReadSettings, S3Location, S3Settings};
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
