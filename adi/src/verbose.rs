//! Diagnostic messages shown only under `OXMPI_VERBOSE=1`.
//!
//! Things a user may want to know but that are not errors (a stranger
//! refused at a rank's port, a transport that found no device, which method
//! a peer was bound to) go through [`vlog!`](crate::vlog), to standard error.

use std::sync::OnceLock;

/// Whether `OXMPI_VERBOSE` asks for diagnostics (any value but empty or `0`).
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("OXMPI_VERBOSE").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Prints a diagnostic line `oxmpi[pid]: ...` to standard error when
/// [`enabled`].
#[macro_export]
macro_rules! vlog {
    ($($arg:tt)*) => {
        if $crate::verbose::enabled() {
            eprintln!("oxmpi[{}]: {}", std::process::id(), format_args!($($arg)*));
        }
    };
}
