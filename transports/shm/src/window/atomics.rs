//! Hardware atomics on window memory: the operations that need no region
//! mutex under a shared lock, because one atomic instruction per element
//! does each: a replace (a store, or a swap when the old value is
//! fetched), a no-op (a load: the fetch of `MPI_Get_accumulate` with
//! `MPI_NO_OP`) and a compare-and-swap, on words of 1, 2, 4 or 8 bytes
//! aligned to their size ([`word_capable`]).
//!
//! Every other accumulate (every reduction) is a read-modify-write under
//! the region mutexes of the bytes it touches (module `regions`), done in
//! one pass over the span, which stores each element whole (aligned
//! elements are written by aligned stores, never byte by byte). So the
//! two ways meet safely where MPI lets concurrent accumulates meet on one
//! element (the same op, or that op and a no-op: `accumulate_ops`'
//! default `same_op_no_op`): a no-op's load sees the element before or
//! after a reduction, never half of it; and the choice between the ways
//! depends only on the op, the element's size and its address, so two
//! origins doing the same op on one element always take the same way.
//!
//! Loads and swaps are sequentially consistent, stores release: a flush
//! (a full fence) orders them against whatever comes next.

use std::sync::atomic::{
    AtomicU16, AtomicU32, AtomicU64, AtomicU8,
    Ordering::{Release, SeqCst},
};

/// Whether words of `size` bytes at `address` can be reached with
/// atomics: the size is 1, 2, 4 or 8, and the address aligned to it.
pub fn word_capable(size: usize, address: usize) -> bool {
    // A mask, not a division: this is asked on every replace and fetch.
    matches!(size, 1 | 2 | 4 | 8) && address & (size - 1) == 0
}

/// Stores the words of `new` (if given) into the consecutive `size`-byte
/// words at `at`, each atomically, and puts the words found there before
/// in `old` (if given): a replace (`new`), a fetching replace (both) or a
/// fetch (`old` alone). Both hold the same whole number of words.
///
/// # Safety
/// `at` must be valid for reads and writes of that many bytes and
/// [`word_capable`] must hold for `(size, at)`; the memory may only be
/// accessed atomically, or under a region mutex by whole-element stores,
/// while this runs.
pub(crate) unsafe fn exchange(
    at: *mut u8,
    size: usize,
    new: Option<&[u8]>,
    mut old: Option<&mut [u8]>,
) {
    macro_rules! words {
        ($atomic:ty, $t:ty) => {{
            let len = new.map_or_else(|| old.as_deref().map_or(0, <[u8]>::len), <[u8]>::len);
            for i in 0..len / size {
                // SAFETY: word `i` lies in the valid, aligned span (the
                // contract), which is only accessed atomically.
                let word = unsafe { <$atomic>::from_ptr(at.add(i * size).cast()) };
                let bytes = i * size..(i + 1) * size;
                let found = match new {
                    Some(new) => {
                        let value = <$t>::from_ne_bytes(leading(&new[bytes.clone()]));
                        if old.is_none() {
                            word.store(value, Release);
                            continue;
                        }
                        word.swap(value, SeqCst)
                    }
                    None => word.load(SeqCst),
                };
                if let Some(old) = old.as_deref_mut() {
                    old[bytes].copy_from_slice(&found.to_ne_bytes());
                }
            }
        }};
    }
    match size {
        1 => words!(AtomicU8, u8),
        2 => words!(AtomicU16, u16),
        4 => words!(AtomicU32, u32),
        _ => words!(AtomicU64, u64),
    }
}

/// Compares the `size`-byte word at `at` with `compare` and, if equal,
/// stores `new`, atomically; puts the old value's bytes (native order) in
/// `old`.
///
/// # Safety
/// `at` must be valid for reads and writes of `size` bytes and
/// [`word_capable`] must hold for `(size, at)`; the memory may only be
/// accessed atomically while this runs; `compare`, `new` and `old` must
/// hold `size` bytes.
pub(crate) unsafe fn compare_and_swap(
    at: *mut u8,
    size: usize,
    compare: &[u8],
    new: &[u8],
    old: &mut [u8],
) {
    macro_rules! cas {
        ($atomic:ty, $t:ty) => {{
            // SAFETY: valid, aligned and atomically accessed (the contract).
            let a = unsafe { <$atomic>::from_ptr(at.cast()) };
            let value = |s: &[u8]| <$t>::from_ne_bytes(leading(s));
            let found = match a.compare_exchange(value(compare), value(new), SeqCst, SeqCst) {
                Ok(x) | Err(x) => x.to_ne_bytes(),
            };
            // A copy of the word's own size, known here: no call to
            // memcpy for a length known only at run time.
            old[..found.len()].copy_from_slice(&found);
        }};
    }
    match size {
        1 => cas!(AtomicU8, u8),
        2 => cas!(AtomicU16, u16),
        4 => cas!(AtomicU32, u32),
        _ => cas!(AtomicU64, u64),
    }
}

/// The first `N` bytes of `s` (which has at least `N`: the callers'
/// contracts).
fn leading<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&s[..N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(align(8))]
    struct Cells([u8; 16]);

    #[test]
    fn exchange_replaces_fetches_and_swaps_whole_words() {
        let mut c = Cells([0; 16]);
        let at = c.0.as_mut_ptr();
        let words = |v: [u32; 4]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
        assert!(word_capable(4, at as usize));
        // SAFETY: 16 valid, 8-aligned bytes nobody else touches.
        unsafe { exchange(at, 4, Some(&words([1, 2, 3, 4])), None) };
        let mut old = vec![0u8; 16];
        // SAFETY: as above.
        unsafe { exchange(at, 4, None, Some(&mut old)) };
        assert_eq!(old, words([1, 2, 3, 4]));
        // SAFETY: as above; the second word on, three words.
        unsafe {
            exchange(
                at.add(4),
                4,
                Some(&words([7, 8, 9, 0])[..12]),
                Some(&mut old[..12]),
            )
        };
        assert_eq!(&old[..12], &words([2, 3, 4, 0])[..12]);
        assert_eq!(c.0.to_vec(), words([1, 7, 8, 9]));
    }

    #[test]
    fn capability_needs_a_word_size_and_alignment() {
        assert!(word_capable(8, 4096));
        assert!(!word_capable(8, 4100));
        assert!(word_capable(4, 4100));
        assert!(word_capable(1, 4101));
        assert!(!word_capable(16, 4096));
        assert!(!word_capable(3, 4095));
    }

    #[test]
    fn compare_and_swap_swaps_only_on_equal() {
        let v = |x: u64| x.to_ne_bytes();
        #[repr(align(8))]
        struct Cell([u8; 8]);
        let mut c = Cell(v(5));
        let mut old = [0u8; 8];
        // SAFETY: the cell is valid, 8-aligned and touched by no one else.
        unsafe { compare_and_swap(c.0.as_mut_ptr(), 8, &v(4), &v(9), &mut old) };
        assert_eq!((old, c.0), (v(5), v(5)));
        // SAFETY: as above.
        unsafe { compare_and_swap(c.0.as_mut_ptr(), 8, &v(5), &v(9), &mut old) };
        assert_eq!((old, c.0), (v(5), v(9)));
        let mut h = [1u8, 2];
        let old = {
            #[repr(align(2))]
            struct Half([u8; 2]);
            let mut cell = Half(h);
            let mut old = [0u8; 2];
            // SAFETY: a valid, 2-aligned cell touched by no one else.
            unsafe { compare_and_swap(cell.0.as_mut_ptr(), 2, &[1, 2], &[3, 4], &mut old) };
            h = cell.0;
            old
        };
        assert_eq!((&old[..2], h), (&[1u8, 2][..], [3, 4]));
    }
}
