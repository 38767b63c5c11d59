//! G1-G8: the training workloads' backwards (`shared/WORKLOADS.md`), each derived by `#[vjp]`
//! from its bf16 forward (`kernels.rs`) and timed as a user calls it: `name::vjp` (G5:
//! `value_and_vjp`, the forward and backward together), every launch and allocation included.
//! G1T, G2T and G6T time the training pair's `backward` instead, from what `forward_train`
//! saved (run before the timing, as the peers' backwards are given the forward's saved
//! tensors). GW times G1, G2, G7 and G8 at other hidden sizes ([`WIDTHS`]).
//! The bytes are WORKLOADS.md's backward bytes: each tensor the backward needs read once, each
//! gradient written once (per-row statistics and weight gradients not counted).
//!
//! Each row is first checked on a few rows of its width against the CPU backend: each gradient
//! within two bf16 ulps of the CPU's, plus, for a weight gradient (a sum over the rows),
//! [`SUM_REL`] of its largest magnitude.

use std::any::Any;

use fuse_runtime::{bf16, Buffer, Device, Error};

use crate::kernels::*;
use crate::measure::{self, Timing};
use crate::report::{Row, Status};
use crate::runner::Runner;
use crate::typed::{Float, Pool};

/// `t x h`, `t x f` and `t x v` of WORKLOADS.md.
const TH: (usize, usize) = (16384, 4096);
const TF: (usize, usize) = (8192, 14336);
const TV: (usize, usize) = (4096, 128256);

/// Rows of the check against the CPU: a partial block's worth, odd.
const CHECK_ROWS: usize = 9;

/// The cases whose gradient cancels: GELU's derivative `Phi(z) + z phi(z)` takes `1 + erf`,
/// whose f32 roundings a few ulps apart on the two backends are not small beside the result
/// where `z` is very negative (doc/language.md, `gelu`); the norms' `dx` is `rstd` times a
/// difference of a row's terms (`dy * w - xhat * mean(dy * w * xhat)`, and LayerNorm's mean
/// besides), near zero where they meet: G2 failed its check once at 3.1e-7 against the CPU's
/// 3.2e-7 (NOTES item 107); softmax's `dx` is `y * (dy - sum(dy * y))`, near zero where `dy`
/// meets the row's dot: G6 failed once at -2.26e-12 against the CPU's -2.43e-12 (item 119).
/// Their gradients are also compared within `CANCEL_REL` of the gradient's largest magnitude.
const CANCELS: &[&str] = &["G1", "G1T", "G2", "G2T", "G6", "G6T", "G8"];
const CANCEL_REL: f64 = 8.0 * f32::EPSILON as f64;

/// A weight gradient's rounding beyond two ulps, as a fraction of its largest magnitude: the
/// GPU and the CPU sum the rows in other orders.
const SUM_REL: f64 = 1e-3;

/// The inputs of one run: the bf16 tensors (in the kernel's order), a per-row label (G5).
struct Inputs {
    bf16s: Vec<Buffer<bf16>>,
    labels: Option<Buffer<i64>>,
    /// What `Case::prepare` made: a training pair's `Saved`.
    saved: Option<Box<dyn Any>>,
}

impl Inputs {
    /// The `Saved` that `Case::prepare` made.
    fn saved<S: 'static>(&self) -> Result<&S, Error> {
        self.saved
            .as_ref()
            .and_then(|s| s.downcast_ref::<S>())
            .ok_or_else(|| Error::Internal {
                detail: "the bench case prepared no Saved of this kernel".to_string(),
            })
    }
}

/// The logits, the labels, and the cotangent of each row's loss.
type CrossEntropyInputs<'a> = (&'a Buffer<bf16>, &'a Buffer<i64>, Buffer<f32>);

/// A cross-entropy's arguments besides its kernel's: the logits, the labels, and the
/// cotangent of each row's loss, `1 / t` (the mean over rows).
fn cross_entropy_inputs<'a>(dev: &Device, i: &'a Inputs) -> Result<CrossEntropyInputs<'a>, Error> {
    let z = &i.bf16s[0];
    let labels = i.labels.as_ref().ok_or_else(|| Error::Internal {
        detail: "a cross-entropy case without labels".to_string(),
    })?;
    let rows = z.shape()[0];
    Ok((z, labels, dev.upload(&vec![1.0 / rows as f32; rows])?))
}

/// Runs a training pair's forward on the inputs, untimed, for the backward to read.
type Prepare = fn(&Device, &Inputs) -> Result<Box<dyn Any>, Error>;

/// A gradient (or G5's loss) as the backward returns it.
enum Grad {
    Bf16(Buffer<bf16>),
    F32(Buffer<f32>),
}

impl Grad {
    /// Its values, read back, in f32.
    fn values(&self) -> Result<Vec<f32>, Error> {
        match self {
            Grad::Bf16(b) => Ok(b.to_vec()?.into_iter().map(bf16::to_f32).collect()),
            Grad::F32(b) => b.to_vec(),
        }
    }
}

/// One backward: its kernel's call on `Inputs`, the gradients left on the device (what is
/// timed), in the order of `Case::sums`.
type Backward = fn(&Device, &Inputs) -> Result<Vec<Grad>, Error>;

#[derive(Clone, Copy)]
struct Case {
    id: &'static str,
    label: &'static str,
    what: &'static str,
    /// `rows x cols` at full size.
    shape: (usize, usize),
    /// The bf16 tensors: each `[rows, cols]` (true) or `[cols]` (false).
    tensors: &'static [bool],
    labels: bool,
    /// Bytes an element of `rows x cols`, and the formula.
    bytes_per: u64,
    formula: &'static str,
    /// Which gradients are weight gradients.
    sums: &'static [bool],
    backward: Backward,
    prepare: Option<Prepare>,
}

/// The rows x cols beside `TH` that `GW` times the backwards with weight gradients at (G1, G2,
/// G7, G8): the hidden sizes of other models, in the same 2^26 elements. Measured first on an
/// H200 (NOTES item 119), G2's `vjp` ran there at 6-22% of copy speed, against 77% at 4096.
/// Past 4096 the rows are cached in shared memory, split over a cluster's blocks (the long
/// rows): 8192, 16384 and 32768 time three of its splits.
const WIDTHS: [(usize, usize); 5] = [
    (262144, 256),
    (65536, 1024),
    (8192, 8192),
    (4096, 16384),
    (2048, 32768),
];

/// G1-G8, one row each, and `GW`: G1, G2, G7 and G8 at each of [`WIDTHS`].
pub fn g(runner: &mut Runner, pool: &mut Pool, id: &str) {
    if id == "GW" {
        for base in ["G1", "G2", "G7", "G8"] {
            let case = case(base).expect("a G case");
            for (rows, cols) in WIDTHS {
                let label = format!("{base} {} {rows}x{cols}", case.label);
                let shape = (rows, cols);
                run(runner, pool, &Case { shape, ..case }, ("GW", &label));
            }
        }
        return;
    }
    match case(id) {
        Some(case) => run(runner, pool, &case, (case.id, case.label)),
        None => runner.not_yet(id),
    }
}

/// The case of row `id`, if it is one of G1-G8 and the training pairs.
fn case(id: &str) -> Option<Case> {
    Some(match id {
        "G1" => Case {
            id: "G1",
            label: "RMSNorm backward bf16",
            what: "dx, dw of y = x * rsqrt(mean_row(x^2) + 1e-6) * w",
            shape: TH,
            tensors: &[true, false, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false, true],
            backward: |dev, i| {
                let g = g1_rmsnorm::vjp(dev, &i.bf16s[0], &i.bf16s[1], &i.bf16s[2])?;
                Ok(vec![Grad::Bf16(g.x), Grad::Bf16(g.w)])
            },
            prepare: None,
        },
        "G2" => Case {
            id: "G2",
            label: "LayerNorm backward bf16",
            what: "dx, dg, db of y = (x - mean_row) * rsqrt(var_row + 1e-5) * g + b",
            shape: TH,
            tensors: &[true, false, false, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false, true, true],
            backward: |dev, i| {
                let s = &i.bf16s;
                let g = g2_layernorm::vjp(dev, &s[0], &s[1], &s[2], &s[3])?;
                Ok(vec![Grad::Bf16(g.x), Grad::Bf16(g.g), Grad::Bf16(g.b)])
            },
            prepare: None,
        },
        "G3" => Case {
            id: "G3",
            label: "SwiGLU backward bf16",
            what: "da, db of c = silu(a) * b",
            shape: TF,
            tensors: &[true, true, true],
            labels: false,
            bytes_per: 10,
            formula: "10 t f",
            sums: &[false, false],
            backward: |dev, i| {
                let s = &i.bf16s;
                let g = g3_swiglu::vjp(dev, &s[0], &s[1], &s[2])?;
                Ok(vec![Grad::Bf16(g.a), Grad::Bf16(g.b)])
            },
            prepare: None,
        },
        "G4" => Case {
            id: "G4",
            label: "GeGLU backward bf16",
            what: "da, db of c = gelu_tanh(a) * b",
            shape: TF,
            tensors: &[true, true, true],
            labels: false,
            bytes_per: 10,
            formula: "10 t f",
            sums: &[false, false],
            backward: |dev, i| {
                let s = &i.bf16s;
                let g = g4_geglu::vjp(dev, &s[0], &s[1], &s[2])?;
                Ok(vec![Grad::Bf16(g.a), Grad::Bf16(g.b)])
            },
            prepare: None,
        },
        "G5" => Case {
            id: "G5",
            label: "cross-entropy forward + backward bf16",
            what:
                "loss = logsumexp_row(z) - z[row, label] and dz, the cotangent 1/t a row (the mean)",
            shape: TV,
            tensors: &[true],
            labels: true,
            bytes_per: 4,
            formula: "4 t v",
            sums: &[false, false],
            backward: |dev, i| {
                let (z, labels, d) = cross_entropy_inputs(dev, i)?;
                let (loss, g) = g5_cross_entropy::value_and_vjp(dev, z, labels, &d)?;
                Ok(vec![Grad::F32(loss), Grad::Bf16(g.z)])
            },
            prepare: None,
        },
        "G5G" => Case {
            id: "G5G",
            label: "cross-entropy forward + backward bf16, the label's logit gathered",
            backward: |dev, i| {
                let (z, labels, d) = cross_entropy_inputs(dev, i)?;
                let (loss, g) = g5_cross_entropy_gathered::value_and_vjp(dev, z, labels, &d)?;
                Ok(vec![Grad::F32(loss), Grad::Bf16(g.z)])
            },
            ..case("G5")?
        },
        "G5F" => Case {
            id: "G5F",
            label: "cross-entropy forward + backward bf16, gathered, #[fast_math]",
            backward: |dev, i| {
                let (z, labels, d) = cross_entropy_inputs(dev, i)?;
                let (loss, g) = g5_cross_entropy_fast::value_and_vjp(dev, z, labels, &d)?;
                Ok(vec![Grad::F32(loss), Grad::Bf16(g.z)])
            },
            ..case("G5")?
        },
        "G6" => Case {
            id: "G6",
            label: "softmax backward bf16",
            what: "dx of y = softmax_row(x)",
            shape: TH,
            tensors: &[true, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false],
            backward: |dev, i| {
                let g = g6_softmax::vjp(dev, &i.bf16s[0], &i.bf16s[1])?;
                Ok(vec![Grad::Bf16(g.x)])
            },
            prepare: None,
        },
        "G7" => Case {
            id: "G7",
            label: "DyT backward bf16",
            what: "dx, dalpha, dg, db of y = g * tanh(alpha * x) + b, alpha = 0.7",
            shape: TH,
            tensors: &[true, false, false, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false, true, true, true],
            backward: |dev, i| {
                let s = &i.bf16s;
                let g = g7_dyt::vjp(dev, &s[0], 0.7, &s[1], &s[2], &s[3])?;
                Ok(vec![
                    Grad::Bf16(g.x),
                    Grad::F32(g.alpha),
                    Grad::Bf16(g.g),
                    Grad::Bf16(g.b),
                ])
            },
            prepare: None,
        },
        "G8" => Case {
            id: "G8",
            label: "bias + GELU + dropout backward bf16",
            what: "dx, dbias of y = dropout(gelu(x + bias[col]), 0.1), the mask drawn again",
            shape: TH,
            tensors: &[true, false, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false, true],
            backward: |dev, i| {
                let s = &i.bf16s;
                let g = g8_bias_gelu_dropout::vjp(dev, &s[0], &s[1], 0x5eed, &s[2])?;
                Ok(vec![Grad::Bf16(g.x), Grad::Bf16(g.bias)])
            },
            prepare: None,
        },
        "G1T" => Case {
            id: "G1T",
            label: "RMSNorm pair backward bf16",
            what: "G1's dx, dw from forward_train's Saved (each row's rstd in f32)",
            shape: TH,
            tensors: &[true, false, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false, true],
            backward: |dev, i| {
                let g = g1_rmsnorm::backward(dev, i.saved::<g1_rmsnorm::Saved>()?, &i.bf16s[2])?;
                Ok(vec![Grad::Bf16(g.x), Grad::Bf16(g.w)])
            },
            prepare: Some(|dev, i| {
                let (_, saved) = g1_rmsnorm::forward_train(dev, &i.bf16s[0], &i.bf16s[1])?;
                Ok(Box::new(saved))
            }),
        },
        "G2T" => Case {
            id: "G2T",
            label: "LayerNorm pair backward bf16",
            what: "G2's dx, dg, db from forward_train's Saved (each row's mean and rstd in f32)",
            shape: TH,
            tensors: &[true, false, false, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false, true, true],
            backward: |dev, i| {
                let saved = i.saved::<g2_layernorm::Saved>()?;
                let g = g2_layernorm::backward(dev, saved, &i.bf16s[3])?;
                Ok(vec![Grad::Bf16(g.x), Grad::Bf16(g.g), Grad::Bf16(g.b)])
            },
            prepare: Some(|dev, i| {
                let s = &i.bf16s;
                let (_, saved) = g2_layernorm::forward_train(dev, &s[0], &s[1], &s[2])?;
                Ok(Box::new(saved))
            }),
        },
        "G6T" => Case {
            id: "G6T",
            label: "softmax pair backward bf16",
            what: "G6's dx from forward_train's Saved (each row's max and sum in f32)",
            shape: TH,
            tensors: &[true, true],
            labels: false,
            bytes_per: 6,
            formula: "6 t h",
            sums: &[false],
            backward: |dev, i| {
                let g = g6_softmax::backward(dev, i.saved::<g6_softmax::Saved>()?, &i.bf16s[1])?;
                Ok(vec![Grad::Bf16(g.x)])
            },
            prepare: Some(|dev, i| {
                let (_, saved) = g6_softmax::forward_train(dev, &i.bf16s[0])?;
                Ok(Box::new(saved))
            }),
        },
        _ => return None,
    })
}

/// The shape a full run takes: WORKLOADS.md's, with fewer rows where the benchmark's sizes
/// are smaller than S1's 2^28 elements (`--small`, the CPU).
fn full_shape(runner: &Runner, (rows, cols): (usize, usize)) -> (usize, usize) {
    let scale = (1usize << 28) / runner.sizes.sweep_total;
    ((rows / scale).max(CHECK_ROWS), cols)
}

/// Checks and times `case`, reported as the row `(id, variant)`.
fn run(runner: &mut Runner, pool: &mut Pool, case: &Case, (id, variant): (&str, &str)) {
    let (rows, cols) = full_shape(runner, case.shape);
    let mut row = Row::new(id, variant);
    row.bytes = Some(case.bytes_per * (rows * cols) as u64);
    row.formula = case.formula.to_string();
    row.definition = case.what.to_string();
    match disagreement(runner, case, cols) {
        Some(failure) => (row.status, row.note) = failure,
        None => match time(runner, pool, case, rows, cols) {
            Ok(timing) => row.timing = Some(timing),
            Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
        },
    }
    runner.push(row);
}

/// Inputs on `dev` of `rows x cols`, each bf16 tensor from `data` (flat f32, one per tensor).
fn inputs(
    dev: &Device,
    case: &Case,
    rows: usize,
    cols: usize,
    data: &[Vec<f32>],
    labels: &[i64],
) -> Result<Inputs, Error> {
    let bf16s = case
        .tensors
        .iter()
        .zip(data)
        .map(|(&whole, v)| {
            let shape = if whole { vec![rows, cols] } else { vec![cols] };
            let h: Vec<bf16> = v.iter().map(|&a| bf16::from_f32(a)).collect();
            dev.upload(&h)?.reshape(&shape)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let labels = match case.labels {
        true => Some(dev.upload(labels)?),
        false => None,
    };
    prepared(dev, case, bf16s, labels)
}

/// Why the device's gradients are not the CPU backend's on fresh inputs of `CHECK_ROWS` rows.
fn disagreement(runner: &mut Runner, case: &Case, cols: usize) -> Option<(Status, String)> {
    let rows = CHECK_ROWS;
    let data: Vec<Vec<f32>> = case
        .tensors
        .iter()
        .map(|&whole| {
            let n = if whole { rows * cols } else { cols };
            measure::normal(n, runner.seeds.next())
        })
        .collect();
    let labels: Vec<i64> = (0..rows)
        .map(|_| (runner.seeds.next() % cols as u64) as i64)
        .collect();
    let on = |dev: &Device| -> Result<Vec<Vec<f32>>, Error> {
        let grads = (case.backward)(dev, &inputs(dev, case, rows, cols, &data, &labels)?)?;
        grads.iter().map(Grad::values).collect()
    };
    let (got, want) = match on(&runner.dev).and_then(|got| Ok((got, on(&Device::cpu())?))) {
        Ok(both) => both,
        Err(e) => return Some((Status::Error, e.to_string())),
    };
    for (k, ((got, want), &sum)) in got.iter().zip(&want).zip(case.sums).enumerate() {
        let largest = want.iter().fold(0.0f64, |m, &w| m.max(f64::from(w).abs()));
        let mut extra = if sum { SUM_REL * largest } else { 0.0 };
        if CANCELS.contains(&case.id) {
            extra += CANCEL_REL * largest;
        }
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol =
                2.0 * f64::from(f32::from(bf16::EPSILON)) * f64::from(w).abs() + extra + 1e-30;
            let ok = (f64::from(g) - f64::from(w)).abs() <= tol; // false for NaN
            if !ok {
                let why =
                    format!("gradient {k}, index {i}: got {g:e}, CPU {w:e} (tolerance {tol:.1e})");
                return Some((Status::Failed, why));
            }
        }
    }
    None
}

/// The device time of the backward at `rows x cols`, on normal inputs from the pool (cast to
/// bf16 on the device) and fresh small ones.
fn time(
    runner: &mut Runner,
    pool: &mut Pool,
    case: &Case,
    rows: usize,
    cols: usize,
) -> Result<Timing, Error> {
    let dev = runner.dev.clone();
    let whole = case.tensors.iter().filter(|&&w| w).count();
    let mut big = pool
        .draw(&dev, rows * cols, whole, &mut runner.seeds)?
        .into_iter();
    let mut bf16s = vec![];
    for &w in case.tensors {
        let tensor = match w {
            true => bf16::cast(&big.next().expect("drawn"))?.reshape(&[rows, cols])?,
            false => {
                let v = measure::normal(cols, runner.seeds.next());
                let h: Vec<bf16> = v.into_iter().map(bf16::from_f32).collect();
                dev.upload(&h)?.reshape(&[cols])?
            }
        };
        bf16s.push(tensor);
    }
    let labels = match case.labels {
        true => {
            let l: Vec<i64> = (0..rows)
                .map(|_| (runner.seeds.next() % cols as u64) as i64)
                .collect();
            Some(dev.upload(&l)?)
        }
        false => None,
    };
    let inputs = prepared(&dev, case, bf16s, labels)?;
    runner.time_runs(|_| (case.backward)(&dev, &inputs).map(drop))
}

/// The inputs, with what `case.prepare` makes of them.
fn prepared(
    dev: &Device,
    case: &Case,
    bf16s: Vec<Buffer<bf16>>,
    labels: Option<Buffer<i64>>,
) -> Result<Inputs, Error> {
    let mut inputs = Inputs {
        bf16s,
        labels,
        saved: None,
    };
    if let Some(prepare) = case.prepare {
        inputs.saved = Some(prepare(dev, &inputs)?);
    }
    Ok(inputs)
}
