//! Inputs, outputs and comparisons: what the generated glue calls, and what the tests check.

use crate::oracle::{self, count, Desc, Extra, WriteStats, V};
use crate::ty::{Rng, Ty};
use fuse_runtime::{bf16, f16, Buffer, Device, Element, Error};

/// One parameter's values on the host.
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I16(Vec<i16>),
    U16(Vec<u16>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    I64(Vec<i64>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
}

/// An element type the glue can move between [`Data`], buffers and [`Out`].
pub trait Elem: Element {
    fn slice(d: &Data) -> &[Self];
    fn values(v: Vec<Self>) -> Vals;
}

macro_rules! elem {
    ($($t:ty => $var:ident, $kind:ident, $conv:expr);* $(;)?) => {$(
        impl Elem for $t {
            fn slice(d: &Data) -> &[Self] {
                match d {
                    Data::$var(v) => v,
                    _ => panic!("the glue asked for {} of another parameter", stringify!($t)),
                }
            }
            fn values(v: Vec<Self>) -> Vals {
                Vals::$kind(v.into_iter().map($conv).collect())
            }
        }
    )*};
}

elem! {
    f32 => F32, Float, f64::from;
    f64 => F64, Float, |x| x;
    f16 => F16, Float, f64::from;
    bf16 => Bf16, Float, f64::from;
    i8 => I8, Exact, i128::from;
    u8 => U8, Exact, i128::from;
    i16 => I16, Exact, i128::from;
    u16 => U16, Exact, i128::from;
    i32 => I32, Exact, i128::from;
    u32 => U32, Exact, i128::from;
    i64 => I64, Exact, i128::from;
    u64 => U64, Exact, i128::from;
    bool => Bool, Exact, i128::from;
}

/// The arguments of one call: each parameter's values and shape.
pub struct Args {
    pub data: Vec<Data>,
    pub shapes: Vec<Vec<usize>>,
    /// For each parameter declared with its dims in another order: the sizes of its dims in
    /// the signature's order and, for each, its place in the declared order.
    pub permuted: Vec<Option<(Vec<usize>, Vec<usize>)>>,
}

impl Args {
    /// Parameter `i` as a buffer on `dev`.
    pub fn tensor<T: Elem>(&self, dev: &Device, i: usize) -> Result<Buffer<T>, Error> {
        dev.upload(T::slice(&self.data[i]))?
            .reshape(&self.shapes[i])
    }

    /// Scalar parameter `i`.
    pub fn scalar<T: Elem>(&self, i: usize) -> T {
        T::slice(&self.data[i])[0]
    }

    /// Every parameter as the oracle's values, each tensor's in the signature's order of dims.
    pub fn oracle_inputs(&self) -> Vec<Vec<V>> {
        self.data
            .iter()
            .zip(&self.permuted)
            .map(|(d, permuted)| {
                let values = data_values(d);
                match permuted {
                    Some((sizes, places)) => in_signature_order(&values, sizes, places),
                    None => values,
                }
            })
            .collect()
    }
}

/// `values`, row-major in a declared order of dims, row-major in the signature's: `sizes` are
/// the dims' sizes in the signature's order, `places[i]` where its dim `i` stands in the
/// declared order.
fn in_signature_order(values: &[V], sizes: &[usize], places: &[usize]) -> Vec<V> {
    // Each dim's stride in the declared layout: the product of the sizes placed after it.
    let strides: Vec<usize> = places
        .iter()
        .map(|&at| {
            let after = places.iter().zip(sizes).filter(|&(&p, _)| p > at);
            after.map(|(_, &size)| size).product()
        })
        .collect();
    (0..values.len())
        .map(|e| {
            let mut rest = e;
            let mut at = 0;
            for i in (0..sizes.len()).rev() {
                at += rest % sizes[i] * strides[i];
                rest /= sizes[i];
            }
            values[at]
        })
        .collect()
}

fn data_values(d: &Data) -> Vec<V> {
    let vals = match d {
        Data::F32(v) => f32::values(v.clone()),
        Data::F64(v) => f64::values(v.clone()),
        Data::F16(v) => f16::values(v.clone()),
        Data::Bf16(v) => bf16::values(v.clone()),
        Data::I8(v) => i8::values(v.clone()),
        Data::U8(v) => u8::values(v.clone()),
        Data::I16(v) => i16::values(v.clone()),
        Data::U16(v) => u16::values(v.clone()),
        Data::I32(v) => i32::values(v.clone()),
        Data::U32(v) => u32::values(v.clone()),
        Data::I64(v) => i64::values(v.clone()),
        Data::U64(v) => u64::values(v.clone()),
        Data::Bool(v) => bool::values(v.clone()),
    };
    match vals {
        Vals::Float(v) => v.into_iter().map(V::float).collect(),
        Vals::Exact(v) => v.into_iter().map(V::int).collect(),
    }
}

/// An output's values: floats (as f64, exactly) or integers and `bool` (as i128).
#[derive(Clone, Debug, PartialEq)]
pub enum Vals {
    Float(Vec<f64>),
    Exact(Vec<i128>),
}

/// One output read back from a device.
pub struct Out {
    pub shape: Vec<usize>,
    pub vals: Vals,
}

impl Out {
    pub fn of<T: Elem>(b: &Buffer<T>) -> Result<Out, Error> {
        Ok(Out {
            shape: b.shape().to_vec(),
            vals: T::values(b.to_vec()?),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Derivatives.

/// A float element type the derivative glue draws tangents and cotangents of.
pub trait Float: Elem {
    fn from_f64(v: f64) -> Self;
}

impl Float for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Float for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl Float for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Float for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// A buffer of `shape` on `dev` of values in [-1, 1), drawn from `stream` (a tangent or a
/// cotangent: the same for a program on every device).
pub fn draw<T: Float>(dev: &Device, shape: &[usize], stream: u64) -> Result<Buffer<T>, Error> {
    let mut rng = Rng(0xd1ff_0000_0000_0000 ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let n: usize = shape.iter().product();
    let v: Vec<T> = (0..n)
        .map(|_| T::from_f64(rng.below(1 << 20) as f64 / f64::from(1 << 19) - 1.0))
        .collect();
    dev.upload(&v)?.reshape(shape)
}

/// `a + b` elementwise, rounded once to `T`: the sum of two tangents (or cotangents) that
/// `Adjoint::left` and `right` run the derivatives on beside each.
pub fn add<T: Float>(dev: &Device, a: &Buffer<T>, b: &Buffer<T>) -> Result<Buffer<T>, Error> {
    let (x, y) = (floats(a)?, floats(b)?);
    let v: Vec<T> = x.iter().zip(&y).map(|(x, y)| T::from_f64(x + y)).collect();
    dev.upload(&v)?.reshape(a.shape())
}

/// `<J v, u>` (`left`, the tangent outputs against the cotangents) and `<v, J^T u>` (`right`,
/// the tangents against the gradients), each with the sum of its terms' magnitudes: the two
/// are equal but for rounding, which is small against those sums, or where the derivative's own
/// terms cancel (p17306's `s - mean(s, d)`: one mode 0, the other 1.7e-8), against the sizes of
/// the cotangents and the tangents (`u_sq`, `v_sq`, their sums of squares), or against what
/// the derivatives' linearity shows of their rounding (`left_noise`, `right_noise`).
#[derive(Default, Debug)]
pub struct Adjoint {
    pub left: f64,
    pub right: f64,
    pub left_abs: f64,
    pub right_abs: f64,
    pub u_sq: f64,
    pub v_sq: f64,
    /// `<jvp(v + w) - jvp(v) - jvp(w), u>`: zero but for rounding, which is of the size of the
    /// derivative's own terms, not its result's. Where those cancel (p18665: `d/ds` of `c / s *
    /// (t + s * x)`, two terms of 260,172 leaving 0.3), both modes round them, each its own
    /// way, and their difference is of this size.
    pub left_noise: f64,
    /// `<v, vjp(u + u') - vjp(u) - vjp(u')>`, the same of reverse mode.
    pub right_noise: f64,
    /// Whether a 16-bit float took part (its rounding is `2^-8`, not `2^-24`).
    pub narrow: bool,
}

fn floats<T: Elem>(b: &Buffer<T>) -> Result<Vec<f64>, Error> {
    Ok(match T::values(b.to_vec()?) {
        Vals::Float(v) => v,
        Vals::Exact(v) => v.into_iter().map(|x| x as f64).collect(),
    })
}

fn narrow<T>() -> bool {
    std::mem::size_of::<T>() == 2
}

impl Adjoint {
    fn dot<A: Elem, B: Elem>(a: &Buffer<A>, b: &Buffer<B>) -> Result<(f64, f64), Error> {
        let (a, b) = (floats(a)?, floats(b)?);
        let sum = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        let abs = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
        Ok((sum, abs))
    }

    /// Adds `<t, u>` of a tangent output at `v` (`t[0]`) and its cotangent, and `<jvp(v + w) -
    /// jvp(v) - jvp(w), u>` to `left_noise` (`t`: the output at `v`, `w` and `v + w`).
    pub fn left<A: Elem, B: Elem>(
        &mut self,
        t: [&Buffer<A>; 3],
        u: &Buffer<B>,
    ) -> Result<(), Error> {
        let (sum, abs) = Self::dot(t[0], u)?;
        let (w, vw) = (Self::dot(t[1], u)?.0, Self::dot(t[2], u)?.0);
        (self.left, self.left_abs) = (self.left + sum, self.left_abs + abs);
        self.left_noise += vw - sum - w;
        self.u_sq += floats(u)?.iter().map(|x| x * x).sum::<f64>();
        self.narrow |= narrow::<A>() || narrow::<B>();
        Ok(())
    }

    /// Adds `<v, g>` of a tangent and its parameter's gradient at `u` (`g[0]`), and `<v,
    /// vjp(u + u') - vjp(u) - vjp(u')>` to `right_noise` (`g`: the gradient at `u`, `u'` and
    /// `u + u'`).
    pub fn right<A: Elem, B: Elem>(
        &mut self,
        v: &Buffer<A>,
        g: [&Buffer<B>; 3],
    ) -> Result<(), Error> {
        let (sum, abs) = Self::dot(v, g[0])?;
        let (uu, us) = (Self::dot(v, g[1])?.0, Self::dot(v, g[2])?.0);
        (self.right, self.right_abs) = (self.right + sum, self.right_abs + abs);
        self.right_noise += us - sum - uu;
        self.v_sq += floats(v)?.iter().map(|x| x * x).sum::<f64>();
        self.narrow |= narrow::<A>() || narrow::<B>();
        Ok(())
    }

    /// Whether every term was finite, so that the two sides can be compared.
    pub fn finite(&self) -> bool {
        [
            self.left,
            self.right,
            self.left_abs,
            self.right_abs,
            self.left_noise,
            self.right_noise,
        ]
        .iter()
        .all(|v| v.is_finite())
    }

    /// Whether the two sides agree: within `2^-6` (16-bit values) or `1e-4` (f32 and f64) of
    /// the larger sum of magnitudes, rounding in each term and each sum; or within 16 f32
    /// roundings of `|u| |v|`, what terms of the size of the Jacobian's entries leave where they
    /// cancel (`|<v, J^T u>| <= |v| |J| |u|`); or, with 32- and 64-bit values, within eight
    /// times what linearity shows of the rounding (`left_noise`, `right_noise`), where the
    /// derivative's terms are larger than its entries. A wrong derivative is off by its terms'
    /// size, not their rounding. (A 16-bit sum `v + w` is itself rounded, by `2^-8`: there the
    /// noise would measure that, not the derivative.)
    pub fn agrees(&self) -> bool {
        let rel = if self.narrow { 2f64.powi(-6) } else { 1e-4 };
        let scale = self.left_abs.max(self.right_abs);
        let cancelled = 2f64.powi(-20) * (self.u_sq * self.v_sq).sqrt();
        let noise = match self.narrow {
            true => 0.0,
            false => 8.0 * (self.left_noise.abs() + self.right_noise.abs()),
        };
        (self.left - self.right).abs() <= (rel * scale).max(cancelled).max(noise) + 1e-30
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs.

/// Sizes a dim takes: 1, primes, sizes that are not multiples of 4 or 8, powers of two, and
/// rows longer than the on-chip paths (4096 elements) for reduced dims.
const SMALL: [usize; 14] = [1, 1, 2, 3, 5, 7, 8, 13, 17, 31, 32, 33, 61, 64];
const MEDIUM: [usize; 6] = [97, 127, 128, 255, 257, 1021];
const LONG: [usize; 6] = [1000, 2048, 4096, 4097, 5003, 8191];
/// Rows for the GPU's cluster and streamed paths, where the budget allows.
const HUGE: [usize; 4] = [16411, 70001, 262147, 1_000_003];

/// Dim sizes for one run of `desc`, with at most `budget` elements in the domain.
pub fn sizes(desc: &Desc, rng: &mut Rng, budget: usize) -> Vec<usize> {
    sizes_with(desc, rng, budget, None)
}

/// [`sizes`], with dim `fixed.0` of size `fixed.1` where given (at most `budget`): the GPU run
/// picks each instance's row length, and so the entry point it takes (`crate::paths`).
pub fn sizes_with(
    desc: &Desc,
    rng: &mut Rng,
    budget: usize,
    fixed: Option<(usize, usize)>,
) -> Vec<usize> {
    assert!(
        fixed.is_none_or(|(_, len)| len <= budget),
        "{fixed:?} is over {budget}"
    );
    let reduced: Vec<usize> = desc.reduced_dims();
    loop {
        let mut s: Vec<usize> = (0..desc.ndims)
            .map(|k| {
                let long = reduced.contains(&k) || desc.ndims == 1;
                match rng.below(20) {
                    0 => 0,
                    1 if long && budget >= 1 << 20 => rng.pick(&HUGE),
                    1..=3 if long => rng.pick(&LONG),
                    4..=7 => rng.pick(&MEDIUM),
                    _ => rng.pick(&SMALL),
                }
            })
            .collect();
        if let Some((dim, len)) = fixed {
            s[dim] = len;
        }
        // A zero dim now and then; otherwise keep within the budget. The budget counts a zero
        // dim as 1: the oracle evaluates every value in full, and a value without the zero dim
        // is not empty (`[61, 0, 2^21]` took its `[d0, d2]` values, 128 M elements, 50 s).
        let within = s.iter().map(|&n| n.max(1)).product::<usize>() <= budget;
        if within && (!s.contains(&0) || rng.percent(30)) {
            // Then the extra dims of the `&mut` parameters, drawn after the domain's so that a
            // program without them draws what it drew before they were generated.
            for e in &desc.extra {
                let n = match *e {
                    Extra::Slots(p) => slots(desc, p, &s, rng),
                    Extra::Rest => rng.pick(&[0, 1, 2, 3, 5, 8, 13]),
                };
                s.push(n);
            }
            return s;
        }
    }
}

/// The rows of a scatter's buffer, indexed by parameter `p`: about as many as the index has
/// elements at each place of the dims it shares with the buffer (fewer, so that some distinct
/// values cannot all fit and fall outside, or more, so that some rows keep their values), no
/// more than the index's type can count past (it holds `rows` and `rows + 1`, outside).
fn slots(desc: &Desc, p: usize, sizes: &[usize], rng: &mut Rng) -> usize {
    let (ty, shape) = desc.params[p];
    let n = shape.map_or(1, |s| count(s & !desc.shared_dims(p), sizes));
    let m = match rng.below(8) {
        0 => rng.below(3),
        1 => n / 2,
        2 | 3 => n,
        4 | 5 => n + 1 + rng.below(5),
        _ => 2 * n + rng.below(3),
    };
    let (_, hi) = crate::ops::int_range(ty);
    m.min(usize::try_from(hi - 1).unwrap_or(usize::MAX))
}

/// The dim sizes [`sizes`] draws from, for a run that picks lengths itself.
pub fn size_choices() -> impl Iterator<Item = usize> {
    [&SMALL[..], &MEDIUM, &LONG, &HUGE]
        .into_iter()
        .flatten()
        .copied()
}

/// Random arguments for `desc` at `sizes`. `special` mixes in NaN, infinities, signed zeros,
/// the extremes of integers.
pub fn args(desc: &Desc, sizes: &[usize], rng: &mut Rng, special: bool) -> Args {
    let mut data = vec![];
    let mut shapes = vec![];
    let mut permuted = vec![];
    for (p, &(ty, shape)) in desc.params.iter().enumerate() {
        let (n, dims) = match (&desc.buffers[p], shape) {
            (Some(axes), _) => {
                let dims: Vec<usize> = axes.iter().map(|a| a.len(sizes)).collect();
                (dims.iter().product(), dims)
            }
            (None, None) => (1, vec![]),
            (None, Some(s)) => (
                count(s, sizes),
                (0..sizes.len())
                    .filter(|k| s & (1 << k) != 0)
                    .map(|k| sizes[k])
                    .collect(),
            ),
        };
        // A `&mut` parameter's first contents are values as any input's: an element that the
        // kernel stores, or should leave alone and does not, shows.
        data.push(match desc.index_of[p] {
            Some(k) if desc.distinct[p] => {
                // One set of rows at each place of the dims the index shares with the buffer.
                let index = shape.unwrap_or(0);
                let groups = oracle::gather(index, desc.shared_dims(p), sizes);
                to_data(ty, distinct_indices(ty, &groups, sizes[k], rng))
            }
            Some(k) => indices(ty, n, sizes[k], rng),
            None => values(ty, n, rng, special),
        });
        // Declared in another order: the buffer's shape is in that order.
        match &desc.orders[p] {
            Some(order) => {
                let ks: Vec<usize> = (0..sizes.len())
                    .filter(|k| shape.unwrap_or(0) & (1 << k) != 0)
                    .collect();
                let places: Vec<usize> = ks
                    .iter()
                    .map(|k| {
                        order
                            .iter()
                            .position(|o| o == k)
                            .expect("a dim of the tensor")
                    })
                    .collect();
                shapes.push(order.iter().map(|&k| sizes[k]).collect());
                permuted.push(Some((dims, places)));
            }
            None => {
                shapes.push(dims);
                permuted.push(None);
            }
        }
    }
    Args {
        data,
        shapes,
        permuted,
    }
}

/// The indices of a scatter into `len` rows, one an element of `group` (its group: the place
/// it goes to along the dims the index shares with the buffer): about one in eight outside
/// (below 0, which wraps in an unsigned type, or at `len` and past), the others rows that no
/// other element of the group takes, in a random order, and outside too once the group has
/// taken every row (two elements stored in one place leave either on a GPU).
fn distinct_indices(ty: Ty, group: &[usize], len: usize, rng: &mut Rng) -> Vec<i128> {
    let mut free: Vec<Option<Vec<usize>>> = vec![None; group.iter().max().map_or(0, |g| g + 1)];
    group
        .iter()
        .map(|&g| {
            let free = free[g].get_or_insert_with(|| (0..len).collect());
            match rng.below(8) {
                0 => -1 - rng.below(2) as i128,
                1 => (len + rng.below(2)) as i128,
                _ if free.is_empty() => match rng.percent(50) {
                    true => -1,
                    false => len as i128,
                },
                _ => free.swap_remove(rng.below(free.len())) as i128,
            }
        })
        .map(|v| crate::ops::wrap(v, ty))
        .collect()
}

/// `n` indices of a gather along a dim of `len`: mostly inside it, about one in eight outside
/// (below 0, which wraps in an unsigned type, or at `len` and past), as `ty`.
fn indices(ty: Ty, n: usize, len: usize, rng: &mut Rng) -> Data {
    let v: Vec<i128> = (0..n)
        .map(|_| match rng.below(8) {
            0 => -1 - rng.below(2) as i128,
            1 => (len + rng.below(2)) as i128,
            _ => rng.below(len.max(1)) as i128,
        })
        .map(|v| crate::ops::wrap(v, ty))
        .collect();
    to_data(ty, v)
}

/// Integers as the values of a parameter of `ty`.
fn to_data(ty: Ty, v: Vec<i128>) -> Data {
    match ty {
        Ty::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
        Ty::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        Ty::I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
        Ty::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        Ty::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        Ty::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
        Ty::I64 => Data::I64(v.iter().map(|&x| x as i64).collect()),
        Ty::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
        other => unreachable!("an index is an integer, not {}", other.name()),
    }
}

fn float(rng: &mut Rng, special: bool) -> f64 {
    let u = |rng: &mut Rng| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    match rng.below(20) {
        0 if special => rng.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0, 1e30]),
        1 => (rng.below(9) as f64) - 4.0,
        2 => (u(rng) * 40.0 - 20.0).exp2() * if rng.percent(50) { -1.0 } else { 1.0 },
        _ => u(rng) * 6.0 - 3.0,
    }
}

fn int(rng: &mut Rng, ty: Ty, special: bool) -> i128 {
    let (lo, hi) = crate::ops::int_range(ty);
    let v = match rng.below(12) {
        0 if special => lo,
        1 if special => hi,
        2 => rng.next_u64() as i128,
        3 => (rng.next_u64() % 1000) as i128,
        _ => rng.below(17) as i128 - 8,
    };
    crate::ops::wrap(v, ty)
}

fn values(ty: Ty, n: usize, rng: &mut Rng, special: bool) -> Data {
    macro_rules! floats {
        ($conv:expr) => {
            (0..n).map(|_| $conv(float(rng, special))).collect()
        };
    }
    macro_rules! ints {
        ($t:ty) => {
            (0..n).map(|_| int(rng, ty, special) as $t).collect()
        };
    }
    match ty {
        Ty::F32 => Data::F32(floats!(|x| x as f32)),
        Ty::F64 => Data::F64(floats!(|x| x)),
        Ty::F16 => Data::F16(floats!(f16::from_f64)),
        Ty::Bf16 => Data::Bf16(floats!(bf16::from_f64)),
        Ty::I8 => Data::I8(ints!(i8)),
        Ty::U8 => Data::U8(ints!(u8)),
        Ty::I16 => Data::I16(ints!(i16)),
        Ty::U16 => Data::U16(ints!(u16)),
        Ty::I32 => Data::I32(ints!(i32)),
        Ty::U32 => Data::U32(ints!(u32)),
        Ty::I64 => Data::I64(ints!(i64)),
        Ty::U64 => Data::U64(ints!(u64)),
        Ty::Bool => Data::Bool((0..n).map(|_| rng.percent(50)).collect()),
    }
}

// ---------------------------------------------------------------------------------------------
// Comparisons.

/// The largest distance allowed between a stored output of `ty` and the oracle's `want`, or
/// `None` where the oracle does not know the value.
pub fn tolerance(want: V, ty: Ty) -> Option<f64> {
    if !want.known() {
        return None;
    }
    Some(2.0 * want.err + oracle_round(ty, want))
}

fn oracle_round(ty: Ty, want: V) -> f64 {
    crate::ops::ulp(ty, want.f.abs() + want.err) + crate::ops::tiny(ty)
}

/// The stored value of `want` for an output of `ty`: infinite past the type's range, or
/// `None` where the error could take it either way.
fn stored(want: V, ty: Ty) -> Option<f64> {
    let t = crate::ops::store_overflow(ty);
    if !want.f.is_finite() || want.f.abs() + want.err < t {
        Some(want.f)
    } else if want.f.abs() - want.err >= t {
        Some(f64::INFINITY.copysign(want.f))
    } else {
        None
    }
}

/// Whether `got` is within `tol` of `want`; NaN matches NaN, infinities only themselves.
pub fn close(got: f64, want: f64, tol: f64) -> bool {
    got == want
        || (got.is_nan() && want.is_nan())
        || (got.is_finite() && want.is_finite() && (got - want).abs() <= tol)
}

/// What one comparison checked: elements the oracle knows (and so checked) and all, of the
/// outputs and of the `&mut` parameters' contents.
#[derive(Clone, Copy, Default, Debug)]
pub struct Counts {
    pub checked: usize,
    pub total: usize,
    /// Of those, the elements of `&mut` parameters.
    pub buffer_checked: usize,
    pub buffer_total: usize,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.checked += o.checked;
        self.total += o.total;
        self.buffer_checked += o.buffer_checked;
        self.buffer_total += o.buffer_total;
    }
}

/// The name of result `j` of a call: an output, or a `&mut` parameter's contents.
fn result_name(desc: &Desc, j: usize) -> String {
    match j.checked_sub(desc.outs.len()) {
        None => format!("output {j}"),
        Some(b) => {
            let p = (0..desc.params.len())
                .filter(|&p| desc.buffers[p].is_some())
                .nth(b)
                .expect("a result for each buffer");
            format!("&mut parameter {p}")
        }
    }
}

/// Checks the results of one call (its outputs, then the contents of its `&mut` parameters,
/// every element of them) against the oracle's: what it checked, or the first mismatch,
/// described.
pub fn against_oracle(
    desc: &Desc,
    got: &[Out],
    want: &[Vec<V>],
    sizes: &[usize],
) -> Result<Counts, String> {
    let mut n = Counts::default();
    let results = desc.results(sizes);
    if got.len() != results.len() || want.len() != results.len() {
        return Err(format!(
            "{} results, oracle {}, want {}",
            got.len(),
            want.len(),
            results.len()
        ));
    }
    for (j, ((g, w), (ty, want_shape))) in got.iter().zip(want).zip(results).enumerate() {
        let what = result_name(desc, j);
        if g.shape != want_shape {
            return Err(format!("{what}: shape {:?}, want {want_shape:?}", g.shape));
        }
        if w_len(&g.vals) != w.len() {
            return Err(format!(
                "{what}: {} elements, oracle {}",
                w_len(&g.vals),
                w.len()
            ));
        }
        let buffer = j >= desc.outs.len();
        for (i, w) in w.iter().enumerate() {
            let ok = match &g.vals {
                Vals::Exact(v) => !w.known() || v[i] == w.i,
                Vals::Float(v) => match (tolerance(*w, ty), stored(*w, ty)) {
                    (Some(tol), Some(s)) => close(v[i], s, tol),
                    _ => true,
                },
            };
            n.checked += w.known() as usize;
            n.total += 1;
            if buffer {
                n.buffer_checked += w.known() as usize;
                n.buffer_total += 1;
            }
            if !ok {
                let got = match &g.vals {
                    Vals::Exact(v) => format!("{}", v[i]),
                    Vals::Float(v) => format!("{:e}", v[i]),
                };
                return Err(format!(
                    "{what} ({}), element {i} of {}: got {got}, oracle {:e} / {} ± {:e}",
                    ty.name(),
                    w_len(&g.vals),
                    w.f,
                    w.i,
                    w.err
                ));
            }
        }
    }
    Ok(n)
}

fn w_len(v: &Vals) -> usize {
    match v {
        Vals::Float(v) => v.len(),
        Vals::Exact(v) => v.len(),
    }
}

/// Checks a GPU run against the CPU run of the same call: integers and `bool` bit for bit where
/// the oracle knows them, floats within twice the oracle's tolerance (both are within one of it).
pub fn gpu_against_cpu(
    desc: &Desc,
    gpu: &[Out],
    cpu: &[Out],
    want: &[Vec<V>],
    sizes: &[usize],
) -> Result<(), String> {
    let results = desc.results(sizes);
    if gpu.len() != results.len() || cpu.len() != results.len() {
        return Err(format!(
            "GPU {} results, CPU {}, want {}",
            gpu.len(),
            cpu.len(),
            results.len()
        ));
    }
    for (j, (((g, c), w), (ty, _))) in gpu.iter().zip(cpu).zip(want).zip(results).enumerate() {
        let what = result_name(desc, j);
        if g.shape != c.shape {
            return Err(format!(
                "{what}: GPU shape {:?}, CPU {:?}",
                g.shape, c.shape
            ));
        }
        for (i, w) in w.iter().enumerate() {
            let (ok, gv, cv) = match (&g.vals, &c.vals) {
                (Vals::Exact(g), Vals::Exact(c)) => {
                    (!w.known() || g[i] == c[i], g[i] as f64, c[i] as f64)
                }
                // Where the oracle's error reaches past the type's range, one device may
                // round to the largest finite value and the other to infinity (p3238: a
                // quotient of logarithms near f16's 65504): both are right, as against the
                // oracle.
                (Vals::Float(g), Vals::Float(c)) => match (tolerance(*w, ty), stored(*w, ty)) {
                    (Some(tol), Some(_)) => (close(g[i], c[i], 2.0 * tol), g[i], c[i]),
                    _ => (true, g[i], c[i]),
                },
                _ => unreachable!("both devices return the same types"),
            };
            if !ok {
                return Err(format!(
                    "{what} ({}), element {i}: GPU {gv:e}, CPU {cv:e}, oracle {:e} ± {:e}",
                    ty.name(),
                    w.f,
                    w.err
                ));
            }
        }
    }
    Ok(())
}

/// Runs the oracle on `args`.
pub fn oracle(desc: &Desc, sizes: &[usize], args: &Args) -> Vec<Vec<V>> {
    oracle::run(desc, sizes, &args.oracle_inputs())
}

/// Runs the oracle on `args`, and says what its writes did.
pub fn oracle_with_stats(desc: &Desc, sizes: &[usize], args: &Args) -> (Vec<Vec<V>>, WriteStats) {
    oracle::run_with_stats(desc, sizes, &args.oracle_inputs())
}
