//! Errors with MPI error classes.
//!
//! Every fallible call in oxmpi returns [`Error`]: an [`ErrorClass`] (what
//! the MPI standard calls the error class, MPI 4.1 §9.4) and a message for a
//! person. The class is what a program branches on; the message says what
//! to fix.

use std::fmt;

/// The MPI error classes oxmpi reports.
///
/// [`ErrorClass::code`] gives the integer value MPICH uses for the class, so
/// that the numbers in oxmpi's messages mean the same as in MPICH's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// MPI_ERR_BUFFER: an invalid buffer pointer or length.
    Buffer,
    /// MPI_ERR_COUNT: an invalid count argument.
    Count,
    /// MPI_ERR_TYPE: an invalid datatype.
    Type,
    /// MPI_ERR_TAG: a tag outside 0..=TAG_UB (or a wildcard where none is allowed).
    Tag,
    /// MPI_ERR_COMM: an invalid communicator.
    Comm,
    /// MPI_ERR_RANK: a rank outside the communicator or group (or given
    /// twice where ranks must be distinct).
    Rank,
    /// MPI_ERR_ROOT: a root rank outside the communicator.
    Root,
    /// MPI_ERR_GROUP: an invalid group (e.g. not a subset of the
    /// communicator's).
    Group,
    /// MPI_ERR_OP: an operation not defined for the datatype it is applied
    /// to (e.g. a bitwise operation on floating-point numbers).
    Op,
    /// MPI_ERR_REQUEST: an invalid request handle.
    Request,
    /// MPI_ERR_ARG: another invalid argument.
    Arg,
    /// MPI_ERR_TRUNCATE: a message longer than the receive buffer.
    Truncate,
    /// MPI_ERR_OTHER: an error with no better class (e.g. the OS refused a resource).
    Other,
    /// MPI_ERR_INTERN: an internal inconsistency in oxmpi.
    Intern,
    /// MPI_ERR_IN_STATUS: see the per-request statuses.
    InStatus,
    /// MPI_ERR_NO_MEM: memory could not be allocated.
    NoMem,
    /// MPI_ERR_UNSUPPORTED_OPERATION: the operation is not available here.
    UnsupportedOperation,
    /// MPI_ERR_PROC_FAILED (MPICH's MPIX_ERR_PROC_FAILED): a peer process
    /// is gone or its connection broke; the operations that need it fail.
    ProcFailed,
    /// MPI_ERR_TOPOLOGY: the communicator has no topology of the kind the
    /// call needs, or the topology given is invalid.
    Topology,
    /// MPI_ERR_DIMS: invalid dimensions of a Cartesian topology.
    Dims,
    /// MPI_ERR_INFO_KEY: an info key that is empty or too long.
    InfoKey,
    /// MPI_ERR_INFO_VALUE: an info value that is too long.
    InfoValue,
    /// MPI_ERR_INFO_NOKEY: an info key that is not set.
    InfoNoKey,
    /// MPI_ERR_WIN: an invalid window (e.g. one already freed).
    Win,
    /// MPI_ERR_SIZE: an invalid window size.
    Size,
    /// MPI_ERR_LOCKTYPE: an invalid lock type.
    LockType,
    /// MPI_ERR_ASSERT: an invalid assertion of a synchronization call.
    Assert,
    /// MPI_ERR_RMA_SYNC: a one-sided operation or synchronization call
    /// out of its epoch (e.g. a put with no access epoch to the target).
    RmaSync,
    /// MPI_ERR_RMA_RANGE: a one-sided access outside the target window.
    RmaRange,
    /// MPI_ERR_RMA_ATTACH: memory that cannot be attached to (or detached
    /// from) a dynamic window.
    RmaAttach,
    /// MPI_ERR_RMA_SHARED: shared memory that cannot be had (a
    /// shared-memory window on a communicator that spans hosts).
    RmaShared,
    /// MPI_ERR_RMA_FLAVOR: a call the window's flavor does not allow
    /// (e.g. attach to a window that is not dynamic).
    RmaFlavor,
}

impl ErrorClass {
    /// The integer value of this class in MPICH's `mpi.h`.
    pub fn code(self) -> i32 {
        match self {
            ErrorClass::Buffer => 1,
            ErrorClass::Count => 2,
            ErrorClass::Type => 3,
            ErrorClass::Tag => 4,
            ErrorClass::Comm => 5,
            ErrorClass::Rank => 6,
            ErrorClass::Root => 7,
            ErrorClass::Group => 8,
            ErrorClass::Op => 9,
            ErrorClass::Request => 19,
            ErrorClass::Arg => 12,
            ErrorClass::Truncate => 14,
            ErrorClass::Other => 15,
            ErrorClass::Intern => 16,
            ErrorClass::InStatus => 17,
            ErrorClass::NoMem => 34,
            ErrorClass::UnsupportedOperation => 44,
            ErrorClass::ProcFailed => 101,
            ErrorClass::Topology => 10,
            ErrorClass::Dims => 11,
            ErrorClass::InfoKey => 29,
            ErrorClass::InfoValue => 30,
            ErrorClass::InfoNoKey => 31,
            ErrorClass::Win => 45,
            ErrorClass::Size => 51,
            ErrorClass::LockType => 47,
            ErrorClass::Assert => 53,
            ErrorClass::RmaSync => 50,
            ErrorClass::RmaRange => 55,
            ErrorClass::RmaAttach => 56,
            ErrorClass::RmaShared => 57,
            ErrorClass::RmaFlavor => 58,
        }
    }

    /// The standard's name for the class, e.g. `MPI_ERR_TRUNCATE`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Buffer => "MPI_ERR_BUFFER",
            ErrorClass::Count => "MPI_ERR_COUNT",
            ErrorClass::Type => "MPI_ERR_TYPE",
            ErrorClass::Tag => "MPI_ERR_TAG",
            ErrorClass::Comm => "MPI_ERR_COMM",
            ErrorClass::Rank => "MPI_ERR_RANK",
            ErrorClass::Root => "MPI_ERR_ROOT",
            ErrorClass::Group => "MPI_ERR_GROUP",
            ErrorClass::Op => "MPI_ERR_OP",
            ErrorClass::Request => "MPI_ERR_REQUEST",
            ErrorClass::Arg => "MPI_ERR_ARG",
            ErrorClass::Truncate => "MPI_ERR_TRUNCATE",
            ErrorClass::Other => "MPI_ERR_OTHER",
            ErrorClass::Intern => "MPI_ERR_INTERN",
            ErrorClass::InStatus => "MPI_ERR_IN_STATUS",
            ErrorClass::NoMem => "MPI_ERR_NO_MEM",
            ErrorClass::UnsupportedOperation => "MPI_ERR_UNSUPPORTED_OPERATION",
            ErrorClass::ProcFailed => "MPI_ERR_PROC_FAILED",
            ErrorClass::Topology => "MPI_ERR_TOPOLOGY",
            ErrorClass::Dims => "MPI_ERR_DIMS",
            ErrorClass::InfoKey => "MPI_ERR_INFO_KEY",
            ErrorClass::InfoValue => "MPI_ERR_INFO_VALUE",
            ErrorClass::InfoNoKey => "MPI_ERR_INFO_NOKEY",
            ErrorClass::Win => "MPI_ERR_WIN",
            ErrorClass::Size => "MPI_ERR_SIZE",
            ErrorClass::LockType => "MPI_ERR_LOCKTYPE",
            ErrorClass::Assert => "MPI_ERR_ASSERT",
            ErrorClass::RmaSync => "MPI_ERR_RMA_SYNC",
            ErrorClass::RmaRange => "MPI_ERR_RMA_RANGE",
            ErrorClass::RmaAttach => "MPI_ERR_RMA_ATTACH",
            ErrorClass::RmaShared => "MPI_ERR_RMA_SHARED",
            ErrorClass::RmaFlavor => "MPI_ERR_RMA_FLAVOR",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An MPI error: a class and a message a person can act on.
///
/// Boxed: one pointer, so that the `Result`s of the short-message path
/// (`Result<()>`, `Result<bool>`, a `Status` with room for an error) are
/// returned in registers rather than through memory; an error is rare, and
/// its allocation is paid only when one is made.
#[derive(Clone, PartialEq, Eq)]
pub struct Error(Box<ErrorParts>);

/// What an [`Error`] holds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ErrorParts {
    class: ErrorClass,
    message: String,
}

impl Error {
    /// An error of `class` with a message.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Error {
        Error(Box::new(ErrorParts {
            class,
            message: message.into(),
        }))
    }

    /// An [`ErrorClass::Other`] error for a failed OS call: `what` says what
    /// was being done.
    pub fn os(what: impl fmt::Display, err: std::io::Error) -> Error {
        Error::new(ErrorClass::Other, format!("{what}: {err}"))
    }

    /// The error's MPI class.
    pub fn class(&self) -> ErrorClass {
        self.0.class
    }

    /// The message, without the class.
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.0.class, self.0.message)
    }
}

impl fmt::Debug for Error {
    // As the unboxed struct printed: the box is an implementation detail.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("class", &self.0.class)
            .field("message", &self.0.message)
            .finish()
    }
}

impl std::error::Error for Error {}

/// The result type of every fallible oxmpi call.
pub type Result<T, E = Error> = std::result::Result<T, E>;
