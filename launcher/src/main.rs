//! oxrun (written next).
fn main() {}
