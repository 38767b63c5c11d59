//! Running out of device memory in the middle of a sequence of `fuse!` calls: each call that
//! finds no memory (for its outputs, its stream's reduction scratch, or its module) is an
//! `Error`, never a panic, and once the memory is back later calls work and compute what the CPU
//! backend computes.
//!
//! The test fills the whole GPU, so it takes [`MEMORY`](super::MEMORY) whole: the other tests of
//! this binary wait for it, and it for them.

use fuse_runtime::{fuse, Buffer, Device, Error};

use super::{device, noise, MEMORY};

fuse! {
    /// Each row value plus each column value: an output far larger than its inputs, so that a
    /// few calls fill the GPU.
    fn outer(r: [f32; rows], c: [f32; cols]) -> [f32; rows, cols] {
        r + c
    }

    /// A full reduction beside a map: its first call on a stream allocates the stream's
    /// reduction scratch.
    fn squares_and_scaled(x: [f32; n]) -> (f32, [f32; n]) {
        (sum(x * x), x * 0.5 - 1.0)
    }

    /// A kernel first called while the GPU is full.
    fn loaded_while_full(x: [f32; n]) -> [f32; n] {
        (x * 0.25).abs() + 3.0
    }

    /// A kernel first called once the memory is back.
    fn loaded_after(x: [f32; n]) -> [f32; n] {
        x.max(0.0) - 2.0
    }
}

/// The columns of every `outer` call while filling: 2^15, so that 2^15 rows are 4 GiB.
const COLS: usize = 1 << 15;

/// The rows of the filling calls, from 4 GiB outputs down to 128 KiB ones.
fn fill_rows() -> impl Iterator<Item = usize> {
    (0..=15).map(|k| (1 << 15) >> k)
}

/// Far more 4 GiB calls than any GPU of today holds: a loop that gets past this never filled it.
const MAX_CALLS: usize = 4096;

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_mid_sequence_then_later_calls_work() {
    let _whole = MEMORY
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(dev) = device() else { return };
    // Everything the calls on a full GPU use is made first: inputs, a second stream (whose
    // scratch is not allocated yet) and preallocated outputs.
    let c = dev.upload(&vec![0.5f32; COLS]).unwrap();
    let rows: Vec<Buffer<f32>> = fill_rows()
        .map(|n| dev.upload(&vec![1.0f32; n]).unwrap())
        .collect();
    let fresh = dev.new_stream().unwrap();
    let x = dev.upload(&[1.0f32, -2.0, 3.0]).unwrap();
    let (mut total, mut scaled) = (dev.zeros(&[]).unwrap(), dev.zeros(&[3]).unwrap());
    let mut out = dev.zeros::<f32>(&[3]).unwrap();

    let held = fill_with_outer(&dev, &c, &rows);
    let rest = fill_the_rest(&dev);

    // The full reduction's scratch, the only allocation of this call, finds no memory.
    let err = squares_and_scaled::into(&fresh, &x, &mut total, &mut scaled).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    // A kernel's first call loads its module, which may need device memory too: an error if
    // there is none, never a panic.
    match loaded_while_full::into(&dev, &x, &mut out) {
        Ok(()) => eprintln!("the module loaded on a full GPU"),
        Err(e) => assert!(
            matches!(e, Error::OutOfMemory { .. }) || e.to_string().contains("OUT_OF_MEMORY"),
            "{e}"
        ),
    }

    drop((held, rest));
    dev.synchronize().unwrap();
    fresh.synchronize().unwrap();
    later_calls_match_the_cpu(&dev, &fresh);
    // The memory is all back: the largest call of the fill runs again.
    let big = outer(&dev, &rows[0], &c).unwrap();
    assert_eq!(big.shape(), [1 << 15, COLS]);
    drop(big);
    dev.synchronize().unwrap();
    give_back_pooled_memory(&dev);
}

/// Has the device's default memory pool, which keeps freed memory for later allocations, give
/// it all back to the driver: the tests after this one then find the GPU as a new process would.
fn give_back_pooled_memory(dev: &Device) {
    use fuse_runtime::cudarc::driver::sys;
    let ctx = dev.cuda_stream().unwrap().context();
    ctx.bind_to_thread().unwrap();
    let mut pool = std::ptr::null_mut();
    // SAFETY: the driver writes the default pool of a valid device into `pool`; trimming it
    // releases only memory no allocation holds. A device without memory pools has nothing to
    // give back.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS
        {
            sys::cuMemPoolTrimTo(pool, 0).result().unwrap();
        }
    }
}

/// Calls `outer` with outputs of 4 GiB, then ever smaller ones down to 128 KiB, each size until
/// it finds no memory, holding every output: the GPU is then full but for less than 128 KiB.
/// Each failure must be the output's allocation, as `Error::OutOfMemory` with its size.
fn fill_with_outer(dev: &Device, c: &Buffer<f32>, rows: &[Buffer<f32>]) -> Vec<Buffer<f32>> {
    let mut held = Vec::new();
    for r in rows {
        loop {
            assert!(held.len() < MAX_CALLS, "{} calls and no error", held.len());
            match outer(dev, r, c) {
                Ok(out) => held.push(out),
                Err(Error::OutOfMemory { bytes, .. }) => {
                    assert_eq!(bytes, r.len() * COLS * 4, "the output's size");
                    break;
                }
                Err(e) => panic!("{} rows: {e}", r.len()),
            }
        }
    }
    let gib = held.iter().map(|b| b.len() * 4).sum::<usize>() as f64 / (1u64 << 30) as f64;
    eprintln!("{} calls held {gib:.1} GiB of outputs", held.len());
    assert!(!held.is_empty(), "not even one call fitted");
    held
}

/// Takes what is left, in allocations of 64 KiB down to 1 byte, so that no allocation at all
/// fits: whatever the pool's granularity, the scratch of the next reduction cannot.
fn fill_the_rest(dev: &Device) -> Vec<Buffer<u8>> {
    let mut held = Vec::new();
    for bytes in (0..=16).map(|k| (1usize << 16) >> k) {
        loop {
            assert!(
                held.len() < MAX_CALLS,
                "{} small buffers and no error",
                held.len()
            );
            match dev.zeros::<u8>(&[bytes]) {
                Ok(b) => held.push(b),
                Err(Error::OutOfMemory { .. }) => break,
                Err(e) => panic!("{bytes} bytes: {e}"),
            }
        }
    }
    eprintln!("then {} small buffers", held.len());
    held
}

/// Every kernel on fresh random inputs of odd sizes, on both streams, against the CPU backend:
/// the memory and the modules that failed before work now, and so do kernels loaded only now.
fn later_calls_match_the_cpu(dev: &Device, fresh: &Device) {
    let cpu = Device::cpu();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    eprintln!("inputs from seed {seed:#x}");
    let floats = |n: usize, k: u64| -> Vec<f32> {
        noise(n, seed ^ k)
            .iter()
            .map(|&v| v as f32 / 37.0)
            .collect()
    };
    let (r, c) = (floats(1001, 1), floats(4099, 2));
    let want = outer(&cpu, &cpu.upload(&r).unwrap(), &cpu.upload(&c).unwrap()).unwrap();
    let got = outer(dev, &dev.upload(&r).unwrap(), &dev.upload(&c).unwrap()).unwrap();
    assert_close(
        "outer",
        &got.to_vec().unwrap(),
        &want.to_vec().unwrap(),
        0.0,
    );

    let x = floats(1_000_003, 3);
    let (cpu_x, gpu_x) = (cpu.upload(&x).unwrap(), fresh.upload(&x).unwrap());
    let (want_sum, want_scaled) = squares_and_scaled(&cpu, &cpu_x).unwrap();
    let (got_sum, got_scaled) = squares_and_scaled(fresh, &gpu_x).unwrap();
    // Any order of summing n terms is within n * eps of the sum of their magnitudes (here, the
    // sum itself); twice that for the CPU's own rounding.
    let (got_sum, want_sum) = (got_sum.to_vec().unwrap()[0], want_sum.to_vec().unwrap()[0]);
    let bound = 2.0 * x.len() as f64 * f64::from(f32::EPSILON) * f64::from(want_sum);
    assert!(
        f64::from((got_sum - want_sum).abs()) <= bound,
        "sum of squares: GPU {got_sum}, CPU {want_sum}, bound {bound}"
    );
    let (got, want) = (got_scaled.to_vec().unwrap(), want_scaled.to_vec().unwrap());
    assert_close("scaled", &got, &want, 1e-6);

    let y = floats(65_537, 4);
    let (cpu_y, gpu_y) = (cpu.upload(&y).unwrap(), dev.upload(&y).unwrap());
    let check = |what, got: Result<Buffer<f32>, Error>, want: Result<Buffer<f32>, Error>| {
        let (got, want) = (
            got.unwrap().to_vec().unwrap(),
            want.unwrap().to_vec().unwrap(),
        );
        assert_close(what, &got, &want, 1e-6);
    };
    check(
        "loaded_while_full",
        loaded_while_full(dev, &gpu_y),
        loaded_while_full(&cpu, &cpu_y),
    );
    check(
        "loaded_after",
        loaded_after(dev, &gpu_y),
        loaded_after(&cpu, &cpu_y),
    );
}

/// Each of `got` within `rel` of `want`, relative to the magnitude (and at least 1).
fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: GPU {g}, CPU {w}, tolerance {tol}"
        );
    }
}
