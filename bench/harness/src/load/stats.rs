//! The load benchmark's pure parts: Jain's fairness index, the agent's memory and thread
//! bounds from its config, and the parsers of what it reads (`/proc/PID/status`, Prometheus
//! text). Unit-tested below.

use std::collections::BTreeMap;

/// Jain's fairness index of `xs`: `(Σx)² / (n · Σx²)`. 1 when every value is equal, `1/n`
/// when one value has everything; NaN for no values or all zeros (nothing to be fair about).
pub fn jain(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        return f64::NAN;
    }
    sum * sum / (n * sq)
}

/// Mean, population standard deviation, min and max of `xs` (which must not be empty).
pub fn summary(xs: &[f64]) -> (f64, f64, f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, var.sqrt(), min, max)
}

/// What one agent session may hold in memory, by the agent's design and config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionMemory {
    /// The session's frame pool: `prefetch_frames` × 1 MiB (`TcpBatchSink::start`).
    pub prefetch: u64,
    /// The plan's batch buffers: the pipeline's u32 batch (`Pipeline::next_batch`, 4 bytes a
    /// token), and as much again for an encoded record when the wire codec is not the output
    /// dtype's plain codec (`RecordEncoder`).
    pub batch: u64,
    /// The dataset's document index: taken as the `.idx` file's size. Loaded once for every
    /// session (the agent's dataset cache), so the bound counts it once.
    pub index: u64,
}

impl SessionMemory {
    pub fn new(
        prefetch_frames: u64,
        batch_size: u64,
        seq_len: u64,
        plain_wire: bool,
        idx_bytes: u64,
    ) -> Self {
        let tokens = batch_size.saturating_mul(seq_len.saturating_add(1));
        let per_token = if plain_wire { 4 } else { 8 };
        SessionMemory {
            prefetch: prefetch_frames.saturating_mul(1 << 20),
            batch: tokens.saturating_mul(per_token),
            index: idx_bytes,
        }
    }

    /// What each session adds: its frame pool and batch buffers.
    pub fn total(&self) -> u64 {
        self.prefetch.saturating_add(self.batch)
    }
}

/// The agent's resident-memory bound: a fixed part, the shared index, and `sessions` × one
/// session's share.
pub fn rss_bound_bytes(base_bytes: u64, per_session: SessionMemory, sessions: u64) -> u64 {
    base_bytes
        .saturating_add(per_session.index)
        .saturating_add(per_session.total().saturating_mul(sessions))
}

/// The agent's thread bound: the threads it has idle, two per streaming TCP session (the
/// connection's thread, which runs the producer, and its `dquant-send` thread), and one per
/// connection still in its handshake (at most `max_handshakes`).
pub fn thread_bound(idle: u64, sessions: u64, max_handshakes: u64) -> u64 {
    idle.saturating_add(sessions.saturating_mul(2))
        .saturating_add(max_handshakes)
}

/// A numeric field of `/proc/PID/status` text: `VmRSS`, `VmHWM` (in KiB, the unit dropped),
/// `Threads`.
pub fn status_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let v = line.strip_prefix(field)?.strip_prefix(':')?;
        v.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// Every series of metric `name` in Prometheus text format: its label set as written
/// (`state="pending"`, empty for none) and its value.
pub fn prom_series(text: &str, name: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
            match r.split_once('}') {
                Some((l, v)) => (l.to_string(), v),
                None => continue,
            }
        } else if rest.starts_with(' ') {
            (String::new(), rest)
        } else {
            // Another metric whose name starts with this one.
            continue;
        };
        if let Some(v) = value.split_whitespace().next().and_then(|v| v.parse().ok()) {
            out.insert(labels, v);
        }
    }
    out
}

/// An error message with its numbers replaced by `N` and anything in square brackets (the
/// bytes the agent quotes) by `…`, so that messages differing only in a session id, a count,
/// a port or the garbage itself are tallied together.
pub fn message_kind(m: &str) -> String {
    let mut out = String::with_capacity(m.len());
    let mut in_num = false;
    let mut depth = 0usize;
    for c in m.chars() {
        match c {
            '[' => {
                if depth == 0 {
                    out.push_str("[…]");
                }
                depth += 1;
                in_num = false;
                continue;
            }
            ']' if depth > 0 => {
                depth -= 1;
                continue;
            }
            _ if depth > 0 => continue,
            _ => {}
        }
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    const MAX: usize = 160;
    if out.len() > MAX {
        let mut end = MAX;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[5.0; 64]), 1.0);
        let mut one_hot = vec![0.0; 64];
        one_hot[3] = 9.0;
        assert!((jain(&one_hot) - 1.0 / 64.0).abs() < 1e-12);
        // Half the consumers at twice the rate of the other half: (3n/2)² / (n · 5n/2) = 0.9.
        let xs: Vec<f64> = (0..64)
            .map(|i| if i % 2 == 0 { 1.0 } else { 2.0 })
            .collect();
        assert!((jain(&xs) - 0.9).abs() < 1e-12);
        // Scale-free.
        let ys: Vec<f64> = xs.iter().map(|x| x * 1e9).collect();
        assert!((jain(&ys) - 0.9).abs() < 1e-12);
        assert!(jain(&[]).is_nan());
        assert!(jain(&[0.0, 0.0]).is_nan());
    }

    #[test]
    fn summary_of_values() {
        let (mean, sd, min, max) = summary(&[1.0, 3.0]);
        assert_eq!((mean, sd, min, max), (2.0, 1.0, 1.0, 3.0));
    }

    #[test]
    fn session_memory_and_bounds() {
        // 8 frames, batch 16 × 4096 tokens, plain wire, a 10 MB index.
        let s = SessionMemory::new(8, 16, 4095, true, 10_000_000);
        assert_eq!(s.prefetch, 8 << 20);
        assert_eq!(s.batch, 16 * 4096 * 4);
        assert_eq!(s.index, 10_000_000);
        assert_eq!(s.total(), (8 << 20) + 262_144);
        let encoded = SessionMemory::new(8, 16, 4095, false, 0);
        assert_eq!(encoded.batch, 16 * 4096 * 8);
        assert_eq!(
            rss_bound_bytes(64 << 20, s, 66),
            (64 << 20) + 10_000_000 + 66 * s.total()
        );
        assert_eq!(thread_bound(12, 66, 64), 12 + 132 + 64);
        // Absurd configs saturate rather than wrap.
        let huge = SessionMemory::new(u64::MAX, u64::MAX, u64::MAX, false, 0);
        assert_eq!(huge.prefetch, u64::MAX);
        assert_eq!(rss_bound_bytes(1, huge, 2), u64::MAX);
    }

    #[test]
    fn proc_status() {
        let text = "Name:\tdquant\nVmPeak:\t 1234 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n\
                    RssAnon:\t 30000 kB\nThreads:\t137\nSigQ:\t0/91468\n";
        assert_eq!(status_field(text, "VmRSS"), Some(40960));
        assert_eq!(status_field(text, "VmHWM"), Some(51200));
        assert_eq!(status_field(text, "Threads"), Some(137));
        // A field is matched whole: `Vm` is no field, `VmRSS` is not `VmRSSx`.
        assert_eq!(status_field(text, "Vm"), None);
        assert_eq!(status_field(text, "VmSwap"), None);
        assert_eq!(status_field(text, "SigQ"), None);
    }

    #[test]
    fn prometheus_text() {
        let text = "# HELP dquant_sessions sessions\n# TYPE dquant_sessions gauge\n\
                    dquant_sessions{state=\"pending\"} 3\ndquant_sessions{state=\"streaming\"} 64\n\
                    dquant_sessions_other 7\ndquant_open_queue_depth 0\n\
                    dquant_refusals_total{reason=\"bad hello\"} 12\n";
        let s = prom_series(text, "dquant_sessions");
        assert_eq!(s.len(), 2);
        assert_eq!(s["state=\"pending\""], 3.0);
        assert_eq!(s["state=\"streaming\""], 64.0);
        assert_eq!(prom_series(text, "dquant_open_queue_depth")[""], 0.0);
        assert_eq!(
            prom_series(text, "dquant_refusals_total")["reason=\"bad hello\""],
            12.0
        );
        assert!(prom_series(text, "dquant_nothing").is_empty());
    }

    #[test]
    fn message_kinds() {
        assert_eq!(
            message_kind("unknown session 1234567 (port 7879)"),
            "unknown session N (port N)"
        );
        assert_eq!(
            message_kind("bad frame magic [12, ab, 3f, 0] (not a dquant data stream)"),
            "bad frame magic […] (not a dquant data stream)"
        );
        let long = "é".repeat(200);
        let k = message_kind(&long);
        assert!(k.ends_with('…') && k.len() <= 160 + '…'.len_utf8());
    }
}
