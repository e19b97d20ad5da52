//! `dquant convert` and `inspect` with `s3://` inputs and outputs, against a real S3 server
//! (s3s-fs on loopback), reached as users reach theirs: through the `AWS_*` variables.

use std::process::Command;

use dquant_testkit::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use dquant_testkit::{fixture, xxh3};
use serde_json::Value;

fn dquant(server: &S3Server, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dquant"))
        .args(args)
        .env_remove("DQUANT_LOG")
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("running the dquant binary");
    let r = (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        !r.2.contains("panicked"),
        "dquant {args:?} panicked:\n{}",
        r.2
    );
    r
}

fn json(server: &S3Server, args: &[&str]) -> Value {
    let (code, out, err) = dquant(server, args);
    assert_eq!(code, 0, "dquant {args:?}: {err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn convert_reads_and_writes_buckets_and_inspect_reads_them() {
    let server = S3Server::start();
    let src = fixture("r50k_int32");
    for ext in ["bin", "idx"] {
        let bytes = std::fs::read(src.with_extension(ext)).unwrap();
        server.put("corpus", &format!("web/r50k_int32.{ext}"), &bytes);
    }
    let local = json(
        &server,
        &["inspect", src.to_str().unwrap(), "--json", "--no-sizes"],
    );
    let remote = json(
        &server,
        &[
            "inspect",
            "s3://corpus/web/r50k_int32",
            "--json",
            "--no-sizes",
        ],
    );
    assert_eq!(remote["checksum"], local["checksum"]);
    assert_eq!(remote["tokens"], local["tokens"]);

    // In place: S3 Megatron int32 -> an S3 block file, by multipart upload.
    let rep = json(
        &server,
        &[
            "convert",
            "s3://corpus/web/r50k_int32",
            "s3://corpus/web/r50k.dqb",
            "--codec",
            "u16+zstd:3",
            "--json",
        ],
    );
    assert_eq!(rep["checksum"], local["checksum"]);
    assert_eq!(rep["files"][0], "s3://corpus/web/r50k.dqb");
    let stored = server.dir().join("corpus/web/r50k.dqb");
    assert_eq!(
        std::fs::metadata(&stored).unwrap().len(),
        rep["dst_bytes"].as_u64().unwrap()
    );
    let remote = json(
        &server,
        &[
            "inspect",
            "s3://corpus/web/r50k.dqb",
            "--json",
            "--no-sizes",
        ],
    );
    assert_eq!(remote["checksum"], local["checksum"]);

    // Back to a local Megatron uint16 pair: the same tokens as converting the local file.
    let dir = tempfile::tempdir().unwrap();
    let from_s3 = dir.path().join("a");
    let from_local = dir.path().join("b");
    for (input, out) in [
        ("s3://corpus/web/r50k.dqb", &from_s3),
        (src.to_str().unwrap(), &from_local),
    ] {
        json(
            &server,
            &[
                "convert",
                input,
                out.to_str().unwrap(),
                "--codec",
                "u16",
                "--json",
                "-q",
            ],
        );
    }
    for ext in ["bin", "idx"] {
        let a = std::fs::read(from_s3.with_extension(ext)).unwrap();
        let b = std::fs::read(from_local.with_extension(ext)).unwrap();
        assert_eq!(xxh3(&a), xxh3(&b), "{ext}");
    }

    // An existing output is refused; a missing input is named.
    let (code, _, err) = dquant(
        &server,
        &[
            "convert",
            "s3://corpus/web/r50k_int32",
            "s3://corpus/web/r50k.dqb",
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "error: s3://corpus/web/r50k.dqb exists; pass --force to replace it"
    );
    let (code, _, err) = dquant(&server, &["inspect", "s3://corpus/web/nope.dqb"]);
    assert_eq!(code, 1);
    assert!(err.contains("web/nope.dqb: no such object"), "{err}");
    // A failed convert leaves no object behind: the token 60000 does not fit u8.
    let (code, _, _) = dquant(
        &server,
        &[
            "convert",
            "s3://corpus/web/r50k_int32",
            "s3://corpus/web/bad.dqb",
            "--codec",
            "u8",
        ],
    );
    assert_eq!(code, 1);
    assert!(!server.dir().join("corpus/web/bad.dqb").exists());
}
