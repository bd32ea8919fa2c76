//! A chunk of a layer's input rows as float32, in memory the stream reads
//! (or converts) the bytes straight into, and the converter that cuts a
//! run of bytes into chunks where the rows need converting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};

use offgnn_shared::io_engine::ReadTarget;
use offgnn_shared::npy::DType;
use tch::{Device, Kind, Tensor};

use super::PAGE;
use super::host_tensors::cpu_values;
use super::stream::Input;
use crate::error::{Error, Result};

/// A chunk of a layer's input rows as float32, in CPU memory that the
/// reader reads (or converts) the bytes into as they arrive: the matmuls
/// take its tensor as it is (a first layer's pass is tens of GB, each copy
/// seconds of CPU).
pub(super) struct Chunk {
    /// Flat float32 memory: the capacity's values and three pages more
    /// (to start a direct read on a page, and for the partial pages at
    /// either end of its rows). Private: the soundness of `values` and
    /// `target` rests on what shares this memory.
    raw: Tensor,
    /// Where the rows start in `raw`, in values.
    pub(super) start: usize,
    pub(super) rows: usize,
    pub(super) width: usize,
    pub(super) capacity: usize,
}

impl Chunk {
    /// Values of slack past the capacity (see `raw`).
    pub(super) const SLACK: usize = 3 * PAGE as usize / 4;

    /// A chunk of `capacity` rows, in page-locked memory if `pinned` (its
    /// copies to the device are blocking, so it is free again once `each`
    /// has returned).
    pub(super) fn new(capacity: usize, width: usize, pinned: bool) -> Result<Chunk> {
        let values = capacity * width + Self::SLACK;
        let raw = if pinned {
            crate::cuda::pinned(values * 4)?.f_view_dtype(Kind::Float)?
        } else {
            Tensor::f_empty([values as i64], (Kind::Float, Device::Cpu))?
        };
        Ok(Chunk {
            raw,
            start: 0,
            rows: 0,
            width,
            capacity,
        })
    }

    /// The chunk's rows, a view of its memory (no copy).
    ///
    /// # Safety
    /// The view shares the chunk's memory, which `values` lends out and the
    /// reader writes again once the chunk is handed back: the caller only
    /// reads the view and what it makes of it that shares the memory (a CPU
    /// `to_device` is the view itself), and drops them all before its
    /// borrow of the chunk ends.
    pub(super) unsafe fn tensor(&self) -> Tensor {
        self.raw
            .narrow(0, self.start as i64, (self.rows * self.width) as i64)
            .view([self.rows as i64, self.width as i64])
    }

    /// The chunk's rows' values.
    pub(super) fn values(&self) -> &[f32] {
        // SAFETY: only `&mut self` methods, which this borrow rules out
        // while the slice lives, write the memory; `raw` is private, and the
        // views `tensor` hands out are only read (its contract).
        let all = unsafe { cpu_values(&self.raw, self.start + self.rows * self.width) };
        &all[self.start..]
    }

    /// The capacity's bytes from the memory's start, for the converting
    /// reader to write (the rows then start there).
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.start = 0;
        let len = self.capacity * self.width * 4;
        // SAFETY: `raw` holds more than `len` bytes, contiguous from its data
        // pointer; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.raw.data_ptr().cast::<u8>(), len) }
    }

    /// Bytes from the memory's start to its first page boundary.
    pub(super) fn page_lead(&self) -> usize {
        (self.raw.data_ptr() as usize).next_multiple_of(PAGE as usize)
            - self.raw.data_ptr() as usize
    }
}

// SAFETY: `raw` owns its memory (a CPU or page-locked allocation that
// moving the struct does not move), freed only when the chunk is dropped;
// `target` always returns the same window of it, and nothing else touches
// the memory while the engine holds the chunk: `raw` is private, and the
// views `tensor` handed out were dropped with the borrow they came from.
unsafe impl ReadTarget for Chunk {
    /// From the memory's first page boundary: the capacity's bytes and two
    /// pages (a span's partial first and last page).
    fn target(&mut self) -> &mut [u8] {
        let len = self.capacity * self.width * 4 + 2 * PAGE as usize;
        let at = self.page_lead();
        // SAFETY: `raw` holds `capacity * width * 4 + 3 * PAGE` bytes and
        // `at < PAGE`, so the window lies inside it.
        unsafe { std::slice::from_raw_parts_mut(self.raw.data_ptr().cast::<u8>().add(at), len) }
    }
}

/// Cuts a run of bytes into chunks of rows, converting them into each
/// chunk's tensor as they come, and sends each chunk on with its index.
pub(super) struct Chunker<'a> {
    pub(super) input: &'a Input,
    pub(super) chunk_rows: usize,
    /// The chunk being filled, and the input bytes written into it so far.
    pub(super) filling: Option<Chunk>,
    pub(super) filled: usize,
    /// An element's bytes split between two runs of bytes.
    pub(super) odd: Vec<u8>,
    pub(super) chunk: usize,
    /// Bytes still to drop at the front of the run (before its first row).
    pub(super) skip: usize,
    pub(super) full: &'a SyncSender<(usize, Chunk)>,
    pub(super) free: &'a Receiver<Chunk>,
    pub(super) stop: &'a AtomicBool,
    /// A chunk's tensor that could not be allocated: the stream stops.
    pub(super) failed: Option<Error>,
}

impl Chunker<'_> {
    pub(super) fn feed(&mut self, mut bytes: &[u8]) {
        let elem = self.input.dtype.size();
        let s = self.skip.min(bytes.len());
        bytes = &bytes[s..];
        self.skip -= s;
        if !self.odd.is_empty() {
            let take = (elem - self.odd.len()).min(bytes.len());
            self.odd.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.odd.len() == elem {
                let odd = std::mem::take(&mut self.odd);
                self.put(&odd);
            }
        }
        let whole = bytes.len() / elem * elem;
        self.put(&bytes[..whole]);
        self.odd.extend_from_slice(&bytes[whole..]);
    }

    /// Converts whole elements into the chunks.
    fn put(&mut self, mut bytes: &[u8]) {
        let chunk_bytes = self.chunk_rows * self.input.row_bytes() as usize;
        let elem = self.input.dtype.size();
        while !bytes.is_empty() {
            if self.stop.load(Ordering::Relaxed) || self.failed.is_some() {
                return;
            }
            if self.filling.is_none() {
                let chunk = match self.free.try_recv() {
                    Ok(c) => Ok(c),
                    Err(_) => Chunk::new(self.chunk_rows, self.input.width, self.input.pinned),
                };
                match chunk {
                    Ok(c) => self.filling = Some(c),
                    Err(e) => {
                        self.failed = Some(e);
                        self.stop.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            }
            let take = (chunk_bytes - self.filled).min(bytes.len());
            let chunk = self.filling.as_mut().expect("a chunk is filling");
            let out = &mut chunk.bytes_mut()[self.filled / elem * 4..][..take / elem * 4];
            match self.input.dtype {
                DType::F16 => {
                    for (o, b) in out.chunks_exact_mut(4).zip(bytes[..take].chunks_exact(2)) {
                        o.copy_from_slice(
                            &half::f16::from_le_bytes([b[0], b[1]])
                                .to_f32()
                                .to_ne_bytes(),
                        );
                    }
                }
                _ if cfg!(target_endian = "little") => out.copy_from_slice(&bytes[..take]),
                _ => {
                    for (o, b) in out.chunks_exact_mut(4).zip(bytes[..take].chunks_exact(4)) {
                        o.copy_from_slice(
                            &f32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_ne_bytes(),
                        );
                    }
                }
            }
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == chunk_bytes {
                self.flush();
            }
        }
    }

    /// Sends the rows gathered so far as one chunk (the last of a run may
    /// be short).
    pub(super) fn flush(&mut self) {
        let filled = std::mem::take(&mut self.filled);
        let Some(mut chunk) = self.filling.take() else {
            return;
        };
        if filled == 0 || self.stop.load(Ordering::Relaxed) {
            self.filling = Some(chunk);
            return;
        }
        chunk.rows = filled / self.input.row_bytes() as usize;
        // A closed channel means the consumer stopped on an error.
        let _ = self.full.send((self.chunk, chunk));
        self.chunk += 1;
    }
}
