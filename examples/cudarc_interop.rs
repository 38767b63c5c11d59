//! fuse inside a cudarc program: cudarc allocates and fills the memory on a stream it created,
//! a `fuse!` kernel computes on that memory on that stream (no copy, no synchronization), and a
//! cudarc kernel compiled with NVRTC consumes the result. Checked against plain Rust in f64.
//!
//! Run it with `cargo run --example cudarc_interop`. It needs a GPU: without one it says so and
//! exits (with status 1 when `FUSE_REQUIRE_GPU=1`).

use std::process::ExitCode;

use fuse_runtime::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use fuse_runtime::cudarc::nvrtc::compile_ptx;
use fuse_runtime::{fuse, BufferView, BufferViewMut, Device};

fuse! {
    /// RMSNorm of each row, with a weight per column.
    pub fn rmsnorm(x: [f32; rows, cols], w: [f32; cols]) -> [f32; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * w
    }
}

/// A plain CUDA kernel of the caller's: adds each row's index to its elements, in place.
const ADD_ROW: &str = r#"
extern "C" __global__ void add_row(float* y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] += (float)(i / cols);
}
"#;

const ROWS: usize = 67;
const COLS: usize = 1000;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    if Device::cuda_count() == 0 {
        println!("cudarc_interop needs a CUDA GPU; none found");
        return Ok(std::env::var("FUSE_REQUIRE_GPU").as_deref() != Ok("1"));
    }
    // The caller's context, stream and memory, all cudarc's.
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let x: Vec<f32> = (0..ROWS * COLS)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
        .collect();
    let w: Vec<f32> = (0..COLS).map(|j| 0.5 + (j % 7) as f32 / 7.0).collect();
    let x_dev = stream.clone_htod(&x)?;
    let w_dev = stream.clone_htod(&w)?;
    let mut y_dev = stream.alloc_zeros::<f32>(ROWS * COLS)?;

    // fuse on the same stream, on the same memory: views borrow it, nothing is copied.
    let dev = Device::from_cuda_stream(stream.clone())?;
    {
        let xv = BufferView::<f32>::new(&dev, &x_dev, &[ROWS, COLS])?;
        let wv = BufferView::<f32>::new(&dev, &w_dev, &[COLS])?;
        let mut yv = BufferViewMut::<f32>::new(&dev, &mut y_dev, &[ROWS, COLS])?;
        rmsnorm::into(&dev, &xv, &wv, &mut yv)?;
    }

    // The caller's own kernel consumes fuse's result, queued after it on the stream.
    let module = ctx.load_module(compile_ptx(ADD_ROW)?)?;
    let add_row = module.load_function("add_row")?;
    let (rows, cols) = (ROWS as i32, COLS as i32);
    let mut launch = stream.launch_builder(&add_row);
    launch.arg(&mut y_dev).arg(&rows).arg(&cols);
    // SAFETY: `add_row` takes (float*, int, int), as given, and touches rows * cols floats,
    // which `y_dev` holds.
    unsafe { launch.launch(LaunchConfig::for_num_elems((ROWS * COLS) as u32)) }?;
    let y = stream.clone_dtoh(&y_dev)?;

    let worst = compare(&x, &w, &y);
    println!("rmsnorm on {ROWS} x {COLS} on cudarc's stream, then a cudarc kernel: largest difference from f64 {worst:.2e}");
    Ok(worst < 1e-4)
}

/// The largest difference between `y` and RMSNorm plus the row index in f64.
fn compare(x: &[f32], w: &[f32], y: &[f32]) -> f64 {
    let mut worst = 0.0f64;
    for (r, (row, out)) in x.chunks(COLS).zip(y.chunks(COLS)).enumerate() {
        let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / COLS as f64;
        let scale = 1.0 / (ms + 1e-6).sqrt();
        for ((&v, &wv), &got) in row.iter().zip(w).zip(out) {
            let want = f64::from(v) * scale * f64::from(wv) + r as f64;
            worst = worst.max((f64::from(got) - want).abs() / want.abs().max(1.0));
        }
    }
    worst
}
