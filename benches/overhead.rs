//! T1, the launch overhead: W1 on 4096 elements called back to back, timed with the host clock
//! up to a final `synchronize`. Beside the calls a program makes (into a preallocated output,
//! allocating it, and the three unfused kernels), the same launch with less and less of fuse in
//! the way, so that the time of a call splits into fuse's host code, cudarc, the driver's
//! `cuLaunchKernel` and the GPU:
//!
//! - `host only`: the generated `into` with the launch stopped before the driver call (nothing
//!   runs on the GPU): fuse's own host time.
//! - `cudarc builder`: the loaded function through cudarc's launch builder, arguments packed once.
//! - `cuLaunchKernel`: the driver call alone, its parameter array built once.
//! - `empty kernel`: the same call for a kernel that does nothing, with the same arguments and
//!   grid: what is left is the driver and the GPU's cost of any launch.

use fuse_runtime::__private::floors::{self, Prebuilt};
use fuse_runtime::__private::{Arg, Geometry, KernelInfo};
use fuse_runtime::{Buffer, Device, Error};

use crate::cases::{self, Dims, Variant, Workload};
use crate::kernels::w1_softplus;
use crate::measure::{self, Timing};
use crate::report::{Row, Status};
use crate::runner::{agree, Runner};

/// The calls a program makes: (row, variant of W1, whether it allocates its output).
const CALLS: [(&str, usize, bool); 3] = [
    ("fused, into (1 kernel)", 0, false),
    ("fused, allocating its output", 0, true),
    ("unfused, into (3 kernels)", 1, false),
];

/// The launch with less of fuse in the way, fastest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Floor {
    HostOnly,
    Builder,
    Raw,
    Empty,
}

const FLOORS: [(Floor, &str); 4] = [
    (Floor::HostOnly, "host only: into, no driver call"),
    (Floor::Builder, "cudarc builder, prebuilt args"),
    (Floor::Raw, "cuLaunchKernel, prebuilt params"),
    (Floor::Empty, "cuLaunchKernel, empty kernel"),
];

/// The T1 rows.
pub fn launch_overhead(runner: &mut Runner) {
    let w = cases::w1();
    let d = Dims::flat(runner.sizes.t1_n);
    let host = runner.host_inputs(&w, d);
    let reference = runner.run_once(&Device::cpu(), &w, &w.variants[0], d, &host);
    // The rows before leave the GPU idle while the CPU computes their references, and an idle
    // H200 drops to a low clock: in one run the first row measured took 4.76 us a call, the
    // bare `cuLaunchKernel` measured after it 3.61. T1 is the steady state, so the calls run
    // for half a second first (an error here shows in the rows).
    if runner.dev.is_cuda() {
        let _ = warm_up(
            runner,
            &w,
            &w.variants[0],
            d,
            std::time::Duration::from_millis(500),
        );
    }
    for (name, variant, allocating) in CALLS {
        let variant = &w.variants[variant];
        let mut row = Row::new("T1", name);
        match runner.disagreement(&w, variant, d, &host, &reference) {
            Some(failure) => (row.status, row.note) = failure,
            None => timed(&mut row, per_call(runner, &w, variant, d, allocating)),
        }
        push(runner, row);
    }
    let inputs = match &reference {
        Ok(want) => two_inputs(runner, &host[0]).map(|x| (x, want)),
        Err(e) => Err(e.clone()),
    };
    for (floor, name) in FLOORS {
        let mut row = Row::new("T1", name);
        match (&inputs, runner.dev.is_cuda()) {
            (_, false) => (row.status, row.note) = (Status::Skipped, "needs a GPU".to_string()),
            (Err(e), true) => (row.status, row.note) = (Status::Error, e.to_string()),
            (Ok((x, want)), true) => match floor_row(runner, floor, x, want) {
                Ok(Ok(times)) => timed(&mut row, Ok(times)),
                Ok(Err(why)) => (row.status, row.note) = (Status::Failed, why),
                Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
            },
        }
        push(runner, row);
    }
}

fn push(runner: &mut Runner, mut row: Row) {
    row.formula = "-".to_string();
    runner.push(row);
}

/// Fills in a row's timing and its note: the time per call, and the part of it the host took
/// to queue the calls (when it is much less, the GPU is what limits the loop).
fn timed(row: &mut Row, times: Result<(Timing, f64), Error>) {
    match times {
        Ok((timing, queued)) => {
            row.note = format!(
                "{:.2} us/call (host clock), {:.2} us to queue",
                timing.median * 1e3,
                queued * 1e3
            );
            row.timing = Some(timing);
        }
        Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
    }
}

/// W1's input `x` (the checked data) and a second random input, on the device.
fn two_inputs(runner: &mut Runner, x: &[f32]) -> Result<[Buffer<f32>; 2], Error> {
    let second = measure::normal(x.len(), runner.seeds.next());
    Ok([runner.dev.upload(x)?, runner.dev.upload(&second)?])
}

/// The host time per call of a program's call, with a preallocated output or `allocating`.
fn per_call(
    runner: &mut Runner,
    w: &Workload,
    variant: &Variant,
    d: Dims,
    allocating: bool,
) -> Result<(Timing, f64), Error> {
    let shapes = (w.inputs)(d);
    let sets = [
        measure::random_inputs(&runner.dev, &shapes, &mut runner.seeds)?,
        measure::random_inputs(&runner.dev, &shapes, &mut runner.seeds)?,
    ];
    let mut outputs = vec![runner.dev.zeros::<f32>(&[d.n])?];
    let mut run = (variant.build)(&runner.dev, d)?;
    let dev = runner.dev.clone();
    rounds(runner, |i| match allocating {
        true => w1_softplus(&dev, &sets[i % 2][0]).map(drop),
        false => run(&sets[i % 2], &mut outputs),
    })
}

/// Calls `variant` back to back for `time`, then waits for the GPU.
fn warm_up(
    runner: &mut Runner,
    w: &Workload,
    variant: &Variant,
    d: Dims,
    time: std::time::Duration,
) -> Result<(), Error> {
    let inputs = measure::random_inputs(&runner.dev, &(w.inputs)(d), &mut runner.seeds)?;
    let mut outputs = vec![runner.dev.zeros::<f32>(&[d.n])?];
    let mut run = (variant.build)(&runner.dev, d)?;
    let start = std::time::Instant::now();
    while start.elapsed() < time {
        for _ in 0..100 {
            run(&inputs, &mut outputs)?;
        }
    }
    runner.dev.synchronize()
}

/// One floor's times, after checking its output against the CPU's `want` where it has one
/// (`Ok(Err(why))` when it disagrees).
fn floor_row(
    runner: &Runner,
    floor: Floor,
    x: &[Buffer<f32>; 2],
    want: &[Vec<f32>],
) -> Result<Result<(Timing, f64), String>, Error> {
    let dev = &runner.dev;
    let n = x[0].len();
    let out = dev.upload(&vec![f32::NAN; n])?;
    if floor == Floor::HostOnly {
        let program = &w1_softplus::__fuse::PROGRAM;
        let call = |i: usize| floors::host_only_into(dev, program, &x[i % 2], &out);
        return rounds(runner, call).map(Ok);
    }
    let kernel: &'static KernelInfo = match floor {
        Floor::Empty => &floors::EMPTY,
        _ => &w1_softplus::__fuse::ENTRY_0,
    };
    let geometry = Geometry::Map {
        elems: n as u64,
        vectors: 1,
    };
    let prebuilt = |x| {
        Prebuilt::new(
            dev,
            kernel,
            geometry,
            &[Arg::Buffer(x), Arg::Buffer(&out), Arg::Dim(n)],
        )
    };
    let mut launches = [prebuilt(&x[0])?, prebuilt(&x[1])?];
    let mut launch = |i: usize| match floor {
        Floor::Builder => launches[i % 2].launch_builder(),
        _ => launches[i % 2].launch_raw(),
    };
    // The empty kernel writes nothing, so only the real kernel's rows have a result to check.
    if floor != Floor::Empty {
        launch(0)?;
        if let Err(why) = agree(&[out.to_vec()?], &want[..1]) {
            return Ok(Err(why));
        }
    }
    rounds(runner, launch).map(Ok)
}

/// The time per call of `call` over T1's rounds (the median and spread of the rounds), and the
/// median time per call to queue them.
fn rounds(
    runner: &Runner,
    mut call: impl FnMut(usize) -> Result<(), Error>,
) -> Result<(Timing, f64), Error> {
    let calls = runner.sizes.t1_calls;
    let (mut done, mut queued) = (Vec::new(), Vec::new());
    for _ in 0..runner.sizes.t1_rounds {
        let times = measure::time_calls(&runner.dev, calls / 10, calls, &mut call)?;
        done.push(times.done);
        queued.push(times.queued);
    }
    Ok((Timing::of(done), Timing::of(queued).median))
}
