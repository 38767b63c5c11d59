//! The generated CUDA C, run on the CPU: `emulate/emulate.py` compiles a kernel's source with
//! g++ against `emulate/shim.h`, a stand-in for the CUDA runtime in which each CUDA thread is a
//! `std::thread` (blocks of 256, run one after another, with real barriers for `__syncthreads`
//! and warp shuffles), and the outputs are compared with the CPU backend.
//!
//! This checks the CUDA text's indexing, loops, vector paths, reductions, random numbers and
//! 16-bit conversions on every CI run, without a GPU. It does not replace the GPU tests: the
//! math functions are the host's, the intrinsics are their exact counterparts, and the GPU's
//! memory model and scheduling are not modelled. Each case uses a grid of three blocks, so the
//! grid-stride loops and the full reductions' last-block step run. It needs `g++` (C++20) and
//! `python3`; without them it is skipped with a note, except under `CI=true`, where it fails.
mod common;
use common::kernels;

#[allow(dead_code)]
#[path = "../../benches/kernels.rs"]
mod bench_kernels;
#[allow(dead_code)]
#[path = "common/grad_kernels.rs"]
mod grad_kernels;
use common::*;
use fuse_runtime::__private::{DimRef, Grid, Param, Program};
use fuse_runtime::{Device, Element};

/// Cross-entropy's labels for `rows` rows of `cols`: of every five, two in range and three not:
/// ignored (-100), past the row, and in the row's range plus 2^32, which a comparison of the
/// low words alone would take.
fn labels(rng: &mut Rng, rows: usize, cols: usize) -> Vec<i64> {
    (0..rows)
        .map(|i| {
            let l = rng.below(cols as u64) as i64;
            match i % 5 {
                1 => -100,
                3 => l + (1 << 32),
                4 => cols as i64 + 3,
                _ => l,
            }
        })
        .collect()
}

/// The bytes of `v` as memory holds them (the kernel's view), in hex.
fn hex<T: Element>(v: &[T]) -> String {
    // SAFETY: every element type is a number, `bool` or a narrow float: plain bytes without
    // padding, so viewing the slice's memory as `u8` reads initialised bytes only.
    let bytes =
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An output's bytes, of element type `ty`, as the values the tests compare.
fn values(ty: &str, b: &[u8]) -> Values {
    let f = |n: usize, g: &dyn Fn(&[u8]) -> f64| Values::Float(b.chunks(n).map(g).collect());
    let e = |n: usize, g: &dyn Fn(&[u8]) -> i128| Values::Exact(b.chunks(n).map(g).collect());
    match ty {
        "f32" => f(4, &|c| f32::from_le_bytes(c.try_into().unwrap()) as f64),
        "f64" => f(8, &|c| f64::from_le_bytes(c.try_into().unwrap())),
        "f16" => f(2, &|c| {
            fuse_runtime::f16::from_bits(u16::from_le_bytes(c.try_into().unwrap())).to_f64()
        }),
        "bf16" => f(2, &|c| {
            fuse_runtime::bf16::from_bits(u16::from_le_bytes(c.try_into().unwrap())).to_f64()
        }),
        "f8e4m3" => f(1, &|c| fuse_runtime::F8E4M3::from_bits(c[0]).to_f64()),
        "f8e5m2" => f(1, &|c| fuse_runtime::F8E5M2::from_bits(c[0]).to_f64()),
        "i8" => e(1, &|c| c[0] as i8 as i128),
        // Quantized values, which may differ by one where f32 and f64 round a .5 apart.
        "q8" => f(1, &|c| f64::from(c[0] as i8)),
        "u8" | "bool" => e(1, &|c| c[0] as i128),
        "i16" => e(2, &|c| i16::from_le_bytes(c.try_into().unwrap()) as i128),
        "u16" => e(2, &|c| u16::from_le_bytes(c.try_into().unwrap()) as i128),
        "i32" => e(4, &|c| i32::from_le_bytes(c.try_into().unwrap()) as i128),
        "u32" => e(4, &|c| u32::from_le_bytes(c.try_into().unwrap()) as i128),
        "i64" => e(8, &|c| i64::from_le_bytes(c.try_into().unwrap()) as i128),
        "u64" => e(8, &|c| u64::from_le_bytes(c.try_into().unwrap()) as i128),
        _ => panic!("{ty}"),
    }
}

fn size(ty: &str) -> usize {
    match ty {
        "f64" | "i64" | "u64" => 8,
        "f32" | "i32" | "u32" => 4,
        "f16" | "bf16" | "i16" | "u16" => 2,
        _ => 1,
    }
}

/// [`emulate_on`] a grid of 3 blocks.
#[allow(clippy::too_many_arguments)]
fn emulate<R: Outputs>(
    what: &str,
    program: &'static Program,
    tensors: Vec<String>,
    scalars: Vec<u64>,
    dims: &[(&str, usize)],
    cpu: &R,
    types: &[&str],
    tols: &[Tol],
) {
    Emulation::default().run(what, program, tensors, scalars, dims, cpu, types, tols);
}

/// [`emulate`] on a grid of `grid` blocks.
#[allow(clippy::too_many_arguments)]
fn emulate_on<R: Outputs>(
    grid: u32,
    what: &str,
    program: &'static Program,
    tensors: Vec<String>,
    scalars: Vec<u64>,
    dims: &[(&str, usize)],
    cpu: &R,
    types: &[&str],
    tols: &[Tol],
) {
    let how = Emulation {
        grid: Some(grid),
        ..Emulation::default()
    };
    how.run(what, program, tensors, scalars, dims, cpu, types, tols);
}

/// [`emulate`] on a launch shaped as the runtime shapes long rows (`shared`).
#[allow(clippy::too_many_arguments)]
fn emulate_launch<R: Outputs>(
    what: &str,
    program: &'static Program,
    tensors: Vec<String>,
    scalars: Vec<u64>,
    dims: &[(&str, usize)],
    cpu: &R,
    types: &[&str],
    tols: &[Tol],
    shared: Option<Shared>,
) {
    let how = Emulation {
        shared,
        ..Emulation::default()
    };
    how.run(what, program, tensors, scalars, dims, cpu, types, tols);
}

/// A launch shaped as the runtime shapes long rows: `cluster` blocks a row, each given `bytes`
/// of dynamic shared memory, to the kernel's long-row entry, which then caches its rows there.
#[derive(Clone, Copy)]
struct Shared {
    cluster: u32,
    bytes: u64,
}

/// How `emulate.py` runs a kernel: blocks in the grid (clusters, with `shared`), whether
/// every buffer starts one element past a 64-byte boundary (as no allocation of the runtime
/// does, to check that the kernels' 16-byte vector paths step aside), and whether the vector
/// loops take their 64-bit indices (`wide`), as for tensors of 2^32 vectors and more, which no
/// test could allocate.
#[derive(Default)]
struct Emulation {
    grid: Option<u32>,
    /// The device's compute capability the entry is picked for; `None` for sm_90.
    arch: Option<u32>,
    /// The entry to run, by its label, in place of the one the runtime would pick.
    entry: Option<&'static str>,
    misalign: bool,
    shared: Option<Shared>,
    wide: bool,
    /// The contents of the `&mut` parameters before the call, in the order of the parameters,
    /// in hex; the CPU's outputs to compare with then end with those buffers after its call.
    written: Vec<String>,
}

/// [`emulate`], then again with the vector loops' 64-bit indices.
#[allow(clippy::too_many_arguments)]
fn emulate_both<R: Outputs>(
    what: &str,
    program: &'static Program,
    tensors: Vec<String>,
    scalars: Vec<u64>,
    dims: &[(&str, usize)],
    cpu: &R,
    types: &[&str],
    tols: &[Tol],
) {
    for wide in [false, true] {
        let how = Emulation {
            wide,
            ..Emulation::default()
        };
        let (tensors, scalars) = (tensors.clone(), scalars.clone());
        how.run(what, program, tensors, scalars, dims, cpu, types, tols);
    }
}

impl Emulation {
    #[allow(clippy::too_many_arguments)]
    fn run<R: Outputs + ?Sized>(
        &self,
        what: &str,
        program: &'static Program,
        tensors: Vec<String>,
        scalars: Vec<u64>,
        dims: &[(&str, usize)],
        cpu: &R,
        types: &[&str],
        tols: &[Tol],
    ) {
        let want = cpu.read();
        let outs: Vec<usize> = want
            .iter()
            .zip(types)
            .map(|(o, t)| o.shape.iter().product::<usize>() * size(t))
            .collect();
        // The entry the runtime picks on an sm_90 device (or `arch`), and each argument slot as the runtime
        // fills it, from the program.
        let sig = program.signature;
        let sizes: Vec<usize> = sig
            .dims
            .iter()
            .map(|name| dims.iter().find(|(n, _)| n == name).expect("every dim").1)
            .collect();
        // With shared memory the long-row entry runs at any length, as its kernel takes the
        // path whenever the launch gives it the memory (the runtime does for long rows only).
        let entry = match (self.shared, self.entry) {
            (Some(_), _) => program.entries.iter().find(|e| e.path == "long_rows"),
            (None, Some(label)) => program.entries.iter().find(|e| e.path == label),
            (None, None) => program.pick(&sizes, self.arch.unwrap_or(90), false),
        }
        .expect("an entry takes every shape");
        let size_of = |d: &DimRef| d.size(&sizes) as u64;
        let n_inputs = sig.tensors.iter().filter(|t| !t.output).count();
        let returned = sig.tensors.len() - n_inputs - self.written.len();
        let slots: Vec<String> = program
            .params
            .iter()
            .map(|param| match *param {
                Param::Input { tensor, bytes } => {
                    format!(
                        "{{\"kind\": \"in\", \"elem\": {bytes}, \"data\": \"{}\"}}",
                        tensors[tensor]
                    )
                }
                Param::Output { tensor, bytes } if tensor - n_inputs >= returned => {
                    let id = tensor - n_inputs - returned;
                    format!(
                        "{{\"kind\": \"inout\", \"elem\": {bytes}, \"id\": {id}, \"data\": \"{}\"}}",
                        self.written[id]
                    )
                }
                Param::Output { tensor, bytes } => format!(
                    "{{\"kind\": \"out\", \"elem\": {bytes}, \"bytes\": {}}}",
                    outs[tensor - n_inputs]
                ),
                Param::Scalar(i) => format!("{{\"kind\": \"value\", \"value\": {}}}", scalars[i]),
                Param::Dim(i) => format!("{{\"kind\": \"value\", \"value\": {}}}", sizes[i]),
                Param::Reciprocal { dims: of, by } => {
                    let d = of.iter().map(size_of).product::<u64>() / u64::from(by);
                    let r = fuse_runtime::__private::reciprocal(d);
                    format!("{{\"kind\": \"value\", \"value\": {r}}}")
                }
                Param::RoundKey { seed, round } => {
                    let key = fuse_runtime::__private::round_key(scalars[seed], round);
                    format!("{{\"kind\": \"value\", \"value\": {key}}}")
                }
                Param::Scratch => "{\"kind\": \"scratch\"}".to_string(),
                Param::Counter => "{\"kind\": \"counter\"}".to_string(),
            })
            .collect();
        let grid = self
            .grid
            .map(|g| format!(", \"grid\": {g}"))
            .unwrap_or_default();
        let launch = self.shared.map_or(String::new(), |s| {
            format!(", \"cluster\": {}, \"smem\": {}", s.cluster, s.bytes)
        });
        // A kernel that sums over rows has a barrier of the grid: its blocks run at once, as
        // the runtime's cooperative launch keeps them.
        let spec = format!(
            "{{\"source\": {}, \"entry\": \"{}\", \"slots\": [{}], \"misalign\": {}, \"wide\": {}, \"together\": {}{grid}{launch}}}",
            json_str(entry.kernel.source),
            entry.kernel.symbol,
            slots.join(", "),
            self.misalign,
            self.wide,
            entry.grid.sums() > 0,
        );
        let build = concat!(env!("CARGO_TARGET_TMPDIR"), "/emulated");
        std::fs::create_dir_all(build).unwrap();
        let name = what.replace(|c: char| !c.is_alphanumeric(), "_");
        let name = match (self.misalign, self.wide) {
            (true, _) => format!("{name}_misaligned"),
            (_, true) => format!("{name}_wide"),
            _ => name,
        };
        let path = format!("{build}/{name}.json");
        std::fs::write(&path, spec).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/emulate/emulate.py");
        let r = std::process::Command::new("python3")
            .args([script, &path, build])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert!(r.status.success(), "{what}: {stderr}");
        let taken = stderr.contains("rows cached in shared memory");
        assert_eq!(
            taken,
            self.shared.is_some(),
            "{what}: whether rows were cached in shared memory"
        );
        let mut at = 0;
        for (k, (w, t)) in want.iter().zip(types).enumerate() {
            let n = outs[k];
            let got = values(t, &r.stdout[at..at + n]);
            at += n;
            let name = format!("{what} output {k}");
            match (&got, &w.values) {
                (Values::Float(g), Values::Float(w)) => assert_close(&name, g, w, &tols[k]),
                (Values::Exact(g), Values::Exact(w)) => assert_exact(&name, g, w),
                (Values::Float(g), Values::Exact(w)) => {
                    let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
                    assert_close(&name, g, &w, &tols[k])
                }
                _ => panic!("{name}: kinds differ"),
            }
        }
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Whether g++ and python3 can run here; under `CI=true` they must.
fn available() -> bool {
    let runs = |cmd: &str| {
        std::process::Command::new(cmd)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let ok = runs("g++") && runs("python3");
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI=true but g++ or python3 is missing"
        );
        eprintln!("skipped: the emulation needs g++ and python3");
    }
    ok
}

#[test]
fn generated_cuda_runs_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    // Softmax, f32: cached rows, streamed vector rows (4100), scalar streamed rows (4099), short
    // rows; cached rows over several rounds of the 3-block grid, the last one partial, so that
    // each block copies its next rows ahead into its second buffer (7x4096, 200x36).
    for (rows, cols) in [
        (5, 36),
        (3, 4100),
        (2, 4099),
        (9, 2),
        (7, 5),
        (7, 4096),
        (200, 36),
        (4, 3000),
        (30, 37),
        (26, 1001),
    ] {
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let cpu = kernels::softmax(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        emulate(
            &format!("softmax {rows}x{cols}"),
            &kernels::softmax::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
    }

    // Division by a row's value through its reciprocal: exact, over raw bits of every kind
    // (3x3000: a row a block, whose lanes divide on the fast path and redo out-of-range ones).
    for (rows, cols) in [(7, 36), (4, 64), (3, 3000)] {
        let raw = |rng: &mut Rng, n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| f32::from_bits(rng.next_u64() as u32))
                .collect()
        };
        let x = raw(&mut rng, rows * cols);
        let mut y = rng.floats::<f32>(rows * cols, -3.0, 3.0);
        y[cols..2 * cols].copy_from_slice(&raw(&mut rng, cols));
        // Row 1's max, then a signaling NaN that the same thread folds in after it: max skips
        // every NaN, as PTX max and f32::max do.
        y[cols] = f32::MAX;
        y[cols + 1] = f32::from_bits(0x7f80_0001);
        let shape = [rows, cols];
        let cpu =
            kernels::div_by_row_max(&dev, &put(&dev, &x, &shape), &put(&dev, &y, &shape)).unwrap();
        emulate(
            &format!("div_by_row_max {rows}x{cols}"),
            &kernels::div_by_row_max::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f32"],
            &[Tol::close(0.0, 0.0)],
        );
    }

    let f32t = Tol::close(2e-5, 1e-6);
    let bits = |v: f32| Element::to_bits(v);
    // 5x2600: a row a block (`width == 256`), the third of each thread's four vectors in the row
    // for some threads only, rows round the 3-block grid.
    for (rows, cols) in [(5, 36), (3, 4100), (4, 33), (6, 4), (13, 1024), (5, 2600)] {
        let n = rows * cols;
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let g = rng.floats::<f32>(cols, -2.0, 2.0);
        let b = rng.floats::<f32>(cols, -2.0, 2.0);
        let r = rng.floats::<f32>(rows, -2.0, 2.0);
        let d = [("rows", rows), ("cols", cols)];
        let cpu = kernels::layernorm(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            &put(&dev, &b, &[cols]),
            1e-5,
        )
        .unwrap();
        emulate(
            &format!("layernorm {rows}x{cols}"),
            &kernels::layernorm::__fuse::PROGRAM,
            vec![hex(&x), hex(&g), hex(&b)],
            vec![bits(1e-5)],
            &d,
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-4, 1e-4), Tol::close(1e-4, 0.0)],
        );
        let cpu = kernels::layernorm_quantize(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            &put(&dev, &b, &[cols]),
            1e-5,
        )
        .unwrap();
        emulate(
            &format!("layernorm_quantize {rows}x{cols}"),
            &kernels::layernorm_quantize::__fuse::PROGRAM,
            vec![hex(&x), hex(&g), hex(&b)],
            vec![bits(1e-5)],
            &d,
            &cpu,
            &["q8", "f32"],
            &[Tol::close(0.0, 1.0), Tol::close(1e-4, 0.0)],
        );
        let cpu = kernels::rmsnorm(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            1e-6,
        )
        .unwrap();
        emulate(
            &format!("rmsnorm {rows}x{cols}"),
            &kernels::rmsnorm::__fuse::PROGRAM,
            vec![hex(&x), hex(&g)],
            vec![bits(1e-6)],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(1e-4, 1e-5)],
        );
        let cpu = kernels::bcast(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &r, &[rows]),
            &put(&dev, &g, &[cols]),
            0.5,
        )
        .unwrap();
        emulate_both(
            &format!("bcast {rows}x{cols}"),
            &kernels::bcast::__fuse::PROGRAM,
            vec![hex(&x), hex(&r), hex(&g)],
            vec![bits(0.5)],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(0.0, 3e-6)],
        );
        let seed = rng.next_u64();
        let cpu = kernels::noise(&dev, &put(&dev, &x, &[rows, cols]), seed).unwrap();
        emulate_both(
            &format!("noise {rows}x{cols}"),
            &kernels::noise::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![seed],
            &d,
            &cpu,
            &["f32", "f32", "f32"],
            &[Tol::EXACT; 3],
        );
        let cpu = kernels::softmax_dropout(&dev, &put(&dev, &x, &[rows, cols]), 0.3, seed).unwrap();
        emulate(
            &format!("softmax_dropout {rows}x{cols}"),
            &kernels::softmax_dropout::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![bits(0.3), seed],
            &d,
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-7), Tol::EXACT],
        );
        let label = labels(&mut rng, rows, cols);
        let cpu = kernels::cross_entropy(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &label, &[rows]),
        )
        .unwrap();
        emulate(
            &format!("cross_entropy {rows}x{cols}"),
            &kernels::cross_entropy::__fuse::PROGRAM,
            vec![hex(&x), hex(&label)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            std::slice::from_ref(&f32t),
        );
        let k: Vec<i32> = rng.ints_in::<i32>(n, -4, 4);
        let cpu = kernels::arg_rows(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &k, &[rows, cols]),
        )
        .unwrap();
        emulate(
            &format!("arg_rows {rows}x{cols}"),
            &kernels::arg_rows::__fuse::PROGRAM,
            vec![hex(&x), hex(&k)],
            vec![],
            &d,
            &cpu,
            &["u32", "u32", "u32"],
            &[Tol::EXACT; 3],
        );
        // 16-bit floats.
        let h: Vec<fuse_runtime::f16> = x.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let hb: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::f16s::softmax(&dev, &put(&dev, &h, &[rows, cols])).unwrap();
        emulate(
            &format!("f16 softmax {rows}x{cols}"),
            &kernels::f16s::softmax::__fuse::PROGRAM,
            vec![hex(&h)],
            vec![],
            &d,
            &cpu,
            &["f16"],
            &[Tol::close(2e-3, 1e-6)],
        );
        let cpu = kernels::bf16s::reduce_rows(&dev, &put(&dev, &hb, &[rows, cols])).unwrap();
        emulate(
            &format!("bf16 reduce_rows {rows}x{cols}"),
            &kernels::bf16s::reduce_rows::__fuse::PROGRAM,
            vec![hex(&hb)],
            vec![],
            &d,
            &cpu,
            &["bf16"; 4],
            &[
                Tol::close(1e-2, 1e-2),
                Tol::close(1e-2, 0.0),
                Tol::close(1e-2, 1e-2),
                Tol::close(1e-2, 1e-2),
            ],
        );
        let cpu = kernels::f16s::reduce_all(&dev, &put(&dev, &h, &[n])).unwrap();
        let abs: f64 = h.iter().map(|v| v.to_f64().abs()).sum();
        emulate(
            &format!("f16 reduce_all {n}"),
            &kernels::f16s::reduce_all::__fuse::PROGRAM,
            vec![hex(&h)],
            vec![],
            &[("n", n)],
            &cpu,
            &["f16", "f16", "f16", "f16", "f32"],
            // Sums: f32 in a tree against f64, then (for f16) one rounding more.
            &[
                Tol::close(2e-3, 1e-5 * abs),
                Tol::EXACT,
                Tol::EXACT,
                Tol::close(2e-3, 1e-5 * abs / n as f64 + 1e-3),
                sum_tol::<f32>(&[abs]),
            ],
        );
        let cpu = kernels::halfs(&dev, &put(&dev, &h, &[n]), &put(&dev, &hb, &[n])).unwrap();
        emulate(
            &format!("halfs {n}"),
            &kernels::halfs::__fuse::PROGRAM,
            vec![hex(&h), hex(&hb)],
            vec![],
            &[("n", n)],
            &cpu,
            &["bf16", "f16"],
            &[Tol::EXACT; 2],
        );
        let y = rng.floats::<f32>(n, -3.0, 3.0);
        let hy: Vec<fuse_runtime::f16> =
            y.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let cpu = kernels::f16s::arith(&dev, &put(&dev, &h, &[n]), &put(&dev, &hy, &[n])).unwrap();
        emulate(
            &format!("f16 arith {n}"),
            &kernels::f16s::arith::__fuse::PROGRAM,
            vec![hex(&h), hex(&hy)],
            vec![],
            &[("n", n)],
            &cpu,
            &["f16"; 6],
            &[Tol::EXACT; 6],
        );
        let iv: Vec<i32> = rng.ints_in::<i32>(n, -1000, 1000);
        let cpu = kernels::f16s::casts(
            &dev,
            &put(&dev, &h, &[n]),
            &put(&dev, &y, &[n]),
            &put(&dev, &iv, &[n]),
        )
        .unwrap();
        emulate(
            &format!("f16 casts {n}"),
            &kernels::f16s::casts::__fuse::PROGRAM,
            vec![hex(&h), hex(&y), hex(&iv)],
            vec![],
            &[("n", n)],
            &cpu,
            &["f32", "f64", "i32", "u8", "f16", "f16", "f16"],
            &[Tol::EXACT; 7],
        );
        // Small integers.
        let a8: Vec<i8> = rng.ints::<i8>(n);
        let b8: Vec<i8> = rng.ints::<i8>(n);
        let cpu = kernels::i8s::arith(&dev, &put(&dev, &a8, &[n]), &put(&dev, &b8, &[n])).unwrap();
        emulate(
            &format!("i8 arith {n}"),
            &kernels::i8s::arith::__fuse::PROGRAM,
            vec![hex(&a8), hex(&b8)],
            vec![],
            &[("n", n)],
            &cpu,
            &["i8"; 5],
            &[Tol::EXACT; 5],
        );
        let a16: Vec<u16> = rng.ints::<u16>(n);
        let cpu = kernels::u16s::casts(&dev, &put(&dev, &a16, &[n])).unwrap();
        emulate(
            &format!("u16 casts {n}"),
            &kernels::u16s::casts::__fuse::PROGRAM,
            vec![hex(&a16)],
            vec![],
            &[("n", n)],
            &cpu,
            &["i32", "u32", "i64", "u64", "f32", "f64"],
            &[Tol::EXACT; 6],
        );
        let s16: Vec<u32> = rng.ints::<u32>(n);
        let cpu = kernels::u16s::bits(
            &dev,
            &put(&dev, &a16, &[n]),
            &put(&dev, &a16.iter().rev().copied().collect::<Vec<_>>(), &[n]),
            &put(&dev, &s16, &[n]),
        )
        .unwrap();
        let rev: Vec<u16> = a16.iter().rev().copied().collect();
        emulate(
            &format!("u16 bits {n}"),
            &kernels::u16s::bits::__fuse::PROGRAM,
            vec![hex(&a16), hex(&rev), hex(&s16)],
            vec![],
            &[("n", n)],
            &cpu,
            &["u16"; 8],
            &[Tol::EXACT; 8],
        );
    }
    for n in [1usize, 31, 4097, 100_003] {
        let x = rng.floats::<f32>(n, -30.0, 30.0);
        let cpu = kernels::logsumexp_all(&dev, &put(&dev, &x, &[n])).unwrap();
        let abs: f64 = x.iter().map(|v| f64::from(v.abs())).sum();
        // Three blocks finish through the partials; one block (as small inputs launch) alone.
        for grid in [3, 1] {
            emulate_on(
                grid,
                &format!("logsumexp_all {n} on {grid} blocks"),
                &kernels::logsumexp_all::__fuse::PROGRAM,
                vec![hex(&x)],
                vec![],
                &[("n", n)],
                &cpu,
                &["f32", "f32"],
                &[Tol::close(2e-6, 1e-6), sum_tol::<f32>(&[abs])],
            );
        }
        let y = rng.floats::<f32>(n, 0.5, 2.0);
        let cpu =
            kernels::fast_functions(&dev, &put(&dev, &x, &[n]), &put(&dev, &y, &[n])).unwrap();
        emulate(
            &format!("fast_functions {n}"),
            &kernels::fast_functions::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &[("n", n)],
            &cpu,
            &["f32"; 8],
            &vec![Tol::close(1e-5, 1e-6); 8],
        );
        let seed = rng.next_u64();
        let xd = rng.floats::<f64>(n, -3.0, 3.0);
        let pd = rng.floats::<f64>(n, 0.0, 1.0);
        let cpu =
            kernels::noisy_sum(&dev, &put(&dev, &xd, &[n]), &put(&dev, &pd, &[n]), seed).unwrap();
        emulate(
            &format!("noisy_sum {n}"),
            &kernels::noisy_sum::__fuse::PROGRAM,
            vec![hex(&xd), hex(&pd)],
            vec![seed],
            &[("n", n)],
            &cpu,
            &["f64", "f64"],
            &[Tol::EXACT, Tol::close(1e-12, 1e-10)],
        );
    }

    for (rows, cols) in [(37, 6), (3, 4100), (5, 4096)] {
        let n = rows * cols;
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let d = [("rows", rows), ("cols", cols)];
        let cpu = kernels::col_softmax(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        emulate(
            &format!("col_softmax {rows}x{cols}"),
            &kernels::col_softmax::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
        let cpu = kernels::softmax_mid(&dev, &put(&dev, &x, &[rows, 2, cols / 2])).unwrap();
        emulate(
            &format!("softmax_mid {rows}x2x{}", cols / 2),
            &kernels::softmax_mid::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("b", rows), ("t", 2), ("c", cols / 2)],
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
        let hb: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::bf16s::softmax(&dev, &put(&dev, &hb, &[rows, cols])).unwrap();
        emulate(
            &format!("bf16 softmax {rows}x{cols}"),
            &kernels::bf16s::softmax::__fuse::PROGRAM,
            vec![hex(&hb)],
            vec![],
            &d,
            &cpu,
            &["bf16"],
            &[Tol::close(1e-2, 1e-6)],
        );
        let g: Vec<fuse_runtime::f16> = rng
            .floats::<f32>(cols, -2.0, 2.0)
            .iter()
            .map(|&v| fuse_runtime::f16::from_f32(v))
            .collect();
        let h: Vec<fuse_runtime::f16> = x.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let eps = fuse_runtime::f16::from_f32(1e-3);
        let cpu = kernels::f16s::layernorm(
            &dev,
            &put(&dev, &h, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            eps,
        )
        .unwrap();
        emulate(
            &format!("f16 layernorm {rows}x{cols}"),
            &kernels::f16s::layernorm::__fuse::PROGRAM,
            vec![hex(&h), hex(&g)],
            vec![Element::to_bits(eps)],
            &d,
            &cpu,
            &["f16", "f32"],
            // `rstd` is an f16 (2^-10 apart): its f32 sums may round to neighbours.
            &[Tol::close(4e-3, 4e-3), Tol::close(2e-3, 0.0)],
        );
        let a: Vec<u8> = rng.ints::<u8>(n);
        let cpu = kernels::u8s::casts(&dev, &put(&dev, &a, &[n])).unwrap();
        emulate(
            &format!("u8 casts {n}"),
            &kernels::u8s::casts::__fuse::PROGRAM,
            vec![hex(&a)],
            vec![],
            &[("n", n)],
            &cpu,
            &["i32", "u32", "i64", "u64", "f32", "f64"],
            &[Tol::EXACT; 6],
        );
    }

    // The benchmark's kernels of issue 5's workloads, at widths that take each path.
    for (rows, cols) in [(3, 4100), (5, 64), (4, 30)] {
        let n = rows * cols;
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let g = rng.floats::<f32>(cols, -2.0, 2.0);
        let b = rng.floats::<f32>(cols, -2.0, 2.0);
        let d = [("rows", rows), ("cols", cols)];
        let seed = rng.next_u64();
        let cpu = bench_kernels::w3_bias_gelu_dropout(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &b, &[cols]),
            seed,
        )
        .unwrap();
        emulate_both(
            &format!("w3 {rows}x{cols}"),
            &bench_kernels::w3_bias_gelu_dropout::__fuse::PROGRAM,
            vec![hex(&x), hex(&b)],
            vec![seed],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-6)],
        );
        let cpu = bench_kernels::w7_layernorm_quantize(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            &put(&dev, &b, &[cols]),
        )
        .unwrap();
        emulate(
            &format!("w7 {rows}x{cols}"),
            &bench_kernels::w7_layernorm_quantize::__fuse::PROGRAM,
            vec![hex(&x), hex(&g), hex(&b)],
            vec![],
            &d,
            &cpu,
            &["q8", "f32"],
            &[Tol::close(0.0, 1.0), Tol::close(1e-4, 0.0)],
        );
        let label = labels(&mut rng, rows, cols);
        let cpu = bench_kernels::w9_cross_entropy(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &label, &[rows]),
        )
        .unwrap();
        emulate(
            &format!("w9 {rows}x{cols}"),
            &bench_kernels::w9_cross_entropy::__fuse::PROGRAM,
            vec![hex(&x), hex(&label)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(2e-5, 2e-5)],
        );
    }
    // 16-bit float kernels that load eight lanes (no division), at sizes around multiples of 8.
    for n in [1usize, 7, 8, 9, 4103] {
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let y = rng.floats::<f32>(n, -3.0, 3.0);
        let h: Vec<fuse_runtime::f16> = x.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let hy: Vec<fuse_runtime::f16> =
            y.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let s = fuse_runtime::f16::from_f32(0.75);
        let cpu =
            kernels::f16s::chain(&dev, &put(&dev, &h, &[n]), &put(&dev, &hy, &[n]), s).unwrap();
        emulate(
            &format!("f16 chain {n}"),
            &kernels::f16s::chain::__fuse::PROGRAM,
            vec![hex(&h), hex(&hy)],
            vec![Element::to_bits(s)],
            &[("n", n)],
            &cpu,
            &["f16"; 3],
            &[Tol::EXACT; 3],
        );
        let b: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let by: Vec<fuse_runtime::bf16> =
            y.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu =
            kernels::bf16s::compare(&dev, &put(&dev, &b, &[n]), &put(&dev, &by, &[n])).unwrap();
        emulate(
            &format!("bf16 compare {n}"),
            &kernels::bf16s::compare::__fuse::PROGRAM,
            vec![hex(&b), hex(&by)],
            vec![],
            &[("n", n)],
            &cpu,
            &["bool"; 6],
            &[Tol::EXACT; 6],
        );
    }
}

/// The bytes an element and the partial sums' bytes an element of `program`'s long-row entry
/// (`Grid::LongRows`): its cached tensors', and its partial sums' beside them.
fn long_row_grid(program: &Program) -> (u32, u32) {
    let entry = program.entries.iter().find(|e| e.path == "long_rows");
    match entry.map(|e| e.grid) {
        Some(Grid::LongRows { cache_bytes, sums }) => (cache_bytes, sums),
        _ => panic!("{}: no long-row entry", program.signature.kernel),
    }
}

/// The launch the runtime gives `program`'s rows of `cols` elements, split over `cluster`
/// blocks: each block the shared memory its part takes, at the bytes an element its long-row
/// entry asks for.
fn long_rows(program: &Program, cols: usize, cluster: u32) -> Shared {
    let (bytes, _) = long_row_grid(program);
    Shared {
        cluster,
        bytes: fuse_runtime::__private::long_row_shared_bytes(cols as u64, cluster, bytes),
    }
}

/// Long rows in clusters of three whose parts hold what a block's own statistics would get
/// wrong: a part of only `-inf`, an infinity, a NaN, a row of only `-inf`, beside rows of fresh
/// values (softmax in bf16, cross-entropy's `logsumexp` in f32).
#[test]
fn long_rows_with_infinite_parts_run_on_an_emulated_cluster() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let (rows, cols, cluster) = (6, 4104, 3);
    let mut x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
    x[cols..cols + cols * 3 / 4].fill(f32::NEG_INFINITY);
    x[2 * cols + 1000] = f32::INFINITY;
    x[3 * cols + 3000] = f32::NAN;
    x[4 * cols..5 * cols].fill(f32::NEG_INFINITY);
    let b: Vec<fuse_runtime::bf16> = x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
    let cpu = kernels::bf16s::softmax(&dev, &put(&dev, &b, &[rows, cols])).unwrap();
    emulate_launch(
        "long bf16 softmax with infinities",
        &kernels::bf16s::softmax::__fuse::PROGRAM,
        vec![hex(&b)],
        vec![],
        &[("rows", rows), ("cols", cols)],
        &cpu,
        &["bf16"],
        &[Tol::close(1e-2, 1e-6)],
        Some(long_rows(
            &kernels::bf16s::softmax::__fuse::PROGRAM,
            cols,
            cluster,
        )),
    );
    let label = labels(&mut rng, rows, cols);
    let cpu = kernels::cross_entropy(
        &dev,
        &put(&dev, &x, &[rows, cols]),
        &put(&dev, &label, &[rows]),
    )
    .unwrap();
    emulate_launch(
        "long cross_entropy with infinities",
        &kernels::cross_entropy::__fuse::PROGRAM,
        vec![hex(&x), hex(&label)],
        vec![],
        &[("rows", rows), ("cols", cols)],
        &cpu,
        &["f32"],
        &[Tol::close(2e-5, 1e-6)],
        Some(long_rows(
            &kernels::cross_entropy::__fuse::PROGRAM,
            cols,
            cluster,
        )),
    );
}

/// Long rows cached in shared memory, launched as the runtime launches them (at small sizes: the
/// kernel takes the path whenever the launch gives it the memory), on clusters of one to four
/// blocks: parts that are partial or empty, lengths that are not a multiple of four, more and
/// fewer rows than the three clusters.
#[test]
fn long_rows_run_from_shared_memory_on_an_emulated_cluster() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    // (rows, cols, blocks per row)
    for (rows, cols, cluster) in [
        (5, 4100, 3),
        (4, 37, 4),
        (3, 33, 4),
        (2, 4099, 2),
        (5, 36, 1),
    ] {
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let cpu = kernels::softmax(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        emulate_launch(
            &format!("long softmax {rows}x{cols} in {cluster}"),
            &kernels::softmax::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
            Some(long_rows(&kernels::softmax::__fuse::PROGRAM, cols, cluster)),
        );
    }
    // 16-bit rows: 16-byte vectors where the length is a multiple of eight, else 8-byte ones,
    // else elements.
    for (rows, cols, cluster) in [(3, 4104, 3), (2, 4100, 2), (3, 4099, 4), (4, 40, 1)] {
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let b: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::bf16s::softmax(&dev, &put(&dev, &b, &[rows, cols])).unwrap();
        emulate_launch(
            &format!("long bf16 softmax {rows}x{cols} in {cluster}"),
            &kernels::bf16s::softmax::__fuse::PROGRAM,
            vec![hex(&b)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["bf16"],
            &[Tol::close(1e-2, 1e-6)],
            Some(long_rows(
                &kernels::bf16s::softmax::__fuse::PROGRAM,
                cols,
                cluster,
            )),
        );
    }
    for (rows, cols, cluster) in [(5, 4100, 3), (4, 37, 4), (2, 41, 1)] {
        let n = rows * cols;
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let g = rng.floats::<f32>(cols, -2.0, 2.0);
        let b = rng.floats::<f32>(cols, -2.0, 2.0);
        let d = [("rows", rows), ("cols", cols)];
        let cpu = kernels::layernorm(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            &put(&dev, &b, &[cols]),
            1e-5,
        )
        .unwrap();
        emulate_launch(
            &format!("long layernorm {rows}x{cols} in {cluster}"),
            &kernels::layernorm::__fuse::PROGRAM,
            vec![hex(&x), hex(&g), hex(&b)],
            vec![Element::to_bits(1e-5f32)],
            &d,
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-4, 1e-4), Tol::close(1e-4, 0.0)],
            Some(long_rows(
                &kernels::layernorm::__fuse::PROGRAM,
                cols,
                cluster,
            )),
        );
        let cpu = bench_kernels::w7_layernorm_quantize(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            &put(&dev, &b, &[cols]),
        )
        .unwrap();
        emulate_launch(
            &format!("long w7 {rows}x{cols} in {cluster}"),
            &bench_kernels::w7_layernorm_quantize::__fuse::PROGRAM,
            vec![hex(&x), hex(&g), hex(&b)],
            vec![],
            &d,
            &cpu,
            &["q8", "f32"],
            &[Tol::close(0.0, 1.0), Tol::close(1e-4, 0.0)],
            Some(long_rows(
                &bench_kernels::w7_layernorm_quantize::__fuse::PROGRAM,
                cols,
                cluster,
            )),
        );
        let label = labels(&mut rng, rows, cols);
        let cpu = kernels::cross_entropy(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &label, &[rows]),
        )
        .unwrap();
        emulate_launch(
            &format!("long cross_entropy {rows}x{cols} in {cluster}"),
            &kernels::cross_entropy::__fuse::PROGRAM,
            vec![hex(&x), hex(&label)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(2e-5, 1e-6)],
            Some(long_rows(
                &kernels::cross_entropy::__fuse::PROGRAM,
                cols,
                cluster,
            )),
        );
        let w = rng.floats::<f64>(n, -2.0, 2.0);
        let m: Vec<u8> = rng.ints::<u8>(n);
        let cpu = kernels::mixed_rows(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &w, &[rows, cols]),
            &put(&dev, &m, &[rows, cols]),
        )
        .unwrap();
        emulate_launch(
            &format!("long mixed_rows {rows}x{cols} in {cluster}"),
            &kernels::mixed_rows::__fuse::PROGRAM,
            vec![hex(&x), hex(&w), hex(&m)],
            vec![],
            &d,
            &cpu,
            &["f64", "f32"],
            &[Tol::close(1e-12, 1e-12), Tol::EXACT],
            Some(long_rows(
                &kernels::mixed_rows::__fuse::PROGRAM,
                cols,
                cluster,
            )),
        );
        let h: Vec<fuse_runtime::f16> = x.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let cpu = kernels::f16s::softmax(&dev, &put(&dev, &h, &[rows, cols])).unwrap();
        emulate_launch(
            &format!("long f16 softmax {rows}x{cols} in {cluster}"),
            &kernels::f16s::softmax::__fuse::PROGRAM,
            vec![hex(&h)],
            vec![],
            &d,
            &cpu,
            &["f16"],
            &[Tol::close(2e-3, 1e-6)],
            Some(long_rows(
                &kernels::f16s::softmax::__fuse::PROGRAM,
                cols,
                cluster,
            )),
        );
        let xd: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let cpu = kernels::softmax_f64(&dev, &put(&dev, &xd, &[rows, cols])).unwrap();
        emulate_launch(
            &format!("long f64 softmax {rows}x{cols} in {cluster}"),
            &kernels::softmax_f64::__fuse::PROGRAM,
            vec![hex(&xd)],
            vec![],
            &d,
            &cpu,
            &["f64"],
            &[Tol::close(1e-12, 1e-15)],
            Some(long_rows(
                &kernels::softmax_f64::__fuse::PROGRAM,
                cols,
                cluster,
            )),
        );
    }

    // Rows indexed by two dims, with a per-row output.
    for (b, t, c, cluster) in [(2, 3, 4100, 2), (2, 2, 37, 4)] {
        let x = rng.floats::<f32>(b * t * c, -5.0, 5.0);
        let cpu = kernels::softmax_last(&dev, &put(&dev, &x, &[b, t, c])).unwrap();
        emulate_launch(
            &format!("long softmax_last {b}x{t}x{c} in {cluster}"),
            &kernels::softmax_last::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("b", b), ("t", t), ("c", c)],
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-7), Tol::close(1e-5, 1e-6)],
            Some(long_rows(
                &kernels::softmax_last::__fuse::PROGRAM,
                c,
                cluster,
            )),
        );
    }
}

/// Rows of 33 to 4095 elements on the general path: a warp a row where the rows keep the grid
/// busy (40 and 25 rows over 3 blocks), wider segments where they do not (5 rows), as vectors of
/// four (300, 1000) or element by element (301); in bf16, vectors of eight (304, 1000) where the
/// length allows, else four (300).
#[test]
fn row_reductions_take_a_warp_a_row_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(40, 300), (25, 301), (25, 1000), (5, 300)] {
        let n = rows * cols;
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let y = rng.floats::<f32>(n, 0.99, 1.01);
        let shape = [rows, cols];
        let cpu = kernels::f32s::reduce_rows(&dev, &put(&dev, &x, &shape), &put(&dev, &y, &shape))
            .unwrap();
        let sum = Tol::close(1e-5, 1e-5 * cols as f64);
        emulate(
            &format!("reduce_rows {rows}x{cols}"),
            &kernels::f32s::reduce_rows::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f32"; 5],
            &[
                sum.clone(),
                Tol::close(1e-4, 0.0),
                Tol::EXACT,
                Tol::EXACT,
                sum,
            ],
        );
    }
    for (rows, cols) in [(40, 304), (25, 300), (25, 1000), (5, 301)] {
        let x = rng.floats::<f32>(rows * cols, -3.0, 3.0);
        let h: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::bf16s::reduce_rows(&dev, &put(&dev, &h, &[rows, cols])).unwrap();
        emulate(
            &format!("bf16 reduce_rows {rows}x{cols}"),
            &kernels::bf16s::reduce_rows::__fuse::PROGRAM,
            vec![hex(&h)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["bf16"; 4],
            &[
                Tol::close(1e-2, 1e-2),
                Tol::EXACT,
                Tol::close(1e-2, 1e-3),
                Tol::close(1e-2, 1e-3),
            ],
        );
    }
}

/// Streamed rows whose length is no multiple of four take their middle as vectors from each
/// row's first whole vector (`peeled_row_loop`), the elements before it and after the last
/// one by one: 16-bit softmax and row reductions, and f32 ones, at odd lengths and at 2 mod 4
/// (1030), where each row starts at another place in its vector; and a length past the
/// register rows' (5001). Up to 4095 on the streamed entry (`rows`), which the kernels would
/// take there without their register entries (peeled too: `peeled_register_rows_` and
/// `peeled_segment_rows_run_on_an_emulated_gpu`).
#[test]
fn odd_rows_stream_as_peeled_vectors_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(9, 37), (7, 1027), (5, 1030), (3, 4095), (2, 5001)] {
        // The streamed entry where the registers' entries would take the rows.
        let how = Emulation {
            entry: (cols < 4096).then_some("rows"),
            ..Emulation::default()
        };
        let x = rng.floats::<f32>(rows * cols, -4.0, 4.0);
        emulate_16_bit_softmax_as(&how, "peeled softmax", &x, rows, cols);
        let d = [("rows", rows), ("cols", cols)];
        let h: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::bf16s::reduce_rows(&dev, &put(&dev, &h, &[rows, cols])).unwrap();
        how.run(
            &format!("bf16 peeled reduce_rows {rows}x{cols}"),
            &kernels::bf16s::reduce_rows::__fuse::PROGRAM,
            vec![hex(&h)],
            vec![],
            &d,
            &cpu,
            &["bf16"; 4],
            &[
                Tol::close(1e-2, 2e-2),
                Tol::EXACT,
                Tol::close(1e-2, 1e-3),
                Tol::close(1e-2, 1e-3),
            ],
        );
        let cpu = kernels::softmax(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        how.run(
            &format!("peeled softmax {rows}x{cols}"),
            &kernels::softmax::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
        let label = labels(&mut rng, rows, cols);
        let cpu = kernels::cross_entropy(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &label, &[rows]),
        )
        .unwrap();
        how.run(
            &format!("peeled cross_entropy {rows}x{cols}"),
            &kernels::cross_entropy::__fuse::PROGRAM,
            vec![hex(&x), hex(&label)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(2e-5, 1e-6)],
        );
    }
}

/// Rows of 2049 to 4096 elements whose length is no multiple of four, held a block a row in
/// registers from each row's first whole vector in memory, the elements before it and after
/// the last whole one streamed in every pass (`block_rows_peeled`): lengths at 1, 2 and 3 mod 4,
/// the shortest and the longest, f32 and 16-bit softmax, two tensors cached
/// (`softmax_products`), values a row written beside the row (`softmax_stats`), a position
/// compared with a label (cross-entropy), over more rows than the grid's blocks.
#[test]
fn peeled_register_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(4, 2049), (5, 2054), (3, 3003), (5, 4095)] {
        let peeled = |program: &'static Program| {
            let entry = program.pick(&[rows, cols], 90, false).unwrap();
            assert_eq!(entry.path, "block_rows_peeled", "{}", program.name());
        };
        for program in [
            &kernels::softmax::__fuse::PROGRAM,
            &kernels::softmax_products::__fuse::PROGRAM,
            &kernels::softmax_stats::__fuse::PROGRAM,
            &kernels::cross_entropy::__fuse::PROGRAM,
            &kernels::bf16s::softmax::__fuse::PROGRAM,
            &kernels::f16s::softmax::__fuse::PROGRAM,
        ] {
            peeled(program);
        }
        let x = rng.floats::<f32>(rows * cols, -4.0, 4.0);
        let y = rng.floats::<f32>(rows * cols, -2.0, 2.0);
        let d = [("rows", rows), ("cols", cols)];
        let shape = [rows, cols];
        emulate_16_bit_softmax("peeled registers", &x, rows, cols);
        let cpu = kernels::softmax(&dev, &put(&dev, &x, &shape)).unwrap();
        emulate(
            &format!("peeled registers softmax {rows}x{cols}"),
            &kernels::softmax::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
        let cpu = kernels::softmax_products(&dev, &put(&dev, &x, &shape), &put(&dev, &y, &shape))
            .unwrap();
        emulate(
            &format!("peeled registers softmax_products {rows}x{cols}"),
            &kernels::softmax_products::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
        let cpu = kernels::softmax_stats(&dev, &put(&dev, &x, &shape)).unwrap();
        emulate(
            &format!("peeled registers softmax_stats {rows}x{cols}"),
            &kernels::softmax_stats::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32"; 3],
            &[Tol::close(1e-5, 1e-7), Tol::EXACT, Tol::close(1e-6, 1e-6)],
        );
        let label = labels(&mut rng, rows, cols);
        let cpu = kernels::cross_entropy(&dev, &put(&dev, &x, &shape), &put(&dev, &label, &[rows]))
            .unwrap();
        emulate(
            &format!("peeled registers cross_entropy {rows}x{cols}"),
            &kernels::cross_entropy::__fuse::PROGRAM,
            vec![hex(&x), hex(&label)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &[Tol::close(2e-5, 1e-6)],
        );
    }
}

/// Rows of 257 to 2048 elements (to 4096 on sm_80) whose length is no multiple of the vectors,
/// held in registers by segments from each row's first whole vector in memory, the elements
/// around those vectors one a thread, loaded beside them (`cached_rows_peeled_<max>`, and
/// `wide_cached_rows_peeled_<max>` for 16-bit rows, each of a constant width): lengths at 1, 2,
/// 3, 5 and 7 mod 8, the shortest and the longest, segments of 16 to 256 threads, f32 and 16-bit softmax, two tensors cached
/// (`softmax_products`), values a row written beside the row (`softmax_stats`), a position
/// compared with a label (cross-entropy), mostly over more rows than the grid's segments.
#[test]
fn peeled_segment_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let cases = [
        (35, 257, 90),
        (11, 777, 90),
        (17, 1027, 90),
        (9, 1030, 90),
        (9, 1533, 90),
        (9, 2047, 90),
    ];
    let sm_80: [(usize, usize, u32); 2] = [(3, 2053, 80), (3, 4095, 80)];
    for (rows, cols, arch) in cases.into_iter().chain(sm_80) {
        // Two blocks: most rows are more than their segments, which then take a second.
        let how = Emulation {
            grid: Some(2),
            arch: Some(arch),
            ..Emulation::default()
        };
        // The entries of a constant width: 512, 1024, 2048 or 4096 elements a segment.
        let max_len = cols.next_power_of_two();
        let cached = format!("cached_rows_peeled_{max_len}");
        let narrow = match cols <= 2048 {
            true => format!("wide_cached_rows_peeled_{max_len}"),
            false => cached.clone(),
        };
        for (program, path) in [
            (&kernels::softmax::__fuse::PROGRAM, &cached),
            (&kernels::softmax_products::__fuse::PROGRAM, &cached),
            (&kernels::softmax_stats::__fuse::PROGRAM, &cached),
            (&kernels::cross_entropy::__fuse::PROGRAM, &cached),
            (&kernels::bf16s::softmax::__fuse::PROGRAM, &narrow),
            (&kernels::f16s::softmax::__fuse::PROGRAM, &narrow),
        ] {
            let entry = program.pick(&[rows, cols], arch, false).unwrap();
            let name = program.name();
            assert_eq!(entry.path, path.as_str(), "{name} at {cols}, sm_{arch}");
        }
        let x = rng.floats::<f32>(rows * cols, -4.0, 4.0);
        let y = rng.floats::<f32>(rows * cols, -2.0, 2.0);
        let d = [("rows", rows), ("cols", cols)];
        let shape = [rows, cols];
        let what = format!("peeled segments {rows}x{cols} sm_{arch}");
        let b: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::bf16s::softmax(&dev, &put(&dev, &b, &shape)).unwrap();
        let program = &kernels::bf16s::softmax::__fuse::PROGRAM;
        let tol = [Tol::close(1e-2, 1e-6)];
        how.run(
            &format!("bf16 softmax {what}"),
            program,
            vec![hex(&b)],
            vec![],
            &d,
            &cpu,
            &["bf16"],
            &tol,
        );
        let h: Vec<fuse_runtime::f16> = x.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let cpu = kernels::f16s::softmax(&dev, &put(&dev, &h, &shape)).unwrap();
        let program = &kernels::f16s::softmax::__fuse::PROGRAM;
        let tol = [Tol::close(2e-3, 1e-6)];
        how.run(
            &format!("f16 softmax {what}"),
            program,
            vec![hex(&h)],
            vec![],
            &d,
            &cpu,
            &["f16"],
            &tol,
        );
        let cpu = kernels::softmax(&dev, &put(&dev, &x, &shape)).unwrap();
        let program = &kernels::softmax::__fuse::PROGRAM;
        let tol = [Tol::close(1e-5, 1e-7)];
        how.run(
            &format!("softmax {what}"),
            program,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32"],
            &tol,
        );
        let cpu = kernels::softmax_products(&dev, &put(&dev, &x, &shape), &put(&dev, &y, &shape))
            .unwrap();
        let program = &kernels::softmax_products::__fuse::PROGRAM;
        let (tensors, tol) = (vec![hex(&x), hex(&y)], [Tol::close(1e-5, 1e-7)]);
        how.run(
            &format!("softmax_products {what}"),
            program,
            tensors,
            vec![],
            &d,
            &cpu,
            &["f32"],
            &tol,
        );
        let cpu = kernels::softmax_stats(&dev, &put(&dev, &x, &shape)).unwrap();
        let program = &kernels::softmax_stats::__fuse::PROGRAM;
        let tol = [Tol::close(1e-5, 1e-7), Tol::EXACT, Tol::close(1e-6, 1e-6)];
        how.run(
            &format!("softmax_stats {what}"),
            program,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32"; 3],
            &tol,
        );
        let label = labels(&mut rng, rows, cols);
        let cpu = kernels::cross_entropy(&dev, &put(&dev, &x, &shape), &put(&dev, &label, &[rows]))
            .unwrap();
        let program = &kernels::cross_entropy::__fuse::PROGRAM;
        let (tensors, tol) = (vec![hex(&x), hex(&label)], [Tol::close(2e-5, 1e-6)]);
        how.run(
            &format!("cross_entropy {what}"),
            program,
            tensors,
            vec![],
            &d,
            &cpu,
            &["f32"],
            &tol,
        );
    }
}

/// GroupNorm (`mean(x, (c, s))`, the weight and bias gathered at each element's channel), in
/// f32 and bf16: positions a multiple of eight, of four only, and of neither, so that each
/// vector reads its channel's weight once where it can (`lane_invariants`) and each element
/// reads its own where not.
#[test]
fn group_norm_runs_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    // Rows of 2560 and 4096 take a row a block (`fz_pos`), the others several rows a block.
    for (b, g, c, s) in [
        (2, 3, 9, 12),
        (3, 2, 6, 64),
        (2, 3, 5, 7),
        (1, 2, 7, 136),
        (1, 2, 5, 512),
        (1, 2, 4, 1024),
    ] {
        let shape = [b, g, c, s];
        let dims = [("b", b), ("g", g), ("c", c), ("s", s)];
        let x = rng.floats::<f32>(b * g * c * s, -3.0, 3.0);
        let w = rng.floats::<f32>(g * c, 0.5, 1.5);
        let bias = rng.floats::<f32>(g * c, -1.0, 1.0);
        let eps = 1e-5f32;
        let cpu = kernels::merged::group_norm(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &w, &[g, c]),
            &put(&dev, &bias, &[g, c]),
            eps,
        )
        .unwrap();
        emulate(
            &format!("group_norm {b}x{g}x{c}x{s}"),
            &kernels::merged::group_norm::__fuse::PROGRAM,
            vec![hex(&x), hex(&w), hex(&bias)],
            vec![Element::to_bits(eps)],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::close(1e-4, 1e-4)],
        );
        let xh: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let wh: Vec<fuse_runtime::bf16> =
            w.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::merged::group_norm_bf16(
            &dev,
            &put(&dev, &xh, &shape),
            &put(&dev, &wh, &[g, c]),
        )
        .unwrap();
        emulate(
            &format!("bf16 group_norm {b}x{g}x{c}x{s}"),
            &kernels::merged::group_norm_bf16::__fuse::PROGRAM,
            vec![hex(&xh), hex(&wh)],
            vec![],
            &dims,
            &cpu,
            &["bf16", "f32", "f32"],
            &[
                Tol::close(1.0 / 128.0, 1e-2),
                Tol::close(1e-5, 1e-5),
                Tol::close(1e-5, 1e-5),
            ],
        );
    }
}

/// Derivatives through views and gathers, each launch against the same launch on the CPU
/// backend: the gathered cross-entropy's loss and gradient in one row launch (labels out of
/// range, ignored and past 2^32 included), its tangent, `silu_and_mul`'s tangent through the
/// halves of its input, and a permuted view's gradients.
#[test]
fn gradients_through_views_run_on_an_emulated_gpu() {
    use fuse_runtime::bf16;
    use grad_kernels::cross_entropy_gathered::{
        __cross_entropy_gathered_j0 as ce_tangent, __cross_entropy_gathered_v0 as ce_both,
    };
    use grad_kernels::half_softmax::{__half_softmax_d0 as sums, __half_softmax_d1 as half};
    use grad_kernels::permuted::__permuted_d0 as permuted_grads;
    use grad_kernels::silu_and_mul::{
        __silu_and_mul_d0 as silu_grad, __silu_and_mul_j0 as silu_tangent,
    };
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let b16 = |v: Vec<f32>| -> Vec<bf16> { v.into_iter().map(bf16::from_f32).collect() };
    for (rows, cols) in [(5, 7), (3, 1000), (9, 33), (2, 4096)] {
        let s = [rows, cols];
        let dims = [("rows", rows), ("cols", cols)];
        let z = b16(rng.floats::<f32>(rows * cols, -3.0, 3.0));
        let v = b16(rng.floats::<f32>(rows * cols, -1.0, 1.0));
        let label = labels(&mut rng, rows, cols);
        let dl = rng.floats::<f32>(rows, -1.0, 1.0);
        let (bz, bl) = (put(&dev, &z, &s), put(&dev, &label, &[rows]));
        let cpu = ce_both(&dev, &bz, &bl, &put(&dev, &dl, &[rows])).unwrap();
        emulate(
            &format!("cross_entropy_gathered value_and_vjp {rows}x{cols}"),
            &ce_both::__fuse::PROGRAM,
            vec![hex(&z), hex(&label), hex(&dl)],
            vec![],
            &dims,
            &cpu,
            &["f32", "bf16"],
            &[Tol::close(1e-5, 1e-5), Tol::close(2f64.powi(-7), 1e-6)],
        );
        let cpu = ce_tangent(&dev, &bz, &bl, &put(&dev, &v, &s)).unwrap();
        emulate(
            &format!("cross_entropy_gathered jvp {rows}x{cols}"),
            &ce_tangent::__fuse::PROGRAM,
            vec![hex(&z), hex(&label), hex(&v)],
            vec![],
            &dims,
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-5), Tol::close(1e-4, 1e-4)],
        );
        let (t, d) = (rows, cols);
        let x = b16(rng.floats::<f32>(t * 2 * d, -3.0, 3.0));
        let tx = b16(rng.floats::<f32>(t * 2 * d, -1.0, 1.0));
        let xs = [t, 2 * d];
        let cpu = silu_tangent(&dev, &put(&dev, &x, &xs), &put(&dev, &tx, &xs)).unwrap();
        emulate(
            &format!("silu_and_mul jvp {t}x{d}"),
            &silu_tangent::__fuse::PROGRAM,
            vec![hex(&x), hex(&tx)],
            vec![],
            &[("t", t), ("d", d)],
            &cpu,
            &["bf16", "bf16"],
            &[
                Tol::close(2f64.powi(-7), 1e-6),
                Tol::close(2f64.powi(-7), 1e-6),
            ],
        );
        // The gradients stored through the halves' views into a buffer of `x`'s shape, which
        // holds other values before: both halves overwrite it; one half leaves the other.
        let dy = b16(rng.floats::<f32>(t * d, -1.0, 1.0));
        let before = b16(rng.floats::<f32>(t * 2 * d, -9.0, 9.0));
        let (bx, bdy) = (put(&dev, &x, &xs), put(&dev, &dy, &[t, d]));
        let mut cpu = put(&dev, &before, &xs);
        silu_grad(&dev, &bx, &bdy, &mut cpu).unwrap();
        let written = |before: &[bf16]| Emulation {
            written: vec![hex(before)],
            ..Emulation::default()
        };
        written(&before).run(
            &format!("silu_and_mul vjp {t}x{d}"),
            &silu_grad::__fuse::PROGRAM,
            vec![hex(&x), hex(&dy)],
            vec![],
            &[("t", t), ("d", d)],
            &cpu,
            &["bf16"],
            &[Tol::close(2f64.powi(-7), 1e-6)],
        );
        let df = rng.floats::<f32>(t * d, -1.0, 1.0);
        let bdf = put(&dev, &df, &[t, d]);
        let (s0, s1) = sums(&dev, &bx, &bdf).unwrap();
        let (h0, h1) = (common::host(&s0), common::host(&s1));
        let mut cpu = put(&dev, &before, &xs);
        half(&dev, &bx, &bdf, &s0, &s1, &mut cpu).unwrap();
        written(&before).run(
            &format!("half_softmax vjp {t}x{d}"),
            &half::__fuse::PROGRAM,
            vec![hex(&x), hex(&df), hex(&h0), hex(&h1)],
            vec![],
            &[("t", t), ("d", d)],
            &cpu,
            &["bf16"],
            &[Tol::close(2f64.powi(-7), 1e-6)],
        );
        let y = b16(rng.floats::<f32>(rows * cols, -2.0, 2.0));
        let dy = b16(rng.floats::<f32>(rows * cols, -1.0, 1.0));
        let cpu = permuted_grads(
            &dev,
            &put(&dev, &z, &s),
            &put(&dev, &y, &[cols, rows]),
            &put(&dev, &dy, &s),
        )
        .unwrap();
        emulate(
            &format!("permuted vjp {rows}x{cols}"),
            &permuted_grads::__fuse::PROGRAM,
            vec![hex(&z), hex(&y), hex(&dy)],
            vec![],
            &[("r", rows), ("c", cols)],
            &cpu,
            &["bf16", "bf16"],
            &[
                Tol::close(2f64.powi(-7), 1e-6),
                Tol::close(2f64.powi(-7), 1e-6),
            ],
        );
    }
}

/// One-hot picks (`index(cols) as i64 == label`), which a vector step settles where the label
/// is none of its positions (`rows::Cuda::four_lanes`), in a bf16 cross-entropy's value and
/// gradient: labels at a row's ends, on either side of a vector's edge and out of range (below
/// zero, past the row, and in its range plus 2^32), on the register, streamed and long-row
/// paths. Every other row spreads its logits over [-100, 100], where a shift other than the
/// row's max (taken two elements at once where the label is settled: `packed_in_lanes`)
/// overflows `exp`.
#[test]
fn one_hot_picks_run_on_an_emulated_gpu() {
    use fuse_runtime::bf16;
    use grad_kernels::cross_entropy::__cross_entropy_v0 as both;
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (cols, cluster) in [
        (33, None),
        (1000, None),
        (5001, None),
        (4104, Some(3)),
        (4099, Some(2)),
    ] {
        let c = cols as i64;
        let label: Vec<i64> = vec![0, 1, 3, 4, 7, 8, 9, c - 8, c - 1, -100, c, (1 << 32) + 5];
        let rows = label.len();
        let s = [rows, cols];
        let z: Vec<bf16> = (0..rows)
            .flat_map(|r| {
                let spread = if r % 2 == 0 { 3.0 } else { 100.0 };
                rng.floats::<f32>(cols, -spread, spread)
            })
            .map(bf16::from_f32)
            .collect();
        let dl = rng.floats::<f32>(rows, -1.0, 1.0);
        let cpu = both(
            &dev,
            &put(&dev, &z, &s),
            &put(&dev, &label, &[rows]),
            &put(&dev, &dl, &[rows]),
        )
        .unwrap();
        emulate_launch(
            &format!("cross_entropy value_and_vjp {rows}x{cols}"),
            &both::__fuse::PROGRAM,
            vec![hex(&z), hex(&label), hex(&dl)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f32", "bf16"],
            &[Tol::close(1e-5, 1e-5), Tol::close(2f64.powi(-7), 1e-6)],
            cluster.map(|c| long_rows(&both::__fuse::PROGRAM, cols, c)),
        );
    }
}

/// GroupNorm with its affine weight and bias (read at each element's place in the merged
/// dim): the launch of `x`'s gradient, the one that sums the weight's and the bias's over `b`,
/// the one that sums those over `s` (reading them through views over the parts of `(c, s)`),
/// and the tangent along every input, each against the same launch on the CPU.
#[test]
fn group_norm_derivatives_run_on_an_emulated_gpu() {
    use grad_kernels::group_norm_affine::{
        __group_norm_affine_d0 as grads, __group_norm_affine_d1 as over_b,
        __group_norm_affine_d2 as over_s, __group_norm_affine_j0 as tangents,
    };
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (b, g, c, s) in [(2, 3, 5, 7), (1, 2, 4, 256), (3, 1, 3, 1024)] {
        let shape = [b, g, c, s];
        let dims = [("b", b), ("g", g), ("c", c), ("s", s)];
        let n = b * g * c * s;
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let (w, bias) = (
            rng.floats::<f32>(g * c, 0.5, 1.5),
            rng.floats::<f32>(g * c, -1.0, 1.0),
        );
        let dy = rng.floats::<f32>(n, -1.0, 1.0);
        let (vw, vb) = (
            rng.floats::<f32>(g * c, -1.0, 1.0),
            rng.floats::<f32>(g * c, -1.0, 1.0),
        );
        let (bx, bw, bb) = (
            put(&dev, &x, &shape),
            put(&dev, &w, &[g, c]),
            put(&dev, &bias, &[g, c]),
        );
        let bdy = put(&dev, &dy, &shape);
        let inputs = || vec![hex(&x), hex(&w), hex(&bias), hex(&dy)];
        let tol = || Tol::close(1e-4, 1e-4);
        let cpu = grads(&dev, &bx, &bw, &bb, &bdy).unwrap();
        emulate(
            &format!("group_norm_affine vjp dx {b}x{g}x{c}x{s}"),
            &grads::__fuse::PROGRAM,
            inputs(),
            vec![],
            &dims,
            &cpu,
            &["f32", "f32", "f32"],
            &[tol(), tol(), tol()],
        );
        let (t0, t1, _) = cpu;
        let cpu = over_b(&dev, &bx, &bw, &bb, &bdy, &t0, &t1).unwrap();
        let mut with_stats = inputs();
        with_stats.extend([hex(&common::host(&t0)), hex(&common::host(&t1))]);
        emulate(
            &format!("group_norm_affine vjp sums over b {b}x{g}x{c}x{s}"),
            &over_b::__fuse::PROGRAM,
            with_stats,
            vec![],
            &dims,
            &cpu,
            &["f32", "f32"],
            &[tol(), tol()],
        );
        // `over_b` returns its sums in the order of its roots, `over_s` reads them in the
        // order of their temporaries.
        let (s1, s0) = cpu;
        let cpu = over_s(&dev, &bx, &bw, &bb, &bdy, &s0, &s1).unwrap();
        let mut with_sums = inputs();
        with_sums.extend([hex(&common::host(&s0)), hex(&common::host(&s1))]);
        emulate(
            &format!("group_norm_affine vjp dw, dbias {b}x{g}x{c}x{s}"),
            &over_s::__fuse::PROGRAM,
            with_sums,
            vec![],
            &dims,
            &cpu,
            &["f32", "f32"],
            &[tol(), tol()],
        );
        let cpu = tangents(
            &dev,
            &bx,
            &bw,
            &bb,
            &bdy,
            &put(&dev, &vw, &[g, c]),
            &put(&dev, &vb, &[g, c]),
        )
        .unwrap();
        emulate(
            &format!("group_norm_affine jvp {b}x{g}x{c}x{s}"),
            &tangents::__fuse::PROGRAM,
            vec![hex(&x), hex(&w), hex(&bias), hex(&dy), hex(&vw), hex(&vb)],
            vec![],
            &dims,
            &cpu,
            &["f32", "f32"],
            &[tol(), tol()],
        );
    }
}

/// `permute`: each element read where its parameter's own layout has it, in an elementwise
/// kernel and in row kernels along the dim whose stride is not one.
#[test]
fn permuted_views_run_on_an_emulated_gpu() {
    use kernels::permuted;
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (r, c) in [(3, 5), (17, 64), (5, 1000)] {
        let x = rng.floats::<f32>(r * c, -3.0, 3.0);
        let y = rng.floats::<f32>(c * r, -3.0, 3.0);
        let dims = [("r", r), ("c", c)];
        let (bx, by) = (put(&dev, &x, &[r, c]), put(&dev, &y, &[c, r]));
        let cpu = permuted::transposed_add(&dev, &bx, &by).unwrap();
        emulate(
            &format!("transposed_add {r}x{c}"),
            &permuted::transposed_add::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::EXACT],
        );
        let cpu = permuted::softmax_of_transpose(&dev, &by).unwrap();
        emulate(
            &format!("softmax_of_transpose {r}x{c}"),
            &permuted::softmax_of_transpose::__fuse::PROGRAM,
            vec![hex(&y)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
        let cpu = permuted::sums_of_products(&dev, &bx, &by).unwrap();
        emulate(
            &format!("sums_of_products {r}x{c}"),
            &permuted::sums_of_products::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-4)],
        );
    }
}

/// The bf16 and f16 softmax of `x` (`rows x cols`, cast from f32) on the emulated GPU against
/// the CPU backend, named `what`.
fn emulate_16_bit_softmax(what: &str, x: &[f32], rows: usize, cols: usize) {
    emulate_16_bit_softmax_as(&Emulation::default(), what, x, rows, cols);
}

/// [`emulate_16_bit_softmax`] as `how` says.
fn emulate_16_bit_softmax_as(how: &Emulation, what: &str, x: &[f32], rows: usize, cols: usize) {
    let (dev, shape) = (Device::cpu(), [rows, cols]);
    let b: Vec<fuse_runtime::bf16> = x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
    let cpu = kernels::bf16s::softmax(&dev, &put(&dev, &b, &shape)).unwrap();
    how.run(
        &format!("bf16 {what} {rows}x{cols}"),
        &kernels::bf16s::softmax::__fuse::PROGRAM,
        vec![hex(&b)],
        vec![],
        &[("rows", rows), ("cols", cols)],
        &cpu,
        &["bf16"],
        &[Tol::close(1e-2, 1e-6)],
    );
    let h: Vec<fuse_runtime::f16> = x.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
    let cpu = kernels::f16s::softmax(&dev, &put(&dev, &h, &shape)).unwrap();
    how.run(
        &format!("f16 {what} {rows}x{cols}"),
        &kernels::f16s::softmax::__fuse::PROGRAM,
        vec![hex(&h)],
        vec![],
        &[("rows", rows), ("cols", cols)],
        &cpu,
        &["f16"],
        &[Tol::close(2e-3, 1e-6)],
    );
}

/// A 16-bit softmax whose rows are a multiple of eight long, up to 2048, holds them in 16-byte
/// vectors, 32 elements a thread (`wide_cached_rows`): segments of 2 to 64 threads, rows
/// neither a power of two nor filling the segment's last vectors, and a row a warp (1024).
/// Rows of two warps (2040) over several rounds of the grid, the last one partial: each
/// segment waits at its own named barrier, so a block's rows need not keep step.
#[test]
fn wide_cached_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let mut rng = Rng::new();
    for (rows, cols) in [
        (9, 40),
        (7, 256),
        (5, 1000),
        (4, 1024),
        (3, 2040),
        (31, 2040),
    ] {
        let x = rng.floats::<f32>(rows * cols, -4.0, 4.0);
        emulate_16_bit_softmax("softmax", &x, rows, cols);
        emulate_bf16_layernorm(&mut rng, &x, rows, cols);
    }
}

/// A bf16 layernorm of `x` (`rows` x `cols`) against the CPU: another tensor along the rows
/// (gamma, random) and a per-row f32 output (`rstd`, written once a row).
fn emulate_bf16_layernorm(rng: &mut Rng, x: &[f32], rows: usize, cols: usize) {
    let (dev, shape) = (Device::cpu(), [rows, cols]);
    let b: Vec<fuse_runtime::bf16> = x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
    let g: Vec<fuse_runtime::bf16> = rng
        .floats::<f32>(cols, 0.5, 1.5)
        .iter()
        .map(|&v| fuse_runtime::bf16::from_f32(v))
        .collect();
    let eps = fuse_runtime::bf16::from_f32(1e-3);
    let cpu = kernels::bf16s::layernorm(&dev, &put(&dev, &b, &shape), &put(&dev, &g, &[cols]), eps)
        .unwrap();
    emulate(
        &format!("bf16 layernorm {rows}x{cols}"),
        &kernels::bf16s::layernorm::__fuse::PROGRAM,
        vec![hex(&b), hex(&g)],
        vec![Element::to_bits(eps)],
        &[("rows", rows), ("cols", cols)],
        &cpu,
        &["bf16", "f32"],
        &[Tol::close(2e-2, 2e-2), Tol::close(1e-2, 1e-4)],
    );
}

/// Rows of 65 to 256 elements, a multiple of four, on the general cached entry's segments of
/// eight and sixteen threads: 16-bit softmaxes at lengths no multiple of eight (which the wide
/// entry takes), with their f32 slots, on the entries of a constant width, and bf16 layernorm
/// on the general one, over more rows than a block's segments hold, the last round partial.
#[test]
fn short_cached_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let mut rng = Rng::new();
    for (rows, cols) in [(37, 68), (70, 100), (9, 132), (33, 252)] {
        let program = &kernels::bf16s::layernorm::__fuse::PROGRAM;
        let entry = program.pick(&[rows, cols], 90, false).expect("an entry");
        assert_eq!(entry.path, "cached_rows", "bf16 layernorm at {cols}");
        assert!(
            entry.kernel.symbol.ends_with("cached_rows"),
            "{}",
            entry.kernel.symbol
        );
        let fixed = if cols <= 128 {
            "cached_rows_128"
        } else {
            "cached_rows_256"
        };
        for program in [
            &kernels::bf16s::softmax::__fuse::PROGRAM,
            &kernels::f16s::softmax::__fuse::PROGRAM,
        ] {
            let entry = program.pick(&[rows, cols], 90, false).expect("an entry");
            assert!(
                entry.kernel.symbol.ends_with(fixed),
                "{}",
                entry.kernel.symbol
            );
        }
        let x = rng.floats::<f32>(rows * cols, -4.0, 4.0);
        emulate_16_bit_softmax("softmax", &x, rows, cols);
        emulate_bf16_layernorm(&mut rng, &x, rows, cols);
    }
}

/// The fp8 types' conversions in the generated C (`fz_f8e4m3`, `fz_f8e5m2`): every code, every
/// midpoint and the values beside it, saturation, NaN; arithmetic; and row kernels that cache
/// rows of 1-byte floats or quantize to them.
#[test]
fn fp8_conversions_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    use common::fp8;
    use fuse_runtime::{F8E4M3, F8E5M2};
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let extra = 2 * rng.below(40) as usize + 1;
    let (a, b) = (fp8::codes(&mut rng, extra), fp8::codes(&mut rng, extra));
    let n = a.len();
    let a: Vec<F8E4M3> = a.into_iter().map(F8E4M3::from_bits).collect();
    let b: Vec<F8E5M2> = b.into_iter().map(F8E5M2::from_bits).collect();
    let (ab, bb) = (put(&dev, &a, &[n]), put(&dev, &b, &[n]));
    let cpu = kernels::fp8s::decode(&dev, &ab, &bb).unwrap();
    emulate(
        &format!("fp8 decode {n}"),
        &kernels::fp8s::decode::__fuse::PROGRAM,
        vec![hex(&a), hex(&b)],
        vec![],
        &[("n", n)],
        &cpu,
        &["f32", "f32", "f8e4m3", "f8e5m2", "bf16", "f16"],
        &[Tol::EXACT; 6],
    );
    let s = F8E4M3::from_f32(1.75);
    let cpu = kernels::fp8s::arith(&dev, &ab, &ab, s).unwrap();
    emulate(
        &format!("fp8 arith {n}"),
        &kernels::fp8s::arith::__fuse::PROGRAM,
        vec![hex(&a), hex(&a)],
        vec![Element::to_bits(s)],
        &[("n", n)],
        &cpu,
        &["f8e4m3", "f8e4m3", "f32", "f8e5m2"],
        &[Tol::EXACT; 4],
    );
    let extra = 2 * rng.below(500) as usize + 1;
    let x = fp8::edges(&mut rng, extra);
    let n = x.len();
    let cpu = kernels::fp8s::encode(&dev, &put(&dev, &x, &[n])).unwrap();
    emulate(
        &format!("fp8 encode {n}"),
        &kernels::fp8s::encode::__fuse::PROGRAM,
        vec![hex(&x)],
        vec![],
        &[("n", n)],
        &cpu,
        &["f8e4m3", "f8e5m2", "f32", "f32"],
        &[Tol::EXACT; 4],
    );
    // Within a step of e4m3 (1/8 relative, its least subnormal absolute): `expf` and `rsqrtf`
    // are the host's here.
    let step = Tol::close(0.125, 2f64.powi(-9));
    for (rows, cols) in [(5, 33), (3, 1000), (2, 4096), (2, 5000)] {
        let shape = [rows, cols];
        let x: Vec<F8E5M2> = (0..rows * cols)
            .map(|_| F8E5M2::from_f32(rng.uniform(-8.0, 8.0) as f32))
            .collect();
        let cpu = kernels::fp8s::softmax(&dev, &put(&dev, &x, &shape)).unwrap();
        emulate(
            &format!("fp8 softmax {rows}x{cols}"),
            &kernels::fp8s::softmax::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f8e4m3"],
            std::slice::from_ref(&step),
        );
        let xb = rng.floats::<fuse_runtime::bf16>(rows * cols, -4.0, 4.0);
        let w = rng.floats::<fuse_runtime::bf16>(cols, 0.5, 2.0);
        let eps = 1e-6f32;
        let cpu = kernels::fp8s::rmsnorm_quant(
            &dev,
            &put(&dev, &xb, &shape),
            &put(&dev, &w, &[cols]),
            eps,
        )
        .unwrap();
        emulate(
            &format!("fp8 rmsnorm_quant {rows}x{cols}"),
            &kernels::fp8s::rmsnorm_quant::__fuse::PROGRAM,
            vec![hex(&xb), hex(&w)],
            vec![Element::to_bits(eps)],
            &[("t", rows), ("h", cols)],
            &cpu,
            &["f8e4m3", "f32"],
            &[step.clone(), Tol::close(1e-5, 0.0)],
        );
    }
}

/// 16-bit dropout with probabilities of the values' types, parameters, in an elementwise loop
/// and in a row kernel's vector steps (among them rows a block holds in registers: 4096
/// exactly, and 5120 and 8192 in vectors of eight): the draws rounded to the type compare
/// with p as integers (`fz_u01_bound_bf16`, `_f16`), each mask the CPU's.
#[test]
fn sixteen_bit_dropout_runs_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    use fuse_runtime::{bf16, f16};
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (n, p) in [(1003, 0.1f32), (64, 0.5), (37, 3e-5), (130, 1.0)] {
        let seed = rng.next_u64();
        let x: Vec<bf16> = rng
            .floats::<f32>(n, -4.0, 4.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let y: Vec<f16> = rng
            .floats::<f32>(n, -4.0, 4.0)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let (pb, pf) = (bf16::from_f32(p), f16::from_f32(p));
        let cpu = kernels::dropout_16(
            &dev,
            &put(&dev, &x, &[n]),
            &put(&dev, &y, &[n]),
            pb,
            pf,
            seed,
        )
        .unwrap();
        emulate(
            &format!("dropout_16 {n}, p {p}"),
            &kernels::dropout_16::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![Element::to_bits(pb), Element::to_bits(pf), seed],
            &[("n", n)],
            &cpu,
            &["bf16", "f16"],
            &[Tol::EXACT; 2],
        );
    }
    for (rows, cols) in [
        (7, 64),
        (3, 1000),
        (2, 4096),
        (2, 5000),
        (2, 5120),
        (4, 8192),
    ] {
        let seed = rng.next_u64();
        let y: Vec<f16> = rng
            .floats::<f32>(rows * cols, -4.0, 4.0)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let q = f16::from_f32(0.2);
        let cpu = kernels::dropout_rows_16(&dev, &put(&dev, &y, &[rows, cols]), q, seed).unwrap();
        emulate(
            &format!("dropout_rows_16 {rows}x{cols}"),
            &kernels::dropout_rows_16::__fuse::PROGRAM,
            vec![hex(&y)],
            vec![Element::to_bits(q), seed],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f16", "f32"],
            &[Tol::EXACT, Tol::close(1e-5, 1e-5 * (cols as f64).sqrt())],
        );
    }
}

/// `exp(x - max)` in f32 beside the row, for the write pass to divide: the values are those the
/// CPU backend computes, not rounded to the row's type.
#[test]
fn sixteen_bit_rows_keep_f32_values_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let mut rng = Rng::new();
    for (rows, cols) in [(4, 4096), (3, 3000)] {
        let x = rng.floats::<f32>(rows * cols, -8.0, 8.0);
        emulate_16_bit_softmax("softmax kept", &x, rows, cols);
    }
}

/// 16-bit rows of 4097 to 8192 elements, a multiple of eight, a block holds in registers in
/// 16-byte vectors, 32 elements a thread (`wide_block_rows`): the shortest (4104, the last
/// threads' vectors half in the row), 5120 and the longest, over more rows than the grid's
/// three blocks; softmax keeps `exp(x - max)` in f32 beside them. Light rows (layernorm, its
/// gamma along the row) keep the long-row entry (here, without its shared memory, the
/// general one).
#[test]
fn wide_block_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let mut rng = Rng::new();
    for (rows, cols) in [(4, 4104), (2, 5120), (5, 8192)] {
        for program in [
            &kernels::bf16s::softmax::__fuse::PROGRAM,
            &kernels::f16s::softmax::__fuse::PROGRAM,
        ] {
            let taken = program.pick(&[rows, cols], 90, false).unwrap().path;
            assert_eq!(taken, "wide_block_rows");
        }
        let layernorm = &kernels::bf16s::layernorm::__fuse::PROGRAM;
        let taken = layernorm.pick(&[rows, cols], 90, false).unwrap().path;
        assert_eq!(taken, "rows");
        let x = rng.floats::<f32>(rows * cols, -8.0, 8.0);
        emulate_16_bit_softmax("wide block", &x, rows, cols);
        emulate_bf16_layernorm(&mut rng, &x, rows, cols);
    }
}

/// A tensor broadcast over the domain's middle dims (`c[t, d]` in `[t, h, d]`) loads vectors:
/// its place is the run within `d` plus `t`'s, carried across the grid-stride steps of a grid of
/// 2 (several runs and tokens a thread), with 32- and 64-bit indices; `d` not a multiple of the
/// lanes takes the scalar loop.
#[test]
fn middle_broadcasts_load_vectors_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, h, d) in [(7, 5, 12), (3, 3, 8), (2, 3, 6)] {
        let q = rng.floats::<f32>(t * h * d, -3.0, 3.0);
        let c = rng.floats::<f32>(t * d, -3.0, 3.0);
        let dims = [("t", t), ("h", h), ("d", d)];
        let cpu =
            kernels::per_token(&dev, &put(&dev, &q, &[t, h, d]), &put(&dev, &c, &[t, d])).unwrap();
        for wide in [false, true] {
            let how = Emulation {
                grid: Some(2),
                wide,
                ..Emulation::default()
            };
            how.run(
                &format!("per_token {t}x{h}x{d}"),
                &kernels::per_token::__fuse::PROGRAM,
                vec![hex(&q), hex(&c)],
                vec![],
                &dims,
                &cpu,
                &["f32"],
                &[Tol::EXACT],
            );
        }
        let qb: Vec<fuse_runtime::bf16> =
            q.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu =
            kernels::per_token_bf16(&dev, &put(&dev, &qb, &[t, h, d]), &put(&dev, &c, &[t, d]))
                .unwrap();
        emulate_on(
            2,
            &format!("per_token_bf16 {t}x{h}x{d}"),
            &kernels::per_token_bf16::__fuse::PROGRAM,
            vec![hex(&qb), hex(&c)],
            vec![],
            &dims,
            &cpu,
            &["bf16"],
            &[Tol::EXACT],
        );
    }
}

/// Reductions over a leading or a middle dim take the column path: a block a tile of 32 columns.
/// A kernel of one reducing pass splits each tile's reduced dim over the blocks the grid has
/// beyond the tiles (grids of 19 and 7 over 1 to 3 tiles: 19 to 2 parts, more than the warps
/// that combine them for some, the last tile's parts finished by whichever block comes last),
/// its partials in the scratch; others (two passes, `center_cols`) take every tile whole. Columns past the last tile's end, and reduced dims
/// shorter than the parts, included.
#[test]
fn column_reductions_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(37, 5), (300, 33), (9, 70), (2, 3), (1000, 64)] {
        let n = rows * cols;
        let d = [("rows", rows), ("cols", cols)];
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let y = rng.floats::<f32>(n, 0.9, 1.1);
        let shape = [rows, cols];
        let cpu = kernels::f32s::reduce_cols(&dev, &put(&dev, &x, &shape), &put(&dev, &y, &shape))
            .unwrap();
        let sum = Tol::close(1e-5, 1e-5 * rows as f64);
        emulate_on(
            19,
            &format!("reduce_cols {rows}x{cols}"),
            &kernels::f32s::reduce_cols::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &d,
            &cpu,
            &["f32"; 5],
            &[
                sum.clone(),
                Tol::close(1e-4, 0.0),
                Tol::EXACT,
                Tol::EXACT,
                sum,
            ],
        );
        let xd: Vec<f64> = x.iter().map(|&v| f64::from(v) * 7.0).collect();
        let cpu = kernels::logsumexp_rows(&dev, &put(&dev, &xd, &shape)).unwrap();
        emulate_on(
            7,
            &format!("logsumexp_rows {rows}x{cols}"),
            &kernels::logsumexp_rows::__fuse::PROGRAM,
            vec![hex(&xd)],
            vec![],
            &d,
            &cpu,
            &["f64"],
            &[Tol::close(1e-13, 1e-13)],
        );
        let cpu = kernels::center_cols(&dev, &put(&dev, &x, &shape)).unwrap();
        emulate_on(
            7,
            &format!("center_cols {rows}x{cols}"),
            &kernels::center_cols::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-5), Tol::close(1e-5, 1e-6)],
        );
        let h: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let cpu = kernels::bf16s::reduce_cols(&dev, &put(&dev, &h, &shape)).unwrap();
        emulate_on(
            7,
            &format!("bf16 reduce_cols {rows}x{cols}"),
            &kernels::bf16s::reduce_cols::__fuse::PROGRAM,
            vec![hex(&h)],
            vec![],
            &d,
            &cpu,
            &["bf16", "bf16", "u32"],
            &[Tol::close(1e-2, 1e-2), Tol::EXACT, Tol::EXACT],
        );
    }
    // 16-bit columns, four a lane where they are a multiple of four (`column_quads`), two where
    // they are even (`column_pairs`), split across blocks where the grid has more blocks than
    // tiles, and one a lane where they are odd.
    for (rows, cols) in [
        (1000, 64),
        (300, 34),
        (37, 130),
        (9, 2),
        (500, 33),
        (64, 127),
        (201, 132),
        (7, 4),
    ] {
        let n = rows * cols;
        let x: Vec<fuse_runtime::bf16> = rng
            .floats::<f32>(n, -3.0, 3.0)
            .iter()
            .map(|&v| fuse_runtime::bf16::from_f32(v))
            .collect();
        let s = rng.floats::<f32>(rows, 0.5, 1.5);
        let cpu = kernels::pairs_bf16(&dev, &put(&dev, &x, &[rows, cols]), &put(&dev, &s, &[rows]))
            .unwrap();
        let program = &kernels::pairs_bf16::__fuse::PROGRAM;
        let taken = program.pick(&[rows, cols], 90, false).unwrap().path;
        let expected = match cols % 4 {
            0 => "column_quads",
            2 => "column_pairs",
            _ => "columns",
        };
        assert_eq!(taken, expected);
        emulate_on(
            7,
            &format!("pairs_bf16 {rows}x{cols}"),
            program,
            vec![hex(&x), hex(&s)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["bf16", "f32", "bf16", "f32"],
            &[
                Tol::close(1e-2, 1e-2),
                Tol::close(1e-5, 1e-5),
                Tol::EXACT,
                Tol::EXACT,
            ],
        );
    }
    for (b, t, c) in [(3, 50, 20), (2, 9, 40), (5, 300, 2), (3, 7, 21)] {
        let x: Vec<fuse_runtime::f16> = rng
            .floats::<f32>(b * t * c, -3.0, 3.0)
            .iter()
            .map(|&v| fuse_runtime::f16::from_f32(v))
            .collect();
        let cpu = kernels::pairs_f16_mid(&dev, &put(&dev, &x, &[b, t, c])).unwrap();
        emulate_on(
            5,
            &format!("pairs_f16_mid {b}x{t}x{c}"),
            &kernels::pairs_f16_mid::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("b", b), ("t", t), ("c", c)],
            &cpu,
            &["f16", "f32", "f16"],
            &[Tol::close(2e-3, 1e-2), Tol::close(1e-5, 1e-5), Tol::EXACT],
        );
    }
    // A middle dim: columns are the (b, c) pairs, adjacent along c.
    for (b, t, c) in [(3, 50, 20), (2, 9, 40)] {
        let x = rng.floats::<f32>(b * t * c, -3.0, 3.0);
        let y = rng.floats::<f32>(b * t * c, 0.9, 1.1);
        let shape = [b, t, c];
        let cpu = kernels::f32s::reduce_mid(&dev, &put(&dev, &x, &shape), &put(&dev, &y, &shape))
            .unwrap();
        let sum = Tol::close(1e-5, 1e-5 * t as f64);
        emulate_on(
            5,
            &format!("reduce_mid {b}x{t}x{c}"),
            &kernels::f32s::reduce_mid::__fuse::PROGRAM,
            vec![hex(&x), hex(&y)],
            vec![],
            &[("b", b), ("t", t), ("c", c)],
            &cpu,
            &["f32"; 5],
            &[
                sum.clone(),
                Tol::close(1e-4, 0.0),
                Tol::EXACT,
                Tol::EXACT,
                sum,
            ],
        );
    }
}

/// Rows of up to 32 elements take the tiled path: tiles of whole rows through shared memory.
/// Each length has enough rows for several tiles per block of the grid of three and a partial
/// last tile; the element sizes 1, 2, 4 and 8 bytes; per-row and broadcast tensors beside the
/// tiled ones; and buffers that start off a 16-byte boundary, which the vector copies skip.
/// Lengths that are a multiple of four take a vector of four elements a thread: every lane of a
/// segment with one (4, 8, 16, 32) or some past the row (12, 20); a layernorm over misaligned
/// buffers takes two elements a thread instead, as its gamma and beta cannot load as vectors.
#[test]
fn short_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let misaligned = Emulation {
        misalign: true,
        ..Emulation::default()
    };
    for cols in [1usize, 2, 3, 4, 5, 7, 8, 12, 16, 17, 20, 31, 32] {
        // About four 4096-element tiles and a partial one.
        let rows = 16384 / cols + 37;
        let d = [("rows", rows), ("cols", cols)];
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let cpu = kernels::softmax(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        for how in [&Emulation::default(), &misaligned] {
            how.run(
                &format!("short softmax {rows}x{cols}"),
                &kernels::softmax::__fuse::PROGRAM,
                vec![hex(&x)],
                vec![],
                &d,
                &cpu,
                &["f32"],
                &[Tol::close(1e-5, 1e-7)],
            );
        }
        let g = rng.floats::<f32>(cols, -2.0, 2.0);
        let b = rng.floats::<f32>(cols, -2.0, 2.0);
        let cpu = kernels::layernorm(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            &put(&dev, &b, &[cols]),
            1e-5,
        )
        .unwrap();
        for how in [&Emulation::default(), &misaligned] {
            how.run(
                &format!("short layernorm {rows}x{cols}"),
                &kernels::layernorm::__fuse::PROGRAM,
                vec![hex(&x), hex(&g), hex(&b)],
                vec![Element::to_bits(1e-5f32)],
                &d,
                &cpu,
                &["f32", "f32"],
                &[Tol::close(1e-4, 1e-4), Tol::close(1e-4, 0.0)],
            );
        }
    }
    // 16-bit rows: a vector of eight a thread where the length is a multiple of eight, four
    // at the other multiples of four, one of two at two, two elements a thread else (and
    // where misaligned).
    for cols in [4usize, 8, 12, 16, 20, 24, 28, 32, 6, 31, 2] {
        let rows = 16384 / cols + 37;
        let d = [("rows", rows), ("cols", cols)];
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let hb: Vec<fuse_runtime::bf16> =
            x.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let h: Vec<fuse_runtime::f16> = x.iter().map(|&v| fuse_runtime::f16::from_f32(v)).collect();
        let bf16_cpu = kernels::bf16s::softmax(&dev, &put(&dev, &hb, &[rows, cols])).unwrap();
        let f16_cpu = kernels::f16s::softmax(&dev, &put(&dev, &h, &[rows, cols])).unwrap();
        for how in [&Emulation::default(), &misaligned] {
            how.run(
                &format!("short bf16 softmax {rows}x{cols}"),
                &kernels::bf16s::softmax::__fuse::PROGRAM,
                vec![hex(&hb)],
                vec![],
                &d,
                &bf16_cpu,
                &["bf16"],
                &[Tol::close(1e-2, 1e-6)],
            );
            how.run(
                &format!("short f16 softmax {rows}x{cols}"),
                &kernels::f16s::softmax::__fuse::PROGRAM,
                vec![hex(&h)],
                vec![],
                &d,
                &f16_cpu,
                &["f16"],
                &[Tol::close(2e-3, 1e-6)],
            );
        }
    }
    // Tiles of wide tensors (40 bytes an element), at every length of a vector of four a
    // thread and a few others: each tile holds a block's step of rows.
    for cols in [4usize, 8, 12, 16, 20, 24, 28, 32, 3, 17, 31] {
        let rows = 2048 / cols + 5;
        let d = [("rows", rows), ("cols", cols)];
        let x = rng.floats::<f64>(rows * cols, -5.0, 5.0);
        let y = rng.floats::<f64>(rows * cols, -5.0, 5.0);
        let h: Vec<fuse_runtime::f16> = rng
            .floats::<f32>(rows * cols, -5.0, 5.0)
            .iter()
            .map(|&v| fuse_runtime::f16::from_f32(v))
            .collect();
        let shape = [rows, cols];
        let cpu = kernels::wide_rows_f64(
            &dev,
            &put(&dev, &x, &shape),
            &put(&dev, &y, &shape),
            &put(&dev, &h, &shape),
        )
        .unwrap();
        emulate(
            &format!("short wide_rows_f64 {rows}x{cols}"),
            &kernels::wide_rows_f64::__fuse::PROGRAM,
            vec![hex(&x), hex(&y), hex(&h)],
            vec![],
            &d,
            &cpu,
            &["f64", "f16"],
            &[Tol::close(1e-12, 1e-12), Tol::EXACT],
        );
    }
    // Other element sizes, at a length per width of threads a row.
    for cols in [2usize, 3, 4, 7, 12, 17, 32] {
        let rows = 4096 / cols + 11;
        let d = [("rows", rows), ("cols", cols)];
        let x = rng.floats::<f64>(rows * cols, -5.0, 5.0);
        let cpu = kernels::softmax_f64(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        emulate(
            &format!("short softmax_f64 {rows}x{cols}"),
            &kernels::softmax_f64::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f64"],
            &[Tol::close(1e-12, 1e-15)],
        );
        let h: Vec<fuse_runtime::f16> = rng
            .floats::<f32>(rows * cols, -5.0, 5.0)
            .iter()
            .map(|&v| fuse_runtime::f16::from_f32(v))
            .collect();
        let cpu = kernels::f16s::softmax(&dev, &put(&dev, &h, &[rows, cols])).unwrap();
        for how in [&Emulation::default(), &misaligned] {
            how.run(
                &format!("short f16 softmax {rows}x{cols}"),
                &kernels::f16s::softmax::__fuse::PROGRAM,
                vec![hex(&h)],
                vec![],
                &d,
                &cpu,
                &["f16"],
                &[Tol::close(2e-3, 1e-6)],
            );
        }
        let a: Vec<bool> = (0..rows * cols).map(|_| rng.below(2) == 1).collect();
        let cpu = kernels::count_true(&dev, &put(&dev, &a, &[rows, cols])).unwrap();
        emulate(
            &format!("short count_true {rows}x{cols}"),
            &kernels::count_true::__fuse::PROGRAM,
            vec![hex(&a)],
            vec![],
            &d,
            &cpu,
            &["u32"],
            &[Tol::EXACT],
        );
        let x = rng.floats::<f32>(rows * cols, -3.0, 3.0);
        let g = rng.floats::<f32>(cols, -2.0, 2.0);
        let b = rng.floats::<f32>(cols, -2.0, 2.0);
        let cpu = kernels::layernorm_quantize(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &g, &[cols]),
            &put(&dev, &b, &[cols]),
            1e-5,
        )
        .unwrap();
        emulate(
            &format!("short layernorm_quantize {rows}x{cols}"),
            &kernels::layernorm_quantize::__fuse::PROGRAM,
            vec![hex(&x), hex(&g), hex(&b)],
            vec![Element::to_bits(1e-5f32)],
            &d,
            &cpu,
            &["q8", "f32"],
            &[Tol::close(0.0, 1.0), Tol::close(1e-4, 0.0)],
        );
        let seed = rng.next_u64();
        let cpu = kernels::softmax_dropout(&dev, &put(&dev, &x, &[rows, cols]), 0.3, seed).unwrap();
        emulate(
            &format!("short softmax_dropout {rows}x{cols}"),
            &kernels::softmax_dropout::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![Element::to_bits(0.3f32), seed],
            &d,
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-7), Tol::EXACT],
        );
        let k: Vec<i32> = rng.ints_in::<i32>(rows * cols, -4, 4);
        let cpu = kernels::arg_rows(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &k, &[rows, cols]),
        )
        .unwrap();
        emulate(
            &format!("short arg_rows {rows}x{cols}"),
            &kernels::arg_rows::__fuse::PROGRAM,
            vec![hex(&x), hex(&k)],
            vec![],
            &d,
            &cpu,
            &["u32", "u32", "u32"],
            &[Tol::EXACT; 3],
        );
    }
    // Rows over two dims, and a fixed number of rows.
    for (b, t, c) in [(7, 301, 3), (3, 50, 32), (2, 1, 17)] {
        let x = rng.floats::<f32>(b * t * c, -5.0, 5.0);
        let cpu = kernels::softmax_last(&dev, &put(&dev, &x, &[b, t, c])).unwrap();
        emulate(
            &format!("short softmax_last {b}x{t}x{c}"),
            &kernels::softmax_last::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("b", b), ("t", t), ("c", c)],
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-7), Tol::close(1e-6, 2e-5)],
        );
        let x = rng.floats::<f32>(4 * c, -5.0, 5.0);
        let cpu = kernels::fixed_rows(&dev, &put(&dev, &x, &[4, c])).unwrap();
        // A sum's rounding depends on its order: bound it by the row's magnitudes, since the
        // row's terms may cancel to a sum far smaller than they are.
        let abs = fold_axis(&f64s(&x), &[4, c], 1, 0.0, |a, v| a + v.abs());
        emulate(
            &format!("short fixed_rows 4x{c}"),
            &kernels::fixed_rows::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("n", c)],
            &cpu,
            &["f32"],
            &[sum_tol::<f32>(&abs)],
        );
    }
    // Rows of length 0 (the general path), and no rows at all.
    for (rows, cols) in [(5, 0), (0, 3)] {
        let x: Vec<f32> = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let cpu = kernels::softmax_stats(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        emulate(
            &format!("short softmax_stats {rows}x{cols}"),
            &kernels::softmax_stats::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f32", "f32", "f32"],
            &[Tol::close(1e-5, 1e-7), Tol::EXACT, Tol::close(1e-6, 2e-5)],
        );
    }
}

/// The derived backwards' sums over rows (`sum(dy * x * rstd, rows)` of RMSNorm's weight,
/// `dbias` of bias + GELU + dropout, LayerNorm's and DyT's pairs), each block adding its rows
/// into its own row of partials and the grid's three blocks, all at once, summing those after
/// a barrier of the grid: on the exact row
/// (4096), a block a row (3000), cached rows (1000, and in segments of a block over several
/// steps of the grid, the last one partial: 29 rows of 1000, 101 of 256; segments of a
/// constant width whose rows only just pass half of what they hold: 132, 516; and none),
/// streamed rows (999), and fewer rows than the grid's three blocks (2).
#[test]
fn partial_sums_over_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let shapes = [
        (7, 4096),
        (5, 3000),
        (4, 1000),
        (29, 1000),
        (101, 256),
        (37, 132),
        (5, 516),
        (0, 256),
        (3, 999),
        (2, 64),
    ];
    for (rows, cols) in shapes {
        partial_sums(rows, cols, None, None);
    }
}

/// The same on rows longer than a block's registers, which kernels without a reduction along
/// them (G8's) take in chunks, a block a chunk of each row (`chunked_rows`): grids of fewer
/// blocks than chunks (each taking several in turn), of a whole number of blocks a chunk, and
/// of blocks left over; chunks of 2048 to 4096 columns, the rows' lengths multiples of four
/// and of 4096 (whose entry's chunks are all 4096 long, without bounds tests); more rows than
/// blocks, fewer, and none.
#[test]
fn partial_sums_over_chunked_rows_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    for (rows, cols, grid) in [
        (7, 4100, None),
        (5, 8192, Some(4)),
        (9, 16384, Some(9)),
        (3, 16384, Some(2)),
        (4, 11012, Some(7)),
        (6, 14336, Some(12)),
        (0, 12288, Some(6)),
        (2, 20484, Some(5)),
    ] {
        let program =
            &bench_kernels::g8_bias_gelu_dropout::__g8_bias_gelu_dropout_d0::__fuse::PROGRAM;
        let entry = program.pick(&[rows, cols], 90, false).expect("an entry");
        let exact = cols % 4096 == 0;
        let path = if exact {
            "chunked_rows_exact"
        } else {
            "chunked_rows"
        };
        assert_eq!(entry.path, path, "G8's backward at {rows} x {cols}");
        partial_sums(rows, cols, None, grid);
        // An f32 kernel's chunks: 16-byte vectors of four.
        let program = &grad_kernels::bias_silu::__bias_silu_d0::__fuse::PROGRAM;
        let entry = program.pick(&[rows, cols], 90, false).expect("an entry");
        assert_eq!(
            entry.path, path,
            "f32 bias and SiLU's backward at {rows} x {cols}"
        );
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        let (x, dy) = (
            rng.floats::<f32>(rows * cols, -3.0, 3.0),
            rng.floats::<f32>(rows * cols, -1.0, 1.0),
        );
        let b = rng.floats::<f32>(cols, -1.0, 1.0);
        let shape = [rows, cols];
        let (px, pdy, pb) = (
            put(&dev, &x, &shape),
            put(&dev, &dy, &shape),
            put(&dev, &b, &[cols]),
        );
        let cpu = grad_kernels::bias_silu::__bias_silu_d0(&dev, &px, &pb, &pdy).unwrap();
        emulate_partials(
            (None, cols, grid),
            &format!("f32 bias silu backward {rows}x{cols}"),
            program,
            vec![hex(&x), hex(&b), hex(&dy)],
            vec![],
            &[("rows", rows), ("cols", cols)],
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-6), Tol::close(1e-4, 1e-3)],
        );
    }
}

/// The same on long rows' launches (`cluster` blocks a row, three clusters, each summing the
/// rows it takes in shared memory into its row of partials, all at once): more rows than
/// clusters, fewer (a cluster without rows writes zeros) and none, parts that are partial or empty, lengths that
/// are not a multiple of four.
#[test]
fn partial_sums_over_long_rows_run_on_an_emulated_cluster() {
    if !available() {
        return;
    }
    for (rows, cols, cluster) in [
        (7, 5000, 2),
        (5, 999, 3),
        (2, 64, 4),
        (4, 1000, 1),
        (0, 300, 2),
    ] {
        partial_sums(rows, cols, Some(cluster), None);
    }
}

/// G1, G2, G7 and G8's backwards at `rows` x `cols` against the CPU, on the entry the runtime
/// picks (on a grid of `grid` blocks, else the emulator's), or on the long-row entry in
/// clusters of `cluster` blocks.
fn partial_sums(rows: usize, cols: usize, cluster: Option<u32>, grid: Option<u32>) {
    use bench_kernels::{g1_rmsnorm, g2_layernorm, g7_dyt, g8_bias_gelu_dropout};
    use fuse_runtime::bf16;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let mut bf16s = |n: usize| -> Vec<bf16> {
        let v = rng.floats::<f32>(n, -2.0, 2.0);
        v.into_iter().map(bf16::from_f32).collect()
    };
    let (x, dy, w, b) = (
        bf16s(rows * cols),
        bf16s(rows * cols),
        bf16s(cols),
        bf16s(cols),
    );
    let shape = [rows, cols];
    let (px, pdy) = (put(&dev, &x, &shape), put(&dev, &dy, &shape));
    let (pw, pb) = (put(&dev, &w, &[cols]), put(&dev, &b, &[cols]));
    let dims = [("t", rows), ("h", cols)];
    // The sums of bf16 weights in bf16: the GPU's order of the rows (a block's, then the
    // blocks') may round to the neighbouring value.
    let sum = || Tol::close(1e-2, 1e-2);
    let cpu = g1_rmsnorm::__g1_rmsnorm_d0(&dev, &px, &pw, &pdy).unwrap();
    emulate_partials(
        (cluster, cols, grid),
        &format!("rmsnorm backward {rows}x{cols}"),
        &g1_rmsnorm::__g1_rmsnorm_d0::__fuse::PROGRAM,
        vec![hex(&x), hex(&w), hex(&dy)],
        vec![],
        &dims,
        &cpu,
        &["bf16", "bf16"],
        &[Tol::close(2e-2, 1e-2), sum()],
    );
    let cpu = g2_layernorm::__g2_layernorm_d0(&dev, &px, &pw, &pb, &pdy).unwrap();
    emulate_partials(
        (cluster, cols, grid),
        &format!("layernorm backward {rows}x{cols}"),
        &g2_layernorm::__g2_layernorm_d0::__fuse::PROGRAM,
        vec![hex(&x), hex(&w), hex(&b), hex(&dy)],
        vec![],
        &dims,
        &cpu,
        &["bf16", "bf16", "bf16"],
        &[Tol::close(2e-2, 2e-2), sum(), sum()],
    );
    let alpha = 0.7f32;
    let cpu = g7_dyt::__g7_dyt_d0(&dev, &px, alpha, &pw, &pb, &pdy).unwrap();
    emulate_partials(
        (cluster, cols, grid),
        &format!("dyt backward {rows}x{cols}"),
        &g7_dyt::__g7_dyt_d0::__fuse::PROGRAM,
        vec![hex(&x), hex(&w), hex(&b), hex(&dy)],
        vec![Element::to_bits(alpha)],
        &dims,
        &cpu,
        &["bf16", "f32", "bf16", "bf16"],
        &[Tol::close(2e-2, 1e-2), Tol::close(1e-3, 1e-2), sum(), sum()],
    );
    let seed = 0x5eed_u64 + rows as u64;
    let cpu = g8_bias_gelu_dropout::__g8_bias_gelu_dropout_d0(&dev, &px, &pb, seed, &pdy).unwrap();
    emulate_partials(
        (cluster, cols, grid),
        &format!("bias gelu dropout backward {rows}x{cols}"),
        &g8_bias_gelu_dropout::__g8_bias_gelu_dropout_d0::__fuse::PROGRAM,
        vec![hex(&x), hex(&b), hex(&dy)],
        vec![seed],
        &dims,
        &cpu,
        &["bf16", "bf16"],
        &[Tol::close(2e-2, 1e-2), sum()],
    );
}

/// [`emulate`] for `partial_sums`, or on the long-row launch in clusters of `cluster` blocks,
/// each with its part of the row and of the partial sums in shared memory.
#[allow(clippy::too_many_arguments)]
fn emulate_partials<R: Outputs>(
    (cluster, cols, grid): (Option<u32>, usize, Option<u32>),
    what: &str,
    program: &'static Program,
    tensors: Vec<String>,
    scalars: Vec<u64>,
    dims: &[(&str, usize)],
    cpu: &R,
    types: &[&str],
    tols: &[Tol],
) {
    let shared = cluster.map(|cluster| {
        assert!(
            long_row_grid(program).1 > 0,
            "{what}: the long-row entry sums over rows"
        );
        long_rows(program, cols, cluster)
    });
    let what = match cluster {
        Some(c) => format!("{what} in clusters of {c}"),
        None => what.to_string(),
    };
    let how = Emulation {
        shared,
        grid,
        ..Emulation::default()
    };
    how.run(&what, program, tensors, scalars, dims, cpu, types, tols);
}

/// The training pair's launches: G1's forward, which also writes each row's rstd in f32, and
/// its backward, which reads it (rows held in registers, streamed, a block a row, long).
#[test]
fn training_pairs_run_on_an_emulated_gpu() {
    use bench_kernels::g1_rmsnorm;
    use fuse_runtime::bf16;
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let mut bf16s = |n: usize| -> Vec<bf16> {
        let v = rng.floats::<f32>(n, -2.0, 2.0);
        v.into_iter().map(bf16::from_f32).collect()
    };
    for (rows, cols) in [(7, 4096), (5, 3000), (3, 999), (2, 64), (9, 24)] {
        let (x, dy, w) = (bf16s(rows * cols), bf16s(rows * cols), bf16s(cols));
        let shape = [rows, cols];
        let (px, pdy, pw) = (
            put(&dev, &x, &shape),
            put(&dev, &dy, &shape),
            put(&dev, &w, &[cols]),
        );
        let dims = [("t", rows), ("h", cols)];
        let (y, rstd) = g1_rmsnorm::__g1_rmsnorm_t(&dev, &px, &pw).unwrap();
        emulate(
            &format!("rmsnorm forward_train {rows}x{cols}"),
            &g1_rmsnorm::__g1_rmsnorm_t::__fuse::PROGRAM,
            vec![hex(&x), hex(&w)],
            vec![],
            &dims,
            &(y, rstd.reshape(&[rows]).unwrap()),
            &["bf16", "f32"],
            &[Tol::close(1e-2, 1e-2), Tol::close(1e-5, 1e-6)],
        );
        let cpu = g1_rmsnorm::__g1_rmsnorm_b0(&dev, &px, &pw, &pdy, &rstd).unwrap();
        emulate(
            &format!("rmsnorm backward from the saved rstd {rows}x{cols}"),
            &g1_rmsnorm::__g1_rmsnorm_b0::__fuse::PROGRAM,
            vec![hex(&x), hex(&w), hex(&dy), hex(&rstd.to_vec().unwrap())],
            vec![],
            &dims,
            &cpu,
            &["bf16", "bf16"],
            // `dw` summed over the rows in the launch, stored as bf16: the GPU's order of the
            // rows may round it to the neighbouring value.
            &[Tol::close(2e-2, 1e-2), Tol::close(1e-2, 1e-2)],
        );
    }
}

/// Issue 22's additions in the CUDA text: `rintf` for `round_ties_even`, the constants written
/// as bits or round-trip digits, elements of small weights (`p_w[5]`) read once a launch, per row
/// and in a full reduction, and integer bounds.
#[test]
fn constants_rounding_and_indexing_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let exact = Tol::close(0.0, 0.0);
    for n in [1usize, 31, 1037] {
        let mut x = rng.floats_special::<f32>(n, -50.0, 50.0);
        for i in (0..n).step_by(2) {
            x[i] = (rng.below(201) as f32 - 100.0) / 2.0;
        }
        let cpu = kernels::f32_extras::ties_even(&dev, &put(&dev, &x, &[n])).unwrap();
        let (program, d) = (&kernels::f32_extras::ties_even::__fuse::PROGRAM, [("n", n)]);
        emulate(
            &format!("ties_even {n}"),
            program,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &["f32", "f32"],
            &[exact.clone(), exact.clone()],
        );

        let cpu = kernels::f32_extras::constant_uses(&dev, &put(&dev, &x, &[n])).unwrap();
        let program = &kernels::f32_extras::constant_uses::__fuse::PROGRAM;
        let types = ["f32", "f32", "bool"];
        emulate(
            &format!("constant_uses {n}"),
            program,
            vec![hex(&x)],
            vec![],
            &d,
            &cpu,
            &types,
            &vec![exact.clone(); 3],
        );

        let w = rng.floats_away::<f32>(3, 0.5, 2.0);
        let x = rng.floats::<f32>(n, -4.0, 4.0);
        let tensors = vec![hex(&x), hex(&w)];
        let cpu =
            kernels::f32_extras::indexed(&dev, &put(&dev, &x, &[n]), &put(&dev, &w, &[3])).unwrap();
        let program = &kernels::f32_extras::indexed::__fuse::PROGRAM;
        let tol = Tol::close(2e-7, 2e-6);
        emulate(
            &format!("indexed {n}"),
            program,
            tensors.clone(),
            vec![],
            &d,
            &cpu,
            &["f32"],
            std::slice::from_ref(&tol),
        );
        let cpu =
            kernels::f32_extras::indexed_full(&dev, &put(&dev, &x, &[n]), &put(&dev, &w, &[3]))
                .unwrap();
        let program = &kernels::f32_extras::indexed_full::__fuse::PROGRAM;
        emulate(
            &format!("indexed_full {n}"),
            program,
            tensors,
            vec![],
            &d,
            &cpu,
            &["f32", "f32"],
            &[tol.clone(), tol],
        );

        let (a, b, c) = (rng.ints::<i8>(n), rng.ints::<u64>(n), rng.ints::<i32>(n));
        let cpu = kernels::int_constants(
            &dev,
            &put(&dev, &a, &[n]),
            &put(&dev, &b, &[n]),
            &put(&dev, &c, &[n]),
        )
        .unwrap();
        let program = &kernels::int_constants::__fuse::PROGRAM;
        let tensors = vec![hex(&a), hex(&b), hex(&c)];
        emulate(
            &format!("int_constants {n}"),
            program,
            tensors,
            vec![],
            &d,
            &cpu,
            &["i8", "u64", "bool", "i32"],
            &[],
        );
    }
    let x = rng.floats::<f32>(5, -1.0, 1.0);
    let types = ["f32"; 7];
    let cpu = kernels::f32_extras::constants(&dev, &put(&dev, &x, &[5])).unwrap();
    let program = &kernels::f32_extras::constants::__fuse::PROGRAM;
    emulate(
        "f32 constants",
        program,
        vec![hex(&x)],
        vec![],
        &[("n", 5)],
        &cpu,
        &types,
        &vec![exact.clone(); 7],
    );
    let x = rng.floats::<f64>(5, -1.0, 1.0);
    let cpu = kernels::f64_extras::constants(&dev, &put(&dev, &x, &[5])).unwrap();
    let program = &kernels::f64_extras::constants::__fuse::PROGRAM;
    emulate(
        "f64 constants",
        program,
        vec![hex(&x)],
        vec![],
        &[("n", 5)],
        &cpu,
        &["f64"; 7],
        &vec![exact.clone(); 7],
    );
    let x = rng.floats::<fuse_runtime::f16>(5, -1.0, 1.0);
    let cpu = kernels::f16_extras::constants(&dev, &put(&dev, &x, &[5])).unwrap();
    let program = &kernels::f16_extras::constants::__fuse::PROGRAM;
    emulate(
        "f16 constants",
        program,
        vec![hex(&x)],
        vec![],
        &[("n", 5)],
        &cpu,
        &["f16"; 7],
        &vec![exact; 7],
    );
    // Rows of a block each, cached in registers, and short rows in tiles.
    for (rows, cols) in [(5, 36), (3, 4100), (9, 2), (7, 1000)] {
        let x = rng.floats::<f32>(rows * cols, -4.0, 4.0);
        let w = rng.floats_away::<f32>(6, 0.5, 2.0);
        let cpu = kernels::f32_extras::indexed_rows(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &w, &[2, 3]),
        )
        .unwrap();
        let program = &kernels::f32_extras::indexed_rows::__fuse::PROGRAM;
        let d = [("rows", rows), ("cols", cols)];
        let tol = Tol::close(2e-7, 2e-6);
        emulate(
            &format!("indexed_rows {rows}x{cols}"),
            program,
            vec![hex(&x), hex(&w)],
            vec![],
            &d,
            &cpu,
            &["f32", "f32"],
            &[tol.clone(), tol],
        );
    }
}

/// Slices (`x[.., ..d]`, `x[.., (1..).step_by(2)]`, the rotary part of each head) in every kind
/// of launch: elementwise (scalar loops: a slice takes its element's coordinates), over rows
/// (short, cached in registers and streamed, by the row length), over columns, and over
/// everything; on aligned and misaligned buffers.
#[test]
fn slices_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    use fuse_runtime::bf16;
    use kernels::slices as s;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let misaligned = Emulation {
        misalign: true,
        ..Emulation::default()
    };
    for (t, d) in [(5, 33), (3, 8), (2, 64), (1, 1), (3, 300), (1, 4100)] {
        let dims = [("t", t), ("d", d)];
        let x = rng.floats_special::<f32>(t * 2 * d, -6.0, 6.0);
        let b = put(&dev, &x, &[t, 2 * d]);
        let what = |k: &str| format!("{k} {t}x{d}");
        for how in [&Emulation::default(), &misaligned] {
            let cpu = s::halves(&dev, &b).unwrap();
            let (p, types) = (&s::halves::__fuse::PROGRAM, ["f32", "f32"]);
            how.run(
                &what("halves"),
                p,
                vec![hex(&x)],
                vec![],
                &dims,
                &cpu,
                &types,
                &[Tol::EXACT, Tol::EXACT],
            );
        }
        let cpu = s::silu_and_mul(&dev, &b).unwrap();
        let tol = [Tol::close(1e-6, 1e-6)];
        emulate(
            &what("silu_and_mul"),
            &s::silu_and_mul::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &tol,
        );
        let cpu = s::evens_odds(&dev, &put(&dev, &x, &[t, d * 2])).unwrap();
        emulate(
            &what("evens_odds"),
            &s::evens_odds::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &dims,
            &cpu,
            &["f32", "f32"],
            &[Tol::EXACT, Tol::EXACT],
        );
        let (alpha, limit) = (1.702f32, 7.0f32);
        let cpu = s::swigluoai_and_mul(&dev, &put(&dev, &x, &[t, d * 2]), alpha, limit).unwrap();
        let scalars = vec![u64::from(alpha.to_bits()), u64::from(limit.to_bits())];
        emulate(
            &what("swigluoai"),
            &s::swigluoai_and_mul::__fuse::PROGRAM,
            vec![hex(&x)],
            scalars,
            &dims,
            &cpu,
            &["f32"],
            &tol,
        );
        let xb: Vec<bf16> = rng.floats::<bf16>(t * 2 * d, -6.0, 6.0);
        let bb = put(&dev, &xb, &[t, 2 * d]);
        for how in [&Emulation::default(), &misaligned] {
            let cpu = s::silu_and_mul_bf16(&dev, &bb).unwrap();
            let p = &s::silu_and_mul_bf16::__fuse::PROGRAM;
            how.run(
                &what("silu_and_mul_bf16"),
                p,
                vec![hex(&xb)],
                vec![],
                &dims,
                &cpu,
                &["bf16"],
                &[Tol::close(1e-2, 1e-6)],
            );
        }
        // Rows: the row length `d` picks the path.
        let cpu = s::silu_and_mul_fp8(&dev, &bb).unwrap();
        let p = &s::silu_and_mul_fp8::__fuse::PROGRAM;
        emulate(
            &what("silu_and_mul_fp8"),
            p,
            vec![hex(&xb)],
            vec![],
            &dims,
            &cpu,
            &["f8e4m3", "f32"],
            &[Tol::close(0.13, 1e-6), Tol::close(1e-6, 0.0)],
        );
        let xf = rng.floats::<f32>(t * 2 * d, -4.0, 4.0);
        let bf = put(&dev, &xf, &[t, 2 * d]);
        let cpu = s::upper_column_sums(&dev, &bf).unwrap();
        emulate(
            &what("upper_column_sums"),
            &s::upper_column_sums::__fuse::PROGRAM,
            vec![hex(&xf)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-4)],
        );
        let cpu = s::lower_total(&dev, &bf).unwrap();
        emulate(
            &what("lower_total"),
            &s::lower_total::__fuse::PROGRAM,
            vec![hex(&xf)],
            vec![],
            &dims,
            &cpu,
            &["f32", "f32"],
            &[Tol::close(1e-5, 1e-3), Tol::EXACT],
        );
    }
    for (t, h, half, p) in [(3, 2, 16, 5), (2, 3, 4, 0), (1, 2, 33, 64)] {
        let head = 2 * half + p;
        let x = rng.floats::<f32>(t * h * head, -3.0, 3.0);
        let c = rng.floats::<f32>(t * half, -1.0, 1.0);
        let sn = rng.floats::<f32>(t * half, -1.0, 1.0);
        let dims = [("t", t), ("h", h), ("half", half), ("p", p)];
        let (bx, bc, bs) = (
            put(&dev, &x, &[t, h, head]),
            put(&dev, &c, &[t, half]),
            put(&dev, &sn, &[t, half]),
        );
        let cpu = s::rotary_neox(&dev, &bx, &bc, &bs).unwrap();
        let tol = Tol::close(1e-6, 1e-6);
        emulate(
            &format!("rotary_neox {t}x{h}x{head}"),
            &s::rotary_neox::__fuse::PROGRAM,
            vec![hex(&x), hex(&c), hex(&sn)],
            vec![],
            &dims,
            &cpu,
            &["f32", "f32"],
            &[tol.clone(), tol.clone()],
        );
        let cpu = s::rotary_pass(&dev, &bx, &bc).unwrap();
        emulate(
            &format!("rotary_pass {t}x{h}x{head}"),
            &s::rotary_pass::__fuse::PROGRAM,
            vec![hex(&x), hex(&c)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::EXACT],
        );
    }
}

/// Gathers (`emb[tokens, ..]`, `x[.., labels]`, a cache row by position) in maps, rows,
/// columns and full reductions, with indices out of range, which read zero on both backends.
#[test]
fn gathers_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    use kernels::gathers as g;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    // Rows of 64 and 304 take the vector loop (loads at each row's gathered start), the
    // others the scalar one.
    for (vocab, e, t) in [
        (50, 33, 21),
        (1, 1, 1),
        (7, 300, 5),
        (50, 64, 21),
        (9, 304, 7),
    ] {
        let emb = rng.floats_special::<f32>(vocab * e, -3.0, 3.0);
        let tokens: Vec<u32> = rng.indices(t, vocab).iter().map(|&i| i as u32).collect();
        let cpu = g::embedding(
            &dev,
            &put(&dev, &emb, &[vocab, e]),
            &put(&dev, &tokens, &[1, t]),
        )
        .unwrap();
        emulate(
            &format!("embedding {vocab}x{e} by {t}"),
            &g::embedding::__fuse::PROGRAM,
            vec![hex(&emb), hex(&tokens)],
            vec![],
            &[("vocab", vocab), ("e", e), ("b", 1), ("s", t)],
            &cpu,
            &["f32"],
            &[Tol::EXACT],
        );
        let emb16: Vec<fuse_runtime::bf16> = rng.floats(vocab * e, -3.0, 3.0);
        let tokens = rng.indices(t, vocab);
        let cpu = g::embedding_bf16(
            &dev,
            &put(&dev, &emb16, &[vocab, e]),
            &put(&dev, &tokens, &[t]),
        )
        .unwrap();
        emulate(
            &format!("bf16 embedding {vocab}x{e} by {t}"),
            &g::embedding_bf16::__fuse::PROGRAM,
            vec![hex(&emb16), hex(&tokens)],
            vec![],
            &[("vocab", vocab), ("e", e), ("t", t)],
            &cpu,
            &["bf16"],
            &[Tol::EXACT],
        );
    }
    for (r, c, n) in [(9, 13, 40), (64, 300, 7)] {
        let table = rng.floats::<f32>(r * c, -3.0, 3.0);
        let i: Vec<u32> = rng.indices(n, r).iter().map(|&v| v as u32).collect();
        let j = rng.indices(n, c);
        let (bt, bi, bj) = (
            put(&dev, &table, &[r, c]),
            put(&dev, &i, &[n]),
            put(&dev, &j, &[n]),
        );
        let cpu = g::pick(&dev, &bt, &bi, &bj).unwrap();
        emulate(
            &format!("pick {r}x{c} by {n}"),
            &g::pick::__fuse::PROGRAM,
            vec![hex(&table), hex(&i), hex(&j)],
            vec![],
            &[("r", r), ("c", c), ("n", n)],
            &cpu,
            &["f32"],
            &[Tol::EXACT],
        );
    }
    // Row lengths of every row path: short, cached, a block a row, streamed.
    for (n, v) in [(9, 3), (7, 33), (3, 4096), (2, 5000), (5, 1)] {
        let x = rng.floats::<f32>(n * v, -8.0, 8.0);
        let mut labels = rng.indices(n, v);
        labels[0] = -100;
        let cpu = g::label_loss(&dev, &put(&dev, &x, &[n, v]), &put(&dev, &labels, &[n])).unwrap();
        emulate(
            &format!("label_loss {n}x{v}"),
            &g::label_loss::__fuse::PROGRAM,
            vec![hex(&x), hex(&labels)],
            vec![],
            &[("n", n), ("v", v)],
            &cpu,
            &["f32", "f32"],
            &[Tol::EXACT, Tol::close(1e-5, 1e-5)],
        );
    }
    for (t, h, half, p, max_pos) in [
        (7, 3, 16, 5, 40),
        (1, 2, 1, 0, 1),
        (5, 1, 33, 64, 9),
        (9, 3, 16, 0, 40),
    ] {
        let head = 2 * half + p;
        let q = rng.floats::<f32>(t * h * head, -3.0, 3.0);
        let cache = rng.floats::<f32>(max_pos * 2 * half, -1.0, 1.0);
        let pos = rng.indices(t, max_pos);
        let cpu = g::rotary_cached(
            &dev,
            &put(&dev, &pos, &[t]),
            &put(&dev, &cache, &[max_pos, 2 * half]),
            &put(&dev, &q, &[t, h, head]),
        )
        .unwrap();
        let tol = Tol::close(1e-6, 1e-6);
        emulate(
            &format!("rotary_cached {t}x{h}x{head}"),
            &g::rotary_cached::__fuse::PROGRAM,
            vec![hex(&pos), hex(&cache), hex(&q)],
            vec![],
            &[
                ("t", t),
                ("max_pos", max_pos),
                ("half", half),
                ("h", h),
                ("p", p),
            ],
            &cpu,
            &["f32", "f32"],
            &[tol.clone(), tol],
        );
    }
    for (a, m, c) in [(3, 5, 7), (2, 40, 300)] {
        let x = rng.floats_special::<f64>(a * m * c, -5.0, 5.0);
        let idx: Vec<i32> = rng
            .indices(a * c, m)
            .iter()
            .map(|&i| i as i32 - 1)
            .collect();
        let cpu = g::middle(&dev, &put(&dev, &x, &[a, m, c]), &put(&dev, &idx, &[a, c])).unwrap();
        emulate(
            &format!("middle {a}x{m}x{c}"),
            &g::middle::__fuse::PROGRAM,
            vec![hex(&x), hex(&idx)],
            vec![],
            &[("a", a), ("m", m), ("c", c)],
            &cpu,
            &["f64"],
            &[Tol::EXACT],
        );
    }
    for (k, c, r) in [(20, 33, 100), (255, 8, 3000), (3, 500, 2)] {
        let table: Vec<fuse_runtime::f16> = rng.floats(k * c, -2.0, 2.0);
        let idx: Vec<u8> = rng.indices(r, k).iter().map(|&i| i as u8).collect();
        let (bt, bi) = (put(&dev, &table, &[k, c]), put(&dev, &idx, &[r]));
        let dims = [("k", k), ("c", c), ("r", r)];
        let cpu = g::gathered_columns(&dev, &bt, &bi).unwrap();
        emulate(
            &format!("gathered_columns {k}x{c} by {r}"),
            &g::gathered_columns::__fuse::PROGRAM,
            vec![hex(&table), hex(&idx)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-4)],
        );
        let cpu = g::gathered_total(&dev, &bt, &bi).unwrap();
        emulate(
            &format!("gathered_total {k}x{c} by {r}"),
            &g::gathered_total::__fuse::PROGRAM,
            vec![hex(&table), hex(&idx)],
            vec![],
            &dims,
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-3)],
        );
    }
    for (n, c, r) in [(10, 33, 17), (4, 5000, 3), (50, 8, 200), (3, 1, 2)] {
        let x = rng.floats::<f32>(n * c, -6.0, 6.0);
        let idx: Vec<u32> = rng.indices(r, n).iter().map(|&i| i as u32).collect();
        let cpu =
            g::softmax_of_rows(&dev, &put(&dev, &x, &[n, c]), &put(&dev, &idx, &[r])).unwrap();
        emulate(
            &format!("softmax_of_rows {n}x{c} by {r}"),
            &g::softmax_of_rows::__fuse::PROGRAM,
            vec![hex(&x), hex(&idx)],
            vec![],
            &[("n", n), ("c", c), ("r", r)],
            &cpu,
            &["f32"],
            &[Tol::close(1e-5, 1e-7)],
        );
    }
    for (m, n) in [(10, 100), (300, 1000)] {
        let codes: Vec<i16> = rng.ints(m);
        let flags = rng.bools(m);
        let w: Vec<fuse_runtime::F8E4M3> = rng
            .floats::<f32>(m, -400.0, 400.0)
            .iter()
            .map(|&v| fuse_runtime::F8E4M3::from_f32(v))
            .collect();
        let mut x = rng.floats::<f32>(n, -1.0, m as f64 / 4.0 + 1.0);
        x[0] = f32::NAN;
        let cpu = g::lookups(
            &dev,
            &put(&dev, &codes, &[m]),
            &put(&dev, &flags, &[m]),
            &put(&dev, &w, &[m]),
            &put(&dev, &x, &[n]),
        )
        .unwrap();
        emulate(
            &format!("lookups {m} by {n}"),
            &g::lookups::__fuse::PROGRAM,
            vec![hex(&codes), hex(&flags), hex(&w), hex(&x)],
            vec![],
            &[("m", m), ("n", n)],
            &cpu,
            &["i16", "bool", "f32"],
            &[Tol::EXACT, Tol::EXACT, Tol::EXACT],
        );
    }
    for (r, c) in [(5, 7), (3, 1)] {
        let x = rng.floats_special::<f64>(r * c, -3.0, 3.0);
        let cpu = g::picks(&dev, &put(&dev, &x, &[r, c])).unwrap();
        emulate(
            &format!("picks {r}x{c}"),
            &g::picks::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("r", r), ("c", c)],
            &cpu,
            &["f64", "f64"],
            &[Tol::EXACT, Tol::EXACT],
        );
    }
}

/// A bf16 buffer's bits, to compare exactly (as `u16`), NaN payloads included.
fn bf16_bits(b: &fuse_runtime::Buffer<fuse_runtime::bf16>) -> Vec<u16> {
    b.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// `cache_rows` of `key` at `slot` into a cache holding `before`, emulated against the CPU
/// backend: the cache's values, or with `bits` its bits (as `u16`, NaN payloads included).
fn cache_rows_emulated(
    what: &str,
    key: &[fuse_runtime::bf16],
    slot: &[i64],
    before: &[fuse_runtime::bf16],
    [t, h, d, slots]: [usize; 4],
    bits: bool,
) {
    use kernels::writes as w;
    let dev = Device::cpu();
    let mut cache = put(&dev, before, &[slots, h, d]);
    let (key_buf, slot_buf) = (put(&dev, key, &[t, h, d]), put(&dev, slot, &[t]));
    w::cache_rows(&dev, &key_buf, &slot_buf, &mut cache).unwrap();
    let how = Emulation {
        written: vec![hex(before)],
        ..Emulation::default()
    };
    let run = |want: &dyn Outputs, ty: &str| {
        how.run(
            &format!("{what} {t}x{h}x{d} into {slots}"),
            &w::cache_rows::__fuse::PROGRAM,
            vec![hex(key), hex(slot)],
            vec![],
            &[("t", t), ("h", h), ("d", d), ("slots", slots)],
            want,
            &[ty],
            &[Tol::EXACT],
        )
    };
    match bits {
        true => run(&put(&dev, &bf16_bits(&cache), &[slots, h, d]), "u16"),
        false => run(&cache, "bf16"),
    }
}

/// bf16 copies store the bits they load, each NaN quieted with its payload kept as the CPU's
/// conversion through f32 does: a plain copy and the cache write's scattered rows, vectors and
/// odd tails, compared bit for bit with the CPU backend.
#[test]
fn bf16_copies_keep_their_bits_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    use fuse_runtime::bf16;
    use kernels::writes as w;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    // Signalling and quiet NaNs of both signs with payloads, infinities, zeros, subnormals.
    let specials = [
        0x7f81u16, 0xff81, 0x7fc0, 0xffc3, 0x7fbf, 0x7f80, 0xff80, 0x8000, 0x0001, 0x807f,
    ];
    let mixed = |rng: &mut Rng, n: usize| -> Vec<bf16> {
        let mut v: Vec<bf16> = rng.floats_special(n, -3.0, 3.0);
        for (i, x) in v.iter_mut().enumerate() {
            if i % 3 == 1 {
                *x = bf16::from_bits(specials[(i / 3) % specials.len()]);
            }
        }
        v
    };
    for (n, c) in [(5, 24), (3, 13), (1, 1), (17, 64)] {
        let x = mixed(&mut rng, n * c);
        let want = w::copy_bf16(&dev, &put(&dev, &x, &[n, c])).unwrap();
        // The CPU's own bits: NaNs quieted, everything else as it was.
        let got = bf16_bits(&want);
        for (a, b) in x.iter().zip(&got) {
            let q = if a.is_nan() {
                a.to_bits() | 0x40
            } else {
                a.to_bits()
            };
            assert_eq!(q, *b, "the CPU's copy of {:#06x}", a.to_bits());
        }
        emulate(
            &format!("copy_bf16 {n}x{c}"),
            &w::copy_bf16::__fuse::PROGRAM,
            vec![hex(&x)],
            vec![],
            &[("n", n), ("c", c)],
            &put(&dev, &got, &[n, c]),
            &["u16"],
            &[Tol::EXACT],
        );
    }
    for (t, h, d, slots) in [(7, 3, 16, 40), (5, 2, 3, 9)] {
        let key = mixed(&mut rng, t * h * d);
        // Distinct slots (a duplicate's winner is unspecified), one padding, one past the end.
        let slot: Vec<i64> = (0..t as i64)
            .map(|i| if i == 2 { -1 } else { i * 2 + 1 })
            .collect();
        let before = mixed(&mut rng, slots * h * d);
        cache_rows_emulated(
            "cache_rows of special values",
            &key,
            &slot,
            &before,
            [t, h, d, slots],
            true,
        );
    }
}

/// Writes through `&mut` parameters: rows scattered to slots (some negative or past the end,
/// writing nothing), two caches in one launch, halves and interleaved pairs of one buffer, a
/// scatter beside a returned output, and every untouched element kept.
#[test]
fn writes_through_mut_parameters_run_on_an_emulated_gpu() {
    if !available() {
        return;
    }
    use kernels::writes as w;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let with = |written: Vec<String>| Emulation {
        written,
        ..Emulation::default()
    };
    for (t, h, d, slots) in [(7, 3, 16, 40), (1, 1, 1, 1), (64, 8, 8, 256)] {
        let key: Vec<fuse_runtime::bf16> = rng.floats(t * h * d, -3.0, 3.0);
        let slot: Vec<i64> = (0..t as i64)
            .map(|i| match i % 5 {
                4 => -1,
                3 => slots as i64 + i,
                _ => (i * 7 + 1) % slots as i64,
            })
            .collect();
        let slot: Vec<i64> = {
            // Distinct slots, as vLLM's are: a duplicate's winner is unspecified.
            let mut seen = std::collections::HashSet::new();
            slot.into_iter()
                .map(|s| if seen.insert(s) { s } else { -1 })
                .collect()
        };
        let before: Vec<fuse_runtime::bf16> = rng.floats(slots * h * d, -9.0, 9.0);
        cache_rows_emulated("cache_rows", &key, &slot, &before, [t, h, d, slots], false);
        let key = rng.floats::<f32>(t * h * d, -3.0, 3.0);
        let value = rng.floats::<f32>(t * h * d, -3.0, 3.0);
        let (k0, v0) = (
            rng.floats::<f32>(slots * h * d, -9.0, 9.0),
            rng.floats::<f32>(slots * h * d, -9.0, 9.0),
        );
        let (mut kc, mut vc) = (
            put(&dev, &k0, &[slots, h, d]),
            put(&dev, &v0, &[slots, h, d]),
        );
        let (bk, bv, bs) = (
            put(&dev, &key, &[t, h, d]),
            put(&dev, &value, &[t, h, d]),
            put(&dev, &slot, &[t]),
        );
        w::kv_cache(&dev, &bk, &bv, &bs, &mut kc, &mut vc).unwrap();
        with(vec![hex(&k0), hex(&v0)]).run(
            &format!("kv_cache {t}x{h}x{d} into {slots}"),
            &w::kv_cache::__fuse::PROGRAM,
            vec![hex(&key), hex(&value), hex(&slot)],
            vec![],
            &[("t", t), ("h", h), ("d", d), ("slots", slots)],
            &(kc, vc),
            &["f32", "f32"],
            &[Tol::EXACT, Tol::EXACT],
        );
    }
    // The buffer read as it is written: in place, and rows copied within it.
    for (m, c) in [(5, 33), (3, 64)] {
        let x0 = rng.floats_special::<f32>(m * c, -3.0, 3.0);
        let y = rng.floats::<f32>(m * c, -3.0, 3.0);
        let mut x = put(&dev, &x0, &[m, c]);
        w::scale_in_place(&dev, &mut x, &put(&dev, &y, &[m, c]), 1.5).unwrap();
        with(vec![hex(&x0)]).run(
            &format!("scale_in_place {m}x{c}"),
            &w::scale_in_place::__fuse::PROGRAM,
            vec![hex(&y)],
            vec![u64::from(1.5f32.to_bits())],
            &[("m", m), ("c", c)],
            &x,
            &["f32"],
            &[Tol::EXACT],
        );
    }
    for (nb, e, m) in [(10, 24, 4), (9, 13, 3)] {
        let src: Vec<i64> = (0..m as i64).map(|i| if i == 2 { -1 } else { i }).collect();
        let dst: Vec<i64> = (0..m as i64).map(|i| nb as i64 - 1 - i).collect();
        let before: Vec<fuse_runtime::bf16> = rng.floats(nb * e, -9.0, 9.0);
        let mut cache = put(&dev, &before, &[nb, e]);
        let (bs, bd) = (put(&dev, &src, &[m]), put(&dev, &dst, &[m]));
        w::copy_rows(&dev, &mut cache, &bs, &bd).unwrap();
        with(vec![hex(&before)]).run(
            &format!("copy_rows {m} of {nb}x{e}"),
            &w::copy_rows::__fuse::PROGRAM,
            vec![hex(&src), hex(&dst)],
            vec![],
            &[("nb", nb), ("e", e), ("m", m)],
            &cache,
            &["bf16"],
            &[Tol::EXACT],
        );
    }
    // Two indices in one write: rows of 8 take the vector loop, rows of 5 the scalar one.
    for (t, h, dx, x, nb, bs) in [(9, 3, 2, 8, 4, 4), (6, 2, 3, 5, 2, 3)] {
        let key: Vec<fuse_runtime::bf16> = rng.floats(t * h * dx * x, -3.0, 3.0);
        let slots = (nb * bs) as i64;
        let slot: Vec<i64> = (0..t as i64)
            .map(|i| match i % 4 {
                3 => -1 - i,
                _ if i < slots => (i * 5 + 2) % slots,
                _ => slots + i,
            })
            .collect();
        let before: Vec<fuse_runtime::bf16> = rng.floats(nb * h * dx * bs * x, -9.0, 9.0);
        let mut cache = put(&dev, &before, &[nb, h, dx, bs, x]);
        let bkey = put(&dev, &key, &[t, h, dx, x]);
        w::paged_cache(&dev, &bkey, &put(&dev, &slot, &[t]), bs as i64, &mut cache).unwrap();
        with(vec![hex(&before)]).run(
            &format!("paged_cache {t}x{h}x{dx}x{x} into {nb}x{bs}"),
            &w::paged_cache::__fuse::PROGRAM,
            vec![hex(&key), hex(&slot)],
            vec![bs as u64],
            &[
                ("t", t),
                ("h", h),
                ("dx", dx),
                ("x", x),
                ("nb", nb),
                ("bs", bs),
            ],
            &cache,
            &["bf16"],
            &[Tol::EXACT],
        );
    }
    for (t, d) in [(5, 33), (1, 1), (3, 300)] {
        let a = rng.floats_special::<f32>(t * d, -3.0, 3.0);
        let b = rng.floats::<f32>(t * d, -3.0, 3.0);
        let before = rng.floats::<f32>(t * 2 * d, -1.0, 1.0);
        let mut out = put(&dev, &before, &[t, 2 * d]);
        w::concat(
            &dev,
            &put(&dev, &a, &[t, d]),
            &put(&dev, &b, &[t, d]),
            &mut out,
        )
        .unwrap();
        with(vec![hex(&before)]).run(
            &format!("concat {t}x{d}"),
            &w::concat::__fuse::PROGRAM,
            vec![hex(&a), hex(&b)],
            vec![],
            &[("t", t), ("d", d)],
            &out,
            &["f32"],
            &[Tol::EXACT],
        );
        let a16: Vec<fuse_runtime::f16> = rng.floats(t * d, -3.0, 3.0);
        let b16: Vec<fuse_runtime::f16> = rng.floats(t * d, -3.0, 3.0);
        let before: Vec<fuse_runtime::f16> = rng.floats(t * d * 2, -1.0, 1.0);
        let mut out = put(&dev, &before, &[t, d * 2]);
        w::interleave(
            &dev,
            &put(&dev, &a16, &[t, d]),
            &put(&dev, &b16, &[t, d]),
            &mut out,
        )
        .unwrap();
        with(vec![hex(&before)]).run(
            &format!("interleave {t}x{d}"),
            &w::interleave::__fuse::PROGRAM,
            vec![hex(&a16), hex(&b16)],
            vec![],
            &[("t", t), ("d", d)],
            &out,
            &["f16"],
            &[Tol::EXACT],
        );
    }
    for (n, c, m) in [(6, 7, 10), (40, 33, 3)] {
        let x = rng.floats::<f32>(n * c, -3.0, 3.0);
        let bias = rng.floats::<f32>(c, -1.0, 1.0);
        let idx: Vec<u32> = (0..n as u32)
            .map(|i| if i % 4 == 3 { m as u32 + i } else { i })
            .collect();
        let before = rng.floats::<f32>(m * c, -9.0, 9.0);
        let mut table = put(&dev, &before, &[m, c]);
        let twice = w::scatter_and_return(
            &dev,
            &put(&dev, &x, &[n, c]),
            &put(&dev, &idx, &[n]),
            &put(&dev, &bias, &[c]),
            &mut table,
        )
        .unwrap();
        with(vec![hex(&before)]).run(
            &format!("scatter_and_return {n}x{c} into {m}"),
            &w::scatter_and_return::__fuse::PROGRAM,
            vec![hex(&x), hex(&idx), hex(&bias)],
            vec![],
            &[("n", n), ("c", c), ("m", m)],
            &(twice, table),
            &["f32", "f32"],
            &[Tol::EXACT, Tol::EXACT],
        );
        let rows: Vec<i32> = vec![2, -1, m as i32];
        let mut table = put(&dev, &before, &[m, c]);
        w::fill_rows(&dev, &put(&dev, &rows, &[3]), 0.5, &mut table).unwrap();
        with(vec![hex(&before)]).run(
            &format!("fill_rows {m}x{c}"),
            &w::fill_rows::__fuse::PROGRAM,
            vec![hex(&rows)],
            vec![u64::from(0.5f32.to_bits())],
            &[("r", 3), ("m", m), ("c", c)],
            &table,
            &["f32"],
            &[Tol::EXACT],
        );
    }
}
