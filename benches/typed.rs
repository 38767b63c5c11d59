//! The workloads over several element types: S2 (reductions in every direction), S3 (16-bit
//! elementwise kernels and a broadcast over heads), W11 (the sum over the leading dim) and V1
//! (vLLM's `silu_and_mul` in bf16, WORKLOADS.md's shape), with the shapes, types and byte counts
//! of `shared/bench/peers.py`. Fused only, like S1's sweep: one
//! `fuse!` fn per kernel and type, since the language has no generics.
//!
//! Each row is checked on a small problem of its shape family against the same kernel on the CPU
//! backend, compared in f32 within two ulps of its output type, then timed over S1's number of
//! elements (`Sizes::sweep_total`). The full-size inputs of type `T` come from a pool of f32
//! normals drawn once and cast on the device: drawing and uploading 2^28 normals takes seconds,
//! and one flat buffer reshapes to every `rows x cols` of its length.

use fuse_runtime::{bf16, f16, Buffer, Device, Element, Error};

use crate::kernels::*;
use crate::measure::{self, Seeds, Timing};
use crate::report::{Row, Status};
use crate::runner::{Runner, ROTATE_BELOW};

/// A float type the typed rows run in: f32, bf16 or f16.
pub trait Float: Element {
    /// The distance from 1.0 to the next number: an ulp, relative.
    const EPSILON: f64;
    /// The smallest positive (subnormal) number: an ulp near zero.
    const TINY: f64;

    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;

    /// `x` rounded to this type on its device (for f32, another handle to `x`).
    fn cast(x: &Buffer<f32>) -> Result<Buffer<Self>, Error>;
}

impl Float for f32 {
    const EPSILON: f64 = f32::EPSILON as f64;
    const TINY: f64 = f32::from_bits(1) as f64;

    fn from_f32(v: f32) -> f32 {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn cast(x: &Buffer<f32>) -> Result<Buffer<f32>, Error> {
        x.reshape(x.shape())
    }
}

impl Float for bf16 {
    const EPSILON: f64 = bf16::EPSILON.to_f64_const();
    const TINY: f64 = bf16::from_bits(1).to_f64_const();

    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn cast(x: &Buffer<f32>) -> Result<Buffer<bf16>, Error> {
        to_bf16(x.device(), &x.reshape(&[x.len()])?)?.reshape(x.shape())
    }
}

impl Float for f16 {
    const EPSILON: f64 = f16::EPSILON.to_f64_const();
    const TINY: f64 = f16::from_bits(1).to_f64_const();

    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn cast(x: &Buffer<f32>) -> Result<Buffer<f16>, Error> {
        to_f16(x.device(), &x.reshape(&[x.len()])?)?.reshape(x.shape())
    }
}

/// Ulps of the output type the check allows. The device and the CPU backend round f32 values
/// that may differ in their last bits (CUDA's `expf` against Rust's, a sum in another order), so
/// a 16-bit store can land one ulp apart; the second ulp is margin, and a real bug (a lost
/// element, a wrong row) moves a result by far more.
const ULPS: f64 = 2.0;

/// Ulps of an f32 output the check allows: its value carries the f32 arithmetic's own error (a
/// row's sum in another order than the CPU backend's f64), not one rounding of it. SO's f32
/// softmax parted from the CPU by up to 3 ulps on an H200 at 100-12289 columns; a lost element
/// of a row of 12289 moves its outputs by about 700.
const F32_ULPS: f64 = 16.0;

/// f32's accumulation on the GPU, as a fraction of the magnitudes each output sums (the CPU
/// backend sums in f64). On an H100 the sums differed by under 1e-7 of that; 1e-6 keeps ten
/// times the room and still fails a lost tile of 32 rows in a column of 2^20 normals (off by
/// about 5.7, against a bound of 0.84), where the runtime's tests' 1e-5 would let it pass.
const SUM_REL: f64 = 1e-6;

/// S2's row widths, as peers.py's.
const S2_COLS: [usize; 7] = [2, 32, 256, 1024, 4096, 32768, 262144];
/// SW's row widths: the wide entry's, 32 elements a lane, half a warp a row (512) to two warps.
const SW_COLS: [usize; 3] = [512, 1024, 2048];
/// SO's row lengths, none a power of two: a multiple of four and not of eight (100), of eight
/// (1000, 3000, 5120, 7168: the hidden sizes of larger models, where a 16-bit softmax holds its
/// rows a block a row in vectors of eight), odd (1027, 4095, 12289), across the short, cached,
/// register and streamed rows' lengths; the rows as many as fit in `sweep_total` elements.
const SO_COLS: [usize; 8] = [100, 1000, 1027, 3000, 4095, 5120, 7168, 12289];
/// S2's column-sum heights (the widths follow from the number of elements).
const S2_ROWS: [usize; 4] = [256, 4096, 65536, 1 << 20];
/// S2's GroupNorm `g x c x s` (groups, channels a group, positions): a diffusion UNet's 320
/// channels at 64 x 64, 64 at 32 x 32, and 512 at 8 x 8; the batch takes the rest.
const S2_GROUPS: [[usize; 3]; 3] = [[32, 10, 4096], [32, 2, 1024], [32, 16, 64]];
/// S3's `t x h x d` at 2^28 elements; at fewer, `t` shrinks.
const S3_SHAPES: [[usize; 3]; 3] = [[65536, 32, 128], [16384, 128, 128], [1 << 20, 4, 64]];

/// One row's kernel: `x` of the row's type, the f32 side inputs, and the output.
type Launch<T> = fn(&Device, &Buffer<T>, &[Buffer<f32>], &mut Buffer<T>) -> Result<(), Error>;

/// The shapes of one problem: `x` (of the row's type), the f32 side inputs, and the output (of
/// the row's type).
struct Shapes {
    x: Vec<usize>,
    side: Vec<Vec<usize>>,
    out: Vec<usize>,
}

impl Shapes {
    /// A kernel of `x: [rows, cols]` alone, whose output has the shape `out(rows, cols)`.
    fn grid(rows: usize, cols: usize, out: fn(usize, usize) -> Vec<usize>) -> Shapes {
        let (x, side, out) = (vec![rows, cols], Vec::new(), out(rows, cols));
        Shapes { x, side, out }
    }

    /// The bytes a run must move, as peers.py counts them: each input read once, the output
    /// written once.
    fn bytes<T: Element>(&self) -> u64 {
        let side: usize = self.side.iter().map(|s| len(s)).sum();
        (size_of::<T>() * (len(&self.x) + len(&self.out)) + size_of::<f32>() * side) as u64
    }
}

fn len(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// What the check bounds beyond [`ULPS`].
#[derive(Clone, Copy)]
enum Tolerance {
    /// Nothing: each output is one rounding of an f32 value computed the same way.
    Ulps,
    /// Sums along `axis` of a two-dim `x`: also [`SUM_REL`] of the magnitudes summed.
    Sum { axis: usize },
    /// Also this much absolute: an output whose f32 terms cancel (GroupNorm's `d * rstd * w +
    /// bias` near zero), where the device's f32 and the CPU's f64 statistics part by an ulp of
    /// the terms, not of the output.
    Abs(f64),
}

/// One row: a kernel of element type `T` at one shape.
struct Case<T: Float> {
    id: &'static str,
    label: String,
    /// The definition (JSON only), and the bytes as a formula.
    what: &'static str,
    formula: String,
    full: Shapes,
    check: Shapes,
    tolerance: Tolerance,
    launch: Launch<T>,
}

/// Normal f32 inputs on the device, drawn once and shared by every row of one length.
#[derive(Default)]
pub struct Pool {
    sets: Vec<Buffer<f32>>,
}

impl Pool {
    /// `count` flat buffers of `len` normals, drawing those the pool lacks; a new length
    /// replaces the old buffers (freed first).
    pub fn draw(
        &mut self,
        dev: &Device,
        len: usize,
        count: usize,
        seeds: &mut Seeds,
    ) -> Result<Vec<Buffer<f32>>, Error> {
        if self.sets.first().is_some_and(|b| b.len() != len) {
            self.sets.clear();
        }
        while self.sets.len() < count {
            let set = measure::random_inputs(dev, &[vec![len]], seeds)?;
            self.sets.extend(set);
        }
        self.sets[..count]
            .iter()
            .map(|b| b.reshape(&[len]))
            .collect()
    }
}

/// S2: row sums in f32, bf16 and f16, softmax in bf16 and f16, column sums in all three.
pub fn s2(runner: &mut Runner, pool: &mut Pool) {
    let at = ("S2", &S2_COLS[..]);
    row_sums::<f32>(runner, pool, at, |dev, x, _, y| {
        s2_row_sum_f32::into(dev, x, y)
    });
    row_sums::<bf16>(runner, pool, at, |dev, x, _, y| {
        s2_row_sum_bf16::into(dev, x, y)
    });
    row_sums::<f16>(runner, pool, at, |dev, x, _, y| {
        s2_row_sum_f16::into(dev, x, y)
    });
    softmaxes::<bf16>(runner, pool, "", |dev, x, _, y| {
        s2_softmax_bf16::into(dev, x, y)
    });
    softmaxes::<f16>(runner, pool, "", |dev, x, _, y| {
        s2_softmax_f16::into(dev, x, y)
    });
    // The same with `#[fast_math]`: 16-bit softmax is bound by instructions, the precise `expf`
    // and division among the most.
    softmaxes::<bf16>(runner, pool, "fast_math ", |dev, x, _, y| {
        s2_softmax_bf16_fast::into(dev, x, y)
    });
    softmaxes::<f16>(runner, pool, "fast_math ", |dev, x, _, y| {
        s2_softmax_f16_fast::into(dev, x, y)
    });
    let total = runner.sizes.sweep_total;
    let shapes: Vec<_> = S2_ROWS
        .iter()
        .filter_map(|&rows| Some((rows, split(total, rows)?)))
        .collect();
    let column = ("S2", "column sum");
    column_sums::<f32>(runner, pool, column, &shapes, |dev, x, _, y| {
        s2_column_sum_f32::into(dev, x, y)
    });
    column_sums::<bf16>(runner, pool, column, &shapes, |dev, x, _, y| {
        s2_column_sum_bf16::into(dev, x, y)
    });
    column_sums::<f16>(runner, pool, column, &shapes, |dev, x, _, y| {
        s2_column_sum_f16::into(dev, x, y)
    });
    for gcs in S2_GROUPS {
        group_norm::<bf16>(runner, pool, gcs, |dev, x, side, y| {
            s2_group_norm_bf16::into(dev, x, &side[0], &side[1], y)
        });
    }
}

/// SW: 16-bit rows at the wide entry's widths (rows of up to 2048 elements, a warp or two a
/// row), 512 and 2048 of which S2 leaves out: softmax (a heavy row) and RMSNorm without a
/// weight (a light one), in bf16.
pub fn sw(runner: &mut Runner, pool: &mut Pool) {
    softmaxes_at::<bf16>(runner, pool, ("SW", &SW_COLS), "", |dev, x, _, y| {
        s2_softmax_bf16::into(dev, x, y)
    });
    let rmsnorm = ("rmsnorm ", "y = x * rsqrt(mean_row(x * x) + 1e-6), in f32");
    rows_at::<bf16>(runner, pool, ("SW", &SW_COLS), rmsnorm, |dev, x, _, y| {
        sw_rmsnorm_bf16::into(dev, x, y)
    });
}

/// SO: the S2 and SW kernels (and S1's f32 softmax) at row lengths that are no power of two,
/// where other entries and their remainders run: the f32 and bf16 softmax, bf16 RMSNorm and the
/// f32 and bf16 row sums.
pub fn so(runner: &mut Runner, pool: &mut Pool) {
    // A length at a time, so that the pool's inputs of that length serve all five kernels.
    for cols in SO_COLS {
        let at = ("SO", &[cols][..]);
        softmaxes_at::<f32>(runner, pool, at, "", |dev, x, _, y| {
            w5_softmax::into(dev, x, y)
        });
        softmaxes_at::<bf16>(runner, pool, at, "", |dev, x, _, y| {
            s2_softmax_bf16::into(dev, x, y)
        });
        let rmsnorm = ("rmsnorm ", "y = x * rsqrt(mean_row(x * x) + 1e-6), in f32");
        rows_at::<bf16>(runner, pool, at, rmsnorm, |dev, x, _, y| {
            sw_rmsnorm_bf16::into(dev, x, y)
        });
        row_sums::<f32>(runner, pool, at, |dev, x, _, y| {
            s2_row_sum_f32::into(dev, x, y)
        });
        row_sums::<bf16>(runner, pool, at, |dev, x, _, y| {
            s2_row_sum_bf16::into(dev, x, y)
        });
    }
}

/// GroupNorm over `[b, g, c, s]`, the statistics over `(c, s)`, the weight and bias `[g, c]`
/// in f32.
fn group_norm<T: Float>(runner: &mut Runner, pool: &mut Pool, gcs: [usize; 3], launch: Launch<T>) {
    let [g, c, s] = gcs;
    // As many groups of rows as fit in S1's elements (2^28 is no multiple of 10 * 4096).
    let b = (runner.sizes.sweep_total / (g * c * s)).max(1);
    let shapes = |b| Shapes {
        x: vec![b, g, c, s],
        side: vec![vec![g, c], vec![g, c]],
        out: vec![b, g, c, s],
    };
    let case = Case {
        id: "S2",
        label: format!("group norm {} {b}x{g}x{c}x{s}", T::NAME),
        what: "y = (x - mean) * rsqrt(var + 1e-5) * w[g, c] + bias[g, c], mean and var over (c, s), in f32",
        formula: format!("{}n + 8 g*c", 2 * size_of::<T>()),
        full: shapes(b),
        check: shapes(few(b, runner.sizes.check_n / (g * c * s))),
        // Terms of normals times rstd (up to about 20): 2^-20 of them is 2e-5.
        tolerance: Tolerance::Abs(2e-5),
        launch,
    };
    run(runner, pool, &case);
}

/// S3: softplus in bf16 and f16, then `q[t, h, d] * c[t, d]` for each shape in f32, bf16 and
/// f16 (`c` always f32).
pub fn s3(runner: &mut Runner, pool: &mut Pool) {
    softplus::<bf16>(runner, pool, "", |dev, x, _, y| {
        s3_softplus_bf16::into(dev, x, y)
    });
    softplus::<f16>(runner, pool, "", |dev, x, _, y| {
        s3_softplus_f16::into(dev, x, y)
    });
    // The same with `#[fast_math]`: 16-bit softplus is bound by the precise `expf` and `logf`.
    softplus::<bf16>(runner, pool, "fast_math ", |dev, x, _, y| {
        s3_softplus_bf16_fast::into(dev, x, y)
    });
    softplus::<f16>(runner, pool, "fast_math ", |dev, x, _, y| {
        s3_softplus_f16_fast::into(dev, x, y)
    });
    for [_, h, d] in S3_SHAPES {
        let Some(t) = split(runner.sizes.sweep_total, h * d) else {
            continue;
        };
        let thd = [t, h, d];
        q_times_c::<f32>(runner, pool, thd, |dev, q, c, y| {
            s3_q_times_c_f32::into(dev, q, &c[0], y)
        });
        q_times_c::<bf16>(runner, pool, thd, |dev, q, c, y| {
            s3_q_times_c_bf16::into(dev, q, &c[0], y)
        });
        q_times_c::<f16>(runner, pool, thd, |dev, q, c, y| {
            s3_q_times_c_f16::into(dev, q, &c[0], y)
        });
    }
}

/// V1's `d`, and its `t` at 2^28 elements of `x` or more (WORKLOADS.md: 8192 tokens).
const V1_D: usize = 14336;
const V1_T: usize = 8192;

/// V1: `silu_and_mul` in bf16 on `x: [t, 2 * d]`, its halves read through slices; then the same
/// with `#[fast_math]`.
pub fn v1(runner: &mut Runner, pool: &mut Pool) {
    silu_and_mul(runner, pool, "", |dev, x, _, y| {
        v1_silu_and_mul::into(dev, x, y)
    });
    silu_and_mul(runner, pool, "fast_math ", |dev, x, _, y| {
        v1_silu_and_mul_fast::into(dev, x, y)
    });
}

fn silu_and_mul(runner: &mut Runner, pool: &mut Pool, variant: &str, launch: Launch<bf16>) {
    let s = runner.sizes;
    let t = (s.sweep_total / (2 * V1_D)).clamp(1, V1_T);
    let shapes = |t| Shapes {
        x: vec![t, 2 * V1_D],
        side: Vec::new(),
        out: vec![t, V1_D],
    };
    let case = Case {
        id: "V1",
        label: format!("silu_and_mul {variant}bf16 {t}x(2*{V1_D})"),
        what: "y = silu(x[:, :d]) * x[:, d:], computed in f32",
        formula: "6 t d".into(),
        full: shapes(t),
        check: shapes(few(t, s.check_n / (2 * V1_D))),
        tolerance: Tolerance::Ulps,
        launch,
    };
    run(runner, pool, &case);
}

/// W11: the f32 sum over the leading dim at `rows x cols` and `cols x rows` (S2's kernel).
pub fn w11(runner: &mut Runner, pool: &mut Pool) {
    let s = runner.sizes;
    let shapes = [(s.rows, s.cols), (s.cols, s.rows)];
    column_sums::<f32>(
        runner,
        pool,
        ("W11", "sum over rows"),
        &shapes,
        |dev, x, _, y| s2_column_sum_f32::into(dev, x, y),
    );
}

/// `total / part` when `part` divides `total`.
fn split(total: usize, part: usize) -> Option<usize> {
    (part > 0 && part <= total && total.is_multiple_of(part)).then(|| total / part)
}

/// How many of `full` rows (or columns) the check takes: about `budget`, at least 3, odd
/// where `full` allows, so that the last block or tile is a partial one.
fn few(full: usize, budget: usize) -> usize {
    (budget.max(3) | 1).min(full)
}

/// The rows of `cols` elements that fit in `total` elements, if one does.
fn rows_in(total: usize, cols: usize) -> Option<usize> {
    (cols > 0 && cols <= total).then(|| total / cols)
}

/// Row sums at each of `widths`, as the row `id`.
fn row_sums<T: Float>(
    runner: &mut Runner,
    pool: &mut Pool,
    (id, widths): (&'static str, &[usize]),
    launch: Launch<T>,
) {
    let s = runner.sizes;
    for &cols in widths {
        let Some(rows) = rows_in(s.sweep_total, cols) else {
            continue;
        };
        let e = size_of::<T>();
        let case = Case {
            id,
            label: format!("row sum {} {rows}x{cols}", T::NAME),
            what: "y[r] = sum over c of x[r, c]",
            formula: format!("{e}n + {e} rows"),
            full: Shapes::grid(rows, cols, |r, _| vec![r]),
            check: Shapes::grid(few(rows, s.check_n / cols), cols, |r, _| vec![r]),
            tolerance: Tolerance::Sum { axis: 1 },
            launch,
        };
        run(runner, pool, &case);
    }
}

fn softmaxes<T: Float>(runner: &mut Runner, pool: &mut Pool, variant: &str, launch: Launch<T>) {
    softmaxes_at(runner, pool, ("S2", &S2_COLS), variant, launch);
}

/// Row softmax at each of `widths`, as the row `id`.
fn softmaxes_at<T: Float>(
    runner: &mut Runner,
    pool: &mut Pool,
    at: (&'static str, &[usize]),
    variant: &str,
    launch: Launch<T>,
) {
    let what = "e = exp(x - max_row(x)); y = e / sum_row(e)";
    rows_at(
        runner,
        pool,
        at,
        (&format!("softmax {variant}"), what),
        launch,
    );
}

/// A kernel from whole rows to whole rows at each of `widths`, as the row `id`, labelled
/// `name` and the type.
fn rows_at<T: Float>(
    runner: &mut Runner,
    pool: &mut Pool,
    (id, widths): (&'static str, &[usize]),
    (name, what): (&str, &'static str),
    launch: Launch<T>,
) {
    let s = runner.sizes;
    for &cols in widths {
        let Some(rows) = rows_in(s.sweep_total, cols) else {
            continue;
        };
        let case = Case {
            id,
            label: format!("{name}{} {rows}x{cols}", T::NAME),
            what,
            formula: format!("{}n", 2 * size_of::<T>()),
            full: Shapes::grid(rows, cols, |r, c| vec![r, c]),
            check: Shapes::grid(few(rows, s.check_n / cols), cols, |r, c| vec![r, c]),
            tolerance: Tolerance::Ulps,
            launch,
        };
        run(runner, pool, &case);
    }
}

/// Column sums at each `(rows, cols)`, as the row `id` with labels that start with `name`.
fn column_sums<T: Float>(
    runner: &mut Runner,
    pool: &mut Pool,
    (id, name): (&'static str, &str),
    shapes: &[(usize, usize)],
    launch: Launch<T>,
) {
    let check_n = runner.sizes.check_n;
    for &(rows, cols) in shapes {
        let e = size_of::<T>();
        let case = Case {
            id,
            label: format!("{name} {} {rows}x{cols}", T::NAME),
            what: "y[c] = sum over r of x[r, c]",
            formula: format!("{e}n + {e} cols"),
            full: Shapes::grid(rows, cols, |_, c| vec![c]),
            check: Shapes::grid(rows, few(cols, check_n / rows), |_, c| vec![c]),
            tolerance: Tolerance::Sum { axis: 0 },
            launch,
        };
        run(runner, pool, &case);
    }
}

fn softplus<T: Float>(runner: &mut Runner, pool: &mut Pool, variant: &str, launch: Launch<T>) {
    let s = runner.sizes;
    let flat = |n| Shapes {
        x: vec![n],
        side: Vec::new(),
        out: vec![n],
    };
    let n = s.sweep_total;
    let case = Case {
        id: "S3",
        label: format!("softplus {variant}{} {n}", T::NAME),
        what: "y = ln(exp(x) + 1), computed in f32",
        formula: format!("{}n", 2 * size_of::<T>()),
        full: flat(n),
        check: flat(few(n, s.check_n)),
        tolerance: Tolerance::Ulps,
        launch,
    };
    run(runner, pool, &case);
}

fn q_times_c<T: Float>(runner: &mut Runner, pool: &mut Pool, thd: [usize; 3], launch: Launch<T>) {
    let [t, h, d] = thd;
    let shapes = |t| Shapes {
        x: vec![t, h, d],
        side: vec![vec![t, d]],
        out: vec![t, h, d],
    };
    let case = Case {
        id: "S3",
        label: format!("q*c[t,d] {} {t}x{h}x{d}", T::NAME),
        what: "y[t, h, d] = q[t, h, d] * c[t, d], computed in f32, c in f32",
        formula: format!("{}n + 4 t*d", 2 * size_of::<T>()),
        full: shapes(t),
        check: shapes(few(t, runner.sizes.check_n / (h * d))),
        tolerance: Tolerance::Ulps,
        launch,
    };
    run(runner, pool, &case);
}

/// Checks one row, times it when the check passes, and pushes it.
fn run<T: Float>(runner: &mut Runner, pool: &mut Pool, case: &Case<T>) {
    let mut row = Row::new(case.id, &case.label);
    row.bytes = Some(case.full.bytes::<T>());
    row.formula = case.formula.clone();
    row.definition = case.what.to_string();
    match disagreement(runner, case) {
        Some(failure) => (row.status, row.note) = failure,
        None => match time(runner, pool, case) {
            Ok(timing) => row.timing = Some(timing),
            Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
        },
    }
    runner.push(row);
}

/// Why the kernel on the device does not give the CPU backend's output for fresh inputs of
/// the check's shapes, or `None` when it does.
fn disagreement<T: Float>(runner: &mut Runner, case: &Case<T>) -> Option<(Status, String)> {
    let s = &case.check;
    let x = measure::normal(len(&s.x), runner.seeds.next());
    let x: Vec<T> = x.into_iter().map(T::from_f32).collect();
    let side = s
        .side
        .iter()
        .map(|shape| measure::normal(len(shape), runner.seeds.next()));
    let side: Vec<Vec<f32>> = side.collect();
    let outputs = run_once(&Device::cpu(), case, &x, &side)
        .and_then(|want| Ok((run_once(&runner.dev, case, &x, &side)?, want)));
    match outputs {
        Ok((got, want)) => {
            let bounds = bounds(case, &x, &want);
            let why = compare(&got, &want, &bounds).err();
            why.map(|why| (Status::Failed, why))
        }
        Err(e) => Some((Status::Error, e.to_string())),
    }
}

/// The output of one run on `dev` of the check's problem, written into a NaN-filled buffer
/// (an element left unwritten fails), in f32.
fn run_once<T: Float>(
    dev: &Device,
    case: &Case<T>,
    x: &[T],
    side: &[Vec<f32>],
) -> Result<Vec<f32>, Error> {
    let s = &case.check;
    let x = dev.upload(x)?.reshape(&s.x)?;
    let side = side.iter().zip(&s.side).map(|(data, shape)| {
        let buffer = dev.upload(data)?;
        buffer.reshape(shape)
    });
    let side = side.collect::<Result<Vec<_>, _>>()?;
    let nan = vec![T::from_f32(f32::NAN); len(&s.out)];
    let mut out = dev.upload(&nan)?.reshape(&s.out)?;
    (case.launch)(dev, &x, &side, &mut out)?;
    Ok(out.to_vec()?.into_iter().map(T::to_f32).collect())
}

/// The largest difference from the CPU's `want` the check allows at each output element:
/// [`ULPS`] ulps of `T` ([`F32_ULPS`] of f32; an ulp is at most `EPSILON |want|`, or `TINY`
/// among the subnormals), and for sums [`SUM_REL`] of the magnitudes of the inputs `x` that each
/// output sums.
fn bounds<T: Float>(case: &Case<T>, x: &[T], want: &[f32]) -> Vec<f64> {
    let ulps = if size_of::<T>() == 4 { F32_ULPS } else { ULPS };
    let (summed, abs) = match case.tolerance {
        Tolerance::Ulps => (vec![0.0; want.len()], 0.0),
        Tolerance::Sum { axis } => (abs_sums(x, &case.check.x, axis), 0.0),
        Tolerance::Abs(abs) => (vec![0.0; want.len()], abs),
    };
    let bound = |(w, s): (&f32, f64)| {
        ulps * (T::EPSILON * f64::from(w.abs()) + T::TINY) + SUM_REL * s + abs
    };
    want.iter().zip(summed).map(bound).collect()
}

/// The sums of `|x|` along `axis` of `x: [rows, cols]`, in f64.
fn abs_sums<T: Float>(x: &[T], shape: &[usize], axis: usize) -> Vec<f64> {
    let cols = shape[1];
    let mut sums = vec![0.0; shape[1 - axis]];
    for (i, v) in x.iter().enumerate() {
        let k = if axis == 1 { i / cols } else { i % cols };
        sums[k] += f64::from(v.to_f32().abs());
    }
    sums
}

/// Why `got` is not `want` within `bounds`: the first bad index, both values and the bound.
/// NaN never passes.
fn compare(got: &[f32], want: &[f32], bounds: &[f64]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, want {}", got.len(), want.len()));
    }
    let values = got.iter().zip(want).zip(bounds).enumerate();
    for (index, ((&g, &w), &tol)) in values {
        let ok = (f64::from(g) - f64::from(w)).abs() <= tol; // false for NaN
        if !ok {
            return Err(format!(
                "index {index}: got {g:e}, CPU {w:e} (tolerance {tol:.1e})"
            ));
        }
    }
    Ok(())
}

/// The device time at full size, from the pool's inputs cast to `T` and fresh side inputs,
/// with a second set to rotate with when a run moves under [`ROTATE_BELOW`] bytes, as
/// `Runner::time` does.
fn time<T: Float>(runner: &mut Runner, pool: &mut Pool, case: &Case<T>) -> Result<Timing, Error> {
    let s = &case.full;
    let count = if s.bytes::<T>() < ROTATE_BELOW { 2 } else { 1 };
    let dev = runner.dev.clone();
    let mut sets = Vec::with_capacity(count);
    for x in pool.draw(&dev, len(&s.x), count, &mut runner.seeds)? {
        let side = measure::random_inputs(&dev, &s.side, &mut runner.seeds)?;
        sets.push((T::cast(&x)?.reshape(&s.x)?, side));
    }
    let mut out = dev.zeros::<T>(&s.out)?;
    runner.time_runs(|i| {
        let (x, side) = &sets[i % sets.len()];
        (case.launch)(&dev, x, side, &mut out)
    })
}
