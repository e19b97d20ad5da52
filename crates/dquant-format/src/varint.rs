//! LEB128 varints for the block file's index sections.
//!
//! Written here rather than taken from a crate: it is a dozen lines, and the decoder must
//! return a typed error (with what it was parsing) on overlong or truncated input, which the
//! small varint crates expose only as `io::Error` or panics.

use crate::error::FormatError;

pub(crate) fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one varint from `buf` at `*pos`, advancing it.
pub(crate) fn get(buf: &[u8], pos: &mut usize, what: &str) -> Result<u64, FormatError> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let Some(&b) = buf.get(*pos) else {
            return Err(FormatError::corrupt(what, "varint runs past the end"));
        };
        *pos += 1;
        if shift == 63 && b > 1 {
            break;
        }
        v |= ((b & 0x7F) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(FormatError::corrupt(what, "varint is longer than 64 bits"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_overlong() {
        let vals = [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX];
        let mut b = Vec::new();
        for v in vals {
            super::put(&mut b, v);
        }
        let mut p = 0;
        for v in vals {
            assert_eq!(super::get(&b, &mut p, "t").unwrap(), v);
        }
        assert_eq!(p, b.len());
        let mut p = 0;
        assert!(super::get(&[0xFF; 11], &mut p, "t").is_err());
        let mut p = 0;
        assert!(super::get(&[0x80], &mut p, "t").is_err());
    }
}
