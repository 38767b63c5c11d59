//! Gradient clipping by global norm across every GPU of the machine: each GPU computes the sum of
//! squares of its shard with one `fuse!` kernel, NCCL all-reduces the partial sums on the
//! devices' own streams, and each GPU scales its shard with a second `fuse!` kernel. Checked
//! against the same computation on one device and in f64 on the host.
//!
//! Run it with `cargo run --example multi_gpu`. NCCL is loaded at run time as `libnccl.so`
//! (cudarc's name for it: link it to `libnccl.so.2` if only that is installed). Without a GPU or
//! NCCL it says so and clips on the CPU alone.

use std::process::ExitCode;

use fuse_runtime::cudarc::nccl::safe::{Comm, ReduceOp};
use fuse_runtime::{fuse, Buffer, Device, Error};

fuse! {
    /// The sum of squares of a shard: its part of the squared global norm.
    pub fn sum_squares(g: [f32; n]) -> f32 {
        sum(g * g)
    }
    /// Scales a shard so that the global norm is at most `max_norm`; `norm2` is the all-reduced
    /// sum of squares, a device scalar.
    pub fn clip(g: [f32; n], norm2: [f32;], max_norm: f32) -> [f32; n] {
        g * (max_norm / (norm2.sqrt() + 1e-6)).min(1.0)
    }
}

const SHARD: usize = 1_000_003;
const MAX_NORM: f32 = 100.0;

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

fn shard(i: usize) -> Vec<f32> {
    (0..SHARD)
        .map(|j| (((i + 1) * 7919 + j * 104_729) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// Whether NCCL can be loaded under the name cudarc looks for first (cudarc panics when it
/// finds none, so ask before).
fn nccl_present() -> bool {
    // SAFETY: loading NCCL runs no initialisation that could break this process.
    unsafe { libloading::Library::new("libnccl.so") }.is_ok()
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let count = Device::cuda_count();
    let shards: Vec<Vec<f32>> = (0..count.max(1)).map(shard).collect();
    let norm2: f64 = shards.iter().flatten().map(|&v| f64::from(v).powi(2)).sum();
    let scale = (f64::from(MAX_NORM) / (norm2.sqrt() + 1e-6)).min(1.0);
    println!(
        "{} shards of {SHARD}: global norm {:.3}, scale {scale:.6}",
        shards.len(),
        norm2.sqrt()
    );
    if count == 0 || !nccl_present() {
        println!("no GPU or no libnccl.so: clipping on the CPU alone");
        let cpu = Device::cpu();
        let clipped = clip_on_one(&cpu, &shards)?;
        return Ok(check(&shards, &clipped, scale));
    }
    let devices: Vec<Device> = (0..count).map(Device::cuda).collect::<Result<_, _>>()?;
    let streams = devices
        .iter()
        .map(|d| d.cuda_stream().cloned().expect("a GPU"))
        .collect();
    let comms = Comm::from_devices(streams).map_err(|e| format!("NCCL: {e:?}"))?;
    let grads: Vec<Buffer<f32>> = devices
        .iter()
        .zip(&shards)
        .map(|(d, s)| d.upload(s))
        .collect::<Result<_, _>>()?;
    // Each GPU's partial sum, queued on its stream.
    let mut partials: Vec<Buffer<f32>> = devices
        .iter()
        .zip(&grads)
        .map(|(d, g)| sum_squares(d, g))
        .collect::<Result<_, _>>()?;
    // The all-reduce, on the same streams, in one NCCL group.
    {
        let group = comms[0].group();
        for (comm, partial) in comms.iter().zip(partials.iter_mut()) {
            comm.all_reduce_in_place(partial.cuda_slice_mut()?, &ReduceOp::Sum)
                .map_err(|e| format!("NCCL all-reduce: {e:?}"))?;
        }
        drop(group);
    }
    let mut clipped = Vec::new();
    for ((d, g), partial) in devices.iter().zip(&grads).zip(&partials) {
        clipped.push(clip(d, g, partial, MAX_NORM)?.to_vec()?);
    }
    let reduced = partials[0].to_vec()?[0];
    println!("all-reduced sum of squares on GPU 0: {reduced:.3} (f64: {norm2:.3})");
    // The same on one device, for comparison.
    let one = clip_on_one(&devices[0], &shards)?;
    let agree = clipped
        .iter()
        .flatten()
        .zip(one.iter().flatten())
        .all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1e-3));
    println!("{count} GPU(s) agree with one GPU: {agree}");
    Ok(agree && check(&shards, &clipped, scale))
}

/// Clipping with every shard on `dev`, the partial sums added on the host.
fn clip_on_one(dev: &Device, shards: &[Vec<f32>]) -> Result<Vec<Vec<f32>>, Error> {
    let grads: Vec<Buffer<f32>> = shards
        .iter()
        .map(|s| dev.upload(s))
        .collect::<Result<_, _>>()?;
    let mut norm2 = 0.0f32;
    for g in &grads {
        norm2 += sum_squares(dev, g)?.to_vec()?[0];
    }
    let norm2 = dev.upload(&[norm2])?.reshape(&[])?;
    grads
        .iter()
        .map(|g| clip(dev, g, &norm2, MAX_NORM)?.to_vec())
        .collect()
}

/// Whether every clipped element is the f64 clipping of its input.
fn check(shards: &[Vec<f32>], clipped: &[Vec<f32>], scale: f64) -> bool {
    let worst = shards
        .iter()
        .flatten()
        .zip(clipped.iter().flatten())
        .map(|(&g, &c)| (f64::from(c) - f64::from(g) * scale).abs())
        .fold(0.0, f64::max);
    println!("largest difference from f64: {worst:.2e}");
    worst < 1e-5
}
