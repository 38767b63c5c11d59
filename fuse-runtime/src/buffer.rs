//! [`Buffer`]: a typed, shaped array on a [`Device`].

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use crate::device::{Device, Kind};
use crate::element::Element;
use crate::error::lock;
use crate::error::Error;
use crate::foreign::{check_type, element_count, Rejected};
use crate::queue::Queue;

/// A row-major array of `T` with a shape, living on a [`Device`].
///
/// A buffer of shape `[]` holds one element (a scalar); a shape with a zero in it holds none.
/// [`Buffer::reshape`] makes another handle to the same storage, so a write through one handle
/// is seen through the other. Buffers are not `Clone`: copy the data with
/// `device.upload(&buffer.to_vec()?)`.
///
/// ```
/// use fuse_runtime::Device;
/// let dev = Device::cpu();
/// let m = dev.upload(&[1i32, 2, 3, 4, 5, 6])?.reshape(&[2, 3])?;
/// assert_eq!(m.shape(), [2, 3]);
/// assert_eq!(m.to_vec()?, [1, 2, 3, 4, 5, 6]);
/// # Ok::<(), fuse_runtime::Error>(())
/// ```
pub struct Buffer<T: Element> {
    shape: Vec<usize>,
    len: usize,
    device: Device,
    storage: Storage<T>,
}

/// Where the elements are. A CUDA allocation holds at least one element, even when `len` is
/// zero, because the driver does not hand out empty allocations.
enum Storage<T: Element> {
    Cpu(Arc<Mutex<Vec<T>>>),
    Cuda {
        /// The `CudaSlice` that owns the allocation: of `T::Repr` when fuse allocated it, or of
        /// the caller's type ([`Buffer::from_cuda_slice`]), `T` itself or `T::Repr`.
        slice: Arc<dyn Any + Send + Sync>,
        /// The allocation's device address, read once: launches pass it for every buffer.
        address: u64,
    },
}

impl<T: Element> Storage<T> {
    fn cuda<R: DeviceRepr + 'static>(slice: CudaSlice<R>, queue: &Queue) -> Storage<T> {
        // The address never changes. With the context's event tracking off (see
        // `CudaDevice::open`) `device_ptr` neither waits nor records anything; with a caller's
        // context that tracks events, it orders this stream after the slice's last write.
        let address = slice.device_ptr(&queue.stream).0;
        Storage::Cuda {
            slice: Arc::new(slice),
            address,
        }
    }
}

impl<T: Element> Buffer<T> {
    /// A one-dimensional buffer holding a copy of `data`.
    pub(crate) fn from_slice(device: &Device, data: &[T]) -> Result<Buffer<T>, Error> {
        let storage = match device.kind() {
            Kind::Cpu => Storage::Cpu(Arc::new(Mutex::new(data.to_vec()))),
            Kind::Cuda(queue) => Storage::cuda(queue.upload(&T::to_repr(data))?, queue),
        };
        Ok(Buffer {
            shape: vec![data.len()],
            len: data.len(),
            device: device.clone(),
            storage,
        })
    }

    /// A zero-filled buffer of `shape`.
    pub(crate) fn zeros(device: &Device, shape: &[usize]) -> Result<Buffer<T>, Error> {
        let len = element_count::<T>(shape)?;
        let storage = match device.kind() {
            Kind::Cpu => Storage::Cpu(Arc::new(Mutex::new(vec![T::default(); len]))),
            Kind::Cuda(queue) => Storage::cuda(queue.zeros::<T::Repr>(len)?, queue),
        };
        Ok(Buffer {
            shape: shape.to_vec(),
            len,
            device: device.clone(),
            storage,
        })
    }

    /// A buffer of `shape` whose contents are unspecified (zeros on the CPU); kernels write
    /// their outputs into these.
    pub(crate) fn uninit(device: &Device, shape: &[usize]) -> Result<Buffer<T>, Error> {
        let len = element_count::<T>(shape)?;
        let storage = match device.kind() {
            Kind::Cpu => Storage::Cpu(Arc::new(Mutex::new(vec![T::default(); len]))),
            Kind::Cuda(queue) => Storage::cuda(queue.uninit::<T::Repr>(len)?, queue),
        };
        Ok(Buffer {
            shape: shape.to_vec(),
            len,
            device: device.clone(),
            storage,
        })
    }

    /// A buffer of `shape` on `dev` that takes over `slice`, cudarc memory, without a copy: the
    /// way to run kernels on memory cudarc (or candle, or CubeCL) allocated.
    /// [`into_cuda_slice`](Buffer::into_cuda_slice) gives it back.
    ///
    /// The slice holds `T` or its device type (`u16` for [`f16`](crate::f16) and
    /// [`bf16`](crate::bf16), `u8` for [`F8E4M3`](crate::F8E4M3), [`F8E5M2`](crate::F8E5M2) and
    /// `bool`), exactly as many elements as `shape`, on the GPU
    /// of `dev`. Otherwise the slice comes back untouched in the [`Rejected`], with an
    /// [`Error::Interop`] that says what did not fit (`?` turns it into the error).
    ///
    /// The slice is used as it is: contiguous, in row-major order. Its last use on another
    /// stream must be ordered before `dev`'s stream uses it (cudarc's event tracking does this
    /// when the slice's context has it on; fuse's own context has it off).
    ///
    /// ```no_run
    /// use fuse_runtime::{Buffer, Device};
    /// let dev = Device::cuda(0)?;
    /// let stream = dev.cuda_stream().unwrap();
    /// let slice = stream.clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    /// let x: Buffer<f32> = Buffer::from_cuda_slice(&dev, slice, &[2, 2])?;
    /// assert_eq!(x.to_vec()?, [1.0, 2.0, 3.0, 4.0]);
    /// let slice = x.into_cuda_slice::<f32>()?;
    /// assert_eq!(slice.len(), 4);
    /// # Ok::<(), fuse_runtime::Error>(())
    /// ```
    // The slice comes back whole in the error, by design: large, but only on a mistake.
    #[allow(clippy::result_large_err)]
    pub fn from_cuda_slice<R: DeviceRepr + 'static>(
        dev: &Device,
        slice: CudaSlice<R>,
        shape: &[usize],
    ) -> Result<Buffer<T>, Rejected<CudaSlice<R>>> {
        let op = "Buffer::from_cuda_slice";
        let checked = (|| {
            let queue = crate::foreign::cuda_device(dev, op)?;
            check_type::<T, R>(op, "slice")?;
            crate::foreign::check_context(queue, slice.stream().context(), op, "slice")?;
            let len = crate::foreign::check_len::<T>(op, shape, slice.len())?;
            Ok((queue.clone(), len))
        })();
        let (queue, len) = match checked {
            Ok(checked) => checked,
            Err(error) => {
                return Err(Rejected {
                    error,
                    value: slice,
                })
            }
        };
        Ok(Buffer {
            shape: shape.to_vec(),
            len,
            device: dev.clone(),
            storage: Storage::cuda(slice, &queue),
        })
    }

    /// The cudarc slice that holds this buffer's elements, given back without a copy: of `R`,
    /// which is `T` or its device type as for [`from_cuda_slice`](Buffer::from_cuda_slice) (a
    /// buffer fuse allocated holds its device type: `f32` for `f32`, `u16` for `bf16`).
    ///
    /// Fails, giving the buffer back in the [`Rejected`], on the CPU, for another `R`, and while
    /// another handle ([`reshape`](Buffer::reshape)) shares the memory.
    // The buffer comes back whole in the error, by design: large, but only on a mistake.
    #[allow(clippy::result_large_err)]
    pub fn into_cuda_slice<R: DeviceRepr + 'static>(
        self,
    ) -> Result<CudaSlice<R>, Rejected<Buffer<T>>> {
        let op = "Buffer::into_cuda_slice";
        let reject = |buffer, expected: String, found: String| Rejected {
            error: Error::Interop {
                op,
                param: "self",
                expected,
                found,
            },
            value: buffer,
        };
        let Buffer {
            shape,
            len,
            device,
            storage,
        } = self;
        let rebuild = |storage| Buffer {
            shape,
            len,
            device,
            storage,
        };
        let type_name = std::any::type_name::<R>();
        let expected = || format!("a GPU buffer held in a `CudaSlice<{type_name}>`");
        let (slice, address) = match storage {
            Storage::Cuda { slice, address } => (slice, address),
            cpu => {
                let found = "a buffer on the CPU".to_string();
                return Err(reject(rebuild(cpu), expected(), found));
            }
        };
        let typed = match slice.downcast::<CudaSlice<R>>() {
            Ok(typed) => typed,
            Err(slice) => {
                let found = format!("not a slice of `{type_name}`");
                return Err(reject(
                    rebuild(Storage::Cuda { slice, address }),
                    expected(),
                    found,
                ));
            }
        };
        Arc::try_unwrap(typed).map_err(|shared| {
            let handles = Arc::strong_count(&shared) - 1;
            let found = format!("shared with {handles} other handle(s) made by `reshape`");
            let storage = Storage::Cuda {
                slice: shared,
                address,
            };
            let only = "the only handle to its memory".to_string();
            reject(rebuild(storage), only, found)
        })
    }

    /// The cudarc slice that holds this buffer's elements when it is a `CudaSlice<T::Repr>`
    /// (every buffer fuse allocates on a GPU), for cudarc calls that read it, such as an NCCL
    /// send; `None` on the CPU.
    pub fn cuda_slice(&self) -> Option<&CudaSlice<T::Repr>> {
        match &self.storage {
            Storage::Cuda { slice, .. } => slice.downcast_ref(),
            Storage::Cpu(_) => None,
        }
    }

    /// The cudarc slice as [`cuda_slice`](Buffer::cuda_slice) gives it, to write, such as an
    /// NCCL all-reduce in place. Fails while another handle ([`reshape`](Buffer::reshape))
    /// shares the memory, since writing through `&mut` then would be seen through it.
    pub fn cuda_slice_mut(&mut self) -> Result<&mut CudaSlice<T::Repr>, Error> {
        let op = "Buffer::cuda_slice_mut";
        let error = |found: &str| Error::Interop {
            op,
            param: "self",
            expected: "the only handle to a GPU buffer fuse allocated".to_string(),
            found: found.to_string(),
        };
        match &mut self.storage {
            Storage::Cpu(_) => Err(error("a buffer on the CPU")),
            Storage::Cuda { slice, .. } => Arc::get_mut(slice)
                .ok_or_else(|| error("shared with other handles made by `reshape`"))?
                .downcast_mut()
                .ok_or_else(|| error("a slice of another type")),
        }
    }

    /// The size of each axis, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements: the product of the shape (1 for the shape `[]`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Another handle to the same elements, seen with `shape`, which must hold as many
    /// elements; fails with [`Error::Reshape`] otherwise.
    pub fn reshape(&self, shape: &[usize]) -> Result<Buffer<T>, Error> {
        let reshape_error = || Error::Reshape {
            from: self.shape.clone(),
            to: shape.to_vec(),
        };
        let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if len != Some(self.len) {
            return Err(reshape_error());
        }
        let storage = match &self.storage {
            Storage::Cpu(data) => Storage::Cpu(data.clone()),
            Storage::Cuda { slice, address } => Storage::Cuda {
                slice: slice.clone(),
                address: *address,
            },
        };
        Ok(Buffer {
            shape: shape.to_vec(),
            len: self.len,
            device: self.device.clone(),
            storage,
        })
    }

    /// A copy of the elements in row-major order. On a GPU this waits for every kernel
    /// submitted before it, and reports any error they raised.
    pub fn to_vec(&self) -> Result<Vec<T>, Error> {
        match (&self.storage, self.device.kind()) {
            (Storage::Cpu(data), _) => Ok(lock(data).clone()),
            (Storage::Cuda { address, .. }, Kind::Cuda(queue)) => {
                // SAFETY: the storage is a live allocation of this device holding `len`
                // elements of `T::Repr`, kept alive by `self` during the call.
                Ok(T::from_repr(unsafe { queue.read(*address, self.len)? }))
            }
            (Storage::Cuda { .. }, Kind::Cpu) => Err(self.storage_mismatch()),
        }
    }

    /// Overwrites every element with `data`, which must have [`len`](Buffer::len) elements;
    /// fails with [`Error::Length`] otherwise.
    pub fn copy_from(&mut self, data: &[T]) -> Result<(), Error> {
        self.check_length("Buffer::copy_from", data.len())?;
        match (&self.storage, self.device.kind()) {
            (Storage::Cpu(storage), _) => {
                lock(storage).copy_from_slice(data);
                Ok(())
            }
            (Storage::Cuda { address, .. }, Kind::Cuda(queue)) => {
                // SAFETY: as in `to_vec`; `data` has `len` elements (checked above).
                unsafe { queue.write(*address, &T::to_repr(data)) }
            }
            (Storage::Cuda { .. }, Kind::Cpu) => Err(self.storage_mismatch()),
        }
    }

    /// Replaces every element with `data` (of length [`len`](Buffer::len)), without a copy on
    /// the CPU.
    pub(crate) fn replace(&mut self, data: Vec<T>) -> Result<(), Error> {
        self.check_length("host_write", data.len())?;
        match &self.storage {
            Storage::Cpu(storage) => {
                *lock(storage) = data;
                Ok(())
            }
            Storage::Cuda { .. } => self.copy_from(&data),
        }
    }

    /// The device address of the first element, or `None` on the CPU.
    pub(crate) fn device_address(&self) -> Option<u64> {
        match (&self.storage, self.device.kind()) {
            (Storage::Cuda { address, .. }, Kind::Cuda(_)) => Some(*address),
            _ => None,
        }
    }

    /// Where the elements are, for the overlap check of a call (see `AnyBuffer::span`).
    pub(crate) fn span(&self) -> Option<(usize, std::ops::Range<u64>)> {
        let bytes = (self.len * std::mem::size_of::<T::Repr>()) as u64;
        if bytes == 0 {
            return None;
        }
        match &self.storage {
            Storage::Cpu(data) => Some((Arc::as_ptr(data) as usize, 0..bytes)),
            Storage::Cuda { address, .. } => Some((0, *address..address + bytes)),
        }
    }

    fn check_length(&self, op: &'static str, found: usize) -> Result<(), Error> {
        if found == self.len {
            Ok(())
        } else {
            Err(Error::Length {
                op,
                expected: self.len,
                found,
            })
        }
    }

    fn storage_mismatch(&self) -> Error {
        Error::Internal {
            detail: format!("a GPU allocation attached to {}", self.device),
        }
    }
}

/// Buffers made by a device (here rather than in `device.rs`, which knows no buffer).
impl Device {
    /// A new one-dimensional buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>, Error> {
        Buffer::from_slice(self, data)
    }

    /// A new buffer of `shape`, filled with zeros (`false` for `bool`).
    ///
    /// The shape `[]` holds one element.
    pub fn zeros<T: Element>(&self, shape: &[usize]) -> Result<Buffer<T>, Error> {
        Buffer::zeros(self, shape)
    }
}

impl<T: Element> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer<{}>{:?} on {}", T::NAME, self.shape, self.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator, so the tests need no extra crate.
    fn noise(n: usize, seed: u64) -> Vec<u64> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            })
            .collect()
    }

    fn round_trip<T: Element>(data: Vec<T>) {
        let dev = Device::cpu();
        let buffer = dev.upload(&data).unwrap();
        assert_eq!(buffer.shape(), [data.len()]);
        assert_eq!(buffer.len(), data.len());
        assert_eq!(buffer.to_vec().unwrap(), data, "{}", T::NAME);
        let empty = dev.upload::<T>(&[]).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.to_vec().unwrap(), Vec::<T>::new());
        let scalar = dev.upload(&data[..1]).unwrap().reshape(&[]).unwrap();
        assert_eq!((scalar.shape(), scalar.len()), (&[][..], 1));
        assert_eq!(scalar.to_vec().unwrap(), data[..1]);
    }

    #[test]
    fn upload_round_trip_every_type() {
        let bits = noise(37, 1);
        round_trip(
            bits.iter()
                .map(|&b| (b as i32) as f32 / 7.0)
                .collect::<Vec<f32>>(),
        );
        round_trip(
            bits.iter()
                .map(|&b| (b as i64) as f64 / 3.0)
                .collect::<Vec<f64>>(),
        );
        round_trip(bits.iter().map(|&b| b as i32).collect::<Vec<i32>>());
        round_trip(bits.iter().map(|&b| b as u32).collect::<Vec<u32>>());
        round_trip(bits.iter().map(|&b| b as i64).collect::<Vec<i64>>());
        round_trip(bits.clone());
        round_trip(bits.iter().map(|&b| b % 3 == 0).collect::<Vec<bool>>());
    }

    #[test]
    fn zeros_of_every_shape() {
        let dev = Device::cpu();
        let z = dev.zeros::<f32>(&[3, 5, 7]).unwrap();
        assert_eq!((z.len(), z.rank()), (105, 3));
        assert!(z.to_vec().unwrap().iter().all(|&v| v == 0.0));
        assert_eq!(dev.zeros::<bool>(&[]).unwrap().to_vec().unwrap(), [false]);
        let empty = dev.zeros::<u64>(&[4, 0, 9]).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.to_vec().unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn absurd_shapes_are_errors() {
        let dev = Device::cpu();
        let err = dev.zeros::<f64>(&[usize::MAX, 2]).unwrap_err();
        assert!(
            matches!(err, Error::TooLarge { element: "f64", .. }),
            "{err}"
        );
        let err = dev.zeros::<f64>(&[usize::MAX / 4]).unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    }

    #[test]
    fn reshape_shares_storage() {
        let dev = Device::cpu();
        let data: Vec<i64> = noise(15, 2).into_iter().map(|b| b as i64).collect();
        let flat = dev.upload(&data).unwrap();
        let mut m = flat.reshape(&[3, 5]).unwrap();
        assert_eq!(m.shape(), [3, 5]);
        let new: Vec<i64> = noise(15, 3).into_iter().map(|b| b as i64).collect();
        m.copy_from(&new).unwrap();
        assert_eq!(
            flat.to_vec().unwrap(),
            new,
            "a write through one handle shows in the other"
        );
        assert_eq!(
            dev.zeros::<f32>(&[0, 3])
                .unwrap()
                .reshape(&[7, 0])
                .unwrap()
                .len(),
            0
        );
    }

    #[test]
    fn reshape_errors_name_both_shapes() {
        let flat = Device::cpu().upload(&[1u32; 15]).unwrap();
        let err = flat.reshape(&[4, 4]).unwrap_err();
        assert_eq!(
            err,
            Error::Reshape {
                from: vec![15],
                to: vec![4, 4]
            }
        );
        assert_eq!(
            err.to_string(),
            "cannot reshape a buffer of shape [15] (15 elements) to [4, 4] (16 elements)"
        );
        let err = flat.reshape(&[usize::MAX, 3]).unwrap_err();
        assert!(matches!(err, Error::Reshape { .. }), "{err}");
    }

    #[test]
    fn copy_from_checks_length() {
        let mut b = Device::cpu().upload(&[1.5f32, 2.5, 3.5]).unwrap();
        let err = b.copy_from(&[1.0, 2.0]).unwrap_err();
        assert_eq!(
            err,
            Error::Length {
                op: "Buffer::copy_from",
                expected: 3,
                found: 2
            }
        );
        assert_eq!(
            b.to_vec().unwrap(),
            [1.5, 2.5, 3.5],
            "a failed copy changes nothing"
        );
        b.copy_from(&[-1.0, -2.0, -3.0]).unwrap();
        assert_eq!(b.to_vec().unwrap(), [-1.0, -2.0, -3.0]);
    }

    #[test]
    fn debug_shows_type_shape_and_device() {
        let b = Device::cpu().zeros::<bool>(&[2, 3]).unwrap();
        assert_eq!(format!("{b:?}"), "Buffer<bool>[2, 3] on CPU");
    }

    #[test]
    fn buffer_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Buffer<f32>>();
        assert_send_sync::<Buffer<bool>>();
    }
}
