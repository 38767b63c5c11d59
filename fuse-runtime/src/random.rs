//! The random numbers of `rand(seed)`, `randn(seed)` and `dropout(x, p, seed)`, computed on the
//! host with the same bits as on the GPU.
//!
//! Every number is a function of three things only: the `u64` seed, the element's position, and
//! the call's stream (its place among the kernel's random calls, in source order, from 0). So a
//! kernel gives the same numbers on every run, every device and every backend, and a dropout
//! mask never has to be stored: it can be drawn again, here or in a second kernel.
//!
//! The generator is Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
//! 3", SC 2011), keyed by the seed. One evaluation gives four 32-bit words; the element at
//! position `i` uses word `i % 4` of the evaluation at counter `(i / 4, stream)`, so four
//! neighbouring elements share one evaluation. The position is the element's row-major index in
//! the shape the random value has: for `dropout(x, p, seed)` the shape of `x`; for `rand(seed)`
//! and `randn(seed)` the shape of the expression they are used in (in `x + rand(seed)`, that of
//! `x`).
//!
//! - [`uniform`]: `(word >> 8) * 2^-24`, the 2^24 multiples of 2^-24 in [0, 1), equally likely.
//! - [`normal`]: Box-Muller on the words paired as (0, 1) and (2, 3): the even element of a pair
//!   takes the cosine, the odd one the sine. The logarithm, sine and cosine are polynomials
//!   evaluated with correctly rounded operations and fused multiply-adds only, in a fixed order,
//!   so both backends round every step alike; they are accurate to a few units in the last place.
//! - `dropout(x, p, seed)` is `0` where `uniform(seed, i, stream) < p`, else
//!   `x * (1 / (1 - p))`, in the type of `x`.
//!
//! ```
//! use fuse_runtime::random;
//! // Philox 4x32-10 on the Random123 known-answer vector.
//! assert_eq!(
//!     random::philox4x32_10([0; 4], [0; 2]),
//!     [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
//! );
//! let u = random::uniform(42, 7, 0);
//! assert!((0.0..1.0).contains(&u));
//! assert!(random::normal(42, 7, 0).is_finite());
//! ```

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
/// The key schedule's words, as the macro's generated Philox adds them (`abi.rs`).
pub(crate) const W0: u32 = fuse_macros::__abi!(PHILOX_W0);
pub(crate) const W1: u32 = fuse_macros::__abi!(PHILOX_W1);
const ROUNDS: u32 = fuse_macros::__abi!(ROUNDS);

/// Philox 4x32 with 10 rounds: the block cipher that turns a counter into four random words.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for _ in 0..ROUNDS {
        let p0 = u64::from(M0) * u64::from(c0);
        let p1 = u64::from(M1) * u64::from(c2);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        [c0, c1, c2, c3] = [hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0];
        k0 = k0.wrapping_add(W0);
        k1 = k1.wrapping_add(W1);
    }
    [c0, c1, c2, c3]
}

/// The four words at the evaluation that holds `position`.
fn block(seed: u64, position: u64, stream: u32) -> [u32; 4] {
    let counter = position >> 2;
    philox4x32_10(
        [counter as u32, (counter >> 32) as u32, stream, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// `rand(seed)` at `position` of stream `stream`: an f32 uniform in [0, 1).
pub fn uniform(seed: u64, position: u64, stream: u32) -> f32 {
    u01(block(seed, position, stream)[(position & 3) as usize])
}

/// `randn(seed)` at `position` of stream `stream`: an f32 standard normal.
pub fn normal(seed: u64, position: u64, stream: u32) -> f32 {
    let w = block(seed, position, stream);
    let pair = (position & 2) as usize;
    box_muller(w[pair], w[pair + 1], position & 1 == 1)
}

/// A word as a multiple of 2^-24 in [0, 1): exact.
fn u01(word: u32) -> f32 {
    (word >> 8) as f32 * TWO_POW_MINUS_24
}

const TWO_POW_MINUS_24: f32 = 5.960_464_5e-8;

/// `sqrt(-2 ln u) * cos(2 pi t)` (or `sin`), with `u` in (0, 1] from `a` and the turn `t` in
/// [0, 1) from `b`: its quadrant from the top two bits, the fraction within it from the next 22.
fn box_muller(a: u32, b: u32, sine: bool) -> f32 {
    let u = ((a >> 8) + 1) as f32 * TWO_POW_MINUS_24;
    let r = (-2.0 * ln01(u)).sqrt();
    // sin(θ) = cos(θ - π/2): one quadrant back.
    let q = ((b >> 30) + if sine { 3 } else { 0 }) & 3;
    let f = ((b >> 8) & 0x3f_ffff) as f32 * 2.384_185_8e-7;
    // cos and sin of (π/2) f, from a fraction at most 1/2: past it, the complement swaps them.
    let swap = f > 0.5;
    let g = if swap { 1.0 - f } else { f };
    let (c, s) = (cos_quarter(g), sin_quarter(g));
    let (c, s) = if swap { (s, c) } else { (c, s) };
    let v = match q {
        0 => c,
        1 => -s,
        2 => -c,
        _ => s,
    };
    r * v
}

fn bits(b: u32) -> f32 {
    f32::from_bits(b)
}

/// ln(u) for a normal `u` in (0, 1]: `e ln 2 + 2 atanh((m - 1) / (m + 1))` with `m` in
/// [√½, √2], the series to s^11.
fn ln01(u: f32) -> f32 {
    let b = u.to_bits();
    let mut e = (b >> 23) as i32 - 127;
    let mut mb = (b & 0x7f_ffff) | 0x3f80_0000;
    if mb > 0x3fb5_04f3 {
        mb -= 0x0080_0000;
        e += 1;
    }
    let m = f32::from_bits(mb);
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let mut p = bits(0x3e3a_2e8c); // 2/11
    p = z.mul_add(p, bits(0x3e63_8e39)); // 2/9
    p = z.mul_add(p, bits(0x3e92_4925)); // 2/7
    p = z.mul_add(p, bits(0x3ecc_cccd)); // 2/5
    p = z.mul_add(p, bits(0x3f2a_aaab)); // 2/3
    let lm = (s * z).mul_add(p, 2.0 * s);
    (e as f32).mul_add(bits(0x3f31_7218), lm) // ln 2
}

/// sin((π/2) f) for f in [0, 1/2]: the Taylor series to f^9.
fn sin_quarter(f: f32) -> f32 {
    let z = f * f;
    let mut p = bits(0x3928_3c1a);
    p = z.mul_add(p, bits(0xbb99_6966));
    p = z.mul_add(p, bits(0x3da3_35e3));
    p = z.mul_add(p, bits(0xbf25_5de7));
    p = z.mul_add(p, bits(0x3fc9_0fdb));
    f * p
}

/// cos((π/2) f) for f in [0, 1/2]: the Taylor series to f^10.
fn cos_quarter(f: f32) -> f32 {
    let z = f * f;
    let mut p = bits(0xb7d3_68f9);
    p = z.mul_add(p, bits(0x3a70_fa83));
    p = z.mul_add(p, bits(0xbcaa_e9e4));
    p = z.mul_add(p, bits(0x3e81_e0f8));
    p = z.mul_add(p, bits(0xbf9d_e9e6));
    z.mul_add(p, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_random123_known_answers() {
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn the_functions_are_accurate() {
        for i in 1..=4096u32 {
            let u = i as f32 / 4096.0;
            let want = (u as f64).ln();
            assert!(
                (ln01(u) as f64 - want).abs() <= 2e-7 * want.abs().max(1.0),
                "ln {u}"
            );
            let f = i as f32 / 8192.0;
            let x = std::f64::consts::FRAC_PI_2 * f as f64;
            assert!((sin_quarter(f) as f64 - x.sin()).abs() < 2e-7, "sin {f}");
            assert!((cos_quarter(f) as f64 - x.cos()).abs() < 2e-7, "cos {f}");
        }
        assert_eq!(ln01(1.0), 0.0);
    }

    #[test]
    fn uniform_and_normal_have_their_moments() {
        let n = 1 << 18;
        let seed = 0x0123_4567_89ab_cdef;
        let (mut su, mut sn, mut sn2, mut sn4) = (0.0, 0.0, 0.0, 0.0);
        for i in 0..n {
            let u = uniform(seed, i, 3) as f64;
            assert!((0.0..1.0).contains(&u));
            su += u;
            let z = normal(seed, i, 3) as f64;
            sn += z;
            sn2 += z * z;
            sn4 += z * z * z * z;
        }
        let n = n as f64;
        assert!((su / n - 0.5).abs() < 0.005, "{}", su / n);
        assert!((sn / n).abs() < 0.01, "{}", sn / n);
        assert!((sn2 / n - 1.0).abs() < 0.01, "{}", sn2 / n);
        assert!((sn4 / n - 3.0).abs() < 0.06, "{}", sn4 / n);
    }

    #[test]
    fn streams_seeds_and_positions_differ() {
        let a: Vec<f32> = (0..64).map(|i| uniform(1, i, 0)).collect();
        let b: Vec<f32> = (0..64).map(|i| uniform(1, i, 1)).collect();
        let c: Vec<f32> = (0..64).map(|i| uniform(2, i, 0)).collect();
        assert_ne!(a, b);
        assert_ne!(a, c);
        let mut sorted = a.clone();
        sorted.sort_by(f32::total_cmp);
        sorted.dedup();
        assert!(sorted.len() > 60, "positions give different numbers");
        assert_eq!(a, (0..64).map(|i| uniform(1, i, 0)).collect::<Vec<_>>());
    }
}
