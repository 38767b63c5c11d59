//! The runtime on a real GPU: memory, device identity, hand-written launches through
//! `__private::launch`, the reduction scratch, the disk cache, and errors.
//!
//! Run with `cargo test -p fuse-runtime --test gpu_runtime -- --ignored`. Without a GPU each
//! test prints why and returns, unless `FUSE_REQUIRE_GPU=1`, which makes that a failure.
//! Running out of device memory in the middle of a sequence of calls is `gpu_memory.rs`'s.

mod gpu_kernels;
mod gpu_memory;

use std::ops::Deref;
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use fuse_runtime::__private::{alloc, bind, launch, Arg, Geometry};
use fuse_runtime::{Buffer, Device, Element, Error, KernelInfo};

use gpu_kernels::{ROW_MAX, SAXPY, SAXPY_SIG, SUM, THRESHOLD};

/// The GPU's memory, which every test of this binary shares and the out-of-memory test
/// (`gpu_memory.rs`) takes whole: the harness runs tests on several threads at once, and one that
/// fills the GPU would make the others fail.
static MEMORY: RwLock<()> = RwLock::new(());

/// CUDA device 0, with a share of its memory: no test fills it while this lives.
struct Gpu {
    dev: Device,
    _memory: RwLockReadGuard<'static, ()>,
}

impl Deref for Gpu {
    type Target = Device;

    fn deref(&self) -> &Device {
        &self.dev
    }
}

/// CUDA device 0 (see [`device`]), shared with the other tests.
fn gpu() -> Option<Gpu> {
    let memory = MEMORY.read().unwrap_or_else(PoisonError::into_inner);
    device().map(|dev| Gpu {
        dev,
        _memory: memory,
    })
}

/// CUDA device 0, or `None` (with the reason printed) when there is none.
fn device() -> Option<Device> {
    match Device::cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("FUSE_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("FUSE_REQUIRE_GPU=1, but there is no usable GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// Deterministic non-zero noise in [-1000, 1000), without an extra crate.
fn noise(n: usize, seed: u64) -> Vec<i64> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n).map(|_| (next() % 2000) as i64 - 1000).collect()
}

fn round_trip<T: Element>(dev: &Device, data: Vec<T>) {
    let buffer = dev.upload(&data).unwrap();
    assert_eq!(buffer.to_vec().unwrap(), data, "{}", T::NAME);
    let empty = dev.upload::<T>(&[]).unwrap();
    assert_eq!(empty.to_vec().unwrap(), Vec::<T>::new(), "{}", T::NAME);
    let scalar = dev.upload(&data[..1]).unwrap().reshape(&[]).unwrap();
    assert_eq!(scalar.to_vec().unwrap(), data[..1], "{}", T::NAME);
    let zeros = dev.zeros::<T>(&[3, 0, 5]).unwrap();
    assert!(zeros.is_empty() && zeros.to_vec().unwrap().is_empty());
    assert!(dev
        .zeros::<T>(&[7, 3])
        .unwrap()
        .to_vec()
        .unwrap()
        .iter()
        .all(|v| *v == T::default()));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn upload_round_trip_every_type() {
    let Some(dev) = gpu() else { return };
    let n = noise(1001, 1);
    round_trip(
        &dev,
        n.iter().map(|&v| v as f32 / 7.0).collect::<Vec<f32>>(),
    );
    round_trip(
        &dev,
        n.iter().map(|&v| v as f64 / 3.0).collect::<Vec<f64>>(),
    );
    round_trip(&dev, n.iter().map(|&v| v as i32).collect::<Vec<i32>>());
    round_trip(
        &dev,
        n.iter()
            .map(|&v| (v as u32).wrapping_mul(2_654_435_761))
            .collect::<Vec<u32>>(),
    );
    round_trip(
        &dev,
        n.iter().map(|&v| v * 1_000_000_007).collect::<Vec<i64>>(),
    );
    round_trip(
        &dev,
        n.iter().map(|&v| (v as u64) << 20).collect::<Vec<u64>>(),
    );
    round_trip(&dev, n.iter().map(|&v| v % 3 == 0).collect::<Vec<bool>>());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copy_from_and_reshape_share_storage() {
    let Some(dev) = gpu() else { return };
    let flat = dev.upload(&noise(35, 2)).unwrap();
    let mut m = flat.reshape(&[5, 7]).unwrap();
    let new = noise(35, 3);
    m.copy_from(&new).unwrap();
    assert_eq!(flat.to_vec().unwrap(), new);
    let err = m.copy_from(&new[..34]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Length {
                expected: 35,
                found: 34,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_identity() {
    let Some(dev) = gpu() else { return };
    let again = Device::cuda(0).unwrap();
    assert_eq!(*dev, again);
    assert_ne!(*dev, Device::cpu());
    assert!(dev.is_cuda() && !dev.is_cpu());
    assert_eq!(dev.ordinal(), Some(0));
    let (major, _) = dev.compute_capability().unwrap();
    assert!(major >= 7, "{}", *dev);
    let name = dev.to_string();
    assert!(
        name.starts_with("CUDA device 0: ") && name.contains("(sm_"),
        "{name}"
    );
    // Buffers from two handles of one device are interchangeable.
    let a = dev.upload(&[1.0f32, 2.0]).unwrap();
    let b = again.upload(&[3.0f32, 4.0]).unwrap();
    assert_eq!(a.device(), b.device());
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

/// What generated code does for `saxpy`: bind, allocate the output, launch.
fn saxpy(dev: &Device, x: &Buffer<f32>, y: &Buffer<f32>, a: f32) -> Result<Buffer<f32>, Error> {
    let probe = dev.zeros::<f32>(x.shape())?;
    let dims = bind(&SAXPY_SIG, dev, &[x, y, &probe])?;
    let out = alloc::<f32>(dev, &[dims[0]])?;
    let args = [
        Arg::Buffer(x),
        Arg::Buffer(y),
        Arg::Buffer(&out),
        Arg::Scalar(Element::to_bits(a)),
        Arg::Dim(dims[0]),
    ];
    launch(
        dev,
        &SAXPY,
        Geometry::Map {
            elems: dims[0] as u64,
            vectors: 1,
        },
        &args,
    )?;
    Ok(out)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn map_launch_with_odd_size() {
    let Some(dev) = gpu() else { return };
    for n in [4097, 1, 255, 257, 1_000_003] {
        let x: Vec<f32> = noise(n, 4).iter().map(|&v| v as f32 * 0.25).collect();
        let y: Vec<f32> = noise(n, 5).iter().map(|&v| v as f32 * 0.5).collect();
        let out = saxpy(
            &dev,
            &dev.upload(&x).unwrap(),
            &dev.upload(&y).unwrap(),
            -1.5,
        )
        .unwrap();
        let got = out.to_vec().unwrap();
        for i in 0..n {
            let want = -1.5f32 * x[i] + y[i];
            assert_eq!(got[i], want, "n = {n}, index {i}");
        }
    }
    // Zero elements: no launch, and no error.
    let empty = dev.upload::<f32>(&[]).unwrap();
    assert!(saxpy(&dev, &empty, &empty, 2.0).unwrap().is_empty());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bool_output_and_negative_int_scalar() {
    let Some(dev) = gpu() else { return };
    let x: Vec<i32> = noise(3001, 6).iter().map(|&v| v as i32).collect();
    let xb = dev.upload(&x).unwrap();
    let out = alloc::<bool>(&dev, &[x.len()]).unwrap();
    let args = [
        Arg::Buffer(&xb),
        Arg::Buffer(&out),
        Arg::Scalar(Element::to_bits(-17i32)),
        Arg::Dim(x.len()),
    ];
    launch(
        &dev,
        &THRESHOLD,
        Geometry::Map {
            elems: x.len() as u64,
            vectors: 1,
        },
        &args,
    )
    .unwrap();
    let want: Vec<bool> = x.iter().map(|&v| v > -17).collect();
    assert_eq!(out.to_vec().unwrap(), want);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rows_launch() {
    let Some(dev) = gpu() else { return };
    for (rows, cols) in [(37, 129), (5000, 3), (1, 1)] {
        let x: Vec<f32> = noise(rows * cols, 7)
            .iter()
            .map(|&v| v as f32 / 8.0)
            .collect();
        let xb = dev.upload(&x).unwrap().reshape(&[rows, cols]).unwrap();
        let out = alloc::<f32>(&dev, &[rows]).unwrap();
        let args = [
            Arg::Buffer(&xb),
            Arg::Buffer(&out),
            Arg::Dim(rows),
            Arg::Dim(cols),
        ];
        let geometry = Geometry::Rows {
            groups: rows as u64,
            row_len: cols as u64,
            cache_bytes: 0,
            blocks_per_sm: 40,
            direct_blocks_per_sm: 0,
        };
        launch(&dev, &ROW_MAX, geometry, &args).unwrap();
        let want: Vec<f32> = x
            .chunks(cols)
            .map(|r| r.iter().copied().fold(f32::MIN, f32::max))
            .collect();
        assert_eq!(out.to_vec().unwrap(), want, "{rows} x {cols}");
    }
}

fn gpu_sum(dev: &Device, data: &[i64]) -> i64 {
    let x = dev.upload(data).unwrap();
    let out = alloc::<i64>(dev, &[]).unwrap();
    let args = [Arg::Buffer(&x), Arg::Buffer(&out), Arg::Dim(data.len())];
    launch(
        dev,
        &SUM,
        Geometry::Full {
            elems: data.len() as u64,
            slots: 1,
        },
        &args,
    )
    .unwrap();
    out.to_vec().unwrap()[0]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn full_reduction_with_scratch_and_counter() {
    let Some(dev) = gpu() else { return };
    // Odd sizes, one past the largest grid, and repeats (the counter must be reset each time).
    for n in [1, 255, 4097, 100_003, 3_000_017, 100_003] {
        let data = noise(n, n as u64);
        assert_eq!(gpu_sum(&dev, &data), data.iter().sum::<i64>(), "n = {n}");
    }
    assert_eq!(
        gpu_sum(&dev, &[]),
        0,
        "an empty reduction still writes its result"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wrong_device_is_an_error() {
    let Some(dev) = gpu() else { return };
    let on_gpu = dev.upload(&[1.0f32; 9]).unwrap();
    let on_cpu = Device::cpu().upload(&[1.0f32; 9]).unwrap();
    let err = saxpy(&dev, &on_gpu, &on_cpu, 1.0).unwrap_err();
    assert!(
        matches!(err, Error::DeviceMismatch { ref param, .. } if param == "y"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("`saxpy`") && text.contains("CPU") && text.contains("CUDA device 0"),
        "{text}"
    );
    // `launch` checks too, even when `bind` was skipped.
    let out = alloc::<f32>(&dev, &[9]).unwrap();
    let args = [
        Arg::Buffer(&on_gpu),
        Arg::Buffer(&on_cpu),
        Arg::Buffer(&out),
        Arg::Scalar(0),
        Arg::Dim(9),
    ];
    let geometry = Geometry::Map {
        elems: 9,
        vectors: 1,
    };
    let err = launch(&dev, &SAXPY, geometry, &args).unwrap_err();
    assert!(
        matches!(err, Error::DeviceMismatch { ref param, .. } if param == "argument 1"),
        "{err}"
    );
    // And on the CPU device, launch refuses rather than crashing.
    let err = launch(&Device::cpu(), &SAXPY, geometry, &args).unwrap_err();
    assert!(matches!(err, Error::NotCuda { .. }), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn compiled_kernels_are_cached_on_disk() {
    let Some(dev) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("fuse-gpu-cache-{}", std::process::id()));
    fuse_runtime::set_cache_dir(Some(dir.clone()));
    // A source no other run has compiled, so the first use must compile it.
    let source = format!("{}\n// {:?}\n", SAXPY.source, std::time::SystemTime::now());
    let kernel: &'static KernelInfo = Box::leak(Box::new(KernelInfo {
        name: "saxpy_cached",
        symbol: "fuse_saxpy",
        source: Box::leak(source.into_boxed_str()),
        cubins: &[],
    }));
    let x = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let out = alloc::<f32>(&dev, &[3]).unwrap();
    let args = [
        Arg::Buffer(&x),
        Arg::Buffer(&x),
        Arg::Buffer(&out),
        Arg::Scalar(Element::to_bits(2.0f32)),
        Arg::Dim(3),
    ];
    launch(
        &dev,
        kernel,
        Geometry::Map {
            elems: 3,
            vectors: 1,
        },
        &args,
    )
    .unwrap();
    assert_eq!(out.to_vec().unwrap(), [3.0, 6.0, 9.0]);
    let (major, minor) = dev.compute_capability().unwrap();
    let arch = major * 10 + minor;
    let path = fuse_runtime::cache::entry_path(kernel.source, arch)
        .unwrap()
        .unwrap();
    assert!(path.exists(), "{}", path.display());
    let again = fuse_runtime::cache::cubin(kernel.source, "saxpy_cached.cu", arch).unwrap();
    assert!(again.from_disk, "the second compile must come from disk");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_is_an_error() {
    let Some(dev) = gpu() else { return };
    let err = dev.zeros::<f32>(&[1 << 40]).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            bytes: 4 << 40,
            device: dev.name()
        }
    );
    assert!(
        err.to_string()
            .starts_with("out of memory on CUDA device 0"),
        "{err}"
    );
    // The device still works afterwards.
    assert_eq!(dev.upload(&[7u32]).unwrap().to_vec().unwrap(), [7]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn compile_error_through_launch() {
    let Some(dev) = gpu() else { return };
    static BROKEN: KernelInfo = KernelInfo {
        name: "broken",
        symbol: "fuse_broken",
        source: "extern \"C\" __global__ void fuse_broken(float* x) {\n    x[0] = nope;\n}\n",
        cubins: &[],
    };
    let x = dev.upload(&[1.0f32]).unwrap();
    let err = launch(
        &dev,
        &BROKEN,
        Geometry::Map {
            elems: 1,
            vectors: 1,
        },
        &[Arg::Buffer(&x)],
    )
    .unwrap_err();
    let Error::Compile {
        ref kernel,
        ref line,
        ..
    } = err
    else {
        panic!("{err}")
    };
    assert_eq!(
        (kernel.as_str(), line.as_slice()),
        ("broken", &[(2, "    x[0] = nope;".to_string())][..])
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn concurrent_launches_from_threads() {
    let Some(dev) = gpu() else { return };
    let results: Vec<bool> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let dev = Device::cuda(0).unwrap();
                scope.spawn(move || {
                    let x: Vec<f32> = noise(10_007, t).iter().map(|&v| v as f32).collect();
                    let xb = dev.upload(&x).unwrap();
                    let out = saxpy(&dev, &xb, &xb, 3.0).unwrap().to_vec().unwrap();
                    let sum = gpu_sum(&dev, &noise(5_003, t + 100));
                    let sum_ok = sum == noise(5_003, t + 100).iter().sum::<i64>();
                    sum_ok && out.iter().zip(&x).all(|(o, v)| *o == 3.0 * v + v)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results, [true; 8]);
    dev.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn launch_overhead_is_small() {
    let Some(dev) = gpu() else { return };
    let x = dev.upload(&[1.0f32; 4097]).unwrap();
    let out = alloc::<f32>(&dev, &[4097]).unwrap();
    let args = [
        Arg::Buffer(&x),
        Arg::Buffer(&x),
        Arg::Buffer(&out),
        Arg::Scalar(0),
        Arg::Dim(4097),
    ];
    let geometry = Geometry::Map {
        elems: 4097,
        vectors: 1,
    };
    launch(&dev, &SAXPY, geometry, &args).unwrap();
    dev.synchronize().unwrap();
    let runs = 2000;
    let start = std::time::Instant::now();
    for _ in 0..runs {
        launch(&dev, &SAXPY, geometry, &args).unwrap();
    }
    dev.synchronize().unwrap();
    let per_launch = start.elapsed() / runs;
    eprintln!("{per_launch:?} per launch of a cached kernel, back to back");
    assert!(
        per_launch < std::time::Duration::from_micros(50),
        "{per_launch:?}"
    );
}
