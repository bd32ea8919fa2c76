//! Torch tensors over host memory the run already holds: views, products
//! written straight into reused buffers, and copies between tensors and
//! vectors (a group's rows are gigabytes; fresh pages cost more than the
//! work on them).

use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// The first `len` values of a contiguous CPU float32 tensor, borrowed
/// with it.
///
/// # Safety
/// Nothing writes those values while the slice lives: neither `t` nor any
/// tensor that shares its memory (a view, a shallow clone, a CPU
/// `to_device` of it), which the borrow of `t` does not rule out.
pub(super) unsafe fn cpu_values(t: &Tensor, len: usize) -> &[f32] {
    assert!(
        t.device() == Device::Cpu
            && t.kind() == Kind::Float
            && t.is_contiguous()
            && t.numel() >= len,
        "a contiguous CPU float32 tensor of at least {len} values"
    );
    if len == 0 {
        return &[];
    }
    // SAFETY: checked just above: `len` float32 values lie contiguously
    // from the tensor's data pointer, in memory the tensor keeps alive
    // while `t` is borrowed; the caller keeps them unwritten meanwhile.
    unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<f32>(), len) }
}

/// A reused CPU float32 buffer for a chunk's matmul product: a fresh one
/// per chunk costs page faults and clearing, more than the matmul itself
/// on a narrow layer.
#[derive(Default)]
pub(super) struct Scratch {
    t: Option<Tensor>,
}

impl Scratch {
    /// `x · w` into the buffer; its values, row after row of `w`'s width.
    pub(super) fn product(&mut self, x: &Tensor, w: &Tensor) -> Result<&[f32]> {
        let (rows, width) = (x.size()[0], w.size()[1]);
        let n = rows * width;
        if self.t.as_ref().is_none_or(|t| t.numel() < n as usize) {
            self.t = Some(Tensor::f_empty([n], (Kind::Float, Device::Cpu))?);
        }
        let t = self.t.as_ref().expect("allocated above");
        matmul_into(x, w, &mut t.narrow(0, 0, n).view([rows, width]))?;
        // SAFETY: `self.t` is this scratch's own, never handed out; the view
        // above, the only other tensor over its memory, is dropped, and the
        // values keep `self` borrowed mutably, so no product writes them.
        Ok(unsafe { cpu_values(t, n as usize) })
    }
}

/// `x · w` into `out` (on the CPU): on the CPU with no intermediate, else
/// made on `x`'s device and copied over.
fn matmul_into(x: &Tensor, w: &Tensor, out: &mut Tensor) -> Result<()> {
    if x.device() == Device::Cpu {
        let _ = x.f_matmul_out(out, w)?;
    } else {
        out.f_copy_(&x.f_matmul(w)?)?;
    }
    Ok(())
}

/// `x · w` written straight into `dst` (`x`'s rows times `w`'s width
/// values, row after row).
pub(super) fn product_into(x: &Tensor, w: &Tensor, dst: &mut [f32]) -> Result<()> {
    let (rows, width) = (x.size()[0], w.size()[1]);
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: `matmul_into` writes the tensor and keeps nothing over it.
    unsafe { on_values(dst, &[rows, width], |out| matmul_into(x, w, out)) }
}

/// Runs `f` on a CPU float32 tensor of `shape` (row-major) over `values`,
/// with no copy: where a group's rows are gigabytes, torch's ops write
/// straight into buffers already paged in.
///
/// # Safety
/// `f` keeps no tensor over `values` past its return: neither the tensor
/// (a shallow clone of it) nor a view or a CPU `to_device` of it, nor the
/// result of an in-place op, which is the tensor again.
pub(super) unsafe fn on_values<T>(
    values: &mut [f32],
    shape: &[i64],
    f: impl FnOnce(&mut Tensor) -> Result<T>,
) -> Result<T> {
    assert_eq!(
        shape.iter().product::<i64>(),
        values.len() as i64,
        "the shape covers the values"
    );
    let mut strides = vec![1i64; shape.len()];
    for i in (1..shape.len()).rev() {
        strides[i - 1] = strides[i] * shape[i];
    }
    // SAFETY: `values` holds exactly the shape's float32 values (checked
    // above), contiguously in row-major order, and is borrowed mutably for
    // this call: the tensor, dropped at its end (`f` keeps none, by the
    // caller's word), is the only access to them meanwhile.
    let mut t = unsafe {
        Tensor::f_from_blob(
            values.as_mut_ptr().cast::<u8>(),
            shape,
            &strides,
            Kind::Float,
            Device::Cpu,
        )?
    };
    f(&mut t)
}

pub(super) fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    let flat = t
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Float)?
        .f_contiguous()?
        .f_view([-1])?;
    Ok(Vec::<f32>::try_from(&flat)?)
}

/// `t`'s values into `buf`, reusing its memory: a group's rows are
/// gigabytes, and fresh pages cost more than the copy (the kernel clears
/// each one on first touch).
pub(super) fn copy_into(t: &Tensor, buf: &mut Vec<f32>) -> Result<()> {
    let t = t
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Float)?
        .f_contiguous()?;
    let n = t.numel();
    buf.clear();
    buf.resize(n, 0.0);
    t.f_copy_data(buf, n)?;
    Ok(())
}

/// `values` as `rows` rows on `device` (copied).
pub(super) fn tensor(values: &[f32], rows: i64, device: Device) -> Result<Tensor> {
    Ok(Tensor::f_from_slice(values)?
        .f_view([rows, -1])?
        .f_to_device(device)?)
}
