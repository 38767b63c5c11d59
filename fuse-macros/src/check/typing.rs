//! Types and shapes of expressions: each expression becomes a node of the kernel's graph.

use crate::error::{closest, did_you_mean};
use crate::func::{self, Sig};
use crate::ir::{is_subsequence, Dim, DimId, Op, Random, Reduce};
use crate::parse::{BinOp, Expr, ExprKind, UnOp};
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::check::Checker;
use crate::consts::Value;

impl Checker<'_> {
    /// Checks an expression and adds its node; `None` after an error.
    pub fn expr(&mut self, e: &Expr) -> Option<usize> {
        let t = &e.tokens;
        match &e.kind {
            ExprKind::Int { value, suffix } => self.int_literal(*value, *suffix, t),
            ExprKind::Float { digits, suffix } => {
                if let Some(e) = suffix.filter(|e| e.float_overflows(digits)) {
                    self.cx.spanned(t, float_out_of_range(digits, e));
                    return None;
                }
                let ty = suffix.map_or(Ty::FloatLit, Ty::Elem);
                Some(self.push(Op::Float(digits.clone()), ty, vec![], t))
            }
            ExprKind::Bool(b) => Some(self.push(Op::Bool(*b), Ty::Elem(Elem::Bool), vec![], t)),
            ExprKind::Const { elem, value } => {
                let op = match value {
                    Value::Float(text) => Op::Float(text.clone()),
                    Value::Int(v) => Op::Int(*v),
                };
                Some(self.push(op, Ty::Elem(*elem), vec![], t))
            }
            ExprKind::Var(name) => self.var(name),
            ExprKind::Index(base, indices) => self.element(base, indices, t),
            ExprKind::Slice(base, items) => self.slice(base, items, t),
            ExprKind::Unary(op, a) => self.unary(*op, a, t),
            ExprKind::Binary(op, a, b, op_tokens) => self.binary(*op, a, b, op_tokens, t),
            ExprKind::Cast(a, ty) => self.cast(a, ty, t),
            ExprKind::If(c, a, b) => self.select(c, a, b, t),
            ExprKind::Call(name, args) => self.call(name, args, t),
            ExprKind::Method(recv, name, args) => self.method(recv, name, args, t),
            ExprKind::Tuple(_) => {
                self.cx.spanned(t, "a tuple can only be the final expression of a kernel, returning several outputs");
                None
            }
        }
    }

    fn int_literal(&mut self, value: i128, suffix: Option<Elem>, t: &TokenStream) -> Option<usize> {
        if let Some(e) = suffix {
            if !e.int_fits(value) {
                self.cx.spanned(t, format!("literal out of range for `{e}`: `{value}` does not fit in `{}`; use a wider type such as `i64`", e.range_text()));
                return None;
            }
        }
        let ty = suffix.map_or(Ty::IntLit, Ty::Elem);
        Some(self.push(Op::Int(value), ty, vec![], t))
    }

    fn var(&mut self, name: &syn::Ident) -> Option<usize> {
        let text = crate::ir::plain_name(name);
        if let Some(&(_, id)) = self.scope.iter().rev().find(|(n, _)| *n == text) {
            if let Some(&Op::Load(p)) = self.nodes.get(id).map(|n| &n.op) {
                if self.params[p].written {
                    self.written_read(p, &quote::ToTokens::to_token_stream(name));
                    return None;
                }
            }
            if let Some(Op::Load(p)) = self.nodes.get(id).map(|n| &n.op) {
                let shape = self.params[*p].shape.as_deref().unwrap_or_default();
                if let Some(&d) = shape
                    .iter()
                    .find(|&&d| matches!(self.dims[d], Dim::Composite(_)))
                {
                    let dim = self.dims[d].text(&self.dims);
                    self.cx.spanned(name, format!("`{text}` has the dim `{dim}`, made of parts, and is read one part at a time through a slice, as in `{text}[{}]`", self.slice_example(*p)));
                    return None;
                }
            }
            return (id != crate::check::POISONED).then_some(id);
        }
        if self.is_named_dim(&text) {
            self.cx.spanned(
                name,
                format!("`{text}` is a dim, not a value; its size is `len({text})`, and dims appear in types and as the second argument of a reduction, as in `sum(x, {text})`"),
            );
            return None;
        }
        let names: Vec<&str> = self.scope.iter().map(|(n, _)| n.as_str()).collect();
        let hint = did_you_mean(closest(&text, names.iter().copied()));
        self.cx.spanned(
            name,
            format!("cannot find value `{text}` in this kernel{hint}"),
        );
        None
    }

    fn unary(&mut self, op: UnOp, a: &Expr, t: &TokenStream) -> Option<usize> {
        let a = self.expr(a)?;
        let ty = self.nodes[a].ty;
        let bad = match op {
            UnOp::Neg if ty.is_bool() => Some("cannot negate `bool`; use `!` for logical not".to_string()),
            UnOp::Neg if !ty.is_float() && !ty.is_signed_int() => {
                Some(format!("cannot negate `{ty}`: unsigned integers have no negative values; convert with `as` to a signed type first"))
            }
            UnOp::Not if ty.is_float() => Some(format!(
                "cannot apply `!` to `{ty}`: `!` is logical not on `bool` and bitwise not on integers; compare instead, as in `x == 0.0`"
            )),
            _ => None,
        };
        if let Some(message) = bad {
            self.cx.spanned(t, message);
            return None;
        }
        let shape = self.nodes[a].shape.clone();
        Some(self.push(Op::Unary(op, a), ty, shape, t))
    }

    fn binary(
        &mut self,
        op: BinOp,
        a: &Expr,
        b: &Expr,
        op_t: &TokenStream,
        t: &TokenStream,
    ) -> Option<usize> {
        let (l, r) = (self.expr(a), self.expr(b));
        let (l, r) = (l?, r?);
        let shape = self.broadcast(&[l, r], t)?;
        let ty = match op {
            BinOp::Shl | BinOp::Shr => {
                for (side, id) in [(a, l), (b, r)] {
                    if !self.nodes[id].ty.is_int() {
                        let found = self.nodes[id].ty;
                        self.cx.spanned(
                            &side.tokens,
                            format!("cannot shift `{found}`: `{}` needs integers", op.symbol()),
                        );
                        return None;
                    }
                }
                self.nodes[l].ty
            }
            _ => self.unify(l, r, b, op_t)?,
        };
        let result = self.binary_result(op, ty, op_t)?;
        Some(self.push(Op::Binary(op, l, r), result, shape, t))
    }

    /// The result type of `op` on operands of type `ty`, or an error if `ty` does not have it.
    fn binary_result(&mut self, op: BinOp, ty: Ty, op_t: &TokenStream) -> Option<Ty> {
        use BinOp::*;
        let sym = op.symbol();
        let bad = match op {
            Add | Sub | Mul | Div | Rem if ty.is_bool() => {
                Some(format!("cannot apply `{sym}` to `bool`; convert with `as u32` to count, or use `&&`, `||`, `^`"))
            }
            And | Or if !ty.is_bool() => Some(format!(
                "`{sym}` needs `bool` operands, found `{ty}`; compare first, as in `x > 0.0`"
            )),
            BitAnd | BitOr | BitXor if ty.is_float() => {
                Some(format!("cannot apply `{sym}` to `{ty}`: bit operations need integers or `bool`"))
            }
            _ => None,
        };
        if let Some(message) = bad {
            self.cx.spanned(op_t, message);
            return None;
        }
        Some(if op.is_comparison() {
            Ty::Elem(Elem::Bool)
        } else {
            ty
        })
    }

    /// The common type of two operands; a literal takes the other side's type.
    pub fn unify(&mut self, l: usize, r: usize, r_expr: &Expr, at: &TokenStream) -> Option<Ty> {
        let (lt, rt) = (self.nodes[l].ty, self.nodes[r].ty);
        match (lt, rt) {
            (Ty::Elem(a), Ty::Elem(b)) if a == b => Some(lt),
            (Ty::Elem(a), Ty::Elem(b)) => {
                let fix = format!("({} as {a})", operand(&r_expr.tokens));
                self.cx.spanned(at, format!("mismatched types: `{a}` and `{b}`; nothing converts implicitly: write `{fix}`"));
                None
            }
            (Ty::Elem(a), _) => self.coerce_or_report(r, a).then_some(lt),
            (_, Ty::Elem(b)) => self.coerce_or_report(l, b).then_some(rt),
            (Ty::FloatLit, _) | (_, Ty::FloatLit) => Some(Ty::FloatLit),
            _ => Some(Ty::IntLit),
        }
    }

    pub fn coerce_or_report(&mut self, id: usize, to: Elem) -> bool {
        match self.coerce(id, to) {
            Ok(()) => true,
            Err(message) => {
                let t = self.nodes[id].tokens.clone();
                self.cx.spanned(t, message);
                false
            }
        }
    }

    /// Gives a literal-typed node (and its literal-typed operands) the type `to`.
    pub fn coerce(&mut self, id: usize, to: Elem) -> Result<(), String> {
        let node = &self.nodes[id];
        match node.ty {
            Ty::Elem(e) if e == to => return Ok(()),
            Ty::Elem(e) => return Err(format!("mismatched types: expected `{to}`, found `{e}`; convert with `as {to}`")),
            Ty::IntLit if !to.is_numeric() => return Err(format!("mismatched types: expected `{to}`, found an integer")),
            Ty::FloatLit if !to.is_float() => {
                return Err(format!("mismatched types: expected `{to}`, found a float literal; write an integer literal or convert with `as {to}`"))
            }
            _ => {}
        }
        let digits = match &node.op {
            Op::Float(digits) => Some(digits.clone()),
            Op::Int(v) if to.is_float() => Some(v.to_string()),
            _ => None,
        };
        if let Some(digits) = digits.filter(|d| to.float_overflows(d)) {
            return Err(float_out_of_range(&digits, to));
        }
        if let Op::Int(v) = node.op {
            if to.is_int() && !to.int_fits(v) {
                return Err(format!("literal out of range for `{to}`: `{v}` does not fit in `{}`; use a wider type such as `i64`, with `as`", to.range_text()));
            }
        }
        let operands = match &node.op {
            Op::Select(_, a, b) => vec![*a, *b],
            op => op.operands(),
        };
        self.nodes[id].ty = Ty::Elem(to);
        for o in operands {
            if self.nodes[o].ty.is_literal() {
                self.coerce(o, to)?;
            }
        }
        Ok(())
    }

    fn cast(&mut self, a: &Expr, ty: &crate::parse::ElemName, t: &TokenStream) -> Option<usize> {
        let a = self.expr(a)?;
        let Some(to) = ty.resolve() else {
            self.unsupported_type(&ty.ty);
            return None;
        };
        let from = self.nodes[a].ty;
        if from.is_literal() {
            self.coerce(a, from.defaulted()).ok()?;
        }
        let from = self.nodes[a].ty.defaulted();
        let bad = if from == Elem::Bool && to.is_float() {
            Some(format!(
                "cannot cast `bool` as `{to}`; cast to an integer first: `(b as u32) as {to}`"
            ))
        } else if from != Elem::Bool && to == Elem::Bool {
            Some(format!(
                "cannot cast `{from}` as `bool`; compare instead, as in `x != 0`"
            ))
        } else {
            None
        };
        if let Some(message) = bad {
            self.cx.spanned(t, message);
            return None;
        }
        let shape = self.nodes[a].shape.clone();
        Some(self.push(Op::Cast(a), Ty::Elem(to), shape, t))
    }

    fn select(&mut self, c: &Expr, a: &Expr, b: &Expr, t: &TokenStream) -> Option<usize> {
        let (c_id, a_id, b_id) = (self.expr(c), self.expr(a), self.expr(b));
        let (c_id, a_id, b_id) = (c_id?, a_id?, b_id?);
        if !self.nodes[c_id].ty.is_bool() {
            let found = self.nodes[c_id].ty;
            self.cx.spanned(&c.tokens, format!("expected a `bool` condition, found `{found}`; compare to get one, as in `x > 0.0`"));
            return None;
        }
        if let (Ty::Elem(x), Ty::Elem(y)) = (self.nodes[a_id].ty, self.nodes[b_id].ty) {
            if x != y {
                let fix = format!("({} as {x})", operand(&b.tokens));
                self.cx.spanned(&b.tokens, format!("`if` and `else` have incompatible types: `{x}` and `{y}`; nothing converts implicitly: write `{fix}`"));
                return None;
            }
        }
        let ty = self.unify(a_id, b_id, b, t)?;
        let shape = self.broadcast(&[c_id, a_id, b_id], t)?;
        Some(self.push(Op::Select(c_id, a_id, b_id), ty, shape, t))
    }

    fn call(&mut self, name: &syn::Ident, args: &[Expr], t: &TokenStream) -> Option<usize> {
        let text = crate::ir::plain_name(name);
        if let Some(op) = Reduce::from_name(&text) {
            return self.reduce(op, name, args, t);
        }
        match text.as_str() {
            "index" => return self.index(args, t),
            "len" => return self.len(args, t),
            "logsumexp" => return self.logsumexp(args, t),
            "argmax" => return self.arg_extreme(Reduce::Max, "argmax", args, t),
            "argmin" => return self.arg_extreme(Reduce::Min, "argmin", args, t),
            "rand" => return self.random(Random::Uniform, "rand", args, t),
            "randn" => return self.random(Random::Normal, "randn", args, t),
            "dropout" => return self.dropout(args, t),
            "permute" => return self.permute(args, t),
            _ => {}
        }
        match func::lookup(&text) {
            Some(info) if info.free => {
                let ids = self.exprs(args)?;
                self.apply(info, name, &ids, args, t)
            }
            Some(_) => {
                let example = match args.split_first() {
                    Some((recv, rest)) => {
                        let rest: Vec<String> = rest.iter().map(|a| a.tokens.to_string()).collect();
                        format!("{}.{text}({})", operand(&recv.tokens), rest.join(", "))
                    }
                    None => format!("a.{text}(..)"),
                };
                self.cx.spanned(
                    name,
                    format!("`{text}` is a method, not a function: write `{example}`"),
                );
                None
            }
            None if self.kernel_names.contains(&text) => {
                self.cx.spanned(name, format!("`{text}` is a kernel of this `fuse!`, and a kernel cannot call another: each `fn` is one launch; write the expression inline, or call both kernels from Rust"));
                None
            }
            None => {
                let candidates = func::FUNCS
                    .iter()
                    .filter(|f| f.free)
                    .map(|f| f.name)
                    .chain(Reduce::NAMES)
                    .chain(crate::check::special::NAMES);
                let hint = did_you_mean(closest(&text, candidates));
                self.cx.spanned(
                    name,
                    format!("cannot find function `{text}` in the language{hint}"),
                );
                None
            }
        }
    }

    fn method(
        &mut self,
        recv: &Expr,
        name: &syn::Ident,
        args: &[Expr],
        t: &TokenStream,
    ) -> Option<usize> {
        let text = crate::ir::plain_name(name);
        let mut all = vec![self.expr(recv)];
        all.extend(args.iter().map(|a| self.expr(a)));
        let ids: Vec<usize> = all.into_iter().collect::<Option<_>>()?;
        match func::lookup(&text) {
            Some(info) if info.method => self.apply(info, name, &ids, args, t),
            Some(_) => {
                self.cx.spanned(
                    name,
                    format!(
                        "`{text}` is a function, not a method: write `{text}({})`",
                        recv.tokens
                    ),
                );
                None
            }
            None => {
                let ty = self.nodes[ids[0]].ty;
                let candidates = func::FUNCS.iter().filter(|f| f.method).map(|f| f.name);
                let hint = did_you_mean(closest(&text, candidates));
                self.cx.spanned(
                    name,
                    format!("no method named `{text}` for `{ty}` in the language{hint}"),
                );
                None
            }
        }
    }

    fn exprs(&mut self, args: &[Expr]) -> Option<Vec<usize>> {
        let ids: Vec<Option<usize>> = args.iter().map(|a| self.expr(a)).collect();
        ids.into_iter().collect()
    }

    /// Types a call of `info` on `ids` (the receiver first, for a method); `args` are the
    /// arguments as written, without the receiver.
    fn apply(
        &mut self,
        info: &func::FuncInfo,
        name: &syn::Ident,
        ids: &[usize],
        args: &[Expr],
        t: &TokenStream,
    ) -> Option<usize> {
        let receiver = usize::from(ids.len() > args.len());
        let expected = info.sig.arity() - receiver;
        let given = args.len();
        if given != expected {
            let s = if expected == 1 { "" } else { "s" };
            let were = if given == 1 { "was" } else { "were" };
            let head = format!(
                "`{}` takes {expected} argument{s} but {given} {were} given",
                info.name
            );
            if given > expected {
                let extra: TokenStream =
                    args[expected..].iter().map(|a| a.tokens.clone()).collect();
                let many = if given - expected == 1 {
                    "the extra argument"
                } else {
                    "the extra arguments"
                };
                self.cx.spanned(extra, format!("{head}; remove {many}"));
            } else {
                let slots: Vec<&str> = (0..info.sig.arity() - 1).map(|_| "_").collect();
                let form = if receiver == 1 {
                    format!("x.{}({})", info.name, slots.join(", "))
                } else {
                    format!("{}(x)", info.name)
                };
                self.cx.spanned(t, format!("{head}; write `{form}`"));
            }
            return None;
        }
        let ty = self.func_type(info, name, ids, receiver == 1, t)?;
        let shape = self.broadcast(ids, t)?;
        Some(self.push(Op::Call(info.func, ids.to_vec()), ty, shape, t))
    }

    fn func_type(
        &mut self,
        info: &func::FuncInfo,
        name: &syn::Ident,
        ids: &[usize],
        method: bool,
        t: &TokenStream,
    ) -> Option<Ty> {
        let n = info.name;
        let mut ty = self.nodes[ids[0]].ty;
        for &other in &ids[1..] {
            if matches!(info.sig, Sig::Powi | Sig::Pow) {
                break;
            }
            let other_expr = Expr {
                kind: ExprKind::Bool(false),
                tokens: self.nodes[other].tokens.clone(),
            };
            ty = self.unify(ids[0], other, &other_expr, t)?;
        }
        let want = match info.sig {
            Sig::Float | Sig::Float2 | Sig::Float3 | Sig::Powi | Sig::FloatTest
                if !ty.is_float() =>
            {
                "a float"
            }
            Sig::Signed if !ty.is_float() && !ty.is_signed_int() => "a float or a signed integer",
            Sig::Num2 | Sig::Num3 if ty.is_bool() => "numbers",
            Sig::Pow | Sig::Bits if !ty.is_int() => "an integer",
            _ => "",
        };
        if !want.is_empty() {
            let recv = operand(&self.nodes[ids[0]].tokens);
            let fix = match info.sig {
                Sig::Signed if ty.is_int() => "; an unsigned value is its own absolute value and sign; convert with `as i64` for a signed one".to_string(),
                _ if ty == Ty::IntLit && want.contains("float") => "; write a float literal, such as `2.0`".to_string(),
                _ if ty.is_int() && want.contains("float") && method => format!("; convert with `as`, as in `({recv} as f32).{n}({})`", if info.sig.arity() == 1 { "" } else { ".." }),
                _ if ty.is_int() && want.contains("float") => format!("; convert with `as`, as in `{n}({recv} as f32)`"),
                Sig::Pow | Sig::Bits => "; these are integer methods; for floats see `powf` and `powi`".to_string(),
                _ => String::new(),
            };
            self.cx
                .spanned(name, format!("`{n}` needs {want}, found `{ty}`{fix}"));
            return None;
        }
        let exponent = match info.sig {
            Sig::Powi => Some(Elem::I32),
            Sig::Pow => Some(Elem::U32),
            _ => None,
        };
        if let Some(e) = exponent {
            if !self.coerce_or_report(ids[1], e) {
                return None;
            }
        }
        Some(match info.sig {
            Sig::FloatTest => Ty::Elem(Elem::Bool),
            Sig::Bits => Ty::Elem(Elem::U32),
            _ => ty,
        })
    }

    fn reduce(
        &mut self,
        op: Reduce,
        name: &syn::Ident,
        args: &[Expr],
        t: &TokenStream,
    ) -> Option<usize> {
        let text = crate::ir::plain_name(name);
        if args.is_empty() || args.len() > 2 {
            self.cx.spanned(t, format!("`{text}` takes a tensor and optionally a dim: `{text}(e)` over every element or `{text}(e, dim)` over one dim"));
            return None;
        }
        let operand = self.expr(&args[0]);
        let dim = match args.get(1) {
            Some(d) => Some(self.reduce_dim(op, &text, &args[0], d)?),
            None => None,
        };
        let operand = operand?;
        let shape = self.nodes[operand].shape.clone();
        if shape.is_empty() {
            let message = if self.shapeless_randoms()[operand] {
                format!("`{text}` reduces a random value that has no shape of its own: it takes the shape of the expression it is used in, and a reduction does not give it one; combine it with a tensor first, as in `{text}(x * rand(seed))`")
            } else {
                format!(
                    "`{text}` reduces a tensor, but `{}` is a scalar here",
                    args[0].tokens
                )
            };
            self.cx.spanned(&args[0].tokens, message);
            return None;
        }
        let result_shape = match dim {
            None => vec![],
            Some(d) => self.reduced_shape(d, &shape, &args[1].tokens)?,
        };
        let ty = self.reduce_type(op, &text, operand, &args[0])?;
        Some(self.push(Op::Reduce(op, operand, dim), ty, result_shape, t))
    }

    pub fn reduce_dim(&mut self, op: Reduce, text: &str, a: &Expr, d: &Expr) -> Option<DimId> {
        let elementwise = matches!(op, Reduce::Max | Reduce::Min);
        let hint = format!(
            "for the elementwise {text}imum of two values write `{}.{text}({})`",
            operand(&a.tokens),
            d.tokens
        );
        let ExprKind::Var(ident) = &d.kind else {
            let message = match &d.kind {
                // `mean(x, (c, s))`, GroupNorm's statistics: the dims taken as one.
                ExprKind::Tuple(dims) if dims.len() >= 2 && !text.starts_with("arg") => {
                    return self.merged_dim(text, dims);
                }
                // A position is not the position of positions.
                ExprKind::Tuple(dims) if dims.len() >= 2 => {
                    let names: Vec<String> = dims.iter().map(|e| e.tokens.to_string()).collect();
                    format!(
                        "`{text}` gives a position along one dim: a position over several dims \
                         at once, such as `{text}(x, ({}))`, is not supported",
                        names.join(", ")
                    )
                }
                _ if elementwise => format!("`{text}(a, b)` reduces `a` over the dim `b`, and `{}` is not a dim name; {hint}", d.tokens),
                _ => format!("the second argument of `{text}` is a dim name, such as `cols`"),
            };
            self.cx.spanned(&d.tokens, message);
            return None;
        };
        let is_value = self.scope.iter().any(|(n, _)| ident == n);
        let value_hint = (elementwise && is_value).then(|| {
            format!("`{text}(a, b)` reduces `a` over the dim `b`, but `{ident}` is a value, not a dim; {hint}")
        });
        self.named_dim(ident, value_hint)
    }

    /// The dim that stands for `dims` reduced together ([`crate::ir::Dim::Merged`]): each a
    /// dim name, none twice.
    fn merged_dim(&mut self, text: &str, dims: &[Expr]) -> Option<DimId> {
        let parts = self.listed_dims(dims, text, |d| {
            format!("`{text}(x, (a, b))` reduces over the dims named in the tuple, and `{d}` is not a dim name")
        })?;
        let merged = crate::ir::Dim::Merged(parts);
        Some(match self.dims.iter().position(|x| *x == merged) {
            Some(id) => id,
            None => {
                self.dims.push(merged);
                self.dims.len() - 1
            }
        })
    }

    /// The dims a tuple's `items` name, in order, each once: `not_dim` is the error for an item
    /// that is not a dim name, and a dim listed twice is an error naming function `what`.
    pub(super) fn listed_dims(
        &mut self,
        items: &[Expr],
        what: &str,
        not_dim: impl Fn(&TokenStream) -> String,
    ) -> Option<Vec<DimId>> {
        let mut dims = vec![];
        for item in items {
            let ExprKind::Var(ident) = &item.kind else {
                self.cx.spanned(&item.tokens, not_dim(&item.tokens));
                return None;
            };
            let d = self.named_dim(ident, None)?;
            if dims.contains(&d) {
                let message = format!("`{}` is listed twice in `{what}`'s dims", item.tokens);
                self.cx.spanned(&item.tokens, message);
                return None;
            }
            dims.push(d);
        }
        Some(dims)
    }

    /// The shape of a reduction over `d` of an operand of shape `shape`, or an error at `at`:
    /// `shape` without `d`, or without the dims `d` takes together, which must stand next to
    /// each other in `shape`, in the order written.
    pub fn reduced_shape(
        &mut self,
        d: DimId,
        shape: &[DimId],
        at: &TokenStream,
    ) -> Option<Vec<DimId>> {
        let crate::ir::Dim::Merged(parts) = &self.dims[d] else {
            if !shape.contains(&d) {
                self.missing_dim(d, shape, at);
                return None;
            }
            return Some(shape.iter().copied().filter(|&s| s != d).collect());
        };
        let parts = parts.clone();
        if let Some(&missing) = parts.iter().find(|p| !shape.contains(p)) {
            self.missing_dim(missing, shape, at);
            return None;
        }
        let start = shape.iter().position(|&s| s == parts[0]).expect("present");
        if shape.get(start..start + parts.len()) != Some(&parts[..]) {
            let names = |dims: &[DimId]| -> Vec<String> {
                dims.iter().map(|&p| self.dims[p].to_string()).collect()
            };
            let ordered: Vec<DimId> = shape
                .iter()
                .copied()
                .filter(|s| parts.contains(s))
                .collect();
            // Every part is in `shape` (checked above), each once: together where they span
            // as many places as there are parts.
            let places: Vec<usize> = ordered
                .iter()
                .map(|d| shape.iter().position(|s| s == d).expect("present"))
                .collect();
            let adjacent = places[places.len() - 1] - places[0] + 1 == parts.len();
            let message = match adjacent {
                true => format!(
                    "list the dims in the order the operand has them, `({})`: it has shape `{}`",
                    names(&ordered).join(", "),
                    self.shape_text(shape)
                ),
                false => format!(
                    "dims reduced together must stand next to each other in the operand, and in `{}` `{}` do not: reduce over one dim at a time in `fn`s of their own (one launch each)",
                    self.shape_text(shape),
                    names(&parts).join("` and `")
                ),
            };
            self.cx.spanned(at, message);
            return None;
        }
        Some(
            shape
                .iter()
                .copied()
                .filter(|s| !parts.contains(s))
                .collect(),
        )
    }

    /// Reports that a reduction's operand, of shape `shape`, lacks the dim `d` written at `at`.
    pub fn missing_dim(&mut self, d: DimId, shape: &[DimId], at: &TokenStream) {
        let (dim, has) = (self.dims[d].to_string(), self.shape_text(shape));
        self.cx.spanned(at, format!("cannot reduce over `{dim}`: the operand has shape `{has}`, which has no dim `{dim}`"));
    }

    /// The dim `ident` names, or an error: `instead` if given, else "cannot find dim" with the
    /// closest name.
    pub fn named_dim(&mut self, ident: &syn::Ident, instead: Option<String>) -> Option<DimId> {
        let name = crate::ir::plain_name(ident);
        if let Some(id) = self
            .dims
            .iter()
            .position(|x| *x == crate::ir::Dim::Named(name.clone()))
        {
            return Some(id);
        }
        let message = instead.unwrap_or_else(|| {
            let names: Vec<String> = self.named_dim_names();
            let hint = did_you_mean(closest(&name, names.iter().map(String::as_str)));
            let list = names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ");
            format!("cannot find dim `{name}` in this kernel{hint} (its dims are {list})")
        });
        self.cx.spanned(ident, message);
        None
    }

    pub fn reduce_type(&mut self, op: Reduce, text: &str, operand: usize, a: &Expr) -> Option<Ty> {
        let ty = self.nodes[operand].ty;
        if ty.is_literal() && !self.coerce_or_report(operand, ty.defaulted()) {
            return None;
        }
        let ty = self.nodes[operand].ty;
        let bad = if ty.is_bool() {
            Some(format!("cannot `{text}` `bool` values; convert with `as u32` first, as in `{text}({} as u32)`", self::operand(&a.tokens)))
        } else if op == Reduce::Mean && !ty.is_float() {
            Some(format!(
                "`{text}` needs a float operand, found `{ty}`; convert with `as f32` or `as f64`"
            ))
        } else {
            None
        };
        if let Some(message) = bad {
            self.cx.spanned(&a.tokens, message);
            return None;
        }
        Some(ty)
    }

    /// The shape of several operands broadcast together by dim name.
    pub fn broadcast(&mut self, ids: &[usize], t: &TokenStream) -> Option<Vec<DimId>> {
        let mut shape: Vec<DimId> = vec![];
        for &id in ids {
            let other = self.nodes[id].shape.clone();
            shape = match broadcast2(&shape, &other) {
                Ok(s) => s,
                Err(Conflict::Disjoint) if self.orderable(&shape, &other) => {
                    merge_sorted(&shape, &other)
                }
                Err(why) => {
                    let fix = match why {
                        Conflict::Order(..) => self.permute_hint(ids),
                        _ => String::new(),
                    };
                    let (a, b) = (self.shape_text(&shape), self.shape_text(&other));
                    let why = self.broadcast_reason(why, &shape, &other);
                    self.cx.spanned(
                        t,
                        format!("shapes `{a}` and `{b}` cannot broadcast: {why}{fix}"),
                    );
                    return None;
                }
            };
        }
        Some(shape)
    }

    /// For dims in different orders, where one operand is a tensor parameter whose type lists
    /// its dims out of the signature's order: the fix, reading it in that order (`permute`).
    fn permute_hint(&self, ids: &[usize]) -> String {
        let permuted = ids.iter().find_map(|&id| match self.nodes[id].op {
            Op::Load(p) if !self.params[p].written => {
                let shape = &self.nodes[id].shape;
                (!shape.windows(2).all(|w| w[0] < w[1])).then_some((p, shape))
            }
            _ => None,
        });
        let Some((p, shape)) = permuted else {
            return String::new();
        };
        let mut order = shape.clone();
        order.sort_unstable();
        let names: Vec<String> = order.iter().map(|&d| self.dims[d].to_string()).collect();
        let name = crate::ir::plain_name(&self.params[p].name);
        format!(
            "; to read `{name}` in the order the signature first names its dims, write `permute({name}, ({}))`",
            names.join(", ")
        )
    }

    fn broadcast_reason(&self, why: Conflict, a: &[DimId], b: &[DimId]) -> String {
        let fixed = |s: &[DimId], o: &[DimId]| {
            s.iter()
                .copied()
                .find(|d| !o.contains(d) && matches!(self.dims[*d], crate::ir::Dim::Fixed(_)))
        };
        let why = match (why, fixed(a, b), fixed(b, a)) {
            (Conflict::Disjoint, Some(x), Some(y)) => Conflict::Fixed(x, y),
            (Conflict::Disjoint, Some(x), None) => return self.fixed_dim_alone(x, a, b),
            (Conflict::Disjoint, None, Some(y)) => return self.fixed_dim_alone(y, b, a),
            (why, _, _) => why,
        };
        match why {
            Conflict::Order(a, b) => format!(
                "they have the dims `{}` and `{}` in different orders; a tensor repeats along the dims it lacks, so shared dims must come in the same order",
                self.dims[a], self.dims[b]
            ),
            Conflict::Fixed(a, b) => format!("the fixed sizes {} and {} differ", self.dims[a], self.dims[b]),
            Conflict::Disjoint => "each has a dim the other lacks, and they do not list their dims in the order the signature first names them; a tensor repeats along the dims it lacks, and dims combine in that order".to_string(),
        }
    }

    /// Why `has` (with the fixed dim `d`) and `lacks` (without it) do not broadcast: a fixed
    /// size is not a dim that another stretches to, as a numpy size-1 axis is.
    fn fixed_dim_alone(&self, d: DimId, has: &[DimId], lacks: &[DimId]) -> String {
        let at = has
            .iter()
            .position(|&x| x == d)
            .expect("the dim is in the shape");
        let rest: Vec<DimId> = has.iter().copied().filter(|&x| x != d).collect();
        let (size, has, rest) = (&self.dims[d], self.shape_text(has), self.shape_text(&rest));
        let across = match lacks.get(at) {
            Some(&o) if !matches!(self.dims[o], crate::ir::Dim::Fixed(_)) => {
                format!(" to `{}`", self.dims[o])
            }
            _ => String::new(),
        };
        let why = match size {
            crate::ir::Dim::Fixed(1) => {
                format!("a size-1 dim does not stretch{across} as in numpy")
            }
            _ => format!("the fixed dim `{size}` matches only a dim of the same fixed size"),
        };
        format!("`{has}` has the fixed dim `{size}`, which `{}` lacks; dims combine by name, not by position, so {why}; leave it out of the type, as `{rest}` (reshape the buffer to match), and the tensor repeats along the dims it lacks", self.shape_text(lacks))
    }

    /// Whether two shapes that are not one inside the other combine into their union: both list
    /// their dims in the order the signature first names them, and the dims only one of them has
    /// are named (differing fixed sizes stay an error). `index(cols)` against `label: [rows]` is
    /// `[rows, cols]`; `a: [m]` against `b: [n]` is their outer product `[m, n]`.
    fn orderable(&self, a: &[DimId], b: &[DimId]) -> bool {
        let sorted = |s: &[DimId]| s.windows(2).all(|w| w[0] < w[1]);
        let named_if_own = |s: &[DimId], o: &[DimId]| {
            s.iter()
                .all(|d| o.contains(d) || matches!(self.dims[*d], crate::ir::Dim::Named(_)))
        };
        sorted(a) && sorted(b) && named_if_own(a, b) && named_if_own(b, a)
    }

    pub fn unsupported_type(&mut self, ty: &syn::Type) {
        self.cx.spanned(
            ty,
            format!(
                "unsupported element type `{}`; the element types are {}",
                ty.to_token_stream(),
                Elem::list_text(|_| true)
            ),
        );
    }
}

/// The error for a float literal `digits` that is infinite in the float type `e`.
fn float_out_of_range(digits: &str, e: Elem) -> String {
    let wider = if e == Elem::F32 { "f64" } else { "f32" };
    format!("literal out of range for `{e}`: `{digits}` is larger than `{e}::MAX`; use `{wider}`")
}

pub enum Conflict {
    Order(DimId, DimId),
    Fixed(DimId, DimId),
    Disjoint,
}

/// Broadcasts two shapes: the result is the longer one if the shorter is a subsequence of it.
pub fn broadcast2(a: &[DimId], b: &[DimId]) -> Result<Vec<DimId>, Conflict> {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if is_subsequence(short, long) {
        return Ok(long.to_vec());
    }
    let shared: Vec<DimId> = short.iter().copied().filter(|d| long.contains(d)).collect();
    for (i, &x) in shared.iter().enumerate() {
        for &y in &shared[i + 1..] {
            let px = long.iter().position(|&d| d == x);
            let py = long.iter().position(|&d| d == y);
            if px > py {
                return Err(Conflict::Order(x, y));
            }
        }
    }
    Err(Conflict::Disjoint)
}

/// The union of two shapes sorted in the signature's order of dims.
fn merge_sorted(a: &[DimId], b: &[DimId]) -> Vec<DimId> {
    let mut all: Vec<DimId> = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// An expression's text as an operand of a suggested fix: wrapped in parentheses unless it is a
/// single name, literal, constant (`f32::MAX`) or call, so that `as` or a method applies to all
/// of it.
pub fn operand(tokens: &TokenStream) -> String {
    use proc_macro2::TokenTree as T;
    let trees: Vec<T> = tokens.clone().into_iter().collect();
    let simple = match trees.as_slice() {
        [_] => true,
        [T::Ident(_), T::Group(g)] => g.delimiter() == proc_macro2::Delimiter::Parenthesis,
        [T::Ident(_), T::Punct(a), T::Punct(b), T::Ident(_)] => {
            a.as_char() == ':' && b.as_char() == ':'
        }
        _ => false,
    };
    // Paths are the only `::` of the language: written as in Rust, without spaces.
    let text = tokens.to_string().replace(" :: ", "::");
    if simple {
        text
    } else {
        format!("({text})")
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::errors;
    use quote::quote;

    #[test]
    fn a_position_over_a_tuple_of_dims_is_not_supported() {
        // Reductions take a tuple of dims (`check::merge`); a position is along one dim.
        let e = errors(quote! { fn f(x: [f32; n, c, s]) -> [u32; n] { argmax(x, (c, s)) } });
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].starts_with("`argmax` gives a position along one dim: a position over several dims at once, such as `argmax(x, (c, s))`, is not supported"),
            "{}",
            e[0]
        );
    }
}
