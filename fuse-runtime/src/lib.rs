//! Fused GPU kernels from a small expression language, with a CPU fallback.
//!
//! The [`fuse!`] macro turns kernel definitions into one CUDA C kernel each, at compile time,
//! plus Rust code that does the same work on the CPU. This crate runs them: it compiles the
//! CUDA C with NVRTC straight to CUBIN on first use (cached on disk), and launches it on typed,
//! shaped buffers; or, on the CPU device, it runs the generated Rust.
//!
//! | Concept | Rust on the CPU | fuse, on the CPU or a GPU |
//! | --- | --- | --- |
//! | Memory | the heap | a [`Device`]: [`Device::cpu()`] or [`Device::cuda(0)`](Device::cuda) |
//! | An array | `Vec<T>` | [`Buffer<T>`], with a shape |
//! | Copying data in | `data.to_vec()` | [`Device::upload`] |
//! | Zeros | `vec![0; n]` | [`Device::zeros`] |
//! | Another shape, same data | `v.chunks(n)` | [`Buffer::reshape`] |
//! | Reading data out | (already there) | [`Buffer::to_vec`], which waits for the GPU |
//! | A function | `fn` | a kernel in [`fuse!`] |
//! | Its compiler | `rustc`, ahead of time | NVRTC at first use, cached on disk ([`nvrtc`], [`cache`]), or at build time (`FUSE_CUBIN_ARCHS`) |
//! | Calling it | runs now | queued, in order, on the device handle's stream |
//! | Waiting for it | (returns when done) | [`Device::synchronize`] |
//! | Memory you already have | a slice | [`BufferView`], [`BufferViewMut`], [`Buffer::from_cuda_slice`] (cudarc memory, raw pointers) |
//! | A stream you already have | — | [`Device::from_cuda_stream`], [`Device::with_raw_stream`] |
//!
//! Generated kernels take a [`Device`] and buffers; the same call runs on either device, so
//! code can be written once and tested on the CPU.
//!
//! # Getting started
//!
//! 1. Pick a device: the first GPU if there is one, else the CPU.
//!
//! ```
//! use fuse_runtime::Device;
//! let dev = Device::detect();
//! println!("running on {dev}"); // "CUDA device 0: NVIDIA H100 80GB HBM3 (sm_90)" or "CPU"
//! ```
//!
//! 2. Put data on it, and give it a shape.
//!
//! ```
//! # use fuse_runtime::Device;
//! # let dev = Device::detect();
//! let x = dev.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?.reshape(&[2, 3])?;
//! let counts = dev.zeros::<i32>(&[2, 3])?;
//! assert_eq!((x.shape(), counts.len()), (&[2, 3][..], 6));
//! # Ok::<(), fuse_runtime::Error>(())
//! ```
//!
//! 3. Read it back; on a GPU this waits for the kernels queued before.
//!
//! ```
//! # use fuse_runtime::Device;
//! # let dev = Device::detect();
//! # let x = dev.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?.reshape(&[2, 3])?;
//! assert_eq!(x.to_vec()?, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
//! # Ok::<(), fuse_runtime::Error>(())
//! ```
//!
//! 4. Handle errors: every failure is an [`Error`] whose message is a full sentence.
//!
//! ```
//! # use fuse_runtime::{Device, Error};
//! let x = Device::cpu().upload(&[1u32, 2, 3])?;
//! let err = x.reshape(&[2, 2]).unwrap_err();
//! assert!(matches!(err, Error::Reshape { .. }));
//! println!("{err}"); // cannot reshape a buffer of shape [3] (3 elements) to [2, 2] (4 elements)
//! # Ok::<(), fuse_runtime::Error>(())
//! ```
//!
//! # Where things are looked for
//!
//! - The CUDA driver (`libcuda`) and NVRTC (`libnvrtc`) are loaded at run time, by the names
//!   [`nvrtc::candidates`] lists. A CUDA 13 NVRTC from the `nvidia-cuda-nvrtc` wheel ships only
//!   `libnvrtc.so.13`: link `libnvrtc.so` to it and put its directory on `LD_LIBRARY_PATH`.
//!   Without them, [`Device::cuda`] returns [`Error::NoDriver`] and launches return
//!   [`Error::NoNvrtc`]; nothing panics, and the CPU device always works.
//! - Compiled kernels are cached in `FUSE_CACHE_DIR`, else `$XDG_CACHE_HOME/fuse`, else
//!   `$HOME/.cache/fuse`; see [`cache`].
//! - Row kernels read rows too long for registers into shared memory once (split over a
//!   thread-block cluster on sm_90) rather than once per pass; `FUSE_LONG_ROWS=0` makes them
//!   stream such rows instead, to compare the two.
//!
//! # Build-time CUBINs: no NVRTC at the first call
//!
//! By default the first call of each kernel in a process compiles it with NVRTC (tens to hundreds
//! of milliseconds), or reads it from the disk cache. To ship programs that skip both, name the
//! GPU architectures to compile for when building:
//!
//! ```sh
//! FUSE_CUBIN_ARCHS=sm_90 cargo build --release      # or sm_80,sm_90; `90` also works
//! ```
//!
//! The [`fuse!`] macro then compiles each kernel with NVRTC for each architecture named, with
//! the options the runtime uses, and embeds the CUBINs in the program beside the CUDA C. On a GPU
//! of one of those architectures the first call only loads the module (about a millisecond); on
//! any other GPU the CUDA C is compiled at run time as usual. Cargo rebuilds the crates that use
//! `fuse!` when the variable changes.
//!
//! - NVRTC must be on `LD_LIBRARY_PATH` when building (it is looked for as `libnvrtc.so`,
//!   `libnvrtc.so.13` and `libnvrtc.so.12`); the program does not need it on those GPUs.
//! - Since the variable asks for it, a missing NVRTC, an architecture it does not compile for or
//!   text that is not an architecture (`sm_90a`, `volta`) fails the build, with the fix in the
//!   message, at the first kernel of each `fuse!`.
//! - A driver older than the build's NVRTC may reject its CUBINs; the runtime then compiles the
//!   CUDA C, as it would without them.
//! - [`Device::kernel_origin`] tells whether a kernel was loaded from its embedded CUBIN, the disk
//!   cache or NVRTC; [`cache::set_embedded_cubins`]`(false)` ignores the embedded CUBINs.
//!
//! # Interop
//!
//! fuse kernels run on the caller's cudarc streams and memory (candle's, CubeCL's), at any
//! element offset, inside CUDA graphs, and on several GPUs: the "Interop" section of
//! [`language`] has the table "you have X, call Y" and the rules of each `unsafe` constructor.
//!
//! ## Language reference
//!
//! The language of [`fuse!`], the generated API and every error are described in [`language`]
//! (also `doc/language.md` in the repository).

#![warn(missing_docs)]

mod buffer;
pub mod cache;
mod copy;
mod cuda;
mod device;
mod element;
mod error;
// Generated code never calls it: the benchmark reaches it as `__private::floors`.
#[doc(hidden)]
pub mod floors;
mod foreign;
mod fp8;
mod grid;
mod inline;
mod kernel;
mod launch;
mod libs;
mod long_rows;
pub mod nvrtc;
// Declared here rather than inside `__private` so that it is the file `src/ops.rs`; generated
// code reaches it as `__private::ops`.
#[doc(hidden)]
#[allow(missing_docs)]
pub mod ops;
mod private;
mod program;
mod queue;
pub mod random;
mod tensor;
mod timer;
mod view;

pub use buffer::Buffer;
pub use cache::{cache_dir, set_cache_dir};
/// The cudarc this crate is built on, for the interop constructors ([`Device::from_cuda_stream`],
/// [`Buffer::from_cuda_slice`], [`BufferView::new`]) and for NCCL: name cudarc through this path
/// (or depend on the same version, 0.19) so that its types are the ones fuse takes.
pub use cudarc;
pub use device::Device;
pub use element::Element;
pub use error::Error;
/// The `float8` crate, whose [`F8E4M3`] and [`F8E5M2`] are the language's fp8 element types,
/// `f8e4m3` and `f8e5m2` (candle's types for them too).
pub use float8;
pub use float8::{F8E4M3, F8E5M2};
pub use foreign::Rejected;
pub use fuse_macros::fuse;
/// The `half` crate, whose [`f16`](struct@f16) and [`bf16`] are the language's 16-bit float element types.
pub use half;
pub use half::{bf16, f16};
pub use kernel::{kernels, KernelInfo};
pub use tensor::{Input, Output};
pub use timer::Timer;
pub use view::{BufferView, BufferViewMut};

/// The interface the code generated by [`fuse!`] calls; not for hand-written code, and not
/// covered by semver. See `doc/PRIVATE_API.md`.
#[doc(hidden)]
pub mod __private {
    pub use crate::floors;
    pub use crate::grid::{Geometry, BLOCK};
    pub use crate::kernel::{kernels, Family, KernelInfo};
    pub use crate::launch::{launch, launch_long_rows, Arg};
    pub use crate::long_rows::long_row_shared_bytes;
    pub use crate::ops;
    pub use crate::private::{
        alloc, alloc_zeroed, bind, bind_written, host_read, host_write, is_cpu, reciprocal,
        round_key, shape_of, DimRef, Signature, Sizes, TensorSig,
    };
    pub use crate::program::{
        launch_program, programs, Entry, Grid, Param, Program, Registered, When, Work,
    };
    pub use crate::tensor::AnyBuffer;
    pub use crate::{Buffer, Device, Element, Error};
    pub use inventory;
}

#[doc = include_str!("../../doc/language.md")]
pub mod language {}
