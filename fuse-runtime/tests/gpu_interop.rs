//! fuse on memory and streams it does not own: cudarc slices and views at any offset, raw
//! pointers, a caller's stream, two streams at once, CUDA graph capture and replay, and several
//! GPUs. Every result is compared with the CPU backend on fresh random inputs.
//!
//! Run with `cargo test -p fuse-runtime --test gpu_interop -- --ignored`. Without a GPU each
//! test prints why and returns, unless `FUSE_REQUIRE_GPU=1`, which makes that a failure.

mod common;

use std::sync::Arc;

use common::{assert_close, gpu, Rng, Tol};
use fuse_runtime::cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};
use fuse_runtime::{bf16, fuse, Buffer, BufferView, BufferViewMut, Device, Error};

fuse! {
    /// Elementwise, with a per-column broadcast.
    pub fn scale_shift(x: [f32; rows, cols], w: [f32; cols]) -> [f32; rows, cols] {
        (x * w + 0.5).tanh()
    }
    /// Rows: two reducing passes, and whole rows written.
    pub fn softmax(x: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }
    /// A full reduction, through the per-stream scratch.
    pub fn total(x: [f32; n]) -> f32 {
        sum(x * x)
    }
    /// 16-bit floats, computed in f32.
    pub fn bf16_gelu(x: [bf16; n]) -> [bf16; n] {
        gelu(x)
    }
    /// RMSNorm, whose backward sums `w`'s gradient over the rows in its one launch: a
    /// cooperative launch with a barrier of the grid, its partial sums in the stream's scratch.
    #[vjp(x, w)]
    pub fn rmsnorm(x: [f32; rows, cols], w: [f32; cols]) -> [f32; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * w
    }
    /// Only ever called inside a capture, to see the error that asks to load it first.
    pub fn never_loaded(x: [f32; n]) -> [f32; n] {
        x * 3.0 - 1.0
    }
}

fn stream_of(dev: &Device) -> Arc<CudaStream> {
    dev.cuda_stream()
        .expect("a CUDA device has a stream")
        .clone()
}

fn upload(stream: &Arc<CudaStream>, data: &[f32]) -> CudaSlice<f32> {
    stream.clone_htod(data).expect("copy to the GPU")
}

/// The CPU backend's result of `f` on `x` (rows x cols).
fn on_cpu<T: fuse_runtime::Element>(
    f: impl Fn(&Device, &Buffer<T>) -> Result<Buffer<T>, Error>,
    x: &[T],
    shape: &[usize],
) -> Vec<T> {
    let cpu = Device::cpu();
    let x = cpu.upload(x).unwrap().reshape(shape).unwrap();
    f(&cpu, &x).unwrap().to_vec().unwrap()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Views of cudarc memory at element offsets 0 to 4 (1 to 3 are not 16-byte aligned) into
/// every kind of kernel, written into views at offsets too: the results equal the CPU's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn views_at_any_offset_run_every_path() {
    let Some(dev) = gpu() else { return };
    let stream = stream_of(&dev);
    let mut rng = Rng::new();
    for (rows, cols) in [(3, 37), (5, 1024), (2, 5003), (1, 20000)] {
        let n = rows * cols;
        let x: Vec<f32> = rng.floats(n, -3.0, 3.0);
        let w: Vec<f32> = rng.floats(cols, -2.0, 2.0);
        let cpu = Device::cpu();
        let (xc, wc) = (
            cpu.upload(&x).unwrap().reshape(&[rows, cols]).unwrap(),
            cpu.upload(&w).unwrap(),
        );
        let want_map = f64s(&scale_shift(&cpu, &xc, &wc).unwrap().to_vec().unwrap());
        let want_rows = f64s(&on_cpu(softmax, &x, &[rows, cols]));
        let want_sum = f64::from(
            total(&cpu, &xc.reshape(&[n]).unwrap())
                .unwrap()
                .to_vec()
                .unwrap()[0],
        );
        for offset in 0..5 {
            let mut padded = vec![7.0f32; offset];
            padded.extend_from_slice(&x);
            let src = upload(&stream, &padded);
            let wsrc = upload(&stream, &[&vec![1.0f32; offset][..], &w].concat());
            let mut out = stream.alloc_zeros::<f32>(n + offset).unwrap();
            let view = src.slice(offset..);
            let xv = BufferView::<f32>::new(&dev, &view, &[rows, cols]).unwrap();
            let wview = wsrc.slice(offset..);
            let wv = BufferView::<f32>::new(&dev, &wview, &[cols]).unwrap();
            let what = format!("{rows}x{cols} at offset {offset}");
            {
                let mut out_view = out.slice_mut(offset..);
                let mut ov = BufferViewMut::<f32>::new(&dev, &mut out_view, &[rows, cols]).unwrap();
                scale_shift::into(&dev, &xv, &wv, &mut ov).unwrap();
                let got = ov.to_vec().unwrap();
                assert_close(
                    &format!("scale_shift {what}"),
                    &got,
                    &want_map,
                    &Tol::close(1e-6, 1e-6),
                );
                softmax::into(&dev, &xv, &mut ov).unwrap();
                let got = ov.to_vec().unwrap();
                assert_close(
                    &format!("softmax {what}"),
                    &got,
                    &want_rows,
                    &Tol::close(1e-5, 1e-7),
                );
            }
            // Nothing before the view was written.
            let head = stream.clone_dtoh(&out.slice(..offset)).unwrap();
            assert!(head.iter().all(|&v| v == 0.0), "{what}: {head:?}");
            let flat = xv.reshape(&[n]).unwrap();
            let got = total(&dev, &flat).unwrap().to_vec().unwrap()[0];
            let tol = 1e-5 * want_sum.abs().max(1.0);
            assert!(
                (f64::from(got) - want_sum).abs() <= tol,
                "total {what}: {got} against {want_sum}"
            );
        }
    }
}

/// A cudarc slice taken into a `Buffer` and given back, with no copy; bf16 held as its bits
/// (`u16`); and every mismatch an error that gives the value back.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_slices_into_buffers_and_back() {
    let Some(dev) = gpu() else { return };
    let stream = stream_of(&dev);
    let mut rng = Rng::new();
    let x: Vec<bf16> = rng.floats(1001, -4.0, 4.0);
    let bits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
    let slice = stream.clone_htod(&bits).unwrap();
    let address = {
        let (ptr, _sync) = fuse_runtime::cudarc::driver::DevicePtr::device_ptr(&slice, &stream);
        ptr
    };
    let buffer = Buffer::<bf16>::from_cuda_slice(&dev, slice, &[1001]).unwrap();
    let y = bf16_gelu(&dev, &buffer).unwrap().to_vec().unwrap();
    let want: Vec<f64> = on_cpu(bf16_gelu, &x, &[1001])
        .iter()
        .map(|v| v.to_f64())
        .collect();
    // An ulp of bf16 apart at most: erf differs in its last f32 bits between the backends.
    assert_close(
        "bf16 gelu on a cudarc slice",
        &y,
        &want,
        &Tol::close(1.0 / 128.0, 1e-6),
    );
    let back: CudaSlice<u16> = buffer.into_cuda_slice().unwrap();
    let (ptr, _sync) = fuse_runtime::cudarc::driver::DevicePtr::device_ptr(&back, &stream);
    assert_eq!(ptr, address, "the same allocation, not a copy");
    assert_eq!(stream.clone_dtoh(&back).unwrap(), bits);

    // Another element type: the slice comes back.
    let doubles = stream.clone_htod(&[1.0f64, 2.0]).unwrap();
    let rejected = Buffer::<f32>::from_cuda_slice(&dev, doubles, &[2]).unwrap_err();
    assert!(
        matches!(rejected.error, Error::Interop { param: "slice", .. }),
        "{}",
        rejected.error
    );
    assert!(
        rejected.error.to_string().contains("f64"),
        "{}",
        rejected.error
    );
    assert_eq!(stream.clone_dtoh(&rejected.value).unwrap(), [1.0, 2.0]);
    // Another length.
    let short = upload(&stream, &[1.0, 2.0, 3.0]);
    let rejected = Buffer::<f32>::from_cuda_slice(&dev, short, &[2, 2]).unwrap_err();
    assert!(
        matches!(rejected.error, Error::Interop { param: "shape", .. }),
        "{}",
        rejected.error
    );
    // A shared buffer cannot be given up; the buffer comes back whole.
    let shared = Buffer::<f32>::from_cuda_slice(&dev, rejected.value, &[3]).unwrap();
    let other = shared.reshape(&[3, 1]).unwrap();
    let rejected = shared.into_cuda_slice::<f32>().unwrap_err();
    assert!(
        matches!(rejected.error, Error::Interop { param: "self", .. }),
        "{}",
        rejected.error
    );
    assert_eq!(rejected.value.to_vec().unwrap(), [1.0, 2.0, 3.0]);
    drop(rejected);
    assert!(
        other.into_cuda_slice::<f32>().is_ok(),
        "the last handle gives it up"
    );
    // A view of the wrong length or type.
    let data = upload(&stream, &[1.0; 12]);
    let err = BufferView::<f32>::new(&dev, &data, &[5, 2]).unwrap_err();
    assert!(
        matches!(err, Error::Interop { param: "shape", .. }),
        "{err}"
    );
    let err = BufferView::<i32>::new(&dev, &data, &[12]).unwrap_err();
    assert!(matches!(err, Error::Interop { param: "src", .. }), "{err}");
    let err = BufferView::<f32>::new(&Device::cpu(), &data, &[12]).unwrap_err();
    assert!(matches!(err, Error::Interop { param: "dev", .. }), "{err}");
}

/// An output that shares memory with an input (a `reshape` handle, or raw views that overlap)
/// is an error that names both, on the GPU as on the CPU; nothing is launched.
#[test]
#[ignore = "needs a CUDA GPU"]
fn outputs_sharing_memory_are_errors() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::new();
    let data: Vec<f32> = rng.floats(6 * 40, -1.0, 1.0);
    for on in [dev.clone(), Device::cpu()] {
        let x = on.upload(&data).unwrap().reshape(&[6, 40]).unwrap();
        let mut same = x.reshape(&[6, 40]).unwrap();
        let err = softmax::into(&on, &x, &mut same).unwrap_err();
        assert!(
            matches!(&err, Error::Alias { output, other, .. } if output == "out" && other == "x"),
            "{on}: {err}"
        );
        assert_eq!(x.to_vec().unwrap(), data, "{on}: nothing was written");
    }
    let stream = stream_of(&dev);
    let memory = upload(&stream, &[&data[..200], &data[..200]].concat());
    let (address, _sync) = fuse_runtime::cudarc::driver::DevicePtr::device_ptr(&memory, &stream);
    // SAFETY (both blocks): the views lie inside `memory`, 400 floats, which outlives them; the
    // overlapping call is refused before anything reads or writes them.
    let (x, mut y) = unsafe {
        (
            BufferView::<f32>::from_raw(&dev, address, &[5, 40]).unwrap(),
            BufferViewMut::<f32>::from_raw(&dev, address + 4 * 40, &[5, 40]).unwrap(),
        )
    };
    let err = softmax::into(&dev, &x, &mut y).unwrap_err();
    assert!(matches!(err, Error::Alias { .. }), "{err}");
    // Side by side, not overlapping: it runs.
    let mut y =
        unsafe { BufferViewMut::<f32>::from_raw(&dev, address + 4 * 200, &[5, 40]) }.unwrap();
    softmax::into(&dev, &x, &mut y).unwrap();
    let want = f64s(&on_cpu(softmax, &data[..200], &[5, 40]));
    assert_close(
        "softmax beside its input",
        &y.to_vec().unwrap(),
        &want,
        &Tol::close(1e-5, 1e-7),
    );
}

/// A raw device pointer, checked with the driver: inside its allocation, on this GPU, aligned.
#[test]
#[ignore = "needs a CUDA GPU"]
fn raw_pointers_are_checked() {
    let Some(dev) = gpu() else { return };
    let stream = stream_of(&dev);
    let mut rng = Rng::new();
    let x: Vec<f32> = rng.floats(999, -2.0, 2.0);
    let slice = upload(&stream, &x);
    let (address, _sync) = fuse_runtime::cudarc::driver::DevicePtr::device_ptr(&slice, &stream);
    // SAFETY: `slice` holds 999 f32s and outlives the view; nothing else writes it.
    let view = unsafe { BufferView::<f32>::from_raw(&dev, address + 4, &[998]) }.unwrap();
    let got = softmax(&dev, &view.reshape(&[2, 499]).unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    let want = f64s(&on_cpu(softmax, &x[1..], &[2, 499]));
    assert_close(
        "softmax of a raw pointer",
        &got,
        &want,
        &Tol::close(1e-5, 1e-7),
    );
    // SAFETY (each): the checks below reject the pointer before anything reads it.
    let past_end = unsafe { BufferView::<f32>::from_raw(&dev, address + 8, &[999]) }.unwrap_err();
    assert!(
        matches!(
            past_end,
            Error::Interop {
                param: "address",
                ..
            }
        ),
        "{past_end}"
    );
    let odd = unsafe { BufferView::<f32>::from_raw(&dev, address + 2, &[4]) }.unwrap_err();
    assert!(
        matches!(
            odd,
            Error::Interop {
                param: "address",
                ..
            }
        ),
        "{odd}"
    );
    let host = x.as_ptr() as u64;
    let err = unsafe { BufferViewMut::<f32>::from_raw(&dev, host, &[4]) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Interop {
                param: "address",
                ..
            }
        ),
        "{err}"
    );
    let err = unsafe { BufferView::<f32>::from_raw(&dev, 0, &[4]) }.unwrap_err();
    assert!(matches!(err, Error::Interop { .. }), "{err}");
}

/// A device made from the caller's cudarc stream queues on it, in order with the caller's own
/// copies; `Device::cuda` queues on a stream of its own, not the legacy default stream.
#[test]
#[ignore = "needs a CUDA GPU"]
fn kernels_run_on_the_callers_stream() {
    let Some(own) = gpu() else { return };
    assert!(
        !stream_of(&own).cu_stream().is_null(),
        "not the legacy default stream"
    );
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let dev = Device::from_cuda_stream(stream.clone()).unwrap();
    assert_eq!(dev.cuda_stream(), Some(&stream));
    assert!(dev == own && !dev.same_stream(&own), "one GPU, two streams");
    let mut rng = Rng::new();
    let (rows, cols) = (129, 300);
    let x: Vec<f32> = rng.floats(rows * cols, -5.0, 5.0);
    let mut src = stream.alloc_zeros::<f32>(rows * cols).unwrap();
    let want = f64s(&on_cpu(softmax, &x, &[rows, cols]));
    let mut out = stream.alloc_zeros::<f32>(rows * cols).unwrap();
    for _ in 0..20 {
        // The caller's copy, fuse's kernel and the caller's read, queued back to back on one
        // stream with no synchronization between them.
        stream.memcpy_htod(&x, &mut src).unwrap();
        let xv = BufferView::<f32>::new(&dev, &src, &[rows, cols]).unwrap();
        let mut ov = BufferViewMut::<f32>::new(&dev, &mut out, &[rows, cols]).unwrap();
        softmax::into(&dev, &xv, &mut ov).unwrap();
        drop((xv, ov));
        stream.memset_zeros(&mut src).unwrap();
        let got = stream.clone_dtoh(&out).unwrap();
        assert_close(
            "softmax on the caller's stream",
            &got,
            &want,
            &Tol::close(1e-5, 1e-7),
        );
    }
    // A raw handle of the same stream.
    // SAFETY: `stream` is a live stream of device 0's primary context and outlives `raw`.
    let raw = unsafe { own.with_raw_stream(stream.cu_stream()) }.unwrap();
    assert!(raw.same_stream(&dev));
}

/// Two streams of one GPU, each running full reductions (with their own scratch) back to back
/// without synchronizing: every result is right.
#[test]
#[ignore = "needs a CUDA GPU"]
fn two_streams_run_full_reductions_at_once() {
    let Some(dev) = gpu() else { return };
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    assert!(!a.same_stream(&b) && a == b);
    let mut rng = Rng::new();
    let inputs: Vec<Vec<f32>> = (0..8)
        .map(|i| rng.floats(300_000 + 7919 * i, -1.0, 1.0))
        .collect();
    let want: Vec<f64> = inputs
        .iter()
        .map(|x| x.iter().map(|&v| f64::from(v) * f64::from(v)).sum())
        .collect();
    let on = |dev: &Device| -> Vec<(Buffer<f32>, Buffer<f32>)> {
        inputs
            .iter()
            .map(|x| {
                let x = dev.upload(x).unwrap();
                let out = dev.zeros::<f32>(&[]).unwrap();
                (x, out)
            })
            .collect()
    };
    let (mut on_a, mut on_b) = (on(&a), on(&b));
    for _ in 0..25 {
        for ((xa, oa), (xb, ob)) in on_a.iter_mut().zip(on_b.iter_mut()) {
            total::into(&a, &*xa, oa).unwrap();
            total::into(&b, &*xb, ob).unwrap();
        }
    }
    for (i, ((_, oa), (_, ob))) in on_a.iter().zip(&on_b).enumerate() {
        for (name, out) in [("a", oa), ("b", ob)] {
            let got = f64::from(out.to_vec().unwrap()[0]);
            assert!(
                (got - want[i]).abs() <= 1e-4 * want[i],
                "stream {name}, input {i}: {got} against {}",
                want[i]
            );
        }
    }
}

/// Three kernels (elementwise, rows, a full reduction) and a caller's copy captured into a CUDA
/// graph once and replayed many times on new inputs: each replay gives the CPU's results.
#[test]
#[ignore = "needs a CUDA GPU"]
fn captured_graphs_replay() {
    let Some(own) = gpu() else { return };
    let dev = own.new_stream().unwrap();
    let stream = stream_of(&dev);
    let (rows, cols) = (64, 1000);
    let mut rng = Rng::new();
    let w: Vec<f32> = rng.floats(cols, -1.0, 1.0);
    let x = dev.zeros::<f32>(&[rows, cols]).unwrap();
    let wb = dev.upload(&w).unwrap();
    let (mut h, mut p, mut s) = (
        dev.zeros::<f32>(&[rows, cols]).unwrap(),
        dev.zeros::<f32>(&[rows, cols]).unwrap(),
        dev.zeros::<f32>(&[]).unwrap(),
    );
    for load in [scale_shift::load, softmax::load, total::load] {
        load(&dev).unwrap();
    }
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    scale_shift::into(&dev, &x, &wb, &mut h).unwrap();
    softmax::into(&dev, &h, &mut p).unwrap();
    total::into(&dev, &p.reshape(&[rows * cols]).unwrap(), &mut s).unwrap();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("a graph");
    let cpu = Device::cpu();
    let wc = cpu.upload(&w).unwrap();
    let mut x = x;
    for replay in 0..30 {
        let data: Vec<f32> = rng.floats(rows * cols, -4.0, 4.0);
        x.copy_from(&data).unwrap();
        graph.launch().unwrap();
        let xc = cpu.upload(&data).unwrap().reshape(&[rows, cols]).unwrap();
        let pc = softmax(&cpu, &scale_shift(&cpu, &xc, &wc).unwrap()).unwrap();
        let sc = total(&cpu, &pc.reshape(&[rows * cols]).unwrap()).unwrap();
        let what = format!("replay {replay}");
        assert_close(
            &what,
            &p.to_vec().unwrap(),
            &f64s(&pc.to_vec().unwrap()),
            &Tol::close(1e-5, 1e-7),
        );
        let (got, want) = (s.to_vec().unwrap()[0], sc.to_vec().unwrap()[0]);
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{what}: {got} against {want}"
        );
    }
}

/// A derived backward that sums over rows (`rmsnorm::vjp`, one cooperative launch) captured
/// into a CUDA graph after a call outside it (which loads the kernel and sizes the stream's
/// scratch), its gradients copied into the caller's buffers, and replayed on new inputs: each
/// replay gives the CPU's gradients, so the graph's barrier of the grid and the counters it
/// zeroes work again every time.
#[test]
#[ignore = "needs a CUDA GPU"]
fn captured_backward_replays() {
    let Some(own) = gpu() else { return };
    let dev = own.new_stream().unwrap();
    let stream = stream_of(&dev);
    let (rows, cols) = (3001, 1000);
    let mut rng = Rng::new();
    let w: Vec<f32> = rng.floats(cols, -2.0, 2.0);
    let wb = dev.upload(&w).unwrap();
    let mut x = dev.zeros::<f32>(&[rows, cols]).unwrap();
    let mut dy = dev.zeros::<f32>(&[rows, cols]).unwrap();
    x.copy_from(&rng.floats(rows * cols, -2.0, 2.0)).unwrap();
    dy.copy_from(&rng.floats(rows * cols, -1.0, 1.0)).unwrap();
    rmsnorm::vjp(&dev, &x, &wb, &dy).unwrap();
    let (mut dx, mut dw) = (
        dev.zeros::<f32>(&[rows, cols]).unwrap(),
        dev.zeros::<f32>(&[cols]).unwrap(),
    );
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    let g = rmsnorm::vjp(&dev, &x, &wb, &dy).unwrap();
    g.x.copy_to(&mut dx).unwrap();
    g.w.copy_to(&mut dw).unwrap();
    drop(g);
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("a graph");
    let cpu = Device::cpu();
    let wc = cpu.upload(&w).unwrap();
    for replay in 0..10 {
        let (xs, dys): (Vec<f32>, Vec<f32>) = (
            rng.floats(rows * cols, -2.0, 2.0),
            rng.floats(rows * cols, -1.0, 1.0),
        );
        x.copy_from(&xs).unwrap();
        dy.copy_from(&dys).unwrap();
        graph.launch().unwrap();
        let shape = [rows, cols];
        let xc = cpu.upload(&xs).unwrap().reshape(&shape).unwrap();
        let dyc = cpu.upload(&dys).unwrap().reshape(&shape).unwrap();
        let want = rmsnorm::vjp(&cpu, &xc, &wc, &dyc).unwrap();
        let what = format!("replay {replay}");
        assert_close(
            &format!("{what}: dx"),
            &dx.to_vec().unwrap(),
            &f64s(&want.x.to_vec().unwrap()),
            &Tol::close(1e-4, 1e-4),
        );
        // Sums of 3001 terms of magnitude up to about 4, in another order.
        assert_close(
            &format!("{what}: dw"),
            &dw.to_vec().unwrap(),
            &f64s(&want.w.to_vec().unwrap()),
            &Tol::close(1e-4, 4.0 * rows as f64 * 1e-5),
        );
    }
}

/// A kernel used inside a capture before its first load is an error that says to load it, and
/// the capture survives it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn capture_of_an_unloaded_kernel_is_an_error() {
    let Some(own) = gpu() else { return };
    let dev = own.new_stream().unwrap();
    let stream = stream_of(&dev);
    let x = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let mut y = dev.zeros::<f32>(&[3]).unwrap();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    let err = never_loaded::into(&dev, &x, &mut y).unwrap_err();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap();
    assert!(matches!(err, Error::Capture { .. }), "{err}");
    assert!(err.to_string().contains("never_loaded::load"), "{err}");
    drop(graph);
    never_loaded::load(&dev).unwrap();
    never_loaded::into(&dev, &x, &mut y).unwrap();
    assert_eq!(y.to_vec().unwrap(), [2.0, 5.0, 8.0]);
}

/// Every GPU of the machine: buffers and kernels on each, and memory of one GPU refused by
/// another with an error. On a machine with one GPU, device 1 is `NoDevice`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gpu_runs_kernels_on_its_own_memory() {
    let Some(first) = gpu() else { return };
    let count = Device::cuda_count();
    assert!(count >= 1);
    let mut rng = Rng::new();
    let x: Vec<f32> = rng.floats(31 * 133, -3.0, 3.0);
    let want = f64s(&on_cpu(softmax, &x, &[31, 133]));
    let devices: Vec<Device> = (0..count).map(|i| Device::cuda(i).unwrap()).collect();
    for (i, dev) in devices.iter().enumerate() {
        assert_eq!(dev.ordinal(), Some(i));
        let xb = dev.upload(&x).unwrap().reshape(&[31, 133]).unwrap();
        let got = softmax(dev, &xb).unwrap().to_vec().unwrap();
        assert_close(
            &format!("softmax on GPU {i}"),
            &got,
            &want,
            &Tol::close(1e-6, 0.0),
        );
    }
    match devices.get(1) {
        Some(second) => {
            let on_second = upload(&stream_of(second), &x);
            let err = BufferView::<f32>::new(&first, &on_second, &[x.len()]).unwrap_err();
            assert!(matches!(err, Error::Interop { param: "src", .. }), "{err}");
            let xb = second.upload(&x).unwrap();
            let err = softmax(&first, &xb.reshape(&[31, 133]).unwrap()).unwrap_err();
            assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
        }
        None => assert!(matches!(Device::cuda(1), Err(Error::NoDevice { .. }))),
    }
}
