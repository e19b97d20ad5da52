//! The C API from C: `examples/c/read_plan.c` is compiled with `cc` against the library cargo
//! built for this test (static, and once shared), then run over real Megatron data, locally
//! and through an agent, in both reading modes. Its checksums must equal those of the same
//! stream read through the Rust API.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dquant_client::Reader;
use dquant_plan::{Cursor, Plan};
use dquant_testkit::agent::Corpus;
use dquant_testkit::fixture_str;

const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

/// What the example prints for a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Summary {
    /// Batches (mode `batches`); `None` in mode `read`, which counts reads instead.
    batches: Option<u64>,
    bytes: u64,
    fnv: String,
    epoch: u64,
    consumed_samples: u64,
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The stream of `plan_json` through the Rust API, in this process, from `cursor`.
fn rust_summary(plan_json: &str, cursor: Cursor) -> Summary {
    let plan = Plan::from_json(plan_json).unwrap();
    let mut r = Reader::local(&plan, cursor).unwrap();
    let (mut h, mut bytes, mut batches) = (0xcbf29ce484222325, 0, 0);
    while let Some(b) = r.next_batch().unwrap() {
        h = fnv1a(h, b.tokens.as_bytes());
        bytes += b.tokens.as_bytes().len() as u64;
        batches += 1;
    }
    let end = r.cursor();
    Summary {
        batches: Some(batches),
        bytes,
        fnv: format!("{h:016x}"),
        epoch: end.epoch,
        consumed_samples: end.consumed_samples,
    }
}

fn local_plan(output: &str) -> String {
    plan_over(&fixture_str("r50k_int32"), output)
}

fn plan_over(source: &str, output: &str) -> String {
    format!(
        r#"{{"sources":[{{"uri":"{source}"}}],"seq_len":127,"batch_size":4,"seed":7,"output":"{output}"}}"#
    )
}

/// Where cargo put this package's libraries for this test run: beside the test binary, in
/// `target/<profile>/deps`. (`cargo test` builds the library, every crate type of it, as a
/// dependency of this test but does not copy it up to `target/<profile>` as `cargo build`
/// does; a library there may be stale.)
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    for lib in ["libdquant_ffi.a", "libdquant_ffi.so"] {
        assert!(
            dir.join(lib).is_file(),
            "{lib} not found beside the test binary, in {}",
            dir.display()
        );
    }
    dir
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The example, compiled into a temporary directory.
struct Example {
    dir: tempfile::TempDir,
    /// Linked with `libdquant_ffi.a`.
    exe: PathBuf,
}

impl Example {
    fn build() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("read_plan");
        let lib = lib_dir().join("libdquant_ffi.a");
        run_ok(
            Command::new("cc")
                .args(["-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror", "-I"])
                .arg(Path::new(MANIFEST).join("include"))
                .arg(Path::new(MANIFEST).join("examples/c/read_plan.c"))
                .arg(lib)
                // What `rustc --print native-static-libs` lists for a static library on Linux.
                .args([
                    "-lgcc_s",
                    "-lutil",
                    "-lrt",
                    "-lpthread",
                    "-lm",
                    "-ldl",
                    "-lc",
                ])
                .arg("-o")
                .arg(&exe),
        );
        Example { dir, exe }
    }

    /// The example linked with `libdquant_ffi.so` instead (found through its rpath).
    fn build_shared(&self) -> PathBuf {
        let exe = self.dir.path().join("read_plan_shared");
        let libs = lib_dir();
        run_ok(
            Command::new("cc")
                .args(["-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror", "-I"])
                .arg(Path::new(MANIFEST).join("include"))
                .arg(Path::new(MANIFEST).join("examples/c/read_plan.c"))
                .arg("-L")
                .arg(&libs)
                .arg("-ldquant_ffi")
                .arg(format!("-Wl,-rpath,{}", libs.display()))
                .arg("-o")
                .arg(&exe),
        );
        exe
    }

    fn plan_file(&self, json: &str) -> PathBuf {
        let n = std::fs::read_dir(self.dir.path()).unwrap().count();
        let p = self.dir.path().join(format!("plan{n}.json"));
        std::fs::write(&p, json).unwrap();
        p
    }

    fn command(&self, exe: &Path, uri: &str, plan: &str, offload: u8, mode: &str) -> Command {
        let mut cmd = Command::new(exe);
        cmd.arg(uri)
            .arg(self.plan_file(plan))
            .arg(offload.to_string())
            .arg(mode);
        cmd
    }

    fn run(&self, uri: &str, plan: &str, offload: u8, mode: &str) -> Summary {
        parse(&run_ok(
            &mut self.command(&self.exe, uri, plan, offload, mode),
        ))
    }

    /// Runs it expecting failure; returns its stderr.
    fn fail(&self, uri: &str, plan: &str, offload: u8) -> String {
        let out = self
            .command(&self.exe, uri, plan, offload, "batches")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
        assert!(out.stdout.is_empty(), "a failed run printed a summary");
        stderr
    }
}

fn parse(out: &Output) -> Summary {
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let field = |key: &str| -> Option<&str> {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    };
    let num = |key: &str| field(key).map(|v| v.parse::<u64>().unwrap());
    let summary = Summary {
        batches: num("batches"),
        bytes: num("bytes").unwrap_or_else(|| panic!("no bytes= in {text}")),
        fnv: field("fnv")
            .unwrap_or_else(|| panic!("no fnv= in {text}"))
            .into(),
        epoch: num("epoch").unwrap(),
        consumed_samples: num("consumed_samples").unwrap(),
    };
    assert!(
        summary.batches.is_some() || num("reads").is_some(),
        "neither batches= nor reads= in {text}"
    );
    summary
}

/// `got` (from the example) matches `want` (from Rust); mode `read` does not count batches.
fn assert_same(got: &Summary, want: &Summary, what: &str) {
    let want = Summary {
        batches: got.batches.and(want.batches),
        ..want.clone()
    };
    assert_eq!(got, &want, "{what}");
}

#[test]
fn c_example_reads_a_local_plan_like_rust() {
    let ex = Example::build();
    for output in ["u16", "i32", "i64"] {
        let plan = local_plan(output);
        let want = rust_summary(&plan, Cursor::START);
        assert!(want.bytes > 100_000 && want.batches > Some(100));
        for mode in ["batches", "read"] {
            let got = ex.run("-", &plan, 0, mode);
            assert_same(&got, &want, &format!("local {output} {mode}"));
        }
    }

    // Resuming with dq_open_at from a mid-stream cursor gives exactly the rest.
    let plan = local_plan("u16");
    let mid = Cursor::new(0, 600);
    let want = rust_summary(&plan, mid);
    let mut cmd = ex.command(&ex.exe, "-", &plan, 0, "batches");
    let got = parse(&run_ok(cmd.arg("0:600")));
    assert_same(&got, &want, "local resumed at 0:600");
    assert_eq!(
        got.bytes,
        rust_summary(&plan, Cursor::START).bytes - 600 * 128 * 2
    );

    // The shared library exports the same API.
    let shared = ex.build_shared();
    let got = parse(&run_ok(&mut ex.command(&shared, "-", &plan, 0, "read")));
    assert_same(&got, &rust_summary(&plan, Cursor::START), "shared library");
}

#[test]
fn c_example_reads_through_an_agent_like_rust() {
    let ex = Example::build();
    // An agent serving root `corpus`, holding `r50k` (a copy of the fixture), with a Unix
    // socket for shared-memory readers.
    let corpus = Corpus::new();
    let (agent, sock) = corpus.agent_with_socket();
    // Over TCP, and through shared memory (dq_next_batch then points into the ring).
    for uri in [agent.uri(), sock] {
        for output in ["u16", "i64"] {
            let want = rust_summary(&local_plan(output), Cursor::START);
            let plan = plan_over("corpus/r50k", output);
            for offload in [1, 0] {
                for mode in ["batches", "read"] {
                    let got = ex.run(&uri, &plan, offload, mode);
                    assert_same(
                        &got,
                        &want,
                        &format!("agent {uri} {output} offload={offload} {mode}"),
                    );
                }
            }
        }
    }
}

#[test]
fn c_example_reports_errors_verbatim() {
    let ex = Example::build();
    let bad = r#"{"sources":[{"uri":"corpus/r50k"}],"seq_len":0,"batch_size":4}"#;
    let stderr = ex.fail("-", bad, 0);
    assert_eq!(
        stderr,
        "read_plan: dq_open failed: seq_len: must be at least 1\n"
    );

    let stderr = ex.fail("-", &local_plan("u16"), 1);
    assert_eq!(
        stderr,
        "read_plan: dq_open failed: offload needs an agent: pass its URI, dquant://HOST:PORT or a Unix socket path\n"
    );

    let corpus = Corpus::new();
    let agent = corpus.agent();
    let uri = agent.uri();
    let unknown = plan_over("nope/x", "u16");
    // The agent's message, verbatim, naming the source: offloaded (the agent refuses the
    // plan) or in-process (opening the source on the agent fails the same way).
    for offload in [1, 0] {
        assert_eq!(
            ex.fail(&uri, &unknown, offload),
            "read_plan: dq_open failed: sources[0] (nope/x): dataset \"nope/x\": unknown root \"nope\" (this agent serves: corpus)\n",
            "offload={offload}"
        );
    }
}

#[test]
fn header_compiles_as_c_and_cpp_with_the_rust_layout() {
    use dquant_ffi::DqBatch;
    use std::mem::{offset_of, size_of};
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from("#include <stddef.h>\n#include \"dquant.h\"\n");
    for (field, offset) in [
        ("data", offset_of!(DqBatch, data)),
        ("bytes", offset_of!(DqBatch, bytes)),
        ("index", offset_of!(DqBatch, index)),
        ("samples", offset_of!(DqBatch, samples)),
        ("sample_len", offset_of!(DqBatch, sample_len)),
        ("itemsize", offset_of!(DqBatch, itemsize)),
        ("doc_offsets", offset_of!(DqBatch, doc_offsets)),
        ("doc_starts", offset_of!(DqBatch, doc_starts)),
        ("doc_starts_len", offset_of!(DqBatch, doc_starts_len)),
    ] {
        src += &format!(
            "_Static_assert(offsetof(dq_batch, {field}) == {offset}, \"dq_batch.{field}\");\n"
        );
    }
    src += &format!(
        "_Static_assert(sizeof(dq_batch) == {}, \"sizeof(dq_batch)\");\n",
        size_of::<DqBatch>()
    );
    let c = dir.path().join("layout.c");
    std::fs::write(&c, &src).unwrap();
    let include = Path::new(MANIFEST).join("include");
    run_ok(
        Command::new("cc")
            .args([
                "-std=c99",
                "-Wall",
                "-Wextra",
                "-pedantic",
                "-Werror",
                "-fsyntax-only",
                "-I",
            ])
            .arg(&include)
            .arg(&c),
    );

    // C++ sees the same declarations (extern "C", no C-only syntax), where a compiler exists.
    let cpp = dir.path().join("header.cpp");
    std::fs::write(
        &cpp,
        "#include \"dquant.h\"\n\
         static_assert(sizeof(dq_batch) == sizeof(void *) * 5 + 24, \"dq_batch\");\n\
         int main() { dq_close(dq_open(nullptr, \"{}\", 0)); return dq_last_error() == nullptr; }\n",
    )
    .unwrap();
    match Command::new("c++").arg("--version").output() {
        Ok(_) => {
            run_ok(
                Command::new("c++")
                    .args([
                        "-std=c++11",
                        "-Wall",
                        "-Wextra",
                        "-pedantic",
                        "-Werror",
                        "-fsyntax-only",
                        "-I",
                    ])
                    .arg(&include)
                    .arg(&cpp),
            );
        }
        Err(e) => eprintln!("no C++ compiler (c++: {e}); the header was checked as C only"),
    }
}
