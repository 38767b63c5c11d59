//! Types, dims and fusion legality. Every user error is found here; later stages assume a
//! checked kernel and treat a broken invariant as a bug.

use crate::error::Errors;
use crate::ir::{Dim, DimId, Kernel, Node, Op, OutputInfo, ParamInfo};
use crate::parse::{lower_body, DimDecl, Expr, ExprKind, Input, KernelDef, TypeDecl};
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;
use std::collections::HashSet;

/// The name of the device argument of every generated function.
pub const DEVICE_ARG: &str = "dev";

pub fn check(input: &Input, cx: &mut Errors) -> Vec<Kernel> {
    let mut seen = HashSet::new();
    for k in &input.kernels {
        if !seen.insert(k.name.to_string()) {
            cx.spanned(&k.name, format!("the kernel `{}` is defined more than once in this `fuse!`; rename one", k.name));
        }
    }
    input.kernels.iter().filter_map(|k| Checker::new(cx).kernel(k)).collect()
}

/// The state of checking one kernel.
pub struct Checker<'a> {
    pub cx: &'a mut Errors,
    pub dims: Vec<Dim>,
    pub params: Vec<ParamInfo>,
    pub nodes: Vec<Node>,
    /// Names in scope, innermost last: parameters, then `let`s.
    pub scope: Vec<(String, usize)>,
}

impl<'a> Checker<'a> {
    fn new(cx: &'a mut Errors) -> Self {
        Checker { cx, dims: vec![], params: vec![], nodes: vec![], scope: vec![] }
    }

    pub fn push(&mut self, op: Op, ty: Ty, shape: Vec<DimId>, tokens: &TokenStream) -> usize {
        self.nodes.push(Node { op, ty, shape, tokens: tokens.clone() });
        self.nodes.len() - 1
    }

    pub fn is_named_dim(&self, name: &str) -> bool {
        self.dims.iter().any(|d| matches!(d, Dim::Named(n) if n == name))
    }

    pub fn named_dim_names(&self) -> Vec<String> {
        self.dims.iter().filter_map(|d| if let Dim::Named(n) = d { Some(n.clone()) } else { None }).collect()
    }

    pub fn shape_text(&self, shape: &[DimId]) -> String {
        let dims: Vec<String> = shape.iter().map(|&d| self.dims[d].to_string()).collect();
        format!("[{}]", dims.join(", "))
    }

    fn kernel(mut self, def: &KernelDef) -> Option<Kernel> {
        let errors_before = self.cx_len();
        self.signature(def);
        let outputs = self.output_types(def);
        let body = lower_body(&def.body, self.cx);
        for (name, e) in &body.lets {
            if let Some(id) = self.expr(e) {
                self.scope.push((name.to_string(), id));
            }
        }
        let tail = match &body.tail {
            Some(t) => t,
            None => {
                self.cx.at(def.body_span, "the kernel body must end with the expression it returns, with no `;` after it");
                return None;
            }
        };
        let outputs = self.outputs(def, outputs?, tail)?;
        if self.cx_len() != errors_before {
            return None;
        }
        let mut kernel = Kernel {
            attrs: def.attrs.clone(),
            vis: def.vis.clone(),
            name: def.name.clone(),
            dims: self.dims,
            params: self.params,
            outputs,
            tuple: matches!(def.output, crate::parse::Output::Tuple(_)),
            nodes: self.nodes,
            launch: crate::ir::Launch::Map { domain: vec![] },
        };
        kernel.launch = crate::fusion::launch(&kernel, tail, self.cx)?;
        Some(kernel)
    }

    fn cx_len(&self) -> usize {
        self.cx.len()
    }

    fn signature(&mut self, def: &KernelDef) {
        let mut names = HashSet::new();
        for p in &def.params {
            let name = p.name.to_string();
            if name == DEVICE_ARG {
                self.cx.spanned(&p.name, format!("the parameter name `{DEVICE_ARG}` is reserved for the device argument of the generated function; rename it"));
            } else if !names.insert(name.clone()) {
                self.cx.spanned(&p.name, format!("the parameter `{name}` is declared more than once; rename one"));
            }
            let elem = self.elem(&p.ty);
            let shape = p.ty.dims.as_ref().map(|dims| self.declare_dims(dims, true));
            let id = self.params.len();
            self.params.push(ParamInfo { name: p.name.clone(), elem: elem.unwrap_or(Elem::F32), shape: shape.clone() });
            let op = if shape.is_some() { Op::Load(id) } else { Op::Scalar(id) };
            let tokens = quote::ToTokens::to_token_stream(&p.name);
            let node = self.push(op, Ty::Elem(elem.unwrap_or(Elem::F32)), shape.unwrap_or_default(), &tokens);
            self.scope.push((name, node));
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
                DimDecl::Named(n) => Dim::Named(n.to_string()),
                DimDecl::Fixed(lit) => match lit.base10_parse::<u64>() {
                    Ok(v) if lit.suffix().is_empty() || lit.suffix() == "usize" => Dim::Fixed(v),
                    _ => {
                        self.cx.spanned(lit, "a fixed dim is a plain integer literal, such as `4`");
                        continue;
                    }
                },
            };
            let id = match self.dims.iter().position(|x| *x == dim) {
                Some(id) => id,
                None if binds || matches!(dim, Dim::Fixed(_)) => {
                    self.dims.push(dim.clone());
                    self.dims.len() - 1
                }
                None => {
                    self.cx.spanned(d.tokens(), format!("the output dim `{dim}` is not bound by any input; every named dim of an output must appear in an input's type"));
                    continue;
                }
            };
            if shape.contains(&id) {
                self.cx.spanned(d.tokens(), format!("the dim `{dim}` appears twice in one tensor type; each axis of a tensor needs its own dim name"));
                continue;
            }
            shape.push(id);
        }
        shape
    }

    fn output_types(&mut self, def: &KernelDef) -> Option<Vec<(Elem, Vec<DimId>)>> {
        let types: Vec<Option<(Elem, Vec<DimId>)>> = def
            .output
            .types()
            .into_iter()
            .map(|t| {
                let elem = self.elem(t);
                let shape = t.dims.as_ref().map(|d| self.declare_dims(d, false)).unwrap_or_default();
                Some((elem?, shape))
            })
            .collect();
        types.into_iter().collect()
    }

    /// Matches the tail expression against the declared outputs.
    fn outputs(&mut self, def: &KernelDef, declared: Vec<(Elem, Vec<DimId>)>, tail: &Expr) -> Option<Vec<OutputInfo>> {
        let items: Vec<&Expr> = match &tail.kind {
            ExprKind::Tuple(items) => items.iter().collect(),
            _ => vec![tail],
        };
        let ids: Vec<Option<usize>> = items.iter().map(|e| self.expr(e)).collect();
        if items.len() != declared.len() {
            let message = format!(
                "the signature declares {} output{} but the body returns {}; return a tuple with one value per output",
                declared.len(),
                if declared.len() == 1 { "" } else { "s" },
                items.len()
            );
            self.cx.spanned(&tail.tokens, message);
            self.cx.spanned(&def.output_tokens, "the declared outputs are here");
            return None;
        }
        let ids: Vec<usize> = ids.into_iter().collect::<Option<_>>()?;
        self.default_literals(&ids, &declared);
        let mut outputs = vec![];
        for ((&id, (elem, shape)), e) in ids.iter().zip(declared).zip(items) {
            let node = &self.nodes[id];
            if node.elem() != elem || node.shape != shape {
                let (want, got) = (self.type_text(elem, &shape), self.type_text(node.elem(), &node.shape.clone()));
                let message = format!("mismatched output type: the signature declares `{want}` but this computes `{got}`");
                self.cx.spanned(&e.tokens, message);
                continue;
            }
            outputs.push(OutputInfo { elem, shape, node: id });
        }
        Some(outputs)
    }

    /// Outputs give their literals the declared type; every other literal takes Rust's default.
    fn default_literals(&mut self, ids: &[usize], declared: &[(Elem, Vec<DimId>)]) {
        for (&id, (elem, _)) in ids.iter().zip(declared) {
            if self.nodes[id].ty.is_literal() {
                self.coerce_or_report(id, *elem);
            }
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
        let dims: Vec<String> = shape.iter().map(|&d| self.dims[d].to_string()).collect();
        format!("[{elem}; {}]", dims.join(", "))
    }
}

impl DimDecl {
    fn tokens(&self) -> TokenStream {
        match self {
            DimDecl::Named(n) => quote::ToTokens::to_token_stream(n),
            DimDecl::Fixed(l) => quote::ToTokens::to_token_stream(l),
        }
    }
}
