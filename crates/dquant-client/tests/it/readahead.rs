//! Sequential readahead of remote sources (`RemoteSource`): chained streams (sources on a
//! storage agent, pulled by a second agent or by this process) are byte-identical to the plan
//! run on local files for every access pattern: unshuffled over epoch wrap-arounds, blends,
//! shuffled, resumed, sharded, compressed on the wire; sequential reads are served by a few
//! chunk requests while shuffled ones never read ahead; and agent errors met while reading
//! ahead or draining surface as the stop-and-wait path reports them.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::slice::from_ref;

use dquant_agent::AgentHandle;
use dquant_client::{open_at, Control, Offload, Reader};
use dquant_engine::{LocalSource, SourceError, TokenSource};
use dquant_format::{DType, DocIndexBuilder};
use dquant_plan::{Cursor, Plan, Schedule, SourceInfo};
use dquant_proto::v1::StatRequest;
use dquant_remote::{ReadaheadConfig, RemoteSource};
use dquant_storage::{Dataset, DatasetWriter, OpenOptions, OutputFormat};
use dquant_testkit::agent;
use dquant_testkit::stream::drain;
use dquant_testkit::xxh3;
use dquant_transport::WireError;

// Chunk requests stay within what an agent serves in one range.
const _: () = assert!(ReadaheadConfig::DEFAULT.chunk_tokens <= dquant_agent::MAX_RANGE_TOKENS);

/// Where the one out-of-`u16` token of `late` sits.
const LATE_BAD: u64 = 1_250_000;

/// Datasets of a few million tokens (many readahead chunks each), served as root `big` by a
/// storage agent, and a second agent near the host that serves nothing of its own:
/// - `a`: Megatron uint16, about 3 Mi tokens of a 50k vocabulary;
/// - `b`: Megatron int32, about 2 Mi tokens with ids up to 200k (18 bits);
/// - `late`: Megatron int32, 1.5 M tokens under 50k but one, 70_000 at [`LATE_BAD`].
struct Big {
    dir: tempfile::TempDir,
    storage: AgentHandle,
    near: AgentHandle,
}

/// A deterministic token stream (an LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

fn write(
    path: &Path,
    dtype: DType,
    tokens: u64,
    seed: u64,
    mut token: impl FnMut(u64, u32) -> u32,
) {
    let mut w = DatasetWriter::create(path, OutputFormat::Megatron { dtype }).unwrap();
    let mut ix = DocIndexBuilder::new();
    let mut rng = Lcg(seed);
    let mut at = 0u64;
    while at < tokens {
        let n = (100 + rng.next() as u64 % 5000).min(tokens - at);
        let doc: Vec<u32> = (at..at + n).map(|o| token(o, rng.next())).collect();
        w.push(&doc).unwrap();
        ix.push_document(n);
        at += n;
    }
    w.finish(&ix.finish()).unwrap();
}

impl Big {
    fn new() -> Self {
        Self::with_storage_workers(None)
    }

    /// The storage agent with `workers` worker threads (`None`: the default, the cores but
    /// one): with two or more, it compresses ranges on them, several requests at once.
    fn with_storage_workers(workers: Option<usize>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("big");
        std::fs::create_dir(&root).unwrap();
        write(&root.join("a"), DType::U16, 3 << 20, 1, |_, r| r % 50_257);
        write(&root.join("b"), DType::I32, 2 << 20, 2, |_, r| {
            if r % 8 == 0 {
                r % 200_000
            } else {
                r % 30_000
            }
        });
        write(&root.join("late"), DType::I32, 1_500_000, 3, |o, r| {
            if o == LATE_BAD {
                70_000
            } else {
                r % 50_000
            }
        });
        let none = dir.path().join("none");
        std::fs::create_dir(&none).unwrap();
        let mut storage_cfg = agent::config(&[("big", root)]);
        if let Some(n) = workers {
            storage_cfg.worker_threads = n;
            // A share of every batch on the pool, however fast its reads.
            storage_cfg.worker_min_share_us = 0;
        }
        let storage = dquant_agent::start(storage_cfg).unwrap();
        let mut cfg = agent::config(&[("none", none)]);
        cfg.upstreams = vec![storage.control_addr().to_string()];
        let near = dquant_agent::start(cfg).unwrap();
        Big { dir, storage, near }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join("big").join(name)
    }

    /// `p` with its `big/NAME` sources replaced by local paths.
    fn localized(&self, p: &Plan) -> Plan {
        let mut p = p.clone();
        for s in &mut p.sources {
            let name = s.uri.strip_prefix("big/").unwrap().to_string();
            s.uri = self.path(&name).display().to_string();
        }
        p
    }

    /// `p` with its sources named by full URIs on the storage agent.
    fn chained(&self, p: &Plan) -> Plan {
        let mut p = p.clone();
        for s in &mut p.sources {
            s.uri = format!("{}/{}", self.storage.uri(), s.uri);
        }
        p
    }

    /// A source session on the storage agent, its ranges sent in `wire_codec`.
    fn remote(&self, name: &str, wire_codec: &str) -> RemoteSource {
        let control = Control::connect(&self.storage.control_addr().to_string()).unwrap();
        let stat = StatRequest {
            dataset: format!("big/{name}"),
            dtype: String::new(),
            eod: None,
            max_token: false,
        };
        RemoteSource::open(control, stat, wire_codec).unwrap()
    }

    fn local(&self, name: &str) -> LocalSource {
        LocalSource::new(Dataset::open(&self.path(name), &OpenOptions::default()).unwrap())
    }
}

/// A plan over `big/NAME` sources ((name, weight)): seed 99, i32 output.
fn plan(names: &[(&str, f64)], seq_len: u32, batch: u32) -> Plan {
    agent::plan_in("big", names, seq_len, batch, 99)
}

/// Checks that the stream of `p` from `from` is the same through each chained path as run
/// in-process on local files: the near agent pulling ranges from the storage agent
/// (`Offload::Yes`), this process pulling them by dataset name and by full URI
/// (`Offload::No`). Returns the stream's checksum.
fn assert_chained_parity(big: &Big, p: &Plan, from: Cursor) -> u64 {
    let (want, want_sizes) = drain(&mut Reader::local(&big.localized(p), from.clone()).unwrap());
    assert!(!want.is_empty(), "the plan yields data");
    let chained = big.chained(p);
    let paths = [
        (
            "near agent chained to the storage agent",
            open_at(&big.near.uri(), &chained, from.clone(), Offload::Yes),
        ),
        (
            "client pulling ranges by name",
            open_at(&big.storage.uri(), p, from.clone(), Offload::No),
        ),
        (
            "client pulling ranges by URI",
            open_at("", &chained, from, Offload::No),
        ),
    ];
    for (what, r) in paths {
        let (got, sizes) = drain(&mut r.unwrap());
        assert_eq!(sizes, want_sizes, "{what}: batch sizes");
        assert_eq!(got.len(), want.len(), "{what}: stream length");
        assert_eq!(xxh3(&got), xxh3(&want), "{what}: whole-stream checksum");
    }
    xxh3(&want)
}

#[test]
fn unshuffled_plan_over_three_epochs_wraps_around_to_the_same_stream_chained() {
    let big = Big::new();
    let mut p = plan(&[("a", 1.0)], 1023, 8);
    p.shuffle = false;
    p.epochs = Some(3);
    assert_chained_parity(&big, &p, Cursor::START);
}

#[test]
fn unshuffled_blend_of_two_remote_sources_is_the_same_stream_chained() {
    let big = Big::new();
    let mut p = plan(&[("a", 0.6), ("b", 0.4)], 511, 6);
    p.shuffle = false;
    p.epochs = Some(2);
    assert_chained_parity(&big, &p, Cursor::START);
}

#[test]
fn shuffled_plan_is_the_same_stream_chained() {
    let big = Big::new();
    let mut p = plan(&[("a", 0.5), ("b", 0.5)], 1023, 4);
    p.samples = Some(3000);
    assert_chained_parity(&big, &p, Cursor::START);
}

#[test]
fn resuming_from_a_mid_stream_cursor_is_the_same_tail_chained() {
    let big = Big::new();
    for shuffle in [false, true] {
        let mut p = plan(&[("a", 0.7), ("b", 0.3)], 1023, 4);
        p.shuffle = shuffle;
        p.epochs = Some(2);
        // A cursor in the middle of the first epoch, from the uninterrupted local stream.
        let mut full = Reader::local(&big.localized(&p), Cursor::START).unwrap();
        for _ in 0..500 {
            full.next_batch().unwrap().unwrap();
        }
        let cursor = full.cursor();
        assert_eq!(cursor.consumed_samples, 2000);
        let (tail, _) = drain(&mut full);
        assert_eq!(
            assert_chained_parity(&big, &p, cursor),
            xxh3(&tail),
            "shuffle {shuffle}"
        );
    }
}

#[test]
fn rank_1_of_3_of_an_unshuffled_plan_is_the_same_stream_chained() {
    let big = Big::new();
    let mut p = plan(&[("a", 1.0)], 255, 16);
    p.shuffle = false;
    p.epochs = Some(2);
    p.world = 3;
    p.rank = 1;
    assert_chained_parity(&big, &p, Cursor::START);
}

#[test]
fn compressed_wire_codecs_give_the_same_stream_chained() {
    // A storage agent that compresses on its session threads, and one that compresses
    // several requests at once on a pool of two.
    for workers in [0, 2] {
        let big = Big::with_storage_workers(Some(workers));
        for codec in ["auto+zstd:1", "u24+lz4"] {
            let mut p = plan(&[("a", 0.5), ("b", 0.5)], 2047, 4);
            p.shuffle = false;
            p.wire_codec = codec.into();
            assert_chained_parity(&big, &p, Cursor::START);
        }
    }
}

/// Ranges compressed on the storage agent's pool, several requests at once, come back in
/// order with every token; a range that cannot be encoded fails with the message one thread
/// gives, after the ranges before it.
#[test]
fn ranges_compressed_on_the_pool_are_exact_and_fail_as_on_one_thread() {
    let pooled = Big::with_storage_workers(Some(2));
    let single = Big::with_storage_workers(Some(0));
    let cfg = ReadaheadConfig {
        chunk_tokens: 100_000,
        in_flight: 4,
    };
    let mut p = plan(&[("a", 1.0)], 1023, 4);
    p.shuffle = false;
    for codec in ["auto+zstd:1", "u16+lz4"] {
        let mut remote = pooled.remote("a", codec);
        remote.set_readahead(cfg);
        read_both(&pooled, &p, "a", &mut remote);
        assert!(remote.requests() > 20, "{codec}: reading ahead");
    }
    // Shuffled: one request of several ranges per batch, no readahead.
    let mut shuffled = p.clone();
    shuffled.shuffle = true;
    let mut remote = pooled.remote("a", "auto+zstd:1");
    let (reads, _) = read_both(&pooled, &shuffled, "a", &mut remote);
    assert_eq!(remote.requests(), reads);
    // One request asking for more than the session reads ahead (3 Mi tokens in 3 ranges,
    // the last one short): answered in full and in order.
    let mut remote = pooled.remote("a", "auto+zstd:1");
    remote.set_readahead(ReadaheadConfig::OFF);
    let total = remote.tokens();
    let ranges = [0..1 << 20, 2 << 20..total, 1 << 20..2 << 20];
    let n: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let (mut want, mut got) = (vec![0u32; n as usize], vec![1u32; n as usize]);
    pooled.local("a").read_ranges(&ranges, &mut want).unwrap();
    remote.read_ranges(&ranges, &mut got).unwrap();
    assert_eq!(remote.requests(), 1);
    assert!(got == want, "three large ranges in one request");
    // The wide token of `late` does not fit `u16+zstd:1`: the scan gets exact tokens up to
    // it, then the agent's message, the same from both agents.
    let scan = |big: &Big| {
        let mut src = big.remote("late", "u16+zstd:1");
        src.set_readahead(cfg);
        scan_late_to_its_error(big, &mut src).to_string()
    };
    let (a, b) = (scan(&pooled), scan(&single));
    assert!(a.contains("u16"), "{a}");
    assert_eq!(a, b);
}

/// Reads `late` from `src` sample by sample (100 tokens from every 99th, sequential), each
/// checked against the local file, until a read fails; returns that error. No read may get
/// past the wide token.
fn scan_late_to_its_error(big: &Big, src: &mut RemoteSource) -> SourceError {
    let mut local = big.local("late");
    let (mut want, mut got) = (vec![0u32; 100], vec![0u32; 100]);
    for i in 0.. {
        let r = i * 99..i * 99 + 100;
        assert!(r.start <= LATE_BAD, "no error up to the wide token");
        local.read_ranges(from_ref(&r), &mut want).unwrap();
        match src.read_ranges(from_ref(&r), &mut got) {
            Ok(()) => assert_eq!(got, want, "tokens {r:?}"),
            Err(e) => return e,
        }
    }
    unreachable!("the scan ends at the wide token")
}

/// Reads the rank's stream of `p` (its single source `name`) from `remote` and from the local
/// file, range by range as a pipeline would (one read per batch), checks every token, and
/// returns (reads, tokens read).
fn read_both(big: &Big, p: &Plan, name: &str, remote: &mut RemoteSource) -> (u64, u64) {
    let mut local = big.local(name);
    let info = SourceInfo {
        tokens: local.tokens(),
    };
    assert_eq!(remote.tokens(), info.tokens);
    let schedule = Schedule::new(p, &[info]).unwrap();
    let mut it = schedule.iter_rank(Cursor::START).unwrap();
    let (mut reads, mut tokens) = (0, 0);
    let (mut want, mut got) = (Vec::new(), Vec::new());
    while let Some(b) = it.next_batch() {
        let ranges: Vec<Range<u64>> = b.samples.iter().map(|s| s.tokens.clone()).collect();
        let n: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        want.resize(n as usize, 0);
        got.resize(n as usize, 1);
        local.read_ranges(&ranges, &mut want).unwrap();
        remote.read_ranges(&ranges, &mut got).unwrap();
        assert_eq!(got, want, "batch {}", b.index);
        reads += 1;
        tokens += n;
    }
    (reads, tokens)
}

#[test]
fn sequential_reads_are_served_by_one_request_per_chunk() {
    let big = Big::new();
    let mut p = plan(&[("a", 1.0)], 1023, 4);
    p.shuffle = false;
    let c = ReadaheadConfig::DEFAULT.chunk_tokens;

    // Default chunks, a compressed wire codec.
    let mut remote = big.remote("a", "auto+zstd:1");
    let total = remote.tokens();
    let (reads, _) = read_both(&big, &p, "a", &mut remote);
    // Two stop-and-wait reads to see the sequence, then one request per chunk.
    let max = 2 + total.div_ceil(c);
    assert!(
        remote.requests() <= max,
        "{} requests for {total} tokens in {c}-token chunks",
        remote.requests()
    );
    assert!(
        reads > 100 * remote.requests(),
        "{reads} reads, {} requests",
        remote.requests()
    );
    // Each token asked for once (but the first two reads, which the window asks again).
    assert!(remote.requested_tokens() <= total + 2 * 4 * 1024);

    // Small chunks: the request count follows the chunk size.
    let mut remote = big.remote("a", "");
    remote.set_readahead(ReadaheadConfig {
        chunk_tokens: 100_000,
        in_flight: 3,
    });
    read_both(&big, &p, "a", &mut remote);
    let chunks = total.div_ceil(100_000);
    assert!(
        (chunks..=chunks + 2).contains(&remote.requests()),
        "{} requests for {chunks} chunks",
        remote.requests()
    );

    // Readahead off: one request per read.
    let mut remote = big.remote("a", "");
    remote.set_readahead(ReadaheadConfig::OFF);
    let (reads, tokens) = read_both(&big, &p, "a", &mut remote);
    assert_eq!(
        (remote.requests(), remote.requested_tokens()),
        (reads, tokens)
    );
}

#[test]
fn shuffled_reads_never_read_ahead() {
    let big = Big::new();
    let mut p = plan(&[("a", 1.0)], 1023, 4);
    p.epochs = Some(1);
    let mut remote = big.remote("a", "");
    let (reads, tokens) = read_both(&big, &p, "a", &mut remote);
    // One request per read, and not a token more than was read.
    assert_eq!(remote.requests(), reads);
    assert_eq!(remote.requested_tokens(), tokens);
}

#[test]
fn epoch_wrap_drains_the_window_then_reads_ahead_again() {
    let big = Big::new();
    let mut p = plan(&[("b", 1.0)], 4095, 2);
    p.shuffle = false;
    p.epochs = Some(3);
    let mut remote = big.remote("b", "auto+lz4");
    let chunk = 200_000;
    remote.set_readahead(ReadaheadConfig {
        chunk_tokens: chunk,
        in_flight: 4,
    });
    let total = remote.tokens();
    let (reads, _) = read_both(&big, &p, "b", &mut remote);
    // Per epoch: two stop-and-wait reads, then chunks (the wrap's read serves its first
    // samples from the window, drains, and asks for the rest stop-and-wait).
    let per_epoch = 3 + total.div_ceil(chunk);
    assert!(
        remote.requests() <= 3 * per_epoch,
        "{} requests in {reads} reads",
        remote.requests()
    );
    assert!(
        reads > 10 * remote.requests(),
        "{reads} reads, {} requests",
        remote.requests()
    );
    // Each epoch asks for its tokens once (never past the end), but for the few samples
    // read stop-and-wait before the window starts again.
    assert!(remote.requested_tokens() <= 3 * (total + 3 * 2 * 4096));
}

#[test]
fn agent_errors_met_reading_ahead_or_draining_surface_as_stop_and_wait_ones() {
    let big = Big::new();
    let cfg = ReadaheadConfig {
        chunk_tokens: 100_000,
        in_flight: 3,
    };

    // Stop-and-wait: asking for a range holding the wide token fails with the agent's
    // message.
    let bad_chunk = 1_200_200..1_300_200;
    assert!(bad_chunk.contains(&LATE_BAD));
    let mut src = big.remote("late", "u16");
    src.set_readahead(ReadaheadConfig::OFF);
    let mut out = vec![0u32; 100_000];
    let stop_and_wait = src.read_ranges(from_ref(&bad_chunk), &mut out).unwrap_err();
    assert!(
        matches!(&stop_and_wait, SourceError::Wire(WireError::Remote(m)) if m.contains("u16")),
        "{stop_and_wait:?}"
    );

    // Draining: three sequential reads from 1_000_000 start the window at 1_000_200, with
    // chunks from there in flight; the third chunk is the bad one. A jump elsewhere drains
    // them and meets the agent's error frame: that read fails as stop-and-wait would.
    let mut src = big.remote("late", "u16");
    src.set_readahead(cfg);
    let mut out = vec![0u32; 101];
    for start in [1_000_000, 1_000_100, 1_000_200] {
        src.read_ranges(from_ref(&(start..start + 101)), &mut out)
            .unwrap();
    }
    assert!(src.requests() > 2, "reading ahead");
    let drained = src.read_ranges(from_ref(&(0..101)), &mut out).unwrap_err();
    assert!(
        matches!(&drained, SourceError::Wire(WireError::Remote(_))),
        "{drained:?}"
    );
    assert_eq!(drained.to_string(), stop_and_wait.to_string());
    // The stream is spent: later reads say so rather than return wrong tokens.
    let after = src.read_ranges(from_ref(&(0..101)), &mut out).unwrap_err();
    assert!(after.to_string().contains("failed earlier"), "{after}");

    // Reading ahead: a sequential scan gets exact tokens up to the error, which comes no
    // later than the read that needs the wide token.
    let mut src = big.remote("late", "u16");
    src.set_readahead(cfg);
    let e = scan_late_to_its_error(&big, &mut src);
    assert!(src.requests() <= 20, "{} requests", src.requests());
    assert!(
        matches!(&e, SourceError::Wire(WireError::Remote(m)) if m.contains("u16")),
        "{e:?}"
    );
}

#[test]
fn jumps_in_the_middle_of_a_sequence_drain_the_chunks_in_flight_and_return_exact_tokens() {
    let big = Big::new();
    let mut remote = big.remote("a", "auto+lz4");
    remote.set_readahead(ReadaheadConfig {
        chunk_tokens: 50_000,
        in_flight: 3,
    });
    let mut local = big.local("a");
    let (mut want, mut got) = (Vec::new(), Vec::new());
    let mut read = |ranges: &[Range<u64>], remote: &mut RemoteSource| {
        let n: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        want.resize(n as usize, 0);
        got.resize(n as usize, 1);
        local.read_ranges(ranges, &mut want).unwrap();
        remote.read_ranges(ranges, &mut got).unwrap();
        assert_eq!(got, want, "{ranges:?}");
    };
    // Batches of 3 samples of 512 tokens, sequential from `from`.
    let batches = |from: u64, n: u64| -> Vec<Vec<Range<u64>>> {
        (0..n)
            .map(|b| {
                (0..3)
                    .map(|k| {
                        let s = from + (b * 3 + k) * 511;
                        s..s + 512
                    })
                    .collect()
            })
            .collect()
    };
    let mut phases = 0;
    for from in [0, 2_000_000, 1_000, 5_000_000 % (3 << 20), 40_000] {
        let before = remote.requests();
        for b in batches(from, 40) {
            read(&b, &mut remote);
        }
        // 40 batches of 1533 tokens: two reads stop-and-wait, then 50k-token chunks (up to 3
        // in flight when the sequence is left, drained by the next jump).
        let sent = remote.requests() - before;
        assert!(
            (2..=2 + 2 + 3).contains(&sent),
            "{sent} requests from {from}"
        );
        // A jump inside one read: its first ranges from the window, the rest stop-and-wait.
        let s = from + 40 * 3 * 511;
        read(&[s..s + 512, s + 511..s + 1023, 7..519], &mut remote);
        phases += 1;
    }
    assert_eq!(phases, 5);
    // Going back over a window's tokens gives them again, not stale ones.
    read(&[100..612, 0..512], &mut remote);
}
