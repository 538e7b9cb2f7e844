//! A non-commutative reduction for the test programs: affine maps
//! `x -> m x + c` modulo 2^16 under composition, which is associative
//! and not commutative, so a result shows the order in which the
//! processes' data were combined.

use oxmpi::collective::{DynBuffer, DynBufferMut, UserOperation};

/// Element `i` of process `id`'s maps, packed as `m << 16 | c`.
pub fn affine(id: usize, i: usize) -> u32 {
    let m = (2 * (id * 7 + i * 3) + 1) as u32 & 0xffff;
    let c = (id * 13 + i * 5) as u32 & 0xffff;
    (m << 16) | c
}

/// Process `id`'s first `len` maps.
pub fn affines(id: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| affine(id, i)).collect()
}

/// `a` then `b`.
pub fn compose(a: u32, b: u32) -> u32 {
    let (ma, ca) = (a >> 16, a & 0xffff);
    let (mb, cb) = (b >> 16, b & 0xffff);
    ((mb.wrapping_mul(ma) & 0xffff) << 16) | (mb.wrapping_mul(ca).wrapping_add(cb) & 0xffff)
}

/// Composition as an MPI operation: `inout = input then inout`.
pub fn composition() -> UserOperation<'static> {
    UserOperation::associative(|input: DynBuffer, inout: DynBufferMut| {
        let input: &[u32] = input.downcast().expect("u32 elements");
        let inout: &mut [u32] = inout.downcast().expect("u32 elements");
        for (a, b) in input.iter().zip(inout) {
            *b = compose(*a, *b);
        }
    })
}

/// The composition, in order, of the maps of the processes `ids`.
pub fn composed(ids: impl Iterator<Item = usize> + Clone, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| {
            ids.clone()
                .map(|id| affine(id, i))
                .reduce(compose)
                .unwrap_or(0)
        })
        .collect()
}
