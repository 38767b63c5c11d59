//! The checked kernel: typed values in a `Vec`, referred to by index, in dependency order.

use crate::func::Func;
use crate::parse::{BinOp, UnOp};
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;
use syn::{Attribute, Ident, Visibility};

pub type NodeId = usize;
pub type DimId = usize;

/// An identifier's text without `r#`: the name every backend and the runtime see.
pub fn plain_name(ident: &Ident) -> String {
    use syn::ext::IdentExt;
    ident.unraw().to_string()
}

/// Whether `short`'s dims appear in `long` in the same order.
pub fn is_subsequence(short: &[DimId], long: &[DimId]) -> bool {
    let mut it = long.iter();
    short.iter().all(|d| it.any(|x| x == d))
}

/// A dim of the kernel: a name bound at launch, or a size fixed in the source, or a dim of a
/// parameter written as an expression of other dims (`2 * d`, `h + p`, `d * 2`), which only
/// slices read, or dims reduced together (`mean(x, (c, s))`) taken as one.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Dim {
    Named(String),
    Fixed(u64),
    Composite(Composite),
    /// Dims adjacent in every tensor that has them, in this order, which a reduction takes
    /// together (`mean(x, (c, s))`): one dim of their sizes' product, row-major, in place of
    /// them in every shape of the kernel. Signatures show the parts ([`Kernel::declared`]).
    Merged(Vec<DimId>),
}

/// A parameter's dim made of other dims, row-major: what its slices pick from.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Composite {
    /// `2 * h + p`: parts one after the other, `count` copies of dim `DimId` each, in order.
    Parts(Vec<(u64, DimId)>),
    /// `d * 2`: `d` groups of `k` adjacent elements; a slice picks one element of each group.
    Interleaved(DimId, u64),
}

impl Composite {
    /// The dims it is made of, with how many copies of each it holds.
    pub fn terms(&self) -> Vec<(u64, DimId)> {
        match self {
            Composite::Parts(parts) => parts.clone(),
            Composite::Interleaved(d, k) => vec![(*k, *d)],
        }
    }
}

/// A dim's text as the user writes it, given the names of the kernel's dims.
fn dim_text(dims: &[Dim], d: DimId) -> String {
    dims.get(d).map_or("?".into(), |x| x.text(dims))
}

impl Dim {
    /// The dim as written in a signature (`rows`, `4`, `2 * d + p`).
    pub fn text(&self, dims: &[Dim]) -> String {
        match self {
            Dim::Named(n) => n.clone(),
            Dim::Fixed(v) => v.to_string(),
            Dim::Composite(Composite::Interleaved(d, k)) => format!("{} * {k}", dim_text(dims, *d)),
            Dim::Composite(Composite::Parts(parts)) => {
                let terms: Vec<String> = parts
                    .iter()
                    .map(|&(count, d)| match count {
                        1 => dim_text(dims, d),
                        _ => format!("{count} * {}", dim_text(dims, d)),
                    })
                    .collect();
                terms.join(" + ")
            }
            Dim::Merged(parts) => {
                let names: Vec<String> = parts.iter().map(|&d| dim_text(dims, d)).collect();
                format!("({})", names.join(", "))
            }
        }
    }
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Dim::Named(n) => f.write_str(n),
            Dim::Fixed(v) => write!(f, "{v}"),
            // Without the kernel's dims the parts have no names; `Dim::text` has them.
            Dim::Composite(_) => f.write_str("(a composite dim)"),
            Dim::Merged(_) => f.write_str("(dims reduced together)"),
        }
    }
}

/// A sum of products of dim sizes, `2 * d_h * d_p + d_p`: a slice's offset or stride, in
/// elements. Each term is a coefficient and the dims whose sizes it multiplies.
pub type Linear = Vec<(u64, Vec<DimId>)>;

/// A slice of a tensor parameter (`x[.., ..d]`): the element at the current coordinates of the
/// node's shape is `p[offset + sum of coordinate * stride]`, with one stride for each dim of the
/// shape. No arithmetic on the value: a slice only moves the load.
///
/// A gather (`emb[tokens, ..]`) is a slice some of whose dims are picked by the values of
/// integer nodes: each such dim's coordinate is its node's value, and the nodes' dims are dims of
/// the slice's shape whose own strides are empty (they move the load only through the indices).
/// `cache[slot / bs, .., slot % bs, ..]` gathers along two dims, both by values over `slot`'s.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub offset: Linear,
    pub strides: Vec<Linear>,
    /// The gathered dims (a gather's in the parameter's order; the parts of dims reduced
    /// together in theirs); empty for a slice.
    pub gathers: Vec<Gather>,
}

impl View {
    /// A tensor laid out row-major over `layout`, read at the coordinates of `order` (the same
    /// dims, in any order): each dim's stride is the product of the sizes after it in `layout`.
    pub fn of_layout(layout: &[DimId], order: &[DimId]) -> View {
        let strides = order
            .iter()
            .map(|d| {
                let at = layout
                    .iter()
                    .position(|x| x == d)
                    .expect("a dim of the layout");
                vec![(1, layout[at + 1..].to_vec())]
            })
            .collect();
        View {
            offset: vec![],
            strides,
            gathers: vec![],
        }
    }

    /// Where the view of a parameter of dims `storage`, over `shape`, reads each element at
    /// the same coordinates in the parameter along every dim of `shape` (in any order: a
    /// permuted view), and picks each other dim of the parameter by an index over those dims
    /// (`x[.., labels]` with `labels: [n]` of `x: [n, v]`): each element of the parameter is
    /// then read by at most one element of the view, so a gradient goes back by a comparison.
    /// The picked dims with their indices, or `None` for a view that moves elements otherwise
    /// (a part or a step of a dim, an index with dims of its own).
    pub fn picks(&self, storage: &[DimId], shape: &[DimId]) -> Option<Vec<(DimId, NodeId)>> {
        let stride = |d: DimId| -> Option<Linear> {
            let at = storage.iter().position(|&x| x == d)?;
            Some(vec![(1, storage[at + 1..].to_vec())])
        };
        if self.offset.iter().any(|&(c, _)| c != 0) || shape.len() != self.strides.len() {
            return None;
        }
        for (&d, s) in shape.iter().zip(&self.strides) {
            if stride(d)? != *s {
                return None;
            }
        }
        let mut picks = vec![];
        for g in &self.gathers {
            let d = storage.iter().copied().find(|&d| {
                !shape.contains(&d)
                    && stride(d).as_ref() == Some(&g.stride)
                    && !picks.iter().any(|&(p, _)| p == d)
            })?;
            picks.push((d, g.index));
        }
        (shape.len() + picks.len() == storage.len()).then_some(picks)
    }

    /// Where the view is how `check::merge` reads a parameter of dims `storage` with only some
    /// of the parts of merged dim `m` (`dims[m]`'s, GroupNorm's `w: [g, c]` against `(c, s)`),
    /// over `shape` (the parameter's dims, its parts replaced by `m`): its own layout, each part
    /// it has gathered by that part's coordinate over `m`. The merged dim and its parts.
    pub fn merged_read(
        &self,
        storage: &[DimId],
        shape: &[DimId],
        dims: &[Dim],
    ) -> Option<(DimId, Vec<DimId>)> {
        let (m, parts) = shape.iter().find_map(|&d| match &dims[d] {
            Dim::Merged(parts) if parts.iter().any(|p| storage.contains(p)) => Some((d, parts)),
            _ => None,
        })?;
        let own = View::of_layout(storage, storage);
        let stride = |d: DimId| {
            storage
                .iter()
                .position(|&x| x == d)
                .map(|at| &own.strides[at])
        };
        let strides: Option<Vec<Linear>> = shape
            .iter()
            .map(|&d| match d == m {
                true => Some(vec![]),
                false => stride(d).cloned(),
            })
            .collect();
        let had: Vec<DimId> = parts
            .iter()
            .copied()
            .filter(|p| storage.contains(p))
            .collect();
        let gathered = self.gathers.len() == had.len()
            && self
                .gathers
                .iter()
                .zip(&had)
                .all(|(g, &d)| Some(&g.stride) == stride(d) && g.len == vec![(1, vec![d])]);
        let covers = storage.len() + 1 == shape.len() + had.len();
        (self.offset.is_empty() && strides? == self.strides && gathered && covers)
            .then(|| (m, parts.clone()))
    }
}

/// The dim of a slice picked by an index value: `p[.. + index * stride + ..]` where
/// `0 <= index < len`, and zero (of the parameter's type) without a load where it is not.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    /// The integer node whose value is the coordinate along the gathered dim.
    pub index: NodeId,
    /// The gathered dim's stride in the parameter, in elements.
    pub stride: Linear,
    /// The gathered dim's size.
    pub len: Linear,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reduce {
    Sum,
    Prod,
    Max,
    Min,
    Mean,
    /// `ln(sum(exp(e)))` in one pass: the accumulator is a pair, the running maximum `m` and the
    /// sum of `exp(e - m)`, rescaled when `m` grows (`logsumexp(e)` over every element).
    LogSumExp,
}

impl Reduce {
    pub fn from_name(name: &str) -> Option<Reduce> {
        Some(match name {
            "sum" => Reduce::Sum,
            "prod" => Reduce::Prod,
            "max" => Reduce::Max,
            "min" => Reduce::Min,
            "mean" => Reduce::Mean,
            _ => return None,
        })
    }

    pub const NAMES: [&'static str; 5] = ["sum", "prod", "max", "min", "mean"];
}

#[derive(Clone, Debug)]
pub enum Op {
    /// The current element of tensor parameter `i`.
    Load(usize),
    /// Scalar parameter `i`.
    Scalar(usize),
    /// The element at a fixed offset of tensor parameter `i` (`w[2]`), the same for every
    /// element of the launch: check allows it only where every dim is of fixed size and the
    /// offset is inside them.
    Element(usize, u64),
    /// The current element's position along a dim, as `u32`.
    Index(DimId),
    /// The element of tensor parameter `i` that a slice of it (`x[.., ..d]`) puts at the
    /// current coordinates of the node's shape.
    View(usize, Box<View>),
    Int(i128),
    Float(String),
    Bool(bool),
    Unary(UnOp, NodeId),
    Binary(BinOp, NodeId, NodeId),
    /// A conversion to the node's type.
    Cast(NodeId),
    Select(NodeId, NodeId, NodeId),
    Call(Func, Vec<NodeId>),
    /// A reduction over one dim, or over every element (`None`).
    Reduce(Reduce, NodeId, Option<DimId>),
    /// The size of a dim, as the node's float type: what a derivative divides a mean's by.
    Len(DimId),
    /// A random number at the current element's position in the node's shape, from the `u64`
    /// seed `NodeId` and the call's stream number (its place among the kernel's random calls).
    Random(Random, NodeId, u32),
}

/// The distributions of [`Op::Random`]; see `fuse_runtime::random`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Random {
    /// `rand(seed)`: an f32 uniform in [0, 1).
    Uniform,
    /// `randn(seed)`: an f32 standard normal.
    Normal,
}

impl Op {
    /// The same operation over other values: `f` of each operand, a view's gathered indices
    /// included.
    pub fn map_operands(&self, f: impl Fn(NodeId) -> NodeId) -> Op {
        match self {
            Op::Unary(u, a) => Op::Unary(*u, f(*a)),
            Op::Binary(b, x, y) => Op::Binary(*b, f(*x), f(*y)),
            Op::Cast(a) => Op::Cast(f(*a)),
            Op::Select(c, a, b) => Op::Select(f(*c), f(*a), f(*b)),
            Op::Call(func, args) => Op::Call(*func, args.iter().map(|&a| f(a)).collect()),
            Op::Reduce(r, a, d) => Op::Reduce(*r, f(*a), *d),
            Op::Random(r, s, n) => Op::Random(*r, f(*s), *n),
            Op::View(p, view) => {
                let mut view = view.clone();
                for g in &mut view.gathers {
                    g.index = f(g.index);
                }
                Op::View(*p, view)
            }
            other => other.clone(),
        }
    }

    pub fn operands(&self) -> Vec<NodeId> {
        match self {
            Op::Load(_)
            | Op::Scalar(_)
            | Op::Element(..)
            | Op::Index(_)
            | Op::Len(_)
            | Op::Int(_)
            | Op::Float(_)
            | Op::Bool(_) => vec![],
            Op::Unary(_, a) | Op::Cast(a) | Op::Reduce(_, a, _) | Op::Random(_, a, _) => {
                vec![*a]
            }
            Op::View(_, view) => view.gathers.iter().map(|g| g.index).collect(),
            Op::Binary(_, a, b) => vec![*a, *b],
            Op::Select(c, a, b) => vec![*c, *a, *b],
            Op::Call(_, args) => args.clone(),
        }
    }
}

pub struct Node {
    pub op: Op,
    pub ty: Ty,
    pub shape: Vec<DimId>,
    /// The user's tokens the value came from, where errors about it point; empty for a value the
    /// macro derived itself (a gradient's, say), which no error names.
    pub tokens: TokenStream,
}

// Derived values are what gradients (issue 21) are made of; until then only tests make them.
#[cfg_attr(not(test), allow(dead_code))]
impl Node {
    /// A value the macro derives, with no tokens of the user's behind it.
    pub fn derived(op: Op, elem: Elem, shape: Vec<DimId>) -> Node {
        Node {
            op,
            ty: Ty::Elem(elem),
            shape,
            tokens: TokenStream::new(),
        }
    }

    /// Whether the macro derived the value (see [`Node::derived`]).
    pub fn is_derived(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The element type; past `check` every node has one.
    pub fn elem(&self) -> Elem {
        match self.ty {
            Ty::Elem(e) => e,
            _ => unreachable!("check resolves every literal type"),
        }
    }
}

pub struct ParamInfo {
    pub name: Ident,
    pub elem: Elem,
    /// `None` for a scalar parameter.
    pub shape: Option<Vec<DimId>>,
    /// A `&mut` tensor parameter, written through `p[items] = value;` (an output of the kernel
    /// with an [`OutputInfo::place`]) and never read.
    pub written: bool,
    /// A `bool` tensor held as packed bits (what the training pair saves of a predicate): 32-bit
    /// words, bit `i % 32` of word `i / 32` the element at row-major position `i` of `shape`.
    /// Only in the hidden launches of an elementwise kernel's training pair, over its domain.
    pub packed: bool,
}

impl ParamInfo {
    /// The element type in memory: `u32` words for packed bits, else `elem`.
    pub fn stored_elem(&self) -> Elem {
        match self.packed {
            true => Elem::U32,
            false => self.elem,
        }
    }
}

pub struct OutputInfo {
    pub elem: Elem,
    pub shape: Vec<DimId>,
    pub node: NodeId,
    /// The output's expression in the body, where errors about this output point.
    pub tokens: TokenStream,
    /// Only in a derived launch over rows: the value over the domain (`shape`, `[rows, len]`)
    /// is not stored but summed over rows in `elem`, and the sums stored as `[len]` of this
    /// type (`stored_shape`, `stored_elem`). Each block of the GPU sums the rows it takes into
    /// its own row of partial sums (in the launch's scratch memory); after a barrier of the
    /// grid, the blocks sum those rows, a share of the columns each, in the blocks' order. The
    /// CPU sums the rows in order.
    pub partial: Option<Elem>,
    /// With `partial`: the value over the domain is summed over everything into one value
    /// (`stored_shape` `[]`): each thread adds its elements as it goes (no row's sum), each
    /// block its threads' into its own slot of the scratch, which the grid then sums in the
    /// blocks' order.
    pub total: bool,
    /// Only for a write through a `&mut` parameter (`cache[slot, ..] = k;`): the value over
    /// the domain (`shape`, the slice's shape) is stored where the slice of the parameter puts
    /// each element, and nowhere else.
    pub place: Option<Place>,
    /// A `bool` output stored as packed bits, as [`ParamInfo::packed`]: ORed into words the
    /// caller zeroed (`alloc_zeroed`).
    pub packed: bool,
}

/// Where a write through a `&mut` parameter stores each element of its domain.
pub struct Place {
    /// The `&mut` parameter: the buffer written, whose shape is the output's in memory.
    pub param: usize,
    pub shape: Vec<DimId>,
    /// The element at the domain's coordinates goes to `param[view's index]`; where the view
    /// gathers and an index is outside its dim, nowhere.
    pub view: View,
}

impl OutputInfo {
    /// The values the output needs: its value, and the indices of a write that scatters.
    pub fn roots(&self) -> Vec<NodeId> {
        let gathers = self.place.iter().flat_map(|p| &p.view.gathers);
        std::iter::once(self.node)
            .chain(gathers.map(|g| g.index))
            .collect()
    }

    /// The element type in memory: `u32` words for packed bits, the sums' type for sums over
    /// rows (`partial`), else `elem`.
    pub fn stored_elem(&self) -> Elem {
        match (self.packed, self.partial) {
            (true, _) => Elem::U32,
            (false, Some(sums)) => sums,
            (false, None) => self.elem,
        }
    }

    /// The output's shape in memory: `shape`, `[len]` for sums over rows (`partial`; `[]` for
    /// a total), or the `&mut` parameter's shape for a write through one.
    pub fn stored_shape(&self) -> Vec<DimId> {
        if let Some(place) = &self.place {
            return place.shape.clone();
        }
        match (self.partial, self.shape.last()) {
            (Some(_), _) if self.total => vec![],
            (Some(_), Some(&len)) => vec![len],
            _ => self.shape.clone(),
        }
    }
}

pub struct Kernel {
    pub attrs: Vec<Attribute>,
    /// `#[fast_math]`: f32 functions through CUDA's fast intrinsics.
    pub fast_math: bool,
    /// The parameters of `#[vjp(..)]` and of `#[jvp(..)]`, by index, in the order listed;
    /// `None` without the attribute.
    pub vjp: Option<Vec<usize>>,
    pub jvp: Option<Vec<usize>>,
    pub vis: Visibility,
    pub name: Ident,
    pub dims: Vec<Dim>,
    pub params: Vec<ParamInfo>,
    pub outputs: Vec<OutputInfo>,
    /// Whether the signature returns a tuple.
    pub tuple: bool,
    pub nodes: Vec<Node>,
    pub launch: Launch,
}

/// A kernel's values and outputs, before its launch is known: what `fusion` decides the launch
/// from, and what every stage after it reads through [`Kernel::body`].
#[derive(Clone, Copy)]
pub struct Body<'a> {
    pub dims: &'a [Dim],
    pub nodes: &'a [Node],
    pub outputs: &'a [OutputInfo],
}

impl Body<'_> {
    pub fn shape_text(&self, shape: &[DimId]) -> String {
        let dims: Vec<String> = shape
            .iter()
            .map(|&d| self.dims[d].text(self.dims))
            .collect();
        format!("[{}]", dims.join(", "))
    }
}

/// How the kernel's one launch iterates, decided by `check` from its reductions.
#[derive(Clone, Debug, PartialEq)]
pub enum Launch {
    /// Every output over `domain`, one element per thread step; no reductions.
    Map { domain: Vec<DimId> },
    /// Reductions over `axis`: one block per point of `domain` without `axis` (a "row"),
    /// outputs over `domain` or over the rows.
    Rows { domain: Vec<DimId>, axis: DimId },
    /// Reductions over every element of `domain`: outputs over `domain` or scalars.
    Full { domain: Vec<DimId> },
}

impl Kernel {
    /// Whether some output is written as partial sums over rows (`OutputInfo::partial`).
    pub fn has_partials(&self) -> bool {
        self.outputs.iter().any(|o| o.partial.is_some())
    }

    /// The position of a named dim among the named dims (the kernel's dim arguments).
    pub fn named_index(&self, dim: DimId) -> Option<usize> {
        match self.dims[dim] {
            Dim::Named(_) => Some(
                self.dims[..dim]
                    .iter()
                    .filter(|d| matches!(d, Dim::Named(_)))
                    .count(),
            ),
            Dim::Fixed(_) | Dim::Composite(_) | Dim::Merged(_) => None,
        }
    }

    /// `shape` as the signature declares it: each merged dim ([`Dim::Merged`]) as its parts.
    pub fn declared(&self, shape: &[DimId]) -> Vec<DimId> {
        let mut out = vec![];
        for &d in shape {
            match &self.dims[d] {
                Dim::Merged(parts) => out.extend(self.declared(parts)),
                _ => out.push(d),
            }
        }
        out
    }

    pub fn named_dims(&self) -> impl Iterator<Item = (DimId, &str)> {
        self.dims.iter().enumerate().filter_map(|(i, d)| match d {
            Dim::Named(n) => Some((i, n.as_str())),
            Dim::Fixed(_) | Dim::Composite(_) | Dim::Merged(_) => None,
        })
    }

    /// The tensor parameters the kernel reads: all but the `&mut` ones, which are outputs.
    pub fn tensor_params(&self) -> impl Iterator<Item = (usize, &ParamInfo, &Vec<DimId>)> {
        self.params
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.written)
            .filter_map(|(i, p)| p.shape.as_ref().map(|s| (i, p, s)))
    }

    /// The `&mut` parameters, in order (see [`Kernel::output_buffer`]).
    pub fn written_params(&self) -> impl Iterator<Item = &ParamInfo> {
        self.params.iter().filter(|p| p.written)
    }

    /// The `&mut` parameters the kernel also reads (through a slice), each with the first
    /// output written into it.
    pub fn read_written_params(&self) -> Vec<(usize, usize)> {
        let read = |p: usize| {
            self.nodes
                .iter()
                .any(|n| matches!(n.op, Op::View(q, _) if q == p))
        };
        (0..self.params.len())
            .filter(|&p| self.params[p].written && read(p))
            .filter_map(|p| {
                let o = self
                    .outputs
                    .iter()
                    .position(|o| o.place.as_ref().is_some_and(|w| w.param == p))?;
                Some((p, o))
            })
            .collect()
    }

    /// The buffer that output `j` is stored in, among the buffers the kernel writes: each
    /// returned output its own, in order, then each `&mut` parameter, in the order of the
    /// parameters, shared by every write through it.
    pub fn output_buffer(&self, j: usize) -> usize {
        let returned = self.outputs.iter().filter(|o| o.place.is_none()).count();
        match &self.outputs[j].place {
            None => j,
            Some(place) => {
                returned
                    + self.params[..place.param]
                        .iter()
                        .filter(|p| p.written)
                        .count()
            }
        }
    }

    /// Whether the kernel draws random numbers (`rand`, `randn`, `dropout`): Philox's state and
    /// rounds shape its launch and register budget.
    pub fn draws_random(&self) -> bool {
        self.nodes.iter().any(|n| matches!(n.op, Op::Random(..)))
    }

    pub fn shape_text(&self, shape: &[DimId]) -> String {
        self.body().shape_text(shape)
    }

    /// Its values and outputs.
    pub fn body(&self) -> Body<'_> {
        Body {
            dims: &self.dims,
            nodes: &self.nodes,
            outputs: &self.outputs,
        }
    }
}
