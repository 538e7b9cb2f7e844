//! Which Rust values can travel in messages (MPI 4.1 §3.2.2, §5).
//!
//! [`Equivalence`] marks a type whose values are plain bytes that any bit
//! pattern makes valid: every primitive integer and floating-point type.
//! [`Buffer`] and [`BufferMut`] are what send and receive calls accept: a
//! single such value, a slice of them, or a vector.
//! Derived datatypes come with communicators and collectives.

use std::any::TypeId;

/// A type that has an MPI datatype: values are their bytes, and any bytes of
/// the right size are a valid value.
///
/// # Safety
/// Implementors must have no padding, no invalid bit patterns, and no
/// pointers or other meaning beyond their bytes.
pub unsafe trait Equivalence: Copy + Send + Sync + 'static {
    /// The MPI name of the matching predefined datatype (for messages).
    const MPI_NAME: &'static str;
}

macro_rules! equivalence {
    ($($t:ty => $name:literal),* $(,)?) => {$(
        // SAFETY: primitive integers and floats have no padding and every
        // bit pattern of their size is a valid value.
        unsafe impl Equivalence for $t {
            const MPI_NAME: &'static str = $name;
        }
    )*};
}

equivalence! {
    i8 => "MPI_INT8_T", i16 => "MPI_INT16_T", i32 => "MPI_INT32_T", i64 => "MPI_INT64_T",
    u8 => "MPI_UINT8_T", u16 => "MPI_UINT16_T", u32 => "MPI_UINT32_T", u64 => "MPI_UINT64_T",
    i128 => "MPI_BYTE[16]", u128 => "MPI_BYTE[16]",
    isize => "MPI_AINT", usize => "MPI_AINT",
    f32 => "MPI_FLOAT", f64 => "MPI_DOUBLE",
}

/// The type of a buffer's elements: which Rust type they are (so that a
/// reduction finds the kernel of a predefined operation for it, and a
/// user-defined operation can downcast to it), its MPI name and its size.
#[derive(Clone, Copy, Debug)]
pub struct ElementType {
    id: TypeId,
    name: &'static str,
    size: usize,
}

impl ElementType {
    /// The element type of buffers of `T`.
    pub fn of<T: Equivalence>() -> ElementType {
        ElementType {
            id: TypeId::of::<T>(),
            name: T::MPI_NAME,
            size: std::mem::size_of::<T>(),
        }
    }

    /// Whether the elements are of type `T`.
    pub fn is<T: Equivalence>(&self) -> bool {
        self.id == TypeId::of::<T>()
    }

    /// The MPI name of the type (for messages).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Size of one element in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl PartialEq for ElementType {
    fn eq(&self, other: &ElementType) -> bool {
        self.id == other.id
    }
}

impl Eq for ElementType {}

/// Something that can be sent: its bytes and the type of its elements.
pub trait Buffer {
    /// The bytes to send.
    fn bytes(&self) -> &[u8];
    /// The type of the elements.
    fn element_type(&self) -> ElementType;
    /// Size of one element in bytes (for counts in statuses).
    fn element_size(&self) -> usize {
        self.element_type().size()
    }
}

/// Something that can be received into.
pub trait BufferMut {
    /// The bytes a message may fill.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// The type of the elements.
    fn element_type(&self) -> ElementType;
    /// Size of one element in bytes.
    fn element_size(&self) -> usize {
        self.element_type().size()
    }
}

fn slice_bytes<T: Equivalence>(s: &[T]) -> &[u8] {
    // SAFETY: `T: Equivalence` has no padding, so every byte of the slice is
    // initialized; the length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

fn slice_bytes_mut<T: Equivalence>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and any bytes written make valid `T`s
    // (`Equivalence` forbids invalid bit patterns); the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

impl<T: Equivalence> Buffer for T {
    fn bytes(&self) -> &[u8] {
        slice_bytes(std::slice::from_ref(self))
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

impl<T: Equivalence> Buffer for [T] {
    fn bytes(&self) -> &[u8] {
        slice_bytes(self)
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

impl<T: Equivalence> Buffer for Vec<T> {
    fn bytes(&self) -> &[u8] {
        slice_bytes(self)
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

impl<T: Equivalence, const N: usize> Buffer for [T; N] {
    fn bytes(&self) -> &[u8] {
        slice_bytes(self)
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

impl<T: Equivalence> BufferMut for T {
    fn bytes_mut(&mut self) -> &mut [u8] {
        slice_bytes_mut(std::slice::from_mut(self))
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

impl<T: Equivalence> BufferMut for [T] {
    fn bytes_mut(&mut self) -> &mut [u8] {
        slice_bytes_mut(self)
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

impl<T: Equivalence> BufferMut for Vec<T> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        slice_bytes_mut(self)
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

impl<T: Equivalence, const N: usize> BufferMut for [T; N] {
    fn bytes_mut(&mut self) -> &mut [u8] {
        slice_bytes_mut(self)
    }
    fn element_type(&self) -> ElementType {
        ElementType::of::<T>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_expose_their_bytes() {
        let x = 0x0102_0304u32;
        assert_eq!(x.bytes(), &x.to_ne_bytes());
        let v = vec![1.5f64, -2.0];
        assert_eq!(v.bytes().len(), 16);
        assert_eq!(Buffer::element_size(&v), 8);
        assert_eq!(Buffer::element_type(&v), ElementType::of::<f64>());
        assert_ne!(Buffer::element_type(&v), ElementType::of::<u64>());
        assert!(Buffer::element_type(&v).is::<f64>());
        let mut a = [0u16; 3];
        a.bytes_mut().copy_from_slice(&[1, 0, 2, 0, 3, 0]);
        assert_eq!(a, [[1, 0], [2, 0], [3, 0]].map(u16::from_le_bytes));
    }
}
