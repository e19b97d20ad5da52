//! `dquant verify`: are two datasets the same tokens with the same boundaries?

use std::path::PathBuf;

use anyhow::Result;
use dquant_format::DocIndex;
use dquant_storage::Dataset;
use serde_json::json;

use crate::util::{self, InputOpts, OutputOpts};

const EXAMPLES: &str = "\
Examples:
  dquant verify data/web_int32 data/web.dqb
  dquant verify data/web_int32 data/web_uint16 --json
Exit status: 0 identical, 1 different (or an error).";

/// Check that two datasets hold identical token streams and document (and sequence)
/// boundaries, whatever their formats and codecs; otherwise report the first difference.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    pub a: PathBuf,
    pub b: PathBuf,
    #[command(flatten)]
    pub input: InputOpts,
    #[command(flatten)]
    pub output: OutputOpts,
}

/// The first way two datasets differ.
#[derive(Debug, PartialEq, Eq)]
pub enum Difference {
    TokenCount {
        a: u64,
        b: u64,
    },
    Documents {
        a: usize,
        b: usize,
    },
    DocumentBoundary {
        document: usize,
        a: u64,
        b: u64,
    },
    SequenceBoundary {
        sequence: usize,
        a: u64,
        b: u64,
    },
    Token {
        offset: u64,
        document: usize,
        in_document: u64,
        a: u32,
        b: u32,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::TokenCount { a, b } => write!(f, "A has {a} tokens, B has {b}"),
            Difference::Documents { a, b } => write!(f, "A has {a} documents, B has {b}"),
            Difference::DocumentBoundary { document, a, b } => write!(
                f,
                "document {document} starts at token {a} in A but at token {b} in B"
            ),
            Difference::SequenceBoundary { sequence, a, b } => write!(
                f,
                "sequence {sequence} starts at token {a} in A but at token {b} in B"
            ),
            Difference::Token { offset, document, in_document, a, b } => write!(
                f,
                "token {offset} (document {document}, token {in_document} of it): A has {a}, B has {b}"
            ),
        }
    }
}

fn index_difference(a: &DocIndex, b: &DocIndex) -> Option<Difference> {
    if a.tokens() != b.tokens() {
        return Some(Difference::TokenCount {
            a: a.tokens(),
            b: b.tokens(),
        });
    }
    if a.documents() != b.documents() {
        return Some(Difference::Documents {
            a: a.documents(),
            b: b.documents(),
        });
    }
    if let Some(d) = (0..a.documents()).find(|&d| a.document(d).start != b.document(d).start) {
        return Some(Difference::DocumentBoundary {
            document: d,
            a: a.document(d).start,
            b: b.document(d).start,
        });
    }
    let (sa, sb) = (a.seq_offsets(), b.seq_offsets());
    if let Some(i) = (0..sa.len().min(sb.len())).find(|&i| sa[i] != sb[i]) {
        return Some(Difference::SequenceBoundary {
            sequence: i,
            a: sa[i],
            b: sb[i],
        });
    }
    if sa.len() != sb.len() {
        let i = sa.len().min(sb.len()) - 1;
        return Some(Difference::SequenceBoundary {
            sequence: i,
            a: sa[i],
            b: sb[i],
        });
    }
    None
}

/// Compares two datasets; `None` means identical.
pub fn compare(a: &Dataset, b: &Dataset, quiet: bool) -> Result<Option<Difference>> {
    if let Some(d) = index_difference(a.index()?, b.index()?) {
        return Ok(Some(d));
    }
    let pb = util::bar(a.tokens(), "comparing", quiet);
    let (mut ra, mut rb) = (a.reader(), b.reader());
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let step = a.natural_chunk().max(1 << 22);
    let mut start = 0;
    while start < a.tokens() {
        let end = (start + step).min(a.tokens());
        ra.read(start..end, &mut ta)?;
        rb.read(start..end, &mut tb)?;
        if let Some(i) = ta.iter().zip(&tb).position(|(x, y)| x != y) {
            pb.finish_and_clear();
            let offset = start + i as u64;
            let (document, in_document) = a.index()?.locate(offset).unwrap_or((0, offset));
            return Ok(Some(Difference::Token {
                offset,
                document,
                in_document,
                a: ta[i],
                b: tb[i],
            }));
        }
        pb.inc(end - start);
        start = end;
    }
    pb.finish_and_clear();
    Ok(None)
}

pub fn run(a: &Args) -> Result<i32> {
    let da = util::open(&a.a, &a.input)?;
    let db = util::open(&a.b, &a.input)?;
    let diff = compare(&da, &db, a.output.quiet())?;
    let (documents, sequences) = (da.documents()?, da.sequences()?);
    if a.output.json {
        util::write_json(&json!({
            "a": da.path(), "b": db.path(),
            "identical": diff.is_none(),
            "tokens": da.tokens(),
            "documents": documents,
            "difference": diff.as_ref().map(|d| d.to_string()),
        }))?;
    } else {
        match &diff {
            None => println!(
                "identical: {} tokens in {} documents ({} sequences)",
                util::thousands(da.tokens()),
                util::thousands(documents),
                util::thousands(sequences)
            ),
            Some(d) => println!("different: {d}"),
        }
    }
    Ok(if diff.is_none() { 0 } else { 1 })
}
