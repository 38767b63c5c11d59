//! Kernel launches: the grid, the argument slots, and the scratch memory of full reductions.

use std::fmt;

use cudarc::driver::{result, sys, CudaSlice, LaunchConfig};

use crate::device::Device;
use crate::error::driver_error;
use crate::error::Error;
use crate::grid::{column_parts, grid, param_array, Geometry, Slots, BLOCK, INLINE_SLOTS};
use crate::inline::Inline;
use crate::kernel::KernelInfo;
use crate::queue::Queue;
use crate::tensor::AnyBuffer;

/// One kernel argument, each passed in an 8-byte slot.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    /// A buffer the kernel reads, passed as its device address.
    Buffer(&'a dyn AnyBuffer),
    /// A buffer the kernel writes, passed as its device address.
    Output(&'a dyn AnyBuffer),
    /// A scalar: its bytes in the low bytes of the `u64` ([`Element::to_bits`](crate::Element)).
    Scalar(u64),
    /// The size of a named dim.
    Dim(usize),
}

impl fmt::Debug for Arg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Buffer(b) => write!(f, "Buffer({:?} on {})", b.shape(), b.device()),
            Arg::Output(b) => write!(f, "Output({:?} on {})", b.shape(), b.device()),
            Arg::Scalar(bits) => write!(f, "Scalar({bits:#x})"),
            Arg::Dim(n) => write!(f, "Dim({n})"),
        }
    }
}

/// Loads `kernel` on first use on `dev` (its embedded CUBIN for the device's architecture, else
/// the on-disk cache, else NVRTC; then the in-process cache) and launches it on `dev`'s
/// stream with `args`, in order. For [`Geometry::Full`] two more arguments follow: the scratch
/// (`unsigned long long*`, at least `slots * gridDim.x` slots) and the counter
/// (`unsigned int*`, zero before the launch; the kernel's last block resets it).
pub fn launch(
    dev: &Device,
    kernel: &'static KernelInfo,
    geometry: Geometry,
    args: &[Arg],
) -> Result<(), Error> {
    launch_with(dev, kernel, None, geometry, args, enqueue)
}

/// [`launch`] for a row kernel with an entry point for long rows (`long_rows`, in the same
/// module): rows past the register cache take it, with their rows in dynamic shared memory,
/// where the device has the memory; other rows, and long rows on other devices, take `kernel`.
pub fn launch_long_rows(
    dev: &Device,
    kernel: &'static KernelInfo,
    long_rows: &'static KernelInfo,
    geometry: Geometry,
    args: &[Arg],
) -> Result<(), Error> {
    launch_with(dev, kernel, Some(long_rows), geometry, args, enqueue)
}

/// [`launch`] or [`launch_long_rows`] (`long_rows`) with `submit` in place of the call that
/// queues the kernel: `submit` is given the stream, the function, the launch shape and every
/// argument slot (the scratch's included). The benchmark's hooks ([`crate::private::floors`])
/// pass one that does not call the driver, to time fuse's host code alone.
pub(crate) fn launch_with(
    dev: &Device,
    kernel: &'static KernelInfo,
    long_rows: Option<&'static KernelInfo>,
    geometry: Geometry,
    args: &[Arg],
    submit: impl FnOnce(&Queue, sys::CUfunction, LaunchConfig, &mut [u64]) -> Result<(), Error>,
) -> Result<(), Error> {
    let queue = dev.queue(kernel.name)?;
    let scratch_slots = match geometry {
        Geometry::Full { .. } | Geometry::Columns { .. } => 2,
        Geometry::Map { .. } | Geometry::Rows { .. } => 0,
    };
    let mut slots = Slots::new(0, args.len() + scratch_slots);
    let slots = slots.as_mut_slice();
    arg_slots(dev, kernel, args, &mut slots[..args.len()])?;
    let mut buffers = Inline::<BufferSlot, INLINE_SLOTS>::new(BufferSlot::NONE, args.len());
    for ((at, arg), buffer) in args.iter().enumerate().zip(buffers.as_mut_slice()) {
        if let Arg::Buffer(b) | Arg::Output(b) = arg {
            *buffer = BufferSlot {
                slot: at,
                bytes: b.bytes(),
                output: matches!(arg, Arg::Output(_)),
            };
        }
    }
    let buffers = buffers.as_slice();
    if let Some(long_rows) = long_rows {
        let unused = |_: &Queue, _, _, _: &mut [u64]| Ok(());
        if launch_entry(queue, long_rows, geometry, slots, buffers, true, 0, unused)? {
            return Ok(());
        }
    }
    launch_entry(queue, kernel, geometry, slots, buffers, false, 0, submit).map(|_| ())
}

/// A slot that holds a buffer's address: its bytes, and whether the kernel writes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BufferSlot {
    pub(crate) slot: usize,
    pub(crate) bytes: usize,
    pub(crate) output: bool,
}

impl BufferSlot {
    /// No buffer: a slot past every argument.
    pub(crate) const NONE: BufferSlot = BufferSlot {
        slot: usize::MAX,
        bytes: 0,
        output: false,
    };
}

/// Launches entry `kernel` with `geometry` and the argument `slots` (the scratch's last two for
/// a full reduction, which this fills), `buffers` saying which slots hold buffers. A long-row
/// entry (`long_rows`) launches only where the device can run it: otherwise nothing is queued
/// and `Ok(false)` says to take the next entry; every other launch calls `submit` with the
/// stream, function, shape and slots (or launches nothing when the work is empty) and gives
/// `Ok(true)`. An entry that sums over rows (`sums`, its `Grid::sums`, not 0) is a cooperative
/// launch of at most the blocks the device holds at once, given its rows of partial sums and
/// its barrier's two counters in the scratch; `submit` does not see it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_entry(
    queue: &Queue,
    kernel: &'static KernelInfo,
    geometry: Geometry,
    slots: &mut [u64],
    buffers: &[BufferSlot],
    long_rows: bool,
    sums: u32,
    submit: impl FnOnce(&Queue, sys::CUfunction, LaunchConfig, &mut [u64]) -> Result<(), Error>,
) -> Result<bool, Error> {
    let Some(mut grid) = grid(geometry, queue.cuda.sm_count, queue.cuda.capability.0) else {
        return Ok(!long_rows || !crate::long_rows::taken(geometry));
    };
    let launch = match long_rows {
        true => {
            // Long rows take their own launch (clusters, dynamic shared memory), which needs
            // the function's attributes: the locked lookup, once per such call.
            let function = queue.cuda.function(kernel, || queue.capturing())?;
            match crate::long_rows::prepare(queue.cuda.long_rows(), &function, geometry, sums) {
                Some(launch) => Launch::Long(function, launch),
                None => return Ok(false),
            }
        }
        false => Launch::Plain(queue.cuda.function_handle(kernel, || queue.capturing())?),
    };
    // A full reduction's partials, a slot set a block, and its counter; a column reduction's,
    // a slot set a column of each part, and a counter a tile.
    let scratch = match geometry {
        Geometry::Full { slots, .. } => {
            Some(((slots.max(1) as usize).saturating_mul(grid as usize), 1))
        }
        // A tile in one part uses neither (the kernel still takes the two pointers), so an
        // unsplit column sum of many columns needs no scratch to grow inside a capture.
        Geometry::Columns { groups, slots, .. } => {
            match column_parts(geometry, queue.cuda.sm_count) {
                (_, 1) => Some((0, 1)),
                (tiles, parts) => {
                    let per_part = (slots.max(1) as u64).saturating_mul(groups);
                    let needed = per_part.saturating_mul(parts);
                    let tiles = usize::try_from(tiles).unwrap_or(usize::MAX);
                    Some((usize::try_from(needed).unwrap_or(usize::MAX), tiles))
                }
            }
        }
        // Sums over rows: a row of partial sums a block (or a cluster), `sums` bytes a column,
        // and the two counters of the barrier before the blocks sum them. Every block is
        // resident: as many as the device holds at once, at most.
        Geometry::Rows { row_len, .. } if sums > 0 => {
            grid = match &launch {
                Launch::Long(_, launch) => launch.blocks(),
                &Launch::Plain(function) => grid.min(queue.cuda.resident_blocks(kernel, function)?),
            };
            let bytes = u64::from(grid)
                .saturating_mul(row_len.max(1))
                .saturating_mul(u64::from(sums));
            let needed = usize::try_from(bytes.div_ceil(8)).unwrap_or(usize::MAX);
            Some((needed, 2))
        }
        Geometry::Map { .. } | Geometry::Rows { .. } => None,
    };
    if let Some((needed, counters)) = scratch {
        let (scratch_address, counter_address) = queue.scratch(needed, counters)?;
        if let [.., scratch_slot, counter_slot] = &mut *slots {
            (*scratch_slot, *counter_slot) = (scratch_address, counter_address);
        }
    }
    // Memory from outside fuse may start anywhere; the kernels' vector loads need 16 bytes.
    let misaligned = |b: &BufferSlot| {
        slots
            .get(b.slot)
            .is_some_and(|&address| !address.is_multiple_of(ALIGN))
    };
    let staged = match buffers.iter().any(misaligned) {
        true => Some(Staged::new(queue, buffers, slots)?),
        false => None,
    };
    match launch {
        Launch::Long(function, launch) => launch.enqueue(
            queue.cuda.long_rows(),
            queue.cu_stream(),
            &function,
            slots,
            sums > 0,
        )?,
        Launch::Plain(function) if sums > 0 => {
            let gpu = queue.cuda.long_rows();
            crate::long_rows::enqueue_cooperative(gpu, queue.cu_stream(), function, slots, grid)?;
        }
        Launch::Plain(function) => {
            let config = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            submit(queue, function, config, slots)?;
        }
    }
    staged.map_or(Ok(()), |staged| staged.finish(queue))?;
    Ok(true)
}

/// How an entry launches: long rows with their clusters and dynamic shared memory, or a plain
/// grid of the function's handle.
enum Launch {
    Long(cudarc::driver::CudaFunction, crate::long_rows::LongLaunch),
    Plain(sys::CUfunction),
}

/// The alignment of every buffer address a kernel is given: its widest vector loads and stores
/// (16 bytes) and bulk copies need it.
const ALIGN: u64 = fuse_macros::__abi!(ALIGN) as u64;

/// The aligned copies of a launch's misaligned buffers: each is copied into a new allocation on
/// the stream before the kernel (inputs) or back out of it after (outputs), so that every
/// kernel path runs on aligned memory. All of it is queued on the stream, with no host
/// synchronization, and works inside a CUDA graph capture.
struct Staged {
    copies: Vec<StagedCopy>,
}

/// One misaligned buffer's aligned copy.
struct StagedCopy {
    aligned: CudaSlice<u8>,
    /// For an output, the caller's address and bytes, which the copy goes back to.
    back_to: Option<(u64, usize)>,
}

impl Staged {
    fn new(queue: &Queue, buffers: &[BufferSlot], slots: &mut [u64]) -> Result<Staged, Error> {
        let mut copies = Vec::new();
        for buffer in buffers {
            let Some(slot) = slots.get_mut(buffer.slot) else {
                continue;
            };
            if slot.is_multiple_of(ALIGN) {
                continue;
            }
            let bytes = buffer.bytes;
            let copy = queue.uninit::<u8>(bytes)?;
            let address = cudarc::driver::DevicePtr::device_ptr(&copy, &queue.stream).0;
            let back_to = match buffer.output {
                true => Some((*slot, bytes)),
                false => {
                    // SAFETY: `*slot` is the address of a live buffer of this device holding
                    // `bytes` bytes (checked by `arg_slots` or `Program::slots`, and the buffer's
                    // constructor), the copy a new allocation of as many; both outlive the copy
                    // in stream order.
                    unsafe { queue.copy(address, *slot, bytes)? };
                    None
                }
            };
            *slot = address;
            copies.push(StagedCopy {
                aligned: copy,
                back_to,
            });
        }
        Ok(Staged { copies })
    }

    /// Queues the copies of the outputs back to the caller's memory; the aligned copies are
    /// freed in stream order, after the kernel and those copies.
    fn finish(self, queue: &Queue) -> Result<(), Error> {
        for copy in &self.copies {
            if let Some((address, bytes)) = copy.back_to {
                let from = cudarc::driver::DevicePtr::device_ptr(&copy.aligned, &queue.stream).0;
                // SAFETY: as in `Staged::new`, with the roles swapped: the caller's output
                // holds `bytes` bytes, and so does its aligned copy.
                unsafe { queue.copy(address, from, bytes)? };
            }
        }
        Ok(())
    }
}

/// Writes the 8-byte slot of each argument into `slots`, checking that buffers live on `dev`.
fn arg_slots(
    dev: &Device,
    kernel: &KernelInfo,
    args: &[Arg],
    slots: &mut [u64],
) -> Result<(), Error> {
    for (position, (arg, slot)) in args.iter().zip(slots).enumerate() {
        *slot = match *arg {
            Arg::Buffer(buffer) | Arg::Output(buffer) => match buffer.device_address() {
                Some(address) if buffer.device() == dev => address,
                _ => {
                    return Err(Error::DeviceMismatch {
                        kernel: kernel.name.to_string(),
                        param: format!("argument {position}"),
                        expected: dev.name(),
                        found: buffer.device().name(),
                    })
                }
            },
            Arg::Scalar(bits) => bits,
            Arg::Dim(size) => size as u64,
        };
    }
    Ok(())
}

/// Queues `function` with one `cuLaunchKernel`: its parameter array, the address of each slot,
/// is built on the stack, so a launch allocates nothing.
pub(crate) fn enqueue(
    queue: &Queue,
    function: sys::CUfunction,
    config: LaunchConfig,
    slots: &mut [u64],
) -> Result<(), Error> {
    let mut params = param_array(slots);
    let params = params.as_mut_slice();
    queue.cuda.bind()?;
    // SAFETY: the `fuse!` macro generated both the kernel's CUDA signature and this argument
    // list from one parsed signature: every parameter is an 8-byte pointer, or a scalar of at
    // most 8 bytes that the driver reads from the low (little-endian) bytes of its slot, and the
    // reduction scratch and counter come last exactly when the geometry is `Full`, so `params`
    // has one entry per parameter. Each entry is the address of its slot in `slots`, which
    // outlives this call; the driver copies the arguments before `cuLaunchKernel` returns.
    // Pointers are the addresses of live allocations on this device (checked in `arg_slots`),
    // kept alive by the caller's borrows until the launch is queued and, after that, freed only
    // in stream order. Outputs were sized by `bind` and `shape_of`, the sizes the kernel is
    // given. The function was loaded in this device's context, bound to this thread above, and
    // its module stays loaded as long as the device (`function_handle`); the stream is that
    // context's.
    let launched = unsafe {
        result::launch_kernel(
            function,
            config.grid_dim,
            config.block_dim,
            config.shared_mem_bytes,
            queue.cu_stream(),
            params,
        )
    };
    launched.map_err(|e| driver_error("cuLaunchKernel", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_debug() {
        assert_eq!(
            format!("{:?}", Arg::Scalar(0x3f80_0000)),
            "Scalar(0x3f800000)"
        );
        assert_eq!(format!("{:?}", Arg::Dim(7)), "Dim(7)");
    }
}
