//! TCP transport (written next).
