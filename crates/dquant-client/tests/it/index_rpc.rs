//! The agent's `Index` RPC and `Stat`'s `max_token` (what `dquant mount` builds its files
//! from): slices equal the dataset's own index, past the end they are short, and bad
//! requests get exact refusals.

use std::path::Path;

use dquant_client::Control;
use dquant_proto::v1::{IndexPart, IndexRequest, StatRequest};
use dquant_proto::MAX_INDEX_VALUES;
use dquant_storage::{Dataset, OpenOptions};
use dquant_testkit::{agent, fixture};

fn req(dataset: &str, part: IndexPart, start: u64, count: u32) -> IndexRequest {
    IndexRequest {
        dataset: Some(StatRequest {
            dataset: dataset.into(),
            ..Default::default()
        }),
        part: part as i32,
        start,
        count,
    }
}

fn served() -> (tempfile::TempDir, dquant_agent::AgentHandle, Control) {
    let dir = tempfile::tempdir().unwrap();
    for name in ["r50k_int32", "r50k_int32_multiseq"] {
        for ext in ["bin", "idx"] {
            let f = format!("{name}.{ext}");
            std::fs::copy(fixture(&f), dir.path().join(&f)).unwrap();
        }
    }
    let a = agent::start(&[("c", dir.path().to_path_buf())]);
    let c = Control::connect(&a.control_addr().to_string()).unwrap();
    (dir, a, c)
}

#[test]
fn index_slices_equal_the_datasets_own_index() {
    let (_dir, _agent, c) = served();
    let local = Dataset::open(
        Path::new(&fixture("r50k_int32_multiseq")),
        &OpenOptions::default(),
    )
    .unwrap();
    let ix = local.index().unwrap();
    for (part, all) in [
        (IndexPart::SequenceOffsets, ix.seq_offsets()),
        (IndexPart::DocumentSequences, ix.doc_seq()),
    ] {
        let n = all.len() as u64;
        for (start, count) in [
            (0, n as u32),
            (0, 1),
            (5, 17),
            (n - 1, 1),
            (n - 3, 10),
            (n, 4),
            (n + 9, 4),
        ] {
            let got = c
                .index(req("c/r50k_int32_multiseq", part, start, count))
                .unwrap();
            let from = start.min(n) as usize;
            let to = (start + u64::from(count)).min(n) as usize;
            assert_eq!(got, all[from..to], "{part:?} {start}+{count}");
        }
    }
}

#[test]
fn stat_finds_the_largest_token_only_when_asked() {
    let (_dir, _agent, c) = served();
    let local = Dataset::open(Path::new(&fixture("r50k_int32")), &OpenOptions::default()).unwrap();
    let mut max = 0;
    local
        .scan::<dquant_storage::StorageError>(1 << 16, |_, t| {
            max = max.max(t.iter().copied().max().unwrap_or(0));
            Ok(())
        })
        .unwrap();
    let mut s = StatRequest {
        dataset: "c/r50k_int32".into(),
        ..Default::default()
    };
    assert_eq!(c.stat(s.clone()).unwrap().max_token, None);
    s.max_token = true;
    let stat = c.stat(s.clone()).unwrap();
    assert_eq!(stat.max_token, Some(max));
    assert_eq!(stat.stored_max_token, None);
    // Kept: the same answer again.
    assert_eq!(c.stat(s).unwrap().max_token, Some(max));
}

#[test]
fn bad_index_requests_are_refused_by_name() {
    let (_dir, _agent, c) = served();
    let err = c
        .index(req(
            "c/r50k_int32",
            IndexPart::SequenceOffsets,
            0,
            MAX_INDEX_VALUES + 1,
        ))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "count {} is over the most one Index reply carries ({MAX_INDEX_VALUES})",
            MAX_INDEX_VALUES + 1
        )
    );
    let mut r = req("c/r50k_int32", IndexPart::SequenceOffsets, 0, 1);
    r.part = 7;
    assert_eq!(c.index(r).unwrap_err().to_string(), "part: unknown value 7");
    let mut r = req("c/r50k_int32", IndexPart::SequenceOffsets, 0, 1);
    r.dataset = None;
    assert_eq!(c.index(r).unwrap_err().to_string(), "dataset: missing");
    let err = c
        .index(req("c/nope", IndexPart::SequenceOffsets, 0, 1))
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = c
        .index(req("elsewhere/x", IndexPart::SequenceOffsets, 0, 1))
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown root \"elsewhere\""),
        "{err}"
    );
}
