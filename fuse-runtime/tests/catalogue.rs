//! The kernel catalogue (`doc/kernels.md`): vLLM's non-GEMM kernels and Liger-Kernel's forward
//! ops, written in `fuse!` (`catalogue/kernels.rs`) and checked on fresh random inputs against
//! references that follow each original's source: its roundings to bf16 between steps, its
//! saturations, its NaN and -0.0 behaviour, where its epsilon goes.
//!
//! Each `#[test]` runs one kernel on the CPU backend. `gpu_matches_cpu_and_reference` runs every
//! one on `Device::cuda(0)` against the same references and the CPU's results; it needs a GPU and
//! is ignored by default (`FUSE_REQUIRE_GPU=1 cargo test -p fuse-runtime --test catalogue --
//! --ignored`; without `FUSE_REQUIRE_GPU=1` it says why it cannot run and returns).

#[allow(dead_code)]
#[path = "catalogue/kernels.rs"]
mod kernels;
#[path = "catalogue/liger_cases.rs"]
mod liger_cases;
#[path = "catalogue/support.rs"]
mod support;
#[path = "catalogue/vllm_cases.rs"]
mod vllm_cases;

use fuse_runtime::Device;
use support::{assert_near, check, Out, Rng};

/// A kernel's check on one device: it draws its inputs from the generator, runs the kernel,
/// and returns each output with its reference.
type Case = fn(&Device, &mut Rng) -> Vec<Out>;

/// One `#[test]` per case on the CPU, in a module named after the library (`vllm::rms_norm`,
/// `liger::rms_norm`), and the list the GPU test runs.
macro_rules! cases {
    ($($library:ident => $module:ident [$($name:ident),* $(,)?]),* $(,)?) => {
        $(
            mod $library {
                $(
                    #[test]
                    fn $name() {
                        let dev = fuse_runtime::Device::cpu();
                        super::check(&super::$module::$name(&dev, &mut super::Rng::fresh()));
                    }
                )*
            }
        )*

        /// Every case, by name.
        const CASES: &[(&str, Case)] = &[
            $($((concat!(stringify!($library), "::", stringify!($name)), $module::$name),)*)*
        ];
    };
}

cases! {
    vllm => vllm_cases [
        silu_and_mul,
        mul_and_silu,
        gelu_and_mul,
        gelu_tanh_and_mul,
        fatrelu_and_mul,
        silu_and_mul_clamp,
        swigluoai_and_mul,
        batched_silu_and_mul,
        gelu_new,
        gelu_fast,
        gelu_quick,
        rms_norm,
        fused_add_rms_norm,
        poly_norm,
        static_scaled_int8_quant,
        static_scaled_int8_azp_quant,
        dynamic_scaled_int8_quant,
        dynamic_scaled_int8_azp_quant,
        rms_norm_dynamic_per_token_quant,
        rms_norm_static_fp8_quant,
        fused_add_rms_norm_static_fp8_quant,
        scaled_fp8_quant,
        per_token_group_quant,
        silu_and_mul_quant,
        silu_mul_fp8_quant,
        convert_fp8,
        rotary_embedding,
        batched_rotary_embedding,
        fused_qk_norm_rope,
        topk_softmax,
        moe_sum,
        apply_repetition_penalties,
        reshape_and_cache_flash,
        reshape_and_cache,
        copy_blocks,
        concat_and_cache_mla,
        merge_attn_states,
    ],
    liger => liger_cases [
        rms_norm,
        layer_norm,
        swiglu_geglu,
        relu_squared,
        rope,
        cross_entropy,
        kl_div,
        jsd,
        tvd,
        dyt,
        group_norm,
        softmax,
        fused_add_rms_norm,
        poly_norm,
    ],
}

/// CUDA device 0, or `None` (with the reason printed) when there is none; with
/// `FUSE_REQUIRE_GPU=1` a missing GPU fails the test instead.
fn gpu() -> Option<Device> {
    match Device::cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("FUSE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("FUSE_REQUIRE_GPU=1, but there is no GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping: no GPU: {e}");
            None
        }
    }
}

/// Every case on the GPU, against its reference, and against the CPU backend on the same
/// inputs (the same seed), within the case's tolerance.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_matches_cpu_and_reference() {
    let Some(gpu) = gpu() else {
        return;
    };
    let mut seeds = Rng::fresh();
    for (name, case) in CASES {
        let seed = seeds.next_u64();
        let on_gpu = case(&gpu, &mut Rng::seeded(seed));
        check(&on_gpu);
        let on_cpu = case(&Device::cpu(), &mut Rng::seeded(seed));
        assert_eq!(on_gpu.len(), on_cpu.len(), "{name}: outputs");
        for (g, c) in on_gpu.iter().zip(&on_cpu) {
            let what = format!("{name}: {} (GPU against CPU)", g.what);
            assert_near(&what, &g.got, &c.got, g.rel, g.abs);
        }
    }
}
