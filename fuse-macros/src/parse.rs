//! The syntax tree of a `fuse!` block. Kernel signatures use the language's own type syntax
//! (`[f32; rows, cols]`), parsed here by hand; bodies are Rust expressions, parsed by syn and then
//! lowered to [`Expr`], which keeps only what the language has. Every node keeps its tokens so that
//! errors point at exactly the offending code.

use crate::error::{self, tokens, Errors};
use crate::limits::MAX_EXPR_DEPTH;
use crate::ty::Elem;
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, LitInt, Token, Visibility};

/// The whole macro input: a list of kernels.
pub struct Input {
    pub kernels: Vec<KernelDef>,
}

pub struct KernelDef {
    pub attrs: Vec<Attribute>,
    /// `#[fast_math]`: f32 math through CUDA's fast intrinsics (see `doc/language.md`).
    pub fast_math: bool,
    /// `#[vjp(a, ..)]` and `#[jvp(a, ..)]`: the derivatives to generate (see `grad/`).
    pub derive: Vec<DeriveAttr>,
    pub vis: Visibility,
    pub name: Ident,
    pub params: Vec<Param>,
    pub output: Output,
    pub output_tokens: TokenStream,
    pub body: Vec<syn::Stmt>,
    pub body_span: Span,
}

pub struct Param {
    pub name: Ident,
    pub ty: TypeDecl,
    /// The tokens of `&mut` before a tensor type: a parameter the kernel writes through
    /// `p[items] = value;`.
    pub written: Option<TokenStream>,
}

/// A declared type: `T` (a scalar) or `[T; d1, .., dk]` (a tensor).
pub struct TypeDecl {
    pub elem: ElemName,
    pub dims: Option<Vec<DimDecl>>,
}

/// An element type as written; [`crate::check`] resolves it.
pub struct ElemName {
    pub ty: syn::Type,
}

impl ElemName {
    /// The element type, or `None` if it is not one of the language's.
    pub fn resolve(&self) -> Option<Elem> {
        match &self.ty {
            syn::Type::Path(p) if p.qself.is_none() => p
                .path
                .get_ident()
                .and_then(|i| Elem::from_name(&i.to_string())),
            _ => None,
        }
    }
}

pub enum DimDecl {
    Named(Ident),
    Fixed(LitInt),
    /// A dim written as an expression of dims, `2 * d`, `h + p` or `d * 2`: [`crate::check`]
    /// reads it (see "Slices" in `doc/language.md`).
    Composite(Box<syn::Expr>),
}

/// The declared outputs: one type, or a tuple of them.
pub struct Output {
    pub types: Vec<TypeDecl>,
    pub tuple: bool,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut kernels = Vec::new();
        while !input.is_empty() {
            kernels.push(input.parse()?);
        }
        Ok(Input { kernels })
    }
}

/// Parses the macro's input, after checking it against the limits that syn's parser needs.
pub fn parse_input(tokens: TokenStream) -> syn::Result<Input> {
    crate::limits::check_tokens(&tokens)?;
    syn::parse2(tokens)
}

/// A `#[vjp(..)]` or `#[jvp(..)]` attribute: which mode, the names listed, and the attribute's
/// tokens (where errors about it point).
pub struct DeriveAttr {
    pub reverse: bool,
    pub names: Vec<Ident>,
    pub tokens: TokenStream,
}

/// Takes `#[vjp(..)]` and `#[jvp(..)]` out of a kernel's attributes: each lists parameter names,
/// at least one.
fn derive_attrs(attrs: &mut Vec<Attribute>) -> syn::Result<Vec<DeriveAttr>> {
    let mut found = vec![];
    let mut kept = vec![];
    for attr in attrs.drain(..) {
        let reverse = attr.path().is_ident("vjp");
        if !reverse && !attr.path().is_ident("jvp") {
            kept.push(attr);
            continue;
        }
        let mode = if reverse { "vjp" } else { "jvp" };
        let usage = format!(
            "`#[{mode}(..)]` lists the float parameters to differentiate with respect to, as in `#[{mode}(x, w)]`"
        );
        let syn::Meta::List(list) = &attr.meta else {
            return Err(syn::Error::new_spanned(&attr, usage));
        };
        let names = list
            .parse_args_with(Punctuated::<Ident, Token![,]>::parse_terminated)
            .map_err(|e| syn::Error::new(e.span(), &usage))?;
        if names.is_empty() {
            return Err(syn::Error::new_spanned(&attr, usage));
        }
        found.push(DeriveAttr {
            reverse,
            names: names.into_iter().collect(),
            tokens: attr.to_token_stream(),
        });
    }
    *attrs = kept;
    Ok(found)
}

/// Takes `#[fast_math]` out of a kernel's attributes (the others go on the generated fn).
fn fast_math(attrs: &mut Vec<Attribute>) -> syn::Result<bool> {
    let mut found = false;
    let mut kept = vec![];
    for attr in attrs.drain(..) {
        if !attr.path().is_ident("fast_math") {
            kept.push(attr);
            continue;
        }
        if !matches!(attr.meta, syn::Meta::Path(_)) {
            return Err(syn::Error::new_spanned(
                attr,
                "`#[fast_math]` takes no arguments: it applies to every f32 function of this kernel",
            ));
        }
        found = true;
    }
    *attrs = kept;
    Ok(found)
}

impl Parse for KernelDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut attrs = input.call(Attribute::parse_outer)?;
        let fast_math = fast_math(&mut attrs)?;
        let derive = derive_attrs(&mut attrs)?;
        let vis: Visibility = input.parse()?;
        input.parse::<Token![fn]>()?;
        let name: Ident = input.parse()?;
        let content;
        syn::parenthesized!(content in input);
        let params = Punctuated::<Param, Token![,]>::parse_terminated(&content)?;
        // No `->`: a kernel that only writes through its `&mut` parameters (checked there).
        let (output, output_tokens) = match input.peek(Token![->]) {
            true => {
                input.parse::<Token![->]>()?;
                let output_fork = input.fork();
                let output = parse_output(input)?;
                (output, tokens_between(&output_fork, input))
            }
            false => (
                Output {
                    types: vec![],
                    tuple: false,
                },
                TokenStream::new(),
            ),
        };
        let body: proc_macro2::Group = input.parse()?;
        if body.delimiter() != proc_macro2::Delimiter::Brace {
            return Err(syn::Error::new(
                body.span(),
                "expected `{` and the kernel's body",
            ));
        }
        let brace_span = body.delim_span();
        let body = syn::parse::Parser::parse2(syn::Block::parse_within, slices(body.stream()))?;
        Ok(KernelDef {
            attrs,
            fast_math,
            derive,
            vis,
            name,
            params: params.into_iter().collect(),
            output,
            output_tokens,
            body,
            body_span: brace_span.join(),
        })
    }
}

/// Wraps the items of each multi-dim slice, `x[.., ..d]`, in parentheses, `x[(.., ..d)]`, so that
/// syn parses it (as an index by a tuple) and [`lower_index`] sees every item with its tokens. A
/// bracket is a slice where it follows a name or a closing bracket or parenthesis (an index) and
/// holds a comma outside any group; an array literal (not in the language) follows neither.
fn slices(tokens: TokenStream) -> TokenStream {
    use proc_macro2::{Delimiter, Group, TokenTree};
    let mut out: Vec<TokenTree> = vec![];
    for tt in tokens {
        let tt = match tt {
            TokenTree::Group(g) => {
                let indexes = matches!(
                    out.last(),
                    Some(TokenTree::Ident(_)) | Some(TokenTree::Group(_))
                );
                let commas = g
                    .stream()
                    .into_iter()
                    .any(|t| matches!(&t, TokenTree::Punct(p) if p.as_char() == ','));
                let inner = slices(g.stream());
                let inner = match g.delimiter() == Delimiter::Bracket && indexes && commas {
                    true => {
                        let mut tuple = Group::new(Delimiter::Parenthesis, inner);
                        tuple.set_span(g.span());
                        TokenStream::from(TokenTree::Group(tuple))
                    }
                    false => inner,
                };
                let mut group = Group::new(g.delimiter(), inner);
                group.set_span(g.span());
                TokenTree::Group(group)
            }
            other => other,
        };
        out.push(tt);
    }
    out.into_iter().collect()
}

fn tokens_between(start: ParseStream, end: ParseStream) -> TokenStream {
    let mut out = TokenStream::new();
    let mut cursor = start.cursor();
    while cursor != end.cursor() {
        let Some((tt, next)) = cursor.token_tree() else {
            break;
        };
        out.extend([tt]);
        cursor = next;
    }
    out
}

impl Parse for Param {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let written = match input.peek(Token![&]) {
            true => {
                let fork = input.fork();
                input.parse::<Token![&]>()?;
                input.parse::<Token![mut]>().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "a parameter that the kernel writes is `&mut [T; dims]`, as in `cache: &mut [f32; slots, d]`; the others are taken by value, as `[f32; n]` or `f32`",
                    )
                })?;
                Some(tokens_between(&fork, input))
            }
            false => None,
        };
        let ty = input.parse()?;
        Ok(Param { name, ty, written })
    }
}

fn parse_output(input: ParseStream) -> syn::Result<Output> {
    if input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in input);
        let items = Punctuated::<TypeDecl, Token![,]>::parse_terminated(&content)?;
        let tuple = items.len() != 1 || items.trailing_punct();
        let types: Vec<TypeDecl> = items.into_iter().collect();
        return Ok(Output { types, tuple });
    }
    Ok(Output {
        types: vec![input.parse()?],
        tuple: false,
    })
}

impl Parse for TypeDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if !input.peek(syn::token::Bracket) {
            let ty: syn::Type = input.parse()?;
            return Ok(TypeDecl {
                elem: ElemName { ty },
                dims: None,
            });
        }
        let content;
        syn::bracketed!(content in input);
        let ty: syn::Type = content.parse()?;
        content.parse::<Token![;]>().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected `;` and the dims of the tensor, as in `[f32; rows, cols]`",
            )
        })?;
        let dims = Punctuated::<DimDecl, Token![,]>::parse_terminated(&content)?;
        Ok(TypeDecl {
            elem: ElemName { ty },
            dims: Some(dims.into_iter().collect()),
        })
    }
}

impl Parse for DimDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let alone = |input: ParseStream| {
            let fork = input.fork();
            let _: proc_macro2::TokenTree = fork.parse()?;
            Ok::<bool, syn::Error>(fork.is_empty() || fork.peek(Token![,]))
        };
        if (input.peek(LitInt) || input.peek(Ident)) && !alone(input)? {
            return Ok(DimDecl::Composite(Box::new(input.parse()?)));
        }
        if input.peek(LitInt) {
            return Ok(DimDecl::Fixed(input.parse()?));
        }
        if input.peek(Ident) {
            return Ok(DimDecl::Named(input.parse()?));
        }
        Err(input.error("expected a dim: a name such as `rows` or an integer literal such as `4`"))
    }
}

/// An expression of the language.
pub struct Expr {
    pub kind: ExprKind,
    pub tokens: TokenStream,
}

pub enum ExprKind {
    Int {
        value: i128,
        suffix: Option<Elem>,
    },
    Float {
        digits: String,
        suffix: Option<Elem>,
    },
    Bool(bool),
    /// An associated constant of an element type, such as `f32::INFINITY` or `u32::MAX`.
    Const {
        elem: Elem,
        value: crate::consts::Value,
    },
    Var(Ident),
    /// `w[i]`, `w[i][j]`: an element of a tensor, the indices outermost first.
    Index(Box<Expr>, Vec<Index>),
    /// `x[.., ..d]`: a slice of a tensor, one item for each of its dims.
    Slice(Box<Expr>, Vec<SliceItem>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>, TokenStream),
    Cast(Box<Expr>, ElemName),
    If(Box<Expr>, Box<Expr>, Box<Expr>),
    Call(Ident, Vec<Expr>),
    Method(Box<Expr>, Ident, Vec<Expr>),
    Tuple(Vec<Expr>),
}

/// One item of a slice, `x[.., ..d]`, and its tokens (where errors about it point).
pub struct SliceItem {
    pub kind: SliceKind,
    pub tokens: TokenStream,
}

pub enum SliceKind {
    /// `..`: the whole dim.
    Full,
    /// `a..b`, `..b`, `a..`: a part of a dim made of parts, its bounds expressions of dims
    /// (`d`, `2 * d`, `h + p`), checked against the parts.
    Range(Option<Box<syn::Expr>>, Option<Box<syn::Expr>>),
    /// `(j..).step_by(k)` (or `(..).step_by(k)` for `j` = 0): element `j` of every group of
    /// `k` in a dim `d * k`.
    Step(u64, u64),
    /// Any other expression: an integer value whose elements pick the dim's elements, a gather
    /// (`emb[tokens, ..]`, `logits[.., labels]`).
    Gather(Box<Expr>),
}

/// An index, an integer literal, and its tokens (where errors about it point).
pub struct Index {
    pub value: u64,
    pub tokens: TokenStream,
}

impl Index {
    /// The slice item that gathers at this literal: `x[0]` along a dim of named size.
    pub fn as_gather(&self) -> SliceItem {
        let literal = Expr {
            kind: ExprKind::Int {
                value: i128::from(self.value),
                suffix: None,
            },
            tokens: self.tokens.clone(),
        };
        SliceItem {
            kind: SliceKind::Gather(Box::new(literal)),
            tokens: self.tokens.clone(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    And,
    Or,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinOp {
    pub fn is_comparison(self) -> bool {
        use BinOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }

    pub fn symbol(self) -> &'static str {
        use BinOp::*;
        match self {
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            Rem => "%",
            And => "&&",
            Or => "||",
            BitAnd => "&",
            BitOr => "|",
            BitXor => "^",
            Shl => "<<",
            Shr => ">>",
            Eq => "==",
            Ne => "!=",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
        }
    }
}

/// A kernel body: `let` bindings in order, then the tail expression.
pub struct Body {
    pub lets: Vec<(Ident, Expr)>,
    /// `p[items] = value;` statements, each with the number of `let`s before it.
    pub writes: Vec<(usize, Write)>,
    pub tail: Option<Expr>,
    /// Names whose `let` had an error, with the number of `let`s before each: later uses of them
    /// are not errors again.
    pub poisoned: Vec<(usize, Ident)>,
    /// Whether the body ends in an expression, even one that did not lower (its error is in `cx`).
    pub has_tail: bool,
}

/// `p[items] = value;`: a write through a `&mut` parameter.
pub struct Write {
    pub target: Expr,
    pub value: Expr,
    pub tokens: TokenStream,
}

/// Lowers a body's statements, reporting every construct the language does not have.
pub fn lower_body(stmts: &[syn::Stmt], cx: &mut Errors) -> Body {
    let cx = &mut Lowering {
        cx,
        depth: 0,
        too_deep: false,
    };
    let mut body = Body {
        lets: Vec::new(),
        writes: Vec::new(),
        tail: None,
        has_tail: false,
        poisoned: Vec::new(),
    };
    for (i, stmt) in stmts.iter().enumerate() {
        let last = i + 1 == stmts.len();
        match stmt {
            syn::Stmt::Local(local) => match lower_let(local, cx) {
                Ok(binding) => body.lets.push(binding),
                Err(Some(name)) => body.poisoned.push((body.lets.len(), name)),
                Err(None) => {}
            },
            syn::Stmt::Expr(syn::Expr::Assign(a), _) => {
                let target = lower_expr(&a.left, cx);
                let value = lower_expr(&a.right, cx);
                if let (Some(target), Some(value)) = (target, value) {
                    let tokens = tokens(a);
                    let write = Write {
                        target,
                        value,
                        tokens,
                    };
                    body.writes.push((body.lets.len(), write));
                }
            }
            syn::Stmt::Expr(e, None) if last => {
                body.has_tail = true;
                body.tail = lower_expr(e, cx);
            }
            syn::Stmt::Expr(e, _) => cx.spanned(e, statement_message(e)),
            syn::Stmt::Item(item) => cx.spanned(
                item,
                "items cannot be declared inside a kernel; declare them outside `fuse!`",
            ),
            syn::Stmt::Macro(m) => cx.spanned(&m.mac, UNSUPPORTED_MACRO),
        }
    }
    body
}

const UNSUPPORTED_MACRO: &str =
    "macros are not expanded inside a kernel; write the expression with the language's operators and functions";

/// A `let`'s name and value; on an error, the name if there is one.
fn lower_let(local: &syn::Local, cx: &mut Lowering) -> Result<(Ident, Expr), Option<Ident>> {
    let name = match &local.pat {
        syn::Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
            if let Some(m) = &p.mutability {
                cx.spanned(m, "`let mut` is not part of the language: values never change; bind a new name with `let`");
            }
            p.ident.clone()
        }
        syn::Pat::Type(t) => {
            cx.spanned(&t.ty, "type annotations on `let` are not supported; write `as T` on the value to convert it");
            return Err(match &*t.pat {
                syn::Pat::Ident(p) => Some(p.ident.clone()),
                _ => None,
            });
        }
        other => {
            cx.spanned(
                other,
                "expected a name: `let` binds one value to one name, as in `let e = x.exp();`",
            );
            return Err(None);
        }
    };
    let Some(init) = &local.init else {
        cx.spanned(local, "`let` needs a value, as in `let e = x.exp();`");
        return Err(Some(name));
    };
    if let Some((_, diverge)) = &init.diverge {
        cx.spanned(diverge, "`let ... else` is not part of the language");
    }
    match lower_expr(&init.expr, cx) {
        Some(e) => Ok((name, e)),
        None => Err(Some(name)),
    }
}

/// The state of lowering one body: the errors, and how deep the expression being lowered is.
struct Lowering<'a> {
    cx: &'a mut Errors,
    depth: usize,
    /// Whether the depth limit was reported: one error a body is enough.
    too_deep: bool,
}

impl std::ops::Deref for Lowering<'_> {
    type Target = Errors;

    fn deref(&self) -> &Errors {
        self.cx
    }
}

impl std::ops::DerefMut for Lowering<'_> {
    fn deref_mut(&mut self) -> &mut Errors {
        self.cx
    }
}

/// Lowers one expression; `None` if it (or a part) is not part of the language, or nests past
/// [`MAX_EXPR_DEPTH`], with the error in `cx`.
fn lower_expr(e: &syn::Expr, cx: &mut Lowering) -> Option<Expr> {
    if cx.depth == MAX_EXPR_DEPTH {
        return too_deep(e, cx);
    }
    cx.depth += 1;
    let lowered = lower_expr_within(e, cx);
    cx.depth -= 1;
    lowered
}

/// The error for `e`, nested past [`MAX_EXPR_DEPTH`]: once a kernel, at its operator.
fn too_deep<T>(e: &syn::Expr, cx: &mut Lowering) -> Option<T> {
    if !std::mem::replace(&mut cx.too_deep, true) {
        cx.at(operator_span(e), crate::error::expr_depth(MAX_EXPR_DEPTH));
    }
    None
}

/// The span of an expression's own operator or name, found without walking its operands: at
/// the depth limit they may nest far deeper still.
fn operator_span(e: &syn::Expr) -> Span {
    use syn::spanned::Spanned;
    match e {
        syn::Expr::Binary(b) => b.op.span(),
        syn::Expr::Unary(u) => u.op.span(),
        syn::Expr::Paren(p) => p.paren_token.span.open(),
        syn::Expr::Call(c) => c.paren_token.span.open(),
        syn::Expr::MethodCall(m) => m.method.span(),
        syn::Expr::Cast(c) => c.as_token.span,
        syn::Expr::If(i) => i.if_token.span,
        other => other.span(),
    }
}

fn lower_expr_within(e: &syn::Expr, cx: &mut Lowering) -> Option<Expr> {
    let kind = match e {
        syn::Expr::Lit(lit) => lower_lit(&lit.lit, cx)?,
        syn::Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
            ExprKind::Var(p.path.get_ident()?.clone())
        }
        syn::Expr::Path(p) => lower_path(p, cx)?,
        syn::Expr::Index(i) => lower_index(i, cx)?,
        syn::Expr::Paren(p) => return lower_expr(&p.expr, cx),
        syn::Expr::Group(g) => return lower_expr(&g.expr, cx),
        syn::Expr::Unary(u) => lower_unary(u, cx)?,
        syn::Expr::Binary(b) => lower_binary(b, cx)?,
        syn::Expr::Cast(c) => {
            let inner = lower_expr(&c.expr, cx);
            ExprKind::Cast(
                Box::new(inner?),
                ElemName {
                    ty: (*c.ty).clone(),
                },
            )
        }
        syn::Expr::If(i) => lower_if(i, cx)?,
        syn::Expr::Call(c) => lower_call(c, cx)?,
        syn::Expr::MethodCall(m) => lower_method(m, cx)?,
        syn::Expr::Tuple(t) => ExprKind::Tuple(lower_all(t.elems.iter(), cx)?),
        other => {
            cx.spanned(other, unsupported(other));
            return None;
        }
    };
    Some(Expr {
        kind,
        tokens: tokens(e),
    })
}

/// A path names a constant of an element type, as `f32::MAX`; any other is an error that lists
/// the constants.
fn lower_path(p: &syn::ExprPath, cx: &mut Errors) -> Option<ExprKind> {
    let segments: Vec<&syn::PathSegment> = p.path.segments.iter().collect();
    let plain = p.qself.is_none()
        && p.path.leading_colon.is_none()
        && segments.iter().all(|s| s.arguments.is_none());
    let elem = match segments.as_slice() {
        [ty, _] if plain => Elem::from_name(&ty.ident.to_string()),
        _ => None,
    };
    let Some(elem) = elem else {
        cx.spanned(p, error::unknown_path());
        return None;
    };
    let name = segments[1].ident.to_string();
    match crate::consts::lookup(elem, &name) {
        Some(value) => Some(ExprKind::Const { elem, value }),
        None => {
            cx.spanned(&segments[1].ident, error::unknown_constant(elem, &name));
            None
        }
    }
}

/// `w[i]` and `w[i][j]`: the indexed expression and the indices, each an integer literal; or a
/// slice, `x[.., ..d]`, whose items `slices` wrapped in a tuple.
fn lower_index(e: &syn::ExprIndex, cx: &mut Lowering) -> Option<ExprKind> {
    if let Some(items) = slice_items(&e.index) {
        if let syn::Expr::Index(inner) = &*e.expr {
            cx.spanned(inner, error::SLICE_OF_INDEX);
            return None;
        }
        let items: Vec<Option<SliceItem>> = items.into_iter().map(|i| slice_item(i, cx)).collect();
        let base = lower_expr(&e.expr, cx);
        let items = items.into_iter().collect::<Option<Vec<SliceItem>>>()?;
        return Some(ExprKind::Slice(Box::new(base?), items));
    }
    if let syn::Expr::Index(inner) = &*e.expr {
        if slice_items(&inner.index).is_some() {
            cx.spanned(e, error::SLICE_OF_INDEX);
            return None;
        }
    }
    // `x[idx]` with an index that is not a literal: a gather along `x`'s one dim.
    if !matches!(&*e.expr, syn::Expr::Index(_)) && literal_index(&e.index).is_none() {
        let item = gather_item(&e.index, cx);
        let base = lower_expr(&e.expr, cx);
        return Some(ExprKind::Slice(Box::new(base?), vec![item?]));
    }
    let mut indices = vec![&*e.index];
    let mut base = &*e.expr;
    while let syn::Expr::Index(i) = base {
        indices.push(&*i.index);
        base = &i.expr;
    }
    indices.reverse();
    let indices: Vec<Option<Index>> = indices.into_iter().map(|i| index(i, cx)).collect();
    let base = lower_expr(base, cx);
    let indices = indices.into_iter().collect::<Option<Vec<Index>>>()?;
    Some(ExprKind::Index(Box::new(base?), indices))
}

/// The items of `x[..]` if it is a slice: a tuple of them, one range, or one `step_by`.
fn slice_items(index: &syn::Expr) -> Option<Vec<&syn::Expr>> {
    match index {
        syn::Expr::Tuple(t) => Some(t.elems.iter().collect()),
        syn::Expr::Range(_) => Some(vec![index]),
        syn::Expr::MethodCall(m) if m.method == "step_by" => Some(vec![index]),
        _ => None,
    }
}

/// An index of a gather: any expression, checked as an integer value.
fn gather_item(e: &syn::Expr, cx: &mut Lowering) -> Option<SliceItem> {
    let index = lower_expr(e, cx)?;
    Some(SliceItem {
        kind: SliceKind::Gather(Box::new(index)),
        tokens: tokens(e),
    })
}

/// One item of a slice: `..`, a range of dims, `(j..).step_by(k)`, or an index (a gather).
fn slice_item(e: &syn::Expr, cx: &mut Lowering) -> Option<SliceItem> {
    let kind = match e {
        syn::Expr::Range(r) if matches!(r.limits, syn::RangeLimits::Closed(_)) => {
            cx.spanned(e, error::SLICE_CLOSED_RANGE);
            return None;
        }
        syn::Expr::Range(r) if r.start.is_none() && r.end.is_none() => SliceKind::Full,
        syn::Expr::Range(r) => {
            // The bounds stay syn's expressions, which are copied and printed recursively: one
            // nested past the limit is an error before either (seed 58: a bound of 1490 chained
            // `.exp()` calls overflowed the fuzzer's stack).
            if let Some(deep) = [&r.start, &r.end]
                .into_iter()
                .flatten()
                .find(|b| nests_too_deep(b))
            {
                return too_deep(deep, cx);
            }
            SliceKind::Range(r.start.clone(), r.end.clone())
        }
        syn::Expr::MethodCall(m) if m.method == "step_by" => step_by(m, cx)?,
        _ => return gather_item(e, cx),
    };
    Some(SliceItem {
        kind,
        tokens: tokens(e),
    })
}

/// Whether `e` nests deeper than [`MAX_EXPR_DEPTH`] (operators, calls, method chains, casts,
/// indices and parentheses each a level, as [`lower_expr`] counts them), walked without
/// recursion: it may nest far deeper than a stack holds.
fn nests_too_deep(e: &syn::Expr) -> bool {
    use syn::Expr as E;
    let mut open = vec![(e, 1)];
    while let Some((e, depth)) = open.pop() {
        if depth > MAX_EXPR_DEPTH {
            return true;
        }
        let mut inner: Vec<&syn::Expr> = vec![];
        match e {
            E::Binary(b) => inner.extend([&*b.left, &*b.right]),
            E::Unary(u) => inner.push(&u.expr),
            E::Paren(p) => inner.push(&p.expr),
            E::Group(g) => inner.push(&g.expr),
            E::Cast(c) => inner.push(&c.expr),
            E::Field(f) => inner.push(&f.base),
            E::Index(i) => inner.extend([&*i.expr, &*i.index]),
            E::MethodCall(m) => inner.extend(std::iter::once(&*m.receiver).chain(&m.args)),
            E::Call(c) => inner.extend(std::iter::once(&*c.func).chain(&c.args)),
            E::Range(r) => inner.extend(r.start.iter().chain(&r.end).map(|b| &**b)),
            E::Tuple(t) => inner.extend(&t.elems),
            E::Array(a) => inner.extend(&a.elems),
            // Blocks nest in braces, which `limits::MAX_GROUP_DEPTH` bounds.
            _ => {}
        }
        open.extend(inner.into_iter().map(|x| (x, depth + 1)));
    }
    false
}

/// `(j..).step_by(k)`: both literals, `j` optional.
fn step_by(m: &syn::ExprMethodCall, cx: &mut Errors) -> Option<SliceKind> {
    let literal = literal_index;
    let mut receiver = &*m.receiver;
    while let syn::Expr::Paren(p) = receiver {
        receiver = &p.expr;
    }
    let start = match receiver {
        syn::Expr::Range(r)
            if r.end.is_none() && !matches!(r.limits, syn::RangeLimits::Closed(_)) =>
        {
            match &r.start {
                None => Some(0),
                Some(s) => literal(s),
            }
        }
        _ => None,
    };
    let step = match (m.args.len(), m.args.first()) {
        (1, Some(a)) => literal(a),
        _ => None,
    };
    match (start, step) {
        (Some(start), Some(step)) => Some(SliceKind::Step(start, step)),
        _ => {
            cx.spanned(m, error::SLICE_STEP);
            None
        }
    }
}

/// The value of a plain integer literal (or one of type `usize`, as Rust's) used as an index.
fn literal_index(e: &syn::Expr) -> Option<u64> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) if matches!(i.suffix(), "" | "usize") => i.base10_parse::<u64>().ok(),
        _ => None,
    }
}

/// An index: a plain integer literal (or one of type `usize`, as Rust's).
fn index(e: &syn::Expr, cx: &mut Errors) -> Option<Index> {
    let value = literal_index(e);
    if value.is_none() {
        cx.spanned(e, error::INDEX_NOT_LITERAL);
    }
    Some(Index {
        value: value?,
        tokens: tokens(e),
    })
}

fn lower_all<'a>(
    exprs: impl Iterator<Item = &'a syn::Expr>,
    cx: &mut Lowering,
) -> Option<Vec<Expr>> {
    let lowered: Vec<Option<Expr>> = exprs.map(|e| lower_expr(e, cx)).collect();
    lowered.into_iter().collect()
}

fn lower_lit(lit: &syn::Lit, cx: &mut Errors) -> Option<ExprKind> {
    match lit {
        syn::Lit::Int(i) => {
            let suffix = lit_suffix(i.suffix(), lit, cx)?;
            if suffix.is_some_and(Elem::is_float) {
                let digits = i.base10_digits().to_string();
                return Some(ExprKind::Float { digits, suffix });
            }
            match i.base10_parse::<i128>() {
                Ok(value) => Some(ExprKind::Int { value, suffix }),
                Err(_) => {
                    cx.spanned(i, "integer literal is too large for any element type");
                    None
                }
            }
        }
        syn::Lit::Float(f) => {
            let suffix = lit_suffix(f.suffix(), lit, cx)?;
            if suffix.is_some_and(|s| !s.is_float()) {
                cx.spanned(
                    f,
                    format!("a float literal cannot have the suffix `{}`", f.suffix()),
                );
                return None;
            }
            Some(ExprKind::Float {
                digits: f.base10_digits().to_string(),
                suffix,
            })
        }
        syn::Lit::Bool(b) => Some(ExprKind::Bool(b.value)),
        other => {
            cx.spanned(
                other,
                "only number and `bool` literals are part of the language",
            );
            None
        }
    }
}

fn lit_suffix(suffix: &str, lit: &syn::Lit, cx: &mut Errors) -> Option<Option<Elem>> {
    if suffix.is_empty() {
        return Some(None);
    }
    match Elem::from_name(suffix) {
        Some(e) if e != Elem::Bool => Some(Some(e)),
        _ => {
            cx.spanned(
                lit,
                format!(
                    "unsupported literal suffix `{suffix}`; the element types are {}",
                    Elem::list_text(Elem::is_numeric)
                ),
            );
            None
        }
    }
}

fn lower_unary(u: &syn::ExprUnary, cx: &mut Lowering) -> Option<ExprKind> {
    let op = match u.op {
        syn::UnOp::Neg(_) => UnOp::Neg,
        syn::UnOp::Not(_) => UnOp::Not,
        _ => {
            cx.spanned(
                u.op,
                "dereferencing is not part of the language: tensors and scalars are used by value",
            );
            return None;
        }
    };
    let inner = lower_expr(&u.expr, cx)?;
    // Fold `-literal` so that `-2147483648i32` is in range, as in Rust.
    if let (UnOp::Neg, ExprKind::Int { value, suffix }) = (op, &inner.kind) {
        return Some(ExprKind::Int {
            value: -value,
            suffix: *suffix,
        });
    }
    Some(ExprKind::Unary(op, Box::new(inner)))
}

fn lower_binary(b: &syn::ExprBinary, cx: &mut Lowering) -> Option<ExprKind> {
    use syn::BinOp as S;
    let op = match b.op {
        S::Add(_) => BinOp::Add,
        S::Sub(_) => BinOp::Sub,
        S::Mul(_) => BinOp::Mul,
        S::Div(_) => BinOp::Div,
        S::Rem(_) => BinOp::Rem,
        S::And(_) => BinOp::And,
        S::Or(_) => BinOp::Or,
        S::BitAnd(_) => BinOp::BitAnd,
        S::BitOr(_) => BinOp::BitOr,
        S::BitXor(_) => BinOp::BitXor,
        S::Shl(_) => BinOp::Shl,
        S::Shr(_) => BinOp::Shr,
        S::Eq(_) => BinOp::Eq,
        S::Ne(_) => BinOp::Ne,
        S::Lt(_) => BinOp::Lt,
        S::Le(_) => BinOp::Le,
        S::Gt(_) => BinOp::Gt,
        S::Ge(_) => BinOp::Ge,
        _ => {
            cx.spanned(b.op, ASSIGNMENT);
            return None;
        }
    };
    let lhs = lower_expr(&b.left, cx);
    let rhs = lower_expr(&b.right, cx);
    Some(ExprKind::Binary(
        op,
        Box::new(lhs?),
        Box::new(rhs?),
        tokens(&b.op),
    ))
}

const ASSIGNMENT: &str =
    "assignment is not part of the language: values never change; bind a new name with `let`";

fn lower_if(i: &syn::ExprIf, cx: &mut Lowering) -> Option<ExprKind> {
    let cond = lower_expr(&i.cond, cx);
    let then = lower_block(&i.then_branch, cx);
    let Some((_, els)) = &i.else_branch else {
        cx.spanned(
            i,
            "`if` without `else`: an `if` selects between two values, so it needs both branches, as in `if c { a } else { b }`",
        );
        return None;
    };
    let els = match &**els {
        syn::Expr::Block(b) if b.attrs.is_empty() && b.label.is_none() => lower_block(&b.block, cx),
        other => lower_expr(other, cx),
    };
    Some(ExprKind::If(
        Box::new(cond?),
        Box::new(then?),
        Box::new(els?),
    ))
}

fn lower_block(block: &syn::Block, cx: &mut Lowering) -> Option<Expr> {
    match block.stmts.as_slice() {
        [syn::Stmt::Expr(e, None)] => lower_expr(e, cx),
        _ => {
            cx.spanned(block, "a branch of `if` holds one expression, as in `if c { a } else { b }`; bind values with `let` before the `if`");
            None
        }
    }
}

fn lower_call(c: &syn::ExprCall, cx: &mut Lowering) -> Option<ExprKind> {
    let func = match &*c.func {
        syn::Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
            p.path.get_ident()?.clone()
        }
        other => {
            cx.spanned(other, "expected a function name such as `exp` or `sum`; paths and closures are not part of the language");
            return None;
        }
    };
    Some(ExprKind::Call(func, lower_all(c.args.iter(), cx)?))
}

fn lower_method(m: &syn::ExprMethodCall, cx: &mut Lowering) -> Option<ExprKind> {
    if let Some(turbofish) = &m.turbofish {
        cx.spanned(turbofish, "generic arguments are not part of the language");
        return None;
    }
    let recv = lower_expr(&m.receiver, cx);
    let args = lower_all(m.args.iter(), cx);
    Some(ExprKind::Method(Box::new(recv?), m.method.clone(), args?))
}

/// The message for an expression used as a statement before the end of the body.
fn statement_message(e: &syn::Expr) -> &'static str {
    use syn::Expr as E;
    match e {
        E::ForLoop(_) | E::While(_) | E::Loop(_) | E::Assign(_) | E::Macro(_) | E::Return(_) => unsupported(e),
        E::Binary(b) if is_compound_assignment(&b.op) => ASSIGNMENT,
        _ => "an expression statement has no effect in a kernel; bind it with `let` or make it the final expression",
    }
}

fn is_compound_assignment(op: &syn::BinOp) -> bool {
    use syn::BinOp as S;
    matches!(
        op,
        S::AddAssign(_)
            | S::SubAssign(_)
            | S::MulAssign(_)
            | S::DivAssign(_)
            | S::RemAssign(_)
            | S::BitXorAssign(_)
            | S::BitAndAssign(_)
            | S::BitOrAssign(_)
            | S::ShlAssign(_)
            | S::ShrAssign(_)
    )
}

/// The message for a Rust expression the language does not have, saying what to write instead.
fn unsupported(e: &syn::Expr) -> &'static str {
    use syn::Expr as E;
    match e {
        E::ForLoop(_) | E::While(_) | E::Loop(_) => {
            "loops are not part of the language: a kernel body is already applied to every element; write it for one element, and reduce with `sum(e, dim)` and friends"
        }
        E::Closure(_) => "closures are not part of the language; write the expression inline or bind it with `let`",
        E::Reference(_) => "references are not part of the language: tensors and scalars are used by value",
        E::Assign(_) => ASSIGNMENT,
        E::Macro(_) => UNSUPPORTED_MACRO,
        E::Return(_) => "`return` is not part of the language: write the value as the final expression of the body, without `return` and `;`",
        E::Block(_) | E::Unsafe(_) => "blocks are not part of the language; bind values with `let` in the kernel body",
        E::Match(_) => "`match` is not part of the language; use `if c { a } else { b }`",
        E::Field(_) => "fields are not part of the language; return several outputs as a tuple `(a, b)`",
        E::Array(_) | E::Repeat(_) => "array literals are not part of the language; pass the values as a tensor parameter",
        E::Range(_) => "ranges are not part of the language: a kernel body is already applied to every element",
        _ => "this expression is not part of the language; a kernel body is built from parameters, literals, operators, `as`, `if`/`else`, and functions such as `exp` and `sum`",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn kernel(tokens: TokenStream) -> KernelDef {
        syn::parse2(tokens).expect("parses")
    }

    #[test]
    fn parses_tensor_and_scalar_params_and_tuple_outputs() {
        let k = kernel(quote! {
            /// doc
            pub fn ln(x: [f32; rows, cols], g: [f32; 4], eps: f32) -> ([f32; rows, cols], [f32; rows]) { x }
        });
        assert_eq!(k.name, "ln");
        assert_eq!(k.params.len(), 3);
        assert_eq!(k.params[0].ty.dims.as_ref().map(Vec::len), Some(2));
        assert!(matches!(
            k.params[1].ty.dims.as_deref(),
            Some([DimDecl::Fixed(_)])
        ));
        assert!(k.params[2].ty.dims.is_none());
        assert_eq!(k.params[2].ty.elem.resolve(), Some(Elem::F32));
        assert!(k.output.tuple && k.output.types.len() == 2);
        assert_eq!(k.attrs.len(), 1);
    }

    #[test]
    fn lowers_the_language_and_rejects_the_rest() {
        let k = kernel(quote! {
            fn f(x: [f32; n]) -> [f32; n] {
                let a = -(x.exp() + 1.0) as f64;
                for i in 0..3 {}
                let b = x.0;
                if a > 0.0 { a } else { sum(x) }
            }
        });
        let mut cx = Errors::default();
        let body = lower_body(&k.body, &mut cx);
        assert_eq!(body.lets.len(), 1);
        assert!(body.tail.is_some());
        let errors: Vec<String> = cx
            .propagate()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("loops"), "{errors:?}");
        assert!(errors[1].starts_with("fields"), "{errors:?}");
    }

    #[test]
    fn negative_literals_fold() {
        let k = kernel(quote!(
            fn f() -> i32 {
                -2147483648i32
            }
        ));
        let mut cx = Errors::default();
        let lowered = lower_body(&k.body, &mut cx).tail.unwrap();
        assert!(matches!(
            lowered.kind,
            ExprKind::Int {
                value: -2147483648,
                suffix: Some(Elem::I32)
            }
        ));
    }
}
