//! Hardware atomics on window memory: the element-wise operations of an
//! accumulate, fetch-and-op and compare-and-swap, done by the origin on
//! the target's memory with one atomic instruction (or a compare-and-swap
//! loop) per element, so that they are atomic per element under a shared
//! lock without a region mutex.
//!
//! The module has its own small vocabulary ([`Element`], [`AtomicOp`]):
//! the MPI layer maps its datatypes and ops onto it and decides with
//! [`atomic_capable`] whether an (op, element, address) triple goes here
//! or under the region mutexes. The answer depends only on the element
//! type and its address, never on the op being "cheap", so that every
//! origin updating one element takes the same path: two origins never mix
//! an atomic and a mutex-protected read-modify-write of one element.
//!
//! All accesses are sequentially consistent.

use std::sync::atomic::{
    AtomicI16, AtomicI32, AtomicI64, AtomicI8, AtomicU16, AtomicU32, AtomicU64, AtomicU8,
    Ordering::SeqCst,
};

/// A basic element type that atomics can update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// Signed 1-byte integer.
    I8,
    /// Signed 2-byte integer.
    I16,
    /// Signed 4-byte integer.
    I32,
    /// Signed 8-byte integer.
    I64,
    /// Unsigned 1-byte integer.
    U8,
    /// Unsigned 2-byte integer.
    U16,
    /// Unsigned 4-byte integer.
    U32,
    /// Unsigned 8-byte integer.
    U64,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
}

impl Element {
    /// Size in bytes.
    pub fn size(self) -> usize {
        match self {
            Element::I8 | Element::U8 => 1,
            Element::I16 | Element::U16 => 2,
            Element::I32 | Element::U32 | Element::F32 => 4,
            Element::I64 | Element::U64 | Element::F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Element::F32 | Element::F64)
    }
}

/// An element-wise operation: the new value from the old one and the
/// operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// old + operand (integers wrap).
    Sum,
    /// old × operand (integers wrap).
    Prod,
    /// The smaller.
    Min,
    /// The larger.
    Max,
    /// Bitwise and (integers).
    BitAnd,
    /// Bitwise or (integers).
    BitOr,
    /// Bitwise exclusive or (integers).
    BitXor,
    /// Logical and, 1 or 0 (integers).
    LogicalAnd,
    /// Logical or, 1 or 0 (integers).
    LogicalOr,
    /// Logical exclusive or, 1 or 0 (integers).
    LogicalXor,
    /// The operand (MPI's REPLACE).
    Replace,
    /// The old value, unchanged (MPI's NO_OP: a fetch).
    NoOp,
}

/// Whether `op` on an `element` at address `address` can be done with
/// atomics: the address is aligned to the element's size, and the op is
/// defined for the element (bitwise and logical ops on integers only).
pub fn atomic_capable(element: Element, op: AtomicOp, address: usize) -> bool {
    address.is_multiple_of(element.size())
        && !(element.is_float()
            && matches!(
                op,
                AtomicOp::BitAnd
                    | AtomicOp::BitOr
                    | AtomicOp::BitXor
                    | AtomicOp::LogicalAnd
                    | AtomicOp::LogicalOr
                    | AtomicOp::LogicalXor
            ))
}

/// Applies `op` with `operand` to the element at `at` atomically and
/// returns the old value's bytes (native order), in the first
/// `element.size()` bytes of the result.
///
/// # Safety
/// `at` must be valid for reads and writes of `element.size()` bytes and
/// aligned to that size, and the memory may only be accessed atomically
/// or with byte copies while this runs; [`atomic_capable`] must hold for
/// `(element, op, at)`; `operand` must hold `element.size()` bytes.
pub(crate) unsafe fn fetch_op(
    at: *mut u8,
    element: Element,
    op: AtomicOp,
    operand: &[u8],
) -> [u8; 8] {
    macro_rules! integer {
        ($atomic:ty, $t:ty) => {{
            // SAFETY: valid, aligned and atomically accessed (the contract).
            let a = unsafe { <$atomic>::from_ptr(at.cast()) };
            let v = <$t>::from_ne_bytes(leading(operand));
            let update = |f: &dyn Fn($t) -> $t| match a.fetch_update(SeqCst, SeqCst, |x| Some(f(x)))
            {
                Ok(x) | Err(x) => x,
            };
            let truth = |b: bool| <$t>::from(b);
            let old = match op {
                AtomicOp::Sum => a.fetch_add(v, SeqCst),
                AtomicOp::Prod => update(&|x| x.wrapping_mul(v)),
                AtomicOp::Min => a.fetch_min(v, SeqCst),
                AtomicOp::Max => a.fetch_max(v, SeqCst),
                AtomicOp::BitAnd => a.fetch_and(v, SeqCst),
                AtomicOp::BitOr => a.fetch_or(v, SeqCst),
                AtomicOp::BitXor => a.fetch_xor(v, SeqCst),
                AtomicOp::LogicalAnd => update(&|x| truth(x != 0 && v != 0)),
                AtomicOp::LogicalOr => update(&|x| truth(x != 0 || v != 0)),
                AtomicOp::LogicalXor => update(&|x| truth((x != 0) != (v != 0))),
                AtomicOp::Replace => a.swap(v, SeqCst),
                AtomicOp::NoOp => a.load(SeqCst),
            };
            widen(&old.to_ne_bytes())
        }};
    }
    macro_rules! float {
        ($atomic:ty, $f:ty) => {{
            // SAFETY: valid, aligned and atomically accessed (the contract).
            let a = unsafe { <$atomic>::from_ptr(at.cast()) };
            let v = <$f>::from_ne_bytes(leading(operand));
            let update = |f: &dyn Fn($f) -> $f| match a
                .fetch_update(SeqCst, SeqCst, |x| Some(f(<$f>::from_bits(x)).to_bits()))
            {
                Ok(x) | Err(x) => x,
            };
            let old = match op {
                AtomicOp::Sum => update(&|x| x + v),
                AtomicOp::Prod => update(&|x| x * v),
                AtomicOp::Min => update(&|x| x.min(v)),
                AtomicOp::Max => update(&|x| x.max(v)),
                AtomicOp::Replace => a.swap(v.to_bits(), SeqCst),
                // Bitwise and logical ops on floats are not atomic-capable
                // (the contract): the value is left as it is.
                _ => a.load(SeqCst),
            };
            widen(&old.to_ne_bytes())
        }};
    }
    match element {
        Element::I8 => integer!(AtomicI8, i8),
        Element::I16 => integer!(AtomicI16, i16),
        Element::I32 => integer!(AtomicI32, i32),
        Element::I64 => integer!(AtomicI64, i64),
        Element::U8 => integer!(AtomicU8, u8),
        Element::U16 => integer!(AtomicU16, u16),
        Element::U32 => integer!(AtomicU32, u32),
        Element::U64 => integer!(AtomicU64, u64),
        Element::F32 => float!(AtomicU32, f32),
        Element::F64 => float!(AtomicU64, f64),
    }
}

/// Compares the `size`-byte word at `at` with `compare` and, if equal,
/// stores `new`, atomically; returns the old value's bytes (native order)
/// in the first `size` bytes of the result. Sizes other than 1, 2, 4 and
/// 8 are not atomic-capable.
///
/// # Safety
/// `at` must be valid for reads and writes of `size` bytes and aligned to
/// `size`, which is 1, 2, 4 or 8, and the memory may only be accessed
/// atomically or with byte copies while this runs; `compare` and `new`
/// must hold `size` bytes.
pub(crate) unsafe fn compare_and_swap(
    at: *mut u8,
    size: usize,
    compare: &[u8],
    new: &[u8],
) -> [u8; 8] {
    macro_rules! cas {
        ($atomic:ty, $t:ty) => {{
            // SAFETY: valid, aligned and atomically accessed (the contract).
            let a = unsafe { <$atomic>::from_ptr(at.cast()) };
            let value = |s: &[u8]| <$t>::from_ne_bytes(leading(s));
            match a.compare_exchange(value(compare), value(new), SeqCst, SeqCst) {
                Ok(x) | Err(x) => widen(&x.to_ne_bytes()),
            }
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

/// `bytes` at the start of an 8-byte array.
fn widen(bytes: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..bytes.len()].copy_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply<const N: usize>(
        cell: &mut [u8; N],
        element: Element,
        op: AtomicOp,
        v: [u8; N],
    ) -> [u8; N] {
        assert!(atomic_capable(element, op, cell.as_ptr() as usize));
        // SAFETY: `cell` is valid and, as checked, aligned; no one else
        // touches it.
        let old = unsafe { fetch_op(cell.as_mut_ptr(), element, op, &v) };
        old[..N].try_into().unwrap()
    }

    #[test]
    fn integer_ops_compute_the_mpi_results() {
        #[repr(align(8))]
        struct Cell([u8; 4]);
        let mut c = Cell(7i32.to_ne_bytes());
        let cell = &mut c.0;
        let i = |v: i32| v.to_ne_bytes();
        assert_eq!(apply(cell, Element::I32, AtomicOp::Sum, i(5)), i(7));
        assert_eq!(apply(cell, Element::I32, AtomicOp::Prod, i(-3)), i(12));
        assert_eq!(apply(cell, Element::I32, AtomicOp::Max, i(0)), i(-36));
        assert_eq!(apply(cell, Element::I32, AtomicOp::Min, i(-1)), i(0));
        assert_eq!(apply(cell, Element::I32, AtomicOp::BitAnd, i(6)), i(-1));
        assert_eq!(apply(cell, Element::I32, AtomicOp::BitOr, i(9)), i(6));
        assert_eq!(apply(cell, Element::I32, AtomicOp::BitXor, i(1)), i(15));
        assert_eq!(apply(cell, Element::I32, AtomicOp::LogicalAnd, i(0)), i(14));
        assert_eq!(apply(cell, Element::I32, AtomicOp::LogicalOr, i(4)), i(0));
        assert_eq!(apply(cell, Element::I32, AtomicOp::LogicalXor, i(4)), i(1));
        assert_eq!(apply(cell, Element::I32, AtomicOp::Replace, i(42)), i(0));
        assert_eq!(apply(cell, Element::I32, AtomicOp::NoOp, i(0)), i(42));
        assert_eq!(*cell, i(42));
        // Unsigned min and max compare as unsigned; sums wrap.
        let mut b = [200u8];
        assert_eq!(apply(&mut b, Element::U8, AtomicOp::Max, [100]), [200]);
        assert_eq!(apply(&mut b, Element::U8, AtomicOp::Sum, [100]), [200]);
        assert_eq!(b, [44]);
        let mut s = [0xFFu8]; // -1 as i8
        assert_eq!(apply(&mut s, Element::I8, AtomicOp::Min, [1]), [0xFF]);
        assert_eq!(s, [0xFF]);
    }

    #[test]
    fn float_ops_compute_the_mpi_results() {
        #[repr(align(8))]
        struct Cell([u8; 8]);
        let mut c = Cell(1.5f64.to_ne_bytes());
        let f = |v: f64| v.to_ne_bytes();
        assert_eq!(apply(&mut c.0, Element::F64, AtomicOp::Sum, f(2.0)), f(1.5));
        assert_eq!(
            apply(&mut c.0, Element::F64, AtomicOp::Prod, f(-2.0)),
            f(3.5)
        );
        assert_eq!(
            apply(&mut c.0, Element::F64, AtomicOp::Max, f(-10.0)),
            f(-7.0)
        );
        assert_eq!(
            apply(&mut c.0, Element::F64, AtomicOp::Min, f(-8.0)),
            f(-7.0)
        );
        assert_eq!(
            apply(&mut c.0, Element::F64, AtomicOp::Replace, f(0.25)),
            f(-8.0)
        );
        assert_eq!(c.0, f(0.25));
    }

    #[test]
    fn capability_needs_alignment_and_a_defined_op() {
        assert!(atomic_capable(Element::I64, AtomicOp::Sum, 4096));
        assert!(!atomic_capable(Element::I64, AtomicOp::Sum, 4100));
        assert!(atomic_capable(Element::I32, AtomicOp::Prod, 4100));
        assert!(atomic_capable(Element::U8, AtomicOp::Max, 4101));
        assert!(atomic_capable(Element::F32, AtomicOp::Sum, 8));
        assert!(!atomic_capable(Element::F32, AtomicOp::BitXor, 8));
        assert!(!atomic_capable(Element::F64, AtomicOp::LogicalOr, 8));
    }

    #[test]
    fn compare_and_swap_swaps_only_on_equal() {
        let v = |x: u64| x.to_ne_bytes();
        #[repr(align(8))]
        struct Cell([u8; 8]);
        let mut c = Cell(v(5));
        // SAFETY: the cell is valid, 8-aligned and touched by no one else.
        let old = unsafe { compare_and_swap(c.0.as_mut_ptr(), 8, &v(4), &v(9)) };
        assert_eq!((old, c.0), (v(5), v(5)));
        // SAFETY: as above.
        let old = unsafe { compare_and_swap(c.0.as_mut_ptr(), 8, &v(5), &v(9)) };
        assert_eq!((old, c.0), (v(5), v(9)));
        let mut h = [1u8, 2];
        let old = {
            #[repr(align(2))]
            struct Half([u8; 2]);
            let mut cell = Half(h);
            // SAFETY: a valid, 2-aligned cell touched by no one else.
            let old = unsafe { compare_and_swap(cell.0.as_mut_ptr(), 2, &[1, 2], &[3, 4]) };
            h = cell.0;
            old
        };
        assert_eq!((&old[..2], h), (&[1u8, 2][..], [3, 4]));
    }
}
