//! oxbench (written next).
fn main() {}
