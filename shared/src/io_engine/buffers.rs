//! Page-aligned heap buffers, the memory O_DIRECT reads land in and writes
//! come from.

use std::fmt;
use std::ptr::NonNull;

use super::PAGE;

/// A heap buffer whose start is aligned to [`PAGE`], as O_DIRECT needs.
/// Its bytes are always initialized: new bytes are zero.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated: a whole number of pages, at least one.
    cap: usize,
}

// SAFETY: an `AlignedBuf` owns its allocation alone, like a `Vec<u8>`: moving
// it to another thread moves that ownership, and `&AlignedBuf` only reads.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; shared references give read-only access to initialized bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> Self {
        let cap = page_capacity(len);
        AlignedBuf {
            ptr: alloc_zeroed_pages(cap),
            len,
            cap,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the buffer can grow to without reallocating.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `cap >= len` bytes, all initialized (zeroed at
        // allocation, or written since).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Sets the length to `len`: the first `min(old, new)` bytes are kept and
    /// bytes past the old length are zero. Reallocates (still page-aligned)
    /// when `len` exceeds the capacity, so earlier slices' addresses change.
    pub fn resize(&mut self, len: usize) {
        if len > self.cap {
            let cap = page_capacity(len);
            let ptr = alloc_zeroed_pages(cap);
            // SAFETY: both allocations hold at least `self.len` bytes and are
            // distinct; the old one is freed as it was made.
            unsafe {
                std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), ptr.as_ptr(), self.len);
                free_pages(self.ptr, self.cap);
            }
            self.ptr = ptr;
            self.cap = cap;
        } else if len > self.len {
            // SAFETY: `[self.len, len)` lies inside the allocation of `cap` bytes.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, len - self.len) };
        }
        self.len = len;
    }

    pub(super) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The start of the bytes, for writes that read them from other threads
    /// after this borrow ends.
    pub(super) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed_pages(self.cap)` and is freed once.
        unsafe { free_pages(self.ptr, self.cap) };
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .finish()
    }
}

fn page_capacity(len: usize) -> usize {
    len.max(1)
        .checked_next_multiple_of(PAGE)
        .expect("an aligned buffer of more than usize::MAX bytes")
}

/// Buffers of this size or more are mapped from the kernel on their own and
/// asked to be backed by transparent huge pages: their pages arrive zeroed
/// when first touched (no second pass over the memory to zero it), and a
/// multi-GB packing partition takes a few thousand page faults instead of
/// a million.
const HUGE_PAGE: usize = 2 << 20;

fn small_layout(cap: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(cap, PAGE)
        .expect("an aligned buffer of more than isize::MAX bytes")
}

/// `cap` zeroed bytes (a nonzero multiple of [`PAGE`]), aligned for
/// O_DIRECT; from an anonymous mapping where large enough.
fn alloc_zeroed_pages(cap: usize) -> NonNull<u8> {
    if cap >= HUGE_PAGE {
        // SAFETY: a fresh private anonymous mapping, no address hint; the
        // kernel returns page-aligned memory that reads as zero.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(small_layout(cap));
        }
        // SAFETY: advice on this mapping's own range; a refusal (THP off)
        // changes nothing.
        unsafe { libc::madvise(raw, cap, libc::MADV_HUGEPAGE) };
        return NonNull::new(raw.cast()).expect("mmap does not return null on success");
    }
    let layout = small_layout(cap);
    // SAFETY: the layout's size is at least one page, never zero.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

/// Frees what [`alloc_zeroed_pages`] returned.
///
/// # Safety
/// `ptr` came from `alloc_zeroed_pages(cap)` and is not used again.
unsafe fn free_pages(ptr: NonNull<u8>, cap: usize) {
    if cap >= HUGE_PAGE {
        // SAFETY: the caller passes a mapping of exactly `cap` bytes.
        unsafe { libc::munmap(ptr.as_ptr().cast(), cap) };
    } else {
        // SAFETY: allocated with exactly this layout.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), small_layout(cap)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_zeroed_and_resizes() {
        // The first `n` bytes still hold the pattern written below.
        let kept = |buf: &AlignedBuf, n: usize| {
            buf.as_slice()[..n]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == i as u8 | 1)
        };
        let empty = AlignedBuf::new(0);
        assert!(empty.is_empty() && empty.as_slice().is_empty());
        assert_eq!(empty.as_slice().as_ptr() as usize % PAGE, 0);

        let mut buf = AlignedBuf::new(5000);
        assert_eq!((buf.len(), buf.capacity()), (5000, 2 * PAGE));
        assert_eq!(buf.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(buf.as_slice().iter().all(|&b| b == 0));
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = i as u8 | 1;
        }
        // Growing past the capacity reallocates, still aligned, prefix kept.
        buf.resize(100_000);
        assert_eq!(buf.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(kept(&buf, 5000));
        assert!(buf.as_slice()[5000..].iter().all(|&b| b == 0));
        // Shrinking then growing within the capacity zeroes the regrown bytes.
        buf.resize(10);
        assert_eq!(buf.len(), 10);
        buf.resize(5000);
        assert!(kept(&buf, 10));
        assert!(buf.as_slice()[10..].iter().all(|&b| b == 0));
        // Past `HUGE_PAGE` the buffer is a mapping of its own: zeroed,
        // aligned, the prefix kept across a move from the heap and between
        // mappings.
        buf.resize(HUGE_PAGE + 1);
        assert_eq!(buf.capacity(), HUGE_PAGE + PAGE);
        assert_eq!(buf.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(kept(&buf, 10));
        assert!(buf.as_slice()[10..].iter().all(|&b| b == 0));
        buf.as_mut_slice()[HUGE_PAGE] = 7;
        buf.resize(3 * HUGE_PAGE);
        assert_eq!(buf.as_slice()[HUGE_PAGE], 7);
        assert!(buf.as_slice()[HUGE_PAGE + 1..].iter().all(|&b| b == 0));
        let big = AlignedBuf::new(5 * HUGE_PAGE);
        assert!(big.as_slice().iter().all(|&b| b == 0));
    }
}
