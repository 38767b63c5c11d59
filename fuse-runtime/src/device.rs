//! [`Device`]: where buffers live and kernels run.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::buffer::Buffer;
use crate::cache::Origin;
use crate::cuda::{lock, CudaDevice};
use crate::element::Element;
use crate::error::Error;
use crate::private::KernelInfo;

/// The CUDA devices opened so far, by ordinal: one shared instance each per process, so that
/// buffers from two `Device::cuda(0)` calls work together.
static OPEN: Mutex<Vec<(usize, Arc<CudaDevice>)>> = Mutex::new(Vec::new());

/// A place where buffers live and kernels run: the CPU, or one CUDA GPU.
///
/// Cloning is cheap (a reference count). On a CUDA device all work goes, in order, to one
/// stream: launches return before the kernel has run, and [`Buffer::to_vec`] waits for it.
///
/// ```
/// use fuse_runtime::Device;
/// let dev = Device::detect(); // the first GPU if there is one, else the CPU
/// let x = dev.upload(&[1.0f32, 2.0, 3.0])?;
/// assert_eq!(x.to_vec()?, [1.0, 2.0, 3.0]);
/// # Ok::<(), fuse_runtime::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    kind: Kind,
}

#[derive(Clone)]
pub(crate) enum Kind {
    Cpu,
    Cuda(Arc<CudaDevice>),
}

impl Device {
    /// The CPU: kernels run as the Rust code the `fuse!` macro generated.
    pub fn cpu() -> Device {
        Device { kind: Kind::Cpu }
    }

    /// CUDA device `ordinal`, opened on first use and shared afterwards.
    ///
    /// Fails with [`Error::NoDriver`] when the CUDA driver library cannot be loaded, and with
    /// [`Error::NoDevice`] when there is no device `ordinal`.
    pub fn cuda(ordinal: usize) -> Result<Device, Error> {
        let mut open = lock(&OPEN);
        if let Some((_, device)) = open.iter().find(|(n, _)| *n == ordinal) {
            return Ok(Device {
                kind: Kind::Cuda(device.clone()),
            });
        }
        // Opening under the lock makes concurrent first calls share one instance.
        let device = Arc::new(CudaDevice::open(ordinal)?);
        open.push((ordinal, device.clone()));
        Ok(Device {
            kind: Kind::Cuda(device),
        })
    }

    /// The first CUDA device when a driver and a GPU are there, else the CPU.
    pub fn detect() -> Device {
        Device::cuda(0).unwrap_or_else(|_| Device::cpu())
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self.kind, Kind::Cuda(_))
    }

    /// Whether this is the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self.kind, Kind::Cpu)
    }

    /// The CUDA ordinal, or `None` for the CPU.
    pub fn ordinal(&self) -> Option<usize> {
        match &self.kind {
            Kind::Cpu => None,
            Kind::Cuda(cuda) => Some(cuda.ordinal),
        }
    }

    /// What this device is, such as `CUDA device 0: NVIDIA H100 80GB HBM3 (sm_90)` or `CPU`.
    pub fn name(&self) -> String {
        match &self.kind {
            Kind::Cpu => "CPU".to_string(),
            Kind::Cuda(cuda) => cuda.describe(),
        }
    }

    /// The CUDA compute capability as (major, minor), such as `(9, 0)`; `None` for the CPU.
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        match &self.kind {
            Kind::Cpu => None,
            Kind::Cuda(cuda) => Some(cuda.capability),
        }
    }

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

    /// Waits until all work submitted to this device has finished, and reports any error it
    /// raised. Does nothing on the CPU.
    pub fn synchronize(&self) -> Result<(), Error> {
        match &self.kind {
            Kind::Cpu => Ok(()),
            Kind::Cuda(cuda) => cuda.synchronize(),
        }
    }

    /// Where the CUBIN of `kernel` came from on this device: embedded at build time
    /// (`FUSE_CUBIN_ARCHS`), the disk cache, or NVRTC; `None` before its first launch here, and
    /// on the CPU.
    ///
    /// ```
    /// use fuse_runtime::{fuse, Device};
    /// fuse! {
    ///     fn double(x: [f32; n]) -> [f32; n] { x * 2.0 }
    /// }
    /// let dev = Device::detect();
    /// let kernel = fuse_runtime::kernels().find(|k| k.name == "double").unwrap();
    /// assert_eq!(dev.kernel_origin(kernel), None);
    /// let y = double(&dev, &dev.upload(&[1.0f32, 2.0])?)?;
    /// // On a GPU: `Some(Origin::Embedded)` when this program was built with
    /// // `FUSE_CUBIN_ARCHS` naming its architecture, else `Disk` or `Nvrtc`.
    /// println!("{:?}", dev.kernel_origin(kernel));
    /// # assert_eq!(y.to_vec()?, [2.0, 4.0]);
    /// # Ok::<(), fuse_runtime::Error>(())
    /// ```
    pub fn kernel_origin(&self, kernel: &KernelInfo) -> Option<Origin> {
        match &self.kind {
            Kind::Cpu => None,
            Kind::Cuda(cuda) => cuda.origin(kernel),
        }
    }

    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The CUDA device, or [`Error::NotCuda`] naming `kernel`.
    pub(crate) fn cuda_for(&self, kernel: &str) -> Result<&Arc<CudaDevice>, Error> {
        match &self.kind {
            Kind::Cuda(cuda) => Ok(cuda),
            Kind::Cpu => Err(Error::NotCuda {
                kernel: kernel.to_string(),
            }),
        }
    }
}

impl PartialEq for Device {
    /// Two handles are equal when they are the same device: both the CPU, or the same GPU.
    fn eq(&self, other: &Device) -> bool {
        match (&self.kind, &other.kind) {
            (Kind::Cpu, Kind::Cpu) => true,
            (Kind::Cuda(a), Kind::Cuda(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Device {}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

impl Default for Device {
    /// The CPU; use [`Device::detect`] to prefer a GPU.
    fn default() -> Device {
        Device::cpu()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_identity_and_names() {
        let cpu = Device::cpu();
        assert!(cpu.is_cpu() && !cpu.is_cuda());
        assert_eq!(cpu, Device::cpu().clone());
        assert_eq!(cpu.to_string(), "CPU");
        assert_eq!(format!("{cpu:?}"), "Device(CPU)");
        assert_eq!(cpu.compute_capability(), None);
        assert_eq!(cpu.ordinal(), None);
        cpu.synchronize().unwrap();
    }

    #[test]
    fn cuda_never_panics() {
        // Without a driver or a GPU this must be an error, never a panic; with one, device 0
        // opens and an absurd ordinal is `NoDevice`.
        match Device::cuda(0) {
            Ok(dev) => {
                assert!(dev.is_cuda());
                assert_eq!(dev, Device::cuda(0).unwrap());
                let err = Device::cuda(1 << 20).unwrap_err();
                assert!(
                    matches!(
                        err,
                        Error::NoDevice {
                            ordinal: 1_048_576,
                            ..
                        }
                    ),
                    "{err}"
                );
            }
            Err(err) => {
                let ok = matches!(
                    err,
                    Error::NoDriver { .. } | Error::NoDevice { .. } | Error::Cuda { .. }
                );
                assert!(ok, "{err}");
                assert!(Device::detect().is_cpu());
            }
        }
    }

    #[test]
    fn device_is_send_sync_and_cheap() {
        fn assert_send_sync<T: Send + Sync + Clone>() {}
        assert_send_sync::<Device>();
    }
}
