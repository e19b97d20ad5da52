//! Shared-memory ring transport: the emulated DMA path into host memory.
//!
//! On a BlueField the host exports a region of its memory and the DPU's DMA engine writes
//! finished batches into it; the host reads them where they land, without a copy or a
//! syscall per batch. This ring is that path on one machine (and how a sidecar agent feeds a
//! trainer on its host): the host process owns the memory, the agent only writes into the
//! slots it is handed, and each side checks what the other wrote before it trusts it.
//!
//! A shared stream's subscribers on one host read one ring the agent creates, each from a
//! reader block of its own ([`RingProducer::create`], [`RingProducer::add_reader`],
//! [`RingConsumer::attach`]): the agent writes each batch once, however many read it.
//!
//! The host ([`RingConsumer`]) creates a sealed memfd holding a ring of slots plus two eventfds
//! and hands all three to the agent ([`RingProducer`]) over a Unix socket ([`RingFds::send`],
//! [`RingFds::recv`]). The producer [reserves](RingProducer::reserve) a free slot, writes a batch
//! and [commits](SlotMut::commit) it; the consumer's [`RingConsumer::next`] returns a
//! [`SlotRef`] view that releases the slot when dropped, and [`RingConsumer::take`] a
//! [`RingView`] that may outlive later batches and be dropped in any order. See [`layout`] for the byte layout and
//! the memory-ordering argument. A side that keeps up makes no syscall per batch: eventfds are
//! written only when the other side set its need-wakeup flag.
//!
//! # The parts
//!
//! * [`layout`]: the bytes both processes share, and the ordering rules both follow.
//! * `handover`: creating the ring (memfd, seals, header, eventfds), passing its descriptors
//!   with the [`HANDSHAKE`] tag over a Unix socket ([`fdpass`]), and attaching to it on the
//!   other side.
//! * `memory`: the mappings, slot addresses, and detaching a long-kept view from its slot
//!   (`mremap`).
//! * `wake`: the eventfd wake-ups and the need-wakeup sleep both sides use when they must wait.
//! * `producer`: [`RingProducer`] and [`SlotMut`]: reserve, commit, close or abort.
//! * `consumer`: [`RingConsumer`], [`RingView`] and [`SlotRef`]: take batches in order,
//!   release them in any order.
//! * `model` (tests only): an exhaustive check of the index and need-wakeup protocol.
//!
//! This module holds what they share: [`RingError`] and two small helpers.

pub mod fdpass;
pub mod layout;
#[cfg(test)]
mod model;

// First, so that the constructors it holds lead the docs of the types they construct.
mod handover;

mod consumer;
mod memory;
mod producer;
mod wake;

use std::io;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rustix::fs::SealFlags;

pub use consumer::{RingConsumer, RingView, SlotRef, WAKE_BATCH_TIMEOUT};
pub use fdpass::{recv_fds, send_fds};
pub use handover::{Answer, RingFds, ANSWER, HANDSHAKE, HANDSHAKE_SHARED, MAX_HANDSHAKE_EXTRA};
use layout::LayoutError;
pub use producer::{RingProducer, SlotMut};

/// Everything that can go wrong on the ring.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("ring: {op}: {source}")]
    Io { op: &'static str, source: io::Error },
    #[error("ring: memfd is not sealed against shrinking (seals {0:?}); refusing to map it")]
    NotSealed(SealFlags),
    #[error("ring: no batch within {0:?}")]
    Timeout(Duration),
    #[error("ring: producer went away without closing the ring; all {complete} complete batches were delivered")]
    ProducerGone { complete: u64 },
    #[error("ring: consumer went away")]
    ConsumerGone,
    #[error("ring: batch {seq} is corrupt: {what}")]
    Corrupt { seq: u64, what: String },
    #[error("ring: batch of {len} bytes does not fit a {slot_size}-byte slot")]
    TooLarge { len: usize, slot_size: u64 },
    #[error("ring: fd handshake: {0}")]
    Handshake(String),
    #[error("ring: no reader block: {0}")]
    ReaderRefused(String),
    #[error("ring: live views hold all {held} slots and this ring's slots are not page aligned, so none can be detached; drop a batch view first")]
    AllHeld { held: u64 },
}

fn io_err(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> RingError {
    move |e| RingError::Io {
        op,
        source: e.into(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can panic half-way through an update.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
