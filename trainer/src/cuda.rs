//! What the CUDA path needs of libtorch beyond tch: side streams, events
//! (to order streams, and to time stages on the device), the caching
//! allocator's stream bookkeeping, and pinned host memory. A safe wrapper
//! over csrc/torch_shim.cpp, which reaches all of it through c10's
//! device-generic interfaces: on a machine without a GPU each call fails
//! with libtorch's message.

use std::ptr::NonNull;

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

unsafe extern "C" {
    fn offgnn_shim_free_string(s: *mut libc::c_char);
    fn offgnn_stream_from_pool(
        device: libc::c_int,
        err: *mut *mut libc::c_char,
    ) -> *mut libc::c_void;
    fn offgnn_stream_free(stream: *mut libc::c_void);
    fn offgnn_stream_make_current(
        stream: *mut libc::c_void,
        err: *mut *mut libc::c_char,
    ) -> libc::c_int;
    fn offgnn_event_record(
        device: libc::c_int,
        timing: libc::c_int,
        err: *mut *mut libc::c_char,
    ) -> *mut libc::c_void;
    fn offgnn_event_free(event: *mut libc::c_void);
    fn offgnn_event_block(event: *mut libc::c_void, err: *mut *mut libc::c_char) -> libc::c_int;
    fn offgnn_event_synchronize(
        event: *mut libc::c_void,
        err: *mut *mut libc::c_char,
    ) -> libc::c_int;
    fn offgnn_event_elapsed_ms(
        start: *mut libc::c_void,
        end: *mut libc::c_void,
        ms: *mut f64,
        err: *mut *mut libc::c_char,
    ) -> libc::c_int;
    fn offgnn_record_stream(tensor: *mut libc::c_void, err: *mut *mut libc::c_char) -> libc::c_int;
    fn offgnn_empty_pinned(bytes: i64, err: *mut *mut libc::c_char) -> *mut libc::c_void;
}

/// The message a shim call left in `err` (and frees it).
pub(crate) fn take_error(err: *mut libc::c_char) -> String {
    if err.is_null() {
        return "unknown error".into();
    }
    // SAFETY: the shims return a NUL-terminated malloc'd string or null.
    let message = unsafe { std::ffi::CStr::from_ptr(err) }
        .to_string_lossy()
        .trim()
        .to_string();
    // SAFETY: allocated by the shims with malloc.
    unsafe { offgnn_shim_free_string(err) };
    message
}

fn failed(what: &str, err: *mut libc::c_char) -> Error {
    Error::torch(what, tch::TchError::Torch(take_error(err)))
}

/// Runs a shim call that returns 0 on success.
fn status(what: &str, f: impl FnOnce(*mut *mut libc::c_char) -> libc::c_int) -> Result<()> {
    let mut err = std::ptr::null_mut();
    if f(&mut err) == 0 {
        Ok(())
    } else {
        Err(failed(what, err))
    }
}

/// Runs a shim call that returns a new object, or null on failure.
fn object(
    what: &str,
    f: impl FnOnce(*mut *mut libc::c_char) -> *mut libc::c_void,
) -> Result<NonNull<libc::c_void>> {
    let mut err = std::ptr::null_mut();
    NonNull::new(f(&mut err)).ok_or_else(|| failed(what, err))
}

fn cuda_index(device: Device) -> Result<libc::c_int> {
    match device {
        Device::Cuda(i) => Ok(i as libc::c_int),
        other => Err(Error::Internal(format!("{other:?} has no CUDA streams"))),
    }
}

/// A CUDA stream from libtorch's pool.
pub struct Stream(NonNull<libc::c_void>);

// SAFETY: a c10::Stream is a plain value (device and id); CUDA streams may
// be used from any thread.
unsafe impl Send for Stream {}

impl Stream {
    pub fn from_pool(device: Device) -> Result<Stream> {
        let index = cuda_index(device)?;
        // SAFETY: the shim catches every exception.
        object("a CUDA stream", |err| unsafe {
            offgnn_stream_from_pool(index, err)
        })
        .map(Stream)
    }

    /// From now on, the work this thread queues on the stream's device
    /// goes to this stream (libtorch keeps a current stream per thread).
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: a live stream; the shim catches every exception.
        status("setting the current CUDA stream", |err| unsafe {
            offgnn_stream_make_current(self.0.as_ptr(), err)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: made by offgnn_stream_from_pool, freed once.
        unsafe { offgnn_stream_free(self.0.as_ptr()) }
    }
}

/// A CUDA event, recorded on the calling thread's current stream.
pub struct Event(NonNull<libc::c_void>);

// SAFETY: CUDA events may be waited on and queried from any thread; each
// Event is used by one thread at a time (it moves with its batch).
unsafe impl Send for Event {}

impl Event {
    /// Records an event now on the current stream of `device`; `timing`
    /// events can be timed against each other.
    pub fn record(device: Device, timing: bool) -> Result<Event> {
        let index = cuda_index(device)?;
        // SAFETY: the shim catches every exception.
        object("recording a CUDA event", |err| unsafe {
            offgnn_event_record(index, libc::c_int::from(timing), err)
        })
        .map(Event)
    }

    /// The calling thread's current stream waits, on the device, for the
    /// work queued before the event (the host goes on at once).
    pub fn wait_on_device(&self) -> Result<()> {
        // SAFETY: a live event; the shim catches every exception.
        status("waiting for a CUDA event", |err| unsafe {
            offgnn_event_block(self.0.as_ptr(), err)
        })
    }

    /// The host waits until the work queued before the event is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event; the shim catches every exception.
        status("synchronizing a CUDA event", |err| unsafe {
            offgnn_event_synchronize(self.0.as_ptr(), err)
        })
    }

    /// Seconds on the device from this event to `end` (both timing events;
    /// waits for `end`).
    pub fn seconds_to(&self, end: &Event) -> Result<f64> {
        end.synchronize()?;
        let mut ms = 0.0;
        // SAFETY: live events; the shim catches every exception.
        status("timing CUDA events", |err| unsafe {
            offgnn_event_elapsed_ms(self.0.as_ptr(), end.0.as_ptr(), &mut ms, err)
        })?;
        Ok(ms / 1e3)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: made by offgnn_event_record, freed once.
        unsafe { offgnn_event_free(self.0.as_ptr()) }
    }
}

/// Tells libtorch's caching allocator that `t`'s memory is in use on the
/// calling thread's current stream, so it is not handed out again before
/// that stream is done with it (torch's `Tensor.record_stream`): needed
/// where a tensor made on a side stream is used on another.
pub fn record_stream(t: &Tensor) -> Result<()> {
    // SAFETY: a live tensor (tch's C_tensor is an at::Tensor*); the shim
    // reads it and catches every exception.
    status("recording a tensor's stream", |err| unsafe {
        offgnn_record_stream(t.as_ptr() as *mut libc::c_void, err)
    })
}

/// `bytes` of page-locked host memory as a uint8 tensor, from libtorch's
/// caching host allocator (which rounds a block up to a power of two, and
/// gives a block out again only after the copies queued from it are done).
pub fn pinned(bytes: usize) -> Result<Tensor> {
    // SAFETY: the shim catches every exception and returns a new
    // at::Tensor* that the Tensor below owns.
    let t = object("page-locked host memory", |err| unsafe {
        offgnn_empty_pinned(bytes as i64, err)
    })?;
    // SAFETY: a new at::Tensor*, owned by nothing else.
    let t = unsafe { Tensor::from_ptr(t.as_ptr().cast()) };
    debug_assert_eq!(t.kind(), Kind::Uint8);
    Ok(t)
}

/// What the training pipeline does on CUDA, once, on a thread of its own
/// (a current stream is per thread): a side stream, a page-locked buffer,
/// a non-blocking copy on the stream, an event the default stream waits
/// on, the allocator told of the tensor's use there, and the copy checked.
/// `trainer info` runs it on each GPU.
pub fn staged_copy_check(device: Device) -> Result<()> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            let side = Stream::from_pool(device)?;
            side.make_current()?;
            let mut host = pinned(1 << 20)?;
            let _ = host.f_fill_(7)?;
            let dev = host.f_to_device_(device, tch::Kind::Uint8, true, false)?;
            let copied = Event::record(device, true)?;
            let sum = std::thread::scope(|t| {
                t.spawn(move || -> Result<i64> {
                    copied.wait_on_device()?;
                    record_stream(&dev)?;
                    Ok(dev.f_sum(tch::Kind::Int64)?.int64_value(&[]))
                })
                .join()
                .expect("the check does not panic")
            })?;
            if sum != 7 << 20 {
                return Err(Error::Internal(format!(
                    "a staged copy summed to {sum}, not {}",
                    7 << 20
                )));
            }
            Ok(())
        })
        .join()
        .expect("the check does not panic")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Without a GPU every call fails with libtorch's message, not a crash:
    // the CPU path never makes these calls, but a misconfigured run must
    // get an error it can print.
    #[test]
    fn without_a_gpu_the_calls_fail_with_a_message() {
        if tch::Cuda::is_available() {
            return;
        }
        assert!(Stream::from_pool(Device::Cpu).is_err());
        let e = Stream::from_pool(Device::Cuda(0))
            .err()
            .expect("no GPU here");
        assert!(!e.to_string().is_empty());
        assert!(Event::record(Device::Cuda(0), true).is_err());
        let e = pinned(4096).expect_err("no GPU here");
        assert!(e.to_string().contains("page-locked"), "{e}");
    }
}
