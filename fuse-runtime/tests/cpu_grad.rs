//! Derivatives (`#[vjp]`, `#[jvp]`) on the CPU backend: every gradient against central finite
//! differences of the forward in f64, and forward mode against reverse mode
//! (`<J v, u> == <v, J^T u>`), on fresh random inputs of odd sizes.
mod common;
use common::Rng;
use fuse_runtime::{fuse, Buffer, Device};

fuse! {
    #[vjp(x, w, eps)]
    #[jvp(x, w)]
    pub fn rmsnorm(x: [f64; rows, cols], w: [f64; cols], eps: f64) -> [f64; rows, cols] {
        x * rsqrt(mean(x * x, cols) + eps) * w
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
