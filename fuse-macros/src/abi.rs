//! The numbers the generated code and the runtime must agree on, defined once, here: the
//! runtime takes each through `fuse_macros::__abi!(NAME)` (a literal), and the tests below check
//! that the CUDA text the macro prints uses them where it spells them out.

/// Threads per block; the runtime launches every kernel with this many.
pub const BLOCK: u32 = 256;
/// Elements of a row each thread keeps in registers, when the row fits: rows up to
/// `CACHE * BLOCK` elements stay in registers, and the runtime launches longer ones elsewhere.
pub const CACHE: u32 = 16;
/// The most blocks of a cluster without the kernel's permission.
pub const PORTABLE_CLUSTER: u32 = 8;
/// The most blocks of a cluster with it. Each block of a long-row kernel keeps a slot for every
/// block's result of every reduction of a pass.
pub const MAX_CLUSTER: u32 = 16;
/// The elements a long row's part is a multiple of (`fz_part`), so that every part of an
/// aligned row starts on a 128-byte line of 4-byte elements.
pub const PART: u32 = 32;
/// Philox 4x32-10's key schedule: the words added to the key's low and high halves each round.
pub const PHILOX_W0: u32 = 0x9E37_79B9;
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Philox 4x32-10's rounds, each with its own key.
pub const ROUNDS: u32 = 10;
/// The alignment in bytes every buffer address a kernel is given must have: its widest vector
/// loads and stores, and bulk copies, are 16 bytes.
pub const ALIGN: u32 = 16;

/// The adjacent rows (columns) a column reduction's block owns, one a lane of a warp: the
/// runtime sizes the grid and the counters by it.
pub const COLUMN_TILE: u32 = 32;

/// The constant `name` as a `u32` literal, for `__abi!`; `None` for a name not defined here.
pub fn value(name: &str) -> Option<u32> {
    Some(match name {
        "BLOCK" => BLOCK,
        "CACHE" => CACHE,
        "PORTABLE_CLUSTER" => PORTABLE_CLUSTER,
        "MAX_CLUSTER" => MAX_CLUSTER,
        "PART" => PART,
        "PHILOX_W0" => PHILOX_W0,
        "PHILOX_W1" => PHILOX_W1,
        "ROUNDS" => ROUNDS,
        "ALIGN" => ALIGN,
        "COLUMN_TILE" => COLUMN_TILE,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::kernel;
    use quote::quote;

    /// The CUDA text of a kernel, with every helper it may print.
    fn text(tokens: proc_macro2::TokenStream) -> String {
        let k = kernel(tokens);
        crate::cuda::text(&k)
    }

    #[test]
    fn the_cuda_text_spells_the_constants_as_defined_here() {
        let random = text(quote! {
            fn r(x: [f32; n], seed: f32) -> [f32; n] { x + randn(seed as u64 + 1) }
        });
        assert!(random.contains(&format!("k0 += {PHILOX_W0:#X}u; k1 += {PHILOX_W1:#X}u;")));
        assert!(random.contains(&format!("for (int i = 0; i < {ROUNDS}; ++i)")));
        assert!(random.contains(&format!("__launch_bounds__({BLOCK}")));
        let long = text(quote! {
            fn s(x: [f32; rows, cols]) -> [f32; rows, cols] {
                let e = (x - max(x, cols)).exp();
                e / sum(e, cols)
            }
        });
        let rounding = format!("blocks - 1) / blocks + {}) & ~{}u", PART - 1, PART - 1);
        assert!(long.contains(&rounding), "fz_part rounds to {PART}");
        assert!(long.contains(&format!("if (blocks > {MAX_CLUSTER} ||")));
        let columns = text(quote! { fn c(x: [f32; r, c]) -> [f32; c] { sum(x, r) } });
        assert!(columns.contains(&format!(
            "const long long gl = tile * {COLUMN_TILE} + lane;"
        )));
        assert!(columns.contains(&format!("threadIdx.x & {}", COLUMN_TILE - 1)));
    }

    #[test]
    fn every_name_has_its_value() {
        assert_eq!(value("BLOCK"), Some(256));
        assert_eq!(value("ALIGN"), Some(16));
        assert_eq!(value("block"), None);
        assert!(PORTABLE_CLUSTER <= MAX_CLUSTER && PART.is_power_of_two());
        // A tile is a warp's lanes, and the block's warps split the reduced dim.
        assert!(COLUMN_TILE == 32 && BLOCK.is_multiple_of(COLUMN_TILE));
    }
}
