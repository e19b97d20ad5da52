//! Megatron `.idx` parser: arbitrary bytes never panic, and whatever parses re-encodes to an
//! index that parses to the same boundaries and dtype.
#![no_main]

use dquant_format::megatron::{encode_idx, parse_idx};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(p) = parse_idx(data) else { return };
    let bytes = encode_idx(p.dtype, &p.index).expect("a parsed index must encode");
    let q = parse_idx(&bytes).expect("an encoded index must parse");
    assert_eq!(q.index, p.index);
    assert_eq!(q.dtype, p.dtype);
    assert!(!q.multimodal);
    // Without the multimodal modes, the encoding is the input itself.
    if !p.multimodal {
        assert_eq!(bytes, data);
    }
});
