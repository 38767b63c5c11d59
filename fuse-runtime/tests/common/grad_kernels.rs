//! Kernels with derivatives, in the types training uses: the GPU gradient tests run them
//! against the CPU backend, and `nvrtc_kernels` compiles every launch of their derivatives.
use fuse_runtime::fuse;

fuse! {
    #[vjp(x, w)]
    #[jvp(x, w)]
    pub fn rmsnorm(x: [f32; rows, cols], w: [f32; cols]) -> [f32; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * w
    }

    #[vjp(x, w)]
    pub fn rmsnorm_bf16(x: [bf16; rows, cols], w: [bf16; cols]) -> [bf16; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * w
    }

    #[vjp(x, g, b)]
    pub fn layernorm_bf16(x: [bf16; rows, cols], g: [bf16; cols], b: [bf16; cols]) -> [bf16; rows, cols] {
        let d = x - mean(x, cols);
        d * rsqrt(mean(d * d, cols) + 1e-5) * g + b
    }

    #[vjp(a, b)]
    #[jvp(a, b)]
    pub fn swiglu(a: [bf16; t, f], b: [bf16; t, f]) -> [bf16; t, f] {
        silu(a) * b
    }

    #[vjp(z)]
    pub fn cross_entropy(z: [bf16; rows, cols], label: [i64; rows]) -> [f32; rows] {
        let z = z as f32;
        logsumexp(z, cols) - sum(if index(cols) as i64 == label { z } else { 0.0 }, cols)
    }

    #[vjp(x)]
    #[jvp(x)]
    pub fn softmax_f16(x: [f16; rows, cols]) -> [f16; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }

    #[vjp(x, alpha, g, b)]
    pub fn dyt(x: [bf16; rows, cols], alpha: f32, g: [bf16; cols], b: [bf16; cols]) -> [bf16; rows, cols] {
        ((alpha * (x as f32)).tanh() as bf16) * g + b
    }

    /// A bias's gradient beside an elementwise one in f32: long rows take chunks of them
    /// (`chunked_rows`), 16-byte vectors of four.
    #[vjp(x, bias)]
    pub fn bias_silu(x: [f32; rows, cols], bias: [f32; cols]) -> [f32; rows, cols] {
        silu(x + bias)
    }

    /// `gelu` in f32: the GPU computes its derivative with a helper of its own
    /// (`fz_gelu_grad`), checked over a wide range and the special values.
    #[vjp(x)]
    #[jvp(x)]
    pub fn gelu_f32(x: [f32; n]) -> [f32; n] {
        gelu(x)
    }

    #[vjp(x, bias)]
    pub fn bias_gelu_dropout(x: [bf16; rows, cols], bias: [bf16; cols], seed: u64) -> [bf16; rows, cols] {
        dropout(gelu(x + bias), 0.1, seed)
    }

    /// The training pair saves the mask `x1 + x2 + x3 + x4 > 0` (packed bits, one an element):
    /// its backward reads it and `dy`, where `vjp` reads the four inputs and `dy`.
    #[vjp(x1)]
    pub fn relu4(x1: [f32; n], x2: [f32; n], x3: [f32; n], x4: [f32; n]) -> [f32; n] {
        relu(x1 + x2 + x3 + x4)
    }

    /// The same over two dims of bf16, eight elements a vector: its mask's bits cross rows.
    #[vjp(a)]
    pub fn relu3_bf16(a: [bf16; t, h], b: [bf16; t, h], c: [bf16; t, h]) -> [bf16; t, h] {
        relu(a + b + c)
    }

    #[vjp(x)]
    #[jvp(x)]
    pub fn total(x: [f32; n]) -> f32 {
        logsumexp(x)
    }

    /// Cross-entropy with the label's logit gathered: the gradient goes back to the label's
    /// column by a comparison, in the launch of the row's softmax.
    #[vjp(z)]
    #[jvp(z)]
    pub fn cross_entropy_gathered(z: [bf16; rows, cols], label: [i64; rows]) -> [f32; rows] {
        logsumexp(z as f32, cols) - (z[.., label] as f32)
    }

    /// vLLM's `silu_and_mul` on the concatenated gate and up projections: both halves'
    /// gradients stored in one launch over the halves' shape.
    #[vjp(x)]
    #[jvp(x)]
    pub fn silu_and_mul(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
        silu(x[.., ..d]) * x[.., d..]
    }

    /// One half read, through a row's sum: the gradient's other half is zero, the sum taken in
    /// a launch before the one that stores the half.
    #[vjp(x)]
    pub fn half_softmax(x: [bf16; t, 2 * d]) -> [f32; t, d] {
        let e = (x[.., ..d] as f32).exp();
        e / sum(e, d)
    }

    /// GroupNorm with its per-channel affine, whose weight is read at each element's place in
    /// the merged dim `(c, s)`: every gradient (the weight's and bias's sum over `s`, part of
    /// that dim) and the tangent along every input.
    #[vjp(x, w, bias)]
    #[jvp(x, w, bias)]
    pub fn group_norm_affine(x: [f32; b, g, c, s], w: [f32; g, c], bias: [f32; g, c]) -> [f32; b, g, c, s] {
        let d = x - mean(x, (c, s));
        d * rsqrt(mean(d * d, (c, s)) + 1e-5) * w + bias
    }

    #[vjp(x, y)]
    #[jvp(x, y)]
    pub fn permuted(x: [bf16; r, c], y: [bf16; c, r]) -> [bf16; r, c] {
        x * permute(y, (r, c)).exp()
    }
}
