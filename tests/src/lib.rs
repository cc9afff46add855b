//! dlock's conformance suite and server harness.
