//! One stream of a CUDA device: where a [`Device`](crate::Device) handle queues its work, with the
//! memory operations that go through it and the scratch of the full reductions queued on it.
//!
//! A device opened with [`Device::cuda`](crate::Device::cuda) has one queue on a stream fuse
//! created (never the legacy default stream); handles made from a caller's stream
//! ([`Device::from_cuda_stream`](crate::Device::from_cuda_stream)) or with
//! [`Device::new_stream`](crate::Device::new_stream) have a queue each. Work queued on one queue
//! runs in order; queues of one GPU run concurrently.

use std::sync::{Arc, Mutex};

use cudarc::driver::{
    result::DriverError, sys, CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits,
};

use crate::cuda::CudaDevice;
use crate::error::Error;
use crate::error::{driver_error, lock};

/// A CUDA stream of one device, shared by the [`Device`](crate::Device) handles made from it.
pub(crate) struct Queue {
    pub(crate) cuda: Arc<CudaDevice>,
    pub(crate) stream: Arc<CudaStream>,
    /// The scratch and counter of the full reductions queued here: one per stream, so that
    /// reductions on two streams never share them.
    pub(crate) reduce: Mutex<ReduceScratch>,
}

impl Queue {
    pub(crate) fn new(cuda: Arc<CudaDevice>, stream: Arc<CudaStream>) -> Queue {
        Queue {
            cuda,
            stream,
            reduce: Mutex::default(),
        }
    }

    /// The raw stream, for driver calls.
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Whether the stream is capturing a CUDA graph, where nothing may synchronize, compile or
    /// load a module.
    pub(crate) fn capturing(&self) -> Result<bool, Error> {
        let status = self
            .stream
            .capture_status()
            .map_err(|e| driver_error("cuStreamIsCapturing", e))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Waits for all work queued on this stream.
    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        self.cuda.bind()?;
        self.stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    /// Allocates `len` zeroed elements (at least one, since the driver rejects empty
    /// allocations; callers keep the logical length).
    pub(crate) fn zeros<R: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<R>, Error> {
        let len = len.max(1);
        self.allocate(len, || self.stream.alloc_zeros::<R>(len))
    }

    /// Allocates `len` elements whose contents are unspecified (at least one element).
    pub(crate) fn uninit<R: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<R>, Error> {
        let len = len.max(1);
        // SAFETY: the memory is device memory, never read as Rust values in place. Reads copy
        // it to the host as `R`, which is an element's `Repr` or a scratch integer: plain
        // numbers (and `u8` for `bool`) for which every bit pattern is a valid value. Kernels
        // write their outputs before anything reads them.
        self.allocate(len, || unsafe { self.stream.alloc::<R>(len) })
    }

    /// Runs `alloc` for `len` elements of `R`; when it finds the device out of memory, gives the
    /// memory the pool keeps back to the driver and tries once more. An allocation that still
    /// fails is [`Error::OutOfMemory`], and nothing is left half done: the stream and the
    /// buffers already allocated stay usable.
    fn allocate<R>(
        &self,
        len: usize,
        alloc: impl Fn() -> Result<CudaSlice<R>, DriverError>,
    ) -> Result<CudaSlice<R>, Error> {
        let first = alloc();
        let out_of_memory =
            matches!(&first, Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let result = match out_of_memory && self.release_memory() {
            true => alloc(),
            false => first,
        };
        result.map_err(|e| self.alloc_error::<R>(len, e))
    }

    /// After an allocation found no memory: waits for this stream's work, so that what it freed
    /// counts as free, and has the device's pool give its unused memory back (see
    /// [`CudaDevice::release_pool_memory`]). Whether that was done; never while the stream
    /// captures a graph, which a wait would break.
    fn release_memory(&self) -> bool {
        !self.capturing().unwrap_or(true)
            && self.synchronize().is_ok()
            && self.cuda.release_pool_memory()
    }

    /// Copies `data` into a new allocation.
    pub(crate) fn upload<R: DeviceRepr + ValidAsZeroBits>(
        &self,
        data: &[R],
    ) -> Result<CudaSlice<R>, Error> {
        let slice = self.uninit::<R>(data.len())?;
        let address = slice.device_ptr(&self.stream).0;
        // SAFETY: `slice` was just allocated with room for `data.len()` elements of `R`.
        unsafe { self.write(address, data)? };
        Ok(slice)
    }

    /// Overwrites `data.len()` elements of `R` at `address`, after all queued work, and waits.
    ///
    /// # Safety
    /// `address` must be device memory of this context with room for `data.len()` elements of
    /// `R`, live until this returns.
    pub(crate) unsafe fn write<R: DeviceRepr>(
        &self,
        address: u64,
        data: &[R],
    ) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        self.cuda.bind()?;
        // SAFETY: the caller's contract bounds the copy; it is queued on this stream after every
        // kernel queued before, and we synchronize before returning, so `data` outlives it.
        let copy =
            unsafe { cudarc::driver::result::memcpy_htod_async(address, data, self.cu_stream()) };
        copy.map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        self.synchronize()
    }

    /// Copies `len` elements of `R` at `address` to the host, after all queued work.
    ///
    /// # Safety
    /// `address` must be device memory of this context holding `len` elements of `R`, live
    /// until this returns.
    pub(crate) unsafe fn read<R: DeviceRepr + ValidAsZeroBits + Default + Clone>(
        &self,
        address: u64,
        len: usize,
    ) -> Result<Vec<R>, Error> {
        let mut data = vec![R::default(); len];
        if len > 0 {
            self.cuda.bind()?;
            // SAFETY: the caller's contract bounds the copy; `data` has room for `len` elements
            // and we synchronize before it is read or dropped.
            let copy = unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut data, address, self.cu_stream())
            };
            copy.map_err(|e| driver_error("cuMemcpyDtoHAsync", e))?;
        }
        // This also surfaces any error of a kernel queued before.
        self.synchronize()?;
        Ok(data)
    }

    /// Queues a copy of `bytes` bytes from `src` to `dst`, both on this device.
    ///
    /// # Safety
    /// Both ranges must be device memory of this context, live until the copy has run in stream
    /// order, and must not overlap.
    pub(crate) unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), Error> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        self.cuda.bind()?;
        // SAFETY: the caller's contract.
        let copied =
            unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.cu_stream()) };
        copied.map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    }

    fn alloc_error<R>(&self, len: usize, e: DriverError) -> Error {
        match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory {
                bytes: len.saturating_mul(std::mem::size_of::<R>()),
                device: self.cuda.describe(),
            },
            _ => driver_error("cuMemAlloc", e),
        }
    }

    /// The device addresses of at least `needed` scratch slots and of `counters` zeroed
    /// counters for a full reduction (one counter) or a column reduction (one a tile) queued
    /// here; see [`ReduceScratch`].
    pub(crate) fn scratch(&self, needed: usize, counters: usize) -> Result<(u64, u64), Error> {
        let mut scratch = lock(&self.reduce);
        if let Some(addresses) = scratch.fits(needed, counters) {
            return Ok(addresses);
        }
        if self.capturing()? {
            return Err(Error::Capture {
                detail: format!(
                    "a reduction needs {needed} scratch slots and {counters} counters on this \
                     stream, more than it has; run the kernel once on this device handle before \
                     the capture"
                ),
            });
        }
        scratch.grow(self, needed, counters)
    }
}

/// The scratch and counters of the full and column reductions of one stream.
///
/// Allocations are kept for as long as the queue: a CUDA graph captured on the stream holds
/// their addresses, so a scratch that grows keeps its old allocation too. The counters are zero
/// between launches (each kernel's last block, or each tile's, resets its own), so replays of a
/// graph find them so.
#[derive(Default)]
pub(crate) struct ReduceScratch {
    slots: Option<(CudaSlice<u64>, u64)>,
    counters: Option<(CudaSlice<u32>, u64)>,
    /// Scratch and counters outgrown, kept for graphs that were captured with them.
    retired: Vec<CudaSlice<u64>>,
    retired_counters: Vec<CudaSlice<u32>>,
}

/// The scratch slots a queue allocates at least: a few kernels' worth on any GPU of today, so
/// that it rarely grows (and never inside a capture, for the kernels of the tests).
const MIN_SLOTS: usize = 1 << 14;

/// The counters a queue allocates at least: a column reduction's tiles of 32 columns, for up to
/// 32768 columns.
const MIN_COUNTERS: usize = 1 << 10;

impl ReduceScratch {
    fn fits(&self, needed: usize, counters: usize) -> Option<(u64, u64)> {
        match (&self.slots, &self.counters) {
            (Some((slots, a)), Some((c, b))) if slots.len() >= needed && c.len() >= counters => {
                Some((*a, *b))
            }
            _ => None,
        }
    }

    fn grow(&mut self, queue: &Queue, needed: usize, counters: usize) -> Result<(u64, u64), Error> {
        if self
            .counters
            .as_ref()
            .is_none_or(|(c, _)| c.len() < counters)
        {
            let fresh = queue.zeros::<u32>(counters.max(MIN_COUNTERS).next_power_of_two())?;
            let address = fresh.device_ptr(&queue.stream).0;
            if let Some((old, _)) = self.counters.replace((fresh, address)) {
                self.retired_counters.push(old);
            }
        }
        if self.slots.as_ref().is_none_or(|(s, _)| s.len() < needed) {
            let slots = queue.uninit::<u64>(needed.max(MIN_SLOTS).next_power_of_two())?;
            let address = slots.device_ptr(&queue.stream).0;
            if let Some((old, _)) = self.slots.replace((slots, address)) {
                self.retired.push(old);
            }
        }
        self.fits(needed, counters).ok_or_else(|| Error::Internal {
            detail: format!("a reduction scratch of {needed} slots and {counters} counters"),
        })
    }
}
