//! Helpers shared by the example programs.
