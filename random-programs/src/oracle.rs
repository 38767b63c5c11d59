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
    /// The dims past the domain's, `d{ndims}` on: the harness sizes them (see [`Extra`]).
    pub extra: Vec<Extra>,
    /// Each parameter's type and dims (a mask over the dims; `None` for a scalar or a buffer).
    pub params: Vec<(Ty, Option<u8>)>,
    /// For each parameter, the dim whose positions its values are, where it indexes a gather
    /// or a scatter.
    pub index_of: Vec<Option<usize>>,
    /// For each parameter, whether it is a scatter's index, whose in-range values are distinct.
    pub distinct: Vec<bool>,
    /// For each `&mut` parameter, its axes.
    pub buffers: Vec<Option<Vec<Axis>>>,
    /// For each tensor parameter declared with its dims in another order (and read through
    /// `permute`), that order: its dims' `K`s as written.
    pub orders: Vec<Option<Vec<usize>>>,
    pub nodes: Vec<Node>,
    pub outs: Vec<(usize, u8)>,
    /// The writes through `&mut` parameters, in the text's order.
    pub writes: Vec<Write>,
}

/// What an extra dim is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Extra {
    /// The rows of a scatter's buffer, indexed by this parameter.
    Slots(usize),
    /// A part of a buffer's dim that nothing writes.
    Rest,
}

/// A part of an axis made of parts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Part {
    Dim(usize),
    Lit(usize),
}

/// An axis of a `&mut` parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Axis {
    Dim(usize),
    /// Parts one after the other (`2 * d1 + d3` is `d1, d1, d3`).
    Parts(Vec<Part>),
    /// `dK * g`.
    Group(usize, usize),
}

impl Axis {
    pub fn len(&self, sizes: &[usize]) -> usize {
        match self {
            Axis::Dim(k) => sizes[*k],
            Axis::Parts(parts) => parts.iter().map(|p| part_len(*p, sizes)).sum(),
            Axis::Group(k, g) => sizes[*k] * g,
        }
    }
}

fn part_len(p: Part, sizes: &[usize]) -> usize {
    match p {
        Part::Dim(k) => sizes[k],
        Part::Lit(n) => n,
    }
}

/// An item of a written slice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Item {
    All,
    Part(usize),
    Pick(usize),
    /// At the values of this node.
    At(usize),
}

/// `buffer[items] = value;`: the slice's shape is the domain.
pub struct Write {
    pub buffer: usize,
    pub value: usize,
    pub items: Vec<Item>,
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
            extra: vec![],
            params: vec![],
            index_of: vec![],
            distinct: vec![],
            buffers: vec![],
            orders: vec![],
            nodes: vec![],
            outs: vec![],
            writes: vec![],
        };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[0] {
                "dims" => d.ndims = w[1].parse().unwrap(),
                "extra" => d.extra.push(match w[1] {
                    "slots" => Extra::Slots(w[2].parse().unwrap()),
                    _ => Extra::Rest,
                }),
                "param" => {
                    // `param TY scalar`, `param TY tensor K..` or `param TY buffer AXIS..`, then
                    // `order K..` for a tensor declared in another order, `index K` for an
                    // index, and `distinct` for a scatter's.
                    let index = w.iter().position(|&x| x == "index").unwrap_or(w.len());
                    let end = w.iter().position(|&x| x == "order").unwrap_or(index);
                    d.orders.push((end < index).then(|| {
                        w[end + 1..index]
                            .iter()
                            .map(|k| k.parse().unwrap())
                            .collect()
                    }));
                    let (shape, buffer) = match w[2] {
                        "scalar" => (None, None),
                        "buffer" => (None, Some(w[3..].iter().map(|a| axis(a)).collect())),
                        _ => (
                            Some(
                                w[3..end]
                                    .iter()
                                    .fold(0u8, |s, k| s | 1 << k.parse::<u8>().unwrap()),
                            ),
                            None,
                        ),
                    };
                    d.params.push((ty_of(w[1]), shape));
                    d.buffers.push(buffer);
                    d.index_of
                        .push(w.get(index + 1).map(|k| k.parse().unwrap()));
                    d.distinct.push(w.get(index + 2) == Some(&"distinct"));
                }
                "write" => d.writes.push(Write {
                    buffer: w[1].parse().unwrap(),
                    value: w[2].parse().unwrap(),
                    items: w[3..].iter().map(|i| item(i)).collect(),
                }),
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

    /// The type and shape of each result of a call at these dim sizes: the outputs, then each
    /// `&mut` parameter's contents, in the parameters' order.
    pub fn results(&self, sizes: &[usize]) -> Vec<(Ty, Vec<usize>)> {
        let outs = self.outs.iter().map(|&(node, shape)| {
            let dims = (0..sizes.len())
                .filter(|k| shape & (1 << k) != 0)
                .map(|k| sizes[k])
                .collect();
            (self.nodes[node].ty, dims)
        });
        let buffers = self.params.iter().zip(&self.buffers).filter_map(|(p, b)| {
            let axes = b.as_ref()?;
            Some((p.0, axes.iter().map(|a| a.len(sizes)).collect()))
        });
        outs.chain(buffers).collect()
    }

    /// For the index `p` of a scatter, the dims it shares with its buffer (`x[.., i, ..]` with
    /// `i` over `[d0, d1]` and the buffer over `[d0, rows, d2]`: `d0`). Two of its elements go
    /// to one place only where they have the same coordinates there.
    pub fn shared_dims(&self, p: usize) -> u8 {
        let rows = self.index_of[p].expect("a scatter's index");
        let buffer = self
            .buffers
            .iter()
            .flatten()
            .find(|axes| axes.contains(&Axis::Dim(rows)))
            .expect("the buffer of a scatter's rows");
        let dims = buffer.iter().fold(0u8, |m, a| match a {
            Axis::Dim(k) | Axis::Group(k, _) if *k < self.ndims => m | 1 << k,
            Axis::Parts(parts) => parts.iter().fold(m, |m, p| match p {
                Part::Dim(k) if *k < self.ndims => m | 1 << k,
                _ => m,
            }),
            _ => m,
        });
        self.params[p].1.unwrap_or(0) & dims
    }

    /// The dims the reductions of this program reduce over (none for full reductions).
    pub fn reduced_dims(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .filter(|n| n.op == "red")
            .filter_map(|n| reduced(&n.args[1]))
            .flatten()
            .collect()
    }
}

/// The dims of a reduction's description: `r`, or `r:k` for the `k` dims from `r` reduced
/// together (`sum(x, (d1, d2))`); `None` for a reduction over every element.
pub fn reduced(text: &str) -> Option<Vec<usize>> {
    match text.split_once(':') {
        Some((r, k)) => {
            let (r, k): (usize, usize) = (r.parse().ok()?, k.parse().ok()?);
            Some((r..r + k).collect())
        }
        None => Some(vec![text.parse().ok()?]),
    }
}

/// An axis of a buffer in the description: `K`, `p:T,T..` (a part `K` or `#N`), `g:K:G`.
fn axis(text: &str) -> Axis {
    if let Some(parts) = text.strip_prefix("p:") {
        let parts = parts.split(',').map(|p| match p.strip_prefix('#') {
            Some(n) => Part::Lit(n.parse().unwrap()),
            None => Part::Dim(p.parse().unwrap()),
        });
        Axis::Parts(parts.collect())
    } else if let Some(g) = text.strip_prefix("g:") {
        let (k, g) = g.split_once(':').expect("g:K:G");
        Axis::Group(k.parse().unwrap(), g.parse().unwrap())
    } else {
        Axis::Dim(text.parse().unwrap())
    }
}

/// An item of a written slice in the description: `all`, `part:J`, `pick:J`, `at:NODE`.
fn item(text: &str) -> Item {
    let (what, n) = text.split_once(':').unwrap_or((text, "0"));
    let n = n.parse().unwrap();
    match what {
        "all" => Item::All,
        "part" => Item::Part(n),
        "pick" => Item::Pick(n),
        "at" => Item::At(n),
        _ => panic!("bad item {text}"),
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
pub fn gather(shape: u8, of: u8, sizes: &[usize]) -> Vec<usize> {
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

/// What the writes of one call did, by the oracle's count.
#[derive(Clone, Copy, Default, Debug)]
pub struct WriteStats {
    /// Elements stored.
    pub stored: usize,
    /// Elements not stored: their index was below 0.
    pub below: usize,
    /// Elements not stored: their index was at the dim's size or past it.
    pub past: usize,
    /// Elements of the buffers that no write reached (they keep their first values).
    pub untouched: usize,
}

/// Evaluates the program on `inputs` (one vector per parameter, in the parameter's shape; a
/// `&mut` parameter's first contents) for the dim `sizes`; returns each result's values,
/// row-major (see [`Desc::results`]).
pub fn run(desc: &Desc, sizes: &[usize], inputs: &[Vec<V>]) -> Vec<Vec<V>> {
    run_with_stats(desc, sizes, inputs).0
}

/// [`run`], and what its writes did.
pub fn run_with_stats(
    desc: &Desc,
    sizes: &[usize],
    inputs: &[Vec<V>],
) -> (Vec<Vec<V>>, WriteStats) {
    let mut vals: Vec<Vec<V>> = Vec::with_capacity(desc.nodes.len());
    for node in &desc.nodes {
        let v = eval(desc, node, sizes, inputs, &vals);
        debug_assert_eq!(v.len(), count(node.shape, sizes));
        vals.push(v);
    }
    let mut results: Vec<Vec<V>> = desc.outs.iter().map(|&(o, _)| vals[o].clone()).collect();
    let mut stats = WriteStats::default();
    for (p, axes) in desc.buffers.iter().enumerate() {
        let Some(axes) = axes else { continue };
        let mut buffer = inputs[p].clone();
        let mut reached = vec![false; buffer.len()];
        for w in desc.writes.iter().filter(|w| w.buffer == p) {
            write(
                desc,
                w,
                axes,
                sizes,
                &vals,
                &mut buffer,
                &mut reached,
                &mut stats,
            );
        }
        stats.untouched += reached.iter().filter(|&&r| !r).count();
        results.push(buffer);
    }
    (results, stats)
}

/// Stores the elements of `w` in `buffer`: for each element of the domain (the slice's shape,
/// row-major), its place along each axis of the buffer, or nothing where a scatter's index is
/// outside the rows.
#[allow(clippy::too_many_arguments)]
fn write(
    desc: &Desc,
    w: &Write,
    axes: &[Axis],
    sizes: &[usize],
    vals: &[Vec<V>],
    buffer: &mut [V],
    reached: &mut [bool],
    stats: &mut WriteStats,
) {
    let domain = (1u8 << desc.ndims) - 1;
    let dims: Vec<usize> = (0..desc.ndims).collect();
    let n = count(domain, sizes);
    let value = gather(domain, desc.nodes[w.value].shape, sizes);
    let index = w.items.iter().find_map(|i| match *i {
        Item::At(node) => Some((node, gather(domain, desc.nodes[node].shape, sizes))),
        _ => None,
    });
    let lens: Vec<usize> = axes.iter().map(|a| a.len(sizes)).collect();
    let mut c = vec![0usize; desc.ndims];
    for e in 0..n {
        let place = 'place: {
            let mut offset = 0;
            for ((axis, item), len) in axes.iter().zip(&w.items).zip(&lens) {
                let at = match (*item, axis) {
                    (Item::All, Axis::Dim(k)) => c[*k],
                    (Item::At(node), Axis::Dim(k)) => {
                        let (_, map) = index.as_ref().expect("the scatter's index");
                        let i = vals[node][map[e]];
                        assert!(i.known(), "a scatter's index is known");
                        match usize::try_from(i.i) {
                            Ok(i) if i < sizes[*k] => i,
                            Ok(_) => break 'place Err(false),
                            Err(_) => break 'place Err(true),
                        }
                    }
                    (Item::Part(j), Axis::Parts(parts)) => {
                        let start: usize = parts[..j].iter().map(|p| part_len(*p, sizes)).sum();
                        match parts[j] {
                            Part::Dim(k) => start + c[k],
                            Part::Lit(_) => unreachable!("a written part is a dim of the domain"),
                        }
                    }
                    (Item::Pick(j), Axis::Group(k, g)) => c[*k] * g + j,
                    (item, axis) => unreachable!("{item:?} of {axis:?}"),
                };
                offset = offset * len + at;
            }
            Ok(offset)
        };
        match place {
            Ok(offset) => {
                buffer[offset] = vals[w.value][value[e]];
                reached[offset] = true;
                stats.stored += 1;
            }
            Err(true) => stats.below += 1,
            Err(false) => stats.past += 1,
        }
        // The next element's coordinates, row-major over the domain.
        for &k in dims.iter().rev() {
            c[k] += 1;
            if c[k] < sizes[k] {
                break;
            }
            c[k] = 0;
        }
    }
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
            // NVRTC may fuse a float product into the sum or difference that takes it, and a
            // product that overflows alone need not inside the FMA: `x * y - inf` is -inf
            // fused, NaN (`inf - inf`) not (p6329 of the 10,000-program run). Such a sum is
            // left open where the product is infinite.
            let fusable = ty.is_float() && matches!(node.op.as_str(), "add" | "sub");
            let products: Vec<bool> = ids
                .iter()
                .map(|&i| fusable && desc.nodes[i].op == "mul" && desc.nodes[i].ty.is_float())
                .collect();
            let mut out = Vec::with_capacity(n);
            let mut xs = Vec::with_capacity(ids.len());
            for e in 0..n {
                xs.clear();
                xs.extend(ids.iter().zip(&maps).map(|(&i, m)| vals[i][m[e]]));
                let overflowed = xs
                    .iter()
                    .zip(&products)
                    .any(|(x, &p)| p && x.f.is_infinite());
                out.push(match overflowed {
                    true => V::UNKNOWN,
                    false => crate::ops::apply(node, ty, &tys, &xs),
                });
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
