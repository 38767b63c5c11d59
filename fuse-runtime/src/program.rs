//! A kernel's schedule as the macro planned it (`fuse-macros/src/plan/program.rs`): its entry
//! points, one per path, the argument list they share, and the rule that picks one. Generated
//! code hands a [`Program`] and the call's tensors, scalars and dims to [`launch_program`], which
//! checks them against it, fills every argument slot from the program's [`Param`]s, picks the
//! entry and launches it.

use cudarc::driver::{sys, LaunchConfig};

use crate::device::Device;
use crate::error::Error;
use crate::grid::{Geometry, Slots, INLINE_SLOTS};
use crate::inline::Inline;
use crate::kernel::KernelInfo;
use crate::launch::{enqueue, launch_entry, BufferSlot};
use crate::private::{reciprocal, round_key, DimRef, Signature};
use crate::queue::Queue;
use crate::tensor::AnyBuffer;

/// The schedule of one `fn` of `fuse!`.
#[derive(Debug)]
pub struct Program {
    /// The tensors and named dims the call was bound against.
    pub signature: &'static Signature,
    /// The parameters of every entry point, in order.
    pub params: &'static [Param],
    /// What the launch iterates over, from the dims.
    pub work: Work,
    /// The entry points, in the order they are tried; the last takes every shape.
    pub entries: &'static [Entry],
}

/// A program as generated code registers it with [`inventory`], for [`programs`].
#[derive(Debug)]
pub struct Registered(pub &'static Program);

inventory::collect!(Registered);

/// Every program of the binary, in no particular order: each `fn` of `fuse!` with all its entry
/// points (where [`kernels`](crate::kernels) lists each `fn` once, by its general entry).
pub fn programs() -> impl Iterator<Item = &'static Program> {
    inventory::iter::<Registered>.into_iter().map(|r| r.0)
}

/// One kernel parameter, an 8-byte slot, and where its value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// Tensor `tensor` of the call (an index into [`Signature::tensors`]), an input, whose
    /// elements take `bytes` bytes: its device address.
    #[allow(missing_docs)]
    Input { tensor: usize, bytes: u32 },
    /// Tensor `tensor` of the call, an output: its device address.
    #[allow(missing_docs)]
    Output { tensor: usize, bytes: u32 },
    /// Scalar `index` of the call: its bits.
    Scalar(usize),
    /// Named dim `index`: its size.
    Dim(usize),
    /// `reciprocal(product of dims / by)`, for an elementwise kernel's index arithmetic.
    #[allow(missing_docs)]
    Reciprocal { dims: &'static [DimRef], by: u32 },
    /// Philox's key of round `round` for the seed in scalar `seed`.
    #[allow(missing_docs)]
    RoundKey { seed: usize, round: u32 },
    /// A full reduction's scratch (at least `slots * gridDim.x` 8-byte slots), or a column
    /// reduction's (`slots * parts * groups`).
    Scratch,
    /// A full reduction's counter, or a column reduction's one a tile, zero before the launch
    /// (the kernel's last block, or each tile's, resets it).
    Counter,
}

/// What a launch iterates over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The elements of a domain (elementwise kernels and full reductions).
    Elements(&'static [DimRef]),
    /// Rows: the dims besides the reduced one, and the reduced one.
    #[allow(missing_docs)]
    Rows {
        rows: &'static [DimRef],
        len: DimRef,
    },
}

/// One entry point of a program.
#[derive(Debug)]
pub struct Entry {
    /// Its module and symbol.
    pub kernel: &'static KernelInfo,
    /// The path's name, such as `"short_rows"`.
    pub path: &'static str,
    /// When it is taken.
    pub when: When,
    /// How its grid is sized.
    pub grid: Grid,
}

/// When an entry is taken: every condition holds. For elementwise kernels and full reductions
/// the length is the number of elements; for row kernels, the row length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct When {
    /// The shortest length.
    pub min_len: u64,
    /// The longest length.
    pub max_len: u64,
    /// Lengths that are multiples of this.
    pub multiple_of: u64,
    /// The least compute capability, major * 10 + minor.
    pub min_arch: u32,
    /// Only where the device has the shared memory for the rows; otherwise the next entry.
    pub long_rows: bool,
    /// Only where the size of the groups' innermost dim (a column reduction's columns) is a
    /// multiple of this.
    pub inner_multiple_of: u64,
}

/// How an entry's grid is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    /// `vectors` 4-element vectors a thread.
    #[allow(missing_docs)]
    Map { vectors: u32 },
    /// At most `blocks_per_sm` blocks an SM (0: a block a row).
    #[allow(missing_docs)]
    Rows { blocks_per_sm: u32 },
    /// As `Rows`, a block a row: a kernel that sums over rows, a row of partial sums a block
    /// in the scratch, `sums` bytes a column, then a barrier of the grid (a cooperative
    /// launch, every block resident) and the column sums; launched even for no rows.
    #[allow(missing_docs)]
    Parts { blocks_per_sm: u32, sums: u32 },
    /// As `Parts`, a block a chunk of up to `CACHE * BLOCK` columns of a row (the row split
    /// into as few such chunks as evenly as it goes), each block's chunk the same in every row
    /// it takes.
    #[allow(missing_docs)]
    Chunks { blocks_per_sm: u32, sums: u32 },
    /// A cluster a row in dynamic shared memory, `cache_bytes` a row element; with `sums`
    /// (not 0), a kernel that sums over rows as for `Parts`, a row of partial sums a cluster:
    /// as many clusters as the device runs at once.
    #[allow(missing_docs)]
    LongRows { cache_bytes: u32, sums: u32 },
    /// `slots` scratch slots a block.
    #[allow(missing_docs)]
    Full { slots: u32 },
    /// A block a tile of columns, `width` adjacent ones a lane, aiming at `blocks_per_sm` blocks
    /// an SM; with `split`, tiles split along the reduced dim, `slots` scratch slots a column of
    /// each part.
    #[allow(missing_docs)]
    Columns {
        slots: u32,
        split: bool,
        blocks_per_sm: u32,
        width: u32,
    },
}

impl Grid {
    /// The bytes a column of a row of partial sums takes in the launch's scratch, for a kernel
    /// that sums over rows; 0 for any other.
    pub fn sums(&self) -> u32 {
        match *self {
            Grid::Parts { sums, .. } | Grid::Chunks { sums, .. } | Grid::LongRows { sums, .. } => {
                sums
            }
            _ => 0,
        }
    }
}

impl When {
    /// Whether rows (or domains) of `len` on a device of compute capability `arch` may take it,
    /// as far as the length says (see [`When::holds_inner`] for the groups' innermost dim).
    pub fn holds(&self, len: u64, arch: u32) -> bool {
        (self.min_len..=self.max_len).contains(&len)
            && len.is_multiple_of(self.multiple_of.max(1))
            && arch >= self.min_arch
    }

    /// Whether groups whose innermost dim has size `inner` may take it.
    pub fn holds_inner(&self, inner: u64) -> bool {
        inner.is_multiple_of(self.inner_multiple_of.max(1))
    }
}

impl Program {
    /// The kernel's Rust name.
    pub fn name(&self) -> &'static str {
        self.signature.kernel
    }

    /// The groups (rows; 1 for elementwise kernels and full reductions) and the length (of a
    /// row, or of the domain) of a launch with these dims.
    pub fn work(&self, dims: &[usize]) -> (u64, u64) {
        let size = |d: &DimRef| d.size(dims) as u64;
        let product = |ds: &[DimRef]| ds.iter().map(size).fold(1u64, u64::saturating_mul);
        match self.work {
            Work::Elements(domain) => (1, product(domain)),
            Work::Rows { rows, len } => (product(rows), size(&len)),
        }
    }

    /// The entries a launch with these dims may take on a device of compute capability `arch`,
    /// in order: the host takes the first, unless it is a long-row entry the device cannot run,
    /// in which case the next.
    pub fn candidates(&self, dims: &[usize], arch: u32) -> impl Iterator<Item = &'static Entry> {
        let (_, len) = self.work(dims);
        let inner = self.inner(dims);
        self.entries
            .iter()
            .filter(move |e| e.when.holds(len, arch) && e.when.holds_inner(inner))
    }

    /// The size of the groups' innermost dim (a column reduction's columns); 1 without groups.
    fn inner(&self, dims: &[usize]) -> u64 {
        match self.work {
            Work::Rows { rows, .. } => rows.last().map_or(1, |d| d.size(dims) as u64),
            Work::Elements(_) => 1,
        }
    }

    /// The entry a launch with these dims takes on a device of compute capability `arch`,
    /// given whether the device would run the long-row entry (`long_rows`).
    pub fn pick(&self, dims: &[usize], arch: u32, long_rows: bool) -> Option<&'static Entry> {
        self.candidates(dims, arch)
            .find(|e| long_rows || !e.when.long_rows)
    }

    /// The value of each argument slot but the scratch's, which the launch fills: from the
    /// call's tensors (their device addresses), scalars and dims. Checks every index and every
    /// tensor's shape and size against the program.
    pub(crate) fn slots(
        &self,
        dev: &Device,
        dims: &[usize],
        tensors: &[&dyn AnyBuffer],
        scalars: &[u64],
    ) -> Result<Slots, Error> {
        let sig = self.signature;
        let internal = |detail: String| Error::Internal {
            detail: format!("kernel `{}`: {detail}", sig.kernel),
        };
        if tensors.len() != sig.tensors.len() || dims.len() != sig.dims.len() {
            return Err(internal(format!(
                "launched with {} tensors and {} dims, but it takes {} and {}",
                tensors.len(),
                dims.len(),
                sig.tensors.len(),
                sig.dims.len()
            )));
        }
        let mut slots = Inline::new(0u64, self.params.len());
        for (slot, param) in slots.as_mut_slice().iter_mut().zip(self.params) {
            *slot = match *param {
                Param::Input { tensor, bytes } | Param::Output { tensor, bytes } => {
                    let (Some(&buffer), Some(declared)) =
                        (tensors.get(tensor), sig.tensors.get(tensor))
                    else {
                        return Err(internal(format!("no tensor {tensor}")));
                    };
                    let output = matches!(param, Param::Output { .. });
                    let shape = crate::private::shape_of(sig, tensor, dims);
                    let elems = shape.iter().fold(1usize, |a, &n| a.saturating_mul(n));
                    if declared.output != output
                        || buffer.shape() != &*shape
                        || buffer.bytes() != elems.saturating_mul(bytes as usize)
                    {
                        return Err(internal(format!(
                            "tensor `{}` has shape {:?} and {} bytes, but the kernel takes {:?} of {bytes}-byte elements{}",
                            declared.name,
                            buffer.shape(),
                            buffer.bytes(),
                            &*shape,
                            if output { " to write" } else { "" }
                        )));
                    }
                    match buffer.device_address() {
                        Some(address) if buffer.device() == dev => address,
                        _ => {
                            return Err(Error::DeviceMismatch {
                                kernel: sig.kernel.to_string(),
                                param: declared.name.to_string(),
                                expected: dev.name(),
                                found: buffer.device().name(),
                            })
                        }
                    }
                }
                Param::Scalar(i) => *scalars
                    .get(i)
                    .ok_or_else(|| internal(format!("no scalar {i}")))?,
                Param::Dim(i) => {
                    *dims.get(i).ok_or_else(|| internal(format!("no dim {i}")))? as u64
                }
                Param::Reciprocal { dims: of, by } => {
                    let size = of
                        .iter()
                        .fold(1u64, |a, d| a.saturating_mul(d.size(dims) as u64));
                    reciprocal(size / u64::from(by.max(1)))
                }
                Param::RoundKey { seed, round } => {
                    let seed = *scalars
                        .get(seed)
                        .ok_or_else(|| internal(format!("no scalar {seed}")))?;
                    round_key(seed, round)
                }
                Param::Scratch | Param::Counter => 0,
            };
        }
        Ok(slots)
    }

    /// The geometry `entry` launches with for these dims.
    pub(crate) fn geometry(&self, entry: &Entry, dims: &[usize]) -> Geometry {
        let (groups, len) = self.work(dims);
        match entry.grid {
            Grid::Map { vectors } => Geometry::Map {
                elems: len,
                vectors,
            },
            Grid::Full { slots } => Geometry::Full { elems: len, slots },
            Grid::Rows { blocks_per_sm } => Geometry::Rows {
                groups,
                row_len: len,
                cache_bytes: 0,
                blocks_per_sm,
                direct_blocks_per_sm: 0,
            },
            // A launch even for no rows, whose sums are then zeros.
            Grid::Parts { blocks_per_sm, .. } => Geometry::Rows {
                groups: groups.max(1),
                row_len: len,
                cache_bytes: 0,
                blocks_per_sm,
                direct_blocks_per_sm: 0,
            },
            // A group a chunk of a row, as the kernel splits it.
            Grid::Chunks { blocks_per_sm, .. } => {
                let chunks = len.div_ceil(crate::grid::REGISTER_ROW).max(1);
                Geometry::Rows {
                    groups: groups.saturating_mul(chunks).max(1),
                    row_len: len,
                    cache_bytes: 0,
                    blocks_per_sm,
                    direct_blocks_per_sm: 0,
                }
            }
            Grid::Columns {
                slots,
                split,
                blocks_per_sm,
                width,
            } => Geometry::Columns {
                groups,
                len,
                slots,
                split,
                blocks_per_sm,
                width,
            },
            // With sums over rows, launched even for no rows, its clusters resident.
            Grid::LongRows { cache_bytes, sums } => Geometry::Rows {
                groups: match sums {
                    0 => groups,
                    _ => groups.max(1),
                },
                row_len: len,
                cache_bytes,
                blocks_per_sm: u32::from(sums > 0),
                direct_blocks_per_sm: 0,
            },
        }
    }
}

/// Launches `program` on `dev`'s stream for a call with these named `dims` (as
/// [`bind`](crate::__private::bind) returned them), `tensors` (inputs then outputs, in
/// [`Signature::tensors`] order) and `scalars` (each one's bits, in order).
///
/// Safe for any arguments: the argument count, each tensor's kind, device, shape and bytes, and
/// every index are checked against the program before anything is queued, and a mismatch is an
/// [`Error::Internal`] (or [`Error::DeviceMismatch`]). What it cannot check is the program
/// itself: its entries' CUDA signatures must be its `params`, which holds for every program
/// the macro writes (both come from one value, `fuse-macros/src/plan/program.rs`).
pub fn launch_program(
    dev: &Device,
    program: &'static Program,
    dims: &[usize],
    tensors: &[&dyn AnyBuffer],
    scalars: &[u64],
) -> Result<(), Error> {
    launch_program_with(dev, program, dims, tensors, scalars, enqueue)
}

/// [`launch_program`] with `submit` in place of the call that queues the kernel (the
/// benchmark's hooks time the host's share alone with it; a long-row launch ignores it).
pub(crate) fn launch_program_with(
    dev: &Device,
    program: &'static Program,
    dims: &[usize],
    tensors: &[&dyn AnyBuffer],
    scalars: &[u64],
    submit: impl FnOnce(&Queue, sys::CUfunction, LaunchConfig, &mut [u64]) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut submit = Some(submit);
    let queue = dev.queue(program.name())?;
    let mut slots = program.slots(dev, dims, tensors, scalars)?;
    let mut buffers = Inline::<BufferSlot, INLINE_SLOTS>::new(BufferSlot::NONE, tensors.len());
    let tensor_slots = program
        .params
        .iter()
        .enumerate()
        .filter_map(|(slot, p)| match *p {
            Param::Input { tensor, .. } => Some((slot, tensor, false)),
            Param::Output { tensor, .. } => Some((slot, tensor, true)),
            _ => None,
        });
    for ((slot, tensor, output), buffer) in tensor_slots.zip(buffers.as_mut_slice()) {
        *buffer = BufferSlot {
            slot,
            bytes: tensors.get(tensor).map_or(0, |t| t.bytes()),
            output,
        };
    }
    let (major, minor) = queue.cuda.capability;
    let arch = major * 10 + minor;
    for entry in program.candidates(dims, arch) {
        let geometry = program.geometry(entry, dims);
        if launch_entry(
            queue,
            entry.kernel,
            geometry,
            slots.as_mut_slice(),
            buffers.as_slice(),
            entry.when.long_rows,
            entry.grid.sums(),
            |queue, function, config, slots| match submit.take() {
                Some(submit) => submit(queue, function, config, slots),
                None => Ok(()),
            },
        )? {
            return Ok(());
        }
    }
    Err(Error::Internal {
        detail: format!(
            "kernel `{}`: no entry point takes dims {dims:?} on sm_{arch}",
            program.name()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::{grid, REGISTER_ROW};

    static SIGNATURE: Signature = Signature {
        kernel: "chunks",
        dims: &["t", "h"],
        tensors: &[],
    };
    static PROGRAM: Program = Program {
        signature: &SIGNATURE,
        params: &[],
        work: Work::Rows {
            rows: &[DimRef::Named(0)],
            len: DimRef::Named(1),
        },
        entries: &[],
    };
    static KERNEL: KernelInfo = KernelInfo {
        name: "chunks",
        symbol: "fuse_chunks_chunked_rows",
        source: "",
        cubins: &[],
    };

    /// The chunked entry's grid: a group a chunk of each row, as many blocks as the SMs hold
    /// (`blocks_per_sm` each), and a launch even for no rows (whose sums are zeros).
    #[test]
    fn chunked_rows_take_a_block_a_chunk() {
        let entry = Entry {
            kernel: &KERNEL,
            path: "chunked_rows",
            when: When {
                min_len: REGISTER_ROW + 1,
                max_len: 64 * REGISTER_ROW,
                multiple_of: 4,
                min_arch: 90,
                long_rows: false,
                inner_multiple_of: 1,
            },
            grid: Grid::Chunks {
                blocks_per_sm: 2,
                sums: 4,
            },
        };
        let groups = |t: usize, h: usize| match PROGRAM.geometry(&entry, &[t, h]) {
            Geometry::Rows { groups, .. } => groups,
            other => panic!("{other:?}"),
        };
        assert_eq!(groups(7, 4100), 14);
        assert_eq!(groups(7, 16384), 28);
        assert_eq!(groups(3, 16388), 15);
        assert_eq!(groups(100_000, 8192), 200_000);
        assert_eq!(groups(0, 8192), 1);
        let blocks = |t, h| grid(PROGRAM.geometry(&entry, &[t, h]), 132, 9);
        if std::env::var_os("FUSE_ROW_BLOCKS_PER_SM").is_none() {
            assert_eq!(blocks(16384, 16384), Some(264));
            assert_eq!(blocks(7, 16384), Some(28));
        }
    }
}
