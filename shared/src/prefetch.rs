//! Software prefetch: asks the processor to start loading cache lines a
//! loop will touch a few iterations on, so that misses to memory overlap
//! instead of stalling one after another (random rows of a large array).

/// Asks the processor to start loading the cache line holding `slice[i]`
/// (nothing where `i` is past its end; a hint only, on x86-64).
#[inline(always)]
pub fn line<T>(slice: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < slice.len() {
        // SAFETY: a prefetch does not fault and reads nothing; the address
        // is in bounds all the same.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                slice.as_ptr().add(i) as *const i8,
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, i);
}

/// [`line`] for every cache line of `slice[i..i + n]`.
#[inline(always)]
pub fn lines<T>(slice: &[T], i: usize, n: usize) {
    let step = (64 / std::mem::size_of::<T>().max(1)).max(1);
    let mut j = i;
    while j < i + n {
        line(slice, j);
        j += step;
    }
}
