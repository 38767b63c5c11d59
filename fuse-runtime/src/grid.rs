//! The shape of a launch, as pure functions of the work and the device: the grid of a
//! [`Geometry`] and the driver's parameter array of its argument slots. Both launch paths (the
//! programs' and the long rows') read it; it reads neither.

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::inline::Inline;

/// The threads per block of every launch (`FUSE_BLOCK` in the generated CUDA C); the macro
/// defines it (`abi.rs`), as every number both sides must agree on.
pub const BLOCK: u32 = fuse_macros::__abi!(BLOCK);

/// Rows up to this length are left to a row kernel's register cache (16 elements a thread);
/// those longer than half of it take a block each.
pub(crate) const REGISTER_ROW: u64 = fuse_macros::__abi!(CACHE) as u64 * BLOCK as u64;

/// How a kernel spreads its work over the GPU; the runtime picks the grid from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geometry {
    /// One thread per element, grid-striding over `elems`; no launch when `elems` is 0.
    Map {
        /// The number of elements.
        elems: u64,
        /// The 4-element vectors each thread takes: 1 for kernels that only stream (as Triton
        /// launches), more for those bound by their instructions (math routines per element)
        /// or whose threads set up more than a vector's work (index divisors, Philox keys),
        /// which a longer grid-stride loop amortizes.
        vectors: u32,
    },
    /// One block per group, grid-striding over `groups`; no launch when `groups` is 0.
    Rows {
        /// The number of groups (rows).
        groups: u64,
        /// The length of each group.
        row_len: u64,
        /// The shared-memory bytes each element of a row takes when the kernel caches long
        /// rows there (see `long_rows`); 0 when it has no such path.
        cache_bytes: u32,
        /// The most blocks per SM in the grid: a program entry's `Grid::Rows` (the macro's
        /// `plan::tuning`); 0 for a block per row. For the long-row launch (`long_rows`), not
        /// 0: as many clusters as the device runs at once, not a cluster a row.
        blocks_per_sm: u32,
        /// For a hand-written launch of a kernel with every row path in one function: the most
        /// blocks per SM for rows of 2049 to 4096 elements, a multiple of four, on sm_90 and
        /// later, in place of `blocks_per_sm`; 0 for none. A program's entries have a grid each
        /// and pass 0.
        direct_blocks_per_sm: u32,
    },
    /// A reduction of everything: grid-striding plus per-block partials in `slots` scratch
    /// slots per block. Always launches, so an empty reduction still writes its result.
    Full {
        /// The number of elements.
        elems: u64,
        /// The scratch slots each block uses.
        slots: u32,
    },
    /// A reduction over a strided dim: a block a tile of 32 adjacent groups
    /// (columns), each tile split into parts along the reduced dim where the tiles alone do not
    /// fill `blocks_per_sm` blocks an SM and `split` allows; no launch when `groups` is 0.
    Columns {
        /// The number of groups (columns).
        groups: u64,
        /// The length of the reduced dim.
        len: u64,
        /// The scratch slots each column of each part uses.
        slots: u32,
        /// Whether tiles may be split across blocks (the kernel has one reducing pass).
        split: bool,
        /// The blocks per SM the grid aims at.
        blocks_per_sm: u32,
        /// Adjacent columns a lane: a tile is `COLUMN_TILE * width` columns.
        width: u32,
    },
}

/// The groups (columns) a column reduction's block owns: one a lane of a warp.
pub(crate) const COLUMN_TILE: u64 = fuse_macros::__abi!(COLUMN_TILE) as u64;

/// The fewest elements of the reduced dim a part of a split column tile takes: eight a warp,
/// so that the parts' partials and their combination stay a small share of the work.
const MIN_PART: u64 = 64;

/// A column reduction's tiles and the parts each is split into, on a GPU of `sm_count`
/// multiprocessors: as many parts as fill the grid the geometry aims at, none shorter than
/// [`MIN_PART`]. The kernel reads the parts back as `gridDim.x / tiles`.
pub(crate) fn column_parts(geometry: Geometry, sm_count: u32) -> (u64, u64) {
    let Geometry::Columns {
        groups,
        len,
        split,
        blocks_per_sm,
        width,
        ..
    } = geometry
    else {
        return (0, 1);
    };
    let tiles = groups.div_ceil(COLUMN_TILE * u64::from(width.max(1)));
    if !split || tiles == 0 {
        return (tiles, 1);
    }
    let target = u64::from(sm_count.max(1)) * u64::from(blocks_per_sm.max(1));
    let parts = (target / tiles).min(len.div_ceil(MIN_PART)).max(1);
    (tiles, parts)
}

/// The number of blocks for `geometry` on a GPU with `sm_count` multiprocessors of compute
/// capability `major.x`, or `None` when there is nothing to launch. A pure function, so full
/// reductions are deterministic.
pub(crate) fn grid(geometry: Geometry, sm_count: u32, major: u32) -> Option<u32> {
    let sm = u64::from(sm_count.max(1));
    let blocks = |elems: u64| elems.div_ceil(u64::from(BLOCK));
    let blocks = match geometry {
        Geometry::Map { elems: 0, .. }
        | Geometry::Rows { groups: 0, .. }
        | Geometry::Columns { groups: 0, .. } => return None,
        // `vectors` 4-element vectors per thread, as many blocks as that takes (the grid-stride
        // loop then runs `vectors` times).
        Geometry::Map { elems, vectors } => elems
            .div_ceil(u64::from(BLOCK) * 4 * map_vectors(vectors))
            .min(i32::MAX as u64),
        Geometry::Rows {
            groups,
            row_len,
            blocks_per_sm,
            direct_blocks_per_sm,
            ..
        } => {
            // The kernel's row-a-block loop, compiled for sm_90 and later, takes these rows.
            let whole =
                row_len % 4 == 0 && (REGISTER_ROW / 2 + 1..=REGISTER_ROW).contains(&row_len);
            let per_sm = match direct_blocks_per_sm {
                d if d > 0 && whole && major >= 9 => d,
                _ => blocks_per_sm,
            };
            match row_blocks_per_sm(per_sm) {
                0 => groups,
                per_sm => groups.min(sm * per_sm),
            }
        }
        // Small inputs in one block, which then writes the result itself (no second round).
        Geometry::Full { elems, .. } if elems <= u64::from(BLOCK) * 32 => 1,
        Geometry::Full { elems, .. } => blocks(elems).min(sm * 4),
        // Every part of every tile a block; unsplit tiles past `i32::MAX` stride.
        Geometry::Columns { .. } => {
            let (tiles, parts) = column_parts(geometry, sm_count);
            tiles.saturating_mul(parts).min(i32::MAX as u64)
        }
    };
    // At most 16 * u32::MAX, and in practice a few thousand; saturate rather than wrap.
    Some(u32::try_from(blocks.max(1)).unwrap_or(u32::MAX))
}

/// A number from the environment variable `name`, read once into `cell`: the knobs with which
/// the benchmark compares launch shapes in one build. `None` when unset or not a number.
pub(crate) fn knob(cell: &'static OnceLock<Option<u64>>, name: &str) -> Option<u64> {
    *cell.get_or_init(|| std::env::var(name).ok()?.trim().parse().ok())
}

/// The 4-element vectors each thread of an elementwise grid takes: the kernel's `vectors`, or
/// what `FUSE_MAP_VECTORS` says, for the benchmark to compare grids in one build. Measured on
/// an H100 (NOTES.md, item 21): W3 (a bias, GELU and Philox dropout) at 79, 88 and 91% of copy
/// with 1, 2 and 4; W1, W2 and W10 a point lower with 2 or 4 than with 1. On an H200 (item 30),
/// whose memory is faster: W1 93, 99, 99 and 97% with 1, 2, 4 and 8; W3 58, 68, 74 and 77%.
fn map_vectors(vectors: u32) -> u64 {
    static SET: OnceLock<Option<u64>> = OnceLock::new();
    knob(&SET, "FUSE_MAP_VECTORS")
        .filter(|&v| v > 0)
        .unwrap_or(u64::from(vectors.max(1)))
}

/// The most blocks per SM a row kernel's grid holds (the kernel's `blocks_per_sm`); its
/// grid-stride loop takes the rest, with the next row copied ahead while a row is reduced.
/// `FUSE_ROW_BLOCKS_PER_SM` (0: a block per row) overrides it, for the benchmark to compare
/// grids.
fn row_blocks_per_sm(blocks_per_sm: u32) -> u64 {
    static SET: OnceLock<Option<u64>> = OnceLock::new();
    knob(&SET, "FUSE_ROW_BLOCKS_PER_SM").unwrap_or(u64::from(blocks_per_sm))
}

/// The argument slots of one launch, on the stack for up to [`INLINE_SLOTS`].
pub(crate) type Slots = Inline<u64, INLINE_SLOTS>;

/// The driver's parameter array for `slots`: the address of each slot, on the stack for up to
/// `INLINE_SLOTS` arguments.
pub(crate) fn param_array(slots: &mut [u64]) -> Inline<*mut c_void, INLINE_SLOTS> {
    let mut params = Inline::new(std::ptr::null_mut::<c_void>(), slots.len());
    for (param, slot) in params.as_mut_slice().iter_mut().zip(slots.iter_mut()) {
        *param = (slot as *mut u64).cast();
    }
    params
}

/// The argument slots a launch keeps on the stack; more (a kernel of over 14 tensors, scalars
/// and dims, with a full reduction's two) go to the heap.
pub(crate) const INLINE_SLOTS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_grid() {
        if std::env::var_os("FUSE_MAP_VECTORS").is_some() {
            return; // it overrides every kernel's vectors
        }
        let one = |elems| grid(Geometry::Map { elems, vectors: 1 }, 132, 9);
        assert_eq!(one(0), None);
        assert_eq!((one(1), one(256), one(1024)), (Some(1), Some(1), Some(1)));
        assert_eq!((one(1025), one(4097)), (Some(2), Some(5)));
        assert_eq!(one(u64::MAX), Some(i32::MAX as u32));
        let four = |elems| grid(Geometry::Map { elems, vectors: 4 }, 132, 9);
        assert_eq!(
            (four(4096), four(4097), four(1 << 20)),
            (Some(1), Some(2), Some(256))
        );
    }

    #[test]
    fn rows_grid() {
        let shaped = |groups, row_len, blocks_per_sm, direct_blocks_per_sm| Geometry::Rows {
            groups,
            row_len,
            cache_bytes: 4,
            blocks_per_sm,
            direct_blocks_per_sm,
        };
        let rows = |groups, blocks_per_sm| shaped(groups, 1000, blocks_per_sm, 320);
        assert_eq!(grid(rows(0, 160), 132, 9), None);
        assert_eq!(grid(rows(7, 160), 132, 9), Some(7));
        if std::env::var_os("FUSE_ROW_BLOCKS_PER_SM").is_none() {
            assert_eq!(grid(rows(1_000_000, 160), 132, 9), Some(132 * 160));
            assert_eq!(grid(rows(1_000_000, 40), 132, 9), Some(132 * 40));
            assert_eq!(grid(rows(1_000_000, 0), 132, 9), Some(1_000_000));
            // Rows a block loads straight into registers: 2049 to 4096 elements, multiples of
            // four, from sm_90.
            let direct = |row_len, major| grid(shaped(1_000_000, row_len, 160, 320), 132, major);
            assert_eq!(direct(4096, 9), Some(132 * 320));
            assert_eq!(direct(2052, 10), Some(132 * 320));
            assert_eq!(direct(4096, 8), Some(132 * 160), "sm_80 has no such loop");
            assert_eq!(
                direct(2048, 9),
                Some(132 * 160),
                "rows of 2048 are segments"
            );
            assert_eq!(direct(4100, 9), Some(132 * 160));
            assert_eq!(direct(4094, 9), Some(132 * 160), "not a multiple of four");
            let copied = shaped(1_000_000, 4096, 160, 0);
            assert_eq!(grid(copied, 132, 9), Some(132 * 160));
            assert_eq!(grid(shaped(77, 4096, 160, 320), 132, 9), Some(77));
        }
    }

    #[test]
    fn column_grids_split_tiles_until_the_gpu_is_full() {
        let columns = |groups, len, split| Geometry::Columns {
            groups,
            len,
            slots: 1,
            split,
            blocks_per_sm: 8,
            width: 1,
        };
        assert_eq!(grid(columns(0, 100, true), 132, 9), None);
        // 4096 columns: 128 tiles, 8 parts each fill 132 SMs x 8.
        assert_eq!(column_parts(columns(4096, 65536, true), 132), (128, 8));
        assert_eq!(grid(columns(4096, 65536, true), 132, 9), Some(1024));
        // 256 columns: 8 tiles of 132 parts.
        assert_eq!(column_parts(columns(256, 1 << 20, true), 132), (8, 132));
        // Enough tiles, a short reduced dim, or a kernel that cannot split: one part.
        assert_eq!(column_parts(columns(65536, 4096, true), 132), (2048, 1));
        assert_eq!(column_parts(columns(256, 100, true), 132), (8, 2));
        assert_eq!(column_parts(columns(256, 1 << 20, false), 132), (8, 1));
        assert_eq!(column_parts(columns(33, 0, true), 132), (2, 1));
        assert_eq!(grid(columns(33, 1 << 20, false), 132, 9), Some(2));
        // Two or four columns a lane: tiles of 64 or 128, and more parts to each.
        let vectors = |groups, len, width| Geometry::Columns {
            groups,
            len,
            slots: 1,
            split: true,
            blocks_per_sm: 8,
            width,
        };
        assert_eq!(column_parts(vectors(4096, 65536, 2), 132), (64, 16));
        assert_eq!(column_parts(vectors(34, 1 << 20, 2), 132), (1, 1056));
        assert_eq!(column_parts(vectors(4096, 65536, 4), 132), (32, 33));
        assert_eq!(column_parts(vectors(36, 1 << 20, 4), 132), (1, 1056));
        assert_eq!(column_parts(vectors(1 << 20, 256, 4), 132), (8192, 1));
    }

    #[test]
    fn full_grid_always_launches() {
        let full = |elems| Geometry::Full { elems, slots: 2 };
        assert_eq!(grid(full(0), 132, 9), Some(1));
        assert_eq!(grid(full(1000), 132, 9), Some(1));
        assert_eq!(grid(full(8192), 132, 9), Some(1));
        assert_eq!(grid(full(8193), 132, 9), Some(33));
        assert_eq!(grid(full(1 << 40), 132, 9), Some(132 * 4));
        assert_eq!(
            grid(full(1 << 40), 0, 9),
            Some(4),
            "a zero SM count still launches"
        );
    }
}
