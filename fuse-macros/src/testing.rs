//! Fixtures for the stages' unit tests: run the pipeline on a token stream.

use crate::error::Errors;
use crate::ir::Kernel;
use proc_macro2::TokenStream;

/// Parses and checks `tokens`; the kernels, or every error message.
pub fn kernels(tokens: TokenStream) -> Result<Vec<Kernel>, Vec<String>> {
    let input = syn::parse2(tokens).map_err(|e| vec![e.to_string()])?;
    let mut cx = Errors::default();
    let kernels = crate::check::check(&input, &mut cx);
    match cx.propagate() {
        Ok(()) => Ok(kernels),
        Err(e) => Err(e.into_iter().map(|e| e.to_string()).collect()),
    }
}

pub fn kernel(tokens: TokenStream) -> Kernel {
    match kernels(tokens) {
        Ok(mut k) => k.remove(0),
        Err(e) => panic!("expected a valid kernel, got {e:?}"),
    }
}

/// The error messages for `tokens`, which must not check.
pub fn errors(tokens: TokenStream) -> Vec<String> {
    match kernels(tokens) {
        Ok(_) => panic!("expected errors"),
        Err(e) => e,
    }
}

/// Asserts that checking `tokens` fails with exactly one error starting with `prefix`.
pub fn assert_error(tokens: TokenStream, prefix: &str) {
    let e = errors(tokens);
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].starts_with(prefix),
        "expected `{prefix}...`, got {:?}",
        e[0]
    );
}
