//! Runs the workloads: checks each variant against the CPU backend on a small problem, then
//! times it on the full one, and collects the rows.

use fuse_runtime::{Buffer, Device, Error};

use crate::cases::{self, Dims, Variant, Workload};
use crate::measure::{self, Flush, Seeds, Timing};
use crate::report::{Row, Status};
use crate::Sizes;

/// Runs shorter than this (ms) are timed again with [`SHORT_REPS`] times the runs: a kernel of a
/// few microseconds varies by one or two from run to run (S1's `sum(exp)` at 2^10: 3.7 to 6.6 us
/// over 30 runs on an H200), so its median needs more of them (Triton's `do_bench`, which times
/// the peers, runs for a second).
pub const SHORT_MS: f64 = 0.05;

/// How many times the runs a short kernel's median takes.
pub const SHORT_REPS: usize = 10;

/// Inputs that fit in this many bytes get a second set to rotate with, so that back-to-back
/// runs do not find them in the L2 cache (50 MB on an H100) even without the flush.
pub const ROTATE_BELOW: u64 = 256 << 20;

/// The state of one benchmark run.
pub struct Runner {
    /// Where the timed kernels run.
    pub dev: Device,
    pub sizes: Sizes,
    pub seeds: Seeds,
    pub rows: Vec<Row>,
    /// The copy ceiling in GB/s, once measured.
    pub copy_gbs: Option<f64>,
    /// The L2 flush between timed runs: on a GPU only.
    flush: Option<Flush>,
}

impl Runner {
    pub fn new(dev: Device, sizes: Sizes) -> Result<Runner, Error> {
        let mut seeds = Seeds::new();
        let flush = match dev.is_cuda() {
            true => Some(Flush::new(&dev, &mut seeds)?),
            false => None,
        };
        Ok(Runner {
            dev,
            sizes,
            seeds,
            rows: Vec::new(),
            copy_gbs: None,
            flush,
        })
    }

    /// Adds a row and prints it as progress.
    pub fn push(&mut self, row: Row) {
        let ms = row.ms().map_or("-".to_string(), |ms| format!("{ms:.4} ms"));
        let status = match row.status {
            Status::Ok => String::new(),
            status => format!(" {}", status.as_str()),
        };
        eprintln!("[{}] {}: {ms}{status} {}", row.id, row.variant, row.note);
        self.rows.push(row);
    }

    /// The copy ceiling: a device-to-device copy, and fuse's own copy kernel.
    pub fn copy(&mut self) {
        let n = self.sizes.n;
        let check = Dims::flat(n.min(self.sizes.check_n));
        self.workload(&cases::copy(), Dims::flat(n), check, None);
        self.copy_gbs = self.rows.iter().find(|r| r.id == "copy").and_then(Row::gbs);
    }

    /// One workload at the full sizes, every variant.
    pub fn full(&mut self, w: &Workload) {
        let s = self.sizes;
        let (full, check) = match w.rows {
            true => (
                Dims::grid(s.rows, s.cols),
                Dims::grid(s.rows.min(s.check_rows), s.cols),
            ),
            false => (Dims::flat(s.n), Dims::flat(s.n.min(s.check_n))),
        };
        self.workload(w, full, check, None);
    }

    /// S1: softmax over one number of elements in rows of every width, and `sum(exp(x))`
    /// over growing sizes; fused only.
    pub fn sweep(&mut self) {
        let s = self.sizes;
        for &cols in s.sweep_cols {
            let rows = s.sweep_total / cols;
            if rows == 0 {
                continue;
            }
            let full = Dims::grid(rows, cols);
            let check = Dims::grid(rows.min(s.check_rows), cols);
            let label = format!("softmax {rows} x {cols}");
            self.workload(&cases::w5(), full, check, Some(label));
        }
        for &log in s.sum_logs {
            let n = 1usize << log;
            let check = Dims::flat(n.min(s.check_n));
            let label = format!("sum(exp(x)) n = 2^{log}");
            self.workload(&cases::w4(), Dims::flat(n), check, Some(label));
        }
    }

    /// Checks each variant (only the fused one when `label` names a sweep row), then times it.
    fn workload(&mut self, w: &Workload, full: Dims, check: Dims, label: Option<String>) {
        let id = if label.is_some() { "S1" } else { w.id };
        let variants = match label {
            Some(_) => &w.variants[..1],
            None => &w.variants[..],
        };
        let host = self.host_inputs(w, check);
        let reference = self.run_once(&Device::cpu(), w, &w.variants[0], check, &host);
        // Full-size inputs, drawn when the first variant passes its check.
        let mut sets: Vec<Vec<Buffer<f32>>> = Vec::new();
        for variant in variants {
            let mut row = Row::new(id, label.as_deref().unwrap_or(variant.name));
            row.bytes = Some((w.bytes)(full));
            row.formula = w.formula.to_string();
            row.definition = w.what.to_string();
            match self.disagreement(w, variant, check, &host, &reference) {
                Some(failure) => (row.status, row.note) = failure,
                None => match self.time(w, variant, full, &mut sets) {
                    Ok(timing) => row.timing = Some(timing),
                    Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
                },
            }
            self.push(row);
        }
    }

    /// Why `variant` on the device does not give the CPU's `reference` outputs for the inputs
    /// `host` at `d`, or `None` when it does.
    pub fn disagreement(
        &self,
        w: &Workload,
        variant: &Variant,
        d: Dims,
        host: &[Vec<f32>],
        reference: &Result<Vec<Vec<f32>>, Error>,
    ) -> Option<(Status, String)> {
        let checked = reference.as_ref().map_err(Clone::clone).and_then(|want| {
            let got = self.run_once(&self.dev, w, variant, d, host)?;
            Ok(agree(&got, want))
        });
        match checked {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some((Status::Failed, why)),
            Err(e) => Some((Status::Error, e.to_string())),
        }
    }

    pub fn host_inputs(&mut self, w: &Workload, d: Dims) -> Vec<Vec<f32>> {
        let shapes = (w.inputs)(d);
        let lens = shapes.iter().map(|s| s.iter().product::<usize>());
        lens.map(|len| measure::normal(len, self.seeds.next()))
            .collect()
    }

    /// The outputs of one run of `variant` on `dev`, written into NaN-filled buffers.
    pub fn run_once(
        &self,
        dev: &Device,
        w: &Workload,
        variant: &Variant,
        d: Dims,
        host: &[Vec<f32>],
    ) -> Result<Vec<Vec<f32>>, Error> {
        let shapes = (w.inputs)(d);
        let inputs = host.iter().zip(&shapes).map(|(data, shape)| {
            let buffer = dev.upload(data)?;
            buffer.reshape(shape)
        });
        let inputs = inputs.collect::<Result<Vec<_>, _>>()?;
        let mut outputs = measure::poisoned(dev, &(w.outputs)(d))?;
        (variant.build)(dev, d)?(&inputs, &mut outputs)?;
        outputs.iter().map(Buffer::to_vec).collect()
    }

    /// The device time of `variant` at `d`, drawing the input sets on first use.
    fn time(
        &mut self,
        w: &Workload,
        variant: &Variant,
        d: Dims,
        sets: &mut Vec<Vec<Buffer<f32>>>,
    ) -> Result<Timing, Error> {
        if sets.is_empty() {
            let shapes = (w.inputs)(d);
            let count = if (w.bytes)(d) < ROTATE_BELOW { 2 } else { 1 };
            for _ in 0..count {
                sets.push(measure::random_inputs(&self.dev, &shapes, &mut self.seeds)?);
            }
        }
        let outputs = (w.outputs)(d).into_iter().map(|s| self.dev.zeros(&s));
        let mut outputs = outputs.collect::<Result<Vec<_>, _>>()?;
        let mut run = (variant.build)(&self.dev, d)?;
        let sets = &*sets;
        self.time_runs(|i| run(&sets[i % sets.len()], &mut outputs))
    }

    /// The device time of `run(i)`, where `i` counts the runs (to rotate input sets): the
    /// warm-up and timed runs of the sizes, each after the L2 flush, and [`SHORT_REPS`] times
    /// the runs when the median is under [`SHORT_MS`].
    pub fn time_runs(
        &mut self,
        mut run: impl FnMut(usize) -> Result<(), Error>,
    ) -> Result<Timing, Error> {
        let (warmup, reps) = (self.sizes.warmup, self.sizes.reps);
        let mut time =
            |reps| measure::time_runs(&self.dev, self.flush.as_mut(), warmup, reps, &mut run);
        match time(reps)? {
            timing if timing.median < SHORT_MS => time(reps * SHORT_REPS),
            timing => Ok(timing),
        }
    }

    /// The row of a workload the language cannot express yet.
    pub fn not_yet(&mut self, id: &str) {
        let why = cases::NOT_YET.iter().find(|(known, _)| *known == id);
        let why = why.map_or("unknown workload", |(_, why)| why);
        let mut row = Row::new(id, "-");
        (row.status, row.note) = (Status::Skipped, format!("not yet expressible: {why}"));
        self.push(row);
    }
}

/// Whether every output agrees with the CPU's, or the first disagreement.
pub fn agree(got: &[Vec<f32>], want: &[Vec<f32>]) -> Result<(), String> {
    for (k, (got, want)) in got.iter().zip(want).enumerate() {
        measure::compare(got, want).map_err(|why| format!("output {k}, {why}"))?;
    }
    Ok(())
}
