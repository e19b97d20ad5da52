//! A reader facing a careless or hostile agent's batch trailers: each refused with its
//! exact message, before the batch is handed out.

use super::*;
use dquant_plan::{Boundaries, Source};
use dquant_transport::memory::pair;
use dquant_transport::BatchSink;

/// The error the reader gives for one batch record of 2 samples of 5 i32 tokens whose
/// trailer is `trailer`, under `plan`.
fn refused(plan: &Plan, trailer: &[u8]) -> String {
    let (mut sink, source) = pair(4);
    let h = BatchHeader {
        codec: plain_codec(OutputDType::I32),
        index: 0,
        samples: 2,
        sample_len: 5,
        payload_len: (40 + trailer.len()) as u32,
        trailer_len: trailer.len() as u32,
        cursor_epoch: 0,
        cursor_consumed: 2,
    };
    let len = RECORD_HEADER_LEN + 40 + trailer.len();
    let room = sink.reserve(len).unwrap();
    room[..RECORD_HEADER_LEN].copy_from_slice(&h.encode());
    room[RECORD_HEADER_LEN + 40..len].copy_from_slice(trailer);
    sink.commit(len).unwrap();
    sink.flush();
    let origin = Origin {
        source: Box::new(source),
        session: None,
        schedule: None,
        transport: None,
        start: Cursor::START,
        rank_batches: 1,
        rank_samples: 2,
        per_epoch: Vec::new(),
    };
    let mut r = Reader::new(origin, plan, RecordPool::default());
    match r.next_batch() {
        Ok(b) => panic!("a batch was handed out: {b:?}"),
        Err(e) => e.to_string(),
    }
}

fn plan(boundaries: bool) -> Plan {
    let mut p = Plan::new(vec![Source::new("a")], 4, 2);
    if boundaries {
        p.boundaries = Some(Boundaries::Documents);
    }
    p
}

#[test]
fn bad_trailers_are_refused_by_name() {
    // The plan's bound: an 8-byte head and two 1-byte bitmask rows, padded: 16 bytes.
    assert_eq!(
        refused(&plan(true), &[0; 24]),
        "agent sent batch 0 with a 24-byte trailer; the plan's is at most 16 bytes"
    );
    // A list that claims one start: 2 counts and a start need 24 bytes, not 16.
    let mut list = [0u8; 16];
    list[0] = 1;
    list[4] = 1;
    let starts = "agent sent batch 0: document starts: a list of 2 counts and 1 starts needs \
                  24 bytes, the trailer has 16";
    assert_eq!(refused(&plan(true), &list), starts);
    let mut bitmask = [0u8; 16];
    bitmask[0] = 2;
    bitmask[4] = 1;
    bitmask[9] = 0b1_0000; // sample 1 marks position 5
    assert_eq!(
        refused(&plan(true), &bitmask),
        "agent sent batch 0: document starts: sample 1 marks a start past 4"
    );
    // No boundaries and one source: no trailer at all.
    assert_eq!(
        refused(&plan(false), &[0; 8]),
        "agent sent batch 0 with a 8-byte trailer; the plan's is at most 0 bytes"
    );
}

#[test]
fn bad_provenance_sections_are_refused_by_name() {
    let mut p = plan(false);
    p.provenance = true;
    // Two samples of one piece each: 8 + 2 × 16 + 2 × 12 = 64 bytes.
    let section = |lengths: [u32; 2]| {
        let mut o = dquant_plan::Origins::new();
        o.push_sample(0, 3, [(1, lengths[0])]);
        o.push_sample(0, 0, [(2, lengths[1])]);
        let mut b = vec![0u8; 64];
        assert_eq!(dquant_engine::origin_section::encode(&o, &mut b), Some(64));
        b
    };
    assert_eq!(
        refused(&p, &section([5, 4])),
        "agent sent batch 0: provenance: sample 1's 1 pieces hold 4 tokens; a sample holds 5, \
         in pieces of at least one"
    );
    let mut huge = section([5, 5]);
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let need = (8 + 2 * 16 + 12 * u32::MAX as u64).div_ceil(8) * 8;
    assert_eq!(
        refused(&p, &huge),
        format!("agent sent batch 0: provenance: 2 samples of 4294967295 pieces need {need} bytes, the trailer has 64")
    );
}
