//! The element type of typed data as the reductions and collectives see
//! it: what one element of a buffer's datatype holds, reduced to what
//! decides which operations apply (MPI 4.1 §6.9.2).
//!
//! Collectives move and combine *packed* data (a buffer's own bytes when
//! its datatype is contiguous, a packed copy otherwise), so an element is
//! its datatype's packed bytes. A datatype whose data is all one basic
//! type — a predefined type, or a derived one such as a vector of
//! `f64` — has that basic type as its kind, and the predefined operations
//! apply to it value by value. Any other datatype is a composite, known by
//! its type signature: user-defined operations see it, and min/max-loc
//! recognise the value–index pairs among them.

use super::primitive::Primitive;
use super::{Equivalence, Handle};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// The type of a buffer's elements: the kind of data one element of its
/// datatype holds, and its size packed.
///
/// Two element types are equal when their kinds are: the same basic type,
/// or composite types of the same type signature (whatever their layout
/// in memory), a signature that repeats a shorter one counting as that
/// one.
#[derive(Clone, Copy, Debug)]
pub struct ElementType {
    kind: Kind,
    /// Bytes of data in one element (the datatype's size).
    size: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Every value of the element is of one basic type.
    Basic(Primitive),
    /// Several basic types: the element's type signature, as a
    /// fingerprint of its runs of basic types.
    Composite(u64),
}

impl ElementType {
    /// The element type of buffers of `T`.
    pub fn of<T: Equivalence>() -> ElementType {
        ElementType::of_datatype(T::equivalent_datatype().0)
    }

    /// The basic type of `T`, when its datatype is a predefined one that
    /// covers every byte of it (a number): then a `T`'s own bytes are its
    /// packed data, and an operation on one `T` needs no view, layout or
    /// staging (the one-sided single-element operations' fast path).
    pub(crate) fn basic_of<T: Equivalence>() -> Option<Primitive> {
        match T::equivalent_datatype().0 {
            Handle::Primitive(basic) if basic.size() == std::mem::size_of::<T>() => Some(basic),
            _ => None,
        }
    }

    /// The element type of values of one basic type.
    #[inline]
    pub(crate) fn of_basic(basic: Primitive) -> ElementType {
        ElementType {
            kind: Kind::Basic(basic),
            size: basic.size(),
        }
    }

    /// The basic type of the elements' values, if they are all of one.
    pub(crate) fn basic(&self) -> Option<Primitive> {
        match self.kind {
            Kind::Basic(basic) => Some(basic),
            Kind::Composite(_) => None,
        }
    }

    /// The element type of data of `datatype`.
    #[inline]
    pub(crate) fn of_datatype(datatype: Handle<'_>) -> ElementType {
        if let Handle::Primitive(basic) = datatype {
            // The common case, on every typed call: no walk of a signature,
            // inlined in the caller.
            return ElementType {
                kind: Kind::Basic(basic),
                size: basic.size(),
            };
        }
        ElementType::of_derived(datatype)
    }

    /// [`ElementType::of_datatype`] of a derived datatype: a walk of its
    /// signature.
    fn of_derived(datatype: Handle<'_>) -> ElementType {
        let size = datatype.shape().size;
        let mut runs: Vec<(Primitive, usize)> = Vec::new();
        datatype.for_each_basic(1, |basic, n| match runs.last_mut() {
            Some((last, count)) if *last == basic => *count += n,
            _ if n > 0 => runs.push((basic, n)),
            _ => {}
        });
        // A signature that repeats a shorter one (a contiguous run of a
        // struct, of `MPI_DOUBLE_INT` pairs) is of that one's kind, as a
        // vector of `f64` is of `f64`'s: its data is whole elements of it.
        let period = (1..runs.len())
            .find(|&p| {
                runs.len().is_multiple_of(p) && runs.chunks(p).all(|chunk| chunk == &runs[..p])
            })
            .unwrap_or(runs.len());
        let kind = match &runs[..period] {
            [(basic, _)] => Kind::Basic(*basic),
            period => {
                let mut fingerprint = DefaultHasher::new();
                period.hash(&mut fingerprint);
                Kind::Composite(fingerprint.finish())
            }
        };
        ElementType { kind, size }
    }

    /// Whether the elements can be read as `T`s: of `T`'s kind, each a
    /// whole number of `T`s, and `T` plain (its datatype covers every byte
    /// of it, so packed data lies as `T`s lie in memory).
    ///
    /// Types are told apart by signature, as MPI matches them: an element
    /// of two `i32`s is also a `ValueIndex<i32, i32>`.
    pub fn is<T: Equivalence>(&self) -> bool {
        let of_t = ElementType::of::<T>();
        let t_size = std::mem::size_of::<T>();
        self.kind == of_t.kind && of_t.size == t_size && self.size.is_multiple_of(t_size)
    }

    /// The MPI name of the basic type, or a description of a composite
    /// one (for messages).
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Basic(basic) => basic.name(),
            Kind::Composite(_) => "a derived datatype of several basic types",
        }
    }

    /// Size of one element's data in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl PartialEq for ElementType {
    fn eq(&self, other: &ElementType) -> bool {
        self.kind == other.kind
    }
}

impl Eq for ElementType {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::ValueIndex;
    use crate::datatype::{Datatype, UserDatatype};

    #[derive(Equivalence, Clone, Copy)]
    #[repr(C)]
    struct Plain {
        a: f64,
        b: i64,
    }

    #[derive(Equivalence, Clone, Copy)]
    #[repr(C)]
    struct Padded {
        a: f64,
        b: i32,
    }

    #[test]
    fn basic_kinds_follow_the_data_not_the_layout() {
        let f64s = f64::equivalent_datatype();
        let column = UserDatatype::vector(4, 1, 3, &f64s).unwrap();
        let element = ElementType::of_datatype(column.as_datatype_ref().0);
        assert_eq!(element, ElementType::of::<f64>());
        assert_eq!((element.size(), element.name()), (32, "MPI_DOUBLE"));
        assert!(element.is::<f64>());
        assert!(!element.is::<u64>());
        // One i32 is not a pair of them; two are.
        assert!(!ElementType::of::<i32>().is::<ValueIndex<i32, i32>>());
        let two = UserDatatype::contiguous(2, &i32::equivalent_datatype()).unwrap();
        assert!(ElementType::of_datatype(two.as_datatype_ref().0).is::<ValueIndex<i32, i32>>());
        assert_ne!(ElementType::of::<i64>(), ElementType::of::<u64>());
    }

    #[test]
    fn composites_are_known_by_their_signature() {
        let plain = ElementType::of::<Plain>();
        assert!(plain.is::<Plain>());
        assert_ne!(plain, ElementType::of::<f64>());
        let (a, b) = (f64::equivalent_datatype(), i64::equivalent_datatype());
        let same = UserDatatype::structured(&[1, 1], &[0, 8], &[&a, &b]).unwrap();
        assert_eq!(ElementType::of_datatype(same.as_datatype_ref().0), plain);
        // Padding keeps a struct from being read as packed data.
        let padded = ElementType::of::<Padded>();
        assert_eq!(padded.size(), 12);
        assert!(!padded.is::<Padded>());
        // Three pairs are of a pair's kind, as three f64s are of f64's.
        let pair = ValueIndex::<f64, i32>::equivalent_datatype();
        let three = UserDatatype::contiguous(3, &pair).unwrap();
        let three = ElementType::of_datatype(three.as_datatype_ref().0);
        assert_eq!(three, ElementType::of::<ValueIndex<f64, i32>>());
        assert_eq!(three.size(), 36);
        let (c, d) = (f32::equivalent_datatype(), i32::equivalent_datatype());
        let swapped = UserDatatype::structured(&[1, 1], &[0, 4], &[&d, &c]).unwrap();
        let swapped = ElementType::of_datatype(swapped.as_datatype_ref().0);
        assert_ne!(swapped, ElementType::of::<ValueIndex<f32, i32>>());
    }
}
