//! The limits on the size of a `fuse!` input, each a compile error that names it.
//!
//! Every stage walks expressions recursively, and a proc macro runs on the compiler's stack: an
//! input deep enough would overflow it, which aborts rustc instead of giving an error. The
//! limits are far past any kernel a person writes, and low enough that every stage, in a debug
//! build, stays well inside the stack a proc macro gets.

use crate::error;
use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};

/// How deep one expression of a body may nest: parentheses, operators, calls, method chains
/// and `if`s each count a level.
pub const MAX_EXPR_DEPTH: usize = 128;

/// How deep brackets of any kind may nest in the input, checked before syn parses it: syn's
/// parser recurses into each group.
pub const MAX_GROUP_DEPTH: usize = 256;

/// How many punctuation tokens may follow one another: syn's parser recurses into each prefix
/// operator (`- - - x`), so a long run would overflow its stack before lowering counts depth.
pub const MAX_PUNCT_RUN: usize = 256;

/// How many tokens one attribute may hold, counted before syn parses it. syn parses the value
/// of `#[name = value]` as an expression, a chain of operators as one level a term, and copying
/// it recurses once a level: a doc attribute of 2000 `x +` terms overflowed the fuzzer's 4 MB
/// stack (seed 56). A `#[vjp(..)]` naming all of [`MAX_PARAMS`] parameters fits.
pub const MAX_ATTR_TOKENS: usize = 512;

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
    let mut after_hash = false;
    for tt in tokens.clone() {
        match &tt {
            TokenTree::Punct(_) => run += 1,
            _ => run = 0,
        }
        if run > MAX_PUNCT_RUN {
            return Err(syn::Error::new(tt.span(), error::punct_run(MAX_PUNCT_RUN)));
        }
        if let TokenTree::Group(g) = &tt {
            if after_hash
                && g.delimiter() == Delimiter::Bracket
                && tokens_within(g) > MAX_ATTR_TOKENS
            {
                return Err(syn::Error::new(
                    g.span(),
                    error::attr_tokens(MAX_ATTR_TOKENS),
                ));
            }
            if depth == MAX_GROUP_DEPTH {
                return Err(too_deep(g.span_open()));
            }
            check_group(&g.stream(), depth + 1)?;
        }
        // `#[..]`, and `#![..]` as well.
        after_hash = match &tt {
            TokenTree::Punct(p) => p.as_char() == '#' || (after_hash && p.as_char() == '!'),
            _ => false,
        };
    }
    Ok(())
}

/// The tokens inside `group`, its groups' too, counted up to one past [`MAX_ATTR_TOKENS`]
/// without recursion: the group may nest past [`MAX_GROUP_DEPTH`].
fn tokens_within(group: &Group) -> usize {
    let mut count = 0;
    let mut open = vec![group.stream().into_iter()];
    while let Some(tokens) = open.last_mut() {
        let Some(tt) = tokens.next() else {
            open.pop();
            continue;
        };
        count += 1;
        if count > MAX_ATTR_TOKENS {
            break;
        }
        if let TokenTree::Group(g) = tt {
            open.push(g.stream().into_iter());
        }
    }
    count
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

    /// An attribute of the limit's tokens passes; one more, or a longer one however nested,
    /// is an error at the attribute, before syn parses it.
    #[test]
    fn attributes_hold_up_to_the_limit() {
        // `#`, then a bracket group of `doc`, `=` and `x + x ...`: 2 + (2 * terms - 1) tokens.
        let attr = |terms: usize| -> TokenStream {
            format!("#[doc = x{}] fn f() {{}}", " + x".repeat(terms - 1))
                .parse()
                .expect("tokens")
        };
        let terms = (MAX_ATTR_TOKENS - 1) / 2;
        assert!(check_tokens(&attr(terms)).is_ok());
        let e = check_tokens(&attr(terms + 1)).unwrap_err();
        assert!(e.to_string().contains("512"), "{e}");
        assert!(check_tokens(&attr(2000)).is_err());
        let deep: TokenStream = format!("#[doc = {}x{}]", "(".repeat(5000), ")".repeat(5000))
            .parse()
            .expect("tokens");
        assert!(check_tokens(&deep).is_err());
        let inner: TokenStream = format!("#![doc = x{}]", " + x".repeat(2000))
            .parse()
            .expect("tokens");
        assert!(check_tokens(&inner).is_err());
        // Brackets after anything but `#` are no attribute.
        let index: TokenStream = format!("x[{}]", "y, ".repeat(1000))
            .parse()
            .expect("tokens");
        assert!(check_tokens(&index).is_ok());
    }

    #[test]
    fn punctuation_runs_up_to_the_limit() {
        let run = |n: usize| format!("{}x", "- ".repeat(n)).parse().expect("tokens");
        assert!(check_tokens(&run(MAX_PUNCT_RUN)).is_ok());
        assert!(check_tokens(&run(MAX_PUNCT_RUN + 1)).is_err());
    }
}
