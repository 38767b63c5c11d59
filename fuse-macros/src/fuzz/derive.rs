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

/// Every derived function of `k` plans, each launch reads only temporaries that an earlier
/// one wrote (or the training pair's forward saved), and each launch's text is emitted.
fn derives(k: &Kernel) -> Result<usize, String> {
    let mut derived = vec![];
    if k.vjp.is_some() {
        let d = crate::grad::vjp(k, false, "d")?;
        let train = crate::grad::train(k, &d)?;
        let saved: Vec<usize> = train.saved.iter().map(|s| s.temp).collect();
        derived.push((d, vec![]));
        derived.push((crate::grad::vjp(k, true, "v")?, vec![]));
        derived.push((train.backward, saved));
    }
    if k.jvp.is_some() {
        derived.push((crate::grad::jvp(k, "j")?, vec![]));
    }
    let mut launches = 0;
    for (d, saved) in &derived {
        let mut written = saved.clone();
        for step in &d.steps {
            if let Some(t) = step.temps.iter().find(|t| !written.contains(t)) {
                return Err(format!(
                    "`{}` reads temporary {t} before a launch writes it",
                    step.kernel.name
                ));
            }
            written.extend(step.dests.iter().filter_map(|d| match d {
                crate::grad::Dest::Temp(t) => Some(*t),
                crate::grad::Dest::Result(_) => None,
            }));
        }
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

/// Random programs whose derivatives once read a temporary before any launch wrote it (a
/// launch moved into a later one by `merge_later` before `partial_sums` rewrote the sums it
/// wrote): each must plan with every temporary written before it is read.
#[test]
fn random_programs_derivatives_write_their_temporaries_first() {
    let kernels = [
        quote! {
            #[vjp(s2, x4)]
            #[jvp(s2, x4)]
            fn p178(x0: [i16; d0, d1, d2], s1: bool, s2: f16, x3: [u16; d0, d1], x4: [f16; d0, d1, d2]) -> f16 {
                (((if s1 { s2.min(s2) } else { asin(s2) }) - 1.0) + logsumexp((s2.min((x3 as f16)) + x4)))
            }
        },
        quote! {
            #[vjp(x0, s1, x2, x3, x4, x6)]
            #[jvp(x0, s1, x2, x3, x4, x6)]
            fn p87(x0: [f32; d0, d1, d2], s1: bf16, x2: [bf16; d1, d2, d0], x3: [bf16; d0, d2], x4: [bf16; d0, d1, d2], x5: [u8; d0, d2], x6: [f16; d1, d2]) -> (f32, bf16, [f16; d0, d1, d2]) {
                let v1 = min(x0);
                let v11 = (-sum((((s1.acos() % s1) * (index(d0) as bf16)) * permute(x2, (d0, d1, d2)))));
                let v12 = v11.recip();
                let v13 = (v1 as bf16);
                let v18 = sum((s1.max(x3) * x4));
                let v25 = (-x6);
                let v26 = ((x5 as f16) - v25);
                (v1, (v12 * (v13 / v11.clamp(v18, s1))), v26.ln_1p())
            }
        },
    ];
    for tokens in kernels {
        let k = crate::testing::kernel(tokens);
        let launches = derives(&k).unwrap_or_else(|e| panic!("{e}"));
        assert!(launches > 0);
    }
}
