//! Pieces of the generated Rust that `expand` and the derivative items (`grad/items.rs`) share:
//! the runtime's path, hygienic local names, element types.

use crate::ty::Elem;
use proc_macro2::{Ident, Span, TokenStream};

/// The runtime crate, as every generated path names it.
pub const RT: &str = "::fuse_runtime";

/// A generated local name, hygienic to the macro, so that no parameter name can capture it.
pub fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

pub fn rt() -> TokenStream {
    RT.parse().expect("a path")
}

/// The Rust type of an element: a primitive, or the runtime's re-export of `half`'s and
/// `float8`'s types.
pub fn elem_tokens(e: Elem) -> TokenStream {
    let path = if e.is_narrow_float() {
        format!("{RT}::{}", e.host_name())
    } else {
        e.name().to_string()
    };
    path.parse().expect("a type path")
}
