//! The catalogue's kernels (`/doc/kernels.md`), written as their users would write them in
//! `fuse!`: vLLM's non-GEMM CUDA kernels in [`vllm`], Liger-Kernel's forward ops in [`liger`].
//! Each doc comment names the original (file and function) and the detail of its semantics that
//! the kernel keeps.

pub mod vllm {
    use fuse_runtime::fuse;

    fuse! {
        /// `csrc/activation_kernels.cu`, `silu_and_mul` (`act_and_mul_kernel`, act first):
        /// `silu_kernel` returns `scalar_t`, so the activation is rounded to bf16 before the
        /// product, which rounds again.
        pub fn silu_and_mul(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
            (silu(x[.., ..d] as f32) as bf16) * x[.., d..]
        }

        /// `mul_and_silu`: the activation on the second half (`act_first = false`).
        pub fn mul_and_silu(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
            x[.., ..d] * (silu(x[.., d..] as f32) as bf16)
        }

        /// `gelu_and_mul`: erf GELU (`gelu_kernel`, PyTorch's `approximate='none'`).
        pub fn gelu_and_mul(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
            (gelu(x[.., ..d] as f32) as bf16) * x[.., d..]
        }

        /// `gelu_tanh_and_mul`: tanh GELU (`gelu_tanh_kernel`).
        pub fn gelu_tanh_and_mul(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
            (gelu_tanh(x[.., ..d] as f32) as bf16) * x[.., d..]
        }

        /// `fatrelu_and_mul` (`fatrelu_kernel`): `f > threshold ? f : 0`, so NaN gates give 0.
        pub fn fatrelu_and_mul(x: [bf16; t, 2 * d], threshold: f32) -> [bf16; t, d] {
            let g = x[.., ..d];
            (if g as f32 > threshold { g } else { 0.0 }) * x[.., d..]
        }

        /// `silu_and_mul_clamp` (`compute<.., HAS_CLAMP>`): the gate clamped above by `fminf`
        /// (a NaN gate becomes `limit`), the up clamped both ways, each rounded to bf16, then
        /// `bf16(silu(gate, alpha)) * (up + beta)` in f32, rounded once more.
        pub fn silu_and_mul_clamp(x: [bf16; t, 2 * d], limit: f32, alpha: f32, beta: f32)
            -> [bf16; t, d]
        {
            let g = ((x[.., ..d] as f32).min(limit) as bf16) as f32;
            let u = ((x[.., d..] as f32).min(limit).max(-limit) as bf16) as f32;
            let act = (g / (1.0 + (-g * alpha).exp())) as bf16;
            (act as f32 * (u + beta)) as bf16
        }

        /// `swigluoai_and_mul`: gate and up interleaved (`x[..., ::2]`, `x[..., 1::2]`), all in
        /// f32 and rounded once: `(u + 1) * g / (1 + exp(-g * alpha))`.
        pub fn swigluoai_and_mul(x: [bf16; t, d * 2], alpha: f32, limit: f32) -> [bf16; t, d] {
            let g = (x[.., (0..).step_by(2)] as f32).min(limit);
            let u = (x[.., (1..).step_by(2)] as f32).min(limit).max(-limit);
            ((u + 1.0) * g / (1.0 + (-g * alpha).exp())) as bf16
        }

        /// `batched_silu_and_mul` (`batched_act_and_mul_kernel`): rows of expert `b` past
        /// `valid[b]` are left unwritten by vLLM (their values are unspecified); here they are 0.
        pub fn batched_silu_and_mul(x: [bf16; b, m, 2 * d], valid: [i32; b]) -> [bf16; b, m, d] {
            let y = (silu(x[.., .., ..d] as f32) as bf16) * x[.., .., d..];
            if (index(m) as i32) < valid { y } else { 0.0 }
        }

        /// `gelu_new` (`gelu_new_kernel`), in `scalar_t` arithmetic: `x * x * x` rounds at each
        /// product, `x + (T)(0.044715 * x3)` and the argument of `tanhf` round, and so do
        /// `0.5 * x` and `1 + t`.
        pub fn gelu_new(x: [bf16; t, h]) -> [bf16; t, h] {
            let xf = x as f32;
            let x3 = (((xf * xf) as bf16) as f32 * xf) as bf16;
            let inner = (xf + ((0.044715 * x3 as f32) as bf16) as f32) as bf16;
            let t = (((0.79788456 * inner as f32) as bf16) as f32).tanh() as bf16;
            (0.5 * x) * ((1.0 + t) as bf16)
        }

        /// `gelu_fast` (`gelu_fast_kernel`), f32.
        pub fn gelu_fast(x: [f32; t, h]) -> [f32; t, h] {
            let t = (x * 0.79788456 * (1.0 + 0.044715 * x * x)).tanh();
            0.5 * x * (1.0 + t)
        }

        /// `gelu_quick` (`gelu_quick_kernel`): `x / (1 + exp(-1.702 x))`, f32.
        pub fn gelu_quick(x: [f32; t, h]) -> [f32; t, h] {
            x / (1.0 + (-1.702 * x).exp())
        }

        /// `csrc/layernorm_kernels.cu`, `rms_norm`: the sum of squares in f32, `rsqrtf(var / h +
        /// eps)`, and `(scalar_t)(x * rstd) * weight`: rounded to bf16 before the weight.
        pub fn rms_norm(x: [bf16; t, h], w: [bf16; h], eps: f32) -> [bf16; t, h] {
            let xf = x as f32;
            let rstd = rsqrt(mean(xf * xf, h) + eps);
            ((xf * rstd) as bf16) * w
        }

        /// `fused_add_rms_norm`, out of place: `z = input + residual` is rounded to bf16 (it is
        /// stored as the new residual) and the norm is of the rounded `z`.
        pub fn fused_add_rms_norm(x: [bf16; t, h], r: [bf16; t, h], w: [bf16; h], eps: f32)
            -> ([bf16; t, h], [bf16; t, h])
        {
            let z = (x as f32 + r as f32) as bf16;
            let zf = z as f32;
            let rstd = rsqrt(mean(zf * zf, h) + eps);
            (((zf * rstd) as bf16) * w, z)
        }

        /// `poly_norm`: `w[0] x³/rms(x³) + w[1] x²/rms(x²) + w[2] x/rms(x) + b`, with the three
        /// sums of squares (of x², x⁴, x⁶) in f32 and `eps` inside each square root.
        pub fn poly_norm(x: [f32; t, h], w: [f32; 3], b: [f32; 1], eps: f32) -> [f32; t, h] {
            let x2 = x * x;
            let x3 = x2 * x;
            let r1 = rsqrt(mean(x2, h) + eps);
            let r2 = rsqrt(mean(x2 * x2, h) + eps);
            let r3 = rsqrt(mean(x3 * x3, h) + eps);
            x3 * r3 * w[0] + x2 * r2 * w[1] + x * r1 * w[2] + b[0]
        }

        /// `csrc/quantization/w8a8/int8/scaled_quant.cu`, `static_scaled_int8_quant_kernel`:
        /// `cvt.rni.sat.s8.f32` of `x / scale`: halves to even, saturated, NaN to 0.
        pub fn static_scaled_int8_quant(x: [bf16; t, h], scale: [f32;]) -> [i8; t, h] {
            (x as f32 / scale).round_ties_even().clamp(-128.0, 127.0) as i8
        }

        /// `static_scaled_int8_azp_quant_kernel`: `x * (1 / scale)` rounded to an i32
        /// (saturating, NaN to 0), plus the zero point (wrapping), saturated to i8.
        pub fn static_scaled_int8_azp_quant(x: [bf16; t, h], scale: [f32;], azp: [i32;])
            -> [i8; t, h]
        {
            let v = x as f32 * (1.0 / scale);
            (v.round_ties_even() as i32 + azp).clamp(-128, 127) as i8
        }

        /// `dynamic_scaled_int8_quant_kernel`: the row's absmax from 0 (`fmaxf` skips NaN),
        /// `scale = absmax / 127`, and `x * (absmax == 0 ? 0 : 127 / absmax)` rounded.
        pub fn dynamic_scaled_int8_quant(x: [bf16; t, h]) -> ([i8; t, h], [f32; t]) {
            let xf = x as f32;
            let absmax = max(xf.abs(), h).max(0.0);
            let inv_s = if absmax == 0.0 { 0.0 } else { 127.0 / absmax };
            ((xf * inv_s).round_ties_even().clamp(-128.0, 127.0) as i8, absmax / 127.0)
        }

        /// `dynamic_scaled_int8_azp_quant_kernel`: `s = (max - min) / 255`, the zero point
        /// `nearbyintf(-128 - min / s)`, and `sat8(rni32(x * (1 / s)) + azp)`.
        pub fn dynamic_scaled_int8_azp_quant(x: [bf16; t, h]) -> ([i8; t, h], [f32; t], [i32; t]) {
            let xf = x as f32;
            let lo = min(xf, h).min(f32::MAX);
            let hi = max(xf, h).max(f32::MIN);
            let s = (hi - lo) / 255.0;
            let azp = (-128.0 - lo / s).round_ties_even() as i32;
            let q = ((xf * (1.0 / s)).round_ties_even() as i32 + azp).clamp(-128, 127) as i8;
            (q, s, azp)
        }

        /// `csrc/quantization/fused_kernels/layernorm_utils.cuh` with
        /// `rms_norm_dynamic_per_token_quant` (int8, residual): `x + residual` in f32 (not
        /// rounded for the norm; rounded where stored as the new residual), the normed value
        /// `(float)((scalar_t)(x * rms) * w)`, the token's scale `max(min(absmax, scale_ub) /
        /// 127, FLT_EPSILON)`, and `cvt.rni.sat.s8` of `y / scale`.
        pub fn rms_norm_dynamic_per_token_quant_int8(
            x: [bf16; t, h], r: [bf16; t, h], w: [bf16; h], eps: f32, scale_ub: f32,
        ) -> ([i8; t, h], [f32; t], [bf16; t, h]) {
            let xf = x as f32 + r as f32;
            let rms = rsqrt(mean(xf * xf, h) + eps);
            let y = ((xf * rms) as bf16 as f32 * w as f32) as bf16 as f32;
            let absmax = max(y.abs(), h).max(0.0);
            let scale = (absmax.min(scale_ub) / 127.0).max(f32::EPSILON);
            let q = (y / scale).round_ties_even().clamp(-128.0, 127.0) as i8;
            (q, scale, xf as bf16)
        }

        /// The fp8 variant: `min_scaling_factor` is `1 / (448 * 512)`, and the value is
        /// `fmax(-448, fmin(y / scale, 448))` (NaN becomes 448) converted with RNE.
        pub fn rms_norm_dynamic_per_token_quant_fp8(
            x: [bf16; t, h], w: [bf16; h], eps: f32, scale_ub: f32,
        ) -> ([f8e4m3; t, h], [f32; t]) {
            let xf = x as f32;
            let rms = rsqrt(mean(xf * xf, h) + eps);
            let y = ((xf * rms) as bf16 as f32 * w as f32) as bf16 as f32;
            let absmax = max(y.abs(), h).max(0.0);
            let scale = (absmax.min(scale_ub) / 448.0).max(1.0 / (448.0 * 512.0));
            ((y / scale).min(448.0).max(-448.0) as f8e4m3, scale)
        }

        /// `csrc/layernorm_quant_kernels.cu`, `rms_norm_static_fp8_quant`: the bf16 norm of
        /// `rms_norm`, then `scaled_fp8_conversion<true>` with `1 / scale`: `fminf` then `fmaxf`
        /// against ±448 (NaN becomes 448) and a saturating RNE conversion.
        pub fn rms_norm_static_fp8_quant(x: [bf16; t, h], w: [bf16; h], scale: [f32;], eps: f32)
            -> [f8e4m3; t, h]
        {
            let xf = x as f32;
            let rstd = rsqrt(mean(xf * xf, h) + eps);
            let y = ((xf * rstd) as bf16 as f32 * w as f32) as bf16 as f32;
            (y * (1.0 / scale)).min(448.0).max(-448.0) as f8e4m3
        }

        /// `fused_add_rms_norm_static_fp8_quant`: `z = input + residual` rounded to bf16, as
        /// in `fused_add_rms_norm`, returned as the new residual.
        pub fn fused_add_rms_norm_static_fp8_quant(
            x: [bf16; t, h], r: [bf16; t, h], w: [bf16; h], scale: [f32;], eps: f32,
        ) -> ([f8e4m3; t, h], [bf16; t, h]) {
            let z = (x as f32 + r as f32) as bf16;
            let zf = z as f32;
            let rstd = rsqrt(mean(zf * zf, h) + eps);
            let y = ((zf * rstd) as bf16 as f32 * w as f32) as bf16 as f32;
            ((y * (1.0 / scale)).min(448.0).max(-448.0) as f8e4m3, z)
        }

        /// `csrc/quantization/w8a8/fp8/common.cu`, `scaled_fp8_quant_kernel_strided` (static):
        /// `x * (1 / scale)`, clamped by `fminf`/`fmaxf` (NaN becomes 448), RNE.
        pub fn static_scaled_fp8_quant(x: [bf16; t, h], scale: [f32;]) -> [f8e4m3; t, h] {
            (x as f32 * (1.0 / scale)).min(448.0).max(-448.0) as f8e4m3
        }

        /// `dynamic_scaled_fp8_quant`, first launch (`segmented_max_reduction_strided`): the
        /// tensor's scale `max(0, max |x| / 448)`. The second launch is `static_scaled_fp8_quant`
        /// with this scale, as in vLLM.
        pub fn fp8_tensor_scale(x: [bf16; t, h]) -> f32 {
            (max((x as f32).abs()) / 448.0).max(0.0)
        }

        /// `dynamic_per_token_scaled_fp8_quant_kernel_strided`: absmax from 0, `scale =
        /// fmaxf(fminf(absmax, scale_ub) / 448, 1 / (448 * 512))`, then `x / scale` (not a
        /// reciprocal) clamped and converted.
        pub fn dynamic_per_token_scaled_fp8_quant(x: [bf16; t, h], scale_ub: f32)
            -> ([f8e4m3; t, h], [f32; t])
        {
            let xf = x as f32;
            let absmax = max(xf.abs(), h).max(0.0);
            let scale = (absmax.min(scale_ub) / 448.0).max(1.0 / (448.0 * 512.0));
            ((xf / scale).min(448.0).max(-448.0) as f8e4m3, scale)
        }

        /// `per_token_group_quant_8bit` (int8): a group's absmax seeded with `eps`, `y_s =
        /// absmax / int8_max`, and `int8_t(fminf(fmaxf(x / y_s, min), max))`: a C++ cast, so
        /// truncated toward zero, not rounded; NaN becomes `int8_min` through `fmaxf`. The
        /// groups are the dim `g` of a `[t, g, gs]` view of the `[t, h]` input.
        pub fn per_token_group_quant_int8(x: [bf16; t, g, gs], eps: f32, qmin: f32, qmax: f32)
            -> ([i8; t, g, gs], [f32; t, g])
        {
            let xf = x as f32;
            let ys = max(xf.abs(), gs).max(eps) / qmax;
            ((xf / ys).max(qmin).min(qmax) as i8, ys)
        }

        /// The `scale_ue8m0` variant: `y_s = exp2f(ceilf(log2f(fmaxf(|y_s|, 1e-10))))`, a power
        /// of two.
        pub fn per_token_group_quant_int8_ue8m0(x: [bf16; t, g, gs], eps: f32, qmin: f32, qmax: f32)
            -> ([i8; t, g, gs], [f32; t, g])
        {
            let xf = x as f32;
            let ys = max(xf.abs(), gs).max(eps) / qmax;
            let ys = ys.abs().max(1e-10).log2().ceil().exp2();
            ((xf / ys).max(qmin).min(qmax) as i8, ys)
        }

        /// The fp8 variant (`per_token_group_quant_fp8`): the same scale, the clamped value
        /// converted to e4m3 with RNE.
        pub fn per_token_group_quant_fp8(x: [bf16; t, g, gs], eps: f32)
            -> ([f8e4m3; t, g, gs], [f32; t, g])
        {
            let xf = x as f32;
            let ys = max(xf.abs(), gs).max(eps) / 448.0;
            ((xf / ys).max(-448.0).min(448.0) as f8e4m3, ys)
        }

        /// `csrc/quantization/activation_kernels.cu`, `silu_and_mul_quant`
        /// (`act_and_mul_quant_kernel`): `ACT_FN(x) * y` in `scalar_t` (the activation and the
        /// product each rounded to bf16), then `scaled_fp8_conversion<true>` with `1 / scale`.
        pub fn silu_and_mul_quant(x: [bf16; t, 2 * d], scale: [f32;]) -> [f8e4m3; t, d] {
            let act = silu(x[.., ..d] as f32) as bf16;
            let y = (act as f32 * x[.., d..] as f32) as bf16;
            (y as f32 * (1.0 / scale)).min(448.0).max(-448.0) as f8e4m3
        }

        /// `silu_mul_fp8_quant_deep_gemm`: per group of `gs` (128 in DeepGEMM) of each token,
        /// `y = silu(gate) * up` in f32, `y_s = max(absmax, eps) / 448` (a power of two
        /// above it with `ue8m0`), and `clamp(y / y_s)` in e4m3. The input `[t, 2 * h]` is viewed
        /// as `[t, 2, g, gs]`: gate and up are picked by a constant index. vLLM skips the
        /// tokens past each expert's count, whose outputs are unspecified; this computes them.
        pub fn silu_mul_fp8_quant(x: [bf16; t, 2, g, gs], eps: f32)
            -> ([f8e4m3; t, g, gs], [f32; t, g])
        {
            let gate = x[.., 0, .., ..] as f32;
            let up = x[.., 1, .., ..] as f32;
            let y = gate / (1.0 + (-gate).exp()) * up;
            let ys = max(y.abs(), gs).max(eps) / 448.0;
            ((y / ys).max(-448.0).min(448.0) as f8e4m3, ys)
        }

        /// `csrc/cache_kernels.cu`, `convert_fp8` (e4m3 to bf16): `float(x) * scale` rounded.
        pub fn convert_fp8_to_bf16(x: [f8e4m3; n], scale: f32) -> [bf16; n] {
            (x as f32 * scale) as bf16
        }

        /// `convert_fp8` (bf16 to e4m3): `x / scale` by `__nv_cvt_float_to_fp8` with
        /// `__NV_SATFINITE`: saturating, NaN to `0x7f`.
        pub fn convert_bf16_to_fp8(x: [bf16; n], scale: f32) -> [f8e4m3; n] {
            (x as f32 / scale) as f8e4m3
        }

        /// `csrc/pos_encoding_kernels.cu`, `rotary_embedding` (NEOX): cos and sin are the halves
        /// of the cache row at each token's position; `x1 cos - x2 sin`, `x2 cos + x1 sin`. The
        /// result's two halves are two outputs (outputs made of parts are not yet in the
        /// language), and q and k take a launch each.
        pub fn rotary_neox(pos: [i64; t], cache: [f32; max_pos, 2 * half], x: [f32; t, h, 2 * half])
            -> ([f32; t, h, half], [f32; t, h, half])
        {
            let cos = cache[pos, ..half];
            let sin = cache[pos, half..];
            let x1 = x[.., .., ..half];
            let x2 = x[.., .., half..];
            (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        }

        /// `rotary_embedding` (GPT-J): the rotated pairs are interleaved (`x[2i]`, `x[2i+1]`);
        /// the even and odd results are two outputs.
        pub fn rotary_gptj(pos: [i64; t], cache: [f32; max_pos, 2 * half], x: [f32; t, h, half * 2])
            -> ([f32; t, h, half], [f32; t, h, half])
        {
            let cos = cache[pos, ..half];
            let sin = cache[pos, half..];
            let x1 = x[.., .., (0..).step_by(2)];
            let x2 = x[.., .., (1..).step_by(2)];
            (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        }

        /// `batched_rotary_embedding` (NEOX): the cache row is `offsets[t] + positions[t]`.
        pub fn batched_rotary_neox(
            pos: [i64; t], offsets: [i64; t], cache: [f32; max_pos, 2 * half], x: [f32; t, h, 2 * half],
        ) -> ([f32; t, h, half], [f32; t, h, half]) {
            let row = pos + offsets;
            let cos = cache[row, ..half];
            let sin = cache[row, half..];
            let x1 = x[.., .., ..half];
            let x2 = x[.., .., half..];
            (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        }

        /// `csrc/fused_qknorm_rope_kernel.cu`, `fused_qk_norm_rope` (NEOX) for one of q and k:
        /// RMSNorm over each head in f32 (`eps` inside the root, the weight per head dim), then
        /// the rotary of the normed head. The head's mean square is the mean of its two halves'.
        pub fn fused_qk_norm_rope(
            pos: [i64; t], cache: [f32; max_pos, 2 * half], x: [f32; t, h, 2 * half],
            w: [f32; 2 * half], eps: f32,
        ) -> ([f32; t, h, half], [f32; t, h, half]) {
            let x1 = x[.., .., ..half];
            let x2 = x[.., .., half..];
            let rstd = rsqrt((mean(x1 * x1, half) + mean(x2 * x2, half)) * 0.5 + eps);
            let n1 = x1 * rstd * w[..half];
            let n2 = x2 * rstd * w[half..];
            let cos = cache[pos, ..half];
            let sin = cache[pos, half..];
            (n1 * cos - n2 * sin, n2 * cos + n1 * sin)
        }

        /// `csrc/moe/topk_softmax_kernels.cu`, `topk_softmax` for `k = 2` (Mixtral): the
        /// softmax over experts in f32, then the largest twice, ties to the lower expert, as
        /// the kernel's argmax loop; with `renormalize` the two weights are divided by their
        /// sum. One output per k: outputs made of parts are not yet in the language.
        pub fn topk2_softmax(x: [f32; t, e], renormalize: bool)
            -> ([f32; t], [f32; t], [i32; t], [i32; t])
        {
            let m = max(x, e);
            let s = sum((x - m).exp(), e);
            let i0 = argmax(x, e);
            let i1 = argmax(if index(e) == i0 { f32::NEG_INFINITY } else { x }, e);
            let w0 = 1.0 / s;
            let w1 = (x[.., i1] - m).exp() / s;
            let total = if renormalize { w0 + w1 } else { 1.0 };
            (w0 / total, w1 / total, i0 as i32, i1 as i32)
        }

        /// `csrc/moe/moe_align_sum_kernels.cu`, `moe_sum`: the sum over the top-k copies of each
        /// token.
        pub fn moe_sum(x: [f32; t, k, h]) -> [f32; t, h] {
            sum(x, k)
        }

        /// `csrc/sampler.cu`, `apply_repetition_penalties`, out of place: where a token appeared
        /// in the prompt or the output, a positive logit is divided by the penalty and any other
        /// multiplied by it.
        pub fn apply_repetition_penalties(
            logits: [f32; s, v], prompt: [bool; s, v], output: [bool; s, v], penalties: [f32; s],
        ) -> [f32; s, v] {
            let p = penalties;
            if prompt || output { if logits > 0.0 { logits / p } else { logits * p } } else { logits }
        }

        /// `csrc/cache_kernels.cu`, `reshape_and_cache_flash` (`kv_cache_dtype` "auto"): each
        /// token's key and value rows to its slot of the caches, `[num_blocks, block_size, h, d]`
        /// seen as `[slots, h, d]`; a negative slot (a padding token) is skipped.
        pub fn reshape_and_cache_flash(
            key: [bf16; t, h, d], value: [bf16; t, h, d], slot_mapping: [i64; t],
            key_cache: &mut [bf16; slots, h, d], value_cache: &mut [bf16; slots, h, d],
        ) {
            key_cache[slot_mapping, .., ..] = key;
            value_cache[slot_mapping, .., ..] = value;
        }

        /// `csrc/cache_kernels.cu`, `reshape_and_cache` ("auto"): the key cache's layout is
        /// `[num_blocks, h, d / x, block_size, x]`, so each token's slot picks two of its dims,
        /// the block (`slot / block_size`) and the place in it (`slot % block_size`); the key
        /// `[t, h, d]` comes as `[t, h, d / x, x]` (a free reshape). A negative slot makes a
        /// negative place, outside its dim: nothing is written, as vLLM skips it. The value
        /// cache, `[num_blocks, h, d, block_size]`, is another domain: a second launch.
        pub fn reshape_and_cache_key(
            key: [bf16; t, h, dx, x], slot_mapping: [i64; t], block_size: i64,
            key_cache: &mut [bf16; nb, h, dx, bs, x],
        ) {
            key_cache[slot_mapping / block_size, .., .., slot_mapping % block_size, ..] = key;
        }

        pub fn reshape_and_cache_value(
            value: [bf16; t, h, d], slot_mapping: [i64; t], block_size: i64,
            value_cache: &mut [bf16; nb, h, d, bs],
        ) {
            value_cache[slot_mapping / block_size, .., .., slot_mapping % block_size] = value;
        }

        /// `csrc/cache_kernels.cu`, `copy_blocks`, one layer: for each pair of `block_mapping`,
        /// the source block of each cache copied to the destination block, the caches
        /// `[num_blocks, block_size, h, d]` seen as `[num_blocks, e]`. vLLM takes every layer's
        /// caches in one launch; this is one launch a layer.
        pub fn copy_blocks(
            block_mapping: [i64; m, 2],
            key_cache: &mut [bf16; nb, e], value_cache: &mut [bf16; nb, e],
        ) {
            let src = block_mapping[.., 0];
            let dst = block_mapping[.., 1];
            key_cache[dst, ..] = key_cache[src, ..];
            value_cache[dst, ..] = value_cache[src, ..];
        }

        /// `csrc/cache_kernels.cu`, `concat_and_cache_mla` ("auto"): each token's latent
        /// `kv_c` and rotary part `k_pe`, concatenated into its slot's row of the cache
        /// `[num_blocks, block_size, kv_lora_rank + pe_dim]` seen as `[slots, r + p]`. The
        /// parts have different widths, so two launches (one `fn` is one domain): the latent
        /// part here, the rotary part in `concat_and_cache_mla_pe`.
        pub fn concat_and_cache_mla(
            kv_c: [bf16; t, r], k_pe: [bf16; t, p], slot_mapping: [i64; t],
            kv_cache: &mut [bf16; slots, r + p],
        ) {
            kv_cache[slot_mapping, ..r] = kv_c;
        }

        pub fn concat_and_cache_mla_pe(
            kv_c: [bf16; t, r], k_pe: [bf16; t, p], slot_mapping: [i64; t],
            kv_cache: &mut [bf16; slots, r + p],
        ) {
            kv_cache[slot_mapping, r..] = k_pe;
        }

        /// `csrc/attention/merge_attn_states.cu`, `merge_attn_states_kernel`: two partial
        /// attention results `[t, h, d]` merged by their log-sum-exps, which are `[h, t]`
        /// (read as `[t, h]` through `permute`); an infinite LSE counts as `-inf`, the scales
        /// are `exp(lse - max) / sum` in f32. The merged LSE `[h, t]` is a launch of its own,
        /// `merge_attn_states_lse` (vLLM writes it from the same launch, once a head).
        pub fn merge_attn_states(
            prefix_output: [bf16; t, h, d], prefix_lse: [f32; h, t],
            suffix_output: [bf16; t, h, d], suffix_lse: [f32; h, t],
        ) -> [bf16; t, h, d] {
            let p_lse = permute(prefix_lse, (t, h));
            let s_lse = permute(suffix_lse, (t, h));
            let p_lse = if p_lse.is_infinite() { f32::NEG_INFINITY } else { p_lse };
            let s_lse = if s_lse.is_infinite() { f32::NEG_INFINITY } else { s_lse };
            let max_lse = p_lse.max(s_lse);
            let p_se = (p_lse - max_lse).exp();
            let s_se = (s_lse - max_lse).exp();
            let out_se = p_se + s_se;
            let p_scale = p_se / out_se;
            let s_scale = s_se / out_se;
            ((prefix_output as f32) * p_scale + (suffix_output as f32) * s_scale) as bf16
        }

        pub fn merge_attn_states_lse(prefix_lse: [f32; h, t], suffix_lse: [f32; h, t]) -> [f32; h, t] {
            let p_lse = if prefix_lse.is_infinite() { f32::NEG_INFINITY } else { prefix_lse };
            let s_lse = if suffix_lse.is_infinite() { f32::NEG_INFINITY } else { suffix_lse };
            let max_lse = p_lse.max(s_lse);
            ((p_lse - max_lse).exp() + (s_lse - max_lse).exp()).ln() + max_lse
        }
    }
}

pub mod liger {
    use fuse_runtime::fuse;

    fuse! {
        /// `src/liger_kernel/ops/rms_norm.py`, `_rms_norm_forward_kernel` (casting mode
        /// "gemma": everything in f32): `Y = x * rstd * (offset + W)`, and `RSTD` per row.
        pub fn rms_norm(x: [f32; t, h], w: [f32; h], eps: f32, offset: f32)
            -> ([f32; t, h], [f32; t])
        {
            let rstd = rsqrt(mean(x * x, h) + eps);
            (x * rstd * (offset + w), rstd)
        }

        /// `ops/layer_norm.py`, `_layer_norm_forward_kernel`: `Y`, `Mean` and `RSTD`, the
        /// variance of the centred row and `eps` inside the root.
        pub fn layer_norm(x: [f32; t, h], w: [f32; h], b: [f32; h], eps: f32)
            -> ([f32; t, h], [f32; t], [f32; t])
        {
            let m = mean(x, h);
            let c = x - m;
            let rstd = rsqrt(mean(c * c, h) + eps);
            (c * rstd * w + b, m, rstd)
        }

        /// `ops/swiglu.py`, `_swiglu_forward_kernel`: `silu(a)` in f32 cast to b's type, times
        /// `b`: two inputs, not halves of one.
        pub fn swiglu(a: [bf16; t, h], b: [bf16; t, h]) -> [bf16; t, h] {
            (silu(a as f32) as bf16) * b
        }

        /// `ops/geglu.py`, `_geglu_tanh_forward_kernel`: tanh GELU of `a` in f32, cast to b's
        /// type, times `b`.
        pub fn geglu(a: [bf16; t, h], b: [bf16; t, h]) -> [bf16; t, h] {
            (gelu_tanh(a as f32) as bf16) * b
        }

        /// `ops/relu_squared`: `relu(x)²`.
        pub fn relu_squared(x: [f32; n]) -> [f32; n] {
            let r = relu(x);
            r * r
        }

        /// `ops/rope.py`, `_triton_rope`: q laid out `[b, s, h, d]`, cos and sin `[b, s, d]` of
        /// which the first half is used. The two halves of the result are two outputs; q and k
        /// take a launch each.
        pub fn rope(x: [f32; b, s, h, 2 * half], cos: [f32; b, s, 2 * half], sin: [f32; b, s, 2 * half])
            -> ([f32; b, s, h, half], [f32; b, s, h, half])
        {
            let c = cos[.., .., ..half];
            let sn = sin[.., .., ..half];
            let x1 = x[.., .., .., ..half];
            let x2 = x[.., .., .., half..];
            (x1 * c - x2 * sn, x2 * c + x1 * sn)
        }

        /// `ops/cross_entropy.py`, `liger_cross_entropy_kernel` (reduction "none"): logits
        /// soft-capped (`softcap * tanh(x / softcap)`), the row's `lse`, the loss `lse - x_y`
        /// mixed with label smoothing (`eps = label_smoothing / n_cols` from the host, as Liger
        /// passes it), plus the z-loss `lse_square_scale * lse²`; rows whose label is
        /// `ignore_index` give 0. Also the predicted class (argmax).
        pub fn cross_entropy(
            x: [f32; n, v], y: [i64; n], ignore_index: i64, label_smoothing: f32, eps: f32,
            lse_square_scale: f32, softcap: f32,
        ) -> ([f32; n], [f32; n], [u32; n]) {
            let z = softcap * (x / softcap).tanh();
            let lse = logsumexp(z, v);
            let zy = softcap * (x[.., y] / softcap).tanh();
            let smooth = sum(-eps * z, v) + label_smoothing * lse;
            let z_loss = lse_square_scale * lse * lse;
            let loss = (lse - zy) * (1.0 - label_smoothing) + smooth + z_loss;
            let ignored = y == ignore_index;
            (if ignored { 0.0 } else { loss }, if ignored { 0.0 } else { z_loss }, argmax(z, v))
        }

        /// `ops/kl_div.py`, `_kldiv_kernel_forward` (`log_target = False`, reduction "none"):
        /// `y * (ln(max(y, eps)) - x)`.
        pub fn kl_div(x: [f32; n, v], y: [f32; n, v], eps: f32) -> [f32; n, v] {
            y * (y.max(eps).ln() - x)
        }

        /// `_kldiv_kernel_forward` with `log_target = True`, summed over each row (the
        /// "batchmean"/"sum" path's row sums): `exp(y) * (y - x)`.
        pub fn kl_div_log_target_rows(x: [f32; n, v], y: [f32; n, v]) -> [f32; n] {
            sum(y.exp() * (y - x), v)
        }

        /// `ops/jsd.py`, `_jsd_kernel` (generalised JSD of log-probabilities, `0 < beta < 1`):
        /// `beta P Y + (1 - beta) Q X - M ln M` with `M = beta P + (1 - beta) Q`, summed over the
        /// row, divided by the number of rows not ignored (from the host), and 0 where the label
        /// is `ignore_index`.
        pub fn jsd(x: [f32; n, v], y: [f32; n, v], label: [i64; n], beta: f32, n_non_ignore: f32)
            -> [f32; n]
        {
            let q = x.exp();
            let p = y.exp();
            let m = beta * p + (1.0 - beta) * q;
            let loss = sum(beta * p * y + (1.0 - beta) * q * x - m * m.ln(), v) / n_non_ignore;
            if label == -100 { 0.0 } else { loss }
        }

        /// `ops/tvd.py`, `_tv_distance_kernel`: `0.5 |p - q|` and its gradient `0.5 sign(p - q)`
        /// (`p > q` gives 0.5, otherwise -0.5), both 0 in rows whose label is `ignore_index`.
        pub fn tvd(p: [f32; n, v], q: [f32; n, v], label: [i64; n], ignore_index: i64)
            -> ([f32; n, v], [f32; n, v])
        {
            let ignored = label == ignore_index;
            let loss = 0.5 * (p - q).abs();
            let grad = if p > q { 0.5 } else { -0.5 };
            (if ignored { 0.0 } else { loss }, if ignored { 0.0 } else { grad })
        }

        /// `ops/group_norm.py`, `_group_norm_forward_kernel`: `X` of `[batch, channels,
        /// hidden]` seen as `[b, g, c, s]` (a free reshape), a group's mean and rstd over its
        /// channels and positions at once, the variance as `E[x^2] - mean^2` as Liger sums it,
        /// the weight and bias per channel (`[g, c]`): `Y`, `Mean`, `RSTD`.
        pub fn group_norm(x: [f32; b, g, c, s], w: [f32; g, c], bias: [f32; g, c], eps: f32)
            -> ([f32; b, g, c, s], [f32; b, g], [f32; b, g])
        {
            let m = mean(x, (c, s));
            let rstd = rsqrt(mean(x * x, (c, s)) - m * m + eps);
            ((x - m) * rstd * w + bias, m, rstd)
        }

        /// `ops/dyt.py`, `_dyt_fwd_kernel`: `gamma * tanh(alpha * x) + beta`, `alpha` a
        /// one-element tensor.
        pub fn dyt(x: [f32; t, h], alpha: [f32;], gamma: [f32; h], beta: [f32; h]) -> [f32; t, h] {
            gamma * (alpha * x).tanh() + beta
        }

        /// `ops/softmax.py`, `_softmax_single_block_forward_kernel`.
        pub fn softmax(x: [f32; t, v]) -> [f32; t, v] {
            let e = (x - max(x, v)).exp();
            e / sum(e, v)
        }

        /// `ops/fused_add_rms_norm.py`: `S = X + R`, `Y = rmsnorm(S) * (offset + W)`, with `S`
        /// and `RSTD` as outputs.
        pub fn fused_add_rms_norm(x: [f32; t, h], r: [f32; t, h], w: [f32; h], eps: f32, offset: f32)
            -> ([f32; t, h], [f32; t, h], [f32; t])
        {
            let s = x + r;
            let rstd = rsqrt(mean(s * s, h) + eps);
            (s * rstd * (offset + w), s, rstd)
        }

        /// `ops/poly_norm.py`, `_poly_norm_forward_kernel`: `Y = w0 norm(x³) + w1 norm(x²) +
        /// w2 norm(x) + b` with `norm(u) = u rsqrt(mean(u²) + eps)`; the three RSTDs (Liger's
        /// `[t, 3]`) as three outputs.
        pub fn poly_norm(x: [f32; t, h], w: [f32; 3], b: [f32; 1], eps: f32)
            -> ([f32; t, h], [f32; t], [f32; t], [f32; t])
        {
            let x2 = x * x;
            let x3 = x2 * x;
            let r3 = rsqrt(mean(x3 * x3, h) + eps);
            let r2 = rsqrt(mean(x2 * x2, h) + eps);
            let r1 = rsqrt(mean(x2, h) + eps);
            (w[0] * x3 * r3 + w[1] * x2 * r2 + w[2] * x * r1 + b[0], r3, r2, r1)
        }
    }
}
