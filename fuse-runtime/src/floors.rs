//! Hooks for the benchmark's launch-overhead rows (T1): one kernel launched with less and less
//! of fuse in the way, so that the time of a call splits into fuse's host code, cudarc's launch
//! builder, the driver's `cuLaunchKernel` and the GPU. For measuring only.
//!
//! - [`host_only`]: [`launch`](crate::__private::launch) up to, not including, the driver call;
//!   [`host_only_into`]: the same for the whole generated `into` of a map kernel.
//! - [`Prebuilt::launch_builder`]: the loaded function through cudarc's launch builder, with the
//!   argument slots packed once.
//! - [`Prebuilt::launch_raw`]: `cuLaunchKernel` itself, with a parameter array built once.
//! - [`EMPTY`]: a kernel that does nothing, with the parameters of a one-input map kernel, so
//!   that its raw launch differs from the real kernel's only in what the GPU runs.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, LaunchConfig, PushKernelArg};

use crate::device::Device;
use crate::error::driver_error;
use crate::error::Error;
use crate::grid::Geometry;
use crate::kernel::KernelInfo;
use crate::launch::{launch_with, Arg};
use crate::private::{bind, is_cpu};
use crate::program::{launch_program_with, Program};
use crate::queue::Queue;
use crate::tensor::AnyBuffer;

/// A kernel with an empty body and the parameters of a map with one input, one output and one
/// dim (`x`, `out`, `n`), as W1's: launch it with the same arguments and geometry.
pub static EMPTY: KernelInfo = KernelInfo {
    name: "empty",
    symbol: "fuse_empty",
    source: "// Does nothing: the launch-overhead floor of the benchmark.\n\
             extern \"C\" __global__ void __launch_bounds__(256) fuse_empty(\n    \
             const float* x, float* out, long long n) {}\n",
    cubins: &[],
};

/// Does what [`launch`](crate::__private::launch) does for `kernel`, except queueing it: checks
/// the arguments and packs their slots, sizes the grid and finds the loaded function (loading it
/// on first use), then returns. Nothing runs on the GPU.
pub fn host_only(
    dev: &Device,
    kernel: &'static KernelInfo,
    geometry: Geometry,
    args: &[Arg],
) -> Result<(), Error> {
    launch_with(
        dev,
        kernel,
        None,
        geometry,
        args,
        |_, function, config, slots| {
            std::hint::black_box((function, config, slots));
            Ok(())
        },
    )
}

/// What the generated `into` of a map kernel with one input and one output (such as W1's) does,
/// with the driver call left out: the host's whole share of a call, less the driver's. It
/// follows `module_items` in `fuse-macros/src/expand.rs`; keep the two alike.
pub fn host_only_into(
    dev: &Device,
    program: &'static Program,
    x: &dyn AnyBuffer,
    out: &dyn AnyBuffer,
) -> Result<(), Error> {
    let tensors = [x, out];
    let dims = bind(program.signature, dev, &tensors)?;
    if is_cpu(dev) {
        return Ok(());
    }
    launch_program_with(
        dev,
        program,
        &dims,
        &tensors,
        &[],
        |_, function, config, slots| {
            std::hint::black_box((function, config, slots));
            Ok(())
        },
    )
}

/// One launch of a kernel, resolved once: its function, grid and argument slots, to launch
/// again and again without fuse's per-call work. It borrows the buffers it was built with, so
/// they outlive every launch.
pub struct Prebuilt<'a> {
    queue: Arc<Queue>,
    function: CudaFunction,
    config: LaunchConfig,
    slots: Box<[u64]>,
    /// The address of each slot, as `cuLaunchKernel` takes them.
    params: Box<[*mut c_void]>,
    buffers: PhantomData<&'a ()>,
}

impl<'a> Prebuilt<'a> {
    /// Resolves the launch that [`launch`](crate::__private::launch) would queue for these
    /// arguments, loading the kernel on first use, and binds the device's context to the
    /// calling thread (where [`launch_raw`](Prebuilt::launch_raw) must then run). Map and row
    /// geometries only: a full reduction's scratch can move between launches.
    pub fn new(
        dev: &Device,
        kernel: &'static KernelInfo,
        geometry: Geometry,
        args: &[Arg<'a>],
    ) -> Result<Prebuilt<'a>, Error> {
        let internal = |detail: &str| Error::Internal {
            detail: format!("a prebuilt launch of `{}`: {detail}", kernel.name),
        };
        if let Geometry::Full { .. } = geometry {
            return Err(internal("full reductions are not supported"));
        }
        let mut resolved = None;
        launch_with(dev, kernel, None, geometry, args, |_, _, config, slots| {
            resolved = Some((config, Box::<[u64]>::from(&*slots)));
            Ok(())
        })?;
        let (config, mut slots) = resolved.ok_or_else(|| internal("nothing to run"))?;
        let params = slots.iter_mut().map(|slot| (slot as *mut u64).cast());
        let queue = dev.queue(kernel.name)?.clone();
        let function = queue.cuda.function(kernel, || queue.capturing())?;
        queue.cuda.bind()?;
        Ok(Prebuilt {
            params: params.collect(),
            queue,
            function,
            config,
            slots,
            buffers: PhantomData,
        })
    }

    /// Queues the kernel through cudarc's launch builder, one `arg` per slot, as fuse launched
    /// before it called the driver itself.
    pub fn launch_builder(&self) -> Result<(), Error> {
        let mut builder = self.queue.stream.launch_builder(&self.function);
        for slot in self.slots.iter() {
            builder.arg(slot);
        }
        // SAFETY: the slots are what `launch` packs for these arguments (checked there against
        // the kernel's device; the kernel's signature and the arguments come from one `fuse!`
        // signature, as for `launch`), and the buffers they address stay borrowed for `'a`.
        let launched = unsafe { builder.launch(self.config) };
        launched
            .map(drop)
            .map_err(|e| driver_error("cuLaunchKernel", e))
    }

    /// Queues the kernel with one `cuLaunchKernel` and the parameter array built once. The
    /// context must be current on this thread, as [`Prebuilt::new`] left it.
    pub fn launch_raw(&mut self) -> Result<(), Error> {
        let (grid, block) = (self.config.grid_dim, self.config.block_dim);
        // SAFETY: as in `launch_builder`; each entry of `params` points at its slot in
        // `self.slots`, a heap allocation that neither moves nor changes while `self` lives, and
        // `cuLaunchKernel` reads the arguments before it returns.
        let result = unsafe {
            sys::cuLaunchKernel(
                self.function.cu_function(),
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                self.config.shared_mem_bytes,
                self.queue.cu_stream(),
                self.params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        result
            .result()
            .map_err(|e| driver_error("cuLaunchKernel", e))
    }
}
