//! dlock's conformance suite, the fixtures that run it, and the helpers of
//! the fault tests. Everything here runs against real servers that the tests
//! start themselves.

pub mod conformance;
pub mod memory;
