//! The backends, one module each; all but `memory` sit behind a cargo feature.
//!
//! | backend | URL | feature | fencing token |
//! |---|---|---|---|
//! | [`memory::MemoryBackend`] | `memory://` | always | per-process counter |

pub mod memory;
