//! One buffer per batch that goes to the device in one copy: page-locked
//! on CUDA (the copy non-blocking), plain memory on the CPU; the rows and
//! int64 indices written into it, and views of it once uploaded.

use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Host memory for one batch's upload: page-locked on CUDA, where a
/// non-blocking copy from it leaves the host free and libtorch's caching
/// host allocator reuses the block once that copy is done; plain memory on
/// the CPU, where the same code runs in tests.
pub(super) fn staging(bytes: usize, device: Device) -> Result<Tensor> {
    // Never empty: a zero-byte tensor has no memory to point at.
    let bytes = bytes.max(8);
    match device {
        Device::Cuda(_) => crate::cuda::pinned(bytes),
        _ => Ok(Tensor::f_empty([bytes as i64], (Kind::Uint8, Device::Cpu))?),
    }
}

/// The bytes of a staging tensor, to write the batch into.
pub(super) fn staged_bytes(t: &mut Tensor) -> &mut [u8] {
    let len = t.numel();
    debug_assert_eq!(t.kind(), Kind::Uint8);
    // SAFETY: a new contiguous uint8 host tensor of `len` bytes, owned by
    // the caller and borrowed mutably for the slice's life.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<u8>(), len) }
}

/// Writes `v` widened to int64 into `out`, 8 bytes each.
pub(super) fn put_indices(out: &mut [u8], v: impl IntoIterator<Item = i64>) {
    for (o, x) in out.chunks_exact_mut(8).zip(v) {
        o.copy_from_slice(&x.to_ne_bytes());
    }
}

/// The staging tensor on `device`: on CUDA a copy queued on the calling
/// thread's current stream, the host going on at once.
pub(super) fn upload(staged: &Tensor, device: Device) -> Result<Tensor> {
    Ok(staged.f_to_device_(device, Kind::Uint8, true, false)?)
}

/// `[offset, offset + len)` of an uploaded staging tensor, as `len / 8`
/// int64 values.
pub(super) fn indices_at(dev: &Tensor, offset: usize, len: usize) -> Result<Tensor> {
    Ok(dev
        .f_narrow(0, offset as i64, (len * 8) as i64)?
        .f_view_dtype(Kind::Int64)?)
}
