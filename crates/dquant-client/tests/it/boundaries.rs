//! Boundary outputs: each sample's document starts follow the rule of
//! `dquant_plan::boundaries` (EOD tokens, or the sources' indices) on Megatron's own fixtures
//! and on blended, shuffled and sharded plans; they arrive the same in-process, over TCP (in
//! any wire codec) and over shared memory; and a source that cannot give them is refused at
//! open with a message that says what to do.

use dquant_client::{open, open_at, Offload, Reader};
use dquant_plan::{Boundaries, Cursor, OutputDType, Plan};
use dquant_storage::{Dataset, OpenOptions};
use dquant_testkit::agent::{plan, Corpus};

const EOD: u32 = 50256;

/// Every batch of a reader: tokens widened to u32, and each sample's starts.
#[derive(Debug, PartialEq)]
struct Batches {
    tokens: Vec<Vec<u32>>,
    starts: Vec<Vec<Vec<u32>>>,
}

fn drain_docs(r: &mut Reader) -> Batches {
    let mut out = Batches {
        tokens: Vec::new(),
        starts: Vec::new(),
    };
    while let Some(b) = r.next_batch().unwrap() {
        let tokens: Vec<u32> = match b.tokens {
            dquant_client::Tokens::U16(t) => t.iter().map(|&x| u32::from(x)).collect(),
            dquant_client::Tokens::I32(t) => t.iter().map(|&x| x as u32).collect(),
            dquant_client::Tokens::I64(t) => t.iter().map(|&x| x as u32).collect(),
        };
        let docs = b.docs.expect("the plan has boundaries");
        assert_eq!(docs.samples(), b.samples);
        assert_eq!(docs.seq_len() as usize + 1, b.sample_len);
        out.starts
            .push((0..b.samples).map(|k| docs.sample(k).to_vec()).collect());
        out.tokens.push(tokens);
    }
    assert!(!out.tokens.is_empty(), "the plan yields data");
    out
}

fn with_boundaries(mut p: Plan, mode: Boundaries) -> Plan {
    p.boundaries = Some(mode);
    p.eod = (mode == Boundaries::Eod).then_some(EOD);
    p.position_ids = true;
    p.loss_mask = true;
    p
}

/// Megatron's rule, straight from the tokens: a start after every input holding EOD.
fn eod_reference(b: &Batches, sample_len: usize) -> Vec<Vec<Vec<u32>>> {
    b.tokens
        .iter()
        .map(|t| {
            t.chunks_exact(sample_len)
                .map(|s| {
                    let inputs = &s[..sample_len - 1];
                    (0..inputs.len())
                        .filter(|&i| inputs[i] == EOD)
                        .map(|i| i as u32 + 1)
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The index's rule: every document start strictly inside each sample's tokens, from the
/// schedule's own sample list and each source's index read apart.
fn documents_reference(p: &Plan, r: &Reader) -> Vec<Vec<Vec<u32>>> {
    let s = r.schedule().expect("an in-process reader");
    let indices: Vec<Dataset> = p
        .sources
        .iter()
        .map(|src| Dataset::open(src.uri.as_ref(), &OpenOptions::default()).unwrap())
        .collect();
    let mut it = s.iter_rank(Cursor::START).unwrap();
    let mut out = Vec::new();
    while let Some(b) = it.next_batch() {
        out.push(
            b.samples
                .iter()
                .map(|x| {
                    let ix = indices[x.source].index().unwrap();
                    (0..ix.documents())
                        .map(|d| ix.document(d).start)
                        .filter(|&t| t > x.tokens.start && t < x.tokens.end)
                        .map(|t| (t - x.tokens.start) as u32)
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect()
                })
                .collect(),
        );
    }
    out
}

#[test]
fn starts_follow_the_rule_on_megatron_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["r50k_int32", "r50k_uint16", "r50k_int32_multiseq"] {
        dquant_testkit::copy_fixture(name, &dir.path().join(name));
    }
    let path = |n: &str| dir.path().join(n).display().to_string();
    for (name, out) in [
        ("r50k_int32", OutputDType::I32),
        // Stored u16 into u16 batches: the copy path, whose starts come from the bytes.
        ("r50k_uint16", OutputDType::U16),
        ("r50k_uint16", OutputDType::I64),
        ("r50k_int32_multiseq", OutputDType::I32),
    ] {
        let mut p = plan(&[("x", 1.0)], 1023, 4);
        p.sources[0].uri = path(name);
        p.output = out;
        let eod = with_boundaries(p.clone(), Boundaries::Eod);
        let mut r = Reader::local(&eod, Cursor::START).unwrap();
        let got = drain_docs(&mut r);
        assert_eq!(got.starts, eod_reference(&got, 1024), "{name} {out}");
        assert!(got.starts.iter().flatten().any(|s| !s.is_empty()));

        // Every document of the fixtures ends with EOD, so the index's starts are the same
        // (documents, not the multiseq file's sequences).
        let docs = with_boundaries(p, Boundaries::Documents);
        let mut r = Reader::local(&docs, Cursor::START).unwrap();
        let want = documents_reference(&docs, &r);
        let by_index = drain_docs(&mut r);
        assert_eq!(by_index.starts, want, "{name}");
        assert_eq!(by_index, got, "{name}: EOD and index agree");
    }
}

#[test]
fn blended_shuffled_sharded_plans_carry_the_same_starts_everywhere() {
    let c = Corpus::new();
    let (agent, sock) = c.agent_with_socket();
    let tcp = agent.uri();
    for mode in [Boundaries::Eod, Boundaries::Documents] {
        for (world, codec) in [(1, "auto"), (3, "auto+zstd:1"), (2, "bits:18+lz4")] {
            let mut p = plan(&[("r50k.dqb", 0.6), ("wide", 0.4)], 200, 5);
            p.samples = Some(240);
            p.wire_codec = codec.into();
            p.world = world;
            p.rank = world - 1;
            let p = with_boundaries(p, mode);
            let mut local = Reader::local(&c.localized(&p), Cursor::START).unwrap();
            if mode == Boundaries::Documents {
                let want = documents_reference(&c.localized(&p), &local);
                let got = drain_docs(&mut local);
                assert_eq!(got.starts, want, "{mode} world {world}");
                local = Reader::local(&c.localized(&p), Cursor::START).unwrap();
            }
            let want = drain_docs(&mut local);
            if mode == Boundaries::Eod {
                assert_eq!(want.starts, eod_reference(&want, 201));
            }
            for uri in [tcp.clone(), sock.clone()] {
                let got = drain_docs(&mut open(&uri, &p, Offload::Yes).unwrap());
                assert_eq!(got, want, "{mode} world {world} {codec} via {uri}");
            }
            // Resumed mid-stream from a cursor: the starts of the rest, unchanged.
            let mut r = open(&tcp, &p, Offload::Yes).unwrap();
            r.next_batch().unwrap().unwrap();
            let cursor = r.cursor();
            let rest = drain_docs(&mut open_at(&tcp, &p, cursor, Offload::Yes).unwrap());
            assert_eq!(rest.starts[..], want.starts[1..], "{mode} resumed");
        }
    }
}

#[test]
fn a_source_without_an_index_is_refused_for_documents() {
    let c = Corpus::new();
    let storage = c.agent();
    let (near, _empty) = c.near_agent(&storage);
    let mut p = with_boundaries(plan(&[("wide", 1.0)], 100, 2), Boundaries::Documents);
    p.sources[0].uri = format!("{}/corpus/wide", storage.uri());
    let Err(err) = open(&near.uri(), &p, Offload::Yes) else {
        panic!("a documents plan over a dquant:// source opened")
    };
    let err = err.to_string();
    assert!(
        err.contains(
            "boundaries = \"documents\" needs each source's document index, and this source \
             does not carry one (a dataset on another agent); use boundaries = \"eod\" with \
             eod = ID"
        ),
        "{err}"
    );
    // EOD boundaries work through the chain, and equal the local ones.
    let p = with_boundaries(plan(&[("wide", 1.0)], 100, 2), Boundaries::Eod);
    let want = drain_docs(&mut Reader::local(&c.localized(&p), Cursor::START).unwrap());
    let mut chained = p.clone();
    chained.sources[0].uri = format!("{}/corpus/wide", storage.uri());
    let got = drain_docs(&mut open(&near.uri(), &chained, Offload::Yes).unwrap());
    assert_eq!(got, want);
}

#[test]
fn expansions_match_the_starts() {
    let c = Corpus::new();
    let p = with_boundaries(plan(&[("r50k", 1.0)], 63, 4), Boundaries::Eod);
    let mut r = Reader::local(&c.localized(&p), Cursor::START).unwrap();
    let mut seen_reset = false;
    while let Some(b) = r.next_batch().unwrap() {
        let d = b.docs.unwrap();
        let n = d.positions();
        let (pos, mask) = (d.position_ids::<i64>(), d.loss_mask(1.0f32, 0.0));
        assert_eq!((pos.len(), mask.len()), (n, n));
        let dquant_client::Tokens::I32(t) = b.tokens else {
            panic!("i32 output")
        };
        for k in 0..b.samples {
            let inputs = &t[k * 64..k * 64 + 63];
            let mut at = 0;
            for i in 0..63 {
                assert_eq!(
                    mask[k * 63 + i],
                    if inputs[i] == EOD as i32 { 0.0 } else { 1.0 }
                );
                assert_eq!(pos[k * 63 + i], at);
                at = if inputs[i] == EOD as i32 { 0 } else { at + 1 };
                seen_reset |= at == 0;
            }
        }
        let mut cu = Vec::new();
        let max = d.cu_seqlens(&mut cu);
        assert_eq!(*cu.last().unwrap() as usize, n);
        assert!(cu.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(max, cu.windows(2).map(|w| w[1] - w[0]).max().unwrap());
    }
    assert!(seen_reset);
}
