//! Job tests (written next).
