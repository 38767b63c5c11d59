//! Which entry point each instance of the GPU run takes, and compiling those entries ahead.
//!
//! Each entry point of a `fn` is a CUDA module of its own, which the runtime compiles with NVRTC
//! on its first launch (0.1 to 1 s for a random program's entry), one at a time: it compiles
//! under its device's lock. Drawn at random, 34 shapes of a row program take most of its entries
//! (up to thirteen: eight short-row splits, the cached, register and cluster paths and the
//! streamed one), so the default batch's run compiled most of its 1256 entries one after the
//! other. Here instead a row program's instances take a few of its entries ([`Paths::PER_PROGRAM`]
//! by default), the row length of each instance chosen among the lengths that take its entry,
//! and the entries a program covers rotate with its place in the batch, so that the run as a
//! whole takes every entry kind of every shape of program. [`warm`] compiles an instance's
//! entries into the disk cache from the calling thread, before the launch: the test's threads
//! then compile side by side, and the runtime's locked first launch only reads the file.

use crate::ty::Rng;
use fuse_runtime::__private::{programs, DimRef, Entry, Program, Work};
use fuse_runtime::KernelInfo;

/// An entry point and the row lengths that take it.
type Taken = (&'static Entry, Vec<usize>);

/// One program's share of the run's entries.
pub struct Paths {
    /// The program as the runtime registered it.
    pub program: &'static Program,
    /// For row programs of several entries: the dim whose size is the row length (`dK` is
    /// `K`), and the entries this program's instances take, each with the lengths that take it.
    rows: Option<(usize, Vec<Taken>)>,
}

impl Paths {
    /// Entries a row program's instances take by default (`FUSE_RANDOM_PATHS`).
    pub const PER_PROGRAM: usize = 3;

    /// The paths of the program named `name`, the `index`-th of the batch, on a device of
    /// compute capability `arch`: `per_program` of its entries, with lengths of at most
    /// `budget`; `None` when the binary does not hold the program.
    pub fn new(
        name: &str,
        index: usize,
        arch: u32,
        budget: usize,
        per_program: usize,
    ) -> Option<Paths> {
        let program = programs().find(|p| p.name() == name)?;
        let rows = match program.work {
            Work::Rows {
                len: DimRef::Named(i),
                ..
            } if program.entries.len() > 1 => {
                let dim = program.signature.dims[i].strip_prefix('d')?.parse().ok()?;
                let taken = taken_by_length(program, arch, budget);
                let start = index.wrapping_mul(per_program) % taken.len().max(1);
                let chosen = (0..per_program.min(taken.len()))
                    .map(|j| taken[(start + j) % taken.len()].clone())
                    .collect();
                Some((dim, chosen))
            }
            _ => None,
        };
        Some(Paths { program, rows })
    }

    /// The row length of instance `k` (dim, size), drawn with `seed` among those of its entry;
    /// `None` for programs of one entry, whose instances draw every size at random.
    pub fn length(&self, k: usize, seed: u64) -> Option<(usize, usize)> {
        let (dim, chosen) = self.rows.as_ref()?;
        let (_, lengths) = chosen.get(k % chosen.len().max(1))?;
        let mut rng = Rng(seed ^ 0x1e46_7e45 ^ (k as u64) << 32);
        Some((*dim, rng.pick(lengths)))
    }

    /// The entries a launch at these dim sizes (`dK` has size `sizes[K]`) may load: the one it
    /// takes and, where that is a long-row entry that the device may refuse, the next one.
    /// Empty where the launch has no work.
    pub fn entries(&self, sizes: &[usize], arch: u32) -> Vec<&'static KernelInfo> {
        let dims: Vec<usize> = self
            .program
            .signature
            .dims
            .iter()
            .map(|d| {
                d.strip_prefix('d')
                    .and_then(|k| k.parse().ok())
                    .map_or(0, |k: usize| sizes[k])
            })
            .collect();
        let (groups, len) = self.program.work(&dims);
        if groups == 0 || len == 0 {
            return vec![];
        }
        let mut entries = vec![];
        for long_rows in [true, false] {
            if let Some(e) = self.program.pick(&dims, arch, long_rows) {
                if !entries
                    .iter()
                    .any(|k: &&KernelInfo| std::ptr::eq(*k, e.kernel))
                {
                    entries.push(e.kernel);
                }
            }
        }
        entries
    }
}

/// The entries of a row program that some length takes on `sm_{arch}`, in the order the host
/// tries them, each with those lengths (at most `budget`): the sizes the random shapes draw
/// from, and the edges of each entry's rule.
fn taken_by_length(program: &'static Program, arch: u32, budget: usize) -> Vec<Taken> {
    let mut lengths: Vec<u64> = crate::harness::size_choices().map(|n| n as u64).collect();
    for e in program.entries {
        let m = e.when.multiple_of.max(1);
        let low = e.when.min_len.div_ceil(m) * m;
        let high = e.when.max_len.min(budget as u64) / m * m;
        lengths.extend([
            low,
            low + m,
            high.saturating_sub(m),
            high,
            e.when.max_len.saturating_add(1),
        ]);
    }
    lengths.retain(|&n| n >= 1 && n <= budget as u64);
    lengths.sort_unstable();
    lengths.dedup();
    let mut taken: Vec<Taken> = vec![];
    for n in lengths {
        let Some(e) = program.entries.iter().find(|e| e.when.holds(n, arch)) else {
            continue;
        };
        match taken.iter_mut().find(|(t, _)| std::ptr::eq(*t, e)) {
            Some((_, ns)) => ns.push(n as usize),
            None => taken.push((e, vec![n as usize])),
        }
    }
    taken.sort_by_key(|(e, _)| program.entries.iter().position(|x| std::ptr::eq(x, *e)));
    taken
}

/// Compiles `kernel` for `sm_{arch}` into the disk cache unless it is there, from this thread:
/// whether NVRTC ran. Does nothing where the cache is off (the launch compiles it instead).
pub fn warm(kernel: &KernelInfo, arch: u32) -> Result<bool, String> {
    if fuse_runtime::cache_dir().is_none() {
        return Ok(false);
    }
    fuse_runtime::cache::cubin(kernel.source, &format!("{}.cu", kernel.name), arch)
        .map(|c| !c.from_disk)
        .map_err(|e| format!("{} for sm_{arch}: {e}", kernel.symbol))
}
