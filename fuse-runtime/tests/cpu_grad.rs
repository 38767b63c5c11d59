//! Derivatives (`#[vjp]`, `#[jvp]`) on the CPU backend: every gradient against central finite
//! differences of the forward in f64, and forward mode against reverse mode
//! (`<J v, u> == <v, J^T u>`), on fresh random inputs of odd sizes.
mod common;
#[path = "common/grad_kernels.rs"]
mod grad_kernels;
use common::Rng;
use fuse_runtime::{bf16, fuse, Buffer, Device};

fuse! {
    #[vjp(x, w, eps)]
    #[jvp(x, w)]
    pub fn rmsnorm(x: [f64; rows, cols], w: [f64; cols], eps: f64) -> [f64; rows, cols] {
        x * rsqrt(mean(x * x, cols) + eps) * w
    }

    /// GroupNorm without its affine: statistics over two dims at once.
    #[vjp(x, eps)]
    #[jvp(x)]
    pub fn group_norm(x: [f64; b, g, c, s], eps: f64) -> [f64; b, g, c, s] {
        let d = x - mean(x, (c, s));
        d * rsqrt(mean(d * d, (c, s)) + eps)
    }

    /// GroupNorm with its per-channel affine: the weight's and bias's gradients sum over the
    /// positions `s`, part of the merged dim `(c, s)`.
    #[vjp(x, w, bias)]
    #[jvp(x, w, bias)]
    pub fn group_norm_affine(x: [f64; b, g, c, s], w: [f64; g, c], bias: [f64; g, c]) -> [f64; b, g, c, s] {
        let d = x - mean(x, (c, s));
        d * rsqrt(mean(d * d, (c, s)) + 1e-5) * w + bias
    }

    /// The weight stored channels first, read through `permute`.
    #[vjp(x, w)]
    pub fn group_norm_permuted(x: [f64; b, g, c, s], w: [f64; c, g]) -> [f64; b, g, c, s] {
        let d = x - mean(x, (c, s));
        d * rsqrt(mean(d * d, (c, s)) + 1e-5) * permute(w, (g, c))
    }

    /// A weight over the first part of a merged dim that has a dim after it, `[(a, b), c]`:
    /// its gradient sums a temporary over `b`, read with the strides of the dims after the
    /// merged one (random program p698's `vjp` read it as if `(a, b)` were last).
    #[vjp(x, w)]
    #[jvp(x, w)]
    pub fn merged_first(x: [f64; a, b, c], w: [f64; a, c]) -> [f64; c] {
        sum(x * w, (a, b))
    }

    /// A bf16 `min` that a later launch reads back: its ties are found there against the
    /// value the first launch compared (random program p833's `vjp` lost the minimum's share
    /// of `s`'s gradient when the temporary was rounded to bf16 and the products were not).
    #[vjp(s, x)]
    #[jvp(s, x)]
    pub fn over_min(s: bf16, x: [bf16; n]) -> bf16 {
        s / min(s * x, n)
    }

    /// A scalar's gradient through a sum over everything, beside values over more dims (`d0`
    /// bound by `z` alone): random program p1381's `vjp` read the sum's temporary before the
    /// launch that writes it, and its `value_and_vjp` merged a block's partial sums (of the
    /// adjoint of `v`, summed over `d0` and `d1`) into the launch that sums everything, where
    /// they have no rows.
    #[vjp(s)]
    #[jvp(s, x, y)]
    pub fn scaled_min(z: [f64; d0, d1, d2], s: f64, x: [f64; d2], y: [f64; d1]) -> [f64; d0, d1, d2] {
        let v = s * x;
        (v * (index(d0) as f64)).min(y).min(sum(y - v, (d1, d2)))
    }

    /// A bf16 sum over the leading dim (of a gather) in an output `value_and_vjp` returns,
    /// which the launch writing the other output, over the same rows, takes as partial sums:
    /// random program p2981 stored them as bf16 (its CPU body did not compile), where they add
    /// in f32 and round once.
    #[vjp(x, b, w)]
    pub fn column_sums_scaled(x: [bf16; r, c], pick: [u8; c], b: [bf16; r], w: [bf16; r], k: [i64; r]) -> ([bf16; r, c], [bf16; r, c]) {
        (sum(-x[pick, ..] - b, r) * w, (k % 7) as bf16 + index(c) as bf16)
    }

    #[vjp(x)]
    #[jvp(x)]
    pub fn softmax(x: [f64; rows, cols]) -> [f64; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }

    #[vjp(x, g, b)]
    #[jvp(x, g, b)]
    pub fn layernorm(x: [f64; rows, cols], g: [f64; cols], b: [f64; cols]) -> ([f64; rows, cols], [f64; rows]) {
        let d = x - mean(x, cols);
        let rstd = rsqrt(mean(d * d, cols) + 1e-5);
        (d * rstd * g + b, rstd)
    }

    #[vjp(x)]
    #[jvp(x)]
    pub fn cross_entropy(x: [f64; rows, cols], label: [i64; rows]) -> [f64; rows] {
        logsumexp(x, cols) - sum(if index(cols) as i64 == label { x } else { 0.0 }, cols)
    }

    #[vjp(x, b)]
    #[jvp(x, b)]
    pub fn row_sums(x: [f64; rows, cols], b: [f64; rows]) -> [f64; rows] {
        sum(x * x + b, cols)
    }

    #[vjp(x, w)]
    #[jvp(x, w)]
    pub fn column_sums(x: [f64; rows, cols], w: [f64; rows]) -> [f64; cols] {
        sum(x * w, rows) + max(x, rows)
    }

    #[vjp(x, s)]
    #[jvp(x, s)]
    pub fn total(x: [f64; n], s: f64) -> f64 {
        logsumexp(x * s) + mean(x * x)
    }

    #[vjp(x, alpha, w)]
    #[jvp(x, alpha, w)]
    pub fn dyt(x: [f64; rows, cols], alpha: f64, w: [f64; cols], b: [f64; cols]) -> [f64; rows, cols] {
        (alpha * x).tanh() * w + b
    }
}

/// Central differences of `f` at `x`, each element in turn.
fn numeric(x: &[f64], f: &dyn Fn(&[f64]) -> f64) -> Vec<f64> {
    (0..x.len())
        .map(|i| {
            let h = 1e-6 * x[i].abs().max(1.0);
            let mut p = x.to_vec();
            p[i] = x[i] + h;
            let up = f(&p);
            p[i] = x[i] - h;
            let down = f(&p);
            (up - down) / (2.0 * h)
        })
        .collect()
}

fn assert_grad(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * scale + 1e-6 * w.abs(),
            "{what}[{i}]: {g} against finite differences {w}"
        );
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn put(dev: &Device, v: &[f64], shape: &[usize]) -> Buffer<f64> {
    common::put(dev, v, shape)
}

fn host(b: &Buffer<f64>) -> Vec<f64> {
    common::host(b)
}

/// A reduction over two dims at once differentiates as one over their merged dim: the
/// gradients in the declared shapes, against finite differences, and forward mode agrees.
#[test]
fn group_norm_gradients_match_finite_differences() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (b, g, c, s) in [(1, 1, 1, 2), (2, 3, 2, 5), (1, 2, 3, 7)] {
        let shape = [b, g, c, s];
        let n = b * g * c * s;
        let x = rng.floats::<f64>(n, -2.0, 2.0);
        let dy = rng.floats::<f64>(n, -1.0, 1.0);
        let eps = rng.uniform(0.1, 0.5);
        let loss = |x: &[f64], eps: f64| {
            let y = group_norm(&dev, &put(&dev, x, &shape), eps).unwrap();
            dot(&host(&y), &dy)
        };
        let grads =
            group_norm::vjp(&dev, &put(&dev, &x, &shape), eps, &put(&dev, &dy, &shape)).unwrap();
        assert_eq!(grads.x.shape(), shape);
        assert_grad("dx", &host(&grads.x), &numeric(&x, &|x| loss(x, eps)));
        assert_grad(
            "deps",
            &host(&grads.eps),
            &numeric(&[eps], &|e| loss(&x, e[0])),
        );
        let v = rng.floats::<f64>(n, -1.0, 1.0);
        let (_, jv) =
            group_norm::jvp(&dev, &put(&dev, &x, &shape), eps, &put(&dev, &v, &shape)).unwrap();
        let (left, right) = (dot(&host(&jv), &dy), dot(&v, &host(&grads.x)));
        assert!(
            (left - right).abs() <= 1e-9 * (1.0 + left.abs()),
            "{left} against {right}"
        );

        // With the affine: `dx` against finite differences, and the tangent along `x`, `w`
        // and `bias` against finite differences of the forward.
        let (w, bias) = (
            rng.floats::<f64>(g * c, 0.5, 1.5),
            rng.floats::<f64>(g * c, -1.0, 1.0),
        );
        let gc = [g, c];
        let run = |a: &[Vec<f64>]| {
            let y = group_norm_affine(
                &dev,
                &put(&dev, &a[0], &shape),
                &put(&dev, &a[1], &gc),
                &put(&dev, &a[2], &gc),
            );
            host(&y.unwrap())
        };
        let grads = group_norm_affine::vjp(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &w, &gc),
            &put(&dev, &bias, &gc),
            &put(&dev, &dy, &shape),
        )
        .unwrap();
        let want = numeric(&x, &|x| {
            dot(&run(&[x.to_vec(), w.clone(), bias.clone()]), &dy)
        });
        assert_grad("affine dx", &host(&grads.x), &want);
        let want = numeric(&w, &|w| {
            dot(&run(&[x.clone(), w.to_vec(), bias.clone()]), &dy)
        });
        assert_grad("affine dw", &host(&grads.w), &want);
        let want = numeric(&bias, &|b| {
            dot(&run(&[x.clone(), w.clone(), b.to_vec()]), &dy)
        });
        assert_grad("affine dbias", &host(&grads.bias), &want);
        let wt: Vec<f64> = (0..c * g).map(|i| w[(i % g) * c + i / g]).collect();
        let runp = |x: &[f64], wt: &[f64]| {
            let y = group_norm_permuted(&dev, &put(&dev, x, &shape), &put(&dev, wt, &[c, g]));
            dot(&host(&y.unwrap()), &dy)
        };
        let gp = group_norm_permuted::vjp(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &wt, &[c, g]),
            &put(&dev, &dy, &shape),
        )
        .unwrap();
        assert_grad(
            "permuted dw",
            &host(&gp.w),
            &numeric(&wt, &|wt| runp(&x, wt)),
        );
        assert_grad("permuted dx", &host(&gp.x), &numeric(&x, &|x| runp(x, &wt)));
        // As doc/language.md says: `dx` with the rows' statistics; the weight's and the
        // bias's sums over `b`, one pass; both summed over `s`.
        assert_eq!(group_norm_affine::VJP_LAUNCHES, 3);
        let (vw, vb) = (
            rng.floats::<f64>(g * c, -1.0, 1.0),
            rng.floats::<f64>(g * c, -1.0, 1.0),
        );
        let (_, jv) = group_norm_affine::jvp(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &w, &gc),
            &put(&dev, &bias, &gc),
            &put(&dev, &v, &shape),
            &put(&dev, &vw, &gc),
            &put(&dev, &vb, &gc),
        )
        .unwrap();
        let want = numeric_tangent(
            &[x.clone(), w.clone(), bias.clone()],
            &[v.clone(), vw, vb],
            &run,
        );
        assert_grad("affine tangent", &host(&jv), &want);
    }
}

#[test]
fn rmsnorm_gradients_match_finite_differences() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(3, 7), (1, 1), (4, 33)] {
        let x = rng.floats::<f64>(rows * cols, -2.0, 2.0);
        let w = rng.floats::<f64>(cols, -2.0, 2.0);
        let dy = rng.floats::<f64>(rows * cols, -1.0, 1.0);
        let eps = rng.uniform(0.1, 0.5);
        let shape = [rows, cols];
        let loss = |x: &[f64], w: &[f64], eps: f64| {
            let y = rmsnorm(&dev, &put(&dev, x, &shape), &put(&dev, w, &[cols]), eps).unwrap();
            dot(&host(&y), &dy)
        };
        let g = rmsnorm::vjp(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &w, &[cols]),
            eps,
            &put(&dev, &dy, &shape),
        )
        .unwrap();
        assert_eq!(g.x.shape(), shape);
        assert_eq!(g.w.shape(), [cols]);
        assert_eq!(g.eps.shape(), [] as [usize; 0]);
        assert_grad("dx", &host(&g.x), &numeric(&x, &|x| loss(x, &w, eps)));
        assert_grad("dw", &host(&g.w), &numeric(&w, &|w| loss(&x, w, eps)));
        assert_grad(
            "deps",
            &host(&g.eps),
            &numeric(&[eps], &|e| loss(&x, &w, e[0])),
        );
        // Forward mode agrees: <J v, u> == <v, J^T u>.
        let (vx, vw) = (
            rng.floats::<f64>(rows * cols, -1.0, 1.0),
            rng.floats::<f64>(cols, -1.0, 1.0),
        );
        let (y, jv) = rmsnorm::jvp(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &w, &[cols]),
            eps,
            &put(&dev, &vx, &shape),
            &put(&dev, &vw, &[cols]),
        )
        .unwrap();
        let forward = rmsnorm(&dev, &put(&dev, &x, &shape), &put(&dev, &w, &[cols]), eps).unwrap();
        assert_eq!(host(&y), host(&forward));
        let left = dot(&host(&jv), &dy);
        let right = dot(&vx, &host(&g.x)) + dot(&vw, &host(&g.w));
        assert!(
            (left - right).abs() <= 1e-9 * left.abs().max(1.0),
            "{left} {right}"
        );
        // The other forms give the same bits.
        let (y2, g2) = rmsnorm::value_and_vjp(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &w, &[cols]),
            eps,
            &put(&dev, &dy, &shape),
        )
        .unwrap();
        assert_eq!(host(&y2), host(&forward));
        assert_eq!(host(&g2.x), host(&g.x));
        assert_eq!(host(&g2.w), host(&g.w));
        let (y3, saved) =
            rmsnorm::forward_train(&dev, &put(&dev, &x, &shape), &put(&dev, &w, &[cols]), eps)
                .unwrap();
        assert_eq!(host(&y3), host(&forward));
        let g3 = rmsnorm::backward(&dev, &saved, &put(&dev, &dy, &shape)).unwrap();
        assert_eq!(host(&g3.x), host(&g.x));
        assert_eq!(host(&g3.eps), host(&g.eps));
    }
}

/// Checks reverse mode against finite differences and forward mode against reverse mode for a
/// kernel of tensor inputs `inputs` (each `(values, shape, differentiated)`): `run` is the
/// forward, `vjp` the gradients of the differentiated inputs given the cotangents, `jvp` the
/// tangent outputs given tangents of the differentiated inputs.
struct Case<'a> {
    what: &'a str,
    inputs: Vec<(Vec<f64>, Vec<usize>)>,
    outputs: Vec<Vec<usize>>,
    run: Run<'a>,
    vjp: Pair<'a>,
    jvp: Pair<'a>,
}

/// Buffers' values, one `Vec` each.
type Values = Vec<Vec<f64>>;
/// The forward, from the inputs' values.
type Run<'a> = &'a dyn Fn(&[Vec<f64>]) -> Values;
/// A derivative, from the inputs' values and the cotangents or tangents.
type Pair<'a> = &'a dyn Fn(&[Vec<f64>], &[Vec<f64>]) -> Values;

fn check(case: Case, rng: &mut Rng) {
    let values: Vec<Vec<f64>> = case.inputs.iter().map(|(v, _)| v.clone()).collect();
    let cot: Vec<Vec<f64>> = case
        .outputs
        .iter()
        .map(|s| rng.floats::<f64>(s.iter().product(), -1.0, 1.0))
        .collect();
    let loss = |vals: &[Vec<f64>]| -> f64 {
        (case.run)(vals)
            .iter()
            .zip(&cot)
            .map(|(o, c)| dot(o, c))
            .sum()
    };
    let grads = (case.vjp)(&values, &cot);
    for (i, g) in grads.iter().enumerate() {
        let want = numeric(&values[i], &|v| {
            let mut vals = values.clone();
            vals[i] = v.to_vec();
            loss(&vals)
        });
        assert_grad(&format!("{} d{i}", case.what), g, &want);
    }
    let tangents: Vec<Vec<f64>> = grads
        .iter()
        .map(|g| rng.floats::<f64>(g.len(), -1.0, 1.0))
        .collect();
    let jv = (case.jvp)(&values, &tangents);
    let left: f64 = jv.iter().zip(&cot).map(|(t, c)| dot(t, c)).sum();
    let right: f64 = tangents.iter().zip(&grads).map(|(t, g)| dot(t, g)).sum();
    assert!(
        (left - right).abs() <= 1e-9 * left.abs().max(right.abs()).max(1.0),
        "{}: <J v, u> = {left} but <v, J^T u> = {right}",
        case.what
    );
}

#[test]
fn row_kernels_gradients_match_finite_differences() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(3, 7), (2, 1), (5, 17)] {
        let s = vec![rows, cols];
        let p = |v: &[f64], shape: &[usize]| put(&dev, v, shape);
        let x = rng.floats::<f64>(rows * cols, -3.0, 3.0);
        check(
            Case {
                what: "softmax",
                inputs: vec![(x.clone(), s.clone())],
                outputs: vec![s.clone()],
                run: &|v| vec![host(&softmax(&dev, &p(&v[0], &s)).unwrap())],
                vjp: &|v, c| {
                    let g = softmax::vjp(&dev, &p(&v[0], &s), &p(&c[0], &s)).unwrap();
                    vec![host(&g.x)]
                },
                jvp: &|v, t| {
                    let (_, j) = softmax::jvp(&dev, &p(&v[0], &s), &p(&t[0], &s)).unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let (g, b) = (
            rng.floats::<f64>(cols, -2.0, 2.0),
            rng.floats::<f64>(cols, -2.0, 2.0),
        );
        let c = vec![cols];
        check(
            Case {
                what: "layernorm",
                inputs: vec![(x.clone(), s.clone()), (g, c.clone()), (b, c.clone())],
                outputs: vec![s.clone(), vec![rows]],
                run: &|v| {
                    let (y, r) =
                        layernorm(&dev, &p(&v[0], &s), &p(&v[1], &c), &p(&v[2], &c)).unwrap();
                    vec![host(&y), host(&r)]
                },
                vjp: &|v, d| {
                    let g = layernorm::vjp(
                        &dev,
                        &p(&v[0], &s),
                        &p(&v[1], &c),
                        &p(&v[2], &c),
                        &p(&d[0], &s),
                        &p(&d[1], &[rows]),
                    )
                    .unwrap();
                    vec![host(&g.x), host(&g.g), host(&g.b)]
                },
                jvp: &|v, t| {
                    let (_, _, ty, tr) = layernorm::jvp(
                        &dev,
                        &p(&v[0], &s),
                        &p(&v[1], &c),
                        &p(&v[2], &c),
                        &p(&t[0], &s),
                        &p(&t[1], &c),
                        &p(&t[2], &c),
                    )
                    .unwrap();
                    vec![host(&ty), host(&tr)]
                },
            },
            &mut rng,
        );
        let label: Vec<i64> = (0..rows).map(|_| rng.below(cols as u64) as i64).collect();
        let l = common::put(&dev, &label, &[rows]);
        check(
            Case {
                what: "cross_entropy",
                inputs: vec![(x.clone(), s.clone())],
                outputs: vec![vec![rows]],
                run: &|v| vec![host(&cross_entropy(&dev, &p(&v[0], &s), &l).unwrap())],
                vjp: &|v, d| {
                    let g =
                        cross_entropy::vjp(&dev, &p(&v[0], &s), &l, &p(&d[0], &[rows])).unwrap();
                    vec![host(&g.x)]
                },
                jvp: &|v, t| {
                    let (_, j) =
                        cross_entropy::jvp(&dev, &p(&v[0], &s), &l, &p(&t[0], &s)).unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let bias = rng.floats::<f64>(rows, -1.0, 1.0);
        let r = vec![rows];
        check(
            Case {
                what: "row_sums",
                inputs: vec![(x.clone(), s.clone()), (bias.clone(), r.clone())],
                outputs: vec![r.clone()],
                run: &|v| vec![host(&row_sums(&dev, &p(&v[0], &s), &p(&v[1], &r)).unwrap())],
                vjp: &|v, d| {
                    let g =
                        row_sums::vjp(&dev, &p(&v[0], &s), &p(&v[1], &r), &p(&d[0], &r)).unwrap();
                    vec![host(&g.x), host(&g.b)]
                },
                jvp: &|v, t| {
                    let (_, j) = row_sums::jvp(
                        &dev,
                        &p(&v[0], &s),
                        &p(&v[1], &r),
                        &p(&t[0], &s),
                        &p(&t[1], &r),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        check(
            Case {
                what: "column_sums",
                inputs: vec![(x.clone(), s.clone()), (bias.clone(), r.clone())],
                outputs: vec![c.clone()],
                run: &|v| {
                    vec![host(
                        &column_sums(&dev, &p(&v[0], &s), &p(&v[1], &r)).unwrap(),
                    )]
                },
                vjp: &|v, d| {
                    let g = column_sums::vjp(&dev, &p(&v[0], &s), &p(&v[1], &r), &p(&d[0], &c))
                        .unwrap();
                    vec![host(&g.x), host(&g.w)]
                },
                jvp: &|v, t| {
                    let (_, j) = column_sums::jvp(
                        &dev,
                        &p(&v[0], &s),
                        &p(&v[1], &r),
                        &p(&t[0], &s),
                        &p(&t[1], &r),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
    }
}

#[test]
fn scalar_parameters_and_full_reductions_have_gradients() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in [1, 5, 37] {
        let x = rng.floats::<f64>(n, -2.0, 2.0);
        let s = rng.uniform(0.5, 1.5);
        let p = |v: &[f64], shape: &[usize]| put(&dev, v, shape);
        check(
            Case {
                what: "total",
                inputs: vec![(x.clone(), vec![n]), (vec![s], vec![])],
                outputs: vec![vec![]],
                run: &|v| {
                    vec![vec![
                        total(&dev, &p(&v[0], &[n]), v[1][0])
                            .unwrap()
                            .to_vec()
                            .unwrap()[0],
                    ]]
                },
                vjp: &|v, d| {
                    let g = total::vjp(&dev, &p(&v[0], &[n]), v[1][0], &p(&d[0], &[])).unwrap();
                    vec![host(&g.x), host(&g.s)]
                },
                jvp: &|v, t| {
                    let (_, j) =
                        total::jvp(&dev, &p(&v[0], &[n]), v[1][0], &p(&t[0], &[n]), t[1][0])
                            .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
    }
    for (rows, cols) in [(3, 5), (1, 9)] {
        let s = vec![rows, cols];
        let c = vec![cols];
        let p = |v: &[f64], shape: &[usize]| put(&dev, v, shape);
        let b = rng.floats::<f64>(cols, -1.0, 1.0);
        check(
            Case {
                what: "dyt",
                inputs: vec![
                    (rng.floats::<f64>(rows * cols, -2.0, 2.0), s.clone()),
                    (vec![rng.uniform(0.3, 1.0)], vec![]),
                    (rng.floats::<f64>(cols, -2.0, 2.0), c.clone()),
                ],
                outputs: vec![s.clone()],
                run: &|v| {
                    vec![host(
                        &dyt(&dev, &p(&v[0], &s), v[1][0], &p(&v[2], &c), &p(&b, &c)).unwrap(),
                    )]
                },
                vjp: &|v, d| {
                    let g = dyt::vjp(
                        &dev,
                        &p(&v[0], &s),
                        v[1][0],
                        &p(&v[2], &c),
                        &p(&b, &c),
                        &p(&d[0], &s),
                    )
                    .unwrap();
                    vec![host(&g.x), host(&g.alpha), host(&g.w)]
                },
                jvp: &|v, t| {
                    let (_, j) = dyt::jvp(
                        &dev,
                        &p(&v[0], &s),
                        v[1][0],
                        &p(&v[2], &c),
                        &p(&b, &c),
                        &p(&t[0], &s),
                        t[1][0],
                        &p(&t[2], &c),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
    }
}

/// `forward_train` gives the forward's outputs and `backward` `vjp`'s gradients, the same bits
/// though it reads the values the forward saved (a row's statistics, a mask) instead of
/// computing them; and it moves fewer bytes where the docs say it saves a mask.
#[test]
fn training_pairs_give_the_forwards_outputs_and_vjps_gradients() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(3, 7), (1, 1), (5, 33)] {
        let s = [rows, cols];
        let x = rng.floats::<f64>(rows * cols, -2.0, 2.0);
        let w = rng.floats::<f64>(cols, -2.0, 2.0);
        let b = rng.floats::<f64>(cols, -2.0, 2.0);
        let dy = rng.floats::<f64>(rows * cols, -1.0, 1.0);
        let dr = rng.floats::<f64>(rows, -1.0, 1.0);
        let (px, pw, pb) = (
            put(&dev, &x, &s),
            put(&dev, &w, &[cols]),
            put(&dev, &b, &[cols]),
        );
        let (pdy, pdr) = (put(&dev, &dy, &s), put(&dev, &dr, &[rows]));

        let (y, r) = layernorm(&dev, &px, &pw, &pb).unwrap();
        let ((y2, r2, saved), g) = (
            layernorm::forward_train(&dev, &px, &pw, &pb).unwrap(),
            layernorm::vjp(&dev, &px, &pw, &pb, &pdy, &pdr).unwrap(),
        );
        assert_eq!(
            (host(&y2), host(&r2)),
            (host(&y), host(&r)),
            "layernorm forward"
        );
        let g2 = layernorm::backward(&dev, &saved, &pdy, &pdr).unwrap();
        assert_eq!(host(&g2.x), host(&g.x), "layernorm dx");
        assert_eq!(host(&g2.g), host(&g.g), "layernorm dg");
        assert_eq!(host(&g2.b), host(&g.b), "layernorm db");

        let (y2, saved) = softmax::forward_train(&dev, &px).unwrap();
        assert_eq!(
            host(&y2),
            host(&softmax(&dev, &px).unwrap()),
            "softmax forward"
        );
        let g = softmax::vjp(&dev, &px, &pdy).unwrap();
        let g2 = softmax::backward(&dev, &saved, &pdy).unwrap();
        assert_eq!(host(&g2.x), host(&g.x), "softmax dx");

        let label: Vec<i64> = (0..rows).map(|_| rng.below(cols as u64) as i64).collect();
        let pl = common::put(&dev, &label, &[rows]);
        let (l2, saved) = cross_entropy::forward_train(&dev, &px, &pl).unwrap();
        assert_eq!(host(&l2), host(&cross_entropy(&dev, &px, &pl).unwrap()));
        let g = cross_entropy::vjp(&dev, &px, &pl, &pdr).unwrap();
        let g2 = cross_entropy::backward(&dev, &saved, &pdr).unwrap();
        assert_eq!(host(&g2.x), host(&g.x), "cross_entropy dx");

        let alpha = rng.uniform(0.3, 1.0);
        let (_, saved) = dyt::forward_train(&dev, &px, alpha, &pw, &pb).unwrap();
        let g = dyt::vjp(&dev, &px, alpha, &pw, &pb, &pdy).unwrap();
        let g2 = dyt::backward(&dev, &saved, &pdy).unwrap();
        assert_eq!(host(&g2.x), host(&g.x), "dyt dx");
        assert_eq!(host(&g2.alpha), host(&g.alpha), "dyt dalpha");
        assert_eq!(host(&g2.w), host(&g.w), "dyt dw");

        let eps = rng.uniform(0.1, 0.5);
        let (_, saved) = rmsnorm::forward_train(&dev, &px, &pw, eps).unwrap();
        let g = rmsnorm::vjp(&dev, &px, &pw, eps, &pdy).unwrap();
        let g2 = rmsnorm::backward(&dev, &saved, &pdy).unwrap();
        assert_eq!(host(&g2.x), host(&g.x), "rmsnorm dx");
        assert_eq!(host(&g2.w), host(&g.w), "rmsnorm dw");
        assert_eq!(host(&g2.eps), host(&g.eps), "rmsnorm deps");

        let pr = put(&dev, &dr, &[rows]);
        let (y2, saved) = row_sums::forward_train(&dev, &px, &pr).unwrap();
        assert_eq!(host(&y2), host(&row_sums(&dev, &px, &pr).unwrap()));
        let g = row_sums::vjp(&dev, &px, &pr, &pdr).unwrap();
        let g2 = row_sums::backward(&dev, &saved, &pdr).unwrap();
        assert_eq!(
            (host(&g2.x), host(&g2.b)),
            (host(&g.x), host(&g.b)),
            "row_sums"
        );

        let dc = rng.floats::<f64>(cols, -1.0, 1.0);
        let pdc = put(&dev, &dc, &[cols]);
        let (y2, saved) = column_sums::forward_train(&dev, &px, &pr).unwrap();
        assert_eq!(host(&y2), host(&column_sums(&dev, &px, &pr).unwrap()));
        let g = column_sums::vjp(&dev, &px, &pr, &pdc).unwrap();
        let g2 = column_sums::backward(&dev, &saved, &pdc).unwrap();
        assert_eq!(
            (host(&g2.x), host(&g2.w)),
            (host(&g.x), host(&g.w)),
            "column_sums"
        );

        let n = rows * cols;
        let (flat, s1) = (put(&dev, &x, &[n]), rng.uniform(0.5, 1.5));
        let d0 = put(&dev, &[rng.uniform(-1.0, 1.0)], &[]);
        let (t2, saved) = total::forward_train(&dev, &flat, s1).unwrap();
        assert_eq!(host(&t2), host(&total(&dev, &flat, s1).unwrap()));
        let g = total::vjp(&dev, &flat, s1, &d0).unwrap();
        let g2 = total::backward(&dev, &saved, &d0).unwrap();
        assert_eq!(
            (host(&g2.x), host(&g2.s)),
            (host(&g.x), host(&g.s)),
            "total"
        );

        // In bf16: the saved rstd is the f32 value the recomputation has.
        let half = |v: &[f64]| v.iter().map(|&a| bf16::from_f64(a)).collect::<Vec<_>>();
        let (xb, wb, dyb) = (
            common::put(&dev, &half(&x), &s),
            common::put(&dev, &half(&w), &[cols]),
            common::put(&dev, &half(&dy), &s),
        );
        let (y2, saved) = grad_kernels::rmsnorm_bf16::forward_train(&dev, &xb, &wb).unwrap();
        let y = grad_kernels::rmsnorm_bf16(&dev, &xb, &wb).unwrap();
        assert_eq!(common::host(&y2), common::host(&y), "bf16 rmsnorm forward");
        let g = grad_kernels::rmsnorm_bf16::vjp(&dev, &xb, &wb, &dyb).unwrap();
        let g2 = grad_kernels::rmsnorm_bf16::backward(&dev, &saved, &dyb).unwrap();
        assert_eq!(common::host(&g2.x), common::host(&g.x), "bf16 rmsnorm dx");
        assert_eq!(common::host(&g2.w), common::host(&g.w), "bf16 rmsnorm dw");
    }
    // `relu(x1 + x2 + x3 + x4)`: the mask saved, and fewer bytes moved.
    use grad_kernels::relu4;
    for n in [1, 7, 1001] {
        let xs: Vec<Buffer<f32>> = (0..4)
            .map(|_| common::put(&dev, &rng.floats::<f32>(n, -1.0, 1.0), &[n]))
            .collect();
        let dy = common::put(&dev, &rng.floats::<f32>(n, -1.0, 1.0), &[n]);
        let (y, saved) = relu4::forward_train(&dev, &xs[0], &xs[1], &xs[2], &xs[3]).unwrap();
        let want = relu4(&dev, &xs[0], &xs[1], &xs[2], &xs[3]).unwrap();
        assert_eq!(common::host(&y), common::host(&want));
        let g = relu4::vjp(&dev, &xs[0], &xs[1], &xs[2], &xs[3], &dy).unwrap();
        let g2 = relu4::backward(&dev, &saved, &dy).unwrap();
        assert_eq!(common::host(&g2.x1), common::host(&g.x1));
        // The gradient itself: `dy` where the sum is positive.
        let (ys, dys) = (common::host(&y), common::host(&dy));
        let dx: Vec<f32> = ys
            .iter()
            .zip(&dys)
            .map(|(&y, &d)| if y > 0.0 { d } else { 0.0 })
            .collect();
        assert_eq!(common::host(&g2.x1), dx);
    }
    assert_eq!(
        (relu4::VJP_BYTES_PER_ELEMENT, relu4::TRAIN_BYTES_PER_ELEMENT),
        (24.0, 8.25),
        "vjp reads x1..x4 and dy and writes dx1; the pair writes a mask of packed bits, reads \
         it and dy, and writes dx1"
    );
    assert_eq!(relu4::BACKWARD_LAUNCHES, 1);
    // In bf16 over `[t, h]`: the bits of rows of odd lengths.
    use grad_kernels::relu3_bf16;
    for (t, h) in [(1, 1), (3, 7), (5, 33), (17, 100)] {
        let s = [t, h];
        let xs: Vec<Buffer<bf16>> = (0..3)
            .map(|_| {
                let v: Vec<bf16> = rng
                    .floats::<f32>(t * h, -1.0, 1.0)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect();
                common::put(&dev, &v, &s)
            })
            .collect();
        let dv: Vec<bf16> = rng
            .floats::<f32>(t * h, -1.0, 1.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let dy = common::put(&dev, &dv, &s);
        let (y, saved) = relu3_bf16::forward_train(&dev, &xs[0], &xs[1], &xs[2]).unwrap();
        let g = relu3_bf16::vjp(&dev, &xs[0], &xs[1], &xs[2], &dy).unwrap();
        let g2 = relu3_bf16::backward(&dev, &saved, &dy).unwrap();
        assert_eq!(
            common::host(&g2.a),
            common::host(&g.a),
            "relu3_bf16 {t}x{h}"
        );
        // `dy` where the sum is positive (bf16 keeps f32's exponents: so is `y`), else zero.
        let want: Vec<bf16> = common::host(&y)
            .iter()
            .zip(&dv)
            .map(|(&y, &d)| if y.to_f32() > 0.0 { d } else { bf16::ZERO })
            .collect();
        assert_eq!(common::host(&g2.a), want, "relu3_bf16 {t}x{h}");
    }
    assert_eq!(relu3_bf16::TRAIN_BYTES_PER_ELEMENT, 4.25);
}

#[test]
fn launch_counts() {
    for (name, v, b, j) in [
        (
            "rmsnorm",
            rmsnorm::VJP_LAUNCHES,
            rmsnorm::VALUE_AND_VJP_LAUNCHES,
            rmsnorm::JVP_LAUNCHES,
        ),
        (
            "softmax",
            softmax::VJP_LAUNCHES,
            softmax::VALUE_AND_VJP_LAUNCHES,
            softmax::JVP_LAUNCHES,
        ),
        (
            "layernorm",
            layernorm::VJP_LAUNCHES,
            layernorm::VALUE_AND_VJP_LAUNCHES,
            layernorm::JVP_LAUNCHES,
        ),
        (
            "cross_entropy",
            cross_entropy::VJP_LAUNCHES,
            cross_entropy::VALUE_AND_VJP_LAUNCHES,
            cross_entropy::JVP_LAUNCHES,
        ),
        (
            "row_sums",
            row_sums::VJP_LAUNCHES,
            row_sums::VALUE_AND_VJP_LAUNCHES,
            row_sums::JVP_LAUNCHES,
        ),
        (
            "column_sums",
            column_sums::VJP_LAUNCHES,
            column_sums::VALUE_AND_VJP_LAUNCHES,
            column_sums::JVP_LAUNCHES,
        ),
        (
            "total",
            total::VJP_LAUNCHES,
            total::VALUE_AND_VJP_LAUNCHES,
            total::JVP_LAUNCHES,
        ),
        (
            "dyt",
            dyt::VJP_LAUNCHES,
            dyt::VALUE_AND_VJP_LAUNCHES,
            dyt::JVP_LAUNCHES,
        ),
    ] {
        println!("{name}: vjp {v}, value_and_vjp {b}, jvp {j}");
    }
}

// Every differentiable function, six a kernel, on inputs in (0.1, 0.9) (shifted where the
// function needs it), with the gradient of each checked on its own (one-hot cotangents).
fuse! {
    #[vjp(x)] #[jvp(x)]
    pub fn funcs1(x: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        (x.exp(), x.exp2(), x.ln(), x.log2(), x.log10(), x.sqrt())
    }
    #[vjp(x)] #[jvp(x)]
    pub fn funcs2(x: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        (x.cbrt(), x.recip(), x.sin(), x.cos(), x.tan(), x.sinh())
    }
    #[vjp(x)] #[jvp(x)]
    pub fn funcs3(x: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        (x.cosh(), x.tanh(), x.asin(), x.acos(), x.atan(), x.asinh())
    }
    #[vjp(x)] #[jvp(x)]
    pub fn funcs4(x: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        ((x + 1.5).acosh(), x.atanh(), x.exp_m1(), x.ln_1p(), (x + 0.3).fract(), x.to_degrees())
    }
    #[vjp(x)] #[jvp(x)]
    pub fn funcs5(x: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        (x.to_radians(), (x - 0.5).abs(), sigmoid(x - 0.5), relu(x - 0.5), gelu(x - 0.5), gelu_tanh(x - 0.5))
    }
    #[vjp(x)] #[jvp(x)]
    pub fn funcs6(x: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        (silu(x - 0.5), softplus(x - 0.5), erf(x - 0.5), rsqrt(x), x.powi(3), (x * 4.0).floor() + x.signum())
    }
    #[vjp(x, y)] #[jvp(x, y)]
    pub fn funcs7(x: [f64; n], y: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        (x.atan2(y - 0.5), x.powf(y), x.hypot(y), x.copysign(y - 0.5), x.log(y + 1.5), x.mul_add(y, x))
    }
    #[vjp(x, y, z)] #[jvp(x, y, z)]
    pub fn funcs8(x: [f64; n], y: [f64; n], z: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n], [f64; n], [f64; n]) {
        (x.max(y), x.min(y), x.clamp(y - 0.4, z + 0.4), x / y, x % (y * 0.3), if x > y { x * z } else { y - z })
    }
}

/// The six outputs of a `funcs` kernel as vectors.
macro_rules! six {
    ($t:expr) => {{
        let (a, b, c, d, e, f) = $t;
        vec![host(&a), host(&b), host(&c), host(&d), host(&e), host(&f)]
    }};
}

#[test]
fn every_function_has_its_derivative() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let n = 23;
    let s = [n];
    let p = |v: &[f64]| put(&dev, v, &s);
    // Away from the kinks of abs, relu, fract, floor and signum, and from ties of max and min.
    let mut x = rng.floats::<f64>(n, 0.1, 0.9);
    for v in &mut x {
        if (*v - 0.5).abs() < 0.02
            || ((*v + 0.3).fract()).abs() < 0.02
            || ((*v * 4.0).fract()).abs() < 0.02
        {
            *v += 0.031;
        }
    }
    let y = rng.floats::<f64>(n, 0.1, 0.9);
    let z = rng.floats::<f64>(n, 0.1, 0.9);
    // One output's cotangent at a time, so that each function's derivative is checked alone.
    let one_hot = |k: usize, c: &[Vec<f64>]| -> Values {
        (0..6)
            .map(|j| if j == k { c[j].clone() } else { vec![0.0; n] })
            .collect()
    };
    macro_rules! unary {
        ($k:ident) => {
            for out in 0..6 {
                check(
                    Case {
                        what: &format!("{} output {out}", stringify!($k)),
                        inputs: vec![(x.clone(), s.to_vec())],
                        outputs: vec![s.to_vec(); 6],
                        run: &|v| one_hot(out, &six!($k(&dev, &p(&v[0])).unwrap())),
                        vjp: &|v, c| {
                            let c = one_hot(out, c);
                            let g = $k::vjp(
                                &dev,
                                &p(&v[0]),
                                &p(&c[0]),
                                &p(&c[1]),
                                &p(&c[2]),
                                &p(&c[3]),
                                &p(&c[4]),
                                &p(&c[5]),
                            )
                            .unwrap();
                            vec![host(&g.x)]
                        },
                        jvp: &|v, t| {
                            let (_, _, _, _, _, _, a, b, c, d, e, f) =
                                $k::jvp(&dev, &p(&v[0]), &p(&t[0])).unwrap();
                            let all =
                                vec![host(&a), host(&b), host(&c), host(&d), host(&e), host(&f)];
                            one_hot(out, &all)
                        },
                    },
                    &mut rng,
                );
            }
        };
    }
    unary!(funcs1);
    unary!(funcs2);
    unary!(funcs3);
    unary!(funcs4);
    unary!(funcs5);
    unary!(funcs6);
    for out in 0..6 {
        check(
            Case {
                what: &format!("funcs7 output {out}"),
                inputs: vec![(x.clone(), s.to_vec()), (y.clone(), s.to_vec())],
                outputs: vec![s.to_vec(); 6],
                run: &|v| one_hot(out, &six!(funcs7(&dev, &p(&v[0]), &p(&v[1])).unwrap())),
                vjp: &|v, c| {
                    let c = one_hot(out, c);
                    let g = funcs7::vjp(
                        &dev,
                        &p(&v[0]),
                        &p(&v[1]),
                        &p(&c[0]),
                        &p(&c[1]),
                        &p(&c[2]),
                        &p(&c[3]),
                        &p(&c[4]),
                        &p(&c[5]),
                    )
                    .unwrap();
                    vec![host(&g.x), host(&g.y)]
                },
                jvp: &|v, t| {
                    let (_, _, _, _, _, _, a, b, c, d, e, f) =
                        funcs7::jvp(&dev, &p(&v[0]), &p(&v[1]), &p(&t[0]), &p(&t[1])).unwrap();
                    one_hot(
                        out,
                        &[host(&a), host(&b), host(&c), host(&d), host(&e), host(&f)],
                    )
                },
            },
            &mut rng,
        );
        check(
            Case {
                what: &format!("funcs8 output {out}"),
                inputs: vec![
                    (x.clone(), s.to_vec()),
                    (y.clone(), s.to_vec()),
                    (z.clone(), s.to_vec()),
                ],
                outputs: vec![s.to_vec(); 6],
                run: &|v| {
                    one_hot(
                        out,
                        &six!(funcs8(&dev, &p(&v[0]), &p(&v[1]), &p(&v[2])).unwrap()),
                    )
                },
                vjp: &|v, c| {
                    let c = one_hot(out, c);
                    let g = funcs8::vjp(
                        &dev,
                        &p(&v[0]),
                        &p(&v[1]),
                        &p(&v[2]),
                        &p(&c[0]),
                        &p(&c[1]),
                        &p(&c[2]),
                        &p(&c[3]),
                        &p(&c[4]),
                        &p(&c[5]),
                    )
                    .unwrap();
                    vec![host(&g.x), host(&g.y), host(&g.z)]
                },
                jvp: &|v, t| {
                    let (_, _, _, _, _, _, a, b, c, d, e, f) = funcs8::jvp(
                        &dev,
                        &p(&v[0]),
                        &p(&v[1]),
                        &p(&v[2]),
                        &p(&t[0]),
                        &p(&t[1]),
                        &p(&t[2]),
                    )
                    .unwrap();
                    one_hot(
                        out,
                        &[host(&a), host(&b), host(&c), host(&d), host(&e), host(&f)],
                    )
                },
            },
            &mut rng,
        );
    }
}

fuse! {
    #[vjp(x)]
    pub fn ties(x: [f64; rows, cols]) -> ([f64; rows], [f64; rows]) {
        (max(x, cols), min(x, cols))
    }

    #[vjp(x, y)]
    #[jvp(x, y)]
    pub fn detached(x: [f64; n], y: [f64; n]) -> [f64; n] {
        x * detach(x * y) + y
    }

    #[vjp(x, w)]
    pub fn rmsnorm_bf16(x: [bf16; rows, cols], w: [bf16; cols]) -> [bf16; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * w
    }

    /// Operands read twice whose partials cancel: `atan2(x, x)` and `x / x` are constant
    /// where `x > 0`, `x - x` everywhere, so the derivative is the last term's.
    #[vjp(x)]
    #[jvp(x)]
    pub fn self_cancelling(x: [f32; n], k: f32) -> [f32; n] {
        (x.atan2(x) + (x - x) + x / x) * k + x
    }

    #[vjp(x, w)]
    pub fn rmsnorm_plain(x: [f64; rows, cols], w: [f64; cols]) -> [f64; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * w
    }
}

/// A maximum's gradient is split evenly among the elements equal to it (torch's `amax`).
#[test]
fn tied_maxima_share_the_gradient() {
    let dev = Device::cpu();
    let x = [1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 5.0, 0.5];
    let d = [0.6, -0.9];
    let g = ties::vjp(
        &dev,
        &put(&dev, &x, &[2, 4]),
        &put(&dev, &d, &[2]),
        &put(&dev, &[2.0, 4.0], &[2]),
    )
    .unwrap();
    let third = -0.9 / 3.0;
    assert_eq!(host(&g.x), [2.0, 0.3, 0.3, 0.0, third, third, third, 4.0]);
}

/// An operand read twice has its partials summed before its adjoint multiplies them, as
/// forward mode sums their products with its one tangent: large opposite terms (here `k / 2x`
/// from `atan2(x, x)`) cancel exactly rather than in turn beside the adjoint's other terms,
/// where `d` would be rounded away (random program p18665).
#[test]
fn operands_read_twice_sum_their_partials_first() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let n = 37;
    let (x, d) = (
        rng.floats::<f32>(n, 0.25, 4.0),
        rng.floats::<f32>(n, -1.0, 1.0),
    );
    let p = |v: &[f32]| dev.upload(v).unwrap().reshape(&[n]).unwrap();
    let k = 3.0e7f32;
    let g = self_cancelling::vjp(&dev, &p(&x), k, &p(&d)).unwrap();
    assert_eq!(g.x.to_vec().unwrap(), d);
    let (_, t) = self_cancelling::jvp(&dev, &p(&x), k, &p(&d)).unwrap();
    assert_eq!(t.to_vec().unwrap(), d);
}

/// `detach(e)` is `e`, and no derivative flows through it.
#[test]
fn detach_stops_the_gradient() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let n = 11;
    let (x, y, d) = (
        rng.floats::<f64>(n, -2.0, 2.0),
        rng.floats::<f64>(n, -2.0, 2.0),
        rng.floats::<f64>(n, -1.0, 1.0),
    );
    let p = |v: &[f64]| put(&dev, v, &[n]);
    let out = host(&detached(&dev, &p(&x), &p(&y)).unwrap());
    let g = detached::vjp(&dev, &p(&x), &p(&y), &p(&d)).unwrap();
    for i in 0..n {
        assert_eq!(out[i], x[i] * (x[i] * y[i]) + y[i]);
        assert_eq!(host(&g.x)[i], d[i] * (x[i] * y[i]));
        assert_eq!(host(&g.y)[i], d[i]);
    }
    let (_, t) = detached::jvp(&dev, &p(&x), &p(&y), &p(&d), &p(&x)).unwrap();
    for i in 0..n {
        assert_eq!(host(&t)[i], d[i] * (x[i] * y[i]) + x[i]);
    }
}

/// bf16 inputs: gradients computed in f32 and returned in bf16, within bf16's rounding of
/// the f64 gradients at the same (bf16) inputs.
#[test]
fn bf16_gradients_are_computed_in_f32() {
    use fuse_runtime::bf16;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let (rows, cols) = (5, 67);
    let round =
        |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|a| bf16::from_f64(a).to_f64()).collect() };
    let x = round(rng.floats::<f64>(rows * cols, -2.0, 2.0));
    let w = round(rng.floats::<f64>(cols, -2.0, 2.0));
    let d = round(rng.floats::<f64>(rows * cols, -1.0, 1.0));
    let b = |v: &[f64], s: &[usize]| {
        let h: Vec<bf16> = v.iter().map(|&a| bf16::from_f64(a)).collect();
        common::put(&dev, &h, s)
    };
    let s = [rows, cols];
    let g = rmsnorm_bf16::vjp(&dev, &b(&x, &s), &b(&w, &[cols]), &b(&d, &s)).unwrap();
    let want = rmsnorm_plain::vjp(
        &dev,
        &put(&dev, &x, &s),
        &put(&dev, &w, &[cols]),
        &put(&dev, &d, &s),
    )
    .unwrap();
    let close = |what: &str, got: &Buffer<bf16>, want: &Buffer<f64>| {
        let (got, want) = (common::host(got), host(want));
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = g.to_f64();
            assert!(
                (g - w).abs() <= 8e-3 * w.abs() + 1e-3 * scale,
                "{what}[{i}]: {g} against {w}"
            );
        }
    };
    close("dx", &g.x, &want.x);
    close("dw", &g.w, &want.w);
}

fuse! {
    #[vjp(x)]
    #[jvp(x)]
    pub fn gathered_cross_entropy(x: [f64; rows, cols], label: [i64; rows]) -> [f64; rows] {
        logsumexp(x, cols) - x[.., label]
    }

    #[vjp(x, y)]
    #[jvp(x, y)]
    pub fn permuted(x: [f64; r, c], y: [f64; c, r]) -> [f64; r, c] {
        x * permute(y, (r, c)) + permute(y, (r, c)).sin()
    }

    #[vjp(x, w)]
    #[jvp(x, w)]
    pub fn elements(x: [f64; n], w: [f64; 2, 3]) -> [f64; n] {
        (x * w[1][2] + w[0][0]).tanh() * w[1][2]
    }

    #[vjp(x, w)]
    #[jvp(x, w)]
    pub fn picked(x: [f64; n], w: [f64; m], i: i64) -> [f64; n] {
        x * w[i] + w[i] * w[i] + x[0] * x
    }

    #[vjp(x, table)]
    #[jvp(x, table)]
    pub fn pairs(x: [f64; a, b], table: [f64; a, k, b], i: [u8; a, b]) -> [f64; a, b] {
        x * table[.., i, ..].exp()
    }

    #[vjp(x)]
    #[jvp(x)]
    pub fn silu_and_mul(x: [f64; t, 2 * d]) -> [f64; t, d] {
        let gate = x[.., ..d];
        gate / (1.0 + (-gate).exp()) * x[.., d..]
    }

    /// Only the first half read, through a row's sum: the other half's gradient is zero, and
    /// the sum is taken in a launch before the one that stores the half's gradient.
    #[vjp(x)]
    #[jvp(x)]
    pub fn half_softmax(x: [f64; t, 2 * d]) -> [f64; t, d] {
        let e = x[.., ..d].exp();
        e / sum(e, d)
    }

    #[vjp(x, w)]
    #[jvp(x, w)]
    pub fn interleaved(x: [f64; n, d * 2], w: [f64; n, d]) -> [f64; n, d] {
        x[.., (0..).step_by(2)] * w + x[.., (1..).step_by(2)].sin() * x[.., (0..).step_by(2)]
    }

    /// Parts of different dims: each part's gradient (a sum over the other part's dim) in a
    /// launch over its own shape.
    #[vjp(q, b)]
    #[jvp(q, b)]
    pub fn parts_apart(q: [f64; t, h + p], b: [f64; h]) -> [f64; t, h, p] {
        q[.., ..h] * b + q[.., h..].exp()
    }

    /// A part's gradient that is the sum itself, stored through its view by a launch of its
    /// own (a mutation of `parts_apart` by the macro's fuzzer looped in the planner); `b`
    /// only gives `h`.
    #[vjp(q)]
    #[jvp(q)]
    pub fn parts_summed(q: [f64; t, h + p], b: [f64; h]) -> [f64; t, h, p] {
        q[.., ..h] + q[.., h..].exp()
    }

    /// A permuted parameter's gradient summed along another dim, and a softmax of a permuted
    /// view: each written in the parameter's order from a value computed in the view's (a
    /// launch of its own that transposes).
    #[vjp(o, lse)]
    #[jvp(o, lse)]
    pub fn scaled_heads(o: [f64; t, h, d], lse: [f64; h, t]) -> [f64; t, h, d] {
        o * permute(lse, (t, h)).exp()
    }

    #[vjp(y)]
    #[jvp(y)]
    pub fn softmax_of_transpose(y: [f64; c, r]) -> [f64; r, c] {
        let v = permute(y, (r, c));
        let e = (v - max(v, c)).exp();
        e / sum(e, c)
    }

    /// A scalar whose gradient sums a term a row and a term an element: two full reductions
    /// over different domains, a launch each.
    #[vjp(x, softcap)]
    #[jvp(x, softcap)]
    pub fn softcapped(x: [f64; n, v], y: [i64; n], softcap: f64) -> [f64; n] {
        let z = softcap * (x / softcap).tanh();
        logsumexp(z, v) - softcap * (x[.., y] / softcap).tanh()
    }

    #[jvp(emb, cache)]
    pub fn embed(emb: [f64; vocab, e], tokens: [u32; t], cache: [f64; p, 2 * e], pos: [i64; t]) -> [f64; t, e] {
        emb[tokens, ..].tanh() * cache[pos, ..e] + cache[pos, e..]
    }
}

/// A parameter over part of a merged dim that is not the last of the read's shape: `dx` and
/// `dw` against finite differences, and forward mode against reverse mode.
#[test]
fn merged_dims_before_others_differentiate() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (a, b, c) in [(1, 61, 3), (2, 3, 5), (3, 1, 2), (4, 7, 1)] {
        let (x, w) = (
            rng.floats::<f64>(a * b * c, -2.0, 2.0),
            rng.floats::<f64>(a * c, -2.0, 2.0),
        );
        let dy = rng.floats::<f64>(c, -1.0, 1.0);
        let loss = |x: &[f64], w: &[f64]| {
            let y = merged_first(&dev, &put(&dev, x, &[a, b, c]), &put(&dev, w, &[a, c]));
            dot(&host(&y.unwrap()), &dy)
        };
        let (px, pw) = (put(&dev, &x, &[a, b, c]), put(&dev, &w, &[a, c]));
        let grads = merged_first::vjp(&dev, &px, &pw, &put(&dev, &dy, &[c])).unwrap();
        let what = format!("{a}x{b}x{c}");
        assert_grad(
            &format!("dx {what}"),
            &host(&grads.x),
            &numeric(&x, &|x| loss(x, &w)),
        );
        assert_grad(
            &format!("dw {what}"),
            &host(&grads.w),
            &numeric(&w, &|w| loss(&x, w)),
        );
        let (vx, vw) = (
            rng.floats::<f64>(a * b * c, -1.0, 1.0),
            rng.floats::<f64>(a * c, -1.0, 1.0),
        );
        let (_, jv) = merged_first::jvp(
            &dev,
            &px,
            &pw,
            &put(&dev, &vx, &[a, b, c]),
            &put(&dev, &vw, &[a, c]),
        )
        .unwrap();
        let left = dot(&host(&jv), &dy);
        let right = dot(&vx, &host(&grads.x)) + dot(&vw, &host(&grads.w));
        assert!(
            (left - right).abs() <= 1e-9 * (1.0 + left.abs()),
            "{what}: {left} against {right}"
        );
    }
}

/// Reverse and forward mode agree on a 16-bit reduction that a second launch reads from a
/// temporary (`over_min`: two launches), for drawn tangents and cotangents.
#[test]
fn narrow_reductions_read_back_keep_their_ties() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    assert_eq!(over_min::VJP_LAUNCHES, 2);
    let f = |v: bf16| f64::from(v.to_f32());
    for n in [1, 8, 37] {
        for _ in 0..50 {
            let x: Vec<bf16> = rng.floats(n, -3.0, 3.0);
            // Away from 0, where `s / min(s * x)` cancels to `1 / x` in f32 roundings.
            let s = rng.uniform(0.5, 3.0) * if rng.below(2) == 0 { 1.0 } else { -1.0 };
            let s = bf16::from_f32(s as f32);
            let (u, vs) = (
                bf16::from_f32(rng.uniform(-1.0, 1.0) as f32),
                bf16::from_f32(rng.uniform(-1.0, 1.0) as f32),
            );
            let vx: Vec<bf16> = rng.floats(n, -1.0, 1.0);
            let px = common::put(&dev, &x, &[n]);
            let g = over_min::vjp(&dev, s, &px, &common::put(&dev, &[u], &[])).unwrap();
            let (_, t) = over_min::jvp(&dev, s, &px, vs, &common::put(&dev, &vx, &[n])).unwrap();
            let left = f(common::host(&t)[0]) * f(u);
            let gx = common::host(&g.x);
            let right = f(common::host(&g.s)[0]) * f(vs)
                + gx.iter().zip(&vx).map(|(&a, &b)| f(a) * f(b)).sum::<f64>();
            // Each side rounded to bf16 on its way out: a few of its steps apart at most.
            let tol = 4.0 * f64::from(f32::from(bf16::EPSILON)) * (left.abs() + right.abs());
            assert!(
                (left - right).abs() <= tol + 1e-6 || !left.is_finite(),
                "n {n}, s {s}: <J v, u> {left} against <v, J^T u> {right}"
            );
        }
    }
}

/// `f`'s tangent at `x` along `v`, by central differences: `(f(x + h v) - f(x - h v)) / 2h`.
fn numeric_tangent(
    x: &[Vec<f64>],
    v: &[Vec<f64>],
    f: &dyn Fn(&[Vec<f64>]) -> Vec<f64>,
) -> Vec<f64> {
    let h = 1e-6;
    let at = |s: f64| -> Vec<Vec<f64>> {
        x.iter()
            .zip(v)
            .map(|(x, v)| x.iter().zip(v).map(|(x, v)| x + s * h * v).collect())
            .collect()
    };
    let (up, down) = (f(&at(1.0)), f(&at(-1.0)));
    up.iter()
        .zip(&down)
        .map(|(u, d)| (u - d) / (2.0 * h))
        .collect()
}

/// Reads through views, gathers and constant indices: reverse mode against finite differences
/// where each element of the parameter is read by at most one element of the view (a permuted
/// view, a gather whose indices run along the other dims, `w[1][2]`), out-of-range indices
/// included (they read zero, and take no gradient); forward mode against reverse mode there,
/// and against finite differences through parts and gathers by an index with dims of its own.
#[test]
fn views_and_gathers_have_derivatives() {
    // The label's logit's gradient goes back in the launch of the row's softmax.
    assert_eq!(gathered_cross_entropy::VJP_LAUNCHES, 1);
    assert_eq!(gathered_cross_entropy::VALUE_AND_VJP_LAUNCHES, 1);
    assert_eq!(gathered_cross_entropy::JVP_LAUNCHES, 1);
    // Both halves' gradients in one launch over the halves' shape; the other kernels' parts
    // after the sums they need, or each over its own shape.
    assert_eq!(silu_and_mul::VJP_LAUNCHES, 1);
    // By bytes, an element of `[t, d]`: both halves of `x` and `dy` read, `dx`'s halves
    // written, in f64.
    assert_eq!(silu_and_mul::VJP_BYTES_PER_ELEMENT, 40.0);
    assert_eq!(half_softmax::VJP_LAUNCHES, 2);
    assert_eq!(interleaved::VJP_LAUNCHES, 1);
    // Each part's gradient a sum along the other part's dim, then stored through its view
    // (a sum and an elementwise launch each), and `b`'s a sum over `t` and `p`.
    assert_eq!(parts_apart::VJP_LAUNCHES, 5);
    // Each part's sum, then stored through its view: two launches a part.
    assert_eq!(parts_summed::VJP_LAUNCHES, 4);
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(3, 7), (1, 1), (6, 13)] {
        let s = vec![rows, cols];
        let p = |v: &[f64], shape: &[usize]| put(&dev, v, shape);
        let x = rng.floats::<f64>(rows * cols, -3.0, 3.0);
        let l = common::put(&dev, &rng.indices(rows, cols), &[rows]);
        check(
            Case {
                what: "gathered_cross_entropy",
                inputs: vec![(x.clone(), s.clone())],
                outputs: vec![vec![rows]],
                run: &|v| {
                    vec![host(
                        &gathered_cross_entropy(&dev, &p(&v[0], &s), &l).unwrap(),
                    )]
                },
                vjp: &|v, d| {
                    let g =
                        gathered_cross_entropy::vjp(&dev, &p(&v[0], &s), &l, &p(&d[0], &[rows]))
                            .unwrap();
                    vec![host(&g.x)]
                },
                jvp: &|v, t| {
                    let (_, j) =
                        gathered_cross_entropy::jvp(&dev, &p(&v[0], &s), &l, &p(&t[0], &s))
                            .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        // The training pair gives `vjp`'s bits.
        let (bx, dl) = (p(&x, &s), p(&rng.floats::<f64>(rows, -1.0, 1.0), &[rows]));
        let (loss, saved) = gathered_cross_entropy::forward_train(&dev, &bx, &l).unwrap();
        assert_eq!(
            host(&loss),
            host(&gathered_cross_entropy(&dev, &bx, &l).unwrap())
        );
        let g = gathered_cross_entropy::backward(&dev, &saved, &dl).unwrap();
        let want = gathered_cross_entropy::vjp(&dev, &bx, &l, &dl).unwrap();
        assert_eq!(host(&g.x), host(&want.x));
        let y = rng.floats::<f64>(rows * cols, -3.0, 3.0);
        let ys = vec![cols, rows];
        check(
            Case {
                what: "permuted",
                inputs: vec![(x.clone(), s.clone()), (y.clone(), ys.clone())],
                outputs: vec![s.clone()],
                run: &|v| {
                    vec![host(
                        &permuted(&dev, &p(&v[0], &s), &p(&v[1], &ys)).unwrap(),
                    )]
                },
                vjp: &|v, d| {
                    let g =
                        permuted::vjp(&dev, &p(&v[0], &s), &p(&v[1], &ys), &p(&d[0], &s)).unwrap();
                    vec![host(&g.x), host(&g.y)]
                },
                jvp: &|v, t| {
                    let (_, j) = permuted::jvp(
                        &dev,
                        &p(&v[0], &s),
                        &p(&v[1], &ys),
                        &p(&t[0], &s),
                        &p(&t[1], &ys),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let n = rows * cols;
        let w = rng.floats::<f64>(6, -1.0, 1.0);
        check(
            Case {
                what: "elements",
                inputs: vec![(x.clone(), vec![n]), (w.clone(), vec![2, 3])],
                outputs: vec![vec![n]],
                run: &|v| {
                    vec![host(
                        &elements(&dev, &p(&v[0], &[n]), &p(&v[1], &[2, 3])).unwrap(),
                    )]
                },
                vjp: &|v, d| {
                    let g =
                        elements::vjp(&dev, &p(&v[0], &[n]), &p(&v[1], &[2, 3]), &p(&d[0], &[n]))
                            .unwrap();
                    vec![host(&g.x), host(&g.w)]
                },
                jvp: &|v, t| {
                    let (_, j) = elements::jvp(
                        &dev,
                        &p(&v[0], &[n]),
                        &p(&v[1], &[2, 3]),
                        &p(&t[0], &[n]),
                        &p(&t[1], &[2, 3]),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let m = cols + 2;
        let w = rng.floats::<f64>(m, -1.0, 1.0);
        let i = rng.indices(1, m)[0];
        check(
            Case {
                what: "picked",
                inputs: vec![(x.clone(), vec![n]), (w.clone(), vec![m])],
                outputs: vec![vec![n]],
                run: &|v| {
                    vec![host(
                        &picked(&dev, &p(&v[0], &[n]), &p(&v[1], &[m]), i).unwrap(),
                    )]
                },
                vjp: &|v, d| {
                    let g = picked::vjp(&dev, &p(&v[0], &[n]), &p(&v[1], &[m]), i, &p(&d[0], &[n]))
                        .unwrap();
                    vec![host(&g.x), host(&g.w)]
                },
                jvp: &|v, t| {
                    let (_, tj) = picked::jvp(
                        &dev,
                        &p(&v[0], &[n]),
                        &p(&v[1], &[m]),
                        i,
                        &p(&t[0], &[n]),
                        &p(&t[1], &[m]),
                    )
                    .unwrap();
                    vec![host(&tj)]
                },
            },
            &mut rng,
        );
        let k = 4;
        let ts = vec![rows, k, cols];
        let table = rng.floats::<f64>(rows * k * cols, -1.0, 1.0);
        let idx: Vec<u8> = (0..n).map(|_| rng.below(k as u64 + 1) as u8).collect();
        let idx = common::put(&dev, &idx, &s);
        check(
            Case {
                what: "pairs",
                inputs: vec![(x.clone(), s.clone()), (table.clone(), ts.clone())],
                outputs: vec![s.clone()],
                run: &|v| {
                    vec![host(
                        &pairs(&dev, &p(&v[0], &s), &p(&v[1], &ts), &idx).unwrap(),
                    )]
                },
                vjp: &|v, d| {
                    let g = pairs::vjp(&dev, &p(&v[0], &s), &p(&v[1], &ts), &idx, &p(&d[0], &s))
                        .unwrap();
                    vec![host(&g.x), host(&g.table)]
                },
                jvp: &|v, t| {
                    let (_, j) = pairs::jvp(
                        &dev,
                        &p(&v[0], &s),
                        &p(&v[1], &ts),
                        &idx,
                        &p(&t[0], &s),
                        &p(&t[1], &ts),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );

        // Parts: both halves, one half, interleaved pairs, parts of different dims.
        let (t, d) = (rows, cols);
        let xs = vec![t, 2 * d];
        let x2 = rng.floats::<f64>(t * 2 * d, -3.0, 3.0);
        let half = vec![t, d];
        check(
            Case {
                what: "silu_and_mul",
                inputs: vec![(x2.clone(), xs.clone())],
                outputs: vec![half.clone()],
                run: &|v| vec![host(&silu_and_mul(&dev, &p(&v[0], &xs)).unwrap())],
                vjp: &|v, c| {
                    let g = silu_and_mul::vjp(&dev, &p(&v[0], &xs), &p(&c[0], &half)).unwrap();
                    vec![host(&g.x)]
                },
                jvp: &|v, tx| {
                    let (_, j) = silu_and_mul::jvp(&dev, &p(&v[0], &xs), &p(&tx[0], &xs)).unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        // The training pair stores the halves too.
        let (bx, dy) = (p(&x2, &xs), p(&rng.floats::<f64>(t * d, -1.0, 1.0), &half));
        let (_, saved) = silu_and_mul::forward_train(&dev, &bx).unwrap();
        let g = silu_and_mul::backward(&dev, &saved, &dy).unwrap();
        assert_eq!(
            host(&g.x),
            host(&silu_and_mul::vjp(&dev, &bx, &dy).unwrap().x)
        );
        let (y, both) = silu_and_mul::value_and_vjp(&dev, &bx, &dy).unwrap();
        assert_eq!(host(&y), host(&silu_and_mul(&dev, &bx).unwrap()));
        assert_eq!(host(&both.x), host(&g.x));
        check(
            Case {
                what: "half_softmax",
                inputs: vec![(x2.clone(), xs.clone())],
                outputs: vec![half.clone()],
                run: &|v| vec![host(&half_softmax(&dev, &p(&v[0], &xs)).unwrap())],
                vjp: &|v, c| {
                    let g = half_softmax::vjp(&dev, &p(&v[0], &xs), &p(&c[0], &half)).unwrap();
                    vec![host(&g.x)]
                },
                jvp: &|v, tx| {
                    let (_, j) = half_softmax::jvp(&dev, &p(&v[0], &xs), &p(&tx[0], &xs)).unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let w2 = rng.floats::<f64>(t * d, -2.0, 2.0);
        check(
            Case {
                what: "interleaved",
                inputs: vec![(x2.clone(), xs.clone()), (w2.clone(), half.clone())],
                outputs: vec![half.clone()],
                run: &|v| {
                    vec![host(
                        &interleaved(&dev, &p(&v[0], &xs), &p(&v[1], &half)).unwrap(),
                    )]
                },
                vjp: &|v, c| {
                    let g =
                        interleaved::vjp(&dev, &p(&v[0], &xs), &p(&v[1], &half), &p(&c[0], &half))
                            .unwrap();
                    vec![host(&g.x), host(&g.w)]
                },
                jvp: &|v, tx| {
                    let (_, j) = interleaved::jvp(
                        &dev,
                        &p(&v[0], &xs),
                        &p(&v[1], &half),
                        &p(&tx[0], &xs),
                        &p(&tx[1], &half),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let (h, pp) = (cols, rows + 1);
        let qs = vec![t, h + pp];
        let q = rng.floats::<f64>(t * (h + pp), -2.0, 2.0);
        let b = rng.floats::<f64>(h, -2.0, 2.0);
        check(
            Case {
                what: "parts_apart",
                inputs: vec![(q.clone(), qs.clone()), (b.clone(), vec![h])],
                outputs: vec![vec![t, h, pp]],
                run: &|v| {
                    vec![host(
                        &parts_apart(&dev, &p(&v[0], &qs), &p(&v[1], &[h])).unwrap(),
                    )]
                },
                vjp: &|v, c| {
                    let g = parts_apart::vjp(
                        &dev,
                        &p(&v[0], &qs),
                        &p(&v[1], &[h]),
                        &p(&c[0], &[t, h, pp]),
                    )
                    .unwrap();
                    vec![host(&g.q), host(&g.b)]
                },
                jvp: &|v, tx| {
                    let (_, j) = parts_apart::jvp(
                        &dev,
                        &p(&v[0], &qs),
                        &p(&v[1], &[h]),
                        &p(&tx[0], &qs),
                        &p(&tx[1], &[h]),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let pb = p(&b, &[h]);
        check(
            Case {
                what: "parts_summed",
                inputs: vec![(q.clone(), qs.clone())],
                outputs: vec![vec![t, h, pp]],
                run: &|v| vec![host(&parts_summed(&dev, &p(&v[0], &qs), &pb).unwrap())],
                vjp: &|v, c| {
                    let g = parts_summed::vjp(&dev, &p(&v[0], &qs), &pb, &p(&c[0], &[t, h, pp]));
                    vec![host(&g.unwrap().q)]
                },
                jvp: &|v, tx| {
                    let (_, j) =
                        parts_summed::jvp(&dev, &p(&v[0], &qs), &pb, &p(&tx[0], &qs)).unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );

        // Launches that transpose; full reductions over two domains.
        let (tt, hh, dd) = (rows, cols, 3);
        let (os, ls) = (vec![tt, hh, dd], vec![hh, tt]);
        let o = rng.floats::<f64>(tt * hh * dd, -2.0, 2.0);
        let lse = rng.floats::<f64>(hh * tt, -1.0, 1.0);
        check(
            Case {
                what: "scaled_heads",
                inputs: vec![(o.clone(), os.clone()), (lse.clone(), ls.clone())],
                outputs: vec![os.clone()],
                run: &|v| {
                    vec![host(
                        &scaled_heads(&dev, &p(&v[0], &os), &p(&v[1], &ls)).unwrap(),
                    )]
                },
                vjp: &|v, c| {
                    let g = scaled_heads::vjp(&dev, &p(&v[0], &os), &p(&v[1], &ls), &p(&c[0], &os))
                        .unwrap();
                    vec![host(&g.o), host(&g.lse)]
                },
                jvp: &|v, tx| {
                    let (_, j) = scaled_heads::jvp(
                        &dev,
                        &p(&v[0], &os),
                        &p(&v[1], &ls),
                        &p(&tx[0], &os),
                        &p(&tx[1], &ls),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let ys = vec![cols, rows];
        check(
            Case {
                what: "softmax_of_transpose",
                inputs: vec![(x.clone(), ys.clone())],
                outputs: vec![s.clone()],
                run: &|v| vec![host(&softmax_of_transpose(&dev, &p(&v[0], &ys)).unwrap())],
                vjp: &|v, c| {
                    let g = softmax_of_transpose::vjp(&dev, &p(&v[0], &ys), &p(&c[0], &s)).unwrap();
                    vec![host(&g.y)]
                },
                jvp: &|v, tx| {
                    let (_, j) =
                        softmax_of_transpose::jvp(&dev, &p(&v[0], &ys), &p(&tx[0], &ys)).unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );
        let softcap = rng.uniform(2.0, 5.0);
        let cap = |v: &[f64]| v[0];
        check(
            Case {
                what: "softcapped",
                inputs: vec![(x.clone(), s.clone()), (vec![softcap], vec![])],
                outputs: vec![vec![rows]],
                run: &|v| {
                    vec![host(
                        &softcapped(&dev, &p(&v[0], &s), &l, cap(&v[1])).unwrap(),
                    )]
                },
                vjp: &|v, c| {
                    let g =
                        softcapped::vjp(&dev, &p(&v[0], &s), &l, cap(&v[1]), &p(&c[0], &[rows]))
                            .unwrap();
                    vec![host(&g.x), host(&g.softcap)]
                },
                jvp: &|v, tx| {
                    let (_, j) = softcapped::jvp(
                        &dev,
                        &p(&v[0], &s),
                        &l,
                        cap(&v[1]),
                        &p(&tx[0], &s),
                        cap(&tx[1]),
                    )
                    .unwrap();
                    vec![host(&j)]
                },
            },
            &mut rng,
        );

        // Forward mode through gathers by an index of its own dims.
        let xs = vec![t, 2 * d];
        let x2 = rng.floats::<f64>(t * 2 * d, -3.0, 3.0);
        let v2 = rng.floats::<f64>(t * 2 * d, -1.0, 1.0);
        let (y, tangent) = silu_and_mul::jvp(&dev, &p(&x2, &xs), &p(&v2, &xs)).unwrap();
        assert_eq!(host(&y), host(&silu_and_mul(&dev, &p(&x2, &xs)).unwrap()));
        let want = numeric_tangent(&[x2], &[v2], &|a| {
            host(&silu_and_mul(&dev, &p(&a[0], &xs)).unwrap())
        });
        assert_grad("silu_and_mul tangent", &host(&tangent), &want);

        let (vocab, e, positions) = (cols + 1, rows + 2, 5);
        let emb = rng.floats::<f64>(vocab * e, -2.0, 2.0);
        let cache = rng.floats::<f64>(positions * 2 * e, -2.0, 2.0);
        // Some out of range, the first in range: the tangent is not all zero.
        let mut tokens: Vec<u32> = (0..t).map(|_| rng.below(vocab as u64 + 1) as u32).collect();
        tokens[0] = rng.below(vocab as u64) as u32;
        let tokens = common::put(&dev, &tokens, &[t]);
        let mut pos = rng.indices(t, positions);
        pos[0] = rng.below(positions as u64) as i64;
        let pos = common::put(&dev, &pos, &[t]);
        let (es, cs) = (vec![vocab, e], vec![positions, 2 * e]);
        let (ve, vc) = (
            rng.floats::<f64>(vocab * e, -1.0, 1.0),
            rng.floats::<f64>(positions * 2 * e, -1.0, 1.0),
        );
        let run = |a: &[Vec<f64>]| {
            host(&embed(&dev, &p(&a[0], &es), &tokens, &p(&a[1], &cs), &pos).unwrap())
        };
        let (y, tangent) = embed::jvp(
            &dev,
            &p(&emb, &es),
            &tokens,
            &p(&cache, &cs),
            &pos,
            &p(&ve, &es),
            &p(&vc, &cs),
        )
        .unwrap();
        assert_eq!(host(&y), run(&[emb.clone(), cache.clone()]));
        let want = numeric_tangent(&[emb, cache], &[ve, vc], &run);
        assert!(
            want.iter().any(|v| *v != 0.0),
            "a tangent that is not all zero"
        );
        assert_grad("embed tangent", &host(&tangent), &want);
    }
}

/// `scaled_min`'s gradients by each derived function against finite differences, its value
/// against the forward's, and forward mode against reverse mode.
#[test]
fn totals_are_written_before_they_are_read() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (a, b, c) in [(1, 1, 1), (3, 5, 2), (2, 1, 7), (4, 3, 3)] {
        let z = put(&dev, &rng.floats::<f64>(a * b * c, -1.0, 1.0), &[a, b, c]);
        let s = rng.uniform(0.5, 2.0);
        let (x, y) = (
            rng.floats::<f64>(c, -2.0, 2.0),
            rng.floats::<f64>(b, -2.0, 2.0),
        );
        let dy = rng.floats::<f64>(a * b * c, -1.0, 1.0);
        let value = |s: f64, x: &[f64], y: &[f64]| {
            host(&scaled_min(&dev, &z, s, &put(&dev, x, &[c]), &put(&dev, y, &[b])).unwrap())
        };
        let loss = |s: f64, x: &[f64], y: &[f64]| dot(&value(s, x, y), &dy);
        let (px, py, pdy) = (
            put(&dev, &x, &[c]),
            put(&dev, &y, &[b]),
            put(&dev, &dy, &[a, b, c]),
        );
        let grads = scaled_min::vjp(&dev, &z, s, &px, &py, &pdy).unwrap();
        let (out, both) = scaled_min::value_and_vjp(&dev, &z, s, &px, &py, &pdy).unwrap();
        let (saved_out, saved) = scaled_min::forward_train(&dev, &z, s, &px, &py).unwrap();
        let pair = scaled_min::backward(&dev, &saved, &pdy).unwrap();
        let what = format!("{a}x{b}x{c}");
        assert_eq!(
            host(&out),
            value(s, &x, &y),
            "{what}: value_and_vjp's value"
        );
        assert_eq!(
            host(&saved_out),
            value(s, &x, &y),
            "{what}: forward_train's value"
        );
        let want = numeric(&[s], &|v| loss(v[0], &x, &y));
        for (how, g) in [
            ("vjp", &grads),
            ("value_and_vjp", &both),
            ("backward", &pair),
        ] {
            assert_grad(&format!("{how} ds {what}"), &host(&g.s), &want);
        }
        let (vs, vx, vy) = (
            rng.uniform(-1.0, 1.0),
            rng.floats::<f64>(c, -1.0, 1.0),
            rng.floats::<f64>(b, -1.0, 1.0),
        );
        let (_, jv) = scaled_min::jvp(
            &dev,
            &z,
            s,
            &px,
            &py,
            vs,
            &put(&dev, &vx, &[c]),
            &put(&dev, &vy, &[b]),
        )
        .unwrap();
        let left = dot(&host(&jv), &dy);
        // The tangents of `x` and `y` by finite differences, `s`'s by the gradient.
        let along = |t: f64| {
            let shift = |v: &[f64], d: &[f64]| -> Vec<f64> {
                v.iter().zip(d).map(|(v, d)| v + t * d).collect()
            };
            loss(s, &shift(&x, &vx), &shift(&y, &vy))
        };
        let right = vs * host(&grads.s)[0] + (along(1e-6) - along(-1e-6)) / 2e-6;
        assert!(
            (left - right).abs() <= 1e-6 * (1.0 + left.abs()),
            "{what}: {left} against {right}"
        );
    }
}

/// `column_sums_scaled`'s values from `value_and_vjp` against the forward's (the sum's within
/// a bf16 rounding: its order differs), and its gradients against `vjp`'s.
#[test]
fn sixteen_bit_partial_sums_add_in_f32() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (r, c) in [(1, 1), (7, 3), (33, 5)] {
        let x: Vec<bf16> = rng.floats(r * c, -2.0, 2.0);
        let w: Vec<bf16> = rng.floats(r, -2.0, 2.0);
        let b = common::put(&dev, &rng.floats::<bf16>(r, -2.0, 2.0), &[r]);
        let k: Vec<i64> = (0..r).map(|_| rng.below(100) as i64 - 50).collect();
        let k = common::put(&dev, &k, &[r]);
        let dy: Vec<bf16> = rng.floats(r * c, -1.0, 1.0);
        let pick: Vec<u8> = (0..c).map(|_| rng.below(r as u64 + 1) as u8).collect();
        let (x, pick, w, dy) = (
            common::put(&dev, &x, &[r, c]),
            common::put(&dev, &pick, &[c]),
            common::put(&dev, &w, &[r]),
            common::put(&dev, &dy, &[r, c]),
        );
        let (want, other) = column_sums_scaled(&dev, &x, &pick, &b, &w, &k).unwrap();
        let want = want.to_vec().unwrap();
        let (got, got_other, both) =
            column_sums_scaled::value_and_vjp(&dev, &x, &pick, &b, &w, &k, &dy, &dy).unwrap();
        let grads = column_sums_scaled::vjp(&dev, &x, &pick, &b, &w, &k, &dy, &dy).unwrap();
        assert_eq!(
            got_other.to_vec().unwrap(),
            other.to_vec().unwrap(),
            "{r}x{c}"
        );
        for (g, w) in got.to_vec().unwrap().iter().zip(&want) {
            let (g, w) = (g.to_f32(), w.to_f32());
            assert!(
                (g - w).abs() <= 0.02 * w.abs().max(1.0),
                "{r}x{c}: {g} against {w}"
            );
        }
        assert_eq!(
            both.x.to_vec().unwrap(),
            grads.x.to_vec().unwrap(),
            "{r}x{c}: dx"
        );
        let (bw, gw) = (both.w.to_vec().unwrap(), grads.w.to_vec().unwrap());
        for (a, b) in bw.iter().zip(&gw) {
            let (a, b) = (a.to_f32(), b.to_f32());
            assert!(
                (a - b).abs() <= 0.02 * b.abs().max(1.0),
                "{r}x{c}: dw {a} against {b}"
            );
        }
    }
}
