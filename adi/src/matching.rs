//! matching
