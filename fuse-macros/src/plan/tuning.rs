//! The tuning numbers of every launch, in one table: each with the measurement behind it
//! (benches/NOTES.md). The program builder (`program.rs`) reads them; no printer does.

use crate::abi::{BLOCK, CACHE};
use crate::ir::{Kernel, Launch, Op};
use crate::parse::BinOp;
use crate::plan::rows::{
    cached_params, direct_row_cost, f32_slots, next_row_to_l2, prefetches, wide_copies_ahead,
    writes_rows,
};
use crate::plan::Plan;
use crate::ty::Elem;

/// The fewest blocks per SM a row kernel declares (`__launch_bounds__`): an explicit register
/// bound (128 here). Without one, ptxas spilled live registers around the IEEE division's
/// slow-path call in kernels that cache rows; elementwise kernels are better left unbounded
/// (but see [`map_min_blocks`]), and rows cached beyond 128 registers take one block
/// ([`register_min_blocks`]).
pub(crate) const MIN_BLOCKS: u32 = 2;

/// The `__launch_bounds__` minimum of blocks per SM for a row kernel's general entry, which
/// streams its rows and holds none on chip: [`min_blocks`], but at most three (85 registers). At
/// four, `layernorm_quantize`'s streaming loop spilled on sm_90 once it was an entry of its own.
///
/// But a row of one tensor reduced once or twice in one pass and left (`sum(x, cols)`: nothing
/// written along the row, no math routine, no random draw, elements of at most 32 bits) holds
/// one step's vectors and its accumulators: five blocks (48 registers) at four lanes, four (64)
/// at eight. (Four reductions of a row spilled 12 bytes at five, a product with another
/// tensor's permuted row 60: the tests' `reduce_rows` and `sums_of_products`.) Left unbounded,
/// ptxas gave the f32 row sum 56 registers beside a peeled loop of two vectors a step
/// (`rows::Cuda::peeled_row_loop`), four blocks an SM where five had run 3-9% faster at
/// 100-5120 columns (benches/NOTES.md items 125 and 127), and the 16-bit ones' one loop 72.
pub(crate) fn stream_min_blocks(k: &Kernel, plan: &Plan) -> u32 {
    let narrow = k.tensor_params().all(|(_, p, _)| p.elem.bits() <= 32);
    let light = plan.passes.len() == 1
        && k.tensor_params().count() == 1
        && reduces(k) <= 2
        && !writes_rows(k)
        && narrow
        && !k.draws_random()
        && routines(k).is_empty();
    match (light, crate::plan::rows::lanes(k)) {
        (true, 8..) => MIN_BLOCKS + 2,
        (true, _) => MIN_BLOCKS + 3,
        (false, _) => min_blocks(k, plan).min(MIN_BLOCKS + 1),
    }
}

/// The `__launch_bounds__` minimum of blocks per SM for a row kernel, which caps its registers
/// (65536 / 256 / blocks) and so sets how many rows an SM overlaps: a row kernel overlaps rows
/// only across blocks. Every kernel of the tests, benches and examples is compiled to check
/// that none spills. For rows cached on chip (4-byte elements, at most three reductions):
/// - a row kept in shared memory (one whole-domain tensor, copied ahead; see
///   `rows::prefetches`), no other tensor along the row and one output, a value per row:
///   five (48 registers);
/// - a row kept in shared memory otherwise, or one row in registers with one output: four (64);
/// - one row in registers otherwise: three (85);
/// - two or more rows in registers: two (128), as they leave too little for the division's
///   slow-path call (`div_by_row_max` spilled at three); but three (85) for 16-bit rows of at
///   most 4 bytes an element together, with partial sums over rows (`OutputInfo::partial`) of
///   one output: what a thread holds across its rows, [`CACHE`] elements of each row and
///   [`CACHE`] sums, is then 32 registers, as one f32 row's and its accumulators; and one
///   output along the rows. Measured on an H200 (benches/NOTES.md item 118): G1's backward
///   (RMSNorm, `x` and `dy` in bf16, `dw`'s partial sums) 80 registers without spills, 81 ->
///   90% of copy speed; G2's and G7's (two outputs' partial sums, 48 registers held) spilled
///   60-80 bytes at three on sm_90, and G2's pair from saved statistics ran 78 -> 66%; G1's
///   `value_and_vjp` (`y` beside `dx`) spilled 32 bytes.
///
/// Other row kernels, and those that draw random numbers: [`MIN_BLOCKS`]; one (255) for a
/// kernel of [`WIDE_SLOTS`] `f64` reduction slots or more beside [`WIDE_ROUTINES`] `f64` math
/// routines or more, whose accumulators stay live through the routines' slow paths: random
/// program `p170` (`logsumexp`, `max` and `prod` of `f64` values beside `log2`, `tanh` and
/// `exp`) spilled 68 bytes on sm_90 at two.
pub(crate) fn min_blocks(k: &Kernel, plan: &Plan) -> u32 {
    let wide_slots: usize = k
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::Reduce(op, ..) if n.elem() == Elem::F64 => Some(crate::plan::rows::slot_count(op)),
            _ => None,
        })
        .sum();
    let wide_routines = routines(k).iter().filter(|&&e| e == Elem::F64).count();
    if wide_slots >= WIDE_SLOTS && wide_routines >= WIDE_ROUTINES {
        return 1;
    }
    let reduces = reduces(k);
    // The rows kept on chip are the tensors over the whole domain; per-row operands (a label,
    // say) cost a register or two whatever their type.
    let (domain, axis) = match &k.launch {
        Launch::Rows { domain, axis } => (domain.as_slice(), Some(*axis)),
        _ => (&[][..], None),
    };
    let whole: Vec<usize> = k
        .tensor_params()
        .filter(|(_, _, s)| s.as_slice() == domain)
        .map(|(i, _, _)| i)
        .collect();
    let narrow = whole.iter().all(|&p| k.params[p].elem.bits() <= 32);
    let cached = axis.is_some() && domain.last() == axis.as_ref() && plan.passes.len() >= 2;
    if !(cached && narrow && reduces <= 3) {
        return MIN_BLOCKS;
    }
    // Philox's state and rounds take registers of their own: `softmax_dropout` needs 91.
    if k.draws_random() {
        return MIN_BLOCKS;
    }
    let along = k
        .tensor_params()
        .filter(|(_, _, s)| s.last() == axis.as_ref())
        .count();
    // A kernel that writes whole rows keeps the output's vectors too: softmax spilled the
    // row-a-block copy of its loop (see `rows`) at five.
    let writes_rows = writes_rows(k);
    // Outputs along the rows but partial sums (which have the domain's shape too).
    let row_outputs = k
        .outputs
        .iter()
        .filter(|o| o.shape.as_slice() == domain && o.partial.is_none())
        .count();
    match (prefetches(k, &whole), along, k.outputs.len()) {
        (true, 1, 1) if !writes_rows => MIN_BLOCKS + 3,
        (true, _, _) => MIN_BLOCKS + 2,
        (false, _, 1) if whole.len() == 1 => MIN_BLOCKS + 2,
        (false, _, _) if whole.len() == 1 => MIN_BLOCKS + 1,
        (false, _, _) if held_registers(k, &whole) <= CACHE * 2 && row_outputs == 1 => {
            MIN_BLOCKS + 1
        }
        (false, _, _) => MIN_BLOCKS,
    }
}

/// The kernel's reductions.
fn reduces(k: &Kernel) -> usize {
    k.nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Reduce(..)))
        .count()
}

/// The registers a thread of a row kernel with partial sums over rows holds across the rows
/// it takes: [`CACHE`] elements of each of its `cached` rows, packed (two 16-bit elements a
/// register), and [`CACHE`] f32 sums for each output of partial sums; `u32::MAX` for a kernel
/// without partial sums, whose rows are its block's for one row only.
fn held_registers(k: &Kernel, cached: &[usize]) -> u32 {
    let sums = k
        .outputs
        .iter()
        .filter(|o| o.partial.is_some() && !o.total)
        .count() as u32;
    match sums {
        0 => u32::MAX,
        _ => CACHE * crate::plan::rows::bytes(k, cached) / 4 + CACHE * sums,
    }
}

/// The element types of the math routines a kernel calls, one for each call: its routines
/// (`Func::is_routine`), less those `#[fast_math]` makes intrinsics, and its float remainders
/// (`fmod`, a routine too). Each has a slow path (trigonometry's argument reduction, `fmod`'s
/// loop, every `f64` routine's special cases) that keeps values of its own live.
fn routines(k: &Kernel) -> Vec<Elem> {
    let live = crate::fusion::live_nodes(&k.body());
    let routine = |n: &crate::ir::Node| match &n.op {
        Op::Call(f, args) => {
            let e = k.nodes[args[0]].elem();
            let fast = k.fast_math && e == Elem::F32 && f.has_fast_intrinsic();
            (f.is_routine() && !fast).then_some(e)
        }
        Op::Binary(BinOp::Rem, ..) => n.elem().is_float().then(|| n.elem()),
        _ => None,
    };
    let nodes = k.nodes.iter().zip(live);
    nodes
        .filter(|(_, l)| *l)
        .filter_map(|(n, _)| routine(n))
        .collect()
}

/// The `__launch_bounds__` minimum of blocks per SM of an elementwise kernel or a full
/// reduction: none, which leaves the register count to ptxas, except one (up to 255 registers,
/// as many as none allows) for a kernel that has `f64` values and calls math routines on
/// narrower floats. Unbounded, ptxas aims at about 40 registers for such a kernel and spills
/// around its routines' slow paths; told that one block an SM suffices, it does not. Measured
/// (NVRTC 13.0, sm_90): random programs `p119`, `p129` and `p184` spilled 8 to 56 bytes at 40 to
/// 48 registers unbounded, and took 50, 61 and 68 at one block without spills. No kernel of the
/// tests, benches and examples mixes the two, and those that keep many values live (the tests'
/// `ml`, 145 registers) are left unbounded.
pub(crate) fn map_min_blocks(k: &Kernel) -> Option<u32> {
    let live = crate::fusion::live_nodes(&k.body());
    let wide = k
        .nodes
        .iter()
        .zip(live)
        .any(|(n, l)| l && n.elem() == Elem::F64);
    let narrow = routines(k).iter().any(|&e| e != Elem::F64);
    (wide && narrow).then_some(1)
}

/// See [`min_blocks`].
const WIDE_SLOTS: usize = 4;
const WIDE_ROUTINES: usize = 3;

/// The tensors (inputs and outputs) and the math routines (`f64` ones counting two) from which a
/// short-row entry takes one block fewer ([`short_min_blocks`]).
pub(crate) const SHORT_TENSORS: usize = 8;
pub(crate) const SHORT_ROUTINES: usize = 2;

/// The `__launch_bounds__` minimum of blocks per SM of the short-row entries: [`SHORT_BLOCKS`]
/// (64 registers), and one fewer (80) for a kernel of [`SHORT_TENSORS`] tensors or more that
/// calls [`SHORT_ROUTINES`] math routines or more: each tensor's address takes two registers
/// through the tile's loops, and each routine's slow path registers of its own. Measured
/// (NVRTC 13.0, sm_80 and sm_90) on the 300 random programs: no short-row entry of up to seven
/// tensors spilled; of the eleven programs with eight to twelve, the five that spilled (4 to 32
/// bytes, 40 entries) called two to six routines and none spills at three blocks (67 to 88
/// registers); of the six that did not, four call fewer than two. The tests', benches' and
/// examples' kernels have at most seven tensors, and their derived backward kernels of eight or
/// more (`layernorm`'s, `error`'s) at most one routine.
///
/// Also one fewer for a kernel of [`SHORT_CHAINED_TENSORS`] tensors or more whose row takes two
/// reducing passes or more (a reduction of a value that needs another's result), which keep
/// each pass's values and the tile's addresses live together: vLLM's
/// `rms_norm_dynamic_per_token_quant` with a residual (`doc/kernels.md`: six tensors, the norm's
/// mean then the scale's maximum) took 63 registers on sm_90 and spilled 24 bytes on sm_80.
pub(crate) fn short_min_blocks(k: &Kernel, plan: &Plan) -> u32 {
    let tensors = k.tensor_params().count() + k.outputs.len();
    let weight = |e: &Elem| if *e == Elem::F64 { 2 } else { 1 };
    let routines: usize = routines(k).iter().map(weight).sum();
    let chained = plan.reducing_passes() >= 2 && tensors >= SHORT_CHAINED_TENSORS;
    let heavy = tensors >= SHORT_TENSORS && routines >= SHORT_ROUTINES;
    match (heavy, chained) {
        // Philox's state besides: random program `p144` (eleven tensors, an `f64` `tanh`, a
        // `dropout`) spilled 16 to 48 bytes at three blocks, on sm_80 and sm_90.
        (true, _) if k.draws_random() => SHORT_BLOCKS - 2,
        (true, _) | (_, true) => SHORT_BLOCKS - 1,
        _ => SHORT_BLOCKS,
    }
}

/// See [`short_min_blocks`].
pub(crate) const SHORT_CHAINED_TENSORS: usize = 6;

/// The `__launch_bounds__` minimum of blocks per SM of the wide cached entry
/// (`Path::RowsCachedWide`, twice the elements a thread of the others caches): `blocks`, the
/// other row entries', or one fewer (not below [`MIN_BLOCKS`]) for
/// - a kernel of three passes or more that also reads a tensor along the row it does not cache
///   (a weight), whose elements each pass loads beside the cached ones: the benchmark's V2
///   (RMSNorm by a weight, then a per-token fp8 scale) spilled 24 bytes on sm_80 and sm_90 at
///   three. RMSNorm (two passes) keeps its bound.
/// - a kernel whose rows are not light (`direct_row_cost`) that keeps f32 values beside its
///   16-bit row for later passes (`f32_slots`: softmax's `exp(x - max)`, 32 registers a
///   thread): S2's bf16 softmax took 80 registers at three blocks, and ran at 79-80% of copy
///   speed on an H200 at 256 and 1024 columns, against 63-64% computing `exp` again at four
///   (benches/NOTES.md item 97).
/// - a kernel whose rows are light but not the lightest (`rows::WIDE_DIRECT_COST`), so copied
///   ahead, that reads tensors besides its cached one: S2's GroupNorm (the weight and bias
///   gathered by channel) spilled 8 bytes on sm_90 at four.
pub(crate) fn wide_min_blocks(k: &Kernel, plan: &Plan, blocks: u32) -> u32 {
    let Launch::Rows { axis, .. } = &k.launch else {
        return blocks;
    };
    let cached = cached_params(k, plan);
    let weights = k
        .tensor_params()
        .any(|(i, _, s)| s.last() == Some(axis) && !cached.contains(&i));
    let light = direct_row_cost(k, plan).is_some();
    let slots = !light && f32_slots(k, plan, &cached);
    let copied = light && wide_copies_ahead(k, plan) && k.tensor_params().count() > cached.len();
    match ((weights && plan.passes.len() >= 3) || slots || copied) && blocks > MIN_BLOCKS {
        true => blocks - 1,
        false => blocks,
    }
}

/// The registers a thread of a row-in-registers entry (`cached_rows`, `block_rows`,
/// `exact_rows`) needs, roughly: its share of the cached rows ([`CACHE`] elements of each cached
/// tensor, a register each 4 bytes), 16 for each pass over the row (its accumulators, indices
/// and loop), 16 more, [`PHILOX_REGISTERS`] for a kernel that draws random numbers and
/// [`WIDE_CALL_REGISTERS`] for one with an `f64` slow-path call ([`wide_calls`]).
fn cached_registers(k: &Kernel, plan: &Plan) -> u32 {
    let words: u32 = cached_params(k, plan)
        .iter()
        .map(|&p| k.params[p].elem.bits().div_ceil(32))
        .sum();
    let philox = if k.draws_random() {
        PHILOX_REGISTERS
    } else {
        0
    };
    let calls = if wide_calls(k) {
        WIDE_CALL_REGISTERS
    } else {
        0
    };
    CACHE * words + 16 * plan.passes.len() as u32 + 16 + philox + calls
}

/// Whether a kernel computes an `f64` math routine or remainder ([`routines`]), division or
/// square root, each of which calls a slow path (special cases, a quotient's rounding) that
/// keeps the caller's live values in registers of its own.
fn wide_calls(k: &Kernel) -> bool {
    use crate::func::Func;
    let live = crate::fusion::live_nodes(&k.body());
    let divides = |n: &crate::ir::Node| match &n.op {
        Op::Binary(BinOp::Div, ..) => true,
        Op::Call(f, _) => matches!(f, Func::Sqrt | Func::Recip),
        _ => false,
    };
    let mut nodes = k.nodes.iter().zip(live).filter(|(_, l)| *l);
    routines(k).contains(&Elem::F64) || nodes.any(|(n, _)| n.elem() == Elem::F64 && divides(n))
}

/// The registers an `f64` slow-path call ([`wide_calls`]) takes beside a cached row
/// ([`cached_registers`]): random program `p41713` (four `f64` tensors and two `f32` cached over
/// two passes, estimated at 224) took 228 registers without its two `f64` divisions and its
/// `rsqrt`, and spilled 104 bytes with them at one block (255), on sm_80 and sm_90.
const WIDE_CALL_REGISTERS: u32 = 32;

/// Whether a row-in-registers entry can hold its rows at all: [`cached_registers`] at most the
/// 255 registers a thread can have. Random programs `p30138` and `p30485` (seven and eight
/// cached tensors of 8-byte elements among eight and thirteen, estimated at 288 and 384)
/// spilled 16 to 256 bytes in `cached_rows`, `block_rows` and `exact_rows` at one block an SM,
/// sm_80 and sm_90; such kernels keep their streamed, tiled and shared-memory entries.
pub(crate) fn rows_fit_registers(k: &Kernel, plan: &Plan) -> bool {
    cached_registers(k, plan) <= 255
}

/// The registers Philox's state and rounds take beside a cached row ([`cached_registers`]):
/// random program `p144` (an `f64`, a `u16` and an `f16` tensor cached over two passes, 128
/// without them, and a `dropout`) spilled 32 bytes on sm_80 at two blocks.
const PHILOX_REGISTERS: u32 = 32;

/// The `__launch_bounds__` minimum of blocks per SM of the row-in-registers entries:
/// [`min_blocks`], except where that is [`MIN_BLOCKS`] (128 registers) and their registers
/// ([`cached_registers`]) are more: one (255). Measured (NVRTC 13.0, sm_80 and sm_90) on the
/// 300 random programs: every entry that spilled at 128 (random programs `p144`, `p170`,
/// `p193`, `p246`, `p251`: four 8-byte tensors cached, or a `u64` and two `f32` over four
/// passes) is estimated at 144 or more, and used 138 to 208 registers at one block. Of the
/// tests', benches' and examples' kernels at two, the most is 128 (`softmax_f16`'s backward,
/// `mixed_rows` 112), and none spills; the `f64` backward kernels of softmax and layernorm in
/// `fuse-runtime/tests/cpu_grad.rs` (144 and 160) spilled 32 to 1248 bytes at two, and none at
/// one.
pub(crate) fn register_min_blocks(k: &Kernel, plan: &Plan) -> u32 {
    match min_blocks(k, plan) {
        MIN_BLOCKS if cached_registers(k, plan) > 65536 / BLOCK / MIN_BLOCKS => 1,
        blocks => blocks,
    }
}

/// The blocks per SM a column reduction's grid aims at: a full SM (8 x 256 threads), each
/// thread with its loads of several rows in flight. With it, f32 column sums ran at 96-98% of
/// copy speed on an H100 over four shapes from 256 x 2^20 to 2^20 x 256 (NOTES item 72).
pub(crate) const COLUMN_BLOCKS_PER_SM: u32 = 8;

/// The `__launch_bounds__` minimum of blocks per SM of a column reduction: [`MIN_BLOCKS`] (128
/// registers). At four (64), the tests' kernels of five reductions over two tensors spilled on
/// sm_90 (`reduce_cols` in f64, `reduce_mid`, `logsumexp_rows`), with eight rows' loads in
/// flight; a column sum takes about 30 registers either way.
pub(crate) const COLUMN_MIN_BLOCKS: u32 = MIN_BLOCKS;

/// The `__launch_bounds__` minimum of blocks per SM of a column reduction that takes two
/// columns a lane (`Path::ColumnPairs`) with `slots` reduction slots: four (64 registers) for up
/// to [`PAIR_LIGHT_SLOTS`], else [`COLUMN_MIN_BLOCKS`]. At [`COLUMN_MIN_BLOCKS`] a 16-bit column
/// sum took 72 registers, three blocks an SM, where the standalone kernel of NOTES.md item 87 ran
/// at 94-99% of copy speed with four; at four, the tests' kernels of four and five reductions
/// (`reduce_cols`, `reduce_mid`, `pairs_bf16`) spilled 8-56 bytes on sm_90, two columns' partials
/// of each in registers. Four columns a lane: [`column_quad_min_blocks`].
pub(crate) fn column_pair_min_blocks(slots: u32) -> u32 {
    if slots <= PAIR_LIGHT_SLOTS {
        4
    } else {
        COLUMN_MIN_BLOCKS
    }
}

/// As [`column_pair_min_blocks`] for four columns a lane (`Path::ColumnQuads`): four blocks an
/// SM for one reduction slot (a bias gradient's sum), else [`COLUMN_MIN_BLOCKS`]. At four, the
/// tests' `pairs_f16_mid` (a sum, a mean and a minimum, twelve partials a lane) spilled 92 bytes
/// on sm_80.
pub(crate) fn column_quad_min_blocks(slots: u32) -> u32 {
    if slots <= 1 {
        4
    } else {
        COLUMN_MIN_BLOCKS
    }
}

/// The most reduction slots a pair kernel holds at 64 registers: three (`pairs_f16_mid`'s sum,
/// mean and min fit on sm_80 and sm_90).
pub(crate) const PAIR_LIGHT_SLOTS: u32 = 3;

/// The shortest row the segments' peeled entries take (`Path::RowsCached` and
/// `Path::RowsCachedWide` at any length, `plan::peels_cache`): segments of at least 16 lanes of
/// eight elements (32 of four), each lane holding one of the row's elements around its whole
/// vectors (fewer than two vectors' worth); shorter rows stream.
pub(crate) const PEELED_MIN_LEN: u64 = 257;

/// The longest row of the wide cached entry (`Path::RowsCachedWide`): 2048 elements, 64
/// threads of 32. Longer rows go on to the row-a-block entries, as 4-byte rows do.
pub(crate) const WIDE_CACHED_ROW: u64 = 2048;

/// The most blocks per SM of the wide entry's grid where it copies rows ahead
/// (`rows::wide_copies_ahead`): 48, each going through its share of the rows with the next
/// one's copy in flight, where the other row grids' 160 gave most blocks a row or two, and the
/// first row's wait each. Measured on an H200 (benches/NOTES.md item 99), S2's bf16 softmax at
/// 256 / 512 / 1024 / 2048 columns, % of copy speed, in one run:
///
/// | blocks an SM | 160 | 3 | 6 | 9 | 12 | 16 | 24 | 32 |
/// | --- | --- | --- | --- | --- | --- | --- | --- | --- |
/// | precise | 81 / 75 / 74 / 70 | 88 / 83 / 83 / 76 | 89 / 86 / 86 / 80 | 91 / 87 / 87 / 80 | **91 / 87 / 86 / 80** | 86 / 86 / 85 / 79 | 85 / 85 / 85 / 79 | 85 / 84 / 84 / 79 |
/// | `#[fast_math]` | 79 / 79 / 78 / 73 | 87 / 89 / 89 / 83 | 87 / 90 / 90 / 84 | 89 / 92 / 92 / 85 | **90 / 92 / 93 / 85** | 91 / 93 / 93 / 85 | 92 / 94 / 92 / 84 | 92 / 92 / 92 / 84 |
///
/// In a later run, with the packed max and stores of item 99, 12 and 16 within a point of each
/// other (precise 92 / 94 / 93 / 88%, against 81 / 80 / 79 / 71% at 160 before). Since, with
/// the next row asked of L2 (item 113), more blocks do better (item 116, S2's bf16 softmax at
/// 256 / 1024 columns, precise; f16 within a point):
///
/// | blocks an SM | 12 | 16 | 24 | 32 | 48 | 64 | 96 |
/// | --- | --- | --- | --- | --- | --- | --- | --- |
/// | % of copy | 91 / 92 | 91 / 93 | 92 / 94 | 93 / 95 | **94 / 95** | 94 / 94 | 91 / 90 |
pub(crate) const WIDE_COPY_BLOCKS_PER_SM: u32 = 48;

/// The most blocks per SM of a short-row entry that takes 16-bit rows a multiple of eight long
/// in vectors of eight (`rows::tile_eights`), where the other row grids take 160 (a tile or
/// two a block). Measured on an H200 (benches/NOTES.md item 116), in GB/s of S2's softmax at
/// 32 columns, with `FUSE_ROW_BLOCKS_PER_SM` for every row entry:
///
/// | blocks an SM | bf16 | f16 | bf16 `#[fast_math]` | f32 (S1) | bf16 at 2 columns |
/// | --- | --- | --- | --- | --- | --- |
/// | 160 | 3682-3685 | 3908 | 3927 | **4201-4204** | **3321-3325** |
/// | 64 | **3871** | **3968** | **4110** | 4083 | 3255 |
///
/// so only the entries with vectors of eight take it; their rows cost the most instructions
/// an element, and more, shorter-lived blocks overlap one tile's passes with another's loads.
pub(crate) const SHORT_EIGHTS_BLOCKS_PER_SM: u32 = 64;

/// The fewest blocks per SM the short-row kernel declares (`__launch_bounds__`): 64 registers,
/// which every kernel of the tests fits without spilling (at five, 48 registers, seven of them
/// spilled), and 4 x 32 KB of tiles fit in sm_80's 164 KB of shared memory.
pub(crate) const SHORT_BLOCKS: u32 = 4;

/// The longest row of each short-row entry: at most two instantiations of the tiled template
/// each, one for a multiple of four and one for other lengths. NVRTC took 2.5 to 3.5 ms for
/// each on an H200's host; with all eleven in one entry softmax's took 38 ms, its other entries
/// 11 to 15 ms.
pub(crate) const SHORT_SPLITS: [u64; 8] = [2, 4, 8, 12, 16, 24, 28, 32];

/// The 4-element vectors each thread of an elementwise kernel takes (see `Geometry::Map`):
/// eight where a thread sets up Philox's keys (W3 on an H200: 74% of copy bandwidth at four,
/// 77% at eight); four where it sets up the reciprocals of a broadcast's index; two where each
/// element calls a math routine (`exp`, `ln`, `tanh`...), which makes the kernel bound by its
/// instructions on a GPU with fast memory, so a thread's own setup and loop costs are worth
/// spreading over two vectors (W1 on an H200: 93% with one, 99% with two; benches/NOTES.md item
/// 30); else one, which keeps the most loads in flight for kernels that only stream (W10: 103%
/// with one, 102% with two).
pub(crate) fn map_vectors(k: &Kernel, domain: &[usize]) -> u32 {
    let broadcast = k
        .tensor_params()
        .any(|(_, _, shape)| shape.as_slice() != domain)
        || k.outputs.iter().any(|o| o.shape.as_slice() != domain);
    let random = k.draws_random();
    let routine = k
        .nodes
        .iter()
        .any(|n| matches!(&n.op, crate::ir::Op::Call(f, _) if f.is_routine()));
    match (random, broadcast, routine) {
        (true, _, _) => 8,
        (false, true, _) => 4,
        (false, false, true) => 2,
        (false, false, false) => 1,
    }
}

/// The most blocks per SM of a row kernel's grid (`Geometry::Rows`). Many short-lived blocks
/// (160 per SM) stream best where a kernel writes whole rows: a block's row writes cover the
/// start of the next block's loads. Longer-lived blocks (40 per SM), each copying its next row
/// while it works through the passes of this one, keep a kernel fed where it has three reducing
/// passes over the row (W7: mean, variance, absolute maximum; bound by its instructions) or
/// writes a value per row only (W9, cross-entropy: its rows are read, reduced and left, so
/// little but the copy ahead hides the next row's loads). Measured (benches/NOTES.md, items 27,
/// 28 and 30): on an H200, W9 96% at 40 against 86% at 160, W7 70% against 67%, W5 95% at 160
/// against 91% at 40; on an H100 the per-row case was 97% at 40 and 100% at 160, and the fast
/// memory decides here.
///
/// A row reduced once and left (a row sum) whose rows are of 32-bit elements takes 120: on an
/// H200 (item 124), S2's f32 row sums ran 0.8-2.2% faster at 2 to 4096 columns with 120 than
/// with 40 (80 in between; equal at 32768 and 262144 columns, 8192 and 1024 rows), where the
/// 16-bit ones did not (bf16 at 2 columns 2% slower with 80 or 120, f16 mixed) and W9 (two
/// passes) was 1.3% slower with 120.
pub(crate) fn row_blocks_per_sm(k: &Kernel, domain: &[usize], plan: &Plan) -> u32 {
    let writes_rows = k.outputs.iter().any(|o| o.shape.as_slice() == domain);
    let rows_of_32_bits = k
        .tensor_params()
        .filter(|(_, _, shape)| shape.as_slice() == domain)
        .all(|(_, p, _)| p.elem.bits() == 32);
    match (plan.reducing_passes(), writes_rows) {
        (0..=2, true) => 160,
        (1, false) if rows_of_32_bits => 120,
        _ => 40,
    }
}

/// The most blocks per SM of a row kernel's grid where a block loads whole rows straight into
/// registers (the row-a-block entries' `Grid::Rows`; `rows::direct_row_cost`), else 0. With no
/// copy ahead a block waits for each row's loads, which other blocks overlap: hundreds of blocks
/// an SM, a few of them resident at once, each a row or two; the fewer instructions an element
/// costs, the more. Measured on an H200, two runs each (benches/NOTES.md, items 55 and 57), in GB/s:
///
/// | blocks an SM | 160 | 240 | 320 | 480 | a block a row |
/// | --- | --- | --- | --- | --- | --- |
/// | W8 (RMSNorm, cost 5) | 4246 | 4280 | 4296 | **4337** | 4326 |
/// | W5 (softmax, cost 15) | 4260 | 4288 | **4297** | 4266 | 4255 |
///
/// For the whole kernel, 320 cost softmax's shorter rows (1024 columns) 6 points, so these
/// grids are for these rows only.
///
/// Except where a block reduces each row twice over two tensors or more, which it asks L2 for
/// its next row of (`rows::next_row_to_l2`): there [`NEXT_ROW_BLOCKS_PER_SM`], whatever the cost.
pub(crate) fn direct_blocks_per_sm(k: &Kernel, plan: &Plan) -> u32 {
    if long_lived_blocks(k, plan) {
        return NEXT_ROW_BLOCKS_PER_SM;
    }
    match direct_row_cost(k, plan) {
        None => 0,
        Some(0..=8) => 480,
        Some(_) => 320,
    }
}

/// Whether a row-a-block grid holds a few long-lived blocks, [`NEXT_ROW_BLOCKS_PER_SM`] an SM:
/// where a block reduces each row twice over two tensors or more, which it asks L2 for its next
/// row of (`rows::next_row_to_l2`).
pub(crate) fn long_lived_blocks(k: &Kernel, plan: &Plan) -> bool {
    let cached = cached_params(k, plan);
    writes_rows(k) && plan.reducing_passes() == 2 && cached.len() >= 2 && next_row_to_l2(k, &cached)
}

/// The blocks per SM of a row-a-block grid where each row is reduced twice over two tensors or
/// more, the next row asked of L2: a few blocks an SM, each going through many rows, whose
/// next rows reach L2 while they reduce this one; with a row or two a block (160 or 320 an SM)
/// each row's loads wait on HBM. 12 is a multiple of any residency up to 4 and of 6, so no SM
/// runs a last wave of fewer blocks (at 6, with four resident, G6 fell to 86%). Measured on
/// an H200 (benches/NOTES.md item 117), % of copy with `FUSE_ROW_BLOCKS_PER_SM` (4096-column
/// rows, which only the row-a-block entry takes):
///
/// | blocks an SM | 2 | 3 | 4 | 6 | 8 | 12 | default |
/// | --- | --- | --- | --- | --- | --- | --- | --- |
/// | G6 (softmax backward: `x`, `dy`; the maximum, then the sums) | 84 | 91 | 93 | 86 | 93 | **93** | 88 (160) |
/// | G6T (from saved statistics: one reduction) | 87 | 94 | 95 | 86 | 94 | 95 | **100** (160) |
/// | S2 softmax bf16 (one tensor), ms | | | | | 0.2850 | 0.2798 | **0.2682** (320) |
pub(crate) const NEXT_ROW_BLOCKS_PER_SM: u32 = 12;

#[cfg(test)]
mod tests {
    use crate::testing::kernel;
    use quote::quote;

    /// The row grid by reducing passes and outputs: W7's three passes (mean, variance, absolute
    /// maximum) and cross-entropy's value per row, against softmax's two passes and whole rows;
    /// a row sum by the width of its elements.
    #[test]
    fn row_grids_follow_the_reducing_passes() {
        let blocks = |tokens| {
            let k = kernel(tokens);
            let crate::ir::Launch::Rows { domain, .. } = &k.launch else {
                panic!("a row kernel")
            };
            super::row_blocks_per_sm(&k, domain, &crate::plan::plan(&k))
        };
        let quantize = blocks(quote! {
            fn q(x: [f32; rows, cols]) -> [i8; rows, cols] {
                let d = x - mean(x, cols);
                let y = d * rsqrt(mean(d * d, cols) + 1e-5);
                (y / (max(y.abs(), cols) / 127.0)).round() as i8
            }
        });
        let softmax = blocks(quote! {
            fn s(x: [f32; rows, cols]) -> [f32; rows, cols] { let e = (x - max(x, cols)).exp(); e / sum(e, cols) }
        });
        let cross_entropy = blocks(quote! {
            fn c(x: [f32; rows, cols], label: [i64; rows]) -> [f32; rows] {
                logsumexp(x, cols) - sum(if index(cols) as i64 == label { x } else { 0.0 }, cols)
            }
        });
        let row_sum = |elem: proc_macro2::TokenStream| {
            blocks(quote! { fn r(x: [#elem; rows, cols]) -> [#elem; rows] { sum(x, cols) } })
        };
        assert_eq!((quantize, softmax, cross_entropy), (40, 160, 40));
        assert_eq!((row_sum(quote!(f32)), row_sum(quote!(bf16))), (120, 40));
    }

    /// The general row entry's register bound: a row of one tensor reduced once or twice and
    /// left takes five blocks an SM at four lanes, four at eight; more reductions, another
    /// tensor or a written row, three at most.
    #[test]
    fn streamed_row_sums_bound_their_registers() {
        let bound = |tokens| {
            let k = kernel(tokens);
            super::stream_min_blocks(&k, &crate::plan::plan(&k))
        };
        let f32_sum = bound(quote! { fn r(x: [f32; rows, cols]) -> [f32; rows] { sum(x, cols) } });
        let bf16_sum =
            bound(quote! { fn r(x: [bf16; rows, cols]) -> [bf16; rows] { sum(x, cols) } });
        let stats = bound(quote! {
            fn r(x: [f32; rows, cols]) -> ([f32; rows], [f32; rows], [f32; rows], [f32; rows]) {
                (sum(x, cols), prod(x, cols), max(x, cols), min(x, cols))
            }
        });
        let products = bound(quote! {
            fn r(x: [f32; rows, cols], y: [f32; rows, cols]) -> [f32; rows] { sum(x * y, cols) }
        });
        let softmax = bound(quote! {
            fn s(x: [f32; rows, cols]) -> [f32; rows, cols] { let e = (x - max(x, cols)).exp(); e / sum(e, cols) }
        });
        assert_eq!((f32_sum, bf16_sum), (5, 4));
        assert!(
            stats <= 3 && products <= 3 && softmax <= 3,
            "{stats} {products} {softmax}"
        );
    }

    /// The grid where a block loads whole rows straight into registers: more blocks for
    /// RMSNorm than for softmax, none for layernorm with GELU, which copies its rows ahead, and
    /// a few long-lived ones for two tensors reduced twice a row.
    #[test]
    fn direct_row_grids_follow_the_cost_of_an_element() {
        let blocks = |tokens| {
            let k = kernel(tokens);
            super::direct_blocks_per_sm(&k, &crate::plan::plan(&k))
        };
        let rmsnorm = blocks(quote! {
            fn r(x: [f32; rows, cols], w: [f32; cols]) -> [f32; rows, cols] {
                x * rsqrt(mean(x * x, cols) + 1e-6) * w
            }
        });
        let softmax = blocks(quote! {
            fn s(x: [f32; rows, cols]) -> [f32; rows, cols] {
                let e = (x - max(x, cols)).exp();
                e / sum(e, cols)
            }
        });
        let layernorm_gelu = blocks(quote! {
            fn l(x: [f32; rows, cols], g: [f32; cols], b: [f32; cols]) -> [f32; rows, cols] {
                let d = x - mean(x, cols);
                gelu(d * rsqrt(mean(d * d, cols) + 1e-5) * g + b)
            }
        });
        // Softmax's backward: two 16-bit tensors, each row reduced twice (its maximum, then
        // its sums); once, from the forward's saved statistics.
        let k = kernel(quote! {
            #[vjp(x)]
            fn s(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
                let e = (x - detach(max(x, cols))).exp();
                e / sum(e, cols)
            }
        });
        let derived = |d: crate::grad::Derived| {
            let k = &d.steps[0].kernel;
            super::direct_blocks_per_sm(k, &crate::plan::plan(k))
        };
        let vjp = crate::grad::vjp(&k, false, "d").unwrap();
        let saved = derived(crate::grad::train(&k, &vjp).unwrap().backward);
        let backward = derived(vjp);
        assert_eq!((rmsnorm, softmax, layernorm_gelu), (480, 320, 0));
        assert_eq!((backward, saved), (super::NEXT_ROW_BLOCKS_PER_SM, 0));
    }

    /// Row-a-block loops copy two 16-bit rows ahead where each block goes through many rows:
    /// softmax's backward (its own grid of a few blocks an SM) and RMSNorm's (partial sums),
    /// on the entry of rows of 4096 only; not the training pair's softmax backward (a row or
    /// two a block), nor a backward that draws random numbers.
    #[test]
    fn blocks_that_take_many_rows_copy_two_sixteen_bit_rows_ahead() {
        let ahead = |tokens, train: bool, exact: bool| {
            let k = kernel(tokens);
            let vjp = crate::grad::vjp(&k, false, "d").unwrap();
            let d = match train {
                true => crate::grad::train(&k, &vjp).unwrap().backward,
                false => vjp,
            };
            let k = &d.steps[0].kernel;
            let plan = crate::plan::plan(k);
            let cached = crate::plan::rows::cached_params(k, &plan);
            crate::plan::rows::block_copies_ahead(k, &plan, &cached, exact)
        };
        let softmax = quote! {
            #[vjp(x)]
            fn s(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
                let e = (x - detach(max(x, cols))).exp();
                e / sum(e, cols)
            }
        };
        let rmsnorm = quote! {
            #[vjp(x, w)]
            fn r(x: [bf16; t, h], w: [bf16; h]) -> [bf16; t, h] {
                x * rsqrt(mean(x * x, h) + 1e-6) * w
            }
        };
        let dropout = quote! {
            #[vjp(x, b)]
            fn d(x: [bf16; t, h], b: [bf16; h], seed: u64) -> [bf16; t, h] {
                let y = dropout(x + b, 0.1, seed);
                y / sum(y, h)
            }
        };
        let found = [
            ahead(softmax.clone(), false, true),
            ahead(softmax.clone(), false, false),
            ahead(softmax, true, true),
            ahead(rmsnorm, false, true),
            ahead(dropout, false, true),
        ];
        assert_eq!(found, [true, false, false, true, false]);
    }

    /// RMSNorm's backward over two bf16 rows with one output's partial sums holds 32 registers
    /// across its rows and takes three blocks an SM; LayerNorm's (two outputs' sums) and the
    /// `value_and_vjp` of RMSNorm (`y` beside `dx`) keep two.
    #[test]
    fn sixteen_bit_rows_with_one_output_of_partial_sums_take_three_blocks() {
        let bound = |tokens, values| {
            let k = kernel(tokens);
            let d = crate::grad::vjp(&k, values, "d").unwrap();
            let k = &d.steps[0].kernel;
            super::min_blocks(k, &crate::plan::plan(k))
        };
        let rmsnorm = quote! {
            #[vjp(x, w)]
            fn r(x: [bf16; t, h], w: [bf16; h]) -> [bf16; t, h] {
                x * rsqrt(mean(x * x, h) + 1e-6) * w
            }
        };
        let layernorm = quote! {
            #[vjp(x, g, b)]
            fn l(x: [bf16; t, h], g: [bf16; h], b: [bf16; h]) -> [bf16; t, h] {
                let d = x - mean(x, h);
                d * rsqrt(mean(d * d, h) + 1e-5) * g + b
            }
        };
        let f32_rmsnorm = quote! {
            #[vjp(x, w)]
            fn r(x: [f32; t, h], w: [f32; h]) -> [f32; t, h] {
                x * rsqrt(mean(x * x, h) + 1e-6) * w
            }
        };
        let found = (
            bound(rmsnorm.clone(), false),
            bound(rmsnorm, true),
            bound(layernorm, false),
            bound(f32_rmsnorm, false),
        );
        assert_eq!(found, (3, 2, 2, 2));
    }

    /// An elementwise kernel is bounded only where it has `f64` values and routines on narrower
    /// floats (random program `p184`'s shape), which ptxas spilled unbounded.
    #[test]
    fn mixed_precision_routines_bound_an_elementwise_kernel() {
        let bound = |tokens| super::map_min_blocks(&kernel(tokens));
        let mixed = bound(quote! {
            fn f(x: [f64; n], y: [i8; n]) -> ([f64; n], [f16; n]) {
                let d = (y as f16).to_degrees();
                (-x.asin(), cos(d % tan(d)))
            }
        });
        let narrow = bound(quote! { fn f(x: [f32; n]) -> [f32; n] { x.sin() + x.cos().tan() } });
        let wide = bound(quote! { fn f(x: [f64; n]) -> [f64; n] { x.sin() + x.cos().tan() } });
        let cast = bound(
            quote! { fn f(x: [f32; n], y: [f64; n]) -> [f64; n] { (x as f64) * y + y.sqrt() } },
        );
        assert_eq!((mixed, narrow, wide, cast), (Some(1), None, None, None));
    }

    /// Short rows take a block fewer with eight tensors or more and two routines or more (an
    /// `f64` one counts two): random program `p244`'s shape, against seven tensors.
    #[test]
    fn many_tensors_and_routines_take_a_short_row_block_fewer() {
        let blocks = |tokens| {
            let k = kernel(tokens);
            super::short_min_blocks(&k, &crate::plan::plan(&k))
        };
        let eight = blocks(quote! {
            fn f(a: [f32; r, c], b: [f32; r, c], x: [f64; r], y: [f64; r], z: [f64; r])
                -> ([f64; r], [f64; r], [f32; r]) {
                (x.asin() + sum(a, c) as f64, y / z, max(b, c))
            }
        });
        let seven = blocks(quote! {
            fn f(a: [f32; r, c], x: [f64; r], y: [f64; r], z: [f64; r])
                -> ([f64; r], [f64; r], [f32; r]) {
                (x.asin() + sum(a, c) as f64, y / z, max(a, c))
            }
        });
        let plain = blocks(quote! {
            fn f(a: [f32; r, c], b: [f32; r, c], x: [f32; r], y: [f32; r], z: [f32; r])
                -> ([f32; r], [f32; r], [f32; r]) {
                (x + sum(a, c), y / z, max(b, c))
            }
        });
        let short = super::SHORT_BLOCKS;
        assert_eq!((eight, seven, plain), (short - 1, short, short));
    }

    /// Rows in registers take one block (255 registers) where their cache and passes need more
    /// than two blocks' 128: four `f64` tensors cached, but not softmax's one `f32`.
    #[test]
    fn rows_cached_beyond_128_registers_take_one_block() {
        let blocks = |tokens| {
            let k = kernel(tokens);
            let plan = crate::plan::plan(&k);
            (
                super::register_min_blocks(&k, &plan),
                super::min_blocks(&k, &plan),
            )
        };
        let wide = blocks(quote! {
            fn f(a: [f64; r, c], b: [f64; r, c], x: [f64; r, c], y: [f64; r, c]) -> [f64; r, c] {
                let m = max(a * b, c);
                x * y - m + sum(a - m, c)
            }
        });
        let softmax = blocks(quote! {
            fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        assert_eq!((wide.0, softmax.0), (1, softmax.1));
    }

    /// Rows are not held in registers where their cache, passes and `f64` slow-path calls need
    /// more than 255: random program `p41713`, whose cached entry spilled 104 bytes at one block,
    /// but the same program with products in place of its quotients fits.
    #[test]
    fn rows_with_wide_calls_beyond_255_registers_are_not_cached() {
        let fits = |tokens| {
            let k = kernel(tokens);
            let plan = crate::plan::plan(&k);
            super::rows_fit_registers(&k, &plan)
        };
        let divides = fits(quote! {
            fn p(x0: [bf16; d0], x1: [f64; d0], x2: [f64; d0], x3: [f64; d0], x4: [f64; d0],
                x5: [f32; d0], x6: [f32; d0]) -> ([f64; d0], [f32; d0]) {
                ((rsqrt(relu(x1)) / x2.copysign((x3 / x4))),
                    (gelu_tanh(max((x5 - x5), d0)) + x6))
            }
        });
        let multiplies = fits(quote! {
            fn p(x0: [bf16; d0], x1: [f64; d0], x2: [f64; d0], x3: [f64; d0], x4: [f64; d0],
                x5: [f32; d0], x6: [f32; d0]) -> ([f64; d0], [f32; d0]) {
                ((relu(x1) * x2.copysign((x3 * x4))), (gelu_tanh(max((x5 - x5), d0)) + x6))
            }
        });
        assert_eq!((divides, multiplies), (false, true));
    }

    /// Elementwise grids: two vectors a thread where each element calls a math routine, four
    /// where a broadcast sets up each thread's work, eight for random numbers, else one.
    #[test]
    fn map_vectors_follow_the_work_per_element() {
        let vectors = |tokens| {
            let k = kernel(tokens);
            let crate::ir::Launch::Map { domain } = &k.launch else {
                panic!("an elementwise kernel")
            };
            super::map_vectors(&k, domain)
        };
        let tangent = vectors(
            quote! { fn t(x: [f32; n], y: [f32; n]) -> [f32; n] { x * y + x.abs().max(y) } },
        );
        let softplus = vectors(quote! { fn s(x: [f32; n]) -> [f32; n] { (x.exp() + 1.0).ln() } });
        let bias =
            vectors(quote! { fn b(x: [f32; r, c], b: [f32; c]) -> [f32; r, c] { (x + b).tanh() } });
        let noise =
            vectors(quote! { fn d(x: [f32; n], seed: u64) -> [f32; n] { x + randn(seed) } });
        assert_eq!((tangent, softplus, bias, noise), (1, 2, 4, 8));
    }
}
