//! Plain-text tables and number formatting, and the reports of the scenarios that return
//! their measurements ([`breakdown`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::DataSpec;

/// Where results go besides the tables.
#[derive(clap::Args, Debug, Clone)]
pub struct JsonOpts {
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON to this file (tables still go to stdout).
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
}

impl JsonOpts {
    /// Writes `v` where asked; true when it went to stdout (no tables wanted).
    pub fn emit(&self, v: &serde_json::Value) -> Result<bool> {
        let text = serde_json::to_string_pretty(v)?;
        if let Some(p) = &self.json_out {
            std::fs::write(p, format!("{text}\n"))
                .with_context(|| format!("writing {}", p.display()))?;
        }
        if self.json {
            println!("{text}");
        }
        Ok(self.json)
    }
}

/// A table printed with aligned columns: the first `left` columns (default 1) left-aligned,
/// the rest right-aligned.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    left: usize,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            left: 1,
        }
    }

    /// Left-aligns the first `k` columns.
    pub fn left(mut self, k: usize) -> Self {
        self.left = k;
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        let n = self.headers.len();
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.len());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate().take(n) {
                if i > 0 {
                    s.push_str("  ");
                }
                if i < self.left {
                    s.push_str(&format!("{c:<width$}", width = w[i]));
                } else {
                    s.push_str(&format!("{c:>width$}", width = w[i]));
                }
            }
            println!("{}", s.trim_end());
        };
        line(&self.headers);
        println!(
            "{}",
            w.iter()
                .map(|&k| "-".repeat(k))
                .collect::<Vec<_>>()
                .join("  ")
        );
        for r in &self.rows {
            line(r);
        }
    }
}

/// `x` with `d` decimals.
pub fn f(x: f64, d: usize) -> String {
    format!("{x:.d$}")
}

/// MiB from KiB.
pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// Milliseconds.
pub fn ms(s: f64) -> String {
    format!("{:.1}", s * 1e3)
}

/// The median of `xs`: the middle value, or the mean of the two middle values for an even
/// count; NaN for none.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Min, median and max of `xs` (which must not be empty). The middle value is the upper of
/// the two middle values for an even count.
pub fn spread(xs: &[f64]) -> (f64, f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// The breakdown's tables (or JSON): each stage's time per token and per GB of output, the
/// producer thread's total, and the differences of the source passes.
pub fn breakdown(
    a: &crate::breakdown::Args,
    ds: &DataSpec,
    st: &crate::breakdown::Stages,
    v: &crate::breakdown::Volume,
) -> Result<()> {
    let crate::breakdown::Volume {
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
