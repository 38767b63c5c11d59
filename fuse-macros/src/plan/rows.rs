//! What a row kernel keeps on chip, decided once for every path: the tensors cached across a
//! row's passes, whether rows are copied ahead or loaded directly, the values a pass stores for
//! later ones, the short rows' tiles and the long rows' shared memory. The CUDA printer reads
//! these answers; it asks no question of its own.

use crate::abi::{BLOCK, CACHE};
use crate::ir::{DimId, Kernel, Launch, NodeId, Op, Reduce};
use crate::parse::BinOp;
use crate::plan::{Layout, Pass, Path, Plan};
use crate::ty::Elem;
use std::collections::BTreeSet;

/// Whether the rows that fit in registers are copied into shared memory ahead (`cp.async`; in
/// the row-a-block loop one bulk copy, `fz_copy_row`), the next row while the block reduces the
/// current one, so that each block keeps bytes in flight instead of alternating between loading
/// and computing. Two buffers of `CACHE * BLOCK` elements: done for one whole-domain tensor of
/// 4-byte elements (32 KB), unless the rows are light enough to load directly
/// (`direct_row_cost`, which `rows_body` asks as well). The row-a-block loop copies two 16-bit
/// rows ahead too ([`block_copies_ahead`]).
pub(crate) fn prefetches(k: &crate::ir::Kernel, cached: &[usize]) -> bool {
    matches!(cached, [p] if k.params[*p].elem.bits() == 32)
}

/// Whether the row-a-block loop copies its next row into shared memory ahead, in bulk: where
/// [`prefetches`] allows it and the rows are not light ([`direct_row_cost`]); and, light or
/// not, for two cached tensors or more whose elements add up to at most 4 bytes (two 16-bit
/// tensors: the same 32 KB of buffers as one f32 row) where each block goes through many rows
/// (the partial sums' grid, a few blocks an SM, or `tuning::NEXT_ROW_BLOCKS_PER_SM`), in
/// kernels that draw no random numbers, on the entry of rows of exactly `CACHE * BLOCK`
/// elements (`exact`: a bulk copy moves whole 16-byte units from 16-byte-aligned addresses,
/// which 16-bit rows a multiple of four long need not be). Measured on an H200 against loading
/// straight into registers with the next row asked of L2 (benches/NOTES.md item 118): G6
/// (softmax backward, 12 blocks an SM) 92 -> 97%, G2 75 -> 77%, G7 66 -> 68%, G2T 75 -> 78%;
/// G6T, whose blocks take a row or two at 160 an SM, 99 -> 93% (so not there).
///
/// Only in kernels that reduce their rows: a block reduction's barrier is what keeps the copy
/// into a buffer from landing before every thread has read the row it held a row earlier.
pub(crate) fn block_copies_ahead(k: &Kernel, plan: &Plan, cached: &[usize], exact: bool) -> bool {
    let stays = k.has_partials() || crate::plan::tuning::long_lived_blocks(k, plan);
    let several = exact && stays && cached.len() >= 2 && bytes(k, cached) <= 4 && !k.draws_random();
    let copies = several || (prefetches(k, cached) && direct_row_cost(k, plan).is_none());
    copies && plan.reducing_passes() >= 1
}

/// Whether a row-a-block loop that reads its rows straight into registers (not copied ahead,
/// [`prefetches`]) asks L2 for the block's next row while its passes run: for rows of two
/// cached tensors or more, or of elements of at most 2 bytes (bf16 and f16 measured), in
/// kernels that draw no random numbers. Measured on an H200 (benches/NOTES.md item 113): S2's
/// bf16 softmax at 4096 columns 85 -> 94% of copy speed, f16 87 -> 96%, G1 71 -> 81%, G2 61 ->
/// 75%, G6 69 -> 78%, G7 61 -> 66%, V2 61 -> 63%; but W5's f32 softmax, one f32 row already at
/// the copy ceiling, 1.3% slower, and G8, whose Philox rounds bound it, 2.5% slower.
pub(crate) fn next_row_to_l2(k: &Kernel, cached: &[usize]) -> bool {
    let narrow = cached.iter().all(|&p| k.params[p].elem.bits() <= 16);
    !cached.is_empty() && !k.draws_random() && (cached.len() >= 2 || narrow)
}

/// Whether a segmented loop of rows in registers with partial sums over rows (whose blocks
/// each go through many steps of rows) asks L2 for the block's next step's rows while this
/// step's passes run: where [`next_row_to_l2`] allows it and the register bound leaves two
/// blocks an SM or fewer (`tuning::min_blocks`), too few warps to keep enough loads in flight
/// on their own. Measured on an H200 (benches/NOTES.md item 120): G2's backward (two outputs'
/// partial sums, two blocks an SM) at 256 columns 52 -> 56% of copy speed, at 1024 40 -> 43%,
/// G7's 46 -> 47% and 42 -> 44%; G1's (one output's, three blocks an SM) at 256 columns 79 ->
/// 76%.
pub(crate) fn segments_ask_l2(k: &Kernel, plan: &Plan, cached: &[usize]) -> bool {
    k.has_partials() && next_row_to_l2(k, cached) && crate::plan::tuning::min_blocks(k, plan) <= 2
}

/// The segment widths (threads a row) of the rows in registers that kernels with partial sums
/// over rows take at a constant width: rows of `width * CACHE / 2 + 1` to `width * CACHE`
/// elements (129 to 256, ... 1025 to 2048), `width`, `lane` and `per_block` constants, and the
/// first half of each row always in it. At a width known only when the kernel runs, every
/// vector's place (`lane + q * width`), its bounds test, and both sides of each reduction's
/// `width > 32` stayed in the row loop: 73 instructions an element for G2's backward against the
/// 55 of the row-a-block entry (benches/NOTES.md item 120).
pub(crate) const SEGMENT_WIDTHS: [u32; 4] = [16, 32, 64, 128];

/// The constant widths of the general cached entry's segments in a kernel without partial sums
/// over rows whose rows keep f32 slots ([`narrow_slots`]): rows of 65 to 128 and 129 to 256
/// elements (eight and sixteen threads of four vectors). At a width set when the kernel ran,
/// each of a row's reductions tested the width before each of five shuffles: SO's bf16 softmax
/// at 100 columns, eight threads a row, took 60 registers and ran at 82% of copy speed on an
/// H100, at 90% with a constant width (benches/NOTES.md items 136 and 138). Other rows' kernels
/// ran slower with them there: the f32 softmax by 1.6%, the bf16 RMSNorm's by 6.5%.
pub(crate) const SHORT_SEGMENT_WIDTHS: [u32; 2] = [8, 16];

/// The constant width of a segments' entry (threads a row) of `path` that `when` takes: for the
/// widths [`fixed_widths`] lists, and for the peeled entries
/// (`plan::peels_cache`, rows of `width * elems / 2 + 1` to `width * elems`, `elems` a thread's
/// `CACHE` elements, twice as many on the wide entry); `None` where it is set when the kernel
/// runs. At a width set when it ran, the wide peeled entry of an f16 softmax spilled 20 bytes
/// at its 80 registers, none at a constant one (a bf16 softmax's, until its f32 slots went too).
pub(crate) fn segment_width(
    k: &Kernel,
    plan: &Plan,
    path: Path,
    when: &crate::plan::When,
) -> Option<u32> {
    let elems = match path {
        Path::RowsCached => CACHE,
        Path::RowsCachedWide => 2 * CACHE,
        _ => return None,
    };
    let width = u32::try_from(when.max_len / u64::from(elems)).ok()?;
    let fixed = when.max_len == u64::from(width * elems) && when.min_len == when.max_len / 2 + 1;
    let listed = path == Path::RowsCached && fixed_widths(k, plan).contains(&width);
    (fixed && (listed || crate::plan::peels_cache(path, when))).then_some(width)
}

/// The widths of the general cached entry's segments that have entries of their own, each for
/// the rows whose length fixes it (`segment_width`): a kernel with partial sums over rows at
/// [`SEGMENT_WIDTHS`], one whose rows keep f32 slots ([`narrow_slots`]) and draws no random
/// value (whose rows defer no division: untried there) at [`SHORT_SEGMENT_WIDTHS`], others at
/// none.
pub(crate) fn fixed_widths(k: &Kernel, plan: &Plan) -> &'static [u32] {
    if k.has_partials() {
        &SEGMENT_WIDTHS
    } else if narrow_slots(k, plan, &cached_params(k, plan)) && !k.draws_random() {
        &SHORT_SEGMENT_WIDTHS
    } else {
        &[]
    }
}

/// Whether the general cached entry's rows of the `cached` tensors keep the values their passes
/// store for later ones in f32 slots (`rs_<name>`): rows of one tensor of 16-bit floats whose
/// passes store something ([`f32_slots`]). Not fp8 rows: an e4m3 softmax spilled 12 bytes on
/// sm_80 at its 64 registers with them; not f32 or several tensors: their slots would be the
/// row's own registers, which spilled `w7_layernorm_quantize` (`row_passes`).
pub(crate) fn narrow_slots(k: &Kernel, plan: &Plan, cached: &[usize]) -> bool {
    matches!(cached, [p] if matches!(k.params[*p].elem, Elem::F16 | Elem::BF16))
        && f32_slots(k, plan, cached)
}

/// The tensors worth keeping in registers across a row's passes: those over the whole domain
/// (the row's own elements, contiguous along the reduced dim). With partial sums over rows
/// (`OutputInfo::partial`), also in one pass: a thread's elements are then the same slots of
/// every row, and its partial sums add up in registers.
pub(crate) fn cached_params(k: &Kernel, plan: &Plan) -> Vec<usize> {
    let Launch::Rows { domain, axis } = &k.launch else {
        return vec![];
    };
    if (plan.passes.len() < 2 && !k.has_partials()) || domain.last() != Some(axis) {
        return vec![];
    }
    k.tensor_params()
        .filter(|(_, _, s)| s.as_slice() == domain.as_slice())
        .map(|(i, _, _)| i)
        .collect()
}

/// The most chunks a row of the chunked entry (`Path::RowChunks`) is split into: rows of up to
/// 64 times a block's registers' worth of elements (262,144), whose chunks a grid of a few
/// blocks an SM takes all at once; longer rows take the long-row or the streamed entry.
pub(crate) const MAX_CHUNKS: u32 = 64;

/// Whether a kernel's rows longer than a block's registers hold (`CACHE * BLOCK` elements)
/// have the chunked entry (`Path::RowChunks`): each block a chunk of up to `CACHE * BLOCK`
/// columns of every row it takes, in registers as a row a block's are, its partial sums
/// over rows in registers. For a kernel whose rows need no value of the whole row (one pass,
/// no reduction along it) and that writes partial sums over rows: a bias's gradient beside an
/// elementwise one, as G8's. Every tensor along the row has it last, so that a chunk is the
/// same offset away in each, and none is read through a view along it. The long-row entry
/// took such rows before: each element copied into shared memory and read back, the partial
/// sums added up there, G8 at 16384 columns ran at 25% of copy speed on an H200 against 49%
/// at 4096 in registers; in chunks, 47% (benches/NOTES.md items 121 and 133).
pub(crate) fn chunks_rows(k: &Kernel, plan: &Plan) -> bool {
    let Launch::Rows { axis, .. } = &k.launch else {
        return false;
    };
    let last = |shape: &[DimId]| !shape.contains(axis) || shape.last() == Some(axis);
    let live = crate::fusion::live_nodes(&k.body());
    let views = k
        .nodes
        .iter()
        .enumerate()
        .any(|(i, n)| live[i] && matches!(n.op, Op::View(..)) && n.shape.contains(axis));
    k.has_partials()
        && plan.passes.len() == 1
        && plan.reducing_passes() == 0
        && !cached_params(k, plan).is_empty()
        && k.tensor_params().all(|(_, _, s)| last(s))
        && k.outputs.iter().all(|o| last(&o.shape))
        && !views
}

/// Whether a kernel's rows a block in registers (`Path::RowBlock`, 2049 to 4096 elements) also
/// have an entry for lengths that are no multiple of four (`When::multiple_of` 1, its symbol
/// ending in `_peeled`): each row's vectors from the first whole one in memory, the elements
/// before and after them streamed in each pass (`cuda::rows`'s `peels_cache`). Where every
/// tensor along the row is of the domain (one offset to a whole vector in all of them), and
/// nothing counts on a vector starting at a multiple of its lanes (as the streamed rows'
/// `peels`): no random values along the row, no quotients of a position, no partial sums over
/// rows. On an H200 (benches/NOTES.md item 128), SO's rows of 4095 columns ran at 96% of copy
/// speed there against 70% streamed (f32 softmax), 78 against 41% (bf16 softmax), 97 against
/// 79% (bf16 RMSNorm). The segments' entry (`cached_rows`) peeled too ran slower than streamed
/// at 1027 columns (f32 softmax 70 against 76%, bf16 softmax 31 against 44%): each pass waits
/// on its few streamed elements' loads, in rows four times shorter.
pub(crate) fn peeled_cache(k: &Kernel, plan: &Plan) -> bool {
    let Launch::Rows { domain, axis } = &k.launch else {
        return false;
    };
    let along = |shape: &[DimId]| shape.last() == Some(axis);
    let live = crate::fusion::live_nodes(&k.body());
    let counts_on_lanes = k.nodes.iter().enumerate().any(|(i, n)| {
        live[i]
            && match n.op {
                Op::Random(..) => along(&n.shape),
                Op::Binary(BinOp::Div, a, _) => matches!(k.nodes[a].op, Op::Index(d) if d == *axis),
                _ => false,
            }
    });
    !cached_params(k, plan).is_empty()
        && !k.has_partials()
        && !counts_on_lanes
        && k.tensor_params().all(|(_, _, s)| !along(s) || s == domain)
        && k.outputs
            .iter()
            .all(|o| !along(&o.shape) || o.shape == *domain)
}

/// Whether a kernel's cached rows also have the wide entry (`Path::RowsCachedWide`): every
/// cached tensor of 2-byte elements and every tensor along the row of at most 2 (`row_elems`),
/// so that each of its vectors, the outputs' included, is at most 16 bytes at eight lanes.
/// With four lanes a thread held 16 elements in 8-byte vectors, and a bf16 softmax's rows of
/// 1024 took 64 threads and a block reduction: 64% of copy speed on an H100 against f32's
/// 100% (NOTES item 76).
pub(crate) fn wide_cache(k: &Kernel, plan: &Plan) -> bool {
    let cached = cached_params(k, plan);
    !cached.is_empty()
        && cached.iter().all(|&p| k.params[p].elem.bits() == 16)
        && row_elems(k).all(|e| e.bits() <= 16)
}

/// Whether the wide entry copies each block's next rows into shared memory ahead (`cp.async`)
/// while it works on the current ones: one cached tensor whose rows are not the lightest,
/// either heavy (`direct_row_cost` none, which every row entry copies ahead where it can) or
/// light at more than [`WIDE_DIRECT_COST`] an element. Its grid is then its own
/// (`tuning::WIDE_COPY_BLOCKS_PER_SM`), so that each block goes through enough rows for the copy
/// ahead to cover their loads.
pub(crate) fn wide_copies_ahead(k: &Kernel, plan: &Plan) -> bool {
    wide_cache(k, plan)
        && cached_params(k, plan).len() == 1
        && direct_row_cost(k, plan).is_none_or(|cost| cost > WIDE_DIRECT_COST)
}

/// The most an element may cost (`element_cost`) for the wide entry to load its rows straight
/// into registers: 8, the class of the lightest rows (`tuning::direct_blocks_per_sm`). Measured
/// on an H200 (benches/NOTES.md item 122), % of copy speed, loaded directly / copied ahead:
/// RMSNorm without a weight (cost 6) at 512, 1024 and 2048 columns 101 / 97, 100 / 97, 101 /
/// 96%; GroupNorm (19: two passes, the weight and bias gathered by channel) at rows of 1024
/// and 2048, 87 / 94% and 78 / 85%, though its vector loop takes 22-26 instructions an element,
/// under the copy's 31. The f32 row-a-block entries load rows of up to [`DIRECT_COST`]
/// directly (items 55-59).
pub(crate) const WIDE_DIRECT_COST: u32 = 8;

/// The element types of a row kernel's tensors along its rows: the parameters whose last dim
/// is the reduced one and the outputs over the whole domain. Per-row tensors (a label, a loss)
/// are read and written once a row, at any vector width; a total (`OutputInfo::total`), a sum
/// in each thread's register, not at all.
pub(crate) fn row_elems(k: &Kernel) -> impl Iterator<Item = Elem> + '_ {
    row_elems_of(k, true)
}

/// [`row_elems`] but the partial sums over rows (`OutputInfo::partial`), which a long row's
/// block adds up in shared memory, not in memory along the row: their vectors of eight f32
/// there are two 16-byte accesses, not a register cache's eight registers more.
pub(crate) fn stored_row_elems(k: &Kernel) -> impl Iterator<Item = Elem> + '_ {
    row_elems_of(k, false)
}

fn row_elems_of(k: &Kernel, partials: bool) -> impl Iterator<Item = Elem> + '_ {
    let (domain, axis) = match &k.launch {
        Launch::Rows { domain, axis } => (domain.as_slice(), Some(*axis)),
        _ => (&[][..], None),
    };
    let params = k
        .tensor_params()
        .filter(move |(_, _, s)| s.last().copied() == axis)
        .map(|(_, p, _)| p.elem);
    let outputs = k
        .outputs
        .iter()
        .filter(move |o| o.shape.as_slice() == domain && !o.total)
        .filter(move |o| partials || o.partial.is_none())
        .map(|o| o.elem);
    params.chain(outputs)
}

/// The most a row's element may cost ([`element_cost`]) for a kernel's row loops to load their
/// rows straight into registers ([`direct_row_cost`]): between softmax's 15 and layernorm with
/// GELU's 29.
pub(crate) const DIRECT_COST: u32 = 20;

/// The cost of an element ([`element_cost`]) of a kernel whose row loops load each row that
/// fits in registers straight from memory, rather than from a buffer it was copied into ahead;
/// `None` where they copy rows ahead (`prefetches`), or cache none. Loaded directly: kernels
/// that write whole rows, reduce in at most two passes and cost little an element. They spend
/// little time on a row but the wait for its loads, which more blocks overlap better than a
/// copy ahead does (`direct_blocks_per_sm` in `tuning.rs` sizes the row-a-block grid from the
/// cost), and the copy's trip through shared memory is then pure cost. Measured on an H200
/// (benches/NOTES.md, items 55, 57 and 59): loaded directly, W5 (softmax) and W8 (RMSNorm)
/// 100-101% of copy speed, against 98% and 98% with the copy ahead, and softmax's rows of
/// 1024 99% against 90%; W6 (layernorm and GELU) 85% against 97%, W7 (three reducing passes) 73%
/// against 97%.
pub(crate) fn direct_row_cost(k: &Kernel, plan: &Plan) -> Option<u32> {
    let cached = cached_params(k, plan);
    if cached.is_empty() || !writes_rows(k) || plan.reducing_passes() > 2 {
        return None;
    }
    Some(element_cost(k, plan, &cached)).filter(|&cost| cost <= DIRECT_COST)
}

/// Whether a row kernel has an output over its whole domain (it writes rows, not a value a row,
/// nor a total).
pub(crate) fn writes_rows(k: &Kernel) -> bool {
    let Launch::Rows { domain, .. } = &k.launch else {
        return false;
    };
    k.outputs.iter().any(|o| &o.shape == domain && !o.total)
}

/// Roughly the instructions an element of a row takes over all the passes of the row-a-block
/// loop, a value stored for later passes (`long_rows::pass_stashes`) counted once: an operation
/// or a load along the row 1, a division 4, a math routine 8 (`exp`, `ln` and kin) or 20
/// (the others: `erf`, `tanh`, trigonometry, powers), a random number 16, an accumulation 1.
/// It only chooses a path and a grid, so it needs to order kernels, not count exactly: W8
/// costs 5, W5 15, W6 29.
pub(crate) fn element_cost(k: &Kernel, plan: &Plan, cached: &[usize]) -> u32 {
    let (_, stashes) = pass_stashes(k, plan, cached, false);
    let node = |n: NodeId| match k.nodes[n].op {
        Op::Load(p) if cached.contains(&p) => 0,
        _ => op_cost(k, n),
    };
    plan.passes
        .iter()
        .zip(stashes)
        .map(|(pass, (reuse, _))| {
            let computed: u32 = match reuse {
                Some((read, _)) => needed(k, pass, read)
                    .into_iter()
                    .filter(|&n| n != read)
                    .map(node)
                    .sum(),
                None => pass.elems.iter().map(|&n| node(n)).sum(),
            };
            computed + pass.reduces.len() as u32
        })
        .sum()
}

/// The cost [`element_cost`] counts for computing value `n` once.
fn op_cost(k: &Kernel, n: NodeId) -> u32 {
    use crate::func::Func::*;
    match &k.nodes[n].op {
        Op::Scalar(_) | Op::Int(_) | Op::Float(_) | Op::Bool(_) => 0,
        Op::Binary(BinOp::Div | BinOp::Rem, ..) => 4,
        Op::Call(Exp | Exp2 | ExpM1 | Ln | Ln1p | Log | Log2 | Log10 | Sigmoid, _) => 8,
        Op::Call(f, _) if f.is_routine() => 20,
        Op::Random(..) => 16,
        _ => 1,
    }
}

/// The most reductions a pass may exchange across a cluster; a kernel with more has no long-row
/// entry.
pub(crate) const PASS_REDUCTIONS: usize = 16;

/// The most blocks of a cluster (`abi::MAX_CLUSTER`, the runtime's limit). Each block keeps an
/// eight-byte slot for every block's result of every reduction of a pass, in two phases.
pub(crate) const MAX_CLUSTER: usize = crate::abi::MAX_CLUSTER as usize;

/// The bytes of shared memory each element of a row takes when `k` caches long rows there: the
/// sizes of its tensors over the whole domain, and of its partial sums over rows. 0 when it has
/// no shared-memory path: not a row kernel over contiguous rows, a single pass without partial
/// sums (which reads each element once anyway), or a pass of more reductions than the exchange
/// takes ([`PASS_REDUCTIONS`]).
pub(crate) fn cached_bytes(k: &Kernel, plan: &Plan) -> u32 {
    match shared_params(k, plan).as_slice() {
        [] => 0,
        cached => bytes(k, cached) + partial_bytes(k),
    }
}

/// The bytes an element of a row takes in the partial sums over rows (`OutputInfo::partial`)
/// a long row's block adds up in shared memory beside its part of the row.
fn partial_bytes(k: &Kernel) -> u32 {
    let partials = k.outputs.iter().filter(|o| o.partial.is_some() && !o.total);
    partials.map(|o| o.elem.bits() / 8).sum()
}

/// The bytes an element of each of `params` takes, summed.
pub(crate) fn bytes(k: &Kernel, params: &[usize]) -> u32 {
    params.iter().map(|&p| k.params[p].elem.bits() / 8).sum()
}

/// The tensors a long row caches in shared memory (those over the whole domain), widest elements
/// first so that every part stays aligned for vectors of four; empty when there is no such path.
pub(crate) fn shared_params(k: &Kernel, plan: &Plan) -> Vec<usize> {
    let Launch::Rows { domain, axis } = &k.launch else {
        return vec![];
    };
    let reduces = || plan.passes.iter().flat_map(|p| &p.reduces);
    // A row's `logsumexp` is a maximum and a sum (`special.rs`): the pair is for full reductions.
    let pairs = reduces().any(|&r| matches!(k.nodes[r].op, Op::Reduce(Reduce::LogSumExp, ..)));
    if (plan.passes.len() < 2 && !k.has_partials())
        || domain.last() != Some(axis)
        || pass_reductions(plan) > PASS_REDUCTIONS
        || pairs
    {
        return vec![];
    }
    let mut params: Vec<usize> = k
        .tensor_params()
        .filter(|(_, _, s)| s == &domain)
        .map(|(i, _, _)| i)
        .collect();
    params.sort_by_key(|&p| std::cmp::Reverse(k.params[p].elem.bits()));
    params
}

/// The most reductions of one pass of `plan`: the results a block exchanges at once.
pub(crate) fn pass_reductions(plan: &Plan) -> usize {
    plan.passes
        .iter()
        .map(|p| p.reduces.len())
        .max()
        .unwrap_or(0)
}

/// For each pass over a row cached on chip (a long row in shared memory, or a row a block keeps
/// in registers or its prefetch buffer; `p` the one cached tensor), the value it stores in the
/// element's place, if any, for the later passes to read instead of computing it again: each
/// thread reads and writes only its own elements, so the store needs no barrier.
/// Softmax stores `exp(x - max)` in its sum's pass, and its write pass divides it without a
/// second `exp`; layernorm-like kernels store `x - mean`, then the normalized value.
///
/// A value qualifies when it has the tensor's type (and computes in it: narrow floats round
/// where they store, so they are left out) or, with `wide`, where the tensor is of narrow
/// floats and the value held in f32 (registers: a second array of f32 holds it), is computed
/// from the element now in the slot, is needed by a later pass, and no later pass needs that
/// element but through it. Of those, the one that saves the most values is taken.
pub(crate) fn stashes(k: &Kernel, plan: &Plan, p: usize, wide: bool) -> Vec<Option<NodeId>> {
    let elem = k.params[p].elem;
    // The slot holds the tensor's element (any `Load(p)`), or the last value stored there.
    let mut slot: Option<NodeId> = None;
    let mut out = vec![];
    for (i, pass) in plan.passes.iter().enumerate() {
        let in_slot = |n: NodeId| match slot {
            Some(s) => n == s,
            None => matches!(k.nodes[n].op, Op::Load(q) if q == p),
        };
        let later = &plan.passes[i + 1..];
        let best = pass
            .elems
            .iter()
            .copied()
            .filter(|&n| {
                let (values, reads) = subtree(k, pass, n, &in_slot);
                let cost = values.iter().map(|&m| op_cost(k, m)).sum();
                !in_slot(n) && reads && stashable(k.nodes[n].elem(), elem, wide, cost)
            })
            .filter(|&n| needed(k, pass, slot.unwrap_or(n)).contains(&n))
            .filter(|&n| {
                let needs = later.iter().map(|l| needed(k, l, n)).collect::<Vec<_>>();
                needs.iter().any(|need| need.contains(&n))
                    && needs.iter().flatten().all(|&m| m == n || !in_slot(m))
            })
            .max_by_key(|&n| subtree(k, pass, n, &in_slot).0.len());
        out.push(best);
        slot = best.or(slot);
    }
    out
}

/// Whether a value of type `value` may take the slot of an element of type `elem`: its own
/// type where that is the type it computes in; with `wide`, beside narrow floats, a value held
/// in f32 (an f32, or a narrow float's value before it is rounded to store) that `cost`s enough.
fn stashable(value: Elem, elem: Elem, wide: bool, cost: u32) -> bool {
    (value == elem && elem.compute() == elem)
        || (wide && elem.is_narrow_float() && value.compute() == Elem::F32 && cost >= STASH_COST)
}

/// The least [`element_cost`] of the values an f32 slot beside a 16-bit row saves: a division
/// or a math routine. The slots double the registers the row takes; for `x - mean`, a
/// subtraction an element, layernorm's rows of 2048 bf16 spilled on sm_80 and sm_90.
const STASH_COST: u32 = 4;

/// Whether the passes over rows of the `cached` tensors keep values in f32 slots of their own
/// beside a row of narrow floats (`rs_<name>` in the CUDA C; [`stashable`] with `wide`): a
/// register for each element the thread caches.
pub(crate) fn f32_slots(k: &Kernel, plan: &Plan, cached: &[usize]) -> bool {
    let (slot, stashes) = pass_stashes(k, plan, cached, true);
    slot.is_some_and(|p| k.params[p].elem.is_narrow_float())
        && stashes.iter().any(|(_, s)| s.is_some())
}

/// A value a pass reads from a cached tensor's slot instead of computing it, and that tensor.
pub(crate) type SlotRead = Option<(NodeId, usize)>;

/// For each pass over a row of the `cached` tensors: the value it reads from the slot, and the
/// value it stores there ([`stashes`]); with the tensor whose slots hold them, if any.
pub(crate) fn pass_stashes(
    k: &Kernel,
    plan: &Plan,
    cached: &[usize],
    wide: bool,
) -> (Option<usize>, Vec<(SlotRead, Option<NodeId>)>) {
    let Some((p, stored)) = stash_slot(k, plan, cached, wide) else {
        return (None, vec![(None, None); plan.passes.len()]);
    };
    let mut slot = None;
    let passes = stored
        .into_iter()
        .map(|stored| {
            let reads = slot.map(|n| (n, p));
            slot = stored.or(slot);
            (reads, stored)
        })
        .collect();
    (Some(p), passes)
}

/// The cached tensor whose slots hold the values passes store for later ones, and what each
/// pass stores there: the one tensor cached, or with `wide`, of several, the first of 16-bit
/// floats for which some pass stores a value (in f32 slots of their own, which leave the
/// others' registers as they are: softmax's backward, `x` and `dy` cached, computed
/// `exp(x - max)` in three passes).
fn stash_slot(
    k: &Kernel,
    plan: &Plan,
    cached: &[usize],
    wide: bool,
) -> Option<(usize, Vec<Option<NodeId>>)> {
    match cached {
        [p] => Some((*p, stashes(k, plan, *p, wide))),
        _ if wide => cached
            .iter()
            .filter(|&&p| k.params[p].elem.is_narrow_float())
            .map(|&p| (p, stashes(k, plan, p, true)))
            .find(|(_, stored)| stored.iter().any(Option::is_some)),
        _ => None,
    }
}

/// The values of `pass` that `n` needs (it included, the slot's values not), and whether one of
/// them reads the slot.
pub(crate) fn subtree(
    k: &Kernel,
    pass: &Pass,
    n: NodeId,
    in_slot: &impl Fn(NodeId) -> bool,
) -> (Vec<NodeId>, bool) {
    let (mut seen, mut stack, mut reads) = (vec![], vec![n], false);
    while let Some(m) = stack.pop() {
        if seen.contains(&m) || !pass.elems.contains(&m) {
            continue;
        }
        if in_slot(m) {
            reads = true;
            continue;
        }
        seen.push(m);
        stack.extend(k.nodes[m].op.operands());
    }
    (seen, reads)
}

/// The values of `pass` that its reductions and writes need when `leaf`'s value is read rather
/// than computed: `pass.elems` less those only `leaf` needs, in their order.
pub(crate) fn needed(k: &Kernel, pass: &Pass, leaf: NodeId) -> Vec<NodeId> {
    let mut need = vec![false; k.nodes.len()];
    let mut stack: Vec<NodeId> = pass
        .reduces
        .iter()
        .flat_map(|&r| k.nodes[r].op.operands())
        .chain(pass.writes.iter().map(|&o| k.outputs[o].node))
        .collect();
    while let Some(n) = stack.pop() {
        if need[n] || !pass.elems.contains(&n) {
            continue;
        }
        need[n] = true;
        if n != leaf {
            stack.extend(k.nodes[n].op.operands());
        }
    }
    pass.elems.iter().copied().filter(|&n| need[n]).collect()
}

/// The longest row the tiled kernel takes.
pub(crate) const SHORT: u32 = 32;

/// Shared memory for one block's tiles, in bytes: [`SHORT_BLOCKS`] blocks fit in sm_80's
/// 164 KB. A tile of 4096 f32 elements of a softmax's input and of its output.
pub(crate) const TILE_BYTES: u32 = 32 * 1024;

/// The 16-byte loads a thread has in flight while it copies a tile in, all issued before their
/// stores: 16 KB a block, up to 64 KB an SM against the 20 KB or so that the H100's bandwidth
/// times its latency asks of one; the tile's inputs take at most that, and the copy 16
/// registers.
/// (With 32 KB of inputs, ptxas hoisted all eight loads a thread, at some 30 registers.)
pub(crate) const IN_FLIGHT: u32 = 4;

/// The fewest elements a tile may hold: one step of a block over rows whose length is a
/// multiple of four, where each of its threads takes a vector of four (`fz_short_rows`' `fours`
/// instantiations step over 256 rows of four, or 32 rows of 32). A tile that holds no whole
/// step takes no rows (`fz_most` is 0) and its loop over the rows never ends: with a tile of
/// 768 (three `f64` tensors), a random program's rows of 28 hung the GPU.
pub(crate) const MIN_TILE: u32 = 4 * BLOCK;

/// The most shared memory a tile may take to hold [`MIN_TILE`] elements, where
/// [`TILE_BYTES`] and [`IN_FLIGHT`] would make it smaller: within the 48 KB of static shared
/// memory a block may have, with room for the kernel's other buffers.
pub(crate) const MAX_TILE_BYTES: u32 = 40 * 1024;

/// Elements per tile are a multiple of this, so that each tensor's part of the tile is a whole
/// number of 16-byte vectors per thread step for any element size.
pub(crate) const TILE_STEP: u32 = 256;

/// A tensor over the whole domain that moves through the tile: an input the passes read or an
/// output they write.
pub(crate) struct Tiled {
    /// Its name in the kernel's parameters: `p_<name>` or `out<o>`.
    pub(crate) global: String,
    /// Its element type as memory holds it.
    pub(crate) storage: &'static str,
    /// Bytes per element.
    pub(crate) size: u32,
    /// The kernel's parameter, for an input; `None` for an output.
    pub(crate) param: Option<usize>,
}

impl Tiled {
    pub(crate) fn input(&self) -> bool {
        self.param.is_some()
    }

    /// The name of its part of the tile (a pointer to elements of shared memory).
    pub(crate) fn shared(&self) -> String {
        format!("ts_{}", self.global)
    }

    /// The name of its global memory inside the row passes, where its own name stands for its
    /// row in the tile.
    pub(crate) fn direct(&self) -> String {
        format!("fz_g_{}", self.global)
    }
}

/// Where `k` reduces contiguous rows and a tile of at least [`MIN_TILE`] elements fits in
/// [`TILE_BYTES`] (or, raised to [`MIN_TILE`], in [`MAX_TILE_BYTES`]): the tensors its tile
/// carries, and the elements of each one's part.
pub(crate) fn tiling(k: &Kernel, plan: &Plan) -> Option<(Vec<Tiled>, u32)> {
    let Launch::Rows { domain, axis } = &k.launch else {
        return None;
    };
    if domain.last() != Some(axis) {
        return None;
    }
    let tiled = tiled_tensors(k, domain, plan);
    // Inside the tile's passes a tiled tensor's name is its row in shared memory, where a
    // gather of it (`x[.., labels]`), which may read any row, would not find its element.
    let gathered = |p: usize| {
        k.nodes
            .iter()
            .any(|n| matches!(&n.op, Op::View(q, v) if *q == p && !v.gathers.is_empty()))
    };
    if tiled.iter().any(|t| t.param.is_some_and(gathered)) {
        return None;
    }
    let bytes: u32 = tiled.iter().map(|t| t.size).sum();
    let input: u32 = tiled.iter().filter(|t| t.input()).map(|t| t.size).sum();
    let loads = IN_FLIGHT * 16 * BLOCK;
    let tile = (TILE_BYTES / bytes.max(1)).min(loads / input.max(1)) / TILE_STEP * TILE_STEP;
    let tile = match tile < MIN_TILE && MIN_TILE * bytes <= MAX_TILE_BYTES {
        true => MIN_TILE,
        false => tile,
    };
    (bytes > 0 && tile >= MIN_TILE).then_some((tiled, tile))
}

/// Whether the tiled short rows whose length is a multiple of eight take a vector of eight
/// elements a thread (`fz_short_rows`' `lanes`): where the tile carries one or two tensors (an
/// input and an output), each of 2-byte elements, no other tensor is along the row (whose
/// vectors would be 8 bytes wide), and the tile holds a block's step of rows of eight a thread
/// (`MIN_TILE` is a step of four). At four elements a thread, a 16-bit softmax's rows of 32
/// ran at 68% of copy speed on an H200 against f32's 96%: the row's shuffles and bookkeeping,
/// shared by four elements, cost twice as much against its bytes; at eight, 76-77%
/// (benches/NOTES.md item 98). With three tensors (softmax's backward: `x`, `dy` and `dx`),
/// ptxas spilled 8 to 16 bytes on sm_80 at 64 registers.
pub(crate) fn tile_eights(k: &Kernel, plan: &Plan) -> bool {
    let Some((tiled, tile)) = tiling(k, plan) else {
        return false;
    };
    tiled.len() <= 2
        && tiled.iter().all(|t| t.size == 2)
        && tile >= 8 * BLOCK
        && row_vector_params(k, plan).is_empty()
}

/// The tensors along the row that the tile does not carry (gamma, beta), in the order the
/// passes load them: the tiled rows' vector step loads them from global memory as vectors of
/// four (`rows::Cuda::row_vectors`), which their address must allow. (The tiled tensors' rows
/// lie in shared memory, aligned whatever their global addresses.)
pub(crate) fn row_vector_params(k: &Kernel, plan: &Plan) -> Vec<usize> {
    let Launch::Rows { domain, axis } = &k.launch else {
        return vec![];
    };
    let mut found = vec![];
    for &id in plan.passes.iter().flat_map(|pass| &pass.elems) {
        if let Op::Load(p) = k.nodes[id].op {
            let shape = k.params[p].shape.as_deref();
            let along = shape.and_then(|s| s.last()) == Some(axis);
            if along && shape != Some(domain.as_slice()) && !found.contains(&p) {
                found.push(p);
            }
        }
    }
    found
}

/// The tensors over the whole domain that the tile carries: inputs that some pass reads,
/// then outputs.
pub(crate) fn tiled_tensors(k: &Kernel, domain: &[DimId], plan: &Plan) -> Vec<Tiled> {
    let read = |p: usize| {
        plan.passes
            .iter()
            .flat_map(|pass| &pass.elems)
            .any(|&id| matches!(k.nodes[id].op, Op::Load(q) if q == p))
    };
    let inputs = k
        .tensor_params()
        .filter(|&(i, _, s)| s.as_slice() == domain && read(i))
        .map(|(i, p, _)| Tiled {
            global: format!("p_{}", crate::ir::plain_name(&p.name)),
            storage: p.elem.c_storage(),
            size: p.elem.bits() / 8,
            param: Some(i),
        });
    let outputs = k
        .outputs
        .iter()
        .enumerate()
        .filter(|(_, o)| o.shape.as_slice() == domain)
        .map(|(i, o)| Tiled {
            global: format!("out{i}"),
            storage: o.elem.c_storage(),
            size: o.elem.bits() / 8,
            param: None,
        });
    inputs.chain(outputs).collect()
}

/// Elements per vector load in elementwise loops: 16 bytes of 4-byte types (8-byte types load
/// two 16-byte vectors).
pub(crate) const LANES: u32 = 4;

/// Elements per vector load in a kernel's elementwise loops: [`LANES`], or twice as many where
/// every tensor is of at most 2 bytes, so that each load is 16 bytes of 2-byte types (8 of 1-byte
/// types; 16 lanes of code would cost more registers than the wider load saves). Narrow floats
/// compute in f32, and at 8 lanes ptxas spilled around the slow paths of f32 division and
/// `fmodf` (`f16s::arith`) in row kernels, whose registers are bounded: row kernels of them that
/// divide keep 4 lanes (8-byte loads). Elementwise kernels take 8 (NVRTC 13.0: `f16s::arith`,
/// five outputs of which a quotient and a remainder, 60 registers on sm_90 and none spilled,
/// the bound left to ptxas): V1's `silu(x[.., ..d]) * x[.., d..]` ran at 91% of copy speed on
/// an H200 with 8-byte loads, where unbroken 16-bit maps run at 100%.
///
/// Tensors read only as gathers' indices count for nothing: a vector loop reads them once a
/// vector (see [`addressed`]), so V4's `i64` slots leave its `bf16` rows at 16-byte vectors.
/// Nor, in a map, do tensors of fewer dims than its domain: broadcasts, each element read
/// again along the dims they lack, whose wider vectors load as two 16-byte ones. S3's
/// `q[t, h, d] * c[t, d]`, bf16 `q` and f32 `c`, ran at 86-88% of copy speed on an H200 with
/// `q` in 8-byte vectors (`benches/NOTES.md` item 97).
pub(crate) fn lanes(k: &Kernel) -> u32 {
    let broadcast = |shape: &[DimId]| match &k.launch {
        Launch::Map { domain } => shape.len() < domain.len(),
        _ => false,
    };
    let outputs = k.outputs.iter().map(|o| o.elem);
    let elems: Vec<Elem> = k
        .tensor_params()
        .filter(|&(p, _, shape)| !only_indices(k, p) && !broadcast(shape))
        .map(|(_, p, _)| p.elem)
        .chain(outputs)
        .collect();
    let narrow = elems.iter().all(|e| e.bits() <= 16);
    let halves = elems.iter().any(|e| e.is_narrow_float());
    let map = matches!(k.launch, Launch::Map { .. });
    if narrow && !(halves && divides_floats(k) && !map) {
        2 * LANES
    } else {
        LANES
    }
}

/// Whether every value read from tensor parameter `p` is the index of a gather (of a slice,
/// or of a write through `&mut`) and nothing else.
fn only_indices(k: &Kernel, p: usize) -> bool {
    let load = |id: NodeId| matches!(k.nodes[id].op, Op::Load(q) if q == p);
    let views = k.nodes.iter().flat_map(|n| match &n.op {
        Op::View(_, view) => view.gathers.as_slice(),
        _ => &[],
    });
    let places = k.outputs.iter().flat_map(|o| match &o.place {
        Some(place) => place.view.gathers.as_slice(),
        None => &[],
    });
    let read = views.chain(places).any(|g| load(g.index));
    // A view's only operand is its gather's index.
    let other_use = k.nodes.iter().any(|n| match &n.op {
        Op::View(..) => false,
        op => op.operands().into_iter().any(load),
    });
    read && !other_use && !k.outputs.iter().any(|o| load(o.node))
}

/// Whether a kernel divides floats or takes a float remainder (or calls a function that
/// divides: `recip`, `rsqrt`, `sigmoid`, `silu`, `log` with a base, `powi` of a negative power).
pub(crate) fn divides_floats(k: &Kernel) -> bool {
    use crate::func::Func;
    k.nodes.iter().any(|n| match &n.op {
        Op::Binary(BinOp::Div | BinOp::Rem, a, _) => k.nodes[*a].elem().compute().is_float(),
        Op::Call(f, _) => matches!(
            f,
            Func::Recip | Func::Rsqrt | Func::Sigmoid | Func::Silu | Func::Log | Func::Powi
        ),
        _ => false,
    })
}

/// How a tensor lines up with the consecutive elements of one vector step (`lanes` of them) of
/// an elementwise loop's domain.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Run {
    /// The tensor has the domain's shape: its own consecutive elements.
    Whole,
    /// Its dims are the domain's dims from the `k`-th on (a bias over `cols`): it repeats along
    /// the others, so the lanes are consecutive elements of it when its size is a multiple of
    /// the lane count.
    Suffix(usize),
    /// Its dims are the domain's first `k` (a scale per row): the lanes share one of its
    /// elements when the size of the remaining dims is a multiple of the lane count.
    Prefix(usize),
    /// Its dims are the domain's first `prefix` and those from the `suffix`-th on, the ones
    /// between left out (a per-token vector over heads, `c[t, d]` in `[t, h, d]`): the lanes are
    /// consecutive elements of it when the suffix's size is a multiple of the lane count, its
    /// vector the suffix's place plus the prefix's, past the dims between.
    Middle { prefix: usize, suffix: usize },
}

impl Run {
    pub(crate) fn of(shape: &[DimId], domain: &[DimId]) -> Option<Run> {
        if shape == domain {
            Some(Run::Whole)
        } else if !shape.is_empty() && domain.ends_with(shape) {
            Some(Run::Suffix(domain.len() - shape.len()))
        } else if domain.starts_with(shape) {
            Some(Run::Prefix(shape.len()))
        } else {
            let prefix = shape.iter().zip(domain).take_while(|(a, b)| a == b).count();
            let tail = &shape[prefix..];
            let suffix = domain.len() - tail.len();
            (prefix > 0 && !tail.is_empty() && domain.ends_with(tail) && suffix > prefix)
                .then_some(Run::Middle { prefix, suffix })
        }
    }

    /// The dims of the run a broadcast tensor repeats along (`Suffix`, `Middle`) or is constant
    /// over (`Prefix`): their size must be a multiple of the lane count. None for `Whole`.
    pub(crate) fn repeat(self, domain: &[DimId]) -> Option<&[DimId]> {
        match self {
            Run::Whole => None,
            Run::Suffix(k) | Run::Prefix(k) | Run::Middle { suffix: k, .. } => Some(&domain[k..]),
        }
    }

    /// The dims a `Middle` tensor leaves out, which its vector's place is divided by.
    pub(crate) fn skipped(self, domain: &[DimId]) -> Option<&[DimId]> {
        match self {
            Run::Middle { prefix, suffix } => Some(&domain[prefix..suffix]),
            _ => None,
        }
    }
}

/// The scratch slots (per block) a full reduction's accumulator takes.
pub(crate) fn slot_count(op: Reduce) -> usize {
    if op == Reduce::LogSumExp {
        2
    } else {
        1
    }
}

/// The scalar parameters that some `rand`, `randn` or `dropout` takes as its seed, in the order
/// of the kernel's nodes. Their round keys come from the host (`fz_key` in the CUDA C); a seed
/// computed in the kernel has its keys made there.
pub(crate) fn seed_params(k: &Kernel) -> Vec<usize> {
    let mut seeds = vec![];
    for node in &k.nodes {
        if let Op::Random(_, seed, _) = node.op {
            if let Op::Scalar(p) = k.nodes[seed].op {
                if !seeds.contains(&p) {
                    seeds.push(p);
                }
            }
        }
    }
    seeds
}

/// How the tensors of one elementwise pass (or a full reduction's) line up with its loop's
/// vectors: the shapes it loads or stores (indices into `Layout::shapes`), each one's run when
/// all have one, whether a value needs its element's coordinates, and whether any tensor is a
/// broadcast.
pub(crate) struct PassLayout {
    pub(crate) used: BTreeSet<usize>,
    pub(crate) runs: Option<Vec<(usize, Run)>>,
    pub(crate) positions: bool,
    pub(crate) broadcast: bool,
    /// The slices the pass reads (`Op::View`), each with its rows' layout where its vectors
    /// can be loaded whole (see [`pitched`]).
    pub(crate) views: Vec<(NodeId, Option<Pitch>)>,
    /// Whether the pass writes through a `&mut` parameter, element by element at the places
    /// its slice computes from the coordinates.
    pub(crate) placed: bool,
    /// Where the pass gathers, writes through `&mut` or reads a slice that is not [`pitched`],
    /// the values its vector loop computes once a vector, before its lanes, from the
    /// coordinates of the vector's first element: each gather's index and what it needs
    /// (see [`addressed`]); `None` where some such access cannot be loaded as vectors.
    pub(crate) addressed: Option<Vec<NodeId>>,
}

/// How a slice over the whole domain lies in memory when its vectors can be loaded whole: the
/// domain's last dim contiguous, and each row of it `pitch` elements after the previous one
/// (`None` for a domain of one dim, a single row), the first at `offset`. The halves of
/// `[t, 2 * d]` have pitch `2 * d` and offsets 0 and `d`; a pick of `d * 2` has none.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pitch {
    pub(crate) pitch: Option<crate::ir::Linear>,
    pub(crate) offset: crate::ir::Linear,
}

/// The layout of slice `id` if its vectors can be loaded whole: it spans the domain, its last
/// dim is contiguous, and each leading dim's stride is the next one's size times its stride, so
/// that its rows of the last dim lie `pitch` apart.
pub(crate) fn pitched(k: &Kernel, id: NodeId, domain: &[DimId]) -> Option<Pitch> {
    let Op::View(_, view) = &k.nodes[id].op else {
        return None;
    };
    // A gather's rows lie where its index puts them: element by element.
    if !view.gathers.is_empty() {
        return None;
    }
    let shape = &k.nodes[id].shape;
    if shape.as_slice() != domain || domain.is_empty() {
        return None;
    }
    let n = shape.len();
    if view.strides[n - 1] != vec![(1, vec![])] {
        return None;
    }
    let pitch = (n >= 2).then(|| view.strides[n - 2].clone());
    if let Some(p) = &pitch {
        let [(1, pitch_dims)] = p.as_slice() else {
            return None;
        };
        for i in 0..n.saturating_sub(2) {
            let dims = [&shape[i + 1..n - 1], &pitch_dims[..]].concat();
            if view.strides[i] != vec![(1, dims)] {
                return None;
            }
        }
    }
    Some(Pitch {
        pitch,
        offset: view.offset.clone(),
    })
}

/// The accesses a pass's vector loop makes by address: its slices `views` (those not
/// [`pitched`]) and the places of its writes through `&mut`, each with the shape whose
/// coordinates it takes.
pub(crate) fn address_views<'a>(
    k: &'a Kernel,
    pass: &'a Pass,
    views: &'a [NodeId],
) -> impl Iterator<Item = (&'a crate::ir::View, &'a [DimId])> {
    let slices = views.iter().map(move |&id| match &k.nodes[id].op {
        Op::View(_, view) => (&**view, k.nodes[id].shape.as_slice()),
        _ => unreachable!("a slice is a view"),
    });
    let places = pass.writes.iter().filter_map(move |&o| {
        let out = &k.outputs[o];
        Some((&out.place.as_ref()?.view, out.shape.as_slice()))
    });
    slices.chain(places)
}

/// The slices of `views` that are not [`pitched`].
pub(crate) fn unpitched(views: &[(NodeId, Option<Pitch>)]) -> Vec<NodeId> {
    views
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(id, _)| *id)
        .collect()
}

/// The values a pass's vector loop needs before its lanes where it gathers, writes through
/// `&mut` or reads a slice that is not [`pitched`] ([`address_views`]): each gather's index,
/// and the values it is computed from, in the pass's order. Such an access is loaded or stored
/// a vector at a time when its rows of the domain's last dim are contiguous (its last dim is the
/// domain's, of stride 1) and its index is the same along them (its values do not have the
/// last dim, and draw nothing at random): the vector's address is then the scalar loop's at the
/// vector's first element. `None` where one is not.
pub(crate) fn addressed(
    k: &Kernel,
    pass: &Pass,
    domain: &[DimId],
    views: &[NodeId],
) -> Option<Vec<NodeId>> {
    let last = *domain.last()?;
    if domain.len() < 2 {
        return None;
    }
    let mut index = vec![];
    for (view, shape) in address_views(k, pass, views) {
        let rows = shape.last() == Some(&last) && view.strides.last() == Some(&vec![(1, vec![])]);
        if !rows {
            return None;
        }
        index.extend(view.gathers.iter().map(|g| g.index));
    }
    let need = super::closure(k, &index, &|id| pass.elems.contains(&id));
    let uniform = need
        .iter()
        .all(|&id| !k.nodes[id].shape.contains(&last) && !matches!(k.nodes[id].op, Op::Random(..)));
    uniform.then_some(need)
}

impl PassLayout {
    /// Whether the pass has a vector loop: every tensor and slice lines up with the vectors, and
    /// no value needs coordinates (which only the scalar loop computes).
    pub(crate) fn vectors(&self) -> Option<&[(usize, Run)]> {
        match &self.runs {
            Some(runs)
                if !self.used.is_empty()
                    && !self.positions
                    && (self.pitched_only() || self.addressed.is_some()) =>
            {
                Some(runs)
            }
            _ => None,
        }
    }

    /// Whether the vector loop computes the coordinates of each vector's first element, for
    /// the accesses [`addressed`] loads and stores.
    pub(crate) fn by_address(&self) -> bool {
        !self.pitched_only() && self.addressed.is_some()
    }

    /// Whether every slice of the pass is [`pitched`] and it writes nothing through `&mut`:
    /// the vector loop needs no addresses.
    fn pitched_only(&self) -> bool {
        self.views.iter().all(|(_, p)| p.is_some()) && !self.placed
    }

    /// Whether the pass's scalar loop splits its index into coordinates.
    pub(crate) fn coordinates(&self) -> bool {
        self.positions || self.broadcast || !self.views.is_empty() || self.placed
    }
}

pub(crate) fn pass_layout(k: &Kernel, pass: &Pass, domain: &[DimId]) -> PassLayout {
    let layout = Layout { k };
    let shapes = layout.shapes();
    let mut used = BTreeSet::new();
    for &id in &pass.elems {
        if let Op::Load(p) = k.nodes[id].op {
            used.insert(layout.shape_index(k.params[p].shape.as_ref().expect("a tensor")));
        }
    }
    for &o in &pass.writes {
        used.insert(layout.shape_index(&k.outputs[o].shape));
    }
    // A slice takes coordinates in the scalar loop, and its own vectors in the vector loop.
    let positions = pass.elems.iter().any(|&id| {
        crate::plan::needs_coordinates(k, id, domain) && !matches!(k.nodes[id].op, Op::View(..))
    });
    let views: Vec<(NodeId, Option<Pitch>)> = pass
        .elems
        .iter()
        .filter(|&&id| matches!(k.nodes[id].op, Op::View(..)))
        .map(|&id| (id, pitched(k, id, domain)))
        .collect();
    let runs = used
        .iter()
        .map(|&s| Run::of(&shapes[s], domain).map(|r| (s, r)))
        .collect();
    let broadcast = used.iter().any(|&s| shapes[s] != domain);
    let placed = pass.writes.iter().any(|&o| k.outputs[o].place.is_some());
    let addressed = addressed(k, pass, domain, &unpitched(&views));
    PassLayout {
        used,
        runs,
        positions,
        broadcast,
        views,
        placed,
        addressed,
    }
}

/// The divisors an elementwise pass's vector loop takes (each run's dims over the lanes, and the
/// dims a `Middle` tensor leaves out), and whether its scalar loop splits coordinates: what its
/// divisors are.
pub(crate) fn needs_divisors(
    k: &Kernel,
    pass: &Pass,
    domain: &[DimId],
) -> (Vec<(Vec<DimId>, u32)>, bool) {
    let layout = pass_layout(k, pass, domain);
    let lanes = lanes(k);
    let mut runs = vec![];
    for (_, r) in layout.vectors().unwrap_or_default() {
        if let Some(dims) = r.repeat(domain) {
            runs.push((dims.to_vec(), lanes));
        }
        if let Some(dims) = r.skipped(domain) {
            runs.push((dims.to_vec(), 1));
        }
    }
    // Slices over rows, and accesses by address: a vector's row and place in it, by the
    // vectors a row (and the row's coordinates by the scalar loop's divisors).
    let pitches = layout
        .views
        .iter()
        .any(|(_, p)| p.as_ref().is_some_and(|p| p.pitch.is_some()));
    if layout.vectors().is_some() && (pitches || layout.by_address()) {
        runs.push((domain[domain.len() - 1..].to_vec(), lanes));
    }
    (runs, layout.coordinates())
}
