//! Inputs the fuzz targets (`fuzz/`) found to break plans, as tests: each one failed before
//! its fix.

use dquant_plan::Plan;

/// `plan_toml`: a weight of 3.3333333333333334e66 came back from the plan's own JSON as
/// 3.3333333333333338e66 (serde_json's default float parsing is not exact). A client sends
/// its plan to an agent as JSON, so the agent would blend with other weights than the
/// client's in-process run: the streams would differ. JSON numbers now parse exactly.
#[test]
fn weights_survive_the_json_an_agent_receives() {
    let toml = "seq_len = 4\nbatch_size = 2\n[[sources]]\nuri = \"c/a\"\n\
                weight = 3333333333333333333333333333333333333333333333333333333333333333330.3\n";
    let p = Plan::from_toml(toml).unwrap();
    let q = Plan::from_json(&p.to_json()).unwrap();
    assert_eq!(q.sources[0].weight.to_bits(), p.sources[0].weight.to_bits());
    assert_eq!(q, p);
    for w in [
        0.1,
        1.0 / 3.0,
        5e-324,
        1.7976931348623157e308,
        2.2250738585072014e-308,
    ] {
        let mut p = p.clone();
        p.sources[0].weight = w;
        let q = Plan::from_json(&p.to_json()).unwrap();
        assert_eq!(q.sources[0].weight.to_bits(), w.to_bits(), "{w:e}");
    }
}
