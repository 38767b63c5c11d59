//! The CUDA C backend: a printer of the `plan::Program`, one module per entry point, each an
//! `extern "C" __global__` function preceded by only the helper functions it uses. It decides no
//! schedule question: which paths exist, their parameters, bounds and length rules are the
//! program's. The text is written through an infallible `String` writer.

use crate::ir::{DimId, Kernel, Launch, NodeId, Op, Reduce};
use crate::parse::BinOp;
use crate::plan::{Divisor, Entry, Layout, Param, Path, Plan, Program, Syntax};
use crate::ty::Elem;
use std::collections::{BTreeMap, BTreeSet};
use text::{helper, narrow_helpers};

mod columns;
mod elementwise;
mod expr;
mod reduce;
mod rows;
mod text;
mod tile;

pub use crate::abi::BLOCK;

/// Coordinates in 64 bits, divided by reciprocals that `divisors` computes once per launch: a
/// 64-bit division is a subroutine call (slow, and live registers spill around it).
const SYNTAX: Syntax = Syntax {
    decl: "const long long ",
    temp: "long long ",
    end: ";",
    quot: |_, t, d| format!("(long long)fz_quot((unsigned long long){t}, dv{d})"),
    index: |v| format!("(long long){v}"),
    below: |v, size| format!("(unsigned long long){v} < (unsigned long long)({size})"),
};

use crate::abi::CACHE;

pub(crate) use crate::abi::ROUNDS;

/// The CUDA C of each entry point of `program`, in its order: each a module of its own, with
/// only the helpers it uses.
pub fn sources(k: &Kernel, program: &Program) -> Vec<String> {
    program
        .entries
        .iter()
        .map(|entry| entry_source(k, program, entry))
        .collect()
}

/// The float products under a row's maximum or minimum whose value more than one pass over the
/// row computes. Each pass must compute the same bits, or a shift by the row's maximum misses
/// it: with `x * y` contracted into the subtraction of `exp(x * y - max)` in one pass and
/// rounded in the pass that took the maximum, the difference is the product's rounding error,
/// which for products near 1e30 is 1e22, and `exp` of it 0 or infinity (a random program's
/// `logsumexp(prod(..) * x)` gave `-inf` for `1e30`). NVRTC contracts what it may; `__fmul_rn`
/// it may not. The functions whose last step is a product count too: `to_degrees`,
/// `to_radians`, `gelu` and `gelu_tanh` (p26365: `logsumexp` over columns of `x.to_degrees()`
/// gave `-inf` where a column held `1e30`). Values are told apart by what they compute, not by
/// node: `max(x * y, c)` and the `x * y` beside it are two nodes of one value. (Sums take the
/// documented difference a contraction makes.)
fn exact_products(k: &Kernel, plan: &Plan) -> BTreeSet<NodeId> {
    // Each node's value: the first node that computes the same from the same values.
    let mut value: Vec<NodeId> = Vec::with_capacity(k.nodes.len());
    let mut seen: BTreeMap<String, NodeId> = BTreeMap::new();
    for (id, node) in k.nodes.iter().enumerate() {
        let operands: Vec<NodeId> = node.op.operands().iter().map(|&a| value[a]).collect();
        let kind = format!("{:?}", node.op);
        let kind = kind.split('(').next().unwrap_or_default();
        let what = match &node.op {
            Op::Binary(op, ..) => format!("{op:?}"),
            Op::Unary(op, _) => format!("{op:?}"),
            Op::Call(f, _) => format!("{f:?}"),
            Op::Reduce(r, _, d) => format!("{r:?} {d:?}"),
            Op::Random(r, _, stream) => format!("{r:?} {stream}"),
            other if operands.is_empty() => format!("{other:?}"),
            _ => String::new(),
        };
        let key = format!("{kind} {what} {operands:?} {:?} {:?}", node.ty, node.shape);
        value.push(*seen.entry(key).or_insert(id));
    }
    let mut passes: BTreeMap<NodeId, usize> = BTreeMap::new();
    for pass in &plan.passes {
        for v in pass
            .elems
            .iter()
            .map(|&id| value[id])
            .collect::<BTreeSet<_>>()
        {
            *passes.entry(v).or_default() += 1;
        }
    }
    // The values each maximum or minimum of a row reads, down to the loads and earlier
    // reductions.
    let mut under = vec![false; k.nodes.len()];
    let mut stack: Vec<NodeId> = k
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::Reduce(Reduce::Max | Reduce::Min | Reduce::LogSumExp, a, _) => Some(a),
            _ => None,
        })
        .collect();
    while let Some(id) = stack.pop() {
        if !std::mem::replace(&mut under[value[id]], true)
            && !matches!(k.nodes[id].op, Op::Reduce(..))
        {
            stack.extend(k.nodes[id].op.operands());
        }
    }
    (0..k.nodes.len())
        .filter(|&id| {
            passes.get(&value[id]).is_some_and(|&n| n > 1)
                && under[value[id]]
                && match &k.nodes[id].op {
                    Op::Binary(BinOp::Mul, ..) => true,
                    Op::Call(f, _) => expr::ENDS_IN_PRODUCT.contains(f),
                    _ => false,
                }
                && k.nodes[id].elem().is_float()
        })
        .collect()
}

/// The CUDA C of one entry point.
fn entry_source(k: &Kernel, program: &Program, entry: &Entry) -> String {
    let plan = &program.plan;
    let mut w = Cuda {
        k,
        plan,
        program,
        path: entry.path,
        when: entry.when,
        segment_width: crate::plan::rows::segment_width(k, plan, entry.path, &entry.when),
        layout: Layout { k },
        out: String::new(),
        indent: 1,
        helpers: BTreeSet::new(),
        cached: vec![],
        row_vectors_now: vec![],
        lanes: crate::plan::rows::lanes(k),
        uniform_divisors: BTreeSet::new(),
        lane_invariant: vec![],
        settled_tests: vec![],
        packed_reductions: vec![],
        exact_products: exact_products(k, plan),
        in_shared: false,
        whole_rows: false,
        direct_rows: false,
        full_rows: false,
        hoisted_positions: false,
        partials_in_registers: false,
        partials_in_shared: false,
        copies_next_row: vec![],
        lane_randoms: vec![],
        slices: vec![],
        addressed: None,
        row_randoms: false,
        defers_division: false,
        rows_at_q: false,
        fast_division: false,
        reuse: None,
        stash: None,
        step_lanes: 4,
        peeled: false,
        peeled_extras: false,
        tail: None,
        cache_lanes: match entry.path {
            Path::RowsCachedWide | Path::RowBlockWide => 8,
            _ => 4,
        },
        cast_bits: None,
        bits: vec![],
        blocks: vec![],
        opened: 0,
    };
    let kernel = match (&k.launch, entry.path) {
        (Launch::Rows { .. }, Path::ShortRows) => w.short_rows_kernel(plan, entry),
        (Launch::Rows { .. }, Path::LongRows) => w.long_rows_kernel(plan, entry),
        (Launch::Rows { domain, axis }, Path::Columns | Path::ColumnPairs | Path::ColumnQuads) => {
            let split = matches!(entry.grid, crate::plan::Grid::Columns { split: true, .. });
            match entry.path {
                Path::ColumnPairs => w.column_vectors_body(domain, *axis, plan, split, 2),
                Path::ColumnQuads => w.column_vectors_body(domain, *axis, plan, split, 4),
                _ => w.columns_body(domain, *axis, plan, split),
            }
            let body = std::mem::take(&mut w.out);
            w.global(entry, &body)
        }
        (launch, _) => {
            match launch {
                Launch::Map { domain } => w.map_body(domain, plan),
                Launch::Rows { domain, axis } => w.rows_body(domain, *axis, plan),
                Launch::Full { domain } => w.full_body(domain, plan),
            }
            let body = std::mem::take(&mut w.out);
            w.global(entry, &body)
        }
    };
    let mut text = format!(
        "// Kernel `{}`, generated by fuse! from its Rust source: edit that, not this.\n// {}\n// Path `{}`: {}\n",
        crate::ir::plain_name(&k.name),
        launch_comment(k),
        entry.path.name(),
        path_comment(entry)
    );
    // The one place `fz_smax` (with `fz_smin`) is added: the reductions' combining steps
    // (`text::combine`) name it without a writer at hand, and elementwise max, min and clamp too.
    if kernel.contains("fz_smax(") || kernel.contains("fz_smin(") {
        w.helpers.insert("fz_smax");
    }
    for h in &w.helpers {
        text.push_str(helper(h));
    }
    text.push_str(&kernel);
    text
}

/// Every entry's text, one after another, for tests that look for a line anywhere in a kernel.
#[cfg(test)]
pub(crate) fn text(k: &Kernel) -> String {
    sources(k, &crate::plan::program(k)).concat()
}

/// When the host takes an entry, and how it runs, in a line.
fn path_comment(entry: &Entry) -> String {
    let w = entry.when;
    let multiple = match w.multiple_of {
        1 => String::new(),
        m => format!(", a multiple of {m}"),
    };
    match entry.path {
        Path::Map | Path::Full => "every launch.".into(),
        Path::Rows => "any row length, the rows streamed from memory in every pass.".into(),
        Path::RowsCached => format!(
            "rows of 1 to {} elements{multiple}, each held in the registers of a segment of threads, read once.",
            w.max_len
        ),
        Path::RowsCachedWide => format!(
            "rows of 1 to {} elements{multiple}, each held in the registers of a segment of threads in 16-byte vectors of 2-byte elements, 32 a thread, read once.",
            w.max_len
        ),
        Path::RowBlock => format!(
            "rows of {} to {} elements{multiple}, on sm_{} and later: a block a row, held in registers.",
            w.min_len, w.max_len, w.min_arch
        ),
        Path::RowBlockExact => format!(
            "rows of exactly {} elements, on sm_{} and later: a block a row, held in registers, no bounds tests.",
            w.min_len, w.min_arch
        ),
        Path::RowBlockWide => format!(
            "rows of {} to {} elements{multiple}, on sm_{} and later: a block a row, held in registers in 16-byte vectors of 2-byte elements, 32 a thread.",
            w.min_len, w.max_len, w.min_arch
        ),
        Path::RowChunks => format!(
            "rows of {} to {} elements{multiple}, on sm_{} and later: a block a chunk of up to {} columns of each row it takes, held in registers, the same chunk in every row.",
            w.min_len, w.max_len, w.min_arch, crate::abi::CACHE * crate::abi::BLOCK
        ),
        Path::ShortRows => format!(
            "rows of 1 to {} elements: tiles of whole rows through shared memory, 16-byte loads and stores.",
            w.max_len
        ),
        Path::LongRows => format!(
            "rows of over {} elements, when the device has the shared memory: the row in the dynamic shared memory of a block or a cluster.",
            w.min_len - 1
        ),
        Path::Columns => match entry.grid {
            crate::plan::Grid::Columns { split: true, .. } => "every launch: a block a tile of 32 adjacent rows, its warps splitting the reduced dim; tiles split along it across blocks where the grid needs more, the tile's last block finishing their partials in a fixed order.".into(),
            _ => "every launch: a block a tile of 32 adjacent rows, its warps splitting the reduced dim.".into(),
        },
        Path::ColumnPairs => "an even innermost column dim: as `columns`, two adjacent columns a lane, loaded as one pair (a tile of 64).".into(),
        Path::ColumnQuads => "an innermost column dim a multiple of four: as `columns`, four adjacent columns a lane, loaded as one vector (a tile of 128).".into(),
    }
}

fn launch_comment(k: &Kernel) -> String {
    match &k.launch {
        Launch::Map { domain } => format!("One thread per element of {}, grid-stride.", k.shape_text(domain)),
        Launch::Rows { domain, axis } if crate::plan::columns(k) => {
            let rows: Vec<DimId> = domain.iter().copied().filter(|d| d != axis).collect();
            format!(
                "Reduces {} over `{}`, a strided dim: each thread one point of {}, adjacent threads adjacent points.",
                k.shape_text(domain),
                k.dims[*axis].text(&k.dims),
                k.shape_text(&rows)
            )
        }
        Launch::Rows { domain, axis } => {
            let rows: Vec<DimId> = domain.iter().copied().filter(|d| d != axis).collect();
            format!(
                "Reduces {} over `{}`: one block per point of {} (grid-stride), block reductions by warp shuffle.",
                k.shape_text(domain),
                k.dims[*axis].text(&k.dims),
                k.shape_text(&rows)
            )
        }
        Launch::Full { domain } => format!(
            "Grid-stride over {}; per-block partials, the last block finishes them in a fixed order (deterministic).",
            k.shape_text(domain)
        ),
    }
}

/// Where a load's offset comes from: the current element, or the current row.
#[derive(Clone, Copy, PartialEq)]
enum Scope {
    Element,
    Row,
    /// Lane `l` of the vectors loaded for the current step (see `vector_loop`).
    Lane,
}

struct Cuda<'a> {
    k: &'a Kernel,
    /// The kernel's plan, which `source` was given.
    plan: &'a Plan,
    /// The whole schedule: parameters, divisors, seeds.
    program: &'a Program,
    /// The path of the entry being written.
    path: Path,
    /// When the host takes it.
    when: crate::plan::When,
    /// The constant width of its segments, where the path and `when` fix one
    /// (`plan::rows::segment_width`), asked once rather than at every cached vector's test.
    segment_width: Option<u32>,
    layout: Layout<'a>,
    out: String,
    indent: usize,
    helpers: BTreeSet<&'static str>,
    /// Tensor parameters loaded as vectors `lv_<name>` for the current row step.
    row_vectors_now: Vec<usize>,
    /// Tensor parameters whose current element is in registers (`rc_<name>[q].v[j]`).
    cached: Vec<usize>,
    /// Elements per vector load in elementwise loops.
    lanes: u32,
    /// Whether the `cached` tensors' rows are in their shared buffers (`rc_<name>`, the
    /// current step's vector, read from `pf_<name>`) rather than in registers.
    in_shared: bool,
    /// Whether the row loop being written is the one for a row a block (`width == BLOCK`, a
    /// constant there): no segments, every thread live, and cached rows longer than half the
    /// cache (see `rows::Cuda::row_loop`).
    whole_rows: bool,
    /// Whether the row kernel being written loads its rows straight into registers in every
    /// row loop, its rows being light (`rows::direct_row_cost`).
    direct_rows: bool,
    /// Whether the row-a-block loop being written reads its positions from `fz_pos` (see
    /// `rows::Cuda::hoist_positions`).
    hoisted_positions: bool,
    /// The random values whose four lanes of a row's vector step share one Philox block,
    /// `rq<id>`, drawn before the lanes (see `rows::Cuda::vector_row_step`).
    lane_randoms: Vec<NodeId>,
    /// In an elementwise vector loop, the slices it loads as vectors (`l_w<id>`), with their
    /// layouts.
    slices: Vec<(NodeId, crate::plan::rows::Pitch)>,
    /// In an elementwise vector loop that loads and stores by address (`PassLayout::by_address`),
    /// the slices it loads at the address of their first lane (`l_w<id>`, zero where a gather's
    /// index is outside its dim), and the values computed once a vector before the lanes.
    addressed: Option<(Vec<NodeId>, Vec<NodeId>)>,
    /// Whether the vector steps being written are a row loop's (in registers or streamed),
    /// whose vectors start at a multiple of their lanes along the row: they draw `lane_randoms`.
    row_randoms: bool,
    /// Whether the partial sums over rows (`OutputInfo::partial`) add up in registers,
    /// `pa<o>[q]`, written once after the row loop (rows in registers), rather than in memory.
    partials_in_registers: bool,
    /// Whether the partial sums over rows add up in the long rows' shared memory, `sp<o>` at
    /// the element's place in the block's part of the row (`long_rows::shared_layout`).
    partials_in_shared: bool,
    /// In the last pass over a long row of a grid that loops over rows, the cached tensors
    /// whose next row each step copies into the slots it has just read
    /// (`long_rows::copy_next_row`); empty otherwise.
    copies_next_row: Vec<usize>,
    /// Whether the row-a-block loop being written is the one for rows of exactly
    /// `CACHE * BLOCK` elements, whose vectors need no bounds tests.
    full_rows: bool,
    /// Whether the cached tensors' vectors of a row step are `rc_<name>[q]` outside a cached
    /// row pass too: in a tiled short row's (`tile::passes`), one vector a lane.
    rows_at_q: bool,
    /// Whether the vector passes being written defer their divisions by a row's value as a row
    /// a block's do (see `rows::Cuda::vector_row_step`): the tiled short rows' and the long
    /// rows' passes, in kernels that draw no random numbers.
    defers_division: bool,
    /// Whether divisions by a row's value take the fast path alone and set `fz_bad` where it
    /// does not apply (see `rows::Cuda::vector_row_step`).
    fast_division: bool,
    /// A value that the current pass reads from the cached tensor's element (`rc_<name>`, where
    /// an earlier pass stored it) instead of computing it, and that tensor; with it, a row step
    /// computes only the values its reductions and writes need besides (see
    /// `rows::long_rows::stashes`).
    reuse: crate::plan::rows::SlotRead,
    /// A value that the current pass stores in place of the cached tensor's element, gathered
    /// lane by lane into `fz_st` in a vector step.
    stash: Option<NodeId>,
    /// Values computed once per launch or row whose reciprocal `dv_<id>` is in scope.
    uniform_divisors: BTreeSet<NodeId>,
    /// The values of a row's vector step computed once before its lanes, which the lanes'
    /// steps leave out (see `rows::Cuda::lane_invariants`).
    lane_invariant: Vec<NodeId>,
    /// Tests of an element's position whose value is known in the lanes being written, with
    /// that value (see `rows::Cuda::four_lanes`).
    settled_tests: Vec<(NodeId, bool)>,
    /// Reductions the lanes being written leave out, accumulated over the vector at once
    /// before them (see `rows::Cuda::four_lanes`).
    packed_reductions: Vec<NodeId>,
    /// Float products rounded on their own (`__fmul_rn`), never contracted into a fused
    /// multiply-add: see [`exact_products`].
    exact_products: BTreeSet<NodeId>,
    /// The elements of a row's vector step (`rows::Cuda::vector_row_step`): four, or eight in
    /// the streamed passes of kernels of 2-byte tensors.
    step_lanes: u32,
    /// In a peeled vector loop (a streamed row's, `rows::Cuda::peeled_row_loop`, or a long row
    /// part's, `long_rows::peel_bounds`): the vectors start `fz_h` elements into the row, the
    /// first on a whole vector of memory.
    peeled: bool,
    /// In a peeled cached row's step of the element around its vectors
    /// (`rows::Cuda::peeled_elements`): the cached tensors' element is `rx_<name>`.
    peeled_extras: bool,
    /// In the last steps of a streamed row's vector loop (`rows::Cuda::row_vector_loop`): the
    /// vector `c`'s test, under which the step works on the vectors it loaded at `fz_cl`, a
    /// vector of the row wherever `c` is.
    tail: Option<String>,
    /// The elements of each of a cached row's vectors in registers (`rc_<name>[q]`): four, or
    /// eight (16 bytes of 2-byte elements) on the wide path.
    cache_lanes: u32,
    /// The bits of the cast to a narrow float `expr` just wrote, for `values` to declare, and
    /// the f32 value they round.
    cast_bits: Option<(String, String)>,
    /// Casts to a narrow float whose bits `h<id>` are declared, each with the blocks open where
    /// it was (see `output_bits`) and the f32 value it rounds (see `vector_element`).
    bits: Vec<(NodeId, Vec<usize>, String)>,
    /// The blocks open now, outermost first, each by its number in the text, and the count of
    /// blocks opened so far.
    blocks: Vec<usize>,
    opened: usize,
}

impl Cuda<'_> {
    fn line(&mut self, text: impl AsRef<str>) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(text.as_ref());
        self.out.push('\n');
    }

    fn open(&mut self, text: impl AsRef<str>) {
        self.opened += 1;
        self.blocks.push(self.opened);
        let text = text.as_ref();
        self.line(if text.is_empty() {
            "{".to_string()
        } else {
            format!("{text} {{")
        });
        self.indent += 1;
    }

    fn close(&mut self) {
        self.blocks.pop();
        self.indent -= 1;
        self.line("}");
    }

    /// `raw`, an element of type `e` as memory holds it, as a value: a narrow float's bits
    /// converted to f32.
    fn loaded(&mut self, e: Elem, raw: String) -> String {
        if !e.is_narrow_float() {
            return raw;
        }
        let (helper, to_f32, _) = narrow_helpers(e);
        self.helpers.insert(helper);
        format!("{to_f32}({raw})")
    }

    /// Element `j` of `vector`, a row kernel's vector of a row (cached, `rc_`, or loaded beside
    /// the cached ones, `lv_`), as a value: of bf16, from the 32-bit word that holds it
    /// (`fz_bf16_at`, a shift or a mask: extracting the half first took two instructions; G7
    /// 57 -> 61% of copy speed on an H200). Not in the elementwise loop (`l_`): read as words,
    /// its vectors' loads sank below the first element's division (V1 87 -> 81%).
    fn row_element(&mut self, e: Elem, vector: &str) -> String {
        if e != Elem::BF16 {
            return self.loaded(e, format!("{vector}.v[j]"));
        }
        self.helpers.insert("fz_bf16");
        self.helpers.insert("fz_vec_bf16");
        format!("fz_bf16_at({vector}, j)")
    }

    /// The value `v` of type `e` as memory holds it: a narrow float rounded to its bits.
    fn stored(&mut self, e: Elem, v: &str) -> String {
        if !e.is_narrow_float() {
            return v.to_string();
        }
        let (helper, _, from_f32) = narrow_helpers(e);
        self.helpers.insert(helper);
        format!("{from_f32}({v})")
    }

    /// Output `o`'s value as memory holds it: the bits of a cast to its 16-bit type where
    /// `values` declared them in a block still open (rounding the value held in f32 again would
    /// be a second conversion, about seven instructions for bf16), else the value converted.
    fn output_bits(&mut self, o: usize) -> String {
        let (node, elem) = (self.k.outputs[o].node, self.k.outputs[o].elem);
        match self.open_cast(o) {
            Some(_) => format!("h{node}"),
            None => self.stored(elem, &format!("v{node}")),
        }
    }

    /// Where output `o`'s value is a cast to its type whose bits a block still open declared,
    /// the f32 value the cast rounds.
    fn open_cast(&self, o: usize) -> Option<String> {
        let out = &self.k.outputs[o];
        if self.k.nodes[out.node].elem() != out.elem {
            return None;
        }
        self.bits
            .iter()
            .find(|(n, path, _)| *n == out.node && self.blocks.starts_with(path))
            .map(|(.., rounded)| rounded.clone())
    }

    /// Whether a vector store of output `o` holds its values in f32 (`s<o>` a `fz_vec<float,
    /// N>`) and rounds the vector whole as it stores it ([`Self::vector_bits`]): bf16 and the
    /// fp8 types, but for the partial sums, which add to memory in their type, and copies.
    /// (f16's rounding is one instruction an element already; S2's f16 softmax ran 2-9% slower
    /// in the call that rounded its vectors so, beside another change: NOTES item 96.)
    fn rounds_vectors(&self, o: usize) -> bool {
        let out = &self.k.outputs[o];
        // A copy (V4's cache write) kept its element by element rounding: 80-82% of copy
        // speed on an H200, 76-78% with the vector's.
        let copy = matches!(
            self.k.nodes[out.node].op,
            Op::Load(_) | Op::View(..) | Op::Element(..)
        );
        let rounded = matches!(out.elem, Elem::BF16 | Elem::F8E4M3 | Elem::F8E5M2);
        rounded && out.partial.is_none() && !copy
    }

    /// The element type of output `o`'s vector of values to store, `s<o>`.
    fn vector_type(&self, o: usize) -> &'static str {
        match self.rounds_vectors(o) {
            true => "float",
            false => self.k.outputs[o].elem.c_storage(),
        }
    }

    /// Output `o`'s value as an element of `s<o>`: its bits, or where the vector is rounded
    /// whole, its f32 value; for a cast to the output's type, the value the cast rounds (the
    /// same bits again; the cast's own rounding, if nothing else reads it, NVVM drops).
    fn vector_element(&mut self, o: usize) -> String {
        if !self.rounds_vectors(o) {
            return self.output_bits(o);
        }
        let node = self.k.outputs[o].node;
        self.open_cast(o).unwrap_or_else(|| format!("v{node}"))
    }

    /// `s<o>`, output `o`'s vector of values, as memory holds it; with `registers` (the step
    /// computed them from rows already in registers or shared memory, loading nothing), values
    /// that arithmetic computed round without a NaN test (`canonical_nans`). Where the step
    /// also loads, the shorter code let ptxas sink loads below the first values' math: G4's
    /// elementwise backward (three tensors loaded) ran at 87% of copy speed on an H200 against
    /// 92%, G7's rows (a weight and a bias loaded each step) at 57% against 60%
    /// (benches/NOTES.md item 99).
    fn vector_bits(&mut self, o: usize, registers: bool) -> String {
        if !self.rounds_vectors(o) {
            return format!("s{o}");
        }
        let elem = self.k.outputs[o].elem;
        let (helper, ..) = narrow_helpers(elem);
        self.helpers.insert(helper);
        let ty = elem.name();
        match elem {
            Elem::BF16 => self.helpers.insert("fz_vec_bf16"),
            Elem::F8E4M3 => self.helpers.insert("fz_vec_f8e4m3"),
            _ => self.helpers.insert("fz_vec_f8e5m2"),
        };
        if registers && self.canonical_nans(o) {
            if elem == Elem::BF16 {
                self.helpers.insert("fz_vec_bf16_pack");
            }
            return format!("fz_pack_{ty}(s{o})");
        }
        format!("fz_round_{ty}(s{o})")
    }

    /// Whether every NaN among output `o`'s f32 values is the canonical one (0x7fffffff), so
    /// that its vector rounds without a NaN test (`fz_pack_bf16`): values that f32 arithmetic
    /// computes (`+ - * /`, directly or through a cast to the output's type), which on the GPU
    /// makes no other NaN, and `fz_log_normal`'s (its last step an `fmaf`, or `y * inf`). A
    /// value that only moves bits (a load, a negation, `abs`, a select, a min or max) can carry
    /// a NaN's payload, which `fz_round_bf16` keeps as the CPU does.
    fn canonical_nans(&self, o: usize) -> bool {
        let mut node = self.k.outputs[o].node;
        if let Op::Cast(a) = self.k.nodes[node].op {
            node = a;
        }
        let f32 = |n: NodeId| self.k.nodes[n].elem().compute() == Elem::F32;
        matches!(
            self.k.nodes[node].op,
            Op::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div, a, b)
                if f32(node) && f32(a) && f32(b)
        ) || (f32(node) && self.log_of_normal(node))
    }

    fn params(&self) -> String {
        self.param_list()
            .iter()
            .map(|(decl, name)| format!("    {decl} {name}"))
            .collect::<Vec<_>>()
            .join(",\n")
            + "\n"
    }

    /// The kernel's parameters in order (the program's), each as its declared type and its name.
    fn param_list(&self) -> Vec<(String, String)> {
        let k = self.k;
        let param = |p: &Param| -> (String, String) {
            match *p {
                Param::Input(i) => {
                    let (t, name) = self.param_text(i);
                    (format!("const {t}* __restrict__"), format!("p_{name}"))
                }
                Param::Output(j) => {
                    let t = k.outputs[j].stored_elem().c_storage();
                    // Sums over rows store their column sums there, their rows of partial
                    // sums going to the scratch (`out<j>`, `global`).
                    match k.outputs[j].partial {
                        Some(_) => (format!("{t}* __restrict__"), format!("fz_sum{j}")),
                        None => (format!("{t}* __restrict__"), format!("out{j}")),
                    }
                }
                Param::Scalar(i) => {
                    let (t, name) = self.param_text(i);
                    (format!("const {t}"), format!("p_{name}"))
                }
                Param::Dim(i) => {
                    let name = k.named_dims().nth(i).expect("a named dim").1;
                    ("const long long".into(), format!("d_{name}"))
                }
                Param::Reciprocal(j) => {
                    ("const unsigned long long".into(), format!("fz_recip_{j}"))
                }
                Param::RoundKey { seed, round } => (
                    "const unsigned long long".into(),
                    format!("fz_key{seed}_{round}"),
                ),
                Param::Scratch => (
                    "unsigned long long* __restrict__".into(),
                    "fz_scratch".into(),
                ),
                Param::Counter => ("unsigned int* __restrict__".into(), "fz_counter".into()),
            }
        };
        self.program.params.iter().map(param).collect()
    }

    /// The `extern "C" __global__` function of `entry`, around `body`. A `&mut` parameter the
    /// kernel also reads through a slice is read through its output's pointer (`p_<name>`, based
    /// on `out<o>`, so that the compiler orders its loads with the stores).
    fn global(&self, entry: &Entry, body: &str) -> String {
        let bound = entry
            .min_blocks
            .map(|b| format!(", {b}"))
            .unwrap_or_default();
        let mut reads = String::new();
        for (p, o) in self.k.read_written_params() {
            let (t, name) = self.param_text(p);
            reads += &format!("    const {t}* const p_{name} = out{o};\n");
        }
        reads += &self.partial_rows();
        format!(
            "extern \"C\" __global__ void __launch_bounds__({BLOCK}{bound}) {}(\n{}) {{\n{reads}{body}}}\n",
            entry.symbol,
            self.params()
        )
    }

    /// The initializer of an `fz_divisor` for the product of `dims` over `by`. In an elementwise
    /// kernel whose divisor depends on the launch, the reciprocal is a parameter the host
    /// computes (see [`Divisor`]); elsewhere the kernel takes it once per thread, which the
    /// row and full kernels' grid-stride loops amortize (or ptxas folds, for fixed dims).
    fn divisor(&mut self, dims: &[DimId], by: u32) -> String {
        self.helpers.insert("fz_quot");
        let size = match (dims, by) {
            ([d], 1) => format!("(unsigned long long){}", self.layout.size(*d)),
            (_, 1) => format!("(unsigned long long)({})", self.layout.product(dims)),
            _ => format!("(unsigned long long)({}) / {by}", self.layout.product(dims)),
        };
        let launched = dims.iter().any(|&d| self.k.named_index(d).is_some());
        if !(launched && matches!(self.k.launch, Launch::Map { .. })) {
            return format!("fz_divisor_of({size})");
        }
        let divisor = Divisor {
            dims: dims.to_vec(),
            by,
        };
        let j = self
            .program
            .divisors
            .iter()
            .position(|d| *d == divisor)
            .expect("the program lists every divisor of an elementwise kernel");
        format!("{{{size}, fz_recip_{j}}}")
    }

    /// A parameter's storage type and plain name, as in `const float* p_x`.
    fn param_text(&self, p: usize) -> (&'static str, String) {
        let param = &self.k.params[p];
        (
            param.stored_elem().c_storage(),
            crate::ir::plain_name(&param.name),
        )
    }

    fn shape_index(&self, shape: &[DimId]) -> usize {
        self.layout.shape_index(shape)
    }

    /// The shapes whose offsets the loads in `nodes` and the stores of `writes` use.
    fn used_shapes(&self, nodes: &[NodeId], writes: &[usize]) -> BTreeSet<usize> {
        let mut used = BTreeSet::new();
        for &id in nodes {
            if let Op::Load(p) = self.k.nodes[id].op {
                used.insert(self.shape_index(self.k.params[p].shape.as_ref().expect("a tensor")));
            }
        }
        for &o in writes {
            used.insert(self.shape_index(&self.k.outputs[o].shape));
        }
        used
    }

    fn writes(&mut self, outputs: &[usize], scope: Scope) {
        let shapes = self.layout.shapes();
        for &o in outputs {
            let out = &self.k.outputs[o];
            let s = self.shape_index(&out.shape);
            let at = match (scope, &self.k.launch) {
                (Scope::Element | Scope::Lane, _) => format!("o{s}"),
                (Scope::Row, Launch::Rows { .. }) => format!("b{s}"),
                (Scope::Row, _) => {
                    debug_assert!(shapes[s].is_empty());
                    "0".into()
                }
            };
            if out.total {
                // An element the thread adds to its sum (`OutputInfo::total`).
                self.line(format!("fz_tot{o} += v{};", out.node));
                continue;
            }
            let v = self.output_bits(o);
            if let Some(place) = &out.place {
                // Nowhere where it scatters from outside the gathered dim.
                let coord = |d| self.layout.coord(d);
                let (at, inside) = self
                    .layout
                    .view_access(&place.view, &out.shape, coord, &SYNTAX);
                match inside {
                    Some(inside) => self.line(format!("if ({inside}) out{o}[{at}] = {v};")),
                    None => self.line(format!("out{o}[{at}] = {v};")),
                }
                continue;
            }
            if out.packed {
                self.helpers.insert("fz_bits");
                self.line(format!("fz_or_bits(out{o}, {at}, {v} ? 1u : 0u);"));
                continue;
            }
            if out.partial.is_some() && self.partials_in_shared {
                self.line(format!("sp{o}[r - begin] += {v};"));
                continue;
            }
            if out.partial.is_some() {
                // The block's partial sum at this element of the row (`OutputInfo::partial`):
                // its first row stores, later ones add.
                let t = out.elem.c_name();
                self.line(format!(
                    "{{ {t}* const fz_pp = out{o} + (long long)blockIdx.x * len + r; *fz_pp = g0 == blockIdx.x ? {v} : *fz_pp + {v}; }}"
                ));
                continue;
            }
            self.line(format!("out{o}[{at}] = {v};"));
        }
    }

    fn values(&mut self, nodes: &[NodeId], scope: Scope) {
        for &id in nodes {
            let t = self.k.nodes[id].elem().c_name();
            if let (Some((reused, p)), Scope::Element) = (self.reuse, scope) {
                if id == reused {
                    // As `expr` reads the cached element itself; an f32 stored beside a row of
                    // narrow floats from its own array (`rows::row_passes`).
                    let (_, name) = self.param_text(p);
                    let slots = match self.k.params[p].elem.is_narrow_float() {
                        true => "rs",
                        false => "rc",
                    };
                    self.line(format!("const {t} v{id} = {slots}_{name}[q].v[j];"));
                    continue;
                }
            }
            let e = self.expr(id, scope);
            match self.cast_bits.take() {
                // A cast to a narrow float: its bits, then its value from them.
                Some((bits, rounded)) => {
                    let elem = self.k.nodes[id].elem();
                    self.line(format!("const {} h{id} = {bits};", elem.c_storage()));
                    let value = match elem == Elem::BF16 && self.arithmetic_only(id) {
                        true => {
                            self.helpers.insert("fz_bf16_value");
                            format!("fz_bf16_value({rounded})")
                        }
                        false => self.loaded(elem, format!("h{id}")),
                    };
                    self.line(format!("const {t} v{id} = {value};"));
                    self.bits.retain(|(n, ..)| *n != id);
                    // Not at a function's top level, where the path would be open in the
                    // next function printed too (the tiled template, then its entry).
                    if !self.blocks.is_empty() {
                        self.bits.push((id, self.blocks.clone(), rounded));
                    }
                }
                None => self.line(format!("const {t} v{id} = {e};")),
            }
            if scope == Scope::Row {
                self.divider(id);
            }
            self.key(id);
        }
    }

    /// Whether value `id` is only ever an operand of arithmetic and comparisons (through
    /// copies in f32): no output stores it and nothing passes it on whole (a select, a
    /// function such as `abs`, a reduction), so a NaN's payload, which the GPU's arithmetic
    /// does not keep, can show nowhere. Such a cast to bf16 skips its NaN test
    /// (`fz_bf16_value`): G7's `tanh(..) as bf16`, five instructions of its 49 an element.
    fn arithmetic_only(&self, id: NodeId) -> bool {
        use crate::parse::BinOp::*;
        let k = self.k;
        !k.outputs.iter().any(|o| o.roots().contains(&id))
            && k.nodes.iter().enumerate().all(|(n, node)| {
                !node.op.operands().contains(&id)
                    || match node.op {
                        Op::Binary(Add | Sub | Mul | Div | Eq | Ne | Lt | Le | Gt | Ge, ..) => true,
                        Op::Cast(_) => node.elem() == Elem::F32 && self.arithmetic_only(n),
                        _ => false,
                    }
            })
    }

    /// After `v<id>`, a value that seeds random draws: Philox's round keys `rk<id>`, from the
    /// parameters `fz_key<j>_<i>` for a seed that is a parameter, else made from the value.
    fn key(&mut self, id: NodeId) {
        let k = self.k;
        if !k
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::Random(_, seed, _) if seed == id))
        {
            return;
        }
        let key = match k.nodes[id].op {
            Op::Scalar(p) => {
                let j = self
                    .program
                    .seeds
                    .iter()
                    .position(|&s| s == p)
                    .expect("a seed parameter");
                let rounds: Vec<String> = (1..ROUNDS).map(|i| format!("fz_key{j}_{i}")).collect();
                format!("{{{{v{id}, {}}}}}", rounds.join(", "))
            }
            _ => format!("fz_key_of(v{id})"),
        };
        self.helpers.insert("fz_random");
        self.line(format!("const fz_key rk{id} = {key};"));
    }

    /// After `v<id>`, a value computed once per launch or per row of a row kernel: when it
    /// divides f32 elements (f16 and bf16 divide in f32 too), its reciprocal `dv_<id>`, which
    /// each element's division then uses (`fz_div_by`). Elementwise kernels keep `a / b`: they
    /// are bound by memory, and the fallback's call spilled there (`op_div_127`).
    fn divider(&mut self, id: NodeId) {
        if !matches!(self.k.launch, Launch::Rows { .. }) {
            return;
        }
        let divides = self.plan.passes.iter().flat_map(|p| &p.elems).any(|&n| {
            matches!(self.k.nodes[n].op, Op::Binary(crate::parse::BinOp::Div, a, b)
                if b == id && self.k.nodes[a].elem().compute() == Elem::F32)
        });
        if divides {
            self.helpers.insert("fz_div_by");
            self.line(format!("const fz_divider dv_{id} = fz_divider_of(v{id});"));
            self.uniform_divisors.insert(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::kernel;
    use quote::quote;
    use std::path::PathBuf;

    fn source(tokens: proc_macro2::TokenStream) -> String {
        let k = kernel(tokens);
        super::text(&k)
    }

    /// The CUDA text of the language reference's kernels, reviewed as diffs when codegen changes.
    /// `FUSE_BLESS=1 cargo test -p fuse-macros golden` rewrites the files.
    #[test]
    fn golden_sources() {
        let kernels = [
            (
                "softplus",
                quote! { pub fn softplus(x: [f32; n]) -> [f32; n] { (x.exp() + 1.0).ln() } },
            ),
            (
                "sum_exp",
                quote! { pub fn sum_exp(x: [f32; n]) -> f32 { sum(x.exp()) } },
            ),
            (
                "softmax",
                quote! { pub fn softmax(x: [f32; rows, cols]) -> [f32; rows, cols] { let e = (x - max(x, cols)).exp(); e / sum(e, cols) } },
            ),
            (
                "layernorm",
                quote! {
                    pub fn layernorm(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols], eps: f32) -> ([f32; rows, cols], [f32; rows]) {
                        let mu = mean(x, cols);
                        let d = x - mu;
                        let rstd = rsqrt(mean(d * d, cols) + eps);
                        (d * rstd * gamma + beta, rstd)
                    }
                },
            ),
            (
                "softmax_f16",
                quote! { pub fn softmax_f16(x: [f16; rows, cols]) -> [f16; rows, cols] { let e = (x - max(x, cols)).exp(); e / sum(e, cols) } },
            ),
            (
                "bias_grad",
                quote! { pub fn bias_grad(g: [f32; rows, cols]) -> [f32; cols] { sum(g, rows) } },
            ),
            (
                "rmsnorm_quant_fp8",
                quote! {
                    pub fn rmsnorm_quant_fp8(x: [bf16; t, h], w: [bf16; h], eps: f32) -> ([f8e4m3; t, h], [f32; t]) {
                        let xf = x as f32;
                        let y = xf * rsqrt(mean(xf * xf, h) + eps) * (w as f32);
                        let scale = max(y.abs(), h) / 448.0;
                        ((y * (1.0 / scale)) as f8e4m3, scale)
                    }
                },
            ),
            (
                "bias_gelu_dropout",
                quote! { pub fn bias_gelu_dropout(x: [f32; rows, cols], bias: [f32; cols], seed: u64) -> [f32; rows, cols] { dropout(gelu(x + bias), 0.1, seed) } },
            ),
            (
                "silu_and_mul",
                quote! { pub fn silu_and_mul(x: [bf16; t, 2 * d]) -> [bf16; t, d] { silu(x[.., ..d]) * x[.., d..] } },
            ),
            (
                "cache_write",
                quote! { pub fn cache_write(k: [bf16; t, h, d], slot: [i64; t], cache: &mut [bf16; slots, h, d]) { cache[slot, .., ..] = k; } },
            ),
        ];
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden");
        let bless = std::env::var_os("FUSE_BLESS").is_some();
        let mut written = std::collections::BTreeSet::new();
        for (name, tokens) in kernels {
            let k = kernel(tokens);
            let program = crate::plan::program(&k);
            // One file per entry point, `<kernel>.<path>.cu`; of the short rows' entries, which
            // differ only in the lengths they dispatch, and of each path's peeled segments,
            // which differ only in their width, the first.
            let entries = program.entries.iter().zip(super::sources(&k, &program));
            let mut seen = std::collections::BTreeSet::new();
            for (entry, text) in entries {
                use crate::plan::Path::{RowsCached, RowsCachedWide, ShortRows};
                let peeled = crate::plan::peels_cache(entry.path, &entry.when);
                let several = entry.path == ShortRows
                    || (peeled && matches!(entry.path, RowsCached | RowsCachedWide));
                if several && !seen.insert(entry.path.name()) {
                    continue;
                }
                let file = format!("{name}.{}.cu", entry.label());
                let path = dir.join(&file);
                written.insert(file);
                if bless {
                    std::fs::create_dir_all(&dir).unwrap();
                    std::fs::write(&path, &text).unwrap();
                }
                let want = std::fs::read_to_string(&path).unwrap_or_default();
                assert!(want == text, "{} differs from the generated source; review the diff and rerun with FUSE_BLESS=1:\n{text}", path.display());
            }
        }
        // No file is left from an entry that no longer exists.
        for file in std::fs::read_dir(&dir).unwrap() {
            let file = file.unwrap().file_name().into_string().unwrap();
            if bless && !written.contains(&file) {
                std::fs::remove_file(dir.join(&file)).unwrap();
            } else {
                assert!(
                    written.contains(&file),
                    "golden/{file} belongs to no entry point"
                );
            }
        }
    }

    /// Every entry point declares the program's parameters in the program's order, and the
    /// register bound its entry says: the ABI and the bounds are written once, in the plan.
    #[test]
    fn every_entry_declares_the_program_parameters_and_bound() {
        use crate::plan::{Param, Path};
        let kernels = [
            quote! { fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) } },
            quote! {
                fn l(x: [f32; r, c], g: [f32; c], eps: f32) -> ([f32; r, c], [f32; r]) {
                    let d = x - mean(x, c);
                    let s = rsqrt(mean(d * d, c) + eps);
                    (d * s * g, s)
                }
            },
            quote! { fn d(x: [f32; r, c], b: [f32; c], seed: u64) -> [f32; r, c] { dropout(x + b, 0.1, seed) } },
            quote! { fn t(x: [f64; n], w: f64) -> f64 { sum(x * w) } },
        ];
        for tokens in kernels {
            let k = kernel(tokens);
            let program = crate::plan::program(&k);
            let name = |i: usize| crate::ir::plain_name(&k.params[i].name);
            let want: Vec<String> = program
                .params
                .iter()
                .map(|p| match *p {
                    Param::Input(i) | Param::Scalar(i) => format!("p_{}", name(i)),
                    Param::Output(j) => format!("out{j}"),
                    Param::Dim(i) => format!("d_{}", k.named_dims().nth(i).unwrap().1),
                    Param::Reciprocal(j) => format!("fz_recip_{j}"),
                    Param::RoundKey { seed, round } => format!("fz_key{seed}_{round}"),
                    Param::Scratch => "fz_scratch".into(),
                    Param::Counter => "fz_counter".into(),
                })
                .collect();
            for (entry, text) in program.entries.iter().zip(super::sources(&k, &program)) {
                let bound = match entry.min_blocks {
                    Some(b) => format!("__launch_bounds__(256, {b}) {}(\n", entry.symbol),
                    None => format!("__launch_bounds__(256) {}(\n", entry.symbol),
                };
                let start = text
                    .find(&bound)
                    .unwrap_or_else(|| panic!("{bound} in {text}"));
                let list = &text[start + bound.len()..];
                let list = &list[..list.find("\n)").unwrap()];
                let names: Vec<&str> = list
                    .lines()
                    .map(|l| l.trim().trim_end_matches(',').rsplit(' ').next().unwrap())
                    .collect();
                assert_eq!(names, want, "{}", entry.symbol);
                assert_eq!(text.matches("__global__").count(), 1, "{}", entry.symbol);
                let row_path = !matches!(entry.path, Path::Map | Path::Full);
                assert_eq!(entry.min_blocks.is_some(), row_path, "{}", entry.symbol);
            }
        }
    }

    #[test]
    fn fast_math_uses_intrinsics_for_f32_only() {
        let fast = source(
            quote! { #[fast_math] fn f(x: [f32; n], y: [f64; n]) -> ([f32; n], [f64; n]) { (x.exp() / x.sqrt(), y.exp()) } },
        );
        assert!(
            fast.contains("__expf(") && fast.contains("sqrtf("),
            "{fast}"
        );
        assert!(
            fast.contains(" exp(v"),
            "f64 keeps the accurate exp: {fast}"
        );
        let accurate = source(quote! { fn f(x: [f32; n]) -> [f32; n] { x.exp() } });
        assert!(accurate.contains("expf(") && !accurate.contains("__expf"));
    }

    /// A 64-bit product or left shift takes its constant operands through `fz_zero` (ptxas 13.0
    /// made `x << 31` a product by -2^31: p11659), folded products too; a 32-bit one, or one of
    /// two values, does not.
    #[test]
    fn float_comparisons_with_constants_go_through_a_zero() {
        let text = source(quote! {
            fn f(x: [f32; n], y: [f32; n], lo: [f32; n], w: [f64; n]) -> ([f32; n], [bool; n], [bool; n], [f64; n]) {
                (x.abs().clamp(lo, -2.0), x.abs() > -2.0, x < y, w.clamp(-1.0, 1.0))
            }
        });
        // The clamps' constant bounds and the comparison's constant, in f32 and f64.
        for hidden in [
            "(v4 < v2 ? v2 : (v4 > (v6 + __uint_as_float(fz_zero)) ? (v6 + __uint_as_float(fz_zero)) : v4))",
            "(v8 > (v10 + __uint_as_float(fz_zero)))",
            "(v3 < (v14 + __longlong_as_double((long long)fz_zero))",
            "(v3 > (v15 + __longlong_as_double((long long)fz_zero))",
        ] {
            assert!(text.contains(hidden), "{hidden}: {text}");
        }
        // Not a comparison of two tensors, nor the clamp's bound that is one.
        assert!(text.contains("(v0 < v1)"), "{text}");
    }

    #[test]
    fn constant_64_bit_products_and_shifts_go_through_a_zero() {
        let text = source(quote! {
            fn f(x: [i64; n], y: [u64; n], z: [i32; n], s: i64) -> ([i64; n], [u64; n], [i32; n], [i64; n]) {
                ((s << 95).min(x), y * 65536 * 32768, z * 7 << 31, x * s)
            }
        });
        assert!(
            text.contains("__constant__ unsigned int fz_zero = 0u;"),
            "{text}"
        );
        // The shift's amount, and both products of `y` by a constant.
        for hidden in [
            "v3 << ((unsigned int)(v4 ^ fz_zero) & 63u)",
            "(v1 * (v7 ^ fz_zero))",
            "(v8 * (v9 ^ fz_zero))",
        ] {
            assert!(text.contains(hidden), "{hidden}: {text}");
        }
        // Not the 32-bit product and shift, nor `x * s`.
        for plain in [
            "(unsigned int)v2 * (unsigned int)v11",
            "v12 << ((unsigned int)v13 & 31u)",
            "(unsigned long long)v0 * (unsigned long long)v3",
        ] {
            assert!(text.contains(plain), "{plain}: {text}");
        }
    }

    /// A cast to bf16 whose value only arithmetic and comparisons take skips the NaN test of
    /// `fz_f32_to_bf16` (a NaN's payload can show nowhere); one that a function passes on
    /// whole (`abs`), or an output stores, keeps it.
    #[test]
    fn casts_to_bf16_that_only_arithmetic_takes_skip_the_nan_test() {
        let text = source(quote! {
            fn f(x: [f32; n], g: [f32; n]) -> ([f32; n], [f32; n], [f32; n]) {
                let t = (x.tanh() as bf16) as f32;
                let a = (x.exp() as bf16) as f32;
                let c = (x.ln() as bf16) as f32;
                (t * g + 1.0, a.abs(), c)
            }
        });
        assert!(
            text.contains("const float v3 = fz_bf16_value(v2);"),
            "{text}"
        );
        for kept in [6, 9] {
            let from_bits = format!("const float v{kept} = fz_bf16_to_f32(h{kept});");
            assert!(text.contains(&from_bits), "{kept}: {text}");
        }
        assert!(!text.contains("fz_bf16_value(v5)") && !text.contains("fz_bf16_value(v8)"));
    }

    /// A cast to a 16-bit float is rounded once: a store of it writes the bits the cast made,
    /// not the value rounded again; bf16 rounds with one instruction from sm_80.
    #[test]
    fn casts_to_16_bit_floats_are_stored_as_rounded() {
        let text = source(quote! {
            fn f(x: [bf16; n], y: [f32; n]) -> ([bf16; n], [f16; n]) {
                let s = ((x as f32).exp() + 1.0).ln();
                (s as bf16, (y * 2.0) as f16)
            }
        });
        assert!(
            text.contains("const unsigned short h7 = fz_f32_to_bf16(v6);"),
            "{text}"
        );
        // A vector store rounds the values the casts round, a vector at once; a scalar store
        // takes the cast's bits.
        assert!(
            text.contains("s0.v[l] = v6;") && text.contains("out0[o0] = h7;"),
            "{text}"
        );
        assert!(!text.contains("fz_f32_to_bf16(v7)"), "{text}");
        assert!(text.contains("s1.v[l] = h10;"), "{text}");
        assert!(text.contains("= fz_round_bf16(s0);") && !text.contains("fz_round_f16"));
        assert!(text.contains("asm(\"cvt.rn.bf16.f32 %0, %1;\""), "{text}");
    }

    /// A bf16 row's largest element is taken two at a time in bf16 (`max.bf16x2`), and a vector
    /// of values that arithmetic computed from a row in registers rounds without a NaN test (the
    /// GPU's arithmetic makes only the canonical NaN); values that move a NaN's bits as they are
    /// keep the test.
    #[test]
    fn bf16_softmax_packs_its_max_and_its_stores() {
        let text = source(quote! {
            fn f(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
                let e = (x - max(x, cols)).exp();
                e / sum(e, cols)
            }
        });
        assert!(
            text.contains("acc1 = fz_max_bf16(acc1, rc_x[q]);"),
            "{text}"
        );
        assert!(text.contains("= fz_pack_bf16(s"), "{text}");
        // Elementwise stores keep the test: the loads of the shorter code sank below the math.
        let map = source(quote! {
            fn f(a: [bf16; n], b: [bf16; n]) -> [bf16; n] { a * b }
        });
        assert!(
            map.contains("= fz_round_bf16(s0)") && !map.contains("fz_pack_bf16(s"),
            "{map}"
        );
        let f16 = source(quote! {
            fn f(x: [f16; rows, cols]) -> [f16; rows, cols] { x - min(x, cols) }
        });
        assert!(f16.contains("acc1 = fz_min_f16(acc1, rc_x[q]);"), "{f16}");
        let moved = source(quote! {
            fn f(y: [f32; rows, cols]) -> ([bf16; rows, cols], [bf16; rows, cols]) {
                let m = max(y, cols);
                ((-y) as bf16, (y.abs() + m) as bf16)
            }
        });
        assert!(moved.contains("= fz_round_bf16(s0)"), "{moved}");
        assert!(moved.contains("= fz_pack_bf16(s1)"), "{moved}");
        assert!(!moved.contains("fz_max_bf16"), "{moved}");
    }

    /// The fp8 types are bytes in memory converted by their own helpers, a cast rounded once;
    /// loads of 1-byte elements are 8 lanes wide.
    #[test]
    fn fp8s_are_bytes_converted_by_helpers() {
        let text = source(quote! {
            fn f(x: [f8e5m2; n], s: [f32; n]) -> ([f8e4m3; n], [f32; n]) {
                let q = (x as f32 * s) as f8e4m3;
                (q, q as f32)
            }
        });
        assert!(
            text.contains("const unsigned char* __restrict__ p_x"),
            "{text}"
        );
        assert!(text.contains("unsigned char* __restrict__ out0"), "{text}");
        assert!(text.contains("= fz_f8e5m2_to_f32(l_x.v[l]);"), "{text}");
        assert!(
            text.contains("const unsigned char h4 = fz_f32_to_f8e4m3(v3);"),
            "{text}"
        );
        // Stored as a vector of the f32 values, rounded whole: two to an instruction where
        // no value is NaN (`fz_round_f8e4m3`), the bits the cast gives.
        assert!(text.contains("s0.v[l] = v3;"), "{text}");
        assert!(text.contains("[j] = fz_round_f8e4m3(s0);"), "{text}");
        assert!(
            !text.contains("fz_f32_to_f8e4m3(v4)"),
            "rounded once: {text}"
        );
        assert!(
            !text.contains("fz_f16") && !text.contains("fz_bf16"),
            "{text}"
        );
        let text = source(quote! {
            fn g(x: [f8e5m2; n]) -> [f8e4m3; n] { (x * 2.0) as f8e4m3 }
        });
        assert!(text.contains("fz_vec<unsigned char, 8>"), "{text}");
    }

    /// A tensor over the domain's first and last dims, broadcast over the ones between (a
    /// per-token vector over heads), loads vectors: its place is the vector's run within the
    /// last dims plus the first dims' place, one division a vector. It does not count for the
    /// lanes: bf16 `q` loads 16 bytes a vector, f32 `c` two 16-byte halves of one.
    #[test]
    fn broadcasts_over_middle_dims_load_vectors() {
        let text = source(quote! {
            fn f(q: [bf16; t, h, d], c: [f32; t, d]) -> [bf16; t, h, d] { ((q as f32) * c) as bf16 }
        });
        assert!(
            text.contains("const fz_divisor vm1 = {(unsigned long long)d_h, fz_recip_1};"),
            "{text}"
        );
        assert!(
            text.contains("jv1 = (unsigned long long)(fz_divmod((unsigned long long)jq1.q, vm1, small).q * vr1.d) + jq1.r;"),
            "{text}"
        );
        assert!(
            text.contains("reinterpret_cast<const fz_vec<float, 8>*>(p_c) + jv1"),
            "{text}"
        );
        assert!(text.contains("fz_vec<unsigned short, 8> l_q"), "{text}");
        assert!(text.contains("if (d_d % 8 == 0)"), "{text}");
    }

    #[test]
    fn integers_wrap_and_divide_totally() {
        let text = source(
            quote! { fn f(a: [i32; n], b: [i32; n]) -> [i32; n] { a * b + a / b - (a % b) } },
        );
        assert!(
            text.contains("((int)((unsigned int)v0 * (unsigned int)v1))"),
            "{text}"
        );
        assert!(
            text.contains("fz_div(v0, v1)") && text.contains("fz_rem(v0, v1)"),
            "{text}"
        );
        assert!(text.contains("static __device__ __forceinline__ int fz_div(int a, int b)"));
        assert!(
            !text.contains("fz_sigmoid"),
            "only the helpers used are emitted"
        );
    }

    #[test]
    fn logs_of_normal_numbers_skip_the_subnormal_and_zero_cases() {
        let ln_of = |arg: proc_macro2::TokenStream| {
            source(quote! { fn f(x: [f32; n], y: [bf16; n]) -> [f32; n] { (#arg).ln() } })
        };
        for arg in [
            quote! { x.exp() + 1.0 },
            quote! { 1.0 + (y as f32).exp2() },
            quote! { x.abs() * 2.0 + 1.0e-30 + x.exp() },
            quote! { x.max(1.0e-37) },
            quote! { x.exp().max(x.abs() + 0.5) + 0.5 },
        ] {
            let text = ln_of(arg.clone());
            assert!(
                text.contains("fz_log_normal(") && !text.contains("logf("),
                "{arg}: {text}"
            );
        }
        // Subnormal, zero or negative arguments possible, or a bound the rounding of the
        // sum could cross: CUDA's own.
        for arg in [
            quote! { x },
            quote! { x.exp() - 1.0 },
            quote! { x.exp() + -1.0 },
            quote! { x.exp() + 1.0e-38 },
            quote! { x.abs() * 1.0e-20 },
            quote! { x.max(x.exp() + 1.0) },
            quote! { y as f32 + 2.0 },
        ] {
            let text = ln_of(arg.clone());
            assert!(
                text.contains("logf(") && !text.contains("fz_log_normal"),
                "{arg}: {text}"
            );
        }
        let fast = source(quote! {
            #[fast_math]
            fn f(x: [f32; n]) -> [f32; n] { (x.exp() + 1.0).ln() }
        });
        assert!(fast.contains("__logf(") && !fast.contains("fz_log_normal"));
    }

    #[test]
    fn narrow_integers_wrap_at_their_width_and_load_eight_lanes() {
        let text = source(
            quote! { fn f(a: [u16; n], b: [u16; n]) -> ([u16; n], [u16; n]) { (a * b, a << 9) } },
        );
        assert!(
            text.contains("((unsigned short)((unsigned int)v0 * (unsigned int)v1))"),
            "C would multiply in `int`, which can overflow: {text}"
        );
        assert!(text.contains("((unsigned int)v3 & 15u)"), "{text}");
        assert!(
            text.contains("fz_vec<unsigned short, 8> l_a") && text.contains("n / 8"),
            "{text}"
        );
        let text = source(quote! { fn f(a: [f16; n], b: [f16; n]) -> [f16; n] { a * b + 1.0 } });
        assert!(
            text.contains("fz_vec<unsigned short, 8> l_a"),
            "16-byte f16 loads: {text}"
        );
        let text = source(quote! { fn f(a: [f16; n], b: [f16; n]) -> [f16; n] { a / b } });
        assert!(
            text.contains("fz_vec<unsigned short, 8> l_a"),
            "an elementwise f16 division loads 16 bytes too: {text}"
        );
        let text = source(quote! { fn f(a: [i8; n]) -> [f32; n] { a as f32 } });
        assert!(
            text.contains("fz_vec<signed char, 4> l_a"),
            "a 4-byte output keeps four lanes: {text}"
        );
    }

    #[test]
    fn casts_follow_rust() {
        let text = source(
            quote! { fn f(x: [f32; n]) -> ([i32; n], [u64; n], [f64; n]) { (x as i32, x as u64, x as f64) } },
        );
        assert!(
            text.contains("((int)fz_f2i_rz_s32(v0))")
                && text.contains("isnan(v0) ? (unsigned long long)0")
                && text.contains("__float2ull_rz(v0)")
                && text.contains("((double)v0)"),
            "{text}"
        );
        let text = source(quote! { fn f(x: [f64; n]) -> [i32; n] { x as i32 } });
        assert!(
            text.contains("(isnan(v0) ? (int)0 : __double2int_rz(v0))"),
            "an f64 NaN converts to the lowest int: {text}"
        );
    }

    #[test]
    fn roundings_and_clamps_fold_into_conversions() {
        let text = source(quote! {
            fn f(x: [f32; n]) -> ([i8; n], [u8; n], [i16; n], [u32; n], [i32; n], [i8; n], [i8; n]) {
                (
                    x.round().clamp(-127.0, 127.0) as i8,
                    x.floor().clamp(0.0, 300.0) as u8,
                    x.ceil() as i16,
                    x.trunc().clamp(-5.0, 7.5) as u32,
                    x.round().clamp(-9.5, 9.0) as i32,
                    x.round().clamp(1.0, 5.0) as i8,
                    x.clamp(-1.0, -0.5).round() as i8,
                )
            }
        });
        for expected in [
            "((signed char)fz_imax(fz_f2i_ra_s8(v0), (-127)))",
            "((unsigned char)fz_f2i_rm_u8(v0))",
            "((short)fz_f2i_rp_s16(v0))",
            "((unsigned int)fz_imin(fz_f2i_rz_u32(v0), 7u))",
            "((int)fz_iclamp(fz_f2i_ra_s32(v0), (-9), 9))",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        // A clamp that would send NaN elsewhere than 0 (to 1) stays a float clamp, converted;
        // a rounding of a clamp folds, the clamp under it stays.
        assert!(
            text.contains("((signed char)fz_f2i_rz_s8(v29))")
                && text.contains("((signed char)fz_f2i_ra_s8(v35))"),
            "{text}"
        );
    }

    /// `fz_f2i_ra`'s rounding: x + copysign(0.5, x) rounded toward zero, then truncated, is
    /// `x.round()` (half away from zero), for every positive f32 in [2^-2, 2^24] (below: both
    /// are zeros; above: integers, left as they are; negative x: both sides are odd). The sum is
    /// exact in f64, and rounding it toward zero to f32 is the nearest f32 stepped toward zero
    /// where it lies past the sum. (Checked over all 2^32 bit patterns, with the CPU's own
    /// round-toward-zero addition, while writing this.)
    #[test]
    fn round_half_away_by_rz_add() {
        let rz_add_half = |x: f32| {
            let s = x as f64 + 0.5f64.copysign(x as f64);
            let n = s as f32;
            match (n as f64).abs() > s.abs() {
                true => f32::from_bits(n.to_bits() - 1),
                false => n,
            }
        };
        let (lo, hi) = (0.25f32.to_bits(), 16777216.0f32.to_bits());
        let special = [0, 1, 0x3e7f_ffff, 0x4b80_0001, 0x7f80_0000, 0x7f7f_ffff];
        for bits in (lo..=hi).chain(special.into_iter().flat_map(|b| [b, b | 0x8000_0000])) {
            let x = f32::from_bits(bits);
            let (got, want) = (rz_add_half(x).trunc(), x.round());
            assert_eq!(got.to_bits(), want.to_bits(), "{x:e}");
        }
        assert!(rz_add_half(f32::NAN).trunc().is_nan());
    }

    #[test]
    fn full_reductions_finish_in_the_last_block() {
        let text = source(quote! { fn f(x: [f64; n]) -> (f64, f64) { (sum(x), max(x)) } });
        assert!(
            text.contains("atomicAdd(fz_counter, 1u) == gridDim.x - 1"),
            "{text}"
        );
        assert!(
            text.contains("*fz_counter = 0u;"),
            "the last block resets the counter for the next launch"
        );
        assert!(text.contains("fmax(acc"), "{text}");
    }

    /// A product under a row's maximum that a later pass computes again is rounded on its own in
    /// every pass, so `exp(x * y - max)` is `exp(0)` at the maximum; products only summed, and
    /// kernels of one pass, keep their contractions.
    #[test]
    fn products_under_a_maximum_are_not_contracted() {
        let text = source(quote! {
            fn p53(x1: [bf16; a, c], x2: [bf16; a, r, c], x3: [bf16; a, r, c]) -> [bf16; a, c] {
                let v = logsumexp(prod(((x1 * x2).tanh() * 0.0009765625) + 1.0, r) * x3, r);
                sigmoid(v)
            }
        });
        assert_eq!(text.matches("__fmul_rn(").count(), 2, "{text}");
        let f64s = source(quote! {
            fn f(x: [f64; r, c], y: [f64; r, c]) -> [f64; r, c] {
                let e = (x * y - max(x * y, c)).exp();
                e / sum(e, c)
            }
        });
        assert!(f64s.contains("__dmul_rn("), "{f64s}");
        // The functions whose last step is a product: p26365's columns of `to_degrees` under a
        // `logsumexp`, and the GELUs, in every element type.
        let degrees = source(quote! {
            fn p26365(x: [f64; r, c], y: [f16; r, c]) -> [f16; r, c] {
                (logsumexp(x.to_degrees(), r) as f16).min(y)
            }
        });
        assert!(
            degrees.contains("__dmul_rn(v") && !degrees.contains(" * (180.0 / 3.14"),
            "{degrees}"
        );
        let gelus = source(quote! {
            fn f(x: [bf16; r, c], y: [f32; r, c]) -> ([bf16; r, c], [f32; r, c], [f32; r, c]) {
                let g = gelu(x);
                let t = gelu_tanh(y);
                (g - max(g, c), t - logsumexp(t, c), y.to_radians() - max(y.to_radians(), c))
            }
        });
        for name in ["fz_gelu_rn(", "fz_gelu_tanh_rn(", "__fmul_rn(v"] {
            assert!(gelus.contains(name), "{name}: {gelus}");
        }
        for tokens in [
            quote! { fn f(x: [f32; r, c], y: [f32; r, c]) -> [f32; r, c] { x * y - mean(x * y, c) } },
            quote! { fn f(x: [f32; n], y: [f32; n]) -> (f32, [f32; n]) { (max(x * y), x * y + 1.0) } },
        ] {
            let text = source(tokens);
            assert!(!text.contains("__fmul_rn("), "{text}");
        }
    }
}
