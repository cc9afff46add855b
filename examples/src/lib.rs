//! Code shared by dlock's example programs: the benchmark suites.

pub mod bench;
