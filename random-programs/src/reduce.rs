//! The oracle's reductions, over one dim or over every element, with their error bounds.

use crate::ops::{eps, finish, int_range, tiny, wrap};
use crate::oracle::{count, rows, Desc, Node, V};
use crate::ty::Ty;

/// The relative error of a float sum of `n` terms, as a fraction of the sum of magnitudes (the
/// accuracy section of `doc/language.md`: `1e-5 * sum |x|` for `f32`, and `f16` and `bf16` sum in
/// `f32`; for `f64`, `1e-12`, or the bound of a sum term by term, `n * 2^-53`, where that is
/// larger: the CPU adds an `f64` row in order, and a million equal terms of about -1000 drifted
/// by 1.7e-11 of their magnitudes).
fn sum_rel(ty: Ty, n: usize) -> f64 {
    if ty == Ty::F64 {
        1e-12f64.max(n as f64 * f64::EPSILON / 2.0)
    } else {
        1e-5
    }
}

/// The sum of `terms` as nearly exactly as `f64` holds it (Neumaier's compensated sum), so the
/// bound is measured from the true sum: the oracle's own sum term by term drifts as the CPU's
/// does, and would pass a CPU that is off by as much. A sum that is not finite term by term
/// (an infinite or NaN term, or partial sums past `f64`) is that sum.
fn exact_sum(terms: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for x in terms {
        let t = s + x;
        c += if s.abs() >= x.abs() {
            (s - t) + x
        } else {
            (x - t) + s
        };
        s = t;
    }
    if s.is_finite() {
        s + c
    } else {
        s
    }
}

pub fn reduce(desc: &Desc, node: &Node, sizes: &[usize], vals: &[Vec<V>]) -> Vec<V> {
    let kind = node.args[0].as_str();
    let operand: usize = node.args[2].parse().expect("a node id");
    let of = desc.nodes[operand].shape;
    let from = desc.nodes[operand].ty;
    let x = &vals[operand];
    let mut row = Vec::new();
    // Over dim `r`, over the `k` adjacent dims from `r` (`r:k`, which stand together in the
    // operand: one run of their sizes' product at the last one's stride), or over everything.
    let (starts, stride, len) = match crate::oracle::reduced(&node.args[1]) {
        Some(dims) => {
            let last = *dims.last().expect("a dim");
            let (starts, stride) = rows(node.shape, of, last, sizes);
            (starts, stride, dims.iter().map(|&d| sizes[d]).product())
        }
        None => (vec![0], 1, count(of, sizes)),
    };
    starts
        .iter()
        .map(|&s| {
            row.clear();
            row.extend((0..len).map(|k| x[s + k * stride]));
            one(kind, node.ty, from, &row)
        })
        .collect()
}

fn one(kind: &str, ty: Ty, from: Ty, row: &[V]) -> V {
    if row.iter().any(|v| !v.known()) {
        return V::UNKNOWN;
    }
    if kind == "argmax" || kind == "argmin" {
        return arg_extreme(kind == "argmax", from, row);
    }
    if !ty.is_float() {
        return int_reduce(kind, ty, row);
    }
    match kind {
        "sum" | "mean" => {
            let s = exact_sum(row.iter().map(|v| v.f));
            let abs: f64 = row.iter().map(|v| v.f.abs()).sum();
            let err: f64 = row.iter().map(|v| v.err).sum();
            if !s.is_finite() || !abs.is_finite() {
                let exact = row.iter().all(|v| v.err == 0.0) && !s.is_finite();
                return if exact { V::float(s) } else { V::UNKNOWN };
            }
            let n = row.len() as f64;
            let err = err + sum_rel(ty, row.len()) * abs + tiny(ty);
            if kind == "sum" {
                // Partial sums of the compute type may overflow where the total does not.
                finish(s, err, ty).and_range(abs, ty)
            } else if row.is_empty() {
                V::float(f64::NAN)
            } else {
                finish(s / n, err / n + eps(ty) * (s / n).abs(), ty).and_range(abs, ty)
            }
        }
        "prod" => {
            let p: f64 = row.iter().map(|v| v.f).product();
            if row.iter().all(|v| v.err == 0.0) && !p.is_finite() {
                return V::float(p);
            }
            if row
                .iter()
                .any(|v| !v.f.is_finite() || (v.err > 0.0 && v.f.abs() <= v.err))
            {
                return V::UNKNOWN;
            }
            let big: f64 = row.iter().map(|v| v.f.abs().max(1.0)).product();
            let small: f64 = row.iter().map(|v| v.f.abs().min(1.0)).product();
            let limit = if ty == Ty::F64 { 1e300 } else { 1e37 };
            if big >= limit || (p != 0.0 && small <= 1.0 / limit) {
                return V::UNKNOWN;
            }
            let rel: f64 = row
                .iter()
                .map(|v| if v.f == 0.0 { 0.0 } else { v.err / v.f.abs() })
                .sum();
            let n = row.len() as f64;
            finish(
                p,
                p.abs() * (rel * 1.5 + (n + 2.0) * eps(ty)) + tiny(ty),
                ty,
            )
        }
        "max" | "min" => {
            let init = if kind == "max" {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            };
            let pick = |a: f64, b: f64| if kind == "max" { a.max(b) } else { a.min(b) };
            let m = row.iter().fold(init, |a, v| pick(a, v.f));
            let err = row.iter().map(|v| v.err).fold(0.0, f64::max);
            finish(m, err, ty)
        }
        "logsumexp" => logsumexp(ty, row),
        _ => unreachable!("reduction {kind}"),
    }
}

impl V {
    /// Unknown where partial sums of magnitude up to `abs` could overflow the compute type.
    fn and_range(self, abs: f64, ty: Ty) -> V {
        if ty != Ty::F64 && abs >= 3e38 {
            V::UNKNOWN
        } else {
            self
        }
    }
}

fn logsumexp(ty: Ty, row: &[V]) -> V {
    let exact = row.iter().all(|v| v.err == 0.0);
    let nan = row.iter().any(|v| v.f.is_nan());
    let inf = row.iter().any(|v| v.f == f64::INFINITY);
    if nan || inf {
        return if exact && !(nan && inf) {
            V::float(if nan { f64::NAN } else { f64::INFINITY })
        } else {
            V::UNKNOWN
        };
    }
    let m = row.iter().map(|v| v.f).fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return V::float(m);
    }
    let s = exact_sum(row.iter().map(|v| (v.f - m).exp()));
    let r = m + s.ln();
    let err = row.iter().map(|v| v.err).fold(0.0, f64::max);
    let err = err + 2.0 * sum_rel(ty, row.len()) + 4.0 * eps(ty) * (r.abs() + m.abs()) + tiny(ty);
    finish(r, err, ty)
}

fn int_reduce(kind: &str, ty: Ty, row: &[V]) -> V {
    let (lo, hi) = int_range(ty);
    let v = match kind {
        "sum" => row.iter().fold(0, |a, v| wrap(a + v.i, ty)),
        "prod" => row.iter().fold(1i128, |a, v| wrap(a.wrapping_mul(v.i), ty)),
        "max" => row.iter().fold(lo, |a, v| a.max(v.i)),
        "min" => row.iter().fold(hi, |a, v| a.min(v.i)),
        _ => unreachable!("integer reduction {kind}"),
    };
    V::int(v)
}

/// The position of the greatest (least) element, ties to the lowest; unknown where another
/// element is within the two errors of it.
fn arg_extreme(max: bool, from: Ty, row: &[V]) -> V {
    let key = |v: &V| -> f64 {
        let f = if from.is_float() { v.f } else { v.i as f64 };
        if max {
            f
        } else {
            -f
        }
    };
    if !from.is_float() {
        // Exact: compare the integers themselves (f64 would round 64-bit values).
        let best = (0..row.len()).fold(None, |b: Option<usize>, k| match b {
            Some(j) if (max && row[k].i <= row[j].i) || (!max && row[k].i >= row[j].i) => b,
            _ => Some(k),
        });
        return V::int(best.map_or(u32::MAX as i128, |k| k as i128));
    }
    let mut best: Option<usize> = None;
    for (k, v) in row.iter().enumerate() {
        if v.f.is_nan() {
            continue;
        }
        if best.is_none_or(|j| key(v) > key(&row[j])) {
            best = Some(k);
        }
    }
    let Some(b) = best else {
        return V::int(u32::MAX as i128);
    };
    let close = row.iter().enumerate().any(|(k, v)| {
        k != b
            && !v.f.is_nan()
            && v.err + row[b].err > 0.0
            && key(v) >= key(&row[b]) - v.err - row[b].err
    });
    if close {
        V::UNKNOWN
    } else {
        V::int(b as i128)
    }
}
