//! The launch schedule of a checked kernel, shared by both backends. [`plan`] says which values
//! are computed once per row (or once per launch), which inside each pass over the elements, and
//! where each output is written; [`program`] adds how the one launch runs: its entry points (one
//! per path), their argument list, geometry and tuning ([`tuning`], [`rows`]), and the host's
//! rule for picking one. Total functions: `check` has already rejected every kernel they cannot
//! schedule.

use crate::fusion::live_nodes;
use crate::ir::{Dim, DimId, Kernel, Launch, NodeId, Op};

pub(crate) mod program;
pub(crate) mod rows;
pub(crate) mod tuning;

pub use program::{
    columns, peels_cache, program, Divisor, Entry, Grid, Param, Path, Program, When,
};

pub struct Plan {
    /// Values computed once per row (once per launch for `Map` and `Full`) before any pass.
    pub prologue: Vec<NodeId>,
    /// The passes over the elements, in order.
    pub passes: Vec<Pass>,
    /// Outputs written once per row (`Rows`) or once by the last block (`Full`).
    pub group_writes: Vec<usize>,
}

/// One loop over the elements (of a row, or of the domain).
pub struct Pass {
    /// Element values computed at each element, in dependency order.
    pub elems: Vec<NodeId>,
    /// Reductions accumulated at each element and finished after the loop.
    pub reduces: Vec<NodeId>,
    /// Outputs written at each element.
    pub writes: Vec<usize>,
    /// Per-row (or per-launch) values that become computable once this pass's reductions finish.
    pub after: Vec<NodeId>,
}

impl Plan {
    /// The passes that reduce: a row kernel's trips through the block reduction.
    pub fn reducing_passes(&self) -> usize {
        self.passes.iter().filter(|p| !p.reduces.is_empty()).count()
    }
}

pub fn plan(k: &Kernel) -> Plan {
    let live = live_nodes(&k.body());
    let is_elem = |id: NodeId| is_element(k, id);
    let depth = depths(&k.nodes);
    let group_nodes = |d: usize| -> Vec<NodeId> {
        (0..k.nodes.len())
            .filter(|&i| {
                live[i] && !is_elem(i) && depth[i] == d && !matches!(k.nodes[i].op, Op::Reduce(..))
            })
            .collect()
    };
    let max_depth = (0..k.nodes.len())
        .filter(|&i| live[i])
        .map(|i| depth[i])
        .max()
        .unwrap_or(0);
    let (elem_outputs, group_writes): (Vec<usize>, Vec<usize>) = (0..k.outputs.len())
        .partition(|&o| is_elem(k.outputs[o].node) || matches!(k.launch, Launch::Map { .. }));
    let mut passes = vec![];
    for d in 1..=max_depth {
        let reduces: Vec<NodeId> = (0..k.nodes.len())
            .filter(|&i| live[i] && depth[i] == d && matches!(k.nodes[i].op, Op::Reduce(..)))
            .collect();
        let roots: Vec<NodeId> = reduces
            .iter()
            .flat_map(|&r| k.nodes[r].op.operands())
            .collect();
        passes.push(Pass {
            elems: closure(k, &roots, &is_elem),
            reduces,
            writes: vec![],
            after: group_nodes(d),
        });
    }
    let output_roots: Vec<NodeId> = elem_outputs
        .iter()
        .flat_map(|&o| k.outputs[o].roots())
        .collect();
    match (&k.launch, passes.first_mut()) {
        // A full reduction's element outputs cannot depend on it: write them in its one pass.
        (Launch::Full { .. }, Some(pass)) => {
            let mut roots = output_roots;
            roots.extend(pass.reduces.iter().flat_map(|&r| k.nodes[r].op.operands()));
            pass.elems = closure(k, &roots, &is_elem);
            pass.writes = elem_outputs;
        }
        _ if !elem_outputs.is_empty() => passes.push(Pass {
            elems: closure(k, &output_roots, &is_elem),
            reduces: vec![],
            writes: elem_outputs,
            after: vec![],
        }),
        _ => {}
    }
    Plan {
        prologue: group_nodes(0),
        passes,
        group_writes,
    }
}

/// Whether a value varies along the elements one thread step visits (else it is per row, or per
/// launch).
pub fn is_element(k: &Kernel, id: NodeId) -> bool {
    let shape = &k.nodes[id].shape;
    match &k.launch {
        Launch::Rows { axis, .. } => shape.contains(axis),
        Launch::Map { .. } | Launch::Full { .. } => !shape.is_empty(),
    }
}

/// Whether a value needs the coordinates of its element, which the loops over a whole domain
/// otherwise skip: `index(dim)`, a slice (whose index is computed from them), and a random value over a shape other than the domain's (one
/// over the domain's shape is drawn at the loop's linear index).
pub fn needs_coordinates(k: &Kernel, id: NodeId, domain: &[DimId]) -> bool {
    match k.nodes[id].op {
        Op::Index(_) | Op::View(..) => true,
        Op::Random(..) => k.nodes[id].shape != domain,
        _ => false,
    }
}

/// How many reductions deep each value is: reductions of depth `d` finish in pass `d`. Also
/// what a derivative's sums wait on (`grad::Graph::sum_split`).
pub(crate) fn depths(nodes: &[crate::ir::Node]) -> Vec<usize> {
    let mut depth = vec![0; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let operands = node
            .op
            .operands()
            .into_iter()
            .map(|o| depth[o])
            .max()
            .unwrap_or(0);
        depth[i] = operands + usize::from(matches!(node.op, Op::Reduce(..)));
    }
    depth
}

/// The element values that `roots` need, in dependency order; stops at per-row values and
/// reductions, which are computed outside the loop.
pub(crate) fn closure(
    k: &Kernel,
    roots: &[NodeId],
    is_elem: &impl Fn(NodeId) -> bool,
) -> Vec<NodeId> {
    let mut need = vec![false; k.nodes.len()];
    let mut stack: Vec<NodeId> = roots.to_vec();
    while let Some(id) = stack.pop() {
        if need[id] || !is_elem(id) || matches!(k.nodes[id].op, Op::Reduce(..)) {
            continue;
        }
        need[id] = true;
        stack.extend(k.nodes[id].op.operands());
    }
    (0..k.nodes.len()).filter(|&i| need[i]).collect()
}

/// How a backend declares index variables and divides, for [`Layout::split`], and writes a
/// gather's index, for [`Layout::view_access`].
pub struct Syntax {
    /// Declares a coordinate, as in `const long long ` or `let `.
    pub decl: &'static str,
    /// Declares the mutable temporary `t`.
    pub temp: &'static str,
    /// Ends a statement.
    pub end: &'static str,
    /// The quotient of a variable by the size of a dim.
    pub quot: fn(&Layout, &str, DimId) -> String,
    /// An integer value as an index (`(long long)v`, `(v as usize)`).
    pub index: fn(&str) -> String,
    /// Whether an integer value is inside a dim of a size: `0 <= v < size`, as one unsigned
    /// comparison (a negative value is a large unsigned one).
    pub below: fn(&str, &str) -> String,
}

/// Index arithmetic, written in the syntax that C and Rust share (`a * b + c`), over variables
/// that both backends declare: `d_<name>` for each named dim and `c<id>` for each coordinate.
pub struct Layout<'a> {
    pub k: &'a Kernel,
}

impl Layout<'_> {
    /// The size of a dim: a variable, or a literal for a fixed dim.
    pub fn size(&self, d: DimId) -> String {
        match &self.k.dims[d] {
            Dim::Named(n) => format!("d_{n}"),
            Dim::Fixed(v) => v.to_string(),
            Dim::Composite(c) => {
                let terms: Vec<(u64, Vec<DimId>)> =
                    c.terms().into_iter().map(|(k, d)| (k, vec![d])).collect();
                format!("({})", self.linear(&terms))
            }
            Dim::Merged(parts) => format!("({})", self.product(parts)),
        }
    }

    /// A sum of products of dim sizes (a slice's offset or stride), `0` for none.
    pub fn linear(&self, terms: &crate::ir::Linear) -> String {
        if terms.is_empty() {
            return "0".into();
        }
        let texts: Vec<String> = terms
            .iter()
            .map(|(k, dims)| match (k, dims.is_empty()) {
                (_, true) => k.to_string(),
                (1, false) => self.product(dims),
                _ => format!("{k} * {}", self.product(dims)),
            })
            .collect();
        texts.join(" + ")
    }

    /// The element a slice (`Op::View`, or a write's `Place`) reaches at the current
    /// coordinates of `shape` ([`Layout::view_index`]), and where it gathers, the test that
    /// each index is inside its gathered dim: outside, a load gives zero and a store is skipped.
    pub fn view_access(
        &self,
        view: &crate::ir::View,
        shape: &[DimId],
        coord: impl Fn(DimId) -> String,
        syntax: &Syntax,
    ) -> (String, Option<String>) {
        let gathered: Vec<String> = view
            .gathers
            .iter()
            .map(|g| (syntax.index)(&format!("v{}", g.index)))
            .collect();
        let at = self.view_index(view, shape, coord, &gathered);
        let inside: Vec<String> = view
            .gathers
            .iter()
            .map(|g| (syntax.below)(&format!("v{}", g.index), &self.linear(&g.len)))
            .collect();
        (at, (!inside.is_empty()).then(|| inside.join(" && ")))
    }

    /// The index of the element a slice (`Op::View`) reads at the current coordinates of its
    /// node's `shape`: `coord` gives each dim's coordinate (`r` along a row kernel's axis).
    /// Each gather's index value is in `gathered`, as the backend's index type.
    pub fn view_index(
        &self,
        view: &crate::ir::View,
        shape: &[DimId],
        coord: impl Fn(DimId) -> String,
        gathered: &[String],
    ) -> String {
        let mut terms = vec![];
        if !view.offset.is_empty() {
            terms.push(self.linear(&view.offset));
        }
        // The index's own dims (an empty stride) move the load only through it.
        for (&d, stride) in shape.iter().zip(&view.strides) {
            if stride.is_empty() {
                continue;
            }
            match self.linear(stride) {
                s if s == "1" => terms.push(coord(d)),
                s if s.contains(" + ") => terms.push(format!("{} * ({s})", coord(d))),
                s => terms.push(format!("{} * {s}", coord(d))),
            }
        }
        for (g, index) in view.gathers.iter().zip(gathered) {
            match self.linear(&g.stride) {
                s if s == "1" => terms.push(index.to_string()),
                s if s.contains(" + ") => terms.push(format!("{index} * ({s})")),
                s => terms.push(format!("{index} * {s}")),
            }
        }
        match terms.is_empty() {
            true => "0".into(),
            false => terms.join(" + "),
        }
    }

    pub fn coord(&self, d: DimId) -> String {
        format!("c{d}")
    }

    /// The product of the sizes of `dims`, `1` for none.
    pub fn product(&self, dims: &[DimId]) -> String {
        if dims.is_empty() {
            return "1".into();
        }
        dims.iter()
            .map(|&d| self.size(d))
            .collect::<Vec<_>>()
            .join(" * ")
    }

    /// The row-major stride of `d` within a tensor of shape `shape`.
    pub fn stride(&self, shape: &[DimId], d: DimId) -> String {
        let at = shape
            .iter()
            .position(|&x| x == d)
            .expect("the dim is in the shape");
        self.product(&shape[at + 1..])
    }

    /// The offset of the current coordinates in a tensor of `shape`, leaving out `skip`.
    pub fn offset(&self, shape: &[DimId], skip: Option<DimId>) -> String {
        let terms: Vec<String> = shape
            .iter()
            .filter(|&&d| Some(d) != skip)
            .map(|&d| match self.stride(shape, d).as_str() {
                "1" => self.coord(d),
                s => format!("{} * {s}", self.coord(d)),
            })
            .collect();
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
    }

    /// Statements, in a backend's `syntax`, that split the linear index `linear` into the
    /// coordinates of `dims`.
    pub fn split(&self, linear: &str, dims: &[DimId], syntax: &Syntax) -> Vec<String> {
        let Syntax {
            decl,
            temp,
            end,
            quot,
            ..
        } = syntax;
        let mut lines = vec![];
        match dims {
            [] => {}
            [only] => lines.push(format!("{decl}{} = {linear}{end}", self.coord(*only))),
            _ => {
                lines.push(format!("{temp}t = {linear}{end}"));
                for (i, &d) in dims.iter().enumerate().rev() {
                    if i == 0 {
                        lines.push(format!("{decl}{} = t{end}", self.coord(d)));
                    } else {
                        // One division per dim, the remainder from the quotient.
                        let (c, size) = (self.coord(d), self.size(d));
                        lines.push(format!("{decl}q{d} = {}{end}", quot(self, "t", d)));
                        lines.push(format!("{decl}{c} = t - q{d} * {size}{end}"));
                        lines.push(format!("t = q{d}{end}"));
                    }
                }
            }
        }
        lines
    }

    /// The position a random value `id` is drawn at: the row-major index of the current element
    /// in the value's shape, widened to 64 bits by `wide`. In an element loop (`element`) over a
    /// value of the domain's shape that is the loop's index `i`; otherwise Horner's rule over the
    /// coordinates (`r` along a row kernel's reduced dim), which both backends declare.
    pub fn position(&self, id: NodeId, element: bool, wide: impl Fn(String) -> String) -> String {
        let shape = &self.k.nodes[id].shape;
        let axis = match &self.k.launch {
            Launch::Map { domain } | Launch::Full { domain } if element && shape == domain => {
                return wide("i".into());
            }
            Launch::Rows { axis, .. } => Some(*axis),
            _ => None,
        };
        let coord = |d: DimId| {
            if Some(d) == axis {
                "r".to_string()
            } else {
                self.coord(d)
            }
        };
        let Some((&first, rest)) = shape.split_first() else {
            return wide("0".into());
        };
        rest.iter().fold(wide(coord(first)), |acc, &d| {
            format!("({acc} * {} + {})", wide(self.size(d)), wide(coord(d)))
        })
    }

    /// The dims whose sizes `split` divides by, for `dims`.
    pub fn divisors(dims: &[DimId]) -> &[DimId] {
        dims.get(1..).unwrap_or(&[])
    }

    /// The position of `shape` among [`Layout::shapes`]: the `s` of the names `o<s>` and `b<s>`.
    pub fn shape_index(&self, shape: &[DimId]) -> usize {
        self.shapes()
            .iter()
            .position(|s| s == shape)
            .expect("every tensor shape is listed")
    }

    /// The offset at row position `r` of a tensor of shape `s` (index `index`), from its row
    /// start `b<index>`: `b0 + r`, `b1 + r * d_cols`, or `b2` where the shape lacks `axis`.
    pub fn row_offset(&self, index: usize, shape: &[DimId], axis: DimId) -> String {
        match shape.contains(&axis).then(|| self.stride(shape, axis)) {
            Some(stride) if stride == "1" => format!("b{index} + r"),
            Some(stride) => format!("b{index} + r * {stride}"),
            None => format!("b{index}"),
        }
    }

    /// The distinct shapes of tensors loaded or stored by `nodes` and `outputs`, for offset names.
    /// A parameter over a dim the launch does not iterate is left out: no output can use it
    /// (`check` broadcasts every value into the launch's domain), and no loop has coordinates
    /// along that dim (`x1: [f32; d1]` beside a domain over `d0`).
    pub fn shapes(&self) -> Vec<Vec<DimId>> {
        let mut shapes: Vec<Vec<DimId>> = vec![];
        let domain = match &self.k.launch {
            Launch::Map { domain } | Launch::Rows { domain, .. } | Launch::Full { domain } => {
                domain
            }
        };
        let all = self
            .k
            .tensor_params()
            .filter(|(_, _, s)| s.iter().all(|d| domain.contains(d)))
            .map(|(_, _, s)| s.clone())
            .chain(self.k.outputs.iter().map(|o| o.shape.clone()));
        for s in all {
            if !shapes.contains(&s) {
                shapes.push(s);
            }
        }
        shapes
    }
}

#[cfg(test)]
mod tests {
    use super::plan;
    use crate::testing::kernel;
    use quote::quote;

    #[test]
    fn softmax_takes_three_passes_over_each_row() {
        let k = kernel(
            quote! { fn f(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) } },
        );
        let p = plan(&k);
        assert_eq!(p.passes.len(), 3);
        assert_eq!(p.passes[0].reduces.len(), 1);
        assert_eq!(p.passes[1].reduces.len(), 1);
        assert_eq!(p.passes[2].writes, vec![0]);
        assert!(p.group_writes.is_empty());
    }

    #[test]
    fn independent_reductions_share_a_pass() {
        let k = kernel(
            quote! { fn f(x: [f32; r, c]) -> ([f32; r], [f32; r]) { (sum(x, c), max(x * 2.0, c)) } },
        );
        let p = plan(&k);
        assert_eq!(p.passes.len(), 1);
        assert_eq!(p.passes[0].reduces.len(), 2);
        assert_eq!(p.group_writes, vec![0, 1]);
    }

    #[test]
    fn full_reduction_writes_element_outputs_in_its_pass() {
        let k = kernel(
            quote! { fn f(x: [f32; n]) -> ([f32; n], f32) { let e = x.exp(); (e, sum(e) * 2.0) } },
        );
        let p = plan(&k);
        assert_eq!(p.passes.len(), 1);
        assert_eq!(p.passes[0].writes, vec![0]);
        assert_eq!(p.group_writes, vec![1]);
        assert_eq!(
            p.passes[0].after.len(),
            1,
            "the product is computed once, after the reduction"
        );
        assert_eq!(
            p.prologue.len(),
            1,
            "the literal is computed once, before the pass"
        );
    }

    #[test]
    fn dead_values_are_not_computed() {
        let k = kernel(quote! { fn f(x: [f32; n]) -> [f32; n] { let unused = x.sin(); x + 1.0 } });
        let p = plan(&k);
        let all: Vec<usize> = p
            .prologue
            .iter()
            .chain(&p.passes[0].elems)
            .copied()
            .collect();
        assert!(all
            .iter()
            .all(|&i| !matches!(k.nodes[i].op, crate::ir::Op::Call(..))));
    }
}
