//! Megatron-Core `IndexedDataset`: a `.bin` of concatenated token arrays and an `.idx` that
//! describes them.
//!
//! `.idx` layout (all little-endian), as `megatron/core/datasets/indexed_dataset.py` writes it:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 9 | magic `MMIDIDX\0\0` |
//! | 9 | 8 | version, u64 = 1 |
//! | 17 | 1 | dtype code (1=u8 2=i8 3=i16 4=i32 5=i64 6=f64 7=f32 8=u16) |
//! | 18 | 8 | sequence count S, u64 |
//! | 26 | 8 | document count D, u64: the length of `document_indices`, so documents + 1 |
//! | 34 | 4·S | `sequence_lengths`, i32 |
//! | … | 8·S | `sequence_pointers`, i64 byte offsets into `.bin` |
//! | … | 8·D | `document_indices`, i64 sequence indices, starting at 0 and ending at S |
//!
//! Multimodal datasets append S bytes of `sequence_modes`; we accept and ignore them.
//!
//! We require what Megatron's writer always produces: pointers that are the running sum of the
//! lengths times the item size, so the `.bin` is one contiguous token stream. Anything else is
//! reported as corruption rather than guessed at.

use crate::dtype::DType;
use crate::error::FormatError;
use crate::index::DocIndex;

pub const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
pub const VERSION: u64 = 1;
/// Bytes before the arrays.
pub const HEADER_LEN: usize = 34;

/// A parsed `.idx`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MegatronIndex {
    pub dtype: DType,
    pub index: DocIndex,
    /// The file carries a `sequence_modes` array (multimodal datasets).
    pub multimodal: bool,
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// What an `.idx` says before its arrays, checked against the file's length: enough to
/// serve the tokens without reading the arrays ([`check_ends`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdxHeader {
    pub dtype: DType,
    /// Sequences: the length of `sequence_lengths` and `sequence_pointers`.
    pub sequences: u64,
    /// The length of `document_indices` (documents + 1).
    pub doc_indices: u64,
    /// The file carries a `sequence_modes` array (multimodal datasets).
    pub multimodal: bool,
}

impl IdxHeader {
    /// Parses the header (the file's first [`HEADER_LEN`] bytes, or all of a shorter file)
    /// and checks that a file of `idx_len` bytes holds exactly the arrays it declares.
    pub fn parse(b: &[u8], idx_len: u64) -> Result<Self, FormatError> {
        if b.len() < HEADER_LEN {
            return Err(FormatError::truncated(
                "Megatron .idx header",
                HEADER_LEN as u64,
                b.len() as u64,
            ));
        }
        if &b[..9] != MAGIC {
            return Err(FormatError::BadMagic {
                what: "Megatron .idx file",
                found: String::from_utf8_lossy(&b[..9]).into_owned(),
                expected: "MMIDIDX\0\0".into(),
            });
        }
        let version = u64_at(b, 9);
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: "Megatron .idx",
                version,
                supported: "version 1",
            });
        }
        let dtype = DType::from_code(b[17])?;
        let (s, d) = (u64_at(b, 18), u64_at(b, 26));
        let too_big =
            || FormatError::corrupt("Megatron .idx", format!("counts S={s} D={d} overflow"));
        let arrays = s
            .checked_mul(12)
            .and_then(|x| d.checked_mul(8).and_then(|y| x.checked_add(y)))
            .and_then(|x| x.checked_add(HEADER_LEN as u64))
            .ok_or_else(too_big)?;
        if idx_len < arrays {
            return Err(FormatError::truncated(
                format!("Megatron .idx with {s} sequences and {d} document indices"),
                arrays,
                idx_len,
            ));
        }
        let multimodal = match idx_len - arrays {
            0 => false,
            extra if extra == s => true,
            extra => {
                return Err(FormatError::corrupt(
                    "Megatron .idx",
                    format!("{extra} unexpected bytes after the document indices"),
                ))
            }
        };
        if d == 0 {
            return Err(FormatError::corrupt(
                "Megatron .idx",
                "document_indices is empty (it must start with 0)",
            ));
        }
        Ok(IdxHeader {
            dtype,
            sequences: s,
            doc_indices: d,
            multimodal,
        })
    }

    /// Byte offset of `sequence_lengths[i]`.
    pub fn length_at(&self, i: u64) -> u64 {
        HEADER_LEN as u64 + 4 * i
    }

    /// Byte offset of `sequence_pointers[i]`.
    pub fn pointer_at(&self, i: u64) -> u64 {
        HEADER_LEN as u64 + 4 * self.sequences + 8 * i
    }

    /// Byte offset of `document_indices[i]`.
    pub fn doc_index_at(&self, i: u64) -> u64 {
        HEADER_LEN as u64 + 12 * self.sequences + 8 * i
    }

    /// Documents: `document_indices` less its leading 0.
    pub fn documents(&self) -> u64 {
        self.doc_indices - 1
    }
}

/// The ends of an `.idx`'s arrays, read on their own: enough to check it against its
/// `.bin` without reading the arrays whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdxEnds {
    pub first_pointer: u64,
    pub last_pointer: u64,
    pub last_length: i32,
    pub first_doc_index: u64,
    pub last_doc_index: u64,
}

/// Checks an `.idx`'s ends, as far as they can tell (the first sequence starts at byte 0,
/// the last ends on a token boundary, the document indices run from 0 to the sequence
/// count), and returns the token count they describe, for [`check_bin_tokens`].
/// [`parse_idx`] checks every entry.
pub fn check_ends(h: &IdxHeader, e: &IdxEnds) -> Result<u64, FormatError> {
    let item = h.dtype.itemsize() as u64;
    let bad = |m: String| Err(FormatError::corrupt("Megatron .idx", m));
    if e.first_doc_index != 0 || e.last_doc_index != h.sequences {
        return bad(format!(
            "document_indices run from {} to {}, expected 0 to {} (the sequence count)",
            e.first_doc_index, e.last_doc_index, h.sequences
        ));
    }
    if h.sequences == 0 {
        return Ok(0);
    }
    if e.first_pointer != 0 {
        return bad(format!(
            "sequence 0 starts at byte {}, expected 0",
            e.first_pointer
        ));
    }
    let Ok(last_len) = u64::try_from(e.last_length) else {
        return bad(format!(
            "sequence {} has negative length {}",
            h.sequences - 1,
            e.last_length
        ));
    };
    let end = e
        .last_pointer
        .checked_add(last_len * item)
        .filter(|end| end % item == 0)
        .ok_or_else(|| {
            FormatError::corrupt(
                "Megatron .idx",
                format!(
                    "the last sequence's pointer {} is not a token boundary",
                    e.last_pointer
                ),
            )
        })?;
    Ok(end / item)
}

/// Checks a `.bin` of `bin_len` bytes against the `tokens` its `.idx` describes.
pub fn check_bin_tokens(dtype: DType, tokens: u64, bin_len: u64) -> Result<(), FormatError> {
    let want = bin_len_of(dtype, tokens);
    if bin_len < want {
        return Err(FormatError::truncated(
            format!(
                "Megatron .bin ({tokens} tokens of {} in the .idx)",
                dtype.numpy_name()
            ),
            want,
            bin_len,
        ));
    }
    if bin_len > want {
        return Err(FormatError::corrupt(
            "Megatron .bin",
            format!(
                "{bin_len} bytes, but the .idx describes only {want} ({tokens} tokens of {}); \
                 the .idx may be stale or truncated",
                dtype.numpy_name()
            ),
        ));
    }
    Ok(())
}

/// Parses and validates a whole `.idx` file.
pub fn parse_idx(b: &[u8]) -> Result<MegatronIndex, FormatError> {
    let IdxHeader {
        dtype,
        sequences: s,
        doc_indices: d,
        multimodal,
    } = IdxHeader::parse(b, b.len() as u64)?;
    let (s, d) = (s as usize, d as usize);
    let lens = &b[HEADER_LEN..HEADER_LEN + 4 * s];
    let ptrs = &b[HEADER_LEN + 4 * s..HEADER_LEN + 12 * s];
    let docs = &b[HEADER_LEN + 12 * s..HEADER_LEN + 12 * s + 8 * d];
    let item = dtype.itemsize() as u64;
    let mut seq_offsets = Vec::with_capacity(s + 1);
    seq_offsets.push(0u64);
    let mut tokens = 0u64;
    for i in 0..s {
        let len = i32::from_le_bytes([
            lens[4 * i],
            lens[4 * i + 1],
            lens[4 * i + 2],
            lens[4 * i + 3],
        ]);
        if len < 0 {
            return Err(FormatError::corrupt(
                "Megatron .idx",
                format!("sequence {i} has negative length {len}"),
            ));
        }
        let ptr = u64_at(ptrs, 8 * i);
        if ptr != tokens * item {
            return Err(FormatError::corrupt(
                "Megatron .idx",
                format!(
                    "sequence {i} starts at byte {ptr}, expected {} (right after sequence {})",
                    tokens * item,
                    i as i64 - 1
                ),
            ));
        }
        tokens += len as u64;
        seq_offsets.push(tokens);
    }
    let doc_seq: Vec<u64> = (0..d).map(|i| u64_at(docs, 8 * i)).collect();
    if doc_seq.is_empty() {
        return Err(FormatError::corrupt(
            "Megatron .idx",
            "document_indices is empty (it must start with 0)",
        ));
    }
    let index = DocIndex::new(seq_offsets, doc_seq)?;
    Ok(MegatronIndex {
        dtype,
        index,
        multimodal,
    })
}

/// Size in bytes of the `.bin` that goes with an index.
pub fn bin_len(dtype: DType, tokens: u64) -> u64 {
    bin_len_of(dtype, tokens)
}

fn bin_len_of(dtype: DType, tokens: u64) -> u64 {
    tokens * dtype.itemsize() as u64
}

/// Checks the `.bin` length against what the `.idx` describes.
pub fn check_bin_len(idx: &MegatronIndex, bin_len: u64) -> Result<(), FormatError> {
    check_bin_tokens(idx.dtype, idx.index.tokens(), bin_len)
}

/// Encodes an `.idx` for `index` stored as `dtype`, exactly as Megatron-Core's
/// `_IndexWriter` would.
pub fn encode_idx(dtype: DType, index: &DocIndex) -> Result<Vec<u8>, FormatError> {
    let s = index.sequences();
    let d = index.doc_seq().len();
    let mut out = Vec::with_capacity(HEADER_LEN + 12 * s + 8 * d);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(dtype.code());
    out.extend_from_slice(&(s as u64).to_le_bytes());
    out.extend_from_slice(&(d as u64).to_le_bytes());
    for i in 0..s {
        let len = index.sequence_len(i);
        let len = i32::try_from(len).map_err(|_| FormatError::Unrepresentable {
            what: format!("sequence {i} ({len} tokens)"),
            detail: "Megatron stores sequence lengths as int32".into(),
        })?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    let item = dtype.itemsize() as u64;
    for &off in &index.seq_offsets()[..s] {
        out.extend_from_slice(&((off * item) as i64).to_le_bytes());
    }
    for &ds in index.doc_seq() {
        out.extend_from_slice(&(ds as i64).to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::DocIndexBuilder;

    fn sample() -> DocIndex {
        let mut b = DocIndexBuilder::new();
        b.push_sequence(3);
        b.push_sequence(4);
        b.end_document();
        b.push_document(5);
        b.finish()
    }

    #[test]
    fn encode_parse_round_trip() {
        for dt in [DType::U16, DType::I32, DType::I64] {
            let bytes = encode_idx(dt, &sample()).unwrap();
            assert_eq!(bytes.len(), HEADER_LEN + 12 * 3 + 8 * 3);
            let p = parse_idx(&bytes).unwrap();
            assert_eq!(p.index, sample());
            assert_eq!(p.dtype, dt);
            check_bin_len(&p, 12 * dt.itemsize() as u64).unwrap();
        }
    }

    #[test]
    fn bad_headers_give_clear_errors() {
        let good = encode_idx(DType::I32, &sample()).unwrap();
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(
            parse_idx(&b).unwrap_err().to_string(),
            "not a Megatron .idx file: bad magic \"XMIDIDX\\0\\0\" (expected \"MMIDIDX\\0\\0\")"
        );
        let mut b = good.clone();
        b[9] = 2;
        assert_eq!(
            parse_idx(&b).unwrap_err().to_string(),
            "unsupported Megatron .idx version 2 (this build reads version 1)"
        );
        let mut b = good.clone();
        b[17] = 42;
        assert_eq!(
            parse_idx(&b).unwrap_err().to_string(),
            "unknown Megatron dtype code 42 (known: 1=u8 2=i8 3=i16 4=i32 5=i64 6=f64 7=f32 8=u16)"
        );
        assert_eq!(
            parse_idx(&good[..good.len() - 1]).unwrap_err().to_string(),
            "truncated Megatron .idx with 3 sequences and 3 document indices: needs 94 bytes but has 93"
        );
        let p = parse_idx(&good).unwrap();
        assert_eq!(
            check_bin_len(&p, 47).unwrap_err().to_string(),
            "truncated Megatron .bin (12 tokens of int32 in the .idx): needs 48 bytes but has 47"
        );
        // A sequence length that points past its neighbour's pointer.
        let mut b = good.clone();
        b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&1000i32.to_le_bytes());
        assert_eq!(
            parse_idx(&b).unwrap_err().to_string(),
            "corrupt Megatron .idx: sequence 1 starts at byte 12, expected 4000 (right after sequence 0)"
        );
    }
}
