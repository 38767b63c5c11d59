//! Memory from outside fuse (cudarc slices, raw device pointers): the checks that a buffer or a
//! view made from it runs, and [`Rejected`], which gives back what could not be taken.

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::device::{Device, Kind};
use crate::element::Element;
use crate::error::Error;
use crate::queue::Queue;

/// A value given back with the [`Error`] that kept it from being taken, so that nothing is lost
/// (a cudarc slice [`Buffer::from_cuda_slice`](crate::Buffer::from_cuda_slice) could not take, or a buffer
/// [`Buffer::into_cuda_slice`](crate::Buffer::into_cuda_slice) could not give up). `?` turns it into the error.
pub struct Rejected<V> {
    /// Why it was not taken.
    pub error: Error,
    /// The value, untouched.
    pub value: V,
}

impl<V> From<Rejected<V>> for Error {
    fn from(rejected: Rejected<V>) -> Error {
        rejected.error
    }
}

impl<V> fmt::Debug for Rejected<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rejected({:?})", self.error)
    }
}

impl<V> fmt::Display for Rejected<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

/// The stream and GPU of `dev`, or an [`Error::Interop`] for the CPU.
pub(crate) fn cuda_device<'d>(dev: &'d Device, op: &'static str) -> Result<&'d Arc<Queue>, Error> {
    match dev.kind() {
        Kind::Cuda(queue) => Ok(queue),
        Kind::Cpu => Err(Error::Interop {
            op,
            param: "dev",
            expected: "a CUDA device".to_string(),
            found: "the CPU".to_string(),
        }),
    }
}

/// Checks that memory of `R`s may be seen as `T`s: `R` is `T` or `T`'s device type.
pub(crate) fn check_type<T: Element, R: 'static>(
    op: &'static str,
    param: &'static str,
) -> Result<(), Error> {
    let (r, t, repr) = (
        TypeId::of::<R>(),
        TypeId::of::<T>(),
        TypeId::of::<T::Repr>(),
    );
    if r == t || r == repr {
        return Ok(());
    }
    Err(Error::Interop {
        op,
        param,
        expected: format!(
            "memory of `{}` (or `{}`)",
            T::NAME,
            std::any::type_name::<T::Repr>()
        ),
        found: format!("memory of `{}`", std::any::type_name::<R>()),
    })
}

/// Checks that memory of `context` is memory of `queue`'s GPU and context.
pub(crate) fn check_context(
    queue: &Queue,
    context: &CudaContext,
    op: &'static str,
    param: &'static str,
) -> Result<(), Error> {
    if context.cu_ctx() == queue.cuda.ctx.cu_ctx() {
        return Ok(());
    }
    let found = match context.ordinal() == queue.cuda.ordinal {
        true => "memory of another context of that GPU".to_string(),
        false => format!("memory of CUDA device {}", context.ordinal()),
    };
    Err(Error::Interop {
        op,
        param,
        expected: format!("memory of {}", queue.cuda.describe()),
        found,
    })
}

/// The elements of `shape`, checked to be `found`, the length of the memory given for it.
pub(crate) fn check_len<T: Element>(
    op: &'static str,
    shape: &[usize],
    found: usize,
) -> Result<usize, Error> {
    let len = element_count::<T>(shape)?;
    if len == found {
        return Ok(len);
    }
    Err(Error::Interop {
        op,
        param: "shape",
        expected: format!("{found} elements, as the memory holds"),
        found: format!("{shape:?}, {len} elements"),
    })
}

/// The number of elements of `shape`, checking that their bytes fit in memory.
pub(crate) fn element_count<T: Element>(shape: &[usize]) -> Result<usize, Error> {
    let too_large = || Error::TooLarge {
        shape: shape.to_vec(),
        element: T::NAME,
    };
    let len = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(too_large)?;
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(too_large)?;
    if bytes > isize::MAX as usize {
        return Err(too_large());
    }
    Ok(len)
}
