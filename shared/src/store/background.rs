//! [`Background`]: a local object's bytes checksummed and written past the
//! page cache on a thread of its own, so that the thread producing them
//! goes on: where a sampler's encoder wrote the row groups it closed, the
//! sampling pool, its queue full, stood idle meanwhile. The checksum is
//! CRC32C, which the processor computes in its own instruction (SHA-256,
//! before it, cost the sampler's cores a noticeable share).

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use super::StagedWriter;
use super::staged::DIRECT_PUT_PIECE;
use crate::io_engine::AlignedBuf;

/// Pieces queued for the thread: with the one it writes and the one being
/// filled, 10 pieces (40 MiB) at most, so that a row group the encoder
/// closes (16 MiB at once) goes in without waiting.
const QUEUED: usize = 8;

/// What the thread returns: the staged file, to finish, and the bytes'
/// CRC32C.
type Done = std::io::Result<(StagedWriter, u32)>;

pub(super) struct Background {
    /// The piece being filled, and how much of it is.
    piece: AlignedBuf,
    filled: usize,
    to: Option<SyncSender<(AlignedBuf, usize)>>,
    /// Pieces the thread is done with.
    spare: Receiver<AlignedBuf>,
    thread: Option<JoinHandle<Done>>,
}

impl Background {
    pub(super) fn new(mut staged: StagedWriter) -> Background {
        let (to, pieces) = sync_channel::<(AlignedBuf, usize)>(QUEUED);
        let (give_back, spare) = sync_channel(QUEUED + 2);
        let thread = std::thread::spawn(move || -> Done {
            let mut crc = 0u32;
            for (piece, len) in pieces {
                let bytes = &piece.as_slice()[..len];
                crc = crc32c::crc32c_append(crc, bytes);
                staged.append_io(bytes)?;
                let _ = give_back.try_send(piece);
            }
            Ok((staged, crc))
        });
        Background {
            piece: AlignedBuf::new(0),
            filled: 0,
            to: Some(to),
            spare,
            thread: Some(thread),
        }
    }

    /// Copies `bytes` into pieces, handing each full one to the thread.
    pub(super) fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            if self.piece.is_empty() {
                self.piece = self
                    .spare
                    .try_recv()
                    .unwrap_or_else(|_| AlignedBuf::new(DIRECT_PUT_PIECE));
            }
            let n = bytes.len().min(DIRECT_PUT_PIECE - self.filled);
            self.piece.as_mut_slice()[self.filled..][..n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == DIRECT_PUT_PIECE {
                self.send()?;
            }
        }
        Ok(())
    }

    fn send(&mut self) -> std::io::Result<()> {
        let piece = std::mem::replace(&mut self.piece, AlignedBuf::new(0));
        let len = std::mem::take(&mut self.filled);
        let to = self.to.as_ref().expect("sent before finish");
        if to.send((piece, len)).is_err() {
            // The thread stopped on an error: it is the one to report.
            return match self.join() {
                Err(e) => Err(e),
                Ok(_) => Err(std::io::Error::other("the object's writer thread stopped")),
            };
        }
        Ok(())
    }

    /// Hands the thread the last piece and waits for it: the staged file,
    /// to finish, and the CRC32C of every byte written.
    pub(super) fn finish(mut self) -> std::io::Result<(StagedWriter, u32)> {
        if self.filled > 0 {
            self.send()?;
        }
        self.join()
    }

    fn join(&mut self) -> Done {
        self.to = None;
        let thread = self.thread.take().expect("joined once");
        thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the object's writer thread panicked")))
    }
}

impl Drop for Background {
    /// Unfinished: the thread ends with what it was given, and its staged
    /// file, dropped, is removed.
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.join();
        }
    }
}
