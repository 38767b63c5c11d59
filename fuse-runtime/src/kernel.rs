//! The entry points of `fuse!` kernels as the runtime loads them: each a CUDA module of its own,
//! and the registry of every kernel of the program.

/// One entry point of a kernel defined by `fuse!`: its own CUDA module, compiled on first use.
/// A `fn` has one for each path of its launch (`name::ENTRIES`), the general one last.
#[derive(Debug)]
pub struct KernelInfo {
    /// The Rust fn name, such as `"softmax"`.
    pub name: &'static str,
    /// The CUDA entry point, such as `"fuse_softmax"`.
    pub symbol: &'static str,
    /// The CUDA C text of the kernel's module.
    pub source: &'static str,
    /// CUBINs compiled from `source` when the crate was built, as (architecture, CUBIN), such as
    /// `(90, ..)` for sm_90: one for each architecture `FUSE_CUBIN_ARCHS` named, or none.
    pub cubins: &'static [(u32, &'static [u8])],
}

impl KernelInfo {
    /// The CUBIN embedded for `sm_{arch}`, if the crate was built with one.
    ///
    /// ```
    /// # use fuse_runtime::KernelInfo;
    /// let kernel = KernelInfo { name: "k", symbol: "fuse_k", source: "", cubins: &[(90, b"\x7fELF")] };
    /// assert_eq!(kernel.cubin(90), Some(&b"\x7fELF"[..]));
    /// assert_eq!(kernel.cubin(80), None);
    /// ```
    pub fn cubin(&self, arch: u32) -> Option<&'static [u8]> {
        self.cubins
            .iter()
            .find(|(embedded, _)| *embedded == arch)
            .map(|(_, cubin)| *cubin)
    }
}

inventory::collect!(KernelInfo);

/// The entry points of one `fn`, the general one last, as generated code registers them with
/// [`inventory`] (`Family(&name::ENTRIES)`).
#[derive(Debug)]
pub struct Family(pub &'static [&'static KernelInfo]);

inventory::collect!(Family);

/// The entry points of the `fn` that `kernel` is an entry point of (the same symbol and text),
/// if it is a registered `fn`'s.
pub(crate) fn family(kernel: &KernelInfo) -> Option<&'static [&'static KernelInfo]> {
    let same = |other: &&KernelInfo| {
        std::ptr::eq(*other, kernel)
            || (other.symbol == kernel.symbol && other.source == kernel.source)
    };
    inventory::iter::<Family>
        .into_iter()
        .find(|f| f.0.iter().any(same))
        .map(|f| f.0)
}

/// Every kernel defined with `fuse!` in the program, in no particular order: each `fn` once, as
/// its general entry point (the one `name::CUDA_SOURCE` holds; `name::ENTRIES` has them all).
///
/// ```
/// for kernel in fuse_runtime::kernels() {
///     println!("{} ({} bytes of CUDA C, {} CUBINs)", kernel.name, kernel.source.len(), kernel.cubins.len());
/// }
/// ```
pub fn kernels() -> impl Iterator<Item = &'static KernelInfo> {
    let general = inventory::iter::<Family>
        .into_iter()
        .filter_map(|f| f.0.last().copied());
    general.chain(inventory::iter::<KernelInfo>)
}
