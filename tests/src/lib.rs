//! dlock's conformance suite and server harness.

pub mod error;
pub mod proxy;
pub mod servers;
pub mod tls;
