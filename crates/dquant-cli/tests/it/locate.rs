//! `dquant locate` against the stream itself: every sample's pieces, read from the datasets'
//! documents, are exactly the tokens the sample's rank received at its step; and a document's
//! samples are exactly those whose pieces name it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use dquant_storage::{Dataset, OpenOptions};
use dquant_testkit::fixture_str;
use serde_json::Value;

const SEQ: usize = 255;
const BATCH: u64 = 3;
const WORLD: u64 = 2;
const SAMPLES: u64 = 1_499;

fn dquant(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dquant"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> Vec<u8> {
    let o = dquant(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

/// Two sources of the same 28 documents (one with a sequence per document, one with up to
/// 1000 tokens a sequence), blended 0.7/0.3, shuffled, past one epoch of the first, on two
/// ranks with drop_last.
fn plan(rank: u64) -> String {
    format!(
        "seq_len = {SEQ}\nbatch_size = {BATCH}\noutput = \"i32\"\nseed = 11\nsamples = {SAMPLES}\n\
         rank = {rank}\nworld = {WORLD}\ndrop_last = true\n\
         [[sources]]\nuri = \"{}\"\nweight = 0.7\n[[sources]]\nuri = \"{}\"\nweight = 0.3\n",
        fixture_str("r50k_int32"),
        fixture_str("r50k_int32_multiseq")
    )
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The tokens of a piece, read from its dataset by document.
fn piece_tokens(p: &Value) -> Vec<i32> {
    let uri = p["uri"].as_str().unwrap();
    let ds = Dataset::open(Path::new(uri), &OpenOptions::default()).unwrap();
    let doc = ds
        .index()
        .unwrap()
        .document(p["document"].as_u64().unwrap() as usize);
    let start = doc.start + p["offset"].as_u64().unwrap();
    let len = p["length"].as_u64().unwrap();
    assert!(start + len <= doc.end, "{p}");
    let bin = std::fs::read(format!("{uri}.bin")).unwrap();
    i32s(&bin[start as usize * 4..(start + len) as usize * 4])
}

#[test]
fn locate_matches_the_stream_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let mut streams = Vec::new();
    for r in 0..WORLD {
        let p = dir.path().join(format!("plan{r}.toml"));
        std::fs::write(&p, plan(r)).unwrap();
        let out = dir.path().join(format!("r{r}.i32"));
        ok(&[
            "read",
            p.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "-q",
        ]);
        streams.push(i32s(&std::fs::read(out).unwrap()));
    }
    let plan0 = dir.path().join("plan0.toml");
    let plan0 = plan0.to_str().unwrap();
    let delivered = SAMPLES / (WORLD * BATCH) * WORLD * BATCH;
    let lines = ok(&[
        "locate",
        plan0,
        "--sample",
        &format!("0..{delivered}"),
        "--json",
    ]);
    let located: Vec<Value> = lines
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(located.len() as u64, delivered);
    let mut holding: BTreeSet<(u64, u64, u64)> = BTreeSet::new();
    for (i, at) in located.iter().enumerate() {
        let i = i as u64;
        assert_eq!(at["sample"], i);
        let (rank, step) = (at["rank"].as_u64().unwrap(), at["step"].as_u64().unwrap());
        let local = i / WORLD;
        assert_eq!((rank, step), (i % WORLD, local / BATCH), "sample {i}");
        let pieces = at["pieces"].as_array().unwrap();
        let tokens: Vec<i32> = pieces.iter().flat_map(piece_tokens).collect();
        let at_stream = local as usize * (SEQ + 1);
        assert_eq!(
            tokens,
            streams[rank as usize][at_stream..at_stream + SEQ + 1],
            "sample {i}: {at}"
        );
        for p in pieces {
            let key = (
                p["source"].as_u64().unwrap(),
                p["document"].as_u64().unwrap(),
            );
            holding.insert((key.0, key.1, i));
        }
    }
    audit_matches(plan0, &located);
    // A document's samples: exactly those whose pieces name it, whole plan and a window.
    for (k, d) in [(0, 0), (0, 13), (0, 27), (1, 5), (1, 27)] {
        for (range, window) in [(None, 0..u64::MAX), (Some("200..900"), 200..900)] {
            let doc = format!("{k}:{d}");
            let mut args = vec!["locate", plan0, "--document", &doc, "--json"];
            args.extend(range.iter().flat_map(|r| ["--range", *r]));
            let got: Value = serde_json::from_slice(&ok(&args)).unwrap();
            let want: Vec<u64> = holding
                .iter()
                .filter(|&&(s, doc, i)| (s, doc) == (k, d) && window.contains(&i))
                .map(|&(_, _, i)| i)
                .collect();
            assert!(!want.is_empty() || range.is_some(), "{doc} is read");
            assert_eq!(got["document"], doc);
            assert_eq!(got["samples"], serde_json::json!(want), "{doc} {range:?}");
        }
    }
}

#[test]
fn locate_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("plan.toml");
    std::fs::write(&p, plan(0)).unwrap();
    let p = p.to_str().unwrap();
    let err = |args: &[&str]| {
        let o = dquant(args);
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).trim_end().to_string()
    };
    assert_eq!(
        err(&["locate", p, "--sample", "1499"]),
        "error: sample: 1499 is past the end of the plan: 1494 samples are delivered"
    );
    assert_eq!(
        err(&["locate", p, "--sample", "1494"]),
        "error: sample: 1494 is past the last full batch of every rank (drop_last): 1494 samples are delivered"
    );
    assert_eq!(
        err(&["locate", p, "--document", "2:0"]),
        "error: source 2: the plan has 2 sources (0 to 1)"
    );
    let uri = fixture_str("r50k_int32");
    assert_eq!(
        err(&["locate", p, "--document", "0:28"]),
        format!("error: document 28 of source 0 ({uri}): it has 28 documents")
    );
    let usage = err(&["locate", p, "--sample", "9..3"]);
    assert!(
        usage.contains("\"9..3\": the start is past the end"),
        "{usage}"
    );
    let usage = err(&["locate", p, "--document", "7"]);
    assert!(
        usage.contains("\"7\" is not SOURCE:DOCUMENT (e.g. 0:42)"),
        "{usage}"
    );
}

/// `dquant audit --until N` against the located samples below N: per source, the samples
/// drawn, and the documents with a token read (touched) and with every reachable token read
/// (completed), from the pieces' token coverage.
fn audit_matches(plan: &str, located: &[Value]) {
    let reach = |uri: &str| {
        let ds = Dataset::open(Path::new(uri), &OpenOptions::default()).unwrap();
        let idx = ds.index().unwrap().clone();
        // Tokens a sample can hold: the first S * seq_len + 1.
        let limit = (ds.tokens() - 1) / SEQ as u64 * SEQ as u64 + 1;
        (idx, limit)
    };
    for until in [0u64, 1, 100, 701, 1494] {
        let got: Value = serde_json::from_slice(&ok(&[
            "audit",
            plan,
            "--until",
            &until.to_string(),
            "--json",
        ]))
        .unwrap();
        for (k, row) in got["sources"].as_array().unwrap().iter().enumerate() {
            let (idx, limit) = reach(row["uri"].as_str().unwrap());
            let mut covered = vec![BTreeSet::new(); idx.documents()];
            let mut samples = 0;
            for at in &located[..until as usize] {
                let pieces = at["pieces"].as_array().unwrap();
                samples += u64::from(pieces[0]["source"] == k as u64);
                for p in pieces.iter().filter(|p| p["source"] == k as u64) {
                    let (o, n) = (p["offset"].as_u64().unwrap(), p["length"].as_u64().unwrap());
                    covered[p["document"].as_u64().unwrap() as usize].extend(o..o + n);
                }
            }
            let touched = covered.iter().filter(|c| !c.is_empty()).count();
            let completed = (0..idx.documents())
                .filter(|&d| {
                    let r = idx.document(d);
                    let want = r.end.min(limit).saturating_sub(r.start);
                    want > 0 && covered[d].len() as u64 == want
                })
                .count();
            let what = format!("until {until}, source {k}: {row}");
            assert_eq!(row["samples"], samples, "{what}");
            assert_eq!(row["exact"], true, "{what}");
            assert_eq!(row["documents_touched"], touched as f64, "{what}");
            assert_eq!(row["documents_completed"], completed as f64, "{what}");
            assert_eq!(row["tokens"], samples * (SEQ as u64 + 1), "{what}");
        }
    }
}
