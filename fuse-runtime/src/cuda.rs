//! One CUDA device: its context, its properties and its loaded kernels.
//!
//! Its streams, and the memory operations queued on them, are [`crate::queue`]'s;
//! [`crate::launch`] adds the kernel launch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result::DriverError, sys, CudaContext, CudaFunction, CudaModule};

use crate::cache::{self, Cubin, Origin};
use crate::error::{driver_error, lock, Error};
use crate::kernel::KernelInfo;

/// An open CUDA device, shared by every [`Device`](crate::Device) handle of its ordinal.
pub(crate) struct CudaDevice {
    pub(crate) ordinal: usize,
    /// The device's marketing name, such as `NVIDIA H100 80GB HBM3`.
    pub(crate) gpu_name: String,
    /// The compute capability as (major, minor).
    pub(crate) capability: (u32, u32),
    /// The number of streaming multiprocessors, which sizes launch grids.
    pub(crate) sm_count: u32,
    /// The device's primary context, with cudarc's event tracking off (see [`CudaDevice::open`]).
    pub(crate) ctx: Arc<CudaContext>,
    kernels: Mutex<Kernels>,
    /// The handles of `kernels`' functions, which launches read without taking its lock.
    handles: Handles,
    /// The shared-memory limits and kernel settings of long rows; see [`crate::long_rows`].
    long_rows: crate::long_rows::LongRows,
}

/// The loaded kernels of one device.
#[derive(Default)]
struct Kernels {
    /// Keyed by the addresses and lengths of a kernel's `source` and `symbol`: both are
    /// `&'static str`, so an address is never reused, and a hit costs no string hashing.
    functions: HashMap<[usize; 4], CudaFunction>,
    /// Keyed by source text, so that two kernels of one source share one module; with where
    /// its CUBIN came from.
    modules: HashMap<&'static str, (Arc<CudaModule>, Origin)>,
}

/// Whether the CUDA driver library can be loaded, asked once per process.
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| crate::libs::present(&driver_candidates()))
}

/// The library names cudarc searches for the driver.
pub(crate) fn driver_candidates() -> Vec<String> {
    let mut names = crate::libs::candidates("cuda");
    names.extend(crate::libs::candidates("nvcuda"));
    crate::libs::unique(names)
}

/// The number of CUDA devices; `Ok(0)` when the driver loads but finds no device.
pub(crate) fn device_count() -> Result<usize, Error> {
    if !driver_present() {
        return Err(Error::NoDriver {
            searched: driver_candidates(),
        });
    }
    crate::libs::check_driver(driver_version()?)?;
    match CudaContext::device_count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => Ok(0),
        Err(e) => Err(driver_error("cuInit", e)),
    }
}

/// The CUDA version the driver supports, as (major, minor). Call it only once the driver is
/// known to load ([`driver_present`]): cudarc panics where it does not.
fn driver_version() -> Result<(u32, u32), Error> {
    let mut version = 0;
    // SAFETY: the driver library loads (checked by the caller), and every driver has
    // `cuDriverGetVersion`, which needs no `cuInit` and writes one integer to a live local.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| driver_error("cuDriverGetVersion", e))?;
    Ok(crate::libs::cuda_version(version))
}

/// Keeps the memory that buffers free in the device's default memory pool, which cudarc's
/// allocations draw from, where the driver's default returns it to the system at every
/// synchronization: a loop that allocates a large output each call and reads a result back
/// (a training step reading its loss) would otherwise map its memory again each time
/// (`benches/NOTES.md`, item 80). PyTorch's caching allocator keeps memory the same way. Only a pool still at the driver's default (0) is changed: a threshold that other code
/// sharing the primary context chose is kept, and `cuMemPoolTrimTo` on the default pool gives the
/// memory back.
fn keep_freed_memory(ctx: &CudaContext) -> Result<(), Error> {
    let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    let mut pool = std::ptr::null_mut();
    let mut threshold = 0u64;
    // SAFETY: the driver writes the default pool of a valid device into `pool`, then reads and
    // writes the 8-byte threshold (a `cuuint64_t`, as the attribute's docs say) through
    // pointers to a live `u64`.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .map_err(|e| driver_error("cuDeviceGetDefaultMemPool", e))?;
        sys::cuMemPoolGetAttribute(pool, attr, (&raw mut threshold).cast())
            .result()
            .map_err(|e| driver_error("cuMemPoolGetAttribute", e))?;
        if threshold == 0 {
            threshold = u64::MAX;
            sys::cuMemPoolSetAttribute(pool, attr, (&raw mut threshold).cast())
                .result()
                .map_err(|e| driver_error("cuMemPoolSetAttribute", e))?;
        }
    }
    Ok(())
}

impl CudaDevice {
    /// Opens device `ordinal`: retains its primary context and reads its properties.
    pub(crate) fn open(ordinal: usize) -> Result<CudaDevice, Error> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: event tracking orders a cudarc allocation's uses between streams. fuse orders
        // work by stream instead: each `Device` handle queues everything on its one stream, in
        // submission order, and work on two streams is ordered by the caller (as the crate docs
        // say), so the per-allocation events would only add launch overhead. It is turned off
        // before this context allocates anything; a caller's own context object (of the same
        // primary context) keeps its setting.
        unsafe { ctx.disable_event_tracking() };
        if ctx.has_async_alloc() {
            keep_freed_memory(&ctx)?;
        }
        let attribute = |a| {
            ctx.attribute(a)
                .map_err(|e| driver_error("cuDeviceGetAttribute", e))
        };
        let major =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sm_count =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let gpu_name = ctx.name().map_err(|e| driver_error("cuDeviceGetName", e))?;
        Ok(CudaDevice {
            ordinal,
            gpu_name,
            capability: (non_negative(major), non_negative(minor)),
            sm_count: non_negative(sm_count).max(1),
            ctx,
            kernels: Mutex::default(),
            handles: Handles::new(),
            long_rows: Default::default(),
        })
    }

    /// The name [`Device::name`](crate::Device::name) shows.
    pub(crate) fn describe(&self) -> String {
        let (major, minor) = self.capability;
        format!(
            "CUDA device {}: {} (sm_{major}{minor})",
            self.ordinal, self.gpu_name
        )
    }

    /// The architecture number NVRTC compiles for, such as 90 for sm_90.
    pub(crate) fn arch(&self) -> u32 {
        self.capability.0 * 10 + self.capability.1
    }

    /// Binds this device's context to the calling thread, as raw driver calls need.
    pub(crate) fn bind(&self) -> Result<(), Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    /// What the long rows need of this device.
    pub(crate) fn long_rows(&self) -> crate::long_rows::Gpu<'_> {
        crate::long_rows::Gpu {
            ctx: &self.ctx,
            sm_count: self.sm_count,
            state: &self.long_rows,
        }
    }

    /// The handle of `kernel`'s loaded function, for a launch: after the first call on this
    /// device it is found without a lock or an allocation. The function stays loaded as long as
    /// the device: its module is never unloaded.
    pub(crate) fn function_handle(
        &self,
        kernel: &'static KernelInfo,
        capturing: impl FnOnce() -> Result<bool, Error>,
    ) -> Result<sys::CUfunction, Error> {
        match self.handles.get(kernel) {
            Some(handle) => Ok(handle),
            None => self
                .function(kernel, capturing)
                .map(|function| function.cu_function()),
        }
    }

    /// The blocks of `kernel`'s loaded `function` the device holds at once: the most a
    /// cooperative launch may have. Asked of the driver once, then found in the handles.
    pub(crate) fn resident_blocks(
        &self,
        kernel: &'static KernelInfo,
        function: sys::CUfunction,
    ) -> Result<u32, Error> {
        if let Some(blocks) = self.handles.resident(kernel) {
            return Ok(blocks);
        }
        let mut per_sm: std::ffi::c_int = 0;
        self.bind()?;
        let block = crate::grid::BLOCK as std::ffi::c_int;
        // SAFETY: `function` is a loaded kernel of this device's context, bound above.
        let asked = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, function, block, 0)
        };
        asked
            .result()
            .map_err(|e| driver_error("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        let blocks = non_negative(per_sm).max(1).saturating_mul(self.sm_count);
        self.handles.set_resident(kernel, blocks);
        Ok(blocks)
    }

    /// The loaded function of `kernel`, compiling and loading its module on first use. The
    /// first use fails with [`Error::Capture`] while the launching stream captures a graph
    /// (`capturing`, asked only then): loading a module there would break the capture.
    pub(crate) fn function(
        &self,
        kernel: &'static KernelInfo,
        capturing: impl FnOnce() -> Result<bool, Error>,
    ) -> Result<CudaFunction, Error> {
        let key = [
            kernel.source.as_ptr() as usize,
            kernel.source.len(),
            kernel.symbol.as_ptr() as usize,
            kernel.symbol.len(),
        ];
        let mut kernels = lock(&self.kernels);
        if let Some(function) = kernels.functions.get(&key) {
            let function = function.clone();
            self.handles
                .insert(&mut kernels, kernel, function.cu_function());
            return Ok(function);
        }
        if kernel.symbol.contains('\0') {
            return Err(Error::Internal {
                detail: format!("kernel symbol {:?} contains a NUL byte", kernel.symbol),
            });
        }
        if !kernels.modules.contains_key(kernel.source) && capturing()? {
            return Err(Error::Capture {
                detail: format!(
                    "kernel `{}` is not loaded on {} yet, and loading it would break the \
                     capture; call `{}::load(&dev)` (or the kernel itself) before capturing",
                    kernel.name,
                    self.describe(),
                    kernel.name
                ),
            });
        }
        let function = self
            .module(&mut kernels, kernel)?
            .load_function(kernel.symbol)
            .map_err(|e| driver_error("cuModuleGetFunction", e))?;
        kernels.functions.insert(key, function.clone());
        self.handles
            .insert(&mut kernels, kernel, function.cu_function());
        Ok(function)
    }

    /// The module of `kernel`'s source, loaded once per source.
    fn module(
        &self,
        kernels: &mut Kernels,
        kernel: &'static KernelInfo,
    ) -> Result<Arc<CudaModule>, Error> {
        if let Some((module, _)) = kernels.modules.get(kernel.source) {
            return Ok(module.clone());
        }
        let (module, origin) = self.load_module(kernel)?;
        kernels
            .modules
            .insert(kernel.source, (module.clone(), origin));
        Ok(module)
    }

    /// Where the CUBIN of `kernel`'s module came from, or `None` before its first launch here.
    /// Of a registered `fn`'s entry point, the first loaded entry point of that `fn`: each path
    /// is a module of its own, and a call loads only the one it takes.
    pub(crate) fn origin(&self, kernel: &KernelInfo) -> Option<Origin> {
        let kernels = lock(&self.kernels);
        let loaded = |k: &KernelInfo| kernels.modules.get(k.source).map(|(_, origin)| *origin);
        loaded(kernel).or_else(|| {
            crate::kernel::family(kernel)?
                .iter()
                .find_map(|entry| loaded(entry))
        })
    }

    /// Loads the module of `kernel`: its embedded CUBIN for this architecture when it has one,
    /// else from the disk cache or NVRTC.
    fn load_module(&self, kernel: &KernelInfo) -> Result<(Arc<CudaModule>, Origin), Error> {
        let embedded = kernel
            .cubin(self.arch())
            .filter(|_| cache::embedded_cubins());
        if let Some(cubin) = embedded.filter(|cubin| cache::whole_elf(cubin)) {
            // A driver older than the NVRTC that built the CUBIN rejects it: then compile the
            // source here, as a build without embedded CUBINs would. A device out of memory
            // would reject any CUBIN, and may have no NVRTC to compile one.
            match self.load_cubin(cubin.to_vec()) {
                Ok(module) => return Ok((module, Origin::Embedded)),
                Err(e) if out_of_memory(&e) => return Err(driver_error("cuModuleLoadData", e)),
                Err(_) => {}
            }
        }
        self.compile_module(kernel)
    }

    /// Loads a CUBIN as a module. When the device has no memory left for it, the memory its
    /// pool keeps for allocations is given back first (the pool may hold nearly all of it, see
    /// [`keep_freed_memory`]), and it tries once more.
    fn load_cubin(&self, cubin: Vec<u8>) -> Result<Arc<CudaModule>, DriverError> {
        let load = |bytes| self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bytes));
        match load(cubin.clone()) {
            Err(e) if out_of_memory(&e) && self.release_pool_memory() => load(cubin),
            loaded => loaded,
        }
    }

    /// Has the device's default memory pool give the memory it keeps for later allocations, and
    /// does not use now, back to the driver: for an allocation or a module load that found the
    /// device full. Memory whose free the host has not yet seen complete stays in the pool.
    /// Whether there was a pool to trim.
    pub(crate) fn release_pool_memory(&self) -> bool {
        if !self.ctx.has_async_alloc() || self.bind().is_err() {
            return false;
        }
        let mut pool = std::ptr::null_mut();
        // SAFETY: the driver writes the default pool of a valid device into `pool`; trimming a
        // pool releases only memory no allocation holds.
        unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device())
                .result()
                .and_then(|()| sys::cuMemPoolTrimTo(pool, 0).result())
                .is_ok()
        }
    }

    /// Loads the module of `kernel` from the disk cache when a usable CUBIN is there, else
    /// compiles it with NVRTC.
    fn compile_module(&self, kernel: &KernelInfo) -> Result<(Arc<CudaModule>, Origin), Error> {
        let program = format!("{}.cu", kernel.name);
        let cubin =
            cache::cubin(kernel.source, &program, self.arch()).map_err(|e| named(e, kernel))?;
        match (self.load_cubin(cubin.bytes), cubin.from_disk) {
            (Ok(module), true) => Ok((module, Origin::Disk)),
            (Ok(module), false) => Ok((module, Origin::Nvrtc)),
            (Err(e), true) if !out_of_memory(&e) => {
                // A cached CUBIN the driver rejects is as good as missing: compile it afresh.
                let Cubin { bytes, .. } = cache::recompile(kernel.source, &program, self.arch())
                    .map_err(|e| named(e, kernel))?;
                let module = self
                    .load_cubin(bytes)
                    .map_err(|e| driver_error("cuModuleLoadData", e))?;
                Ok((module, Origin::Nvrtc))
            }
            (Err(e), _) => Err(driver_error("cuModuleLoadData", e)),
        }
    }
}

/// The function handles of one device by kernel, for launches to find without a lock: an
/// open-addressed table from the address of a kernel's `&'static KernelInfo` (unique, and never
/// reused) to its `CUfunction`. Entries are added under the `kernels` lock and never removed, so
/// a reader that sees a kernel's address also sees its handle. A kernel that finds no free
/// entry near its hash is simply not cached: its launches take the lock, as before.
struct Handles {
    entries: Box<[Handle; HANDLES]>,
}

/// The entries of [`Handles`]: far more kernels than a program defines, at 16 bytes each.
const HANDLES: usize = 1024;
/// The entries a lookup or an insertion looks at, from the kernel's hash on.
const PROBES: usize = 16;

#[derive(Default)]
struct Handle {
    /// The kernel's address, or 0 while the entry is free; written last.
    kernel: AtomicUsize,
    function: AtomicPtr<sys::CUfunc_st>,
    /// The blocks of the function the device holds at once, or 0 until a launch asked.
    resident: AtomicU32,
}

impl Handles {
    fn new() -> Handles {
        Handles {
            entries: Box::new(std::array::from_fn(|_| Handle::default())),
        }
    }

    /// The entries `kernel` may be in, in order.
    fn probe(&self, kernel: usize) -> impl Iterator<Item = &Handle> {
        // Fibonacci hashing of the address (statics are aligned, so its low bits carry little).
        let hash = (kernel as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54;
        (0..PROBES).map(move |i| &self.entries[(hash as usize + i) % HANDLES])
    }

    /// `kernel`'s entry, if it has one.
    fn entry(&self, kernel: &'static KernelInfo) -> Option<&Handle> {
        let kernel = kernel as *const KernelInfo as usize;
        for entry in self.probe(kernel) {
            match entry.kernel.load(Ordering::Acquire) {
                // The `Acquire` pairs with the `Release` in `insert`: the handle was stored
                // before the address that names it.
                k if k == kernel => return Some(entry),
                0 => return None,
                _ => {}
            }
        }
        None
    }

    fn get(&self, kernel: &'static KernelInfo) -> Option<sys::CUfunction> {
        self.entry(kernel)
            .map(|entry| entry.function.load(Ordering::Relaxed))
    }

    /// The blocks of `kernel`'s function the device holds at once, once [`Handles::set_resident`]
    /// stored them.
    fn resident(&self, kernel: &'static KernelInfo) -> Option<u32> {
        self.entry(kernel)
            .map(|entry| entry.resident.load(Ordering::Relaxed))
            .filter(|&blocks| blocks > 0)
    }

    /// Stores the blocks of `kernel`'s function the device holds at once, where `kernel` has an
    /// entry. Every caller stores the same number, so racing stores agree.
    fn set_resident(&self, kernel: &'static KernelInfo, blocks: u32) {
        if let Some(entry) = self.entry(kernel) {
            entry.resident.store(blocks, Ordering::Relaxed);
        }
    }

    /// Adds `kernel`'s handle. Taking the `kernels` lock's guard makes the inserts one at a time.
    fn insert(
        &self,
        _locked: &mut Kernels,
        kernel: &'static KernelInfo,
        function: sys::CUfunction,
    ) {
        let kernel = kernel as *const KernelInfo as usize;
        for entry in self.probe(kernel) {
            match entry.kernel.load(Ordering::Relaxed) {
                0 => {
                    entry.function.store(function, Ordering::Relaxed);
                    entry.kernel.store(kernel, Ordering::Release);
                    return;
                }
                k if k == kernel => return,
                _ => {}
            }
        }
    }
}

/// A compile error names the kernel, not the NVRTC program.
fn named(error: Error, kernel: &KernelInfo) -> Error {
    match error {
        Error::Compile { log, line, .. } => Error::Compile {
            kernel: kernel.name.to_string(),
            log,
            line,
        },
        other => other,
    }
}

/// Whether the driver ran out of device memory.
fn out_of_memory(e: &DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

fn non_negative(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> &'static KernelInfo {
        Box::leak(Box::new(KernelInfo {
            name: "k",
            symbol: "fuse_k",
            source: "",
            cubins: &[],
        }))
    }

    /// A stand-in function handle: the table stores it and never dereferences it.
    fn handle(n: usize) -> sys::CUfunction {
        std::ptr::without_provenance_mut(n * 8)
    }

    #[test]
    fn handles_find_what_was_inserted() {
        let (handles, mut locked) = (Handles::new(), Kernels::default());
        let kernels: Vec<_> = (0..200).map(|_| kernel()).collect();
        assert_eq!(handles.get(kernels[0]), None);
        for (n, &k) in kernels.iter().enumerate() {
            handles.insert(&mut locked, k, handle(n + 1));
        }
        for (n, &k) in kernels.iter().enumerate() {
            assert_eq!(handles.get(k), Some(handle(n + 1)), "kernel {n}");
        }
        // A second insert of a kernel keeps its first handle (both are the same function).
        handles.insert(&mut locked, kernels[0], handle(999));
        assert_eq!(handles.get(kernels[0]), Some(handle(1)));
    }

    #[test]
    fn resident_blocks_are_kept_beside_their_handle() {
        let (handles, mut locked) = (Handles::new(), Kernels::default());
        let (cached, uncached) = (kernel(), kernel());
        handles.insert(&mut locked, cached, handle(7));
        assert_eq!(handles.resident(cached), None);
        handles.set_resident(cached, 264);
        assert_eq!(handles.resident(cached), Some(264));
        assert_eq!(handles.get(cached), Some(handle(7)));
        // A kernel without an entry keeps nothing, and asks the driver each time.
        handles.set_resident(uncached, 132);
        assert_eq!(handles.resident(uncached), None);
    }

    #[test]
    fn full_handles_fall_back_without_losing_entries() {
        let (handles, mut locked) = (Handles::new(), Kernels::default());
        let kernels: Vec<_> = (0..2 * HANDLES).map(|_| kernel()).collect();
        for (n, &k) in kernels.iter().enumerate() {
            handles.insert(&mut locked, k, handle(n + 1));
        }
        // Some found no free entry and are not cached; every cached one is right.
        let cached = kernels
            .iter()
            .enumerate()
            .filter_map(|(n, &k)| handles.get(k).map(|found| assert_eq!(found, handle(n + 1))));
        let cached = cached.count();
        assert!(cached > HANDLES / 2 && cached <= HANDLES, "{cached} cached");
    }
}
