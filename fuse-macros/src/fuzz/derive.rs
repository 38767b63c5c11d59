//! Derivatives of every kernel of the repository: each that checks, with every float parameter
//! listed in `#[vjp]` (where it has a float output) and in `#[jvp]`, must either be refused by
//! check with one of the documented "not yet" errors or plan every derived function (`vjp`,
//! `value_and_vjp`, `jvp`, the training pair) and emit both backends' text for each launch,
//! never "a bug of fuse" or a panic. Found that a permuted GroupNorm weight's gradient did not
//! split into launches.

use crate::ir::{plain_name, Kernel};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};

/// The refusals a listed parameter may meet, by their start (see the errors of
/// `doc/language.md`).
const REFUSALS: [&str; 3] = [
    "`#[vjp]` does not yet differentiate",
    "`#[vjp]` differentiates a gather",
    "`#[jvp]` does not yet differentiate",
];

/// `k`'s text (`tokens`) with `#[vjp]` and `#[jvp]` of every float parameter it reads, or
/// `None` where it has derivatives already, writes through `&mut` or has no float parameter.
fn with_derivatives(tokens: &TokenStream, k: &Kernel) -> Option<TokenStream> {
    if k.vjp.is_some() || k.jvp.is_some() || k.params.iter().any(|p| p.written) {
        return None;
    }
    let floats: Vec<proc_macro2::Ident> = k
        .params
        .iter()
        .filter(|p| p.elem.is_float())
        .map(|p| format_ident!("{}", plain_name(&p.name)))
        .collect();
    if floats.is_empty() {
        return None;
    }
    // A kernel with no float output has nothing to differentiate (an error of its own).
    if !k.outputs.iter().any(|o| o.elem.is_float()) {
        return None;
    }
    Some(quote!(#[vjp(#(#floats),*)] #[jvp(#(#floats),*)] #tokens))
}

/// Every derived function of `k` plans, and each launch's text is emitted.
fn derives(k: &Kernel) -> Result<usize, String> {
    let mut derived = vec![];
    if k.vjp.is_some() {
        let d = crate::grad::vjp(k, false, "d")?;
        let train = crate::grad::train(k, &d)?;
        derived.push(d);
        derived.push(crate::grad::vjp(k, true, "v")?);
        derived.push(train.backward);
    }
    if k.jvp.is_some() {
        derived.push(crate::grad::jvp(k, "j")?);
    }
    let mut launches = 0;
    for d in &derived {
        for step in &d.steps {
            let program = crate::plan::program(&step.kernel);
            crate::cuda::sources(&step.kernel, &program);
            crate::cpu::body(&step.kernel, &program.plan);
            launches += 1;
        }
    }
    Ok(launches)
}

#[test]
fn every_kernel_of_the_repository_differentiates_or_says_why_not() {
    let (mut derived, mut refused, mut failures) = (0, 0, vec![]);
    for tokens in super::seeds::kernels() {
        let Ok(kernels) = crate::testing::kernels(tokens.clone()) else {
            continue;
        };
        let [k] = &kernels[..] else { continue };
        let Some(listed) = with_derivatives(&tokens, k) else {
            continue;
        };
        let outcome = std::panic::catch_unwind(|| match crate::testing::kernels(listed.clone()) {
            Ok(k) => derives(&k[0]).map(|_| true),
            Err(errors) => match errors
                .iter()
                .find(|e| !REFUSALS.iter().any(|r| e.starts_with(r)))
            {
                Some(e) => Err(format!("an error other than a refusal: {e}")),
                None => Ok(false),
            },
        });
        match outcome {
            Ok(Ok(true)) => derived += 1,
            Ok(Ok(false)) => refused += 1,
            Ok(Err(e)) => failures.push(format!("{e}\n  in {listed}")),
            Err(_) => failures.push(format!("a panic\n  in {listed}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} kernels fail to differentiate ({derived} did, {refused} refused):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(derived >= 100, "only {derived} kernels derived");
    eprintln!("{derived} kernels differentiated, {refused} refused");
}
