//! `dquant read`: a plan run in-process, written out, resumable, with named plan errors.

use std::process::Command;

use dquant_testkit::fixture_str;

fn dquant(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dquant"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn read_writes_the_plan_and_resumes_from_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        format!(
            "seq_len = 255\nbatch_size = 2\noutput = \"u16\"\nseed = 3\n\
             [[sources]]\nuri = \"{}\"\nweight = 3.0\n[[sources]]\nuri = \"{}\"\n",
            fixture_str("r50k_int32"),
            fixture_str("r50k_uint16")
        ),
    )
    .unwrap();
    let full = dir.path().join("full.u16");
    let o = dquant(&[
        "read",
        plan.to_str().unwrap(),
        "--out",
        full.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    let full = std::fs::read(&full).unwrap();
    // Every sample of both sources (each has (161032 - 1) / 255 = 631 samples) as u16.
    assert_eq!(full.len(), 2 * 631 * 256 * 2);
    assert_eq!(summary["bytes"], full.len());
    assert_eq!(summary["cursor"]["consumed_samples"], 2 * 631);
    // Resuming after 100 samples writes exactly the rest, to stdout.
    let o = dquant(&["read", plan.to_str().unwrap(), "--cursor", "100", "-q"]);
    assert!(o.status.success());
    assert!(
        o.stdout == full[100 * 256 * 2..],
        "the resumed stream is the tail"
    );
    // A whole cursor from a --json summary (the blend's counts included) resumes the same.
    let part = dquant(&[
        "read",
        plan.to_str().unwrap(),
        "--cursor",
        "100",
        "--json",
        "--out",
        "/dev/null",
    ]);
    let end: serde_json::Value = serde_json::from_slice(&part.stderr).unwrap();
    assert_eq!(end["cursor"]["blend"].as_array().unwrap().len(), 2);
    let mid = r#"{"epoch":0,"consumed_samples":100,"blend":[75,25]}"#;
    let o = dquant(&["read", plan.to_str().unwrap(), "--cursor-json", mid, "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stdout == full[100 * 256 * 2..],
        "--cursor-json resumes the tail"
    );
    let o = dquant(&[
        "read",
        plan.to_str().unwrap(),
        "--cursor-json",
        r#"{"epoch":0,"consumed_samples":100,"blend":[25,75]}"#,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "error: cursor: blend[0] = 25 is not this plan's blend after 100 samples (source 0's \
         share is 75.0)\n"
    );
}

#[test]
fn bad_plans_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.json");
    std::fs::write(
        &p,
        format!(
            r#"{{"seq_len": 8, "batch_size": 1, "sources": [{{"uri": "{}", "weight": -0.5}}]}}"#,
            fixture_str("r50k_int32")
        ),
    )
    .unwrap();
    let o = dquant(&["read", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "error: {}: sources[0].weight: must be a finite number > 0 (got -0.5)\n",
            p.display()
        )
    );
}

/// A shuffled plan reads samples from random places: over an archive (`rank+zstd`, the rank
/// table in the footer), over small ranked blocks and over the dpu preset's 32 KiB LZ4 blocks
/// it gives the bytes it gives over the Megatron source.
#[test]
fn a_shuffled_plan_reads_the_same_tokens_from_ranked_and_lz4_block_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture_str("r50k_int32");
    let stream = |uri: &str| {
        let plan = dir.path().join("plan.toml");
        std::fs::write(
            &plan,
            format!(
                "seq_len = 255\nbatch_size = 4\noutput = \"u16\"\nseed = 11\nshuffle = true\n\
                 epochs = 2\n[[sources]]\nuri = \"{uri}\"\n"
            ),
        )
        .unwrap();
        let o = dquant(&["read", plan.to_str().unwrap(), "-q"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let want = stream(&src);
    assert_eq!(want.len(), 2 * 631 * 256 * 2);
    for (name, opts) in [
        ("archive.dqb", &["--preset", "archive"][..]),
        ("dpu.dqb", &["--preset", "dpu"][..]),
        (
            "small.dqb",
            &["--codec", "auto+rank+zstd:3", "--block-size", "16KiB"][..],
        ),
    ] {
        let dqb = dir.path().join(name);
        let mut args = vec!["convert", &src, dqb.to_str().unwrap(), "-q"];
        args.extend_from_slice(opts);
        let o = dquant(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(stream(dqb.to_str().unwrap()) == want, "{name}");
    }
}
