//! A layer's input streamed front to back, once per group, in chunks of
//! rows handed to the group's aggregation while the next are read (in the
//! spirit of DiskGNN §5.2: read the big file once, sequentially, and take
//! each row to where it is needed).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};
use std::time::Instant;

use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, PendingRead, ReadReq, ReadTarget};
use offgnn_shared::npy::DType;

use super::PAGE;
use super::chunk::{Chunk, Chunker};
use crate::error::{Error, Result};

/// Bytes per request and requests per call of the sequential streams.
pub(super) const REQUEST: usize = 1 << 20;
pub(super) const PER_CALL: usize = 8;

/// Chunks the reader thread may have ready ahead of the one in use.
pub(super) const STREAM_AHEAD: usize = 2;

/// A layer's input: a file of `rows` rows of `width` values from byte
/// `data_offset` on.
#[derive(Clone, Debug)]
pub(super) struct Input {
    pub(super) path: PathBuf,
    pub(super) data_offset: u64,
    pub(super) rows: u64,
    pub(super) width: usize,
    pub(super) dtype: DType,
    /// Chunks in page-locked memory (CUDA): their copies to the device go
    /// at the DMA engine's rate, without a bounce through a staging buffer.
    pub(super) pinned: bool,
    /// The dataset's features, whose rows are node ids: a NaN or infinity
    /// among them is refused as it streams, since it would turn every
    /// prediction it reaches into NaN (a hidden layer's output is not
    /// checked).
    pub(super) features: bool,
}

impl Input {
    pub(super) fn row_bytes(&self) -> u64 {
        (self.width * self.dtype.size()) as u64
    }

    pub(super) fn to_f32(&self, raw: &[u8], out: &mut Vec<f32>) {
        out.clear();
        match self.dtype {
            DType::F16 => out.extend(
                raw.chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            _ => out.extend(
                raw.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
    }

    /// Rows `[a, b)` as float32, read in place.
    pub(super) fn read_rows(&self, a: u64, b: u64, out: &mut Vec<f32>) -> Result<u64> {
        let mut raw = vec![0u8; ((b - a) * self.row_bytes()) as usize];
        let f = File::open(&self.path).map_err(|e| Error::io(self.path.display(), e))?;
        f.read_exact_at(&mut raw, self.data_offset + a * self.row_bytes())
            .map_err(|e| Error::io(self.path.display(), e))?;
        self.to_f32(&raw, out);
        Ok(raw.len() as u64)
    }

    /// Streams every row once through the I/O engine and hands `each`
    /// chunks of `chunk_rows` rows (the last may be shorter) as float32,
    /// with the chunk's index: chunks `first..` in order, then `0..first`
    /// (a rotation, so that a group's own rows can come first; still one
    /// sequential pass, in two runs). A reader thread reads the next chunks
    /// and converts their bytes straight into the chunks' tensors while
    /// `each` works on this one (two chunks ahead at most, their tensors
    /// recycled). Returns the bytes read: the rows, from the page their
    /// data starts on.
    pub(super) fn stream(
        &self,
        engine: &IoEngine,
        chunk_rows: u64,
        first: usize,
        times: &mut StreamTimes,
        bar: &indicatif::ProgressBar,
        mut each: impl FnMut(usize, &Chunk) -> Result<()>,
    ) -> Result<u64> {
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Made inside the scope: if `each` panics, the consumer's ends
            // are dropped as it unwinds, so the reader, blocked on them,
            // ends before the scope waits for it.
            let (full_tx, full_rx) = sync_channel::<(usize, Chunk)>(STREAM_AHEAD);
            let (free_tx, free_rx) = channel::<Chunk>();
            let stop = &stop;
            let reader = scope.spawn(move || {
                if self.reads_in_place() {
                    self.read_into_chunks(engine, chunk_rows, first, &full_tx, &free_rx, stop)
                } else {
                    self.read_chunks(engine, chunk_rows, first, full_tx, free_rx, stop)
                }
            });
            let mut outcome = Ok(());
            let mut waited = Instant::now();
            for (c, chunk) in full_rx.iter() {
                times.io_wait += waited.elapsed().as_secs_f64();
                let t = Instant::now();
                if outcome.is_ok() {
                    // SIGINT or SIGTERM: the group ends here, unfinished.
                    outcome = offgnn_shared::signals::check()
                        .map_err(Error::from)
                        .and_then(|()| self.check_finite(c as u64 * chunk_rows, &chunk))
                        .and_then(|()| each(c, &chunk));
                    if outcome.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                times.scatter += t.elapsed().as_secs_f64();
                bar.inc(chunk.rows as u64 * self.row_bytes());
                let _ = free_tx.send(chunk);
                waited = Instant::now();
            }
            drop(free_tx);
            let read = reader.join().expect("the reader thread does not panic")?;
            outcome.map(|()| read)
        })
    }

    /// Refuses a chunk of the features, its first row node `first_row`,
    /// that holds a NaN or an infinity, naming the node and column.
    fn check_finite(&self, first_row: u64, chunk: &Chunk) -> Result<()> {
        if !self.features {
            return Ok(());
        }
        // Blocks tested without an early exit vectorize; only a block that
        // holds one is searched.
        let values = chunk.values();
        let bad = values
            .chunks(1024)
            .enumerate()
            .find(|(_, block)| block.iter().fold(false, |acc, v| acc | !v.is_finite()))
            .and_then(|(k, block)| {
                let i = block.iter().position(|v| !v.is_finite())?;
                Some((k * 1024 + i, block[i]))
            });
        match bad {
            None => Ok(()),
            Some((i, value)) => Err(Error::InvalidArgument(format!(
                "{}: node {}, column {} is {value}: the features hold NaN or infinity, which would make NaN predictions; fix the file (`sampler inspect` names the first)",
                self.path.display(),
                first_row + (i / self.width) as u64,
                i % self.width
            ))),
        }
    }

    /// Whether the stream reads straight into the chunks' memory: float32
    /// rows in this machine's byte order, starting on a float's boundary.
    fn reads_in_place(&self) -> bool {
        self.dtype == DType::F32
            && cfg!(target_endian = "little")
            && self.data_offset.is_multiple_of(4)
    }

    /// The reader side of [`Input::stream`] where the rows need no
    /// conversion: each chunk's bytes are read straight into its memory
    /// (O_DIRECT, whole pages, from the page boundary before its rows), the
    /// next chunk's reads queued before this one is handed on, so the disk
    /// never waits for the hand-over and no byte is copied. A page shared
    /// by two chunks is read once, by the first to need it: the next chunk
    /// in the file gets its bytes of that page copied (a few KB), and the
    /// chunk before `first`, handed on last, the bytes of `first`'s first
    /// page that are its own. At most `STREAM_AHEAD + 2` chunks exist, as
    /// the memory plan counts them.
    fn read_into_chunks(
        &self,
        engine: &IoEngine,
        chunk_rows: u64,
        first: usize,
        full: &SyncSender<(usize, Chunk)>,
        free: &Receiver<Chunk>,
        stop: &AtomicBool,
    ) -> Result<u64> {
        let file = engine.open(&self.path)?;
        let end = self.data_offset + self.rows * self.row_bytes();
        let chunks = self.rows.div_ceil(chunk_rows) as usize;
        let order: Vec<usize> = (first..chunks).chain(0..first).collect();
        let stopped = || stop.load(Ordering::Relaxed);
        let mut handover = Handover {
            input: self,
            first,
            chunks,
            end,
            // Whole pages up to the last one the rows fill, read directly;
            // the bytes after it through the page cache.
            direct_end: if file.is_direct() {
                end / PAGE * PAGE
            } else {
                end
            },
            carry: Vec::new(),
            wrap: Vec::new(),
            read: 0,
        };
        let mut made = 0;
        let mut in_flight = VecDeque::new();
        for i in 0..order.len() {
            if stopped() {
                break;
            }
            let span = self.chunk_span(&order, i, first, chunk_rows);
            let chunk = match free.try_recv() {
                Ok(chunk) => chunk,
                Err(_) if made < STREAM_AHEAD + 2 => {
                    made += 1;
                    Chunk::new(chunk_rows as usize, self.width, self.pinned)?
                }
                Err(_) => match free.recv() {
                    Ok(chunk) => chunk,
                    // The consumer is gone.
                    Err(_) => break,
                },
            };
            let page = span.s / PAGE * PAGE;
            let direct_to = span.read_to.min(handover.direct_end).max(span.read_from);
            let reqs = ReadReq::span(
                (span.read_from, direct_to),
                REQUEST,
                (span.read_from - page) as usize,
            );
            in_flight.push_back((span, engine.read_behind(&file, &reqs, chunk)?));
            if in_flight.len() == 2 {
                let next = in_flight.pop_front().expect("two in flight");
                handover.finish(next, full, stop)?;
            }
        }
        while let Some(next) = in_flight.pop_front() {
            handover.finish(next, full, stop)?;
        }
        Ok(handover.read)
    }

    /// The span of the `i`-th chunk of the stream's `order` (see
    /// [`ChunkSpan`]).
    fn chunk_span(&self, order: &[usize], i: usize, first: usize, chunk_rows: u64) -> ChunkSpan {
        let rb = self.row_bytes();
        let end = self.data_offset + self.rows * rb;
        let c = order[i];
        let s = self.data_offset + c as u64 * chunk_rows * rb;
        let e = (self.data_offset + ((c as u64 + 1) * chunk_rows).min(self.rows) * rb).min(end);
        let head_carried = i > 0 && order[i - 1] + 1 == c && !s.is_multiple_of(PAGE);
        let tail_wrapped = first > 0 && c + 1 == first && !e.is_multiple_of(PAGE);
        let page = s / PAGE * PAGE;
        let read_from = if head_carried {
            s.next_multiple_of(PAGE)
        } else {
            page
        };
        let read_to = if tail_wrapped {
            e / PAGE * PAGE
        } else {
            e.next_multiple_of(PAGE)
        }
        .max(read_from);
        ChunkSpan {
            c,
            s,
            e,
            read_from,
            read_to,
            head_carried,
            tail_wrapped,
        }
    }

    /// The reader side of [`Input::stream`]: sends whole chunks in the
    /// stream's order. The rows from chunk `first` on are read first, from
    /// the page that chunk starts on; the bytes of that page before the
    /// chunk belong to chunk `first - 1` and are kept until the second run
    /// (from the page the data starts on up to that page) reaches them, so
    /// no byte is read twice.
    fn read_chunks(
        &self,
        engine: &IoEngine,
        chunk_rows: u64,
        first: usize,
        full: SyncSender<(usize, Chunk)>,
        free: Receiver<Chunk>,
        stop: &AtomicBool,
    ) -> Result<u64> {
        let file = engine.open(&self.path)?;
        let data = self.data_offset;
        let end = data + self.rows * self.row_bytes();
        let split = (data + first as u64 * chunk_rows * self.row_bytes()).min(end);
        let (data_page, split_page) = (data / PAGE * PAGE, split / PAGE * PAGE);
        // Two calls' room: the next is read while this one's bytes are
        // converted into the chunks (see [`IoEngine::read_span`]).
        let mut buf = AlignedBuf::new(2 * REQUEST * PER_CALL);
        let from = split_page.max(data_page);
        // The first run's bytes before chunk `first`.
        let lead = (split - from) as usize;
        let mut chunker = Chunker {
            input: self,
            chunk_rows: chunk_rows as usize,
            filling: None,
            filled: 0,
            odd: Vec::new(),
            chunk: first,
            skip: lead,
            full: &full,
            free: &free,
            stop,
            failed: None,
        };
        let mut carried = Vec::with_capacity(lead);
        let mut read = read_range(
            engine,
            &file,
            &self.path,
            (from, end),
            &mut buf,
            stop,
            |bytes| {
                let take = (lead - carried.len()).min(bytes.len());
                carried.extend_from_slice(&bytes[..take]);
                chunker.feed(bytes);
            },
        )?;
        chunker.flush();
        if first > 0 {
            chunker.chunk = 0;
            chunker.skip = (data - data_page) as usize;
            read += read_range(
                engine,
                &file,
                &self.path,
                (data_page, from),
                &mut buf,
                stop,
                |bytes| chunker.feed(bytes),
            )?;
            chunker.feed(&carried);
            chunker.flush();
        }
        match chunker.failed {
            Some(e) => Err(e),
            None => Ok(read),
        }
    }
}

/// Where a chunk's rows lie in its layer's file (`[s, e)`), the bytes
/// the stream reads for it (`[read_from, read_to)`, whole pages, clipped
/// to the rows' end), and which of its bytes come from another chunk's
/// pages instead: its first partial page (read for the chunk before it)
/// or its last (read for chunk `first`, at the stream's start).
struct ChunkSpan {
    c: usize,
    s: u64,
    e: u64,
    read_from: u64,
    read_to: u64,
    head_carried: bool,
    tail_wrapped: bool,
}

/// What [`Input::read_into_chunks`] keeps from chunk to chunk: the bytes of
/// the pages two chunks share, and the bytes read so far.
struct Handover<'a> {
    input: &'a Input,
    first: usize,
    chunks: usize,
    /// Where the rows end, and where the pages read directly end.
    end: u64,
    direct_end: u64,
    /// The next chunk's bytes of the page this one ends in, and the
    /// bytes of chunk `first`'s first page before it.
    carry: Vec<u8>,
    wrap: Vec<u8>,
    read: u64,
}

impl Handover<'_> {
    /// Completes a chunk whose direct reads were queued: its bytes past
    /// the last whole page, those of its pages another chunk read, and
    /// where its rows start; then sends it on, unless the stream stopped.
    fn finish(
        &mut self,
        (span, pending): (ChunkSpan, PendingRead<'_, Chunk>),
        full: &SyncSender<(usize, Chunk)>,
        stop: &AtomicBool,
    ) -> Result<()> {
        let (n, mut chunk) = pending.wait();
        self.read += n?;
        let lead = chunk.page_lead();
        let page = span.s / PAGE * PAGE;
        let mem = ReadTarget::target(&mut chunk);
        // The bytes past the last whole page, through the page cache.
        let (b0, b1) = (
            span.read_from.max(self.direct_end),
            span.read_to.min(self.end),
        );
        if b0 < b1 {
            let path = &self.input.path;
            let f = File::open(path).map_err(|e| Error::io(path.display(), e))?;
            f.read_exact_at(&mut mem[(b0 - page) as usize..(b1 - page) as usize], b0)
                .map_err(|e| Error::io(path.display(), e))?;
            self.read += b1 - b0;
        }
        if span.head_carried {
            let at = (span.s - page) as usize;
            mem[at..at + self.carry.len()].copy_from_slice(&self.carry);
        }
        if span.tail_wrapped {
            let at = (span.e / PAGE * PAGE - page) as usize;
            mem[at..at + self.wrap.len()].copy_from_slice(&self.wrap);
        }
        if span.c == self.first && self.first > 0 {
            self.wrap = mem[..(span.s - page) as usize].to_vec();
        }
        self.carry.clear();
        if span.c + 1 < self.chunks && !span.tail_wrapped {
            let to = span.e.next_multiple_of(PAGE).min(self.end);
            self.carry
                .extend_from_slice(&mem[(span.e - page) as usize..(to - page) as usize]);
        }
        // On a float's boundary: the memory's start is, and so are the
        // data offset and the rows (`reads_in_place`).
        debug_assert!((lead + (span.s - page) as usize).is_multiple_of(4));
        chunk.start = (lead + (span.s - page) as usize) / 4;
        chunk.rows = ((span.e - span.s) / self.input.row_bytes()) as usize;
        if !stop.load(Ordering::Relaxed) {
            // A closed channel means the consumer stopped on an error.
            let _ = full.send((span.c, chunk));
        }
        Ok(())
    }
}

/// Reads `path`'s bytes `[from, to)` front to back (`from` on a page) in
/// requests of `REQUEST` bytes, `PER_CALL` of them queued together, and
/// hands each call's bytes to `each`; on an O_DIRECT file a partial last
/// page is read buffered. Ends early once `stop` is set (the consumer
/// failed or was signalled). Returns the bytes read.
fn read_range(
    engine: &IoEngine,
    file: &IoFile,
    path: &Path,
    (from, to): (u64, u64),
    buf: &mut AlignedBuf,
    stop: &AtomicBool,
    mut each: impl FnMut(&[u8]),
) -> Result<u64> {
    let stopped = || stop.load(Ordering::Relaxed);
    let direct_to = if file.is_direct() {
        (to / PAGE * PAGE).max(from)
    } else {
        to
    };
    let mut at = from;
    if !stopped() {
        at += engine.read_span(file, (from, direct_to), REQUEST, PER_CALL, buf, |bytes| {
            each(bytes);
            !stopped()
        })?;
    }
    if at < to && !stopped() {
        let mut tail = vec![0u8; (to - at) as usize];
        let f = File::open(path).map_err(|e| Error::io(path.display(), e))?;
        f.read_exact_at(&mut tail, at)
            .map_err(|e| Error::io(path.display(), e))?;
        each(&tail);
        at = to;
    }
    Ok(at - from)
}

/// Where a stream's time went: waiting for the disk, and in the work on
/// each chunk (projection and scatter).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StreamTimes {
    pub(super) io_wait: f64,
    pub(super) scatter: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::ALIGN_NODES;

    /// Streams a file of `rows` rows of `width` float32 values (row r's
    /// values r * width..) after a header of `offset` bytes, in chunks of
    /// 1024 rows from chunk `first` on; checks each chunk's rows and the
    /// order, and returns the bytes read.
    fn stream_rows(engine: &IoEngine, offset: u64, rows: u64, width: usize, first: usize) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.bin");
        let mut bytes = vec![0xA5u8; offset as usize];
        for v in 0..rows as usize * width {
            bytes.extend_from_slice(&(v as f32).to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let input = Input {
            path,
            data_offset: offset,
            rows,
            width,
            dtype: DType::F32,
            pinned: false,
            features: true,
        };
        let chunk_rows = ALIGN_NODES;
        let chunks = rows.div_ceil(chunk_rows) as usize;
        let mut seen = Vec::new();
        let read = input
            .stream(
                engine,
                chunk_rows,
                first,
                &mut StreamTimes::default(),
                &indicatif::ProgressBar::hidden(),
                |c, chunk| {
                    let r0 = c as u64 * chunk_rows;
                    let want: Vec<f32> = (r0 as usize * width
                        ..(r0 + chunk_rows).min(rows) as usize * width)
                        .map(|v| v as f32)
                        .collect();
                    assert!(
                        chunk.values() == want,
                        "offset {offset}, first {first}: chunk {c}"
                    );
                    // SAFETY: `t` is only read, and dropped when this
                    // closure returns.
                    let t = unsafe { chunk.tensor() };
                    assert_eq!(t.size(), [(want.len() / width) as i64, width as i64]);
                    assert_eq!(t.double_value(&[0, 0]), want[0] as f64);
                    seen.push(c);
                    Ok(())
                },
            )
            .unwrap();
        let order: Vec<usize> = (first..chunks).chain(0..first).collect();
        assert_eq!(seen, order, "offset {offset}, first {first}");
        read
    }

    #[test]
    fn streams_hand_every_row_once_whatever_the_pages() {
        // Chunks of 1024 rows of 3 values are 3 pages; the last chunk is
        // 17 rows, inside one page. A header of 128 bytes puts every chunk
        // boundary inside a page (read once, for the chunk before it, in
        // place); 4096 on one; 130 makes the rows' floats unaligned, so the
        // reader converts them through its buffer instead.
        let rows = 5 * ALIGN_NODES + 17;
        for direct in [true, false] {
            let engine = IoEngine::new(offgnn_shared::io_engine::IoOptions {
                direct,
                ..Default::default()
            });
            for offset in [128u64, 4096, 130] {
                assert_eq!(
                    Input {
                        path: PathBuf::new(),
                        data_offset: offset,
                        rows,
                        width: 3,
                        dtype: DType::F32,
                        pinned: false,
                        features: true,
                    }
                    .reads_in_place(),
                    offset % 4 == 0
                );
                for first in [0, 1, 3, 5] {
                    let read = stream_rows(&engine, offset, rows, 3, first);
                    // Every byte from the page the rows start on, once.
                    assert_eq!(
                        read,
                        offset % PAGE + rows * 12,
                        "direct {direct}, offset {offset}, first {first}"
                    );
                }
            }
        }
    }

    /// A NaN in the features stops the stream at its chunk, naming the
    /// node and column; a hidden layer's output is streamed as it is.
    #[test]
    fn a_non_finite_feature_is_refused_naming_node_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("feat.bin");
        let (rows, width) = (3 * ALIGN_NODES, 5usize);
        let mut values = vec![0.5f32; rows as usize * width];
        let node = ALIGN_NODES + 7;
        values[node as usize * width + 3] = f32::NAN;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&path, bytes).unwrap();
        let engine = IoEngine::new(Default::default());
        for features in [true, false] {
            let input = Input {
                path: path.clone(),
                data_offset: 0,
                rows,
                width,
                dtype: DType::F32,
                pinned: false,
                features,
            };
            let mut seen = 0;
            let outcome = input.stream(
                &engine,
                ALIGN_NODES,
                0,
                &mut StreamTimes::default(),
                &indicatif::ProgressBar::hidden(),
                |_, _| {
                    seen += 1;
                    Ok(())
                },
            );
            if features {
                let err = outcome.unwrap_err().to_string();
                assert!(
                    err.contains(&format!("node {node}, column 3 is NaN")),
                    "{err}"
                );
                assert_eq!(seen, 1);
            } else {
                outcome.unwrap();
                assert_eq!(seen, 3);
            }
        }
    }
}
