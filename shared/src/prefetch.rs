//! Software prefetch: asks the processor to start loading cache lines a
//! loop will touch a few iterations on, so that misses to memory overlap
//! instead of stalling one after another (random rows of a large array).

/// Asks the processor to start loading the cache line holding `slice[i]`
/// (nothing where `i` is past its end; a hint only, on x86-64).
#[inline(always)]
pub fn line<T>(slice: &[T], i: usize) {
    fetch::<{ HINT_L1 }, T>(slice, i);
}

/// [`line`] for every cache line of `slice[i..i + n]`.
#[inline(always)]
pub fn lines<T>(slice: &[T], i: usize, n: usize) {
    each_line::<{ HINT_L1 }, T>(slice, i, n);
}

/// [`lines`], into the L2 cache only: for rows read a little later (a pass
/// over a few other rows first), where a prefetch into L1 would wait for
/// one of its few fill buffers and stall the loop that asks.
#[inline(always)]
pub fn lines_to_l2<T>(slice: &[T], i: usize, n: usize) {
    each_line::<{ HINT_L2 }, T>(slice, i, n);
}

#[cfg(target_arch = "x86_64")]
const HINT_L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const HINT_L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const HINT_L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const HINT_L2: i32 = 0;

#[inline(always)]
fn each_line<const HINT: i32, T>(slice: &[T], i: usize, n: usize) {
    let step = (64 / std::mem::size_of::<T>().max(1)).max(1);
    let mut j = i;
    while j < i + n {
        fetch::<HINT, T>(slice, j);
        j += step;
    }
}

#[inline(always)]
fn fetch<const HINT: i32, T>(slice: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < slice.len() {
        // SAFETY: a prefetch does not fault and reads nothing; the address
        // is in bounds all the same.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(slice.as_ptr().add(i) as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, i);
}
