//! The fuzzer's seeds: every `fuse!` block of the repository's tests, examples and benches, the
//! ui tests' invalid kernels, and the fixtures of this crate's own unit tests (`quote!` blocks
//! that interpolate nothing).

use super::gen::{flatten, Flat};
use proc_macro2::{TokenStream, TokenTree};
use std::path::{Path, PathBuf};

/// The folders, relative to the workspace root, whose `.rs` files hold kernels.
const FOLDERS: [&str; 6] = [
    "fuse-runtime/tests",
    "fuse-runtime/src",
    "examples",
    "benches",
    "ui-tests/tests/ui",
    "fuse-macros/src",
];

/// Every seed, flattened, in a fixed order so that a run is reproducible from its seed.
pub fn all() -> Vec<Vec<Flat>> {
    blocks()
        .into_iter()
        .map(|block| {
            let mut flat = vec![];
            flatten(block, &mut flat);
            flat
        })
        .collect()
}

/// Every block of the repository, then the kernels of each that has several, one each.
pub fn blocks() -> Vec<TokenStream> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![];
    for folder in FOLDERS {
        rust_files(&root.join(folder), &mut files);
    }
    files.sort();
    let mut seeds = vec![];
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        // Doc examples and the like may not tokenize; the files that matter do.
        if let Ok(tokens) = text.parse::<TokenStream>() {
            find_blocks(tokens, &mut seeds);
        }
    }
    let kernels: Vec<TokenStream> = seeds
        .iter()
        .flat_map(|b| split_kernels(b.clone()))
        .collect();
    seeds.extend(kernels);
    seeds
}

/// Every kernel of the repository on its own (each block's kernels, split).
pub fn kernels() -> Vec<TokenStream> {
    kernels_in(blocks())
}

fn kernels_in(blocks: Vec<TokenStream>) -> Vec<TokenStream> {
    blocks
        .into_iter()
        .flat_map(|b| {
            let split = split_kernels(b.clone());
            if split.is_empty() {
                vec![b]
            } else {
                split
            }
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Collects the contents of `fuse! {..}` and of `quote! {..}` without interpolations, at any
/// depth, with `macro_rules!` metavariables replaced by plain names.
fn find_blocks(tokens: TokenStream, out: &mut Vec<TokenStream>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tt) in tokens.iter().enumerate() {
        let TokenTree::Group(group) = tt else {
            continue;
        };
        let invoked = match i.checked_sub(2).map(|j| &tokens[j..i]) {
            Some([TokenTree::Ident(name), TokenTree::Punct(bang)]) if bang.as_char() == '!' => {
                Some(name.to_string())
            }
            _ => None,
        };
        match invoked.as_deref() {
            Some("fuse") => out.push(fill_metavariables(group.stream())),
            Some("quote") if !interpolates(group.stream()) => out.push(group.stream()),
            _ => find_blocks(group.stream(), out),
        }
    }
}

fn interpolates(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Punct(p) => p.as_char() == '#',
        TokenTree::Group(g) => interpolates(g.stream()),
        _ => false,
    })
}

/// `$t` becomes `f32` and any other `$name` becomes `name`, so that the kernels written as
/// `macro_rules!` templates are kernels.
fn fill_metavariables(tokens: TokenStream) -> TokenStream {
    let mut out = TokenStream::new();
    let mut iter = tokens.into_iter().peekable();
    while let Some(tt) = iter.next() {
        match tt {
            TokenTree::Punct(p) if p.as_char() == '$' => {
                if let Some(TokenTree::Ident(name)) = iter.peek() {
                    let name = if name == "t" {
                        "f32".to_string()
                    } else {
                        name.to_string()
                    };
                    out.extend(name.parse::<TokenStream>().expect("a name"));
                    iter.next();
                }
            }
            TokenTree::Group(g) => {
                let inner = fill_metavariables(g.stream());
                out.extend([TokenTree::Group(proc_macro2::Group::new(
                    g.delimiter(),
                    inner,
                ))]);
            }
            other => out.extend([other]),
        }
    }
    out
}

/// The kernels of a block with several, one a stream: a mutation of a single kernel more often
/// still checks, and then reaches the planner and both emitters.
fn split_kernels(block: TokenStream) -> Vec<TokenStream> {
    let mut kernels = vec![];
    let mut current = TokenStream::new();
    let mut saw_fn = false;
    for tt in block {
        saw_fn |= matches!(&tt, TokenTree::Ident(i) if i == "fn");
        let ends = saw_fn
            && matches!(&tt, TokenTree::Group(g) if g.delimiter() == proc_macro2::Delimiter::Brace);
        current.extend([tt]);
        if ends {
            kernels.push(std::mem::take(&mut current));
            saw_fn = false;
        }
    }
    if kernels.len() > 1 {
        kernels
    } else {
        vec![]
    }
}
