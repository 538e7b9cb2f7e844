//! Connection handshake (written next).
