//! The whole schedule of one `fn` as a value: its launch's entry points (one per path), the
//! argument list they share (the ABI), each entry's geometry and tuning, and the host-side rule
//! that picks it. The CUDA printer prints one `__global__` per entry from it, `expand` emits it
//! as the runtime's `Program`, and the runtime fills the arguments and picks the entry from it.

use crate::abi::{BLOCK, CACHE, ROUNDS};
use crate::ir::{plain_name, DimId, Kernel, Launch, NodeId, Op};
use crate::plan::rows::{
    cached_bytes, cached_params, chunks_rows, direct_row_cost, fixed_widths, needs_divisors,
    peeled_cache, seed_params, slot_count, tile_eights, tiling, wide_cache, wide_copies_ahead,
    MAX_CHUNKS, SHORT,
};
use crate::plan::{tuning, Plan};
use crate::ty::Elem;

/// The schedule of a kernel: what `plan` computes where, and how it launches.
pub struct Program {
    /// The passes and where each value is computed.
    pub plan: Plan,
    /// The kernel's parameters, in order, as every entry declares them and every launch fills them.
    pub params: Vec<Param>,
    /// The divisors whose reciprocals are parameters (`Param::Reciprocal(j)` is `divisors[j]`).
    pub divisors: Vec<Divisor>,
    /// The scalar parameters that seed random draws (`Param::RoundKey { seed: j, .. }` is
    /// `seeds[j]`), in the order of the kernel's nodes.
    pub seeds: Vec<usize>,
    /// The entry points, in the order the host tries them: the first whose rule holds runs.
    /// The last one takes every shape.
    pub entries: Vec<Entry>,
}

/// One parameter of every entry point, passed in an 8-byte slot.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Param {
    /// Tensor parameter `i` of the kernel (an index into `Kernel::params`): `const T* p_<name>`.
    Input(usize),
    /// Output `j`: `T* out<j>`.
    Output(usize),
    /// Scalar parameter `i` of the kernel: `const T p_<name>`.
    Scalar(usize),
    /// Named dim `i` (in `Kernel::named_dims` order): `const long long d_<name>`.
    Dim(usize),
    /// The reciprocal of `Program::divisors[j]`: `fz_recip_<j>`.
    Reciprocal(usize),
    /// Philox's round key `round` of seed `seed` (an index into `Program::seeds`):
    /// `fz_key<seed>_<round>`.
    RoundKey { seed: usize, round: u32 },
    /// A full or column reduction's per-block partials (`fz_scratch`), which the runtime
    /// provides.
    Scratch,
    /// A full reduction's counter of finished blocks, or a column reduction's one per tile of
    /// columns (`fz_counter`), zero before a launch.
    Counter,
}

/// A divisor of an elementwise kernel's index arithmetic: the product of the sizes of `dims`,
/// divided by `by`. Its reciprocal is a kernel parameter, computed once per launch on the host:
/// in the kernel it was a 64-bit division (a subroutine of about 80 instructions) that every
/// thread ran before its first element, and an elementwise grid gives each thread one vector.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Divisor {
    pub dims: Vec<DimId>,
    pub by: u32,
}

/// The paths a launch can take; each is an entry point of its own.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    /// An elementwise kernel: one thread a vector, grid-stride.
    Map,
    /// A full reduction: grid-stride partials, the last block finishes them.
    Full,
    /// A row kernel's general path: any row length, a segment of a warp or a whole block a
    /// row, rows streamed from memory in every pass.
    Rows,
    /// Rows a multiple of four long that fit in the registers of a segment or a block
    /// (`CACHE` elements a thread), read once.
    RowsCached,
    /// As `RowsCached` for a kernel of 2-byte tensors whose rows are a multiple of eight long,
    /// up to `WIDE_CACHED_ROW`: 16-byte vectors of eight elements, `2 * CACHE` a thread, so
    /// a row of 1024 is a warp's.
    RowsCachedWide,
    /// Rows of `CACHE * BLOCK / 2 + 1` to `CACHE * BLOCK` elements, a multiple of four: a block
    /// a row, the row in registers, `width` a constant (sm_90 and later).
    RowBlock,
    /// Rows of exactly `CACHE * BLOCK` elements: as `RowBlock`, without bounds tests.
    RowBlockExact,
    /// As `RowBlock` for a kernel of 2-byte tensors (those of `RowsCachedWide`): rows of
    /// `CACHE * BLOCK + 1` to `2 * CACHE * BLOCK` elements, a multiple of eight, in 16-byte
    /// vectors of eight, `2 * CACHE` a thread.
    RowBlockWide,
    /// Rows of `CACHE * BLOCK + 1` to `MAX_CHUNKS * CACHE * BLOCK` elements, a multiple of four,
    /// of a kernel whose rows need no value of the whole row and that writes partial sums over
    /// rows (`plan::rows::chunks_rows`): each block a chunk of up to `CACHE * BLOCK` columns of
    /// every row it takes, held in registers as `RowBlock` holds a row (sm_90 and later).
    RowChunks,
    /// Rows of 1 to `SHORT` elements, tiles of whole rows through shared memory.
    ShortRows,
    /// Rows longer than the register cache, in the dynamic shared memory of a block or a
    /// cluster, when the device has it.
    LongRows,
    /// A reduction over a leading or middle dim: a block a tile of `COLUMN_TILE` adjacent
    /// rows (columns, in the bias gradient's terms), each thread one of them, the block's
    /// warps splitting the reduced dim, so that every warp's load is 32 neighbours.
    Columns,
    /// As `Columns`, two adjacent columns a lane, loaded as one pair, so that a warp's load of
    /// 16-bit elements covers a whole 128-byte line (NOTES.md item 87): where the innermost
    /// column dim is even ([`column_pairs`]).
    ColumnPairs,
    /// As `ColumnPairs`, four adjacent columns a lane (an 8-byte load of 16-bit elements, a
    /// tile of 128 columns), where the innermost column dim is a multiple of four.
    ColumnQuads,
}

impl Path {
    /// The suffix of the entry's symbol, after `fuse_<name>`.
    pub fn suffix(self) -> &'static str {
        match self {
            Path::Map | Path::Full | Path::Rows | Path::Columns => "",
            Path::RowsCached => "_cached_rows",
            Path::RowsCachedWide => "_wide_cached_rows",
            Path::RowBlock => "_block_rows",
            Path::RowBlockExact => "_exact_rows",
            Path::RowBlockWide => "_wide_block_rows",
            Path::RowChunks => "_chunked_rows",
            Path::ShortRows => "_short_rows",
            Path::LongRows => "_long_rows",
            Path::ColumnPairs => "_column_pairs",
            Path::ColumnQuads => "_column_quads",
        }
    }

    /// The path's name, as the runtime reports it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Map => "map",
            Path::Full => "full",
            Path::Rows => "rows",
            Path::RowsCached => "cached_rows",
            Path::RowsCachedWide => "wide_cached_rows",
            Path::RowBlock => "block_rows",
            Path::RowBlockExact => "exact_rows",
            Path::RowBlockWide => "wide_block_rows",
            Path::RowChunks => "chunked_rows",
            Path::ShortRows => "short_rows",
            Path::LongRows => "long_rows",
            Path::Columns => "columns",
            Path::ColumnPairs => "column_pairs",
            Path::ColumnQuads => "column_quads",
        }
    }
}

/// How an entry's grid is sized.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Grid {
    /// `vectors` 4-element vectors a thread, as many blocks as that takes.
    Map { vectors: u32 },
    /// A block (or a segment) a row, at most `blocks_per_sm` blocks an SM (0: a block a row).
    Rows { blocks_per_sm: u32 },
    /// As `Rows`, a block a row, for a kernel that sums over rows (`OutputInfo::partial`):
    /// every block resident (a cooperative launch, a barrier of the grid), its row of partial
    /// sums in the launch's scratch, `sums` bytes a column ([`sum_bytes`]).
    Parts { blocks_per_sm: u32, sums: u32 },
    /// As `Parts`, for `Path::RowChunks`: a block a chunk of `CACHE * BLOCK` columns of a row,
    /// each block's chunk the same in every row it takes.
    Chunks { blocks_per_sm: u32, sums: u32 },
    /// A cluster a row, each block caching its part in dynamic shared memory: `cache_bytes`
    /// a row element. With sums over rows (`sums` > 0, as for `Parts`), as many clusters as
    /// are resident, a row of partial sums each.
    LongRows { cache_bytes: u32, sums: u32 },
    /// Grid-stride partials, `slots` scratch slots a block.
    Full { slots: u32 },
    /// A block a tile of columns, up to `blocks_per_sm` blocks an SM; with `split`, tiles are
    /// split along the reduced dim until the grid has them, each part's partials in `slots`
    /// scratch slots a column, finished by the tile's last block.
    Columns {
        slots: u32,
        split: bool,
        blocks_per_sm: u32,
        /// Adjacent columns a lane: a tile is `COLUMN_TILE * width` columns.
        width: u32,
    },
}

/// When the host takes an entry: every condition holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct When {
    /// Row lengths from `min_len` to `max_len` (elementwise and full: the whole range).
    pub min_len: u64,
    pub max_len: u64,
    /// Row lengths that are multiples of this.
    pub multiple_of: u64,
    /// Devices of this compute capability (major * 10 + minor) or later.
    pub min_arch: u32,
    /// Only where the device has the shared memory for the rows (`LongRows`); the runtime
    /// decides, and falls through to the next entry when it has not.
    pub long_rows: bool,
    /// Only where the innermost dim of the groups (a column reduction's columns) has a size
    /// that is a multiple of this.
    pub inner_multiple_of: u64,
}

impl When {
    /// Every launch.
    pub const ALWAYS: When = When {
        min_len: 0,
        max_len: u64::MAX,
        multiple_of: 1,
        min_arch: 0,
        long_rows: false,
        inner_multiple_of: 1,
    };
}

/// One entry point: a `__global__` function of its own, in a CUDA module of its own.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    pub path: Path,
    /// Its symbol, `fuse_<name>` and the path's suffix.
    pub symbol: String,
    /// The `__launch_bounds__` minimum of blocks per SM, which caps its registers; `None` for
    /// none.
    pub min_blocks: Option<u32>,
    pub grid: Grid,
    pub when: When,
}

impl Entry {
    /// The entry's name among its kernel's: its path's, with the longest row for the short rows,
    /// which have several entries (`short_rows_4`), and `_peeled` for the row-a-block entry that
    /// takes any length (`plan::rows::peeled_cache`).
    pub fn label(&self) -> String {
        match self.path {
            Path::ShortRows => format!("{}_{}", self.path.name(), self.when.max_len),
            Path::RowBlock if peels_cache(self.path, &self.when) => {
                format!("{}_peeled", self.path.name())
            }
            Path::RowChunks if exact_chunks(&self.when) => format!("{}_exact", self.path.name()),
            path if peels_cache(path, &self.when) => {
                format!("{}_peeled_{}", path.name(), self.when.max_len)
            }
            // The segments of a constant width (`plan::rows::segment_width`), as their symbols.
            Path::RowsCached if self.when.min_len > 1 => {
                format!("{}_{}", self.path.name(), self.when.max_len)
            }
            path => path.name().to_string(),
        }
    }
}

/// Whether a chunked entry (`Path::RowChunks`) taken `when` is the one for rows a multiple of
/// `CACHE * BLOCK` long, whose chunks all are that long: no bounds tests.
pub fn exact_chunks(when: &When) -> bool {
    when.multiple_of == u64::from(CACHE * BLOCK)
}

/// Whether an entry of `path` taken `when` holds rows in registers at lengths that are no
/// multiple of its vectors (`plan::rows::peeled_cache`): each row's vectors from its first
/// whole one in memory, the fewer than two vectors' worth of elements around them a thread
/// each, beside them (`cuda::rows`).
pub fn peels_cache(path: Path, when: &When) -> bool {
    matches!(
        path,
        Path::RowBlock | Path::RowsCached | Path::RowsCachedWide
    ) && when.multiple_of == 1
}

/// The schedule of checked kernel `k`.
pub fn program(k: &Kernel) -> Program {
    let plan = crate::plan::plan(k);
    let seeds = seed_params(k);
    let divisors = match &k.launch {
        Launch::Map { domain } => map_divisors(k, &plan, domain),
        _ => vec![],
    };
    let params = params(k, &divisors, &seeds);
    let entries = entries(k, &plan);
    Program {
        plan,
        params,
        divisors,
        seeds,
        entries,
    }
}

/// The parameter list: tensors, outputs, scalars, named dims, reciprocals, round keys, and a full
/// reduction's scratch and counter.
fn params(k: &Kernel, divisors: &[Divisor], seeds: &[usize]) -> Vec<Param> {
    let mut ps: Vec<Param> = k.tensor_params().map(|(i, _, _)| Param::Input(i)).collect();
    ps.extend((0..k.outputs.len()).map(Param::Output));
    let scalars = k
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.shape.is_none());
    ps.extend(scalars.map(|(i, _)| Param::Scalar(i)));
    ps.extend((0..k.named_dims().count()).map(Param::Dim));
    ps.extend((0..divisors.len()).map(Param::Reciprocal));
    for seed in 0..seeds.len() {
        ps.extend((1..ROUNDS).map(|round| Param::RoundKey { seed, round }));
    }
    if matches!(k.launch, Launch::Full { .. }) || columns(k) || k.has_partials() {
        ps.extend([Param::Scratch, Param::Counter]);
    }
    ps
}

/// The bytes a column of a block's row of partial sums takes in the launch's scratch
/// (`OutputInfo::partial`): each sum's row at the widest one's stride, so that the kernel and
/// the runtime agree on where each starts with one number.
pub fn sum_bytes(k: &Kernel) -> u32 {
    let sums = k.outputs.iter().filter(|o| o.partial.is_some());
    let widest = sums.clone().map(|o| o.elem.bits() / 8).max().unwrap_or(0);
    sums.count() as u32 * widest
}

/// Whether `k` reduces over a dim other than its domain's last: its rows are strided, and
/// adjacent rows (columns) adjacent in memory.
pub fn columns(k: &Kernel) -> bool {
    matches!(&k.launch, Launch::Rows { domain, axis } if domain.last() != Some(axis))
}

/// Whether the column reduction `k` has entries that take two adjacent columns a lane
/// (`Path::ColumnPairs`, for an even innermost column dim) and four (`Path::ColumnQuads`, for
/// one that is a multiple of four): one column a lane of 16-bit elements loads half a 128-byte
/// line a warp, and ran at 74-79% of copy speed where two reach 93-100% (NOTES.md item 87) and
/// four up to 99% (item 115). Where every tensor along the columns has elements of at
/// most two bytes, in one pass that writes no elements, whose per-column values before the
/// loop read no tensor (the pair shares them) and which needs no column's own position
/// (`index`, a random draw, a slice's coordinates): the bias and weight gradients' column sums.
pub fn column_pairs(k: &Kernel, plan: &Plan) -> bool {
    let Launch::Rows { domain, .. } = &k.launch else {
        return false;
    };
    let Some(inner) = domain.last() else {
        return false;
    };
    let along: Vec<Elem> = k
        .tensor_params()
        .filter(|(_, _, s)| s.last() == Some(inner))
        .map(|(_, p, _)| p.elem)
        .collect();
    let reads = |id: NodeId| {
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            match k.nodes[n].op {
                Op::Load(_) | Op::View(..) | Op::Index(_) | Op::Random(..) => return true,
                ref op => stack.extend(op.operands()),
            }
        }
        false
    };
    columns(k)
        && !along.is_empty()
        && along.iter().all(|e| e.bits() <= 16)
        && k.outputs.iter().all(|o| o.shape.last() == Some(inner))
        && plan.passes.len() == 1
        && plan.passes.iter().all(|p| p.writes.is_empty())
        && !plan.prologue.iter().any(|&id| reads(id))
        && !k
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::Index(_) | Op::Random(..) | Op::View(..)))
}

/// The scratch slots of each reduction of `k`: two for `logsumexp`'s pair, else one.
fn reduction_slots(k: &Kernel) -> u32 {
    k.nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::Reduce(op, ..) => Some(slot_count(op) as u32),
            _ => None,
        })
        .sum()
}

/// The entry points of `k`, in the order the host tries them.
fn entries(k: &Kernel, plan: &Plan) -> Vec<Entry> {
    let symbol = |path: Path| format!("fuse_{}{}", plain_name(&k.name), path.suffix());
    let entry = |path, min_blocks, grid, when| Entry {
        path,
        symbol: symbol(path),
        min_blocks,
        grid,
        when,
    };
    match &k.launch {
        Launch::Map { domain } => {
            let vectors = tuning::map_vectors(k, domain);
            let bound = tuning::map_min_blocks(k);
            vec![entry(Path::Map, bound, Grid::Map { vectors }, When::ALWAYS)]
        }
        Launch::Full { .. } => {
            let slots = reduction_slots(k);
            let bound = tuning::map_min_blocks(k);
            vec![entry(Path::Full, bound, Grid::Full { slots }, When::ALWAYS)]
        }
        Launch::Rows { .. } if columns(k) => {
            // One reducing pass and no element writes: the tile's parts reduce independently.
            let split = plan.passes.len() == 1 && plan.passes[0].writes.is_empty();
            let grid = |width| Grid::Columns {
                slots: reduction_slots(k),
                split,
                blocks_per_sm: tuning::COLUMN_BLOCKS_PER_SM,
                width,
            };
            let bound = Some(tuning::COLUMN_MIN_BLOCKS);
            let mut entries = vec![];
            if column_pairs(k, plan) {
                let slots = reduction_slots(k);
                for (path, width, bound) in [
                    (Path::ColumnQuads, 4, tuning::column_quad_min_blocks(slots)),
                    (Path::ColumnPairs, 2, tuning::column_pair_min_blocks(slots)),
                ] {
                    let when = When {
                        inner_multiple_of: width as u64,
                        ..When::ALWAYS
                    };
                    entries.push(entry(path, Some(bound), grid(width), when));
                }
            }
            entries.push(entry(Path::Columns, bound, grid(1), When::ALWAYS));
            entries
        }
        Launch::Rows { domain, .. } => {
            let bound = Some(tuning::min_blocks(k, plan));
            let rows = Grid::Rows {
                blocks_per_sm: tuning::row_blocks_per_sm(k, domain, plan),
            };
            let register_row = u64::from(CACHE * BLOCK);
            let rows_of = |min_len, max_len, multiple_of, min_arch| When {
                min_len,
                max_len,
                multiple_of,
                min_arch,
                ..When::ALWAYS
            };
            let mut entries = vec![];
            if tiling(k, plan).is_some() {
                // Several entries, each instantiating the tiled template for its lengths only:
                // in one, NVRTC took 38 ms for softmax's (on an H200), the longest of any entry.
                let mut min_len = 1;
                let eights = tile_eights(k, plan);
                for max_len in tuning::SHORT_SPLITS {
                    // 16-bit rows in vectors of eight: a grid of their own.
                    let grid = match eights && (min_len..=max_len).any(|l| l % 8 == 0) {
                        true => Grid::Rows {
                            blocks_per_sm: tuning::SHORT_EIGHTS_BLOCKS_PER_SM,
                        },
                        false => rows,
                    };
                    let mut short = entry(
                        Path::ShortRows,
                        Some(tuning::short_min_blocks(k, plan)),
                        grid,
                        rows_of(min_len, max_len, 1, 0),
                    );
                    short.symbol = format!("{}_{max_len}", short.symbol);
                    entries.push(short);
                    min_len = max_len + 1;
                }
                debug_assert_eq!(min_len, u64::from(SHORT) + 1);
            }
            let fit = tuning::rows_fit_registers(k, plan);
            if wide_cache(k, plan) && fit {
                let blocks = bound.map(|b| tuning::wide_min_blocks(k, plan, b));
                let grid = match wide_copies_ahead(k, plan) {
                    true => Grid::Rows {
                        blocks_per_sm: tuning::WIDE_COPY_BLOCKS_PER_SM,
                    },
                    false => rows,
                };
                entries.push(entry(
                    Path::RowsCachedWide,
                    blocks,
                    grid,
                    rows_of(1, tuning::WIDE_CACHED_ROW, 8, 0),
                ));
            }
            if !cached_params(k, plan).is_empty() && fit {
                let bound = Some(tuning::register_min_blocks(k, plan));
                // Light rows load straight into registers, with a grid of their own, and so
                // do rows reduced twice over two tensors that ask L2 for the next.
                let block = match tuning::direct_blocks_per_sm(k, plan) {
                    0 => rows,
                    blocks_per_sm => Grid::Rows { blocks_per_sm },
                };
                // Compiled for sm_90 and later: ptxas for sm_80 spilled this loop of
                // `w7_layernorm_quantize` around the division's slow-path calls at 64 registers.
                entries.push(entry(
                    Path::RowBlockExact,
                    bound,
                    block,
                    rows_of(register_row, register_row, 4, 90),
                ));
                entries.push(entry(
                    Path::RowBlock,
                    bound,
                    block,
                    rows_of(register_row / 2 + 1, register_row, 4, 90),
                ));
                // 16-bit rows past those, up to twice as long, a block a row in vectors of
                // eight, which the long-row entry would take otherwise: SO's bf16 softmax at
                // 5120 columns ran there at 53% of copy speed on an H200, bound by `expf`
                // twice an element (benches/NOTES.md item 127), where the registers keep
                // `exp(x - max)` in f32: 81% here. Not light rows, which the long-row entry's
                // bulk copies serve better: bf16 RMSNorm at 5120 columns 98% there, 87% here.
                if wide_cache(k, plan) && direct_row_cost(k, plan).is_none() {
                    let blocks =
                        tuning::wide_min_blocks(k, plan, tuning::register_min_blocks(k, plan));
                    entries.push(entry(
                        Path::RowBlockWide,
                        Some(blocks),
                        block,
                        rows_of(register_row + 1, 2 * register_row, 8, 90),
                    ));
                }
                // Segments of a constant width where the length fixes it
                // (`plan::rows::segment_width`): a kernel with partial sums over rows at every
                // width, one whose rows keep f32 slots in short rows.
                for &width in fixed_widths(k, plan) {
                    let max_len = u64::from(width * CACHE);
                    let mut fixed = entry(
                        Path::RowsCached,
                        bound,
                        rows,
                        rows_of(max_len / 2 + 1, max_len, 4, 0),
                    );
                    fixed.symbol = format!("{}_{max_len}", fixed.symbol);
                    entries.push(fixed);
                }
                entries.push(entry(
                    Path::RowsCached,
                    bound,
                    rows,
                    rows_of(1, register_row, 4, 0),
                ));
                // Rows of other lengths: the same entries, each row's vectors from its first
                // whole one (`plan::rows::peeled_cache`): a block a row, then segments (the
                // wide ones where the kernel has them), from `PEELED_MIN_LEN`. Streamed
                // instead, SO's bf16 softmax at 1027 columns ran at 44% of copy speed on an
                // H200, its f32 softmax at 77%.
                if peeled_cache(k, plan) {
                    let mut peeled = |path, bound, grid, when: When| {
                        let mut e = entry(path, bound, grid, when);
                        e.symbol = match path {
                            Path::RowBlock => format!("{}_peeled", e.symbol),
                            _ => format!("{}_peeled_{}", e.symbol, when.max_len),
                        };
                        entries.push(e);
                    };
                    peeled(
                        Path::RowBlock,
                        bound,
                        block,
                        rows_of(register_row / 2 + 1, register_row, 1, 90),
                    );
                    // Segments of a constant width each (`plan::rows::segment_width`): rows from
                    // `PEELED_MIN_LEN` on, up to 512, to 1024, ... to 4096; 16-bit rows in the
                    // wide entries to 2048, in the others only past them (on sm_80).
                    let wide = wide_cache(k, plan);
                    let mut max_len = 2 * (tuning::PEELED_MIN_LEN - 1);
                    while max_len <= register_row {
                        let when = rows_of(max_len / 2 + 1, max_len, 1, 0);
                        if wide && max_len <= tuning::WIDE_CACHED_ROW {
                            // Without the f32 slots of the wide entry above, and its block an
                            // SM fewer: with them, 16-bit softmaxes spilled at 80 registers.
                            peeled(Path::RowsCachedWide, bound, rows, when);
                        } else {
                            peeled(Path::RowsCached, bound, rows, when);
                        }
                        max_len *= 2;
                    }
                }
            }
            // Longer rows of a kernel that needs no value of a whole row, with partial sums
            // over rows: a block a chunk of each (`plan::rows::chunks_rows`), before the
            // long-row entry, which would keep them in shared memory. Rows a multiple of
            // `CACHE * BLOCK` long have an entry of their own, whose chunks are all that long,
            // without bounds tests (as `RowBlockExact`'s rows).
            if chunks_rows(k, plan) && fit {
                let bound = Some(tuning::register_min_blocks(k, plan));
                let max_len = u64::from(MAX_CHUNKS) * register_row;
                let mut exact = entry(
                    Path::RowChunks,
                    bound,
                    rows,
                    rows_of(2 * register_row, max_len, register_row, 90),
                );
                exact.symbol = format!("{}_exact", exact.symbol);
                entries.push(exact);
                entries.push(entry(
                    Path::RowChunks,
                    bound,
                    rows,
                    rows_of(register_row + 1, max_len, 4, 90),
                ));
            }
            let cache_bytes = cached_bytes(k, plan);
            if cache_bytes > 0 {
                let when = When {
                    long_rows: true,
                    ..rows_of(register_row + 1, u64::MAX, 1, 0)
                };
                entries.push(entry(
                    Path::LongRows,
                    bound,
                    Grid::LongRows {
                        cache_bytes,
                        sums: 0,
                    },
                    when,
                ));
            }
            let stream = Some(tuning::stream_min_blocks(k, plan));
            entries.push(entry(Path::Rows, stream, rows, When::ALWAYS));
            if k.has_partials() {
                // Partial sums over rows need each block's rows to be its own: a block (or a
                // segment of one) a row, or a cluster a long row, each block its part of the
                // row; never tiles of short rows.
                let sums = sum_bytes(k);
                // Their blocks stay for the whole launch, as many an SM as the entry's register
                // bound guarantees room for, all resident at once for the barrier before the
                // partials are summed.
                entries.retain(|e| e.path != Path::ShortRows);
                for e in &mut entries {
                    match e.grid {
                        Grid::Rows { blocks_per_sm } if e.path == Path::RowChunks => {
                            e.grid = Grid::Chunks {
                                blocks_per_sm: e.min_blocks.unwrap_or(blocks_per_sm),
                                sums,
                            };
                        }
                        Grid::Rows { blocks_per_sm } => {
                            e.grid = Grid::Parts {
                                blocks_per_sm: e.min_blocks.unwrap_or(blocks_per_sm),
                                sums,
                            };
                        }
                        Grid::LongRows { cache_bytes, .. } => {
                            e.grid = Grid::LongRows { cache_bytes, sums };
                        }
                        _ => {}
                    }
                }
            }
            entries
        }
    }
}

/// The divisors whose reciprocals an elementwise kernel takes as parameters, in the order its
/// loops use them: for each pass, the runs of the broadcast tensors its vector loop steps
/// through (a run's size over the lanes), then the dims its scalar loop splits the linear index
/// by. Only divisors that depend on a named dim; a fixed one is folded in the kernel.
fn map_divisors(k: &Kernel, plan: &Plan, domain: &[DimId]) -> Vec<Divisor> {
    let mut divisors: Vec<Divisor> = vec![];
    let mut add = |dims: &[DimId], by: u32| {
        let divisor = Divisor {
            dims: dims.to_vec(),
            by,
        };
        let launched = dims.iter().any(|&d| k.named_index(d).is_some());
        if launched && !divisors.contains(&divisor) {
            divisors.push(divisor);
        }
    };
    for pass in &plan.passes {
        let (runs, coordinates) = needs_divisors(k, pass, domain);
        for (dims, by) in runs {
            add(&dims, by);
        }
        if coordinates {
            for &d in crate::plan::Layout::divisors(domain) {
                add(&[d], 1);
            }
        }
    }
    divisors
}

#[cfg(test)]
mod tests {
    use super::{program, Grid, Param, Path};
    use crate::plan::tuning;
    use crate::testing::kernel;
    use quote::quote;

    fn paths(tokens: proc_macro2::TokenStream) -> Vec<Path> {
        program(&kernel(tokens))
            .entries
            .iter()
            .map(|e| e.path)
            .collect()
    }

    /// Softmax has every row path; the general one comes last and takes every length.
    #[test]
    fn entries_are_tried_in_order_and_end_with_the_general_path() {
        let softmax = paths(quote! {
            fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        use Path::*;
        assert_eq!(
            softmax,
            [
                ShortRows,
                ShortRows,
                ShortRows,
                ShortRows,
                ShortRows,
                ShortRows,
                ShortRows,
                ShortRows,
                RowBlockExact,
                RowBlock,
                RowsCached,
                RowBlock,
                RowsCached,
                RowsCached,
                RowsCached,
                RowsCached,
                LongRows,
                Rows
            ]
        );
        let column = paths(quote! { fn f(x: [f32; r, c]) -> [f32; c] { sum(x, r) } });
        assert_eq!(column, [Columns]);
        // Rows a thread's registers cannot hold (eight f64 tensors cached over two passes,
        // about 300 registers) have no row-in-registers entry; four (about 180) have them.
        let heavy = paths(quote! {
            fn f(a: [f64; r, c], b: [f64; r, c], d: [f64; r, c], e: [f64; r, c], g: [f64; r, c], h: [f64; r, c], i: [f64; r, c], j: [f64; r, c]) -> [f64; r, c] {
                let s = a + b + d + e + g + h + i + j;
                s - max(s, c)
            }
        });
        assert!(!heavy
            .iter()
            .any(|p| matches!(p, RowBlockExact | RowBlock | RowsCached)));
        assert!(heavy.contains(&LongRows) && heavy.last() == Some(&Rows));
        let four = paths(quote! {
            fn f(a: [f64; r, c], b: [f64; r, c], d: [f64; r, c], e: [f64; r, c]) -> [f64; r, c] {
                let s = a + b + d + e;
                s - max(s, c)
            }
        });
        assert!(four.contains(&RowsCached));
        // 16-bit columns: four a lane where the columns are a multiple of four, two where they
        // are even, one otherwise.
        for tokens in [
            quote! { fn f(x: [bf16; r, c]) -> [bf16; c] { sum(x, r) } },
            quote! { fn f(x: [f16; b, t, c], s: [f32; t]) -> ([f32; b, c], [f16; b, c]) { (sum((x as f32) * s, t), max(x, t)) } },
            quote! { fn f(x: [u8; r, c]) -> [u32; c] { sum(x as u32, r) } },
        ] {
            assert_eq!(paths(tokens), [ColumnQuads, ColumnPairs, Columns]);
        }
        // Not where a column needs its own value before the loop (`w`), its position, a
        // second pass (`logsumexp`'s shift, a maximum used again), or where a tensor along the
        // columns is wider than two bytes.
        for tokens in [
            quote! { fn f(x: [bf16; r, c], w: [bf16; c]) -> [f32; c] { sum((x as f32) * (w as f32).exp(), r) } },
            quote! { fn f(x: [bf16; r, c]) -> [u32; c] { argmax(x, r) } },
            quote! { fn f(x: [bf16; r, c]) -> [f32; c] { sum((x as f32) * (index(c) as f32), r) } },
            quote! { fn f(x: [bf16; r, c]) -> [f32; c] { let m = max(x, r); sum(((x - m) as f32).exp(), r) } },
            quote! { fn f(x: [bf16; r, c]) -> [f32; c] { logsumexp(x as f32, r) } },
            quote! { fn f(x: [bf16; r, 2 * c]) -> [f32; c] { sum(x[.., ..c] as f32, r) } },
            quote! { fn f(x: [bf16; r, c], y: [f32; r, c]) -> [f32; c] { sum((x as f32) * y, r) } },
        ] {
            assert_eq!(paths(tokens), [Columns]);
        }
        assert_eq!(
            paths(quote! { fn f(x: [f32; n]) -> f32 { sum(x) } }),
            [Full]
        );
        assert_eq!(
            paths(quote! { fn f(x: [f32; n]) -> [f32; n] { x * 2.0 } }),
            [Map]
        );
    }

    /// A 16-bit softmax also has the wide cached entry, tried before the row-a-block ones for
    /// rows a multiple of eight long up to 2048, and a wide row-a-block entry for those of 4097
    /// to 8192, tried before the long rows; a kernel with a 4-byte tensor along its rows has
    /// neither.
    #[test]
    fn sixteen_bit_rows_have_a_wide_cached_entry() {
        let k = kernel(quote! {
            fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        let bf16 = program(&k);
        let wide: Vec<_> = bf16
            .entries
            .iter()
            .filter(|e| e.path == Path::RowsCachedWide)
            .collect();
        // And its peeled copies for other lengths from 257, tried after it, a constant width
        // each.
        let [wide, peeled @ ..] = &wide[..] else {
            panic!("wide entries")
        };
        assert_eq!(
            (wide.when.min_len, wide.when.max_len, wide.when.multiple_of),
            (1, 2048, 8)
        );
        let lens: Vec<_> = peeled
            .iter()
            .map(|e| (e.when.min_len, e.when.max_len, e.when.multiple_of))
            .collect();
        assert_eq!(lens, [(257, 512, 1), (513, 1024, 1), (1025, 2048, 1)]);
        assert_eq!(peeled[1].label(), "wide_cached_rows_peeled_1024");
        let width = crate::plan::rows::segment_width(
            &k,
            &crate::plan::plan(&k),
            Path::RowsCachedWide,
            &peeled[1].when,
        );
        assert_eq!(width, Some(32));
        let at = |p: Path| bf16.entries.iter().position(|e| e.path == p).unwrap();
        assert!(at(Path::RowsCachedWide) < at(Path::RowBlockExact));
        let block = &bf16.entries[at(Path::RowBlockWide)];
        assert_eq!(
            (
                block.when.min_len,
                block.when.max_len,
                block.when.multiple_of
            ),
            (4097, 8192, 8)
        );
        assert!(at(Path::RowBlockWide) < at(Path::LongRows));
        let text = crate::cuda::text(&kernel(quote! {
            fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        }));
        assert!(
            text.contains("fz_vec<unsigned short, 8> rc_x[4];"),
            "{text}"
        );
        // Its rows are copied ahead, 16 bytes a `cp.async`, and `exp(x - max)` is kept for the
        // last pass in f32 slots, at a block an SM fewer than the other row entries.
        assert!(
            text.contains("__shared__ fz_vec<unsigned short, 8> pf_x alignas(128) [2][1024];"),
            "{text}"
        );
        assert!(text.contains("fz_vec<float, 8> rs_x[4];"), "{text}");
        assert!(
            text.contains("__launch_bounds__(256, 3) fuse_s_wide_cached_rows("),
            "{text}"
        );
        assert!(
            text.contains("__launch_bounds__(256, 4) fuse_s_exact_rows("),
            "{text}"
        );
        // The wide row a block: a thread's 32 elements in 16 registers and their 32 f32 slots,
        // at a block an SM fewer too.
        assert!(
            text.contains("__launch_bounds__(256, 3) fuse_s_wide_block_rows("),
            "{text}"
        );
        // A per-row f32 output is written once a row: the rows stay wide.
        let per_row = paths(quote! {
            fn s(x: [bf16; r, c]) -> ([bf16; r, c], [f32; r]) {
                let e = (x - max(x, c)).exp();
                (e / sum(e, c), max(x, c) as f32)
            }
        });
        assert!(per_row.contains(&Path::RowsCachedWide));
        // An f32 tensor along the row would need 32-byte vectors.
        let mixed = paths(quote! {
            fn s(x: [bf16; r, c], g: [f32; c]) -> [bf16; r, c] {
                let e = (x - max(x, c)).exp();
                (e / sum(e, c) * (g as bf16))
            }
        });
        assert!(!mixed.contains(&Path::RowsCachedWide) && !mixed.contains(&Path::RowBlockWide));
    }

    /// The short-row entries that take 16-bit rows in vectors of eight have a grid of their
    /// own; rows of other types, or with a tensor along the row besides the tile's, the row
    /// grid.
    #[test]
    fn sixteen_bit_short_rows_in_eights_have_their_own_grid() {
        let grids = |tokens| -> Vec<(u64, Grid)> {
            program(&kernel(tokens))
                .entries
                .into_iter()
                .filter(|e| e.path == Path::ShortRows)
                .map(|e| (e.when.max_len, e.grid))
                .collect()
        };
        let rows = Grid::Rows { blocks_per_sm: 160 };
        let eights = Grid::Rows {
            blocks_per_sm: tuning::SHORT_EIGHTS_BLOCKS_PER_SM,
        };
        let bf16 = grids(quote! {
            fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        let wanted: Vec<(u64, Grid)> = tuning::SHORT_SPLITS
            .iter()
            .map(|&max| (max, if max % 8 == 0 { eights } else { rows }))
            .collect();
        assert_eq!(bf16, wanted);
        let f32 = grids(quote! {
            fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        assert!(f32.iter().all(|&(_, g)| g == rows), "{f32:?}");
        let gamma = grids(quote! {
            fn s(x: [bf16; r, c], g: [bf16; c]) -> [bf16; r, c] { x * g / sum(x, c) }
        });
        assert!(
            !gamma.is_empty() && gamma.iter().all(|&(_, g)| g == rows),
            "{gamma:?}"
        );
    }

    /// A 16-bit softmax's long rows take the row's maximum two elements an instruction, as the
    /// register paths and the tiled short rows do, from the vector read out of shared memory.
    #[test]
    fn sixteen_bit_long_rows_take_their_maximum_in_pairs() {
        let text = crate::testing::entry_source(
            quote! {
                fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
            },
            Path::LongRows,
        );
        assert!(
            text.contains("acc1 = fz_max_bf16(acc1, rc_x[q]);"),
            "{text}"
        );
    }

    /// Every length and architecture has exactly one first entry, and the general path is
    /// reached by every length the others decline.
    #[test]
    fn every_row_length_has_an_entry() {
        let p = program(&kernel(quote! {
            fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        }));
        let first = |len: u64, arch: u32| {
            p.entries.iter().find(|e| {
                let w = e.when;
                len >= w.min_len
                    && len <= w.max_len
                    && len.is_multiple_of(w.multiple_of)
                    && arch >= w.min_arch
                    && !w.long_rows
            })
        };
        let pick = |len: u64, arch: u32| first(len, arch).map(|e| e.path);
        assert_eq!(pick(3, 90), Some(Path::ShortRows));
        assert_eq!(pick(7, 90), Some(Path::ShortRows));
        assert_eq!(pick(32, 90), Some(Path::ShortRows));
        // Lengths that are no multiple of four take the peeled copies of the register entries
        // from 257: segments, a block a row from 2049 on sm_90.
        let peeled = |len: u64, arch: u32| {
            let e = first(len, arch).unwrap();
            (e.path, e.symbol.contains("_peeled"))
        };
        assert_eq!(pick(33, 90), Some(Path::Rows));
        assert_eq!(peeled(36, 90), (Path::RowsCached, false));
        assert_eq!(pick(37, 90), Some(Path::Rows));
        assert_eq!(pick(255, 90), Some(Path::Rows));
        assert_eq!(peeled(257, 90), (Path::RowsCached, true));
        assert_eq!(peeled(1027, 80), (Path::RowsCached, true));
        assert_eq!(peeled(2048, 90), (Path::RowsCached, false));
        assert_eq!(peeled(2047, 90), (Path::RowsCached, true));
        assert_eq!(peeled(2052, 90), (Path::RowBlock, false));
        assert_eq!(peeled(2051, 90), (Path::RowBlock, true));
        assert_eq!(peeled(2052, 80), (Path::RowsCached, false));
        assert_eq!(peeled(2051, 80), (Path::RowsCached, true));
        assert_eq!(peeled(4096, 90), (Path::RowBlockExact, false));
        assert_eq!(peeled(4095, 90), (Path::RowBlock, true));
        assert_eq!(pick(4100, 90), Some(Path::Rows));
        assert_eq!(pick(4099, 90), Some(Path::Rows));
    }

    /// The register entries' peeled copies (a block a row, segments, and the wide segments of
    /// 16-bit rows) are there where every tensor along the row is of the domain and nothing
    /// counts on a vector starting at a multiple of four: not beside a weight along the row,
    /// random draws along it or a position's quotient.
    #[test]
    fn register_rows_peel_where_vectors_may_start_anywhere() {
        let peeled = |tokens| {
            program(&kernel(tokens))
                .entries
                .iter()
                .filter(|e| e.symbol.contains("_peeled"))
                .count()
        };
        assert_eq!(
            peeled(quote! {
                fn s(x: [bf16; r, c], y: [bf16; r, c], l: [i64; r]) -> ([f32; r, c], [f32; r]) {
                    let z = (x * y) as f32;
                    let e = (z - max(z, c)).exp();
                    (e / sum(e, c), sum(if index(c) as i64 == l { z } else { 0.0 }, c))
                }
            }),
            5
        );
        // A block a row, the wide segments to 2048 and the others past them.
        assert_eq!(
            peeled(quote! {
                fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
            }),
            5
        );
        for tokens in [
            quote! { fn f(x: [f32; r, c], w: [f32; c]) -> [f32; r, c] { x * rsqrt(mean(x * x, c) + 1e-6) * w } },
            quote! { fn d(x: [f32; r, c], seed: u64) -> [f32; r, c] { dropout(x - max(x, c), 0.5, seed) } },
            quote! { fn q(x: [f32; r, c]) -> [f32; r, c] { x - max(x, c) + (index(c) / 4) as f32 } },
        ] {
            assert_eq!(peeled(tokens), 0);
        }
    }

    /// A value the macro derives itself (no user tokens behind it) is planned and printed as
    /// any other: what a derived backward kernel is made of.
    #[test]
    fn derived_values_are_planned_and_printed() {
        use crate::ir::{Node, Op};
        use crate::parse::BinOp;
        use crate::ty::Elem;
        let mut k = kernel(quote! { fn f(x: [f32; n]) -> [f32; n] { x * 2.0 } });
        let out = k.outputs[0].node;
        let shape = k.nodes[out].shape.clone();
        k.nodes.push(Node::derived(
            Op::Binary(BinOp::Add, out, out),
            Elem::F32,
            shape,
        ));
        let derived = k.nodes.len() - 1;
        k.outputs[0].node = derived;
        assert!(k.nodes[derived].is_derived() && !k.nodes[out].is_derived());
        let p = program(&k);
        assert!(p.plan.passes[0].elems.contains(&derived));
        let text = crate::cuda::sources(&k, &p).concat();
        assert!(
            text.contains(&format!("v{derived} = (v{out} + v{out})")),
            "{text}"
        );
        let cpu = crate::cpu::body(&k, &p.plan);
        assert!(cpu.contains(&format!("v{derived}")), "{cpu}");
    }

    /// The argument order: tensors, outputs, scalars, dims, reciprocals, round keys, scratch.
    #[test]
    fn parameters_come_in_abi_order() {
        let p = program(&kernel(quote! {
            fn f(x: [f32; r, c], b: [f32; c], seed: u64, s: f32) -> ([f32; r, c], f32) {
                let y = dropout(x + b, 0.1, seed) * s;
                (y, sum(y))
            }
        }));
        let want = [
            Param::Input(0),
            Param::Input(1),
            Param::Output(0),
            Param::Output(1),
            Param::Scalar(2),
            Param::Scalar(3),
            Param::Dim(0),
            Param::Dim(1),
        ];
        assert_eq!(p.params[..8], want);
        let keys: Vec<&Param> = p.params[8..17].iter().collect();
        assert!(keys.iter().enumerate().all(|(i, &&k)| k
            == Param::RoundKey {
                seed: 0,
                round: i as u32 + 1
            }));
        assert_eq!(p.params[17..], [Param::Scratch, Param::Counter]);
    }

    /// An elementwise kernel's broadcast takes the reciprocal of its run (over the lanes) and
    /// of the dims its scalar loop splits by; fixed dims take none.
    #[test]
    fn broadcasts_divide_by_reciprocals_from_the_host() {
        let p = program(&kernel(quote! {
            fn f(x: [f32; r, c], b: [f32; c]) -> [f32; r, c] { x + b }
        }));
        assert_eq!(p.divisors.len(), 2, "{:?}", p.divisors);
        assert_eq!((p.divisors[0].by, p.divisors[1].by), (4, 1));
        let fixed = program(&kernel(quote! {
            fn f(x: [f32; r, 8], b: [f32; 8]) -> [f32; r, 8] { x + b }
        }));
        assert!(fixed.divisors.is_empty());
    }
}
