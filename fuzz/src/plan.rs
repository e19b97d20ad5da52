//! What every plan that parses must satisfy, whichever text it came from.

use dquant_plan::{Plan, WireCodec};

/// A plan that parsed: its JSON re-parses to the same plan, so does its TOML (which fails only
/// for integers above `i64::MAX`, which TOML cannot hold), its wire codec re-parses from its
/// display form, and its sizes are the products of its fields.
pub fn check_parsed(p: &Plan) {
    let json = p.to_json();
    match Plan::from_json(&json) {
        Ok(q) => assert_eq!(&q, p, "JSON round trip of a plan\n{json}"),
        Err(e) => panic!("a plan's own JSON does not parse: {e}\n{json}"),
    }
    match p.to_toml() {
        Ok(toml) => match Plan::from_toml(&toml) {
            Ok(q) => assert_eq!(&q, p, "TOML round trip of a plan\n{toml}"),
            Err(e) => panic!("a plan's own TOML does not parse: {e}\n{toml}"),
        },
        Err(_) => {
            let big = |v: u64| v > i64::MAX as u64;
            assert!(big(p.seed) || p.samples.is_some_and(big));
        }
    }
    let wire = p
        .parsed_wire_codec()
        .expect("a validated plan's wire codec parses");
    assert_eq!(wire.to_string().parse::<WireCodec>().ok(), Some(wire));
    let bytes =
        u128::from(p.batch_size) * (u128::from(p.seq_len) + 1) * p.output.itemsize() as u128;
    assert_eq!(u128::from(p.batch_bytes()), bytes.min(u128::from(u64::MAX)));
    assert_eq!(p.sample_len() as u64, u64::from(p.seq_len) + 1);
    assert!(p.rank < p.world && p.seq_len > 0 && p.batch_size > 0 && !p.sources.is_empty());
}
