//! `#[distributed_lock]` (work in progress).
use proc_macro::TokenStream;

#[proc_macro_attribute]
pub fn distributed_lock(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
