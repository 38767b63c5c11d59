//! Three `fuse!` kernels captured into a CUDA graph once and replayed on new data: bias + GELU,
//! a row softmax, and the sum of all of it, with the inputs refreshed between replays. Each
//! replay is checked against the CPU backend, and the time of a replay is printed beside three
//! plain launches.
//!
//! Run it with `cargo run --example graph`. On the CPU (no GPU) it runs the three kernels
//! without a graph, as the CPU has none.

use std::process::ExitCode;
use std::time::Instant;

use fuse_runtime::cudarc::driver::sys;
use fuse_runtime::{fuse, Buffer, Device, Error};

fuse! {
    pub fn bias_gelu(x: [f32; rows, cols], b: [f32; cols]) -> [f32; rows, cols] {
        gelu(x + b)
    }
    pub fn softmax(x: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }
    pub fn total(x: [f32; n]) -> f32 {
        sum(x)
    }
}

const ROWS: usize = 32;
const COLS: usize = 1024;

/// The chain's buffers on one device: inputs, intermediates and the result.
struct Chain {
    x: Buffer<f32>,
    b: Buffer<f32>,
    h: Buffer<f32>,
    p: Buffer<f32>,
    s: Buffer<f32>,
}

impl Chain {
    fn new(dev: &Device, b: &[f32]) -> Result<Chain, Error> {
        Ok(Chain {
            x: dev.zeros(&[ROWS, COLS])?,
            b: dev.upload(b)?,
            h: dev.zeros(&[ROWS, COLS])?,
            p: dev.zeros(&[ROWS, COLS])?,
            s: dev.zeros(&[])?,
        })
    }

    /// Queues the three kernels; inside a capture, nothing here allocates or synchronizes.
    fn queue(&mut self, dev: &Device) -> Result<(), Error> {
        bias_gelu::into(dev, &self.x, &self.b, &mut self.h)?;
        softmax::into(dev, &self.h, &mut self.p)?;
        total::into(dev, &self.p.reshape(&[ROWS * COLS])?, &mut self.s)
    }
}

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

fn run() -> Result<bool, Error> {
    let dev = Device::detect();
    let b: Vec<f32> = (0..COLS).map(|j| (j % 13) as f32 / 13.0 - 0.5).collect();
    let (mut chain, mut reference) = (Chain::new(&dev, &b)?, Chain::new(&Device::cpu(), &b)?);
    let Some(stream) = dev.cuda_stream().cloned() else {
        println!("no GPU: the chain runs on the CPU, without a graph");
        chain.queue(&dev)?;
        return Ok(chain.s.to_vec()?[0].is_finite());
    };
    // Everything a capture needs is done before it: the kernels loaded, the scratch ready.
    for load in [bias_gelu::load, softmax::load, total::load] {
        load(&dev)?;
    }
    let capture = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    let cuda = |e: fuse_runtime::cudarc::driver::DriverError| Error::Cuda {
        op: "graph",
        detail: e.to_string(),
    };
    stream.begin_capture(capture).map_err(cuda)?;
    let queued = chain.queue(&dev);
    let graph = stream.end_capture(flags).map_err(cuda)?;
    queued?;
    let graph = graph.ok_or_else(|| Error::Cuda {
        op: "graph",
        detail: "nothing captured".into(),
    })?;

    let mut worst = 0.0f64;
    for replay in 0..20 {
        let x: Vec<f32> = (0..ROWS * COLS)
            .map(|i| ((i * 7 + replay * 13) % 29) as f32 / 4.0 - 3.5)
            .collect();
        chain.x.copy_from(&x)?;
        graph.launch().map_err(cuda)?;
        reference.x.copy_from(&x)?;
        reference.queue(&Device::cpu())?;
        let (got, want) = (chain.s.to_vec()?[0], reference.s.to_vec()?[0]);
        worst = worst.max(f64::from((got - want).abs()));
        let (p, q) = (chain.p.to_vec()?, reference.p.to_vec()?);
        for (g, w) in p.iter().zip(&q) {
            worst = worst.max(f64::from((g - w).abs()));
        }
    }
    println!(
        "20 replays of a captured 3-kernel chain: largest difference from the CPU {worst:.2e}"
    );

    let per_call = |f: &mut dyn FnMut() -> Result<(), Error>| -> Result<f64, Error> {
        let runs = 2000;
        dev.synchronize()?;
        let start = Instant::now();
        for _ in 0..runs {
            f()?;
        }
        dev.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / runs as f64)
    };
    let plain = per_call(&mut || chain.queue(&dev))?;
    let replayed = per_call(&mut || graph.launch().map_err(cuda))?;
    println!(
        "per chain of three: {plain:.2} us as plain launches, {replayed:.2} us as a graph replay"
    );
    Ok(worst < 1e-5)
}
