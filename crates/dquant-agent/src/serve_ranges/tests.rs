//! Range answers in a stream codec: zstd alone, at a level fitted to the link.

use super::*;
use crate::stream_level::FLOOR;
use dquant_engine::LocalSource;
use dquant_plan::Source;
use dquant_transport::RangeHeader;

/// Answers collected as (header, payload).
#[derive(Default)]
struct Collect(Vec<(RangeHeader, Vec<u8>)>);

impl RecordOut for Collect {
    fn put(&mut self, head: &[u8; RECORD_HEADER_LEN], payload: &[u8]) -> Result<bool, RangeError> {
        self.0
            .push((RangeHeader::parse(head).unwrap(), payload.to_vec()));
        Ok(true)
    }
}

/// Ranges asked for in the transport codec are compressed alone, at a zstd level that
/// steps down a window at a time while the writer waited for nothing, and back up to the
/// stream's own while it waited on the link; each answer names its level and decodes to
/// the range's tokens.
#[test]
fn a_stream_codecs_ranges_follow_the_links_waits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.u16");
    let tokens: Vec<u16> = (0..40_000u32).map(|i| (i * 7919 % 30_000) as u16).collect();
    std::fs::write(
        &path,
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let mut source = Source::new(path.display().to_string());
    source.dtype = Some("u16".into());
    let wire: WireCodec = "transport".parse().unwrap();
    let mut ds = Ranges {
        source: Box::new(LocalSource::open(&path, &source).unwrap()),
        name: "t".into(),
        wire: wire.without_stream(),
        total: tokens.len() as u64,
        max_len: 1 << 20,
        enc: Encoders::default(),
        tokens: Vec::new(),
        payload: Vec::new(),
        spare: Vec::new(),
        level: Some(StreamLevel::deciding_every(5, RANGE_WINDOW)),
    };
    let mut out = Collect::default();
    let mut stats = Stats::default();
    let w = RANGE_WINDOW as usize;
    for i in 0..12 * w {
        let start = (i as u64 * 1000) % 39_000;
        assert!(ds.answer(&[(start, 1000)], &mut out, &mut stats).unwrap());
        ds.fit_level(Some(if i < 6 * w { 0.0 } else { 0.9 }));
    }
    let levels: Vec<i32> = out
        .0
        .iter()
        .map(|(h, _)| h.codec.compression.zstd_level().unwrap())
        .collect();
    // Alone: zstd, not a stream.
    assert!(out.0.iter().all(|(h, _)| !h.codec.compression.is_stream()));
    assert_eq!(&levels[..w], &vec![5; w][..]);
    assert_eq!(levels[5 * w], FLOOR, "{levels:?}");
    assert_eq!(*levels.last().unwrap(), 5, "{levels:?}");
    let mut d = dquant_codec::Decoder::new();
    for (h, p) in &out.0 {
        let mut got = vec![0u32; h.len as usize];
        d.decode(h.codec, p, &mut got).unwrap();
        let want = &tokens[h.start as usize..(h.start + h.len) as usize];
        assert!(got.iter().zip(want).all(|(&a, &b)| a == u32::from(b)));
    }
    // A ring's answers (no waits to go by) keep the level.
    let before = ds.wire;
    ds.fit_level(None);
    assert_eq!(ds.wire, before);
}
