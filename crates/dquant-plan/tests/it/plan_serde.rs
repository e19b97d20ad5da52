//! Plans as text: JSON and TOML round trips, defaults, and the exact validation messages.

use crate::common;

use dquant_codec::{Codec, Compression, Width};
use dquant_plan::{
    Boundaries, Cursor, Interpolate, OutputDType, Plan, Schedule, Source, SourceInfo, Stage,
    WhenExhausted, WireCodec,
};

fn full_plan() -> Plan {
    Plan {
        sources: vec![
            Source {
                uri: "/data/web_text_document".into(),
                weight: 0.7,
                dtype: None,
                eod: None,
                max_epochs: Some(2),
                max_samples: None,
            },
            Source {
                uri: "dquant://storage-1:7070/code".into(),
                weight: 0.25,
                dtype: None,
                eod: None,
                max_epochs: None,
                max_samples: Some(1_000),
            },
            Source {
                uri: "/data/raw.u16".into(),
                weight: 0.05,
                dtype: Some("uint16".into()),
                eod: Some(50256),
                max_epochs: None,
                max_samples: None,
            },
        ],
        seq_len: 4096,
        batch_size: 8,
        seed: 1234,
        shuffle: false,
        epochs: None,
        samples: Some(1_000_000),
        output: OutputDType::I64,
        wire_codec: "auto+zstd:3".into(),
        rank: 3,
        world: 8,
        drop_last: true,
        boundaries: Some(Boundaries::Eod),
        eod: Some(50256),
        position_ids: true,
        loss_mask: true,
        cu_seqlens: true,
        provenance: true,
        stages: vec![Stage {
            start_sample: None,
            start_fraction: Some(0.75),
            weights: vec![1.0, 0.0, 2.0],
        }],
        interpolate: Interpolate::Linear,
        when_exhausted: WhenExhausted::Renormalize,
    }
}

#[test]
fn round_trips_json_toml_struct() {
    let p = full_plan();
    p.validate().unwrap();
    let json = p.to_json();
    assert_eq!(Plan::from_json(&json).unwrap(), p);
    let toml = p.to_toml().unwrap();
    assert_eq!(Plan::from_toml(&toml).unwrap(), p);
    // JSON -> struct -> TOML -> struct -> JSON is the same text.
    let again = Plan::from_toml(&Plan::from_json(&json).unwrap().to_toml().unwrap()).unwrap();
    assert_eq!(again.to_json(), json);
    // With epochs instead of samples, and defaults.
    let mut q = common::plan(&[1.0], 2048, 4);
    q.epochs = Some(3);
    assert_eq!(Plan::from_toml(&q.to_toml().unwrap()).unwrap(), q);
    assert_eq!(Plan::from_json(&q.to_json()).unwrap(), q);
}

#[test]
fn toml_text_is_what_a_person_would_write() {
    let toml = full_plan().to_toml().unwrap();
    assert!(
        toml.starts_with("seq_len = 4096\nbatch_size = 8\nseed = 1234\n"),
        "{toml}"
    );
    assert!(toml.contains("\n[[sources]]\nuri = \"/data/raw.u16\"\nweight = 0.05\ndtype = \"uint16\"\neod = 50256\n"), "{toml}");
    assert!(
        !toml.contains("\nepochs"),
        "absent options are left out: {toml}"
    );
}

#[test]
fn defaults() {
    let p =
        Plan::from_json(r#"{"sources": [{"uri": "a"}], "seq_len": 8, "batch_size": 2}"#).unwrap();
    assert_eq!(p, Plan::new(vec![Source::new("a")], 8, 2));
    assert_eq!(p.sources[0].weight, 1.0);
    assert!(p.shuffle);
    assert_eq!(p.seed, 0);
    assert_eq!((p.epochs, p.samples), (None, None));
    assert_eq!(p.output, OutputDType::I32);
    assert_eq!(p.wire_codec, "transport");
    assert_eq!((p.rank, p.world, p.drop_last), (0, 1, false));
    let t = Plan::from_toml("seq_len = 8\nbatch_size = 2\n[[sources]]\nuri = \"a\"\n").unwrap();
    assert_eq!(t, p);
    // Neither epochs nor samples: one epoch.
    let s = Schedule::new(&p, &[SourceInfo { tokens: 81 }]).unwrap();
    assert_eq!(s.total_samples(), 10);
}

#[test]
fn output_dtypes() {
    for (name, d, size) in [
        ("u16", OutputDType::U16, 2),
        ("i32", OutputDType::I32, 4),
        ("i64", OutputDType::I64, 8),
    ] {
        let json = format!(
            r#"{{"sources": [{{"uri": "a"}}], "seq_len": 1, "batch_size": 1, "output": "{name}"}}"#
        );
        let p = Plan::from_json(&json).unwrap();
        assert_eq!(p.output, d);
        assert_eq!(d.itemsize(), size);
        assert_eq!(d.to_string(), name);
    }
}

#[test]
fn cursor_serde() {
    // A plain cursor is Megatron's two numbers; the optional parts appear only when set.
    let c = Cursor::new(2, 4096);
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(json, r#"{"epoch":2,"consumed_samples":4096}"#);
    assert_eq!(serde_json::from_str::<Cursor>(&json).unwrap(), c);
    assert_eq!(
        toml::from_str::<Cursor>(&toml::to_string(&c).unwrap()).unwrap(),
        c
    );
    let full = Cursor {
        blend: vec![1000, 3094],
        delivered: vec![4095, 4097],
        ..c
    };
    let json = serde_json::to_string(&full).unwrap();
    assert_eq!(
        json,
        r#"{"epoch":2,"consumed_samples":4096,"blend":[1000,3094],"delivered":[4095,4097]}"#
    );
    assert_eq!(serde_json::from_str::<Cursor>(&json).unwrap(), full);
    assert_eq!(full.watermark(), Some(4094));
    assert!(serde_json::from_str::<Cursor>(r#"{"consumed_samples":1,"step":3}"#).is_err());
}

fn json_err(body: &str) -> String {
    let text = format!(r#"{{"sources": [{{"uri": "a"}}], "seq_len": 8, "batch_size": 2{body}}}"#);
    Plan::from_json(&text).unwrap_err().to_string()
}

fn invalid(f: impl FnOnce(&mut Plan)) -> String {
    common::invalid(full_plan(), f)
}

#[test]
fn validation_names_the_field() {
    assert_eq!(
        invalid(|p| p.sources[1].weight = -0.5),
        "sources[1].weight: must be a finite number > 0 (got -0.5)"
    );
    assert_eq!(
        invalid(|p| p.sources[0].weight = 0.0),
        "sources[0].weight: must be a finite number > 0 (got 0)"
    );
    assert_eq!(
        invalid(|p| p.sources[2].weight = f64::INFINITY),
        "sources[2].weight: must be a finite number > 0 (got inf)"
    );
    assert_eq!(
        invalid(|p| p.sources.clear()),
        "sources: at least one source is required"
    );
    assert_eq!(
        invalid(|p| p.sources[1].uri = " ".into()),
        "sources[1].uri: must not be empty"
    );
    assert_eq!(
        invalid(|p| p.sources[2].dtype = Some("u17".into())),
        "sources[2].dtype: unknown dtype 'u17' (expected one of u8, i8, i16, u16, i32, i64, f32, f64)"
    );
    assert_eq!(
        invalid(|p| p.sources[0].eod = Some(0)),
        "sources[0].eod: only applies to raw token files, which need a dtype"
    );
    assert_eq!(invalid(|p| p.seq_len = 0), "seq_len: must be at least 1");
    assert_eq!(
        invalid(|p| p.batch_size = 0),
        "batch_size: must be at least 1"
    );
    assert_eq!(
        invalid(|p| p.epochs = Some(2)),
        "epochs and samples: give at most one"
    );
    assert_eq!(
        invalid(|p| (p.epochs, p.samples) = (Some(0), None)),
        "epochs: must be at least 1"
    );
    assert_eq!(
        invalid(|p| p.samples = Some(0)),
        "samples: must be at least 1"
    );
    assert_eq!(invalid(|p| p.rank = 8), "rank: 8 is not below world 8");
    assert_eq!(
        invalid(|p| (p.rank, p.world) = (4, 4)),
        "rank: 4 is not below world 4"
    );
    assert_eq!(
        invalid(|p| (p.rank, p.world) = (0, 0)),
        "world: must be at least 1"
    );
    assert_eq!(
        invalid(|p| p.wire_codec = "u17".into()),
        "wire_codec: invalid codec 'u17': expected u8, u16, u24, u32, i32, i64 or bits:N (N in 1..=32)"
    );
    assert_eq!(
        invalid(|p| p.wire_codec = "auto+gzip".into()),
        "wire_codec: invalid codec 'gzip': expected none, lz4, lz4hc:LEVEL, zstd or zstd:LEVEL (or rank+zstd:LEVEL in storage, stream:LEVEL on the wire)"
    );
    for codec in ["u24+rank+zstd:19", "auto+rank+zstd:3"] {
        assert_eq!(
            invalid(|p| p.wire_codec = codec.into()),
            format!("wire_codec: invalid codec '{codec}': rank+zstd is a storage codec (it needs the dataset's rank table); use zstd:LEVEL on the wire")
        );
    }
    for codec in ["u16+lz4hc:9", "auto+lz4hc"] {
        assert_eq!(
            invalid(|p| p.wire_codec = codec.into()),
            format!("wire_codec: invalid codec '{codec}': lz4hc is a storage codec (its parser writes 10-50 MB/s a core); use lz4 on the wire, which the same decoder reads")
        );
    }
    assert_eq!(
        invalid(|p| p.wire_codec = "bits:33".into()),
        "wire_codec: invalid codec 'bits:33': N in bits:N must be an integer in 1..=32"
    );
}

#[test]
fn boundary_fields_agree() {
    assert_eq!(
        invalid(|p| p.boundaries = None),
        "position_ids: needs boundaries = \"eod\" (with eod = ID) or boundaries = \"documents\""
    );
    assert_eq!(
        invalid(|p| (p.boundaries, p.position_ids, p.loss_mask) = (None, false, false)),
        "cu_seqlens: needs boundaries = \"eod\" (with eod = ID) or boundaries = \"documents\""
    );
    assert_eq!(
        invalid(|p| p.eod = None),
        "boundaries: \"eod\" needs the end-of-document token: eod = ID"
    );
    assert_eq!(
        invalid(|p| p.boundaries = Some(Boundaries::Documents)),
        "eod: only applies with boundaries = \"eod\" (\"documents\" takes the starts from the index)"
    );
    assert_eq!(
        invalid(|p| {
            p.boundaries = None;
            (p.position_ids, p.loss_mask, p.cu_seqlens) = (false, false, false);
        }),
        "eod: only applies with boundaries = \"eod\""
    );
    // Each mode, as a person writes it.
    let toml = r#"
        seq_len = 8
        batch_size = 2
        boundaries = "documents"
        loss_mask = true
        [[sources]]
        uri = "a"
    "#;
    let p = Plan::from_toml(toml).unwrap();
    assert_eq!(p.boundaries, Some(Boundaries::Documents));
    assert!(p.loss_mask && !p.position_ids && !p.cu_seqlens);
    assert_eq!(
        json_err(r#", "boundaries": "eos""#),
        "plan: unknown variant `eos`, expected `eod` or `documents` at line 1 column 78"
    );
    // A plan without boundaries serializes as it did before they existed.
    let plain = common::plan(&[1.0], 8, 2);
    assert!(!plain.to_json().contains("boundaries"));
    assert!(!plain.to_toml().unwrap().contains("loss_mask"));
    // The trailer bound: the document section (8 + 2 × ⌈8 / 8⌉ bytes, padded) and no cursor
    // counts for one source.
    assert_eq!(p.trailer_bound(), 16);
    assert_eq!(plain.trailer_bound(), 0);
}

#[test]
fn wire_codecs_accepted() {
    // (as written, as displayed): `zstd` means zstd:3.
    for (c, canonical) in [
        ("auto", "auto"),
        ("auto+zstd:3", "auto+zstd:3"),
        ("auto+zstd:-5", "auto+zstd:-5"),
        ("auto+lz4", "auto+lz4"),
        ("auto+zstd", "auto+zstd:3"),
        ("u16", "u16"),
        ("bits:17", "bits:17"),
        ("u24+zstd:19", "u24+zstd:19"),
        ("i32+lz4", "i32+lz4"),
        ("transport", "auto+stream:5"),
        ("auto+stream:1", "auto+stream:1"),
        ("u24+stream", "u24+stream:5"),
    ] {
        let mut p = full_plan();
        p.wire_codec = c.into();
        p.validate().unwrap_or_else(|e| panic!("{c}: {e}"));
        let parsed = p.parsed_wire_codec().unwrap();
        assert_eq!(parsed.to_string(), canonical);
        assert_eq!(canonical.parse::<WireCodec>().unwrap(), parsed);
    }
    assert_eq!(
        "auto+lz4".parse::<WireCodec>().unwrap(),
        WireCodec::Auto(Compression::Lz4)
    );
    assert_eq!(
        "auto".parse::<WireCodec>().unwrap(),
        WireCodec::Auto(Compression::None)
    );
    assert_eq!(
        "u16+zstd:3".parse::<WireCodec>().unwrap(),
        WireCodec::Fixed(Codec::new(Width::U16, Compression::Zstd(3)))
    );
    // Where a reader may not see every record from the first: each compressed alone.
    let alone = |s: &str| s.parse::<WireCodec>().unwrap().without_stream().to_string();
    assert_eq!(alone("transport"), "auto+zstd:5");
    assert_eq!(alone("bits:17+stream:2"), "bits:17+zstd:2");
    assert_eq!(alone("auto+lz4"), "auto+lz4");
}

#[test]
fn text_errors_have_line_and_column() {
    assert_eq!(
        json_err(r#", "bogus": 1"#),
        "plan: unknown field `bogus`, expected one of `sources`, `seq_len`, `batch_size`, \
         `seed`, `shuffle`, `epochs`, `samples`, `output`, `wire_codec`, `rank`, `world`, \
         `drop_last`, `boundaries`, `eod`, `position_ids`, `loss_mask`, `cu_seqlens`, \
         `provenance`, `stages`, `interpolate`, `when_exhausted` at line 1 column 66"
    );
    assert_eq!(
        Plan::from_json(r#"{"sources": [{"uri": "a", "wieght": 2}], "seq_len": 1, "batch_size": 1}"#)
            .unwrap_err()
            .to_string(),
        "plan: unknown field `wieght`, expected one of `uri`, `weight`, `dtype`, `eod`, `max_epochs`, `max_samples` at line 1 column 34"
    );
    assert_eq!(
        Plan::from_json("{\n  \"seq_len\": 1,\n  \"batch_size\": 2 x}")
            .unwrap_err()
            .to_string(),
        "plan: expected `,` or `}` at line 3 column 19"
    );
    assert_eq!(
        Plan::from_json(r#"{"seq_len": 1, "batch_size": 1}"#)
            .unwrap_err()
            .to_string(),
        "plan: missing field `sources` at line 1 column 31"
    );
    assert_eq!(
        json_err(r#", "output": "u8""#),
        "plan: unknown variant `u8`, expected one of `u16`, `i32`, `i64` at line 1 column 73"
    );
    assert_eq!(
        json_err(r#", "seq_len": -1"#)
            .split(" at line")
            .next()
            .unwrap(),
        "plan: duplicate field `seq_len`"
    );
    // Validation runs after parsing.
    assert_eq!(
        json_err(r#", "world": 2, "rank": 2"#),
        "rank: 2 is not below world 2"
    );

    assert_eq!(
        Plan::from_toml("seq_len = 1\nbatch_size = 1\nbogus = 2\n[[sources]]\nuri = \"a\"\n")
            .unwrap_err()
            .to_string(),
        "plan: TOML parse error at line 3, column 1\n  |\n3 | bogus = 2\n  | ^^^^^\n\
         unknown field `bogus`, expected one of `sources`, `seq_len`, `batch_size`, `seed`, \
         `shuffle`, `epochs`, `samples`, `output`, `wire_codec`, `rank`, `world`, `drop_last`, \
         `boundaries`, `eod`, `position_ids`, `loss_mask`, `cu_seqlens`, `provenance`, `stages`, \
         `interpolate`, `when_exhausted`\n"
    );
    assert_eq!(
        Plan::from_toml("seq_len = 1\nbatch_size = 1\n[[sources]]\nuri = \"a\"\nwieght = 1\n")
            .unwrap_err()
            .to_string(),
        "plan: TOML parse error at line 5, column 1\n  |\n5 | wieght = 1\n  | ^^^^^^\n\
         unknown field `wieght`, expected one of `uri`, `weight`, `dtype`, `eod`, `max_epochs`, \
         `max_samples`\n"
    );
    assert_eq!(
        Plan::from_toml("seq_len = \nbatch_size = 1\n")
            .unwrap_err()
            .to_string(),
        "plan: TOML parse error at line 1, column 11\n  |\n1 | seq_len = \n  |           ^\n\
         string values must be quoted, expected literal string\n"
    );
    assert_eq!(
        Plan::from_toml("seq_len = 1\nbatch_size = 1\n[[sources]]\nuri = \"a\"\nweight = -0.5\n")
            .unwrap_err()
            .to_string(),
        "sources[0].weight: must be a finite number > 0 (got -0.5)"
    );
}

#[test]
fn toml_cannot_hold_every_u64() {
    let mut p = full_plan();
    p.seed = u64::MAX;
    assert_eq!(
        p.to_toml().unwrap_err().to_string(),
        "seed: 18446744073709551615 does not fit in a TOML integer (at most 9223372036854775807)"
    );
    assert_eq!(Plan::from_json(&p.to_json()).unwrap(), p);
}

#[test]
fn token_counts_are_checked_by_name() {
    let mut p = full_plan();
    p.seq_len = 8;
    let err = |p: &Plan, tokens: &[u64]| {
        Schedule::new(p, &common::infos(tokens))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&p, &[100, 8, 100]),
        "sources[1]: dquant://storage-1:7070/code has 8 tokens, fewer than seq_len + 1 = 9"
    );
    assert_eq!(
        err(&p, &[100, 100]),
        "sources: the plan has 3 sources but 2 token counts were given"
    );
    assert!(Schedule::new(&p, &common::infos(&[9, 9, 9])).is_ok());
    p.samples = None;
    p.epochs = Some(u32::MAX);
    assert_eq!(
        err(&p, &[u64::MAX, u64::MAX / 2, 9]),
        "epochs: 4294967295 epochs of 3458764513820540927 samples is more than 2^64 - 1"
    );
}
