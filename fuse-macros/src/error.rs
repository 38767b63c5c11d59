//! The error collector and the catalogue of every message the macro can give.
//!
//! Every user error is written once here, in rustc's voice: lower case, no final period, code in
//! backticks, what is wrong first and the fix after. Proc macros on stable cannot attach notes, so
//! the fix follows in the same message.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use std::fmt::Display;

/// Collects errors so that one build reports every independent mistake, as rustc does.
#[derive(Default)]
pub struct Errors {
    list: Vec<syn::Error>,
}

impl Errors {
    pub fn at(&mut self, span: Span, message: impl Display) {
        self.list.push(syn::Error::new(span, message));
    }

    pub fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.list.push(syn::Error::new_spanned(tokens, message));
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Ends a stage: all collected errors as one, or nothing.
    pub fn propagate(&mut self) -> Result<(), syn::Error> {
        let mut list = std::mem::take(&mut self.list).into_iter();
        let Some(mut first) = list.next() else {
            return Ok(());
        };
        for e in list {
            first.combine(e);
        }
        Err(first)
    }
}

/// The closest of `candidates` to `name`, if it is close enough to be a likely misspelling.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|&(d, c)| d <= limit && c != name)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    // Optimal string alignment: insertions, deletions, substitutions and swaps of neighbours
    // each count one, as rustc counts them.
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// `, did you mean `x`?` or nothing.
pub fn did_you_mean(suggestion: Option<&str>) -> String {
    match suggestion {
        Some(s) => format!("; did you mean `{s}`?"),
        None => String::new(),
    }
}

/// The tokens of a syntax node, for errors that span it.
pub fn tokens(node: &impl ToTokens) -> TokenStream {
    node.to_token_stream()
}

/// An expression nested past [`crate::limits::MAX_EXPR_DEPTH`].
pub fn expr_depth(limit: usize) -> String {
    format!(
        "this expression nests more than {limit} levels deep, the most `fuse!` takes; bind inner \
         parts to names with `let`"
    )
}

/// Brackets nested past [`crate::limits::MAX_GROUP_DEPTH`].
pub fn group_depth(limit: usize) -> String {
    format!(
        "brackets nest more than {limit} levels deep here, the most `fuse!` takes; bind inner \
         parts to names with `let`"
    )
}

/// An attribute of more tokens than [`crate::limits::MAX_ATTR_TOKENS`].
pub fn attr_tokens(limit: usize) -> String {
    format!("this attribute holds more than {limit} tokens, the most `fuse!` takes in one")
}

/// Punctuation in a row past [`crate::limits::MAX_PUNCT_RUN`].
pub fn punct_run(limit: usize) -> String {
    format!(
        "more than {limit} operators in a row, the most `fuse!` takes; bind inner parts to names \
         with `let`"
    )
}

/// A signature past [`crate::limits::MAX_PARAMS`], [`crate::limits::MAX_OUTPUTS`] or
/// [`crate::limits::MAX_DIMS`]: `what` is "parameters", "outputs" or "named dims".
pub fn signature_size(what: &str, limit: usize) -> String {
    format!(
        "this kernel has more than {limit} {what}, the most `fuse!` takes (each is an argument of \
         every launch); pass related values as one tensor"
    )
}

/// A path that is not a constant of an element type (`std::f32::consts::PI`, `Foo::BAR`).
pub fn unknown_path() -> String {
    "paths are not part of the language, except the constants of the element types: \
     `f32::NAN`, `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::MAX`, `f32::MIN`, \
     `f32::MIN_POSITIVE` and `f32::EPSILON` (also of `f64`, `f16` and `bf16`), and `MIN` and \
     `MAX` of the integer types, as in `u32::MAX`; otherwise use a parameter or `let` name"
        .to_string()
}

/// `elem::name` where `elem` is an element type without that constant.
pub fn unknown_constant(elem: crate::ty::Elem, name: &str) -> String {
    let names = crate::consts::names(elem);
    if names.is_empty() {
        return format!("no constant `{elem}::{name}` in the language: `{elem}` has none");
    }
    let hint = match closest(name, names.iter().copied()) {
        Some(c) => format!("; did you mean `{elem}::{c}`?"),
        None => String::new(),
    };
    let list: Vec<String> = names.iter().map(|c| format!("`{elem}::{c}`")).collect();
    format!(
        "no constant `{elem}::{name}` in the language{hint} (the constants of `{elem}` are {})",
        list.join(", ")
    )
}

/// An index that is not an integer literal.
pub const INDEX_NOT_LITERAL: &str = "the indices of `w[i][j]` are integer literals, as in \
     `w[0][1]`, picking fixed elements of a tensor with dims of fixed size (`w: [f32; 3, 4]`); \
     to pick by an integer value, gather along one dim with a slice, as in `w[i, ..]`";

/// The way out of every build-time CUBIN error.
const CUBIN_FIX: &str = "unset `FUSE_CUBIN_ARCHS` to compile kernels at run time";

/// An entry of `FUSE_CUBIN_ARCHS` that is not an architecture.
pub fn cubin_arch(entry: &str) -> String {
    format!(
        "`FUSE_CUBIN_ARCHS` names `{entry}`, which is not a GPU architecture such as `sm_90` or \
         `90`; write a list such as `sm_80,sm_90`, or {CUBIN_FIX}"
    )
}

/// `FUSE_CUBIN_ARCHS` is set, but NVRTC is not there to compile with.
pub fn cubin_no_nvrtc(searched: &[String]) -> String {
    let searched: Vec<String> = searched.iter().map(|name| format!("`{name}`")).collect();
    format!(
        "`FUSE_CUBIN_ARCHS` is set, but NVRTC could not be loaded (searched for {}); put its \
         directory on `LD_LIBRARY_PATH` for the build, or {CUBIN_FIX}",
        searched.join(", ")
    )
}

/// `FUSE_CUBIN_ARCHS` names an architecture that this NVRTC does not compile for.
pub fn cubin_unsupported(arch: u32, version: (i32, i32), supported: &[u32]) -> String {
    let supported: Vec<String> = supported.iter().map(|a| format!("`sm_{a}`")).collect();
    format!(
        "NVRTC {}.{} does not compile for `sm_{arch}`; it compiles for {}: leave `sm_{arch}` out \
         of `FUSE_CUBIN_ARCHS`, or {CUBIN_FIX}",
        version.0,
        version.1,
        supported.join(", ")
    )
}

/// NVRTC rejected a kernel at build time (the architecture was checked before); its log
/// follows the message.
pub fn cubin_compile(kernel: &str, arch: u32, options: &str, log: &str) -> String {
    format!(
        "NVRTC could not compile kernel `{kernel}` for `sm_{arch}` (options `{options}`); this is \
         a bug in fuse, please report it; meanwhile {CUBIN_FIX}\nNVRTC log:\n{log}"
    )
}

/// Any other NVRTC call that failed at build time, for `kernel` or for the whole build.
pub fn cubin_nvrtc_call(function: &str, kernel: Option<&str>, detail: &str) -> String {
    let kernel = kernel.map_or(String::new(), |k| format!(" for kernel `{k}`"));
    format!("NVRTC failed in `{function}`{kernel}: {detail}; {CUBIN_FIX}")
}

/// `a..=b` in a slice.
pub const SLICE_CLOSED_RANGE: &str =
    "a slice takes a range with an exclusive end, as in `d..2 * d`, not `..=`";

/// A `step_by` that is not `(j..).step_by(k)` with literals.
pub const SLICE_STEP: &str = "a strided pick is `(j..).step_by(k)` with integer literals `j < k`, as in `x[.., (1..).step_by(2)]` for the odd elements of a dim `d * 2`";

/// A slice of an indexed tensor, or an index of a slice.
pub const SLICE_OF_INDEX: &str =
    "a slice takes a tensor parameter and is not indexed again: write every dim's item in one `[..]`, as in `x[.., ..d]`";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_finds_one_edit_away() {
        assert_eq!(closest("exq", ["exp", "ln", "sqrt"]), Some("exp"));
        assert_eq!(closest("colz", ["rows", "cols"]), Some("cols"));
        assert_eq!(closest("zzzz", ["exp", "ln"]), None);
        assert_eq!(closest("inptu", ["input", "x"]), Some("input"));
    }

    #[test]
    fn errors_combine_in_order() {
        let mut cx = Errors::default();
        assert!(cx.propagate().is_ok());
        cx.at(Span::call_site(), "first");
        cx.at(Span::call_site(), "second");
        let e = cx.propagate().unwrap_err();
        let all: Vec<String> = e.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(all, ["first", "second"]);
    }
}
