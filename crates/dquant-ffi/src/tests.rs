//! The ABI called from Rust: NULL handling, errors, end of stream, panics, and the header's
//! agreement with this crate.

use std::collections::BTreeSet;
use std::ffi::{CStr, CString};

use dquant_testkit::fixture_str;

use super::*;

const HEADER: &str = include_str!("../include/dquant.h");
const SOURCE: &str = include_str!("lib.rs");

fn plan_json(seq_len: u32, batch_size: u32, output: &str) -> CString {
    let src = serde_json_string(&fixture_str("r50k_int32"));
    CString::new(format!(
        r#"{{"sources":[{{"uri":{src}}}],"seq_len":{seq_len},"batch_size":{batch_size},"seed":7,"output":"{output}"}}"#
    ))
    .unwrap()
}

/// `s` as a JSON string literal (the fixture path has no characters that need more than this).
fn serde_json_string(s: &str) -> String {
    assert!(!s.contains(['"', '\\']) && !s.chars().any(char::is_control));
    format!("\"{s}\"")
}

fn last_error() -> Option<String> {
    let p = dq_last_error();
    // SAFETY: a non-NULL `dq_last_error` is a NUL-terminated string valid until the next
    // failing call on this thread; it is copied out at once.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned())
}

fn open_local(json: &CString) -> *mut DqReader {
    // SAFETY: NULL uri and a valid NUL-terminated plan.
    let r = unsafe { dq_open(ptr::null(), json.as_ptr(), 0) };
    assert!(!r.is_null(), "dq_open failed: {:?}", last_error());
    r
}

/// The whole stream of the plan through the Rust API, as bytes.
fn rust_stream(json: &CString) -> (Vec<u8>, u64, Cursor) {
    let plan = Plan::from_json(json.to_str().unwrap()).unwrap();
    let mut r = Reader::local(&plan, Cursor::START).unwrap();
    let mut bytes = Vec::new();
    let mut batches = 0;
    while let Some(b) = r.next_batch().unwrap() {
        bytes.extend_from_slice(b.tokens.as_bytes());
        batches += 1;
    }
    (bytes, batches, r.cursor())
}

fn cursor_of(r: *const DqReader) -> (u64, u64) {
    let (mut e, mut c) = (u64::MAX, u64::MAX);
    // SAFETY: `r` is a live reader; both out-pointers are valid.
    assert_eq!(unsafe { dq_cursor(r, &mut e, &mut c) }, 0);
    (e, c)
}

#[test]
fn null_arguments_fail_with_a_message_naming_them() {
    let mut buf = [0u8; 8];
    let mut batch = DqBatch::NONE;
    // SAFETY: NULL readers are allowed and reported; the other pointers are valid.
    unsafe {
        assert_eq!(dq_read(ptr::null_mut(), buf.as_mut_ptr().cast(), 8), -1);
        assert_eq!(last_error().as_deref(), Some("dq_read: reader is NULL"));
        assert_eq!(dq_next_batch(ptr::null_mut(), &mut batch), -1);
        assert_eq!(
            last_error().as_deref(),
            Some("dq_next_batch: reader is NULL")
        );
        assert_eq!(dq_cursor(ptr::null(), ptr::null_mut(), ptr::null_mut()), -1);
        assert_eq!(last_error().as_deref(), Some("dq_cursor: reader is NULL"));
        assert!(dq_open(ptr::null(), ptr::null(), 0).is_null());
        assert_eq!(last_error().as_deref(), Some("dq_open: plan_json is NULL"));
        assert!(dq_open_at(ptr::null(), ptr::null(), 0, 0, 0).is_null());
        assert_eq!(
            last_error().as_deref(),
            Some("dq_open_at: plan_json is NULL")
        );
        dq_close(ptr::null_mut());
    }
    // Closing NULL does not touch the last error.
    assert_eq!(
        last_error().as_deref(),
        Some("dq_open_at: plan_json is NULL")
    );

    let r = open_local(&plan_json(127, 4, "u16"));
    // SAFETY: `r` is live; NULL buffers and outputs are reported.
    unsafe {
        assert_eq!(dq_read(r, ptr::null_mut(), 8), -1);
        assert_eq!(last_error().as_deref(), Some("dq_read: buf is NULL"));
        // A zero-length read reads nothing, whatever the buffer.
        assert_eq!(dq_read(r, ptr::null_mut(), 0), 0);
        dq_close(r);
    }
    let r = open_local(&plan_json(127, 4, "u16"));
    // SAFETY: as above.
    unsafe {
        assert_eq!(dq_next_batch(r, ptr::null_mut()), -1);
        assert_eq!(last_error().as_deref(), Some("dq_next_batch: out is NULL"));
        // Cursor outputs may be NULL: nothing is written.
        assert_eq!(dq_cursor(r, ptr::null_mut(), ptr::null_mut()), 0);
        dq_close(r);
    }
}

#[test]
fn failures_set_the_errors_display_text_verbatim() {
    std::thread::spawn(|| assert_eq!(last_error(), None, "a fresh thread has no error"))
        .join()
        .unwrap();
    let bad = CString::new(r#"{"sources":[{"uri":"x"}],"seq_len":0,"batch_size":4}"#).unwrap();
    // SAFETY: valid NUL-terminated strings.
    let r = unsafe { dq_open(c"".as_ptr(), bad.as_ptr(), 0) };
    assert!(r.is_null());
    assert_eq!(last_error().as_deref(), Some("seq_len: must be at least 1"));

    let syntax = CString::new(r#"{"sources":[],"seq_len":1,"batch_size":1,"bogus":1}"#).unwrap();
    // SAFETY: as above.
    assert!(unsafe { dq_open(ptr::null(), syntax.as_ptr(), 0) }.is_null());
    let msg = last_error().unwrap();
    assert!(msg.starts_with("plan: unknown field `bogus`"), "{msg}");

    // Offloading needs an agent.
    let json = plan_json(127, 4, "u16");
    // SAFETY: as above.
    assert!(unsafe { dq_open(ptr::null(), json.as_ptr(), 1) }.is_null());
    assert_eq!(
        last_error().as_deref(),
        Some("offload needs an agent: pass its URI, dquant://HOST:PORT or a Unix socket path")
    );

    // A missing local dataset: the client's message, naming the source.
    let missing =
        CString::new(r#"{"sources":[{"uri":"/nonexistent/dq"}],"seq_len":8,"batch_size":2}"#)
            .unwrap();
    // SAFETY: as above.
    assert!(unsafe { dq_open(ptr::null(), missing.as_ptr(), 0) }.is_null());
    let msg = last_error().unwrap();
    assert!(msg.starts_with("sources[0] (/nonexistent/dq): "), "{msg}");

    // Invalid UTF-8 is reported, not trusted.
    let bytes = CString::new(vec![b'{', 0xff, b'}']).unwrap();
    // SAFETY: as above.
    assert!(unsafe { dq_open(ptr::null(), bytes.as_ptr(), 0) }.is_null());
    let msg = last_error().unwrap();
    assert!(
        msg.starts_with("dq_open: plan_json is not valid UTF-8"),
        "{msg}"
    );

    // A successful call leaves the last error alone (as errno).
    let r = open_local(&json);
    assert!(last_error().unwrap().starts_with("dq_open: plan_json"));
    // SAFETY: `r` is live and closed once.
    unsafe { dq_close(r) };

    // Errors are per thread.
    std::thread::spawn(|| assert_eq!(last_error(), None))
        .join()
        .unwrap();
}

#[test]
fn next_batch_borrows_the_planned_batches_and_returns_0_at_the_end() {
    for output in ["u16", "i32", "i64"] {
        let json = plan_json(127, 4, output);
        let (want, want_batches, want_cursor) = rust_stream(&json);
        let r = open_local(&json);
        assert_eq!(cursor_of(r), (0, 0));
        let mut got = Vec::new();
        let mut batches = 0u64;
        let mut b = DqBatch::NONE;
        // SAFETY: `r` is live; `b` is valid for writes; `b.data` is read before the next call.
        unsafe {
            while dq_next_batch(r, &mut b) == 1 {
                assert_eq!(b.index, batches);
                assert_eq!(b.sample_len, 128);
                assert_eq!(
                    b.itemsize as usize,
                    Plan::from_json(json.to_str().unwrap())
                        .unwrap()
                        .output
                        .itemsize()
                );
                assert_eq!(b.bytes, (b.samples * b.sample_len * b.itemsize) as usize);
                assert!(b.samples >= 1 && b.samples <= 4);
                got.extend_from_slice(std::slice::from_raw_parts(b.data.cast::<u8>(), b.bytes));
                batches += 1;
            }
            assert!(b.data.is_null() && b.bytes == 0, "the end leaves no batch");
            // The end is sticky.
            assert_eq!(dq_next_batch(r, &mut b), 0);
        }
        assert_eq!(batches, want_batches);
        assert!(
            got == want,
            "{output}: the bytes differ from Reader::next_batch's"
        );
        let end = cursor_of(r);
        assert_eq!(end, (want_cursor.epoch, want_cursor.consumed_samples));
        // SAFETY: `r` is live and closed once.
        unsafe { dq_close(r) };
    }
}

#[test]
fn read_copies_the_same_stream_and_resumes_from_the_cursor() {
    let json = plan_json(100, 3, "i32");
    let (want, _, want_cursor) = rust_stream(&json);
    let r = open_local(&json);
    let mut got = Vec::new();
    // An odd size, so reads straddle batches.
    let mut buf = vec![0u8; 1001];
    let mut half = None;
    loop {
        // SAFETY: `r` is live; `buf` is valid for writes of its length.
        let n = unsafe { dq_read(r, buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n >= 0, "dq_read failed: {:?}", last_error());
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n as usize]);
        if half.is_none() && got.len() >= want.len() / 2 {
            half = Some(cursor_of(r));
        }
    }
    // SAFETY: `r` is live.
    assert_eq!(unsafe { dq_read(r, buf.as_mut_ptr().cast(), buf.len()) }, 0);
    assert!(got == want, "the bytes differ from Reader::next_batch's");
    assert_eq!(
        cursor_of(r),
        (want_cursor.epoch, want_cursor.consumed_samples)
    );
    // SAFETY: `r` is live and closed once.
    unsafe { dq_close(r) };

    // Resuming at a mid-stream cursor gives exactly the rest.
    let (epoch, consumed) = half.unwrap();
    assert!(consumed > 0);
    // SAFETY: valid NUL-terminated plan, NULL uri.
    let r = unsafe { dq_open_at(ptr::null(), json.as_ptr(), 0, epoch, consumed) };
    assert!(!r.is_null(), "{:?}", last_error());
    let plan = Plan::from_json(json.to_str().unwrap()).unwrap();
    let skipped = consumed as usize * 101 * 4;
    let mut rest = Vec::new();
    let mut b = DqBatch::NONE;
    // SAFETY: `r` is live; `b.data` is read before the next call.
    unsafe {
        while dq_next_batch(r, &mut b) == 1 {
            rest.extend_from_slice(std::slice::from_raw_parts(b.data.cast::<u8>(), b.bytes));
        }
        dq_close(r);
    }
    assert_eq!(plan.world, 1);
    assert!(
        rest == want[skipped..],
        "the resumed stream is not the rest"
    );
}

/// The reader's cursor as JSON, through the snprintf-style call (first asking the length).
fn cursor_json_of(r: *const DqReader) -> String {
    // SAFETY: `r` is live; a NULL buffer with length 0 only asks the length.
    let n = unsafe { dq_cursor_json(r, ptr::null_mut(), 0) };
    assert!(n > 0, "{:?}", last_error());
    let mut buf = vec![1 as c_char; n as usize + 1];
    // SAFETY: `buf` is valid for writes of its length.
    assert_eq!(unsafe { dq_cursor_json(r, buf.as_mut_ptr(), buf.len()) }, n);
    // SAFETY: the call NUL-terminated `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_owned()
}

/// Two sub-ranks of a two-source blend stop at different batches; their JSON cursors, merged
/// through the ABI, resume on three ranks with every sample of the plan exactly once.
#[test]
fn json_cursors_merge_and_resume_on_another_world() {
    let src = serde_json_string(&fixture_str("r50k_int32"));
    let json_for = |rank: u32, world: u32| {
        CString::new(format!(
            r#"{{"sources":[{{"uri":{src}}},{{"uri":{src},"weight":3}}],"seq_len":64,"batch_size":2,"seed":5,"rank":{rank},"world":{world}}}"#
        ))
        .unwrap()
    };
    let mut samples: Vec<Vec<u8>> = Vec::new();
    let take = |r: *mut DqReader, n: usize, out: &mut Vec<Vec<u8>>| {
        let mut b = DqBatch::NONE;
        for _ in 0..n {
            // SAFETY: `r` is live; `b.data` is read before the next call.
            if unsafe { dq_next_batch(r, &mut b) } != 1 {
                break;
            }
            // SAFETY: `b.data` holds `b.bytes` bytes until the next call on `r`.
            let bytes = unsafe { std::slice::from_raw_parts(b.data.cast::<u8>(), b.bytes) };
            out.extend(bytes.chunks(65 * 4).map(<[u8]>::to_vec));
        }
    };
    let mut cursors = Vec::new();
    for (rank, n) in [(0, 3), (1, 5)] {
        let r = open_local(&json_for(rank, 2));
        take(r, n, &mut samples);
        let c = cursor_json_of(r);
        assert!(c.contains(r#""blend":["#), "{c}");
        cursors.push(CString::new(c).unwrap());
        // SAFETY: `r` is live and closed once.
        unsafe { dq_close(r) };
    }
    let ptrs: Vec<*const c_char> = cursors.iter().map(|c| c.as_ptr()).collect();
    let mut buf = vec![0 as c_char; 4096];
    // SAFETY: `ptrs` holds 2 NUL-terminated strings; `buf` is valid for its length.
    let n = unsafe { dq_merge_cursors(ptrs.as_ptr(), ptrs.len(), buf.as_mut_ptr(), buf.len()) };
    assert!(n > 0 && (n as usize) < buf.len(), "{:?}", last_error());
    // SAFETY: NUL-terminated by the call.
    let merged = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_owned();
    assert!(
        merged.to_str().unwrap().contains(r#""delivered":["#),
        "{merged:?}"
    );
    for rank in 0..3 {
        // SAFETY: valid NUL-terminated plan and cursor, NULL uri.
        let r =
            unsafe { dq_open_cursor(ptr::null(), json_for(rank, 3).as_ptr(), 0, merged.as_ptr()) };
        assert!(!r.is_null(), "{:?}", last_error());
        take(r, usize::MAX, &mut samples);
        // SAFETY: `r` is live and closed once.
        unsafe { dq_close(r) };
    }
    let whole = open_local(&json_for(0, 1));
    let mut want = Vec::new();
    take(whole, usize::MAX, &mut want);
    // SAFETY: `whole` is live and closed once.
    unsafe { dq_close(whole) };
    samples.sort();
    want.sort();
    assert_eq!(samples.len(), want.len());
    assert!(
        samples == want,
        "the resumed samples are not the rest of the plan"
    );
    // Bad JSON is named.
    let bad = CString::new(r#"{"consumed_samples":"x"}"#).unwrap();
    // SAFETY: valid NUL-terminated strings.
    let r = unsafe { dq_open_cursor(ptr::null(), json_for(0, 1).as_ptr(), 0, bad.as_ptr()) };
    assert!(r.is_null());
    assert_eq!(
        last_error().unwrap(),
        "dq_open_cursor: cursor: invalid type: string \"x\", expected u64 at line 1 column 23"
    );
}

#[test]
fn one_reader_is_read_one_way() {
    let json = plan_json(127, 4, "u16");
    let r = open_local(&json);
    let mut buf = [0u8; 10];
    let mut b = DqBatch::NONE;
    // SAFETY: `r` is live; the buffers are valid.
    unsafe {
        assert_eq!(dq_read(r, buf.as_mut_ptr().cast(), buf.len()), 10);
        assert_eq!(dq_next_batch(r, &mut b), -1);
        assert!(last_error()
            .unwrap()
            .starts_with("dq_next_batch: this reader is being read with dq_read"));
        dq_close(r);
    }
    let r = open_local(&json);
    // SAFETY: as above.
    unsafe {
        assert_eq!(dq_next_batch(r, &mut b), 1);
        assert_eq!(dq_read(r, buf.as_mut_ptr().cast(), buf.len()), -1);
        assert!(last_error()
            .unwrap()
            .starts_with("dq_read: this reader is being read with dq_next_batch"));
        dq_close(r);
    }
}

#[test]
fn a_panic_becomes_an_error_and_breaks_only_its_reader() {
    assert_eq!(guard("dq_test", -1, || panic!("boom")), -1);
    assert_eq!(
        last_error().as_deref(),
        Some("dq_test: internal error (a bug in dquant): boom")
    );
    let r = open_local(&plan_json(127, 4, "u16"));
    // SAFETY: `r` is live.
    let v = unsafe { with_reader("dq_test", r, -1, |_| -> CResult<i32> { panic!("{}", 42) }) };
    assert_eq!(v, -1);
    assert_eq!(
        last_error().as_deref(),
        Some("dq_test: internal error (a bug in dquant): 42")
    );
    let mut b = DqBatch::NONE;
    // SAFETY: `r` is live (broken, but still closable).
    unsafe {
        assert_eq!(dq_next_batch(r, &mut b), -1);
        assert!(last_error()
            .unwrap()
            .starts_with("dq_next_batch: this reader is unusable after an internal error"));
        assert_eq!(dq_cursor(r, ptr::null_mut(), ptr::null_mut()), -1);
        dq_close(r);
    }
}

#[test]
fn batches_carry_the_document_starts_of_the_rust_api() {
    let src = serde_json_string(&fixture_str("r50k_int32"));
    let json = CString::new(format!(
        r#"{{"sources":[{{"uri":{src}}}],"seq_len":255,"batch_size":3,"boundaries":"eod","eod":50256}}"#
    ))
    .unwrap();
    let plan = Plan::from_json(json.to_str().unwrap()).unwrap();
    let mut want = Reader::local(&plan, Cursor::START).unwrap();
    let r = open_local(&json);
    let mut b = DqBatch::NONE;
    let mut starts = 0;
    // SAFETY: `r` is live; `b` is valid for writes; its arrays are read before the next call.
    unsafe {
        while dq_next_batch(r, &mut b) == 1 {
            let w = want.next_batch().unwrap().unwrap();
            let d = w.docs.unwrap();
            let offsets = std::slice::from_raw_parts(b.doc_offsets, b.samples as usize + 1);
            let got = std::slice::from_raw_parts(b.doc_starts, b.doc_starts_len);
            assert_eq!((offsets, got), (d.offsets(), d.starts()));
            starts += got.len();
        }
        assert!(b.doc_offsets.is_null() && b.doc_starts.is_null() && b.doc_starts_len == 0);
        dq_close(r);
    }
    assert!(want.next_batch().unwrap().is_none());
    assert!(starts > 20, "{starts} document starts");
    // A plan without boundaries leaves them NULL.
    let r = open_local(&plan_json(127, 4, "i32"));
    // SAFETY: as above.
    unsafe {
        assert_eq!(dq_next_batch(r, &mut b), 1);
        assert!(b.doc_offsets.is_null() && b.doc_starts.is_null() && b.doc_starts_len == 0);
        dq_close(r);
    }
}

#[test]
fn batch_layout_is_the_headers() {
    use std::mem::{align_of, offset_of, size_of};
    assert_eq!(offset_of!(DqBatch, data), 0);
    assert_eq!(offset_of!(DqBatch, bytes), size_of::<usize>());
    assert_eq!(offset_of!(DqBatch, index), 2 * size_of::<usize>());
    assert_eq!(offset_of!(DqBatch, samples), 2 * size_of::<usize>() + 8);
    assert_eq!(offset_of!(DqBatch, sample_len), 2 * size_of::<usize>() + 12);
    assert_eq!(offset_of!(DqBatch, itemsize), 2 * size_of::<usize>() + 16);
    assert_eq!(
        offset_of!(DqBatch, doc_offsets),
        2 * size_of::<usize>() + 24
    );
    assert_eq!(offset_of!(DqBatch, doc_starts), 3 * size_of::<usize>() + 24);
    assert_eq!(
        offset_of!(DqBatch, doc_starts_len),
        4 * size_of::<usize>() + 24
    );
    assert_eq!(align_of::<DqBatch>(), 8);

    // The header declares the same fields in the same order, with the C twin of each type.
    let start = HEADER
        .find("typedef struct dq_batch {")
        .expect("dq_batch in dquant.h");
    let body = &HEADER[start..];
    let body = &strip_c_comments(&body[body.find('{').unwrap() + 1..body.find('}').unwrap()]);
    let c_fields: Vec<(String, String)> = body
        .split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ty, name) = f
                .rsplit_once(|c: char| c.is_whitespace() || c == '*')
                .unwrap();
            let ty = format!("{ty}{}", &f[ty.len()..f.len() - name.len()]);
            (
                ty.split_whitespace().collect::<Vec<_>>().join(" "),
                name.to_string(),
            )
        })
        .collect();
    let want = [
        ("const void *", "data"),
        ("size_t", "bytes"),
        ("uint64_t", "index"),
        ("uint32_t", "samples"),
        ("uint32_t", "sample_len"),
        ("uint32_t", "itemsize"),
        ("const uint32_t *", "doc_offsets"),
        ("const uint32_t *", "doc_starts"),
        ("size_t", "doc_starts_len"),
    ];
    let c_fields: Vec<(&str, &str)> = c_fields
        .iter()
        .map(|(t, n)| (t.as_str(), n.as_str()))
        .collect();
    assert_eq!(c_fields, want);
}

/// `text` without its `/* */` and `//` comments.
fn strip_c_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The `dq_*` functions the header declares.
fn header_functions() -> BTreeSet<String> {
    let code = strip_c_comments(HEADER);
    let mut names = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("dq_") {
        let boundary = i == 0 || !rest[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if boundary && tail[end..].trim_start().starts_with('(') {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The `#[no_mangle] extern "C"` functions this crate exports.
fn exported_functions() -> BTreeSet<String> {
    let lines: Vec<&str> = SOURCE.lines().map(str::trim).collect();
    let mut names = BTreeSet::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(sig) = line
            .strip_prefix("pub unsafe extern \"C\" fn ")
            .or_else(|| line.strip_prefix("pub extern \"C\" fn "))
        else {
            continue;
        };
        let name = &sig[..sig.find('(').unwrap()];
        assert!(
            i > 0 && lines[i - 1] == "#[no_mangle]",
            "{name} is extern \"C\" but not #[no_mangle]"
        );
        names.insert(name.to_string());
    }
    names
}

#[test]
fn the_header_declares_exactly_the_exported_functions() {
    let declared = header_functions();
    let exported = exported_functions();
    assert!(declared.len() >= 7, "found only {declared:?} in dquant.h");
    let missing: Vec<_> = declared.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "declared in dquant.h, not exported: {missing:?}"
    );
    let undeclared: Vec<_> = exported.difference(&declared).collect();
    assert!(
        undeclared.is_empty(),
        "exported, not declared in dquant.h: {undeclared:?}"
    );
    for f in [
        "dq_open",
        "dq_open_at",
        "dq_read",
        "dq_next_batch",
        "dq_cursor",
        "dq_close",
        "dq_last_error",
    ] {
        assert!(exported.contains(f), "{f} is not exported");
    }
}

/// Every batch of `r` through `dq_next_batch`, back to back; closes it.
fn drain_c(r: *mut DqReader) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut b = DqBatch::NONE;
    // SAFETY: `r` is a live reader; each batch's data is valid until the next call.
    unsafe {
        while dq_next_batch(r, &mut b) == 1 {
            bytes.extend_from_slice(std::slice::from_raw_parts(b.data.cast::<u8>(), b.bytes));
        }
        dq_close(r);
    }
    bytes
}

#[test]
fn a_shared_stream_opened_and_subscribed_gives_both_readers_the_plan() {
    let c = dquant_testkit::agent::Corpus::new();
    let agent = c.agent();
    let mut plan = dquant_testkit::agent::plan(&[("r50k", 1.0)], 127, 4);
    plan.wire_codec = "auto+lz4".into();
    let want = rust_stream(&CString::new(c.localized(&plan).to_json()).unwrap()).0;
    let uri = CString::new(agent.uri()).unwrap();
    let json = CString::new(plan.to_json()).unwrap();
    let share = CString::new("job9/dp1").unwrap();
    let start = CString::new(r#"{"consumed_samples":0}"#).unwrap();
    // SAFETY: valid NUL-terminated strings throughout.
    let (a, b) = unsafe {
        let a = dq_open_shared(uri.as_ptr(), json.as_ptr(), ptr::null(), share.as_ptr(), 2);
        assert!(!a.is_null(), "{:?}", last_error());
        let b = dq_subscribe(uri.as_ptr(), share.as_ptr(), start.as_ptr());
        assert!(!b.is_null(), "{:?}", last_error());
        (a as usize, b as usize)
    };
    let other = std::thread::spawn(move || drain_c(b as *mut DqReader));
    assert_eq!(drain_c(a as *mut DqReader), want);
    assert_eq!(other.join().unwrap(), want);
    let missing = CString::new("job9/dp2").unwrap();
    // SAFETY: as above.
    assert!(unsafe { dq_subscribe(uri.as_ptr(), missing.as_ptr(), ptr::null()) }.is_null());
    assert!(last_error()
        .unwrap()
        .contains("no shared stream \"job9/dp2\""));
}
