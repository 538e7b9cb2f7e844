//! Datatypes: which Rust values travel in messages and how they lie in
//! memory (MPI 4.1 §3.2.2, §5).
//!
//! # Types with a datatype
//!
//! [`Equivalence`] is the trait of a Rust type that has an MPI datatype:
//! every primitive integer and floating-point type (a predefined datatype),
//! and any plain struct that derives it ([`derive@Equivalence`]): a
//! `#[repr(C)]` struct of such fields, arrays of them and nested derived
//! structs. A value, a slice, an array and a `Vec` of such a type are
//! message buffers ([`Buffer`], [`BufferMut`]), so `process.send(&x)`,
//! `send(&particles[..])` and `receive::<Particle>()` work alike for
//! numbers and structs.
//!
//! A struct's datatype names its fields only: padding bytes between and
//! after them are never read or sent, and a receive writes only the
//! fields. So a type "with holes" is as good a buffer as a plain one. Where
//! the difference matters — describing a buffer with *another* datatype,
//! through a [`View`] or [`MutView`], which may name any byte of it — the
//! buffer must be plain: its elements' datatype must cover every byte
//! (no padding), which is checked when the view is made.
//!
//! # Derived datatypes
//!
//! [`UserDatatype`] is a committed datatype made by a constructor (MPI 4.1
//! §5.1.2 – §5.1.7): [`contiguous`](UserDatatype::contiguous),
//! [`vector`](UserDatatype::vector),
//! [`heterogeneous_vector`](UserDatatype::heterogeneous_vector) (hvector),
//! [`indexed`](UserDatatype::indexed),
//! [`heterogeneous_indexed`](UserDatatype::heterogeneous_indexed)
//! (hindexed), [`indexed_block`](UserDatatype::indexed_block),
//! [`heterogeneous_indexed_block`](UserDatatype::heterogeneous_indexed_block),
//! [`structured`](UserDatatype::structured) (struct),
//! [`subarray`](UserDatatype::subarray), [`resized`](UserDatatype::resized)
//! and [`dup`](UserDatatype::dup). [`UncommittedUserDatatype`] has the same
//! constructors for types that only serve to build others, and
//! [`commit`](UncommittedUserDatatype::commit) (`MPI_Type_commit`), which
//! flattens the type map once. A datatype is freed when its value is
//! dropped ([`UserDatatype::free`] says so explicitly); types made from it
//! keep what they need.
//!
//! Size, extent and bounds (`MPI_Type_size`, `MPI_Type_get_extent`,
//! `MPI_Type_get_true_extent`) are methods of [`UncommittedDatatype`],
//! which every datatype has; [`Status::count_of`](crate::Status::count_of)
//! and [`Status::elements_of`](crate::Status::elements_of) are
//! `MPI_Get_count` and `MPI_Get_elements` for any datatype.
//!
//! ```no_run
//! use oxmpi::datatype::{MutView, UserDatatype, View};
//! use oxmpi::traits::*;
//! # let universe = oxmpi::initialize().unwrap();
//! # let world = universe.world();
//! // Column 2 of a 4 x 4 row-major matrix.
//! let column = UserDatatype::vector(4, 1, 4, &f64::equivalent_datatype()).unwrap();
//! let mut matrix = [0.0f64; 16];
//! if world.rank() == 0 {
//!     let column_2 = View::with_count_and_datatype(&matrix[2..], 1, &column).unwrap();
//!     world.process_at_rank(1).send(&column_2).unwrap();
//! } else if world.rank() == 1 {
//!     let mut column_2 = MutView::with_count_and_datatype(&mut matrix[2..], 1, &column).unwrap();
//!     world.process_at_rank(0).receive_into(&mut column_2).unwrap();
//! }
//! ```
//!
//! # Safety by construction
//!
//! A view checks, before anything is copied, that every byte its datatype
//! names for its count lies in its buffer; a datatype that reaches outside
//! is an `MPI_ERR_BUFFER` error, never an access out of bounds. Sends of
//! data that is contiguous in memory (predefined types, plain structs,
//! derived types that turn out contiguous) hand the device the buffer
//! itself; other data is packed into a temporary buffer first, and a
//! receive of it is unpacked from one when it completes.
//!
//! # Pack and external32
//!
//! [`Communicator::pack`](crate::Communicator::pack), `pack_into`,
//! `unpack_into` and `pack_size` are `MPI_Pack`, `MPI_Unpack` and
//! `MPI_Pack_size` (MPI 4.1 §5.2); [`pack_external`], [`unpack_external`]
//! and [`pack_external_size`] write and read the canonical big-endian
//! `external32` representation (§5.2.3, §15.5.2), for data that crosses
//! machines of another byte order.

mod constructors;
mod element;
mod external32;
mod pack;
mod primitive;
mod typemap;
mod view;

pub use constructors::{Order, UncommittedUserDatatype, UserDatatype};
pub use element::ElementType;
pub use external32::{pack_external, pack_external_into, pack_external_size, unpack_external};
pub(crate) use pack::{Incoming, Outgoing};
pub(crate) use primitive::Primitive;
pub(crate) use typemap::{Run, Segments};
pub use view::{Buffer, BufferMut, MutView, View};
pub(crate) use view::{PackStream, UnpackStream};

/// Derives [`Equivalence`](trait@Equivalence) for a plain struct, as
/// rsmpi's `#[derive(Equivalence)]` does: the struct must be `#[repr(C)]`
/// (with `packed` or `align` if wanted) and `Copy`, and every field an
/// `Equivalence` type or an array (of arrays) of one.
///
/// Its datatype is a struct datatype of the fields at the offsets the
/// compiler chose (`std::mem::offset_of!`), resized to the struct's size:
/// its extent is `size_of::<Self>()`, trailing padding included, and
/// padding is never sent. A check the compiler evaluates confirms the
/// layout the datatype relies on (fields in declaration order, none
/// overlapping, all within the struct).
///
/// ```
/// use oxmpi::datatype::Equivalence;
/// use oxmpi::traits::*;
///
/// #[derive(Equivalence, Clone, Copy)]
/// #[repr(C)]
/// struct Particle {
///     position: [f64; 3],
///     charge: i8, // 7 bytes of padding follow
///     id: u64,
/// }
///
/// let datatype = Particle::equivalent_datatype();
/// assert_eq!(datatype.size(), 3 * 8 + 1 + 8);
/// assert_eq!(datatype.extent(), std::mem::size_of::<Particle>() as isize);
/// ```
///
/// Generic structs, enums, unions and structs without `#[repr(C)]` are
/// refused, as are fields of other types:
///
/// ```compile_fail
/// # use oxmpi::datatype::Equivalence;
/// #[derive(Equivalence, Clone, Copy)]
/// struct NoReprC {
///     a: i32,
///     b: f64,
/// }
/// ```
///
/// ```compile_fail
/// # use oxmpi::datatype::Equivalence;
/// #[derive(Equivalence, Clone, Copy)]
/// #[repr(C)]
/// struct WithABool {
///     flag: bool, // not every byte value is a bool
/// }
/// ```
///
/// ```compile_fail
/// # use oxmpi::datatype::Equivalence;
/// #[derive(Equivalence, Clone, Copy)]
/// #[repr(C)]
/// struct Generic<T: Copy> {
///     value: T,
/// }
/// ```
pub use oxmpi_derive::Equivalence;

/// MPI's `int` for counts and block lengths; a negative one is an error
/// of class `MPI_ERR_COUNT` (counts) or `MPI_ERR_ARG` (block lengths).
pub type Count = i32;

/// MPI's `MPI_Aint`: a displacement, bound or extent in bytes.
pub type Address = isize;

use std::fmt;
use std::sync::Arc;
use typemap::{Shape, TypeNode};

/// A Rust type that has an MPI datatype (rsmpi's `Equivalence`): values of
/// it can be sent and received, alone or in slices, arrays and vectors.
///
/// Implemented for the primitive integers and floats, and derived for
/// plain structs ([`derive@Equivalence`]).
///
/// # Safety
/// The datatype describes one value at offset 0: its lower bound is 0 and
/// its extent is `size_of::<Self>()`; every byte it names is a byte of a
/// field (never padding) within the value; writing any bytes there leaves
/// a valid value, and so does the all-zero bit pattern. The type holds no
/// pointers or other meaning beyond its bytes.
pub unsafe trait Equivalence: Copy + Send + Sync + 'static {
    /// The datatype of one value.
    fn equivalent_datatype() -> DatatypeRef<'static>;
}

macro_rules! equivalence {
    ($($t:ty => $p:ident),* $(,)?) => {$(
        // SAFETY: primitive integers and floats have no padding, every bit
        // pattern of their size is a valid value, and their predefined
        // datatype covers exactly their bytes.
        unsafe impl Equivalence for $t {
            fn equivalent_datatype() -> DatatypeRef<'static> {
                DatatypeRef(Handle::Primitive(Primitive::$p))
            }
        }
    )*};
}

equivalence! {
    i8 => I8, i16 => I16, i32 => I32, i64 => I64, i128 => I128,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64, u128 => U128,
    isize => Isize, usize => Usize, f32 => F32, f64 => F64,
}

/// A datatype as the rest of the crate sees it: predefined (no
/// allocation), or a node of a type map.
#[derive(Clone, Copy)]
pub(crate) enum Handle<'a> {
    Primitive(Primitive),
    Node(&'a Arc<TypeNode>),
}

/// A [`Handle`] that owns its node: the datatype of a stream the device
/// keeps beyond the borrow the handle came from.
#[derive(Clone)]
pub(crate) enum OwnedHandle {
    Primitive(Primitive),
    Node(Arc<TypeNode>),
}

impl OwnedHandle {
    pub(crate) fn handle(&self) -> Handle<'_> {
        match self {
            OwnedHandle::Primitive(p) => Handle::Primitive(*p),
            OwnedHandle::Node(node) => Handle::Node(node),
        }
    }
}

impl Handle<'_> {
    /// The datatype, owned (a node is shared, not copied).
    pub(crate) fn to_owned_handle(self) -> OwnedHandle {
        match self {
            Handle::Primitive(p) => OwnedHandle::Primitive(p),
            Handle::Node(node) => OwnedHandle::Node(Arc::clone(node)),
        }
    }

    pub(crate) fn shape(&self) -> Shape {
        match self {
            Handle::Primitive(p) => Shape::of_primitive(*p),
            Handle::Node(node) => *node.shape(),
        }
    }

    /// Where the data of `count` elements starts when it is one contiguous
    /// range in type-map order.
    pub(crate) fn contiguous_start(&self, count: usize) -> Option<isize> {
        match self {
            Handle::Primitive(_) => Some(0),
            Handle::Node(node) => node.contiguous_start(count),
        }
    }

    /// The flattened type map of `count` elements, as runs in type-map
    /// order (touching segments merged, equally spaced ones folded).
    pub(crate) fn runs_of(&self, count: usize) -> Vec<Run> {
        match self {
            Handle::Primitive(p) => {
                let len = count.saturating_mul(p.size());
                if len == 0 {
                    Vec::new()
                } else {
                    vec![Run::new(0, len, 1, 0)]
                }
            }
            Handle::Node(node) => node.runs_of(count),
        }
    }

    /// Calls `f` with the [`Segments`] of `count` elements (a predefined
    /// type's are one segment), to walk them with a cursor.
    pub(crate) fn with_segments<R>(&self, count: usize, f: impl FnOnce(Segments<'_>) -> R) -> R {
        match self {
            Handle::Primitive(p) => {
                let whole = [Run {
                    offset: 0,
                    len: count.saturating_mul(p.size()),
                    count: 1,
                    stride: 0,
                }];
                f(Segments::new(&whole, 0, 1))
            }
            Handle::Node(node) => f(Segments::new(node.runs(), node.shape().extent(), count)),
        }
    }

    /// The basic elements in the first `bytes` bytes of a message of such
    /// elements; `None` if `bytes` ends inside one.
    pub(crate) fn elements_in(&self, bytes: usize) -> Option<usize> {
        match self {
            Handle::Primitive(p) => bytes.is_multiple_of(p.size()).then(|| bytes / p.size()),
            Handle::Node(node) => node.signature().elements_in(bytes),
        }
    }

    /// Calls `f(basic type, n)` for runs of the basic elements of `count`
    /// elements, in order.
    pub(crate) fn for_each_basic(&self, count: usize, mut f: impl FnMut(Primitive, usize)) {
        match self {
            Handle::Primitive(p) => f(*p, count),
            Handle::Node(node) => node.signature().for_each_basic(count, &mut f),
        }
    }

    /// The node, shared (predefined types get one of their own).
    fn node(&self) -> Arc<TypeNode> {
        match self {
            Handle::Primitive(p) => Arc::new(TypeNode::primitive(*p)),
            Handle::Node(node) => Arc::clone(node),
        }
    }
}

mod sealed {
    /// Gives the datatype behind a handle, committed or not; only this
    /// crate's datatypes have one, and only this crate calls it.
    pub trait Sealed {
        #[doc(hidden)]
        fn handle(&self) -> super::DatatypeRef<'_>;
    }
}

/// A datatype, committed or not: usable to build other datatypes (rsmpi's
/// `UncommittedDatatype`). Its size and bounds are its methods.
pub trait UncommittedDatatype: sealed::Sealed {
    /// Bytes of data in one element (`MPI_Type_size`): padding and holes
    /// do not count.
    #[doc(alias = "MPI_Type_size")]
    fn size(&self) -> usize {
        self.handle().0.shape().size
    }

    /// The span from the lower to the upper bound (`MPI_Type_get_extent`):
    /// how far apart consecutive elements are.
    #[doc(alias = "MPI_Type_get_extent")]
    fn extent(&self) -> Address {
        self.handle().0.shape().extent()
    }

    /// The lower bound (`MPI_Type_get_extent`'s `lb`).
    fn lower_bound(&self) -> Address {
        self.handle().0.shape().lb
    }

    /// The upper bound: lower bound plus extent.
    fn upper_bound(&self) -> Address {
        self.handle().0.shape().ub
    }

    /// Where the data really starts (`MPI_Type_get_true_extent`'s
    /// `true_lb`), whatever bounds `resized` set; 0 without data.
    #[doc(alias = "MPI_Type_get_true_extent")]
    fn true_lower_bound(&self) -> Address {
        self.handle().0.shape().true_lb()
    }

    /// The span of the data itself (`MPI_Type_get_true_extent`): from its
    /// first to one past its last byte; 0 without data.
    fn true_extent(&self) -> Address {
        self.handle().0.shape().true_extent()
    }
}

/// A committed datatype: one that can describe a buffer (rsmpi's
/// `Datatype`).
pub trait Datatype: UncommittedDatatype {
    /// A borrowed handle to this datatype.
    fn as_datatype_ref(&self) -> DatatypeRef<'_>;
}

impl<D: sealed::Sealed + ?Sized> sealed::Sealed for &D {
    fn handle(&self) -> DatatypeRef<'_> {
        (**self).handle()
    }
}
impl<D: UncommittedDatatype + ?Sized> UncommittedDatatype for &D {}
impl<D: Datatype + ?Sized> Datatype for &D {
    fn as_datatype_ref(&self) -> DatatypeRef<'_> {
        (**self).as_datatype_ref()
    }
}

/// A borrowed committed datatype: a predefined one (what
/// [`Equivalence::equivalent_datatype`] gives for numbers), or a
/// [`UserDatatype`].
#[derive(Clone, Copy)]
pub struct DatatypeRef<'a>(pub(crate) Handle<'a>);

impl sealed::Sealed for DatatypeRef<'_> {
    fn handle(&self) -> DatatypeRef<'_> {
        *self
    }
}
impl UncommittedDatatype for DatatypeRef<'_> {}
impl Datatype for DatatypeRef<'_> {
    fn as_datatype_ref(&self) -> DatatypeRef<'_> {
        *self
    }
}

impl fmt::Debug for DatatypeRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Handle::Primitive(p) => f.write_str(p.name()),
            Handle::Node(node) => fmt::Debug::fmt(node.shape(), f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Communicator;

    #[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
    #[repr(C)]
    struct Inner {
        tag: u8, // 1 byte of padding follows
        values: [u16; 3],
    }

    #[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
    #[repr(C)]
    struct Outer {
        x: f64,
        inner: Inner, // 0 bytes of padding follow (Inner is 8 bytes)
        grid: [[i32; 2]; 3],
        last: u8, // 7 bytes of padding follow
    }

    #[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
    #[repr(C)]
    struct Pair(u32, f32);

    fn outer() -> Outer {
        Outer {
            x: 1.5,
            inner: Inner {
                tag: 7,
                values: [1, 2, 3],
            },
            grid: [[4, 5], [6, 7], [8, 9]],
            last: 10,
        }
    }

    /// The fields' bytes in declaration order: what a packed `Outer` is.
    fn fields_of(o: &Outer) -> Vec<u8> {
        let mut bytes = o.x.to_ne_bytes().to_vec();
        bytes.push(o.inner.tag);
        o.inner
            .values
            .iter()
            .for_each(|v| bytes.extend(v.to_ne_bytes()));
        o.grid
            .iter()
            .flatten()
            .for_each(|v| bytes.extend(v.to_ne_bytes()));
        bytes.push(o.last);
        bytes
    }

    #[test]
    fn primitives_are_predefined_types_of_their_size() {
        let d = f64::equivalent_datatype();
        assert_eq!((d.size(), d.extent(), d.lower_bound()), (8, 8, 0));
        assert_eq!((d.true_lower_bound(), d.true_extent()), (0, 8));
        assert_eq!(format!("{:?}", i32::equivalent_datatype()), "MPI_INT32_T");
        assert_eq!(u128::equivalent_datatype().size(), 16);
    }

    #[test]
    fn derived_structs_skip_their_padding() {
        let d = Outer::equivalent_datatype();
        assert_eq!(d.size(), 8 + 1 + 6 + 24 + 1);
        assert_eq!(d.extent(), std::mem::size_of::<Outer>() as isize);
        assert_eq!((d.lower_bound(), d.true_lower_bound()), (0, 0));
        let last = std::mem::offset_of!(Outer, last);
        assert_eq!(d.true_extent(), last as isize + 1);
        let inner = Inner::equivalent_datatype();
        assert_eq!((inner.size(), inner.extent()), (7, 8));
        let pair = Pair::equivalent_datatype();
        assert_eq!((pair.size(), pair.extent()), (8, 8));
    }

    #[test]
    fn derived_structs_pack_their_fields_in_order() {
        let comm = Communicator::world(0, 1);
        let values = [
            outer(),
            Outer {
                x: -2.0,
                last: 99,
                ..outer()
            },
        ];
        let packed = comm.pack(&values[..]).unwrap();
        let expected: Vec<u8> = values.iter().flat_map(fields_of).collect();
        assert_eq!(packed, expected);
        let mut back = [Outer {
            x: 0.0,
            inner: Inner {
                tag: 0,
                values: [0; 3],
            },
            grid: [[0; 2]; 3],
            last: 0,
        }; 2];
        assert_eq!(
            comm.unpack_into(&packed, &mut back[..], 0).unwrap(),
            packed.len()
        );
        assert_eq!(back, values);
        // A struct with no padding is plain: another datatype may view it.
        let pairs = [Pair(1, 2.0), Pair(3, 4.0)];
        let firsts = UserDatatype::vector(2, 1, 2, &u32::equivalent_datatype()).unwrap();
        let view = View::with_count_and_datatype(&pairs[..], 1, &firsts).unwrap();
        assert_eq!(
            comm.pack(&view).unwrap(),
            [1u32, 3].map(u32::to_ne_bytes).concat()
        );
        // One with padding is not.
        let e = View::with_count_and_datatype(&values[..], 1, &firsts).unwrap_err();
        assert_eq!(e.class(), crate::ErrorClass::Buffer);
    }
}
