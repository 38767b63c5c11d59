//! [`Device`]: where buffers live and kernels run.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::cache::Origin;
use cudarc::driver::{sys, CudaStream};

use crate::cuda::CudaDevice;
use crate::error::Error;
use crate::error::{driver_error, lock};
use crate::kernel::KernelInfo;
use crate::queue::Queue;

/// The CUDA devices opened so far, by ordinal, each with the stream `Device::cuda` queues on:
/// one shared instance each per process, so that buffers from two `Device::cuda(0)` calls work
/// together.
static OPEN: Mutex<Vec<(usize, Arc<Queue>)>> = Mutex::new(Vec::new());

/// A place where buffers live and kernels run: the CPU, or one CUDA GPU and one of its streams.
///
/// Cloning is cheap (a reference count). On a CUDA device all work of a handle goes, in order,
/// to its stream: launches return before the kernel has run, and [`Buffer::to_vec`](crate::Buffer::to_vec) waits for
/// it. [`Device::cuda`] queues on a stream fuse creates for the GPU (never the legacy default
/// stream); [`Device::from_cuda_stream`] and [`Device::new_stream`] give handles on other
/// streams of the same GPU. Handles of one GPU compare equal and share buffers and loaded
/// kernels, whatever their streams; ordering work between two streams is the caller's (events,
/// or [`Device::synchronize`]).
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
    Cuda(Arc<Queue>),
}

impl Device {
    /// The CPU: kernels run as the Rust code the `fuse!` macro generated.
    pub fn cpu() -> Device {
        Device { kind: Kind::Cpu }
    }

    /// CUDA device `ordinal`, opened on first use and shared afterwards.
    ///
    /// Opening a device keeps the memory freed buffers give back in the device's default memory
    /// pool for later allocations, as PyTorch's caching allocator does, where the driver's
    /// default returns it to the system at each synchronization; a release threshold that
    /// other code already set on that pool is left alone. An allocation or a kernel's first load
    /// that finds the GPU full has the pool give back the memory it keeps unused, and tries once
    /// more; one that still fails is an error ([`Error::OutOfMemory`] for an allocation), and
    /// the device, its streams and its buffers stay usable.
    ///
    /// Fails with [`Error::NoDriver`] when the CUDA driver library cannot be loaded, with
    /// [`Error::DriverTooOld`] when it is older than CUDA 12.0's, and with [`Error::NoDevice`]
    /// when there is no device `ordinal`; never panics.
    pub fn cuda(ordinal: usize) -> Result<Device, Error> {
        Ok(Device {
            kind: Kind::Cuda(open_queue(ordinal)?),
        })
    }

    /// The number of CUDA devices, for [`Device::cuda`]`(0..n)`; 0 without a driver.
    pub fn cuda_count() -> usize {
        crate::cuda::device_count().unwrap_or(0)
    }

    /// A handle on the GPU of `stream` that queues all its work on `stream`, a cudarc stream
    /// the caller owns: launches, copies, and the allocations of outputs and scratch. Kernels
    /// then run in order with the caller's own work on that stream, with no synchronization.
    ///
    /// The stream must belong to the device's primary context (cudarc's
    /// [`CudaContext::new`](cudarc::driver::CudaContext::new) retains it, as candle and CubeCL
    /// do); another context is an [`Error::Interop`].
    ///
    /// ```no_run
    /// use fuse_runtime::{cudarc::driver::CudaContext, Device};
    /// let ctx = CudaContext::new(0).unwrap();
    /// let stream = ctx.new_stream().unwrap();
    /// let dev = Device::from_cuda_stream(stream.clone())?;
    /// assert_eq!(dev.cuda_stream(), Some(&stream));
    /// # Ok::<(), fuse_runtime::Error>(())
    /// ```
    pub fn from_cuda_stream(stream: Arc<CudaStream>) -> Result<Device, Error> {
        let cuda = open_queue(stream.context().ordinal())?.cuda.clone();
        if stream.context().cu_ctx() != cuda.ctx.cu_ctx() {
            return Err(Error::Interop {
                op: "Device::from_cuda_stream",
                param: "stream",
                expected: format!("a stream of the primary context of {}", cuda.describe()),
                found: "a stream of another context".to_string(),
            });
        }
        Ok(Device {
            kind: Kind::Cuda(Arc::new(Queue::new(cuda, stream))),
        })
    }

    /// A handle on this GPU that queues its work on `stream`, a raw `CUstream` created by
    /// other code (a framework that hands out only the handle).
    ///
    /// # Safety
    /// - `stream` is a live stream of this GPU's primary context (checked: another context is
    ///   an [`Error::Interop`]), or null for the legacy default stream.
    /// - It stays alive as long as the returned handle and everything made from it (buffers
    ///   allocated through it are freed on it), and the caller does not destroy it before.
    /// - Ordering fuse's work with work that other code queues elsewhere is the caller's.
    pub unsafe fn with_raw_stream(&self, stream: sys::CUstream) -> Result<Device, Error> {
        let queue = self.queue("Device::with_raw_stream")?;
        let cuda = queue.cuda.clone();
        cuda.bind()?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the caller promises `stream` is a live stream; the driver writes its context.
        unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }
            .result()
            .map_err(|e| driver_error("cuStreamGetCtx", e))?;
        if ctx != cuda.ctx.cu_ctx() {
            return Err(Error::Interop {
                op: "Device::with_raw_stream",
                param: "stream",
                expected: format!("a stream of the primary context of {}", cuda.describe()),
                found: "a stream of another context".to_string(),
            });
        }
        // SAFETY: the stream belongs to this context (checked), and the caller keeps it alive
        // and orders work with it, as this function's contract says.
        let stream = unsafe { cuda.ctx.wrap_borrowed_stream(stream) };
        Ok(Device {
            kind: Kind::Cuda(Arc::new(Queue::new(cuda, stream))),
        })
    }

    /// A handle on the same GPU with a new stream of its own, which runs concurrently with this
    /// handle's (a non-blocking stream, as cudarc creates them); the CPU gives the CPU. Buffers
    /// and loaded kernels are shared; the order of work between the two streams is the
    /// caller's, as with any two streams.
    pub fn new_stream(&self) -> Result<Device, Error> {
        match &self.kind {
            Kind::Cpu => Ok(Device::cpu()),
            Kind::Cuda(queue) => {
                let cuda = queue.cuda.clone();
                let stream = cuda
                    .ctx
                    .new_stream()
                    .map_err(|e| driver_error("cuStreamCreate", e))?;
                Ok(Device {
                    kind: Kind::Cuda(Arc::new(Queue::new(cuda, stream))),
                })
            }
        }
    }

    /// The cudarc stream this handle queues on, or `None` for the CPU: pass it to cudarc (a
    /// launch, a copy, a graph capture, NCCL) to order that work with fuse's.
    pub fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        match &self.kind {
            Kind::Cpu => None,
            Kind::Cuda(queue) => Some(&queue.stream),
        }
    }

    /// Whether `other` queues on the same stream (both the CPU counts as the same).
    pub fn same_stream(&self, other: &Device) -> bool {
        match (&self.kind, &other.kind) {
            (Kind::Cpu, Kind::Cpu) => true,
            (Kind::Cuda(a), Kind::Cuda(b)) => a.stream.cu_stream() == b.stream.cu_stream(),
            _ => false,
        }
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
            Kind::Cuda(queue) => Some(queue.cuda.ordinal),
        }
    }

    /// What this device is, such as `CUDA device 0: NVIDIA H100 80GB HBM3 (sm_90)` or `CPU`.
    pub fn name(&self) -> String {
        match &self.kind {
            Kind::Cpu => "CPU".to_string(),
            Kind::Cuda(queue) => queue.cuda.describe(),
        }
    }

    /// The CUDA compute capability as (major, minor), such as `(9, 0)`; `None` for the CPU.
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        match &self.kind {
            Kind::Cpu => None,
            Kind::Cuda(queue) => Some(queue.cuda.capability),
        }
    }

    /// Waits until all work submitted to this handle's stream has finished, and reports any
    /// error it raised. Does nothing on the CPU.
    pub fn synchronize(&self) -> Result<(), Error> {
        match &self.kind {
            Kind::Cpu => Ok(()),
            Kind::Cuda(queue) => queue.synchronize(),
        }
    }

    /// Loads `kernel` on this device now (its embedded CUBIN, the disk cache or NVRTC), as its
    /// first call would, with every other entry point of its `fn` (each path of its launch is a
    /// module of its own), and readies the scratch of reductions on this handle's stream:
    /// what a CUDA graph capture must find done. Generated code calls it as `name::load(&dev)`.
    /// Does nothing on the CPU.
    pub fn load(&self, kernel: &'static KernelInfo) -> Result<(), Error> {
        match &self.kind {
            Kind::Cpu => Ok(()),
            Kind::Cuda(queue) => {
                queue.cuda.function(kernel, || queue.capturing())?;
                for entry in crate::kernel::family(kernel).unwrap_or_default() {
                    queue.cuda.function(entry, || queue.capturing())?;
                }
                queue.scratch(0, 1).map(drop)
            }
        }
    }

    /// Where the CUBIN of `kernel` came from on this device: embedded at build time
    /// (`FUSE_CUBIN_ARCHS`), the disk cache, or NVRTC; `None` before its first launch here, and
    /// on the CPU. For an entry point of a `fuse!` kernel (such as [`kernels`](crate::kernels)
    /// lists), the first of its `fn`'s entry points loaded here: a call loads only the one it
    /// takes.
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
            Kind::Cuda(queue) => queue.cuda.origin(kernel),
        }
    }

    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The CUDA stream and device, or [`Error::NotCuda`] naming `kernel`.
    pub(crate) fn queue(&self, kernel: &str) -> Result<&Arc<Queue>, Error> {
        match &self.kind {
            Kind::Cuda(queue) => Ok(queue),
            Kind::Cpu => Err(Error::NotCuda {
                kernel: kernel.to_string(),
            }),
        }
    }
}

/// The queue `Device::cuda(ordinal)` gives: device `ordinal` and the stream fuse created for it,
/// opened on first use and shared afterwards.
fn open_queue(ordinal: usize) -> Result<Arc<Queue>, Error> {
    let mut open = lock(&OPEN);
    if let Some((_, queue)) = open.iter().find(|(n, _)| *n == ordinal) {
        return Ok(queue.clone());
    }
    // Opening under the lock makes concurrent first calls share one instance.
    let cuda = Arc::new(CudaDevice::open(ordinal)?);
    let stream = cuda
        .ctx
        .new_stream()
        .map_err(|e| driver_error("cuStreamCreate", e))?;
    let queue = Arc::new(Queue::new(cuda, stream));
    open.push((ordinal, queue.clone()));
    Ok(queue)
}

impl PartialEq for Device {
    /// Two handles are equal when they are the same device: both the CPU, or the same GPU,
    /// whatever their streams ([`Device::same_stream`] tells those apart).
    fn eq(&self, other: &Device) -> bool {
        match (&self.kind, &other.kind) {
            (Kind::Cpu, Kind::Cpu) => true,
            (Kind::Cuda(a), Kind::Cuda(b)) => Arc::ptr_eq(&a.cuda, &b.cuda),
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
                    Error::NoDriver { .. }
                        | Error::DriverTooOld { .. }
                        | Error::NoDevice { .. }
                        | Error::Cuda { .. }
                );
                assert!(ok, "{err}");
                assert!(Device::detect().is_cpu());
            }
        }
    }

    #[test]
    fn no_driver_names_the_library_and_the_fix() {
        if crate::cuda::driver_present() {
            eprintln!("skipping: this machine has a CUDA driver library");
            return;
        }
        let err = Device::cuda(0).unwrap_err();
        let searched = crate::cuda::driver_candidates();
        assert_eq!(
            err,
            Error::NoDriver {
                searched: searched.clone()
            }
        );
        let text = err.to_string();
        assert!(text.starts_with("no CUDA driver: could not load the `cuda` library"));
        assert!(text.contains(&searched[0]), "{text}");
        assert!(text.contains("install the NVIDIA driver"), "{text}");
        assert_eq!(Device::cuda_count(), 0);
        assert!(Device::detect().is_cpu());
    }

    #[test]
    fn device_is_send_sync_and_cheap() {
        fn assert_send_sync<T: Send + Sync + Clone>() {}
        assert_send_sync::<Device>();
    }
}
