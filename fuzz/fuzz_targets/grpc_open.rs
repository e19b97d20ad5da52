//! The decoded gRPC `Open` request, taken as the agent takes it (`dquant-agent`'s
//! `grpc::Service::open`): protobuf bytes → `OpenRequest` → `Plan::from_json` → the wire
//! codec → the agent's limits (`Limits::check_plan`, `check_wire`) → the cursor → the
//! pipeline positioned at it (`Pipeline::open_until`, with the stop a request's deadline
//! gives it) → its first batches. The agent's sources are files under its roots; here they
//! are synthetic sources whose every token is a function of (source, offset).
//!
//! Checked, beyond no panic and no allocation the limits do not allow:
//!
//! * the request re-encodes to bytes that decode to the same request (prost);
//! * a plan that parsed passes `dquant_fuzz::plan::check_parsed`;
//! * a plan within the limits opens at any cursor or is refused with an error (never a
//!   panic, never a wrapped size); the batches it then gives have the plan's shape, at most
//!   `batch_size` samples of `seq_len + 1` tokens, and every sample is the tokens its
//!   provenance names, read from that source.
//!
//! Work per run is bounded by the harness, not by the agent: at most 16 sources, world 64,
//! 2^20 tokens a batch, and the blend replay stops at its first check (the agent stops it at
//! the request's deadline instead).
#![no_main]

use std::ops::Range;

use dquant_agent::Limits;
use dquant_engine::{Pipeline, SourceError, TokenSource};
use dquant_plan::{Cursor, Plan, Source};
use dquant_proto::v1::OpenRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// Token `offset` of synthetic source `d`: even sources fit 16 bits, odd ones use all 32 (so
/// a `u16` plan over them fails its fit check, as a real one would).
fn token(d: usize, offset: u64) -> u32 {
    let t = offset.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (d as u64).wrapping_mul(0xc2b2_ae35);
    let t = (t >> 17) as u32;
    if d.is_multiple_of(2) {
        t % 50_000
    } else {
        t
    }
}

struct Synthetic {
    d: usize,
    tokens: u64,
}

impl TokenSource for Synthetic {
    fn tokens(&self) -> u64 {
        self.tokens
    }

    fn read_ranges(&mut self, ranges: &[Range<u64>], out: &mut [u32]) -> Result<(), SourceError> {
        let mut at = 0;
        for r in ranges {
            assert!(
                r.start <= r.end && r.end <= self.tokens,
                "read {r:?} of {}",
                self.tokens
            );
            for o in r.clone() {
                out[at] = token(self.d, o);
                at += 1;
            }
        }
        assert_eq!(at, out.len(), "ranges fill exactly the buffer");
        Ok(())
    }
}

/// A source's length, from its URI: from a few tokens (too short for most plans) to a few
/// samples' worth.
fn tokens_of(s: &Source, sample_len: u64) -> u64 {
    let h = s.uri.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    h % (4 * sample_len + 64)
}

fn open(req: &OpenRequest) {
    // What `Service::open` does, in its order (the caller's dataset check needs tenants and
    // is not part of the request).
    let Ok(plan) = Plan::from_json(&req.plan_json) else {
        return;
    };
    dquant_fuzz::plan::check_parsed(&plan);
    let Ok(wire) = plan.parsed_wire_codec() else {
        panic!("a validated plan's wire codec does not parse");
    };
    let limits = Limits::default();
    if limits.check_plan(&plan).is_err() || limits.check_wire("wire_codec", wire).is_err() {
        return;
    }
    assert!(plan.batch_bytes() <= limits.max_batch_bytes);
    if plan.sources.len() > 16 || plan.world > 64 || plan.batch_tokens() > 1 << 20 {
        return;
    }
    let cursor = Cursor {
        epoch: req.epoch,
        consumed_samples: req.consumed_samples,
        blend: req.blend.clone(),
        delivered: req.delivered.clone(),
    };
    let sample_len = plan.sample_len() as u64;
    let open_source = |d: usize, s: &Source| -> Result<Box<dyn TokenSource>, SourceError> {
        Ok(Box::new(Synthetic {
            d,
            tokens: tokens_of(s, sample_len),
        }))
    };
    let mut checks = 0u32;
    // Sources opened (one check each), then the first check of the blend replay.
    let allowed = plan.sources.len() as u32 + 1;
    let mut stop = || {
        checks += 1;
        checks > allowed
    };
    let Ok(mut pipeline) = Pipeline::open_until(&plan, cursor, open_source, &mut stop) else {
        return;
    };
    let sched = pipeline.schedule();
    assert!(sched.rank_samples() <= sched.total_samples());
    assert!(sched.rank_batches() <= sched.rank_samples().div_ceil(u64::from(plan.batch_size)));
    let width = plan.output.width();
    for _ in 0..2 {
        let Ok(Some(b)) = pipeline.next_batch_checked(width) else {
            return;
        };
        assert!(b.samples >= 1 && b.samples <= plan.batch_size as usize);
        assert_eq!(b.tokens.len(), b.samples * plan.sample_len());
        assert_eq!(b.provenance.len(), b.samples);
        for (k, &(d, start)) in b.provenance.iter().enumerate() {
            let sample = &b.tokens[k * plan.sample_len()..(k + 1) * plan.sample_len()];
            for (j, &t) in sample.iter().enumerate() {
                assert_eq!(t, token(d, start + j as u64), "sample {k} token {j}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(req) = OpenRequest::decode(data) else {
        return;
    };
    let again = req.encode_to_vec();
    assert_eq!(OpenRequest::decode(&again[..]).ok().as_ref(), Some(&req));
    open(&req);
});
