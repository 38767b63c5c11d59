//! Long rows cached in shared memory: the launch of a row kernel whose rows are too long for the
//! kernel's register cache but fit in the dynamic shared memory of one block, or, on sm_90, of the
//! blocks of a thread-block cluster, each caching a part of the row. The kernel then reads each
//! row from memory once, whatever its number of passes (`fuse-macros/src/cuda/rows/long_rows.rs`
//! writes that path, as an entry point of its own beside the row kernel's; [`launch`] launches it
//! when the rows, the kernel and the device allow it, and the caller launches the row kernel
//! otherwise).
//!
//! Rows are split over the fewest blocks a row whose parts take at most 64 KiB, where that keeps
//! at least half the most blocks resident, as the driver counts them ([`choose`]), and the grid
//! holds a cluster per row.
//! A kernel with sums over rows keeps as many clusters as run at once, each looping over rows,
//! and splits them by the rows those clusters hold in L2, then fewer, larger parts.
//! `FUSE_LONG_ROWS_WAVES` can make it hold only as many clusters as the device runs at once,
//! each taking every so many rows and asking L2 for its next row while it works on this one
//! ([`waves`]); that lost on an H200 once the blocks were lean.
//!
//! Rows that fit nowhere, devices without the shared memory, and kernels without the path
//! ([`Geometry::Rows`]'s `cache_bytes` is 0) launch as before and stream their rows; so does every
//! row when the environment variable `FUSE_LONG_ROWS` is `0` when a device is first used, to
//! compare the two.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaFunction};

use crate::error::{driver_error, lock, Error};
use crate::grid::{knob, param_array, Geometry, BLOCK, REGISTER_ROW};

/// The blocks per SM that `FUSE_LONG_ROWS_PER_SM` asks a block's shared memory to leave room
/// for, in place of the split [`choose`] makes, for the benchmark to compare the two in one
/// build.
fn blocks_per_sm() -> Option<u64> {
    static SET: OnceLock<Option<u64>> = OnceLock::new();
    knob(&SET, "FUSE_LONG_ROWS_PER_SM").filter(|&n| n > 0)
}

/// The cluster size `FUSE_LONG_ROWS_CLUSTER` asks every long row to be split into, in place of
/// the split [`choose`] makes (where its parts fit a block), for the benchmark to time each
/// split in one build.
fn forced_cluster() -> Option<u32> {
    static SET: OnceLock<Option<u64>> = OnceLock::new();
    knob(&SET, "FUSE_LONG_ROWS_CLUSTER")
        .filter(|&n| n > 0)
        .and_then(|n| u32::try_from(n).ok())
}

/// Whether `FUSE_LONG_ROWS_TRACE=1` asks each kernel's split to be written to stderr, with the
/// clusters of each size the driver runs at once, for the benchmark's sweeps of the split.
fn traced() -> bool {
    static SET: OnceLock<bool> = OnceLock::new();
    *SET.get_or_init(|| std::env::var_os("FUSE_LONG_ROWS_TRACE").is_some_and(|v| v == "1"))
}

/// The clusters of a long-row grid, in multiples of those the device runs at once: 0, a cluster
/// per row (the block scheduler replaces a finished one at once), unless `FUSE_LONG_ROWS_WAVES`
/// says otherwise, for the benchmark to compare grids in one build. With 1 every cluster stays
/// resident over its rows and has its next row fetched into L2 while it works. Measured on an
/// H200 (benches/NOTES.md items 31 and 32), S1's softmax: with the row kernel's 32 KiB of static
/// buffers in every block, rows of 262144 in clusters of 13 at 51% of copy bandwidth resident
/// against 46% a cluster per row; with the long-row entry's lean blocks (clusters of 14, three
/// blocks an SM) 56% against 63%, and rows of 32768 (clusters of 3, four an SM) 60% against 80%.
fn waves() -> u64 {
    static SET: OnceLock<Option<u64>> = OnceLock::new();
    knob(&SET, "FUSE_LONG_ROWS_WAVES").unwrap_or(0)
}

/// The clusters of the grid for `groups` rows when the device runs `resident` clusters at once:
/// [`waves`] times `resident`, no more than the rows; a cluster per row when the waves are 0.
///
/// Every cluster loops over rows `g`, `g + clusters`, ... (the kernel's row loop strides by the
/// grid's clusters), so fewer clusters than rows is always correct.
fn grid_clusters(groups: u64, resident: u32, waves: u64) -> u64 {
    match waves {
        0 => groups,
        n => groups.min(u64::from(resident).saturating_mul(n)).max(1),
    }
}

/// The most blocks of a cluster: 8 is the portable limit, 16 needs the kernel's permission.
const PORTABLE_CLUSTER: u32 = fuse_macros::__abi!(PORTABLE_CLUSTER);
const MAX_CLUSTER: u32 = fuse_macros::__abi!(MAX_CLUSTER);

/// The elements of a row each of `cluster` blocks caches: a multiple of 32, so that each part
/// of a row starts on a 128-byte line (the kernel's `fz_part` rounds alike).
fn part(row_len: u64, cluster: u32) -> u64 {
    row_len
        .div_ceil(u64::from(cluster.max(1)))
        .next_multiple_of(u64::from(fuse_macros::__abi!(PART)))
}

/// The dynamic shared memory each block of a cluster of `cluster` needs for rows of `row_len`
/// elements of `cache_bytes` bytes: its part of the row. (The slots its cluster exchanges
/// partial reductions through are the kernel's static shared memory.)
///
/// ```
/// use fuse_runtime::__private::long_row_shared_bytes;
/// assert_eq!(long_row_shared_bytes(32768, 2, 4), 16384 * 4);
/// assert_eq!(long_row_shared_bytes(9, 4, 4), 32 * 4, "parts are multiples of 32");
/// ```
pub fn long_row_shared_bytes(row_len: u64, cluster: u32, cache_bytes: u32) -> u64 {
    part(row_len, cluster).saturating_mul(u64::from(cache_bytes))
}

/// What a device and a kernel allow a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Limits {
    /// The most dynamic shared memory of one block: the device's opt-in maximum less the
    /// kernel's static shared memory.
    per_block: u64,
    /// The dynamic shared memory per block that leaves room for the blocks an SM that
    /// `FUSE_LONG_ROWS_PER_SM` names, when it does.
    target: Option<u64>,
    /// The most blocks of a cluster; 1 without cluster launches.
    cluster: u32,
}

/// How rows are split: blocks per row (the cluster size) and dynamic shared bytes per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    cluster: u32,
    shared: u32,
}

/// The splits of rows of `row_len` worth asking the driver about: every cluster size whose
/// parts fit in one block; with `FUSE_LONG_ROWS_PER_SM`, only the fewest blocks per row whose
/// parts fit its target (else the most one block may have). None for rows the register cache
/// holds and kernels without the path.
fn candidates(row_len: u64, cache_bytes: u32, limits: Limits) -> Vec<Shape> {
    if cache_bytes == 0 || row_len <= REGISTER_ROW {
        return vec![];
    }
    let shape = |cluster| {
        let shared = long_row_shared_bytes(row_len, cluster, cache_bytes);
        let shared = u32::try_from(shared).ok()?;
        (u64::from(shared) <= limits.per_block).then_some(Shape { cluster, shared })
    };
    let all = (1..=limits.cluster.max(1)).filter_map(shape);
    if let Some(cluster) = forced_cluster() {
        return all.filter(|s| s.cluster == cluster).collect();
    }
    match limits.target {
        None => all.collect(),
        Some(target) => {
            let all: Vec<Shape> = all.collect();
            let fits = all.iter().find(|s| u64::from(s.shared) <= target);
            fits.or(all.first()).copied().into_iter().collect()
        }
    }
}

/// Of `candidates` (fewest blocks a row first), the first whose parts take at most
/// [`LEAN_PART`] bytes and that keeps at least half the most blocks any of them keeps resident
/// (clusters the device runs at once, as `resident` says, times their blocks); else the first
/// that keeps three quarters of the most; and its resident clusters. `None` (stream the rows)
/// when none can run.
///
/// Resident blocks matter, because a long row's block alternates between copying its part in
/// and working through the passes, and only other blocks on its SM overlap the two; but so does
/// each block's share of a row, whose reductions and exchanges across the cluster cost the same
/// whatever its part. On an H100 (benches/NOTES.md item 148, every cluster size of S1's and
/// S2's softmax and G5's cross-entropy), the fastest split was each time the fewest blocks a
/// row of parts of at most 64 KiB, three blocks an SM, though more blocks of smaller parts
/// could run: S1's rows of 32768 floats in clusters of 2 (396 blocks resident) at 95% of copy
/// bandwidth, against 92% in clusters of 3 (609, the three quarters of the rule before);
/// 262144 floats in 16 (336) at 95%, as 14 (294, parts of 75,008 bytes); S2's bf16 rows of
/// 32768 whole (396) at 93%, against 91% in clusters of 2 (528); of 262144 in 8 (360) at 88%,
/// against 77% in 7 (329, parts of 74,944 bytes, three an SM too) and 78% in 16 (448); G5's
/// rows of 128256 bf16 in 4 (368) at 90-91%, against 87-89% in 5 (470). (On an H200, with
/// the kernels of items 34 and 44, S1's rows of 32768 in clusters of 2 ran 1.7 points behind
/// 3; not measured there since.)
///
/// A grid that loops over rows (`looping`: its clusters resident, summing their rows into
/// partial sums) is chosen otherwise, by what its clusters keep in L2 and by fewer, larger
/// parts. Each cluster holds its row and has asked L2 for its next one, so the rows its
/// clusters hold (resident clusters times a row's bytes of the tensors it copies) are kept
/// within two ninths of L2 where a split allows it; of those, the first that keeps two thirds
/// of the most blocks. On an H100 (benches/NOTES.md items 140 and 141, GW's RMSNorm and
/// LayerNorm backwards at 8192-32768 bf16 columns), RMSNorm's rows in clusters of 1 / 2 / 4
/// at three blocks an SM (13 MB held) read 22% more from memory than the rows' bytes (at 8192
/// columns), and ran 4-12% slower than in clusters of 2 / 3 / 5 (6.5-9.7 MB); LayerNorm's,
/// whose three passes and two exchanges a row bound it by instructions, ran 3-8% faster in
/// clusters of 1 / 2 / 4 at two blocks an SM (8.7 MB) than of 2 / 3 / 6 at three.
fn choose(
    candidates: &[Shape],
    mut resident: impl FnMut(Shape) -> u32,
    looping: Option<Looping>,
) -> Option<(Shape, u32)> {
    let blocks = |(s, c): (Shape, u32)| u64::from(c) * u64::from(s.cluster);
    let running: Vec<(Shape, u32)> = candidates
        .iter()
        .map(|&shape| (shape, resident(shape)))
        .filter(|&(_, clusters)| clusters > 0)
        .collect();
    let Some(looping) = looping else {
        let most = running.iter().map(|&r| blocks(r)).max()?;
        let lean = |&r: &(Shape, u32)| u64::from(r.0.shared) <= LEAN_PART && blocks(r) * 2 >= most;
        let lean = running.iter().copied().find(lean);
        return lean.or_else(|| running.into_iter().find(|&r| blocks(r) * 4 >= most * 3));
    };
    let held = |(_, c): (Shape, u32)| u64::from(c).saturating_mul(looping.row_bytes);
    let fits = |r: &(Shape, u32)| held(*r).saturating_mul(9) <= looping.l2.saturating_mul(2);
    let within: Vec<(Shape, u32)> = running.iter().copied().filter(fits).collect();
    let pool = match within.is_empty() || looping.l2 == 0 {
        true => running,
        false => within,
    };
    let most = pool.iter().map(|&r| blocks(r)).max()?;
    pool.into_iter().find(|&r| blocks(r) * 3 >= most * 2)
}

/// The most bytes of a row a block of a cluster caches by preference: the parts of the fastest
/// splits measured ([`choose`]), three blocks an SM of sm_90's shared memory.
const LEAN_PART: u64 = 64 << 10;

/// What [`choose`] weighs for a grid that loops over rows.
#[derive(Clone, Copy, Debug)]
struct Looping {
    /// A row's bytes of the tensors each cluster copies (its length times their bytes an
    /// element: the shared memory an element takes, less its partial sums').
    row_bytes: u64,
    /// The device's L2 in bytes; 0 when the driver will not say.
    l2: u64,
}

/// The shared memory of one device, read once.
#[derive(Clone, Copy, Debug)]
struct DeviceLimits {
    per_sm: u64,
    per_block_optin: u64,
    reserved_per_block: u64,
    clusters: bool,
    /// L2's bytes; 0 when the driver will not say.
    l2: u64,
}

/// One kernel's settings on one device.
struct Function {
    limits: Limits,
    /// The `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` set so far.
    max_dynamic: u32,
    /// The split chosen for each (row length, bytes an element), with its resident clusters;
    /// `None` where the rows stream.
    splits: HashMap<(u64, u32), Option<(Shape, u32)>>,
    /// How many clusters of (blocks, shared bytes) the device runs at once, as the driver
    /// answered; 0 when none can run.
    clusters: HashMap<(u32, u32), u32>,
}

/// The long-row state of one device: its limits and each kernel's settings, keyed by the
/// kernel's `CUfunction` (which lives as long as the device's loaded modules).
#[derive(Default)]
pub(crate) struct LongRows {
    device: OnceLock<Option<DeviceLimits>>,
    functions: Mutex<HashMap<usize, Function>>,
}

/// A long-row launch the device can run: its grid and split.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LongLaunch {
    grid: u32,
    shape: Shape,
}

/// What the long rows need of a device: its context, its SMs, and its long-row state.
#[derive(Clone, Copy)]
pub(crate) struct Gpu<'a> {
    pub(crate) ctx: &'a Arc<CudaContext>,
    pub(crate) sm_count: u32,
    pub(crate) state: &'a LongRows,
}

impl Gpu<'_> {
    fn bind(&self) -> Result<(), Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }
}

/// The launch of `function`, a row kernel's long-row entry, for `geometry`, when the rows, the
/// kernel and the device allow it; `None` where the rows should take the next entry.
pub(crate) fn prepare(
    gpu: Gpu,
    function: &CudaFunction,
    geometry: Geometry,
    sums: u32,
) -> Option<LongLaunch> {
    let Geometry::Rows {
        groups,
        row_len,
        cache_bytes,
        blocks_per_sm,
        ..
    } = geometry
    else {
        return None;
    };
    if !taken(geometry) {
        return None;
    }
    let (shape, resident) = gpu
        .state
        .prepare(gpu, function, row_len, cache_bytes, sums)?;
    // Clusters that each sum their rows into a row of partial sums stay resident, as many as
    // run at once: a wave more would write as many rows of partials again.
    let waves = match blocks_per_sm {
        0 => waves(),
        _ => 1,
    };
    let clusters =
        grid_clusters(groups, resident, waves).min(u64::from(i32::MAX as u32 / shape.cluster));
    Some(LongLaunch {
        grid: clusters as u32 * shape.cluster,
        shape,
    })
}

impl LongLaunch {
    /// The blocks of the launch.
    pub(crate) fn blocks(&self) -> u32 {
        self.grid
    }

    /// Queues the launch on `stream` with the argument `slots`; `cooperative` for a kernel
    /// with a barrier of the grid (sums over rows), whose clusters are then all resident.
    pub(crate) fn enqueue(
        self,
        gpu: Gpu,
        stream: sys::CUstream,
        function: &CudaFunction,
        slots: &mut [u64],
        cooperative: bool,
    ) -> Result<(), Error> {
        let function = function.cu_function();
        enqueue(
            gpu,
            stream,
            function,
            slots,
            self.grid,
            self.shape,
            cooperative,
        )
    }
}

/// Queues `function` on `grid` blocks as a cooperative launch, without clusters or dynamic
/// shared memory: the kernels that sum over rows in registers (`Grid::Parts`, `Grid::Chunks`),
/// whose barrier of the grid needs every block resident.
pub(crate) fn enqueue_cooperative(
    gpu: Gpu,
    stream: sys::CUstream,
    function: sys::CUfunction,
    slots: &mut [u64],
    grid: u32,
) -> Result<(), Error> {
    let shape = Shape {
        cluster: 1,
        shared: 0,
    };
    enqueue(gpu, stream, function, slots, grid, shape, true)
}

/// Whether `geometry` may take the long-row launch (rows past the register cache of a kernel
/// that can cache them in shared memory); [`launch`] then decides whether the device allows it.
pub(crate) fn taken(geometry: Geometry) -> bool {
    matches!(geometry, Geometry::Rows { groups, row_len, cache_bytes, .. }
        if groups > 0 && cache_bytes > 0 && row_len > REGISTER_ROW)
}

impl LongRows {
    /// The shape for rows of `row_len`, with the kernel's attributes set for it, and how many
    /// clusters of it the device runs at once; `None` when the rows should stream instead.
    /// A kernel with partial sums over rows (`sums` bytes an element, of the `cache_bytes` an
    /// element takes in shared memory) loops over rows in resident clusters (`Looping`).
    fn prepare(
        &self,
        gpu: Gpu,
        function: &CudaFunction,
        row_len: u64,
        cache_bytes: u32,
        sums: u32,
    ) -> Option<(Shape, u32)> {
        gpu.bind().ok()?;
        let device = (*self.device.get_or_init(|| DeviceLimits::read(gpu.ctx)))?;
        let mut functions = lock(&self.functions);
        let entry = match functions.entry(function.cu_function() as usize) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(Function::new(function, device)?),
        };
        if let Some(&split) = entry.splits.get(&(row_len, cache_bytes)) {
            return split;
        }
        let candidates = candidates(row_len, cache_bytes, entry.limits);
        let looping = (sums > 0).then(|| Looping {
            row_bytes: row_len.saturating_mul(u64::from(cache_bytes.saturating_sub(sums))),
            l2: device.l2,
        });
        let resident = |shape| entry.resident(gpu, function, shape);
        let split = choose(&candidates, resident, looping);
        if traced() {
            // The driver's answers, cached by `resident` as `choose` asked them.
            let asked: Vec<(u32, u32)> = candidates
                .iter()
                .map(|&shape| (shape.cluster, entry.resident(gpu, function, shape)))
                .collect();
            let chosen = split.map(|(shape, _)| shape.cluster);
            eprintln!(
                "fuse long rows: {row_len} x {cache_bytes} bytes: (cluster, resident clusters) \
                 {asked:?}, chose {chosen:?}"
            );
        }
        entry.splits.insert((row_len, cache_bytes), split);
        split
    }
}

impl DeviceLimits {
    /// The device's shared-memory limits; `None` when the driver will not say, or when
    /// `FUSE_LONG_ROWS=0` turns the path off.
    fn read(context: &CudaContext) -> Option<DeviceLimits> {
        use sys::CUdevice_attribute::*;
        if std::env::var_os("FUSE_LONG_ROWS").is_some_and(|v| v == "0") {
            return None;
        }
        let get = |a| {
            context
                .attribute(a)
                .ok()
                .and_then(|v| u64::try_from(v).ok())
        };
        Some(DeviceLimits {
            per_sm: get(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            per_block_optin: get(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            reserved_per_block: get(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)
                .unwrap_or(0),
            clusters: get(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH).unwrap_or(0) != 0,
            l2: get(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).unwrap_or(0),
        })
    }
}

impl Function {
    /// A kernel's limits on the device: its static shared memory is read, and on a device with
    /// cluster launches it is allowed clusters of 16 where the driver agrees.
    fn new(function: &CudaFunction, device: DeviceLimits) -> Option<Function> {
        let fixed = function.shared_size_bytes().ok()?;
        let fixed = u64::try_from(fixed).ok()?;
        let cluster = match device.clusters {
            false => 1,
            true => {
                let attribute =
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
                match function.set_attribute(attribute, 1) {
                    Ok(()) => MAX_CLUSTER,
                    Err(_) => PORTABLE_CLUSTER,
                }
            }
        };
        Some(Function {
            limits: Limits {
                per_block: device.per_block_optin.saturating_sub(fixed),
                target: blocks_per_sm().map(|blocks| target(device, fixed, blocks)),
                cluster,
            },
            max_dynamic: 0,
            clusters: HashMap::new(),
            splits: HashMap::new(),
        })
    }

    /// How many clusters of `shape` the device runs at once (0 when none, or when the kernel
    /// may not have its shared memory), asked once per shape.
    fn resident(&mut self, gpu: Gpu, function: &CudaFunction, shape: Shape) -> u32 {
        if let Some(&clusters) = self.clusters.get(&(shape.cluster, shape.shared)) {
            return clusters;
        }
        let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        if shape.shared > self.max_dynamic {
            let Ok(shared) = i32::try_from(shape.shared) else {
                return 0;
            };
            if function.set_attribute(attribute, shared).is_err() {
                return 0;
            }
            self.max_dynamic = shape.shared;
        }
        let clusters = resident_clusters(gpu, function, shape);
        self.clusters
            .insert((shape.cluster, shape.shared), clusters);
        clusters
    }
}

/// The dynamic shared memory per block that leaves room for `blocks` blocks an SM, for a kernel
/// of `fixed` bytes of static shared memory.
fn target(device: DeviceLimits, fixed: u64, blocks: u64) -> u64 {
    (device.per_sm / blocks)
        .saturating_sub(device.reserved_per_block)
        .saturating_sub(fixed)
}

/// The launch attribute of a cluster of `blocks` blocks along x.
fn cluster_attribute(blocks: u32) -> sys::CUlaunchAttribute {
    let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
    value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: blocks,
        y: 1,
        z: 1,
    };
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value,
    }
}

/// The launch attribute of a cooperative launch: every block resident at once.
fn cooperative_attribute() -> sys::CUlaunchAttribute {
    let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
    value.cooperative = 1;
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
        pad: [0; 4],
        value,
    }
}

/// The launch configuration of `grid` blocks in clusters of `shape.cluster`, pointing at
/// `attribute` (the cluster dimension, or nothing for clusters of one).
fn config(
    stream: sys::CUstream,
    grid: u32,
    shape: Shape,
    attribute: &mut sys::CUlaunchAttribute,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: BLOCK,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shape.shared,
        hStream: stream,
        attrs: attribute,
        numAttrs: u32::from(shape.cluster > 1),
    }
}

/// How many clusters of `shape` the device runs at once, 0 when it can place none (clusters of
/// 16 may not fit the SMs of one GPC with that much shared memory each) or the driver will not
/// say. For clusters of one, blocks per SM times SMs.
fn resident_clusters(gpu: Gpu, function: &CudaFunction, shape: Shape) -> u32 {
    if shape.cluster == 1 {
        let per_sm = function.occupancy_max_active_blocks_per_multiprocessor(
            BLOCK,
            shape.shared as usize,
            None,
        );
        return per_sm.map_or(0, |blocks| blocks.saturating_mul(gpu.sm_count));
    }
    let mut attribute = cluster_attribute(shape.cluster);
    // The occupancy query reads the shape, not the stream.
    let config = config(std::ptr::null_mut(), shape.cluster, shape, &mut attribute);
    let mut clusters: std::ffi::c_int = 0;
    // SAFETY: `config` and the attribute it points at live until the call returns, and
    // `function` is a loaded kernel of this device's context, which `prepare` bound.
    let asked = unsafe {
        sys::cuOccupancyMaxActiveClusters(&mut clusters, function.cu_function(), &config)
    };
    match asked.result() {
        Ok(()) => u32::try_from(clusters).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Queues `function` on `grid` blocks of `shape` with the argument `slots`, a cooperative
/// launch where `cooperative`.
fn enqueue(
    gpu: Gpu,
    stream: sys::CUstream,
    function: sys::CUfunction,
    slots: &mut [u64],
    grid: u32,
    shape: Shape,
    cooperative: bool,
) -> Result<(), Error> {
    let mut params = param_array(slots);
    let mut attributes = [cluster_attribute(shape.cluster), cooperative_attribute()];
    let mut config = config(stream, grid, shape, &mut attributes[0]);
    if cooperative {
        // The cooperative attribute after the cluster's, or alone for clusters of one.
        let first = usize::from(shape.cluster == 1);
        config.attrs = &mut attributes[first];
        config.numAttrs = 2 - first as u32;
    }
    gpu.bind()?;
    // SAFETY: as for `launch::enqueue`, the arguments are the kernel's own parameters in order
    // (the macro wrote both from one signature), each read by the driver from its 8-byte slot
    // during this call; `params` points into `slots`, which outlives the call. The grid is a
    // multiple of the cluster size and the shared memory is at most the kernel's maximum, set
    // in `prepare` (or none); the kernel uses only the shared memory it is given (it checks the
    // size). `function` is a loaded kernel of the bound context. A cooperative grid is at most
    // the blocks the device holds at once (`launch::resident_blocks`, or `prepare`'s clusters).
    let launched = unsafe {
        sys::cuLaunchKernelEx(
            &config,
            function,
            params.as_mut_slice().as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    launched
        .result()
        .map_err(|e| driver_error("cuLaunchKernelEx", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100 or H200: 228 KiB per SM, 227 KiB per block with opt-in, 1 KiB reserved per
    /// block; for a kernel of 352 bytes of static shared memory (softmax's: two reductions'
    /// warp results, its cluster's exchange slots and transaction barriers), and with
    /// `FUSE_LONG_ROWS_PER_SM`'s `blocks` when given.
    fn hopper(blocks: Option<u64>) -> Limits {
        let device = DeviceLimits {
            per_sm: 233_472,
            per_block_optin: 232_448,
            reserved_per_block: 1024,
            clusters: true,
            l2: H100_L2,
        };
        Limits {
            per_block: 232_448 - 352,
            target: blocks.map(|blocks| target(device, 352, blocks)),
            cluster: MAX_CLUSTER,
        }
    }

    /// A model of how many clusters of a shape an H200 runs at once, for a kernel whose
    /// registers allow `most` blocks an SM: 132 SMs in GPCs of 16 and 18, each SM holding the
    /// blocks its shared memory and the registers allow, a cluster's blocks in one GPC.
    fn h200(most: u32) -> impl Fn(Shape) -> u32 {
        move |shape: Shape| {
            let by_memory = 233_472 / (u64::from(shape.shared) + 352 + 1024);
            let per_sm = (by_memory as u32).min(most);
            [16, 16, 16, 16, 16, 16, 18, 18]
                .iter()
                .map(|sms| sms * per_sm / shape.cluster)
                .sum()
        }
    }

    /// The cluster size chosen for rows of `len` floats.
    fn cluster(len: u64, limits: Limits, resident: impl Fn(Shape) -> u32) -> Option<u32> {
        split(len, 4, limits, resident)
    }

    /// The cluster size chosen for rows of `len` elements of `bytes` bytes.
    fn split(len: u64, bytes: u32, limits: Limits, resident: impl Fn(Shape) -> u32) -> Option<u32> {
        choose(&candidates(len, bytes, limits), resident, None).map(|(shape, _)| shape.cluster)
    }

    /// An H100's (and an H200's) L2: 50 MiB.
    const H100_L2: u64 = 50 << 20;

    /// The cluster size and resident blocks chosen for rows of `len` elements of a kernel with
    /// partial sums over rows (a grid that loops over rows), `cache_bytes` an element of which
    /// `sums` are the sums', registers allowing `most` blocks an SM.
    fn looping(len: u64, cache_bytes: u32, sums: u32, most: u32) -> Option<(u32, u32)> {
        let looping = Looping {
            row_bytes: len * u64::from(cache_bytes - sums),
            l2: H100_L2,
        };
        let resident = h200(most);
        choose(
            &candidates(len, cache_bytes, hopper(None)),
            &resident,
            Some(looping),
        )
        .map(|(shape, clusters)| (shape.cluster, clusters * shape.cluster))
    }

    #[test]
    fn a_looping_grid_keeps_its_rows_within_l2_and_takes_fewer_larger_parts() {
        // RMSNorm's backward in bf16 (x and dy, one f32 sum: 8 bytes an element; 72
        // registers, three blocks an SM): clusters of 1 / 2 / 4 at three an SM would hold
        // 13 MB of rows, so 2 / 3 / 5 (the fastest measured, benches/NOTES.md item 141), at
        // three an SM (clusters of 5: 370 blocks, a GPC's last SMs short of a cluster).
        assert_eq!(looping(8192, 8, 4, 3), Some((2, 396)));
        assert_eq!(looping(16384, 8, 4, 3), Some((3, 396)));
        assert_eq!(looping(32768, 8, 4, 3), Some((5, 370)));
        // LayerNorm's (two f32 sums: 12 bytes; 80 registers): clusters of 1 / 2 / 4 at two
        // blocks an SM, two thirds of the most, not 2 / 3 / 6 at three.
        assert_eq!(looping(8192, 12, 8, 3), Some((1, 264)));
        assert_eq!(looping(16384, 12, 8, 3), Some((2, 264)));
        assert_eq!(looping(32768, 12, 8, 3), Some((4, 264)));
        // Where no split keeps the rows within L2 (rows of 400000: 8 clusters of 14 to 16
        // hold 12.8 MB), the same rule over every split: the fewer blocks a row.
        let whole = Looping {
            row_bytes: 400_000 * 4,
            l2: H100_L2,
        };
        let candidates = candidates(400_000, 8, hopper(None));
        let chosen = choose(&candidates, h200(3), Some(whole)).map(|(s, _)| s.cluster);
        assert_eq!(chosen, Some(14));
        assert_eq!(choose(&candidates, |_| 0, Some(whole)), None);
    }

    #[test]
    fn parts_are_multiples_of_32() {
        assert_eq!(part(32768, 2), 16384);
        assert_eq!(part(40001, 3), 13344);
        assert_eq!(part(9, 4), 32);
        assert_eq!(long_row_shared_bytes(262_144, 16, 4), 65536);
    }

    /// The clusters an H100 ran at once of each cluster size from 1 (`FUSE_LONG_ROWS_TRACE`,
    /// benches/NOTES.md item 148), 0 where a size is not listed.
    fn h100(clusters: &[u32]) -> impl Fn(Shape) -> u32 + '_ {
        move |shape: Shape| {
            let i = shape.cluster as usize - 1;
            clusters.get(i).copied().unwrap_or(0)
        }
    }

    #[test]
    fn the_split_takes_the_fewest_blocks_a_row_of_lean_parts() {
        // The H100's resident clusters of S2's bf16 softmax at 262144 columns (no part of
        // clusters of 1 or 2 fits a block): 8 (parts of 65,536 bytes, 360 blocks), not 7
        // (74,944 bytes, 329) nor 16 (448, the most).
        let softmax = [0, 0, 39, 30, 47, 39, 47, 45, 37, 44, 37, 37, 30, 30, 28, 28];
        assert_eq!(split(262_144, 2, hopper(None), h100(&softmax)), Some(8));
        // G5's cross-entropy, rows of 128256: 4 (64,128 bytes, 368 blocks), not 5 (470), which
        // three quarters of the most (496) took.
        let entropy = [
            0, 66, 79, 92, 94, 79, 69, 62, 51, 44, 37, 37, 30, 30, 28, 28,
        ];
        assert_eq!(split(128_256, 2, hopper(None), h100(&entropy)), Some(4));
        // S1's softmax at 32768 floats: 2 (65,536 bytes, 396 blocks of 620), not 3.
        let floats = [
            132, 198, 203, 154, 124, 101, 84, 77, 60, 58, 51, 44, 42, 37, 37, 35,
        ];
        assert_eq!(split(32768, 4, hopper(None), h100(&floats)), Some(2));
        // Lean splits that keep less than half the most blocks: the fewest blocks a row that
        // keep three quarters of the most (clusters of 7, 329 blocks).
        let starved = [0, 0, 39, 30, 47, 39, 47, 10, 10, 10, 10, 10, 10, 10, 10, 10];
        assert_eq!(split(262_144, 2, hopper(None), h100(&starved)), Some(7));
    }

    #[test]
    fn the_split_on_a_model_h200() {
        // Rows of 900,000 floats have no lean split: the fewest blocks a row that keep three
        // quarters of the most.
        assert_eq!(cluster(900_000, hopper(None), h200(6)), Some(16));
        // On the model H200, softmax's long-row entry (40 registers, six blocks an SM): 32768
        // floats in clusters of 2 (three an SM, 396 blocks: half of the 792 of clusters of 4);
        // 262144 in 16 (parts of 64 KiB).
        assert_eq!(cluster(32768, hopper(None), h200(6)), Some(2));
        assert_eq!(cluster(262_144, hopper(None), h200(6)), Some(16));
        // A kernel of 128 registers: two blocks an SM whatever the parts, so the fewest blocks
        // a row of those that keep two an SM.
        assert_eq!(cluster(32768, hopper(None), h200(2)), Some(2));
        // Rows the register cache holds, kernels without the path, and rows no cluster holds
        // stream.
        assert!(candidates(4096, 4, hopper(None)).is_empty());
        assert!(candidates(1 << 15, 0, hopper(None)).is_empty());
        assert!(!candidates(4097, 4, hopper(None)).is_empty());
        assert_eq!(cluster(1 << 20, hopper(None), h200(6)), None);
        // Nothing resident (the driver said 0, or would not say): stream.
        assert_eq!(cluster(32768, hopper(None), |_| 0), None);
    }

    #[test]
    fn a_blocks_per_sm_target_takes_the_fewest_blocks_a_row_that_fit_it() {
        // FUSE_LONG_ROWS_PER_SM=4, as the rule before: 32768 floats in clusters of 3.
        assert_eq!(
            candidates(32768, 4, hopper(Some(4))),
            vec![Shape {
                cluster: 3,
                shared: 10944 * 4
            }]
        );
        assert_eq!(cluster(262_144, hopper(Some(3)), h200(6)), Some(14));
        // A target nothing fits: the most one block may have.
        assert_eq!(cluster(262_144, hopper(Some(6)), h200(6)), Some(5));
    }

    #[test]
    fn a100_caches_in_one_block_or_streams() {
        let a100 = Limits {
            per_block: 166_912,
            target: None,
            cluster: 1,
        };
        let resident = |shape: Shape| (167_936 / (u64::from(shape.shared) + 1024)) as u32 * 108;
        assert_eq!(cluster(32768, a100, resident), Some(1));
        assert_eq!(cluster(262_144, a100, resident), None);
    }

    #[test]
    fn grids_hold_the_resident_clusters_each_looping_over_rows() {
        // S1's softmax rows on an H200: 132 clusters of 3 resident, 8192 rows.
        assert_eq!(grid_clusters(8192, 132, 1), 132);
        assert_eq!(grid_clusters(8192, 132, 2), 264);
        assert_eq!(
            grid_clusters(100, 132, 1),
            100,
            "no more clusters than rows"
        );
        assert_eq!(
            grid_clusters(8192, 132, 0),
            8192,
            "0 waves: a cluster per row"
        );
        assert_eq!(
            grid_clusters(8192, u32::MAX, 1),
            8192,
            "more resident than rows"
        );
        assert_eq!(grid_clusters(1, 0, 1), 1);
    }
}
