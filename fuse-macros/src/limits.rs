//! The limits on the size of a `fuse!` input, each a compile error that names it.
//!
//! Every stage walks expressions recursively, and a proc macro runs on the compiler's stack: an
//! input deep enough would overflow it, which aborts rustc instead of giving an error. The
//! limits are far past any kernel a person writes, and low enough that every stage, in a debug
//! build, stays well inside the stack a proc macro gets.

use crate::error;
use proc_macro2::{Span, TokenStream, TokenTree};

/// How deep one expression of a body may nest: parentheses, operators, calls, method chains
/// and `if`s each count a level.
pub const MAX_EXPR_DEPTH: usize = 128;

/// How deep brackets of any kind may nest in the input, checked before syn parses it: syn's
/// parser recurses into each group.
pub const MAX_GROUP_DEPTH: usize = 256;

/// How many punctuation tokens may follow one another: syn's parser recurses into each prefix
/// operator (`- - - x`), so a long run would overflow its stack before lowering counts depth.
pub const MAX_PUNCT_RUN: usize = 256;

/// How many parameters a kernel may take, and how many outputs and distinct named dims it may
/// have. Every one is an 8-byte argument of each launch, and a seed parameter ten (its Philox
/// round keys): at these limits a launch's arguments stay under the 32 KB a CUDA launch passes
/// (`nvrtc_kernels` compiles what it can of them; the runtime keeps 16 on the stack).
pub const MAX_PARAMS: usize = 256;
pub const MAX_OUTPUTS: usize = 64;
pub const MAX_DIMS: usize = 64;

/// Checks the raw tokens against the limits that syn's parser needs: the first one broken.
pub fn check_tokens(tokens: &TokenStream) -> syn::Result<()> {
    check_group(tokens, 0)
}

fn check_group(tokens: &TokenStream, depth: usize) -> syn::Result<()> {
    let mut run = 0;
    for tt in tokens.clone() {
        match &tt {
            TokenTree::Punct(_) => run += 1,
            _ => run = 0,
        }
        if run > MAX_PUNCT_RUN {
            return Err(syn::Error::new(tt.span(), error::punct_run(MAX_PUNCT_RUN)));
        }
        if let TokenTree::Group(g) = &tt {
            if depth == MAX_GROUP_DEPTH {
                return Err(too_deep(g.span_open()));
            }
            check_group(&g.stream(), depth + 1)?;
        }
    }
    Ok(())
}

fn too_deep(at: Span) -> syn::Error {
    syn::Error::new(at, error::group_depth(MAX_GROUP_DEPTH))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> TokenStream {
        format!("{}x{}", "(".repeat(depth), ")".repeat(depth))
            .parse()
            .expect("tokens")
    }

    #[test]
    fn groups_nest_up_to_the_limit() {
        assert!(check_tokens(&nested(MAX_GROUP_DEPTH)).is_ok());
        let e = check_tokens(&nested(MAX_GROUP_DEPTH + 1)).unwrap_err();
        assert!(e.to_string().contains("256"), "{e}");
    }

    #[test]
    fn punctuation_runs_up_to_the_limit() {
        let run = |n: usize| format!("{}x", "- ".repeat(n)).parse().expect("tokens");
        assert!(check_tokens(&run(MAX_PUNCT_RUN)).is_ok());
        assert!(check_tokens(&run(MAX_PUNCT_RUN + 1)).is_err());
    }
}
