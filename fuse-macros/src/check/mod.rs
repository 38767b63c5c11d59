//! Types, dims and fusion legality. Every user error is found here; later stages assume a
//! checked kernel and treat a broken invariant as a bug.

mod element;
mod merge;
mod slice;
mod special;
pub(crate) mod typing;
mod write;

use crate::error::{self, Errors};
use crate::ir::plain_name;
use crate::ir::{Dim, DimId, Kernel, Node, Op, OutputInfo, ParamInfo};
use crate::limits::{MAX_DIMS, MAX_OUTPUTS, MAX_PARAMS};
use crate::parse::{lower_body, DimDecl, Expr, ExprKind, Input, KernelDef, TypeDecl};
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;
use std::collections::HashSet;

/// The scope entry of a name whose value had an error.
pub const POISONED: usize = usize::MAX;

/// The name of the device argument of every generated function.
pub const DEVICE_ARG: &str = "dev";

pub fn check(input: &Input, cx: &mut Errors) -> Vec<Kernel> {
    let mut seen = HashSet::new();
    for k in &input.kernels {
        if !seen.insert(plain_name(&k.name)) {
            cx.spanned(
                &k.name,
                format!(
                    "the kernel `{}` is defined more than once in this `fuse!`; rename one",
                    plain_name(&k.name)
                ),
            );
        }
    }
    let names: Vec<String> = input.kernels.iter().map(|k| plain_name(&k.name)).collect();
    input
        .kernels
        .iter()
        .filter_map(|k| Checker::new(cx, names.clone()).kernel(k))
        .collect()
}

/// The state of checking one kernel.
pub struct Checker<'a> {
    pub cx: &'a mut Errors,
    pub dims: Vec<Dim>,
    pub params: Vec<ParamInfo>,
    pub nodes: Vec<Node>,
    /// Names in scope, innermost last: parameters, then `let`s.
    pub scope: Vec<(String, usize)>,
    /// The kernels of this `fuse!`, which a body cannot call.
    pub kernel_names: Vec<String>,
    /// The random calls (`rand`, `randn`, `dropout`) so far: each draws its own stream.
    pub random_sites: u32,
    /// The named dims among `dims`, counted as they are declared (for [`MAX_DIMS`]).
    pub named_dims: usize,
}

impl<'a> Checker<'a> {
    fn new(cx: &'a mut Errors, kernel_names: Vec<String>) -> Self {
        Checker {
            cx,
            dims: vec![],
            params: vec![],
            nodes: vec![],
            scope: vec![],
            kernel_names,
            random_sites: 0,
            named_dims: 0,
        }
    }

    pub fn push(&mut self, op: Op, ty: Ty, shape: Vec<DimId>, tokens: &TokenStream) -> usize {
        self.nodes.push(Node {
            op,
            ty,
            shape,
            tokens: tokens.clone(),
        });
        self.nodes.len() - 1
    }

    pub fn is_named_dim(&self, name: &str) -> bool {
        self.dims
            .iter()
            .any(|d| matches!(d, Dim::Named(n) if n == name))
    }

    pub fn named_dim_names(&self) -> Vec<String> {
        self.dims
            .iter()
            .filter_map(|d| {
                if let Dim::Named(n) = d {
                    Some(n.clone())
                } else {
                    None
                }
            })
            .collect()
    }

    pub fn shape_text(&self, shape: &[DimId]) -> String {
        let dims: Vec<String> = shape
            .iter()
            .map(|&d| self.dims[d].text(&self.dims))
            .collect();
        format!("[{}]", dims.join(", "))
    }

    fn kernel(mut self, def: &KernelDef) -> Option<Kernel> {
        let errors_before = self.cx.len();
        self.signature(def);
        if self.cx.len() == errors_before {
            self.composites_bind(def);
        }
        let before_outputs = self.cx.len();
        // No `->`: a kernel that only writes through its `&mut` parameters.
        let returns = !def.output.types.is_empty() || !def.output_tokens.is_empty();
        // An output type with an error is not matched against the body: that would only repeat it.
        let outputs = match returns {
            true => self
                .output_types(def)
                .filter(|_| self.cx.len() == before_outputs),
            false => Some(vec![]),
        };
        let body = lower_body(&def.body, self.cx);
        let mut poisoned = body.poisoned.iter().peekable();
        let mut writes = body.writes.iter().peekable();
        let mut placed = vec![];
        for (i, (name, e)) in body.lets.iter().enumerate() {
            while let Some((_, w)) = writes.next_if(|(at, _)| *at == i) {
                placed.push(self.write(w));
            }
            while let Some((_, p)) = poisoned.next_if(|(at, _)| *at == i) {
                self.scope.push((plain_name(p), POISONED));
            }
            // A value with an error still binds its name, so its uses are not errors again.
            let id = self.expr(e).unwrap_or(POISONED);
            self.scope.push((plain_name(name), id));
        }
        for (_, p) in poisoned {
            self.scope.push((plain_name(p), POISONED));
        }
        for (_, w) in writes {
            placed.push(self.write(w));
        }
        let tail = match (&body.tail, returns) {
            (Some(t), true) => Some(t),
            (None, true) if body.has_tail => return None,
            (None, true) => {
                self.cx.at(
                    def.body_span,
                    "the kernel body must end with the expression it returns, with no `;` after it",
                );
                return None;
            }
            (Some(t), false) => {
                self.cx.spanned(&t.tokens, "the body ends in a value, but the signature declares no output: declare its type after the parameters, as in `-> [f32; n]`");
                return None;
            }
            (None, false) if body.has_tail => return None,
            (None, false) if body.writes.is_empty() => {
                self.cx.at(def.body_span, "a kernel returns at least one output or writes through a `&mut` parameter: declare the output's type, as in `-> [f32; n]`, and end the body with its value");
                return None;
            }
            (None, false) => None,
        };
        let Some(outputs) = outputs else {
            if let Some(tail) = tail {
                self.tail_items(tail);
            }
            return None;
        };
        let mut outputs = match tail {
            Some(tail) => self.outputs(outputs, tail)?,
            None => {
                // A kernel that only writes: its other literals (a shift's `3`) take Rust's
                // default, as `outputs` gives them beside the returned values.
                let before = self.cx.len();
                self.default_literals(&[], &[]);
                if self.cx.len() != before {
                    return None;
                }
                vec![]
            }
        };
        // Written outputs after the returned ones, which the generated API returns in order.
        outputs.extend(placed.into_iter().flatten());
        // Names that some write statement targets, checked or not: an error there is enough.
        let targeted: Vec<String> = body
            .writes
            .iter()
            .filter_map(|(_, w)| match &w.target.kind {
                ExprKind::Slice(base, _) | ExprKind::Index(base, _) => match &base.kind {
                    ExprKind::Var(name) => Some(plain_name(name)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        self.every_written_param_is_written(&outputs, &targeted);
        if self.cx.len() != errors_before {
            return None;
        }
        self.merge_reduced_dims(&mut outputs)?;
        let body = crate::ir::Body {
            dims: &self.dims,
            nodes: &self.nodes,
            outputs: &outputs,
        };
        let launch = crate::fusion::launch(&body, self.cx)?;
        if let (Some(o), false) = (
            outputs.iter().find(|o| o.place.is_some()),
            matches!(launch, crate::ir::Launch::Map { .. }),
        ) {
            self.cx.spanned(&o.tokens, "a write through a `&mut` parameter is elementwise, and this kernel reduces: write the reduced values in a kernel of its own, which only writes");
            return None;
        }
        if let (Some(attr), Some(o)) = (
            def.derive.first(),
            outputs.iter().find(|o| o.place.is_some()),
        ) {
            let mode = if attr.reverse { "vjp" } else { "jvp" };
            self.cx.spanned(&o.tokens, format!("`#[{mode}]` does not yet differentiate a kernel that writes through a `&mut` parameter; return the values instead"));
            return None;
        }
        let (vjp, jvp) = self.derive_lists(def, &outputs)?;
        Some(Kernel {
            attrs: def.attrs.clone(),
            fast_math: def.fast_math,
            vjp,
            jvp,
            vis: def.vis.clone(),
            name: def.name.clone(),
            dims: self.dims,
            params: self.params,
            outputs,
            tuple: def.output.tuple,
            nodes: self.nodes,
            launch,
        })
    }

    /// Reports a `&mut` parameter that no statement writes.
    fn every_written_param_is_written(&mut self, outputs: &[OutputInfo], targeted: &[String]) {
        for (i, p) in self.params.iter().enumerate() {
            let written = outputs
                .iter()
                .any(|o| o.place.as_ref().is_some_and(|w| w.param == i))
                || targeted.contains(&plain_name(&p.name));
            if p.written && !written {
                let name = plain_name(&p.name);
                self.cx.spanned(&p.name, format!("`{name}` is `&mut` but nothing writes it: write it through a slice, as in `{name}[idx, ..] = value;`, or take it by value"));
            }
        }
    }

    /// The parameters of `#[vjp(..)]` and `#[jvp(..)]`: each a float parameter of the kernel,
    /// listed once, in a kernel with a float output.
    #[allow(clippy::type_complexity)]
    fn derive_lists(
        &mut self,
        def: &KernelDef,
        outputs: &[OutputInfo],
    ) -> Option<(Option<Vec<usize>>, Option<Vec<usize>>)> {
        let errors_before = self.cx.len();
        let (mut vjp, mut jvp) = (None, None);
        for attr in &def.derive {
            let mode = if attr.reverse { "vjp" } else { "jvp" };
            let slot = if attr.reverse { &mut vjp } else { &mut jvp };
            if slot.is_some() {
                self.cx.spanned(
                    &attr.tokens,
                    format!("`#[{mode}]` is given more than once; list every parameter in one"),
                );
                continue;
            }
            if !outputs.iter().any(|o| o.elem.is_float()) {
                self.cx.spanned(
                    &attr.tokens,
                    format!("`#[{mode}]` needs a float output to differentiate, and this kernel returns none"),
                );
                continue;
            }
            let mut listed: Vec<usize> = vec![];
            for name in &attr.names {
                let text = plain_name(name);
                let Some(i) = self.params.iter().position(|p| plain_name(&p.name) == text) else {
                    let floats: Vec<String> = self
                        .params
                        .iter()
                        .filter(|p| p.elem.is_float())
                        .map(|p| plain_name(&p.name))
                        .collect();
                    let hint = match error::closest(&text, floats.iter().map(String::as_str)) {
                        Some(s) => error::did_you_mean(Some(s)),
                        None => {
                            let list: Vec<String> =
                                floats.iter().map(|f| format!("`{f}`")).collect();
                            format!("; its float parameters are {}", list.join(", "))
                        }
                    };
                    self.cx.spanned(
                        name,
                        format!(
                            "`{text}` is not a parameter of `{}`{hint}",
                            plain_name(&def.name)
                        ),
                    );
                    continue;
                };
                let elem = self.params[i].elem;
                if !elem.is_float() {
                    self.cx.spanned(
                        name,
                        format!("`{text}` is of type `{elem}`, and only float parameters have derivatives; list the float ones"),
                    );
                } else if listed.contains(&i) {
                    self.cx.spanned(
                        name,
                        format!("`{text}` is listed twice in `#[{mode}]`; list it once"),
                    );
                } else {
                    listed.push(i);
                }
            }
            *slot = Some(listed);
        }
        // A listed tensor with some of the dims a reduction takes together, read through
        // gathers (`check::merge`): its gradient is a reduction over part of a dim, which only
        // a read of the whole tensor gives. (Its tangent is read through the same gathers; an
        // unlisted one is read as in the kernel.)
        let merged: Vec<&Vec<DimId>> = self
            .dims
            .iter()
            .filter_map(|d| match d {
                Dim::Merged(parts) => Some(parts),
                _ => None,
            })
            .collect();
        let partial = vjp.iter().flatten().find_map(|&p| {
            let shape = self.params[p].shape.as_ref()?;
            let parts = merged
                .iter()
                .find(|parts| parts.iter().any(|d| shape.contains(d)))?;
            // Read as a whole tensor is (`merge`'s gathers of its own layout), its gradient
            // sums over the parts it lacks (`Graph::merged_adjoint`); through a slice, not yet.
            let derivable = self.nodes.iter().all(|n| match &n.op {
                Op::View(q, view) if *q == p => {
                    view.merged_read(shape, &n.shape, &self.dims).is_some()
                }
                _ => true,
            });
            (!derivable).then_some((p, parts))
        });
        if let Some((p, parts)) = partial {
            let names: Vec<String> = parts.iter().map(|&d| self.dims[d].to_string()).collect();
            let name = plain_name(&self.params[p].name);
            let at = def.params[p].name.clone();
            self.cx.spanned(&at, format!("`#[vjp]` does not yet differentiate a kernel with respect to `{name}`, which has some of the dims `({})` that a reduction takes together, and not all, and is read through a slice; leave `{name}` out of `#[vjp]` (the others' gradients are derived), or read it whole", names.join(", ")));
        } else if let Some((at, message)) =
            vjp.as_ref().and_then(|listed| self.first_scatter(listed))
        {
            self.cx.spanned(&at, message);
        }
        (self.cx.len() == errors_before).then_some((vjp, jvp))
    }

    fn signature(&mut self, def: &KernelDef) {
        if let Some(p) = def.params.get(MAX_PARAMS) {
            self.cx
                .spanned(&p.name, error::signature_size("parameters", MAX_PARAMS));
        }
        let mut names = HashSet::new();
        for p in &def.params {
            let name = plain_name(&p.name);
            if name == DEVICE_ARG {
                self.cx.spanned(&p.name, format!("the parameter name `{DEVICE_ARG}` is reserved for the device argument of the generated function; rename it"));
            }
            let duplicate = !names.insert(name.clone());
            if duplicate {
                self.cx.spanned(
                    &p.name,
                    format!("the parameter `{name}` is declared more than once; rename one"),
                );
            }
            let elem = self.elem(&p.ty);
            let before = self.cx.len();
            let shape = p.ty.dims.as_ref().map(|dims| self.declare_dims(dims, true));
            // A tensor whose dims have an error is poisoned, so its uses are not errors too.
            let elem = elem.filter(|_| self.cx.len() == before);
            if let (Some(t), None) = (&p.written, &shape) {
                self.cx.spanned(t, format!("`{name}` is written through `&mut`, which takes a tensor type, as in `{name}: &mut [f32; n]`"));
            }
            let id = self.params.len();
            self.params.push(ParamInfo {
                name: p.name.clone(),
                elem: elem.unwrap_or(Elem::F32),
                shape: shape.clone(),
                written: p.written.is_some() && shape.is_some(),
                packed: false,
            });
            let op = if shape.is_some() {
                Op::Load(id)
            } else {
                Op::Scalar(id)
            };
            let tokens = quote::ToTokens::to_token_stream(&p.name);
            let node = self.push(
                op,
                Ty::Elem(elem.unwrap_or(Elem::F32)),
                shape.unwrap_or_default(),
                &tokens,
            );
            // The body sees the first of duplicate names; a parameter of an unsupported type is
            // poisoned so its uses are not type errors too.
            if !duplicate {
                self.scope
                    .push((name, if elem.is_some() { node } else { POISONED }));
            }
        }
    }

    fn elem(&mut self, ty: &TypeDecl) -> Option<Elem> {
        let e = ty.elem.resolve();
        if e.is_none() {
            self.unsupported_type(&ty.elem.ty);
        }
        e
    }

    /// Interns the dims of a tensor type. Inputs bind named dims; an output may only use them.
    fn declare_dims(&mut self, dims: &[DimDecl], binds: bool) -> Vec<DimId> {
        let mut shape: Vec<DimId> = vec![];
        for d in dims {
            let dim = match d {
                DimDecl::Named(n) => Dim::Named(plain_name(n)),
                DimDecl::Fixed(lit) => self.fixed_dim(lit),
                DimDecl::Composite(e) => match self.composite(e, binds) {
                    Some(c) => Dim::Composite(c),
                    None => continue,
                },
            };
            let Some(id) = self.intern(dim.clone(), &d.tokens(), binds) else {
                continue;
            };
            if shape.contains(&id) {
                let dim = dim.text(&self.dims);
                self.cx.spanned(d.tokens(), format!("the dim `{dim}` appears twice in one tensor type; each axis of a tensor needs its own dim name"));
                continue;
            }
            shape.push(id);
        }
        shape
    }

    fn fixed_dim(&mut self, lit: &syn::LitInt) -> Dim {
        match lit.base10_parse::<u64>() {
            Ok(v) if lit.suffix().is_empty() || lit.suffix() == "usize" => Dim::Fixed(v),
            Ok(_) => {
                self.cx.spanned(
                    lit,
                    "a fixed dim is a plain integer literal, such as `4`, with no suffix",
                );
                Dim::Fixed(u64::MAX)
            }
            Err(_) => {
                self.cx.spanned(
                    lit,
                    format!("the fixed dim `{lit}` is too large: sizes are `u64`"),
                );
                Dim::Fixed(u64::MAX)
            }
        }
    }

    /// The id of `dim`, declared where it is new: inputs (`binds`) declare named dims.
    fn intern(&mut self, dim: Dim, tokens: &TokenStream, binds: bool) -> Option<DimId> {
        if let Some(id) = self.dims.iter().position(|x| *x == dim) {
            return Some(id);
        }
        if !binds && matches!(dim, Dim::Named(_)) {
            self.cx.spanned(tokens, format!("the output dim `{dim}` is not bound by any input; every named dim of an output must appear in an input's type"));
            return None;
        }
        if matches!(dim, Dim::Named(_)) {
            if self.named_dims == MAX_DIMS {
                self.cx
                    .spanned(tokens, error::signature_size("named dims", MAX_DIMS));
            }
            self.named_dims += 1;
        }
        self.dims.push(dim);
        Some(self.dims.len() - 1)
    }

    fn output_types(&mut self, def: &KernelDef) -> Option<Vec<(Elem, Vec<DimId>)>> {
        if def.output.types.is_empty() {
            self.cx.spanned(&def.output_tokens, "a kernel returns at least one output: declare its type, as in `-> [f32; n]` or `-> (f32, [f32; n])`");
            return None;
        }
        if let Some(t) = def.output.types.get(MAX_OUTPUTS) {
            self.cx
                .spanned(&t.elem.ty, error::signature_size("outputs", MAX_OUTPUTS));
        }
        let types: Vec<Option<(Elem, Vec<DimId>)>> = def
            .output
            .types
            .iter()
            .map(|t| {
                let elem = self.elem(t);
                let shape = t
                    .dims
                    .as_ref()
                    .map(|d| self.declare_dims(d, false))
                    .unwrap_or_default();
                Some((elem?, shape))
            })
            .collect();
        types.into_iter().collect()
    }

    /// Checks the tail expression's items, for their own errors.
    fn tail_items(&mut self, tail: &Expr) {
        match &tail.kind {
            ExprKind::Tuple(items) => items.iter().for_each(|e| {
                self.expr(e);
            }),
            _ => {
                self.expr(tail);
            }
        }
    }

    /// Matches the tail expression against the declared outputs.
    fn outputs(
        &mut self,
        declared: Vec<(Elem, Vec<DimId>)>,
        tail: &Expr,
    ) -> Option<Vec<OutputInfo>> {
        let items: Vec<&Expr> = match &tail.kind {
            ExprKind::Tuple(items) => items.iter().collect(),
            _ => vec![tail],
        };
        let ids: Vec<Option<usize>> = items.iter().map(|e| self.expr(e)).collect();
        if items.len() != declared.len() {
            let (n, m) = (declared.len(), items.len());
            let names: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
            let types: Vec<String> = declared
                .iter()
                .map(|(e, s)| self.type_text(*e, s))
                .collect();
            let types = if n == 1 {
                types.join("")
            } else {
                format!("({})", types.join(", "))
            };
            let message = format!(
                "the signature declares {n} output{} `{}` but the body returns {m} value{}; return one value per output, as in `({})`",
                if n == 1 { "" } else { "s" },
                types,
                if m == 1 { "" } else { "s" },
                names.join(", ")
            );
            self.cx.spanned(&tail.tokens, message);
            return None;
        }
        let ids: Vec<usize> = ids.into_iter().collect::<Option<_>>()?;
        let before_literals = self.cx.len();
        self.default_literals(&ids, &declared);
        if self.cx.len() != before_literals {
            // A literal that does not fit its type keeps a literal type, which has no element
            // type to compare with the declared one below.
            return None;
        }
        self.shape_randoms(&ids, &declared, &items)?;
        let mut outputs = vec![];
        for ((&id, (elem, shape)), e) in ids.iter().zip(declared).zip(items) {
            let node = &self.nodes[id];
            if node.elem() != elem || node.shape != shape {
                let (want, got) = (
                    self.type_text(elem, &shape),
                    self.type_text(node.elem(), &node.shape.clone()),
                );
                let node_shape = self.nodes[id].shape.clone();
                let fix = self.output_fix(elem, &shape, &node_shape, &got);
                let message = format!("mismatched output type: the signature declares `{want}` but this computes `{got}`; {fix}");
                self.cx.spanned(&e.tokens, message);
                continue;
            }
            outputs.push(OutputInfo {
                elem,
                shape,
                node: id,
                tokens: e.tokens.clone(),
                partial: None,
                total: false,
                place: None,
                packed: false,
            });
        }
        Some(outputs)
    }

    /// Gives each random value that has no shape of its own (`rand(seed)`, and what is computed
    /// from it alone) the shape of the expression it is used in, or of the output it is: each
    /// element there draws its own number. A value used at two shapes is an error, since it would
    /// be two different draws.
    fn shape_randoms(
        &mut self,
        ids: &[usize],
        declared: &[(Elem, Vec<DimId>)],
        items: &[&Expr],
    ) -> Option<()> {
        let n = self.nodes.len();
        let varying = self.shapeless_randoms();
        if !varying.contains(&true) {
            return Some(());
        }
        let mut wanted: Vec<Option<Vec<DimId>>> = vec![None; n];
        let errors = self.cx.len();
        for ((&id, (_, shape)), e) in ids.iter().zip(declared).zip(items) {
            if varying[id] {
                self.want_shape(&mut wanted[id], shape, &e.tokens);
            }
        }
        // Users come after what they use: each node's shape is final before its operands'.
        for i in (0..n).rev() {
            if varying[i] {
                if let Some(shape) = wanted[i].clone() {
                    self.nodes[i].shape = shape;
                }
            }
            // A reduction of a value without a shape is an error already (`reduce`), so every
            // user here gives its operands its own shape.
            let (shape, tokens) = (self.nodes[i].shape.clone(), self.nodes[i].tokens.clone());
            for a in self.nodes[i].op.operands() {
                if varying[a] {
                    self.want_shape(&mut wanted[a], &shape, &tokens);
                }
            }
        }
        (self.cx.len() == errors).then_some(())
    }

    /// Records that a random value is used at `shape`; a second, different shape is an error.
    fn want_shape(&mut self, wanted: &mut Option<Vec<DimId>>, shape: &[DimId], at: &TokenStream) {
        match wanted {
            Some(other) if other != shape => {
                let (a, b) = (self.shape_text(other), self.shape_text(shape));
                self.cx.spanned(at, format!("this random value is used at two shapes, `{a}` and `{b}`: it is drawn once per element of the shape it is used at, so it cannot be shared between shapes; call `rand` again for each shape"));
            }
            Some(_) => {}
            None => *wanted = Some(shape.to_vec()),
        }
    }

    /// How to make an output's computed type match its declaration.
    fn output_fix(&self, elem: Elem, declared: &[DimId], computed: &[DimId], got: &str) -> String {
        let extra: Vec<String> = computed
            .iter()
            .filter(|d| !declared.contains(d))
            .map(|&d| self.dims[d].to_string())
            .collect();
        if declared == computed {
            format!("convert it with `as {elem}`, or declare `{got}`")
        } else if declared.is_empty() {
            format!("reduce it, as in `sum(e)`, or declare `{got}`")
        } else if let (true, Some(d)) =
            (crate::ir::is_subsequence(declared, computed), extra.first())
        {
            format!("reduce over `{d}`, as in `sum(e, {d})`, or declare `{got}`")
        } else {
            format!("declare `{got}`; an output is not broadcast to a larger shape")
        }
    }

    /// Outputs give their literals the declared type; every other literal takes Rust's default.
    fn default_literals(&mut self, ids: &[usize], declared: &[(Elem, Vec<DimId>)]) {
        let mut fits = true;
        for (&id, (elem, _)) in ids.iter().zip(declared) {
            if self.nodes[id].ty.is_literal() {
                fits &= self.coerce_or_report(id, *elem);
            }
        }
        if !fits {
            // The literal that did not fit is still untyped: defaulting it would report it again.
            return;
        }
        for id in (0..self.nodes.len()).rev() {
            let ty = self.nodes[id].ty;
            if ty.is_literal() {
                self.coerce_or_report(id, ty.defaulted());
            }
        }
    }

    fn type_text(&self, elem: Elem, shape: &[DimId]) -> String {
        if shape.is_empty() {
            return elem.to_string();
        }
        let dims: Vec<String> = shape
            .iter()
            .map(|&d| self.dims[d].text(&self.dims))
            .collect();
        format!("[{elem}; {}]", dims.join(", "))
    }
}

impl DimDecl {
    pub(super) fn tokens(&self) -> TokenStream {
        match self {
            DimDecl::Named(n) => quote::ToTokens::to_token_stream(n),
            DimDecl::Fixed(l) => quote::ToTokens::to_token_stream(l),
            DimDecl::Composite(e) => quote::ToTokens::to_token_stream(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::{Launch, Op};
    use crate::testing::{assert_error, errors, kernel};
    use crate::ty::{Elem, Ty};
    use quote::quote;

    #[test]
    fn literals_take_the_other_operands_type() {
        let k = kernel(quote! { fn f(x: [f32; n]) -> [f32; n] { x * 2 + 0.5 } });
        for node in &k.nodes {
            assert_eq!(node.ty, Ty::Elem(Elem::F32), "{:?}", node.op);
        }
    }

    #[test]
    fn unconstrained_literals_default_as_in_rust() {
        let k = kernel(quote! { fn f(x: [f64; n]) -> [f64; n] { x + (2 as f64) + 1.5 } });
        let two = k.nodes.iter().find(|n| matches!(n.op, Op::Int(2))).unwrap();
        assert_eq!(two.ty, Ty::Elem(Elem::I32));
        assert!(k.nodes.iter().all(|n| !n.ty.is_literal()));
    }

    #[test]
    fn broadcasting_goes_by_dim_name() {
        let k = kernel(
            quote! { fn f(x: [f32; r, c], a: [f32; r], b: [f32; c]) -> [f32; r, c] { x * a + b } },
        );
        assert_eq!(k.outputs[0].shape, vec![0, 1]);
        let k = kernel(quote! { fn f(a: [f32; m], b: [f32; n]) -> [f32; m, n] { a * b } });
        assert_eq!(
            k.outputs[0].shape,
            vec![0, 1],
            "the outer product, in the signature's order"
        );
        let k =
            kernel(quote! { fn f(x: [f32; r, c], l: [u32; r]) -> [bool; r, c] { index(c) == l } });
        assert_eq!(k.outputs[0].shape, vec![0, 1]);
        assert_error(
            quote! { fn f(x: [f32; r, c], y: [f32; c, r]) -> [f32; r, c] { x + y } },
            "shapes `[r, c]` and `[c, r]` cannot broadcast: they have the dims",
        );
        assert_error(
            quote! { fn f(x: [f32; 1, s, h], y: [f32; b, s, h]) -> [f32; b, s, h] { y + x } },
            "shapes `[b, s, h]` and `[1, s, h]` cannot broadcast: `[1, s, h]` has the fixed dim `1`, which `[b, s, h]` lacks; dims combine by name, not by position, so a size-1 dim does not stretch to `b` as in numpy; leave it out of the type, as `[s, h]`",
        );
        assert_error(
            quote! { fn f(x: [f32; 4, h], y: [f32; b]) -> f32 { sum(x * y) } },
            "shapes `[4, h]` and `[b]` cannot broadcast: `[4, h]` has the fixed dim `4`, which `[b]` lacks; dims combine by name, not by position, so the fixed dim `4` matches only a dim of the same fixed size; leave it out of the type, as `[h]`",
        );
        assert_error(
            quote! { fn f(x: [f32; 3], y: [f32; 4]) -> [f32; 3] { x + y } },
            "shapes `[3]` and `[4]` cannot broadcast: the fixed sizes 3 and 4 differ",
        );
    }

    #[test]
    fn mismatched_types_suggest_the_cast() {
        assert_error(
            quote! { fn f(x: [f32; n], y: [f64; n]) -> [f32; n] { x + y } },
            "mismatched types: `f32` and `f64`; nothing converts implicitly: write `(y as f32)`",
        );
        assert_error(
            quote! { fn f(i: [i32; n]) -> [i32; n] { i + 1.5 } },
            "mismatched types: expected `i32`, found a float literal",
        );
    }

    #[test]
    fn unknown_names_suggest_the_closest() {
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { x.exq() } },
            "no method named `exq` for `f32` in the language; did you mean `exp`?",
        );
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { exq(x) } },
            "cannot find function `exq` in the language; did you mean `exp`?",
        );
        assert_error(
            quote! { fn f(xs: [f32; n]) -> [f32; n] { x } },
            "cannot find value `x` in this kernel; did you mean `xs`?",
        );
        assert_error(
            quote! { fn f(x: [f32; r, c]) -> [f32; r] { sum(x, cc) } },
            "cannot find dim `cc` in this kernel; did you mean `c`?",
        );
    }

    #[test]
    fn operations_the_type_lacks() {
        assert_error(
            quote! { fn f(i: [i32; n]) -> [i32; n] { i.exp() } },
            "`exp` needs a float, found `i32`",
        );
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { x & x } },
            "cannot apply `&` to `f32`",
        );
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { !x } },
            "cannot apply `!` to `f32`",
        );
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { if x { x } else { x } } },
            "expected a `bool` condition, found `f32`",
        );
        assert_error(
            quote! { fn f(x: [u32; n]) -> [u32; n] { -x } },
            "cannot negate `u32`",
        );
        assert_error(
            quote! { fn f(x: [i32; n]) -> f32 { mean(x) } },
            "`mean` needs a float operand",
        );
    }

    /// Parameters, outputs and named dims up to their limits check; one more is one error,
    /// at the first past the limit, naming the limit.
    #[test]
    fn signatures_are_limited_in_size() {
        use crate::limits::{MAX_DIMS, MAX_OUTPUTS, MAX_PARAMS};
        let params = |n: usize| -> proc_macro2::TokenStream {
            let list: Vec<String> = (0..n).map(|i| format!("p{i}: f32")).collect();
            format!("fn f({}) -> f32 {{ p0 }}", list.join(", "))
                .parse()
                .unwrap()
        };
        assert!(crate::testing::kernels(params(MAX_PARAMS)).is_ok());
        let e = errors(params(MAX_PARAMS + 1));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("more than 256 parameters"), "{e:?}");
        let outputs = |n: usize| -> proc_macro2::TokenStream {
            let types = vec!["f32"; n].join(", ");
            let values = vec!["x"; n].join(", ");
            format!("fn f(x: f32) -> ({types}) {{ ({values}) }}")
                .parse()
                .unwrap()
        };
        assert!(crate::testing::kernels(outputs(MAX_OUTPUTS)).is_ok());
        let e = errors(outputs(MAX_OUTPUTS + 1));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("more than 64 outputs"), "{e:?}");
        let dims = |n: usize| -> proc_macro2::TokenStream {
            let list: Vec<String> = (0..n).map(|i| format!("x{i}: [f32; d{i}]")).collect();
            format!("fn f({}) -> [f32; d0] {{ x0 }}", list.join(", "))
                .parse()
                .unwrap()
        };
        assert!(crate::testing::kernels(dims(MAX_DIMS)).is_ok());
        let e = errors(dims(MAX_DIMS + 1));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("more than 64 named dims"), "{e:?}");
    }

    #[test]
    fn outputs_must_match_the_signature() {
        assert_error(quote! { fn f(x: [f32; r, c]) -> [f32; r] { x } }, "mismatched output type: the signature declares `[f32; r]` but this computes `[f32; r, c]`");
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; m] { x } },
            "the output dim `m` is not bound by any input",
        );
        let e = errors(quote! { fn f(x: [f32; n]) -> ([f32; n], [f32; n]) { x } });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("the signature declares 2 outputs `([f32; n], [f32; n])` but the body returns 1 value"), "{e:?}");
    }

    #[test]
    fn independent_errors_are_all_reported() {
        let e = errors(quote! {
            fn f(x: [f32; n], x: [f32; n]) -> [f32; n] { x.exq() }
            fn g(y: [String; n]) -> [f32; n] { y }
            fn f(z: f32) -> f32 { z }
        });
        assert_eq!(e.len(), 4, "{e:#?}");
    }

    /// `f32::MAX` and kin are literals of their own type, with their exact values; another path
    /// is an error that lists them.
    #[test]
    fn constants_of_the_element_types() {
        let k = kernel(quote! {
            fn f(x: [f32; n], i: [u8; n]) -> ([f32; n], [u8; n], [f64; n]) {
                (x.min(f32::MAX).max(-f32::INFINITY), i.min(u8::MAX), (x as f64) + f64::EPSILON)
            }
        });
        let constants: Vec<(Ty, String)> = k
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::Float(t) => Some((n.ty, t.clone())),
                Op::Int(v) => Some((n.ty, v.to_string())),
                _ => None,
            })
            .collect();
        assert_eq!(
            constants,
            [
                (Ty::Elem(Elem::F32), "3.4028235e38".to_string()),
                (Ty::Elem(Elem::F32), "inf".to_string()),
                (Ty::Elem(Elem::U8), "255".to_string()),
                (Ty::Elem(Elem::F64), "2.220446049250313e-16".to_string()),
            ]
        );
        // A constant has its type: it is no literal that takes the other side's.
        assert_error(
            quote! { fn f(x: [f64; n]) -> [f64; n] { x.min(f32::MAX) } },
            "mismatched types: `f64` and `f32`; nothing converts implicitly: write `(f32::MAX as f64)`",
        );
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { x.min(f32::INFINTY) } },
            "no constant `f32::INFINTY` in the language; did you mean `f32::INFINITY`? (the constants of `f32` are `f32::NAN`,",
        );
        assert_error(
            quote! { fn f(x: [i32; n]) -> [i32; n] { x + i32::EPSILON } },
            "no constant `i32::EPSILON` in the language (the constants of `i32` are `i32::MIN`, `i32::MAX`)",
        );
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { x * std::f32::consts::PI } },
            "paths are not part of the language, except the constants of the element types: `f32::NAN`",
        );
    }

    #[test]
    fn launch_kinds() {
        let k = kernel(
            quote! { fn f(x: [f32; r, c]) -> ([f32; r, c], [f32; r]) { let m = max(x, c); (x - m, m) } },
        );
        assert_eq!(
            k.launch,
            Launch::Rows {
                domain: vec![0, 1],
                axis: 1
            }
        );
        let k = kernel(quote! { fn f(x: [f32; n]) -> (f32, [f32; n]) { (sum(x) / 2.0, x * 2.0) } });
        assert_eq!(k.launch, Launch::Full { domain: vec![0] });
        let k = kernel(quote! { fn f(a: f32) -> f32 { a + 1.0 } });
        assert_eq!(k.launch, Launch::Map { domain: vec![] });
    }
}
