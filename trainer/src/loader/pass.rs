//! One pass of a loader on a thread of its own: what it produces waits in
//! a bounded queue (the back-pressure), and ending the pass early closes
//! the queue, which the producer sees at its next batch, then joins it.

use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Next;
use crate::error::{Error, Result};

/// A pass in progress: the queue of finished batches, and the thread that
/// produces them from `S` and gives `S` back when it ends.
pub(super) struct Pass<B, S> {
    batches: Receiver<Result<B>>,
    thread: JoinHandle<S>,
}

impl<B: Send + 'static, S: Send + 'static> Pass<B, S> {
    /// Starts `produce` on `state` on a thread of its own; each batch it
    /// hands its sender waits in a queue of `prefetch`. The sender fails
    /// once the queue is closed, which ends `produce`; a failure of its
    /// own reaches the caller after the batches before it.
    pub(super) fn start<F>(prefetch: usize, state: S, produce: F) -> Result<Pass<B, S>>
    where
        F: FnOnce(&S, &mut dyn FnMut(B) -> Result<()>) -> Result<()> + Send + 'static,
    {
        let (tx, rx) = sync_channel::<Result<B>>(prefetch);
        let thread = std::thread::Builder::new()
            .name("offgnn-loader".into())
            .spawn(move || {
                let mut send = |b: B| {
                    tx.send(Ok(b))
                        .map_err(|_| Error::Stopped("the loader was closed".into()))
                };
                if let Err(e) = produce(&state, &mut send)
                    && !matches!(e, Error::Stopped(_))
                {
                    let _ = tx.send(Err(e));
                }
                state
            })
            .map_err(|e| Error::io("starting the loader's thread", e))?;
        Ok(Pass {
            batches: rx,
            thread,
        })
    }

    /// The next batch, waiting at most `wait`; the producer's failure as
    /// an error. After `Done` or an error the pass is over: end it.
    pub(super) fn next(&self, wait: Duration) -> Result<Next<B>> {
        match self.batches.recv_timeout(wait) {
            Ok(Ok(b)) => Ok(Next::Batch(Box::new(b))),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(Next::Waiting),
            Err(RecvTimeoutError::Disconnected) => Ok(Next::Done),
        }
    }

    /// Closes the queue and joins the thread: its state back.
    pub(super) fn end(self) -> S {
        drop(self.batches);
        self.thread
            .join()
            .expect("the loader's thread does not panic")
    }
}

/// Whether what [`Pass::next`] found ends the pass.
pub(super) fn over<B>(got: &Result<Next<B>>) -> bool {
    !matches!(got, Ok(Next::Batch(_) | Next::Waiting))
}
