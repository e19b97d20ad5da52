//! Plans as JSON (`Plan::from_json`: what the `Open` RPC carries, and what `dquant` reads
//! from `--plan x.json`): any text parses or is refused without a panic, and every plan that
//! parses passes `dquant_fuzz::plan::check_parsed` (JSON and TOML round trips, wire codec,
//! sizes, the validated invariants).
#![no_main]

use dquant_plan::Plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = Plan::from_json(text) {
        dquant_fuzz::plan::check_parsed(&p);
    }
});
