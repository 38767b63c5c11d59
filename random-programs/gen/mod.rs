//! The generator of random, well-typed `fuse!` functions (used by `build.rs`).
//!
//! A program is built as a DAG of typed nodes over the dims of one domain. Each node is written
//! twice: as the language's text (which `fuse!` compiles) and as one line of a small data
//! description (which the test's oracle, `src/oracle.rs`, evaluates without the macro). The
//! generator follows the language's rules so that every program checks: shapes are subsequences
//! of the domain's dims, a kernel reduces over one dim (`Rows`), over everything (`Full`) or not
//! at all (`Map`), and literals sit only where inference gives them a type. Some map programs
//! also write through `&mut` parameters (`write_group`): each write's slice has the domain's
//! shape, the launch's, and the description says where each element goes.

pub mod ty;

use std::fmt::Write;
use ty::{Rng, Ty, FLOATS, INTS};

/// One generated program: the `fn` item, its description for the oracle, and the glue that
/// calls it with the harness's inputs.
pub struct Program {
    pub name: String,
    pub seed: u64,
    pub text: String,
    pub desc: String,
    pub glue: String,
    /// For a program with derivatives (`#[vjp]` and `#[jvp]` of every float parameter): the
    /// glue that checks them (`fn derive_NAME`).
    pub derive: Option<String>,
}

/// How a kernel iterates (see the language reference, "One fn, one launch").
#[derive(Clone, Copy, PartialEq, Debug)]
enum Scheme {
    Map,
    Rows(usize),
    Full,
}

/// Where an expression is generated: which reductions it may contain.
#[derive(Clone, Copy, PartialEq)]
enum Red {
    /// None (elementwise code, or the operand of a full reduction).
    None,
    /// Reductions over this dim.
    Dim(usize),
    /// Full reductions (the scalar outputs of a `Full` kernel).
    Full,
}

struct Param {
    name: String,
    ty: Ty,
    /// The dims, as a mask over the domain's; `None` for a scalar.
    shape: Option<u8>,
    /// For an index of a gather: the dim whose positions its values are (the harness draws
    /// them mostly inside it, some outside). For the index of a scatter, the extra dim of the
    /// buffer's rows.
    index: Option<usize>,
    /// The index of a scatter: its in-range values are distinct (where two elements go to one
    /// place, which one a GPU stores is unspecified).
    distinct: bool,
    /// A `&mut` parameter: its axes (it has no node: it is never read).
    buffer: Option<Vec<Axis>>,
    /// A tensor declared with its dims in another order than the signature's (their `K`s, as
    /// written), read through `permute`.
    order: Option<Vec<usize>>,
}

/// An axis of a `&mut` parameter.
#[derive(Clone)]
enum Axis {
    /// A plain dim (of the domain, or an extra dim: a scatter's rows).
    Dim(usize),
    /// A dim made of parts, one after the other (`2 * d1 + d3`, `3 + d1`).
    Parts(Vec<Term>),
    /// `dK * g`: `dK` groups of `g` adjacent elements.
    Group(usize, usize),
}

/// A term of a sum of parts.
#[derive(Clone, Copy)]
enum Term {
    /// `n * dK`: `n` parts of the dim `K`.
    Dims(usize, usize),
    /// An integer literal: one part of that size.
    Lit(usize),
}

/// An item of a written slice, one an axis of the buffer.
#[derive(Clone, Copy)]
enum Item {
    All,
    /// Part `j` of a sum.
    Part(usize),
    /// Element `j` of each group.
    Pick(usize),
    /// A scatter at the values of this node.
    At(usize),
}

/// What an extra dim (past the domain's) is: sized by the harness, not drawn as the domain's.
enum Extra {
    /// The rows of a scatter's buffer, indexed by this parameter.
    Slots(usize),
    /// A part of a buffer's dim that nothing writes.
    Rest,
}

/// `buffer[items] = value;`
struct WriteStmt {
    buffer: usize,
    value: usize,
    items: Vec<Item>,
}

struct Node {
    ty: Ty,
    shape: u8,
    text: String,
    /// Bound by `let`, so that later expressions may use it again.
    bound: bool,
    /// Depends on a full reduction (usable only in scalar outputs).
    full: bool,
    literal: bool,
    /// The parameter it is (its index in `params`), under whatever name a `let` gave it.
    input: Option<usize>,
}

struct Gen {
    rng: Rng,
    ndims: usize,
    scheme: Scheme,
    /// The element types this program favours, so that types meet.
    favourite: [Ty; 2],
    params: Vec<Param>,
    nodes: Vec<Node>,
    lets: Vec<String>,
    desc: Vec<String>,
    reductions: usize,
    /// The next reduction must be over the whole domain: a row kernel's domain is the largest
    /// shape of its outputs and reduction operands, and every other must fit in it.
    need_full_operand: bool,
    /// Random calls so far: the next one's stream.
    random_sites: usize,
    /// The choices added after the first batches, drawn apart from `rng` (see `leaf`).
    side: Rng,
    /// How many dims a row kernel reduces over at once, from its `Scheme::Rows` dim on: 2 in
    /// some programs of two or three dims (`sum(x, (d0, d1))`), drawn apart from `rng`.
    span: usize,
    /// Whether a map program writes through `&mut` parameters, and how: drawn apart from `rng`
    /// and `side`, so that a program without writes is the one its seed gave before.
    wrng: Rng,
    /// The stream that picks the parameters read through `permute` and their orders.
    prng: Rng,
    /// The extra dims, `d{ndims}` on.
    extra: Vec<Extra>,
    writes: Vec<WriteStmt>,
}

const FLOAT_LITERALS: [&str; 8] = ["0.5", "1.0", "2.0", "3.0", "0.25", "1.5", "4.0", "0.125"];

/// One-argument float functions: methods and free functions both.
const FLOAT_FNS: [&str; 32] = [
    "exp",
    "exp2",
    "exp_m1",
    "ln",
    "log2",
    "log10",
    "ln_1p",
    "sqrt",
    "cbrt",
    "recip",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "floor",
    "ceil",
    "trunc",
    "round",
    "fract",
    "to_degrees",
    "to_radians",
    "abs",
    "signum",
    "exp",
];

/// The ML functions: free functions only.
const ML_FNS: [&str; 8] = [
    "sigmoid",
    "silu",
    "relu",
    "gelu",
    "gelu_tanh",
    "softplus",
    "erf",
    "rsqrt",
];

const FLOAT_TESTS: [&str; 5] = [
    "is_nan",
    "is_finite",
    "is_infinite",
    "is_sign_negative",
    "is_sign_positive",
];

/// The parts of a sum, one term each (`2 * d1` is two parts `d1`).
fn parts(terms: &[Term]) -> Vec<Term> {
    terms
        .iter()
        .flat_map(|&t| match t {
            Term::Dims(c, k) => vec![Term::Dims(1, k); c],
            lit => vec![lit],
        })
        .collect()
}

/// Parts back into a sum: adjacent parts of one dim as one term.
fn merge(parts: &[Term]) -> Vec<Term> {
    let mut out: Vec<Term> = vec![];
    for &p in parts {
        match (out.last_mut(), p) {
            (Some(Term::Dims(c, k)), Term::Dims(1, j)) if *k == j => *c += 1,
            _ => out.push(p),
        }
    }
    out
}

fn group(axis: &Axis) -> usize {
    match axis {
        Axis::Group(_, g) => *g,
        _ => unreachable!("a pick of a group"),
    }
}

/// Generates the program `name` from `seed`.
pub fn program(name: &str, seed: u64) -> Program {
    let mut rng = Rng(seed);
    let ndims = 1 + rng.below(3);
    let scheme = match rng.weighted(&[30, 50, 20]) {
        0 => Scheme::Map,
        1 => Scheme::Rows(rng.below(ndims)),
        _ => Scheme::Full,
    };
    let favourite = [rng.pick(&ty::ALL), rng.pick(&FLOATS)];
    let mut g = Gen {
        rng,
        ndims,
        scheme,
        favourite,
        params: vec![],
        nodes: vec![],
        lets: vec![],
        desc: vec![],
        reductions: 0,
        need_full_operand: false,
        random_sites: 0,
        side: Rng(seed ^ 0x9a7e_5eed_0000_0001),
        span: 1,
        wrng: Rng(seed ^ 0x3717_e5ee_d000_0002),
        prng: Rng(seed ^ 0x7e3a_17ed_0000_0004),
        extra: vec![],
        writes: vec![],
    };
    // Some row kernels reduce over two adjacent dims at once.
    if let Scheme::Rows(r) = g.scheme {
        if ndims >= 2 && Rng(seed ^ 0x5ba2_0d15_0000_0003).percent(25) {
            g.span = 2;
            g.scheme = Scheme::Rows(r.min(ndims - 2));
        }
    }
    // The first parameter names every dim in order, so that unions of shapes follow it.
    let first = g.pick_ty(false);
    g.new_param(first, Some(g.domain()));
    // A launch that writes is elementwise: some map programs write through `&mut` parameters,
    // beside their outputs (the same outputs as without the writes) or with none.
    let writes = g.scheme == Scheme::Map && g.wrng.percent(45);
    let outputs = match writes && g.wrng.percent(35) {
        true => vec![],
        false => g.outputs(),
    };
    if writes {
        for _ in 0..1 + g.wrng.percent(30) as usize {
            g.write_group();
        }
    }
    g.finish(name, seed, &outputs)
}

impl Gen {
    fn domain(&self) -> u8 {
        (1u8 << self.ndims) - 1
    }

    fn dim(k: usize) -> String {
        format!("d{k}")
    }

    /// The dims a row kernel's reductions from dim `r` take, as a mask.
    fn rmask(&self, r: usize) -> u8 {
        ((1u8 << self.span) - 1) << r
    }

    /// Whether `shape` has some of the dims reduced together and not all: a random value over
    /// it would draw its numbers by positions the merged dim does not keep (an error).
    fn split_by_reduction(&self, shape: u8) -> bool {
        match self.scheme {
            Scheme::Rows(r) if self.span > 1 => {
                let m = self.rmask(r);
                shape & m != 0 && shape & m != m
            }
            _ => false,
        }
    }

    /// A type for a new value: often one of the program's favourites.
    fn pick_ty(&mut self, bool_ok: bool) -> Ty {
        loop {
            let t = if self.rng.percent(60) {
                self.rng.pick(&self.favourite)
            } else {
                self.rng.pick(&ty::ALL)
            };
            if bool_ok || t != Ty::Bool {
                return t;
            }
        }
    }

    fn new_param(&mut self, ty: Ty, shape: Option<u8>) -> usize {
        let i = self.params.len();
        let name = match shape {
            Some(_) => format!("x{i}"),
            None => format!("s{i}"),
        };
        self.params.push(Param {
            name: name.clone(),
            ty,
            shape,
            index: None,
            distinct: false,
            buffer: None,
            order: None,
        });
        let id = self.node(
            ty,
            shape.unwrap_or(0),
            name,
            format!("in {i}"),
            false,
            false,
        );
        self.nodes[id].input = Some(i);
        id
    }

    /// Adds a node; `op` is its description after the type.
    fn node(
        &mut self,
        ty: Ty,
        shape: u8,
        text: String,
        op: String,
        full: bool,
        lit: bool,
    ) -> usize {
        let id = self.nodes.len();
        self.desc
            .push(format!("node {id} {} {shape} {op}", ty.name()));
        self.nodes.push(Node {
            ty,
            shape,
            text,
            bound: false,
            full,
            literal: lit,
            input: None,
        });
        id
    }

    /// Binds a compound node with `let` now and then, so that it can be used again.
    fn maybe_bind(&mut self, id: usize) -> usize {
        if !self.nodes[id].literal && !self.nodes[id].bound && self.rng.percent(25) {
            let name = format!("v{id}");
            let line = format!("let {name} = {};", self.nodes[id].text);
            self.lets.push(line);
            let n = &mut self.nodes[id];
            n.text = name;
            n.bound = true;
        }
        id
    }

    fn t(&self, id: usize) -> &str {
        &self.nodes[id].text
    }

    fn full_of(&self, ids: &[usize]) -> bool {
        ids.iter().any(|&i| self.nodes[i].full)
    }

    fn shape_of(&self, ids: &[usize]) -> u8 {
        ids.iter().fold(0, |s, &i| s | self.nodes[i].shape)
    }

    // -----------------------------------------------------------------------------------------
    // Outputs.

    fn outputs(&mut self) -> Vec<usize> {
        let d = self.domain();
        let n = 1 + self.rng.weighted(&[50, 35, 15]);
        let mut outs = vec![];
        let whole_first = self.rng.percent(50);
        self.need_full_operand = matches!(self.scheme, Scheme::Rows(_)) && !whole_first;
        for k in 0..n {
            let ty = self.pick_ty(true);
            let out = match self.scheme {
                Scheme::Map => {
                    let e = self.expr(ty, d, 3, Red::None);
                    self.fit(e, ty, d, Red::None)
                }
                Scheme::Rows(r) => {
                    let whole = if k == 0 {
                        whole_first
                    } else {
                        self.rng.percent(50)
                    };
                    let shape = if whole { d } else { d & !self.rmask(r) };
                    let e = self.expr(ty, shape, 3, Red::Dim(r));
                    let e = self.fit(e, ty, shape, Red::Dim(r));
                    if k == n - 1 && (self.reductions == 0 || self.need_full_operand) {
                        // A row kernel needs a reduction: tie one into the last output.
                        let red = self.reduction(ty, shape, 1, r);
                        self.combine(e, red, ty)
                    } else {
                        e
                    }
                }
                Scheme::Full => {
                    if k == 0 || self.rng.percent(50) {
                        let e = self.expr(ty, 0, 3, Red::Full);
                        if self.nodes[e].full {
                            e
                        } else {
                            let red = self.full_reduction(ty, 1);
                            self.combine(e, red, ty)
                        }
                    } else {
                        let e = self.expr(ty, d, 3, Red::None);
                        self.fit(e, ty, d, Red::None)
                    }
                }
            };
            outs.push(out);
        }
        outs
    }

    /// `e` (of type `ty`) widened to exactly `shape` by combining it with values over the dims
    /// it lacks.
    fn fit(&mut self, mut e: usize, ty: Ty, shape: u8, red: Red) -> usize {
        if self.nodes[e].literal {
            let other = self.leaf(ty, shape, red);
            e = self.combine(other, e, ty);
        }
        while self.nodes[e].shape != shape {
            let missing = shape & !self.nodes[e].shape;
            let k = missing.trailing_zeros() as usize;
            let term = self.leaf_with_dim(ty, shape, k);
            e = self.combine(e, term, ty);
        }
        e
    }

    /// A binary operation of `ty` on `a` and `b`, one that keeps both operands' shapes.
    fn combine(&mut self, a: usize, b: usize, ty: Ty) -> usize {
        let op = if ty == Ty::Bool {
            self.rng.pick(&["&&", "||", "^", "=="])
        } else if ty.is_float() {
            self.rng.pick(&["+", "-", "*", "max", "min"])
        } else {
            self.rng.pick(&["+", "-", "*", "^", "|", "max", "min"])
        };
        match op {
            "max" | "min" => self.method(op, ty, a, &[b]),
            _ => self.binary(op, ty, a, b),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Expressions.

    /// An expression of type `ty` whose shape is within `max`.
    fn expr(&mut self, ty: Ty, max: u8, depth: usize, red: Red) -> usize {
        if depth == 0 || self.rng.percent(15) {
            return self.leaf(ty, max, red);
        }
        let id = match ty {
            Ty::Bool => self.bool_expr(max, depth, red),
            t if t.is_float() => self.float_expr(ty, max, depth, red),
            _ => self.int_expr(ty, max, depth, red),
        };
        self.maybe_bind(id)
    }

    /// An operand: an expression, or (when `lit_ok`) now and then a literal.
    fn operand(&mut self, ty: Ty, max: u8, depth: usize, red: Red, lit_ok: bool) -> usize {
        if lit_ok && ty != Ty::Bool && self.rng.percent(25) {
            self.literal(ty)
        } else {
            self.expr(ty, max, depth, red)
        }
    }

    fn literal(&mut self, ty: Ty) -> usize {
        let text = if ty.is_float() {
            let l = self.rng.pick(&FLOAT_LITERALS);
            if self.rng.percent(20) {
                format!("(-{l})")
            } else {
                l.to_string()
            }
        } else if ty == Ty::Bool {
            self.rng.pick(&["true", "false"]).to_string()
        } else {
            let v = match self.rng.below(4) {
                0 => self.rng.below(ty.int_max() as usize + 1) as u64,
                _ => self.rng.below(10) as u64,
            };
            if ty.is_signed() && self.rng.percent(25) {
                format!("(-{v})")
            } else {
                v.to_string()
            }
        };
        let value = text
            .trim_start_matches('(')
            .trim_end_matches(')')
            .to_string();
        self.node(ty, 0, text, format!("lit {value}"), false, true)
    }

    /// A leaf of type `ty` within `max`: a parameter, a bound value, or a conversion of one.
    fn leaf(&mut self, ty: Ty, max: u8, red: Red) -> usize {
        let usable: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| {
                let n = &self.nodes[i];
                n.ty == ty
                    && n.shape & !max == 0
                    && (n.bound || n.input.is_some())
                    && (red == Red::Full || !n.full)
            })
            .collect();
        if !usable.is_empty() && self.rng.percent(70) {
            return self.rng.pick(&usable);
        }
        if red == Red::Full && max == 0 && self.rng.percent(60) {
            return self.full_reduction(ty, 2);
        }
        // Drawn from a stream of its own, so that a program without a gather is the one the
        // seed gave before gathers were generated (their kernels' spill checks stand).
        if self.side.percent(12) && self.span == 1 {
            return self.gather(ty, max);
        }
        let shape = if max == 0 || self.rng.percent(15) {
            None
        } else {
            Some(self.subshape(max))
        };
        if self.rng.percent(70) {
            let p = self.new_param(ty, shape);
            self.maybe_permute(p)
        } else {
            // A parameter of another type, converted.
            let from = self.pick_ty(true);
            let p = self.new_param(from, shape);
            let p = self.maybe_permute(p);
            self.convert(p, ty)
        }
    }

    /// A gather of type `ty` within `max`: a new tensor parameter over the dims `rest` and `k`
    /// (a dim of the domain, any), read along `k` at an index whose dims are some of `rest`'s
    /// (`x[.., i, ..]`); the result is over `rest`. The index is a new integer parameter whose
    /// values the harness draws inside `k` mostly, now and then converted to another integer
    /// type (which may wrap it out of range, where the gather reads zero).
    fn gather(&mut self, ty: Ty, max: u8) -> usize {
        let k = self.rng.below(self.ndims);
        let rest = match max & !(1 << k) {
            0 => 0,
            m => self.subshape(m) & !(1 << k),
        };
        let table_shape = rest | 1 << k;
        let index_shape = match rest {
            0 => None,
            r => Some(self.subshape(r)).filter(|_| self.rng.percent(85)),
        };
        let table = self.new_param(ty, Some(table_shape));
        let index_ty = self.rng.pick(&INTS);
        let index = self.new_param(index_ty, index_shape);
        let p = self.params.len() - 1;
        self.params[p].index = Some(k);
        let index = match self.rng.percent(25) {
            true => {
                let to = self.rng.pick(&INTS);
                self.convert(index, to)
            }
            false => index,
        };
        let items: Vec<String> = (0..self.ndims)
            .filter(|d| table_shape & (1 << d) != 0)
            .map(|d| match d == k {
                true => self.t(index).to_string(),
                false => "..".to_string(),
            })
            .collect();
        let text = format!("{}[{}]", self.t(table), items.join(", "));
        let tp = self.params.len() - 2;
        self.node(
            ty,
            rest,
            text,
            format!("take {tp} {k} {index}"),
            false,
            false,
        )
    }

    /// A leaf of type `ty` within `max` that has the dim `k`.
    fn leaf_with_dim(&mut self, ty: Ty, max: u8, k: usize) -> usize {
        if self.rng.percent(20) {
            let i = self.node(
                Ty::U32,
                1 << k,
                format!("index({})", Self::dim(k)),
                format!("index {k}"),
                false,
                false,
            );
            return self.convert(i, ty);
        }
        let shape = self.subshape(max) | (1 << k);
        let from = if self.rng.percent(70) {
            ty
        } else {
            self.pick_ty(true)
        };
        let p = self.new_param(from, Some(shape));
        let p = self.maybe_permute(p);
        self.convert(p, ty)
    }

    /// Parameter node `id`, now and then (a stream of its own, so that other programs are the
    /// ones their seeds gave before) declared with its dims in another order and read through
    /// `permute(x, (..))` in the signature's: a tensor of two dims or more, never the first
    /// parameter (which names every dim in order).
    fn maybe_permute(&mut self, id: usize) -> usize {
        let p = self.nodes[id].input.expect("a parameter");
        let shape = self.params[p].shape.unwrap_or(0);
        let dims: Vec<usize> = (0..self.ndims).filter(|k| shape & (1 << k) != 0).collect();
        if p == 0 || dims.len() < 2 || !self.prng.percent(10) {
            return id;
        }
        let mut order = dims.clone();
        while order == dims {
            for i in (1..order.len()).rev() {
                let j = self.prng.below(i + 1);
                order.swap(i, j);
            }
        }
        let names: Vec<String> = dims.iter().map(|&k| Self::dim(k)).collect();
        self.nodes[id].text = format!("permute({}, ({}))", self.params[p].name, names.join(", "));
        self.params[p].order = Some(order);
        id
    }

    /// A random non-empty subset of `max`.
    fn subshape(&mut self, max: u8) -> u8 {
        loop {
            let s = (self.rng.next_u64() as u8) & max;
            if s != 0 || max == 0 {
                return if self.rng.percent(40) { max } else { s };
            }
        }
    }

    /// `e` as `ty`: a cast, through an integer where `e` is `bool`, or a comparison where `ty`
    /// is `bool`.
    fn convert(&mut self, e: usize, ty: Ty) -> usize {
        let from = self.nodes[e].ty;
        if from == ty {
            e
        } else if ty == Ty::Bool {
            let zero = self.literal_zero(from);
            let op = self.rng.pick(&["<", "!=", ">="]);
            self.binary(op, from, e, zero)
        } else if from == Ty::Bool && ty.is_float() {
            let i = self.cast(e, Ty::U8);
            self.cast(i, ty)
        } else {
            self.cast(e, ty)
        }
    }

    fn literal_zero(&mut self, ty: Ty) -> usize {
        let text = if ty.is_float() { "0.0" } else { "0" };
        self.node(ty, 0, text.into(), "lit 0".into(), false, true)
    }

    fn cast(&mut self, e: usize, ty: Ty) -> usize {
        let text = format!("({} as {})", self.t(e), ty.name());
        let (shape, full) = (self.nodes[e].shape, self.nodes[e].full);
        self.node(ty, shape, text, format!("cast {e}"), full, false)
    }

    /// `a op b` for an operator whose result has the operands' type (`ty`), or `bool` for
    /// comparisons (then `ty` is the operands' type).
    fn binary(&mut self, op: &str, ty: Ty, a: usize, b: usize) -> usize {
        let name = match op {
            "+" => "add",
            "-" => "sub",
            "*" => "mul",
            "/" => "div",
            "%" => "rem",
            "&" => "and",
            "|" => "or",
            "^" => "xor",
            "<<" => "shl",
            ">>" => "shr",
            "==" => "eq",
            "!=" => "ne",
            "<" => "lt",
            "<=" => "le",
            ">" => "gt",
            ">=" => "ge",
            "&&" => "land",
            "||" => "lor",
            _ => unreachable!("unknown operator {op}"),
        };
        let out = if matches!(name, "eq" | "ne" | "lt" | "le" | "gt" | "ge") {
            Ty::Bool
        } else {
            ty
        };
        let text = format!("({} {op} {})", self.t(a), self.t(b));
        let (shape, full) = (self.shape_of(&[a, b]), self.full_of(&[a, b]));
        self.node(out, shape, text, format!("{name} {a} {b}"), full, false)
    }

    /// `a.name(args..)`, of type `ty`.
    fn method(&mut self, name: &str, ty: Ty, a: usize, args: &[usize]) -> usize {
        let list: Vec<&str> = args.iter().map(|&i| self.t(i)).collect();
        let text = format!("{}.{name}({})", self.t(a), list.join(", "));
        let mut all = vec![a];
        all.extend(args);
        let ids: Vec<String> = all.iter().map(|i| i.to_string()).collect();
        let (shape, full) = (self.shape_of(&all), self.full_of(&all));
        self.node(
            ty,
            shape,
            text,
            format!("fn {name} {}", ids.join(" ")),
            full,
            false,
        )
    }

    /// A one-argument function, as a method or a free function.
    fn call1(&mut self, name: &str, ty: Ty, a: usize, free: bool) -> usize {
        let text = if free {
            format!("{name}({})", self.t(a))
        } else {
            format!("{}.{name}()", self.t(a))
        };
        let (shape, full) = (self.nodes[a].shape, self.nodes[a].full);
        self.node(ty, shape, text, format!("fn {name} {a}"), full, false)
    }

    fn select(&mut self, ty: Ty, max: u8, depth: usize, red: Red) -> usize {
        let c = self.expr(Ty::Bool, max, depth - 1, red);
        let a = self.expr(ty, max, depth - 1, red);
        let b = self.operand(ty, max, depth - 1, red, true);
        let text = format!(
            "(if {} {{ {} }} else {{ {} }})",
            self.t(c),
            self.t(a),
            self.t(b)
        );
        let (shape, full) = (self.shape_of(&[c, a, b]), self.full_of(&[c, a, b]));
        self.node(ty, shape, text, format!("sel {c} {a} {b}"), full, false)
    }

    fn float_expr(&mut self, ty: Ty, max: u8, depth: usize, red: Red) -> usize {
        let reduce = if matches!(red, Red::Dim(_)) { 14 } else { 0 };
        let d = depth - 1;
        match self
            .rng
            .weighted(&[24, 24, 10, 8, 10, reduce, 6, 3, 4, 3, 3])
        {
            0 => {
                let f = self.rng.pick(&FLOAT_FNS);
                let a = self.expr(ty, max, d, red);
                let free = self.rng.percent(30);
                self.call1(f, ty, a, free)
            }
            1 => {
                let op = self.rng.pick(&["+", "-", "*", "/", "%"]);
                let a = self.expr(ty, max, d, red);
                let b = self.operand(ty, max, d, red, true);
                self.binary(op, ty, a, b)
            }
            2 => {
                let f = self
                    .rng
                    .pick(&["max", "min", "powf", "atan2", "hypot", "copysign", "log"]);
                let a = self.expr(ty, max, d, red);
                let b = self.operand(ty, max, d, red, true);
                self.method(f, ty, a, &[b])
            }
            3 => self.select(ty, max, depth, red),
            4 => {
                let from = self.pick_ty(true);
                let e = self.expr(from, max, d, red);
                self.convert(e, ty)
            }
            5 => match red {
                Red::Dim(r) => self.reduction(ty, max, d, r),
                _ => unreachable!("weight 0"),
            },
            6 => {
                let f = self.rng.pick(&ML_FNS);
                let a = self.expr(ty, max, d, red);
                self.call1(f, ty, a, true)
            }
            7 => {
                let a = self.expr(ty, max, d, red);
                let text = format!("(-{})", self.t(a));
                let (s, full) = (self.nodes[a].shape, self.nodes[a].full);
                self.node(ty, s, text, format!("neg {a}"), full, false)
            }
            8 => {
                let f = self.rng.pick(&["clamp", "mul_add"]);
                let a = self.expr(ty, max, d, red);
                let b = self.operand(ty, max, d, red, true);
                let c = self.operand(ty, max, d, red, true);
                self.method(f, ty, a, &[b, c])
            }
            10 => self.dropout(ty, max, d, red),
            _ => {
                let a = self.expr(ty, max, d, red);
                let n = if self.rng.percent(60) {
                    let v = self.rng.below(12) as i64 - 4;
                    let text = if v < 0 {
                        format!("({v})")
                    } else {
                        v.to_string()
                    };
                    self.node(Ty::I32, 0, text, format!("lit {v}"), false, true)
                } else {
                    self.expr(Ty::I32, max, d, red)
                };
                self.method("powi", ty, a, &[n])
            }
        }
    }

    fn int_expr(&mut self, ty: Ty, max: u8, depth: usize, red: Red) -> usize {
        let d = depth - 1;
        let reduce = if matches!(red, Red::Dim(_)) { 10 } else { 0 };
        let u32_only = if ty == Ty::U32 { 4 } else { 0 };
        match self
            .rng
            .weighted(&[30, 6, 6, 8, 3, 14, 8, reduce, u32_only, u32_only])
        {
            0 => {
                let op = self.rng.pick(&["+", "-", "*", "/", "%", "&", "|", "^"]);
                let a = self.expr(ty, max, d, red);
                let b = self.operand(ty, max, d, red, true);
                self.binary(op, ty, a, b)
            }
            1 => {
                let op = self.rng.pick(&["<<", ">>"]);
                let a = self.expr(ty, max, d, red);
                let b = if self.rng.percent(50) {
                    let v = self.rng.below(ty.int_max().min(100) as usize);
                    self.node(ty, 0, v.to_string(), format!("lit {v}"), false, true)
                } else {
                    let by = self.rng.pick(&INTS);
                    self.expr(by, max, d, red)
                };
                self.binary(op, ty, a, b)
            }
            2 => {
                let a = self.expr(ty, max, d, red);
                let (s, full) = (self.nodes[a].shape, self.nodes[a].full);
                if ty.is_signed() && self.rng.percent(50) {
                    let text = format!("(-{})", self.t(a));
                    self.node(ty, s, text, format!("neg {a}"), full, false)
                } else {
                    let text = format!("(!{})", self.t(a));
                    self.node(ty, s, text, format!("not {a}"), full, false)
                }
            }
            3 => {
                let a = self.expr(ty, max, d, red);
                match self.rng.below(4) {
                    0 if ty.is_signed() => {
                        let f = self.rng.pick(&["abs", "signum"]);
                        let free = self.rng.percent(30);
                        self.call1(f, ty, a, free)
                    }
                    1 => {
                        let b = self.operand(ty, max, d, red, true);
                        let c = self.operand(ty, max, d, red, true);
                        self.method("clamp", ty, a, &[b, c])
                    }
                    _ => {
                        let f = self.rng.pick(&["max", "min"]);
                        let b = self.operand(ty, max, d, red, true);
                        self.method(f, ty, a, &[b])
                    }
                }
            }
            4 => {
                let a = self.expr(ty, max, d, red);
                let n = if self.rng.percent(70) {
                    let v = self.rng.below(9);
                    self.node(Ty::U32, 0, v.to_string(), format!("lit {v}"), false, true)
                } else {
                    self.expr(Ty::U32, max, d, red)
                };
                self.method("pow", ty, a, &[n])
            }
            5 => {
                let from = self.pick_ty(true);
                let e = self.expr(from, max, d, red);
                self.convert(e, ty)
            }
            6 => self.select(ty, max, depth, red),
            7 => match red {
                Red::Dim(r) => self.reduction(ty, max, d, r),
                _ => unreachable!("weight 0"),
            },
            8 => {
                let from = self.rng.pick(&INTS);
                let a = self.expr(from, max, d, red);
                let f = self
                    .rng
                    .pick(&["count_ones", "leading_zeros", "trailing_zeros"]);
                let free = self.rng.percent(30);
                self.call1(f, Ty::U32, a, free)
            }
            _ => match red {
                Red::Dim(r) if self.rng.percent(70) => self.reduction(Ty::U32, max, d, r),
                _ => {
                    let k = self.rng.below(self.ndims);
                    if max & (1 << k) == 0 {
                        return self.leaf(ty, max, red);
                    }
                    let text = format!("index({})", Self::dim(k));
                    self.node(ty, 1 << k, text, format!("index {k}"), false, false)
                }
            },
        }
    }

    fn bool_expr(&mut self, max: u8, depth: usize, red: Red) -> usize {
        let d = depth - 1;
        match self.rng.weighted(&[40, 25, 8, 10, 5]) {
            0 => {
                let t = self.pick_ty(false);
                let op = self.rng.pick(&["==", "!=", "<", "<=", ">", ">="]);
                let a = self.expr(t, max, d, red);
                let b = self.operand(t, max, d, red, true);
                self.binary(op, t, a, b)
            }
            1 => {
                let op = self.rng.pick(&["&&", "||", "&", "|", "^"]);
                let a = self.expr(Ty::Bool, max, d, red);
                let b = self.operand(Ty::Bool, max, d, red, true);
                self.binary(op, Ty::Bool, a, b)
            }
            2 => {
                let a = self.expr(Ty::Bool, max, d, red);
                let text = format!("(!{})", self.t(a));
                let (s, full) = (self.nodes[a].shape, self.nodes[a].full);
                self.node(Ty::Bool, s, text, format!("not {a}"), full, false)
            }
            3 => {
                let t = self.rng.pick(&FLOATS);
                let a = self.expr(t, max, d, red);
                let f = self.rng.pick(&FLOAT_TESTS);
                let free = self.rng.percent(30);
                self.call1(f, Ty::Bool, a, free)
            }
            _ => self.select(Ty::Bool, max, depth, red),
        }
    }

    /// `dropout(x, p, seed)`, bound by `let` so that each `let` holds one random call and the
    /// calls' order in the text (their streams) is the order they are made in.
    fn dropout(&mut self, ty: Ty, max: u8, depth: usize, red: Red) -> usize {
        if max == 0 {
            return self.leaf(ty, max, red);
        }
        let mut x = self.expr(ty, max, depth, red);
        if self.nodes[x].shape == 0 {
            let shape = self.subshape(max);
            x = self.fit(x, ty, shape, red);
        }
        if self.split_by_reduction(self.nodes[x].shape) {
            return x;
        }
        let p = self.rng.pick(&["0.5", "0.25", "0.125"]);
        let p = self.node(ty, 0, p.into(), format!("lit {p}"), false, true);
        let seed = match (0..self.params.len()).find(|&i| {
            let p = &self.params[i];
            // A written buffer has no `shape` either: its axes are its shape.
            p.ty == Ty::U64 && p.shape.is_none() && p.buffer.is_none()
        }) {
            Some(i) => (0..self.nodes.len())
                .find(|&n| self.nodes[n].input == Some(i))
                .expect("each parameter has a node"),
            None => self.new_param(Ty::U64, None),
        };
        let stream = self.random_sites;
        self.random_sites += 1;
        let text = format!("dropout({}, {}, {})", self.t(x), self.t(p), self.t(seed));
        let (shape, full) = (self.nodes[x].shape, self.nodes[x].full);
        let id = self.node(
            ty,
            shape,
            text,
            format!("dropout {stream} {x} {p} {seed}"),
            full,
            false,
        );
        let name = format!("v{id}");
        self.lets
            .push(format!("let {name} = {};", self.nodes[id].text));
        let n = &mut self.nodes[id];
        n.text = name;
        n.bound = true;
        id
    }

    // -----------------------------------------------------------------------------------------
    // Reductions.

    /// A reduction over `r` whose result, of type `ty`, is within `max`.
    fn reduction(&mut self, ty: Ty, max: u8, depth: usize, r: usize) -> usize {
        if ty == Ty::Bool {
            let e = self.reduction(Ty::F32, max, depth, r);
            return self.convert(e, Ty::Bool);
        }
        let m = self.rmask(r);
        let over = (self.subshape(max) & !m) | m;
        let rows = self.domain() & !m;
        let over = if self.need_full_operand && rows & !max == 0 {
            self.need_full_operand = false;
            self.domain()
        } else if self.rng.percent(30) {
            (max & !m) | m
        } else {
            over
        };
        let (kind, operand_ty) = self.reduction_kind(ty);
        let e = self.expr(operand_ty, over, depth, Red::Dim(r));
        let e = self.fit(e, operand_ty, over, Red::Dim(r));
        let e = if kind == "prod" && operand_ty.is_float() {
            self.near_one(e, operand_ty)
        } else {
            e
        };
        self.reductions += 1;
        let (dims, desc) = match self.span {
            1 => (Self::dim(r), r.to_string()),
            n => {
                let names: Vec<String> = (r..r + n).map(Self::dim).collect();
                (format!("({})", names.join(", ")), format!("{r}:{n}"))
            }
        };
        let text = format!("{kind}({}, {dims})", self.t(e));
        let full = self.nodes[e].full;
        let id = self.node(
            ty,
            over & !m,
            text,
            format!("red {kind} {desc} {e}"),
            full,
            false,
        );
        self.maybe_bind(id)
    }

    /// A reduction that gives `ty`, and the type of its operand.
    fn reduction_kind(&mut self, ty: Ty) -> (&'static str, Ty) {
        // A position is along one dim.
        if ty == Ty::U32 && self.rng.percent(40) && self.span == 1 {
            let kind = self.rng.pick(&["argmax", "argmin"]);
            let mut from = self.pick_ty(false);
            if from == Ty::Bool {
                from = Ty::F32;
            }
            return (kind, from);
        }
        let kinds: &[&str] = if ty.is_float() {
            &["sum", "max", "min", "mean", "logsumexp", "prod", "sum"]
        } else {
            &["sum", "max", "min", "prod"]
        };
        (self.rng.pick(kinds), ty)
    }

    /// `1 + tanh(e) / 1024`: a factor near 1, so that long products neither overflow nor
    /// vanish.
    fn near_one(&mut self, e: usize, ty: Ty) -> usize {
        let t = self.call1("tanh", ty, e, false);
        let k = self.node(
            ty,
            0,
            "0.0009765625".into(),
            "lit 0.0009765625".into(),
            false,
            true,
        );
        let small = self.binary("*", ty, t, k);
        let one = self.node(ty, 0, "1.0".into(), "lit 1".into(), false, true);
        self.binary("+", ty, small, one)
    }

    /// A full reduction of a value over the whole domain, of type `ty`.
    fn full_reduction(&mut self, ty: Ty, depth: usize) -> usize {
        if ty == Ty::Bool {
            let e = self.full_reduction(Ty::I32, depth);
            return self.convert(e, Ty::Bool);
        }
        let kinds: &[&str] = if ty.is_float() {
            &["sum", "max", "min", "mean", "logsumexp", "prod", "sum"]
        } else {
            &["sum", "max", "min", "prod"]
        };
        let kind = self.rng.pick(kinds);
        let d = self.domain();
        let e = self.expr(ty, d, depth, Red::None);
        let e = self.fit(e, ty, d, Red::None);
        let e = if kind == "prod" && ty.is_float() {
            self.near_one(e, ty)
        } else {
            e
        };
        self.reductions += 1;
        let text = format!("{kind}({})", self.t(e));
        let id = self.node(ty, 0, text, format!("red {kind} all {e}"), true, false);
        self.maybe_bind(id)
    }

    // -----------------------------------------------------------------------------------------
    // Writes through `&mut` parameters.

    /// A new `&mut` parameter of the domain's dims and its writes, each of a slice whose shape
    /// is the domain (the launch's, one for every write and output): now and then a scatter of
    /// rows (a run of the domain's dims replaced by an extra dim, the rows, indexed by a new
    /// integer parameter over that run and perhaps some other dims; the harness draws its
    /// in-range values distinct), now and then a dim made of parts of which some are written
    /// (halves, a part beside an extra dim or a literal, `step_by` picks), or both, or neither
    /// (the whole buffer).
    fn write_group(&mut self) {
        let ty = self.pick_ty(true);
        let (n, d) = (self.ndims, self.domain());
        let mut axes: Vec<Axis> = (0..n).map(Axis::Dim).collect();
        let mut at = None;
        let scatter = self.wrng.percent(65);
        if scatter {
            let (lo, len) = match self.wrng.percent(20) {
                true => (self.wrng.below(n + 1), 0),
                false => {
                    let lo = self.wrng.below(n);
                    (lo, 1 + self.wrng.below(n - lo))
                }
            };
            let run = (((1u16 << len) - 1) << lo) as u8;
            let shared = match self.wrng.percent(25) {
                true => self.wrng.next_u64() as u8 & d & !run,
                false => 0,
            };
            let index_shape = run | shared;
            let rows = self.ndims + self.extra.len();
            let index_ty = self.wrng.pick(&INTS);
            let index = self.new_param(index_ty, Some(index_shape).filter(|&s| s != 0));
            let p = self.params.len() - 1;
            self.params[p].index = Some(rows);
            self.params[p].distinct = true;
            self.extra.push(Extra::Slots(p));
            // A cast to `i64` keeps every value, so distinct values stay distinct.
            let index = match self.wrng.percent(25) {
                true => self.convert(index, Ty::I64),
                false => index,
            };
            axes.drain(lo..lo + len);
            axes.insert(lo, Axis::Dim(rows));
            at = Some((lo, index));
        }
        let plain: Vec<usize> = (0..axes.len())
            .filter(|&a| matches!(axes[a], Axis::Dim(k) if k < n))
            .collect();
        let mut parted = None;
        if !plain.is_empty() && (!scatter || self.wrng.percent(50)) {
            let a = match self.wrng.percent(60) {
                true => plain[plain.len() - 1],
                false => self.wrng.pick(&plain),
            };
            let Axis::Dim(k) = axes[a] else {
                unreachable!("a plain axis")
            };
            let lit = 1 + self.wrng.below(5);
            let axis = match self.wrng.below(9) {
                0 => Axis::Parts(vec![Term::Dims(2, k)]),
                1 => Axis::Parts(vec![Term::Dims(3, k)]),
                2 => Axis::Parts(vec![Term::Dims(1, k), Term::Dims(1, self.rest())]),
                3 => Axis::Parts(vec![Term::Dims(1, self.rest()), Term::Dims(1, k)]),
                4 => Axis::Parts(vec![Term::Dims(2, k), Term::Dims(1, self.rest())]),
                5 => Axis::Parts(vec![Term::Lit(lit), Term::Dims(1, k)]),
                6 => Axis::Parts(vec![Term::Dims(1, k), Term::Lit(lit)]),
                _ => Axis::Group(k, 2 + self.wrng.below(3)),
            };
            // The parts of the domain's dim, each written or not (one at least).
            let choices: Vec<Item> = match &axis {
                Axis::Parts(terms) => parts(terms)
                    .iter()
                    .enumerate()
                    .filter(|(_, &t)| matches!(t, Term::Dims(_, j) if j == k))
                    .map(|(j, _)| Item::Part(j))
                    .collect(),
                Axis::Group(_, g) => (0..*g).map(Item::Pick).collect(),
                Axis::Dim(_) => unreachable!("a new axis has parts"),
            };
            let mut chosen: Vec<Item> = choices
                .iter()
                .copied()
                .filter(|_| self.wrng.percent(60))
                .collect();
            if chosen.is_empty() {
                chosen.push(self.wrng.pick(&choices));
            }
            axes[a] = axis;
            parted = Some((a, chosen));
        }
        let p = self.params.len();
        self.params.push(Param {
            name: format!("w{p}"),
            ty,
            shape: None,
            index: None,
            distinct: false,
            buffer: Some(axes.clone()),
            order: None,
        });
        let picks = parted.as_ref().map_or(vec![Item::All], |(_, c)| c.clone());
        for pick in picks {
            let items = (0..axes.len())
                .map(|a| match (at, &parted) {
                    (Some((b, index)), _) if a == b => Item::At(index),
                    (_, Some((b, _))) if a == *b => pick,
                    _ => Item::All,
                })
                .collect();
            let value = self.write_value(ty, d);
            self.writes.push(WriteStmt {
                buffer: p,
                value,
                items,
            });
        }
    }

    /// A new extra dim, a part of a buffer that nothing writes.
    fn rest(&mut self) -> usize {
        self.extra.push(Extra::Rest);
        self.ndims + self.extra.len() - 1
    }

    /// A written value of `ty`: of the domain's shape mostly, now and then of some of its dims
    /// (a broadcast) or a literal.
    fn write_value(&mut self, ty: Ty, d: u8) -> usize {
        if ty != Ty::Bool && self.wrng.percent(10) {
            return self.literal(ty);
        }
        let e = self.expr(ty, d, 3, Red::None);
        match self.wrng.percent(70) {
            true => self.fit(e, ty, d, Red::None),
            false => e,
        }
    }

    /// A sum of parts as the language writes it: `2 * d1 + d3`.
    fn sum_text(terms: &[Term]) -> String {
        let t: Vec<String> = terms
            .iter()
            .map(|t| match *t {
                Term::Dims(1, k) => Self::dim(k),
                Term::Dims(c, k) => format!("{c} * {}", Self::dim(k)),
                Term::Lit(v) => v.to_string(),
            })
            .collect();
        t.join(" + ")
    }

    fn axis_text(axis: &Axis) -> String {
        match axis {
            Axis::Dim(k) => Self::dim(*k),
            Axis::Parts(terms) => Self::sum_text(terms),
            Axis::Group(k, g) => format!("{} * {g}", Self::dim(*k)),
        }
    }

    /// An item of a slice of `axis`; `short` writes `(..).step_by(g)` for `(0..).step_by(g)`.
    fn item_text(&self, axis: &Axis, item: Item, short: bool) -> String {
        match (item, axis) {
            (Item::All, _) => "..".into(),
            (Item::At(index), _) => self.t(index).to_string(),
            (Item::Pick(0), _) if short => format!("(..).step_by({})", group(axis)),
            (Item::Pick(j), _) => format!("({j}..).step_by({})", group(axis)),
            (Item::Part(j), Axis::Parts(terms)) => {
                let all = parts(terms);
                let start = match j {
                    0 => String::new(),
                    _ => Self::sum_text(&merge(&all[..j])),
                };
                let end = match j + 1 == all.len() {
                    true => String::new(),
                    false => Self::sum_text(&merge(&all[..j + 1])),
                };
                format!("{start}..{end}")
            }
            (Item::Part(_), _) => unreachable!("a part of a sum"),
        }
    }

    /// The desc's form of an axis: `K`, `p:T,T..` (each part a dim `K` or a literal `#N`),
    /// `g:K:G`.
    fn axis_desc(axis: &Axis) -> String {
        match axis {
            Axis::Dim(k) => k.to_string(),
            Axis::Parts(terms) => {
                let ps: Vec<String> = parts(terms)
                    .iter()
                    .map(|t| match t {
                        Term::Dims(_, k) => k.to_string(),
                        Term::Lit(v) => format!("#{v}"),
                    })
                    .collect();
                format!("p:{}", ps.join(","))
            }
            Axis::Group(k, g) => format!("g:{k}:{g}"),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Output.

    fn tensor_type(&self, ty: Ty, shape: u8) -> String {
        if shape == 0 {
            return ty.name().to_string();
        }
        let dims: Vec<String> = (0..self.ndims)
            .filter(|k| shape & (1 << k) != 0)
            .map(Self::dim)
            .collect();
        format!("[{}; {}]", ty.name(), dims.join(", "))
    }

    fn finish(self, name: &str, seed: u64, outs: &[usize]) -> Program {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| match &p.buffer {
                Some(axes) => {
                    let axes: Vec<String> = axes.iter().map(Self::axis_text).collect();
                    format!("{}: &mut [{}; {}]", p.name, p.ty.name(), axes.join(", "))
                }
                None => match &p.order {
                    Some(order) => {
                        let dims: Vec<String> = order.iter().map(|&k| Self::dim(k)).collect();
                        format!("{}: [{}; {}]", p.name, p.ty.name(), dims.join(", "))
                    }
                    None => format!(
                        "{}: {}",
                        p.name,
                        self.tensor_type(p.ty, p.shape.unwrap_or(0))
                    ),
                },
            })
            .collect();
        let types: Vec<String> = outs
            .iter()
            .map(|&o| self.tensor_type(self.nodes[o].ty, self.nodes[o].shape))
            .collect();
        let values: Vec<&str> = outs.iter().map(|&o| self.t(o)).collect();
        let (ret, body) = match outs.len() {
            0 => (String::new(), String::new()),
            1 => (format!(" -> {}", types[0]), values[0].to_string()),
            _ => (
                format!(" -> ({})", types.join(", ")),
                format!("({})", values.join(", ")),
            ),
        };
        // Some programs without writes, with a float output and a float parameter, have
        // derivatives along every float parameter (a stream of their own, so that the programs
        // are the ones the seeds gave before).
        let floats: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].buffer.is_none() && self.params[i].ty.is_float())
            .collect();
        let derives = self.writes.is_empty()
            && !floats.is_empty()
            && outs.iter().any(|&o| self.nodes[o].ty.is_float())
            && Rng(seed ^ 0xd3e1_7a7e_0000_0005).percent(40);
        let mut text = String::new();
        if derives {
            let names: Vec<&str> = floats
                .iter()
                .map(|&i| self.params[i].name.as_str())
                .collect();
            let list = names.join(", ");
            writeln!(text, "#[vjp({list})]\n#[jvp({list})]").unwrap();
        }
        writeln!(text, "fn {name}({}){ret} {{", params.join(", ")).unwrap();
        for l in &self.lets {
            writeln!(text, "    {l}").unwrap();
        }
        for w in &self.writes {
            let axes = self.params[w.buffer].buffer.as_ref().expect("a buffer");
            let items: Vec<String> = axes
                .iter()
                .zip(&w.items)
                .map(|(a, &i)| self.item_text(a, i, w.buffer % 2 == 0))
                .collect();
            let buffer = &self.params[w.buffer].name;
            let value = self.t(w.value);
            writeln!(text, "    {buffer}[{}] = {value};", items.join(", ")).unwrap();
        }
        if !body.is_empty() {
            writeln!(text, "    {body}").unwrap();
        }
        text.push_str("}\n");

        let mut desc = format!("dims {}\n", self.ndims);
        for e in &self.extra {
            match e {
                Extra::Slots(p) => writeln!(desc, "extra slots {p}").unwrap(),
                Extra::Rest => writeln!(desc, "extra rest").unwrap(),
            }
        }
        for p in &self.params {
            let dims = match (&p.buffer, p.shape) {
                (Some(axes), _) => {
                    let axes: Vec<String> = axes.iter().map(Self::axis_desc).collect();
                    format!("buffer {}", axes.join(" "))
                }
                (None, None) => "scalar".to_string(),
                (None, Some(s)) => {
                    let ks: Vec<String> = (0..self.ndims)
                        .filter(|k| s & (1 << k) != 0)
                        .map(|k| k.to_string())
                        .collect();
                    format!("tensor {}", ks.join(" "))
                }
            };
            let order = match &p.order {
                Some(o) => {
                    let ks: Vec<String> = o.iter().map(|k| k.to_string()).collect();
                    format!(" order {}", ks.join(" "))
                }
                None => String::new(),
            };
            let index = p.index.map_or(String::new(), |k| format!(" index {k}"));
            let distinct = if p.distinct { " distinct" } else { "" };
            writeln!(desc, "param {} {dims}{order}{index}{distinct}", p.ty.name()).unwrap();
        }
        for l in &self.desc {
            writeln!(desc, "{l}").unwrap();
        }
        for &o in outs {
            writeln!(desc, "out {o} {}", self.nodes[o].shape).unwrap();
        }
        for w in &self.writes {
            let items: Vec<String> = w
                .items
                .iter()
                .map(|i| match *i {
                    Item::All => "all".to_string(),
                    Item::Part(j) => format!("part:{j}"),
                    Item::Pick(j) => format!("pick:{j}"),
                    Item::At(n) => format!("at:{n}"),
                })
                .collect();
            writeln!(desc, "write {} {} {}", w.buffer, w.value, items.join(" ")).unwrap();
        }
        let glue = self.glue(name, outs.len());
        let derive = derives.then(|| self.derive_glue(name, outs, &floats));
        Program {
            name: name.to_string(),
            seed,
            text,
            desc,
            glue,
            derive,
        }
    }

    /// The glue's type name of `ty`.
    fn rust_ty(ty: Ty) -> &'static str {
        match ty {
            Ty::F16 => "f16",
            Ty::Bf16 => "bf16",
            other => other.name(),
        }
    }

    /// `fn derive_NAME(dev, args) -> Result<Adjoint, Error>`: calls the forward, `vjp` with a
    /// cotangent for each float output and `jvp` with a tangent for each float parameter
    /// (`floats`), all drawn by the harness, and gathers `<J v, u>` and `<v, J^T u>`.
    fn derive_glue(&self, name: &str, outs: &[usize], floats: &[usize]) -> String {
        let mut s = format!(
            "pub fn derive_{name}(dev: &Device, a: &Args) -> Result<crate::harness::Adjoint, Error> {{\n"
        );
        let mut args = vec![];
        for (i, p) in self.params.iter().enumerate() {
            let t = Self::rust_ty(p.ty);
            match p.shape {
                Some(_) => {
                    writeln!(s, "    let {} = a.tensor::<{t}>(dev, {i})?;", p.name).unwrap();
                    args.push(format!("&{}", p.name));
                }
                None => args.push(format!("a.scalar::<{t}>({i})")),
            }
        }
        let args = args.join(", ");
        writeln!(s, "    let r = {name}(dev, {args})?;").unwrap();
        let out = |k: usize| match outs.len() {
            1 => "r".to_string(),
            _ => format!("r.{k}"),
        };
        let float_outs: Vec<usize> = (0..outs.len())
            .filter(|&k| self.nodes[outs[k]].ty.is_float())
            .collect();
        // Each cotangent `u` and tangent `v` beside a second, `u'` and `w`, and their sums: the
        // derivatives are linear in them, so what `jvp(v + w) - jvp(v) - jvp(w)` and the same
        // of `vjp` leave is the rounding of the derivatives' own terms (`Adjoint::left_noise`).
        let (mut cots, mut cots2, mut cots_sum) = (vec![], vec![], vec![]);
        for (j, &k) in float_outs.iter().enumerate() {
            let t = Self::rust_ty(self.nodes[outs[k]].ty);
            for (v, stream) in [("u", j), ("uu", 300 + j)] {
                writeln!(
                    s,
                    "    let {v}{j} = crate::harness::draw::<{t}>(dev, {}.shape(), {stream})?;",
                    out(k)
                )
                .unwrap();
            }
            writeln!(
                s,
                "    let us{j} = crate::harness::add(dev, &u{j}, &uu{j})?;"
            )
            .unwrap();
            cots.push(format!("&u{j}"));
            cots2.push(format!("&uu{j}"));
            cots_sum.push(format!("&us{j}"));
        }
        let (mut tans, mut tans2, mut tans_sum) = (vec![], vec![], vec![]);
        for (j, &i) in floats.iter().enumerate() {
            let p = &self.params[i];
            let t = Self::rust_ty(p.ty);
            let shape = match p.shape {
                Some(_) => format!("{}.shape()", p.name),
                None => "&[]".to_string(),
            };
            for (v, stream) in [("v", 100 + j), ("w", 200 + j)] {
                writeln!(
                    s,
                    "    let {v}{j} = crate::harness::draw::<{t}>(dev, {shape}, {stream})?;"
                )
                .unwrap();
            }
            writeln!(
                s,
                "    let vw{j} = crate::harness::add(dev, &v{j}, &w{j})?;"
            )
            .unwrap();
            for (list, v) in [(&mut tans, "v"), (&mut tans2, "w"), (&mut tans_sum, "vw")] {
                list.push(match p.shape {
                    Some(_) => format!("&{v}{j}"),
                    None => format!("{v}{j}.to_vec()?[0]"),
                });
            }
        }
        for (g, list) in [("g", &cots), ("gu", &cots2), ("gs", &cots_sum)] {
            writeln!(
                s,
                "    let {g} = {name}::vjp(dev, {args}, {})?;",
                list.join(", ")
            )
            .unwrap();
        }
        for (j, list) in [("j", &tans), ("jw", &tans2), ("js", &tans_sum)] {
            writeln!(
                s,
                "    let {j} = {name}::jvp(dev, {args}, {})?;",
                list.join(", ")
            )
            .unwrap();
        }
        writeln!(s, "    let mut adj = crate::harness::Adjoint::default();").unwrap();
        for j in 0..float_outs.len() {
            let o = outs.len() + j;
            writeln!(s, "    adj.left([&j.{o}, &jw.{o}, &js.{o}], &u{j})?;").unwrap();
        }
        for (j, &i) in floats.iter().enumerate() {
            let p = &self.params[i].name;
            writeln!(s, "    adj.right(&v{j}, [&g.{p}, &gu.{p}, &gs.{p}])?;").unwrap();
        }
        writeln!(s, "    Ok(adj)\n}}").unwrap();
        s
    }

    /// `fn run_NAME(dev, args) -> Result<Vec<Out>, Error>`: uploads the inputs and each `&mut`
    /// parameter's first contents, calls the kernel and reads its outputs back, then each `&mut`
    /// parameter's contents.
    fn glue(&self, name: &str, outs: usize) -> String {
        let mut s =
            format!("pub fn run_{name}(dev: &Device, a: &Args) -> Result<Vec<Out>, Error> {{\n");
        let mut args = vec![];
        let mut buffers = vec![];
        for (i, p) in self.params.iter().enumerate() {
            let t = match p.ty {
                Ty::F16 => "f16",
                Ty::Bf16 => "bf16",
                other => other.name(),
            };
            if p.buffer.is_some() {
                writeln!(s, "    let mut {} = a.tensor::<{t}>(dev, {i})?;", p.name).unwrap();
                args.push(format!("&mut {}", p.name));
                buffers.push(format!("Out::of(&{})?", p.name));
            } else if p.shape.is_some() {
                writeln!(s, "    let {} = a.tensor::<{t}>(dev, {i})?;", p.name).unwrap();
                args.push(format!("&{}", p.name));
            } else {
                args.push(format!("a.scalar::<{t}>({i})"));
            }
        }
        let mut reads: Vec<String> = match outs {
            0 => vec![],
            1 => vec!["Out::of(&r)?".into()],
            _ => (0..outs).map(|k| format!("Out::of(&r.{k})?")).collect(),
        };
        let call = format!("{name}(dev, {})?;", args.join(", "));
        match outs {
            0 => writeln!(s, "    {call}").unwrap(),
            _ => writeln!(s, "    let r = {call}").unwrap(),
        }
        reads.extend(buffers);
        writeln!(s, "    Ok(vec![{}])\n}}", reads.join(", ")).unwrap();
        s
    }
}
