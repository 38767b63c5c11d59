//! Fixtures for the stages' unit tests: run the pipeline on a token stream.

use crate::error::Errors;
use crate::ir::Kernel;
use proc_macro2::TokenStream;

/// Parses and checks `tokens`; the kernels, or every error message.
pub fn kernels(tokens: TokenStream) -> Result<Vec<Kernel>, Vec<String>> {
    let input = crate::parse::parse_input(tokens).map_err(|e| vec![e.to_string()])?;
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

/// The CUDA C of `tokens`' entry point for `path`, which its program must have.
pub fn entry_source(tokens: TokenStream, path: crate::plan::Path) -> String {
    let k = kernel(tokens);
    let program = crate::plan::program(&k);
    let at = program.entries.iter().position(|e| e.path == path);
    let at = at.unwrap_or_else(|| panic!("no {} entry", path.name()));
    crate::cuda::sources(&k, &program).swap_remove(at)
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

/// Every row of the language reference's compile-time error tables: the message, up to any `…`,
/// must be the start of the first error of the row's example kernel, so the reference cannot
/// drift from the catalogue the checker implements.
#[test]
fn language_reference_errors_are_the_checkers() {
    let doc = include_str!("../../doc/language.md");
    let section = doc
        .split("### Compile-time errors")
        .nth(1)
        .expect("the section exists");
    let section = section
        .split("### Run-time errors")
        .next()
        .unwrap_or(section);
    let mut rows = 0;
    let mut wrong = vec![];
    for line in section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Message") && !l.starts_with("| ---"))
    {
        let cells: Vec<String> = line
            .replace("\\|", "\u{1}")
            .split(" | ")
            .map(|c| c.replace('\u{1}', "|"))
            .collect();
        let [message, example] =
            [&cells[0], &cells[1]].map(|c| c.trim_matches(|ch| ch == '|' || ch == ' ').to_string());
        let example = example.trim_matches('`');
        let prefix = message.split('…').next().unwrap_or("").trim_end();
        let first = match example.parse::<TokenStream>() {
            Ok(tokens) => match kernels(tokens) {
                Ok(_) => "no error".to_string(),
                Err(e) => e[0].clone(),
            },
            Err(e) => format!("does not tokenize: {e}"),
        };
        let prefix = prefix.replace('`', "");
        if !first.replace('`', "").starts_with(&prefix) {
            wrong.push(format!(
                "{example}\n  documented: {message}\n  actual:     {first}"
            ));
        }
        rows += 1;
    }
    assert!(rows >= 60, "only {rows} rows found");
    assert!(
        wrong.is_empty(),
        "{} of {rows} rows differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
