//! The derived datatype constructors (MPI 4.1 §5.1.2 – §5.1.7), dup
//! (§5.1.10), commit and free (§5.1.9): their argument checks, and the
//! type-map nodes they make.

use super::sealed::Sealed;
use super::typemap::{fits, Blocks, Field, TypeNode};
use super::{Address, Count, Datatype, DatatypeRef, Handle, UncommittedDatatype};
use crate::{Error, ErrorClass, Result};
use std::fmt;
use std::sync::Arc;

/// Storage order of a multidimensional array, for
/// [`UserDatatype::subarray`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Row-major: the last dimension varies fastest (`MPI_ORDER_C`).
    C,
    /// Column-major: the first dimension varies fastest
    /// (`MPI_ORDER_FORTRAN`).
    Fortran,
}

/// A derived datatype that is not committed (yet): it can build other
/// datatypes, and [`commit`](UncommittedUserDatatype::commit) makes it
/// usable in communication.
pub struct UncommittedUserDatatype(Arc<TypeNode>);

/// A committed derived datatype (`MPI_Datatype` after `MPI_Type_commit`);
/// freed when dropped. See the [module docs](super).
#[derive(Clone)]
pub struct UserDatatype(Arc<TypeNode>);

/// A count argument: negative is `MPI_ERR_COUNT`.
pub(crate) fn count_arg(what: &str, value: Count) -> Result<usize> {
    usize::try_from(value).map_err(|_| {
        Error::new(
            ErrorClass::Count,
            format!("{what} is {value}: a count cannot be negative"),
        )
    })
}

/// A block length or array dimension: negative is `MPI_ERR_ARG`.
fn length_arg(what: &str, value: Count) -> Result<usize> {
    usize::try_from(value).map_err(|_| {
        Error::new(
            ErrorClass::Arg,
            format!("{what} is {value}: it cannot be negative"),
        )
    })
}

fn same_length(what: &str, a: usize, other: &str, b: usize) -> Result<()> {
    if a == b {
        return Ok(());
    }
    Err(Error::new(
        ErrorClass::Arg,
        format!("{what} has {a} entries and {other} has {b}: they must be as many"),
    ))
}

/// `elements` extents of `old`, in bytes.
fn times_extent(elements: i128, old: &TypeNode) -> Result<isize> {
    fits(elements * old.shape().extent() as i128)
}

fn listed(
    blocklengths: impl ExactSizeIterator<Item = Count>,
    displacements: impl ExactSizeIterator<Item = Result<isize>>,
) -> Result<Blocks> {
    same_length(
        "array_of_blocklengths",
        blocklengths.len(),
        "array_of_displacements",
        displacements.len(),
    )?;
    blocklengths
        .zip(displacements)
        .enumerate()
        .map(|(i, (len, displacement))| {
            Ok((
                displacement?,
                length_arg(&format!("array_of_blocklengths[{i}]"), len)?,
            ))
        })
        .collect::<Result<_>>()
        .map(Blocks::Listed)
}

impl UncommittedUserDatatype {
    fn blocks<D: UncommittedDatatype + ?Sized>(
        oldtype: &D,
        blocks: impl FnOnce(&TypeNode) -> Result<Blocks>,
    ) -> Result<UncommittedUserDatatype> {
        let old = oldtype.handle().0.node();
        let blocks = blocks(&old)?;
        TypeNode::blocks(&old, blocks).map(|node| UncommittedUserDatatype(Arc::new(node)))
    }

    /// `count` copies of `oldtype`, one after the other
    /// (`MPI_Type_contiguous`).
    #[doc(alias = "MPI_Type_contiguous")]
    pub fn contiguous<D: UncommittedDatatype + ?Sized>(count: Count, oldtype: &D) -> Result<Self> {
        let len = count_arg("count", count)?;
        Self::blocks(oldtype, |_| {
            Ok(Blocks::Strided {
                count: 1,
                len,
                stride: 0,
            })
        })
    }

    /// `count` blocks of `blocklength` copies of `oldtype`, block starts
    /// `stride` extents of `oldtype` apart (`MPI_Type_vector`).
    #[doc(alias = "MPI_Type_vector")]
    pub fn vector<D: UncommittedDatatype + ?Sized>(
        count: Count,
        blocklength: Count,
        stride: Count,
        oldtype: &D,
    ) -> Result<Self> {
        let blocks = count_arg("count", count)?;
        let len = length_arg("blocklength", blocklength)?;
        Self::blocks(oldtype, |old| {
            Ok(Blocks::Strided {
                count: blocks,
                len,
                stride: times_extent(stride.into(), old)?,
            })
        })
    }

    /// Like [`vector`](Self::vector) with `stride` in bytes
    /// (`MPI_Type_create_hvector`).
    #[doc(alias = "MPI_Type_create_hvector")]
    pub fn heterogeneous_vector<D: UncommittedDatatype + ?Sized>(
        count: Count,
        blocklength: Count,
        stride: Address,
        oldtype: &D,
    ) -> Result<Self> {
        let blocks = count_arg("count", count)?;
        let len = length_arg("blocklength", blocklength)?;
        Self::blocks(oldtype, |_| {
            Ok(Blocks::Strided {
                count: blocks,
                len,
                stride,
            })
        })
    }

    /// Block `i` holds `blocklengths[i]` copies of `oldtype` from
    /// `displacements[i]` extents of `oldtype` (`MPI_Type_indexed`).
    #[doc(alias = "MPI_Type_indexed")]
    pub fn indexed<D: UncommittedDatatype + ?Sized>(
        blocklengths: &[Count],
        displacements: &[Count],
        oldtype: &D,
    ) -> Result<Self> {
        Self::blocks(oldtype, |old| {
            listed(
                blocklengths.iter().copied(),
                displacements.iter().map(|&d| times_extent(d.into(), old)),
            )
        })
    }

    /// Like [`indexed`](Self::indexed) with displacements in bytes
    /// (`MPI_Type_create_hindexed`).
    #[doc(alias = "MPI_Type_create_hindexed")]
    pub fn heterogeneous_indexed<D: UncommittedDatatype + ?Sized>(
        blocklengths: &[Count],
        displacements: &[Address],
        oldtype: &D,
    ) -> Result<Self> {
        Self::blocks(oldtype, |_| {
            listed(
                blocklengths.iter().copied(),
                displacements.iter().map(|&d| Ok(d)),
            )
        })
    }

    /// Blocks of `blocklength` copies of `oldtype`, block `i` from
    /// `displacements[i]` extents of `oldtype`
    /// (`MPI_Type_create_indexed_block`).
    #[doc(alias = "MPI_Type_create_indexed_block")]
    pub fn indexed_block<D: UncommittedDatatype + ?Sized>(
        blocklength: Count,
        displacements: &[Count],
        oldtype: &D,
    ) -> Result<Self> {
        Self::blocks(oldtype, |old| {
            listed(
                std::iter::repeat_n(blocklength, displacements.len()),
                displacements.iter().map(|&d| times_extent(d.into(), old)),
            )
        })
    }

    /// Like [`indexed_block`](Self::indexed_block) with displacements in
    /// bytes (`MPI_Type_create_hindexed_block`).
    #[doc(alias = "MPI_Type_create_hindexed_block")]
    pub fn heterogeneous_indexed_block<D: UncommittedDatatype + ?Sized>(
        blocklength: Count,
        displacements: &[Address],
        oldtype: &D,
    ) -> Result<Self> {
        Self::blocks(oldtype, |_| {
            listed(
                std::iter::repeat_n(blocklength, displacements.len()),
                displacements.iter().map(|&d| Ok(d)),
            )
        })
    }

    /// Block `i` holds `blocklengths[i]` copies of `types[i]` from byte
    /// `displacements[i]` (`MPI_Type_create_struct`). Without bounds set by
    /// [`resized`](Self::resized) in a field, the extent is rounded up to
    /// the largest alignment of the basic types in it, as a C compiler
    /// pads a struct.
    #[doc(alias = "MPI_Type_create_struct")]
    pub fn structured(
        blocklengths: &[Count],
        displacements: &[Address],
        types: &[&dyn UncommittedDatatype],
    ) -> Result<Self> {
        same_length(
            "array_of_blocklengths",
            blocklengths.len(),
            "array_of_displacements",
            displacements.len(),
        )?;
        same_length(
            "array_of_blocklengths",
            blocklengths.len(),
            "array_of_types",
            types.len(),
        )?;
        let fields = blocklengths
            .iter()
            .zip(displacements)
            .zip(types)
            .enumerate()
            .map(|(i, ((&len, &displacement), old))| {
                Ok(Field {
                    displacement,
                    count: length_arg(&format!("array_of_blocklengths[{i}]"), len)?,
                    old: old.handle().0.node(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        TypeNode::structure(fields).map(|node| UncommittedUserDatatype(Arc::new(node)))
    }

    /// The `subsizes` block of an array of `sizes` elements of `oldtype`
    /// that starts at `starts`, in C or Fortran `order`
    /// (`MPI_Type_create_subarray`). Its lower bound is 0 and its extent
    /// the whole array's, so consecutive elements are consecutive arrays.
    #[doc(alias = "MPI_Type_create_subarray")]
    pub fn subarray<D: UncommittedDatatype + ?Sized>(
        sizes: &[Count],
        subsizes: &[Count],
        starts: &[Count],
        order: Order,
        oldtype: &D,
    ) -> Result<Self> {
        same_length(
            "array_of_sizes",
            sizes.len(),
            "array_of_subsizes",
            subsizes.len(),
        )?;
        same_length(
            "array_of_sizes",
            sizes.len(),
            "array_of_starts",
            starts.len(),
        )?;
        if sizes.is_empty() {
            return Err(Error::new(
                ErrorClass::Arg,
                "a subarray needs at least one dimension (ndims is 0)",
            ));
        }
        let mut dims = Vec::with_capacity(sizes.len());
        for (i, ((&size, &subsize), &start)) in sizes.iter().zip(subsizes).zip(starts).enumerate() {
            if size < 1 || subsize < 1 || start < 0 || start > size - subsize {
                return Err(Error::new(
                    ErrorClass::Arg,
                    format!(
                        "dimension {i}: size {size}, subsize {subsize}, start {start}: sizes and \
                         subsizes must be positive and the block must lie in the array \
                         (0 <= start <= size - subsize)"
                    ),
                ));
            }
            dims.push((size as i128, subsize as usize, start as i128));
        }
        // From the fastest-varying dimension outwards.
        if order == Order::C {
            dims.reverse();
        }
        let old = oldtype.handle().0.node();
        let extent = old.shape().extent() as i128;
        let (_, innermost, _) = dims[0];
        let mut node = Arc::new(TypeNode::blocks(
            &old,
            Blocks::Strided {
                count: 1,
                len: innermost,
                stride: 0,
            },
        )?);
        let mut row = extent;
        let mut displacement = 0;
        for (i, &(size, subsize, start)) in dims.iter().enumerate() {
            displacement += start * row;
            if i > 0 {
                let blocks = Blocks::Strided {
                    count: subsize,
                    len: 1,
                    stride: fits(row)?,
                };
                node = Arc::new(TypeNode::blocks(&node, blocks)?);
            }
            row *= size;
        }
        let placed = Arc::new(TypeNode::blocks(
            &node,
            Blocks::Listed(vec![(fits(displacement)?, 1)]),
        )?);
        TypeNode::resized(&placed, 0, fits(row)?).map(|n| UncommittedUserDatatype(Arc::new(n)))
    }

    /// `oldtype` with lower bound `lb` and extent `extent`
    /// (`MPI_Type_create_resized`): its data stays where it is, and
    /// consecutive elements are `extent` bytes apart.
    #[doc(alias = "MPI_Type_create_resized")]
    pub fn resized<D: UncommittedDatatype + ?Sized>(
        oldtype: &D,
        lb: Address,
        extent: Address,
    ) -> Result<Self> {
        TypeNode::resized(&oldtype.handle().0.node(), lb, extent)
            .map(|node| UncommittedUserDatatype(Arc::new(node)))
    }

    /// Commits the datatype (`MPI_Type_commit`): flattens its type map
    /// once, for every operation that will use it.
    #[doc(alias = "MPI_Type_commit")]
    pub fn commit(self) -> UserDatatype {
        self.0.runs();
        UserDatatype(self.0)
    }
}

/// The committed form of each [`UncommittedUserDatatype`] constructor.
macro_rules! committed {
    ($(
        $(#[$doc:meta])*
        fn $name:ident$(<$d:ident>)?($($arg:ident: $t:ty),*);
    )*) => {
        impl UserDatatype {$(
            $(#[$doc])*
            pub fn $name$(<$d: UncommittedDatatype + ?Sized>)?($($arg: $t),*) -> Result<UserDatatype> {
                UncommittedUserDatatype::$name($($arg),*).map(UncommittedUserDatatype::commit)
            }
        )*}
    };
}

committed! {
    /// `count` copies of `oldtype`, one after the other
    /// (`MPI_Type_contiguous`), committed.
    #[doc(alias = "MPI_Type_contiguous")]
    fn contiguous<D>(count: Count, oldtype: &D);
    /// `count` blocks of `blocklength` copies of `oldtype`, block starts
    /// `stride` extents of `oldtype` apart (`MPI_Type_vector`), committed.
    #[doc(alias = "MPI_Type_vector")]
    fn vector<D>(count: Count, blocklength: Count, stride: Count, oldtype: &D);
    /// Like [`vector`](Self::vector) with `stride` in bytes
    /// (`MPI_Type_create_hvector`), committed.
    #[doc(alias = "MPI_Type_create_hvector")]
    fn heterogeneous_vector<D>(count: Count, blocklength: Count, stride: Address, oldtype: &D);
    /// Block `i` holds `blocklengths[i]` copies of `oldtype` from
    /// `displacements[i]` extents of `oldtype` (`MPI_Type_indexed`),
    /// committed.
    #[doc(alias = "MPI_Type_indexed")]
    fn indexed<D>(blocklengths: &[Count], displacements: &[Count], oldtype: &D);
    /// Like [`indexed`](Self::indexed) with displacements in bytes
    /// (`MPI_Type_create_hindexed`), committed.
    #[doc(alias = "MPI_Type_create_hindexed")]
    fn heterogeneous_indexed<D>(blocklengths: &[Count], displacements: &[Address], oldtype: &D);
    /// Blocks of `blocklength` copies of `oldtype`, block `i` from
    /// `displacements[i]` extents of `oldtype`
    /// (`MPI_Type_create_indexed_block`), committed.
    #[doc(alias = "MPI_Type_create_indexed_block")]
    fn indexed_block<D>(blocklength: Count, displacements: &[Count], oldtype: &D);
    /// Like [`indexed_block`](Self::indexed_block) with displacements in
    /// bytes (`MPI_Type_create_hindexed_block`), committed.
    #[doc(alias = "MPI_Type_create_hindexed_block")]
    fn heterogeneous_indexed_block<D>(blocklength: Count, displacements: &[Address], oldtype: &D);
    /// Block `i` holds `blocklengths[i]` copies of `types[i]` from byte
    /// `displacements[i]` (`MPI_Type_create_struct`), committed; see
    /// [`UncommittedUserDatatype::structured`] for its extent.
    #[doc(alias = "MPI_Type_create_struct")]
    fn structured(blocklengths: &[Count], displacements: &[Address], types: &[&dyn UncommittedDatatype]);
    /// The `subsizes` block of an array of `sizes` elements of `oldtype`
    /// that starts at `starts`, in C or Fortran `order`
    /// (`MPI_Type_create_subarray`), committed; see
    /// [`UncommittedUserDatatype::subarray`].
    #[doc(alias = "MPI_Type_create_subarray")]
    fn subarray<D>(sizes: &[Count], subsizes: &[Count], starts: &[Count], order: Order, oldtype: &D);
    /// `oldtype` with lower bound `lb` and extent `extent`
    /// (`MPI_Type_create_resized`), committed.
    #[doc(alias = "MPI_Type_create_resized")]
    fn resized<D>(oldtype: &D, lb: Address, extent: Address);
}

impl UserDatatype {
    /// A new handle to the same datatype (`MPI_Type_dup`); each is freed
    /// on its own.
    #[doc(alias = "MPI_Type_dup")]
    pub fn dup(&self) -> UserDatatype {
        self.clone()
    }

    /// Frees the datatype (`MPI_Type_free`), as dropping it does. Types
    /// made from it, and operations using it, keep what they need.
    #[doc(alias = "MPI_Type_free")]
    pub fn free(self) {}

    /// The datatype `#[derive(Equivalence)]` gives a struct of `size`
    /// bytes whose fields are `(offset, elements, element datatype)`, in
    /// declaration order: a struct datatype of the fields, resized to
    /// `0..size`.
    ///
    /// # Panics
    /// Never for a layout the compiler made: offsets and sizes of a Rust
    /// type are below `isize::MAX`, so no bound can overflow.
    #[doc(hidden)]
    pub fn of_struct_fields(
        size: usize,
        fields: &[(usize, usize, DatatypeRef<'_>)],
    ) -> UserDatatype {
        let fields = fields
            .iter()
            .map(|&(offset, count, datatype)| Field {
                displacement: offset as isize,
                count,
                old: datatype.0.node(),
            })
            .collect();
        let node = TypeNode::structure(fields)
            .and_then(|s| TypeNode::resized(&Arc::new(s), 0, size as isize))
            .unwrap_or_else(|e| panic!("a Rust struct's layout overflowed a datatype: {e}"));
        UncommittedUserDatatype(Arc::new(node)).commit()
    }
}

impl Sealed for UncommittedUserDatatype {
    fn handle(&self) -> DatatypeRef<'_> {
        DatatypeRef(Handle::Node(&self.0))
    }
}
impl UncommittedDatatype for UncommittedUserDatatype {}

impl Sealed for UserDatatype {
    fn handle(&self) -> DatatypeRef<'_> {
        DatatypeRef(Handle::Node(&self.0))
    }
}
impl UncommittedDatatype for UserDatatype {}
impl Datatype for UserDatatype {
    fn as_datatype_ref(&self) -> DatatypeRef<'_> {
        DatatypeRef(Handle::Node(&self.0))
    }
}

impl fmt::Debug for UserDatatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UserDatatype").field(self.0.shape()).finish()
    }
}

impl fmt::Debug for UncommittedUserDatatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UncommittedUserDatatype")
            .field(self.0.shape())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::Equivalence;

    fn class<T>(r: Result<T>) -> ErrorClass {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.class(),
        }
    }

    #[test]
    fn bad_arguments_have_their_error_classes() {
        let int = i32::equivalent_datatype();
        assert_eq!(class(UserDatatype::contiguous(-1, &int)), ErrorClass::Count);
        assert_eq!(
            class(UserDatatype::vector(-2, 1, 1, &int)),
            ErrorClass::Count
        );
        assert_eq!(class(UserDatatype::vector(2, -1, 1, &int)), ErrorClass::Arg);
        assert_eq!(
            class(UserDatatype::indexed(&[1, -1], &[0, 4], &int)),
            ErrorClass::Arg
        );
        assert_eq!(
            class(UserDatatype::heterogeneous_indexed(&[1], &[0, 4], &int)),
            ErrorClass::Arg
        );
        assert_eq!(
            class(UserDatatype::indexed_block(-1, &[0], &int)),
            ErrorClass::Arg
        );
        assert_eq!(
            class(UserDatatype::structured(&[1, 1], &[0, 8], &[&int])),
            ErrorClass::Arg
        );
        for (sizes, subsizes, starts) in [
            (&[][..], &[][..], &[][..]),
            (&[4], &[0], &[0]),
            (&[4], &[5], &[0]),
            (&[4], &[2], &[3]),
            (&[4], &[2], &[-1]),
            (&[4, 4], &[2], &[0]),
        ] {
            let r = UserDatatype::subarray(sizes, subsizes, starts, Order::C, &int);
            assert_eq!(
                class(r),
                ErrorClass::Arg,
                "{sizes:?} {subsizes:?} {starts:?}"
            );
        }
        let huge = UserDatatype::contiguous(i32::MAX, &u64::equivalent_datatype()).unwrap();
        let r = UserDatatype::vector(i32::MAX, 1, i32::MAX, &huge);
        assert_eq!(class(r), ErrorClass::Type);
    }

    #[test]
    fn subarrays_follow_their_storage_order() {
        // A 2 x 2 block at (1, 1) of a 3 x 4 array of bytes.
        let byte = u8::equivalent_datatype();
        let c = UserDatatype::subarray(&[3, 4], &[2, 2], &[1, 1], Order::C, &byte).unwrap();
        let f = UserDatatype::subarray(&[3, 4], &[2, 2], &[1, 1], Order::Fortran, &byte).unwrap();
        let segments = |d: &UserDatatype| {
            let mut out = Vec::new();
            let _ = d.handle().0.with_segments(1, |segments| {
                segments.for_each(|o, l| {
                    out.push((o, l));
                    std::ops::ControlFlow::Continue(())
                })
            });
            out
        };
        // Row-major: rows 1 and 2, columns 1-2: bytes 5-6 and 9-10.
        assert_eq!(segments(&c), [(5, 2), (9, 2)]);
        // Column-major (3 rows per column): columns 1 and 2, rows 1-2.
        assert_eq!(segments(&f), [(4, 2), (7, 2)]);
        for d in [&c, &f] {
            assert_eq!((d.lower_bound(), d.extent(), d.size()), (0, 12, 4));
        }
    }
}
