//! PMI-1 client (written next).
