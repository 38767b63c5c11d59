//! [`Buffer`]: a typed, shaped array on a [`Device`].

use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::cuda::{lock, CudaDevice};
use crate::device::{Device, Kind};
use crate::element::Element;
use crate::error::Error;

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
        slice: Arc<CudaSlice<T::Repr>>,
        /// The allocation's device address, read once: launches pass it for every buffer.
        address: u64,
    },
}

impl<T: Element> Storage<T> {
    fn cuda(slice: CudaSlice<T::Repr>, cuda: &CudaDevice) -> Storage<T> {
        // The address never changes, and with the context's event tracking off (see
        // `CudaDevice::open`) `device_ptr` neither waits nor records anything.
        let address = slice.device_ptr(&cuda.stream).0;
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
            Kind::Cuda(cuda) => Storage::cuda(cuda.upload(&T::to_repr(data))?, cuda),
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
            Kind::Cuda(cuda) => Storage::cuda(cuda.zeros(len)?, cuda),
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
            Kind::Cuda(cuda) => Storage::cuda(cuda.uninit(len)?, cuda),
        };
        Ok(Buffer {
            shape: shape.to_vec(),
            len,
            device: device.clone(),
            storage,
        })
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
            (Storage::Cuda { slice, .. }, Kind::Cuda(cuda)) => {
                Ok(T::from_repr(cuda.read(slice, self.len)?))
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
            (Storage::Cuda { slice, .. }, Kind::Cuda(cuda)) => cuda.write(slice, &T::to_repr(data)),
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
