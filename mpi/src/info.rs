//! Info objects (MPI 4.1 §10): sets of string hints, and the hints of a
//! communicator (§7.4.4).
//!
//! An [`Info`] maps keys to values, both strings, keeping the keys in the
//! order they were first set (the order [`Info::nth_key`] counts in). A
//! key is 1 to [`MAX_INFO_KEY`] bytes, a value at most [`MAX_INFO_VAL`]
//! bytes; longer ones are `MPI_ERR_INFO_KEY` and `MPI_ERR_INFO_VALUE`
//! errors, and deleting a key that is not set is `MPI_ERR_INFO_NOKEY`.
//!
//! A communicator keeps the hints set on it ([`Communicator::set_info`])
//! and gives them back ([`Communicator::info`]); a duplicate starts with
//! its parent's. oxmpi acts on none of them yet, which the standard
//! allows (hints may be ignored).

use crate::comm::Communicator;
use crate::{Error, ErrorClass, Result};

/// The longest info key, in bytes (`MPI_MAX_INFO_KEY` less the C string's
/// terminator, as in MPICH).
pub const MAX_INFO_KEY: usize = 255;
/// The longest info value, in bytes (`MPI_MAX_INFO_VAL` less the C
/// string's terminator, as in MPICH).
pub const MAX_INFO_VAL: usize = 1024;

/// A set of hints (`MPI_Info`); cloning it is `MPI_Info_dup`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// Keys and values, in the order the keys were first set.
    entries: Vec<(String, String)>,
}

impl Info {
    /// An empty info object (`MPI_Info_create`).
    #[doc(alias = "MPI_Info_create")]
    pub fn new() -> Info {
        Info::default()
    }

    /// Sets `key` to `value` (`MPI_Info_set`), replacing its value if it
    /// was set.
    #[doc(alias = "MPI_Info_set")]
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        check_key(key)?;
        if value.len() > MAX_INFO_VAL {
            return Err(Error::new(
                ErrorClass::InfoValue,
                format!(
                    "the value for info key {key:?} is {} bytes long; values are at most {MAX_INFO_VAL}",
                    value.len()
                ),
            ));
        }
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value.to_owned(),
            None => self.entries.push((key.to_owned(), value.to_owned())),
        }
        Ok(())
    }

    /// The value of `key`, or `None` if it is not set (`MPI_Info_get_string`).
    #[doc(alias = "MPI_Info_get_string")]
    #[doc(alias = "MPI_Info_get")]
    pub fn get(&self, key: &str) -> Result<Option<&str>> {
        check_key(key)?;
        Ok(self
            .entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str()))
    }

    /// Removes `key` (`MPI_Info_delete`); `MPI_ERR_INFO_NOKEY` if it is not
    /// set.
    #[doc(alias = "MPI_Info_delete")]
    pub fn delete(&mut self, key: &str) -> Result<()> {
        check_key(key)?;
        let at = self
            .entries
            .iter()
            .position(|(k, _)| k == key)
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::InfoNoKey,
                    format!("info key {key:?} is not set"),
                )
            })?;
        self.entries.remove(at);
        Ok(())
    }

    /// The number of keys set (`MPI_Info_get_nkeys`).
    #[doc(alias = "MPI_Info_get_nkeys")]
    pub fn num_keys(&self) -> usize {
        self.entries.len()
    }

    /// The `n`-th key, from 0, in the order the keys were first set
    /// (`MPI_Info_get_nthkey`); `MPI_ERR_ARG` if there are not that many.
    #[doc(alias = "MPI_Info_get_nthkey")]
    pub fn nth_key(&self, n: usize) -> Result<&str> {
        self.entries.get(n).map(|(k, _)| k.as_str()).ok_or_else(|| {
            Error::new(
                ErrorClass::Arg,
                format!(
                    "info key {n} asked for, but only {} are set",
                    self.entries.len()
                ),
            )
        })
    }
}

/// Checks that `key` is a valid info key.
fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_INFO_KEY {
        return Err(Error::new(
            ErrorClass::InfoKey,
            format!(
                "info key {key:?} is {} bytes long; keys are 1 to {MAX_INFO_KEY}",
                key.len()
            ),
        ));
    }
    Ok(())
}

impl Communicator {
    /// Sets the communicator's hints to `info`'s, at this process
    /// (`MPI_Comm_set_info`).
    #[doc(alias = "MPI_Comm_set_info")]
    pub fn set_info(&self, info: &Info) -> Result<()> {
        let set = self.info_slot().map(|mut hints| *hints = info.clone());
        self.handled(set)
    }

    /// A copy of the communicator's hints (`MPI_Comm_get_info`).
    #[doc(alias = "MPI_Comm_get_info")]
    pub fn info(&self) -> Result<Info> {
        self.handled(self.info_slot().map(|hints| hints.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_order_and_limits_have_their_classes() {
        let mut info = Info::new();
        info.set("b", "1").unwrap();
        info.set("a", "2").unwrap();
        info.set("b", "3").unwrap();
        assert_eq!((info.num_keys(), info.nth_key(0).unwrap()), (2, "b"));
        assert_eq!(info.get("b").unwrap(), Some("3"));
        assert_eq!(info.nth_key(2).unwrap_err().class(), ErrorClass::Arg);
        let long_key = "k".repeat(MAX_INFO_KEY + 1);
        assert_eq!(
            info.set(&long_key, "v").unwrap_err().class(),
            ErrorClass::InfoKey
        );
        assert_eq!(info.set("", "v").unwrap_err().class(), ErrorClass::InfoKey);
        let long_value = "v".repeat(MAX_INFO_VAL + 1);
        assert_eq!(
            info.set("c", &long_value).unwrap_err().class(),
            ErrorClass::InfoValue
        );
        info.set("c", &"v".repeat(MAX_INFO_VAL)).unwrap();
        let copy = info.clone();
        info.delete("b").unwrap();
        assert_eq!(info.delete("b").unwrap_err().class(), ErrorClass::InfoNoKey);
        assert_eq!(info.nth_key(0).unwrap(), "a");
        assert_eq!(copy.get("b").unwrap(), Some("3"));
    }
}
