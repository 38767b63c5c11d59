//! Derivatives of every kernel of the repository: each that checks, with every float parameter
//! listed in `#[vjp]` (where it has a float output) and in `#[jvp]`, must either be refused by
//! check with one of the documented "not yet" errors or plan every derived function (`vjp`,
//! `value_and_vjp`, `jvp`, the training pair) and emit both backends' text for each launch,
//! never "a bug of fuse" or a panic. Found that a permuted GroupNorm weight's gradient did not
//! split into launches.
//!
//! `mutated_kernels_differentiate` does the same for the fuzzer's inputs (its mutations of the
//! same seeds) that check as one kernel: [`CI_CASES`] cases from the fuzzer's seed by default,
//! `FUSE_FUZZ_DERIVE_CASES` and `FUSE_FUZZ_SEED` for a long session. Written after the fuzzer
//! happened on a mutation with `#[vjp]` whose part's gradient is a sum itself, on which the
//! planner looped forever.

use super::Progress;
use crate::ir::Kernel;
use proc_macro2::TokenStream;
use quote::quote;
use std::sync::mpsc;

/// Cases of the run that `cargo test` does on every build.
const CI_CASES: u64 = 3_000;

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
    // The names as the parameters spell them: a raw identifier (`r#as`) stays raw, as a user
    // lists it (seed 60's case 6276 listed `as`, which no attribute can name).
    let floats: Vec<proc_macro2::Ident> = k
        .params
        .iter()
        .filter(|p| p.elem.is_float())
        .map(|p| p.name.clone())
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

/// Whether the kernel of `listed` (derivatives listed) differentiates (`true`) or check refuses
/// it with a documented error (`false`); `Err` with anything else.
fn differentiates(listed: TokenStream) -> Result<bool, String> {
    match crate::testing::kernels(listed) {
        Ok(k) => derives(&k[0]).map(|_| true),
        Err(errors) => match errors
            .iter()
            .find(|e| !REFUSALS.iter().any(|r| e.starts_with(r)))
        {
            Some(e) => Err(format!("an error other than a refusal: {e}")),
            None => Ok(false),
        },
    }
}

/// A parameter named by a raw identifier is listed as the kernel spells it (`r#as`), and the
/// kernel differentiates: from seed 60, case 6276 of the mutations listed `as`, which no
/// attribute can name.
#[test]
fn raw_parameter_names_are_listed_raw() {
    let tokens = quote! {
        pub fn unused_rows(x: [f32; rows, cols], r#as: [f32; k, m]) -> [f32; rows] {
            sum(x, cols)
        }
    };
    let k = crate::testing::kernel(tokens.clone());
    let listed = with_derivatives(&tokens, &k).expect("float parameters");
    assert!(listed.to_string().contains("vjp (x , r#as)"), "{listed}");
    assert_eq!(differentiates(listed), Ok(true));
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
        let outcome = std::panic::catch_unwind(|| differentiates(listed.clone()));
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

/// Random programs of a larger batch (p300-p799) whose derivatives did not plan: reductions
/// over different dims (or over a dim and over every element) whose results only meet
/// elementwise, which no rule put in earlier launches ("does not split into launches"); a sum
/// over `d1` whose result scales values over a dim its operand lacks (the same); and a
/// temporary left in a launch's `using` after `partial_sums` dropped the launch that wrote it,
/// which a root that `merge_later` moved in read unwritten (p383's `vjp` did not compile).
#[test]
fn random_programs_derivatives_plan() {
    let kernels = [
        quote! {
            #[vjp(x0, x1, x3, x5)]
            #[jvp(x0, x1, x3, x5)]
            fn p301(x0: [bf16; d0, d1, d2], x1: [f64; d0, d1], s2: u8, x3: [bf16; d0, d1, d2], x4: [i16; d0, d2], x5: [bf16; d1, d2]) -> ([bf16; d0, d1, d2], [bf16; d0, d1, d2]) {
                let v2 = x1.is_finite();
                let v3 = relu(x0);
                let v5 = (if v2 { v3 } else { 4.0 });
                let v16 = x3[.., x4, ..].round();
                let v20 = sum(v5, d1);
                ((-v5), ((if (!(s2 <= 2)) { (if v2 { x0 } else { v5.round() }) } else { (v16 % 3.0) }) - sum((v20 * x5), d1)))
            }
        },
        quote! {
            #[vjp(x0, x1, x3, x4, x5, x10, s11, x12)]
            #[jvp(x0, x1, x3, x4, x5, x10, s11, x12)]
            fn p314(x0: [bf16; d0, d1, d2], x1: [f64; d0, d1, d2], x2: [u64; d0, d2], x3: [f32; d2], x4: [f32; d0, d2], x5: [f64; d1, d0], x6: [u16; d0], x7: [u16; d0, d1], x8: [bool; d0, d1, d2], x9: [i8; d1, d2], x10: [f64; d0, d1, d2], s11: f64, x12: [f64; d2, d0]) -> ([f64; d0, d1, d2], [u16; d0, d1], [f64; d0, d1, d2]) {
                let v6 = rsqrt(x1[.., x2, ..].signum()).atanh();
                let v13 = logsumexp(x3.min(x4), d2);
                (v6.max((index(d1) as f64)), (if v13.is_infinite() { (((permute(x5, (d0, d1)) as u16) * x6) - (x6 ^ x7)) } else { x6 }), sum((if x8[x9, .., ..] { v6 } else { x10 }).max(tanh(s11)), d2).min(permute(x12, (d0, d2))))
            }
        },
        quote! {
            #[vjp(x0, s2)]
            #[jvp(x0, s2)]
            fn p374(x0: [f16; d0], x1: [i16; d0], s2: f16) -> ([u8; d0], [f16; d0]) {
                let v3 = ((-x1) as u8);
                let v4 = (v3 | v3);
                let v7 = v3.min((v4 & 9));
                let v9 = (x0 / s2);
                let v13 = (sum(x0, d0) * s2.atan());
                (v7, (log2(v9) - v13))
            }
        },
        quote! {
            #[vjp(x0, x1, x3)]
            #[jvp(x0, x1, x3)]
            fn p383(x0: [bf16; d0, d1, d2], x1: [bf16; d0, d1, d2], x2: [i32; d0, d1], x3: [bf16; d0, d1, d2], s4: i64) -> [bf16; d0, d1, d2] {
                let v5 = recip((x0 / x1).powi(x2));
                let v9 = sum(x3[.., .., s4], d0);
                v5.max(v9)
            }
        },
        quote! {
            #[vjp(x1, x2)]
            #[jvp(x1, x2)]
            fn p410(x0: [i16; d0, d1, d2], x1: [f64; d0, d1, d2], x2: [bf16; d2], x3: [bool; d0, d2]) -> [bf16; d0, d1, d2] {
                let v7 = (if x3 { x2 } else { x2 });
                (if (x1 == (-2.0)) { (-x2) } else { v7 }).clamp(acos(x2).acos(), 0.25)
            }
        },
        quote! {
            #[vjp(x1, x3, x4, x6, x7, x9, x10, x12, s13, x14, x15)]
            #[jvp(x1, x3, x4, x6, x7, x9, x10, x12, s13, x14, x15)]
            fn p470(x0: [u32; d0, d1, d2], x1: [f64; d0, d2], x2: [i16; d2], x3: [f32; d0, d1, d2], x4: [f32; d0, d2], x5: [i8; d0], x6: [f32; d2], x7: [f32; d0, d2], x8: [i64; d2], x9: [f32; d0], x10: [f64; d0, d1], x11: [i8; d0], x12: [f32; d0, d1], s13: f32, x14: [f32; d0, d1], x15: [f32; d2]) -> ([f64; d0, d1, d2], [f32; d0, d2], [f32; d0, d2]) {
                let v17 = sum(x1[x2, ..].cosh().max((index(d1) as f64)), d1).mul_add((sum(x1.min((index(d1) as f64)), d1) % x1.cbrt()), (x3 as f64));
                let v37 = x9.ln();
                let v40 = sum(v37.max(x12), d1);
                let v46 = logsumexp(((s13 - v37) * x14), d1);
                let v48 = (v46 + 1.5);
                (v17, (if ((x4[.., (x5 as i64)] > x4) || (x4 != x6)) { (if (x7[x8, ..] > x9) { asin(x7) } else { (x10[.., x11] as f32) }) } else { v40 }), (v48 + x15))
            }
        },
        quote! {
            #[vjp(x0, x1)]
            #[jvp(x0, x1)]
            fn p487(x0: [f16; d0, d1, d2], x1: [f16; d1, d2], x2: [i8; d2], x3: [u8; d1], x4: [u8; d1], x5: [u8; d0, d1]) -> ([f16; d0, d1, d2], [f16; d0, d1]) {
                let v6 = x1[x2, ..].mul_add(x1, x0);
                let v21 = (((x4 - 5) | x3.min(x5)) as f16);
                (((x0 / 2.0) * v6).powf(min(((x3 as f16) * (index(d2) as f16)), d2)), v21)
            }
        },
        quote! {
            #[vjp(x0, x1, x2, x3, x4, x5)]
            #[jvp(x0, x1, x2, x3, x4, x5)]
            fn p557(x0: [f32; d0, d1, d2], x1: [f16; d1, d2], x2: [f32; d1], x3: [f16; d1, d2], x4: [f64; d0, d2], x5: [f64; d1, d2]) -> ([f16; d1, d2], [f64; d0, d1, d2]) {
                let v2 = gelu(x1);
                let v12 = x4.atanh();
                (v2, (((x2 as f64) + (index(d0) as f64)) - (x3 as f64)).min(mean((v12 * x5), d0)))
            }
        },
        quote! {
            #[vjp(x1, x2, x4)]
            #[jvp(x1, x2, x4)]
            fn p585(x0: [i64; d0, d1, d2], x1: [f64; d0, d1, d2], x2: [f64; d0, d2], x3: [i16; d0], x4: [f64; d0, d2], x5: [u32; d0, d1]) -> ([u64; d0, d1, d2], [f64; d0, d1]) {
                let v1 = x1;
                ((v1 as u64), min(x2[.., (x3 as u32)].log(x4).acos(), d2).min((x5 as f64)))
            }
        },
        // p1381 (the batch from p1300): the launch summing a row's sums of a total went last,
        // after a launch that read the total (`vjp` did not compile).
        quote! {
            #[vjp(x0, s1, x2, x3)]
            #[jvp(x0, s1, x2, x3)]
            fn p1381(x0: [f64; d0, d1, d2], s1: f64, x2: [f64; d2], x3: [f64; d1]) -> [f64; d0, d1, d2] {
                let v3 = s1.min(x2);
                (log2(v3) * (index(d0) as f64)).min(x3).min(sum((x3 - v3), (d1, d2)))
            }
        },
    ];
    for tokens in kernels {
        let k = crate::testing::kernel(tokens);
        let launches = derives(&k).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        assert!(launches > 0);
    }
}

/// Derives every float parameter of each input of the fuzzer that checks as one kernel, in its
/// every derived function: each is refused or plans, as the repository's kernels must.
#[test]
fn mutated_kernels_differentiate() {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = var("FUSE_FUZZ_SEED").unwrap_or(super::CI_SEED);
    let cases = var("FUSE_FUZZ_DERIVE_CASES").unwrap_or(CI_CASES);
    super::report(super::watched(move |progress| {
        mutations(seed, cases, progress)
    }));
}

fn mutations(seed: u64, cases: u64, progress: mpsc::Sender<Progress>) {
    let seeds = super::Seeds::new();
    let pool = super::gen::Pool::new();
    let (mut derived, mut refused) = (0, 0);
    for case in 0..cases {
        let input = super::input(case, seed, &seeds, &pool);
        let _ = progress.send(Progress::Started(input.to_string()));
        let Ok(kernels) = crate::testing::kernels(input.clone()) else {
            continue;
        };
        let [k] = &kernels[..] else { continue };
        let listed = match with_derivatives(&input, k) {
            Some(listed) => listed,
            None if k.vjp.is_some() || k.jvp.is_some() => input,
            None => continue,
        };
        let text = listed.to_string();
        let _ = progress.send(Progress::Started(text.clone()));
        let outcome = std::panic::catch_unwind(|| differentiates(listed));
        let what = match outcome {
            Ok(Ok(true)) => {
                derived += 1;
                continue;
            }
            Ok(Ok(false)) => {
                refused += 1;
                continue;
            }
            Ok(Err(e)) => e,
            Err(_) => {
                let message = super::PANIC.with(|p| p.borrow_mut().take());
                format!("panic: {}", message.unwrap_or_default())
            }
        };
        super::failed(&progress, case, what, text);
    }
    let summary = format!(
        "{cases} cases from seed {seed:#x}: {derived} kernels differentiated, {refused} refused"
    );
    let _ = progress.send(Progress::Done(summary));
}
