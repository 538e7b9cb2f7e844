//! Reduction operations (MPI 4.1 §6.9): the predefined ones
//! ([`SystemOperation`]) with the types each is defined for, and
//! user-defined ones ([`UserOperation`]).
//!
//! An operation combines two buffers element by element: `inout[i] =
//! input[i] op inout[i]` (the argument order of MPI's user functions). A
//! reduction applies it in rank order, lower ranks' data as `input`, so a
//! non-commutative operation sees `x0 op x1 op ... op x(n-1)`.
//!
//! Which predefined operation goes with which type follows the standard's
//! table (§6.9.2); any other pairing is an `MPI_ERR_OP` error:
//!
//! | operation | types |
//! |---|---|
//! | `max`, `min`, `sum`, `product` | integers, floating point |
//! | `logical_and`, `logical_or`, `logical_xor` | integers (0 is false; the result is 0 or 1) |
//! | `bitwise_and`, `bitwise_or`, `bitwise_xor` | integers |
//! | `min_loc`, `max_loc` | [`ValueIndex`] pairs |
//!
//! Integer sums and products wrap around on overflow. `max` and `min`
//! compare as MPICH does (`a > b ? a : b`), so a NaN is kept only where
//! it was already the accumulated value.

use super::typed::{Input, Output};
use crate::datatype::{
    Buffer, BufferMut, Datatype, DatatypeRef, ElementType, Equivalence, Primitive, UserDatatype,
};
use crate::rma::path::Segment;
use crate::{Error, ErrorClass, Result};
use std::mem::offset_of;
use std::sync::OnceLock;

/// A reduction operation: a [`SystemOperation`] or a [`UserOperation`]
/// (or a reference to one).
pub trait Operation: sealed::Sealed {
    /// Whether the operation is commutative (`MPI_Op_commutative`).
    fn is_commutative(&self) -> bool {
        match self.as_op() {
            OpRef::System(_) => true,
            OpRef::User(user) => user.commutative,
        }
    }
}

mod sealed {
    /// What an [`Operation`](super::Operation) is; only this crate's
    /// operations have it.
    pub trait Sealed {
        fn as_op(&self) -> super::OpRef<'_>;
    }
}

/// An operation as the reductions see it. (`pub` only so that the sealed
/// trait can name it; the module is private to the crate.)
#[derive(Clone, Copy)]
pub enum OpRef<'a> {
    /// A predefined operation.
    System(SystemOp),
    /// A user-defined operation.
    User(&'a UserOperation<'a>),
}

/// The predefined operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SystemOp {
    Max,
    Min,
    Sum,
    Product,
    LogicalAnd,
    LogicalOr,
    LogicalXor,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    MinLoc,
    MaxLoc,
}

impl SystemOp {
    fn mpi_name(self) -> &'static str {
        match self {
            SystemOp::Max => "MPI_MAX",
            SystemOp::Min => "MPI_MIN",
            SystemOp::Sum => "MPI_SUM",
            SystemOp::Product => "MPI_PROD",
            SystemOp::LogicalAnd => "MPI_LAND",
            SystemOp::LogicalOr => "MPI_LOR",
            SystemOp::LogicalXor => "MPI_LXOR",
            SystemOp::BitwiseAnd => "MPI_BAND",
            SystemOp::BitwiseOr => "MPI_BOR",
            SystemOp::BitwiseXor => "MPI_BXOR",
            SystemOp::MinLoc => "MPI_MINLOC",
            SystemOp::MaxLoc => "MPI_MAXLOC",
        }
    }
}

/// A predefined operation (MPI 4.1 §6.9.2), e.g. `MPI_SUM`. All are
/// commutative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemOperation(SystemOp);

impl SystemOperation {
    /// Which predefined operation this is.
    pub(crate) fn system_op(self) -> SystemOp {
        self.0
    }

    /// The predefined operation `op`.
    pub(crate) fn from_system_op(op: SystemOp) -> SystemOperation {
        SystemOperation(op)
    }

    /// The maximum (`MPI_MAX`).
    pub fn max() -> SystemOperation {
        SystemOperation(SystemOp::Max)
    }
    /// The minimum (`MPI_MIN`).
    pub fn min() -> SystemOperation {
        SystemOperation(SystemOp::Min)
    }
    /// The sum (`MPI_SUM`).
    pub fn sum() -> SystemOperation {
        SystemOperation(SystemOp::Sum)
    }
    /// The product (`MPI_PROD`).
    pub fn product() -> SystemOperation {
        SystemOperation(SystemOp::Product)
    }
    /// Logical and (`MPI_LAND`).
    pub fn logical_and() -> SystemOperation {
        SystemOperation(SystemOp::LogicalAnd)
    }
    /// Logical or (`MPI_LOR`).
    pub fn logical_or() -> SystemOperation {
        SystemOperation(SystemOp::LogicalOr)
    }
    /// Logical exclusive or (`MPI_LXOR`).
    pub fn logical_xor() -> SystemOperation {
        SystemOperation(SystemOp::LogicalXor)
    }
    /// Bitwise and (`MPI_BAND`).
    pub fn bitwise_and() -> SystemOperation {
        SystemOperation(SystemOp::BitwiseAnd)
    }
    /// Bitwise or (`MPI_BOR`).
    pub fn bitwise_or() -> SystemOperation {
        SystemOperation(SystemOp::BitwiseOr)
    }
    /// Bitwise exclusive or (`MPI_BXOR`).
    pub fn bitwise_xor() -> SystemOperation {
        SystemOperation(SystemOp::BitwiseXor)
    }
    /// The smallest value and its index (`MPI_MINLOC`), on [`ValueIndex`]
    /// pairs: among equal values, the smallest index.
    pub fn min_loc() -> SystemOperation {
        SystemOperation(SystemOp::MinLoc)
    }
    /// The largest value and its index (`MPI_MAXLOC`), on [`ValueIndex`]
    /// pairs: among equal values, the smallest index.
    pub fn max_loc() -> SystemOperation {
        SystemOperation(SystemOp::MaxLoc)
    }
}

impl sealed::Sealed for SystemOperation {
    fn as_op(&self) -> OpRef<'_> {
        OpRef::System(self.0)
    }
}

impl Operation for SystemOperation {}

/// The function of a [`UserOperation`].
type UserFunction<'a> = dyn Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a;

/// An operation defined by a closure (`MPI_Op_create`): it is called with
/// `input` and `inout` buffers of equal length and must leave `inout[i] =
/// input[i] op inout[i]`. The buffers are typed at run time: downcast them
/// to the element type of the reduction.
///
/// ```no_run
/// # let universe = oxmpi::initialize().unwrap();
/// # let world = universe.world();
/// use oxmpi::collective::UserOperation;
/// let sum = UserOperation::commutative(|input, inout| {
///     let input: &[i32] = input.downcast().unwrap();
///     let inout: &mut [i32] = inout.downcast().unwrap();
///     for (x, y) in input.iter().zip(inout) {
///         *y += x;
///     }
/// });
/// let mut total = 0;
/// world.all_reduce_into(&world.rank(), &mut total, &sum).unwrap();
/// ```
pub struct UserOperation<'a> {
    function: Box<UserFunction<'a>>,
    commutative: bool,
}

impl<'a> UserOperation<'a> {
    /// A commutative (and associative) operation: reductions may combine
    /// the ranks' data in any order.
    pub fn commutative<F>(function: F) -> UserOperation<'a>
    where
        F: Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a,
    {
        UserOperation {
            function: Box::new(function),
            commutative: true,
        }
    }

    /// An associative, not necessarily commutative operation: reductions
    /// combine the ranks' data in rank order.
    pub fn associative<F>(function: F) -> UserOperation<'a>
    where
        F: Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a,
    {
        UserOperation {
            function: Box::new(function),
            commutative: false,
        }
    }
}

impl std::fmt::Debug for UserOperation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserOperation")
            .field("commutative", &self.commutative)
            .finish_non_exhaustive()
    }
}

impl<'a> sealed::Sealed for UserOperation<'a> {
    fn as_op(&self) -> OpRef<'_> {
        OpRef::User(self)
    }
}

impl Operation for UserOperation<'_> {}

impl<T: Operation + ?Sized> sealed::Sealed for &T {
    fn as_op(&self) -> OpRef<'_> {
        (**self).as_op()
    }
}

impl<T: Operation + ?Sized> Operation for &T {}

/// The input of a [`UserOperation`]: elements of a type known at run time.
#[derive(Clone, Copy, Debug)]
pub struct DynBuffer<'a> {
    bytes: &'a [u8],
    element_type: ElementType,
}

impl<'a> DynBuffer<'a> {
    /// The elements as `T`s, if they are `T`s.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a [T]> {
        if !self.element_type.is::<T>() {
            return None;
        }
        typed(self.bytes)
    }

    /// The type of the elements.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.element_type.size()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The accumulating buffer of a [`UserOperation`], which it updates.
#[derive(Debug)]
pub struct DynBufferMut<'a> {
    bytes: &'a mut [u8],
    element_type: ElementType,
}

impl<'a> DynBufferMut<'a> {
    /// The elements as `T`s, if they are `T`s.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a mut [T]> {
        if !self.element_type.is::<T>() {
            return None;
        }
        typed_mut(self.bytes)
    }

    /// The type of the elements.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.element_type.size()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A value and its index, the element type of `min_loc` and `max_loc`
/// (MPI's pair types). Defined for the standard's pairs: `i32`
/// (`MPI_2INT`), `f32` (`MPI_FLOAT_INT`), `f64` (`MPI_DOUBLE_INT`), `i64`
/// (`MPI_LONG_INT`) and `i16` (`MPI_SHORT_INT`) values and `u32` with an
/// `i32` index, and `i64`, `u64` and `f64` values with an `i64` index.
/// A pair is laid out as C lays out the struct `{ value; index; }`, so
/// `ValueIndex<f64, i32>` has `MPI_DOUBLE_INT`'s extent of 16 bytes, of
/// which its datatype names 12 (the padding is never read or sent); any
/// `#[repr(C)]` struct of such a value and index deriving
/// [`Equivalence`] has the same type signature, and works with
/// `min_loc` and `max_loc` too.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ValueIndex<V, I> {
    /// The value compared.
    pub value: V,
    /// Its index (e.g. the rank that holds it).
    pub index: I,
}

/// The pair types: each `value, index;` of [`ValueIndex`] (the
/// `Equivalence` impls and the location kernels).
macro_rules! for_each_pair {
    ($m:ident) => {
        $m! {
            i32, i32;
            u32, i32;
            f32, i32;
            f64, i32;
            i64, i32;
            i16, i32;
            i64, i64;
            u64, i64;
            f64, i64;
        }
    };
}

macro_rules! value_index {
    ($($v:ty, $i:ty;)*) => {$(
        // SAFETY: `repr(C)` with two fields that take any bits (all zeros
        // included), and the datatype names the two fields at their
        // offsets, never the padding after a narrower index, resized to
        // the pair's size (as `#[derive(Equivalence)]` makes it).
        unsafe impl Equivalence for ValueIndex<$v, $i> {
            fn equivalent_datatype() -> DatatypeRef<'static> {
                static DATATYPE: OnceLock<UserDatatype> = OnceLock::new();
                DATATYPE
                    .get_or_init(|| {
                        UserDatatype::of_struct_fields(
                            std::mem::size_of::<ValueIndex<$v, $i>>(),
                            &[
                                (offset_of!(ValueIndex<$v, $i>, value), 1, <$v>::equivalent_datatype()),
                                (offset_of!(ValueIndex<$v, $i>, index), 1, <$i>::equivalent_datatype()),
                            ],
                        )
                    })
                    .as_datatype_ref()
            }
        }
    )*};
}

for_each_pair!(value_index);

/// Combines `input` into `inout`: `inout[i] = input[i] op inout[i]`.
/// `None` if the bytes are not aligned for the element type.
type Kernel = fn(&[u8], &mut [u8]) -> Option<()>;

/// Combines `input` into runs of window memory, each run a [`Segment`]
/// (its bytes at `disp` in the window, combined with `input[data]`), their
/// old bytes to the same range of the result if given, in order, as
/// [`Kernel`] does for one, and stops before a run as long as the last
/// argument or longer, or one it cannot do (out of range, not aligned):
/// the number of runs done.
type RunsKernel = unsafe fn(&[u8], *mut [u8], &[Segment], Option<&mut [u8]>, usize) -> usize;

/// A predefined operation's kernels on one type of numbers.
#[derive(Clone, Copy)]
struct Kernels {
    contiguous: Kernel,
    runs: RunsKernel,
}

/// An operation ready to apply to elements of one type: see
/// [`Reduction::new`].
#[derive(Clone, Copy)]
pub(crate) struct Reduction<'o> {
    op: OpRef<'o>,
    element_type: ElementType,
    kernel: Option<Kernel>,
}

impl<'o> Reduction<'o> {
    /// `op` on elements of `element_type`; an `MPI_ERR_OP` error if `op`
    /// is a predefined operation not defined for that type.
    pub(crate) fn new<O: Operation + ?Sized>(
        op: &'o O,
        element_type: ElementType,
    ) -> Result<Reduction<'o>> {
        let op = op.as_op();
        let kernel = match op {
            OpRef::System(system) => {
                Some(kernel(system, element_type).ok_or_else(|| undefined(system, element_type))?)
            }
            OpRef::User(_) => None,
        };
        Ok(Reduction {
            op,
            element_type,
            kernel,
        })
    }

    /// The type of the elements it combines.
    pub(crate) fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Whether the data may be combined in any order.
    pub(crate) fn is_commutative(&self) -> bool {
        match self.op {
            OpRef::System(_) => true,
            OpRef::User(user) => user.commutative,
        }
    }

    /// Size in bytes of the smallest part of the data the operation
    /// combines on its own: the basic type's where the elements are all
    /// of one (a vector of `f64` is combined `f64` by `f64`), else an
    /// element's. The algorithms split data only at multiples of it, so
    /// processes whose datatypes differ (a vector, or as many `f64`s)
    /// split it alike, and long data of one element can be split.
    pub(crate) fn unit_size(&self) -> usize {
        let element_type = self.element_type;
        element_type
            .basic()
            .map_or(element_type.size(), |basic| basic.size())
    }

    /// `inout[i] = input[i] op inout[i]` for every element (the two are
    /// equally long, a whole number of elements, aligned for them).
    pub(crate) fn apply(&self, input: &[u8], inout: &mut [u8]) -> Result<()> {
        debug_assert_eq!(input.len(), inout.len());
        let applied = match (self.kernel, self.op) {
            (Some(kernel), _) => kernel(input, inout),
            (None, OpRef::User(user)) => {
                (user.function)(
                    DynBuffer {
                        bytes: input,
                        element_type: self.element_type,
                    },
                    DynBufferMut {
                        bytes: inout,
                        element_type: self.element_type,
                    },
                );
                Some(())
            }
            (None, OpRef::System(_)) => None,
        };
        applied.ok_or_else(|| {
            Error::new(
                ErrorClass::Intern,
                format!(
                    "a reduction buffer of {} is not aligned for its elements",
                    self.element_type.name()
                ),
            )
        })
    }
}

/// A predefined operation on numbers of one basic type or on value-index
/// pairs, its kernel looked up once: what a one-sided accumulate applies.
/// A function pointer, where a [`Reduction`] also carries the operation
/// and the element type for user-defined operations (building and
/// copying that cost a one-element fetch-and-op some 40 instructions
/// more).
#[derive(Clone, Copy)]
pub(crate) struct PredefinedReduction {
    kernel: Kernel,
    /// The runs kernel, for numbers (pairs: none, one run at a time).
    runs: Option<RunsKernel>,
}

impl PredefinedReduction {
    /// `op` on numbers of type `basic`; an `MPI_ERR_OP` error if the
    /// standard does not define it for them (`MPI_MINLOC` and
    /// `MPI_MAXLOC` take value-index pairs, never a basic type). Always
    /// inlined (a table look-up): where the one-sided direct path is
    /// inlined whole, the compiler kept this a call (27 instructions per
    /// accumulate with the call).
    #[inline(always)]
    pub(crate) fn new(op: SystemOp, basic: Primitive) -> Result<PredefinedReduction> {
        match number_kernel_of(op, basic) {
            Some(kernels) => Ok(PredefinedReduction {
                kernel: kernels.contiguous,
                runs: Some(kernels.runs),
            }),
            None => Err(undefined(op, ElementType::of_basic(basic))),
        }
    }

    /// `op` on value-index pairs of type `pair`: the collectives' location
    /// kernel; an `MPI_ERR_OP` error for any operation but `MPI_MINLOC`
    /// and `MPI_MAXLOC`. Out of line: off the numbers' way.
    #[inline(never)]
    pub(crate) fn of_pairs(op: SystemOp, pair: PairType) -> Result<PredefinedReduction> {
        match pair.kernel(op) {
            Some(kernel) => Ok(PredefinedReduction { kernel, runs: None }),
            None => Err(undefined(op, pair.element_type())),
        }
    }

    /// `inout[i] = input[i] op inout[i]` for every element, where both
    /// are equally long, a whole number of elements, aligned for them;
    /// `false` (nothing done) if they are not aligned (or, for pairs,
    /// which are read at any alignment, not whole pairs).
    #[inline]
    pub(crate) fn apply(self, input: &[u8], inout: &mut [u8]) -> bool {
        debug_assert_eq!(input.len(), inout.len());
        (self.kernel)(input, inout).is_some()
    }

    /// [`PredefinedReduction::apply`] on runs of `window`, in order: each
    /// of `runs` combines `input[data]` into the window's bytes at `disp`,
    /// their bytes from before first copied to `old[data]` if `old` is
    /// given; the number of runs done, stopping before the first it
    /// cannot do (out of `window`, `input` or `old`, not aligned, not
    /// whole elements), or as long as `shorter_than` or longer, which the
    /// caller does its own way. Each run's bytes are borrowed only while
    /// it is combined. Pairs do none (0).
    ///
    /// # Safety
    /// `window` is valid for reads and writes of its length; while this
    /// runs, the caller may write the bytes of every run it covers and
    /// no one else writes them or reads them but with atomic loads (the
    /// region mutexes or the exclusive lock of the one-sided direct path).
    #[inline]
    pub(crate) unsafe fn apply_runs(
        self,
        input: &[u8],
        window: *mut [u8],
        runs: &[Segment],
        old: Option<&mut [u8]>,
        shorter_than: usize,
    ) -> usize {
        match self.runs {
            // SAFETY: the caller's guarantee, the runs kernel's contract.
            Some(kernel) => unsafe { kernel(input, window, runs, old, shorter_than) },
            None => 0,
        }
    }
}

/// The `MPI_ERR_OP` error for a predefined operation on a type the
/// standard does not define it for. Cold: out of the way of the
/// reductions that are defined.
#[cold]
fn undefined(op: SystemOp, element_type: ElementType) -> Error {
    Error::new(
        ErrorClass::Op,
        format!(
            "{} is not defined for {} (MPI 4.1 §6.9.2 lists the types of each operation)",
            op.mpi_name(),
            element_type.name()
        ),
    )
}

/// Applies `op` to `input` and `inout` on this process alone, leaving
/// `inout[i] = input[i] op inout[i]` (`MPI_Reduce_local`). The two must
/// hold equally many elements (else `MPI_ERR_COUNT`) of one type (else
/// `MPI_ERR_TYPE`).
pub fn reduce_local_into<S, R, O>(input: &S, inout: &mut R, op: O) -> Result<()>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let (input, mut output) = (Input::new(input)?, Output::new(inout)?);
    let element_type = same_element_type(input.element_type(), output.element_type())?;
    let reduction = Reduction::new(&op, element_type)?;
    let (input, inout) = (input.bytes(), output.bytes_mut());
    if input.len() != inout.len() {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "the input holds {} elements and the result buffer {}",
                input.len() / element_type.size(),
                inout.len() / element_type.size()
            ),
        ));
    }
    reduction.apply(input, inout)?;
    output.finish()
}

/// The element type two buffers share, or an `MPI_ERR_TYPE` error.
#[inline]
pub(crate) fn same_element_type(a: ElementType, b: ElementType) -> Result<ElementType> {
    if a != b {
        return Err(Error::new(
            ErrorClass::Type,
            format!(
                "the buffers hold different types ({} and {})",
                a.name(),
                b.name()
            ),
        ));
    }
    Ok(a)
}

/// `bytes` as a slice of `T`, if they are aligned for it and a whole
/// number of `T`s. A test of the address's low bits and of the length
/// (`align_to`, which finds the aligned middle of any bytes, cost a
/// one-element one-sided fetch-and-op some 25 instructions more).
#[inline(always)]
fn typed<T: Equivalence>(bytes: &[u8]) -> Option<&[T]> {
    let start = bytes.as_ptr().cast::<T>();
    whole_run(start, bytes.len()).then(|| {
        // SAFETY: the callers' `T` is plain (a number, or a type that
        // `ElementType::is` found plain): no padding, and no invalid bit
        // patterns (`Equivalence`), so any aligned run of bytes is a
        // valid run of `T`s; the `T`s cover exactly the bytes (checked
        // above), which stay borrowed as long as the slice.
        unsafe { std::slice::from_raw_parts(start, bytes.len() / size_of::<T>()) }
    })
}

/// Whether `len` bytes from `start` are a whole number of `T`s at an
/// address aligned for them.
#[inline(always)]
fn whole_run<T>(start: *const T, len: usize) -> bool {
    start.is_aligned() && len.is_multiple_of(size_of::<T>())
}

/// `bytes` as a mutable slice of `T`, as [`typed`].
#[inline(always)]
fn typed_mut<T: Equivalence>(bytes: &mut [u8]) -> Option<&mut [T]> {
    let start = bytes.as_mut_ptr().cast::<T>();
    whole_run(start, bytes.len()).then(|| {
        // SAFETY: as in `typed`; any `T` written back is valid bytes, and
        // the slice borrows `bytes` exclusively.
        unsafe { std::slice::from_raw_parts_mut(start, bytes.len() / size_of::<T>()) }
    })
}

/// `inout[i] = f(input[i], inout[i])` over elements of `T`, if the bytes
/// are aligned for them and whole ones ([`combine_typed`]).
#[inline(always)]
fn elementwise<T: Number, const WIDE: bool>(
    input: &[u8],
    inout: &mut [u8],
    f: impl Fn(T, T) -> T,
) -> Option<()> {
    let input = typed::<T>(input)?;
    let inout = typed_mut::<T>(inout)?;
    combine_typed::<T, WIDE>(input, inout, f);
    Some(())
}

/// `inout[i] = f(input[i], inout[i])`, with the loop compiled for AVX2
/// when `WIDE` (only chosen where the CPU has it: [`number_kernels`]) and
/// for the build's baseline otherwise.
#[inline(always)]
fn combine_typed<T: Copy, const WIDE: bool>(input: &[T], inout: &mut [T], f: impl Fn(T, T) -> T) {
    // A few elements (one, for a fetch-and-op) gain nothing from wide
    // registers and would pay the vector loop's set-up: the plain loop.
    #[cfg(target_arch = "x86_64")]
    if WIDE && input.len() >= WIDE_FROM {
        // SAFETY: `WIDE` kernels are only picked after
        // `is_x86_feature_detected!("avx2")` said yes ([`number_kernels`]).
        unsafe { combine_avx2(input, inout, f) };
        return;
    }
    combine_each(input, inout, f);
}

/// From how many elements [`elementwise`] takes the AVX2 loop.
#[cfg(target_arch = "x86_64")]
const WIDE_FROM: usize = 8;

/// The loop of [`elementwise`]: kept one, so that the AVX2 build of it
/// below is the same code, vectorised by the compiler for wider
/// registers.
#[inline(always)]
fn combine_each<T: Copy>(input: &[T], inout: &mut [T], f: impl Fn(T, T) -> T) {
    for (x, y) in input.iter().zip(inout) {
        *y = f(*x, *y);
    }
}

/// [`combine_each`] compiled with AVX2 enabled: 256-bit lanes where the
/// baseline (SSE2) has 128, and 64-bit integer compares (`max`, `min`)
/// that SSE2 lacks.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn combine_avx2<T: Copy>(input: &[T], inout: &mut [T], f: impl Fn(T, T) -> T) {
    combine_each(input, inout, f)
}

/// Integers and floating-point numbers: what `max`, `min`, `sum` and
/// `product` apply to.
trait Number: Equivalence + PartialOrd {
    fn plus(self, other: Self) -> Self;
    fn times(self, other: Self) -> Self;
}

/// Integers: what the logical and bitwise operations apply to.
trait Integer:
    Number
    + std::ops::BitAnd<Output = Self>
    + std::ops::BitOr<Output = Self>
    + std::ops::BitXor<Output = Self>
{
    fn is_true(self) -> bool;
    fn from_bool(b: bool) -> Self;
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl Number for $t {
            fn plus(self, other: $t) -> $t {
                self.wrapping_add(other)
            }
            fn times(self, other: $t) -> $t {
                self.wrapping_mul(other)
            }
        }
        impl Integer for $t {
            fn is_true(self) -> bool {
                self != 0
            }
            fn from_bool(b: bool) -> $t {
                <$t>::from(b)
            }
        }
    )*};
}

integers!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);

macro_rules! floats {
    ($($t:ty),*) => {$(
        impl Number for $t {
            fn plus(self, other: $t) -> $t {
                self + other
            }
            fn times(self, other: $t) -> $t {
                self * other
            }
        }
    )*};
}

floats!(f32, f64);

/// A predefined operation on numbers of type `T`, as a type: each kernel
/// is compiled for one ([`contiguous`], [`over_runs`]), the operation inlined
/// in its loop.
trait Combine<T> {
    fn combine(a: T, b: T) -> T;
}

macro_rules! operations {
    ($($(#[$doc:meta])* $name:ident<$bound:ident>: |$a:ident, $b:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        struct $name;
        impl<T: $bound> Combine<T> for $name {
            #[inline(always)]
            fn combine($a: T, $b: T) -> T {
                $body
            }
        }
    )*};
}

operations! {
    /// `MPI_MAX`, compared as MPICH does (`a > b ? a : b`).
    Max<Number>: |a, b| if a > b { a } else { b };
    /// `MPI_MIN`.
    Min<Number>: |a, b| if a < b { a } else { b };
    /// `MPI_SUM`.
    Sum<Number>: |a, b| a.plus(b);
    /// `MPI_PROD`.
    Product<Number>: |a, b| a.times(b);
    /// `MPI_LAND`.
    LogicalAnd<Integer>: |a, b| T::from_bool(a.is_true() && b.is_true());
    /// `MPI_LOR`.
    LogicalOr<Integer>: |a, b| T::from_bool(a.is_true() || b.is_true());
    /// `MPI_LXOR`.
    LogicalXor<Integer>: |a, b| T::from_bool(a.is_true() != b.is_true());
    /// `MPI_BAND`.
    BitwiseAnd<Integer>: |a, b| a & b;
    /// `MPI_BOR`.
    BitwiseOr<Integer>: |a, b| a | b;
    /// `MPI_BXOR`.
    BitwiseXor<Integer>: |a, b| a ^ b;
}

/// The kernel of operation `O` on numbers of type `T` ([`Kernel`]).
fn contiguous<T: Number, O: Combine<T>, const WIDE: bool>(
    input: &[u8],
    inout: &mut [u8],
) -> Option<()> {
    elementwise::<T, WIDE>(input, inout, O::combine)
}

/// The runs kernel of operation `O` on numbers of type `T`
/// ([`RunsKernel`]): [`contiguous`]'s loop ([`combine_typed`]) on each
/// run, in one function, so that a run of one element costs its checks
/// and one combination, not a call through the table. The bases (window,
/// data, result) are tested for alignment once, then each run's offsets:
/// a number's size is a power of two and a multiple of its alignment.
///
/// # Safety
/// As [`PredefinedReduction::apply_runs`].
unsafe fn over_runs<T: Number, O: Combine<T>, const WIDE: bool>(
    input: &[u8],
    window: *mut [u8],
    runs: &[Segment],
    mut old: Option<&mut [u8]>,
    shorter_than: usize,
) -> usize {
    let (base, window_len, size) = (window.cast::<u8>(), window.len(), size_of::<T>());
    let old_base = old.as_deref().map_or(0, |old| old.as_ptr() as usize);
    if (base as usize | input.as_ptr() as usize | old_base) & (align_of::<T>() - 1) != 0 {
        return 0;
    }
    for (done, run) in runs.iter().enumerate() {
        let (start, end) = (run.data.start, run.data.end);
        let Ok(at) = usize::try_from(run.disp) else {
            return done;
        };
        let len = end.wrapping_sub(start);
        let fits = start <= end && len <= window_len && at <= window_len - len;
        if !fits || (at | start | len) & (size - 1) != 0 || len >= shorter_than {
            return done;
        }
        let Some(data) = input.get(start..end) else {
            return done;
        };
        let old = match old.as_deref_mut() {
            Some(old) => match old.get_mut(start..end) {
                Some(old) => Some(old),
                None => return done,
            },
            None => None,
        };
        let count = len / size;
        // SAFETY: the data's bytes, and the run's bytes of `window`
        // (checked above: which the caller may read and write, and nobody
        // else writes or reads but atomically meanwhile, this function's
        // contract), are whole `T`s at addresses aligned for them (the
        // bases and the offsets, tested); a number takes any bits. The
        // window's slice lives for this run alone.
        let (data, inout) = unsafe {
            (
                std::slice::from_raw_parts(data.as_ptr().cast::<T>(), count),
                std::slice::from_raw_parts_mut(base.add(at).cast::<T>(), count),
            )
        };
        if let Some(old) = old {
            old.copy_from_slice(as_bytes(inout));
        }
        if let ([x], [y]) = (data, &mut *inout) {
            // One element, a strided layout's usual run: without the
            // loop's set-up (the two lengths' minimum, the unrolled
            // part's test), which cost it as much again.
            *y = O::combine(*x, *y);
        } else {
            combine_typed::<T, WIDE>(data, inout, O::combine);
        }
    }
    runs.len()
}

/// The bytes of `values`.
#[inline(always)]
fn as_bytes<T: Number>(values: &[T]) -> &[u8] {
    // SAFETY: a number has no padding: its bytes are initialised.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values)) }
}

/// `MPI_MINLOC` (`smaller_first`) or `MPI_MAXLOC`: the winning value,
/// and the smaller index on a tie.
fn pick_loc<V: Number, I: Number>(
    a: ValueIndex<V, I>,
    b: ValueIndex<V, I>,
    smaller_first: bool,
) -> ValueIndex<V, I> {
    let a_wins = if smaller_first {
        a.value < b.value
    } else {
        a.value > b.value
    };
    let b_wins = if smaller_first {
        b.value < a.value
    } else {
        b.value > a.value
    };
    match (a_wins, b_wins) {
        (true, _) => a,
        (_, true) => b,
        _ => ValueIndex {
            value: a.value,
            index: if b.index < a.index { b.index } else { a.index },
        },
    }
}

/// `inout[i] = pick_loc(input[i], inout[i])` over packed pairs: each a
/// `V` and then an `I`, with no padding (the packed data of a pair type:
/// 12 bytes for `MPI_DOUBLE_INT`, whose C struct takes 16), read where
/// they lie, aligned or not. `None` if the bytes are not whole pairs.
fn pick_locs<V: Number, I: Number>(
    input: &[u8],
    inout: &mut [u8],
    smaller_first: bool,
) -> Option<()> {
    let split = size_of::<V>();
    let pair = split + size_of::<I>();
    if !input.len().is_multiple_of(pair) || !inout.len().is_multiple_of(pair) {
        return None;
    }
    for (x, y) in input.chunks_exact(pair).zip(inout.chunks_exact_mut(pair)) {
        let (x_value, x_index) = x.split_at(split);
        let a = ValueIndex {
            value: read_number::<V>(x_value),
            index: read_number::<I>(x_index),
        };
        let (y_value, y_index) = y.split_at_mut(split);
        let b = ValueIndex {
            value: read_number::<V>(y_value),
            index: read_number::<I>(y_index),
        };
        let won = pick_loc(a, b, smaller_first);
        write_number(y_value, won.value);
        write_number(y_index, won.index);
    }
    Some(())
}

/// The number `bytes` hold (exactly its size, at any alignment).
#[inline(always)]
fn read_number<T: Number>(bytes: &[u8]) -> T {
    assert_eq!(bytes.len(), size_of::<T>());
    // SAFETY: `bytes` holds `size_of::<T>()` bytes (checked above), and a
    // number has no padding and takes any bits.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// Writes `value` into `bytes` (exactly its size, at any alignment).
#[inline(always)]
fn write_number<T: Number>(bytes: &mut [u8], value: T) {
    assert_eq!(bytes.len(), size_of::<T>());
    // SAFETY: `bytes` has room for `size_of::<T>()` bytes (checked
    // above), which it borrows exclusively.
    unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast::<T>(), value) }
}

fn min_loc<V: Number, I: Number>(input: &[u8], inout: &mut [u8]) -> Option<()> {
    pick_locs::<V, I>(input, inout, true)
}

fn max_loc<V: Number, I: Number>(input: &[u8], inout: &mut [u8]) -> Option<()> {
    pick_locs::<V, I>(input, inout, false)
}

/// The kernels of a predefined operation on integers of type `T`.
fn integer_kernel<T: Integer, const WIDE: bool>(op: SystemOp) -> Option<Kernels> {
    Some(match op {
        SystemOp::LogicalAnd => kernels::<T, LogicalAnd, WIDE>(),
        SystemOp::LogicalOr => kernels::<T, LogicalOr, WIDE>(),
        SystemOp::LogicalXor => kernels::<T, LogicalXor, WIDE>(),
        SystemOp::BitwiseAnd => kernels::<T, BitwiseAnd, WIDE>(),
        SystemOp::BitwiseOr => kernels::<T, BitwiseOr, WIDE>(),
        SystemOp::BitwiseXor => kernels::<T, BitwiseXor, WIDE>(),
        _ => return arithmetic_kernel::<T, WIDE>(op),
    })
}

/// The kernels of the predefined operations on every number, integer or
/// floating-point: `MPI_MAX`, `MPI_MIN`, `MPI_SUM` and `MPI_PROD`.
fn arithmetic_kernel<T: Number, const WIDE: bool>(op: SystemOp) -> Option<Kernels> {
    Some(match op {
        SystemOp::Max => kernels::<T, Max, WIDE>(),
        SystemOp::Min => kernels::<T, Min, WIDE>(),
        SystemOp::Sum => kernels::<T, Sum, WIDE>(),
        SystemOp::Product => kernels::<T, Product, WIDE>(),
        _ => return None,
    })
}

/// Operation `O`'s kernels on numbers of type `T`.
fn kernels<T: Number, O: Combine<T>, const WIDE: bool>() -> Kernels {
    Kernels {
        contiguous: contiguous::<T, O, WIDE>,
        runs: over_runs::<T, O, WIDE>,
    }
}

/// The kernel of `op` on `element_type`, if the standard defines it.
/// Inlined: on the numbers, the common case (a one-sided fetch-and-op
/// picks its kernel on every call, twice), it is a table look-up.
#[inline]
fn kernel(op: SystemOp, element_type: ElementType) -> Option<Kernel> {
    if matches!(op, SystemOp::MinLoc | SystemOp::MaxLoc) {
        return location_kernel(op, element_type);
    }
    number_kernel_of(op, element_type.basic()?).map(|kernels| kernels.contiguous)
}

/// The kernel of `op` on numbers of type `basic`, if the standard defines
/// it (`None` for the value-index pairs' operations). Inlined: a table
/// look-up.
#[inline]
fn number_kernel_of(op: SystemOp, basic: Primitive) -> Option<Kernels> {
    number_kernels()[basic as usize]
        .get(op as usize)
        .copied()
        .flatten()
}

/// The kernel of `MPI_MINLOC` or `MPI_MAXLOC` on `element_type`, if its
/// data is [`ValueIndex`] pairs (tested before the numbers: a pair of
/// `i32`s is also two `i32`s). Out of line, so that [`kernel`] stays
/// small.
#[inline(never)]
fn location_kernel(op: SystemOp, element_type: ElementType) -> Option<Kernel> {
    PairType::of(element_type).and_then(|pair| pair.kernel(op))
}

/// A value-index pair type, the type `MPI_MINLOC` and `MPI_MAXLOC` take:
/// its place in the list of pair types (`for_each_pair`), which is also
/// its code in one-sided messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PairType(u8);

/// What is known of a pair type: its element type, its packed size and
/// its two kernels.
struct PairKernels {
    element_type: fn() -> ElementType,
    size: usize,
    min_loc: Kernel,
    max_loc: Kernel,
}

macro_rules! pair_kernels {
    ($($v:ty, $i:ty;)*) => {
        /// Every pair type's kernels, in the order of `for_each_pair`.
        const PAIRS: &[PairKernels] = &[$(
            PairKernels {
                element_type: ElementType::of::<ValueIndex<$v, $i>>,
                size: size_of::<$v>() + size_of::<$i>(),
                min_loc: min_loc::<$v, $i>,
                max_loc: max_loc::<$v, $i>,
            },
        )*];
    };
}

for_each_pair!(pair_kernels);

impl PairType {
    /// The pair type whose data `element_type`'s is: of the pair's type
    /// signature, each element a whole number of pairs (a pair type, or
    /// a derived type of it such as a contiguous run of pairs). Not
    /// [`ElementType::is`], which asks that the type lie in memory as its
    /// packed data does: a pair with padding does not.
    pub(crate) fn of(element_type: ElementType) -> Option<PairType> {
        static ELEMENT_TYPES: OnceLock<Vec<ElementType>> = OnceLock::new();
        let pairs =
            ELEMENT_TYPES.get_or_init(|| PAIRS.iter().map(|p| (p.element_type)()).collect());
        let index = pairs.iter().position(|&pair| {
            element_type == pair && element_type.size().is_multiple_of(pair.size())
        })?;
        Some(PairType(index as u8))
    }

    /// The pair type of code `code` ([`PairType::code`]), if there is one.
    pub(crate) fn from_code(code: u8) -> Option<PairType> {
        (usize::from(code) < PAIRS.len()).then_some(PairType(code))
    }

    /// Its code: its index among the pair types.
    pub(crate) fn code(self) -> u8 {
        self.0
    }

    /// Bytes of one pair's packed data (12 for `MPI_DOUBLE_INT`).
    pub(crate) fn size(self) -> usize {
        PAIRS[usize::from(self.0)].size
    }

    /// The kernel of `op` on these pairs: `MPI_MINLOC` and `MPI_MAXLOC`
    /// only.
    fn kernel(self, op: SystemOp) -> Option<Kernel> {
        let pair = &PAIRS[usize::from(self.0)];
        match op {
            SystemOp::MinLoc => Some(pair.min_loc),
            SystemOp::MaxLoc => Some(pair.max_loc),
            _ => None,
        }
    }

    /// The element type of one pair (for messages).
    pub(crate) fn element_type(self) -> ElementType {
        (PAIRS[usize::from(self.0)].element_type)()
    }
}

/// The operations on numbers: every [`SystemOp`] but the two on
/// value-index pairs, which come last.
const NUMBER_OPS: usize = SystemOp::MinLoc as usize;

/// The kernels of the operations on numbers, by basic type (its index in
/// [`Primitive::ALL`]) and [`SystemOp`]; `None` where the standard does
/// not define the pair.
type NumberKernels = [[Option<Kernels>; NUMBER_OPS]; Primitive::ALL.len()];

/// The kernels for this CPU, picked once: those compiled for AVX2 where
/// it has it (x86-64), else the baseline's. A table, where testing each
/// type in turn cost more than a small reduction itself (a one-sided
/// fetch-and-op picks its kernel on every call).
fn number_kernels() -> &'static NumberKernels {
    static KERNELS: OnceLock<NumberKernels> = OnceLock::new();
    KERNELS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let wide = std::arch::is_x86_feature_detected!("avx2");
        #[cfg(not(target_arch = "x86_64"))]
        let wide = false;
        let mut table: NumberKernels = [[None; NUMBER_OPS]; Primitive::ALL.len()];
        for basic in Primitive::ALL {
            for (index, kernel) in table[basic as usize].iter_mut().enumerate() {
                let op = NUMBER_OP_ORDER[index];
                *kernel = if wide {
                    number_kernel::<true>(op, basic)
                } else {
                    number_kernel::<false>(op, basic)
                };
            }
        }
        table
    })
}

/// The [`SystemOp`]s on numbers (all but the location pairs') in their
/// declaration order, so that `NUMBER_OP_ORDER[op as usize] == op`; also
/// the order of the reductions' codes in one-sided messages.
pub(crate) const NUMBER_OP_ORDER: [SystemOp; NUMBER_OPS] = [
    SystemOp::Max,
    SystemOp::Min,
    SystemOp::Sum,
    SystemOp::Product,
    SystemOp::LogicalAnd,
    SystemOp::LogicalOr,
    SystemOp::LogicalXor,
    SystemOp::BitwiseAnd,
    SystemOp::BitwiseOr,
    SystemOp::BitwiseXor,
];

/// The kernel of `op` on numbers of type `basic`, compiled for AVX2 if
/// `WIDE`.
fn number_kernel<const WIDE: bool>(op: SystemOp, basic: Primitive) -> Option<Kernels> {
    match basic {
        Primitive::I8 => integer_kernel::<i8, WIDE>(op),
        Primitive::I16 => integer_kernel::<i16, WIDE>(op),
        Primitive::I32 => integer_kernel::<i32, WIDE>(op),
        Primitive::I64 => integer_kernel::<i64, WIDE>(op),
        Primitive::I128 => integer_kernel::<i128, WIDE>(op),
        Primitive::Isize => integer_kernel::<isize, WIDE>(op),
        Primitive::U8 => integer_kernel::<u8, WIDE>(op),
        Primitive::U16 => integer_kernel::<u16, WIDE>(op),
        Primitive::U32 => integer_kernel::<u32, WIDE>(op),
        Primitive::U64 => integer_kernel::<u64, WIDE>(op),
        Primitive::U128 => integer_kernel::<u128, WIDE>(op),
        Primitive::Usize => integer_kernel::<usize, WIDE>(op),
        Primitive::F32 => arithmetic_kernel::<f32, WIDE>(op),
        Primitive::F64 => arithmetic_kernel::<f64, WIDE>(op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply<T: Equivalence>(op: SystemOperation, input: &[T], inout: &mut [T]) -> Result<()> {
        reduce_local_into(input, inout, op)
    }

    #[test]
    fn every_predefined_operation_on_integers() {
        let a = [6i32, -3, 0, 5];
        let cases: [(SystemOperation, [i32; 4]); 10] = [
            (SystemOperation::max(), [6, 2, 0, 5]),
            (SystemOperation::min(), [1, -3, 0, 0]),
            (SystemOperation::sum(), [7, -1, 0, 5]),
            (SystemOperation::product(), [6, -6, 0, 0]),
            (SystemOperation::logical_and(), [1, 1, 0, 0]),
            (SystemOperation::logical_or(), [1, 1, 0, 1]),
            (SystemOperation::logical_xor(), [0, 0, 0, 1]),
            (SystemOperation::bitwise_and(), [0, 0, 0, 0]),
            (SystemOperation::bitwise_or(), [7, -1, 0, 5]),
            (SystemOperation::bitwise_xor(), [7, -1, 0, 5]),
        ];
        for (op, expected) in cases {
            let mut b = [1i32, 2, 0, 0];
            apply(op, &a, &mut b).unwrap();
            assert_eq!(b, expected, "{op:?}");
        }
        let mut wrapped = [u8::MAX];
        apply(SystemOperation::sum(), &[2u8], &mut wrapped).unwrap();
        assert_eq!(wrapped, [1]);
    }

    #[test]
    fn floats_take_arithmetic_and_refuse_bitwise_and_logical_operations() {
        let mut b = [1.5f64, -2.0];
        apply(SystemOperation::sum(), &[0.25, 4.0], &mut b).unwrap();
        assert_eq!(b, [1.75, 2.0]);
        apply(SystemOperation::max(), &[3.0, 1.0], &mut b).unwrap();
        assert_eq!(b, [3.0, 2.0]);
        apply(SystemOperation::product(), &[2.0, 0.5], &mut b).unwrap();
        assert_eq!(b, [6.0, 1.0]);
        for op in [
            SystemOperation::bitwise_and(),
            SystemOperation::bitwise_or(),
            SystemOperation::bitwise_xor(),
            SystemOperation::logical_and(),
            SystemOperation::logical_or(),
            SystemOperation::logical_xor(),
            SystemOperation::min_loc(),
            SystemOperation::max_loc(),
        ] {
            let e = apply(op, &[1.0f32], &mut [2.0f32]).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Op, "{op:?}");
        }
    }

    #[test]
    fn the_table_covers_every_type_class() {
        let ints = [
            ElementType::of::<i8>(),
            ElementType::of::<i16>(),
            ElementType::of::<i32>(),
            ElementType::of::<i64>(),
            ElementType::of::<i128>(),
            ElementType::of::<isize>(),
            ElementType::of::<u8>(),
            ElementType::of::<u16>(),
            ElementType::of::<u32>(),
            ElementType::of::<u64>(),
            ElementType::of::<u128>(),
            ElementType::of::<usize>(),
        ];
        let floats = [ElementType::of::<f32>(), ElementType::of::<f64>()];
        let pairs = [
            (ElementType::of::<ValueIndex<i32, i32>>(), true),
            (ElementType::of::<ValueIndex<u32, i32>>(), false),
            (ElementType::of::<ValueIndex<f32, i32>>(), false),
            (ElementType::of::<ValueIndex<f64, i32>>(), false),
            (ElementType::of::<ValueIndex<i64, i32>>(), false),
            (ElementType::of::<ValueIndex<i16, i32>>(), false),
            (ElementType::of::<ValueIndex<i64, i64>>(), true),
            (ElementType::of::<ValueIndex<u64, i64>>(), false),
            (ElementType::of::<ValueIndex<f64, i64>>(), false),
        ];
        use SystemOp::*;
        let all = [
            Max, Min, Sum, Product, LogicalAnd, LogicalOr, LogicalXor, BitwiseAnd, BitwiseOr,
            BitwiseXor, MinLoc, MaxLoc,
        ];
        for op in all {
            let arithmetic = matches!(op, Max | Min | Sum | Product);
            let location = matches!(op, MinLoc | MaxLoc);
            for t in ints {
                assert_eq!(kernel(op, t).is_some(), !location, "{op:?} {}", t.name());
            }
            for t in floats {
                assert_eq!(kernel(op, t).is_some(), arithmetic, "{op:?} {}", t.name());
            }
            for (t, same_types) in pairs {
                // A pair of two values of one type has the signature of
                // two of them, so the numbers' operations apply too.
                let defined = location || same_types;
                assert_eq!(kernel(op, t).is_some(), defined, "{op:?} {}", t.name());
            }
        }
    }

    #[test]
    fn the_kernel_tables_follow_the_declaration_orders() {
        for (i, basic) in Primitive::ALL.into_iter().enumerate() {
            assert_eq!(basic as usize, i, "{basic:?}");
        }
        for (i, op) in NUMBER_OP_ORDER.into_iter().enumerate() {
            assert_eq!(op as usize, i, "{op:?}");
        }
    }

    /// A small deterministic generator (xorshift64).
    struct Bits(u64);

    impl Bits {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// What each operation does to one pair of elements, written out
    /// element by element: the reference for the kernels.
    fn reference<T: Number>(op: SystemOp, a: T, b: T, bitwise: impl Fn(SystemOp, T, T) -> T) -> T {
        match op {
            SystemOp::Max => {
                if a > b {
                    a
                } else {
                    b
                }
            }
            SystemOp::Min => {
                if a < b {
                    a
                } else {
                    b
                }
            }
            SystemOp::Sum => a.plus(b),
            SystemOp::Product => a.times(b),
            _ => bitwise(op, a, b),
        }
    }

    fn integer_reference<T: Integer>(op: SystemOp, a: T, b: T) -> T {
        reference(op, a, b, |op, a: T, b: T| match op {
            SystemOp::LogicalAnd => T::from_bool(a.is_true() && b.is_true()),
            SystemOp::LogicalOr => T::from_bool(a.is_true() || b.is_true()),
            SystemOp::LogicalXor => T::from_bool(a.is_true() != b.is_true()),
            SystemOp::BitwiseAnd => a & b,
            SystemOp::BitwiseOr => a | b,
            _ => a ^ b,
        })
    }

    /// Every kernel of `T` in both builds (the AVX2 one where this CPU
    /// has it) against `reference`, for 0 to 67 elements at the first
    /// four element offsets of a 64-byte aligned buffer (elements past the span must stay as they were), on `values`
    /// (which hold the overflows and NaNs) mixed with random bits; `same`
    /// compares a result with the reference's.
    fn check_kernels<T: Equivalence + std::fmt::Debug>(
        basic: Primitive,
        special: &[T],
        reference: impl Fn(SystemOp, T, T) -> T,
        same: impl Fn(T, T) -> bool,
    ) {
        #[repr(align(64))]
        struct Block([u8; 2048]);
        let size = basic.size();
        let mut bits = Bits(0x9e37_79b9_7f4a_7c15 ^ size as u64);
        let as_t = |bytes: &[u8]| -> T {
            // SAFETY: `T` is plain data of `size` bytes, any bits valid.
            unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
        };
        #[cfg(target_arch = "x86_64")]
        let builds: &[bool] = if std::arch::is_x86_feature_detected!("avx2") {
            &[false, true]
        } else {
            &[false]
        };
        #[cfg(not(target_arch = "x86_64"))]
        let builds: &[bool] = &[false];
        for (index, op) in NUMBER_OP_ORDER.into_iter().enumerate() {
            for &wide in builds {
                let kernel = if wide {
                    number_kernel::<true>(op, basic)
                } else {
                    number_kernel::<false>(op, basic)
                };
                let Some(kernels) = kernel else {
                    assert!(matches!(basic, Primitive::F32 | Primitive::F64) && index >= 4);
                    continue;
                };
                for len in 0..=67 {
                    for start in 0..4 {
                        let span = start * size..(start + len) * size;
                        let (mut input, mut inout) = (Block([0; 2048]), Block([0; 2048]));
                        for byte in input.0.iter_mut().chain(inout.0.iter_mut()) {
                            *byte = bits.next() as u8;
                        }
                        for (i, value) in special.iter().enumerate() {
                            // SAFETY: in the block, at an element boundary.
                            unsafe {
                                let at = (i * 3 % 64) * size;
                                std::ptr::write_unaligned(
                                    input.0[at..].as_mut_ptr().cast(),
                                    *value,
                                );
                                let at = (i * 5 % 64) * size;
                                std::ptr::write_unaligned(
                                    inout.0[at..].as_mut_ptr().cast(),
                                    *value,
                                );
                            }
                        }
                        let before = inout.0;
                        (kernels.contiguous)(&input.0[span.clone()], &mut inout.0[span.clone()])
                            .unwrap();
                        // The runs kernel, each element a run of its own
                        // from the last, the old elements fetched: the
                        // same elements; none done if runs of one element
                        // are as long as those it must leave.
                        let runs: Vec<Segment> = (start..start + len)
                            .rev()
                            .map(|e| Segment {
                                disp: (e * size) as u64,
                                data: e * size..(e + 1) * size,
                            })
                            .collect();
                        let (mut by_runs, mut old) = (before, [0u8; 2048]);
                        let window = std::ptr::slice_from_raw_parts_mut(by_runs.as_mut_ptr(), 2048);
                        for (shorter_than, done) in [(size, 0), (usize::MAX, len)] {
                            // SAFETY: `window` is `by_runs`, this test's.
                            let runs_done = unsafe {
                                (kernels.runs)(
                                    &input.0,
                                    window,
                                    &runs,
                                    Some(&mut old),
                                    shorter_than,
                                )
                            };
                            assert_eq!(runs_done, done, "runs done");
                        }
                        assert_eq!(old[span.clone()], before[span.clone()], "old elements");
                        for e in 0..72 {
                            let at = e * size..(e + 1) * size;
                            let got = as_t(&inout.0[at.clone()]);
                            let by_runs = as_t(&by_runs[at.clone()]);
                            assert!(same(by_runs, got), "{by_runs:?} by runs, {got:?} whole");
                            let expected = if span.contains(&at.start) {
                                reference(op, as_t(&input.0[at.clone()]), as_t(&before[at]))
                            } else {
                                as_t(&before[at])
                            };
                            assert!(
                                same(got, expected),
                                "{got:?}, not {expected:?}: {op:?} on {basic:?} (AVX2: {wide}), \
                                 {len} elements from {start}, element {e}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_kernel_matches_the_element_by_element_reference() {
        macro_rules! integers {
            ($($t:ty => $basic:ident),*) => {$(
                check_kernels::<$t>(
                    Primitive::$basic,
                    &[<$t>::MAX, <$t>::MIN, 0, 1, <$t>::MAX - 1, <$t>::MIN.wrapping_add(1)],
                    integer_reference::<$t>,
                    |a, b| a == b,
                );
            )*};
        }
        integers!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, i128 => I128, isize => Isize,
            u8 => U8, u16 => U16, u32 => U32, u64 => U64, u128 => U128, usize => Usize);
        check_kernels::<f32>(
            Primitive::F32,
            &[
                f32::NAN,
                -f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                -0.0,
                0.0,
                f32::MAX,
                f32::MIN_POSITIVE,
            ],
            |op, a, b| reference(op, a, b, |_, _, _| unreachable!("no bitwise float op")),
            // Bit for bit, but for a NaN's payload: when both operands
            // are NaNs the hardware keeps one, and a vector loop may have
            // swapped the operands (MPI says nothing of payloads).
            |a, b| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
        );
        check_kernels::<f64>(
            Primitive::F64,
            &[
                f64::NAN,
                -f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                0.0,
                f64::MAX,
                f64::MIN_POSITIVE,
            ],
            |op, a, b| reference(op, a, b, |_, _, _| unreachable!("no bitwise float op")),
            // Bit for bit, but for a NaN's payload: when both operands
            // are NaNs the hardware keeps one, and a vector loop may have
            // swapped the operands (MPI says nothing of payloads).
            |a, b| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
        );
    }

    #[test]
    fn locations_prefer_the_smaller_index_on_ties() {
        let a = [
            ValueIndex {
                value: 1.0f64,
                index: 4i64,
            },
            ValueIndex {
                value: 5.0,
                index: 1,
            },
            ValueIndex {
                value: 2.0,
                index: 7,
            },
        ];
        let mut b = [
            ValueIndex {
                value: 1.0,
                index: 2,
            },
            ValueIndex {
                value: 3.0,
                index: 0,
            },
            ValueIndex {
                value: 2.0,
                index: 9,
            },
        ];
        let mut c = b;
        apply(SystemOperation::min_loc(), &a, &mut b).unwrap();
        assert_eq!(
            b.map(|p| (p.value, p.index)),
            [(1.0, 2), (3.0, 0), (2.0, 7)]
        );
        apply(SystemOperation::max_loc(), &a, &mut c).unwrap();
        assert_eq!(
            c.map(|p| (p.value, p.index)),
            [(1.0, 2), (5.0, 1), (2.0, 7)]
        );
    }

    #[test]
    fn padded_pairs_have_the_c_layout_and_reduce_as_packed_data() {
        use crate::datatype::UncommittedDatatype;
        let double_int = ValueIndex::<f64, i32>::equivalent_datatype();
        // MPI_DOUBLE_INT: 12 bytes of data, a 16-byte extent.
        assert_eq!((double_int.size(), double_int.extent()), (12, 16));
        fn ties<V: Number + std::fmt::Debug>(make: fn(i8) -> V)
        where
            ValueIndex<V, i32>: Equivalence + PartialEq + std::fmt::Debug,
        {
            let pair = |v: i8, index: i32| ValueIndex {
                value: make(v),
                index,
            };
            let a = [pair(1, 4), pair(5, 1), pair(2, 7), pair(-3, 2)];
            let b = [pair(1, 2), pair(3, 0), pair(2, 9), pair(-3, 8)];
            let (mut min, mut max) = (b, b);
            reduce_local_into(&a[..], &mut min[..], SystemOperation::min_loc()).unwrap();
            reduce_local_into(&a[..], &mut max[..], SystemOperation::max_loc()).unwrap();
            assert_eq!(min, [pair(1, 2), pair(3, 0), pair(2, 7), pair(-3, 2)]);
            assert_eq!(max, [pair(1, 2), pair(5, 1), pair(2, 7), pair(-3, 2)]);
        }
        ties::<f64>(f64::from);
        ties::<i64>(i64::from);
        ties::<i16>(i16::from);
    }

    #[test]
    fn user_operations_see_typed_buffers_in_mpi_argument_order() {
        // inout = input - inout: not commutative, so the order shows.
        let minus = UserOperation::associative(|input, inout| {
            let input: &[i64] = input.downcast().unwrap();
            let inout: &mut [i64] = inout.downcast().unwrap();
            for (x, y) in input.iter().zip(inout) {
                *y = x - *y;
            }
        });
        assert!(!minus.is_commutative());
        let mut b = [1i64, 2];
        reduce_local_into(&[10i64, 20][..], &mut b[..], &minus).unwrap();
        assert_eq!(b, [9, 18]);
        let wrong_type = UserOperation::commutative(|input, _| {
            assert!(input.downcast::<i32>().is_none());
            assert_eq!(input.len(), 1);
        });
        assert!(wrong_type.is_commutative());
        reduce_local_into(&1u64, &mut 2u64, &wrong_type).unwrap();
    }

    #[test]
    fn mismatched_buffers_are_count_and_type_errors() {
        let e = reduce_local_into(&[1i32, 2][..], &mut [0i32][..], SystemOperation::sum());
        assert_eq!(e.unwrap_err().class(), ErrorClass::Count);
        let e = reduce_local_into(&1i32, &mut 0u32, SystemOperation::sum());
        assert_eq!(e.unwrap_err().class(), ErrorClass::Type);
    }
}
