//! Slices along a named dim: a parameter's dim written as an expression of dims (`2 * d`,
//! `2 * h + p`, `d * 2`), and `x[.., ..d]`, `x[.., d..]`, `x[.., (1..).step_by(2)]`, which read
//! one part of it. A slice is a load at another place ([`Op::View`]): it never computes with the
//! value, so `-0.0` and NaN pass through it unchanged.

use crate::check::Checker;
use crate::ir::{Composite, Dim, DimId, Gather, Linear, Op, View};
use crate::parse::{Expr, ExprKind, KernelDef, SliceItem, SliceKind};
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;
use quote::ToTokens;
use std::collections::BTreeMap;

/// A sum of named dims with integer coefficients, plus a constant: a slice's bound, or the
/// start of a part.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
struct Form {
    dims: BTreeMap<DimId, i128>,
    constant: i128,
}

impl Form {
    fn add(mut self, other: &Form, sign: i128) -> Form {
        for (&d, &c) in &other.dims {
            let e = self.dims.entry(d).or_default();
            *e = e.saturating_add(sign.saturating_mul(c));
        }
        self.dims.retain(|_, c| *c != 0);
        self.constant = self
            .constant
            .saturating_add(sign.saturating_mul(other.constant));
        self
    }

    fn scale(mut self, k: i128) -> Form {
        self.dims
            .values_mut()
            .for_each(|c| *c = c.saturating_mul(k));
        self.dims.retain(|_, c| *c != 0);
        self.constant = self.constant.saturating_mul(k);
        self
    }

    /// The form times the product of the sizes of `stride`, as index arithmetic. Only the
    /// start of a part is made one, a sum of sizes, so no coefficient is negative.
    fn times(&self, stride: &[DimId]) -> Linear {
        let coefficient = |c: i128| u64::try_from(c.max(0)).unwrap_or(u64::MAX);
        let mut terms: Linear = self
            .dims
            .iter()
            .map(|(&d, &c)| (coefficient(c), [&[d][..], stride].concat()))
            .collect();
        if self.constant != 0 {
            terms.push((coefficient(self.constant), stride.to_vec()));
        }
        terms
    }
}

/// The most parts a dim may have, and the largest group of `d * k`: far more than any kernel
/// needs (halves, pairs), few enough that every part can be listed in a message.
const MAX_PARTS: u64 = 64;

const COMPOSITE_FORMS: &str = "a dim is a name, an integer literal, or one made of other dims: `2 * d` (two parts of `d`, one after the other), `h + p` (a part `h`, then a part `p`), `2 * h + p`, or `d * 2` (`d` pairs of adjacent elements, picked with `step_by`)";

impl Checker<'_> {
    /// A parameter's dim written as an expression of dims: parts (`2 * h + p`) or interleaved
    /// groups (`d * 2`). Its dims are declared as the signature's other dims are.
    pub(super) fn composite(&mut self, e: &syn::Expr, binds: bool) -> Option<Composite> {
        let before = self.cx.len();
        let composite = self.composite_within(e, binds);
        if composite.is_none() && binds && self.cx.len() > before {
            // Its names are still the signature's dims: an output over them is no error too.
            for name in idents(e) {
                let dim = Dim::Named(crate::ir::plain_name(&name));
                if !self.dims.contains(&dim) {
                    self.dims.push(dim);
                    self.named_dims += 1;
                }
            }
        }
        composite
    }

    fn composite_within(&mut self, e: &syn::Expr, binds: bool) -> Option<Composite> {
        if !binds {
            self.cx.spanned(e, "an output's dim is a name or an integer literal; an output made of parts (`2 * d`) is not in the language yet: return each part as an output of its own");
            return None;
        }
        let e = unparen(e);
        if let syn::Expr::Binary(b) = e {
            if let (syn::BinOp::Mul(_), Some(name), Some(k)) =
                (&b.op, ident(&b.left), literal(&b.right))
            {
                if !(2..=MAX_PARTS).contains(&k) {
                    self.cx.spanned(&b.right, format!("a dim `d * k` has groups of `k` elements, from 2 to {MAX_PARTS}: write `d` for groups of one"));
                    return None;
                }
                let d =
                    self.intern(Dim::Named(crate::ir::plain_name(name)), &tokens(name), true)?;
                return Some(Composite::Interleaved(d, k));
            }
        }
        let mut parts = vec![];
        for term in sum_terms(e) {
            parts.push(self.part(term)?);
        }
        let count = parts.iter().fold(0u64, |n, &(k, _)| n.saturating_add(k));
        if count > MAX_PARTS {
            let message = format!(
                "`{}` has {count} parts, more than the {MAX_PARTS} a dim may have",
                quote::quote!(#e)
            );
            self.cx.spanned(e, message);
            return None;
        }
        Some(Composite::Parts(parts))
    }

    /// One term of a sum of parts: `d`, `2 * d`, or a literal size `4`.
    fn part(&mut self, term: &syn::Expr) -> Option<(u64, DimId)> {
        let term = unparen(term);
        let (count, dim) = match term {
            syn::Expr::Binary(b) if matches!(b.op, syn::BinOp::Mul(_)) => {
                (literal(&b.left), ident(&b.right))
            }
            _ => (Some(1), ident(term)),
        };
        if let (Some(count), Some(name)) = (count, dim) {
            if count == 0 {
                self.cx.spanned(
                    term,
                    "a dim made of parts has at least one of each: drop this term",
                );
                return None;
            }
            let d = self.intern(Dim::Named(crate::ir::plain_name(name)), &tokens(name), true)?;
            return Some((count, d));
        }
        if let Some(size) = literal(term) {
            let d = self.intern(Dim::Fixed(size), &tokens(term), true)?;
            return Some((1, d));
        }
        self.cx.spanned(term, COMPOSITE_FORMS);
        None
    }

    /// Checks that the call can bind every dim of the composite dims of the inputs: each, in the
    /// order of the parameters, may hold one dim that no input has on its own and no composite
    /// before it binds, which the call computes from the buffer's size.
    pub(super) fn composites_bind(&mut self, def: &KernelDef) {
        let plain: Vec<DimId> = self
            .params
            .iter()
            .filter_map(|p| p.shape.as_ref())
            .flatten()
            .copied()
            .filter(|&d| matches!(self.dims[d], Dim::Named(_)))
            .collect();
        let mut bound: Vec<DimId> = plain;
        let shapes: Vec<Option<Vec<DimId>>> = self.params.iter().map(|p| p.shape.clone()).collect();
        for (param, shape) in def.params.iter().zip(shapes) {
            let Some(shape) = shape else { continue };
            let decls = param.ty.dims.as_deref().unwrap_or_default();
            for (&d, decl) in shape.iter().zip(decls) {
                let Dim::Composite(c) = &self.dims[d] else {
                    continue;
                };
                let free: Vec<DimId> = c
                    .terms()
                    .into_iter()
                    .map(|(_, d)| d)
                    .filter(|d| matches!(self.dims[*d], Dim::Named(_)) && !bound.contains(d))
                    .collect();
                if free.len() > 1 {
                    let names: Vec<String> = free
                        .iter()
                        .map(|&d| format!("`{}`", self.dims[d]))
                        .collect();
                    let message = format!("the call cannot tell the sizes of {} from the size of `{}` alone: give all but one of them a tensor parameter with that dim, as `cos: [f32; t, half]` gives `half` of `x: [f32; t, 2 * half + p]`", names.join(" and "), self.dims[d].text(&self.dims));
                    self.cx.spanned(decl.tokens(), message);
                }
                bound.extend(free);
            }
        }
    }

    /// The value that a slice's (or a write's) base names, where it is a name in scope.
    pub(super) fn named(&self, base: &Expr) -> Option<usize> {
        let ExprKind::Var(name) = &base.kind else {
            return None;
        };
        let text = crate::ir::plain_name(name);
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| *n == text)
            .map(|&(_, id)| id)
    }

    /// The scope's value of a slice's base, which must name a tensor parameter.
    fn sliced_param(&mut self, base: &Expr) -> Option<usize> {
        let found = self.named(base);
        match found.map(|id| (id, self.nodes.get(id).map(|n| &n.op))) {
            Some((_, Some(&Op::Load(p)))) => Some(p),
            Some((crate::check::POISONED, _)) => None,
            _ => {
                self.cx.spanned(&base.tokens, "only a tensor parameter can be sliced or gathered from, as in `x[.., ..d]` with `x: [f32; t, 2 * d]` or `emb[tokens, ..]`; slice the parameter, then compute with the part");
                None
            }
        }
    }

    /// `x[items]`: the part of tensor parameter `x` that the items pick, one item a dim.
    pub fn slice(&mut self, base: &Expr, items: &[SliceItem], t: &TokenStream) -> Option<usize> {
        let p = self.sliced_param(base)?;
        let (view, shape) = self.view_of(p, items, t)?;
        let elem = self.params[p].elem;
        Some(self.push(Op::View(p, Box::new(view)), Ty::Elem(elem), shape, t))
    }

    /// `permute(x, (t, h))`: tensor parameter `x` with its dims in the order listed, every one
    /// of them once: the same memory read in another order, each element where `x`'s own layout
    /// has it (a view, like a slice: no arithmetic on the values). vLLM's attention LSEs are
    /// `[h, t]` beside outputs `[t, h, d]`; dims combine by name in one order, so the LSE is read
    /// as `permute(lse, (t, h))`.
    pub fn permute(&mut self, args: &[Expr], t: &TokenStream) -> Option<usize> {
        let usage = "`permute` takes a tensor parameter and all its dims in the order to read them, as in `permute(lse, (t, h))` with `lse: [f32; h, t]`";
        let [base, order] = args else {
            self.cx.spanned(t, usage);
            return None;
        };
        let found = self.named(base);
        let p = match found.map(|id| (id, self.nodes.get(id).map(|n| &n.op))) {
            Some((_, Some(&Op::Load(p)))) if !self.params[p].written => p,
            Some((_, Some(&Op::Load(p)))) => {
                let name = crate::ir::plain_name(&self.params[p].name);
                self.cx.spanned(&base.tokens, format!("`{name}` is written through `&mut`, and `permute` reads a parameter the kernel does not write; pass the values to read as a parameter of their own"));
                return None;
            }
            Some((crate::check::POISONED, _)) => return None,
            _ => {
                self.cx.spanned(&base.tokens, format!("only a tensor parameter read as a whole can be permuted: it is a view of the parameter's memory; {usage}"));
                return None;
            }
        };
        let declared = self.params[p].shape.clone().expect("a tensor parameter");
        let ExprKind::Tuple(items) = &order.kind else {
            self.cx.spanned(&order.tokens, usage);
            return None;
        };
        let name = crate::ir::plain_name(&self.params[p].name);
        let dims = self.listed_dims(items, "permute", |d| {
            format!("`{d}` is not a dim name; {usage}")
        })?;
        if let Some(i) = dims.iter().position(|d| !declared.contains(d)) {
            let shape = self.shape_text(&declared);
            let message = format!(
                "`{name}` has no dim `{}`: it has shape `{shape}`",
                items[i].tokens
            );
            self.cx.spanned(&items[i].tokens, message);
            return None;
        }
        if dims.len() != declared.len() {
            let message = format!("`permute` lists every dim of `{name}`, of shape `{}`, once: a permuted view has all of them", self.shape_text(&declared));
            self.cx.spanned(&order.tokens, message);
            return None;
        }
        let load = found.expect("a parameter");
        if dims == declared {
            return Some(load);
        }
        let view = View::of_layout(&declared, &dims);
        let elem = self.params[p].elem;
        Some(self.push(Op::View(p, Box::new(view)), Ty::Elem(elem), dims, t))
    }

    /// Reports a read of a `&mut` parameter by its name alone: the kernel reads one through a
    /// slice, as it writes it.
    pub(super) fn written_read(&mut self, p: usize, t: &TokenStream) {
        let name = crate::ir::plain_name(&self.params[p].name);
        let whole = vec![".."; self.params[p].shape.as_ref().map_or(1, Vec::len)].join(", ");
        self.cx.spanned(t, format!("`{name}` is a `&mut` parameter, read through a slice as it is written: `{name}[{whole}]`, or `{name}[idx, ..]`"));
    }

    /// The slice of tensor parameter `p` that `items` pick: where each element of its shape is.
    pub(super) fn view_of(
        &mut self,
        p: usize,
        items: &[SliceItem],
        t: &TokenStream,
    ) -> Option<(View, Vec<DimId>)> {
        let name = crate::ir::plain_name(&self.params[p].name);
        let storage = self.params[p]
            .shape
            .clone()
            .expect("a loaded parameter is a tensor");
        if items.len() != storage.len() {
            let dims = if storage.len() == 1 { "dim" } else { "dims" };
            let its = if items.len() == 1 { "item" } else { "items" };
            self.cx.spanned(t, format!("`{name}` has {} {dims}, `{}`, but the slice has {} {its}: write one for each dim, `..` for a whole one", storage.len(), self.shape_text(&storage), items.len()));
            return None;
        }
        let mut view = View {
            offset: vec![],
            strides: vec![],
            gathers: vec![],
        };
        let mut shape = vec![];
        // The dims each gather's index brings, and where among the items they go.
        let mut gathered: Vec<(usize, Vec<DimId>)> = vec![];
        for (at, (&d, item)) in storage.iter().zip(items).enumerate() {
            let stride = &storage[at + 1..];
            if let SliceKind::Gather(index) = &item.kind {
                let id = self.gather_index(&name, d, index)?;
                view.gathers.push(Gather {
                    index: id,
                    stride: vec![(1, stride.to_vec())],
                    len: self.dim_len(d),
                });
                gathered.push((shape.len(), self.nodes[id].shape.clone()));
                continue;
            }
            let (dim, inner, offset) = self.pick(&name, d, item)?;
            if shape.contains(&dim) {
                self.cx.spanned(
                    &item.tokens,
                    format!(
                        "this slice of `{name}` has the dim `{}` twice; a value has each dim once",
                        self.dims[dim]
                    ),
                );
                return None;
            }
            shape.push(dim);
            view.strides.push(vec![(inner, stride.to_vec())]);
            view.offset.extend(offset.times(stride));
        }
        // The indices' dims that no other item has: the indices move the load along them, and
        // they move it along nothing else. Each goes where the first index that has it is
        // (`cache[slot / bs, .., slot % bs, ..]` has `slot`'s dims once, first); later places
        // first, so that the earlier ones stay where they are.
        let mut seen = shape.clone();
        let mut inserts = vec![];
        for (at, dims) in gathered {
            let new: Vec<DimId> = dims.into_iter().filter(|d| !seen.contains(d)).collect();
            seen.extend(&new);
            inserts.push((at, new));
        }
        for (at, new) in inserts.into_iter().rev() {
            for (i, &d) in new.iter().enumerate() {
                shape.insert(at + i, d);
                view.strides.insert(at + i, vec![]);
            }
        }
        Some((view, shape))
    }

    /// A gather's index: an integer value (an unsuffixed literal is an `i64`); a literal one
    /// is checked against the dim where its size is fixed.
    fn gather_index(&mut self, name: &str, d: DimId, index: &Expr) -> Option<usize> {
        let id = self.expr(index)?;
        let ty = self.nodes[id].ty;
        if ty == Ty::IntLit {
            self.coerce_or_report(id, Elem::I64).then_some(())?;
        } else if !ty.is_int() {
            let found = ty
                .elem()
                .map_or("a float".to_string(), |e| format!("`{e}`"));
            self.cx.spanned(&index.tokens, format!("an index of `{name}` is an integer value, as `tokens: [u32; t]` in `{name}[tokens, ..]`, and this one is {found}; convert it with `as i64`"));
            return None;
        }
        let literal = match &self.nodes[id].op {
            Op::Int(v) => Some(*v),
            Op::Unary(crate::parse::UnOp::Neg, a) => match self.nodes[*a].op {
                Op::Int(v) => Some(-v),
                _ => None,
            },
            _ => None,
        };
        if let Some(v) = literal {
            let size = match self.dims[d] {
                Dim::Fixed(size) => Some(size),
                _ => None,
            };
            let message = match size {
                _ if v < 0 => format!("index out of bounds: indices start at 0, and this one is {v}"),
                Some(size) if v >= i128::from(size) => format!("index out of bounds: this dim of `{name}` has size {size} but the index is {v}"),
                _ => String::new(),
            };
            if !message.is_empty() {
                self.cx.spanned(&index.tokens, message);
                return None;
            }
        }
        Some(id)
    }

    /// The size of dim `d` as index arithmetic.
    fn dim_len(&self, d: DimId) -> Linear {
        match &self.dims[d] {
            Dim::Composite(c) => c.terms().into_iter().map(|(k, d)| (k, vec![d])).collect(),
            Dim::Merged(parts) => vec![(1, parts.clone())],
            Dim::Named(_) | Dim::Fixed(_) => vec![(1, vec![d])],
        }
    }

    /// What one item picks from dim `d`: the dim of the result, the distance between its
    /// elements (in elements of `d`), and where the first is.
    fn pick(&mut self, name: &str, d: DimId, item: &SliceItem) -> Option<(DimId, u64, Form)> {
        let text = self.dims[d].text(&self.dims);
        match (&item.kind, self.dims[d].clone()) {
            (SliceKind::Full, Dim::Composite(_)) => {
                self.cx.spanned(&item.tokens, format!("`..` would take all of `{name}`'s dim `{text}`, which is read one part at a time: pick a part, as in `{}`", self.example(d)));
                None
            }
            (SliceKind::Full, _) => Some((d, 1, Form::default())),
            (SliceKind::Range(start, end), Dim::Composite(Composite::Parts(parts))) => self
                .part_of(
                    name,
                    &text,
                    &parts,
                    start.as_deref(),
                    end.as_deref(),
                    &item.tokens,
                ),
            (SliceKind::Step(start, step), Dim::Composite(Composite::Interleaved(e, k))) => {
                if *step != k || *start >= k {
                    self.cx.spanned(&item.tokens, format!("`{name}`'s dim `{text}` has groups of {k}: pick element `j` of each with `(j..).step_by({k})`, `j` from 0 to {}", k - 1));
                    return None;
                }
                let offset = Form {
                    dims: BTreeMap::new(),
                    constant: *start as i128,
                };
                Some((e, k, offset))
            }
            _ => {
                let message = match &self.dims[d] {
                    Dim::Composite(_) => format!("`{name}`'s dim `{text}` is read with `{}`", self.example(d)),
                    _ => format!("`{name}`'s dim `{text}` is not made of parts: write `..` for it, or declare it as parts, as in `2 * {text}` or `{text} * 2`"),
                };
                self.cx.spanned(&item.tokens, message);
                None
            }
        }
    }

    /// A slice of parameter `p` that reads its first part, for messages: `x[.., ..d]`.
    pub(super) fn slice_example(&self, p: usize) -> String {
        let shape = self.params[p].shape.as_deref().unwrap_or_default();
        let items: Vec<String> = shape.iter().map(|&d| self.example(d)).collect();
        items.join(", ")
    }

    /// A slice item that reads a part of composite dim `d`, for messages.
    fn example(&self, d: DimId) -> String {
        match &self.dims[d] {
            Dim::Composite(Composite::Interleaved(_, k)) => format!("(0..).step_by({k})"),
            Dim::Composite(Composite::Parts(parts)) => format!("..{}", self.dims[parts[0].1]),
            _ => "..".into(),
        }
    }

    /// The part of `parts` that `start..end` covers exactly.
    fn part_of(
        &mut self,
        name: &str,
        text: &str,
        parts: &[(u64, DimId)],
        start: Option<&syn::Expr>,
        end: Option<&syn::Expr>,
        t: &TokenStream,
    ) -> Option<(DimId, u64, Form)> {
        let one: Vec<DimId> = parts
            .iter()
            .flat_map(|&(k, d)| (0..k).map(move |_| d))
            .collect();
        let mut starts = vec![Form::default()];
        for &d in &one {
            let next = starts
                .last()
                .expect("a start")
                .clone()
                .add(&self.form_of_dim(d), 1);
            starts.push(next);
        }
        let start = match start {
            Some(e) => self.form(e)?,
            None => Form::default(),
        };
        let end = match end {
            Some(e) => Some(self.form(e)?),
            None => None,
        };
        let found = (0..one.len())
            .find(|&i| starts[i] == start && end.as_ref().is_none_or(|e| *e == starts[i + 1]));
        match found {
            Some(i) if end.is_some() || i + 1 == one.len() => Some((one[i], 1, starts[i].clone())),
            _ => {
                let bounds: Vec<String> = (0..one.len())
                    .map(|i| {
                        format!(
                            "`{}..{}`",
                            self.form_text(&starts[i]),
                            self.form_text(&starts[i + 1])
                        )
                    })
                    .collect();
                self.cx.spanned(
                    t,
                    format!(
                        "this range is not one part of `{name}`'s dim `{text}`; its parts are {}",
                        bounds.join(", ")
                    ),
                );
                None
            }
        }
    }

    fn form_of_dim(&self, d: DimId) -> Form {
        match self.dims[d] {
            Dim::Fixed(v) => Form {
                dims: BTreeMap::new(),
                constant: v as i128,
            },
            _ => Form {
                dims: [(d, 1)].into(),
                constant: 0,
            },
        }
    }

    fn form_text(&self, f: &Form) -> String {
        let mut terms: Vec<String> = f
            .dims
            .iter()
            .map(|(&d, &c)| match c {
                1 => self.dims[d].to_string(),
                _ => format!("{c} * {}", self.dims[d]),
            })
            .collect();
        if f.constant != 0 || terms.is_empty() {
            terms.push(f.constant.to_string());
        }
        terms.join(" + ")
    }

    /// A slice bound as a sum of dims: names, literals, `+`, `-`, and `*` by a literal.
    fn form(&mut self, e: &syn::Expr) -> Option<Form> {
        let e = unparen(e);
        if let Some(v) = literal(e) {
            return Some(Form {
                dims: BTreeMap::new(),
                constant: v as i128,
            });
        }
        if let Some(name) = ident(e) {
            let text = crate::ir::plain_name(name);
            if let Some(d) = self
                .dims
                .iter()
                .position(|x| *x == Dim::Named(text.clone()))
            {
                return Some(self.form_of_dim(d));
            }
            self.cx.spanned(name, format!("a slice's bounds are written with the signature's dims, and `{text}` is not one"));
            return None;
        }
        if let syn::Expr::Binary(b) = e {
            let (l, r) = (self.form(&b.left)?, self.form(&b.right)?);
            let factor = |f: &Form| f.dims.is_empty().then_some(f.constant);
            match b.op {
                syn::BinOp::Add(_) => return Some(l.add(&r, 1)),
                syn::BinOp::Sub(_) => return Some(l.add(&r, -1)),
                syn::BinOp::Mul(_) => match (factor(&l), factor(&r)) {
                    (Some(k), _) => return Some(r.scale(k)),
                    (_, Some(k)) => return Some(l.scale(k)),
                    _ => {}
                },
                _ => {}
            }
        }
        self.cx.spanned(
            e,
            "a slice's bound is a sum of dims, as in `d`, `2 * d` or `h + p`",
        );
        None
    }

    /// The first read of a parameter listed in `#[vjp]` whose gradient would be a scatter-add:
    /// a gather that may read an element more than once (an index with dims of its own, or
    /// not along the parameter's other dims: see [`View::picks`]), and the error that says so.
    /// Parts and steps read each element once: their gradients are stored through the same
    /// views ([`crate::grad::Grad::Parts`]).
    pub fn first_scatter(&self, listed: &[usize]) -> Option<(TokenStream, String)> {
        self.nodes.iter().find_map(|n| {
            let Op::View(p, view) = &n.op else {
                return None;
            };
            let storage = self.params[*p].shape.as_ref()?;
            if !listed.contains(p)
                || view.gathers.is_empty()
                || view.picks(storage, &n.shape).is_some()
                || view.merged_read(storage, &n.shape, &self.dims).is_some()
            {
                return None;
            }
            let name = crate::ir::plain_name(&self.params[*p].name);
            let own: Vec<String> = view
                .gathers
                .iter()
                .flat_map(|g| &self.nodes[g.index].shape)
                .filter(|d| !storage.contains(d))
                .map(|&d| format!("`{}`", self.dims[d].text(&self.dims)))
                .collect();
            let message = match own.first() {
                Some(d) => format!("`#[vjp]` does not yet differentiate a gather from `{name}` by an index with a dim `{name}` lacks ({d}), as here: indices may repeat, and its gradient would add up what each picks, a scatter; leave `{name}` out of `#[vjp]`, or list it in `#[jvp]`"),
                None => format!("`#[vjp]` differentiates a gather from `{name}` whose indices run along `{name}`'s other dims, read whole (`x[.., labels]` with `labels: [n]` of `x: [n, v]`), and not this one; leave `{name}` out of `#[vjp]`, or list it in `#[jvp]`"),
            };
            Some((n.tokens.clone(), message))
        })
    }
}

fn tokens(t: &impl ToTokens) -> TokenStream {
    t.to_token_stream()
}

fn unparen(mut e: &syn::Expr) -> &syn::Expr {
    while let syn::Expr::Paren(p) = e {
        e = &p.expr;
    }
    e
}

fn ident(e: &syn::Expr) -> Option<&syn::Ident> {
    match unparen(e) {
        syn::Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        _ => None,
    }
}

fn literal(e: &syn::Expr) -> Option<u64> {
    match unparen(e) {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) if matches!(i.suffix(), "" | "usize") => i.base10_parse::<u64>().ok(),
        _ => None,
    }
}

/// Every name in a dim's expression.
fn idents(e: &syn::Expr) -> Vec<syn::Ident> {
    match unparen(e) {
        syn::Expr::Binary(b) => [idents(&b.left), idents(&b.right)].concat(),
        other => ident(other).cloned().into_iter().collect(),
    }
}

/// The terms of `a + b + c`, left to right.
fn sum_terms(e: &syn::Expr) -> Vec<&syn::Expr> {
    match unparen(e) {
        syn::Expr::Binary(b) if matches!(b.op, syn::BinOp::Add(_)) => {
            let mut terms = sum_terms(&b.left);
            terms.push(&b.right);
            terms
        }
        other => vec![other],
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::{Composite, Dim, Launch, Op};
    use crate::testing::{assert_error, kernel};
    use quote::quote;

    fn views(k: &crate::ir::Kernel) -> Vec<(&Vec<usize>, &crate::ir::View)> {
        k.nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::View(_, v) => Some((&n.shape, &**v)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn halves_of_two_parts_read_at_offsets_with_the_whole_row_as_stride() {
        let k = kernel(quote! {
            fn silu_and_mul(x: [f32; t, 2 * d]) -> [f32; t, d] {
                silu(x[.., ..d]) * x[.., d..]
            }
        });
        let (t, d) = (0, 1);
        assert_eq!(k.dims[2], Dim::Composite(Composite::Parts(vec![(2, d)])));
        assert_eq!(k.launch, Launch::Map { domain: vec![t, d] });
        let v = views(&k);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].0, &vec![t, d]);
        assert_eq!(v[0].1.strides, vec![vec![(1, vec![2])], vec![(1, vec![])]]);
        assert!(v[0].1.offset.is_empty());
        assert_eq!(v[1].1.offset, vec![(1, vec![d])]);
    }

    #[test]
    fn a_sum_of_parts_reads_each_part_at_its_start_with_the_head_as_stride() {
        let k = kernel(quote! {
            fn rotary(x: [f32; t, h, 2 * half + p], c: [f32; t, half]) -> [f32; t, h, half] {
                let pass = x[.., .., 2 * half..];
                x[.., .., half..2 * half] * c
            }
        });
        let (t, h, half, p) = (0, 1, 2, 3);
        let head = 4;
        assert_eq!(
            k.dims[head],
            Dim::Composite(Composite::Parts(vec![(2, half), (1, p)]))
        );
        assert_eq!(k.dims[head].text(&k.dims), "2 * half + p");
        assert_eq!(k.params[0].shape, Some(vec![t, h, head]));
        let v = views(&k);
        assert_eq!(v[0].0, &vec![t, h, p]);
        assert_eq!(v[0].1.offset, vec![(2, vec![half])]);
        assert_eq!(v[1].0, &vec![t, h, half]);
        assert_eq!(v[1].1.offset, vec![(1, vec![half])]);
        assert_eq!(
            v[1].1.strides,
            vec![
                vec![(1, vec![h, head])],
                vec![(1, vec![head])],
                vec![(1, vec![])]
            ]
        );
        // It lines up with vectors: its last dim is contiguous, its rows a head apart.
        let slice = k.nodes.iter().rposition(|n| matches!(n.op, Op::View(..)));
        let pitch = crate::plan::rows::pitched(&k, slice.unwrap(), &[t, h, half]);
        assert!(pitch.is_some_and(|p| p.pitch == Some(vec![(1, vec![head])])));
    }

    #[test]
    fn a_strided_pick_steps_by_its_group() {
        let k = kernel(quote! {
            fn odds(x: [f32; t, d * 2]) -> [f32; t, d] { x[.., (1..).step_by(2)] }
        });
        let (t, d) = (0, 1);
        assert_eq!(k.dims[2], Dim::Composite(Composite::Interleaved(d, 2)));
        let v = views(&k);
        assert_eq!(v[0].1.strides, vec![vec![(1, vec![2])], vec![(2, vec![])]]);
        assert_eq!(v[0].1.offset, vec![(1, vec![])]);
        // Its elements are two apart: no vectors, the scalar loop.
        assert!(crate::plan::rows::pitched(&k, k.outputs[0].node, &[t, d]).is_none());
    }

    #[test]
    fn slices_work_in_every_launch() {
        let launch = |tokens| kernel(tokens).launch;
        let (t, d) = (0, 1);
        assert_eq!(
            launch(quote! { fn f(x: [f32; t, 2 * d]) -> [f32; t] { sum(x[.., ..d], d) } }),
            Launch::Rows {
                domain: vec![t, d],
                axis: d
            }
        );
        assert_eq!(
            launch(quote! { fn f(x: [f32; t, 2 * d]) -> [f32; d] { sum(x[.., d..], t) } }),
            Launch::Rows {
                domain: vec![t, d],
                axis: t
            }
        );
        assert_eq!(
            launch(quote! { fn f(x: [f32; t, 2 * d]) -> f32 { sum(x[.., d..]) } }),
            Launch::Full { domain: vec![t, d] }
        );
    }

    #[test]
    fn a_slice_is_bracketed_only_where_it_indexes() {
        // An array literal keeps its own error; a slice beside other mistakes hides none of them.
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { x * [1.0, 2.0] } },
            "array literals are not part of the language",
        );
        let e = crate::testing::errors(quote! {
            fn f(x: [f32; t, 2 * d]) -> [f32; t, d] {
                let a = x[.., ..k];
                let b = exq(x[.., d..]);
                let c = 1.5i32;
                x[.., ..d]
            }
        });
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e
            .iter()
            .any(|e| e.starts_with("a slice's bounds are written with the signature's dims")));
    }

    #[test]
    fn malformed_slices_are_spanned_errors() {
        for (tokens, prefix) in [
            (
                quote! { fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { x[.., d..d] } },
                "this range is not one part",
            ),
            (
                quote! { fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { x[.., 2 * d..] } },
                "this range is not one part",
            ),
            (
                quote! { fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { x[.., .., ..] } },
                "`x` has 2 dims",
            ),
            (
                quote! { fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { x[.., (0..).step_by(2)] } },
                "`x`'s dim `2 * d` is read with `..d`",
            ),
            (
                quote! { fn f(x: [f32; t, d * 2]) -> [f32; t, d] { x[.., (0..).step_by(3)] } },
                "`x`'s dim `d * 2` has groups of 2",
            ),
            (
                quote! { fn f(x: [f32; t, d * 2]) -> [f32; t, d] { x[.., (0..).step_by(2, 3)] } },
                "a strided pick is",
            ),
            (
                quote! { fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { let y = x; y[.., ..d] } },
                "`x` has the dim `2 * d`",
            ),
            (
                quote! { fn f(x: [f32; d, 2 * d]) -> f32 { sum(x[.., ..d]) } },
                "this slice of `x` has the dim `d` twice",
            ),
            (
                quote! { fn f(s: f32, x: [f32; t, 2 * d]) -> [f32; t, d] { s[.., ..d] } },
                "only a tensor parameter can be sliced",
            ),
        ] {
            assert_error(tokens, prefix);
        }
    }
}

#[cfg(test)]
mod gather_tests {
    use crate::ir::{Launch, Op};
    use crate::testing::{assert_error, kernel};
    use quote::quote;

    fn gathers(k: &crate::ir::Kernel) -> Vec<(&Vec<usize>, &crate::ir::View)> {
        k.nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::View(_, v) if !v.gathers.is_empty() => Some((&n.shape, &**v)),
                _ => None,
            })
            .collect()
    }

    /// `emb[tokens, ..]`: the tokens' dims take the gathered dim's place, and move the load
    /// only through the index (empty strides); the index's row of the table is `e` apart.
    #[test]
    fn an_embedding_takes_the_tokens_dims_in_place_of_the_vocabulary() {
        let k = kernel(quote! {
            fn embed(emb: [bf16; vocab, e], tokens: [u32; b, s]) -> [bf16; b, s, e] { emb[tokens, ..] }
        });
        let (vocab, e, b, s) = (0, 1, 2, 3);
        assert_eq!(
            k.launch,
            Launch::Map {
                domain: vec![b, s, e]
            }
        );
        let g = gathers(&k);
        let (shape, view) = g[0];
        assert_eq!(shape, &vec![b, s, e]);
        assert_eq!(view.strides, vec![vec![], vec![], vec![(1, vec![])]]);
        let gather = &view.gathers[0];
        assert_eq!(gather.stride, vec![(1, vec![e])]);
        assert_eq!(gather.len, vec![(1, vec![vocab])]);
        assert!(matches!(k.nodes[gather.index].op, Op::Load(1)));
        // Its element order is the gather's: no vector loads.
        assert!(crate::plan::rows::pitched(&k, k.outputs[0].node, &[b, s, e]).is_none());
    }

    /// `x[.., labels]` with `labels: [n]`: the index's dim is the row's own, so the value is
    /// one per row, read in a launch over rows beside the row's reductions.
    #[test]
    fn a_label_is_one_value_a_row() {
        let k = kernel(quote! {
            fn ce(x: [f32; n, v], labels: [i64; n]) -> [f32; n] { logsumexp(x, v) - x[.., labels] }
        });
        let (n, v) = (0, 1);
        assert_eq!(
            k.launch,
            Launch::Rows {
                domain: vec![n, v],
                axis: v
            }
        );
        let (shape, view) = gathers(&k)[0];
        assert_eq!(shape, &vec![n]);
        assert_eq!(view.strides, vec![vec![(1, vec![v])]]);
        assert_eq!(view.gathers[0].stride, vec![(1, vec![])]);
        // The tile of short rows would hold `x`'s rows where the gather reads it: not taken.
        let program = crate::plan::program(&k);
        assert!(crate::plan::rows::tiling(&k, &program.plan).is_none());
        let cuda = crate::cuda::sources(&k, &program).join("\n");
        assert!(
            cuda.contains("((unsigned long long)v1 < (unsigned long long)(d_v) ? p_x[c0 * d_v + (long long)v1] : (float)0)"),
            "{cuda}"
        );
        let cpu = crate::cpu::body(&k, &program.plan).to_string();
        assert!(cpu.contains("if (v1 as u64) < ((d_v) as u64)"), "{cpu}");
    }

    /// A cache row by position, split in halves: the gather and a part in one slice.
    #[test]
    fn a_gather_and_a_part_share_a_slice() {
        let k = kernel(quote! {
            fn rot(pos: [i64; t], cache: [f32; p, 2 * half], q: [f32; t, half]) -> [f32; t, half] {
                q * cache[pos, ..half] + cache[pos, half..]
            }
        });
        let (t, p, half) = (0, 1, 2);
        let g = gathers(&k);
        assert_eq!(g.len(), 2);
        for (shape, view) in &g {
            assert_eq!(*shape, &vec![t, half]);
            assert_eq!(view.gathers[0].len, vec![(1, vec![p])]);
            assert_eq!(view.gathers[0].stride, vec![(1, vec![3])]);
        }
        assert!(g[0].1.offset.is_empty());
        assert_eq!(g[1].1.offset, vec![(1, vec![half])]);
    }

    /// An unsuffixed literal index is an `i64`, checked where the dim's size is fixed; `x[0]`
    /// along a named dim is a gather too, and `w[i]` by a scalar.
    #[test]
    fn literal_and_scalar_indices_gather() {
        let k = kernel(quote! {
            fn f(x: [f32; r, c], w: [f32; 3], i: u32) -> [f32; r] { x[.., 2] * w[i] }
        });
        let g = gathers(&k);
        assert_eq!(g.len(), 2);
        let index = g[0].1.gathers[0].index;
        assert_eq!(k.nodes[index].elem(), crate::ty::Elem::I64);
        let k = kernel(quote! { fn f(x: [f32; n]) -> f32 { x[0] } });
        assert_eq!(gathers(&k)[0].0, &Vec::<usize>::new());
    }

    /// Gathers along two dims: by indices of one shape (one element each, its dims once, where
    /// the first index is), and by indices of two (their outer product, in their places).
    #[test]
    fn gathers_along_two_dims() {
        let k = kernel(
            quote! { fn f(x: [f32; r, c], i: [u32; n], j: [u32; n]) -> [f32; n] { x[i, j] } },
        );
        let g = gathers(&k);
        assert_eq!(g.len(), 1);
        let (n, (r, c)) = (2, (0, 1));
        assert_eq!(g[0].0, &vec![n]);
        assert_eq!(g[0].1.strides, vec![Vec::<(u64, Vec<usize>)>::new()]);
        let strides: Vec<_> = g[0].1.gathers.iter().map(|g| g.stride.clone()).collect();
        assert_eq!(strides, vec![vec![(1, vec![c])], vec![(1, vec![])]]);
        let lens: Vec<_> = g[0].1.gathers.iter().map(|g| g.len.clone()).collect();
        assert_eq!(lens, vec![vec![(1, vec![r])], vec![(1, vec![c])]]);
        let k = kernel(quote! {
            fn f(cache: [f32; nb, h, bs, x], slot: [i64; t], b: i64) -> [f32; t, h, x] {
                cache[slot / b, .., slot % b, ..]
            }
        });
        let g = gathers(&k);
        let (t, h, x) = (4, 1, 3);
        assert_eq!(g[0].0, &vec![t, h, x]);
        assert_eq!(g[0].1.gathers.len(), 2);
        let k = kernel(
            quote! { fn f(x: [f32; r, c], i: [u32; a], j: [u32; b]) -> [f32; a, b] { x[i, j] } },
        );
        let (a, b) = (2, 3);
        assert_eq!(gathers(&k)[0].0, &vec![a, b]);
    }

    #[test]
    fn malformed_gathers_are_spanned_errors() {
        for (tokens, prefix) in [
            (
                quote! { fn f(x: [f32; r, c], i: [f32; r]) -> [f32; r] { x[.., i] } },
                "an index of `x` is an integer value",
            ),
            (
                quote! { fn f(x: [f32; r, c], i: [bool; r]) -> [f32; r] { x[.., i] } },
                "an index of `x` is an integer value",
            ),
            (
                quote! { fn f(x: [f32; r, 4]) -> [f32; r] { x[.., 4] } },
                "index out of bounds: this dim of `x` has size 4 but the index is 4",
            ),
            (
                quote! { fn f(x: [f32; r, c]) -> [f32; r] { x[.., -1] } },
                "index out of bounds: indices start at 0, and this one is -1",
            ),
            (
                quote! { fn f(x: [f32; r, c], t: [u32; n]) -> [f32; n, c] { x[t] } },
                "`x` has 2 dims",
            ),
            (
                quote! { fn f(x: [f32; r, c], t: [u32; n]) -> [f32; n, c] { (x * 2.0)[t, ..] } },
                "only a tensor parameter can be sliced or gathered from",
            ),
        ] {
            assert_error(tokens, prefix);
        }
    }
}

#[cfg(test)]
mod permute_tests {
    use crate::ir::{Launch, Op};
    use crate::testing::kernel;
    use quote::quote;

    /// `permute(lse, (t, h))` of `lse: [h, t]`: a view over `[t, h]` whose stride along `t` is
    /// one and along `h` is `len(t)`; the kernel is elementwise over `[t, h, d]`.
    #[test]
    fn a_permuted_view_strides_by_the_parameters_own_layout() {
        let k = kernel(quote! {
            fn f(o: [f32; t, h, d], lse: [f32; h, t]) -> [f32; t, h, d] { o * permute(lse, (t, h)).exp() }
        });
        let (t, h, d) = (0, 1, 2);
        assert_eq!(
            k.launch,
            Launch::Map {
                domain: vec![t, h, d]
            }
        );
        let views: Vec<_> = k
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::View(1, v) => Some((&n.shape, &**v)),
                _ => None,
            })
            .collect();
        let [(shape, view)] = views.as_slice() else {
            panic!("one view of `lse`: {views:?}");
        };
        assert_eq!(*shape, &vec![t, h]);
        assert_eq!(view.strides, vec![vec![(1, vec![])], vec![(1, vec![t])]]);
        assert!(view.offset.is_empty() && view.gathers.is_empty());
    }

    /// In its own order a permute is the parameter itself.
    #[test]
    fn a_permute_in_the_parameters_order_is_a_plain_load() {
        let k = kernel(quote! {
            fn f(x: [f32; r, c]) -> [f32; r, c] { permute(x, (r, c)) * 2.0 }
        });
        assert!(k.nodes.iter().all(|n| !matches!(n.op, Op::View(..))));
    }
}
