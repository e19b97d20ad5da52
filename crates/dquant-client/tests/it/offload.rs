//! Offload parity: for each plan, the stream through an agent is byte-identical to the plan
//! run in-process — single and blended sources, shuffled or not, sharded over 4 ranks,
//! resumed from a cursor in the middle, through a chain of two agents, and with the client
//! pulling token ranges itself.

use dquant_client::{open, open_at, open_shared, Offload, Reader, Share};
use dquant_plan::{Cursor, OutputDType, Plan};
use dquant_testkit::agent::{plan, Corpus};
use dquant_testkit::stream::{drain, read_all};
use dquant_testkit::xxh3;

/// A stream's bytes and its batches' sample counts.
type Stream = (Vec<u8>, Vec<usize>);

/// The stream of `p` in-process (local paths) and through the agent at `uri`.
fn both(c: &Corpus, uri: &str, p: &Plan, from: Cursor) -> (Stream, Stream) {
    let mut local = Reader::local(&c.localized(p), from.clone()).unwrap();
    let mut remote = open_at(uri, p, from, Offload::Yes).unwrap();
    assert!(remote.is_offloaded());
    assert_eq!(remote.rank_batches(), local.rank_batches());
    assert_eq!(remote.rank_samples(), local.rank_samples());
    let l = drain(&mut local);
    let r = drain(&mut remote);
    assert_eq!(remote.cursor(), local.cursor(), "cursors agree at the end");
    (l, r)
}

fn assert_parity(c: &Corpus, uri: &str, p: &Plan, from: Cursor) -> u64 {
    let ((lb, ls), (rb, rs)) = both(c, uri, p, from);
    assert!(!lb.is_empty(), "the plan yields data");
    assert_eq!(ls, rs, "batch sizes agree");
    assert_eq!(lb.len(), rb.len());
    assert_eq!(xxh3(&lb), xxh3(&rb), "whole-stream checksums agree");
    xxh3(&lb)
}

#[test]
fn offloaded_streams_equal_local_ones() {
    let c = Corpus::new();
    let agent = c.agent();
    let uri = agent.uri();

    // Single source, shuffled (the default), in each output dtype.
    for out in [OutputDType::U16, OutputDType::I32, OutputDType::I64] {
        let mut p = plan(&[("r50k", 1.0)], 255, 8);
        p.output = out;
        assert_parity(&c, &uri, &p, Cursor::START);
    }
    // The block-file copy gives the very same stream as the Megatron original.
    let mut p = plan(&[("r50k", 1.0)], 255, 8);
    let a = assert_parity(&c, &uri, &p, Cursor::START);
    p.sources[0].uri = "corpus/r50k.dqb".into();
    assert_eq!(assert_parity(&c, &uri, &p, Cursor::START), a);

    // Unshuffled, several epochs, compressed wire codecs.
    // u24 tokens straddle frame boundaries (3-byte tokens, 1 MiB frames).
    for codec in ["u16+zstd:3", "auto+lz4", "bits:16", "auto", "u24", "i64"] {
        let mut p = plan(&[("r50k.dqb", 1.0)], 100, 5);
        p.shuffle = false;
        p.epochs = Some(2);
        p.wire_codec = codec.into();
        assert_parity(&c, &uri, &p, Cursor::START);
    }

    // Blended 70/30: 16-bit and 18-bit vocabularies, wire codec picked per batch.
    let mut p = plan(&[("r50k.dqb", 0.7), ("wide", 0.3)], 511, 4);
    p.wire_codec = "auto+zstd:1".into();
    p.samples = Some(600);
    assert_parity(&c, &uri, &p, Cursor::START);
    drop(agent);
}

#[test]
fn sharded_ranks_partition_the_global_stream_through_the_agent() {
    let c = Corpus::new();
    let agent = c.agent();
    let uri = agent.uri();
    let mut p = plan(&[("r50k.dqb", 0.6), ("wide", 0.4)], 63, 3);
    p.samples = Some(500);
    let sample = 64 * 4;
    let (global, _) = drain(&mut open(&uri, &p, Offload::Yes).unwrap());
    let mut ranks = Vec::new();
    for rank in 0..4 {
        let mut q = p.clone();
        q.world = 4;
        q.rank = rank;
        assert_parity(&c, &uri, &q, Cursor::START);
        ranks.push(drain(&mut open(&uri, &q, Offload::Yes).unwrap()).0);
    }
    // Global sample i is rank i % 4's local sample i / 4: interleaving the ranks' samples
    // must give back the global stream exactly (no duplicates, no gaps).
    let mut interleaved = Vec::new();
    let n = global.len() / sample;
    for i in 0..n {
        let r = &ranks[i % 4];
        let k = i / 4;
        interleaved.extend_from_slice(&r[k * sample..(k + 1) * sample]);
    }
    assert_eq!(ranks.iter().map(|r| r.len()).sum::<usize>(), global.len());
    assert_eq!(xxh3(&interleaved), xxh3(&global));

    // Blend counts at every prefix stay within one sample of the weights.
    let local = Reader::local(&c.localized(&p), Cursor::START).unwrap();
    let s = local.schedule().unwrap();
    let mut counts = [0u64; 2];
    for i in 0..s.total_samples() {
        counts[s.sample(i).unwrap().source] += 1;
        let n = (i + 1) as f64;
        assert!(
            (counts[0] as f64 - 0.6 * n).abs() <= 1.0,
            "prefix {n}: {counts:?}"
        );
        assert!(
            (counts[1] as f64 - 0.4 * n).abs() <= 1.0,
            "prefix {n}: {counts:?}"
        );
    }
}

#[test]
fn a_resumed_stream_is_the_tail_of_the_uninterrupted_one() {
    let c = Corpus::new();
    let agent = c.agent();
    let uri = agent.uri();
    let mut p = plan(&[("r50k", 0.5), ("wide", 0.5)], 127, 4);
    p.epochs = Some(2);
    p.world = 2;
    p.rank = 1;
    let mut full = open(&uri, &p, Offload::Yes).unwrap();
    let mut head = Vec::new();
    for _ in 0..7 {
        head.extend_from_slice(full.next_batch().unwrap().unwrap().tokens.as_bytes());
    }
    let cursor = full.cursor();
    assert_eq!(cursor.consumed_samples, 7 * 4 * 2);
    // The batch records carried the blend's counts: the resume below starts without a replay.
    let mut replay = Reader::local(&c.localized(&p), Cursor::START)
        .unwrap()
        .schedule()
        .unwrap()
        .blender();
    replay.seek(cursor.consumed_samples);
    assert_eq!(cursor.blend, replay.counts());
    let (tail, _) = drain(&mut full);
    drop(full);
    // Resume through the agent and in-process: both equal the uninterrupted tail.
    let resumed = assert_parity(&c, &uri, &p, cursor);
    assert_eq!(resumed, xxh3(&tail));
    assert!(!head.is_empty());
}

/// Two offloaded ranks stop at different batches; their cursors, merged, resume on three
/// offloaded ranks (the merged cursor's delivered samples travel in the Open request): every
/// sample of the plan exactly once.
#[test]
fn merged_cursors_resume_through_the_agent_on_another_world() {
    let c = Corpus::new();
    let agent = c.agent();
    let uri = agent.uri();
    let mut p = plan(&[("r50k.dqb", 0.6), ("wide", 0.4)], 63, 3);
    p.samples = Some(500);
    let sample = 64 * 4;
    let rows =
        |bytes: &[u8]| -> Vec<Vec<u8>> { bytes.chunks(sample).map(<[u8]>::to_vec).collect() };
    let mut got = Vec::new();
    let mut cursors = Vec::new();
    for (rank, take) in [(0, 9), (1, 14)] {
        let q = Plan {
            rank,
            world: 2,
            ..p.clone()
        };
        let mut r = open(&uri, &q, Offload::Yes).unwrap();
        for _ in 0..take {
            got.extend(rows(r.next_batch().unwrap().unwrap().tokens.as_bytes()));
        }
        cursors.push(r.cursor());
    }
    let merged = dquant_plan::merge_cursors(&cursors).unwrap();
    assert_eq!(merged.consumed_samples, got.len() as u64);
    assert!(!merged.delivered.is_empty());
    for rank in 0..3 {
        let q = Plan {
            rank,
            world: 3,
            ..p.clone()
        };
        got.extend(rows(
            &drain(&mut open_at(&uri, &q, merged.clone(), Offload::Yes).unwrap()).0,
        ));
    }
    let mut want = rows(&drain(&mut open(&uri, &p, Offload::Yes).unwrap()).0);
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "the resumed ranks do not deliver exactly the rest"
    );
}

#[test]
fn chained_agents_and_client_side_pulls_give_the_same_bytes() {
    let c = Corpus::new();
    let storage = c.agent();
    // The agent near the host: serves nothing of its own, pulls from the storage agent.
    let (near, _empty) = c.near_agent(&storage);

    let mut p = plan(&[("r50k.dqb", 0.7), ("wide", 0.3)], 255, 4);
    p.samples = Some(300);
    p.output = OutputDType::I32;
    let expect = xxh3(&drain(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap()).0);

    // Offload::No against the storage agent: this process pulls token ranges and packs.
    let got = xxh3(&drain(&mut open(&storage.uri(), &p, Offload::No).unwrap()).0);
    assert_eq!(got, expect);

    // A plan on the near agent whose sources live on the storage agent.
    let mut chained = p.clone();
    for s in &mut chained.sources {
        s.uri = format!("{}/{}", storage.uri(), s.uri);
    }
    let mut r = open(&near.uri(), &chained, Offload::Yes).unwrap();
    assert_eq!(xxh3(&drain(&mut r).0), expect);
    // The same plan with full URIs also runs in-process.
    let mut r = open("", &chained, Offload::No).unwrap();
    assert_eq!(xxh3(&drain(&mut r).0), expect);
}

#[test]
fn read_returns_the_same_bytes_as_next_batch() {
    let c = Corpus::new();
    let agent = c.agent();
    let mut p = plan(&[("r50k.dqb", 1.0)], 1000, 3);
    p.output = OutputDType::U16;
    let (want, _) = drain(&mut open(&agent.uri(), &p, Offload::Yes).unwrap());
    let mut r = open(&agent.uri(), &p, Offload::Yes).unwrap();
    let got = read_all(&mut r, 777);
    assert_eq!(xxh3(&got), xxh3(&want));
    assert_eq!(r.cursor().consumed_samples, r.rank_samples());
}

#[test]
fn many_clients_at_once_each_get_their_own_stream() {
    let c = Corpus::new();
    let agent = c.agent();
    let uri = agent.uri();
    let plans: Vec<Plan> = (0..8u64)
        .map(|i| {
            let mut p = plan(&[("r50k.dqb", 0.5 + i as f64), ("wide", 1.0)], 127, 4);
            p.seed = i;
            p.samples = Some(400);
            p.output = if i % 2 == 0 {
                OutputDType::I32
            } else {
                OutputDType::I64
            };
            p
        })
        .collect();
    let want: Vec<u64> = plans
        .iter()
        .map(|p| xxh3(&drain(&mut Reader::local(&c.localized(p), Cursor::START).unwrap()).0))
        .collect();
    let got: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = plans
            .iter()
            .map(|p| {
                let uri = &uri;
                s.spawn(move || xxh3(&drain(&mut open(uri, p, Offload::Yes).unwrap()).0))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    let distinct: std::collections::HashSet<_> = got.iter().collect();
    assert_eq!(
        distinct.len(),
        plans.len(),
        "different plans, different streams"
    );
}

/// Chained token ranges travel in the plan's wire codec (not an agent default): a `u16` wire
/// codec over 18-bit tokens fails upstream, naming the token's offset in the whole dataset.
#[test]
fn chained_ranges_travel_in_the_plans_wire_codec() {
    let c = Corpus::new();
    let storage = c.agent();
    let (near, _empty) = c.near_agent(&storage);

    let ds = dquant_storage::Dataset::open(
        &c.root().join("wide"),
        &dquant_storage::OpenOptions::default(),
    )
    .unwrap();
    let mut toks = Vec::new();
    ds.reader().read(0..ds.tokens(), &mut toks).unwrap();
    let o = toks.iter().position(|&t| t > 65535).unwrap();
    let v = toks[o];

    let mut p = plan(&[("wide", 1.0)], 255, 4);
    p.shuffle = false;
    p.output = OutputDType::I32;
    p.wire_codec = "u16".into();
    p.sources[0].uri = format!("{}/{}", storage.uri(), p.sources[0].uri);
    let upstream = format!(
        "sources[0] ({}): corpus/wide: token {v} at offset {o} does not fit in u16 (max 65535); it needs 18 bits: use bits:18 or wider",
        p.sources[0].uri
    );
    for (agent, offload) in [(near.uri(), Offload::Yes), (String::new(), Offload::No)] {
        let mut r = open(&agent, &p, offload).unwrap();
        let e = loop {
            match r.next_batch() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("a u16 wire codec carried 18-bit tokens"),
                Err(e) => break e.to_string(),
            }
        };
        assert_eq!(e, upstream, "{offload:?}");
    }

    // With a codec that fits, the chain carries the plan's compressed codec and equals local;
    // the transport preset's ranges are each compressed alone (zstd at its level).
    for codec in ["bits:18+zstd:1", "transport"] {
        p.wire_codec = codec.into();
        let mut local = p.clone();
        local.sources[0].uri = c.path("wide");
        let expect = xxh3(&drain(&mut Reader::local(&local, Cursor::START).unwrap()).0);
        let mut r = open(&near.uri(), &p, Offload::Yes).unwrap();
        assert_eq!(xxh3(&drain(&mut r).0), expect, "{codec}");
    }
}

/// The transport preset (`transport`: narrowed ids in a zstd stream a session's batches share)
/// gives the local stream, on an agent with one worker thread and on one with a pool (which
/// compresses other codecs ahead); blended sources switch the width from batch to batch
/// within the stream; a resumed session starts its stream afresh; and a shared stream's
/// records are compressed alone, since a subscriber may join late.
#[test]
fn the_transport_preset_streams_equal_local_ones() {
    let c = Corpus::new();
    for workers in [1, 3] {
        let mut cfg = c.config();
        cfg.worker_threads = workers;
        // The pool takes a share of every batch, however fast: the split is what is tested.
        cfg.worker_min_share_us = 0;
        let agent = dquant_agent::start(cfg).unwrap();
        let uri = agent.uri();
        for codec in ["transport", "u24+stream:1", "auto+stream:3"] {
            let mut p = plan(&[("r50k.dqb", 0.7), ("wide", 0.3)], 255, 8);
            p.wire_codec = codec.into();
            p.samples = Some(900);
            let whole = assert_parity(&c, &uri, &p, Cursor::START);
            let mut r = open(&uri, &p, Offload::Yes).unwrap();
            for _ in 0..5 {
                r.next_batch().unwrap().unwrap();
            }
            let at = r.cursor();
            let (tail, _) = drain(&mut r);
            assert_eq!(assert_parity(&c, &uri, &p, at), xxh3(&tail));
            assert_ne!(whole, xxh3(&tail));
        }
        let mut p = plan(&[("r50k.dqb", 1.0)], 255, 8);
        p.wire_codec = "transport".into();
        p.samples = Some(400);
        let want = assert_parity(&c, &uri, &p, Cursor::START);
        let share = Share {
            name: "t".into(),
            group: 1,
        };
        let mut shared = open_shared(&uri, &p, Cursor::START, &share).unwrap();
        assert_eq!(
            xxh3(&drain(&mut shared).0),
            want,
            "{workers} workers, shared"
        );
    }
}
