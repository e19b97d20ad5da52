//! The C ABI of the host API: `libdquant_ffi.so` / `libdquant_ffi.a`, declared in
//! `include/dquant.h`.
//!
//! It wraps [`dquant_client`] one to one: [`dq_open`] / [`dq_open_at`] are
//! [`dquant_client::open_at`] with the plan given as JSON, [`dq_next_batch`] is
//! [`Reader::next_batch`](dquant_client::Reader::next_batch), [`dq_read`] is
//! [`Reader::read`](dquant_client::Reader::read), [`dq_cursor`] is
//! [`Reader::cursor`](dquant_client::Reader::cursor) and [`dq_close`] drops the reader.
//!
//! Two choices shape the ABI:
//!
//! - **Errors are thread-local, as `errno` and `dlerror`.** A failing call returns its
//!   failure value (NULL or -1) and stores a message that [`dq_last_error`] returns. C has no
//!   way to return a `Result`, and passing an error out-parameter to every call would make
//!   the common, successful path noisier for no gain. Keeping the message per thread lets
//!   independent readers on different threads fail without racing on one global. Messages are
//!   the Rust errors' `Display` text verbatim (a bad plan says `seq_len: must be at least 1`,
//!   exactly what the CLI would), so a C program can show them as they are. Like `errno`,
//!   the message is only meaningful right after a call that reported failure: successful
//!   calls leave it alone, and [`dq_close`] never touches it, so a program can close its reader
//!   before reporting why it stopped.
//! - **Batches are borrowed, not copied.** [`dq_next_batch`] hands out a pointer into the
//!   reader's own batch buffer, valid until the next call on that reader, exactly as
//!   `Reader::next_batch` borrows in Rust. A trainer can then hand the bytes to its framework
//!   (or copy them to pinned memory) once, with no intermediate copy made here. [`dq_read`]
//!   is the copying alternative, for callers that own a buffer.
//!
//! Every entry point catches panics (a panic must not unwind into C, which is undefined
//! behaviour, or abort the host) and turns them into an error. A reader whose call panicked
//! may hold half-updated state, so it is marked broken and every later call on it fails; it
//! can still be closed.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use dquant_client::{Offload, Reader, Share, Tokens};
use dquant_plan::{Cursor, Plan};

/// An open reader: what a C `dq_reader *` points to (opaque to C).
pub struct DqReader {
    reader: Reader,
    mode: Mode,
    /// Set when a call panicked inside the reader; every later call then fails.
    broken: bool,
}

// dquant.h lets a reader move between threads (used by one at a time): it must be `Send`.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<DqReader>();
};

/// How a reader is being consumed. [`Reader::next_batch`](dquant_client::Reader::next_batch)
/// drops whatever [`Reader::read`](dquant_client::Reader::read) left of a partly read batch,
/// so one reader is read one way only: the first call decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Unset,
    Batches,
    Bytes,
}

impl DqReader {
    fn claim(&mut self, mode: Mode, func: &str) -> CResult<()> {
        match self.mode {
            Mode::Unset => {
                self.mode = mode;
                Ok(())
            }
            m if m == mode => Ok(()),
            Mode::Bytes => Err(CError(format!(
                "{func}: this reader is being read with dq_read; use either dq_read or \
                 dq_next_batch on one reader, not both (mixing would skip the rest of a \
                 partly read batch)"
            ))),
            Mode::Batches => Err(CError(format!(
                "{func}: this reader is being read with dq_next_batch; use either dq_read or \
                 dq_next_batch on one reader, not both"
            ))),
        }
    }
}

/// One batch, as [`dq_next_batch`] fills it (`dq_batch` in C): `samples × sample_len` token ids
/// of `itemsize` bytes each, row-major, little-endian, at `data`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DqBatch {
    /// The tokens, borrowed from the reader: valid until the next call on that reader.
    pub data: *const c_void,
    /// `samples * sample_len * itemsize`.
    pub bytes: usize,
    /// Index of this batch in the rank's stream.
    pub index: u64,
    /// Samples in this batch (the plan's `batch_size`, or fewer in a short last batch).
    pub samples: u32,
    /// Tokens per sample: the plan's `seq_len + 1`.
    pub sample_len: u32,
    /// Bytes per token id: 2 (`u16`), 4 (`i32`) or 8 (`i64`), from the plan's `output`.
    pub itemsize: u32,
    /// When the plan has `boundaries`: `samples + 1` offsets into `doc_starts` (sample `k`'s
    /// starts are `doc_starts[doc_offsets[k]..doc_offsets[k + 1]]`); NULL without. Borrowed
    /// like `data`.
    pub doc_offsets: *const u32,
    /// Every sample's document starts (input positions in `1..=seq_len`), back to back; NULL
    /// without boundaries.
    pub doc_starts: *const u32,
    /// Entries at `doc_starts`.
    pub doc_starts_len: usize,
}

impl DqBatch {
    /// What `*out` holds after a call that returned no batch.
    const NONE: DqBatch = DqBatch {
        data: ptr::null(),
        bytes: 0,
        index: 0,
        samples: 0,
        sample_len: 0,
        itemsize: 0,
        doc_offsets: ptr::null(),
        doc_starts: ptr::null(),
        doc_starts_len: 0,
    };
}

thread_local! {
    /// The message of this thread's last failing call.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records `msg` as this thread's last error.
fn set_error(msg: String) {
    // A NUL inside the message would cut it short in C; show it instead.
    let msg = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // `try_with` fails only while the thread is being torn down; the message is lost then,
    // but the call still returns its failure value.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = Some(msg));
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

fn panic_error(func: &str, payload: &(dyn Any + Send)) -> String {
    format!(
        "{func}: internal error (a bug in dquant): {}",
        panic_message(payload)
    )
}

/// An error as the C caller gets it: the message [`dq_last_error`] returns beside a failing
/// return value, which is all the C ABI carries. Every failure reaches C through it, so the
/// bindings' errors are rendered here once.
#[derive(Debug)]
struct CError(String);

type CResult<T> = Result<T, CError>;

impl From<String> for CError {
    fn from(message: String) -> Self {
        CError(message)
    }
}

impl From<&str> for CError {
    fn from(message: &str) -> Self {
        CError(message.to_string())
    }
}

/// Runs `body`; an error or a panic becomes this thread's last error and `fail` is returned.
fn guard<T>(func: &str, fail: T, body: impl FnOnce() -> CResult<T>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(CError(msg))) => {
            set_error(msg);
            fail
        }
        Err(payload) => {
            set_error(panic_error(func, &*payload));
            fail
        }
    }
}

/// As [`guard`], on the reader behind `r`: fails on a NULL or broken reader, and marks the
/// reader broken when `body` panics.
///
/// # Safety
/// `r` is NULL or a pointer returned by [`dq_open`] / [`dq_open_at`], not yet closed, that
/// no other call is using at the same time.
unsafe fn with_reader<T>(
    func: &str,
    r: *mut DqReader,
    fail: T,
    body: impl FnOnce(&mut DqReader) -> CResult<T>,
) -> T {
    // SAFETY: the caller guarantees `r` is NULL or a live reader from `dq_open*` that nothing
    // else uses during this call, so a unique reference to it is sound.
    let Some(h) = (unsafe { r.as_mut() }) else {
        set_error(format!("{func}: reader is NULL"));
        return fail;
    };
    if h.broken {
        set_error(unusable(func));
        return fail;
    }
    match catch_unwind(AssertUnwindSafe(|| body(&mut *h))) {
        Ok(Ok(v)) => v,
        Ok(Err(CError(msg))) => {
            set_error(msg);
            fail
        }
        Err(payload) => {
            h.broken = true;
            set_error(panic_error(func, &*payload));
            fail
        }
    }
}

/// The string at `p`, or `None` for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and unmodified for `'a`.
unsafe fn c_str<'a>(func: &str, name: &str, p: *const c_char) -> CResult<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: `p` is non-NULL, and the caller guarantees it points to a NUL-terminated string
    // valid for `'a`.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(Some)
        .map_err(|e| CError(format!("{func}: {name} is not valid UTF-8 ({e})")))
}

/// Why a call on a reader marked broken fails.
fn unusable(func: &str) -> String {
    format!("{func}: this reader is unusable after an internal error in an earlier call; close it")
}

/// The cursor of the reader behind `r`, read only: fails on a NULL or broken reader, as
/// [`with_reader`] does.
///
/// # Safety
/// `r` is NULL or a live reader from `dq_open*`, not being closed at the same time.
unsafe fn cursor_of(func: &str, r: *const DqReader) -> CResult<Cursor> {
    // SAFETY: the caller guarantees `r` is NULL or a live reader; reading it through a shared
    // reference is sound (the cursor calls take a `const dq_reader *`).
    let h = unsafe { r.as_ref() }.ok_or_else(|| format!("{func}: reader is NULL"))?;
    if h.broken {
        return Err(CError(unusable(func)));
    }
    Ok(h.reader.cursor())
}

/// # Safety
/// As [`dq_open_at`].
unsafe fn open(
    func: &str,
    uri: *const c_char,
    plan_json: *const c_char,
    offload: c_int,
    cursor: Cursor,
) -> *mut DqReader {
    guard(func, ptr::null_mut(), || {
        // SAFETY: the caller guarantees `uri` is NULL or a NUL-terminated string valid for
        // this call.
        let uri = unsafe { c_str(func, "uri", uri) }?.unwrap_or("");
        // SAFETY: as for `uri`.
        let json = unsafe { c_str(func, "plan_json", plan_json) }?
            .ok_or_else(|| format!("{func}: plan_json is NULL"))?;
        let plan = Plan::from_json(json).map_err(|e| e.to_string())?;
        let offload = if offload != 0 {
            Offload::Yes
        } else {
            Offload::No
        };
        dquant_client::open_at(uri, &plan, cursor, offload)
            .map(boxed)
            .map_err(|e| CError(e.to_string()))
    })
}

/// Opens the plan `plan_json` (a plan in JSON) from the start of its stream. See
/// [`dq_open_at`].
///
/// # Safety
/// `uri` is NULL or a NUL-terminated string; `plan_json` is a NUL-terminated string (NULL is
/// reported as an error). Both need only stay valid during the call.
#[no_mangle]
pub unsafe extern "C" fn dq_open(
    uri: *const c_char,
    plan_json: *const c_char,
    offload: c_int,
) -> *mut DqReader {
    // SAFETY: the caller upholds `open`'s contract, which is this function's.
    unsafe { open("dq_open", uri, plan_json, offload, Cursor::START) }
}

/// Opens the plan `plan_json` at the cursor `(epoch, consumed_samples)` (from [`dq_cursor`]
/// of an earlier reader of the same plan). `uri` is `dquant://HOST:PORT` for an agent, or NULL
/// or `""` for none; `offload` nonzero runs the plan on that agent. Returns NULL on error.
///
/// # Safety
/// As [`dq_open`].
#[no_mangle]
pub unsafe extern "C" fn dq_open_at(
    uri: *const c_char,
    plan_json: *const c_char,
    offload: c_int,
    epoch: u64,
    consumed_samples: u64,
) -> *mut DqReader {
    let cursor = Cursor::new(epoch, consumed_samples);
    // SAFETY: the caller upholds `open`'s contract, which is this function's.
    unsafe { open("dq_open_at", uri, plan_json, offload, cursor) }
}

/// As [`dq_open_at`], at a whole cursor in JSON, as [`dq_cursor_json`] or
/// [`dq_merge_cursors`] wrote it (`{"epoch":E,"consumed_samples":N,"blend":[...],
/// "delivered":[...]}`; the last two optional): with the blend's counts a blended plan resumes
/// without replaying from sample 0, and a merged cursor resumes on another number of ranks.
/// `cursor_json` NULL starts at the beginning. Returns NULL on error.
///
/// # Safety
/// As [`dq_open`]; `cursor_json` is NULL or a NUL-terminated string valid during the call.
#[no_mangle]
pub unsafe extern "C" fn dq_open_cursor(
    uri: *const c_char,
    plan_json: *const c_char,
    offload: c_int,
    cursor_json: *const c_char,
) -> *mut DqReader {
    let func = "dq_open_cursor";
    let cursor = guard(func, None, || {
        // SAFETY: the caller guarantees `cursor_json` is NULL or a NUL-terminated string.
        unsafe { optional_cursor(func, cursor_json) }.map(|c| Some(c.unwrap_or(Cursor::START)))
    });
    let Some(cursor) = cursor else {
        return ptr::null_mut();
    };
    // SAFETY: the caller upholds `open`'s contract, which is this function's.
    unsafe { open(func, uri, plan_json, offload, cursor) }
}

/// The cursor in `cursor_json` (NULL: `None`).
///
/// # Safety
/// `cursor_json` is NULL or a NUL-terminated string valid during the call.
unsafe fn optional_cursor(func: &str, cursor_json: *const c_char) -> CResult<Option<Cursor>> {
    // SAFETY: the caller guarantees `cursor_json` is NULL or a NUL-terminated string.
    match unsafe { c_str(func, "cursor_json", cursor_json) }? {
        None => Ok(None),
        Some(text) => parse_cursor(func, text).map(Some),
    }
}

fn boxed(reader: Reader) -> *mut DqReader {
    Box::into_raw(Box::new(DqReader {
        reader,
        mode: Mode::Unset,
        broken: false,
    }))
}

/// Opens the plan `plan_json` on the agent at `uri` as the shared stream `share` (e.g.
/// `"job42/dp3"`), or joins the stream of that name another reader of this tenant opened
/// with the same plan: the agent runs the plan once, and every reader of the stream gets the
/// same batches. `cursor_json` (NULL: the start) must be the stream's current cursor or a
/// batch boundary still in its window when the stream exists. The stream makes no batch
/// until `group` readers joined (this one included), at most the agent's ticket lifetime;
/// 0 or 1 starts at once. Returns NULL on error.
///
/// # Safety
/// `uri`, `plan_json` and `share` are NUL-terminated strings; `cursor_json` is NULL or one.
/// All need only stay valid during the call.
#[no_mangle]
pub unsafe extern "C" fn dq_open_shared(
    uri: *const c_char,
    plan_json: *const c_char,
    cursor_json: *const c_char,
    share: *const c_char,
    group: u32,
) -> *mut DqReader {
    let func = "dq_open_shared";
    guard(func, ptr::null_mut(), || {
        // SAFETY: the caller guarantees each is NULL or a NUL-terminated string valid for
        // this call.
        let (uri, json, name, cursor) = unsafe {
            (
                c_str(func, "uri", uri)?.ok_or_else(|| format!("{func}: uri is NULL"))?,
                c_str(func, "plan_json", plan_json)?
                    .ok_or_else(|| format!("{func}: plan_json is NULL"))?,
                c_str(func, "share", share)?.ok_or_else(|| format!("{func}: share is NULL"))?,
                optional_cursor(func, cursor_json)?,
            )
        };
        let plan = Plan::from_json(json).map_err(|e| e.to_string())?;
        let share = Share {
            name: name.to_string(),
            group,
        };
        let cursor = cursor.unwrap_or(Cursor::START);
        dquant_client::open_shared(uri, &plan, cursor, &share)
            .map(boxed)
            .map_err(|e| CError(e.to_string()))
    })
}

/// Joins the shared stream `share` that another reader of this tenant opened on the agent at
/// `uri` ([`dq_open_shared`]), at `cursor_json` (a batch boundary still in the stream's
/// window) or, NULL, at the stream's current cursor. The plan comes from the agent. Returns
/// NULL on error (no such stream, a cursor no longer in the window).
///
/// # Safety
/// `uri` and `share` are NUL-terminated strings; `cursor_json` is NULL or one. All need
/// only stay valid during the call.
#[no_mangle]
pub unsafe extern "C" fn dq_subscribe(
    uri: *const c_char,
    share: *const c_char,
    cursor_json: *const c_char,
) -> *mut DqReader {
    let func = "dq_subscribe";
    guard(func, ptr::null_mut(), || {
        // SAFETY: the caller guarantees each is NULL or a NUL-terminated string valid for
        // this call.
        let (uri, name, at) = unsafe {
            (
                c_str(func, "uri", uri)?.ok_or_else(|| format!("{func}: uri is NULL"))?,
                c_str(func, "share", share)?.ok_or_else(|| format!("{func}: share is NULL"))?,
                optional_cursor(func, cursor_json)?,
            )
        };
        dquant_client::subscribe(uri, name, at.as_ref())
            .map(boxed)
            .map_err(|e| CError(e.to_string()))
    })
}

/// A cursor from its JSON text, the error naming `func`.
fn parse_cursor(func: &str, text: &str) -> CResult<Cursor> {
    Cursor::from_json(text).map_err(|e| CError(format!("{func}: {e}")))
}

/// Writes `text` and a NUL into `buf` (`len` bytes) as `snprintf` does: as much as fits, always
/// NUL-terminated when `len > 0`; returns the length of the whole text (without the NUL), so a
/// result `>= len` says the buffer was too small.
///
/// # Safety
/// `buf` is NULL (then `len` must be 0) or valid for writes of `len` bytes.
unsafe fn write_text(text: &str, buf: *mut c_char, len: usize) -> i64 {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `buf` is valid for `len > n` bytes and does not overlap `text`.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
            buf.add(n).write(0);
        }
    }
    i64::try_from(text.len()).unwrap_or(i64::MAX)
}

/// Writes the reader's whole cursor (as [`dq_cursor`], with the blend's counts when the plan
/// blends several sources, and the samples a merged cursor listed as delivered past it) as JSON into `buf`, `snprintf`-style: returns the JSON's length (call
/// again with a larger buffer when it is `>= len`), or -1 on error.
///
/// # Safety
/// `r` as for [`dq_cursor`]; `buf` is NULL with `len` 0, or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn dq_cursor_json(r: *const DqReader, buf: *mut c_char, len: usize) -> i64 {
    guard("dq_cursor_json", -1, || {
        // SAFETY: the caller guarantees `r` is NULL or a live reader not being closed.
        let text = unsafe { cursor_of("dq_cursor_json", r) }?.to_json();
        // SAFETY: the caller's guarantee on `buf` and `len`.
        Ok(unsafe { write_text(&text, buf, len) })
    })
}

/// Merges the cursors of all `n` sub-ranks of one run (`cursors[r]`: sub-rank `r`'s cursor as
/// [`dq_cursor_json`] wrote it, where sub-rank `r` is rank `r` of `n` in its plan) into one
/// cursor that a job on any number of ranks opens with [`dq_open_cursor`], nothing lost and
/// nothing repeated. Writes it as JSON into `buf`, `snprintf`-style; returns its length, or
/// -1 on error.
///
/// # Safety
/// `cursors` is valid for reads of `n` pointers, each a NUL-terminated string; `buf` as for
/// [`dq_cursor_json`].
#[no_mangle]
pub unsafe extern "C" fn dq_merge_cursors(
    cursors: *const *const c_char,
    n: usize,
    buf: *mut c_char,
    len: usize,
) -> i64 {
    let func = "dq_merge_cursors";
    guard(func, -1, || {
        if cursors.is_null() {
            return Err(CError(format!("{func}: cursors is NULL")));
        }
        // SAFETY: the caller guarantees `cursors` holds `n` readable pointers.
        let ptrs = unsafe { std::slice::from_raw_parts(cursors, n) };
        let parsed = ptrs
            .iter()
            .enumerate()
            .map(|(r, &p)| {
                // SAFETY: each is a NUL-terminated string, by the caller's guarantee.
                let text = unsafe { c_str(func, &format!("cursors[{r}]"), p) }?
                    .ok_or_else(|| format!("{func}: cursors[{r}] is NULL"))?;
                parse_cursor(func, text)
            })
            .collect::<CResult<Vec<Cursor>>>()?;
        let merged = dquant_plan::merge_cursors(&parsed).map_err(|e| format!("{func}: {e}"))?;
        let text = merged.to_json();
        // SAFETY: the caller's guarantee on `buf` and `len`.
        Ok(unsafe { write_text(&text, buf, len) })
    })
}

/// Copies up to `len` next bytes of the stream (batches back to back, in the plan's output
/// dtype) into `buf`. Returns the bytes written (fewer than `len` only at the end), 0 at the
/// end (or when `len` is 0), -1 on error.
///
/// # Safety
/// `r` is NULL or a live reader from [`dq_open`] / [`dq_open_at`], used by no other call at
/// the same time; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn dq_read(r: *mut DqReader, buf: *mut c_void, len: usize) -> i64 {
    let body = |h: &mut DqReader| {
        h.claim(Mode::Bytes, "dq_read")?;
        if len == 0 {
            return Ok(0);
        }
        if buf.is_null() {
            return Err("dq_read: buf is NULL".into());
        }
        // A slice may not span more than isize::MAX bytes (nor would one read fill it).
        let len = len.min(isize::MAX as usize);
        let buf = buf.cast::<u8>();
        // SAFETY: `buf` is non-NULL and the caller guarantees it is valid for writes of
        // `len` bytes. Zeroing first makes every byte initialized, which a `&mut [u8]`
        // requires: C buffers are often fresh from malloc.
        let out = unsafe {
            ptr::write_bytes(buf, 0, len);
            std::slice::from_raw_parts_mut(buf, len)
        };
        let n = h.reader.read(out).map_err(|e| e.to_string())?;
        // n <= len <= isize::MAX = i64::MAX on 64-bit targets.
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    };
    // SAFETY: the caller guarantees `r` is NULL or a live reader used only by this call.
    unsafe { with_reader("dq_read", r, -1, body) }
}

/// Takes the next batch: fills `*out` and returns 1; returns 0 at the end and -1 on error
/// (`*out` then holds a NULL `data` and zeros). `out->data` points into the reader's own
/// buffer (no copy) and stays valid until the next call on this reader.
///
/// # Safety
/// `r` is NULL or a live reader from [`dq_open`] / [`dq_open_at`], used by no other call at
/// the same time; `out` is NULL or valid for writing one `dq_batch`.
#[no_mangle]
pub unsafe extern "C" fn dq_next_batch(r: *mut DqReader, out: *mut DqBatch) -> c_int {
    if !out.is_null() {
        // SAFETY: `out` is non-NULL and the caller guarantees it is valid for writing a
        // `dq_batch` (`DqBatch` is its `repr(C)` twin). Every return but 1 leaves this.
        unsafe { out.write(DqBatch::NONE) };
    }
    let body = |h: &mut DqReader| {
        if out.is_null() {
            return Err("dq_next_batch: out is NULL".into());
        }
        h.claim(Mode::Batches, "dq_next_batch")?;
        let Some(b) = h.reader.next_batch().map_err(|e| e.to_string())? else {
            return Ok(0);
        };
        let too_big = |what: &str, v: usize| {
            format!("dq_next_batch: {what} {v} does not fit dq_batch's uint32_t field")
        };
        let bytes = b.tokens.as_bytes();
        let batch = DqBatch {
            data: bytes.as_ptr().cast(),
            bytes: bytes.len(),
            index: b.index,
            samples: u32::try_from(b.samples).map_err(|_| too_big("samples", b.samples))?,
            sample_len: u32::try_from(b.sample_len)
                .map_err(|_| too_big("sample_len", b.sample_len))?,
            itemsize: match b.tokens {
                Tokens::U16(_) => 2,
                Tokens::I32(_) => 4,
                Tokens::I64(_) => 8,
            },
            doc_offsets: b.docs.map_or(ptr::null(), |d| d.offsets().as_ptr()),
            doc_starts: b.docs.map_or(ptr::null(), |d| d.starts().as_ptr()),
            doc_starts_len: b.docs.map_or(0, |d| d.starts().len()),
        };
        // SAFETY: `out` is non-NULL and valid for writing a `dq_batch`, as above. `data`
        // borrows the reader's batch buffer, which lives in the boxed reader and is only
        // changed by the next call on it, as dquant.h documents.
        unsafe { out.write(batch) };
        Ok(1)
    };
    // SAFETY: the caller guarantees `r` is NULL or a live reader used only by this call.
    unsafe { with_reader("dq_next_batch", r, -1, body) }
}

/// Stores where a resumed reader would continue (after the last batch handed out whole) in
/// `*epoch` and `*consumed_samples`; either may be NULL to skip it. Returns 0, or -1 on error.
///
/// # Safety
/// `r` is NULL or a live reader from [`dq_open`] / [`dq_open_at`], not being closed at the
/// same time; `epoch` and `consumed_samples` are each NULL or valid for writing a `u64`.
#[no_mangle]
pub unsafe extern "C" fn dq_cursor(
    r: *const DqReader,
    epoch: *mut u64,
    consumed_samples: *mut u64,
) -> c_int {
    guard("dq_cursor", -1, || {
        // SAFETY: the caller guarantees `r` is NULL or a live reader not being closed.
        let c = unsafe { cursor_of("dq_cursor", r) }?;
        if !epoch.is_null() {
            // SAFETY: non-NULL, and the caller guarantees it is valid for writing a u64.
            unsafe { epoch.write(c.epoch) };
        }
        if !consumed_samples.is_null() {
            // SAFETY: as for `epoch`.
            unsafe { consumed_samples.write(c.consumed_samples) };
        }
        Ok(0)
    })
}

/// Closes a reader (ends its session on the agent, if offloaded) and frees it. NULL is
/// ignored. Never changes [`dq_last_error`] unless closing itself fails.
///
/// # Safety
/// `r` is NULL or a live reader from [`dq_open`] / [`dq_open_at`], not used again afterwards
/// and by no other call at the same time.
#[no_mangle]
pub unsafe extern "C" fn dq_close(r: *mut DqReader) {
    if r.is_null() {
        return;
    }
    guard("dq_close", (), || {
        // SAFETY: `r` came from `Box::into_raw` in `open` and the caller guarantees it is not
        // used again, so taking the box back and dropping it frees it exactly once.
        drop(unsafe { Box::from_raw(r) });
        Ok(())
    })
}

/// The message of this thread's last failing `dq_*` call, NUL-terminated; NULL if none has
/// failed on this thread. Valid until the next failing `dq_*` call on this thread.
#[no_mangle]
pub extern "C" fn dq_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ref().map_or(ptr::null(), |m| m.as_ptr()))
        .unwrap_or(ptr::null())
}

#[cfg(test)]
mod tests;
