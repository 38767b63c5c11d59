//! The CPU backend: the same plan as the CUDA kernel, written as Rust loops. It is the reference
//! the GPU is tested against, so it favours accuracy: float sums and products accumulate in f64.

use crate::func::Func;
use crate::ir::{DimId, Kernel, Launch, NodeId, Op, Random, Reduce};
use crate::parse::{BinOp, UnOp};
use crate::plan::{Layout, Pass, Plan, Syntax};
use crate::ty::Elem;

const OPS: &str = "::fuse_runtime::__private::ops";

const SYNTAX: Syntax = Syntax {
    decl: "let ",
    temp: "let mut ",
    end: ";",
    quot: |l, t, d| format!("{t} / {}", l.size(d)),
    index: |v| format!("({v} as usize)"),
    below: |v, size| format!("({v} as u64) < (({size}) as u64)"),
};

/// The body of the CPU function: statements over `d_<dim>` sizes, `p_<param>` slices and scalars,
/// and `out<j>` mutable slices, all declared by [`crate::expand`].
pub fn body(k: &Kernel, plan: &Plan) -> String {
    let mut w = Cpu {
        k,
        layout: Layout { k },
        out: String::new(),
    };
    // A `&mut` parameter the kernel also reads: its contents before the launch, which every
    // read sees here (on a GPU, a read of an element another element writes is unspecified).
    for (p, o) in k.read_written_params() {
        let name = crate::ir::plain_name(&k.params[p].name);
        w.line(format!(
            "let p_{name} = out{}.to_vec();",
            k.output_buffer(o)
        ));
    }
    match &k.launch {
        Launch::Map { domain } => {
            w.line(format!("let n: usize = {};", w.layout.product(domain)));
            w.values(&plan.prologue, Scope::Row);
            for pass in &plan.passes {
                w.element_loop(domain, pass);
            }
        }
        Launch::Rows { domain, axis } => w.rows(domain, *axis, plan),
        Launch::Full { domain } => w.full(domain, plan),
    }
    w.out
}

#[derive(Clone, Copy, PartialEq)]
enum Scope {
    Element,
    Row,
}

struct Cpu<'a> {
    k: &'a Kernel,
    layout: Layout<'a>,
    out: String,
}

impl Cpu<'_> {
    fn line(&mut self, text: impl AsRef<str>) {
        self.out.push_str(text.as_ref());
        self.out.push('\n');
    }

    fn shape_index(&self, shape: &[DimId]) -> usize {
        self.layout.shape_index(shape)
    }

    fn element_loop(&mut self, domain: &[DimId], pass: &Pass) {
        self.line("for i in 0..n {");
        let shapes = self.layout.shapes();
        let placed = pass
            .writes
            .iter()
            .any(|&o| self.k.outputs[o].place.is_some());
        let positions = placed
            || pass
                .elems
                .iter()
                .any(|&id| crate::plan::needs_coordinates(self.k, id, domain));
        if positions || shapes.iter().any(|s| s != domain) {
            for l in self.layout.split("i", domain, &SYNTAX) {
                self.line(l);
            }
        }
        for (s, shape) in shapes.iter().enumerate() {
            let offset = if shape == domain {
                "i".to_string()
            } else {
                self.layout.offset(shape, None)
            };
            self.line(format!("let o{s}: usize = {offset};"));
        }
        self.values(&pass.elems, Scope::Element);
        self.accumulate(&pass.reduces);
        self.writes(&pass.writes, Scope::Element);
        self.line("}");
    }

    fn rows(&mut self, domain: &[DimId], axis: DimId, plan: &Plan) {
        let rows: Vec<DimId> = domain.iter().copied().filter(|&d| d != axis).collect();
        self.line(format!(
            "let groups: usize = {};",
            self.layout.product(&rows)
        ));
        self.line(format!("let len: usize = {};", self.layout.size(axis)));
        // Sums over rows: every row in order, in the type of their values, then stored.
        let sums: Vec<usize> = (0..self.k.outputs.len())
            .filter(|&o| self.k.outputs[o].partial.is_some())
            .collect();
        for &o in &sums {
            let t = self.k.outputs[o].elem.name();
            let n = if self.k.outputs[o].total { "1" } else { "len" };
            self.line(format!("let mut fz_sum{o}: Vec<{t}> = vec![0.0; {n}];"));
        }
        self.line("for g in 0..groups {");
        for l in self.layout.split("g", &rows, &SYNTAX) {
            self.line(l);
        }
        let shapes = self.layout.shapes();
        for (s, shape) in shapes.iter().enumerate() {
            self.line(format!(
                "let b{s}: usize = {};",
                self.layout.offset(shape, Some(axis))
            ));
        }
        self.values(&plan.prologue, Scope::Row);
        for pass in &plan.passes {
            self.init_accumulators(&pass.reduces);
            self.line("for r in 0..len {");
            for (s, shape) in shapes.iter().enumerate() {
                let offset = self.layout.row_offset(s, shape, axis);
                self.line(format!("let o{s}: usize = {offset};"));
            }
            self.values(&pass.elems, Scope::Element);
            self.accumulate(&pass.reduces);
            self.writes(&pass.writes, Scope::Element);
            self.line("}");
            self.finish(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
        }
        self.writes(&plan.group_writes, Scope::Row);
        self.line("}");
        for &o in &sums {
            let out = &self.k.outputs[o];
            let (elem, sums) = (out.elem, out.stored_elem());
            let value = match (elem == sums, sums.is_narrow_float()) {
                (true, _) => format!("fz_sum{o}[r]"),
                (false, true) => stored(sums, &format!("(fz_sum{o}[r] as f32)")),
                (false, false) => format!("fz_sum{o}[r] as {}", sums.name()),
            };
            let n = if out.total { "1" } else { "len" };
            self.line(format!("for r in 0..{n} {{ out{o}[r] = {value}; }}"));
        }
    }

    fn full(&mut self, domain: &[DimId], plan: &Plan) {
        self.line(format!("let n: usize = {};", self.layout.product(domain)));
        self.values(&plan.prologue, Scope::Row);
        let pass = &plan.passes[0];
        self.init_accumulators(&pass.reduces);
        self.element_loop(domain, pass);
        self.finish(&pass.reduces, "n");
        self.values(&pass.after, Scope::Row);
        self.writes(&plan.group_writes, Scope::Row);
    }

    /// A reduction's operation, the type of its values (f32 for the 16-bit floats) and operand.
    fn reduction(&self, id: NodeId) -> (Reduce, Elem, NodeId) {
        match self.k.nodes[id].op {
            Op::Reduce(op, a, _) => (op, self.k.nodes[id].elem().compute(), a),
            _ => unreachable!("the plan lists reductions"),
        }
    }

    fn init_accumulators(&mut self, reduces: &[NodeId]) {
        for &r in reduces {
            let (op, e, _) = self.reduction(r);
            let (t, init) = match (op, e.is_float()) {
                (Reduce::Sum | Reduce::Mean, true) => ("f64", "0.0".to_string()),
                (Reduce::LogSumExp, _) => {
                    self.line(format!("let mut acs{r}: f64 = 0.0;"));
                    ("f64", "f64::NEG_INFINITY".to_string())
                }
                (Reduce::Prod, true) => ("f64", "1.0".to_string()),
                (Reduce::Sum, false) => (e.name(), "0".to_string()),
                (Reduce::Prod, false) => (e.name(), "1".to_string()),
                (Reduce::Max, true) => (e.name(), format!("{}::NEG_INFINITY", e.name())),
                (Reduce::Min, true) => (e.name(), format!("{}::INFINITY", e.name())),
                (Reduce::Max, false) => (e.name(), format!("{}::MIN", e.name())),
                (Reduce::Min, false) => (e.name(), format!("{}::MAX", e.name())),
                (Reduce::Mean, false) => unreachable!("check rejects integer means"),
            };
            self.line(format!("let mut acc{r}: {t} = {init};"));
        }
    }

    fn accumulate(&mut self, reduces: &[NodeId]) {
        for &r in reduces {
            let (op, e, a) = self.reduction(r);
            let step = match (op, e.is_float()) {
                (Reduce::Sum | Reduce::Mean, true) => format!("acc{r} + v{a} as f64"),
                (Reduce::LogSumExp, _) => {
                    self.line(format!(
                        "{OPS}::lse_add(&mut acc{r}, &mut acs{r}, v{a} as f64);"
                    ));
                    continue;
                }
                (Reduce::Prod, true) => format!("acc{r} * v{a} as f64"),
                (Reduce::Sum, false) => format!("acc{r}.wrapping_add(v{a})"),
                (Reduce::Prod, false) => format!("acc{r}.wrapping_mul(v{a})"),
                // `max` as a select (NaN ignored, as `f32::max` does): rustc 1.95's LLVM
                // crashed (SIGSEGV in SelectionDAG) on a loop that took `f32::max` and
                // `f64::max` of two rows together, as `(logsumexp(x, c), logsumexp(y, c))`
                // with `x` f32 and `y` f64 does (p20915 of the random programs).
                (Reduce::Max, true) => {
                    format!("if v{a} > acc{r} || acc{r}.is_nan() {{ v{a} }} else {{ acc{r} }}")
                }
                (Reduce::Min, true) => {
                    format!("if v{a} < acc{r} || acc{r}.is_nan() {{ v{a} }} else {{ acc{r} }}")
                }
                (Reduce::Max, false) => format!("acc{r}.max(v{a})"),
                (Reduce::Min, false) => format!("acc{r}.min(v{a})"),
                (Reduce::Mean, false) => unreachable!("check rejects integer means"),
            };
            self.line(format!("acc{r} = {step};"));
        }
    }

    fn finish(&mut self, reduces: &[NodeId], count: &str) {
        for &r in reduces {
            let (op, e, _) = self.reduction(r);
            let t = e.name();
            let value = match op {
                Reduce::Mean => format!("(acc{r} / {count} as f64) as {t}"),
                Reduce::LogSumExp => format!("(acc{r} + acs{r}.ln()) as {t}"),
                _ if e.is_float() && matches!(op, Reduce::Sum | Reduce::Prod) => {
                    format!("acc{r} as {t}")
                }
                _ => format!("acc{r}"),
            };
            self.line(format!("let v{r}: {t} = {value};"));
        }
    }

    fn writes(&mut self, outputs: &[usize], scope: Scope) {
        for &o in outputs {
            let out = &self.k.outputs[o];
            if out.partial.is_some() {
                let at = if out.total { "0" } else { "r" };
                self.line(format!("fz_sum{o}[{at}] += v{};", out.node));
                continue;
            }
            let v = stored(out.elem, &format!("v{}", out.node));
            let buffer = self.k.output_buffer(o);
            if let Some(place) = &out.place {
                // Nowhere where it scatters from outside the gathered dim.
                let coord = |d| self.layout.coord(d);
                let (at, inside) = self
                    .layout
                    .view_access(&place.view, &out.shape, coord, &SYNTAX);
                match inside {
                    Some(inside) => {
                        self.line(format!("if {inside} {{ out{buffer}[{at}] = {v}; }}"))
                    }
                    None => self.line(format!("out{buffer}[{at}] = {v};")),
                }
                continue;
            }
            let at = self.at(&out.shape.clone(), scope);
            if out.packed {
                // Bit `at % 32` of word `at / 32`, cleared or set: the words start as zeros on
                // the GPU, here as whatever the buffer held.
                self.line(format!(
                    "{{ let fz_w = &mut out{buffer}[{at} >> 5]; let fz_b = 1u32 << ({at} & 31); *fz_w = if {v} {{ *fz_w | fz_b }} else {{ *fz_w & !fz_b }}; }}"
                ));
                continue;
            }
            self.line(format!("out{buffer}[{at}] = {v};"));
        }
    }

    fn at(&self, shape: &[DimId], scope: Scope) -> String {
        let s = self.shape_index(shape);
        match (scope, &self.k.launch) {
            (Scope::Element, _) => format!("o{s}"),
            (Scope::Row, Launch::Rows { .. }) => format!("b{s}"),
            (Scope::Row, _) => "0".into(),
        }
    }

    fn values(&mut self, nodes: &[NodeId], scope: Scope) {
        for &id in nodes {
            let e = self.expr(id, scope);
            let t = self.k.nodes[id].elem().compute().name();
            self.line(format!("let v{id}: {t} = {e};"));
        }
    }

    fn expr(&self, id: NodeId, scope: Scope) -> String {
        let k = self.k;
        let node = &k.nodes[id];
        let e = node.elem();
        let v = |i: &NodeId| format!("v{i}");
        match &node.op {
            Op::Load(p) => {
                let param = &k.params[*p];
                let at = self.at(param.shape.as_ref().expect("a tensor"), scope);
                let name = crate::ir::plain_name(&param.name);
                if param.packed {
                    return format!("((p_{name}[{at} >> 5] >> ({at} & 31)) & 1 != 0)");
                }
                loaded(param.elem, format!("p_{name}[{at}]"))
            }
            Op::Scalar(p) => {
                let param = &k.params[*p];
                loaded(
                    param.elem,
                    format!("p_{}", crate::ir::plain_name(&param.name)),
                )
            }
            Op::Element(p, offset) => {
                let param = &k.params[*p];
                let raw = format!("p_{}[{offset}]", crate::ir::plain_name(&param.name));
                loaded(param.elem, raw)
            }
            Op::View(p, view) => {
                let param = &k.params[*p];
                let axis = match &k.launch {
                    Launch::Rows { axis, .. } => Some(*axis),
                    _ => None,
                };
                let coord = |d| match Some(d) == axis {
                    true => "r".to_string(),
                    false => self.layout.coord(d),
                };
                let (at, inside) = self.layout.view_access(view, &node.shape, coord, &SYNTAX);
                let mut raw = format!("p_{}[{at}]", crate::ir::plain_name(&param.name));
                // An index outside the gathered dim reads nothing and gives zero.
                if let Some(inside) = inside {
                    raw = format!(
                        "(if {inside} {{ {raw} }} else {{ ::core::default::Default::default() }})"
                    );
                }
                loaded(param.elem, raw)
            }
            Op::Index(d) => match &k.launch {
                Launch::Rows { axis, .. } if d == axis => "(r as u32)".to_string(),
                _ => format!("({} as u32)", self.layout.coord(*d)),
            },
            Op::Len(d) => format!("({} as {})", self.layout.size(*d), e.compute().name()),
            Op::Int(value) if e.is_float() => float_bits(&value.to_string(), e),
            Op::Int(value) => format!("({value}{})", e.name()),
            Op::Float(digits) => float_bits(digits, e),
            Op::Bool(b) => b.to_string(),
            Op::Unary(UnOp::Neg, a) if e.is_float() => format!("(-v{a})"),
            Op::Unary(UnOp::Neg, a) => format!("v{a}.wrapping_neg()"),
            Op::Unary(UnOp::Not, a) => format!("(!v{a})"),
            Op::Binary(op, a, b) => binary(*op, k.nodes[*a].elem(), &v(a), &v(b)),
            // Rounded to the narrow type (through f32, as on the GPU), and held in f32 again.
            Op::Cast(a) if e.is_narrow_float() => loaded(e, stored(e, &format!("(v{a} as f32)"))),
            Op::Cast(a) => format!("(v{a} as {})", e.compute().name()),
            Op::Select(c, a, b) => format!("(if v{c} {{ v{a} }} else {{ v{b} }})"),
            Op::Call(f, args) => {
                let args: Vec<String> = args.iter().map(v).collect();
                call(*f, k.nodes[node.op.operands()[0]].elem().compute(), &args)
            }
            Op::Reduce(..) => unreachable!("reductions are finished outside the element loops"),
            Op::Random(kind, seed, site) => {
                let f = match kind {
                    Random::Uniform => "rand",
                    Random::Normal => "randn",
                };
                format!("{OPS}::{f}(v{seed}, {}, {site})", self.position(id, scope))
            }
        }
    }

    /// The position a random value is drawn at (see [`Layout::position`]).
    fn position(&self, id: NodeId, scope: Scope) -> String {
        let element = scope == Scope::Element;
        self.layout
            .position(id, element, |x| format!("({x} as u64)"))
    }
}

/// A float literal, exactly: the bits of the value the literal denotes in its type (a narrow
/// float's as the f32 that holds it).
fn float_bits(digits: &str, e: Elem) -> String {
    if e.compute() == Elem::F32 {
        let v = e.round(digits.parse().unwrap_or(f32::NAN));
        format!("f32::from_bits({:#x})", v.to_bits())
    } else {
        let v: f64 = digits.parse().unwrap_or(f64::NAN);
        format!("f64::from_bits({:#x})", v.to_bits())
    }
}

/// `raw`, an element of type `e` as a slice holds it, as a value: a narrow float as f32 (the
/// fp8 types by the runtime's conversions, which match the GPU's also for NaN).
fn loaded(e: Elem, raw: String) -> String {
    match e {
        Elem::F16 | Elem::BF16 => format!("::fuse_runtime::{}::to_f32({raw})", e.name()),
        Elem::F8E4M3 | Elem::F8E5M2 => format!("{OPS}::{}_to_f32({raw})", e.name()),
        _ => raw,
    }
}

/// The value `v` of type `e` as a slice holds it: a narrow float rounded from f32.
fn stored(e: Elem, v: &str) -> String {
    match e {
        Elem::F16 | Elem::BF16 => format!("::fuse_runtime::{}::from_f32({v})", e.name()),
        Elem::F8E4M3 | Elem::F8E5M2 => format!("{OPS}::{}_from_f32({v})", e.name()),
        _ => v.to_string(),
    }
}

fn binary(op: BinOp, e: Elem, a: &str, b: &str) -> String {
    use BinOp::*;
    let wrapping = |name: &str| format!("{a}.wrapping_{name}({b})");
    match op {
        Add if e.is_int() => wrapping("add"),
        Sub if e.is_int() => wrapping("sub"),
        Mul if e.is_int() => wrapping("mul"),
        Div if e.is_int() => format!("{OPS}::div({a}, {b})"),
        Rem if e.is_int() => format!("{OPS}::rem({a}, {b})"),
        Shl => format!("{a}.wrapping_shl({b} as u32)"),
        Shr => format!("{a}.wrapping_shr({b} as u32)"),
        _ => format!("({a} {} {b})", op.symbol()),
    }
}

fn call(f: Func, e: Elem, a: &[String]) -> String {
    use Func::*;
    let x = &a[0];
    let method = |name: &str| {
        let rest = a[1..].join(", ");
        format!("{x}.{name}({rest})")
    };
    let op = |name: &str| format!("{OPS}::{name}({})", a.join(", "));
    match f {
        Exp => method("exp"),
        Exp2 => method("exp2"),
        Ln => method("ln"),
        Log2 => method("log2"),
        Log10 => method("log10"),
        Sqrt => method("sqrt"),
        Cbrt => method("cbrt"),
        Recip => method("recip"),
        Sin => method("sin"),
        Cos => method("cos"),
        Tan => method("tan"),
        Sinh => method("sinh"),
        Cosh => method("cosh"),
        Tanh => method("tanh"),
        Asin => method("asin"),
        Acos => method("acos"),
        Atan => method("atan"),
        // Not std's: its formulas overflow near the largest value and lose accuracy near 1
        // (`acosh`) and -1 (`atanh`); `ops` has libm's.
        Asinh => op("asinh"),
        Acosh => op("acosh"),
        Atanh => op("atanh"),
        ExpM1 => method("exp_m1"),
        Ln1p => method("ln_1p"),
        Floor => method("floor"),
        Ceil => method("ceil"),
        Round => method("round"),
        RoundTiesEven => method("round_ties_even"),
        Trunc => method("trunc"),
        Fract => method("fract"),
        ToDegrees => method("to_degrees"),
        ToRadians => method("to_radians"),
        Abs if e.is_float() => method("abs"),
        Abs => method("wrapping_abs"),
        Signum => method("signum"),
        Atan2 => method("atan2"),
        Powf => method("powf"),
        Hypot => method("hypot"),
        Copysign => method("copysign"),
        Log => method("log"),
        Max => method("max"),
        Min => method("min"),
        MulAdd => method("mul_add"),
        IsNan => method("is_nan"),
        IsFinite => method("is_finite"),
        IsInfinite => method("is_infinite"),
        IsSignNegative => method("is_sign_negative"),
        IsSignPositive => method("is_sign_positive"),
        Pow => method("wrapping_pow"),
        CountOnes => method("count_ones"),
        LeadingZeros => method("leading_zeros"),
        TrailingZeros => method("trailing_zeros"),
        Clamp => op("clamp"),
        Powi => op("powi"),
        Sigmoid => op("sigmoid"),
        Relu => op("relu"),
        Gelu => op("gelu"),
        GeluGrad => op("gelu_grad"),
        GeluTanh => op("gelu_tanh"),
        Silu => op("silu"),
        Softplus => op("softplus"),
        Erf => op("erf"),
        Rsqrt => op("rsqrt"),
        Detach => format!("({x})"),
    }
}
