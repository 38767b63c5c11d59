//! The interface generated code calls (`::fuse_runtime::__private`); see `doc/PRIVATE_API.md`.
//!
//! Nothing here is meant for hand-written code, and it may change with the macro.

use std::fmt;
use std::ops::Deref;

use crate::buffer::Buffer;
use crate::device::Device;
use crate::element::Element;
use crate::error::Error;
use crate::inline::Inline;
use crate::tensor::{AnyBuffer, Input, Output};

/// One axis of a tensor in a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DimRef {
    /// A named dim: an index into [`Signature::dims`].
    Named(usize),
    /// A literal size.
    Fixed(usize),
    /// A dim made of parts, `2 * h + p` (or `d * 2`, the same size): the sum of each count
    /// times its dim's size. It binds the one named dim in it that no other axis binds.
    Sum(&'static [(usize, DimRef)]),
    /// The 32-bit words that hold one bit for each element of a tensor of these axes (a
    /// predicate the training pair saves): their product divided by 32, rounded up. It binds
    /// nothing.
    Words(&'static [DimRef]),
    /// Dims a reduction takes together (`mean(x, (c, s))`), as one: the product of their sizes.
    /// Only in a program's work and divisors, never in a signature (which has the parts).
    Product(&'static [DimRef]),
}

impl DimRef {
    /// The size of the dim when the named dims have the sizes `dims` (0 where one is missing).
    pub fn size(&self, dims: &[usize]) -> usize {
        match *self {
            DimRef::Named(i) => dims.get(i).copied().unwrap_or(0),
            DimRef::Fixed(n) => n,
            DimRef::Sum(terms) => terms.iter().fold(0usize, |a, (count, d)| {
                a.saturating_add(count.saturating_mul(d.size(dims)))
            }),
            DimRef::Words(axes) => axes
                .iter()
                .fold(1usize, |a, d| a.saturating_mul(d.size(dims)))
                .div_ceil(32),
            DimRef::Product(axes) => axes
                .iter()
                .fold(1usize, |a, d| a.saturating_mul(d.size(dims))),
        }
    }
}

/// One tensor parameter (input or output) of a kernel.
#[derive(Debug, Clone, Copy)]
pub struct TensorSig {
    /// The parameter's name.
    pub name: &'static str,
    /// Its axes, outermost first.
    pub dims: &'static [DimRef],
    /// Whether the kernel writes it (outputs come after inputs).
    pub output: bool,
}

/// The tensor parameters of a kernel and the named dims they share.
#[derive(Debug, Clone, Copy)]
pub struct Signature {
    /// The kernel's Rust name.
    pub kernel: &'static str,
    /// The named dims, such as `["rows", "cols"]`.
    pub dims: &'static [&'static str],
    /// Inputs, then outputs.
    pub tensors: &'static [TensorSig],
}

/// Checks that every tensor (inputs then outputs, in [`Signature::tensors`] order) is on `dev`
/// and has the declared rank, and binds each named dim from the first tensor that has it;
/// later tensors must agree. Returns the size of each named dim, in [`Signature::dims`] order.
/// `tensors` may also hold the inputs alone, to bind the dims before the outputs are allocated.
pub fn bind(sig: &Signature, dev: &Device, tensors: &[&dyn AnyBuffer]) -> Result<Sizes, Error> {
    let mut some = Inline::<Option<&dyn AnyBuffer>, SIZES>::new(None, tensors.len());
    for (s, &t) in some.as_mut_slice().iter_mut().zip(tensors) {
        *s = Some(t);
    }
    let sizes = bind_present(sig, dev, some.as_slice())?;
    if tensors.len() == sig.tensors.len() {
        check_overlaps(sig, tensors)?;
    }
    Ok(sizes)
}

/// [`bind`] before the returned outputs are allocated, of a kernel that also writes through
/// `&mut` parameters: the inputs, then the `&mut` parameters (the last tensors of `sig`).
pub fn bind_written(
    sig: &Signature,
    dev: &Device,
    inputs: &[&dyn AnyBuffer],
    written: &[&dyn AnyBuffer],
) -> Result<Sizes, Error> {
    let returned = sig
        .tensors
        .len()
        .saturating_sub(inputs.len() + written.len());
    let present = inputs
        .iter()
        .map(|&t| Some(t))
        .chain((0..returned).map(|_| None))
        .chain(written.iter().map(|&t| Some(t)));
    let mut some = Inline::<Option<&dyn AnyBuffer>, SIZES>::new(None, sig.tensors.len());
    for (s, t) in some.as_mut_slice().iter_mut().zip(present) {
        *s = t;
    }
    bind_present(sig, dev, some.as_slice())
}

/// [`bind`] of the tensors that are present (`Some`), without the overlap check.
fn bind_present(
    sig: &Signature,
    dev: &Device,
    tensors: &[Option<&dyn AnyBuffer>],
) -> Result<Sizes, Error> {
    let inputs = sig.tensors.iter().filter(|t| !t.output).count();
    if tensors.len() != sig.tensors.len() && tensors.len() != inputs {
        return Err(Error::Internal {
            detail: format!(
                "kernel `{}` takes {} tensors, but bind was given {}",
                sig.kernel,
                sig.tensors.len(),
                tensors.len()
            ),
        });
    }
    let mut bound = Inline::<Option<(usize, &'static str)>, SIZES>::new(None, sig.dims.len());
    let bound = bound.as_mut_slice();
    // Inputs first, then outputs, so that a size always comes from an input when one has it.
    // Dims made of parts (`2 * d`) after the plain ones, since they may bind a dim from them.
    for want_output in [false, true] {
        for (param, &tensor) in sig.tensors.iter().zip(tensors) {
            if let (true, Some(tensor)) = (param.output == want_output, tensor) {
                check_tensor(sig, param, tensor, dev, bound)?;
            }
        }
        for (param, &tensor) in sig.tensors.iter().zip(tensors) {
            if let (true, Some(tensor)) = (param.output == want_output, tensor) {
                check_sums(sig, param, tensor, bound)?;
            }
        }
    }
    let mut sizes = Inline::new(0, sig.dims.len());
    for ((size, bound), name) in sizes.as_mut_slice().iter_mut().zip(&*bound).zip(sig.dims) {
        *size = bound.map(|(n, _)| n).ok_or_else(|| Error::Internal {
            detail: format!("kernel `{}`: no tensor has the dim `{name}`", sig.kernel),
        })?;
    }
    Ok(Sizes(sizes))
}

/// Checks that no output shares memory with an input or another output: the kernels read their
/// inputs through non-aliasing pointers (and the CPU backend would read a copy), so such a call
/// would be undefined on a GPU. Reported as [`Error::Alias`], naming both parameters.
fn check_overlaps(sig: &Signature, tensors: &[&dyn AnyBuffer]) -> Result<(), Error> {
    for (j, (out, out_tensor)) in sig.tensors.iter().zip(tensors).enumerate() {
        if !out.output {
            continue;
        }
        let Some((base, range)) = out_tensor.span() else {
            continue;
        };
        for (i, (other, other_tensor)) in sig.tensors.iter().zip(tensors).enumerate() {
            if i == j || (other.output && i > j) {
                continue;
            }
            let overlaps = other_tensor
                .span()
                .is_some_and(|(b, r)| b == base && r.start < range.end && range.start < r.end);
            if overlaps {
                return Err(Error::Alias {
                    kernel: sig.kernel.to_string(),
                    output: out.name.to_string(),
                    other: other.name.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Checks one tensor's device, rank and sizes, binding the named dims it is first to have.
fn check_tensor(
    sig: &Signature,
    param: &TensorSig,
    tensor: &dyn AnyBuffer,
    dev: &Device,
    bound: &mut [Option<(usize, &'static str)>],
) -> Result<(), Error> {
    if tensor.device() != dev {
        return Err(Error::DeviceMismatch {
            kernel: sig.kernel.to_string(),
            param: param.name.to_string(),
            expected: dev.name(),
            found: tensor.device().name(),
        });
    }
    let shape = tensor.shape();
    if shape.len() != param.dims.len() {
        return Err(Error::Rank {
            kernel: sig.kernel.to_string(),
            param: param.name.to_string(),
            expected: param.dims.len(),
            found: shape.len(),
        });
    }
    for (axis, (&dim, &found)) in param.dims.iter().zip(shape).enumerate() {
        check_axis(sig, param, axis, dim, found, bound)?;
    }
    Ok(())
}

/// Checks the axes of one tensor that are made of parts (`2 * h + p`): with one of their named
/// dims not yet bound, binds it to what the axis's size leaves for it, which must divide evenly.
fn check_sums(
    sig: &Signature,
    param: &TensorSig,
    tensor: &dyn AnyBuffer,
    bound: &mut [Option<(usize, &'static str)>],
) -> Result<(), Error> {
    for (axis, (&dim, &found)) in param.dims.iter().zip(tensor.shape()).enumerate() {
        if let DimRef::Words(axes) = dim {
            check_words(sig, param, axis, axes, found, bound)?;
            continue;
        }
        let DimRef::Sum(terms) = dim else { continue };
        let text = sum_text(sig, terms);
        let mut known = 0usize;
        let mut free = None;
        for &(count, d) in terms {
            match d {
                DimRef::Named(i) if bound.get(i).is_some_and(|b| b.is_none()) => {
                    free = Some((count, i))
                }
                DimRef::Named(i) => {
                    let size = bound.get(i).copied().flatten().map_or(0, |(n, _)| n);
                    known = known.saturating_add(count.saturating_mul(size));
                }
                DimRef::Fixed(n) => known = known.saturating_add(count.saturating_mul(n)),
                DimRef::Sum(_) | DimRef::Words(_) | DimRef::Product(_) => {}
            }
        }
        let mismatch = |expected| Error::Shape {
            kernel: sig.kernel.to_string(),
            param: param.name.to_string(),
            dim: format!("axis {axis} (`{text}`)"),
            expected,
            found,
            bound_by: None,
        };
        match free {
            None if known == found => {}
            None => return Err(mismatch(known)),
            Some((count, i)) => {
                let rest = found.checked_sub(known).ok_or_else(|| mismatch(known))?;
                if rest % count.max(1) != 0 {
                    return Err(mismatch(found - rest % count.max(1)));
                }
                bound[i] = Some((rest / count.max(1), param.name));
            }
        }
    }
    Ok(())
}

/// Checks an axis of packed bits ([`DimRef::Words`]) once the dims of its tensor's axes are
/// bound by other tensors: one word for each 32 elements, the last word partly used.
fn check_words(
    sig: &Signature,
    param: &TensorSig,
    axis: usize,
    axes: &'static [DimRef],
    found: usize,
    bound: &[Option<(usize, &'static str)>],
) -> Result<(), Error> {
    let sizes: Vec<usize> = bound.iter().map(|b| b.map_or(0, |(n, _)| n)).collect();
    let expected = DimRef::Words(axes).size(&sizes);
    if expected == found {
        return Ok(());
    }
    let names: Vec<String> = axes
        .iter()
        .map(|&d| match d {
            DimRef::Named(i) => sig.dims.get(i).copied().unwrap_or("?").to_string(),
            DimRef::Fixed(n) => n.to_string(),
            DimRef::Sum(_) | DimRef::Words(_) | DimRef::Product(_) => "?".into(),
        })
        .collect();
    Err(Error::Shape {
        kernel: sig.kernel.to_string(),
        param: param.name.to_string(),
        dim: format!(
            "axis {axis} (the 32-bit words of one bit an element of `[{}]`)",
            names.join(", ")
        ),
        expected,
        found,
        bound_by: None,
    })
}

/// A dim made of parts as the signature writes it, `2 * h + p`.
fn sum_text(sig: &Signature, terms: &[(usize, DimRef)]) -> String {
    let names: Vec<String> = terms
        .iter()
        .map(|&(count, d)| {
            let name = match d {
                DimRef::Named(i) => sig.dims.get(i).copied().unwrap_or("?").to_string(),
                DimRef::Fixed(n) => n.to_string(),
                DimRef::Sum(_) | DimRef::Words(_) | DimRef::Product(_) => "?".into(),
            };
            match count {
                1 => name,
                _ => format!("{count} * {name}"),
            }
        })
        .collect();
    names.join(" + ")
}

fn check_axis(
    sig: &Signature,
    param: &TensorSig,
    axis: usize,
    dim: DimRef,
    found: usize,
    bound: &mut [Option<(usize, &'static str)>],
) -> Result<(), Error> {
    let mismatch = |dim: String, expected, bound_by: Option<&str>| Error::Shape {
        kernel: sig.kernel.to_string(),
        param: param.name.to_string(),
        dim,
        expected,
        found,
        bound_by: bound_by.map(str::to_string),
    };
    match dim {
        DimRef::Fixed(size) if size != found => Err(mismatch(
            format!("axis {axis} (fixed size {size})"),
            size,
            None,
        )),
        DimRef::Fixed(_) | DimRef::Sum(_) | DimRef::Words(_) | DimRef::Product(_) => Ok(()),
        DimRef::Named(index) => {
            let (Some(slot), Some(&name)) = (bound.get_mut(index), sig.dims.get(index)) else {
                return Err(Error::Internal {
                    detail: format!("kernel `{}`: dim index {index} out of range", sig.kernel),
                });
            };
            match *slot {
                None => {
                    *slot = Some((found, param.name));
                    Ok(())
                }
                Some((size, _)) if size == found => Ok(()),
                Some((size, by)) => Err(mismatch(name.to_string(), size, Some(by))),
            }
        }
    }
}

/// The shape of tensor `index` of `sig` when the named dims have the sizes `dims` (as [`bind`]
/// returns them). An index out of range gives an empty shape.
pub fn shape_of(sig: &Signature, index: usize, dims: &[usize]) -> Sizes {
    let Some(tensor) = sig.tensors.get(index) else {
        return Sizes(Inline::new(0, 0));
    };
    let mut shape = Inline::new(0, tensor.dims.len());
    for (size, dim) in shape.as_mut_slice().iter_mut().zip(tensor.dims) {
        *size = dim.size(dims);
    }
    Sizes(shape)
}

/// The sizes [`Sizes`] holds without a heap allocation: more named dims than any kernel of the
/// tests has, and more axes than most tensors.
const SIZES: usize = 8;

/// Sizes, as [`bind`] (of the named dims) and [`shape_of`] (of a tensor's axes) return them:
/// read as a `[usize]`. Up to eight are kept inline, so that a call allocates nothing for them.
pub struct Sizes(Inline<usize, SIZES>);

impl Deref for Sizes {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        self.0.as_slice()
    }
}

impl fmt::Debug for Sizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq for Sizes {
    fn eq(&self, other: &Sizes) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[usize; N]> for Sizes {
    fn eq(&self, other: &[usize; N]) -> bool {
        **self == *other
    }
}

/// Allocates an output of `shape` on `dev`. Its contents are unspecified (zeros on the CPU):
/// the kernel writes every element.
pub fn alloc<T: Element>(dev: &Device, shape: &[usize]) -> Result<Buffer<T>, Error> {
    Buffer::uninit(dev, shape)
}

/// Allocates an output of `shape` on `dev`, filled with zeros: packed bits, which the kernel
/// sets with an atomic or of each word's bits and never clears.
pub fn alloc_zeroed<T: Element>(dev: &Device, shape: &[usize]) -> Result<Buffer<T>, Error> {
    Buffer::zeros(dev, shape)
}

/// A copy of a tensor's elements, in row-major order (for the CPU backend).
pub fn host_read<T: Element>(b: &(impl Input<T> + ?Sized)) -> Result<Vec<T>, Error> {
    b.read()
}

/// Replaces all of a tensor's elements with `data`, which must have as many elements (for the
/// CPU backend; on the CPU a buffer's vector is moved in, not copied).
pub fn host_write<T: Element>(
    b: &mut (impl Output<T> + ?Sized),
    data: Vec<T>,
) -> Result<(), Error> {
    b.write(data)
}

/// The reciprocal an elementwise kernel divides its indices by (`fz_recip_<j>`):
/// `floor((2^64 - 1) / d)`, with which `fz_quot` is exact for every 64-bit dividend. Computed
/// here once per launch rather than by every thread; 0 for `d = 0`, which no launch divides by.
pub fn reciprocal(d: u64) -> u64 {
    u64::MAX.checked_div(d).unwrap_or(0)
}

/// The key of Philox's round `round` (from 0) for `seed`: `k0 + round * W0` in the low word and
/// `k1 + round * W1` in the high word, each wrapping (see [`crate::random`]). A kernel whose
/// seed is a parameter takes rounds 1 to 9 as parameters of their own (`fz_key<j>_<i>`), so
/// that its rounds read them rather than add them again at every draw.
pub fn round_key(seed: u64, round: u32) -> u64 {
    use crate::random::{W0, W1};
    let k0 = (seed as u32).wrapping_add(round.wrapping_mul(W0));
    let k1 = ((seed >> 32) as u32).wrapping_add(round.wrapping_mul(W1));
    u64::from(k1) << 32 | u64::from(k0)
}

/// Whether `dev` is the CPU, so generated code runs its CPU version.
pub fn is_cpu(dev: &Device) -> bool {
    dev.is_cpu()
}

#[cfg(test)]
mod tests;
