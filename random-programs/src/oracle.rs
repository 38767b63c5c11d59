//! The oracle: a float64 interpreter of a program's description (see `gen/mod.rs`), written for
//! this test alone. It shares nothing with the macro: not its parser, IR, planner or printers.
//!
//! Each value carries a bound on how far any correct implementation may be from the exact
//! result (`V::err`), grown by each operation from the language's accuracy rules: one rounding
//! of the compute type for `+ - * /`, the ulps of `doc/language.md`'s table for the functions,
//! `1e-5 * sum |x|` for an `f32` sum, and the sensitivity of each function to its arguments'
//! own errors (found by evaluating it at the corners of their intervals). Where an error could
//! change a discrete result (a comparison, a cast to an integer, `floor`, an argmax) the value is
//! *unknown* and not checked. Integers are exact, in i128, wrapped to their width.

use crate::ty::Ty;

/// One element: `f` for floats, `i` for integers and `bool`; `err` bounds the distance of a
/// correct implementation's float from `f`, and is infinite where the value is unknown.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct V {
    pub f: f64,
    pub i: i128,
    pub err: f64,
}

impl V {
    pub const UNKNOWN: V = V {
        f: f64::NAN,
        i: 0,
        err: f64::INFINITY,
    };
    pub fn float(f: f64) -> V {
        V { f, i: 0, err: 0.0 }
    }
    pub fn int(i: i128) -> V {
        V {
            f: 0.0,
            i,
            err: 0.0,
        }
    }
    pub fn known(&self) -> bool {
        self.err.is_finite()
    }
}

/// A parsed description.
pub struct Desc {
    pub ndims: usize,
    pub params: Vec<(Ty, Option<u8>)>,
    /// For each parameter, the dim whose positions its values are, where it indexes a gather.
    pub index_of: Vec<Option<usize>>,
    pub nodes: Vec<Node>,
    pub outs: Vec<(usize, u8)>,
}

pub struct Node {
    pub ty: Ty,
    pub shape: u8,
    pub op: String,
    pub args: Vec<String>,
}

pub fn ty_of(name: &str) -> Ty {
    *crate::ty::ALL
        .iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

impl Desc {
    pub fn parse(text: &str) -> Desc {
        let mut d = Desc {
            ndims: 0,
            params: vec![],
            index_of: vec![],
            nodes: vec![],
            outs: vec![],
        };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[0] {
                "dims" => d.ndims = w[1].parse().unwrap(),
                "param" => {
                    // `param TY scalar` or `param TY tensor K..`, then `index K` for an index.
                    let end = w.iter().position(|&x| x == "index").unwrap_or(w.len());
                    let shape = match w[2] {
                        "scalar" => None,
                        _ => Some(
                            w[3..end]
                                .iter()
                                .fold(0u8, |s, k| s | 1 << k.parse::<u8>().unwrap()),
                        ),
                    };
                    d.params.push((ty_of(w[1]), shape));
                    d.index_of.push(w.get(end + 1).map(|k| k.parse().unwrap()));
                }
                "node" => {
                    assert_eq!(w[1].parse::<usize>().unwrap(), d.nodes.len(), "{line}");
                    d.nodes.push(Node {
                        ty: ty_of(w[2]),
                        shape: w[3].parse().unwrap(),
                        op: w[4].to_string(),
                        args: w[5..].iter().map(|s| s.to_string()).collect(),
                    });
                }
                "out" => d.outs.push((w[1].parse().unwrap(), w[2].parse().unwrap())),
                _ => panic!("bad description line {line}"),
            }
        }
        d
    }

    /// The dims a reduction of this program reduces over (`None` for a full reduction).
    pub fn reduced_dims(&self) -> Vec<Option<usize>> {
        self.nodes
            .iter()
            .filter(|n| n.op == "red")
            .map(|n| n.args[1].parse().ok())
            .collect()
    }
}

/// The elements of a value of `shape` (a mask over the dims) for these dim sizes.
pub fn count(shape: u8, sizes: &[usize]) -> usize {
    (0..sizes.len())
        .filter(|k| shape & (1 << k) != 0)
        .map(|k| sizes[k])
        .product()
}

/// Row-major strides of a value of `shape`, one per dim of the domain (0 for dims it lacks).
fn strides(shape: u8, sizes: &[usize]) -> Vec<usize> {
    let mut st = vec![0; sizes.len()];
    let mut s = 1;
    for k in (0..sizes.len()).rev() {
        if shape & (1 << k) != 0 {
            st[k] = s;
            s *= sizes[k];
        }
    }
    st
}

/// For each element of a value of `shape`, the offset of the element of `of` (a value whose
/// dims are a subset of `shape`'s, or that has the dim `extra` too, at position 0) it reads.
fn gather(shape: u8, of: u8, sizes: &[usize]) -> Vec<usize> {
    let n = count(shape, sizes);
    let dims: Vec<usize> = (0..sizes.len()).filter(|k| shape & (1 << k) != 0).collect();
    let st = strides(of, sizes);
    let mut idx = vec![0usize; dims.len()];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(dims.iter().zip(&idx).map(|(&k, &c)| c * st[k]).sum());
        for j in (0..dims.len()).rev() {
            idx[j] += 1;
            if idx[j] < sizes[dims[j]] {
                break;
            }
            idx[j] = 0;
        }
    }
    out
}

/// Evaluates the program on `inputs` (one vector per parameter, in the parameter's shape) for
/// the dim `sizes`; returns each output's values, row-major.
pub fn run(desc: &Desc, sizes: &[usize], inputs: &[Vec<V>]) -> Vec<Vec<V>> {
    let mut vals: Vec<Vec<V>> = Vec::with_capacity(desc.nodes.len());
    for node in &desc.nodes {
        let v = eval(desc, node, sizes, inputs, &vals);
        debug_assert_eq!(v.len(), count(node.shape, sizes));
        vals.push(v);
    }
    desc.outs.iter().map(|&(o, _)| vals[o].clone()).collect()
}

fn arg(node: &Node, k: usize) -> usize {
    node.args[k].parse().expect("a node id")
}

fn eval(desc: &Desc, node: &Node, sizes: &[usize], inputs: &[Vec<V>], vals: &[Vec<V>]) -> Vec<V> {
    let n = count(node.shape, sizes);
    let ty = node.ty;
    match node.op.as_str() {
        "in" => inputs[arg(node, 0)].clone(),
        "lit" => {
            let text = &node.args[0];
            let v = if ty.is_float() {
                V::float(text.parse().expect("a float literal"))
            } else if ty == Ty::Bool {
                V::int((text == "true") as i128)
            } else {
                V::int(text.parse().expect("an integer literal"))
            };
            vec![v; n]
        }
        "index" => (0..n).map(|c| V::int(c as i128)).collect(),
        "take" => take(desc, node, sizes, inputs, vals),
        "red" => crate::reduce::reduce(desc, node, sizes, vals),
        "dropout" => dropout(desc, node, sizes, vals),
        _ => {
            let ids: Vec<usize> = (0..node.args.len())
                .filter(|&k| !(node.op == "fn" && k == 0))
                .map(|k| arg(node, k))
                .collect();
            let maps: Vec<Vec<usize>> = ids
                .iter()
                .map(|&i| gather(node.shape, desc.nodes[i].shape, sizes))
                .collect();
            let tys: Vec<Ty> = ids.iter().map(|&i| desc.nodes[i].ty).collect();
            let mut out = Vec::with_capacity(n);
            let mut xs = Vec::with_capacity(ids.len());
            for e in 0..n {
                xs.clear();
                xs.extend(ids.iter().zip(&maps).map(|(&i, m)| vals[i][m[e]]));
                out.push(crate::ops::apply(node, ty, &tys, &xs));
            }
            out
        }
    }
}

/// `x[.., i, ..]` (args: the parameter, the gathered dim `k`, the index node): for each
/// element of the node's shape (the parameter's dims but `k`), the parameter's element at the
/// same coordinates and position `i` along `k`, or zero where `i` is outside `k`.
fn take(desc: &Desc, node: &Node, sizes: &[usize], inputs: &[Vec<V>], vals: &[Vec<V>]) -> Vec<V> {
    let (p, k, index) = (arg(node, 0), arg(node, 1), arg(node, 2));
    let table = desc.params[p].1.expect("a gather reads a tensor");
    let base = gather(node.shape, table, sizes);
    let at = gather(node.shape, desc.nodes[index].shape, sizes);
    let stride = strides(table, sizes)[k];
    let zero = match node.ty.is_float() {
        true => V::float(0.0),
        false => V::int(0),
    };
    (0..base.len())
        .map(|e| {
            let i = vals[index][at[e]];
            match usize::try_from(i.i) {
                _ if !i.known() => V::UNKNOWN,
                Ok(i) if i < sizes[k] => inputs[p][base[e] + i * stride],
                _ => zero,
            }
        })
        .collect()
}

/// Offsets for a reduction: for each result element (a value of `shape`), the offset of the
/// first element of its row in the operand (of `of`), and the operand's stride along `r`.
pub fn rows(shape: u8, of: u8, r: usize, sizes: &[usize]) -> (Vec<usize>, usize) {
    (gather(shape, of, sizes), strides(of, sizes)[r])
}

/// `dropout(x, p, seed)` (args: stream, x, p, seed): `0` where the uniform number of the
/// element's position (row-major in the node's shape) and the call's stream, converted to the
/// type, is below `p`, else `x * (1 / (1 - p))`. The numbers are `fuse_runtime::random`'s host
/// copy of the generator: the one place the oracle uses the runtime, as the language defines
/// the bits.
fn dropout(desc: &Desc, node: &Node, sizes: &[usize], vals: &[Vec<V>]) -> Vec<V> {
    let stream: u32 = node.args[0].parse().expect("a stream");
    let (x, p, seed) = (arg(node, 1), arg(node, 2), arg(node, 3));
    let map = gather(node.shape, desc.nodes[x].shape, sizes);
    let seed = vals[seed][0];
    let p = vals[p][0];
    if !seed.known() || !p.known() {
        return vec![V::UNKNOWN; map.len()];
    }
    let scale = 1.0 / (1.0 - p.f);
    let mul = |v: &[f64]| v[0] * scale;
    (0..map.len())
        .map(|e| {
            let u = fuse_runtime::random::uniform(seed.i as u64, e as u64, stream);
            let u = match node.ty {
                Ty::F16 => f64::from(fuse_runtime::f16::from_f32(u)),
                Ty::Bf16 => f64::from(fuse_runtime::bf16::from_f32(u)),
                _ => f64::from(u),
            };
            if u < p.f {
                V::float(0.0)
            } else {
                crate::ops::smooth(&mul, &[vals[x][map[e]]], node.ty, 1.0, 0.0)
            }
        })
        .collect()
}
