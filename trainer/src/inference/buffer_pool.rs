//! The pool of buffers a run hands from group to group and layer to
//! layer, so that their pages are faulted in once.

use rayon::prelude::*;

/// Buffers a run hands from group to group and layer to layer: a group's
/// rows are GBs, and fresh pages cost more than the work on them (the
/// kernel clears each on first touch). A request
/// gets the smallest buffer that holds it, else the largest one, grown.
#[derive(Default)]
pub(super) struct Spares(Vec<Vec<f32>>);

impl Spares {
    /// An empty buffer with room for `capacity` values.
    pub(super) fn take_empty(&mut self, capacity: usize) -> Vec<f32> {
        let mut buf = self.pick(capacity);
        buf.clear();
        buf.reserve(capacity);
        buf
    }

    /// The smallest buffer that holds `capacity` values, else the largest,
    /// else a new one; as it was given back.
    fn pick(&mut self, capacity: usize) -> Vec<f32> {
        let fits = (0..self.0.len())
            .filter(|&i| self.0[i].capacity() >= capacity)
            .min_by_key(|&i| self.0[i].capacity());
        let largest = (0..self.0.len()).max_by_key(|&i| self.0[i].capacity());
        fits.or(largest)
            .map(|i| self.0.swap_remove(i))
            .unwrap_or_default()
    }

    /// A buffer of `len` values that the caller overwrites, every one: a
    /// reused buffer keeps its old values (clearing gigabytes the caller
    /// writes anyway is time lost); only values it never held are zeroed,
    /// as [`Spares::take`] does.
    pub(super) fn take_overwritten(&mut self, len: usize) -> Vec<f32> {
        let mut buf = self.pick(len);
        if buf.len() >= len {
            buf.truncate(len);
            return buf;
        }
        if buf.capacity() < len {
            // Grown: nothing of the old values is worth the copy.
            buf.clear();
            buf.reserve(len);
        }
        let old = buf.len();
        buf.spare_capacity_mut()[..len - old]
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
        // SAFETY: the first `old` values were there, the rest up to `len`
        // are written just above.
        unsafe { buf.set_len(len) };
        buf
    }

    /// A buffer of `len` zeros, written by the thread pool: gigabytes of
    /// fresh pages are faulted in (and zeroed by the kernel) on each
    /// thread at once, not by one thread's `resize`; faulted in later, by
    /// the scatter, they would cost the stream more.
    pub(super) fn take(&mut self, len: usize) -> Vec<f32> {
        let mut buf = self.take_empty(len);
        buf.spare_capacity_mut()[..len]
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
        // SAFETY: `take_empty` leaves the buffer empty with room for `len`
        // values, all written just above.
        unsafe { buf.set_len(len) };
        buf
    }

    pub(super) fn give(&mut self, buf: Vec<f32>) {
        if buf.capacity() > 0 {
            self.0.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer to overwrite keeps a reused buffer's values and zeroes
    /// only those it never held; grown, it copies none of the old ones.
    #[test]
    fn buffers_to_overwrite_zero_only_what_they_never_held() {
        let mut spares = Spares::default();
        let mut held = Vec::with_capacity(100);
        held.extend([1.0f32; 40]);
        spares.give(held);
        let buf = spares.take_overwritten(60);
        assert_eq!(buf.len(), 60);
        assert!(buf[..40].iter().all(|&v| v == 1.0) && buf[40..].iter().all(|&v| v == 0.0));
        spares.give(buf);
        let buf = spares.take_overwritten(30);
        assert_eq!(buf.len(), 30);
        spares.give(buf);
        let buf = spares.take_overwritten(1000);
        assert_eq!(buf.len(), 1000);
        assert!(buf.iter().all(|&v| v == 0.0));
    }
}
