//! One buffer per batch that goes to the device in one copy: page-locked
//! on CUDA (the copy non-blocking), plain memory on the CPU; the rows and
//! int64 indices written into it, and views of it once uploaded.

use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Host memory for one batch's upload: page-locked on CUDA, where a
/// non-blocking copy from it leaves the host free and libtorch's caching
/// host allocator reuses the block once that copy is done; plain memory on
/// the CPU, where the same code runs in tests. Its tensor is private, so
/// that no other tensor shares the memory until [`Staging::upload`] takes it.
pub(super) struct Staging(Tensor);

impl Staging {
    pub(super) fn new(bytes: usize, device: Device) -> Result<Staging> {
        // Never empty: a zero-byte tensor has no memory to point at.
        let bytes = bytes.max(8);
        let t = match device {
            Device::Cuda(_) => crate::cuda::pinned(bytes)?,
            _ => Tensor::f_empty([bytes as i64], (Kind::Uint8, Device::Cpu))?,
        };
        assert!(
            t.kind() == Kind::Uint8
                && t.device() == Device::Cpu
                && t.is_contiguous()
                && t.numel() == bytes,
            "staging memory is {bytes} contiguous host bytes"
        );
        Ok(Staging(t))
    }

    /// The bytes, to write the batch into.
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.0.numel();
        // SAFETY: `new` made the tensor, `len` contiguous host bytes (it
        // checked), and no other tensor shares them until `upload` consumes
        // `self`; `&mut self` makes the slice the only access meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.0.data_ptr().cast::<u8>(), len) }
    }

    /// The bytes on `device`: on CUDA a copy queued on the calling
    /// thread's current stream, the host going on at once. Consumes the
    /// staging memory, which on the CPU is the tensor returned.
    pub(super) fn upload(self, device: Device) -> Result<Tensor> {
        Ok(self.0.f_to_device_(device, Kind::Uint8, true, false)?)
    }
}

/// Writes `v` widened to int64 into `out`, 8 bytes each.
pub(super) fn put_indices(out: &mut [u8], v: impl IntoIterator<Item = i64>) {
    for (o, x) in out.chunks_exact_mut(8).zip(v) {
        o.copy_from_slice(&x.to_ne_bytes());
    }
}

/// `[offset, offset + len)` of an uploaded staging tensor, as `len / 8`
/// int64 values.
pub(super) fn indices_at(dev: &Tensor, offset: usize, len: usize) -> Result<Tensor> {
    Ok(dev
        .f_narrow(0, offset as i64, (len * 8) as i64)?
        .f_view_dtype(Kind::Int64)?)
}
