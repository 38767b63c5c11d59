//! [`Buffer::copy_to`]: a copy from one buffer into another on the same device.

use crate::buffer::Buffer;
use crate::device::Kind;
use crate::element::Element;
use crate::error::Error;

impl<T: Element> Buffer<T> {
    /// Copies every element into `dst`, which must live on the same device and hold as many
    /// elements (its shape may differ).
    ///
    /// On a CUDA device this is a device-to-device copy queued on the device's stream, in order
    /// with kernels: it returns before the copy has run, like a launch. On the CPU it copies
    /// now. Fails with [`Error::DeviceMismatch`] or [`Error::Length`] and changes nothing when
    /// the buffers do not match.
    ///
    /// ```
    /// use fuse_runtime::Device;
    /// let dev = Device::detect();
    /// let src = dev.upload(&[1.0f32, 2.0, 3.0, 4.0])?;
    /// let mut dst = dev.zeros::<f32>(&[2, 2])?;
    /// src.copy_to(&mut dst)?;
    /// assert_eq!(dst.to_vec()?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), fuse_runtime::Error>(())
    /// ```
    pub fn copy_to(&self, dst: &mut Buffer<T>) -> Result<(), Error> {
        if self.device() != dst.device() {
            return Err(Error::DeviceMismatch {
                kernel: "Buffer::copy_to".to_string(),
                param: "dst".to_string(),
                expected: self.device().name(),
                found: dst.device().name(),
            });
        }
        if self.len() != dst.len() {
            return Err(Error::Length {
                op: "Buffer::copy_to",
                expected: dst.len(),
                found: self.len(),
            });
        }
        match self.device().kind() {
            Kind::Cpu => dst.replace(self.to_vec()?),
            Kind::Cuda(queue) => {
                let missing = || Error::Internal {
                    detail: format!("a buffer on {} without a device address", self.device()),
                };
                let src_address = self.device_address().ok_or_else(missing)?;
                let dst_address = dst.device_address().ok_or_else(missing)?;
                // Handles made by `reshape` share one allocation: a copy onto itself is done.
                if self.is_empty() || src_address == dst_address {
                    return Ok(());
                }
                let bytes = self.len() * std::mem::size_of::<T::Repr>();
                // SAFETY: both addresses are the starts of live allocations of this device's
                // context, each holding at least `len` elements of `T::Repr` (the lengths are
                // equal, checked above), so the copy stays in bounds of both. Distinct buffers
                // are distinct allocations (a buffer is always a whole allocation), so the two
                // ranges do not overlap. The copy is queued on the source's stream, after every
                // kernel queued there that used either buffer; allocations are freed in stream
                // order, so both outlive it.
                unsafe { queue.copy(dst_address, src_address, bytes) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Device, Error};

    #[test]
    fn copies_between_shapes_of_one_length() {
        let dev = Device::cpu();
        let src = dev
            .upload(&[1i64, -2, 3, -4, 5, -6])
            .unwrap()
            .reshape(&[2, 3])
            .unwrap();
        let mut dst = dev.zeros::<i64>(&[3, 2]).unwrap();
        src.copy_to(&mut dst).unwrap();
        assert_eq!(dst.to_vec().unwrap(), [1, -2, 3, -4, 5, -6]);
        assert_eq!(dst.shape(), [3, 2], "the destination keeps its shape");
        let bools = dev.upload(&[true, false, true]).unwrap();
        let mut out = dev.zeros::<bool>(&[3]).unwrap();
        bools.copy_to(&mut out).unwrap();
        assert_eq!(out.to_vec().unwrap(), [true, false, true]);
    }

    #[test]
    fn copy_onto_itself_and_empty() {
        let dev = Device::cpu();
        let src = dev.upload(&[1.5f32, 2.5]).unwrap();
        let mut same = src.reshape(&[2, 1]).unwrap();
        src.copy_to(&mut same).unwrap();
        assert_eq!(same.to_vec().unwrap(), [1.5, 2.5]);
        let empty = dev.zeros::<f64>(&[0, 4]).unwrap();
        let mut other = dev.zeros::<f64>(&[0]).unwrap();
        empty.copy_to(&mut other).unwrap();
        assert!(other.is_empty());
    }

    #[test]
    fn length_mismatch_is_an_error_and_changes_nothing() {
        let dev = Device::cpu();
        let src = dev.upload(&[1u32, 2, 3]).unwrap();
        let mut dst = dev.upload(&[9u32, 9]).unwrap();
        let err = src.copy_to(&mut dst).unwrap_err();
        assert_eq!(
            err,
            Error::Length {
                op: "Buffer::copy_to",
                expected: 2,
                found: 3
            }
        );
        assert_eq!(dst.to_vec().unwrap(), [9, 9]);
    }

    #[test]
    fn device_mismatch_is_an_error() {
        // Only testable with a GPU; without one there is a single device.
        let Ok(gpu) = Device::cuda(0) else { return };
        let src = Device::cpu().upload(&[1.0f32]).unwrap();
        let mut dst = gpu.zeros::<f32>(&[1]).unwrap();
        let err = src.copy_to(&mut dst).unwrap_err();
        assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
    }
}
