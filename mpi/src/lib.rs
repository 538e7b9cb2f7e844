//! oxmpi (written next).
