//! The kernels the benchmark times: each workload as one fused `fn`, and the single operations
//! its unfused version chains (one `fn`, so one launch, per operation of the definition in
//! `shared/WORKLOADS.md`; a library-level op such as `gelu` counts as one).

use fuse_runtime::fuse;

fuse! {
    /// W1: softplus written as a chain, `ln(exp(x) + 1)`.
    pub fn w1_softplus(x: [f32; n]) -> [f32; n] {
        (x.exp() + 1.0).ln()
    }

    /// W2: add, then GELU in its tanh form.
    pub fn w2_add_gelu(a: [f32; n], b: [f32; n]) -> [f32; n] {
        gelu_tanh(a + b)
    }

    /// W3: bias add, GELU in its erf form, dropout with p = 0.1 (Philox, keyed by `seed`).
    pub fn w3_bias_gelu_dropout(x: [f32; rows, cols], bias: [f32; cols], seed: u64)
        -> [f32; rows, cols]
    {
        dropout(gelu(x + bias), 0.1, seed)
    }

    /// W4: a full reduction of an elementwise expression.
    pub fn w4_sum_exp(x: [f32; n]) -> f32 {
        sum(x.exp())
    }

    /// W5: softmax over each row.
    pub fn w5_softmax(x: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }

    /// W6: layernorm (two nested row means), then GELU in its erf form.
    pub fn w6_layernorm_gelu(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols])
        -> [f32; rows, cols]
    {
        let mu = mean(x, cols);
        let d = x - mu;
        let rstd = rsqrt(mean(d * d, cols) + 1e-5);
        gelu(d * rstd * gamma + beta)
    }

    /// W7: layernorm, then int8 quantization by each row's absolute maximum: `q` rounds half
    /// away from zero and saturates to [-127, 127].
    pub fn w7_layernorm_quantize(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols])
        -> ([i8; rows, cols], [f32; rows])
    {
        let mu = mean(x, cols);
        let d = x - mu;
        let y = d * rsqrt(mean(d * d, cols) + 1e-5) * gamma + beta;
        let scale = max(y.abs(), cols) / 127.0;
        ((y / scale).round().clamp(-127.0, 127.0) as i8, scale)
    }

    /// W8: RMSNorm.
    pub fn w8_rmsnorm(x: [f32; rows, cols], w: [f32; cols]) -> [f32; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * w
    }

    /// W9: softmax cross-entropy per row, labels as i64.
    pub fn w9_cross_entropy(x: [f32; rows, cols], label: [i64; rows]) -> [f32; rows] {
        logsumexp(x, cols) - sum(if index(cols) as i64 == label { x } else { 0.0 }, cols)
    }

    /// W10: a product and its forward-mode tangent, two outputs.
    pub fn w10_tangent(x: [f32; n], y: [f32; n], dx: [f32; n], dy: [f32; n])
        -> ([f32; n], [f32; n])
    {
        (x * y, dx * y + x * dy)
    }

    /// W10 derived: the product, whose `jvp` is W10's tangent.
    #[jvp(x, y)]
    pub fn w10_product(x: [f32; n], y: [f32; n]) -> [f32; n] {
        x * y
    }

    /// The copy row's fuse! variant: one read and one write per element.
    pub fn identity(x: [f32; n]) -> [f32; n] {
        x
    }

    /// Reads a large buffer and writes one number, between timed runs: it evicts the L2 cache
    /// (leaving no dirty lines behind) and keeps the GPU busy while the host queues the next run.
    pub fn flush(x: [f32; n]) -> f32 {
        sum(x)
    }

    // One operation each, for the unfused variants.

    /// `exp(x)`.
    pub fn op_exp(x: [f32; n]) -> [f32; n] {
        x.exp()
    }
    /// `ln(x)`.
    pub fn op_ln(x: [f32; n]) -> [f32; n] {
        x.ln()
    }
    /// `x + c` for a scalar `c`.
    pub fn op_add_scalar(x: [f32; n], c: f32) -> [f32; n] {
        x + c
    }
    /// `a + b`.
    pub fn op_add(a: [f32; n], b: [f32; n]) -> [f32; n] {
        a + b
    }
    /// `|x|`.
    pub fn op_abs(x: [f32; n]) -> [f32; n] {
        x.abs()
    }
    /// `x / 127`.
    pub fn op_div_127(x: [f32; n]) -> [f32; n] {
        x / 127.0
    }
    /// The int8 quantization of `x` by a scale per row.
    pub fn op_quantize(x: [f32; rows, cols], scale: [f32; rows]) -> [i8; rows, cols] {
        (x / scale).round().clamp(-127.0, 127.0) as i8
    }
    /// `x + bias`, the bias broadcast over the rows.
    pub fn op_add_bias(x: [f32; rows, cols], bias: [f32; cols]) -> [f32; rows, cols] {
        x + bias
    }
    /// `dropout(x, 0.1, seed)`.
    pub fn op_dropout(x: [f32; n], seed: u64) -> [f32; n] {
        dropout(x, 0.1, seed)
    }
    /// `a * b`.
    pub fn op_mul(a: [f32; n], b: [f32; n]) -> [f32; n] {
        a * b
    }
    /// `x * x`.
    pub fn op_square(x: [f32; n]) -> [f32; n] {
        x * x
    }
    /// `rsqrt(x)`.
    pub fn op_rsqrt(x: [f32; n]) -> [f32; n] {
        rsqrt(x)
    }
    /// GELU, erf form.
    pub fn op_gelu(x: [f32; n]) -> [f32; n] {
        gelu(x)
    }
    /// GELU, tanh form.
    pub fn op_gelu_tanh(x: [f32; n]) -> [f32; n] {
        gelu_tanh(x)
    }
    /// The sum of every element.
    pub fn op_sum(x: [f32; n]) -> f32 {
        sum(x)
    }
    /// The maximum of each row.
    pub fn op_row_max(x: [f32; rows, cols]) -> [f32; rows] {
        max(x, cols)
    }
    /// The sum of each row.
    pub fn op_row_sum(x: [f32; rows, cols]) -> [f32; rows] {
        sum(x, cols)
    }
    /// The mean of each row.
    pub fn op_row_mean(x: [f32; rows, cols]) -> [f32; rows] {
        mean(x, cols)
    }
    /// The log-sum-exp of each row.
    pub fn op_row_logsumexp(x: [f32; rows, cols]) -> [f32; rows] {
        logsumexp(x, cols)
    }
    /// The element of each row at its label.
    pub fn op_row_pick(x: [f32; rows, cols], label: [i64; rows]) -> [f32; rows] {
        sum(if index(cols) as i64 == label { x } else { 0.0 }, cols)
    }
    /// `a - b` for per-row numbers.
    pub fn op_sub_rows(a: [f32; rows], b: [f32; rows]) -> [f32; rows] {
        a - b
    }
    /// Each row minus its own number.
    pub fn op_sub_row(x: [f32; rows, cols], r: [f32; rows]) -> [f32; rows, cols] {
        x - r
    }
    /// Each row times its own number.
    pub fn op_mul_row(x: [f32; rows, cols], r: [f32; rows]) -> [f32; rows, cols] {
        x * r
    }
    /// Each row divided by its own number.
    pub fn op_div_row(x: [f32; rows, cols], r: [f32; rows]) -> [f32; rows, cols] {
        x / r
    }
    /// Each column times its own number.
    pub fn op_mul_col(x: [f32; rows, cols], c: [f32; cols]) -> [f32; rows, cols] {
        x * c
    }
    /// Each column plus its own number.
    pub fn op_add_col(x: [f32; rows, cols], c: [f32; cols]) -> [f32; rows, cols] {
        x + c
    }
}

// S2, S3 and W11: one kernel per workload and element type, since the language has no generics.
// The 16-bit types compute in f32 and round where they store; the casts say so where it helps.
fuse! {
    /// S2: the sum of each row, in f32.
    pub fn s2_row_sum_f32(x: [f32; rows, cols]) -> [f32; rows] {
        sum(x, cols)
    }
    /// S2: the sum of each row, in bf16.
    pub fn s2_row_sum_bf16(x: [bf16; rows, cols]) -> [bf16; rows] {
        sum(x, cols)
    }
    /// S2: the sum of each row, in f16.
    pub fn s2_row_sum_f16(x: [f16; rows, cols]) -> [f16; rows] {
        sum(x, cols)
    }

    /// S2: softmax over each row, in bf16.
    pub fn s2_softmax_bf16(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }
    /// SW: RMSNorm without a weight, in bf16: a light row (one reduction, read once), loaded
    /// straight into registers at the widths the wide 16-bit entry takes.
    pub fn sw_rmsnorm_bf16(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
        let xf = x as f32;
        (xf * rsqrt(mean(xf * xf, cols) + 1e-6)) as bf16
    }
    /// S2: softmax over each row, in f16.
    pub fn s2_softmax_f16(x: [f16; rows, cols]) -> [f16; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }
    /// S2's bf16 softmax with CUDA's fast `expf` and division: what the precise functions cost
    /// the 16-bit rows, which are bound by instructions (NOTES item 96).
    #[fast_math]
    pub fn s2_softmax_bf16_fast(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }
    /// S2's f16 softmax with CUDA's fast `expf` and division.
    #[fast_math]
    pub fn s2_softmax_f16_fast(x: [f16; rows, cols]) -> [f16; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }

    /// S2 and W11: the sum of each column (over the leading dim, a bias gradient), in f32.
    pub fn s2_column_sum_f32(x: [f32; rows, cols]) -> [f32; cols] {
        sum(x, rows)
    }
    /// S2: the sum of each column, in bf16.
    pub fn s2_column_sum_bf16(x: [bf16; rows, cols]) -> [bf16; cols] {
        sum(x, rows)
    }
    /// S2: the sum of each column, in f16.
    pub fn s2_column_sum_f16(x: [f16; rows, cols]) -> [f16; cols] {
        sum(x, rows)
    }

    /// S3: softplus as W1 writes it, computed in f32 and stored as bf16.
    pub fn s3_softplus_bf16(x: [bf16; n]) -> [bf16; n] {
        ((x as f32).exp() + 1.0).ln() as bf16
    }
    /// S3: softplus as W1 writes it, computed in f32 and stored as f16.
    pub fn s3_softplus_f16(x: [f16; n]) -> [f16; n] {
        ((x as f32).exp() + 1.0).ln() as f16
    }

    /// S3: softplus in bf16 with CUDA's fast `__expf` and `__logf`.
    #[fast_math]
    pub fn s3_softplus_bf16_fast(x: [bf16; n]) -> [bf16; n] {
        ((x as f32).exp() + 1.0).ln() as bf16
    }
    /// S3: softplus in f16 with CUDA's fast `__expf` and `__logf`.
    #[fast_math]
    pub fn s3_softplus_f16_fast(x: [f16; n]) -> [f16; n] {
        ((x as f32).exp() + 1.0).ln() as f16
    }

    /// S3: a per-token vector broadcast over the heads, in f32.
    pub fn s3_q_times_c_f32(q: [f32; t, h, d], c: [f32; t, d]) -> [f32; t, h, d] {
        q * c
    }
    /// V1: vLLM's `silu_and_mul` on the concatenated gate and up projections, `x: [t, 2 * d]`:
    /// the first half of each row is the gate, the second the up projection.
    pub fn v1_silu_and_mul(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
        silu(x[.., ..d]) * x[.., d..]
    }
    /// V2: RMSNorm, then vLLM's dynamic per-token fp8 (e4m3) quantization: each token's scale
    /// is its largest magnitude over 448 (at least `1 / (448 * 512)`, vLLM's floor), and the
    /// values divided by it, rounded to e4m3.
    pub fn v2_rmsnorm_fp8(x: [bf16; t, h], w: [bf16; h]) -> ([f8e4m3; t, h], [f32; t]) {
        let xf = x as f32;
        let y = xf * rsqrt(mean(xf * xf, h) + 1e-6) * (w as f32);
        let s = (max(y.abs(), h) / 448.0).max(1.0 / (448.0 * 512.0));
        ((y / s) as f8e4m3, s)
    }
    /// V3: vLLM's NEOX `rotary_embedding` with the cos/sin cache gathered by position: each
    /// head's halves rotate by the cache row of the token's position (cos, then sin), computed
    /// in f32 and written as one `[t, h, 2 * half]` output, both halves through `&mut`.
    pub fn v3_rotary(
        pos: [i64; t],
        cache: [f32; max_pos, 2 * half],
        q: [bf16; t, h, 2 * half],
        out: &mut [bf16; t, h, 2 * half],
    ) {
        let cos = cache[pos, ..half];
        let sin = cache[pos, half..];
        let x1 = q[.., .., ..half] as f32;
        let x2 = q[.., .., half..] as f32;
        out[.., .., ..half] = (x1 * cos - x2 * sin) as bf16;
        out[.., .., half..] = (x2 * cos + x1 * sin) as bf16;
    }
    /// V4: vLLM's KV-cache write (`reshape_and_cache_flash`, one cache): each token's rows to
    /// its slot; a negative slot writes nothing.
    pub fn v4_cache_write(k: [bf16; t, h, d], slot: [i64; t], cache: &mut [bf16; slots, h, d]) {
        cache[slot, .., ..] = k;
    }
    /// V1 with CUDA's fast `expf` and division, as S3's 16-bit softplus needed for the ceiling.
    #[fast_math]
    pub fn v1_silu_and_mul_fast(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
        silu(x[.., ..d]) * x[.., d..]
    }
    /// S3: a per-token f32 vector broadcast over the heads of bf16 `q`, multiplied in f32.
    pub fn s3_q_times_c_bf16(q: [bf16; t, h, d], c: [f32; t, d]) -> [bf16; t, h, d] {
        ((q as f32) * c) as bf16
    }
    /// S2: GroupNorm in bf16, a group's statistics over its channels and positions at once
    /// (`mean(x, (c, s))`), the f32 weight and bias per channel read at each element's channel.
    pub fn s2_group_norm_bf16(x: [bf16; b, g, c, s], w: [f32; g, c], bias: [f32; g, c]) -> [bf16; b, g, c, s] {
        let xf = x as f32;
        let d = xf - mean(xf, (c, s));
        (d * rsqrt(mean(d * d, (c, s)) + 1e-5) * w + bias) as bf16
    }
    /// S3: a per-token f32 vector broadcast over the heads of f16 `q`, multiplied in f32.
    pub fn s3_q_times_c_f16(q: [f16; t, h, d], c: [f32; t, d]) -> [f16; t, h, d] {
        ((q as f32) * c) as f16
    }

    /// `x` rounded to bf16: the typed rows draw their inputs once in f32 and cast them.
    pub fn to_bf16(x: [f32; n]) -> [bf16; n] {
        x as bf16
    }
    /// `x` rounded to f16.
    pub fn to_f16(x: [f32; n]) -> [f16; n] {
        x as f16
    }
}

// The training workloads (WORKLOADS.md, G1-G8): bf16 forwards whose backwards `#[vjp]`
// derives; `grad.rs` times the backwards.
fuse! {
    /// G1: RMSNorm.
    #[vjp(x, w)]
    pub fn g1_rmsnorm(x: [bf16; t, h], w: [bf16; h]) -> [bf16; t, h] {
        x * rsqrt(mean(x * x, h) + 1e-6) * w
    }

    /// G2: LayerNorm.
    #[vjp(x, g, b)]
    pub fn g2_layernorm(x: [bf16; t, h], g: [bf16; h], b: [bf16; h]) -> [bf16; t, h] {
        let d = x - mean(x, h);
        d * rsqrt(mean(d * d, h) + 1e-5) * g + b
    }

    /// G3: SwiGLU.
    #[vjp(a, b)]
    pub fn g3_swiglu(a: [bf16; t, f], b: [bf16; t, f]) -> [bf16; t, f] {
        silu(a) * b
    }

    /// G4: GeGLU, GELU's tanh form.
    #[vjp(a, b)]
    pub fn g4_geglu(a: [bf16; t, f], b: [bf16; t, f]) -> [bf16; t, f] {
        gelu_tanh(a) * b
    }

    /// G5: cross-entropy per row over a vocabulary (the mean over rows is the cotangent
    /// `1 / t` of each row), forward and backward together through `value_and_vjp`.
    #[vjp(z)]
    pub fn g5_cross_entropy(z: [bf16; t, v], label: [i64; t]) -> [f32; t] {
        let z = z as f32;
        logsumexp(z, v) - sum(if index(v) as i64 == label { z } else { 0.0 }, v)
    }

    /// G5 as the workload writes it, the label's logit gathered (`z[row, label]`): the first
    /// pass over a row does no label test, which G5's one-hot sum does in every element.
    #[vjp(z)]
    pub fn g5_cross_entropy_gathered(z: [bf16; t, v], label: [i64; t]) -> [f32; t] {
        logsumexp(z as f32, v) - (z[.., label] as f32)
    }

    /// G5G with `#[fast_math]`: `exp` as `__expf` (`ex2.approx`), as Triton's softmax and
    /// cross-entropy (the peers') compute it.
    #[fast_math]
    #[vjp(z)]
    pub fn g5_cross_entropy_fast(z: [bf16; t, v], label: [i64; t]) -> [f32; t] {
        logsumexp(z as f32, v) - (z[.., label] as f32)
    }

    /// G6: softmax, its shift detached as doc/language.md advises: the shift cancels, and
    /// its derivative (the maximum's, split among ties) would take two passes more.
    #[vjp(x)]
    pub fn g6_softmax(x: [bf16; t, h]) -> [bf16; t, h] {
        let e = (x - detach(max(x, h))).exp();
        e / sum(e, h)
    }

    /// G7: DyT, `alpha` a learned scalar.
    #[vjp(x, alpha, g, b)]
    pub fn g7_dyt(x: [bf16; t, h], alpha: f32, g: [bf16; h], b: [bf16; h]) -> [bf16; t, h] {
        ((alpha * (x as f32)).tanh() as bf16) * g + b
    }

    /// G8: bias, GELU (erf) and dropout with p = 0.1, the mask drawn again from the seed.
    #[vjp(x, bias)]
    pub fn g8_bias_gelu_dropout(x: [bf16; t, h], bias: [bf16; h], seed: u64) -> [bf16; t, h] {
        dropout(gelu(x + bias), 0.1, seed)
    }
}
