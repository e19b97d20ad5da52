//! Shared set-up for the agent's end-to-end tests: a root of real Megatron data (plus an
//! 18-bit-vocabulary dataset and a compressed block-file copy) and an agent on loopback.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use dquant_agent::{AgentConfig, AgentHandle};
use dquant_client::Reader;
use dquant_codec::Codec;
use dquant_format::block::{block_tokens_for, DEFAULT_BLOCK_BYTES};
use dquant_format::{DType, DocIndexBuilder};
use dquant_plan::{OutputDType, Plan, Source};
use dquant_storage::{Dataset, DatasetWriter, OpenOptions, OutputFormat};

pub fn fixtures() -> PathBuf {
    let p = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures/megatron"
    ));
    assert!(p.is_dir(), "Megatron fixtures not found at {}", p.display());
    p.to_path_buf()
}

/// A directory served as root `corpus`:
/// - `r50k`: Megatron int32 (the fixture, real r50k tokens);
/// - `r50k.dqb`: the same tokens as u16+zstd:3 blocks;
/// - `wide`: Megatron int32 with ids up to 200k (an o200k-sized vocabulary, 18 bits).
pub struct Corpus {
    pub dir: tempfile::TempDir,
}

impl Corpus {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("corpus");
        std::fs::create_dir(&root).unwrap();
        for ext in ["bin", "idx"] {
            std::fs::copy(
                fixtures().join(format!("r50k_int32.{ext}")),
                root.join(format!("r50k.{ext}")),
            )
            .unwrap();
        }
        let src = Dataset::open(&root.join("r50k"), &OpenOptions::default()).unwrap();
        let codec: Codec = "u16+zstd:3".parse().unwrap();
        let mut w = DatasetWriter::create(
            &root.join("r50k.dqb"),
            OutputFormat::Block {
                codec,
                block_tokens: block_tokens_for(codec.width, DEFAULT_BLOCK_BYTES / 16),
                vocab_size: 0,
            },
        )
        .unwrap();
        src.scan(1 << 16, |_, t| w.push(t)).unwrap();
        w.finish(src.index()).unwrap();

        // Documents of 50..2000 tokens, ids spread over 0..200_000 (an LCG: deterministic).
        let mut w = DatasetWriter::create(
            &root.join("wide"),
            OutputFormat::Megatron { dtype: DType::I32 },
        )
        .unwrap();
        let mut ix = DocIndexBuilder::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for _ in 0..120 {
            let n = 50 + next() as usize % 1950;
            let doc: Vec<u32> = (0..n)
                .map(|_| {
                    let r = next();
                    // Mostly small ids, some wide ones: like a real 200k vocabulary.
                    if r % 8 == 0 {
                        r % 200_000
                    } else {
                        r % 30_000
                    }
                })
                .collect();
            w.push(&doc).unwrap();
            ix.push_document(n as u64);
        }
        w.finish(&ix.finish()).unwrap();
        Corpus { dir }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("corpus")
    }

    /// The local path of dataset `corpus/NAME`.
    pub fn path(&self, name: &str) -> String {
        self.root().join(name).display().to_string()
    }

    pub fn config(&self) -> AgentConfig {
        let mut c = AgentConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..AgentConfig::default()
        };
        c.roots.insert("corpus".into(), self.root());
        c
    }

    pub fn agent(&self) -> AgentHandle {
        dquant_agent::start(self.config()).unwrap()
    }

    /// An agent near the host: it serves nothing of its own (one empty root, kept alive by
    /// the returned directory) and pulls from others when a plan names them.
    pub fn near_agent(&self) -> (AgentHandle, tempfile::TempDir) {
        let empty = tempfile::tempdir().unwrap();
        let mut cfg = self.config();
        cfg.roots.clear();
        cfg.roots.insert("none".into(), empty.path().to_path_buf());
        (dquant_agent::start(cfg).unwrap(), empty)
    }

    /// `plan` with its `corpus/NAME` sources replaced by local paths.
    pub fn localized(&self, plan: &Plan) -> Plan {
        let mut p = plan.clone();
        for s in &mut p.sources {
            if let Some(name) = s.uri.strip_prefix("corpus/") {
                s.uri = self.path(name);
            }
        }
        p
    }
}

pub fn plan(names: &[(&str, f64)], seq_len: u32, batch: u32) -> Plan {
    let sources = names
        .iter()
        .map(|(n, w)| Source::new(format!("corpus/{n}")).weight(*w))
        .collect();
    let mut p = Plan::new(sources, seq_len, batch);
    p.seed = 1234;
    p.output = OutputDType::I32;
    p
}

/// Everything a reader yields: the bytes of all batches and each batch's sample count.
pub fn drain(r: &mut Reader) -> (Vec<u8>, Vec<usize>) {
    let mut bytes = Vec::new();
    let mut sizes = Vec::new();
    while let Some(b) = r.next_batch().unwrap() {
        assert_eq!(b.tokens.len(), b.samples * b.sample_len);
        bytes.extend_from_slice(b.tokens.as_bytes());
        sizes.push(b.samples);
    }
    (bytes, sizes)
}

pub fn xxh3(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

/// Everything a reader yields through `read` in `buf_len`-byte calls.
pub fn read_all(r: &mut Reader, buf_len: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; buf_len];
    loop {
        let n = r.read(&mut buf).unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// Waits (up to 10 s) until `agent` holds no session, pending or active.
pub fn wait_idle(agent: &AgentHandle) {
    let t = std::time::Instant::now();
    while agent.sessions() != (0, 0) {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "sessions still held: {:?}",
            agent.sessions()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
