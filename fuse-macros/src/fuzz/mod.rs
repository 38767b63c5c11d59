//! The macro never panics: a fuzzer that feeds the whole macro (`expand::fuse`, the function the
//! proc macro calls: parse, check, plan and both emitters) mutated kernels and random token
//! streams, and requires each to end in generated code or in `compile_error!`s, never a panic, a
//! hang or an expansion that does not parse as Rust.
//!
//! The seeds are every `fuse!` block of the repository (tests, examples, benches, ui tests) and
//! this crate's unit-test fixtures; the mutations delete, swap, duplicate and replace tokens,
//! insert keywords, raw and unicode identifiers and literals past every type's range, splice in
//! pieces of other kernels, and build deep nestings and long expressions (`gen.rs`).
//!
//! Runs:
//! - `cargo test -p fuse-macros fuzz` runs the CI-sized run: [`CI_CASES`] cases from a fixed seed,
//!   a few seconds in a debug build.
//! - `FUSE_FUZZ_CASES=1000000 FUSE_FUZZ_SEED=7 cargo test --release -p fuse-macros fuzz_run`
//!   runs a long session; every failure is printed with its case number and input.
//! - `FUSE_FUZZ_CASE=1234` (with the same seed) runs that one case only, and
//!   `FUSE_FUZZ_TRACE=1` prints each input before running it: a stack overflow aborts the
//!   process, and the last input printed is the one that caused it.
//!
//! The seeds are read from the working tree, so a case number names one input only for one tree
//! (a new ui test shifts them); a failure is printed with its input, and an input that found a
//! bug is kept below as a regression test, by its text.

mod derive;
mod gen;
mod seeds;

use gen::{Flat, Rng};
use proc_macro2::{TokenStream, TokenTree};
use std::cell::RefCell;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Cases of the run that `cargo test` does on every build.
const CI_CASES: u64 = 5_000;

/// The seed of the CI run; long sessions pick others with `FUSE_FUZZ_SEED`.
const CI_SEED: u64 = 0x5EED_F05E;

/// A case slower than this is a failure: the macro's work must stay proportional to its input.
const SLOW: Duration = Duration::from_secs(5);

/// With no case finished for this long, the run is stuck: an infinite loop, reported with its
/// input.
const STUCK: Duration = Duration::from_secs(120);

/// The stack the cases run on. rustc runs proc macros on its main thread, of 8 MiB, part of
/// which rustc itself uses; the macro must fit in what is left, so the fuzzer gives it half.
const STACK: usize = 4 << 20;

/// One input that made the macro fail, and how.
struct Failure {
    case: u64,
    what: String,
    input: String,
}

/// How one input ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Code,
    Errors,
}

thread_local! {
    /// The message of the last panic on this thread, written by the hook that `run` installs.
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `input` through the whole macro: `Err` with what went wrong if it panicked or its
/// expansion is not Rust; else the outcome and the time the macro took. (Only the macro's: the
/// check that the expansion parses, syn reading back every string literal of its CUDA C, took
/// twice as long on a whole repository file of `#[vjp]` kernels, 21.6 MB of expansion, and
/// made that case "slow" at 3.9 s where the macro took 1.4: NOTES item 145.)
fn run_one(input: TokenStream) -> Result<(Outcome, Duration), String> {
    let start = Instant::now();
    let result = std::panic::catch_unwind(|| crate::expand::fuse(input));
    let took = start.elapsed();
    let out = match result {
        Ok(out) => out,
        Err(_) => {
            let message = PANIC.with(|p| p.borrow_mut().take());
            return Err(format!("panic: {}", message.unwrap_or_default()));
        }
    };
    let outcome = if has_compile_error(out.clone()) {
        Outcome::Errors
    } else {
        Outcome::Code
    };
    match syn::parse2::<syn::File>(out.clone()) {
        Ok(_) => Ok((outcome, took)),
        Err(e) => Err(format!("the expansion does not parse as Rust: {e}\n{out}")),
    }
}

fn has_compile_error(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(i) => i == "compile_error",
        TokenTree::Group(g) => has_compile_error(g.stream()),
        _ => false,
    })
}

/// Makes panics on fuzzing threads quiet and remembered; other threads keep the default hook.
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let fuzzing = std::thread::current().name() == Some("fuzz");
        if !fuzzing {
            return default(info);
        }
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| l.to_string()).unwrap_or_default();
        PANIC.with(|p| *p.borrow_mut() = Some(format!("{message} at {at}")));
    }));
}

/// The seeds, and which of them expand to code: those are mutated more often, so that more
/// inputs get past the checker to the planner and the emitters.
struct Seeds {
    all: Vec<Vec<Flat>>,
    valid: Vec<usize>,
}

impl Seeds {
    fn new() -> Seeds {
        let all = seeds::all();
        let valid = (0..all.len())
            .filter(|&i| matches!(run_one(gen::unflatten(&all[i])), Ok((Outcome::Code, _))))
            .collect();
        Seeds { all, valid }
    }

    fn pick(&self, rng: &mut Rng) -> &[Flat] {
        if !self.valid.is_empty() && !rng.chance(4) {
            &self.all[*rng.pick(&self.valid)]
        } else {
            rng.pick(&self.all).as_slice()
        }
    }
}

/// The input of case `case`: a mutated seed, or now and then a random stream.
fn input(case: u64, seed: u64, seeds: &Seeds, pool: &gen::Pool) -> TokenStream {
    let mut rng = Rng::new(seed ^ case.wrapping_mul(0xA24B_AED4_963E_E407));
    let flat = if rng.chance(8) {
        gen::random_stream(&mut rng, &pool.all)
    } else {
        let base = seeds.pick(&mut rng);
        let other = seeds.pick(&mut rng);
        gen::mutate(&mut rng, base, other, pool)
    };
    gen::unflatten(&flat)
}

/// What the run is asked to do, from the environment or the CI defaults.
struct Plan {
    seed: u64,
    cases: std::ops::Range<u64>,
    trace: bool,
}

impl Plan {
    fn from_env(default_cases: u64) -> Plan {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let seed = var("FUSE_FUZZ_SEED").unwrap_or(CI_SEED);
        let cases = match (var("FUSE_FUZZ_CASE"), var("FUSE_FUZZ_CASES")) {
            (Some(one), _) => one..one + 1,
            (None, Some(n)) => 0..n,
            (None, None) => 0..default_cases,
        };
        let trace = std::env::var_os("FUSE_FUZZ_TRACE").is_some();
        Plan { seed, cases, trace }
    }
}

/// Runs the plan's cases on a thread of its own, watched for hangs; every failure.
fn run(plan: Plan) -> Vec<Failure> {
    watched(move |progress| fuzz_thread(plan, progress))
}

/// Runs `cases` on a fuzzing thread of its own, which reports each input as it starts it, each
/// failure and the summary: panics where no case finishes for [`STUCK`], with the input. The
/// watch starts with the first case: the seeds are expanded before it (the repository's own
/// kernels, which build), and that takes minutes in a debug build on a loaded machine, where
/// CI runs both fuzzers beside the other tests.
fn watched(cases: impl FnOnce(mpsc::Sender<Progress>) + Send + 'static) -> Vec<Failure> {
    install_panic_hook();
    let (progress, finished) = mpsc::channel::<Progress>();
    std::thread::Builder::new()
        .name("fuzz".into())
        .stack_size(STACK)
        .spawn(move || cases(progress))
        .expect("a thread");
    let mut failures = vec![];
    let mut current = String::new();
    let mut started = false;
    loop {
        let next = match started {
            true => finished.recv_timeout(STUCK),
            false => finished
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(Progress::Started(input)) => {
                current = input;
                started = true;
            }
            Ok(Progress::Failed(f)) => failures.push(f),
            Ok(Progress::Done(summary)) => {
                eprintln!("fuzz: {summary}");
                return failures;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("stuck on the input\n{current}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the fuzzing thread died on the input\n{current}")
            }
        }
    }
}

enum Progress {
    Started(String),
    Failed(Failure),
    Done(String),
}

/// Reports that case `case`, of input `input`, failed with `what`.
fn failed(progress: &mpsc::Sender<Progress>, case: u64, what: String, input: String) {
    let _ = progress.send(Progress::Failed(Failure { case, what, input }));
}

fn fuzz_thread(plan: Plan, progress: mpsc::Sender<Progress>) {
    let seeds = Seeds::new();
    assert!(
        seeds.valid.len() > 100,
        "only {} valid seeds",
        seeds.valid.len()
    );
    let pool = gen::Pool::new();
    let (mut code, mut errors, mut slowest) = (0u64, 0u64, Duration::ZERO);
    for case in plan.cases.clone() {
        let input = input(case, plan.seed, &seeds, &pool);
        let text = input.to_string();
        if plan.trace {
            eprintln!("fuzz case {case}: {text}");
        }
        let _ = progress.send(Progress::Started(text.clone()));
        let what = match run_one(input) {
            Ok((outcome, took)) => {
                slowest = slowest.max(took);
                match outcome {
                    _ if took > SLOW => format!("slow: {took:?}"),
                    Outcome::Code => {
                        code += 1;
                        continue;
                    }
                    Outcome::Errors => {
                        errors += 1;
                        continue;
                    }
                }
            }
            Err(what) => what,
        };
        failed(&progress, case, what, text);
    }
    let summary = format!(
        "{} cases from seed {:#x} over {} seeds ({} valid): {code} generated code, {errors} \
         errors, slowest {slowest:?}",
        plan.cases.end - plan.cases.start,
        plan.seed,
        seeds.all.len(),
        seeds.valid.len()
    );
    let _ = progress.send(Progress::Done(summary));
}

/// Fails with every failure, grouped by what went wrong, with an input of each.
fn report(failures: Vec<Failure>) {
    if failures.is_empty() {
        return;
    }
    let mut kinds: std::collections::BTreeMap<String, Vec<Failure>> = Default::default();
    for f in failures {
        let key: String = f
            .what
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect();
        kinds.entry(key).or_default().push(f);
    }
    let mut text = String::new();
    for (what, list) in &kinds {
        let first = &list[0];
        let input: String = first.input.chars().take(2000).collect();
        text += &format!(
            "\n{} case(s), first case {}: {what}\n  input: {input}\n",
            list.len(),
            first.case
        );
    }
    panic!("{} kinds of failure:{text}", kinds.len());
}

#[test]
fn fuzz_run() {
    report(run(Plan::from_env(CI_CASES)));
}

/// Runs `text` through the macro on a thread like the fuzzer's; what went wrong, if anything.
fn check_input(text: &str) -> Result<Outcome, String> {
    install_panic_hook();
    let text = text.to_string();
    std::thread::Builder::new()
        .name("fuzz".into())
        .stack_size(STACK)
        .spawn(move || run_one(text.parse().expect("tokens")).map(|(outcome, _)| outcome))
        .expect("a thread")
        .join()
        .expect("no stack overflow")
}

/// Asserts that each input ends as expected, with no failure.
fn assert_outcomes(cases: &[(&str, Outcome)]) {
    for (text, want) in cases {
        match check_input(text) {
            Ok(got) => assert_eq!(got, *want, "{text}"),
            Err(e) => panic!("{text}\n{e}"),
        }
    }
}

/// Found by the fuzzer (seed 56, case 13915): a doc attribute whose value was a chain of 2000
/// `x +` terms, which syn parsed as an expression 2000 levels deep, overflowed the stack where
/// `check` copied the kernel's attributes. An attribute's tokens are now limited
/// ([`crate::limits::MAX_ATTR_TOKENS`]), an error naming the limit.
#[test]
fn long_attributes_are_an_error_naming_the_limit() {
    let kernel = |terms: usize| {
        format!(
            "#[doc = x{}] fn f(x: [f32; n]) -> [f32; n] {{ x }}",
            " + x".repeat(terms - 1)
        )
    };
    // Within the limit the macro passes the attribute on (rustc judges a doc's value).
    assert_outcomes(&[
        (&kernel(200), Outcome::Code),
        (&kernel(2000), Outcome::Errors),
    ]);
    let errors = crate::testing::errors(kernel(2000).parse().expect("tokens"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("512"), "{errors:?}");
    let doc = format!(
        "#[doc = \"{}\"] fn f(x: [f32; n]) -> [f32; n] {{ x }}",
        "x".repeat(5000)
    );
    assert_outcomes(&[(&doc, Outcome::Code)]);
}

/// An expression `depth` levels deep of the given shape, as the body of a kernel.
fn deep_kernel(shape: &str, depth: usize) -> String {
    let body = match shape {
        "paren" => format!("{}x{}", "(".repeat(depth), ")".repeat(depth)),
        "neg" => format!("{}x", "-".repeat(depth)),
        "add" => format!("x{}", " + x".repeat(depth)),
        "exp" => format!("x{}", ".exp()".repeat(depth)),
        "call" => format!("{}x{}", "exp(".repeat(depth), ")".repeat(depth)),
        _ => unreachable!("a shape above"),
    };
    format!("fn s(x: [f32; n]) -> [f32; n] {{ {body} }}")
}

/// Found by the fuzzer: 2000 nested parentheses overflowed the stack in `check` (every stage
/// recursed past 300 levels or so); syn's own parser overflowed on 6000 parentheses or prefix
/// operators. Depth is now an error that names its limit.
#[test]
fn deep_expressions_are_an_error_naming_the_limit() {
    let max = crate::limits::MAX_EXPR_DEPTH;
    for shape in ["paren", "neg", "add", "exp", "call"] {
        // A body's tail is one level; a shape's levels are one each, the innermost `x` one more.
        assert_outcomes(&[(&deep_kernel(shape, max - 2), Outcome::Code)]);
        for depth in [max, 1_000, 6_000] {
            let text = deep_kernel(shape, depth);
            assert_outcomes(&[(&text, Outcome::Errors)]);
            let errors = crate::testing::errors(text.parse().expect("tokens"));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(
                errors[0].contains(&max.to_string()) || errors[0].contains("256"),
                "{errors:?}"
            );
        }
    }
}

/// Found by the fuzzer (seed 58): a slice's bound of 1490 chained `.exp()` calls overflowed its
/// stack, the bound kept as syn's expression and copied and printed before any stage counted
/// its depth. A bound nested past the limit is now the same error as any expression.
#[test]
fn deep_slice_bounds_are_an_error_naming_the_limit() {
    let max = crate::limits::MAX_EXPR_DEPTH;
    for depth in [max + 1, 1_490, 6_000] {
        let chain = format!("exp(){}", ".exp()".repeat(depth));
        let sum = format!("n{}", " + n".repeat(depth));
        for bound in [format!("..{chain}"), format!("({sum})..")] {
            let text = format!("fn s(x: [f32; n]) -> [f32; n] {{ exp(x[{bound}]) }}");
            assert_outcomes(&[(&text, Outcome::Errors)]);
            let errors = crate::testing::errors(text.parse().expect("tokens"));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].contains(&max.to_string()), "{errors:?}");
        }
    }
    // Within the limit, such a bound is the slice's own error, not the depth's.
    let text = format!(
        "fn s(x: [f32; n]) -> [f32; n] {{ x[..exp(){}] }}",
        ".exp()".repeat(8)
    );
    let errors = crate::testing::errors(text.parse().expect("tokens"));
    assert!(!errors.is_empty(), "a bound of calls is no slice");
    assert!(
        !errors.iter().any(|e| e.contains(&max.to_string())),
        "{errors:?}"
    );
}

/// Found by the fuzzer: `r#in` as a dim panicked in `format_ident!` (`d_r#in`), and a stub for a
/// kernel with errors named a parameter `r#type` as `type`, which is not Rust. `r#x` is `x`, so
/// it is reserved or a duplicate as `x` is.
#[test]
fn raw_identifiers_are_the_names_they_spell() {
    use Outcome::*;
    assert_outcomes(&[
        (
            "fn f(r#type: [f32; n]) -> [f32; n] { powf(x, 2.0) }",
            Errors,
        ),
        (
            "fn f(r#type: [f32; n], r#type: f32) -> [f32; n] { x }",
            Errors,
        ),
        ("fn f(r#type: [f32; n]) -> [f32; n] { r#type }", Code),
        ("fn r#fn(x: [f32; n]) -> [f32; n] { x }", Code),
        (
            "fn f(x: [f32; r#in]) -> [f32; r#in] { sum(x, r#in) + x }",
            Code,
        ),
        (
            "fn f(x: [f32; n]) -> [f32; n] { let r#loop = x; r#loop }",
            Code,
        ),
        ("fn f(größe: [f32; ñ]) -> [f32; ñ] { größe.exp() }", Code),
    ]);
    let errors = |text: &str| crate::testing::errors(text.parse().expect("tokens"));
    let reserved = errors("fn f(x: [f32; n], r#dev: f32) -> [f32; n] { x }");
    assert!(reserved[0].contains("`dev` is reserved"), "{reserved:?}");
    let twice = errors("fn f(x: [f32; n], r#x: f32) -> [f32; n] { x }");
    assert!(
        twice[0].contains("`x` is declared more than once"),
        "{twice:?}"
    );
    let kernels = errors("fn f(x: f32) -> f32 { x } fn r#f(x: f32) -> f32 { x }");
    assert!(kernels[0].contains("defined more than once"), "{kernels:?}");
}

/// Found by the fuzzer (seed 1, case 143257): an untyped integer literal returned as an output it
/// does not fit left the literal untyped, and the output check panicked asking its element type.
/// Found by the CI run once slice kernels were among the seeds: a part count of 2^32 was
/// expanded into a list of that many parts.
#[test]
fn dims_of_many_parts_and_huge_slice_bounds_are_errors() {
    assert_outcomes(&[
        ("fn f(x: [f32; t, 4294967296 * d]) -> [f32; t, d] { x[.., ..d] }", Outcome::Errors),
        ("fn f(x: [f32; t, d * 4294967296]) -> [f32; t, d] { x[.., (0..).step_by(2)] }", Outcome::Errors),
        ("fn f(x: [f32; t, 0 * d + p]) -> [f32; t, p] { x[.., ..] }", Outcome::Errors),
        (
            "fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { x[.., 18446744073709551615 * 18446744073709551615 * 18446744073709551615 * d..] }",
            Outcome::Errors,
        ),
        ("fn f(x: [f32; t, 64 * d]) -> [f32; t, d] { x[.., 63 * d..] }", Outcome::Code),
    ]);
}

#[test]
fn a_literal_that_does_not_fit_its_output_is_one_error() {
    for text in [
        "fn f() -> i32 { - 18446744073709551615 }",
        "fn f() -> (i32, i64) { (1 + 18446744073709551615, 1) }",
    ] {
        assert_outcomes(&[(text, Outcome::Errors)]);
        let errors = crate::testing::errors(text.parse().expect("tokens"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("literal out of range for `i32`"),
            "{errors:?}"
        );
    }
}
