//! Agents in this process, on ephemeral loopback ports, and [`Corpus`]: a root of real
//! Megatron data (plus a compressed block-file copy and an 18-bit-vocabulary dataset) to serve
//! and to compare offloaded streams with local ones. For the client's and the FFI's
//! end-to-end tests.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dquant_agent::{AgentConfig, AgentHandle};
use dquant_codec::Codec;
use dquant_format::block::{block_tokens_for, DEFAULT_BLOCK_BYTES};
use dquant_format::{DType, DocIndexBuilder};
use dquant_plan::{OutputDType, Plan, Source};
use dquant_storage::{Dataset, DatasetWriter, OpenOptions, OutputFormat};

/// An agent config on ephemeral loopback ports (control and data) serving `roots`
/// ((name, directory)); tests change what else they need before starting it.
pub fn config(roots: &[(&str, PathBuf)]) -> AgentConfig {
    let mut c = AgentConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..AgentConfig::default()
    };
    for (name, path) in roots {
        c.roots.insert(name.to_string(), path.clone());
    }
    c
}

/// An agent started from [`config`]`(roots)`.
pub fn start(roots: &[(&str, PathBuf)]) -> AgentHandle {
    dquant_agent::start(config(roots)).unwrap()
}

/// Waits (up to 10 s) until `agent` holds no session, pending or active.
pub fn wait_idle(agent: &AgentHandle) {
    let t = Instant::now();
    while agent.sessions() != (0, 0) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "sessions still held: {:?}",
            agent.sessions()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes dataset `src` again as a dquant block file `dst` in `codec`, in blocks of a
/// sixteenth of the default size (so that even the fixtures span many blocks).
pub fn write_block_copy(src: &Path, dst: &Path, codec: Codec) {
    let ds = Dataset::open(src, &OpenOptions::default()).unwrap();
    let mut w = DatasetWriter::create(
        dst,
        OutputFormat::Block {
            codec,
            block_tokens: block_tokens_for(codec.width, DEFAULT_BLOCK_BYTES / 16),
            vocab_size: 0,
        },
    )
    .unwrap();
    ds.scan(1 << 16, |_, t| w.push(t)).unwrap();
    w.finish(ds.index().unwrap()).unwrap();
}

/// A directory served as root `corpus`:
/// - `r50k`: Megatron int32 (the fixture, real r50k tokens);
/// - `r50k.dqb`: the same tokens as u16+zstd:3 blocks;
/// - `wide`: Megatron int32 with ids up to 200k (an o200k-sized vocabulary, 18 bits).
pub struct Corpus {
    pub dir: tempfile::TempDir,
}

impl Corpus {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("corpus");
        std::fs::create_dir(&root).unwrap();
        crate::copy_fixture("r50k_int32", &root.join("r50k"));
        write_block_copy(
            &root.join("r50k"),
            &root.join("r50k.dqb"),
            "u16+zstd:3".parse().unwrap(),
        );

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

    /// [`config`] serving this corpus as root `corpus`.
    pub fn config(&self) -> AgentConfig {
        config(&[("corpus", self.root())])
    }

    pub fn agent(&self) -> AgentHandle {
        dquant_agent::start(self.config()).unwrap()
    }

    /// [`config`](Self::config) with TLS on both planes, from a test PKI made in `dir` for
    /// 127.0.0.1; returns the config and the PKI (its CA is what clients trust).
    pub fn tls_config(&self, dir: &Path) -> (AgentConfig, crate::tls::TestPki) {
        let pki = crate::tls::make_pki(dir, "agent", &["127.0.0.1"]);
        let mut cfg = self.config();
        cfg.tls = Some(dquant_agent::TlsFiles {
            cert: pki.cert.clone(),
            key: pki.key.clone(),
        });
        (cfg, pki)
    }

    /// An agent of this corpus that also listens on a Unix socket in the corpus's directory
    /// (for shared-memory readers); returns it and the socket's path.
    pub fn agent_with_socket(&self) -> (AgentHandle, String) {
        self.agent_with_socket_and(|_| {})
    }

    /// [`agent_with_socket`](Self::agent_with_socket), its config changed by `edit` first.
    pub fn agent_with_socket_and(
        &self,
        edit: impl FnOnce(&mut AgentConfig),
    ) -> (AgentHandle, String) {
        let mut cfg = self.config();
        edit(&mut cfg);
        let sock = self.dir.path().join("agent.sock");
        cfg.socket = Some(sock.clone());
        let agent = dquant_agent::start(cfg).unwrap();
        assert_eq!(agent.socket(), Some(sock.as_path()));
        (agent, sock.display().to_string())
    }

    /// An agent near the host: it serves nothing of its own (one empty root, kept alive by
    /// the returned directory) and pulls from `upstream` when a plan names it.
    pub fn near_agent(&self, upstream: &AgentHandle) -> (AgentHandle, tempfile::TempDir) {
        let empty = tempfile::tempdir().unwrap();
        let mut cfg = self.config();
        cfg.roots.clear();
        cfg.roots.insert("none".into(), empty.path().to_path_buf());
        cfg.upstreams = vec![upstream.control_addr().to_string()];
        (dquant_agent::start(cfg).unwrap(), empty)
    }

    /// Asserts that `agent` (serving this corpus as `corpus`) still streams a good plan
    /// correctly: the whole stream equals the in-process one. Tests of bad input call it
    /// after each case.
    pub fn assert_serving(&self, agent: &AgentHandle) {
        let p = plan(&[("r50k.dqb", 0.5), ("wide", 0.5)], 127, 4);
        let local = dquant_client::Reader::local(&self.localized(&p), dquant_plan::Cursor::START);
        let want = crate::xxh3(&crate::stream::drain(&mut local.unwrap()).0);
        let remote = dquant_client::open(&agent.uri(), &p, dquant_client::Offload::Yes);
        let got = crate::xxh3(&crate::stream::drain(&mut remote.unwrap()).0);
        assert_eq!(got, want, "the agent still serves correct data");
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

/// A plan over `corpus/NAME` sources ((name, weight)) of a [`Corpus`]: seed 1234, i32 output.
pub fn plan(names: &[(&str, f64)], seq_len: u32, batch: u32) -> Plan {
    plan_in("corpus", names, seq_len, batch, 1234)
}

/// A plan over `ROOT/NAME` sources ((name, weight)) of an agent's root `root`, with `seed` and
/// i32 output: for tests that serve a root of their own.
pub fn plan_in(root: &str, names: &[(&str, f64)], seq_len: u32, batch: u32, seed: u64) -> Plan {
    let sources = names
        .iter()
        .map(|(n, w)| Source::new(format!("{root}/{n}")).weight(*w))
        .collect();
    let mut p = Plan::new(sources, seq_len, batch);
    p.seed = seed;
    p.output = OutputDType::I32;
    p
}
