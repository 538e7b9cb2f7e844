//! selfvc
