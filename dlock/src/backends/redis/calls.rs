//! Floor 4a of the Redis backend, beneath `waiting`: one request on its way. A command or a
//! script, alone or batched, bounded by the caller's deadline
//! (`requests.rs`), the batches themselves (`batching.rs`, the batched
//! operations in `batching/ops.rs`, the next batches sent one after
//! another in `batching/hand_over.rs`), and the release of a grant whose
//! caller went away before its answer (`unfinished.rs`).
//!
//! May use: `config`, `protocol`, `transport`, `topology`.

pub(crate) mod batching;
pub(crate) mod requests;
pub(crate) mod unfinished;
