//! The predefined datatypes (MPI 4.1 §3.2.2) that Rust's primitive
//! numbers are, and how each is written in external32 (MPI 4.1 §15.5.2):
//! its size and alignment here, its MPI name, and its big-endian canonical
//! form.

use crate::{Error, ErrorClass, Result};
use std::mem::size_of;

/// A predefined datatype: one Rust primitive number type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Primitive {
    I8,
    I16,
    I32,
    I64,
    I128,
    U8,
    U16,
    U32,
    U64,
    U128,
    Isize,
    Usize,
    F32,
    F64,
}

impl Primitive {
    /// Every basic type, in a fixed order: a basic type's index here is
    /// its code where one travels in a packet (one-sided operations).
    pub(crate) const ALL: [Primitive; 14] = [
        Primitive::I8,
        Primitive::I16,
        Primitive::I32,
        Primitive::I64,
        Primitive::I128,
        Primitive::U8,
        Primitive::U16,
        Primitive::U32,
        Primitive::U64,
        Primitive::U128,
        Primitive::Isize,
        Primitive::Usize,
        Primitive::F32,
        Primitive::F64,
    ];

    /// Size of one value in memory, in bytes.
    #[inline]
    pub(crate) fn size(self) -> usize {
        match self {
            Primitive::I8 | Primitive::U8 => 1,
            Primitive::I16 | Primitive::U16 => 2,
            Primitive::I32 | Primitive::U32 | Primitive::F32 => 4,
            Primitive::I64 | Primitive::U64 | Primitive::F64 => 8,
            Primitive::I128 | Primitive::U128 => 16,
            Primitive::Isize | Primitive::Usize => size_of::<usize>(),
        }
    }

    /// Whether it is an integer (every basic type but the floating
    /// ones): what `MPI_Compare_and_swap` takes (MPI 4.1 §12.3.4).
    pub(crate) fn is_integer(self) -> bool {
        !matches!(self, Primitive::F32 | Primitive::F64)
    }

    /// Alignment of a value in memory: the `k` of the standard's rounding
    /// of a struct's extent (MPI 4.1 §5.1.6).
    pub(crate) fn align(self) -> usize {
        match self {
            Primitive::I8 | Primitive::U8 => align_of::<u8>(),
            Primitive::I16 | Primitive::U16 => align_of::<u16>(),
            Primitive::I32 | Primitive::U32 => align_of::<u32>(),
            Primitive::F32 => align_of::<f32>(),
            Primitive::I64 | Primitive::U64 => align_of::<u64>(),
            Primitive::F64 => align_of::<f64>(),
            Primitive::I128 | Primitive::U128 => align_of::<u128>(),
            Primitive::Isize | Primitive::Usize => align_of::<usize>(),
        }
    }

    /// The MPI name of the predefined datatype. Rust's 128-bit integers
    /// have none; they travel as 16 bytes (and as 16 big-endian bytes in
    /// external32, like every other integer).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Primitive::I8 => "MPI_INT8_T",
            Primitive::I16 => "MPI_INT16_T",
            Primitive::I32 => "MPI_INT32_T",
            Primitive::I64 => "MPI_INT64_T",
            Primitive::I128 => "i128 (16 bytes)",
            Primitive::U8 => "MPI_UINT8_T",
            Primitive::U16 => "MPI_UINT16_T",
            Primitive::U32 => "MPI_UINT32_T",
            Primitive::U64 => "MPI_UINT64_T",
            Primitive::U128 => "u128 (16 bytes)",
            Primitive::Isize | Primitive::Usize => "MPI_AINT",
            Primitive::F32 => "MPI_FLOAT",
            Primitive::F64 => "MPI_DOUBLE",
        }
    }

    /// Size of one value in external32 (MPI 4.1 §15.5.2, table 15.3):
    /// the fixed-width types keep their width, and `MPI_AINT` (`isize`,
    /// `usize`) is 8 bytes on every machine.
    pub(crate) fn external32_size(self) -> usize {
        match self {
            Primitive::Isize | Primitive::Usize => 8,
            other => other.size(),
        }
    }

    /// Writes `native` (whole values of this type in this machine's
    /// representation) into `external` in external32: two's complement or
    /// IEEE 754, big-endian. `external` holds as many values.
    pub(crate) fn encode_external32(self, native: &[u8], external: &mut [u8]) {
        macro_rules! encode {
            ($t:ty as $e:ty) => {
                for (from, to) in native
                    .chunks_exact(size_of::<$t>())
                    .zip(external.chunks_exact_mut(size_of::<$e>()))
                {
                    if let Some(bytes) = from.first_chunk() {
                        to.copy_from_slice(&(<$t>::from_ne_bytes(*bytes) as $e).to_be_bytes());
                    }
                }
            };
        }
        match self {
            Primitive::I8 => encode!(i8 as i8),
            Primitive::I16 => encode!(i16 as i16),
            Primitive::I32 => encode!(i32 as i32),
            Primitive::I64 => encode!(i64 as i64),
            Primitive::I128 => encode!(i128 as i128),
            Primitive::U8 => encode!(u8 as u8),
            Primitive::U16 => encode!(u16 as u16),
            Primitive::U32 => encode!(u32 as u32),
            Primitive::U64 => encode!(u64 as u64),
            Primitive::U128 => encode!(u128 as u128),
            Primitive::Isize => encode!(isize as i64),
            Primitive::Usize => encode!(usize as u64),
            Primitive::F32 => encode!(f32 as f32),
            Primitive::F64 => encode!(f64 as f64),
        }
    }

    /// Reads external32 values from `external` into `native`, the inverse
    /// of [`Primitive::encode_external32`]. An `MPI_AINT` that does not fit
    /// this machine's `isize`/`usize` (a 32-bit machine reading a 64-bit
    /// address) is an `MPI_ERR_TRUNCATE` error.
    pub(crate) fn decode_external32(self, external: &[u8], native: &mut [u8]) -> Result<()> {
        macro_rules! decode {
            ($t:ty, from $e:ty) => {
                for (from, to) in external
                    .chunks_exact(size_of::<$e>())
                    .zip(native.chunks_exact_mut(size_of::<$t>()))
                {
                    if let Some(bytes) = from.first_chunk() {
                        let wide = <$e>::from_be_bytes(*bytes);
                        let value = <$t>::try_from(wide).map_err(|_| {
                            Error::new(
                                ErrorClass::Truncate,
                                format!(
                                    "the external32 {} {wide} does not fit a {}-byte value here",
                                    self.name(),
                                    size_of::<$t>()
                                ),
                            )
                        })?;
                        to.copy_from_slice(&value.to_ne_bytes());
                    }
                }
            };
            ($t:ty) => {
                for (from, to) in external
                    .chunks_exact(size_of::<$t>())
                    .zip(native.chunks_exact_mut(size_of::<$t>()))
                {
                    if let Some(bytes) = from.first_chunk() {
                        to.copy_from_slice(&<$t>::from_be_bytes(*bytes).to_ne_bytes());
                    }
                }
            };
        }
        match self {
            Primitive::I8 => decode!(i8),
            Primitive::I16 => decode!(i16),
            Primitive::I32 => decode!(i32),
            Primitive::I64 => decode!(i64),
            Primitive::I128 => decode!(i128),
            Primitive::U8 => decode!(u8),
            Primitive::U16 => decode!(u16),
            Primitive::U32 => decode!(u32),
            Primitive::U64 => decode!(u64),
            Primitive::U128 => decode!(u128),
            Primitive::Isize => decode!(isize, from i64),
            Primitive::Usize => decode!(usize, from u64),
            Primitive::F32 => decode!(f32),
            Primitive::F64 => decode!(f64),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external32_is_big_endian_at_the_standard_sizes() {
        let mut out = [0u8; 4];
        Primitive::I32.encode_external32(&0x0102_0304i32.to_ne_bytes(), &mut out);
        assert_eq!(out, [1, 2, 3, 4]);
        let mut out = [0u8; 8];
        Primitive::F64.encode_external32(&1.0f64.to_ne_bytes(), &mut out);
        assert_eq!(out, [0x3f, 0xf0, 0, 0, 0, 0, 0, 0]);
        let mut out = [0u8; 8];
        Primitive::Isize.encode_external32(&(-2isize).to_ne_bytes(), &mut out);
        assert_eq!(out, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(Primitive::Usize.external32_size(), 8);
        assert_eq!(Primitive::U16.external32_size(), 2);
    }

    #[test]
    fn external32_decodes_what_it_encodes() {
        let values = [1.5f32, -0.0, f32::MAX];
        let native: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut external = vec![0u8; 12];
        Primitive::F32.encode_external32(&native, &mut external);
        assert_eq!(&external[..4], &1.5f32.to_be_bytes());
        let mut back = vec![0u8; 12];
        Primitive::F32
            .decode_external32(&external, &mut back)
            .unwrap();
        assert_eq!(back, native);
    }
}
