//! Where the offload path's CPU time goes, stage by stage, timed on one thread in this
//! process: the agent's producer step (`dquant-agent`'s `produce.rs`) made with the engine's
//! own pieces (`Pipeline`, the output check of `Pipeline::next_batch_checked`,
//! `RecordEncoder::encode`, `encode_width` into frames), then the source read underneath the
//! pipeline peeled layer by layer. The tables and JSON are made by
//! [`breakdown`].
//!
//! Not modelled: when the wire codec is the output dtype's plain codec and the dataset stores
//! that dtype (a uint16 dataset sent as `u16`), the agent reads stored bytes straight into
//! the record (`Pipeline::next_batch_into`) and never decodes them to u32; the pipeline pass
//! here decodes them (`Pipeline::next_batch`).

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dquant_codec::{encode_width, Width};
use dquant_engine::record::{Payload, Record};
use dquant_engine::{check_fits, LocalSource, Pipeline, RecordEncoder, TokenSource};
use dquant_plan::{Cursor, Source, WireCodec};
use dquant_remote::open_source;
use dquant_storage::{Dataset, OpenOptions, ReadBuffers};
use dquant_transport::frame::MAX_PAYLOAD;
use dquant_transport::{FrameHeader, FrameKind};

use crate::procs;
use crate::report::{f, Table};
use crate::{DataSpec, PlanOpts};
use serde_json::json;

const EXAMPLES: &str = "\
Examples:
  dquant-offload-bench breakdown /data/zipf1g_u16
  dquant-offload-bench breakdown /data/zipf1g_u16 --shuffle --samples 65536 --json";

/// Where the offload path's CPU goes, stage by stage, on one thread.
///
/// Times each stage of the offload path on one thread, over the same plan the throughput
/// bench runs: the pipeline (source reads, per-sample copies), the output range check, the
/// engine's record encoder (codec choice, wire range check, encode), the encode or copy into
/// 1 MiB frames and their crc32c, and the consumer's copy out of frames; then the source read
/// alone, the dataset read alone and a bare pread of the same bytes, so the pipeline's own
/// share can be told from the storage layer's. Socket costs are not here: the throughput
/// bench's plain copy measures those.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(flatten)]
    pub plan: PlanOpts,
    /// Shuffle the plan (default: stored order).
    #[arg(long)]
    pub shuffle: bool,
    /// Do not read the dataset once beforehand to bring it into the page cache.
    #[arg(long)]
    pub no_warm: bool,
    /// Measure everything this many times; each stage reports its fastest (the machine is
    /// shared: the minimum is the least disturbed).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    #[command(flatten)]
    pub out: crate::report::JsonOpts,
}

/// Each stage's time: the fastest over the measurements ([`Stages::min`]).
#[derive(Default)]
pub(crate) struct Stages {
    pub pipeline: Duration,
    /// `check_fits` for the output dtype, where `Pipeline::next_batch_checked` makes it (zero
    /// when the sources' bound proves it cannot fail: see [`Volume::checked_output`]).
    pub check_out: Duration,
    /// `RecordEncoder::encode`: codec choice, wire check (when needed) and encode.
    pub record: Duration,
    /// `encode_width` of `Payload::Plain` tokens into the frames.
    pub frame_encode: Duration,
    /// Record headers and `Payload::Bytes` copied into the frames.
    pub frame_copy: Duration,
    pub frame_crc: Duration,
    pub client_copy: Duration,
    pub source: Duration,
    pub dataset: Duration,
    pub pread: Duration,
    pub pread_random: Duration,
    pub pread_span: Option<Duration>,
}

/// 1 MiB frames filled as `FrameSink::write` and `FrameSink::write_encoded` do; each full one
/// gets its crc computed as `FrameWriter::send` does.
struct Frames {
    buf: Vec<u8>,
    /// Bytes of `buf` filled.
    len: usize,
    /// Bytes written in all.
    written: u64,
    copy: Duration,
    encode: Duration,
    crc: Duration,
}

impl Frames {
    fn new() -> Self {
        Frames {
            buf: vec![0; MAX_PAYLOAD],
            len: 0,
            written: 0,
            copy: Duration::ZERO,
            encode: Duration::ZERO,
            crc: Duration::ZERO,
        }
    }

    fn write(&mut self, mut b: &[u8]) -> Result<()> {
        while !b.is_empty() {
            let t = Instant::now();
            let k = (MAX_PAYLOAD - self.len).min(b.len());
            self.buf[self.len..self.len + k].copy_from_slice(&b[..k]);
            self.len += k;
            self.written += k as u64;
            b = &b[k..];
            self.copy += t.elapsed();
            if self.len == MAX_PAYLOAD {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// `tokens` encoded at the byte-aligned `width` straight into the frames; a token that
    /// straddles two frames is encoded aside and its bytes split.
    fn write_encoded(&mut self, width: Width, mut tokens: &[u32]) -> Result<()> {
        let bw = width
            .byte_width()
            .context("Payload::Plain has a byte-aligned width")?;
        while !tokens.is_empty() {
            let t = Instant::now();
            let k = ((MAX_PAYLOAD - self.len) / bw).min(tokens.len());
            if k == 0 {
                let mut one = [0u8; 8];
                encode_width(width, &tokens[..1], &mut one[..bw])?;
                self.encode += t.elapsed();
                self.write(&one[..bw])?;
                tokens = &tokens[1..];
                continue;
            }
            encode_width(
                width,
                &tokens[..k],
                &mut self.buf[self.len..self.len + k * bw],
            )?;
            self.len += k * bw;
            self.written += (k * bw) as u64;
            tokens = &tokens[k..];
            self.encode += t.elapsed();
            if self.len == MAX_PAYLOAD {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let t = Instant::now();
        let h = FrameHeader::for_payload(FrameKind::Data, 0, &self.buf[..self.len])?;
        std::hint::black_box(h);
        self.len = 0;
        self.crc += t.elapsed();
        Ok(())
    }
}

impl Stages {
    /// Stage by stage, the smaller of two measurements.
    fn min(self, o: Stages) -> Stages {
        Stages {
            pipeline: self.pipeline.min(o.pipeline),
            check_out: self.check_out.min(o.check_out),
            record: self.record.min(o.record),
            frame_encode: self.frame_encode.min(o.frame_encode),
            frame_copy: self.frame_copy.min(o.frame_copy),
            frame_crc: self.frame_crc.min(o.frame_crc),
            client_copy: self.client_copy.min(o.client_copy),
            source: self.source.min(o.source),
            dataset: self.dataset.min(o.dataset),
            pread: self.pread.min(o.pread),
            pread_random: self.pread_random.min(o.pread_random),
            pread_span: match (self.pread_span, o.pread_span) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            },
        }
    }
}

/// What one measurement streamed.
pub(crate) struct Volume {
    pub tokens: u64,
    pub out_bytes: u64,
    pub wire_bytes: u64,
    /// Whether the output check ran: `Pipeline::next_batch_checked` skips it when the
    /// sources' bound proves every token fits the output dtype.
    pub checked_output: bool,
}

pub fn run(a: &Args) -> Result<()> {
    let ds = a.plan.dataset()?;
    if a.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    if !a.no_warm {
        procs::warm_file(&ds.bin())?;
        procs::warm_file(&ds.idx())?;
    }
    let (mut st, v) = measure(a, &ds)?;
    for _ in 1..a.repeats {
        st = st.min(measure(a, &ds)?.0);
    }
    breakdown(a, &ds, &st, &v)
}

/// All passes once.
fn measure(a: &Args, ds: &DataSpec) -> Result<(Stages, Volume)> {
    let plan = a.plan.plan(&ds.local(), a.shuffle);
    let wire: WireCodec = plan.wire_codec.parse()?;
    let width = plan.output.width();
    let item = a.plan.output_itemsize() as usize;
    let mut st = Stages::default();

    // Pass 0, untimed: the same stream once, so every pass below finds the same warm state
    // (page cache, allocations) and none pays for being first.
    let mut pipeline = Pipeline::open(&plan, Cursor::START, |_, s| open_source(s, None, ""))?;
    while pipeline.next_batch()?.is_some() {}

    // Pass 1: the agent's producer step, stage by stage, and the consumer's copy.
    let mut pipeline = Pipeline::open(&plan, Cursor::START, |_, s| open_source(s, None, ""))?;
    let l = pipeline.sample_len();
    let bound = pipeline.max_token_bound();
    // As `Pipeline::next_batch_checked`: no check when the sources' bound proves it.
    let checked_output = bound > width.max_token();
    let mut encoder = RecordEncoder::new(wire, bound);
    let mut starts: Vec<Vec<u64>> = Vec::new();
    let mut frames = Frames::new();
    let mut record_bytes = 0u64;
    // The payload's bytes as the consumer finds them in the frames (made untimed).
    let mut received: Vec<u8> = Vec::new();
    let mut batch_buf: Vec<u8> = Vec::new();
    let (mut tokens, mut out_bytes, mut wire_bytes) = (0u64, 0u64, 0u64);
    loop {
        let t = Instant::now();
        let Some(b) = pipeline.next_batch()? else {
            break;
        };
        st.pipeline += t.elapsed();
        starts.push(b.provenance.iter().map(|&(_, s)| s).collect());

        if checked_output {
            let t = Instant::now();
            check_fits(&b, l, width, "")?;
            st.check_out += t.elapsed();
        }

        let t = Instant::now();
        let Record { header, payload } = encoder.encode(&b, l)?;
        st.record += t.elapsed();

        let h = header.encode();
        frames.write(&h)?;
        let payload_len = header.payload_len as usize;
        record_bytes += (h.len() + payload_len) as u64;
        let wire_payload: &[u8] = match payload {
            Payload::Bytes(p) => {
                frames.write(p)?;
                p
            }
            Payload::Plain { width, tokens } => {
                frames.write_encoded(width, tokens)?;
                received.resize(payload_len, 0);
                encode_width(width, tokens, &mut received)?;
                &received
            }
        };

        // The consumer: a plain wire codec in the output dtype is copied straight from the
        // frame into the batch buffer (`Reader::fill`, `direct`).
        let t = Instant::now();
        batch_buf.resize(b.tokens.len() * item, 0);
        if wire_payload.len() == batch_buf.len() {
            batch_buf.copy_from_slice(wire_payload);
        } else {
            bail!("breakdown models only plain wire codecs in the output dtype (e.g. u16 → u16)");
        }
        std::hint::black_box(&batch_buf);
        st.client_copy += t.elapsed();

        tokens += b.tokens.len() as u64;
        out_bytes += (b.tokens.len() * item) as u64;
        wire_bytes += payload_len as u64;
    }
    frames.flush()?;
    ensure!(
        frames.written == record_bytes,
        "the frames got {} bytes, the records are {record_bytes}",
        frames.written
    );
    st.frame_copy = frames.copy;
    st.frame_encode = frames.encode;
    st.frame_crc = frames.crc;
    if tokens == 0 {
        bail!("the plan yields no tokens");
    }

    // Pass 2: the same sample ranges through the plan's source (`LocalSource::read_ranges`,
    // straight into a batch-sized buffer, as the pipeline does for a single source).
    let src = Source::new(ds.local());
    let mut source = LocalSource::open(std::path::Path::new(&ds.local()), &src)?;
    let mut ranges = Vec::new();
    let mut out: Vec<u32> = Vec::new();
    for s in &starts {
        ranges.clear();
        ranges.extend(s.iter().map(|&x| x..x + l as u64));
        out.resize(s.len() * l, 0);
        let t = Instant::now();
        source.read_ranges(&ranges, &mut out)?;
        st.source += t.elapsed();
    }
    drop(source);

    // Pass 3: `Dataset::read_into` of each range (pread, then decode to u32 in place).
    let dataset = Dataset::open(std::path::Path::new(&ds.local()), &OpenOptions::default())?;
    let mut bufs = ReadBuffers::new();
    out.resize(l, 0);
    for s in &starts {
        let t = Instant::now();
        for &x in s {
            dataset.read_into(x..x + l as u64, &mut out, &mut bufs)?;
        }
        st.dataset += t.elapsed();
    }

    // Pass 4: a bare pread of the same bytes of the .bin.
    let bin = std::fs::File::open(ds.bin())?;
    let stored_item = (bin.metadata()?.len() / dataset.tokens().max(1)) as usize;
    let mut raw = vec![0u8; l * stored_item];
    for s in &starts {
        let t = Instant::now();
        for &x in s {
            bin.read_exact_at(&mut raw, x * stored_item as u64)?;
        }
        st.pread += t.elapsed();
    }
    std::hint::black_box(&raw);

    // Pass 5 (what-if): the same preads on a descriptor with POSIX_FADV_RANDOM, which turns
    // off the kernel's readahead bookkeeping for it.
    let bin_random = std::fs::File::open(ds.bin())?;
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid fd; fadvise only changes caching behaviour.
        let r =
            unsafe { libc::posix_fadvise(bin_random.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        if r != 0 {
            bail!(
                "posix_fadvise(RANDOM): {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
    }
    for s in &starts {
        let t = Instant::now();
        for &x in s {
            bin_random.read_exact_at(&mut raw, x * stored_item as u64)?;
        }
        st.pread_random += t.elapsed();
    }

    // Pass 6 (what-if): one pread per batch when its samples are adjacent in the file (an
    // unshuffled plan: sample k+1 starts seq_len tokens after sample k).
    let adjacent = starts
        .iter()
        .all(|s| s.windows(2).all(|w| w[1] == w[0] + (l as u64 - 1)));
    if adjacent {
        let mut span = Vec::new();
        let mut d = Duration::ZERO;
        for s in &starts {
            let tokens = (s.len() - 1) * (l - 1) + l;
            span.resize(tokens * stored_item, 0u8);
            let t = Instant::now();
            bin.read_exact_at(&mut span, s[0] * stored_item as u64)?;
            d += t.elapsed();
        }
        std::hint::black_box(&span);
        st.pread_span = Some(d);
    }

    Ok((
        st,
        Volume {
            tokens,
            out_bytes,
            wire_bytes,
            checked_output,
        },
    ))
}

/// The breakdown's tables (or JSON): each stage's time per token and per GB of output, the
/// producer thread's total, and the differences of the source passes.
fn breakdown(a: &Args, ds: &DataSpec, st: &Stages, v: &Volume) -> Result<()> {
    let Volume {
        tokens,
        out_bytes,
        wire_bytes,
        checked_output,
    } = *v;
    let producer = st.pipeline + st.check_out + st.record + st.frame_encode + st.frame_copy;
    let check_out = if checked_output {
        "check_fits for the output dtype (Pipeline::next_batch_checked)"
    } else {
        "check_fits for the output dtype: skipped, the sources' bound fits it"
    };
    let rows: Vec<(&str, &str, Duration)> = vec![
        ("producer", "Pipeline::next_batch (all of it)", st.pipeline),
        (
            "producer",
            "  of which: LocalSource::read_ranges (pass 2)",
            st.source,
        ),
        (
            "producer",
            "    of which: Dataset::read_into per sample (pass 3)",
            st.dataset,
        ),
        (
            "producer",
            "      of which: pread of the stored bytes (pass 4)",
            st.pread,
        ),
        (
            "what-if",
            "pass 4 with POSIX_FADV_RANDOM on the fd",
            st.pread_random,
        ),
        ("producer", check_out, st.check_out),
        (
            "producer",
            "codec choice + wire check + encode (RecordEncoder::encode)",
            st.record,
        ),
        (
            "producer",
            "encode_width into 1 MiB frames (Payload::Plain)",
            st.frame_encode,
        ),
        (
            "producer",
            "FrameSink copy into 1 MiB frames (headers, Payload::Bytes)",
            st.frame_copy,
        ),
        ("producer", "= producer thread total", producer),
        (
            "sender",
            "crc32c of each frame (FrameWriter::send)",
            st.frame_crc,
        ),
        (
            "consumer",
            "copy frame → batch buffer (Reader::fill)",
            st.client_copy,
        ),
    ];
    let mut rows = rows;
    if let Some(d) = st.pread_span {
        rows.insert(
            5,
            (
                "what-if",
                "pass 4 as one pread per batch (adjacent samples)",
                d,
            ),
        );
    }
    let derived: Vec<(&str, Duration)> = vec![
        (
            "Pipeline own work: schedule, bookkeeping, any gather copy",
            st.pipeline.saturating_sub(st.source),
        ),
        (
            "LocalSource loop around Dataset::read_into",
            st.source.saturating_sub(st.dataset),
        ),
        (
            "Dataset::read_into after the pread: decode stored dtype → u32",
            st.dataset.saturating_sub(st.pread),
        ),
    ];
    let gb = out_bytes as f64 / 1e9;
    let ns_tok = |d: Duration| d.as_secs_f64() * 1e9 / tokens as f64;
    {
        let j = |(side, what, d): &(&str, &str, Duration)| {
            json!({"side": side, "stage": what.trim(), "seconds": d.as_secs_f64(),
                   "ns_per_token": ns_tok(*d), "cpu_s_per_gb": d.as_secs_f64() / gb})
        };
        let out = json!({
            "bench": "breakdown", "dataset": ds.local(), "plan": a.plan.describe(),
            "shuffle": a.shuffle, "repeats": a.repeats, "tokens": tokens, "output_bytes": out_bytes, "wire_bytes": wire_bytes,
            "stages": rows.iter().map(j).collect::<Vec<_>>(),
            "derived": derived.iter().map(|(w, d)| json!({"stage": w, "seconds": d.as_secs_f64(),
                "ns_per_token": ns_tok(*d), "cpu_s_per_gb": d.as_secs_f64() / gb})).collect::<Vec<_>>(),
            "producer_bound_gb_per_s": gb / producer.as_secs_f64(),
        });
        if a.out.emit(&out)? {
            return Ok(());
        }
    }
    println!(
        "dataset {}; plan: {}, shuffle={}; {:.2} G tokens, {:.3} GB of output payload",
        ds.local(),
        a.plan.describe(),
        a.shuffle,
        tokens as f64 / 1e9,
        gb
    );
    println!(
        "one thread; each stage the fastest of {} measurements; CPU s/GB is per GB (1e9 bytes) of output payload\n",
        a.repeats
    );
    let mut t = Table::new(&["side", "stage", "s", "ns/token", "CPU s/GB", "alone GB/s"]).left(2);
    for (side, what, d) in &rows {
        t.row(vec![
            side.to_string(),
            what.to_string(),
            f(d.as_secs_f64(), 3),
            f(ns_tok(*d), 3),
            f(d.as_secs_f64() / gb, 3),
            if d.is_zero() {
                "-".into()
            } else {
                f(gb / d.as_secs_f64(), 2)
            },
        ]);
    }
    t.print();
    println!();
    let mut t = Table::new(&[
        "derived (differences of the passes)",
        "s",
        "ns/token",
        "CPU s/GB",
    ]);
    for (what, d) in &derived {
        t.row(vec![
            what.to_string(),
            f(d.as_secs_f64(), 3),
            f(ns_tok(*d), 3),
            f(d.as_secs_f64() / gb, 3),
        ]);
    }
    t.print();
    println!(
        "\nthe producer thread alone could deliver {:.2} GB/s of payload (before any socket cost)",
        gb / producer.as_secs_f64()
    );
    Ok(())
}
