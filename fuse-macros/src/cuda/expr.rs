//! Expressions: one CUDA C expression per value of the kernel.

use super::text::{c_math_name, cast, float_literal, int_literal, suffixed};
use super::{Cuda, Scope};
use crate::func::Func;
use crate::ir::{Launch, NodeId, Op, Random};
use crate::parse::{BinOp, UnOp};
use crate::ty::Elem;

impl Cuda<'_> {
    pub(super) fn expr(&mut self, id: NodeId, scope: Scope) -> String {
        let k = self.k;
        let node = &k.nodes[id];
        let e = node.elem();
        let v = |i: &NodeId| format!("v{i}");
        if let Some(&(_, value)) = self.settled_tests.iter().find(|&&(n, _)| n == id) {
            return value.to_string();
        }
        match &node.op {
            Op::Load(p) => {
                let param = &k.params[*p];
                let s = self.shape_index(param.shape.as_ref().expect("a tensor"));
                let name = crate::ir::plain_name(&param.name);
                // Packed bits: only elementwise launches over their shape read them.
                if param.packed {
                    self.helpers.insert("fz_bits");
                    return match scope {
                        Scope::Lane => {
                            format!("fz_bit(p_{name}, (long long)j * {}, l)", self.lanes)
                        }
                        _ => format!("fz_bit(p_{name}, o{s})"),
                    };
                }
                let raw = match (scope, &k.launch) {
                    (Scope::Lane, _) => format!("l_{name}.v[l]"),
                    (Scope::Element, _) if self.row_vectors_now.contains(p) => {
                        return self.row_element(param.elem, &format!("lv_{name}"));
                    }
                    (Scope::Element, _) if self.cached.contains(p) && self.peeled_extras => {
                        format!("rx_{name}")
                    }
                    (Scope::Element, _) if self.cached.contains(p) && self.in_shared => {
                        return self.row_element(param.elem, &format!("rc_{name}"));
                    }
                    (Scope::Element, _) if self.cached.contains(p) => {
                        return self.row_element(param.elem, &format!("rc_{name}[q]"));
                    }
                    (Scope::Element, _) => format!("p_{name}[o{s}]"),
                    (Scope::Row, Launch::Rows { .. }) => format!("p_{name}[b{s}]"),
                    (Scope::Row, _) => format!("p_{name}[0]"),
                };
                self.loaded(param.elem, raw)
            }
            Op::Scalar(p) => {
                let param = &k.params[*p];
                let raw = format!("p_{}", crate::ir::plain_name(&param.name));
                self.loaded(param.elem, raw)
            }
            Op::Element(p, offset) => {
                let param = &k.params[*p];
                let raw = format!("p_{}[{offset}]", crate::ir::plain_name(&param.name));
                self.loaded(param.elem, raw)
            }
            Op::View(p, _) if scope == Scope::Lane => {
                self.loaded(k.params[*p].elem, format!("l_w{id}.v[l]"))
            }
            Op::View(p, view) => {
                let param = &k.params[*p];
                let axis = match &k.launch {
                    Launch::Rows { axis, .. } => Some(*axis),
                    _ => None,
                };
                let coord = |d| match Some(d) == axis {
                    true => "(long long)r".to_string(),
                    false => self.layout.coord(d),
                };
                let (at, inside) =
                    self.layout
                        .view_access(view, &node.shape, coord, &super::SYNTAX);
                let mut raw = format!("p_{}[{at}]", crate::ir::plain_name(&param.name));
                // An index outside the gathered dim reads nothing and gives zero.
                if let Some(inside) = inside {
                    raw = format!("({inside} ? {raw} : ({})0)", param.elem.c_storage());
                }
                self.loaded(param.elem, raw)
            }
            Op::Index(d) => match &k.launch {
                Launch::Rows { axis, .. } if d == axis => "((unsigned int)r)".to_string(),
                _ => format!("((unsigned int){})", self.layout.coord(*d)),
            },
            Op::Len(d) => format!("(({}){})", e.compute().c_name(), self.layout.size(*d)),
            Op::Int(value) => int_literal(*value, e),
            Op::Float(digits) => float_literal(digits, e),
            Op::Bool(b) => b.to_string(),
            Op::Unary(op, a) => self.unary(*op, e, &v(a)),
            Op::Binary(BinOp::Div, a, b)
                if scope != Scope::Row && self.uniform_divisors.contains(b) =>
            {
                match self.fast_division {
                    true => format!("fz_div_fast(v{a}, v{b}, dv_{b}, fz_bad)"),
                    false => format!("fz_div_by(v{a}, v{b}, dv_{b})"),
                }
            }
            // A uniform draw below a launch-wide value (dropout's mask), compared as integers.
            Op::Binary(BinOp::Lt, a, b) if self.draw_word(*a, *b, scope).is_some() => {
                let (word, bound) = self.draw_word(*a, *b, scope).unwrap_or_default();
                self.helpers.insert("fz_u01_bound");
                format!("fz_u01_below({word}, {bound}(v{b}))")
            }
            Op::Binary(BinOp::Mul, a, b) if self.exact_products.contains(&id) => {
                match k.nodes[*a].elem().compute() {
                    Elem::F64 => format!("__dmul_rn(v{a}, v{b})"),
                    _ => format!("__fmul_rn(v{a}, v{b})"),
                }
            }
            // A 64-bit product or left shift with a constant operand takes it through
            // `fz_zero`, which neither compiler can fold: ptxas 13.0 (sm_80 and sm_90) made
            // `x << 31` and `x * 2147483648` on 64 bits `x * -2147483648` where it computed
            // them again inside an unrolled loop (p11659 of the random programs: `(s << 95)
            // .min(..)` written through `&mut`, its high word negated). NVVM folds constant
            // products (`s * 65536 * 32768`), so every constant operand goes through it.
            Op::Binary(op @ (BinOp::Mul | BinOp::Shl), a, b)
                if e.is_int() && e.bits() == 64 && (self.constant(*a) || self.constant(*b)) =>
            {
                let hide = |n: &NodeId| match self.constant(*n) {
                    true => format!("({} ^ fz_zero)", v(n)),
                    false => v(n),
                };
                // A shift hides its amount only: a constant shifted by a variable amount is no product.
                let (x, y) = match op {
                    BinOp::Shl => (v(a), hide(b)),
                    _ => (hide(a), hide(b)),
                };
                self.helpers.insert("fz_zero");
                self.binary(*op, e, &x, &y)
            }
            // A 32-bit unsigned value widened to 64 bits and compared with a 64-bit integer
            // (`index(v) as i64 == label`, cross-entropy's): equal when the other's high word
            // is zero and its low word the value, a test of the high word that stays out of a
            // row's loop where the other is the row's, and one 32-bit comparison an element
            // (ptxas compared both words of each element).
            Op::Binary(op @ (BinOp::Eq | BinOp::Ne), a, b) if self.widened(*a, *b).is_some() => {
                let (narrow, wide) = self.widened(*a, *b).unwrap_or_default();
                let equal = format!(
                    "((unsigned long long)v{wide} >> 32 == 0ull && (unsigned int)v{wide} == (unsigned int)v{narrow})"
                );
                match op {
                    BinOp::Eq => equal,
                    _ => format!("(!{equal})"),
                }
            }
            // An ordered comparison of floats with a constant operand takes the constant
            // through `fz_zero` (plus a zero ptxas cannot see): ptxas 13.0 (sm_80 and sm_90)
            // folded `setp.gt.f32 |x|, -2.0` to true, losing NaN (p21199 of the random programs:
            // `(x2 / x0).copysign(0.25).clamp(x4, -2.0)` was -2 for `0 / 0`, not NaN).
            Op::Binary(op @ (BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge), a, b)
                if k.nodes[*a].elem().is_float() && (self.constant(*a) || self.constant(*b)) =>
            {
                let t = k.nodes[*a].elem().compute();
                let (x, y) = (self.opaque(*a, t), self.opaque(*b, t));
                self.binary(*op, t, &x, &y)
            }
            Op::Binary(op, a, b) => self.binary(*op, k.nodes[*a].elem().compute(), &v(a), &v(b)),
            Op::Cast(a) => {
                if let Some(converted) = self.float_to_int(*a, e) {
                    return converted;
                }
                let converted = cast(k.nodes[*a].elem(), e, &v(a));
                match e.is_narrow_float() {
                    // Rounded to the 16-bit type, and held in f32 again; `values` keeps the
                    // bits too, for a store of the value (`Cuda::bits`).
                    true => {
                        let bits = self.stored(e, &converted);
                        self.cast_bits = Some((bits.clone(), converted));
                        self.loaded(e, bits)
                    }
                    false => converted,
                }
            }
            Op::Select(c, a, b) => format!("({} ? {} : {})", v(c), v(a), v(b)),
            Op::Call(f, args) => {
                let arg_elem = k.nodes[node.op.operands()[0]].elem().compute();
                let args: Vec<String> = match f {
                    // Its bounds are compared as above.
                    crate::func::Func::Clamp if arg_elem.is_float() => {
                        let (lo, hi) = (
                            self.opaque(args[1], arg_elem),
                            self.opaque(args[2], arg_elem),
                        );
                        vec![v(&args[0]), lo, hi]
                    }
                    _ => args.iter().map(v).collect(),
                };
                if self.exact_products.contains(&id) && !self.k.fast_math {
                    if let Some(text) = self.exact_call(*f, arg_elem, &args) {
                        return text;
                    }
                }
                if self.log_of_normal(id) {
                    self.helpers.insert("fz_log_normal");
                    return format!("fz_log_normal({})", args[0]);
                }
                self.call(*f, arg_elem, &args)
            }
            Op::Reduce(..) => unreachable!("reductions are finished outside the element loops"),
            Op::Random(kind, seed, site) => {
                self.helpers.insert("fz_random");
                match (scope, kind) {
                    // A row's vector step drew the block of its four lanes (`rq<id>`); `j` is
                    // the lane, and the position of lane 0 a multiple of four.
                    (Scope::Element, Random::Uniform) if self.lane_randoms.contains(&id) => {
                        format!("fz_u01(rq{id}[j >> 2].v[j & 3])")
                    }
                    (Scope::Element, Random::Normal) if self.lane_randoms.contains(&id) => format!(
                        "fz_box_muller(rq{id}[j >> 2].v[j & 2], rq{id}[j >> 2].v[(j & 2) | 1], (j & 1) != 0)"
                    ),
                    // The words come from `vector_loop`, one Philox block per four lanes.
                    (Scope::Lane, Random::Uniform) => format!("fz_u01(rq{id}[l >> 2].v[l & 3])"),
                    (Scope::Lane, Random::Normal) => format!(
                        "fz_box_muller(rq{id}[l >> 2].v[l & 2], rq{id}[l >> 2].v[(l & 2) | 1], (l & 1) != 0)"
                    ),
                    (_, Random::Uniform) => {
                        format!("fz_rand(rk{seed}, {}, {site}u)", self.position(id, scope))
                    }
                    (_, Random::Normal) => {
                        format!("fz_randn(rk{seed}, {}, {site}u)", self.position(id, scope))
                    }
                }
            }
        }
    }

    /// `a as to` for an f32 `a` and an integer type of at most 32 bits: one conversion (the
    /// `fz_f2i` helpers), into which a `round`, `floor`, `ceil` or `trunc` of `a`, and before
    /// that a clamp of it between constants, are folded. `as` is monotone, so for `lo <= hi`,
    /// `clamp(x, lo, hi) as T == clamp(x as T, lo as T, hi as T)` for every x but NaN, which both
    /// sides send to 0 where `lo as T <= 0 <= hi as T`; and `x.round() as T` is x converted
    /// rounding half away from zero, as `fz_f2i_ra` does. The nodes folded in are still written
    /// (and left to the compiler to drop where nothing else reads them).
    fn float_to_int(&mut self, a: NodeId, to: Elem) -> Option<String> {
        let k = self.k;
        let p = match to {
            Elem::I8 => "s8",
            Elem::U8 => "u8",
            Elem::I16 => "s16",
            Elem::U16 => "u16",
            Elem::I32 => "s32",
            Elem::U32 => "u32",
            _ => return None,
        };
        if k.nodes[a].elem().compute() != Elem::F32 {
            return None;
        }
        let (min, max) = to.int_bounds();
        // Rust's `as` from f32 (NaN excluded by `lo <= hi`).
        let conv = |x: f32| (x as i128).clamp(min, max);
        let mut x = a;
        let mut bounds = (min, max);
        if let Op::Call(Func::Clamp, args) = &k.nodes[x].op {
            if let (Elem::F32, Some(lo), Some(hi)) = (
                k.nodes[x].elem(),
                self.const_f32(args[1]),
                self.const_f32(args[2]),
            ) {
                if lo <= hi && conv(lo) <= 0 && conv(hi) >= 0 {
                    bounds = (conv(lo), conv(hi));
                    x = args[0];
                }
            }
        }
        let mut mode = "rz";
        if let Op::Call(f @ (Func::Round | Func::Floor | Func::Ceil | Func::Trunc), args) =
            &k.nodes[x].op
        {
            if k.nodes[x].elem() == Elem::F32 && k.nodes[args[0]].elem() == Elem::F32 {
                mode = match f {
                    Func::Round => "ra",
                    Func::Floor => "rm",
                    Func::Ceil => "rp",
                    _ => "rz",
                };
                x = args[0];
            }
        }
        self.helpers.insert("fz_f2i");
        let converted = format!("fz_f2i_{mode}_{p}(v{x})");
        // The helpers give an int (an unsigned int for u32), clamped as one.
        let int = if to == Elem::U32 {
            Elem::U32
        } else {
            Elem::I32
        };
        // The conversion saturates already: a bound at the type's own limit is left out.
        let (lo, hi) = (int_literal(bounds.0, int), int_literal(bounds.1, int));
        let clamped = match (bounds.0 > min, bounds.1 < max) {
            (true, true) => format!("fz_iclamp({converted}, {lo}, {hi})"),
            (true, false) => format!("fz_imax({converted}, {lo})"),
            (false, true) => format!("fz_imin({converted}, {hi})"),
            (false, false) => converted,
        };
        Some(format!("(({}){clamped})", to.c_name()))
    }

    /// The value of an f32 node that is a constant: a literal, or the negation of one.
    fn const_f32(&self, id: NodeId) -> Option<f32> {
        let node = &self.k.nodes[id];
        if node.elem() != Elem::F32 {
            return None;
        }
        match &node.op {
            Op::Float(digits) => digits.parse().ok(),
            Op::Int(value) => Some(*value as f32),
            Op::Unary(UnOp::Neg, a) => self.const_f32(*a).map(|v| -v),
            _ => None,
        }
    }

    /// Whether node `id` is `ln(x)` for an f32 `x` that is never below `f32::MIN_POSITIVE`
    /// (but NaN), outside `#[fast_math]`: `logf` without its cases for subnormal and zero
    /// arguments (`fz_log_normal`), which `logf` tests at every call, five of its 24
    /// instructions. Softplus written as `(x.exp() + 1.0).ln()` takes the log of at least 1:
    /// in 16-bit types it is bound by its instructions, not its bytes.
    pub(super) fn log_of_normal(&self, id: NodeId) -> bool {
        match &self.k.nodes[id].op {
            Op::Call(Func::Ln, args) => {
                let x = args[0];
                self.k.nodes[x].elem().compute() == Elem::F32
                    && !self.k.fast_math
                    && self
                        .least(x)
                        .is_some_and(|l| l >= f64::from(f32::MIN_POSITIVE))
            }
            _ => false,
        }
    }

    /// A number that f32 node `n` is never below but where it is NaN, from its operations
    /// alone; `None` where none is known. A sum or product of values at least `a` and `b` is at
    /// least `a + b` (`a * b`, for `a, b >= 0`) rounded to f32, as rounding is monotone, and so
    /// at least the f64 sum less a margin wider than both roundings (`round_down`).
    fn least(&self, n: NodeId) -> Option<f64> {
        let node = &self.k.nodes[n];
        if node.elem() != Elem::F32 {
            return None;
        }
        let positive = |m: NodeId| self.least(m).filter(|&b| b >= 0.0);
        match &node.op {
            Op::Float(_) | Op::Int(_) | Op::Unary(UnOp::Neg, _) => {
                self.const_f32(n).map(f64::from).filter(|b| !b.is_nan())
            }
            // exp's, exp2's and abs's results are never negative (exp(-inf) is +0).
            Op::Call(Func::Exp | Func::Exp2 | Func::Abs, _) => Some(0.0),
            // `max` returns the other operand where one is NaN, so it is at least the
            // smaller of the two bounds, and at least a constant operand's value always.
            Op::Call(Func::Max, args) => {
                let (a, b) = (self.least(args[0]), self.least(args[1]));
                let constant = |m: NodeId, least: Option<f64>| least.filter(|_| self.constant(m));
                let both = a.zip(b).map(|(a, b)| a.min(b));
                [both, constant(args[0], a), constant(args[1], b)]
                    .into_iter()
                    .flatten()
                    .reduce(f64::max)
            }
            Op::Binary(BinOp::Add, a, b) => Some(round_down(self.least(*a)? + self.least(*b)?)),
            Op::Binary(BinOp::Mul, a, b) => Some(round_down(positive(*a)? * positive(*b)?)),
            _ => None,
        }
    }

    /// The position a random value is drawn at (see [`Layout::position`]).
    pub(super) fn position(&self, id: NodeId, scope: Scope) -> String {
        let element = scope == Scope::Element;
        self.layout
            .position(id, element, |x| format!("(unsigned long long)({x})"))
    }

    fn unary(&mut self, op: UnOp, e: Elem, a: &str) -> String {
        match op {
            UnOp::Neg if e.is_float() => format!("(-{a})"),
            UnOp::Neg if e.is_signed_int() && e.bits() < 32 => {
                self.helpers.insert("fz_neg_narrow");
                format!("(({})fz_neg_narrow((int){a}))", e.c_name())
            }
            UnOp::Neg => format!("(({})(0ull - ({}){a}))", e.c_name(), e.c_unsigned()),
            UnOp::Not if e == Elem::Bool => format!("(!{a})"),
            UnOp::Not => format!("(({})~{a})", e.c_name()),
        }
    }

    /// For `a < b`, with `a` a uniform draw whose Philox word this scope holds (the lanes' blocks
    /// of an elementwise step or of a row's vector step), or its rounding to bf16 or f16 (a
    /// 16-bit dropout's), and `b` one value for every element: the word, and the helper that
    /// gives the bound it is compared with (`fz_u01_below`). The draw is the word's top 24 bits
    /// times 2^-24 and the rounding is monotone, so the draws below `b` are the words below a
    /// bound: a conversion, a rounding and a float comparison an element become one integer
    /// comparison (G8's backward, bf16).
    fn draw_word(&self, a: NodeId, b: NodeId, scope: Scope) -> Option<(String, &'static str)> {
        let k = self.k;
        let uniform = |n: NodeId| {
            matches!(k.nodes[n].op, Op::Random(Random::Uniform, ..))
                && k.nodes[n].elem() == Elem::F32
        };
        let (draw, bound) = match (&k.nodes[a].op, k.nodes[a].elem()) {
            (Op::Random(Random::Uniform, ..), Elem::F32) => (a, "fz_u01_bound"),
            (Op::Cast(u), Elem::BF16) if uniform(*u) => (*u, "fz_u01_bound_bf16"),
            (Op::Cast(u), Elem::F16) if uniform(*u) => (*u, "fz_u01_bound_f16"),
            _ => return None,
        };
        if !k.nodes[b].shape.is_empty() || k.nodes[b].elem() != k.nodes[a].elem() {
            return None;
        }
        let word = match scope {
            Scope::Lane => format!("rq{draw}[l >> 2].v[l & 3]"),
            Scope::Element if self.lane_randoms.contains(&draw) => {
                format!("rq{draw}[j >> 2].v[j & 3]")
            }
            _ => return None,
        };
        Some((word, bound))
    }

    /// For `a == b` (or `!=`) of 64-bit integers one of which is an unsigned value of at most
    /// 32 bits widened (`Cast`): that value and the other operand.
    fn widened(&self, a: NodeId, b: NodeId) -> Option<(NodeId, NodeId)> {
        let k = self.k;
        let narrow = |n: NodeId| match k.nodes[n].op {
            Op::Cast(x)
                if k.nodes[n].elem().is_int()
                    && k.nodes[n].elem().bits() == 64
                    && k.nodes[x].elem().is_int()
                    && !k.nodes[x].elem().is_signed_int()
                    && k.nodes[x].elem().bits() <= 32 =>
            {
                Some(x)
            }
            _ => None,
        };
        if k.nodes[a].elem() != k.nodes[b].elem() {
            return None;
        }
        match (narrow(a), narrow(b)) {
            (Some(x), _) => Some((x, b)),
            (None, Some(y)) => Some((y, a)),
            _ => None,
        }
    }

    /// `v<n>`, or where `n` is a constant, `v<n>` plus a zero of type `t` (f32 or f64) that
    /// neither compiler can fold (`fz_zero`, a `__constant__`): a comparison with it is not
    /// one with a known constant, which ptxas 13.0 folded wrongly for NaN (see `expr`).
    fn opaque(&mut self, n: NodeId, t: Elem) -> String {
        if !self.constant(n) {
            return format!("v{n}");
        }
        self.helpers.insert("fz_zero");
        match t {
            Elem::F64 => format!("(v{n} + __longlong_as_double((long long)fz_zero))"),
            _ => format!("(v{n} + __uint_as_float(fz_zero))"),
        }
    }

    /// Whether node `n`'s value is a constant of the program: literals and what is computed
    /// from them alone, which NVVM folds.
    fn constant(&self, n: NodeId) -> bool {
        match &self.k.nodes[n].op {
            Op::Int(_) | Op::Float(_) | Op::Bool(_) => true,
            op @ (Op::Unary(..) | Op::Binary(..) | Op::Cast(_) | Op::Select(..)) => {
                op.operands().into_iter().all(|m| self.constant(m))
            }
            _ => false,
        }
    }

    pub(super) fn binary(&mut self, op: BinOp, e: Elem, a: &str, b: &str) -> String {
        use BinOp::*;
        let (t, u) = (e.c_name(), e.c_unsigned());
        match op {
            Add | Sub | Mul if e.wraps_via_unsigned() => {
                format!("(({t})(({u}){a} {} ({u}){b}))", op.symbol())
            }
            Add | Sub | Mul if e.is_int() => format!("(({t})({a} {} {b}))", op.symbol()),
            Rem if e.is_float() => format!("{}({a}, {b})", suffixed("fmod", e)),
            Div | Rem if e.is_int() => {
                let name = if op == Div { "fz_div" } else { "fz_rem" };
                self.helpers.insert(name);
                format!("{name}({a}, {b})")
            }
            Shl => format!(
                "(({t})(({u}){a} << ((unsigned int){b} & {}u)))",
                e.bits() - 1
            ),
            Shr => format!("(({t})({a} >> ((unsigned int){b} & {}u)))", e.bits() - 1),
            BitAnd | BitOr | BitXor if e == Elem::Bool => {
                format!("((bool)({a} {} {b}))", op.symbol())
            }
            _ => format!("({a} {} {b})", op.symbol()),
        }
    }

    /// A function of [`ENDS_IN_PRODUCT`], its last product rounded on its own (see
    /// `exact_products`); `None` for the others.
    fn exact_call(&mut self, f: Func, e: Elem, a: &[String]) -> Option<String> {
        use Func::*;
        let x = &a[0];
        let mul = if e == Elem::F64 {
            "__dmul_rn"
        } else {
            "__fmul_rn"
        };
        Some(match f {
            ToDegrees | ToRadians => format!("{mul}({x}, {})", angle_factor(f, e)),
            Gelu | GeluTanh => {
                let name = if f == Gelu {
                    "fz_gelu_rn"
                } else {
                    "fz_gelu_tanh_rn"
                };
                self.helpers.insert(name);
                format!("{name}({x})")
            }
            _ => return None,
        })
    }

    fn call(&mut self, f: Func, e: Elem, a: &[String]) -> String {
        use Func::*;
        let s = |name: &str| suffixed(name, e);
        let one = if e == Elem::F32 { "1.0f" } else { "1.0" };
        let x = &a[0];
        let helper = |w: &mut Self, name: &'static str| {
            w.helpers.insert(name);
            format!("{name}({})", a.join(", "))
        };
        if e == Elem::F32 && self.k.fast_math {
            if let Some(text) = fast(f, a) {
                return text;
            }
        }
        match f {
            Exp | Exp2 | Log2 | Log10 | Sqrt | Cbrt | Sin | Cos | Tan | Sinh | Cosh | Tanh
            | Asin | Acos | Atan | Asinh | Acosh | Atanh | Floor | Ceil | Round | RoundTiesEven
            | Trunc | Erf => {
                format!("{}({x})", s(c_math_name(f)))
            }
            Ln => format!("{}({x})", s("log")),
            ExpM1 => format!("{}({x})", s("expm1")),
            Ln1p => format!("{}({x})", s("log1p")),
            Recip => format!("({one} / {x})"),
            // CUDA's rsqrtf (at most 2 ulp, as torch.rsqrt on CUDA): unlike 1/sqrt or
            // __frsqrt_rn it has no slow-path call, around which a cached row's registers spill.
            Rsqrt if e == Elem::F32 => format!("rsqrtf({x})"),
            Rsqrt => format!("({one} / {}({x}))", s("sqrt")),
            Detach => format!("({x})"),
            Fract => format!("({x} - {}({x}))", s("trunc")),
            ToDegrees | ToRadians => format!("({x} * {})", angle_factor(f, e)),
            Abs if e.is_float() => format!("{}({x})", s("fabs")),
            // std's `log(self, base)` is `self.ln() / base.ln()`.
            Log => format!("({}({x}) / {}({}))", s("log"), s("log"), a[1]),
            Hypot if e == Elem::F64 => helper(self, "fz_hypot"),
            Atan2 | Powf | Hypot | Copysign => format!("{}({x}, {})", s(c_math_name(f)), a[1]),
            Max | Min if e.is_float() => format!(
                "{}({x}, {})",
                s(if f == Max { "fmax" } else { "fmin" }),
                a[1]
            ),
            // `entry_source` adds the helper wherever its text names `fz_smax` or `fz_smin`.
            Max | Min | Clamp if super::text::through_unsigned(e) => {
                match f {
                    Max => format!("fz_smax({x}, {})", a[1]),
                    Min => format!("fz_smin({x}, {})", a[1]),
                    // As below: `lo` where `x < lo`, even when `lo > hi`.
                    _ => format!(
                        "({x} < {lo} ? {lo} : fz_smin({x}, {hi}))",
                        lo = a[1],
                        hi = a[2]
                    ),
                }
            }
            Max => format!("({x} > {b} ? {x} : {b})", b = a[1]),
            Min => format!("({x} < {b} ? {x} : {b})", b = a[1]),
            Clamp => format!(
                "({x} < {lo} ? {lo} : ({x} > {hi} ? {hi} : {x}))",
                lo = a[1],
                hi = a[2]
            ),
            MulAdd => format!("{}({x}, {}, {})", s("fma"), a[1], a[2]),
            IsNan => format!("((bool)isnan({x}))"),
            IsFinite => format!("((bool)isfinite({x}))"),
            IsInfinite => format!("((bool)isinf({x}))"),
            IsSignNegative => format!("(signbit({x}) != 0)"),
            IsSignPositive => format!("(signbit({x}) == 0)"),
            Relu => format!("({x} < 0 ? ({})0 : {x})", e.c_name()),
            CountOnes if e.bits() <= 32 => {
                format!("((unsigned int)__popc((unsigned int)({}){x}))", e.c_bits())
            }
            CountOnes => format!("((unsigned int)__popcll((unsigned long long){x}))"),
            LeadingZeros if e.bits() == 32 => format!("((unsigned int)__clz((int){x}))"),
            // Narrower types: the zeros of their bits zero-extended to 32, less the extension.
            LeadingZeros if e.bits() < 32 => format!(
                "((unsigned int)__clz((int)({}){x}) - {}u)",
                e.c_bits(),
                32 - e.bits()
            ),
            LeadingZeros => format!("((unsigned int)__clzll((long long){x}))"),
            TrailingZeros if e.bits() <= 32 => format!(
                "({x} == 0 ? {}u : (unsigned int)(__ffs((int){x}) - 1))",
                e.bits()
            ),
            TrailingZeros => {
                format!("({x} == 0 ? 64u : (unsigned int)(__ffsll((long long){x}) - 1))")
            }
            Abs => helper(self, "fz_abs"),
            Signum => helper(self, "fz_signum"),
            Powi => helper(self, "fz_powi"),
            Pow => helper(self, "fz_pow"),
            Sigmoid => helper(self, "fz_sigmoid"),
            Gelu => helper(self, "fz_gelu"),
            GeluGrad => helper(self, "fz_gelu_grad"),
            GeluTanh => helper(self, "fz_gelu_tanh"),
            Silu => helper(self, "fz_silu"),
            Softplus => helper(self, "fz_softplus"),
        }
    }
}

/// A number below both `x` rounded to f32 and `x` as an f64 sum or product of two f32 values
/// rounded (each at most half an ulp away: 2^-24 of `x`, or 2^-150 among the subnormals).
fn round_down(x: f64) -> f64 {
    x - x.abs() * f64::powi(2.0, -22) - f64::powi(2.0, -148)
}

/// `#[fast_math]`: the f32 functions CUDA's `--use_fast_math` replaces by intrinsics, and the
/// helpers built on `expf`. Division and square roots stay correctly rounded.
fn fast(f: Func, a: &[String]) -> Option<String> {
    use Func::*;
    let x = &a[0];
    Some(match f {
        Exp => format!("__expf({x})"),
        Ln => format!("__logf({x})"),
        Log2 => format!("__log2f({x})"),
        Log10 => format!("__log10f({x})"),
        Sin => format!("__sinf({x})"),
        Cos => format!("__cosf({x})"),
        Tan => format!("__tanf({x})"),
        Powf => format!("__powf({x}, {})", a[1]),
        Log => format!("(__logf({x}) / __logf({}))", a[1]),
        Sigmoid => format!("(1.0f / (1.0f + __expf(-{x})))"),
        Silu => format!("({x} / (1.0f + __expf(-{x})))"),
        Softplus => format!("(fmaxf({x}, 0.0f) + log1pf(__expf(-fabsf({x}))))"),
        _ => return None,
    })
}

/// The functions whose last step is a product: where a row's maximum reads one in several
/// passes, `exact_products` keeps that product apart and `exact_call` rounds it on its own.
pub(super) const ENDS_IN_PRODUCT: [Func; 4] =
    [Func::ToDegrees, Func::ToRadians, Func::Gelu, Func::GeluTanh];

/// The constant `to_degrees` (`to_radians`) multiplies by, in `e`'s C type.
fn angle_factor(f: Func, e: Elem) -> &'static str {
    match (f, e == Elem::F32) {
        (Func::ToDegrees, true) => "57.2957795130823208767981548141051703f",
        (Func::ToDegrees, false) => "(180.0 / 3.14159265358979323846264338327950288)",
        (_, true) => "(3.14159265358979323846264338327950288f / 180.0f)",
        (_, false) => "(3.14159265358979323846264338327950288 / 180.0)",
    }
}
#[cfg(test)]
mod tests {
    /// The planner counts a `#[fast_math]` kernel's f32 functions by `has_fast_intrinsic` when it
    /// sizes the kernel (`plan/tuning.rs`): each of those has its fast form here.
    #[test]
    fn every_fast_intrinsic_is_printed_fast() {
        let args = ["x".to_string(), "y".to_string()];
        for info in crate::func::FUNCS {
            if info.func.has_fast_intrinsic() {
                assert!(super::fast(info.func, &args).is_some(), "{}", info.name);
            }
        }
    }
}
