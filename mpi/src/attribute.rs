//! Attributes cached on communicators (MPI 4.1 §7.7), and the predefined
//! attributes of the world communicator (§9.1.2).
//!
//! A [`Keyval<T>`] is a key under which a program caches a value of type
//! `T` on any communicator ([`Communicator::set_attribute`],
//! [`Communicator::attribute`], [`Communicator::delete_attribute`]). The
//! type is checked by the compiler: a keyval of `T` stores and returns a
//! `T`, so the `MPI_ERR_KEYVAL` of a mismatched key cannot happen. Its
//! two callbacks say what happens to a value when its communicator is
//! duplicated (the copy callback returns the duplicate's value, or `None`
//! for none; an error fails the duplication) and when the value goes (on
//! [`Communicator::delete_attribute`], on a new value for the key, and
//! when the communicator is freed; an error fails that call).
//!
//! ```no_run
//! use oxmpi::Keyval;
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! // Copied into duplicates with one more level; announced when deleted.
//! let depth = Keyval::<u32>::new(
//!     |d| Ok(Some(d + 1)),
//!     |d| {
//!         println!("depth {d} deleted");
//!         Ok(())
//!     },
//! );
//! world.set_attribute(&depth, 0).unwrap();
//! let dup = world.duplicate().unwrap();
//! assert_eq!(dup.attribute(&depth).unwrap(), Some(1));
//! dup.free().unwrap(); // prints "depth 1 deleted"
//! ```
//!
//! Values are kept per process: setting one at a process sets it there
//! only. A keyval may be freed ([`Keyval::free`], or dropped) while
//! values under it are still cached; their callbacks stay until they go.
//!
//! Copy callbacks run while the attributes of the communicator being
//! duplicated are locked: one that reads or sets that communicator's
//! attributes waits for ever. Delete callbacks run without the lock.

use crate::comm::{Communicator, TAG_UB};
use crate::Result;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// What a keyval's copy callback is: the value for the duplicate, or
/// `None` for no value there (`MPI_Comm_copy_attr_function`).
pub type CopyCallback<T> = dyn Fn(&T) -> Result<Option<T>> + Send + Sync;

/// What a keyval's delete callback is: it is given the value that goes
/// (`MPI_Comm_delete_attr_function`).
pub type DeleteCallback<T> = dyn Fn(T) -> Result<()> + Send + Sync;

/// A key for attributes of type `T` (`MPI_Comm_create_keyval`).
pub struct Keyval<T> {
    inner: Arc<KeyvalData<T>>,
}

struct KeyvalData<T> {
    /// Unique in this process: the key of the values in a communicator.
    id: u64,
    copy: Box<CopyCallback<T>>,
    delete: Box<DeleteCallback<T>>,
}

impl<T: Send + Sync + 'static> Keyval<T> {
    /// A keyval with the callbacks `copy` and `delete`
    /// (`MPI_Comm_create_keyval`).
    #[doc(alias = "MPI_Comm_create_keyval")]
    pub fn new(
        copy: impl Fn(&T) -> Result<Option<T>> + Send + Sync + 'static,
        delete: impl Fn(T) -> Result<()> + Send + Sync + 'static,
    ) -> Keyval<T> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Keyval {
            inner: Arc::new(KeyvalData {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                copy: Box::new(copy),
                delete: Box::new(delete),
            }),
        }
    }

    /// A keyval whose values are not copied to duplicates and are dropped
    /// when they go (`MPI_COMM_NULL_COPY_FN`, `MPI_COMM_NULL_DELETE_FN`).
    pub fn without_callbacks() -> Keyval<T> {
        Keyval::new(|_| Ok(None), |_| Ok(()))
    }

    /// Frees the keyval (`MPI_Comm_free_keyval`); values cached under it
    /// keep their callbacks until they go. Dropping it does the same.
    #[doc(alias = "MPI_Comm_free_keyval")]
    pub fn free(self) {
        drop(self);
    }
}

impl<T: Clone + Send + Sync + 'static> Keyval<T> {
    /// A keyval whose values are cloned into duplicates and dropped when
    /// they go (`MPI_COMM_DUP_FN`).
    pub fn duplicating() -> Keyval<T> {
        Keyval::new(|value: &T| Ok(Some(value.clone())), |_| Ok(()))
    }
}

impl<T> std::fmt::Debug for Keyval<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyval({})", self.inner.id)
    }
}

/// A cached value and its keyval's callbacks, whatever its type.
trait Stored: Send + Sync {
    /// The value for a duplicate, through the copy callback.
    fn copy(&self) -> Result<Option<Box<dyn Stored>>>;
    /// Gives the value to the delete callback.
    fn delete(self: Box<Self>) -> Result<()>;
    fn as_any(&self) -> &dyn Any;
}

struct Attribute<T> {
    value: T,
    keyval: Arc<KeyvalData<T>>,
}

impl<T: Send + Sync + 'static> Stored for Attribute<T> {
    fn copy(&self) -> Result<Option<Box<dyn Stored>>> {
        let copied = (self.keyval.copy)(&self.value)?;
        Ok(copied.map(|value| {
            Box::new(Attribute {
                value,
                keyval: self.keyval.clone(),
            }) as Box<dyn Stored>
        }))
    }

    fn delete(self: Box<Self>) -> Result<()> {
        let Attribute { value, keyval } = *self;
        (keyval.delete)(value)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The attributes of one communicator, by keyval id.
#[derive(Default)]
pub(crate) struct Attributes {
    values: BTreeMap<u64, Box<dyn Stored>>,
}

impl Attributes {
    /// The attributes of a duplicate: each value's copy, where its copy
    /// callback makes one.
    pub(crate) fn copy_all(&self) -> Result<Attributes> {
        let mut copied = Attributes::default();
        for (&id, value) in &self.values {
            if let Some(copy) = value.copy()? {
                copied.values.insert(id, copy);
            }
        }
        Ok(copied)
    }

    /// Deletes every value, in the order they were keyed. A value whose
    /// delete callback fails is dropped all the same (its callback had
    /// it); the first such error is returned after the rest are deleted.
    pub(crate) fn delete_all(&mut self) -> Result<()> {
        let mut first_error = Ok(());
        for (_, value) in std::mem::take(&mut self.values) {
            if let Err(e) = value.delete() {
                if first_error.is_ok() {
                    first_error = Err(e);
                }
            }
        }
        first_error
    }
}

impl Communicator {
    /// Caches `value` under `keyval` on this communicator, at this
    /// process (`MPI_Comm_set_attr`); a value already there is deleted
    /// first (its delete callback runs, and its error fails the call,
    /// leaving the new value set).
    #[doc(alias = "MPI_Comm_set_attr")]
    pub fn set_attribute<T: Send + Sync + 'static>(
        &self,
        keyval: &Keyval<T>,
        value: T,
    ) -> Result<()> {
        let stored = Box::new(Attribute {
            value,
            keyval: keyval.inner.clone(),
        });
        let old = self
            .attributes()
            .map(|mut attributes| attributes.values.insert(keyval.inner.id, stored));
        let result = old.and_then(|old| old.map_or(Ok(()), |old| old.delete()));
        self.handled(result)
    }

    /// A copy of the value cached under `keyval` on this communicator, or
    /// `None` (`MPI_Comm_get_attr`).
    #[doc(alias = "MPI_Comm_get_attr")]
    pub fn attribute<T: Clone + Send + Sync + 'static>(
        &self,
        keyval: &Keyval<T>,
    ) -> Result<Option<T>> {
        let found = self.attributes().map(|attributes| {
            attributes
                .values
                .get(&keyval.inner.id)
                .and_then(|stored| stored.as_any().downcast_ref::<Attribute<T>>())
                .map(|attribute| attribute.value.clone())
        });
        self.handled(found)
    }

    /// Deletes the value cached under `keyval` (`MPI_Comm_delete_attr`):
    /// its delete callback runs, and its error is the call's. No value is
    /// no error.
    #[doc(alias = "MPI_Comm_delete_attr")]
    pub fn delete_attribute<T: Send + Sync + 'static>(&self, keyval: &Keyval<T>) -> Result<()> {
        let taken = self
            .attributes()
            .map(|mut attributes| attributes.values.remove(&keyval.inner.id));
        let result = taken.and_then(|taken| taken.map_or(Ok(()), |value| value.delete()));
        self.handled(result)
    }

    /// The value of a predefined attribute (MPI 4.1 §9.1.2): `Some` on the
    /// world communicator, `None` on the others.
    #[doc(alias = "MPI_Comm_get_attr")]
    pub fn predefined_attribute(&self, which: PredefinedAttribute) -> Option<i32> {
        if !self.is_world() {
            return None;
        }
        let job = JOB.get()?;
        Some(match which {
            PredefinedAttribute::TagUpperBound => TAG_UB,
            PredefinedAttribute::WtimeIsGlobal => 0,
            PredefinedAttribute::AppNum => job.appnum,
            PredefinedAttribute::UniverseSize => job.universe_size,
        })
    }
}

/// The attributes MPI defines on the world communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredefinedAttribute {
    /// The largest tag (`MPI_TAG_UB`): [`TAG_UB`].
    TagUpperBound,
    /// Whether [`crate::time`] is synchronized between the processes
    /// (`MPI_WTIME_IS_GLOBAL`): 0, it is not.
    WtimeIsGlobal,
    /// Which part of an MPMD launch (`oxrun -n 2 a : -n 2 b`) this
    /// process belongs to, from 0 (`MPI_APPNUM`).
    AppNum,
    /// How many processes the job can have (`MPI_UNIVERSE_SIZE`): the
    /// world's size, as oxmpi does not spawn processes.
    UniverseSize,
}

/// What the predefined attributes are made of, learnt at start-up.
pub(crate) struct JobAttributes {
    pub(crate) appnum: i32,
    pub(crate) universe_size: i32,
}

static JOB: OnceLock<JobAttributes> = OnceLock::new();

/// Records the predefined attributes' values (once, at initialization).
pub(crate) fn set_job_attributes(job: JobAttributes) {
    // MPI is initialized once per process: a second value cannot come.
    let _ = JOB.set(job);
}
