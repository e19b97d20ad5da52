//! Plain-text tables and number formatting, and the reports of the scenarios that return
//! their measurements ([`breakdown`]).

use std::path::PathBuf;

use anyhow::{Context, Result};

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
