// NOTES.md item 143: hand-written variants of V2's row-a-block entry (`exact_rows` of
// `v2_rmsnorm_fp8`, RMSNorm then a per-token e4m3 quantization of rows of 4096 bf16), timed by
// `v2_rows.py` beside fuse's own entry, which also supplies the helpers used here (`fz_vec`,
// `fz_bf16_at`, `fz_divider_of`, `fz_div_fast`, `fz_div_by`, `fz_f32_to_f8e4m3`).
// V2K(name, W, L, STASH, blocks an SM, LD): W threads a row (256 / W rows a block), vectors of
// L elements, STASH keeps y = x * rstd * w in f32 registers for the last pass (else computed
// again), `__launch_bounds__(256, blocks)`, LD the load of x (below).
// LD 0: C++ (ld.global.nc where the compiler proves it), 1: ld.global, 2: ld.global.L1::no_allocate,
// 3: ld.global.cs (evict first).
template <int L, int LD> static __device__ __forceinline__ fz_vec<unsigned short, L> v2_load(const fz_vec<unsigned short, L>* p) {
    if constexpr (LD == 0) return *p;
    else {
        union { fz_vec<unsigned short, L> v; unsigned int w[L / 2]; } u;
        if constexpr (L == 4) {
            if constexpr (LD == 1) asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(u.w[0]), "=r"(u.w[1]) : "l"(p));
            if constexpr (LD == 2) asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(u.w[0]), "=r"(u.w[1]) : "l"(p));
            if constexpr (LD == 3) asm volatile("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(u.w[0]), "=r"(u.w[1]) : "l"(p));
        } else {
            if constexpr (LD == 1) asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u.w[0]), "=r"(u.w[1]), "=r"(u.w[2]), "=r"(u.w[3]) : "l"(p));
            if constexpr (LD == 2) asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u.w[0]), "=r"(u.w[1]), "=r"(u.w[2]), "=r"(u.w[3]) : "l"(p));
            if constexpr (LD == 3) asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u.w[0]), "=r"(u.w[1]), "=r"(u.w[2]), "=r"(u.w[3]) : "l"(p));
        }
        return u.v;
    }
}
// Hand variants of V2's exact_rows entry: W threads a row (256 / W rows a block), L elements a
// vector, STASH keeps y in f32 registers for the last pass (else recomputed from x and w).
template <int W, int L, bool STASH, int LD>
static __device__ __forceinline__ void v2_body(const unsigned short* __restrict__ p_x,
    const unsigned short* __restrict__ p_w, unsigned char* __restrict__ out0,
    float* __restrict__ out1, const long long d_t) {
    constexpr int R = 256 / W, Q = 4096 / (W * L), WW = W / 32;
    __shared__ float red4[R][WW];
    __shared__ float red12[R][WW];
    const int sub = threadIdx.x / W, lane = threadIdx.x % W;
    for (long long g0 = (long long)blockIdx.x * R; g0 < d_t; g0 += (long long)gridDim.x * R) {
        const long long g = g0 + sub;
        const bool live = g < d_t;
        const long long b0 = (live ? g : g0) * 4096;
        fz_vec<unsigned short, L> rc[Q];
        #pragma unroll
        for (int q = 0; q < Q; ++q)
            rc[q] = v2_load<L, LD>(reinterpret_cast<const fz_vec<unsigned short, L>*>(p_x + b0) + lane + q * W);
        float acc = 0.0f;
        #pragma unroll
        for (int q = 0; q < Q; ++q)
            #pragma unroll
            for (int j = 0; j < L; ++j) { const float v = fz_bf16_at(rc[q], j); acc = acc + v * v; }
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc = acc + __shfl_xor_sync(0xffffffffu, acc, off);
        if ((lane & 31) == 0) red4[sub][lane >> 5] = acc;
        __syncthreads();
        acc = red4[sub][0];
        #pragma unroll
        for (int w = 1; w < WW; ++w) acc = acc + red4[sub][w];
        const float v7 = rsqrtf(acc * (1.0f / 4096.0f) + 1e-6f);
        float mx = -__int_as_float(0x7f800000);
        float ys[STASH ? Q * L : 1];
        #pragma unroll
        for (int q = 0; q < Q; ++q) {
            const fz_vec<unsigned short, L> lw = *(reinterpret_cast<const fz_vec<unsigned short, L>*>(p_w) + lane + q * W);
            #pragma unroll
            for (int j = 0; j < L; ++j) {
                const float y = __fmul_rn(__fmul_rn(fz_bf16_at(rc[q], j), v7), fz_bf16_at(lw, j));
                mx = fmaxf(mx, fabsf(y));
                if constexpr (STASH) ys[q * L + j] = y;
            }
        }
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if ((lane & 31) == 0) red12[sub][lane >> 5] = mx;
        __syncthreads();
        mx = red12[sub][0];
        #pragma unroll
        for (int w = 1; w < WW; ++w) mx = fmaxf(mx, red12[sub][w]);
        const float v20 = fmaxf(mx / 448.0f, 1.0f / (448.0f * 512.0f));
        const fz_divider dv = fz_divider_of(v20);
        #pragma unroll
        for (int q = 0; q < Q; ++q) {
            float y[L];
            if constexpr (STASH) {
                #pragma unroll
                for (int j = 0; j < L; ++j) y[j] = ys[q * L + j];
            } else {
                const fz_vec<unsigned short, L> lw = *(reinterpret_cast<const fz_vec<unsigned short, L>*>(p_w) + lane + q * W);
                #pragma unroll
                for (int j = 0; j < L; ++j) y[j] = __fmul_rn(__fmul_rn(fz_bf16_at(rc[q], j), v7), fz_bf16_at(lw, j));
            }
            fz_vec<unsigned char, L> s0;
            bool bad = false;
            #pragma unroll
            for (int j = 0; j < L; ++j) s0.v[j] = fz_f32_to_f8e4m3(fz_div_fast(y[j], v20, dv, bad));
            if (bad) {
                #pragma unroll
                for (int j = 0; j < L; ++j) s0.v[j] = fz_f32_to_f8e4m3(fz_div_by(y[j], v20, dv));
            }
            if (live) *(reinterpret_cast<fz_vec<unsigned char, L>*>(out0 + b0) + lane + q * W) = s0;
        }
        if (live && lane == 0) out1[g] = v20;
    }
}
#define V2K(NAME, W, L, S, MB, LD) extern "C" __global__ void __launch_bounds__(256, MB) NAME( \
    const unsigned short* __restrict__ x, const unsigned short* __restrict__ w, \
    unsigned char* __restrict__ q, float* __restrict__ s, const long long t, const long long h) \
    { v2_body<W, L, S, LD>(x, w, q, s, t); }
V2K(h256_4s_3_ld0, 256, 4, true, 3, 0)
V2K(h128_4s_4_ld0, 128, 4, true, 4, 0)
V2K(h256_4s_3_ld1, 256, 4, true, 3, 1)
V2K(h128_4s_4_ld1, 128, 4, true, 4, 1)
V2K(h256_4s_3_ld2, 256, 4, true, 3, 2)
V2K(h128_4s_4_ld2, 128, 4, true, 4, 2)
V2K(h256_4s_3_ld3, 256, 4, true, 3, 3)
V2K(h128_4s_4_ld3, 128, 4, true, 4, 3)
V2K(h128_8s_4_ld1, 128, 8, true, 4, 1)
V2K(h64_8s_2_ld1, 64, 8, true, 2, 1)
V2K(h256_4s_6_ld1, 256, 4, true, 6, 1)
V2K(h128_4s_5_ld1, 128, 4, true, 5, 1)
V2K(h256_4n_8_ld1, 256, 4, false, 8, 1)
