//! What a reader yields, whole: the two ways tests collect a stream to compare it (batch by
//! batch, or through `read` in a given buffer size).

use dquant_client::Reader;

/// Everything a reader yields: the bytes of all batches and each batch's sample count.
pub fn drain(r: &mut Reader) -> (Vec<u8>, Vec<usize>) {
    let mut bytes = Vec::new();
    let mut sizes = Vec::new();
    while let Some(b) = r.next_batch().unwrap() {
        assert_eq!(b.tokens.len(), b.samples * b.sample_len);
        bytes.extend_from_slice(b.tokens.as_bytes());
        sizes.push(b.samples);
    }
    (bytes, sizes)
}

/// Everything a reader yields until its end or its first error, and that error: for tests
/// of faults, where an error is an outcome to check, not a failure of the test.
pub fn until_error(r: &mut Reader) -> (Vec<u8>, Option<String>) {
    let mut bytes = Vec::new();
    loop {
        match r.next_batch() {
            Ok(Some(b)) => bytes.extend_from_slice(b.tokens.as_bytes()),
            Ok(None) => return (bytes, None),
            Err(e) => return (bytes, Some(e.to_string())),
        }
    }
}

/// Everything a reader yields through `read` in `buf_len`-byte calls.
pub fn read_all(r: &mut Reader, buf_len: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; buf_len];
    loop {
        let n = r.read(&mut buf).unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}
