//! Memory fuse does not own: [`BufferView`] and [`BufferViewMut`], borrowed views of cudarc
//! memory or of a raw device pointer, and the [`Input`] and [`Output`] traits through which a
//! generated kernel takes them beside [`Buffer`](crate::Buffer)s.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, DevicePtr, DevicePtrMut};

use crate::device::Device;
use crate::element::Element;
use crate::error::Error;
use crate::foreign::{check_context, check_len, check_type, cuda_device, element_count};
use crate::queue::Queue;
use crate::tensor::{sealed::Sealed, AnyBuffer, Input, Output};

impl<T: Element> Sealed for BufferView<'_, T> {}
impl<T: Element> Sealed for BufferViewMut<'_, T> {}

/// A borrowed view of `T`s in GPU memory fuse does not own, with a shape: a generated kernel
/// reads it in place, as it reads a [`Buffer`](crate::Buffer).
///
/// Made from cudarc memory ([`BufferView::new`]: a `CudaSlice` or `CudaView`, such as a candle
/// tensor's storage) or from a raw device pointer ([`BufferView::from_raw`]). The memory is
/// taken as it is: contiguous, row-major, starting at the view's first element. A strided or
/// transposed source is the caller's to make contiguous first. A view at any element offset
/// works: a kernel given an address that is not 16-byte aligned runs on an aligned copy, made
/// on the stream (a device copy of that argument, no host synchronization).
///
/// ```no_run
/// use fuse_runtime::{fuse, BufferView, Device};
/// fuse! {
///     fn double(x: [f32; n]) -> [f32; n] { x * 2.0 }
/// }
/// let dev = Device::cuda(0)?;
/// let stream = dev.cuda_stream().unwrap();
/// let data = stream.clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0]).unwrap();
/// let tail = data.slice(1..); // a view at an element offset
/// let x = BufferView::<f32>::new(&dev, &tail, &[4])?;
/// assert_eq!(double(&dev, &x)?.to_vec()?, [4.0, 6.0, 8.0, 10.0]);
/// # Ok::<(), fuse_runtime::Error>(())
/// ```
pub struct BufferView<'a, T: Element> {
    raw: Raw<T>,
    _memory: PhantomData<&'a [T]>,
}

/// A mutably borrowed view of `T`s in GPU memory fuse does not own, with a shape: a generated
/// kernel reads it, or writes an output into it (`name::into`), in place. Made as
/// [`BufferView`] is, from `CudaSlice`s and `CudaViewMut`s or a raw pointer.
pub struct BufferViewMut<'a, T: Element> {
    raw: Raw<T>,
    _memory: PhantomData<&'a mut [T]>,
}

/// A view's parts: checked when it is made, and never freed by fuse.
struct Raw<T: Element> {
    shape: Vec<usize>,
    len: usize,
    device: Device,
    address: u64,
    _element: PhantomData<fn() -> T>,
}

impl<T: Element> Raw<T> {
    /// The parts of a view of `shape` at `address` on `dev`, whose memory was checked.
    fn new(dev: &Device, address: u64, shape: &[usize], len: usize) -> Raw<T> {
        Raw {
            shape: shape.to_vec(),
            len,
            device: dev.clone(),
            address,
            _element: PhantomData,
        }
    }

    fn reshape(self, shape: &[usize]) -> Result<Raw<T>, Error> {
        let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if len != Some(self.len) {
            return Err(Error::Reshape {
                from: self.shape,
                to: shape.to_vec(),
            });
        }
        Ok(Raw {
            shape: shape.to_vec(),
            ..self
        })
    }

    fn to_vec(&self) -> Result<Vec<T>, Error> {
        let queue = cuda_device(&self.device, "BufferView::to_vec")?;
        // SAFETY: the view's memory was checked to hold `len` elements of `T` on this device
        // when it was made, and its borrow (or the raw contract) keeps it alive now.
        Ok(T::from_repr(unsafe { queue.read(self.address, self.len)? }))
    }
}

/// Implements the accessors both views share.
macro_rules! view_accessors {
    ($view:ident) => {
        impl<'a, T: Element> $view<'a, T> {
            /// The size of each axis, outermost first.
            pub fn shape(&self) -> &[usize] {
                &self.raw.shape
            }

            /// The number of elements.
            pub fn len(&self) -> usize {
                self.raw.len
            }

            /// Whether the view holds no elements.
            pub fn is_empty(&self) -> bool {
                self.raw.len == 0
            }

            /// The device the memory lives on, with the stream the view's checks used.
            pub fn device(&self) -> &Device {
                &self.raw.device
            }

            /// The device address of the first element.
            pub fn address(&self) -> u64 {
                self.raw.address
            }

            /// The same memory seen with `shape`, which must hold as many elements; fails with
            /// [`Error::Reshape`] otherwise.
            pub fn reshape(self, shape: &[usize]) -> Result<$view<'a, T>, Error> {
                let raw = self.raw.reshape(shape)?;
                Ok($view {
                    raw,
                    _memory: PhantomData,
                })
            }

            /// A copy of the elements in row-major order, after all work queued on the view's
            /// device handle.
            pub fn to_vec(&self) -> Result<Vec<T>, Error> {
                self.raw.to_vec()
            }
        }

        impl<T: Element> AnyBuffer for $view<'_, T> {
            fn shape(&self) -> &[usize] {
                &self.raw.shape
            }

            fn device(&self) -> &Device {
                &self.raw.device
            }

            fn device_address(&self) -> Option<u64> {
                Some(self.raw.address)
            }

            fn bytes(&self) -> usize {
                self.raw.len * std::mem::size_of::<T::Repr>()
            }

            fn span(&self) -> Option<(usize, std::ops::Range<u64>)> {
                let bytes = self.bytes() as u64;
                (bytes > 0).then(|| (0, self.raw.address..self.raw.address + bytes))
            }
        }

        impl<T: Element> Input<T> for $view<'_, T> {
            fn read(&self) -> Result<Vec<T>, Error> {
                self.raw.to_vec()
            }
        }

        impl<T: Element> fmt::Debug for $view<'_, T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "{}<{}>{:?} at {:#x} on {}",
                    stringify!($view),
                    T::NAME,
                    self.raw.shape,
                    self.raw.address,
                    self.raw.device
                )
            }
        }
    };
}

view_accessors!(BufferView);
view_accessors!(BufferViewMut);

impl<'a, T: Element> BufferView<'a, T> {
    /// A view of `src`, cudarc memory of the GPU of `dev` (a `CudaSlice<R>` or `CudaView<R>`),
    /// seen with `shape`. `R` is `T` or its device type (`u16` for `f16`/`bf16`, `u8` for
    /// `F8E4M3`/`F8E5M2` and `bool`); `src` holds exactly as many elements as `shape`. A mismatch (the CPU device,
    /// another GPU or context, another element type, another length) is an
    /// [`Error::Interop`] naming what was expected and found.
    pub fn new<R: 'static, S: DevicePtr<R>>(
        dev: &Device,
        src: &'a S,
        shape: &[usize],
    ) -> Result<BufferView<'a, T>, Error> {
        let op = "BufferView::new";
        let (queue, len) = check_cudarc::<T, R>(dev, op, src.stream().context(), shape, src.len())?;
        // With the source context's event tracking on, this orders `dev`'s stream after the
        // memory's last write on another stream.
        let address = src.device_ptr(&queue.stream).0;
        Ok(BufferView {
            raw: Raw::new(dev, address, shape, len),
            _memory: PhantomData,
        })
    }

    /// A view of `shape` at `address`, a device pointer of the GPU of `dev` that other code
    /// (a framework that hands out only pointers) allocated. The pointer is checked with the
    /// driver: it must be device memory of this GPU, aligned to `T`, with
    /// `shape`'s elements inside one allocation; otherwise this is an [`Error::Interop`].
    ///
    /// # Safety
    /// - The memory holds `shape`'s elements of `T` (as its device type) and stays allocated
    ///   for `'a`, which the caller chooses: while the view, or a kernel queued with it, uses it.
    /// - Nothing writes it while kernels queued with the view may read it, and work queued on
    ///   other streams is ordered with `dev`'s stream by the caller.
    pub unsafe fn from_raw(
        dev: &Device,
        address: u64,
        shape: &[usize],
    ) -> Result<BufferView<'a, T>, Error> {
        let len = check_raw::<T>(dev, "BufferView::from_raw", address, shape)?;
        Ok(BufferView {
            raw: Raw::new(dev, address, shape, len),
            _memory: PhantomData,
        })
    }
}

impl<'a, T: Element> BufferViewMut<'a, T> {
    /// A mutable view of `src`, cudarc memory of the GPU of `dev` (a `CudaSlice<R>` or
    /// `CudaViewMut<R>`), seen with `shape`: as [`BufferView::new`], for outputs too.
    pub fn new<R: 'static, S: DevicePtrMut<R>>(
        dev: &Device,
        src: &'a mut S,
        shape: &[usize],
    ) -> Result<BufferViewMut<'a, T>, Error> {
        let op = "BufferViewMut::new";
        let (queue, len) = check_cudarc::<T, R>(dev, op, src.stream().context(), shape, src.len())?;
        let address = src.device_ptr_mut(&queue.stream).0;
        Ok(BufferViewMut {
            raw: Raw::new(dev, address, shape, len),
            _memory: PhantomData,
        })
    }

    /// A mutable view of `shape` at `address`, checked as for [`BufferView::from_raw`].
    ///
    /// # Safety
    /// As for [`BufferView::from_raw`], and nothing else reads or writes the memory while
    /// kernels queued with the view may write it.
    pub unsafe fn from_raw(
        dev: &Device,
        address: u64,
        shape: &[usize],
    ) -> Result<BufferViewMut<'a, T>, Error> {
        let len = check_raw::<T>(dev, "BufferViewMut::from_raw", address, shape)?;
        Ok(BufferViewMut {
            raw: Raw::new(dev, address, shape, len),
            _memory: PhantomData,
        })
    }

    /// Overwrites every element with `data`, which must have [`len`](BufferViewMut::len)
    /// elements; fails with [`Error::Length`] otherwise.
    pub fn copy_from(&mut self, data: &[T]) -> Result<(), Error> {
        if data.len() != self.raw.len {
            return Err(Error::Length {
                op: "BufferViewMut::copy_from",
                expected: self.raw.len,
                found: data.len(),
            });
        }
        let queue = cuda_device(&self.raw.device, "BufferViewMut::copy_from")?;
        // SAFETY: the view's memory holds `len` elements of `T` (checked when it was made) and
        // is borrowed mutably for the view's life.
        unsafe { queue.write(self.raw.address, &T::to_repr(data)) }
    }
}

impl<T: Element> Output<T> for BufferViewMut<'_, T> {
    fn write(&mut self, data: Vec<T>) -> Result<(), Error> {
        self.copy_from(&data)
    }
}

/// The checks of a view of cudarc memory of `context` and `found` elements of `R`.
fn check_cudarc<'d, T: Element, R: 'static>(
    dev: &'d Device,
    op: &'static str,
    context: &CudaContext,
    shape: &[usize],
    found: usize,
) -> Result<(&'d Arc<Queue>, usize), Error> {
    let queue = cuda_device(dev, op)?;
    check_type::<T, R>(op, "src")?;
    check_context(queue, context, op, "src")?;
    Ok((queue, check_len::<T>(op, shape, found)?))
}

/// The checks of a raw pointer: aligned to `T`, device memory of `dev`'s GPU, and `shape`'s bytes
/// inside one allocation, as the driver reports them. (The GPU, not the context: memory from a
/// stream-ordered pool, as cudarc allocates, belongs to no context.)
fn check_raw<T: Element>(
    dev: &Device,
    op: &'static str,
    address: u64,
    shape: &[usize],
) -> Result<usize, Error> {
    let queue = cuda_device(dev, op)?;
    let len = element_count::<T>(shape)?;
    let bytes = (len * std::mem::size_of::<T::Repr>()) as u64;
    let error = |expected: String, found: String| Error::Interop {
        op,
        param: "address",
        expected,
        found,
    };
    let align = std::mem::align_of::<T::Repr>() as u64;
    if address == 0 || !address.is_multiple_of(align) {
        return Err(error(
            format!("a non-null address aligned to {align} bytes"),
            format!("{address:#x}"),
        ));
    }
    queue.cuda.bind()?;
    use sys::CUpointer_attribute::*;
    let ordinal = pointer_attribute(address, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, -1i32);
    let start = pointer_attribute(address, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 0u64);
    let size = pointer_attribute(address, CU_POINTER_ATTRIBUTE_RANGE_SIZE, 0usize);
    let expected = || format!("memory of {}", queue.cuda.describe());
    match ordinal {
        Some(ordinal) if usize::try_from(ordinal) == Ok(queue.cuda.ordinal) => {}
        Some(ordinal) => {
            let found = format!("{address:#x}, memory of CUDA device {ordinal}");
            return Err(error(expected(), found));
        }
        None => {
            return Err(error(
                expected(),
                format!("{address:#x}, which the driver does not know as device memory"),
            ))
        }
    }
    if let (Some(start), Some(size)) = (start, size) {
        let end = start.saturating_add(size as u64);
        if address.saturating_add(bytes) > end {
            return Err(error(
                format!("{bytes} bytes inside one allocation"),
                format!(
                    "{address:#x}, {} bytes before the end of its allocation",
                    end - address
                ),
            ));
        }
    }
    Ok(len)
}

/// One attribute of a device pointer, or `None` when the driver does not know the pointer.
fn pointer_attribute<V>(address: u64, attribute: sys::CUpointer_attribute, init: V) -> Option<V> {
    let mut value = init;
    // SAFETY: every attribute asked for here is written by the driver as a value of the type
    // `V` it is read into (an `int` ordinal, an address, a size), into `value`, which lives
    // until the call returns.
    let asked =
        unsafe { sys::cuPointerGetAttribute((&mut value as *mut V).cast(), attribute, address) };
    asked.result().ok().map(|()| value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foreign::Rejected;

    #[test]
    fn element_types_match_by_type_or_device_type() {
        check_type::<f32, f32>("op", "src").unwrap();
        check_type::<half::bf16, half::bf16>("op", "src").unwrap();
        check_type::<half::bf16, u16>("op", "src").unwrap();
        check_type::<bool, u8>("op", "src").unwrap();
        let err = check_type::<f32, f64>("BufferView::new", "src").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`BufferView::new`: `src` is memory of `f64`, but it must be memory of `f32` (or `f32`)"
        );
        let err = check_type::<half::f16, i16>("op", "slice").unwrap_err();
        assert!(
            matches!(err, Error::Interop { param: "slice", .. }),
            "{err}"
        );
        assert!(
            check_type::<u8, bool>("op", "src").is_err(),
            "bool is not u8's device type"
        );
    }

    #[test]
    fn lengths_must_equal_the_shape() {
        assert_eq!(check_len::<f32>("op", &[3, 4], 12).unwrap(), 12);
        assert_eq!(check_len::<f32>("op", &[], 1).unwrap(), 1);
        let err = check_len::<f32>("Buffer::from_cuda_slice", &[5, 2], 12).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`Buffer::from_cuda_slice`: `shape` is [5, 2], 10 elements, but it must be 12 \
             elements, as the memory holds"
        );
        let err = check_len::<f64>("op", &[usize::MAX, 2], 3).unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    }

    #[test]
    fn views_need_a_cuda_device() {
        let Err(err) = cuda_device(&Device::cpu(), "BufferView::new") else {
            panic!("the CPU has no stream")
        };
        assert!(matches!(err, Error::Interop { param: "dev", .. }), "{err}");
        // SAFETY: the CPU device is refused before the address is looked at.
        let err = unsafe { BufferView::<f32>::from_raw(&Device::cpu(), 256, &[4]) }.unwrap_err();
        assert!(matches!(err, Error::Interop { param: "dev", .. }), "{err}");
    }

    #[test]
    fn rejected_turns_into_its_error() {
        let rejected = Rejected {
            error: Error::Reshape {
                from: vec![3],
                to: vec![4],
            },
            value: vec![1, 2, 3],
        };
        assert!(rejected.to_string().starts_with("cannot reshape"));
        let error: Error = rejected.into();
        assert!(matches!(error, Error::Reshape { .. }));
    }
}
